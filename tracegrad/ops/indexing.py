"""Indexing: ``x[idx]``, out-of-place ``x[idx] = v``, gathers, nonzero.

An index is split into a static part, kept as the hashable attribute
``index`` (a tuple of items: ``("s", start, stop, step)`` for a slice,
``("i", k)`` for an int, ``("n",)`` for None, ``("e",)`` for Ellipsis,
``("a", j)`` for the j-th index array), and the index arrays, which are
operands.  A boolean mask becomes its ``nonzero()`` integer arrays, so the
shape of a result never depends on values that are only known at run time.  Rows: getitem, index_add (its transpose: a scatter that adds
repeated indices), setitem, nonzero, dynamic_slice and dynamic_update_slice.
take, take_along_axis, gather, index_select, masked_fill and narrow are
compositions.

Traced indices (a step counter or batch index that is an argument):

* A traced integer array or scalar is an index-array operand of getitem like
  any other, so NumPy's advanced-indexing rules (negative indices, where the
  advanced axes land, IndexError for an index out of range) hold at run time
  because the generated code is NumPy's own ``x[...]``.
* A traced *boolean* index has a data-dependent shape: TraceError naming
  ``np.where``.
* A slice whose bounds are traced, ``x[i * 10:(i + 1) * 10]``, has a length
  known at trace time only when ``stop - start`` is a constant: the bounds'
  graphs are read as affine forms of the traced values and subtracted.  It
  becomes a ``dynamic_slice`` row (traced start, static length); where NumPy
  would return fewer elements for the start met at run time, the generated
  code raises IndexError instead of returning a different array.
* ``data[idx]`` on a NumPy array cannot be intercepted (``ndarray.__getitem__``
  always returns an ndarray), so while a function is traced the NumPy arrays
  it names as globals, closure variables and defaults are handed to it as
  tracers of inputs read at call time where the caller can pass them
  (``lift``: tracegrad.frontend.captured), else as ``IndexableArray`` views:
  ndarrays in every respect (same memory, plain ndarray results) except
  that an index holding a traced value records a graph node
  (``indexable_constants``).
"""
from __future__ import annotations

import functools
import operator
import types

import numpy as np

from tracegrad.ops import runtime_numpy as _rt
from tracegrad.ops.primitives import Aval, bind, register
from tracegrad.ops._define import method, implements, _ops, ArrayMethods, NUMPY_FUNCTIONS
from tracegrad.ops.base import is_value, shape_of, shape_by_eval, zeros_like_value, where

__all__ = ["getitem", "setitem", "index_add", "take", "take_along_axis", "gather",
           "index_select", "nonzero", "argwhere", "masked_fill", "narrow", "dynamic_slice",
           "dynamic_update_slice"]


# --- the index encoding -----------------------------------------------------------------

def _bound(v):
    return None if v is None else operator.index(v)


def _is_tracer(v):
    return hasattr(v, "_trace")


def _traced_mask_error(mask):
    mask._misuse(
        f"a traced boolean array ({mask.dtype}{list(mask.shape)}) used as an index",
        "The result of x[mask] has as many elements as mask has True values, which is not "
        "known while tracing, and compiled code has fixed shapes. Keep the shape and zero "
        "the rest: np.where(mask, x, 0.0) (np.sum(np.where(mask, x, 0.0)) for a masked sum, "
        "np.sum(mask) for the count), or compute idx = np.flatnonzero(mask) outside and "
        "pass the integer array idx (one trace per number of selected elements).")


def parse_index(idx):
    """(static index spec, list of index-array operands) for a NumPy index."""
    if not isinstance(idx, tuple):
        idx = (idx,)
    spec, arrays = [], []
    for item in idx:
        item = _plain_index_item(item)
        if item is None:
            spec.append(("n",))
        elif item is Ellipsis:
            spec.append(("e",))
        elif isinstance(item, slice):
            spec.append(("s", _bound(item.start), _bound(item.stop), _bound(item.step)))
        elif isinstance(item, (int, np.integer)) and not isinstance(item, (bool, np.bool_)):
            spec.append(("i", int(item)))
        elif is_value(item) or isinstance(item, (np.ndarray, list, tuple, bool, np.bool_)):
            if isinstance(item, list) and any(is_value(e) for e in item):
                item = _ops.stack([e if is_value(e) else np.asarray(e) for e in item])
            a = item if is_value(item) else np.asarray(item)
            if a.dtype.kind == "f" and getattr(a, "size", 1) == 0 and not is_value(a):
                a = a.astype(np.intp)  # x[[]]: an empty list is an empty int index
            if a.dtype.kind not in "iub":
                raise IndexError(f"tensors used as indices must be integer or boolean, "
                                 f"got {a.dtype}")
            if a.dtype.kind == "b" and _is_tracer(a):
                _traced_mask_error(a)
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


def _setitem_v_vjp(g, out, x, v, *arrays, index):
    """v's cotangent: g at the written positions.  Where an index array
    repeats a position (``y[[1, 1]] = v``), NumPy keeps the last write, so
    only that occurrence of v receives g there (the others are overwritten)."""
    gv = bind(getitem_p, g, *arrays, index=index)
    if not arrays:   # a basic index selects each position once
        return gv
    sel = tuple(shape_of(gv))
    ids = np.arange(int(np.prod(sel, dtype=np.int64)), dtype=np.float64).reshape(sel)
    if not any(is_value(a) for a in arrays):
        stamp = np.full(tuple(shape_of(x)), -1.0)
        idx = build_index(index, arrays)
        stamp[idx] = ids
        last = stamp[idx] == ids
        return gv if last.all() else where(last, gv, 0.0)
    # traced index arrays: the same stamp, computed where the indices are known
    stamp = bind(setitem_p, np.full(tuple(shape_of(x)), -1.0), ids, *arrays, index=index)
    return where(bind(getitem_p, stamp, *arrays, index=index) == ids, gv, 0.0)


setitem_p = register(
    "setitem", lambda xp, x, v, *arrays, index: _rt._setitem(x, build_index(index, arrays), v),
    shape=lambda x, v, *arrays, index: Aval(x.shape, x.dtype),
    # x's cotangent is g with the overwritten positions zeroed; v's is g there
    # (at the last write of a repeated position)
    vjp=(lambda g, out, x, v, *arrays, index: bind(setitem_p, g, 0.0, *arrays, index=index),
         _setitem_v_vjp),
    jvp=_setitem_jvp,
    numpy=lambda names, index:
        f"_setitem({names[0]}, {_index_text(index, names[2:], False)}, {names[1]})",
    helpers=("_setitem",))

nonzero_p = register(
    "nonzero", lambda xp, x, ndim: tuple(xp.nonzero(x)),
    shape=shape_by_eval(lambda xp, x, ndim: tuple(np.nonzero(x))),
    n_out=lambda ndim: ndim, nondiff=True, save_inputs=False, numpy="np.nonzero({0})")




# --- slices with a traced start ----------------------------------------------------------------
# attrs: axis, delta = stop - start (static), step (static); the result has
# len(range(0, delta, step)) elements along axis whatever the start.

def _ds_len(delta, step):
    return len(range(0, delta, step))


def _ds_shape(x, start, axis, delta, step):
    if not isinstance(start, Aval) or start.shape != () or start.dtype.kind not in "iu":
        what = f"{start.dtype}{list(start.shape)}" if isinstance(start, Aval) else repr(start)
        raise TypeError(f"the start of a dynamic slice must be an integer scalar, got {what}")
    n, want = x.shape[axis], _ds_len(delta, step)
    if want > n:  # no start gives NumPy this many elements: fail now, not at every call
        raise IndexError(f"a slice of {want} elements along axis {axis}, which has length {n}: "
                         f"NumPy would return fewer for every start")
    return Aval(x.shape[:axis] + (want,) + x.shape[axis + 1:], x.dtype)


def _ds_vjp(g, out, x, start, axis, delta, step):
    # the transpose: g written into zeros at the same place
    return bind(dynamic_update_slice_p, zeros_like_value(x), g, start,
                axis=axis, delta=delta, step=step)


def _ds_batch(vals, flags, B, axis, delta, step):
    if flags[0] and not flags[1]:  # one start for the whole batch: shift the axis
        return bind(dynamic_slice_p, vals[0], vals[1], axis=axis + 1, delta=delta, step=step)
    return NotImplemented  # a batched start: the generic rule unrolls


dynamic_slice_p = register(
    "dynamic_slice",
    lambda xp, x, start, axis, delta, step:
        x[_rt._dynamic_slice_index(x, start, axis, delta, step)],
    shape=_ds_shape,
    vjp=(_ds_vjp, None),
    jvp=(lambda t, out, x, start, **a: bind(dynamic_slice_p, t, start, **a), None),
    numpy=lambda names, axis, delta, step:
        f"{names[0]}[_dynamic_slice_index({names[0]}, {names[1]}, {axis!r}, {delta!r}, "
        f"{step!r})]",
    helpers=("_dynamic_slice_index",), view=True, batch=_ds_batch,
    doc="x[start:start + delta:step] along axis, start known only at run time; "
        "IndexError where NumPy's result would be shorter")


def _dus_shape(x, v, start, axis, delta, step):
    _ds_shape(x, start, axis, delta, step)  # the same checks of start and length
    return Aval(x.shape, x.dtype)


def _dus_jvp(ts, out, x, v, start, **a):
    tx, tv = ts[0], ts[1]
    base = zeros_like_value(x) if tx is None else tx
    return bind(dynamic_update_slice_p, base, 0.0 if tv is None else tv, start, **a)


dynamic_update_slice_p = register(
    "dynamic_update_slice",
    lambda xp, x, v, start, axis, delta, step:
        _rt._setitem(x, _rt._dynamic_slice_index(x, start, axis, delta, step), v),
    shape=_dus_shape,
    # x's cotangent is g with the written slice zeroed; v's is g's slice
    vjp=(lambda g, out, x, v, start, **a: bind(dynamic_update_slice_p, g, 0.0, start, **a),
         lambda g, out, x, v, start, **a: bind(dynamic_slice_p, g, start, **a),
         None),
    jvp=_dus_jvp,
    numpy=lambda names, axis, delta, step:
        f"_setitem({names[0]}, _dynamic_slice_index({names[0]}, {names[2]}, {axis!r}, "
        f"{delta!r}, {step!r}), {names[1]})",
    helpers=("_setitem", "_dynamic_slice_index"),
    doc="a copy of x with v written at [start:start + delta:step] along axis")


_LINEAR_OPS = ("add", "sub", "mul", "neg")


def _affine(v, depth=0):
    """``v`` as an affine form ``({node id: coefficient}, constant)`` over the
    trace's values, read from its graph (add, sub, neg, multiplication by an
    integer constant; any other node is an atom); None for a non-integer."""
    if isinstance(v, (bool, np.bool_)):
        return None
    if isinstance(v, (int, np.integer)):
        return {}, int(v)
    if not _is_tracer(v):
        return None
    nodes = v._trace.nodes

    def rec(nid, depth):
        n = nodes[nid]
        if n.op == "const":
            c = n.value
            if isinstance(c, (int, np.integer)) and not isinstance(c, (bool, np.bool_)):
                return {}, int(c)
            if isinstance(c, np.ndarray) and c.shape == () and c.dtype.kind in "iu":
                return {}, int(c)
        elif n.op in _LINEAR_OPS and depth < 64:
            parts = [rec(i, depth + 1) for i in n.inputs]
            if n.op == "neg":
                (f, c), = parts
                return {k: -a for k, a in f.items()}, -c
            (fa, ca), (fb, cb) = parts
            if n.op == "mul":
                if fa and fb:
                    return {nid: 1}, 0  # a product of two traced values: an atom
                k, (f, c) = (cb, (fa, ca)) if not fb else (ca, (fb, cb))
                return {i: a * k for i, a in f.items()}, c * k
            sign = 1 if n.op == "add" else -1
            f = dict(fa)
            for i, a in fb.items():
                f[i] = f.get(i, 0) + sign * a
            return {i: a for i, a in f.items() if a}, ca + sign * cb
        return {nid: 1}, 0

    return rec(v.id, 0)


def _static_delta(start, stop):
    """``stop - start`` when the trace can prove it constant, else None."""
    a, b = _affine(start), _affine(stop)
    if a is None or b is None:
        return None
    diff = dict(b[0])
    for i, c in a[0].items():
        diff[i] = diff.get(i, 0) - c
    return None if any(diff.values()) else b[1] - a[1]


def _has_traced_bound(item):
    return isinstance(item, slice) and any(_is_tracer(b) for b in (item.start, item.stop,
                                                                   item.step))


def _axes_taken(item):
    """How many axes of the indexed array an index item consumes."""
    if item is None or item is Ellipsis:
        return 0
    if isinstance(item, (bool, np.bool_)):
        return 0
    if isinstance(item, (slice, int, np.integer)):
        return 1
    a = item if is_value(item) else np.asarray(item)
    return len(a.shape) if a.dtype.kind == "b" else 1


def _traced_slice(x, axis, item):
    """``x[..., start:stop:step]`` on ``axis`` with traced bounds: a
    dynamic_slice when stop - start is a constant."""
    start, stop, step = item.start, item.stop, item.step
    tracer = next(b for b in (start, stop, step) if _is_tracer(b))
    if _is_tracer(step):
        tracer._misuse("a slice with a traced step", "A step decides the result's length; "
                       "it must be a Python int (mark the argument static with "
                       "static_argnums= if it changes rarely).")
    step = 1 if step is None else operator.index(step)
    if step == 0:
        raise ValueError("slice step cannot be zero")
    delta = None if start is None or stop is None else _static_delta(start, stop)
    if delta is None:
        tracer._misuse(
            "a slice whose length depends on a traced value",
            "Compiled code has fixed shapes, so the length stop - start must be known while "
            "tracing. Write x[start:start + n] with a constant n (also "
            "x[i * n:(i + 1) * n]), or tg.dynamic_slice(x, start, n, axis=...).")
    if not _is_tracer(start):  # a constant start with a traced stop that cancels out
        start = stop - delta
    return bind(dynamic_slice_p, x, start, axis=axis, delta=delta, step=step)


def _getitem_traced_slices(x, items):
    """``x[items]`` where some slices have traced bounds: each of those is a
    dynamic_slice on its axis (a slice keeps its axis, so the rest of the
    index, with ``:`` in their place, applies afterwards unchanged)."""
    nd = len(shape_of(x))
    fill = nd - sum(_axes_taken(it) for it in items if it is not Ellipsis)
    axis, rest = 0, []
    for it in items:
        if _has_traced_bound(it):
            if axis >= nd:
                raise IndexError(f"too many indices for an array of {nd} dimensions")
            x = _traced_slice(x, axis, it)
            it = slice(None)
        axis += fill if it is Ellipsis else _axes_taken(it)
        rest.append(it)
    rest = tuple(rest)
    if all(isinstance(it, slice) and it == slice(None) for it in rest):
        return x
    return getitem(x, rest)


# --- the functional API -----------------------------------------------------------------------

def getitem(x, idx):
    """``x[idx]`` for any NumPy index; repeated integer indices add their
    gradients."""
    t = type(idx)
    if t is slice and not _has_traced_bound(idx):  # the common x[a:b]: no general parsing
        return bind(getitem_p, x, index=(("s", _bound(idx.start), _bound(idx.stop),
                                           _bound(idx.step)),))
    if t is int:
        return bind(getitem_p, x, index=(("i", idx),))
    items = idx if t is tuple else (idx,)
    if any(_has_traced_bound(it) for it in items):
        return _getitem_traced_slices(x, items)
    spec, arrays = parse_index(idx)
    return bind(getitem_p, x, *arrays, index=spec)


def setitem(x, idx, value):
    """A new value equal to a copy of ``x`` with ``[idx] = value``;
    differentiable with respect to both ``x`` and ``value``."""
    spec, arrays = parse_index(idx)
    if isinstance(value, (list, tuple)):
        value = np.asarray(value)
    return bind(setitem_p, x, value, *arrays, index=spec)


def _plain_index_item(it):
    """A ``range`` indexes as the integer array it spells (NumPy's rule); a
    constant traced array (one the function created from constants) as its
    value."""
    if isinstance(it, range):
        return np.arange(it.start, it.stop, it.step)
    if _is_tracer(it):
        v = it.known_value()
        if v is not None:
            return np.asarray(v, dtype=it.dtype)
    return it


def plain_index(idx):
    if isinstance(idx, tuple):
        return tuple(_plain_index_item(it) for it in idx)
    return _plain_index_item(idx)


def holds_value(obj):
    """Does a (nested) list or tuple hold a tracegrad value?"""
    if isinstance(obj, (list, tuple)):
        return any(holds_value(o) for o in obj)
    return is_value(obj)


def stack_values(seq):
    """A nested list of values and numbers as one value (np.array of them)."""
    if isinstance(seq, (list, tuple)):
        return _ops.stack([stack_values(s) for s in seq])
    return seq


def assign_index(x, idx, value):
    """What ``x[idx] = value`` makes of ``x`` in NumPy: a copy of ``x`` with
    ``value`` cast to its dtype and broadcast into ``x[idx]``."""
    idx = plain_index(idx)
    if isinstance(value, MaskedSelection):     # y[mask] = <an expression of x[mask]>
        m = idx[0] if isinstance(idx, tuple) and len(idx) == 1 else idx
        if not (_is_tracer(m) and m.dtype == np.bool_ and m.shape
                and tuple(m.shape) == tuple(shape_of(x))[:len(m.shape)]):
            value._refuse("y[index] = x[mask] with an index other than the same traced mask")
        return value._write_into(x, m)
    if isinstance(value, (list, tuple)):
        value = stack_values(value) if holds_value(value) else np.asarray(value)
    vdtype = np.result_type(value) if not is_value(value) else value.dtype
    if vdtype != x.dtype:
        if vdtype.kind == "c" and x.dtype.kind != "c":
            raise TypeError(f"item assignment of a complex value into a {x.dtype} array "
                            f"would discard the imaginary part; write np.real(value)")
        value = value.astype(x.dtype) if is_value(value) else np.asarray(value, x.dtype)
    items = idx if isinstance(idx, tuple) else (idx,)
    masks = [it for it in items if _is_tracer(it) and it.dtype == np.bool_ and it.shape]
    if masks:
        mask = masks[0]
        if len(items) != 1 or tuple(mask.shape) != tuple(shape_of(x))[:len(mask.shape)]:
            _traced_mask_error(mask)
        n = int(np.prod(shape_of(value))) if is_value(value) else np.size(value)
        if n != 1:
            mask._misuse(
                f"y[mask] = value with a traced boolean mask and a value of {n} elements",
                "Which elements the value's entries go to depends on the mask's True count, "
                "which is not known while tracing. Write the whole array: "
                "y = np.where(mask, new_values_of_full_shape, y).")
        m = mask.reshape(tuple(mask.shape) + (1,) * (len(shape_of(x)) - len(mask.shape)))
        v = value.reshape(()) if is_value(value) else np.asarray(value).reshape(())
        return where(m, v, x)
    return setitem(x, idx, value)


class MaskedSelection:
    """``x[mask]`` for a traced boolean ``mask`` (issue 24): its shape
    depends on the mask's values, so it is kept lazily as the full-shape
    array ``full`` whose elements under the mask are the selection's.  What
    keeps the selection's positions is supported:

    * elementwise arithmetic and ufuncs with numbers, 0-d values, values
      that broadcast over the trailing axes, or another selection by the
      same mask (``x[mask] * 2``, ``np.exp(x[mask])``), and the in-place
      forms (``y[mask] *= a`` runs ``tmp = y[mask]; tmp *= a; y[mask] = tmp``);
    * assigning it back: ``y[mask] = sel`` is ``np.where(mask, sel_full, y)``;
    * ``sel.sum()`` / ``np.sum(sel)``: ``np.sum(np.where(mask, full, 0))``.

    Anything else raises the traced-mask error.  Elements outside the mask
    are 1 before each operation, so nothing there overflows or poisons a
    gradient."""
    __slots__ = ("mask", "full", "_rest")

    def __init__(self, full, mask):
        self.full = full
        self.mask = mask
        self._rest = tuple(shape_of(full))[len(mask.shape):]

    @property
    def dtype(self):
        return self.full.dtype

    @property
    def ndim(self):
        return 1 + len(self._rest)

    def _m(self):
        m = self.mask
        return m.reshape(tuple(m.shape) + (1,) * len(self._rest)) if self._rest else m

    def _safe(self):
        return where(self._m(), self.full, np.ones((), self.full.dtype))

    def _operand(self, other, what):
        if isinstance(other, MaskedSelection):
            if other.mask is not self.mask and other.mask.id != self.mask.id:
                self._refuse(f"{what} of selections by two different traced masks")
            return other._safe()
        shp = tuple(shape_of(other)) if is_value(other) else np.shape(other)
        rest = self._rest
        if isinstance(other, (list, tuple)):
            other = np.asarray(other)
        if len(shp) > 1 + len(rest) or (len(shp) == 1 + len(rest) and shp[0] != 1):
            self._refuse(f"{what} of a selection x[mask] (its length depends on the traced "
                         f"mask) and an array of shape {shp}")
        if len(shp) == 1 + len(rest):
            other = other.reshape(shp[1:])
            shp = shp[1:]
        try:
            np.broadcast_shapes(shp, rest)
        except ValueError:
            self._refuse(f"{what} of a selection x[mask] with trailing shape {rest} and an "
                         f"array of shape {shp}")
        return other

    def _refuse(self, what=None):
        if what is None:
            _traced_mask_error(self.mask)
        m = self.mask
        self.mask._misuse(
            f"{what} (x[mask] with a traced boolean array ({m.dtype}{list(m.shape)}) used as "
            f"an index)",
            "x[mask] with a traced mask is kept lazily (its length depends on the mask's "
            "values): elementwise arithmetic with numbers, 0-d values or another x[mask] of "
            "the same mask, y[mask] op= value, y[mask] = <that> and .sum() work. Otherwise "
            "keep the shape: np.where(mask, x, 0.0).")

    def _binary(self, fn, other, swap=False, what="arithmetic"):
        o = self._operand(other, what)
        a = self._safe()
        return MaskedSelection(fn(o, a) if swap else fn(a, o), self.mask)

    def _inplace(self, fn, other, symbol):
        r = self._binary(fn, other, what=f"in-place '{symbol}'")
        if np.dtype(r.dtype) != np.dtype(self.dtype):
            if not np.can_cast(r.dtype, self.dtype, "same_kind"):
                raise TypeError(f"Cannot cast ufunc '{symbol[:-1]}' output from "
                                f"{np.dtype(r.dtype)!r} to {np.dtype(self.dtype)!r} with "
                                f"casting rule 'same_kind'")
            r.full = _ops.astype(r.full, self.dtype)
        self.full = r.full
        return self

    def _write_into(self, y, mask):
        """y[mask] = self, as a new value of y."""
        if mask is not self.mask and mask.id != self.mask.id:
            self._refuse("y[mask] = x[mask2] with two different traced masks")
        if tuple(shape_of(y)) != tuple(shape_of(self.full)):
            self._refuse(f"y[mask] = x[mask] with y of shape {tuple(shape_of(y))} and x of "
                         f"shape {tuple(shape_of(self.full))}")
        v = self.full
        if np.dtype(v.dtype) != np.dtype(y.dtype):
            if v.dtype.kind == "c" and y.dtype.kind != "c":
                raise TypeError(f"item assignment of a complex value into a {y.dtype} array "
                                f"would discard the imaginary part; write np.real(value)")
            v = _ops.astype(v, y.dtype)
        return where(self._m(), v, y)

    def sum(self, axis=None, dtype=None, out=None, keepdims=False, **kw):
        if axis is not None or out is not None or keepdims or kw:
            self._refuse("x[mask].sum(axis=, out=, keepdims=...)")
        r = _ops.sum(where(self._m(), self.full, np.zeros((), self.full.dtype)))
        return r if dtype is None else _ops.astype(r, dtype)

    def __array_function__(self, func, types, args, kwargs):
        if func is np.sum and args and args[0] is self and len(args) == 1:
            return self.sum(**kwargs)
        self._refuse(f"np.{getattr(func, '__name__', func)} of x[mask]")

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if method != "__call__" or kwargs or ufunc.nout != 1:
            self._refuse(f"np.{ufunc.__name__}.{method} of x[mask]")
        if ufunc.nin == 1:
            return MaskedSelection(ufunc(self._safe()), self.mask)
        if ufunc.nin == 2 and len(inputs) == 2:
            if inputs[0] is self:
                return self._binary(ufunc, inputs[1])
            return self._binary(ufunc, inputs[0], swap=True)
        self._refuse(f"np.{ufunc.__name__} of x[mask]")

    def __array__(self, dtype=None, copy=None):
        self._refuse()

    def __getattr__(self, name):
        if name.startswith("_") or name in ("grad_fn", "requires_grad"):
            raise AttributeError(f"'MaskedSelection' object has no attribute {name!r}")
        self._refuse(f"x[mask].{name}")

    def __bool__(self):
        self._refuse()

    def __len__(self):
        self._refuse()

    def __iter__(self):
        self._refuse()

    def __getitem__(self, idx):
        self._refuse("indexing x[mask][...]")

    def __setitem__(self, idx, value):
        self._refuse("item assignment into x[mask][...]")

    def __neg__(self):
        return MaskedSelection(-self._safe(), self.mask)

    def __pos__(self):
        return MaskedSelection(+self._safe(), self.mask)

    def __abs__(self):
        return MaskedSelection(abs(self._safe()), self.mask)


def _masked_ops():
    for sym, op in (("add", operator.add), ("sub", operator.sub), ("mul", operator.mul),
                    ("truediv", operator.truediv), ("floordiv", operator.floordiv),
                    ("mod", operator.mod), ("pow", operator.pow)):
        def fwd(self, other, _op=op):
            return self._binary(_op, other)

        def rev(self, other, _op=op):
            return self._binary(_op, other, swap=True)

        def inp(self, other, _op=op, _s=sym):
            return self._inplace(_op, other, {"add": "+=", "sub": "-=", "mul": "*=",
                                              "truediv": "/=", "floordiv": "//=", "mod": "%=",
                                              "pow": "**="}[_s])
        setattr(MaskedSelection, f"__{sym}__", fwd)
        setattr(MaskedSelection, f"__r{sym}__", rev)
        setattr(MaskedSelection, f"__i{sym}__", inp)
    for sym in ("lt", "le", "gt", "ge", "eq", "ne", "matmul", "rmatmul", "and", "or", "xor"):
        def refuse(self, other, _s=sym):
            self._refuse(f"'{_s}' of x[mask]")
        setattr(MaskedSelection, f"__{sym}__", refuse)


_masked_ops()


def masked_selection(x, idx):
    """``x[idx]`` as a MaskedSelection where ``idx`` is one traced boolean
    array over x's leading axes, else None."""
    if _is_tracer(idx) and idx.dtype == np.bool_ and idx.shape and _is_tracer(x) and \
            idx.known_value() is None and \
            tuple(idx.shape) == tuple(shape_of(x))[:len(idx.shape)]:
        return MaskedSelection(x, idx)
    return None


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
    """Elements at ``indices`` along ``axis`` (of the flattened x when None);
    ``mode='clip'`` clips the indices into range (negative ones to 0, as
    NumPy), ``'wrap'`` takes them modulo the axis length."""
    if out is not None:
        raise TypeError("tracegrad does not support np.take(..., out=): a tracegrad value cannot "
                        "be written into an array; assign the result instead")
    if axis is None:
        x, axis = _ops.ravel(x), 0
    nd = len(shape_of(x))
    axis = _axis(axis, nd)
    indices = _index_mode(_as_index(indices), shape_of(x)[axis], mode, "take")
    return getitem(x, _sl(nd, axis, indices))


def _index_mode(indices, n, mode, name):
    """NumPy's ``mode=`` of take/choose applied to the indices of an axis of
    length n: 'raise' leaves them (out of range is an IndexError), 'clip'
    clips them to [0, n-1], 'wrap' takes them modulo n."""
    modes = {"raise": "raise", "r": "raise", "clip": "clip", "c": "clip", "wrap": "wrap",
             "w": "wrap"}
    m = modes.get(mode) if isinstance(mode, str) else None
    if m is None:
        raise ValueError(f"clipmode must be one of 'clip', 'raise', or 'wrap' (got {mode!r})")
    if m == "raise":
        return indices
    if not is_value(indices):
        return np.clip(indices, 0, n - 1) if m == "clip" else np.mod(indices, n)
    if m == "clip":
        return _ops.clip(indices, 0, n - 1)
    return _ops.remainder(indices, n)


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
        if len(shape_of(indices)) != 1:
            raise ValueError("when axis=None, `indices` must have a single dimension.")
        x, axis = _ops.ravel(x), 0
    nd = len(shape_of(x))
    if len(shape_of(indices)) != nd:
        raise ValueError(f"take_along_axis: indices has {len(shape_of(indices))} dimensions "
                         f"but the array has {nd}; they must match")
    return _along(x, indices, _axis(axis, nd), shape_of(x))


@implements(np.choose)
def choose(a, choices, out=None, mode="raise"):
    """np.choose: ``choices[a[i]][i]`` elementwise, a and every choice
    broadcast together; ``mode=`` as take's ('raise': an entry of a out of
    range is an error, 'clip', 'wrap').  Composed of stack and
    take_along_axis, so the gradient reaches the chosen entries."""
    if out is not None:
        raise TypeError("tracegrad does not support np.choose(..., out=): a tracegrad value "
                        "cannot be written into an array; assign the result instead")
    if is_value(choices) or isinstance(choices, np.ndarray):
        choices = [choices[i] for i in range(shape_of(choices)[0])]
    choices = [c if is_value(c) else np.asarray(c) for c in choices]
    n = len(choices)
    idx = _as_index(a)
    if not is_value(idx):
        if idx.dtype.kind not in "iub":
            raise TypeError(f"Cannot cast array data from {idx.dtype!r} to dtype('int64') "
                            f"according to the rule 'safe'")
        if mode in ("raise", "r") and idx.size and (idx.min() < 0 or idx.max() >= n):
            raise ValueError("invalid entry in choice array")
    shape = np.broadcast_shapes(tuple(shape_of(idx)), *(tuple(shape_of(c)) for c in choices))
    idx = _index_mode(idx, n, mode, "choose")
    idx = _ops.broadcast_to(idx, shape) if is_value(idx) else np.broadcast_to(idx, shape)
    stacked = _ops.stack([_ops.broadcast_to(c, shape) if is_value(c) else np.broadcast_to(c, shape)
                          for c in choices])
    return _along(stacked, _ops.expand_dims(idx, 0) if is_value(idx) else idx[None], 0,
                  shape_of(stacked))[0]


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
    if _is_tracer(x):
        x._misuse("nonzero/argwhere of a traced array",
                  "How many indices it returns depends on the values, which are not known "
                  "while tracing, and compiled code has fixed shapes. Use np.where(cond, a, b) "
                  "to select elementwise, or compute the indices outside the function and "
                  "pass them as an integer array argument.")
    return bind(nonzero_p, x, ndim=len(shape_of(x)))


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


def _static_int(v, what):
    if _is_tracer(v) or hasattr(v, "grad_fn"):
        raise TypeError(f"dynamic_slice: {what} must be a Python int (it decides the shape), "
                        f"got a {type(v).__name__}")
    return operator.index(v)


def dynamic_slice(x, start, size, axis=0):
    """``x[start:start + size]`` along ``axis``, where ``start`` may be traced
    (a step counter): one compiled function for every start.  NumPy would
    return fewer than ``size`` elements for a start near the end; compiled
    code raises IndexError there instead."""
    size = _static_int(size, "size")
    nd = len(shape_of(x))
    return bind(dynamic_slice_p, x, start, axis=_axis(_static_int(axis, "axis"), nd),
                delta=size, step=1)


def dynamic_update_slice(x, update, start, axis=0):
    """A copy of ``x`` with ``update`` written at ``[start:start + n]`` along
    ``axis`` (n = update's length there), differentiable in ``x`` and
    ``update``; ``start`` may be traced."""
    nd = len(shape_of(x))
    axis = _axis(_static_int(axis, "axis"), nd)
    ushape = shape_of(update)
    if len(ushape) != nd:
        raise ValueError(f"dynamic_update_slice: update has {len(ushape)} dimensions, the "
                         f"array {nd}; they must match (the update's length along axis "
                         f"{axis} is the slice's)")
    return bind(dynamic_update_slice_p, x, update, start, axis=axis, delta=ushape[axis], step=1)


# --- NumPy arrays a traced function names: indexable by traced values ---------------------------

def _holds_tracer(idx):
    items = idx if isinstance(idx, tuple) else (idx,)
    return any(_is_tracer(it) or _has_traced_bound(it)
               or (isinstance(it, list) and any(_is_tracer(e) for e in it)) for it in items)


def _plain(v):
    return v.view(np.ndarray) if isinstance(v, IndexableArray) else v


def _plain_args(args):
    return tuple(type(a)(_plain(e) for e in a) if type(a) in (list, tuple) else _plain(a)
                 for a in args)


class IndexableArray(np.ndarray):
    """A view of a NumPy array that a traced function names (a global, a
    closure variable, a default), handed to it while it is traced.

    ``ndarray.__getitem__`` cannot return a traced value, so ``data[idx]``
    with a traced ``idx`` would fail; this view records a getitem (or
    dynamic_slice) node with the array as a constant instead.  Everything
    else is NumPy's: same memory, and computations give plain ndarrays."""

    def __getitem__(self, idx):
        if _holds_tracer(idx):
            return getitem(self.view(np.ndarray), idx)
        return super().__getitem__(idx)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if any(isinstance(a, ArrayMethods) for a in inputs):
            return NotImplemented  # the tracer's (or Tensor's) override records the op
        if "out" in kwargs:
            kwargs["out"] = _plain_args(kwargs["out"])
        return getattr(ufunc, method)(*_plain_args(inputs), **kwargs)

    def __array_function__(self, func, types, args, kwargs):
        if any(not issubclass(t, np.ndarray) for t in types):
            return NotImplemented  # a tracer among the dispatched arguments: its override
        if any(_is_tracer(a) for a in args) or any(_is_tracer(a) for a in kwargs.values()):
            fn = NUMPY_FUNCTIONS.get(func)  # a traced non-dispatched argument: np.take(data, i)
            if fn is not None:
                return fn(*args, **kwargs)
        return func(*_plain_args(args), **{k: _plain(v) for k, v in kwargs.items()})

    def __repr__(self):
        return repr(self.view(np.ndarray))

    def __reduce__(self):  # pickles (and copies) as the plain array it stands for
        return self.view(np.ndarray).__reduce__()


def _indexable(v, memo, desc=None):
    stand_in = memo["substitute"](v) if memo.get("substitute") is not None else None
    if stand_in is not None:
        return stand_in
    if type(v) is types.FunctionType and (
            (memo.get("lift") is not None and _draws_captured(v, memo))
            or (memo.get("substitute") is not None and _names_creators(v, memo))):
        return _helper_with_captured(v, memo)
    if type(v) is types.FunctionType and memo.get("functions") is not None:
        return _traced_function(v, memo)
    lift = memo.get("lift")
    if type(v) is not np.ndarray and (lift is None or not _liftable_object(v)):
        return v
    w = memo.get(id(v))
    if w is None:
        # captured state read at call time: the tracer of an implicit input
        # (tracegrad.frontend.captured), else the view of a constant
        got = lift(v, desc or "a captured value") if lift is not None else None
        if got is None:
            if type(v) is not np.ndarray:
                return v
            got = v.view(IndexableArray)
        w = memo[id(v)] = (got, v)  # keep v alive: ids stay unique
    return w[0]


_GENERATORS = (np.random.Generator, np.random.RandomState)


def _liftable_object(v):
    """A random generator or an eager Tensor (captured state the lift hook
    may turn into an input)."""
    return type(v) in _GENERATORS or (hasattr(v, "grad_fn") and hasattr(v, "_data"))


def _draws_captured(f, memo):
    """Does ``f`` name a random generator in its globals, closure or defaults
    (so its draws must be recorded, not made while tracing)?"""
    key = ("draws", id(f))
    got = memo.get(key)
    if got is None:
        got = memo[key] = _names_generator(f)
    return got


def _names_generator(f):
    if (f.__module__ or "").split(".")[0] in ("numpy", "scipy", "tracegrad"):
        return False
    for cell in f.__closure__ or ():
        if _cell_holds(cell, _GENERATORS):
            return True
    if any(type(d) in _GENERATORS for d in f.__defaults__ or ()):
        return True
    g = f.__globals__
    return any(type(g.get(n)) in _GENERATORS for n in _code_names(f.__code__))


def _code_names(code):
    names = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names |= _code_names(c)
    return names


# numpy's array creators that tracegrad.frontend.created stands in for
CREATOR_NAMES = ("zeros", "ones", "empty", "full", "zeros_like", "ones_like", "empty_like",
                 "full_like", "copy", "array", "asarray")
_LIBRARIES = ("numpy", "scipy", "tracegrad")


def _code_names(code):
    names = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names |= _code_names(c)
    return names


def _names_creators(f, memo):
    """Is ``f`` the user's helper that creates arrays (np.zeros, np.array...)?
    Its copy sees the stand-ins that make them followed arrays."""
    key = ("creates", id(f))
    got = memo.get(key)
    if got is None:
        module = (getattr(f, "__module__", None) or "").split(".", 1)[0]
        got = memo[key] = module not in _LIBRARIES and (bool(
            _code_names(f.__code__).intersection(CREATOR_NAMES)) or _names_stand_in(f, memo))
    return got


def _names_stand_in(f, memo):
    """Does ``f`` name, as a global or closure variable, something besides
    numpy that ``memo["substitute"]`` stands in for (SciPy's modules and
    functions: tracegrad.frontend.scipy_calls)?  Its copy sees the stand-ins."""
    g = f.__globals__
    values = [g[n] for n in _code_names(f.__code__) if n in g]
    for c in f.__closure__ or ():
        try:
            values.append(c.cell_contents)
        except ValueError:  # an empty cell
            pass
    return any(v is not np and memo["substitute"](v) is not None for v in values)


def _helper_with_captured(f, memo):
    """A helper of the traced function that draws from a generator it
    captured, or that creates arrays: a copy of it that sees the
    generator's stand-in (the helper would otherwise draw while tracing,
    which tracing refuses) and numpy's followed creators.  Only such helpers
    are copied: every other function keeps its identity."""
    w = memo.get(id(f))
    if w is None or w[0] is w[1]:
        if memo.get("functions") is not None and w is None:
            memo["functions"].enter(f)       # its loops are rewritten as the caller's
        w = memo[id(f)] = (_with_indexable(f, memo, 1), f)
    return w[0]


def _traced_function(f, memo):
    """A function the traced function names as a global or a closure
    variable: handed once to ``memo["functions"].enter`` (tracegrad.frontend.trace
    passes the loop rewrite, which rewrites its loops in place until the
    call ends); the function itself is returned."""
    if id(f) not in memo:
        memo[id(f)] = (f, f)
        memo["functions"].enter(f)
    return f


# ``__import__`` for the functions traced or run with stand-ins (installed by
# tracegrad.frontend.scipy_calls: ``import scipy.linalg`` in the function
# body gives SciPy's modules as the stand-ins module-level names give)
IMPORT_HOOK = None


class _IndexableGlobals(dict):
    """A function's globals as the function sees them while traced: reads
    give NumPy arrays as IndexableArray views (the same view every time);
    the module's dict itself is never changed.  (Holds only __builtins__;
    ``LOAD_GLOBAL`` on a dict subclass goes through ``__getitem__``.)"""

    def __init__(self, base, memo):
        built = base.get("__builtins__", __builtins__)
        if IMPORT_HOOK is not None and memo.get("substitute") is not None:
            # an import statement inside the function gives the stand-ins too
            built = dict(built if isinstance(built, dict) else vars(built),
                         __import__=IMPORT_HOOK)
        super().__init__(__builtins__=built, __name__=base.get("__name__"))
        self._base, self._memo = base, memo

    def __getitem__(self, key):
        if dict.__contains__(self, key) and key != "__name__":
            return dict.__getitem__(self, key)  # a global the traced function assigned
        return _indexable(self._base[key], self._memo, key)

    def get(self, key, default=None):
        try:
            return self[key]
        except KeyError:
            return default

    def __contains__(self, key):
        return dict.__contains__(self, key) or key in self._base

    def write_back(self):
        """Globals the traced function assigned (``global n; n += 1``) reach
        the module, as they would without tracing; an array view stands for
        the array it views."""
        views = {id(e[0]): e[1] for e in self._memo.values()
                 if type(e) is tuple and e[0] is not e[1]}
        for key, value in dict.items(self):
            if key not in ("__builtins__", "__name__"):
                self._base[key] = views.get(id(value), value)


def _with_indexable(fn, memo, depth=0):
    if depth > 4:
        return fn
    if isinstance(fn, types.MethodType):
        f = _with_indexable(fn.__func__, memo, depth + 1)
        return fn if f is fn.__func__ else types.MethodType(f, fn.__self__)
    if isinstance(fn, functools.partial):
        f = _with_indexable(fn.func, memo, depth + 1)
        return functools.partial(f, *[_indexable(a, memo, f"bound argument {i}")
                                      for i, a in enumerate(fn.args)],
                                 **{k: _indexable(v, memo, k) for k, v in fn.keywords.items()})
    if not isinstance(fn, types.FunctionType):
        return fn
    closure = fn.__closure__
    if closure:  # new cells only for arrays (and functions the loop rewrite replaces):
        # nonlocal counters keep their own cell
        closure = tuple(_indexable_cell(c, memo, name)
                        for c, name in zip(closure, fn.__code__.co_freevars))
    scope = _IndexableGlobals(fn.__globals__, memo)
    memo.setdefault("scopes", []).append(scope)
    code = fn.__code__
    params = code.co_varnames[:code.co_argcount]
    defaults = fn.__defaults__ and tuple(
        _indexable(d, memo, p) for d, p in zip(fn.__defaults__,
                                               params[len(params) - len(fn.__defaults__):]))
    new = types.FunctionType(fn.__code__, scope, fn.__name__, defaults, closure)
    new.__kwdefaults__ = fn.__kwdefaults__ and {k: _indexable(v, memo, k)
                                                for k, v in fn.__kwdefaults__.items()}
    new.__qualname__, new.__module__, new.__doc__ = fn.__qualname__, fn.__module__, fn.__doc__
    new.__dict__.update(fn.__dict__)
    new.__wrapped__ = fn
    return new


def _indexable_cell(cell, memo, name=None):
    if _cell_holds_array(cell) or (memo.get("lift") is not None and _cell_holds_liftable(cell)):
        return types.CellType(_indexable(cell.cell_contents, memo, name))
    try:
        f = cell.cell_contents
    except ValueError:  # an empty cell (a variable assigned later)
        return cell
    if memo.get("substitute") is not None and memo["substitute"](f) is not None:
        return types.CellType(memo["substitute"](f))
    if type(f) is types.FunctionType and (
            (memo.get("lift") is not None and _draws_captured(f, memo))
            or (memo.get("substitute") is not None and _names_creators(f, memo))):
        return types.CellType(_helper_with_captured(f, memo))
    if memo.get("functions") is not None and type(f) is types.FunctionType:
        _traced_function(f, memo)
    return cell


def _cell_holds_array(cell):
    return _cell_holds(cell, (np.ndarray,))


def _cell_holds(cell, types_):
    try:
        return type(cell.cell_contents) in types_
    except ValueError:  # an empty cell (a variable assigned later)
        return False


def _cell_holds_liftable(cell):
    try:
        return _liftable_object(cell.cell_contents)
    except ValueError:
        return False


def indexable_constants(fn, functions=None, lift=None, substitute=None):
    """``fn`` as the tracer calls it: the NumPy arrays it names as globals,
    closure variables and defaults (and a partial's bound arguments) are
    IndexableArray views, so ``data[i]``, ``data[i * n:(i + 1) * n]`` and
    ``np.take(data, idx)`` record graph nodes when the index is traced.
    Arrays reached in other ways (an attribute, another module) stay plain
    ndarrays: pass those as arguments to index them by traced values.
    ``functions``: ``enter(f)`` is called once for each function ``fn``
    names as a global or closure variable, ``restore()`` when the call ends
    (tracegrad.frontend.trace passes the loop rewrite's ``CalledFunctions``).
    ``lift(value, name)``: the traced stand-in of a captured array or random
    generator read at call time (tracegrad.frontend.captured), or None to
    keep it a constant.  ``substitute(value)``: a stand-in for a global or
    closure value (tracegrad.frontend.created: numpy's array creators), or None."""
    memo = {"functions": functions, "scopes": [], "lift": lift, "substitute": substitute}
    traced = _with_indexable(fn, memo)
    scopes = memo["scopes"]
    if not scopes and functions is None:
        return fn

    def call(*args, **kwargs):
        try:
            return traced(*args, **kwargs)
        finally:
            for scope in scopes:
                scope.write_back()
            if functions is not None:
                functions.restore()
    return call
