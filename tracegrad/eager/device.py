"""Devices and the defaults of new tensors: ``tg.device``, the default
dtype and device (``torch.set_default_dtype`` / ``set_default_device``),
and the array module (NumPy or CuPy) a device's data lives in.
"""
from __future__ import annotations

import numpy as np

from tracegrad.ops import dtypes as _dtypes
from tracegrad.ops.base import resolve_dtype as _resolve_dtype

_ndarray = np.ndarray


class device:
    """``tg.device("cpu")`` / ``tg.device("cuda")``, compared by type and index."""
    __slots__ = ("type", "index")

    def __init__(self, type="cpu", index=None):
        if isinstance(type, device):
            type, index = type.type, type.index
        if ":" in type:
            type, idx = type.split(":", 1)
            index = int(idx)
        if type not in ("cpu", "cuda"):
            raise ValueError(f"unknown device {type!r}: tracegrad knows 'cpu' and 'cuda'")
        self.type = type
        self.index = index

    def __eq__(self, other):
        if isinstance(other, str):
            other = device(other)
        return isinstance(other, device) and self.type == other.type and (
            self.index == other.index or self.index is None or other.index is None)

    def __hash__(self):
        return hash(self.type)

    def __repr__(self):
        return f"device(type='{self.type}'" + (f", index={self.index})" if self.index is not None else ")")

    def __str__(self):
        return self.type if self.index is None else f"{self.type}:{self.index}"

    def __enter__(self):
        """``with tg.device("cpu"):`` makes it the default device inside the block."""
        _Defaults.device_stack.append(_Defaults.device)
        set_default_device(self)
        return self

    def __exit__(self, *exc):
        _Defaults.device = _Defaults.device_stack.pop()
        return False


_CPU = device("cpu")


class _DefaultsType:
    """What the constructors make when told nothing: ``dtype`` for Python
    floats (and for zeros/ones/rand/...; torch's float32, kept in
    tracegrad.ops.dtypes where the promotion rule reads it too),
    ``device`` for data."""
    device = None                  # None: cpu
    device_stack = []              # outer defaults of open ``with tg.device(...)`` blocks

    @property
    def dtype(self):
        return _dtypes.Defaults.dtype


_Defaults = _DefaultsType()


def set_default_dtype(d):
    """torch.set_default_dtype: the dtype the constructors give Python floats
    (``tg.tensor([1.5])``, ``tg.zeros(3)``, ``tg.rand(2)``, ``tg.arange(0., 1.)``)
    and, paired with it, Python complex numbers (complex64 for float32,
    complex128 for float64), and the dtype torch's promotion gives a Python
    float next to an integer tensor.  The default is float32, as torch's;
    ``tg.set_default_dtype(tg.float64)`` gives NumPy's.  Only floating
    dtypes are accepted, as in torch."""
    try:
        dt = _resolve_dtype(d)
    except TypeError:
        dt = None
    if dt is None or dt.kind != "f":
        raise TypeError(f"only floating-point types are supported as the default type "
                        f"(float16, float32 or float64), got {d!r}")
    _dtypes.Defaults.dtype = dt


def get_default_dtype():
    """The dtype Python floats become in the constructors (see set_default_dtype)."""
    return _Defaults.dtype


def set_default_device(dev):
    """torch.set_default_device: where the constructors put new tensors when
    given no ``device=``.  'cpu' (or None) is NumPy; 'cuda' needs CuPy."""
    if dev is None:
        _Defaults.device = None
        return
    d = device(dev)
    if d.type == "cuda":
        _xp_for(d)   # says what to install when CuPy is missing
        _Defaults.device = d
    else:
        _Defaults.device = None


def get_default_device():
    """The device of a tensor made without ``device=`` (torch.get_default_device)."""
    return _Defaults.device if _Defaults.device is not None else _CPU


def _xp_for(dev):
    if dev is None:
        dev = _Defaults.device
        if dev is None:
            return np
    if device(dev).type == "cuda":
        try:
            import cupy
        except ImportError:
            raise RuntimeError("device='cuda' needs CuPy: pip install 'tracegrad[cuda]' on a machine "
                               "with an NVIDIA GPU") from None
        return cupy
    return np


def _to_host(a):
    if type(a) is _ndarray:
        return a
    get = getattr(a, "get", None)
    return get() if get is not None else np.asarray(a)


def _device_of(a):
    return device("cuda") if type(a).__module__.startswith("cupy") else _CPU


def device_type(dev):
    return device(dev).type
