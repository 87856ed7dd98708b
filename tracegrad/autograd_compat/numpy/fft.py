"""``autograd.numpy.fft``: NumPy's ``numpy.fft`` (its functions dispatch to
tracegrad on differentiated values)."""
import numpy.fft as _mod


def __getattr__(name):
    return getattr(_mod, name)


def __dir__():
    return dir(_mod)
