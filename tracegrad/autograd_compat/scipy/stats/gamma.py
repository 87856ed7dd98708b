"""``autograd.scipy.stats.gamma``: ``tracegrad.scipy.stats.gamma``'s functions."""
from tracegrad.scipy.stats import gamma as _dist

globals().update({k: v for k, v in vars(_dist).items() if not k.startswith('_')})
__all__ = sorted(k for k in vars(_dist) if not k.startswith('_'))
