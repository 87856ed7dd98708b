"""``torch.cuda``'s device queries, answered by tracegrad's GPU path: CuPy.

tracegrad runs on an NVIDIA GPU through CuPy (``pip install
'tracegrad[cuda]'``): a Tensor moves there with ``.cuda()`` / ``.to("cuda")``
and compiled code takes the CUDA target with ``backend="cupy"``.  These
functions say whether that path works on this machine.  CuPy is imported on
the first query, never by ``import tracegrad``.

``is_available()`` answers a question, so a machine without CuPy, without a
driver or without a device answers False, as torch does; the functions that
need a device (``current_device``, ``get_device_name``, ``synchronize``)
raise a RuntimeError that gives the reason and the fix instead.
"""
from __future__ import annotations

from tracegrad.eager.device import device

__all__ = ["is_available", "device_count", "current_device", "get_device_name",
           "synchronize"]

INSTALL = ("tracegrad runs on the GPU through CuPy: pip install 'tracegrad[cuda]' (or the "
           "cupy-cudaXXx wheel for your CUDA version) on a machine with an NVIDIA GPU and "
           "driver")


def _probe():
    """(number of CUDA devices CuPy sees, why there are none or None)."""
    try:
        import cupy
    except ImportError as e:
        return 0, f"CuPy is not installed ({e})"
    try:
        n = int(cupy.cuda.runtime.getDeviceCount())
    except cupy.cuda.runtime.CUDARuntimeError as e:   # no driver, no device
        return 0, f"CuPy found no usable CUDA device ({e})"
    return n, None if n > 0 else "CuPy found no CUDA device"


def is_available() -> bool:
    """True if CuPy imports and sees at least one CUDA device."""
    return _probe()[0] > 0


def device_count() -> int:
    """The number of CUDA devices CuPy sees (0 without CuPy or a device)."""
    return _probe()[0]


def _require(what):
    n, why = _probe()
    if n == 0:
        raise RuntimeError(f"tracegrad.cuda.{what}: no CUDA device is available: {why}. "
                           f"{INSTALL}; check with tracegrad.cuda.is_available() and use "
                           f"device='cpu' otherwise.")
    import cupy
    return cupy, n


def _index(dev, n, what):
    """The device index named by None, an int, "cuda", "cuda:1" or a
    tracegrad.device (None: the current device)."""
    if dev is None:
        return None
    if isinstance(dev, int) and not isinstance(dev, bool):
        idx = dev
    else:
        d = device(dev) if isinstance(dev, str) else dev
        if getattr(d, "type", None) != "cuda":
            raise ValueError(f"tracegrad.cuda.{what}: expected a CUDA device, got {dev!r}")
        idx = d.index
    if idx is not None and not 0 <= idx < n:
        raise ValueError(f"tracegrad.cuda.{what}: device index {idx} is out of range; this "
                         f"machine has {n} CUDA device{'s' if n != 1 else ''}")
    return idx


def current_device() -> int:
    """The index of the CUDA device CuPy uses now."""
    cupy, _ = _require("current_device")
    return int(cupy.cuda.runtime.getDevice())


def get_device_name(device=None) -> str:
    """The name of a CUDA device (default: the current one)."""
    cupy, n = _require("get_device_name")
    idx = _index(device, n, "get_device_name")
    if idx is None:
        idx = int(cupy.cuda.runtime.getDevice())
    name = cupy.cuda.runtime.getDeviceProperties(idx)["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def synchronize(device=None) -> None:
    """Wait until the work queued on a CUDA device (default: the current
    one) has finished, e.g. before reading a clock."""
    cupy, n = _require("synchronize")
    idx = _index(device, n, "synchronize")
    if idx is None:
        cupy.cuda.runtime.deviceSynchronize()
    else:
        with cupy.cuda.Device(idx):
            cupy.cuda.runtime.deviceSynchronize()
