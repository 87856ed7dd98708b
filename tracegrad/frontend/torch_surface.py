"""More of the torch face: top-level functions and Tensor methods torch has
and NumPy spells differently or not at all (``torch.quantile``,
``torch.cov``, ``torch.cdist``, ``torch.lerp``, ``t.scatter_add``,
``t.index_put_``, ``t.new_zeros``, ``t.unbind``...), with torch's names,
argument order and defaults, eager and traced alike.

Each is composed of the registry's functional ops, so its derivative is
theirs (nothing here has a rule of its own).  In-place methods update an
eager Tensor through its in-place machinery (version counter, views) and a
traced torch-face value as the other in-place methods of a trace do.
"""
from __future__ import annotations

import collections
import math

import numpy as np

from tracegrad import ops
from tracegrad.ops import _define, indexing, linalg, primitives, shape as _shape
from tracegrad.ops import dtypes as _dtypes
from tracegrad.ops._define import face_method
from tracegrad.ops.base import resolve_dtype
from tracegrad.eager.tensor import Tensor

FACE = "torch"

__all__ = ["quantile", "nanquantile", "var_mean", "std_mean", "cov", "corrcoef", "cdist", "dist",
           "lerp", "addcdiv", "addcmul", "take_along_dim", "trapezoid", "trapz", "meshgrid",
           "msort", "diag_embed", "cholesky_solve", "pinverse", "index_add", "index_put",
           "scatter", "scatter_add", "scatter_reduce", "masked_select", "clamp_min", "clamp_max", "rsub",
           "logcumsumexp", "mode", "unbind", "unflatten", "argsort", "svd", "diagonal",
           "cumsum", "cumprod", "logsumexp", "flip", "roll", "tile", "diff", "searchsorted",
           "count_nonzero", "round", "cholesky", "diag", "trace",
           "tensordot", "take", "dot", "vdot", "qr"]


def _shape_of(x):
    return tuple(x.shape) if hasattr(x, "shape") else np.shape(x)


def _nd(x):
    return len(_shape_of(x))


def _dim(d, nd):
    d = int(d)
    if not -max(nd, 1) <= d < max(nd, 1):
        raise IndexError(f"Dimension out of range (expected to be in range of "
                         f"[{-max(nd, 1)}, {max(nd, 1) - 1}], but got {d})")
    return d % max(nd, 1)


def _is_value(x):
    return hasattr(x, "_face")


def _torch_method(*names, numpy_advice=None):
    """A torch-only Tensor method: torch's meaning on torch-face values;
    NumPy-face values are told what to write instead."""
    def deco(fn):
        face_method(FACE, *names)(fn)
        for n in names:
            _define.face_advice("numpy", n, numpy_advice or
                                f"NumPy arrays have no '{n}' (a torch Tensor method)")
        return fn
    return deco


def _inplace(t, fn, name, *args):
    """``t`` made ``fn(t, *args)`` in place: an eager Tensor through its
    in-place machinery, a traced value by rebinding every name bound to it."""
    if isinstance(t, Tensor):
        return t._inplace(fn, *args)
    return t._assign(ops.astype(fn(t, *args), t.dtype), f"in-place '{name}'",
                     f"b = b.{name[:-1]}(...)")


# --- quantiles ----------------------------------------------------------------------------

def _static_q(q, name):
    if _is_value(q) and not isinstance(q, Tensor):
        raise TypeError(f"torch.{name}: q must be known while tracing (a number, a list or a "
                        f"tensor made outside the function)")
    qa = np.asarray(q._data if isinstance(q, Tensor) else q, dtype=np.float64)
    if qa.ndim > 1:
        raise RuntimeError(f"{name}() q must be a scalar or 1D tensor")
    if np.any((qa < 0) | (qa > 1)):
        raise RuntimeError(f"{name}() q values must be in the range [0, 1]")
    return qa


def _interp(sorted_x, pos, interpolation, dim):
    """Values at fractional positions ``pos`` (an array, per q) along ``dim``
    of a sorted tensor, with torch's interpolation."""
    lo = np.floor(pos)
    hi = np.ceil(pos)
    if interpolation == "lower":
        idx = lo
    elif interpolation == "higher":
        idx = hi
    elif interpolation == "nearest":
        idx = np.round(pos)
    elif interpolation in ("linear", "midpoint"):
        idx = None
    else:
        raise RuntimeError(f"quantile() interpolation must be one of linear, lower, higher, "
                           f"midpoint or nearest. Got {interpolation}")
    if idx is not None:
        return ops.take(sorted_x, idx.astype(np.int64), axis=dim)
    a = ops.take(sorted_x, lo.astype(np.int64), axis=dim)
    b = ops.take(sorted_x, hi.astype(np.int64), axis=dim)
    w = (pos - lo) if interpolation == "linear" else np.where(hi > lo, 0.5, 0.0)
    shape = [1] * _nd(sorted_x)
    shape[dim] = len(w)
    w = ops.astype(np.asarray(w).reshape(shape), sorted_x.dtype)
    return a + w * (b - a)


def _quantile(input, q, dim, keepdim, interpolation, name, ignore_nan):
    if input.dtype.kind != "f":
        raise RuntimeError(f"{name}() input tensor must be either float or double dtype")
    qa = _static_q(q, name)
    scalar_q = qa.ndim == 0
    qa = qa.reshape(-1)
    x = input
    if dim is None:
        x, d = ops.reshape(x, (-1,)), 0
    else:
        d = _dim(dim, _nd(x))
    n = _shape_of(x)[d]
    if n == 0:
        raise RuntimeError(f"{name}() input tensor cannot be empty")
    s = _shape.torch_sort(x, d).values          # NaN last
    nan = ops.isnan(x)
    if ignore_nan:
        valid = ops.sum(ops.logical_not(nan), axis=d, keepdims=True)      # per slice
        last = ops.astype(ops.maximum(valid - 1, 0), np.float64)
        pos = ops.expand_dims(last, 0) * ops.astype(
            np.asarray(qa).reshape((-1,) + (1,) * _nd(x)), np.float64)
        pos = ops.stop_gradient(pos)
        outs = []
        for k in range(len(qa)):
            p = pos[k]
            lo, hi = ops.floor(p), ops.ceil(p)
            if interpolation == "lower":
                v = ops.take_along_axis(s, ops.astype(lo, np.int64), axis=d)
            elif interpolation == "higher":
                v = ops.take_along_axis(s, ops.astype(hi, np.int64), axis=d)
            elif interpolation == "nearest":
                v = ops.take_along_axis(s, ops.astype(ops.round(p), np.int64), axis=d)
            elif interpolation in ("linear", "midpoint"):
                a = ops.take_along_axis(s, ops.astype(lo, np.int64), axis=d)
                b = ops.take_along_axis(s, ops.astype(hi, np.int64), axis=d)
                w = (p - lo) if interpolation == "linear" else ops.where(hi > lo, 0.5, 0.0)
                v = a + ops.astype(w, s.dtype) * (b - a)
            else:
                raise RuntimeError(f"{name}() interpolation must be one of linear, lower, "
                                   f"higher, midpoint or nearest. Got {interpolation}")
            outs.append(ops.where(valid == 0, np.nan, v))
        res = ops.squeeze(ops.stack(outs, 0), axis=d + 1)          # (q, the rest)
    else:
        res = _interp(s, qa * (n - 1), interpolation, d)                 # q along d
        res = ops.where(ops.any(nan, axis=d, keepdims=True), np.nan, res)
        res = ops.moveaxis(res, d, 0)
    if keepdim:
        if dim is None:
            res = ops.reshape(res, (len(qa),) + (1,) * _nd(input))
        else:
            res = ops.expand_dims(res, d + 1)
    if scalar_q:
        res = res[0]
    return res


@_torch_method("quantile")
def quantile(input, q, dim=None, keepdim=False, *, interpolation="linear", out=None):
    """torch.quantile: the q-th quantiles along ``dim`` (all elements when
    None); q a number or a 1-D list/tensor of them (a leading dimension)."""
    _no_out(out, "quantile")
    return _quantile(input, q, dim, keepdim, interpolation, "quantile", False)


@_torch_method("nanquantile")
def nanquantile(input, q, dim=None, keepdim=False, *, interpolation="linear", out=None):
    """torch.nanquantile: quantile ignoring NaN (NaN where a slice is all NaN)."""
    _no_out(out, "nanquantile")
    return _quantile(input, q, dim, keepdim, interpolation, "nanquantile", True)


def _no_out(out, name):
    if out is not None:
        raise TypeError(f"torch.{name}(out=) cannot write into a tracegrad value; assign the "
                        f"result")


# --- moments ------------------------------------------------------------------------------

def _correction(correction, unbiased):
    if unbiased is not None:
        return 1 if unbiased else 0
    return 1 if correction is None else correction


def var_mean(input, dim=None, unbiased=None, keepdim=False, *, correction=None, out=None):
    """torch.var_mean: (var, mean) along ``dim`` (unbiased by default)."""
    _no_out(out, "var_mean")
    if isinstance(dim, bool) and unbiased is None:      # var_mean(x, False): unbiased
        dim, unbiased = None, dim
    c = _correction(correction, unbiased)
    return (ops.var(input, axis=dim, ddof=c, keepdims=keepdim),
            ops.mean(input, axis=dim, keepdims=keepdim))


def std_mean(input, dim=None, unbiased=None, keepdim=False, *, correction=None, out=None):
    """torch.std_mean: (std, mean) along ``dim`` (unbiased by default)."""
    _no_out(out, "std_mean")
    if isinstance(dim, bool) and unbiased is None:
        dim, unbiased = None, dim
    c = _correction(correction, unbiased)
    return (ops.std(input, axis=dim, ddof=c, keepdims=keepdim),
            ops.mean(input, axis=dim, keepdims=keepdim))


@_torch_method("cov")
def cov(input, *, correction=1, fweights=None, aweights=None):
    """torch.cov: rows are variables, columns observations (a 1-D input is
    one variable: a 0-d result)."""
    x = input
    if _nd(x) > 2:
        raise RuntimeError(f"cov(): expected input to have two or fewer dimensions but got an "
                           f"input with {_nd(x)} dimensions")
    one = _nd(x) < 2
    if one:
        x = ops.reshape(x, (1, -1))
    if x.dtype.kind in "biu":
        x = ops.astype(x, _dtypes.Defaults.dtype)
    n = _shape_of(x)[1]
    w = None
    if fweights is not None:
        w = fweights
    if aweights is not None:
        w = aweights if w is None else w * aweights
    if w is None:
        avg = ops.mean(x, axis=1, keepdims=True)
        fact = n - correction
    else:
        w = ops.astype(w, x.dtype) if _is_value(w) else np.asarray(w, dtype=x.dtype)
        wsum = ops.sum(w)
        avg = ops.sum(x * w, axis=1, keepdims=True) / wsum
        if aweights is None:
            fact = wsum - correction
        else:
            fact = wsum - correction * ops.sum(w * aweights) / wsum
    xm = x - avg
    xw = xm if w is None else xm * w
    # a non-positive number of degrees of freedom divides by 0, as torch does
    fact = ops.maximum(fact, 0) if _is_value(fact) else (fact if fact > 0 else 0)
    c = ops.matmul(xw, ops.conj(ops.transpose(xm))) / fact
    return ops.reshape(c, ()) if one else c


def _pos(a):
    return a if a > 0 else 0


@_torch_method("corrcoef")
def corrcoef(input):
    """torch.corrcoef: Pearson's correlation coefficients (rows are variables)."""
    c = cov(input)
    if _nd(c) == 0:
        return c / c
    d = ops.diagonal(c, 0, 0, 1)
    sd = ops.sqrt(d)
    c = c / ops.expand_dims(sd, 1) / ops.expand_dims(sd, 0)
    return ops.clip(c, -1, 1) if c.dtype.kind == "f" else c


# --- distances ----------------------------------------------------------------------------

def cdist(x1, x2, p=2.0, compute_mode="use_mm_for_euclid_dist_if_necessary"):
    """torch.cdist: the p-norm distance of every row of x1 to every row of
    x2 ((B?, P, M) and (B?, R, M) give (B?, P, R))."""
    if _nd(x1) < 2 or _nd(x2) < 2:
        raise RuntimeError(f"cdist only supports at least 2D tensors, X1 got: {_nd(x1)}D")
    if _shape_of(x1)[-1] != _shape_of(x2)[-1]:
        raise RuntimeError(f"X1 and X2 must have the same number of columns. X1: "
                           f"{_shape_of(x1)[-1]} X2: {_shape_of(x2)[-1]}")
    if p < 0:
        raise RuntimeError(f"cdist only supports non-negative p values")
    diff = ops.expand_dims(x1, -2) - ops.expand_dims(x2, -3)
    return linalg.vector_norm(diff, ord=float(p), axis=-1)


def dist(input, other, p=2):
    """torch.dist: the p-norm of input - other."""
    return linalg.vector_norm(input - other, ord=float(p))


face_method(FACE, "dist")(dist)


# --- pointwise ----------------------------------------------------------------------------

def lerp(input, end, weight, *, out=None):
    """torch.lerp: input + weight * (end - input)."""
    _no_out(out, "lerp")
    return input + weight * (end - input)


def addcdiv(input, tensor1, tensor2, *, value=1, out=None):
    """torch.addcdiv: input + value * tensor1 / tensor2."""
    _no_out(out, "addcdiv")
    return input + value * (tensor1 / tensor2)


def addcmul(input, tensor1, tensor2, *, value=1, out=None):
    """torch.addcmul: input + value * tensor1 * tensor2."""
    _no_out(out, "addcmul")
    return input + value * (tensor1 * tensor2)


def clamp_min(input, min):
    out = ops.clip(input, min, None)
    # a number bound: torch's clamp_min(Tensor, Scalar), one edge
    return out if isinstance(min, Tensor) else _define.name_grad_fn(out, "ClampMinBackward0",
                                                            (("self", ("in", 0)),))


def clamp_max(input, max):
    out = ops.clip(input, None, max)
    return out if isinstance(max, Tensor) else _define.name_grad_fn(out, "ClampMaxBackward0",
                                                            (("self", ("in", 0)),))


def rsub(input, other, *, alpha=1):
    """torch.rsub: other - alpha * input (``2 - b`` is rsub(b, 2))."""
    return other - (input if alpha == 1 else input * alpha)


for _n, _f in (("lerp", lerp), ("addcdiv", addcdiv), ("addcmul", addcmul),
               ("clamp_min", clamp_min), ("clamp_max", clamp_max)):
    _torch_method(_n)(_f)


def _inplace_variant(name, fn):
    def method(self, *args, **kwargs):
        return _inplace(self, lambda t, *a: fn(t, *a, **kwargs), name, *args)
    method.__name__ = method.__qualname__ = name
    _torch_method(name)(method)


for _n, _f in (("lerp_", lerp), ("addcdiv_", addcdiv), ("addcmul_", addcmul),
               ("clamp_min_", clamp_min), ("clamp_max_", clamp_max)):
    _inplace_variant(_n, _f)


# --- indexing -----------------------------------------------------------------------------

def take_along_dim(input, indices, dim=None, *, out=None):
    """torch.take_along_dim: gather along ``dim`` with input and indices
    broadcast on the other dimensions (flattened both when dim is None)."""
    _no_out(out, "take_along_dim")
    if dim is None:
        return ops.take_along_axis(ops.reshape(input, (-1,)), ops.reshape(indices, (-1,)), 0)
    nd = _nd(input)
    d = _dim(dim, nd)
    si, sx = list(_shape_of(indices)), list(_shape_of(input))
    if len(si) != nd:
        raise RuntimeError(f"torch.take_along_dim(): input and indices should have the same "
                           f"number of dimensions, but got {nd} dimensions for input, and "
                           f"{len(si)} dimensions for indices")
    bx = list(np.broadcast_shapes(tuple(sx[:d] + [1] + sx[d + 1:]),
                                  tuple(si[:d] + [1] + si[d + 1:])))
    bi = list(bx)
    bx[d], bi[d] = sx[d], si[d]
    x = ops.broadcast_to(input, tuple(bx)) if tuple(bx) != tuple(sx) else input
    i = indices if tuple(bi) == tuple(si) else (
        ops.broadcast_to(indices, tuple(bi)) if _is_value(indices)
        else np.broadcast_to(indices, tuple(bi)))
    return ops.take_along_axis(x, i, d)


face_method(FACE, "take_along_dim")(take_along_dim)


def _along_index(index, dim, nd):
    """The advanced index that puts ``index``'s entries along ``dim`` and
    aranges on the other dimensions (torch's scatter/gather addressing)."""
    si = _shape_of(index)
    idx = []
    for k in range(nd):
        if k == dim:
            idx.append(index)
        else:
            shp = [1] * nd
            shp[k] = si[k]
            idx.append(np.arange(si[k]).reshape(shp))
    return tuple(idx)


def _check_scatter(self, dim, index, src, name):
    nd = _nd(self)
    d = _dim(dim, nd)
    if _nd(index) != nd:
        raise RuntimeError(f"Index tensor must have the same number of dimensions as self "
                           f"tensor")
    if getattr(index, "dtype", np.dtype(np.int64)).kind not in "iu":
        raise RuntimeError(f"{name}(): Expected dtype int64 for index")
    if src is not None and _is_value(src) and _nd(src):
        si, ss = _shape_of(index), _shape_of(src)
        if any(a > b for a, b in zip(si, ss)):
            raise RuntimeError(f"Expected index {list(si)} to be no larger than src "
                               f"{list(ss)} in every dimension")
        if tuple(ss) != tuple(si):
            src = src[tuple(slice(0, n) for n in si)]
    return d, src


def _src_values(self, index, src, value):
    if src is None:
        src = value
    if not _is_value(src) or not _nd(src):
        return ops.astype(ops.broadcast_to(src, _shape_of(index)), self.dtype) \
            if _is_value(src) else np.full(_shape_of(index), src, dtype=self.dtype)
    return ops.astype(src, self.dtype) if src.dtype != self.dtype else src


@_torch_method("scatter")
def scatter(input, dim, index, src=None, value=None, *, reduce=None):
    """torch.scatter: input with ``src`` (or ``value``) written at ``index``
    along ``dim``; reduce='add' or 'multiply' combines instead."""
    if reduce is not None:
        if reduce == "add":
            return scatter_add(input, dim, index, _src_values(input, index, src, value))
        if reduce == "multiply":
            return scatter_reduce(input, dim, index, _src_values(input, index, src, value),
                                  "prod")
        raise RuntimeError(f"reduce argument must be either add or multiply, got {reduce}")
    if src is None and value is None:
        raise TypeError("scatter() needs src or value")
    d, src = _check_scatter(input, dim, index, src, "scatter")
    return indexing.setitem(input, _along_index(index, d, _nd(input)),
                            _src_values(input, index, src, value))


@_torch_method("scatter_add")
def scatter_add(input, dim, index, src):
    """torch.scatter_add: input plus ``src`` added at ``index`` along ``dim``
    (repeated indices accumulate)."""
    d, src = _check_scatter(input, dim, index, src, "scatter_add")
    src = _src_values(input, index, src, None)
    return input + indexing.index_add(src, _along_index(index, d, _nd(input)),
                                      _shape_of(input))


@_torch_method("scatter_reduce")
def scatter_reduce(input, dim, index, src, reduce, *, include_self=True):
    """torch.scatter_reduce: reduce ('sum', 'prod', 'mean', 'amax', 'amin')
    the ``src`` entries scattered to each position (with the input's own
    value when include_self)."""
    d, src = _check_scatter(input, dim, index, src, "scatter_reduce")
    src = _src_values(input, index, src, None)
    nd = _nd(input)
    where = _along_index(index, d, nd)
    shape = _shape_of(input)
    hit = indexing.index_add(np.ones(_shape_of(index), input.dtype), where, shape) > 0
    count = indexing.index_add(np.ones(_shape_of(index), np.float64), where, shape)
    if reduce in ("sum", "mean"):
        total = indexing.index_add(src, where, shape)
        base = input if include_self else ops.where(hit, 0, input)
        res = base + total
        if reduce == "mean":
            n = count + (1 if include_self else 0)
            n = ops.maximum(n, 1)
            res = res / n
            if input.dtype.kind in "iub":
                res = ops.floor(res)
        return ops.astype(res, input.dtype)
    if reduce in ("amax", "amin", "prod"):
        # one target position per (source, position) pair: a dense comparison
        # along ``dim`` (the other dimensions of index must match the input's)
        si = _shape_of(index)
        if any(si[k] != shape[k] for k in range(nd) if k != d):
            raise RuntimeError(f"scatter_reduce(reduce='{reduce}') in tracegrad needs index "
                               f"to have the input's size in every dimension but dim")
        n = shape[d]
        pos = np.arange(n).reshape((n,) + (1,) * nd)
        hits = ops.equal(ops.expand_dims(index, 0), pos)
        # hits[p, ..., j, ...]: source j goes to position p along d
        s = ops.expand_dims(src, 0)
        if reduce == "prod":
            vals = ops.where(hits, s, 1)
            red = ops.prod(vals, axis=d + 1)
        else:
            fill = -np.inf if reduce == "amax" else np.inf
            if input.dtype.kind in "iub":
                info = np.iinfo(input.dtype)
                fill = info.min if reduce == "amax" else info.max
            vals = ops.where(hits, s, fill)
            red = ops.amax(vals, axis=d + 1) if reduce == "amax" else ops.amin(vals, axis=d + 1)
        red = ops.moveaxis(red, 0, d)
        red = ops.astype(red, input.dtype)
        if include_self:
            comb = input * red if reduce == "prod" else (
                ops.maximum(input, red) if reduce == "amax" else ops.minimum(input, red))
        else:
            comb = red
        return ops.where(hit, comb, input)
    raise RuntimeError(f"reduce argument must be either sum, prod, mean, amax or amin, got "
                       f"{reduce}")


def _inplace_of(name, fn):
    def method(self, *args, **kwargs):
        return _inplace(self, lambda t: fn(t, *args, **kwargs), name)
    method.__name__ = method.__qualname__ = name
    _torch_method(name)(method)


for _n, _f in (("scatter_", scatter), ("scatter_add_", scatter_add),
               ("scatter_reduce_", scatter_reduce)):
    _inplace_of(_n, _f)


def index_add(input, dim, index, source, *, alpha=1, out=None):
    """torch.index_add: input with ``alpha * source`` added at ``index``
    along ``dim`` (repeated indices accumulate)."""
    _no_out(out, "index_add")
    nd = _nd(input)
    d = _dim(dim, nd)
    if alpha != 1:
        source = source * alpha
    if _nd(source) == 0:
        source = ops.reshape(source, (1,))
    where = (slice(None),) * d + (index,)
    return input + ops.astype(indexing.index_add(source, where, _shape_of(input)), input.dtype)


def index_put(input, indices, values, accumulate=False):
    """torch.index_put: input with ``values`` written (or added, with
    accumulate) at the tensors of ``indices``."""
    idx = tuple(indices)
    if accumulate:
        vals = ops.broadcast_to(values, _shape_of(input[idx])) if _is_value(values) else \
            np.broadcast_to(np.asarray(values, input.dtype), _shape_of(input[idx]))
        return input + ops.astype(indexing.index_add(vals, idx, _shape_of(input)), input.dtype)
    return indexing.setitem(input, idx, ops.astype(values, input.dtype)
                            if _is_value(values) else values)


_torch_method("index_add")(index_add)
_torch_method("index_put")(index_put)
_inplace_of("index_add_", index_add)
_inplace_of("index_put_", index_put)


@_torch_method("masked_fill_")
def masked_fill_(self, mask, value):
    return _inplace(self, lambda t: ops.astype(ops.where(mask, value, t), t.dtype),
                    "masked_fill_")


@_torch_method("masked_select")
def masked_select(input, mask):
    """torch.masked_select: the elements where ``mask`` (broadcast) holds, 1-D."""
    shape = np.broadcast_shapes(_shape_of(input), _shape_of(mask))
    x = ops.broadcast_to(input, shape) if tuple(shape) != _shape_of(input) else input
    m = mask if tuple(shape) == _shape_of(mask) else (
        ops.broadcast_to(mask, shape) if _is_value(mask) else np.broadcast_to(mask, shape))
    return x[m]


@_torch_method("logcumsumexp")
def logcumsumexp(input, dim):
    """torch.logcumsumexp: log(cumsum(exp(x))) along ``dim``, without overflow."""
    d = _dim(dim, _nd(input))
    m = ops.stop_gradient(ops.amax(input, axis=d, keepdims=True))
    m = ops.where(ops.isfinite(m), m, 0)
    return ops.log(ops.cumsum(ops.exp(input - m), axis=d)) + m


_mode_t = collections.namedtuple("mode", ["values", "indices"])


@_torch_method("mode")
def mode(input, dim=-1, keepdim=False):
    """torch.mode: the most frequent value along ``dim`` (the smallest of
    equally frequent ones) and the index of its last occurrence."""
    nd = _nd(input)
    if nd == 0:
        return _mode_t(input, ops.astype(ops.zeros_like_value(input), np.int64))
    d = _dim(dim, nd)
    x = ops.moveaxis(input, d, -1)
    n = _shape_of(x)[-1]
    eq = ops.equal(ops.expand_dims(x, -1), ops.expand_dims(x, -2))      # [..., i, j]
    counts = ops.astype(ops.sum(eq, axis=-1), np.int64)                  # per i
    # the most frequent, then the smallest: more elements above it
    above = ops.astype(ops.sum(ops.less(ops.expand_dims(x, -1), ops.expand_dims(x, -2)),
                               axis=-1), np.int64)
    best = ops.argmax(counts * (n + 1) + above, axis=-1)
    val = ops.take_along_axis(ops.stop_gradient(x), ops.expand_dims(best, -1), -1)
    last = (n - 1) - ops.argmax(ops.flip(ops.equal(x, val), -1), axis=-1)
    idx = ops.expand_dims(ops.astype(last, np.int64), -1)
    values = ops.take_along_axis(x, idx, -1)[..., 0]
    indices = idx[..., 0]
    if keepdim:
        values = ops.expand_dims(values, d)
        indices = ops.expand_dims(indices, d)
    return _mode_t(values, indices)


# --- shapes -------------------------------------------------------------------------------

@_torch_method("unbind")
def unbind(input, dim=0):
    """torch.unbind: the slices along ``dim``, that dimension removed."""
    d = _dim(dim, _nd(input))
    return tuple(input[(slice(None),) * d + (i,)] for i in range(_shape_of(input)[d]))


@_torch_method("unflatten")
def unflatten(input, dim, sizes):
    """torch.unflatten: dimension ``dim`` split into ``sizes`` (one may be -1)."""
    shp = list(_shape_of(input))
    d = _dim(dim, len(shp))
    sizes = [int(s) for s in sizes]
    if sizes.count(-1) > 1:
        raise RuntimeError("only one dimension can be inferred")
    known = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
        sizes[sizes.index(-1)] = shp[d] // known if known else 0
    if math.prod(sizes) != shp[d]:
        raise RuntimeError(f"unflatten: Provided sizes {sizes} don't multiply up to the size "
                           f"of dim {dim} ({shp[d]}) in the input tensor")
    return ops.reshape(input, tuple(shp[:d] + sizes + shp[d + 1:]))


def meshgrid(*tensors, indexing=None):
    """torch.meshgrid: coordinate grids of 1-D tensors; indexing 'ij' (the
    default, torch's) or 'xy'."""
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        tensors = tuple(tensors[0])
    if indexing is None:
        indexing = "ij"
    if indexing not in ("ij", "xy"):
        raise RuntimeError(f"torch.meshgrid: indexing must be one of \"xy\" or \"ij\", but "
                           f"received: {indexing}")
    for t in tensors:
        if _nd(t) > 1:
            raise RuntimeError(f"torch.meshgrid: Expected 0D or 1D tensor in the tensor list "
                               f"but got: {t}")
    flat = [ops.reshape(t, (-1,)) for t in tensors]
    swap = indexing == "xy" and len(flat) >= 2
    if swap:
        flat[0], flat[1] = flat[1], flat[0]
    shape = tuple(_shape_of(t)[0] for t in flat)
    n = len(flat)
    grids = [ops.broadcast_to(ops.reshape(t, tuple(-1 if k == i else 1 for k in range(n))),
                              shape) for i, t in enumerate(flat)]
    if swap:
        grids[0], grids[1] = grids[1], grids[0]
    return tuple(grids)


def msort(input):
    """torch.msort: sorted along the first dimension."""
    return _shape.torch_sort(input, 0).values


face_method(FACE, "msort")(msort)


def diag_embed(input, offset=0, dim1=-2, dim2=-1):
    """torch.diag_embed: the last dimension of ``input`` on the diagonal
    (``offset`` above it) of the planes ``dim1``, ``dim2`` of the result."""
    shp = _shape_of(input)
    n = shp[-1] + abs(offset)
    rows = np.arange(shp[-1]) + _pos(-offset)
    cols = np.arange(shp[-1]) + _pos(offset)
    out = ops.astype(np.zeros(shp[:-1] + (n, n)), input.dtype)
    out = indexing.setitem(out, (Ellipsis, rows, cols), input)
    nd = len(shp) + 1
    d1, d2 = _dim(dim1, nd), _dim(dim2, nd)
    if d1 == d2:
        raise RuntimeError(f"diagonal dimensions cannot be identical {dim1}, {dim2}")
    return ops.moveaxis(out, (nd - 2, nd - 1), (d1, d2))


face_method(FACE, "diag_embed")(diag_embed)


def trapezoid(y, x=None, *, dx=None, dim=-1):
    """torch.trapezoid: the trapezoidal rule along ``dim`` (sample points
    ``x``, or spacing ``dx``, 1 by default)."""
    nd = _nd(y)
    d = _dim(dim, nd)
    n = _shape_of(y)[d]
    if n == 0:
        return ops.sum(y, axis=d)
    a = y[(slice(None),) * d + (slice(1, None),)]
    b = y[(slice(None),) * d + (slice(None, -1),)]
    if x is not None:
        if dx is not None:
            raise TypeError("trapezoid() received an invalid combination of arguments: x and dx")
        if _nd(x) == 1:
            dxs = x[1:] - x[:-1]
            shp = [1] * nd
            shp[d] = n - 1
            dxs = ops.reshape(dxs, tuple(shp)) if _is_value(dxs) else np.reshape(dxs, shp)
        else:
            dxs = ops.diff(x, axis=d if _nd(x) == nd else -1)
        return ops.sum((a + b) * dxs, axis=d) / 2
    return ops.sum(a + b, axis=d) * ((1 if dx is None else dx) / 2)


trapz = trapezoid


def cholesky_solve(B, L, upper=False, *, out=None):
    """torch.cholesky_solve: X with A X = B where A = L L^H (U^H U if upper)."""
    _no_out(out, "cholesky_solve")
    A = ops.matmul(ops.conj(_mT(L)), L) if upper else ops.matmul(L, ops.conj(_mT(L)))
    return linalg.solve(A, B)


face_method(FACE, "cholesky_solve")(cholesky_solve)


def _mT(x):
    return ops.swapaxes(x, -1, -2)


def pinverse(input, rcond=1e-15):
    """torch.pinverse: the pseudo-inverse (singular values below rcond times
    the largest dropped)."""
    return linalg.pinv(input, rcond)


face_method(FACE, "pinverse")(pinverse)


# --- torch's meaning of names NumPy has with another ------------------------------------

def argsort(input, dim=-1, descending=False, stable=False):
    """torch.argsort(input, dim=-1, descending=False, stable=False)."""
    return _shape.torch_argsort(input, dim, descending)


_svd_t = collections.namedtuple("svd", ["U", "S", "V"])


def svd(input, some=True, compute_uv=True, *, out=None):
    """torch.svd: (U, S, V) with input = U diag(S) V^H (V, not V^H; reduced
    unless some=False)."""
    _no_out(out, "svd")
    if not compute_uv:
        s = linalg.svd(input, full_matrices=False, compute_uv=False)
        m, n = _shape_of(input)[-2:]
        bs = _shape_of(input)[:-2]
        z = lambda r, c: ops.astype(np.zeros(bs + (r, c)), input.dtype)   # noqa: E731
        return _svd_t(z(m, m if not some else min(m, n)), s,
                      z(n, n if not some else min(m, n)))
    u, s, vh = linalg.svd(input, full_matrices=not some)
    return _svd_t(u, s, ops.conj(_mT(vh)))


face_method(FACE, "svd")(svd)


def diagonal(input, offset=0, dim1=0, dim2=1):
    """torch.diagonal(input, offset=0, dim1=0, dim2=1)."""
    return ops.diagonal(input, offset, dim1, dim2)


def _dim_alias(dim, axis, name):
    """torch accepts NumPy's ``axis=`` for ``dim`` (and ``keepdims=``)."""
    if axis is not None:
        if dim is not None:
            raise TypeError(f"{name}() got both dim and axis")
        return axis
    if dim is None:
        raise TypeError(f"{name}() missing 1 required positional argument: 'dim'")
    return dim


def _torch_dim_fn(np_fn, name, doc):
    def fn(input, dim=None, *, dtype=None, out=None, axis=None):
        _no_out(out, name)
        res = np_fn(input, axis=_dim_alias(dim, axis, name))
        return res if dtype is None else ops.astype(res, resolve_dtype(dtype))
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = doc
    return fn


cumsum = _torch_dim_fn(ops.cumsum, "cumsum", "torch.cumsum(input, dim, *, dtype=None)")
cumprod = _torch_dim_fn(ops.cumprod, "cumprod", "torch.cumprod(input, dim, *, dtype=None)")


def logsumexp(input, dim=None, keepdim=False, *, out=None, axis=None, keepdims=None):
    """torch.logsumexp(input, dim, keepdim=False): dim is required."""
    _no_out(out, "logsumexp")
    return ops.logsumexp(input, axis=_dim_alias(dim, axis, "logsumexp"),
                         keepdims=keepdim if keepdims is None else keepdims)


def flip(input, dims):
    """torch.flip(input, dims): a copy reversed along ``dims``."""
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    return ops.flip(input, dims)


def roll(input, shifts, dims=None):
    """torch.roll(input, shifts, dims=None)."""
    return ops.roll(input, shifts, dims)


def tile(input, dims):
    """torch.tile(input, dims)."""
    return ops.tile(input, tuple(dims) if not isinstance(dims, int) else (dims,))


def diff(input, n=1, dim=-1, prepend=None, append=None, *, axis=None):
    """torch.diff(input, n=1, dim=-1, prepend=None, append=None)."""
    if axis is not None:
        dim = axis
    kw = {}
    if prepend is not None:
        kw["prepend"] = prepend
    if append is not None:
        kw["append"] = append
    return ops.diff(input, n, dim, **kw)


def searchsorted(sorted_sequence, input, *, out_int32=False, right=False, side=None,
                 sorter=None):
    """torch.searchsorted(sorted_sequence, values, *, right=False, side=None):
    a 1-D sequence or one per row of the leading dimensions."""
    if side is None:
        side = "right" if right else "left"
    if _nd(sorted_sequence) <= 1:
        res = ops.searchsorted(sorted_sequence, input, side=side, sorter=sorter)
    else:
        rows = [ops.searchsorted(sorted_sequence[i], input[i], side=side)
                for i in range(_shape_of(sorted_sequence)[0])]
        res = ops.stack(rows, 0)
    return ops.astype(res, np.int32 if out_int32 else np.int64)


def count_nonzero(input, dim=None, *, axis=None):
    """torch.count_nonzero(input, dim=None): an int64 tensor."""
    if axis is not None:
        dim = axis
    return ops.astype(ops.count_nonzero(input, axis=dim), np.int64)


def round(input, *, decimals=0, out=None):
    """torch.round(input, *, decimals=0): half to even."""
    _no_out(out, "round")
    return ops.round(input, decimals)


def cholesky(input, upper=False, *, out=None):
    """torch.cholesky(input, upper=False)."""
    _no_out(out, "cholesky")
    L = linalg.cholesky(input)
    return ops.conj(_mT(L)) if upper else L


_lstsq_t = collections.namedtuple("lstsq", ["solution", "residuals", "rank",
                                            "singular_values"])


def removed_lstsq(*args, **kwargs):
    """torch.lstsq was removed from torch (1.9); so it is here."""
    raise RuntimeError("This function was deprecated since version 1.9 and is now removed. "
                       "`torch.lstsq` is deprecated in favor of `torch.linalg.lstsq`. "
                       "`torch.linalg.lstsq` has reversed arguments and does not return the "
                       "QR decomposition in the returned tuple.")


def removed_solve(*args, **kwargs):
    """torch.solve was removed from torch (1.9); so it is here."""
    raise RuntimeError("This function was deprecated since version 1.9 and is now removed. "
                       "`torch.solve` is deprecated in favor of `torch.linalg.solve`. "
                       "`torch.linalg.solve` has its arguments reversed and does not return "
                       "the LU factorization.")


def lstsq(A, B, rcond=None, *, driver=None):
    """torch.linalg.lstsq: (solution, residuals, rank, singular_values), the
    minimum-norm solution; as torch's default CPU driver ('gelsy'), the
    rank is given, the residuals where A is tall and of full rank, and the
    singular values are empty."""
    if _nd(A) == 2 and _nd(B) in (1, 2):
        x, res, rank, _ = linalg.lstsq(A, B, rcond)
        return _lstsq_t(x, res, ops.astype(rank, np.int64) if _is_value(rank) else
                        np.asarray(rank, np.int64), _empty(A))
    return _lstsq_t(linalg_solve_lstsq(A, B, rcond), _empty(A), _empty(A, np.int64),
                    _empty(A))


def linalg_solve_lstsq(A, B, rcond):
    vec = _nd(B) == 1
    b = ops.expand_dims(B, -1) if vec else B
    x = ops.matmul(linalg.pinv(A, rcond) if rcond is not None else linalg.pinv(A), b)
    return x[..., 0] if vec else x


def _empty(like, dtype=None):
    return ops.astype(np.zeros((0,)), dtype or like.dtype)


def solve(A, B, *, left=True, out=None):
    """torch.linalg.solve: B is a batch of vectors when it has one dimension
    fewer than A and matches A's leading dimensions (torch's rule), else a
    batch of matrices; left=False solves X A = B."""
    _no_out(out, "solve")
    if not left:
        return _mT(solve(_mT(A), _mT(B)))
    sa, sb = _shape_of(A), _shape_of(B)
    vec = len(sb) == 1 or (len(sb) == len(sa) - 1 and tuple(sb) == tuple(sa[:-1]))
    if vec:
        return ops.matmul(linalg.inv(A), ops.expand_dims(B, -1))[..., 0] if len(sb) > 1 \
            else linalg.solve(A, B)
    return linalg.solve(A, B)


def diag(input, diagonal=0, *, out=None):
    """torch.diag(input, diagonal=0)."""
    _no_out(out, "diag")
    return ops.diag(input, diagonal)


def trace(input):
    """torch.trace: the sum of a matrix's diagonal."""
    if _nd(input) != 2:
        raise RuntimeError(f"trace: expected a matrix, but got tensor with dim {_nd(input)}")
    return ops.trace(input)


def tensordot(a, b, dims=2, out=None):
    """torch.tensordot(a, b, dims=2)."""
    _no_out(out, "tensordot")
    return ops.tensordot(a, b, dims)


def take(input, index):
    """torch.take: elements of the flattened input at ``index`` (its shape)."""
    return ops.take(ops.reshape(input, (-1,)), index)


def dot(input, tensor, *, out=None):
    """torch.dot: the inner product of two 1-D tensors."""
    _no_out(out, "dot")
    if _nd(input) != 1 or _nd(tensor) != 1:
        raise RuntimeError(f"1D tensors expected, but got {_nd(input)}D and {_nd(tensor)}D "
                           f"tensors")
    return ops.dot(input, tensor)


def vdot(input, other, *, out=None):
    """torch.vdot: the inner product of two 1-D tensors, the first conjugated."""
    _no_out(out, "vdot")
    if _nd(input) != 1 or _nd(other) != 1:
        raise RuntimeError(f"1D tensors expected, but got {_nd(input)}D and {_nd(other)}D "
                           f"tensors")
    return ops.vdot(input, other)


_qr_t = collections.namedtuple("qr", ["Q", "R"])


def qr(input, some=True, *, out=None):
    """torch.qr(input, some=True): (Q, R), reduced unless some=False."""
    _no_out(out, "qr")
    q, r = linalg.qr(input, "reduced" if some else "complete")
    return _qr_t(q, r)


# --- new tensors like this one ------------------------------------------------------------

def _new(self, fill, size, dtype, requires_grad):
    shape = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list)) else \
        tuple(int(s) for s in size)
    dt = self.dtype if dtype is None else resolve_dtype(dtype)
    arr = fill(shape, dt)
    if isinstance(self, Tensor):
        data = self._data
        if type(data) is not np.ndarray:       # on the tensor's device
            arr = primitives.array_module(data).asarray(arr)
        t = Tensor(arr)
        return t.requires_grad_(True) if requires_grad else t
    return self._trace.follow(arr, self._face)


def _new_method(name, fill):
    def method(self, *size, dtype=None, device=None, requires_grad=False, layout=None,
               pin_memory=False):
        return _new(self, fill, size, dtype, requires_grad)
    method.__name__ = method.__qualname__ = name
    method.__doc__ = f"Tensor.{name}(size, *, dtype=None): of this tensor's dtype and device."
    _torch_method(name)(method)


_new_method("new_zeros", lambda s, d: np.zeros(s, d))
_new_method("new_ones", lambda s, d: np.ones(s, d))
_new_method("new_empty", lambda s, d: np.zeros(s, d))


@_torch_method("new_full")
def new_full(self, size, fill_value, *, dtype=None, device=None, requires_grad=False,
             layout=None, pin_memory=False):
    return _new(self, lambda s, d: np.full(s, fill_value, d), (tuple(size),), dtype,
                requires_grad)


@_torch_method("new_tensor")
def new_tensor(self, data, *, dtype=None, device=None, requires_grad=False, layout=None,
               pin_memory=False):
    """Tensor.new_tensor(data): a copy of data, of this tensor's dtype unless told."""
    if hasattr(data, "_face") and not isinstance(data, Tensor):
        return ops.astype(data, self.dtype if dtype is None else resolve_dtype(dtype))
    arr = np.array(data._data if isinstance(data, Tensor) else data)
    return _new(self, lambda s, d: arr.astype(d), (arr.shape,), dtype, requires_grad)
