"""``scipy.interpolate`` on tracegrad values (``tracegrad.ops.scipy_interpolate``):
the same classes and functions SciPy's own reach when called on traced or
recorded values (CubicSpline, CubicHermiteSpline, PchipInterpolator,
pchip_interpolate, PPoly, BSpline, make_interp_spline, interp1d,
RegularGridInterpolator, interpn)."""
from tracegrad.ops import scipy_interpolate as _impl

__all__ = sorted(_impl.FUNCTIONS)
globals().update(_impl.FUNCTIONS)
