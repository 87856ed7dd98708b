"""``import tracegrad.numpy as np``: NumPy's namespace for code that builds
arrays out of differentiated values (as ``autograd.numpy`` and
``jax.numpy`` offer).

Every name is NumPy's own (``np.sin``, ``np.linalg.solve``, ``np.random``,
``np.float64``...): NumPy functions already dispatch to tracegrad through
``__array_function__`` when a traced or eager value is among their
arguments.  What NumPy cannot dispatch, because it converts its argument
to an array first, is given here with NumPy's meaning:

* ``array`` / ``asarray`` of a value, or of (nested) lists mixing values and
  numbers: stacked into one value that stays differentiable;
* ``r_[...]`` and ``c_[...]`` with values among the pieces;
* ``full(shape, value)`` with a value as the fill;
* ``concatenate``, ``stack``, ``hstack``, ``vstack``, ``column_stack`` of
  sequences whose pieces are (nested) lists holding values
  (``np.concatenate([x, [x[1]]])``).

On plain data each of these is exactly NumPy's, so code written against
this module runs unchanged on ndarrays.
"""
from __future__ import annotations

import numpy as _np

from tracegrad.ops._define import ArrayMethods as _Value, numpy_copy as _numpy_copy


def __getattr__(name):
    return getattr(_np, name)


def __dir__():
    return sorted(set(dir(_np)) | {"array", "asarray", "r_", "c_", "full", *_JOINS})


def _holds_value(obj):
    if isinstance(obj, _Value):
        return True
    if isinstance(obj, (list, tuple)):
        return any(_holds_value(o) for o in obj)
    return False


def _build(obj, dtype):
    """A value from a value, or a (nested) sequence holding one: NumPy's
    np.array of it, stacked so that it stays differentiable."""
    if isinstance(obj, _Value):
        return obj if dtype is None else obj.astype(dtype)
    if isinstance(obj, (list, tuple)):
        if not obj:
            return _np.array(obj, dtype=dtype)
        parts = [_build(o, None) for o in obj]
        # NumPy's np.array promotes the pieces together: numbers become
        # arrays of their default dtype first, as np.array([x32, 1.5]) does
        parts = [p if isinstance(p, _Value) else _np.asarray(p) for p in parts]
        shapes = {tuple(p.shape) for p in parts}
        if len(shapes) > 1:
            raise ValueError(f"setting an array element with a sequence: the pieces have "
                             f"shapes {sorted(shapes)} (NumPy refuses an inhomogeneous shape)")
        out = _np.stack(parts)
        return out if dtype is None else out.astype(dtype)
    return _np.array(obj, dtype=dtype)


def array(object, dtype=None, *, copy=True, order="K", subok=False, ndmin=0, like=None):
    """np.array, also of values and of lists holding them."""
    if not _holds_value(object):
        return _np.array(object, dtype=dtype, copy=copy, order=order, subok=subok, ndmin=ndmin)
    if order not in ("K", "C", "A", None):
        raise ValueError(f"array(order={order!r}) of a differentiated value: only the "
                         f"default layout exists for it; drop order=")
    out = _build(object, dtype)
    if copy and out is object:
        out = _numpy_copy(out)       # np.array copies; np.asarray does not
    while out.ndim < ndmin:
        out = out[None]
    return out


def asarray(a, dtype=None, order=None, *, copy=None, like=None):
    """np.asarray: a value stays itself (no copy), lists holding values stack."""
    if not _holds_value(a):
        return _np.asarray(a, dtype=dtype, order=order, copy=copy)
    return array(a, dtype=dtype, copy=bool(copy))


def full(shape, fill_value, dtype=None, order="C", *, like=None):
    """np.full, also with a differentiated fill value (broadcast to shape)."""
    if not _holds_value(fill_value):
        return _np.full(shape, fill_value, dtype=dtype, order=order)
    v = fill_value if dtype is None else fill_value.astype(dtype)
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    return _np.broadcast_to(v, shape) + _np.zeros(shape, dtype=v.dtype)


def _joiner(name):
    numpy_fn = getattr(_np, name)

    def join(arrays, *args, **kwargs):
        # NumPy dispatches on the pieces only when they are arrays already: a
        # list holding a value among the pieces is made one first (asarray)
        if isinstance(arrays, (list, tuple)) and any(
                isinstance(p, (list, tuple)) and _holds_value(p) for p in arrays):
            arrays = [asarray(p) if isinstance(p, (list, tuple)) and _holds_value(p) else p
                      for p in arrays]
        return numpy_fn(arrays, *args, **kwargs)
    join.__name__ = join.__qualname__ = name
    join.__doc__ = f"np.{name}, also of pieces that are lists holding differentiated values."
    return join


_JOINS = ("concatenate", "stack", "hstack", "vstack", "column_stack")
concatenate, stack, hstack, vstack, column_stack = (_joiner(n) for n in _JOINS)


def _pieces(key):
    return key if isinstance(key, tuple) else (key,)


class _Concatenator:
    """r_ and c_: NumPy's own for plain pieces; with values among them, the
    pieces (slices become aranges) are joined by concatenate."""

    def __init__(self, numpy_version, columns):
        self._numpy = numpy_version
        self._columns = columns

    def __getitem__(self, key):
        items = _pieces(key)
        if not any(_holds_value(i) for i in items):
            return self._numpy[key]
        parts = []
        for item in items:
            if isinstance(item, str):
                raise ValueError(f"{'c_' if self._columns else 'r_'}[{item!r}, ...]: string "
                                 f"directives are not supported with differentiated values; "
                                 f"use np.concatenate / np.stack with axis=")
            if isinstance(item, slice):
                item = _np.r_[item]
            item = asarray(item)
            if self._columns:
                parts.append(item.reshape((-1, 1)) if item.ndim <= 1 else item)
            else:
                parts.append(item.reshape((1,)) if item.ndim == 0 else item)
        return _np.concatenate(parts, axis=-1 if self._columns else 0)

    def __len__(self):
        return 0


r_ = _Concatenator(_np.r_, columns=False)
c_ = _Concatenator(_np.c_, columns=True)
