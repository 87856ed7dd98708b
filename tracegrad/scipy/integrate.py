"""``scipy.integrate``'s rules on samples (trapezoid, cumulative_trapezoid,
simpson) on tracegrad values (``tracegrad.ops.scipy_more``)."""
from tracegrad.ops import scipy_more as _impl

__all__ = sorted(_impl.INTEGRATE)
globals().update(_impl.INTEGRATE)
