"""``autograd.numpy.random``: NumPy's ``numpy.random`` (its functions dispatch to
tracegrad on differentiated values)."""
import numpy.random as _mod


def __getattr__(name):
    return getattr(_mod, name)


def __dir__():
    return dir(_mod)
