"""Shape manipulation: joining, splitting, reordering, padding, sorting.

Rows: concatenate, split, flip, roll, tile, repeat, pad, sort, argsort,
argpartition.  Everything else (flatten, squeeze, stack, rot90, diff, ...)
is a composition of these and of reshape/transpose/getitem, so it needs no
rule of its own.
"""
from __future__ import annotations

import builtins as _builtins
import collections

import numpy as np

from tracegrad.ops.primitives import Aval, bind, register, result_dtype
from tracegrad.ops._define import method, implements, axis_arg, _ops
from tracegrad.ops.runtime_numpy import (_invert_permutation, _partition_positions, _sorted_by,
                                         _unpermute_along)
from tracegrad.ops.base import (reshape, transpose, sub, neg, is_value, shape_of, shape_by_eval,
                                zeros_like_value, astype, sum, broadcast_to)

__all__ = ["flatten", "ravel", "squeeze", "unsqueeze", "expand_dims", "moveaxis", "movedim",
           "concatenate", "concat", "cat", "stack", "hstack", "vstack", "column_stack",
           "split", "array_split", "chunk", "flip", "fliplr", "flipud", "roll", "rot90", "tile",
           "repeat", "repeat_interleave", "pad", "diff", "sort", "argsort", "partition",
           "argpartition", "atleast_1d", "atleast_2d", "atleast_3d"]


def _norm_axis(axis, ndim, what="axis"):
    a = int(axis)
    if not -ndim <= a < _builtins.max(ndim, 1):
        raise IndexError(f"{what} {a} is out of range for a tensor of {ndim} dimensions "
                         f"(expected a value in [{-ndim}, {ndim - 1}])")
    return a % _builtins.max(ndim, 1)


_DEFAULT = object()  # "axis not given", distinct from NumPy's meaningful axis=None


def _axis_or_dim(axis, dim, default):
    if axis is _DEFAULT:
        return default if dim is None else dim
    return axis_arg(axis, dim)


def _sl(ndim, axis, s):
    """An index selecting slice ``s`` along ``axis`` and everything elsewhere."""
    return (slice(None),) * axis + (s,) + (slice(None),) * (ndim - axis - 1)


# --- concatenate ---------------------------------------------------------------------

def _concat_shape(*xs, axis):
    shape = list(xs[0].shape)
    shape[axis] = _builtins.sum(x.shape[axis] for x in xs)
    return Aval(tuple(shape), result_dtype(*xs))


def _concat_vjp(g, out, *xs, axis):
    # each operand's cotangent is its slab of g
    cts, start = [], 0
    for x in xs:
        n = x.shape[axis]
        cts.append(g[_sl(len(g.shape), axis, slice(start, start + n))])
        start += n
    return tuple(cts)


def _concat_jvp(ts, out, *xs, axis):
    return concatenate([zeros_like_value(x) if t is None else t for t, x in zip(ts, xs)],
                       axis=axis)


concatenate_p = register(
    "concatenate", lambda xp, *xs, axis: xp.concatenate(xs, axis=axis), shape=_concat_shape,
    vjp=_concat_vjp, jvp=_concat_jvp, save_inputs=False,
    numpy=lambda names, axis: f"np.concatenate([{', '.join(names)}], axis={axis!r})")


# --- split -------------------------------------------------------------------------------

def _split_vjp(g, out, x, axis, indices):
    bounds = (0,) + tuple(indices) + (x.shape[axis],)
    parts = []
    for gi, a, b in zip(g, bounds[:-1], bounds[1:]):
        if gi is None:  # an output nobody used: zeros of its shape
            shape = list(x.shape)
            shape[axis] = b - a
            gi = np.zeros(shape, x.dtype)
        parts.append(gi)
    return (concatenate(parts, axis=axis),)


split_p = register(
    "split", lambda xp, x, axis, indices: tuple(xp.split(x, list(indices), axis=axis)),
    shape=shape_by_eval(lambda xp, x, axis, indices: tuple(xp.split(x, list(indices), axis=axis))),
    n_out=lambda axis, indices: len(indices) + 1,
    vjp=_split_vjp, jvp=lambda ts, out, x, axis, indices: bind(split_p, ts[0], axis=axis,
                                                                  indices=indices),
    save_inputs=False, view=True,
    numpy="tuple(np.split({0}, {indices}, axis={axis}))")


# --- flips, rolls, tiling ----------------------------------------------------------------

flip_p = register(
    "flip", lambda xp, x, axes: xp.flip(x, axis=axes),
    shape=lambda x, axes: x,
    vjp=(lambda g, out, x, axes: bind(flip_p, g, axes=axes),),
    jvp=(lambda t, out, x, axes: bind(flip_p, t, axes=axes),),
    numpy="np.flip({0}, axis={axes})", save_inputs=False, view=True)


def _neg_shift(shift):
    return tuple(-s for s in shift) if isinstance(shift, tuple) else -shift


roll_p = register(
    "roll", lambda xp, x, shift, axis: xp.roll(x, shift, axis=axis),
    shape=lambda x, shift, axis: x,
    vjp=(lambda g, out, x, shift, axis: bind(roll_p, g, shift=_neg_shift(shift), axis=axis),),
    jvp=(lambda t, out, x, shift, axis: bind(roll_p, t, shift=shift, axis=axis),),
    numpy="np.roll({0}, {shift}, axis={axis})", save_inputs=False)


def _tile_vjp(g, out, x, reps):
    # out axis i is reps[i] copies of x's axis i: split it as (copy, element)
    inter = []
    for r, d in zip(reps, x.shape):
        inter += [r, d]
    return sum(reshape(g, tuple(inter)), axis=tuple(range(0, 2 * len(reps), 2)))


tile_p = register(
    "tile", lambda xp, x, reps: xp.tile(x, reps),
    shape=lambda x, reps: Aval(tuple(r * d for r, d in zip(reps, x.shape)), x.dtype),
    vjp=(_tile_vjp,), jvp=(lambda t, out, x, reps: bind(tile_p, t, reps=reps),),
    numpy="np.tile({0}, {reps})", save_inputs=False)


def _repeat_vjp(g, out, x, repeats, axis):
    # element j along axis became positions j*r .. j*r + r - 1
    s = tuple(x.shape)
    g = reshape(g, s[:axis] + (s[axis], repeats) + s[axis + 1:])
    return sum(g, axis=axis + 1)


repeat_p = register(
    "repeat", lambda xp, x, repeats, axis: xp.repeat(x, repeats, axis=axis),
    shape=lambda x, repeats, axis: Aval(
        x.shape[:axis] + (x.shape[axis] * repeats,) + x.shape[axis + 1:], x.dtype),
    vjp=(_repeat_vjp,),
    jvp=(lambda t, out, x, repeats, axis: bind(repeat_p, t, repeats=repeats, axis=axis),),
    numpy="np.repeat({0}, {repeats}, axis={axis})", save_inputs=False)

pad_p = register(
    "pad", lambda xp, x, pad_width, value: xp.pad(x, pad_width, mode="constant",
                                                   constant_values=value),
    shape=lambda x, pad_width, value: Aval(
        tuple(d + a + b for d, (a, b) in zip(x.shape, pad_width)), x.dtype),
    # the cotangent of the original values is the middle of g
    vjp=(lambda g, out, x, pad_width, value:
         g[tuple(slice(a, a + d) for d, (a, b) in zip(x.shape, pad_width))],),
    jvp=(lambda t, out, x, pad_width, value: bind(pad_p, t, pad_width=pad_width, value=0),),
    numpy="np.pad({0}, {pad_width}, constant_values={value})", save_inputs=False)


# --- sorting -----------------------------------------------------------------------------

# kind: "stable", or NumPy's unstable "quicksort" or "heapsort", called as
# the user asked for it: the order NumPy gives equal elements (ties, and
# -0.0 beside 0.0) is that kind's, so the same kind gives the same numbers.
# CuPy sorts stably whatever the kind (it accepts no other), which is one
# of the orders an unstable sort may give.
def _sort_kind(xp, kind):
    return {"kind": kind} if xp is np else {}


def _sort_vjp(g, out, x, axis, kind):
    # sorted position -> original position is the argsort of the same kind;
    # g goes back there in one scatter.  Tied elements may take each
    # other's places in any order: each order gives a valid gradient.
    return bind(unpermute_along_p, g, bind(argsort_p, x, axis=axis, kind=kind), axis=axis)


sort_p = register(
    "sort", lambda xp, x, axis, kind: xp.sort(x, axis=axis, **_sort_kind(xp, kind)),
    shape=lambda x, axis, kind: x,
    vjp=(_sort_vjp,),
    jvp=(lambda t, out, x, axis, kind: _gather_by(
        t, bind(argsort_p, x, axis=axis, kind=kind), axis),),
    numpy="np.sort({0}, axis={axis}, kind={kind})", cupy="np.sort({0}, axis={axis})")
argsort_p = register(
    "argsort", lambda xp, x, axis, kind: xp.argsort(x, axis=axis, **_sort_kind(xp, kind)),
    shape=lambda x, axis, kind: Aval(x.shape, np.dtype(np.intp)), nondiff=True,
    save_inputs=False,
    numpy="np.argsort({0}, axis={axis}, kind={kind})", cupy="np.argsort({0}, axis={axis})")
# the inverse of permutations (SciPy's LU pivots): one scatter where a
# second argsort would sort
invert_permutation_p = register(
    "invert_permutation", lambda xp, p, axis: _invert_permutation(p, axis, xp),
    shape=lambda p, axis: p, nondiff=True, save_inputs=False,
    numpy="_invert_permutation({0}, {axis})", helpers=("_invert_permutation",))
# x gathered along ``axis`` by permutations ``perm``.  A pass
# (passes._sort_by_its_argsort) writes sort(x, kind) so where the graph has
# argsort(x, kind) anyway, for the sort's gradient: one sort, not two.  kind:
# that sort's (the result is then that sort's, bit for bit: _sorted_by), or
# None for a plain gather (the gradient's).
def _permute_along_shape(x, perm, axis, kind):
    if tuple(x.shape) != tuple(perm.shape):
        raise ValueError(f"permute_along: the permutations' shape {tuple(perm.shape)} is not "
                         f"the array's {tuple(x.shape)}")
    return x


def _permute_along(xp, x, perm, axis, kind):
    _permute_along_shape(x, perm, axis, kind)
    return _sorted_by(x, perm, axis, kind, xp)


def _gather_by(g, perm, axis):
    return bind(permute_along_p, g, perm, axis=axis, kind=None)


permute_along_p = register(
    "permute_along", _permute_along,
    shape=_permute_along_shape,
    vjp=(lambda g, out, x, perm, axis, kind: bind(unpermute_along_p, g, perm, axis=axis),
         None),
    jvp=(lambda t, out, x, perm, axis, kind: _gather_by(t, perm, axis), None),
    numpy="_sorted_by({0}, {1}, {axis}, {kind})", helpers=("_sorted_by",),
    cupy="np.take_along_axis({0}, {1}, axis={axis})")   # CuPy sorts stably: a gather
# its transpose: g put back where permutations took it from (one scatter)
unpermute_along_p = register(
    "unpermute_along", lambda xp, g, perm, axis: _unpermute_along(g, perm, axis, xp),
    shape=lambda g, perm, axis: _permute_along_shape(g, perm, axis, None),
    vjp=(lambda ct, out, g, perm, axis: _gather_by(ct, perm, axis), None),
    jvp=(lambda t, out, g, perm, axis: bind(unpermute_along_p, t, perm, axis=axis), None),
    numpy="_unpermute_along({0}, {1}, {axis})", helpers=("_unpermute_along",))
argpartition_p = register(
    "argpartition", lambda xp, x, kth, axis: xp.argpartition(x, kth, axis=axis),
    shape=lambda x, kth, axis: Aval(x.shape, np.dtype(np.intp)), nondiff=True,
    save_inputs=False, numpy="np.argpartition({0}, {kth}, axis={axis})")
# np.partition itself: its arrangement of the elements on each side of kth
# is its own (NumPy's argpartition arranges them otherwise from about 1,000
# elements on), so the gradient finds where each element came from
partition_positions_p = register(
    "partition_positions",
    lambda xp, x, out, kth, axis: _partition_positions(x, out, kth, axis, xp),
    shape=lambda x, out, kth, axis: Aval(x.shape, np.dtype(np.intp)), nondiff=True,
    save_inputs=False, numpy="_partition_positions({0}, {1}, {kth}, {axis})",
    helpers=("_partition_positions",))


def _partition_perm(out, x, kth, axis):
    return bind(partition_positions_p, x, out, kth=kth, axis=axis)


partition_p = register(
    "partition", lambda xp, x, kth, axis: xp.partition(x, kth, axis=axis),
    shape=lambda x, kth, axis: x,
    vjp=(lambda g, out, x, kth, axis: bind(
        unpermute_along_p, g, _partition_perm(out, x, kth, axis), axis=axis),),
    jvp=(lambda t, out, x, kth, axis: _gather_by(t, _partition_perm(out, x, kth, axis), axis),),
    numpy="np.partition({0}, {kth}, axis={axis})", save_out=True)


# --- the functional API --------------------------------------------------------------------

def flatten(x, start_dim=0, end_dim=-1):
    """torch's flatten: merge dims start_dim..end_dim (all by default)."""
    s = shape_of(x)
    if not s:
        return reshape(x, (1,))
    a, b = _norm_axis(start_dim, len(s), "start_dim"), _norm_axis(end_dim, len(s), "end_dim")
    if a > b:
        raise RuntimeError("flatten() has invalid args: start_dim cannot come after end_dim")
    n = 1
    for d in s[a:b + 1]:
        n *= d
    return reshape(x, s[:a] + (n,) + s[b + 1:])


def _c_contiguous(x):
    """Is ``x``'s memory C-contiguous (a traced view's strides replayed, an
    eager value's array)?"""
    flag = getattr(x, "_c_contiguous", None)
    if flag is not None:
        return flag
    flags = getattr(getattr(x, "_data", None), "flags", None)
    return flags is None or flags.c_contiguous


@method("ravel")
@implements(np.ravel)
def ravel(x, order="C"):
    if order == "C" and is_value(x) and not _c_contiguous(x):
        # NumPy's ravel is a view only of contiguous memory (x[::-1].ravel()
        # and x.T.ravel() copy, so writes into the result stay there)
        from tracegrad.ops.base import clone
        x = clone(x)
    return reshape(x, (-1,), order=order)


@implements(np.squeeze)
def squeeze(x, axis=None, *, dim=None):
    """NumPy's squeeze: drop the given length-1 axes (all of them by default)."""
    s = shape_of(x)
    axis = axis_arg(axis, dim)
    if axis is None:
        return reshape(x, tuple(d for d in s if d != 1))
    axes = {_norm_axis(a, len(s)) for a in (axis if isinstance(axis, tuple) else (axis,))}
    for a in axes:
        if s[a] != 1:
            raise ValueError(f"cannot select an axis to squeeze out which has size not equal "
                             f"to one (axis {a} has size {s[a]})")
    return reshape(x, tuple(d for i, d in enumerate(s) if i not in axes))


def _squeeze_method(x, dim=None, *, axis=None):
    """torch's squeeze: a dim whose size is not 1 is left alone."""
    s = shape_of(x)
    dim = axis_arg(axis, dim)
    if dim is None:
        return squeeze(x)
    dims = dim if isinstance(dim, tuple) else (dim,)
    keep = tuple(a for a in (_norm_axis(d, len(s), "dim") for d in dims) if s[a] == 1)
    return squeeze(x, keep) if keep else x


@implements(np.expand_dims)
def expand_dims(x, axis):
    """Insert length-1 axes at the given positions of the result."""
    s = shape_of(x)
    axes = axis if isinstance(axis, (tuple, list)) else (axis,)
    nd = len(s) + len(axes)
    axes = sorted(_norm_axis(a, nd) for a in axes)
    shape, it = [], iter(s)
    for i in range(nd):
        shape.append(1 if i in axes else next(it))
    return reshape(x, tuple(shape))


@method("unsqueeze")
def unsqueeze(x, dim):
    return expand_dims(x, dim)


@method("moveaxis", "movedim")
@implements(np.moveaxis)
def moveaxis(x, source, destination):
    nd = len(shape_of(x))
    src = [_norm_axis(a, nd) for a in (source if isinstance(source, (tuple, list)) else (source,))]
    dst = [_norm_axis(a, nd) for a in
           (destination if isinstance(destination, (tuple, list)) else (destination,))]
    order = [i for i in range(nd) if i not in src]
    for d, s in sorted(zip(dst, src)):
        order.insert(d, s)
    return transpose(x, tuple(order))


movedim = moveaxis


def _as_operand(x):
    return x if is_value(x) or isinstance(x, np.ndarray) else np.asarray(x)


@implements(np.concatenate)
def concatenate(arrays, axis=_DEFAULT, out=None, dtype=None, *, dim=None, casting=None):
    """Join tensors along an existing axis (axis=None: flatten them first)."""
    axis = _axis_or_dim(axis, dim, 0)
    xs = [_as_operand(a) for a in arrays]
    if not xs:
        raise ValueError("need at least one array to concatenate")
    if axis is None:
        xs, axis = [ravel(x) for x in xs], 0
    nd = len(shape_of(xs[0]))
    if nd == 0:
        raise ValueError("zero-dimensional arrays cannot be concatenated")
    axis = _norm_axis(axis, nd)
    ref = shape_of(xs[0])
    for x in xs[1:]:
        s = shape_of(x)
        if len(s) != nd or any(a != b for i, (a, b) in enumerate(zip(s, ref)) if i != axis):
            raise ValueError(
                f"concatenate: all shapes must match except along axis {axis}; got "
                f"{[list(shape_of(v)) for v in xs]}")
    if dtype is not None:
        casting = "same_kind" if casting is None else casting
        for x in xs:
            if not np.can_cast(np.dtype(x.dtype), np.dtype(dtype), casting):
                raise TypeError(f"Cannot cast array data from dtype({str(np.dtype(x.dtype))!r}) "
                                f"to dtype({str(np.dtype(dtype))!r}) according to the rule "
                                f"{casting!r}")
        xs = [astype(x, dtype) for x in xs]
    return bind(concatenate_p, *xs, axis=axis)


concat = cat = concatenate


@implements(np.stack)
def stack(arrays, axis=_DEFAULT, out=None, *, dim=None, dtype=None, casting=None):
    """Join tensors of one shape along a new axis."""
    axis = _axis_or_dim(axis, dim, 0)
    xs = [_as_operand(a) for a in arrays]
    if not xs:
        raise ValueError("need at least one array to stack")
    shapes = {shape_of(x) for x in xs}
    if len(shapes) != 1:
        raise ValueError(f"stack expects each tensor to be equal size, got "
                         f"{[list(shape_of(x)) for x in xs]}")
    return concatenate([expand_dims(x, axis) for x in xs], axis=axis, dtype=dtype,
                       casting=casting)


@implements(np.hstack)
def hstack(tup, *, dtype=None, casting=None):
    xs = atleast_1d(*tup) if len(tup) > 1 else [atleast_1d(*tup)]
    return concatenate(xs, axis=0 if len(shape_of(xs[0])) == 1 else 1, dtype=dtype,
                       casting=casting)


@implements(np.vstack)
def vstack(tup, *, dtype=None, casting=None):
    xs = atleast_2d(*tup) if len(tup) > 1 else [atleast_2d(*tup)]
    return concatenate(xs, axis=0, dtype=dtype, casting=casting)


@implements(np.column_stack)
def column_stack(tup):
    xs = [reshape(_as_operand(x), (-1, 1)) if len(shape_of(x)) < 2 else x for x in tup]
    return concatenate(xs, axis=1)


def _split_at(x, indices, axis):
    n = shape_of(x)[axis]
    indices = tuple(_builtins.min(_builtins.max(int(i) if i >= 0 else int(i) + n, 0), n)
                    for i in indices)
    return list(bind(split_p, x, axis=axis, indices=indices))


@implements(np.split)
def split(x, indices_or_sections, axis=_DEFAULT, *, dim=None):
    """NumPy's split: N equal sections, or at the given indices."""
    axis = _norm_axis(_axis_or_dim(axis, dim, 0), len(shape_of(x)))
    n = shape_of(x)[axis]
    if isinstance(indices_or_sections, (int, np.integer)):
        k = int(indices_or_sections)
        if k <= 0 or n % k:
            raise ValueError(f"array split does not result in an equal division: {n} elements "
                             f"into {k} sections; use array_split for unequal parts")
        return _split_at(x, tuple(i * (n // k) for i in range(1, k)), axis)
    return _split_at(x, tuple(indices_or_sections), axis)


@implements(np.array_split)
def array_split(x, indices_or_sections, axis=0):
    axis = _norm_axis(axis, len(shape_of(x)))
    n = shape_of(x)[axis]
    if isinstance(indices_or_sections, (int, np.integer)):
        k = int(indices_or_sections)
        if k <= 0:
            raise ValueError("number sections must be larger than 0")
        each, extra = divmod(n, k)
        sizes = [each + 1] * extra + [each] * (k - extra)
        return _split_at(x, tuple(np.cumsum(sizes)[:-1].tolist()), axis)
    return _split_at(x, tuple(indices_or_sections), axis)


def _split_method(x, split_size_or_sections, dim=0):
    """torch's split: pieces of one size (the last may be smaller) or of the given sizes."""
    dim = _norm_axis(dim, len(shape_of(x)), "dim")
    n = shape_of(x)[dim]
    if isinstance(split_size_or_sections, (int, np.integer)):
        step = int(split_size_or_sections)
        if step <= 0:
            raise RuntimeError(f"split expects split_size be non-negative, but got {step}")
        return tuple(_split_at(x, tuple(range(step, n, step)), dim))
    sizes = [int(s) for s in split_size_or_sections]
    if _builtins.sum(sizes) != n:
        raise RuntimeError(f"split_with_sizes expects split_sizes to sum exactly to {n} "
                           f"(input tensor's size at dimension {dim}), but got {sizes}")
    return tuple(_split_at(x, tuple(np.cumsum(sizes)[:-1].tolist()), dim))


@method("chunk")
def chunk(x, chunks, dim=0):
    """torch's chunk: ``chunks`` pieces of ceil(n / chunks) (fewer if they run out)."""
    n = shape_of(x)[_norm_axis(dim, len(shape_of(x)), "dim")]
    return _split_method(x, _builtins.max(-(-n // int(chunks)), 1), dim)


@implements(np.flip)
def flip(x, axis=None, *, dims=None):
    """Reverse the order of elements along the given axes (all by default)."""
    axis = axis_arg(axis, dims)
    nd = len(shape_of(x))
    axes = tuple(range(nd)) if axis is None else tuple(
        sorted({_norm_axis(a, nd) for a in (axis if isinstance(axis, tuple) else (axis,))}))
    if not axes:
        return x
    return bind(flip_p, x, axes=axes)


@method("flip")
def _flip_method(x, *dims, **kw):
    if "dims" in kw:
        dims = kw["dims"]
    elif len(dims) == 1:
        dims = dims[0]
    return flip(x, tuple(dims) if isinstance(dims, (tuple, list)) else dims)


@method("fliplr")
@implements(np.fliplr)
def fliplr(x):
    return flip(x, 1)


@method("flipud")
@implements(np.flipud)
def flipud(x):
    return flip(x, 0)


@method("roll")
@implements(np.roll)
def roll(x, shift=None, axis=None, *, shifts=None, dims=None):
    """Shift elements cyclically (over the flattened array when axis is None);
    torch's keywords ``shifts=`` and ``dims=`` too."""
    axis = axis_arg(axis, dims)
    if shifts is not None:
        if shift is not None:
            raise TypeError("roll: pass either shift or shifts=, not both")
        shift = shifts
    if shift is None:
        raise TypeError("roll() missing required argument 'shift' (torch: 'shifts')")
    if axis is None:
        return reshape(bind(roll_p, ravel(x), shift=int(shift), axis=None), shape_of(x))
    nd = len(shape_of(x))
    axes = axis if isinstance(axis, tuple) else (axis,)
    shifts = tuple(int(s) for s in shift) if isinstance(shift, (tuple, list)) else (int(shift),)
    if len(shifts) == 1:
        shifts = shifts * len(axes)
    if len(shifts) != len(axes):
        raise ValueError(f"roll: {len(shifts)} shifts for {len(axes)} axes")
    return bind(roll_p, x, shift=shifts, axis=tuple(_norm_axis(a, nd) for a in axes))


@method("rot90")
@implements(np.rot90)
def rot90(x, k=1, axes=(0, 1), *, dims=None):
    """Rotate by 90 degrees k times in the plane of ``axes`` (first toward second)."""
    if dims is not None:
        axes = tuple(dims)
    nd = len(shape_of(x))
    a, b = (_norm_axis(v, nd) for v in axes)
    if a == b:
        raise ValueError("rot90: the two axes must differ")
    k %= 4
    if k == 0:
        return x
    if k == 2:
        return flip(x, (a, b))
    perm = list(range(nd))
    perm[a], perm[b] = perm[b], perm[a]
    if k == 1:
        return transpose(flip(x, b), tuple(perm))
    return flip(transpose(x, tuple(perm)), b)


@implements(np.tile)
def tile(x, reps):
    """Repeat the whole tensor ``reps`` times along each axis (np.tile)."""
    reps = (int(reps),) if isinstance(reps, (int, np.integer)) else tuple(int(r) for r in reps)
    s = shape_of(x)
    nd = _builtins.max(len(s), len(reps))
    reps = (1,) * (nd - len(reps)) + reps
    if len(s) < nd:
        x = reshape(_as_operand(x), (1,) * (nd - len(s)) + s)
    if all(r == 1 for r in reps):
        # a copy all the same (np.tile and torch's repeat make one): an
        # in-place update of the result must not reach x
        return _ops.clone(x)
    return bind(tile_p, x, reps=reps)


method("tile")(tile)


def _repeat_method(x, *sizes):
    """torch's repeat: tile, with at least as many sizes as dimensions."""
    if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)):
        sizes = tuple(sizes[0])
    if len(sizes) < len(shape_of(x)):
        raise RuntimeError("Number of dimensions of repeat dims can not be smaller than number "
                           "of dimensions of tensor")
    return tile(x, sizes)


@implements(np.repeat)
def repeat(x, repeats, axis=None):
    """Repeat each element (np.repeat); per-element counts gather by index."""
    if axis is None:
        x, axis = ravel(x), 0
    axis = _norm_axis(axis, len(shape_of(x)))
    if isinstance(repeats, (int, np.integer)) or np.ndim(repeats) == 0 and not is_value(repeats):
        return bind(repeat_p, x, repeats=int(repeats), axis=axis)
    if is_value(repeats):
        raise TypeError("repeat: per-element repeat counts must be constants (a list or "
                        "ndarray), not a tracegrad value")
    idx = np.repeat(np.arange(shape_of(x)[axis]), np.asarray(repeats))
    return _ops.getitem(x, _sl(len(shape_of(x)), axis, idx))


@method("repeat_interleave")
def repeat_interleave(x, repeats, dim=None):
    """torch's repeat_interleave: np.repeat under its torch name."""
    return repeat(x, repeats, axis=dim)


@implements(np.pad)
def pad(x, pad_width, mode="constant", constant_values=0, **kw):
    """np.pad: constant padding is a row; edge/reflect/symmetric/wrap gather by index."""
    s = shape_of(x)
    width = np.broadcast_to(np.asarray(pad_width, dtype=np.int64), (len(s), 2))
    width = tuple((int(a), int(b)) for a, b in width)
    if mode == "constant":
        if kw:
            raise TypeError(f"pad: unexpected keyword(s) {sorted(kw)} for mode='constant'")
        cv = np.asarray(constant_values)
        if cv.ndim:
            raise NotImplementedError("pad: per-axis constant_values are not supported; "
                                      "pass one scalar")
        return bind(pad_p, _as_operand(x), pad_width=width, value=cv.item())
    if mode not in ("edge", "reflect", "symmetric", "wrap") or kw:
        raise NotImplementedError(f"pad: mode={mode!r} with options {sorted(kw)} is not "
                                  f"supported; use constant, edge, reflect, symmetric or wrap")
    for axis, (a, b) in enumerate(width):
        if a or b:  # which source element each padded position copies
            idx = np.pad(np.arange(s[axis]), (a, b), mode=mode)
            x = _ops.getitem(x, _sl(len(s), axis, idx))
    return x


@method("diff")
@implements(np.diff)
def diff(x, n=1, axis=_DEFAULT, prepend=None, append=None, *, dim=None):
    """n-th forward difference along an axis."""
    axis = _axis_or_dim(axis, dim, -1)
    nd = len(shape_of(x))
    axis = _norm_axis(axis, nd)
    parts = []
    for extra in (prepend, None, append):
        if extra is None:
            continue
        e = _as_operand(extra)
        if len(shape_of(e)) == 0:
            shape = list(shape_of(x))
            shape[axis] = 1
            e = broadcast_to(e, tuple(shape))
        parts.append(e)
    if parts:
        parts.insert(0 if prepend is None else 1, x)
        x = concatenate(parts, axis=axis)
    for _ in range(n):
        x = sub(x[_sl(nd, axis, slice(1, None))], x[_sl(nd, axis, slice(None, -1))])
    return x


_SORT_KINDS = {"q": "quicksort", "h": "heapsort", "m": "stable", "s": "stable"}


def _sort_kind_of(kind, stable):
    """NumPy's ``kind=`` and ``stable=`` as the kind tracegrad's sort rows
    carry: "quicksort" (NumPy's default), "heapsort" or "stable" ("mergesort"
    is NumPy's name for its stable sort too).  NumPy reads the first letter."""
    if stable is not None:
        if kind is not None:
            raise ValueError("`kind` and keyword parameters can't be provided at the same "
                             "time. Use only one of them.")
        return "stable" if stable else "quicksort"
    if kind is None:
        return "quicksort"
    k = _SORT_KINDS.get(kind[:1].lower()) if isinstance(kind, str) else None
    if k is None:
        raise ValueError(f"sort kind must be one of 'quick', 'heap', or 'stable' (got {kind!r})")
    return k


def _sort_options(kind, order, select=False):
    """NumPy's ``order=`` (field names: tracegrad values have no fields) and,
    for a partition, its one ``kind``."""
    if select and kind != "introselect":
        raise ValueError(f"select kind must be 'introselect' (got {kind!r})")
    if order is not None:
        raise ValueError("Cannot specify order when the array has no fields.")


@implements(np.sort)
def sort(x, axis=-1, kind=None, order=None, *, stable=None):
    """np.sort: sorted values; equal elements in the order NumPy's ``kind``
    gives them; the gradient follows each element to its place."""
    _sort_options(kind, order)
    kind = _sort_kind_of(kind, stable)
    if axis is None:
        x, axis = ravel(x), 0
    return bind(sort_p, x, axis=_norm_axis(axis, len(shape_of(x))), kind=kind)


@implements(np.argsort)
def argsort(x, axis=-1, kind=None, order=None, *, stable=None):
    """np.argsort: indices that sort x, equal elements in the order NumPy's
    ``kind`` gives them (no gradient)."""
    _sort_options(kind, order)
    kind = _sort_kind_of(kind, stable)
    if axis is None:
        x, axis = ravel(x), 0
    return bind(argsort_p, x, axis=_norm_axis(axis, len(shape_of(x))), kind=kind)


# --- torch's sorts: stable (torch leaves the order of equal elements open
# unless stable=True, so one order serves both), NaN the largest value ------

return_types_sort = collections.namedtuple("sort", ["values", "indices"])


def torch_argsort(x, dim=-1, descending=False):
    """torch.argsort: stable; descending puts NaN first, as torch does."""
    dim = _norm_axis(dim, len(shape_of(x)), "dim")
    if not descending:
        return bind(argsort_p, x, axis=dim, kind="stable")
    order = bind(argsort_p, neg(x), axis=dim, kind="stable")   # NaN last here
    if np.dtype(result_dtype(x)).kind not in "fc":
        return order
    # NaN to the front, in their first order: a stable sort of "is a number"
    is_number = _ops.logical_not(_ops.isnan(_ops.take_along_axis(x, order, axis=dim)))
    return _ops.take_along_axis(order, bind(argsort_p, is_number, axis=dim, kind="stable"),
                                axis=dim)


def torch_sort(x, dim=-1, descending=False):
    """torch.sort: (values, indices), stable, NaN the largest value."""
    dim = _norm_axis(dim, len(shape_of(x)), "dim")
    idx = torch_argsort(x, dim, descending)
    if descending:
        return return_types_sort(_ops.take_along_axis(x, idx, axis=dim), idx)
    return return_types_sort(bind(sort_p, x, axis=dim, kind="stable"), idx)


def _sort_method(x, dim=-1, descending=False, stable=False):
    """torch's sort: (values, indices)."""
    return torch_sort(x, dim, descending)


def _kth(kth):
    """A partition's ``kth``: an int, or a tuple of them."""
    return tuple(int(k) for k in kth) if isinstance(kth, (tuple, list)) else int(kth)


@implements(np.argpartition)
def argpartition(x, kth, axis=-1, kind="introselect", order=None):
    _sort_options(kind, order, select=True)
    if axis is None:
        x, axis = ravel(x), 0
    return bind(argpartition_p, x, kth=_kth(kth), axis=_norm_axis(axis, len(shape_of(x))))


@implements(np.partition)
def partition(x, kth, axis=-1, kind="introselect", order=None):
    """np.partition: NumPy's own arrangement of the elements."""
    _sort_options(kind, order, select=True)
    if axis is None:
        x, axis = ravel(x), 0
    return bind(partition_p, x, kth=_kth(kth), axis=_norm_axis(axis, len(shape_of(x))))


def _atleast(n, arys):
    out = []
    for a in arys:
        a = _as_operand(a)
        s = shape_of(a)
        if len(s) < n:
            if n == 3 and len(s) == 2:
                s = s + (1,)
            elif n == 3 and len(s) == 1:
                s = (1,) + s + (1,)
            else:
                s = (1,) * (n - len(s)) + s
            a = reshape(a, s)
        out.append(a)
    return out[0] if len(out) == 1 else out


@implements(np.atleast_1d)
def atleast_1d(*arys):
    return _atleast(1, arys)


@implements(np.atleast_2d)
def atleast_2d(*arys):
    return _atleast(2, arys)


@implements(np.atleast_3d)
def atleast_3d(*arys):
    return _atleast(3, arys)


# --- torch's *_as methods ------------------------------------------------------------------

method("expand_as")(lambda x, other: broadcast_to(x, tuple(other.shape)))
method("view_as", "reshape_as")(lambda x, other: reshape(x, tuple(other.shape)))
method("type_as")(lambda x, other: astype(x, other.dtype))
