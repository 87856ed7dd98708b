"""``scipy.integrate`` on tracegrad values: the rules on samples (trapezoid,
cumulative_trapezoid, simpson: ``tracegrad.ops.scipy_more``), and ``quad``,
``dblquad``, ``odeint``, ``solve_ivp`` (``tracegrad.frontend.scipy_roots``,
rows in ``tracegrad.ops.scipy_solvers``; SciPy needed at call time): the same
functions SciPy's own reach when called on traced or recorded values."""
from tracegrad.frontend import scipy_roots as _roots
from tracegrad.ops import scipy_more as _impl
from tracegrad.scipy.optimize import _public

_SOLVERS = ("quad", "dblquad", "odeint", "solve_ivp")
__all__ = sorted(_impl.INTEGRATE) + list(_SOLVERS)
globals().update(_impl.INTEGRATE)
globals().update({n: _public("scipy.integrate", n, _roots.INTEGRALS) for n in _SOLVERS})
