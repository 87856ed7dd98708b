"""SciPy's differentiable functions on tracegrad values, under an explicit name
(``tracegrad.scipy.special``, ``.linalg``, ``.signal``, ``.fft``, ``.integrate``,
``.stats``, ``.interpolate``, ``.optimize``), with SciPy's names, signatures and broadcasting.

The same table SciPy's own functions reach when a function tracegrad
differentiates calls them as written (``scipy.linalg.expm(a)``,
``from scipy.special import expit``): tracegrad.frontend.scipy_calls routes
them here by the identity of SciPy's function objects; see docs/scipy.md.
The implementations live in the op layer (``tracegrad/ops/scipy_*.py``).

A public face, on top of the layers: it may import any of them.
"""
from tracegrad.scipy import special, stats, linalg, signal, fft, integrate, interpolate, optimize

__all__ = ["special", "stats", "linalg", "signal", "fft", "integrate", "interpolate", "optimize"]
