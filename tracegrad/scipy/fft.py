"""``scipy.fft`` on tracegrad values: NumPy's FFT rows with SciPy's signatures
(``tracegrad.ops.scipy_more``)."""
from tracegrad.ops import scipy_more as _impl

__all__ = sorted(_impl.FFT)
globals().update(_impl.FFT)
