"""``autograd.scipy.stats.norm``: ``tracegrad.scipy.stats.norm``'s functions."""
from tracegrad.scipy.stats import norm as _dist

globals().update({k: v for k, v in vars(_dist).items() if not k.startswith('_')})
__all__ = sorted(k for k in vars(_dist) if not k.startswith('_'))
