"""Moving arrays between devices: the ``to_device`` row.

``Tensor.to(device)``, ``.cuda()`` and ``.cpu()`` bind it.  The value moves
between NumPy (``"cpu"``) and CuPy (``"cuda"``); the gradient moves back to
the device the input came from, so a graph that crosses devices
differentiates like any other.  In compile mode the backend (``backend="cupy"``
or the arguments' array type) places the whole computation, so the emitter
prints the identity.  (The module is ``devices``, not ``device``: ``tracegrad.ops``
re-exports its names into ``tracegrad``, where ``device`` is the class.)
"""
from __future__ import annotations

import numpy as np

from tracegrad.ops.primitives import Aval, bind, register

__all__ = ["to_device"]


def _cupy():
    try:
        import cupy
    except ImportError:
        raise RuntimeError("moving a tensor to device 'cuda' needs CuPy: pip install "
                           "'tracegrad[cuda]' on a machine with an NVIDIA GPU") from None
    return cupy


def _on_gpu(x):
    return type(x).__module__.startswith("cupy")


def _to_device_impl(xp, x, device, source):
    if device == "cuda":
        return _cupy().asarray(x)
    return x.get() if _on_gpu(x) else np.asarray(x)


to_device_p = register(
    "to_device", _to_device_impl,
    shape=lambda x, device, source: Aval(x.shape, x.dtype),
    vjp=(lambda g, out, x, device, source: to_device(g, source),),
    jvp=(lambda t, out, x, device, source: to_device(t, device),),
    save_inputs=False,
    # Compiled code runs wholly on its backend's device (NumPy or the CUDA
    # target), where the arrays already are: a move is the identity there.
    numpy="{0}",
    doc="Copy to device 'cpu' (NumPy) or 'cuda' (CuPy); the gradient moves back.")


def to_device(x, device):
    """``x`` on ``device`` ("cpu" or "cuda"), differentiably."""
    if device not in ("cpu", "cuda"):
        raise ValueError(f"unknown device {device!r}: tracegrad knows 'cpu' and 'cuda'")
    data = getattr(x, "_data", x)
    source = "cuda" if _on_gpu(data) else "cpu"
    if hasattr(x, "_trace"):
        source = "cuda" if x._trace.backend == "cupy" else "cpu"
    return bind(to_device_p, x, device=device, source=source)
