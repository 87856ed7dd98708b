"""``autograd.numpy.linalg``: NumPy's ``numpy.linalg`` (its functions dispatch to
tracegrad on differentiated values)."""
import numpy.linalg as _mod


def __getattr__(name):
    return getattr(_mod, name)


def __dir__():
    return dir(_mod)
