"""SciPy's differentiable functions on tracegrad values (``tracegrad.scipy.special``,
``tracegrad.scipy.stats``), with SciPy's names, signatures and broadcasting.

SciPy itself is not needed: the values come from tracegrad's own rows
(``tracegrad/ops/special.py``) and compositions of existing ones.

A public face, on top of the layers: it may import any of them.
"""
from tracegrad.scipy import special, stats

__all__ = ["special", "stats"]
