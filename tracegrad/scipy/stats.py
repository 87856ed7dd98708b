"""``scipy.stats`` distributions on tracegrad values, with SciPy's parameter
names, argument conventions and broadcasting: the same objects SciPy's own
distributions reach when their methods are called on traced or recorded
values (``tracegrad.ops.scipy_stats``; see docs/scipy.md)."""
from tracegrad.ops import scipy_stats as _impl

__all__ = sorted(_impl.DISTRIBUTIONS)
globals().update(_impl.DISTRIBUTIONS)
