"""Tensor constructors with torch's signatures: ``tensor``, ``zeros``,
``ones``, ``full``, ``eye``, ``arange``, ``linspace``, the ``*_like``
family and the random ones (``rand``, ``randn``, ``randint``, ``randperm``,
``normal``, ``manual_seed``).
"""
from __future__ import annotations

import numpy as np

from tracegrad.eager.device import _Defaults, _ndarray, _xp_for, device_type
from tracegrad.eager.tensor import Tensor
from tracegrad.ops import primitives
from tracegrad.ops.base import resolve_dtype as _resolve_dtype
from tracegrad.ops.random import is_tracing, traced_generator

def _default_float(arr, data):
    """A float64 (complex128) array made from Python numbers takes the
    default dtype (its complex partner), as torch.tensor does; NumPy arrays,
    NumPy scalars (np.float64(x), also inside a list) and Tensors keep their
    own dtype."""
    dt = _Defaults.dtype
    if dt.itemsize == 8 or isinstance(data, (Tensor, _ndarray, np.generic)) or \
            hasattr(data, "__cuda_array_interface__"):
        return arr
    if arr.dtype in (np.float64, np.complex128) and _holds_wide_numpy_scalar(data):
        return arr
    if arr.dtype == np.float64:
        return arr.astype(dt)
    if arr.dtype == np.complex128:
        return arr.astype(np.complex64 if dt.itemsize == 4 else np.complex128)
    return arr


def _holds_wide_numpy_scalar(data):
    """Does a (nested) list or tuple hold a NumPy float64 or complex128
    scalar?  torch.tensor([np.float64(1), 2.0]) is float64, as its items
    say, where [1.0, 2.0] takes the default dtype."""
    stack = [data]
    while stack:
        d = stack.pop()
        if isinstance(d, (list, tuple)):
            stack.extend(d)
        elif isinstance(d, (np.float64, np.complex128)):
            return True
    return False


def _make(data, requires_grad):
    t = Tensor(data)
    if requires_grad:
        t.requires_grad_(True)
    return t


def tensor(data, dtype=None, device=None, requires_grad=False, pin_memory=False):
    """A new leaf tensor holding a copy of ``data`` (dtype follows NumPy)."""
    xp = _xp_for(device)
    if isinstance(data, Tensor):
        data = data._data
    dt = _resolve_dtype(dtype)
    if isinstance(data, (list, tuple)) and any(isinstance(d, Tensor) for d in data):
        data = [d._data if isinstance(d, Tensor) else d for d in data]
    arr = xp.array(data, dtype=dt, copy=True)
    if dt is None:
        arr = _default_float(arr, data)
    return _make(arr, requires_grad)


def as_tensor(data, dtype=None, device=None):
    if isinstance(data, Tensor) and dtype is None:
        return data
    xp = _xp_for(device)
    dt = _resolve_dtype(dtype)
    arr = xp.asarray(data._data if isinstance(data, Tensor) else data, dtype=dt)
    return Tensor(arr if dt is not None else _default_float(arr, data))


def from_numpy(a):
    return Tensor(a)


def _shape_args(size):
    if len(size) == 1 and isinstance(size[0], (tuple, list)):
        return tuple(size[0])
    return tuple(size)


def _filled(fill, size, dtype, device, requires_grad):
    xp = _xp_for(device)
    dt = _resolve_dtype(dtype) or _Defaults.dtype
    return _make(fill(xp, _shape_args(size), dt), requires_grad)


def zeros(*size, dtype=None, device=None, requires_grad=False, out=None):
    return _filled(lambda xp, s, d: xp.zeros(s, d), size, dtype, device, requires_grad)


def ones(*size, dtype=None, device=None, requires_grad=False, out=None):
    return _filled(lambda xp, s, d: xp.ones(s, d), size, dtype, device, requires_grad)


def empty(*size, dtype=None, device=None, requires_grad=False, out=None):
    return _filled(lambda xp, s, d: xp.empty(s, d), size, dtype, device, requires_grad)


def full(size, fill_value, dtype=None, device=None, requires_grad=False):
    xp = _xp_for(device)
    dt = _resolve_dtype(dtype)
    if dt is None:
        dt = np.result_type(fill_value)
        if isinstance(fill_value, (float, complex)):   # Python numbers: torch's defaults
            dt = _default_float(np.empty(0, dt), fill_value).dtype
    return _make(xp.full(tuple(size) if not isinstance(size, int) else (size,), fill_value, dt),
                 requires_grad)


def eye(n, m=None, dtype=None, device=None, requires_grad=False):
    xp = _xp_for(device)
    return _make(xp.eye(n, m, dtype=_resolve_dtype(dtype) or _Defaults.dtype), requires_grad)


def _like(fill, t, dtype, device, requires_grad):
    a = t._data if isinstance(t, Tensor) else np.asarray(t)
    dt = _resolve_dtype(dtype) or a.dtype
    xp = primitives.array_module(a) if device is None else _xp_for(device)
    return _make(fill(xp, a.shape, dt), requires_grad)


def zeros_like(t, dtype=None, device=None, requires_grad=False, memory_format=None):
    return _like(lambda xp, s, d: xp.zeros(s, d), t, dtype, device, requires_grad)


def ones_like(t, dtype=None, device=None, requires_grad=False, memory_format=None):
    return _like(lambda xp, s, d: xp.ones(s, d), t, dtype, device, requires_grad)


def empty_like(t, dtype=None, device=None, requires_grad=False, memory_format=None):
    return _like(lambda xp, s, d: xp.empty(s, d), t, dtype, device, requires_grad)


def full_like(t, fill_value, dtype=None, device=None, requires_grad=False, memory_format=None):
    return _like(lambda xp, s, d: xp.full(s, fill_value, d), t, dtype, device, requires_grad)


def arange(start, end=None, step=1, dtype=None, device=None, requires_grad=False):
    xp = _xp_for(device)
    if end is None:
        start, end = 0, start
    dt = _resolve_dtype(dtype)
    if dt is None:
        dt = np.dtype(np.int64) if all(isinstance(v, int) for v in (start, end, step)) else _Defaults.dtype
    return _make(xp.arange(start, end, step, dtype=dt), requires_grad)


def linspace(start, end, steps, dtype=None, device=None, requires_grad=False):
    xp = _xp_for(device)
    return _make(xp.linspace(start, end, steps, dtype=_resolve_dtype(dtype) or _Defaults.dtype),
                 requires_grad)


class _RNG:
    gen = np.random.default_rng()


def manual_seed(seed):
    """Seed the generator behind rand/randn/randint/randperm/normal and
    dropout, in place: compiled code that draws from it holds this very
    object, and draws the seeded stream too."""
    _RNG.gen.bit_generator.state = np.random.default_rng(seed).bit_generator.state
    return _RNG.gen


def seed():
    s = int(np.random.SeedSequence().entropy % (2 ** 63))
    manual_seed(s)
    return s


def _not_while_tracing(name):
    """tracegrad's own generator cannot be drawn from by generated code: a
    draw while tracing would be frozen into it, so refuse."""
    if is_tracing():
        raise TypeError(
            f"tg.{name} was called while tracegrad traces a function: the sample would be "
            f"drawn once and frozen into the compiled code. Draw with np.random (for example "
            f"np.random.standard_normal(shape), which compiled code draws afresh on every "
            f"call), pass a np.random.Generator argument, or draw outside and pass the "
            f"sample as an argument.")


def numpy_generator(generator=None):
    """The NumPy Generator to draw from: ``generator``'s own (a
    tracegrad.Generator, or a NumPy Generator), or tracegrad's global one
    (seeded by tg.manual_seed)."""
    if generator is None:
        return _RNG.gen
    if isinstance(generator, np.random.Generator):
        return generator
    rng = getattr(generator, "_rng", None)
    if isinstance(rng, np.random.Generator):
        return rng
    raise TypeError(f"generator must be a tracegrad.Generator, got {type(generator).__name__}")


def traced_draw(generator, method, *args, **kwargs):
    """While tracing: ``method`` of the generator recorded as a random_draw
    node reading that generator (an implicit input of the compiled call:
    torch.compile draws from torch's generator on every call too); a
    torch-face value.  None where the trace lifts no generator."""
    proxy = traced_generator(numpy_generator(generator),
                             "torch's default generator" if generator is None
                             else "the generator= argument")
    if proxy is None:
        return None
    out = getattr(proxy, method)(*args, **kwargs)
    out._face = "torch"
    return out


def _traced(sample, dt, requires_grad, name):
    if sample is None:
        _not_while_tracing(name)
    if requires_grad:
        raise TypeError(f"tg.{name}(..., requires_grad=True) inside a compiled function: a "
                        f"leaf created there cannot be differentiated; draw it outside and "
                        f"pass it as an argument")
    return sample if sample.dtype == dt else sample.astype(dt)


def _random(draw, size, dtype, device, requires_grad, name, generator=None, method=None):
    dt = _resolve_dtype(dtype) or _Defaults.dtype
    if is_tracing():
        return _traced(traced_draw(generator, method, _shape_args(size)), dt, requires_grad,
                       name)
    arr = draw(_shape_args(size)).astype(dt, copy=False)
    if device is None:
        device = _Defaults.device
    if device is not None and device_type(device) == "cuda":
        arr = _xp_for(device).asarray(arr)
    return _make(arr, requires_grad)


def rand(*size, dtype=None, device=None, requires_grad=False, generator=None):
    return _random(lambda s: numpy_generator(generator).random(s), size, dtype, device,
                   requires_grad, "rand", generator, "random")


def randn(*size, dtype=None, device=None, requires_grad=False, generator=None):
    return _random(lambda s: numpy_generator(generator).standard_normal(s), size, dtype, device,
                   requires_grad, "randn", generator, "standard_normal")


def rand_like(t, dtype=None, device=None, requires_grad=False):
    return rand(*t.shape, dtype=dtype or t.dtype, device=device, requires_grad=requires_grad)


def randn_like(t, dtype=None, device=None, requires_grad=False):
    return randn(*t.shape, dtype=dtype or t.dtype, device=device, requires_grad=requires_grad)


def randint(low, high=None, size=(), dtype=None, device=None, requires_grad=False,
            generator=None):
    if high is None:
        low, high = 0, low
    dt = _resolve_dtype(dtype) or np.int64
    if is_tracing():
        return _traced(traced_draw(generator, "integers", low, high, size=tuple(size)), dt,
                       requires_grad, "randint")
    arr = numpy_generator(generator).integers(low, high, size=tuple(size)).astype(dt)
    return _make(arr, requires_grad)


def randperm(n, dtype=None, device=None, requires_grad=False, generator=None):
    dt = _resolve_dtype(dtype) or np.int64
    if is_tracing():
        return _traced(traced_draw(generator, "permutation", n), dt, requires_grad, "randperm")
    return _make(numpy_generator(generator).permutation(n).astype(dt), requires_grad)


def normal(mean=0.0, std=1.0, size=(), dtype=None, device=None, requires_grad=False,
           generator=None):
    dt = _resolve_dtype(dtype) or _Defaults.dtype
    if is_tracing():
        return _traced(traced_draw(generator, "normal", mean, std, size=tuple(size)), dt,
                       requires_grad, "normal")
    arr = numpy_generator(generator).normal(mean, std, size=tuple(size)).astype(dt)
    return _make(arr, requires_grad)
