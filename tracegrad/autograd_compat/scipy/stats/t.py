"""``autograd.scipy.stats.t``: ``tracegrad.scipy.stats.t``'s functions."""
from tracegrad.scipy.stats import t as _dist

globals().update({k: v for k, v in vars(_dist).items() if not k.startswith('_')})
__all__ = sorted(k for k in vars(_dist) if not k.startswith('_'))
