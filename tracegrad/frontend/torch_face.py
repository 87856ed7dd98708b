"""The torch face: torch.Tensor's meaning for the methods whose meaning
differs between NumPy and torch, and for the top-level functions
(``import tracegrad as torch`` is the torch dialect).

Eager Tensors speak torch, and so does a traced value that stands for a
Tensor argument.  Differing names, torch's meaning:

=======================  ======================================================
``t.size(dim=None)``     a method: the shape, or one dimension's length
``t.std/var(dim)``       unbiased (``correction=1``) unless told otherwise
``t.max/min(dim)``       ``(values, indices)``; ``t.max(other)`` elementwise
``t.repeat(*sizes)``     tiles the tensor
``t.transpose(d0, d1)``  swaps two dimensions
``t.flatten(s, e)``      merges dimensions ``s..e``
``t.view(*shape)``       the same data in a new shape
``t.sort(dim)``          ``(values, indices)``
``t.split(size, dim)``   pieces of ``size`` (or of the given sizes)
``t.nonzero()``          an ``(n, ndim)`` index tensor
``t.squeeze(dim)``       leaves a dimension whose length is not 1 alone
``t.median/topk/...``    ``(values, indices)``; ``median()`` the lower middle
=======================  ======================================================

The same names at the top level (``tg.std``, ``tg.max``, ``tg.split``,
``tg.transpose``, ``tg.sort``, ``tg.nonzero``, ``tg.squeeze``, ``tg.norm``,
``tg.topk``, ``tg.kthvalue``, ``tg.median``)
have torch's signatures and meaning; ``np.*`` called on any value keeps
NumPy's.
"""
from __future__ import annotations

import collections

import numpy as np

from tracegrad import ops
from tracegrad.ops import indexing, linalg, reductions, shape
from tracegrad.ops import _define
from tracegrad.ops import dtypes as _dtypes
from tracegrad.ops.base import resolve_dtype
from tracegrad.ops._define import face_method

FACE = "torch"

__all__ = ["std", "var", "max", "min", "sort", "split", "transpose", "nonzero", "squeeze",
           "norm", "topk", "kthvalue", "median", "sum", "mean", "prod", "amax", "amin", "argmax",
           "argmin", "all", "any", "nansum", "nanmean", "cross", "equal", "isclose", "allclose",
           "result_type", "promote_types", "can_cast", "finfo", "iinfo"]


# ``x.data`` of a traced value: as torch's, the same values cut from the
# gradient (a detached alias), e.g. ``while y.data.norm() < 1000:``
face_method(FACE, "data")(property(lambda t: ops.stop_gradient(t)))


@face_method(FACE, "size")
def size(t, dim=None):
    return tuple(t.shape) if dim is None else t.shape[dim]


@face_method(FACE, "dim", "ndimension")
def dim(t):
    return len(t.shape)


@face_method(FACE, "numel")
def numel(t):
    return t.size_


@face_method(FACE, "t")
def t(t):
    if len(t.shape) > 2:
        raise RuntimeError(f"t() expects a tensor with <= 2 dimensions, but self is "
                           f"{len(t.shape)}D")
    out = ops.transpose(t)
    return _define.name_grad_fn(out, "TBackward0") if len(t.shape) == 2 else out


@face_method(FACE, "transpose")
def transpose(input, dim0, dim1):
    """torch.transpose: swap two dimensions."""
    return ops.swapaxes(input, dim0, dim1)


@face_method(FACE, "view")
def view(t, *shape_or_dtype):
    """Tensor.view(*shape): a new shape over the same data (view(dtype),
    reinterpreting bytes, has no derivative)."""
    if len(shape_or_dtype) == 1 and not isinstance(shape_or_dtype[0], (int, tuple, list)) \
            and not hasattr(shape_or_dtype[0], "__index__"):
        raise TypeError(f"view({shape_or_dtype[0]!r}) reinterprets the tensor's bytes as another "
                        f"dtype, which tracegrad cannot differentiate; use .to(dtype)")
    return ops.reshape(t, *shape_or_dtype)


std = face_method(FACE, "std")(reductions._std_method)
var = face_method(FACE, "var")(reductions._var_method)
@face_method(FACE, "max")
def max(input, dim=None, keepdim=False, *, other=None, axis=None, keepdims=None, out=None):
    """torch.max / x.max: the value, (values, indices) along ``dim``, or the
    elementwise maximum; the backward nodes named as torch names them."""
    res = reductions._max_method(input, dim, keepdim, other=other, axis=axis,
                                 keepdims=keepdims, out=out)
    if other is None and dim is None and axis is None:
        return _define.name_grad_fn(res, "MaxBackward1", (("result", ("out",)),
                                                          ("self", ("in", 0))))
    if other is None and dim is not None and isinstance(res, tuple):
        d = int(dim) % len(input.shape)
        _define.name_grad_fn(res[0], "MaxBackward0", (("dim", ("const", d)),
                                                      ("keepdim", ("const", bool(keepdim))),
                                                      ("self_sym_sizes", ("sizes", 0))))
    return res
min = face_method(FACE, "min")(reductions._min_method)
sort = face_method(FACE, "sort")(shape._sort_method)


@face_method(FACE, "argsort")
def argsort(input, dim=-1, descending=False, stable=False):
    """Tensor.argsort: stable, NaN the largest value (torch's order)."""
    return shape.torch_argsort(input, dim, descending)
split = face_method(FACE, "split")(shape._split_method)
nonzero = face_method(FACE, "nonzero")(indexing._nonzero_method)
squeeze = face_method(FACE, "squeeze")(shape._squeeze_method)
face_method(FACE, "repeat")(shape._repeat_method)
face_method(FACE, "flatten")(shape.flatten)
norm = linalg._norm_method   # torch.norm(input, p='fro', dim=None, keepdim=False)


def _torch_reduction(op, name, takes_dtype):
    """torch's argument order for a reduction: (input, dim, keepdim) and
    dtype by keyword (NumPy's puts dtype or out third); NumPy's keywords
    are accepted where they do not conflict."""
    def reduction(input, dim=None, keepdim=False, *, dtype=None, axis=None, keepdims=None,
                  out=None):
        if out is not None:
            raise TypeError(f"{name}(out=) cannot write into a tracegrad value; assign the result")
        kw = {"dtype": dtype} if dtype is not None else {}
        if dtype is not None and not takes_dtype:
            raise TypeError(f"{name}() got an unexpected keyword argument 'dtype'")
        return op(input, axis=dim if axis is None else axis,
                  keepdims=keepdim if keepdims is None else keepdims, **kw)
    reduction.__name__ = reduction.__qualname__ = name
    reduction.__doc__ = f"torch.{name}(input, dim=None, keepdim=False)"
    return face_method(FACE, name)(reduction)


sum = _torch_reduction(ops.sum, "sum", True)
mean = _torch_reduction(reductions.mean, "mean", True)
prod = _torch_reduction(reductions.prod, "prod", True)
nansum = _torch_reduction(reductions.nansum, "nansum", True)
nanmean = _torch_reduction(reductions.nanmean, "nanmean", True)
amax = _torch_reduction(reductions.amax, "amax", False)
amin = _torch_reduction(reductions.amin, "amin", False)
argmax = _torch_reduction(reductions.argmax, "argmax", False)
argmin = _torch_reduction(reductions.argmin, "argmin", False)
all = _torch_reduction(reductions.all, "all", False)
any = _torch_reduction(reductions.any, "any", False)


@face_method(FACE, "cross")
def cross(input, other, dim=None):
    """torch.cross: along ``dim``, by default the first dimension of length 3
    (NumPy's np.cross uses the last)."""
    if dim is None:
        shape = input.shape if len(input.shape) >= len(other.shape) else other.shape
        dim = next((i for i, n in enumerate(shape) if n == 3), None)
        if dim is None:
            raise RuntimeError(f"no dimension of size 3 in input of shape {tuple(shape)}")
    return linalg.cross(input, other, axis=dim)

@face_method(FACE, "equal")
def equal(input, other):
    """torch.equal: ONE bool, True when both have the same shape and the
    same elements (torch.eq / ``==`` compare elementwise)."""
    if tuple(input.shape) != tuple(getattr(other, "shape", ())):
        return False
    return bool(reductions.all(ops.equal(input, other)))


@face_method(FACE, "isclose")
def isclose(input, other, rtol=1e-05, atol=1e-08, equal_nan=False):
    """torch.isclose: |input - other| <= atol + rtol * |other|, elementwise
    (infinities equal themselves; NaN only with equal_nan)."""
    a, b = input, other
    with np.errstate(invalid="ignore"):      # inf - inf: handled by the equality below
        close = ops.less_equal(ops.abs(a - b), atol + rtol * ops.abs(b))
    close = ops.logical_or(close, ops.equal(a, b))     # equal infinities
    if equal_nan:
        close = ops.logical_or(close, ops.logical_and(ops.isnan(a), ops.isnan(b)))
    return close


@face_method(FACE, "allclose")
def allclose(input, other, rtol=1e-05, atol=1e-08, equal_nan=False):
    """torch.allclose: ONE bool, isclose everywhere (shapes broadcast)."""
    return bool(reductions.all(isclose(input, other, rtol, atol, equal_nan)))


_topk = collections.namedtuple("topk", ["values", "indices"])
_kthvalue = collections.namedtuple("kthvalue", ["values", "indices"])
_median = collections.namedtuple("median", ["values", "indices"])


def _pick(t, order, positions, dim):
    """(values, indices) of the elements at ``positions`` of ``order`` (an
    argsort along ``dim``); the values carry the gradient."""
    idx = ops.take(order, positions, axis=dim)
    return ops.take_along_axis(t, idx, axis=dim), idx


@face_method(FACE, "topk")
def topk(input, k, dim=-1, largest=True, sorted=True):
    """The k largest (or smallest) elements along ``dim``, largest first."""
    order = shape.torch_argsort(input, dim, descending=largest)
    return _topk(*_pick(input, order, list(range(k)), dim))


@face_method(FACE, "kthvalue")
def kthvalue(input, k, dim=-1, keepdim=False):
    """The k-th smallest element along ``dim`` (k counts from 1)."""
    values, indices = _pick(input, shape.torch_argsort(input, dim), [k - 1], dim)
    if not keepdim:
        values, indices = ops.squeeze(values, dim), ops.squeeze(indices, dim)
    return _kthvalue(values, indices)


@face_method(FACE, "median")
def median(input, dim=None, keepdim=False):
    """torch's median: the lower of the two middle values (no average);
    with ``dim``, (values, indices)."""
    if dim is None:
        flat = ops.reshape(input, (-1,))
        return kthvalue(flat, (flat.shape[0] + 1) // 2, 0).values
    n = input.shape[dim]
    values, indices = kthvalue(input, (n + 1) // 2, dim, keepdim)
    return _median(values, indices)


# torch's in-place methods on a traced value (eager Tensors have their own,
# eager/torch_methods.py): the update NumPy's augmented assignment makes,
# seen by every name bound to the value; through a view, which compiled code
# cannot write through, a TraceError that says so.
def _traced_binary_inplace(name, op, symbol):
    def method(t, other, alpha=1):
        if alpha != 1:
            other = other * alpha
        return t._inplace(op, other, symbol)
    method.__name__ = method.__qualname__ = name
    face_method(FACE, name)(method)
    _define.face_advice("numpy", name, f"NumPy arrays have no '{name}': write a {symbol} b")


for _name, _op, _symbol in (("add_", "add", "+="), ("sub_", "sub", "-="), ("mul_", "mul", "*="),
                            ("div_", "truediv", "/="), ("pow_", "pow", "**=")):
    _traced_binary_inplace(_name, _op, _symbol)


def _traced_unary_inplace(name, fn, instead):
    def method(t, *args, **kwargs):
        return t._assign(fn(t, *args, **kwargs), f"in-place '{name}'", instead)
    method.__name__ = method.__qualname__ = name
    face_method(FACE, name)(method)
    _define.face_advice("numpy", name, f"NumPy arrays have no '{name}': write {instead}")


_traced_unary_inplace("neg_", lambda t: ops.neg(t), "b = -b")
_traced_unary_inplace("exp_", lambda t: ops.exp(t), "b = np.exp(b)")
for _name in ("clamp_", "clip_"):
    _traced_unary_inplace(_name, lambda t, min=None, max=None: ops.clip(t, min, max),
                          "b = b.clamp(min, max)")
_traced_unary_inplace("zero_", lambda t: ops.zeros_like_value(t), "b = b * 0")
_traced_unary_inplace("fill_", lambda t, value: ops.astype(ops.zeros_like_value(t) + value,
                                                           t.dtype), "b = np.full_like(b, value)")
_traced_unary_inplace("copy_", lambda t, src, non_blocking=False: ops.astype(
    ops.broadcast_to(src, t.shape), t.dtype), "b = src")


# --- torch's dtype queries (the rule itself: tracegrad.ops.dtypes) -------------------------

def result_type(tensor, other):
    """torch.result_type: the dtype torch's promotion gives ``tensor op other``
    (each a tensor or a number; 0-d tensors and numbers decide only by
    category)."""
    return _dtypes.result_type(tensor, other)


def promote_types(type1, type2):
    """torch.promote_types: the smallest dtype both cast to, torch's table
    (int64 with float16 is float16)."""
    return _dtypes.promote_types(_resolve(type1), _resolve(type2))


def can_cast(from_, to):
    """torch.can_cast: casting does not lower the category (bool < integer <
    floating < complex)."""
    return _dtypes.category(_resolve(from_)) <= _dtypes.category(_resolve(to))


def finfo(type=None):
    """torch.finfo: bits, eps, max, min, tiny, smallest_normal, resolution of
    a floating dtype (the default dtype when none is given)."""
    dt = _dtypes.Defaults.dtype if type is None else _resolve(type)
    if dt.kind not in "fc":
        raise TypeError(f"torch.finfo() requires a floating point input type, got {dt}")
    return np.finfo(dt)


def iinfo(type):
    """torch.iinfo: bits, max, min of an integer dtype."""
    dt = _resolve(type)
    if dt.kind not in "biu":
        raise TypeError(f"torch.iinfo() requires an integer input type, got {dt}")
    return np.iinfo(dt)


def _resolve(d):
    if hasattr(d, "dtype") and not isinstance(d, np.dtype):
        raise TypeError(f"expected a dtype, got a {type(d).__name__}")
    return resolve_dtype(d)
