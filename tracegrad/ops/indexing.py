"""Indexing: ``x[idx]``, out-of-place ``x[idx] = v``, gathers, nonzero.

An index is split into a static part, kept as the hashable attribute
``index`` (a tuple of items: ``("s", start, stop, step)`` for a slice,
``("i", k)`` for an int, ``("n",)`` for None, ``("e",)`` for Ellipsis,
``("a", j)`` for the j-th index array), and the index arrays, which are
operands.  A boolean mask becomes its ``nonzero()`` integer arrays, so the
shape of a result never depends on values that are only known at run time.  Rows: getitem, index_add (its transpose: a scatter that adds
repeated indices), setitem, nonzero.  take, take_along_axis, gather,
index_select, masked_fill and narrow are compositions.
"""
from __future__ import annotations

import operator

import numpy as np

from tracegrad import runtime_numpy as _rt
from tracegrad.primitives import Aval, bind, register
from tracegrad.ops._define import method, implements, _ops
from tracegrad.ops.base import is_value, shape_of, shape_by_eval, zeros_like_value, where

__all__ = ["getitem", "setitem", "index_add", "take", "take_along_axis", "gather",
           "index_select", "nonzero", "argwhere", "masked_fill", "narrow"]


# --- the index encoding -----------------------------------------------------------------

def _bound(v):
    return None if v is None else operator.index(v)


def parse_index(idx):
    """(static index spec, list of index-array operands) for a NumPy index."""
    if not isinstance(idx, tuple):
        idx = (idx,)
    spec, arrays = [], []
    for item in idx:
        if item is None:
            spec.append(("n",))
        elif item is Ellipsis:
            spec.append(("e",))
        elif isinstance(item, slice):
            spec.append(("s", _bound(item.start), _bound(item.stop), _bound(item.step)))
        elif isinstance(item, (int, np.integer)) and not isinstance(item, (bool, np.bool_)):
            spec.append(("i", int(item)))
        elif is_value(item) or isinstance(item, (np.ndarray, list, tuple, bool, np.bool_)):
            a = item if is_value(item) else np.asarray(item)
            if a.dtype.kind == "f" and getattr(a, "size", 1) == 0 and not is_value(a):
                a = a.astype(np.intp)  # x[[]]: an empty list is an empty int index
            if a.dtype.kind not in "iub":
                raise IndexError(f"tensors used as indices must be integer or boolean, "
                                 f"got {a.dtype}")
            if a.dtype.kind == "b" and len(a.shape):
                # a mask is its nonzero() index arrays (NumPy defines it so);
                # as integers the result's shape no longer depends on values
                parts = _ops.nonzero(a) if is_value(a) else np.nonzero(a)
            else:
                parts = (a,)
            for part in parts:
                spec.append(("a", len(arrays)))
                arrays.append(part)
        else:
            raise IndexError(
                f"only integers, slices (`:`), ellipsis (`...`), None and integer or boolean "
                f"arrays are valid indices; got {type(item).__name__}")
    return tuple(spec), arrays


def build_index(spec, arrays):
    """The NumPy index a spec stands for, with the given index arrays."""
    out = []
    for it in spec:
        k = it[0]
        out.append(slice(*it[1:]) if k == "s" else it[1] if k == "i" else None if k == "n"
                   else Ellipsis if k == "e" else arrays[it[1]])
    return tuple(out)


def _index_text(spec, names, subscript):
    """Source text of the index: ``a:b:c, None, ix`` inside brackets, or a
    tuple expression (``slice(a, b, c), None, ix``) to pass to a helper."""
    parts = []
    for it in spec:
        k = it[0]
        if k == "s":
            a, b, c = it[1:]
            if subscript:
                parts.append(("" if a is None else repr(a)) + ":" + ("" if b is None else repr(b))
                             + ("" if c is None else ":" + repr(c)))
            else:
                parts.append(f"slice({a!r}, {b!r}, {c!r})")
        elif k == "i":
            parts.append(repr(it[1]))
        elif k == "n":
            parts.append("None")
        elif k == "e":
            parts.append("..." if subscript else "Ellipsis")
        else:
            parts.append(names[it[1]])
    if not parts:
        return "()"
    text = ", ".join(parts) + ("," if len(parts) == 1 else "")
    return text if subscript else f"({text})"


# --- rows -----------------------------------------------------------------------------------

def _getitem_impl(xp, x, *arrays, index):
    return x[build_index(index, arrays)]


getitem_p = register(
    "getitem", _getitem_impl, shape=shape_by_eval(_getitem_impl),
    # the transpose of a gather is a scatter that adds repeated positions
    vjp=(lambda g, out, x, *arrays, index:
         bind(index_add_p, g, *arrays, index=index, shape=tuple(x.shape)),),
    jvp=(lambda t, out, x, *arrays, index: bind(getitem_p, t, *arrays, index=index),),
    numpy=lambda names, index: f"{names[0]}[{_index_text(index, names[1:], True)}]",
    view=True)


def _index_add_impl(xp, g, *arrays, index, shape):
    if not arrays:  # a basic index: each position once, a plain assignment
        return _rt._index_set(g, shape, build_index(index, arrays), xp=xp)
    return _rt._index_add(g, shape, build_index(index, arrays), xp=xp)


index_add_p = register(
    "index_add", _index_add_impl,
    shape=lambda g, *arrays, index, shape: Aval(tuple(shape), g.dtype),
    vjp=(lambda g, out, v, *arrays, index, shape: bind(getitem_p, g, *arrays, index=index),),
    jvp=(lambda t, out, v, *arrays, index, shape:
         bind(index_add_p, t, *arrays, index=index, shape=shape),),
    numpy=lambda names, index, shape:
        # basic indices select each position once: a plain assignment does
        f"_index_{'add' if any(it[0] == 'a' for it in index) else 'set'}({names[0]}, "
        f"{tuple(shape)!r}, {_index_text(index, names[1:], False)})",
    helpers=("_index_add", "_index_set"))


def _setitem_jvp(ts, out, x, v, *arrays, index):
    tx, tv = ts[0], ts[1]
    base = zeros_like_value(x) if tx is None else tx
    return bind(setitem_p, base, 0.0 if tv is None else tv, *arrays, index=index)


setitem_p = register(
    "setitem", lambda xp, x, v, *arrays, index: _rt._setitem(x, build_index(index, arrays), v),
    shape=lambda x, v, *arrays, index: Aval(x.shape, x.dtype),
    # x's cotangent is g with the overwritten positions zeroed; v's is g there
    vjp=(lambda g, out, x, v, *arrays, index: bind(setitem_p, g, 0.0, *arrays, index=index),
         lambda g, out, x, v, *arrays, index: bind(getitem_p, g, *arrays, index=index)),
    jvp=_setitem_jvp,
    numpy=lambda names, index:
        f"_setitem({names[0]}, {_index_text(index, names[2:], False)}, {names[1]})",
    helpers=("_setitem",))

nonzero_p = register(
    "nonzero", lambda xp, x, ndim: tuple(xp.nonzero(x)),
    shape=shape_by_eval(lambda xp, x, ndim: tuple(np.nonzero(x))),
    n_out=lambda ndim: ndim, nondiff=True, save_inputs=False, numpy="np.nonzero({0})")


# --- the functional API -----------------------------------------------------------------------

def getitem(x, idx):
    """``x[idx]`` for any NumPy index; repeated integer indices add their
    gradients."""
    t = type(idx)
    if t is slice:     # the common x[a:b]: no general parsing
        return bind(getitem_p, x, index=(("s", _bound(idx.start), _bound(idx.stop),
                                           _bound(idx.step)),))
    if t is int:
        return bind(getitem_p, x, index=(("i", idx),))
    spec, arrays = parse_index(idx)
    return bind(getitem_p, x, *arrays, index=spec)


def setitem(x, idx, value):
    """A new value equal to a copy of ``x`` with ``[idx] = value``;
    differentiable with respect to both ``x`` and ``value``."""
    spec, arrays = parse_index(idx)
    if isinstance(value, (list, tuple)):
        value = np.asarray(value)
    return bind(setitem_p, x, value, *arrays, index=spec)


def index_add(g, idx, shape):
    """Zeros of ``shape`` with ``g`` added at ``[idx]`` (repeats accumulate)."""
    spec, arrays = parse_index(idx)
    return bind(index_add_p, g, *arrays, index=spec, shape=tuple(int(d) for d in shape))


def _sl(ndim, axis, s):
    return (slice(None),) * axis + (s,) + (slice(None),) * (ndim - axis - 1)


def _axis(axis, ndim):
    a = int(axis)
    if not -ndim <= a < max(ndim, 1):
        raise IndexError(f"axis {a} is out of range for a tensor of {ndim} dimensions")
    return a % max(ndim, 1)


def _as_index(indices):
    return indices if is_value(indices) else np.asarray(indices)


@method("take")
@implements(np.take)
def take(x, indices, axis=None, out=None, mode="raise"):
    """Elements at ``indices`` along ``axis`` (of the flattened x when None)."""
    if mode != "raise":
        raise NotImplementedError("take: only mode='raise' is supported")
    if axis is None:
        return getitem(_ops.ravel(x), _as_index(indices))
    nd = len(shape_of(x))
    return getitem(x, _sl(nd, _axis(axis, nd), _as_index(indices)))


@method("index_select")
def index_select(x, dim, index):
    return take(x, index, axis=dim)


def _along(x, indices, axis, sizes):
    """x[i0, ..., indices, ..., in] with aranges on the other axes."""
    nd = len(sizes)
    idx = []
    for k in range(nd):
        if k == axis:
            idx.append(indices)
        else:
            shape = [1] * nd
            shape[k] = sizes[k]
            idx.append(np.arange(sizes[k]).reshape(shape))
    return getitem(x, tuple(idx))


@implements(np.take_along_axis)
def take_along_axis(x, indices, axis=-1):
    """Gather along ``axis`` with an index array of x's rank (np.take_along_axis)."""
    indices = _as_index(indices)
    if axis is None:
        x, indices, axis = _ops.ravel(x), _ops.ravel(indices), 0
    nd = len(shape_of(x))
    if len(shape_of(indices)) != nd:
        raise ValueError(f"take_along_axis: indices has {len(shape_of(indices))} dimensions "
                         f"but the array has {nd}; they must match")
    return _along(x, indices, _axis(axis, nd), shape_of(x))


@method("gather")
def gather(x, dim, index):
    """torch's gather: out[i][j] = x[i][index[i][j]] for dim=1 (index may be smaller)."""
    index = _as_index(index)
    nd = len(shape_of(x))
    if len(shape_of(index)) != nd:
        raise RuntimeError("gather: index tensor must have the same number of dimensions "
                           "as the input tensor")
    return _along(x, index, _axis(dim, nd), shape_of(index))


@implements(np.nonzero)
def nonzero(x):
    """Indices of the nonzero elements, one index array per dimension (no gradient)."""
    return bind(nonzero_p, x, ndim=len(shape_of(x)))


@method("nonzero")
def _nonzero_method(x, *, as_tuple=False):
    """torch's nonzero: an (n, ndim) index tensor, or a tuple with as_tuple=True."""
    idx = nonzero(x)
    return idx if as_tuple else _ops.stack(idx, axis=1)


@implements(np.argwhere)
def argwhere(x):
    return _ops.stack(nonzero(x), axis=1)


@method("masked_fill")
def masked_fill(x, mask, value):
    """value where mask is True, x elsewhere."""
    return where(mask, value, x)


@method("narrow")
def narrow(x, dim, start, length):
    nd = len(shape_of(x))
    dim = _axis(dim, nd)
    start = int(start) % shape_of(x)[dim] if int(start) < 0 else int(start)
    return getitem(x, _sl(nd, dim, slice(start, start + int(length))))
