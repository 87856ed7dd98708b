"""``autograd.scipy.stats.chi2``: ``tracegrad.scipy.stats.chi2``'s functions."""
from tracegrad.scipy.stats import chi2 as _dist

globals().update({k: v for k, v in vars(_dist).items() if not k.startswith('_')})
__all__ = sorted(k for k in vars(_dist) if not k.startswith('_'))
