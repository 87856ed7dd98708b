"""``scipy.signal``'s convolutions and linear filters on tracegrad values
(``tracegrad.ops.scipy_more``)."""
from tracegrad.ops import scipy_more as _impl

__all__ = sorted(_impl.SIGNAL)
globals().update(_impl.SIGNAL)
