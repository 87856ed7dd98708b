"""``autograd.scipy.stats.multivariate_normal``: ``tracegrad.scipy.stats.multivariate_normal``'s functions."""
from tracegrad.scipy.stats import multivariate_normal as _dist

globals().update({k: v for k, v in vars(_dist).items() if not k.startswith('_')})
__all__ = sorted(k for k in vars(_dist) if not k.startswith('_'))
