"""``autograd.numpy``: NumPy's namespace for differentiated code, which is
``tracegrad.numpy`` (NumPy's own names, plus ``array``/``asarray``/``r_``/
``c_``/``full`` that accept differentiated values).  ``numpy.random``,
``numpy.linalg`` and ``numpy.fft`` are NumPy's, as modules to import."""
import tracegrad.numpy as _tnp
from tracegrad.autograd_compat.numpy import random, linalg, fft  # noqa: F401
from tracegrad.numpy import array, asarray, r_, c_, full  # noqa: F401


def __getattr__(name):
    return getattr(_tnp, name)


def __dir__():
    return sorted(set(_tnp.__dir__()) | {"random", "linalg", "fft"})
