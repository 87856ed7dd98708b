"""``scipy.linalg`` on tracegrad values (``tracegrad.ops.scipy_linalg``): the same
functions SciPy's own reach when called on traced or recorded values."""
from tracegrad.ops import scipy_linalg as _impl

__all__ = sorted(_impl.FUNCTIONS)
globals().update(_impl.FUNCTIONS)
