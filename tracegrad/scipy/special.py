"""``scipy.special``'s differentiable functions on tracegrad values.

The same table SciPy's own functions reach when they are called on traced or
recorded values (``tracegrad.ops.scipy_special``; see docs/scipy.md): NumPy-only
rows for gammaln, digamma/polygamma, erf, erfinv, the Bessel functions of static
order and the incomplete gamma and beta functions (no SciPy needed), and the rows
``scipy_ufunc1/2/3`` (SciPy's values, tracegrad's derivative rules) for the rest.
"""
from tracegrad.ops import scipy_special as _impl

__all__ = sorted(set(_impl.PUBLIC) | set(_impl.UFUNCS) | set(_impl.FUNCTIONS))
globals().update({n: getattr(_impl, n) for n in __all__})
_f = _impl._f
