"""Reductions and scans.

Rows: prod, amax, amin, argmax, argmin, all, any, cumsum, cumprod (sum lives
in base).  mean, var, std, logsumexp, nansum and nanmean are compositions of
primitives, so their gradients come from the rows they use; logsumexp
subtracts a ``stop_gradient`` maximum to stay finite.
"""
from __future__ import annotations

import builtins as _builtins
import collections

import numpy as np

from tracegrad.ops.primitives import Aval, bind, register
from tracegrad.ops._define import method, implements, axis_arg, norm_axes, _ops, refuse_out
from tracegrad.ops.base import (add, sub, mul, div, log, exp, sum, where, equal, reshape,
                                astype, stop_gradient, is_value,
                                shape_of, expand_reduced, shape_by_eval,
                                _reduced_shape)
from tracegrad.ops.elementwise import sqrt, isfinite, isnan, maximum, minimum

__all__ = ["mean", "prod", "amax", "amin", "max", "min", "argmax", "argmin", "var", "std",
           "logsumexp", "cumsum", "cumprod", "all", "any", "nansum", "nanmean", "count_nonzero"]


def _keep(keepdims, keepdim):
    return bool(keepdim) if keepdim is not None else bool(keepdims)


def _reduce_shape_rule(out_dtype=None):
    def rule(x, axis, keepdims):
        return Aval(_reduced_shape(x.shape, axis, keepdims), out_dtype or x.dtype)
    return rule


# --- prod -----------------------------------------------------------------------------

def _prod_others(x, axes):
    """For every element, the product of the other elements of its reduced
    group: the product of those before it times the product of those after
    it (two running products), exact with zeros and, being products of
    the elements themselves, with exact derivatives there too (JAX's rule;
    a formula that sets the zeros to 1 and divides has the right values but
    the wrong second derivative at a zero).  Linear in the group's size."""
    nd = len(shape_of(x))
    red = norm_axes(axes, nd)
    keep = tuple(a for a in range(nd) if a not in red)
    order = keep + red
    moved = _ops.transpose(x, order) if order != tuple(range(nd)) else x
    last = len(keep)        # the reduced axes as one, the last
    flat = reshape(moved, tuple(shape_of(moved))[:last] + (_count(x, red),))
    others = mul(_cumprod_before(flat, last),
                 _flip1(_cumprod_before(_flip1(flat, last), last), last))
    others = reshape(others, tuple(shape_of(moved)))
    if order == tuple(range(nd)):
        return others
    return _ops.transpose(others, tuple(int(i) for i in np.argsort(order)))


def _times_prod_others(v, x, out, axis, keepdims, reduced=False):
    """v times _prod_others(x) (``reduced``: v of the reduced shape, as the
    cotangent is, broadcast inside the branches, where the kernels read it
    in place): where x holds no zero (the common case), v * prod / x
    (torch's prod backward branches the same way; the division only where
    it divides by no zero)."""
    def full(v):
        return expand_reduced(v, tuple(x.shape), axis, keepdims) if reduced else v
    return _ops.cond(
        _zeros_in(x), lambda v, x, out: mul(full(v), _prod_others(x, axis)),
        lambda v, x, out: mul(full(v), div(expand_reduced(out, tuple(x.shape), axis, keepdims),
                                           x)),
        v, x, out)


def _zeros_in(x):
    """Does x hold a zero?  (A count in x's dtype, a sum the native target
    fuses into one vector loop over x: no cancellation, so never 0 with a
    zero counted.)"""
    return _ops.greater(sum(astype(equal(x, 0), x.dtype)), 0)


prod_p = register(
    "prod", lambda xp, x, axis, keepdims: xp.prod(x, axis=axis, keepdims=keepdims),
    shape=shape_by_eval(lambda xp, x, axis, keepdims: xp.prod(x, axis=axis, keepdims=keepdims)),
    vjp=(lambda g, out, x, axis, keepdims:
         _times_prod_others(g, x, out, axis, keepdims, reduced=True),),
    jvp=(lambda t, out, x, axis, keepdims:
         sum(_times_prod_others(t, x, out, axis, keepdims), axis=axis, keepdims=keepdims),),
    numpy="np.prod({0}, axis={axis}, keepdims={keepdims})", save_out=True)


# --- amax / amin ------------------------------------------------------------------------

def _extreme_weights(out, x, axis, keepdims):
    """Where x attains the extreme, 1/count (ties share evenly, as torch)."""
    hit = astype(equal(x, expand_reduced(out, tuple(x.shape), axis, keepdims)), x.dtype)
    return div(hit, sum(hit, axis=axis, keepdims=True))


def _extreme_row(name, fn):
    return register(
        name, lambda xp, x, axis, keepdims, _f=fn: getattr(xp, _f)(x, axis=axis, keepdims=keepdims),
        shape=_reduce_shape_rule(),
        vjp=(lambda g, out, x, axis, keepdims:
             mul(expand_reduced(g, tuple(x.shape), axis, keepdims),
                 _extreme_weights(out, x, axis, keepdims)),),
        jvp=(lambda t, out, x, axis, keepdims:
             sum(mul(t, _extreme_weights(out, x, axis, keepdims)), axis=axis, keepdims=keepdims),),
        numpy=f"np.{'maximum' if fn == 'max' else 'minimum'}.reduce({{0}}, axis={{axis}}, "
              f"keepdims={{keepdims}})",
        cupy=f"np.{fn}({{0}}, axis={{axis}}, keepdims={{keepdims}})", save_out=True)


amax_p = _extreme_row("amax", "max")
amin_p = _extreme_row("amin", "min")


def _arg_row(name):
    impl = lambda xp, x, axis, keepdims, _n=name: getattr(xp, _n)(x, axis=axis, keepdims=keepdims)
    return register(name, impl, shape=shape_by_eval(impl), nondiff=True, save_inputs=False,
                    numpy=f"np.{name}({{0}}, axis={{axis}}, keepdims={{keepdims}})")


argmax_p = _arg_row("argmax")
argmin_p = _arg_row("argmin")


def _bool_row(name):
    return register(
        name, lambda xp, x, axis, keepdims, _n=name: getattr(xp, _n)(x, axis=axis, keepdims=keepdims),
        shape=_reduce_shape_rule(np.dtype(bool)), nondiff=True, save_inputs=False,
        numpy=f"np.{name}({{0}}, axis={{axis}}, keepdims={{keepdims}})")


all_p = _bool_row("all")
any_p = _bool_row("any")


# --- scans ----------------------------------------------------------------------------------

def _flip1(x, axis):
    return _ops.flip(x, axis)


cumsum_p = register(
    "cumsum", lambda xp, x, axis: xp.cumsum(x, axis=axis),
    shape=shape_by_eval(lambda xp, x, axis: xp.cumsum(x, axis=axis)),
    # the transpose of a running sum is a running sum from the other end
    vjp=(lambda g, out, x, axis: _flip1(cumsum(_flip1(g, axis), axis), axis),),
    jvp=(lambda t, out, x, axis: cumsum(t, axis),),
    numpy="np.cumsum({0}, axis={axis})", save_inputs=False)


def _shifted(v, s, axis, later, fill=0):
    """v moved ``s`` places along ``axis``, ``fill`` coming in: v[i + s]
    (``later``) or v[i - s] at i."""
    shape = tuple(shape_of(v))
    n = shape[axis]
    pad = _ops.broadcast_to(np.full((), fill, np.dtype(v.dtype)),
                            shape[:axis] + (_builtins.min(s, n),) + shape[axis + 1:])
    idx = [slice(None)] * len(shape)
    idx[axis] = slice(s, None) if later else slice(None, _builtins.max(n - s, 0))
    part = _ops.getitem(v, tuple(idx))
    return _ops.concatenate([part, pad] if later else [pad, part], axis=axis)


def _affine_scan(a, b, axis, later):
    """r with r[i] = b[i] + a[i] * r[i + 1] (``later``; r[i - 1] otherwise),
    r = 0 past the ends: log2 n steps of products and sums of a and b (a
    Hillis-Steele scan, each step composing maps twice as far apart), no
    division, so exact where a holds zeros, and so are its derivatives."""
    n, s = shape_of(a)[axis], 1
    while s < n:
        b = add(b, mul(a, _shifted(b, s, axis, later)))
        a = mul(a, _shifted(a, s, axis, later))
        s *= 2
    return b


def _cumprod_before(x, axis):
    """The running product of the elements before each one (1 at the start)."""
    return bind(cumprod_p, _shifted(x, 1, axis, False, fill=1), axis=axis)


def _cumprod_vjp(g, out, x, axis):
    """d out[i] / d x[j] = prod_{k <= i, k != j} x[k] for j <= i, so the
    cotangent of x[j] is before[j] * r[j] with r[j] = g[j] + x[j + 1] * r[j + 1].
    With no zero in x (the common case): sum_{i >= j} g[i] out[i] / x[j], a
    running sum from the end (after a pass that counts the zeros); with a
    zero, the recurrence itself (_affine_scan): right where dividing by the
    zero is not, first derivatives and second alike."""
    return _ops.cond(
        _zeros_in(x),
        lambda g, x, out: mul(_cumprod_before(x, axis),
                              _affine_scan(_shifted(x, 1, axis, True), g, axis, True)),
        lambda g, x, out: div(_flip1(cumsum(_flip1(mul(g, out), axis), axis), axis), x),
        g, x, out)


def _cumprod_jvp(t, out, x, axis):
    """The tangent of out[i] = out[i - 1] * x[i]: T[i] = x[i] * T[i - 1] +
    before[i] * t[i]; with no zero in x, out * cumsum(t / x)."""
    return _ops.cond(
        _zeros_in(x),
        lambda t, x, out: _affine_scan(x, mul(_cumprod_before(x, axis), t), axis, False),
        lambda t, x, out: mul(out, cumsum(div(t, x), axis)), t, x, out)


cumprod_p = register(
    "cumprod", lambda xp, x, axis: xp.cumprod(x, axis=axis),
    shape=shape_by_eval(lambda xp, x, axis: xp.cumprod(x, axis=axis)),
    vjp=(_cumprod_vjp,), jvp=(_cumprod_jvp,), numpy="np.cumprod({0}, axis={axis})",
    save_out=True)


# --- the functional API ---------------------------------------------------------------------

def _axes(x, axis, dim):
    return norm_axes(axis_arg(axis, dim), len(shape_of(x)))


def _count(x, axes):
    n = 1
    for a in axes:
        n *= shape_of(x)[a]
    return n


def _to_float(x):
    dt = np.dtype(getattr(x, "dtype", np.float64))
    return x if dt.kind in "fc" else astype(x, np.float64)


def _masked(x, mask, fill):
    """x where ``mask`` (NumPy's ``where=``) holds, else the reduction's
    identity ``fill``: the masked elements take no part and get no gradient."""
    if mask is None or mask is True:
        return x
    return where(mask, x, fill)


def _as_dtype_of(v, like):
    dt = np.dtype(getattr(like, "dtype", np.float64))
    return v if np.dtype(getattr(v, "dtype", dt)) == dt else astype(v, dt)


def _initial(initial, res):
    """NumPy's ``initial=`` cast to the reduction's dtype first (an int
    reduction with initial=0.5 starts from 0)."""
    if is_value(initial):
        return _as_dtype_of(initial, res)
    with np.errstate(invalid="ignore"):
        return np.array(initial).astype(np.dtype(getattr(res, "dtype", np.float64)))


def _mask_count(x, mask, axes, keepdims):
    """How many elements ``mask`` selects in each reduced group (float64)."""
    if mask is None or mask is True:
        return _count(x, axes)
    m = _ops.broadcast_to(mask, tuple(shape_of(x)))
    return sum(astype(m, np.float64), axis=axes, keepdims=keepdims)


def _float_dtype_only(name, dtype):
    if dtype is not None and np.dtype(dtype).kind not in "fc":
        raise TypeError(f"tracegrad does not support np.{name}(..., dtype={np.dtype(dtype).name}): "
                        f"an integer accumulator truncates every element; compute in floating "
                        f"point and convert the result (np.{name}(x).astype(...))")


@implements(np.mean)
def mean(x, axis=None, dtype=None, out=None, keepdims=False, *, dim=None, keepdim=None,
         where=None):
    """Arithmetic mean: sum / count (integers average in float64, as NumPy);
    ``where=`` averages the selected elements: sum(where) / count(where)."""
    refuse_out("mean", out)
    axes = _axes(x, axis, dim)
    k = _keep(keepdims, keepdim)
    acc = _to_float(x) if dtype is None else astype(x, dtype)
    total = sum(_masked(acc, where, 0), axis=axes, keepdims=k)
    res = div(total, _mask_count(x, where, axes, k))
    res_dtype = np.dtype(dtype) if dtype is not None else np.dtype(getattr(acc, "dtype",
                                                                            np.float64))
    return res if np.dtype(getattr(res, "dtype", res_dtype)) == res_dtype else astype(res,
                                                                                      res_dtype)


@implements(np.prod)
def prod(x, axis=None, dtype=None, out=None, keepdims=False, initial=None, where=None, *,
         dim=None, keepdim=None):
    """Product of elements; its gradient is exact where elements are zero.
    ``where=`` multiplies the selected elements, ``initial=`` multiplies in."""
    refuse_out("prod", out)
    if dtype is not None:
        x = astype(x, dtype)
    res = bind(prod_p, _masked(x, where, 1), axis=_axes(x, axis, dim),
               keepdims=_keep(keepdims, keepdim))
    if initial is not None:
        res = _as_dtype_of(mul(res, _initial(initial, res)), res)
    return res


def _extreme(name, prim, pairwise, x, axis, out, keepdims, dim, keepdim, initial, mask):
    refuse_out(name, out)
    if initial is not None:
        initial = _initial(initial, x)
    if mask is not None and mask is not True:
        if initial is None:
            raise ValueError(f"reduction operation '{'maximum' if name == 'max' else 'minimum'}' "
                             f"does not have an identity, so to use a where mask one has to "
                             f"specify 'initial'")
        x = where(mask, x, initial)
    res = bind(prim, x, axis=_axes(x, axis, dim), keepdims=_keep(keepdims, keepdim))
    if initial is not None:    # NumPy's initial= takes part in the reduction
        res = _as_dtype_of(pairwise(res, _initial(initial, res)), res)
    return res


@implements(np.amax, np.max)
def amax(x, axis=None, out=None, keepdims=False, initial=None, where=None, *, dim=None,
         keepdim=None):
    """Largest element (NumPy style: an array, never indices); ``initial=``
    takes part as one more element, ``where=`` (with initial) selects."""
    return _extreme("max", amax_p, maximum, x, axis, out, keepdims, dim, keepdim, initial, where)


@implements(np.amin, np.min)
def amin(x, axis=None, out=None, keepdims=False, initial=None, where=None, *, dim=None,
         keepdim=None):
    return _extreme("min", amin_p, minimum, x, axis, out, keepdims, dim, keepdim, initial, where)


def sum_keywords(x, axis=None, dtype=None, out=None, keepdims=False, initial=None, where=None,
                 **kw):
    """np.sum's ``out=``, ``initial=`` and ``where=`` (base.sum sends them here)."""
    refuse_out("sum", out)
    if kw:
        raise TypeError(f"sum() got an unexpected keyword argument {next(iter(kw))!r}")
    res = sum(_masked(x, where, 0), axis=axis, dtype=dtype, keepdims=keepdims)
    if initial is not None:
        res = _as_dtype_of(add(res, _initial(initial, res)), res)
    return res


max = amax
min = amin

# torch's x.max(dim) returns (values, indices)
return_types_max = collections.namedtuple("max", ["values", "indices"])
return_types_min = collections.namedtuple("min", ["values", "indices"])


def _torch_extreme(x, dim, keepdim, other, axis, keepdims, values_fn, arg_fn, pair, pairwise):
    if other is not None or (dim is not None and is_value(dim)):
        return pairwise(x, dim if other is None else other)
    d = axis_arg(axis, dim)
    k = _keep(keepdims, keepdim)
    if d is None:
        return values_fn(x, keepdims=k)
    if not isinstance(d, int):
        return values_fn(x, axis=d, keepdims=k)
    return pair(values_fn(x, axis=d, keepdims=k), arg_fn(x, axis=d, keepdims=k))


def _max_method(x, dim=None, keepdim=False, *, other=None, axis=None, keepdims=None, out=None):
    """torch's max: ``x.max()`` a value, ``x.max(dim)`` (values, indices),
    ``x.max(other)`` the elementwise maximum."""
    return _torch_extreme(x, dim, keepdim, other, axis, keepdims, amax, argmax,
                          return_types_max, maximum)


def _min_method(x, dim=None, keepdim=False, *, other=None, axis=None, keepdims=None, out=None):
    return _torch_extreme(x, dim, keepdim, other, axis, keepdims, amin, argmin,
                          return_types_min, minimum)


def _arg(prim, x, axis, dim, keepdims, keepdim):
    a = axis_arg(axis, dim)
    if a is not None:
        a = int(a)
        nd = len(shape_of(x))
        if not -nd <= a < _builtins.max(nd, 1):
            raise IndexError(f"{prim.name}: axis {a} is out of range for {nd} dimensions")
        a %= _builtins.max(nd, 1)
    return bind(prim, x, axis=a, keepdims=_keep(keepdims, keepdim))


@implements(np.argmax)
def argmax(x, axis=None, out=None, keepdims=False, *, dim=None, keepdim=None):
    """Index of the largest element (no gradient)."""
    refuse_out("argmax", out)
    return _arg(argmax_p, x, axis, dim, keepdims, keepdim)


@implements(np.argmin)
def argmin(x, axis=None, out=None, keepdims=False, *, dim=None, keepdim=None):
    refuse_out("argmin", out)
    return _arg(argmin_p, x, axis, dim, keepdims, keepdim)


@implements(np.all)
def all(x, axis=None, out=None, keepdims=False, *, dim=None, keepdim=None, where=None):
    """True where every element is nonzero (no gradient); ``where=`` selects."""
    refuse_out("all", out)
    x = _masked(x, where, True)
    return bind(all_p, x, axis=_axes(x, axis, dim), keepdims=_keep(keepdims, keepdim))


@implements(np.any)
def any(x, axis=None, out=None, keepdims=False, *, dim=None, keepdim=None, where=None):
    refuse_out("any", out)
    x = _masked(x, where, False)
    return bind(any_p, x, axis=_axes(x, axis, dim), keepdims=_keep(keepdims, keepdim))




@implements(np.count_nonzero)
def count_nonzero(x, axis=None, *, keepdims=False, dim=None):
    return sum(astype(_ops.not_equal(x, 0), np.int64), axis=axis_arg(axis, dim),
               keepdims=keepdims)


method("count_nonzero")(lambda x, dim=None: count_nonzero(x, dim=dim))


def _correction(ddof, correction, unbiased, default):
    given = [v is not None for v in (ddof, correction, unbiased)]
    if given.count(True) > 1:
        raise TypeError("pass only one of ddof=, correction= and unbiased=")
    if ddof is not None:
        return ddof
    if correction is not None:
        return correction
    if unbiased is not None:
        return 1 if unbiased else 0
    return default


def _var(x, axis, dim, keepdims, keepdim, ddof, mask=None, given_mean=None):
    axes = _axes(x, axis, dim)
    x = _to_float(x)
    k = _keep(keepdims, keepdim)
    if given_mean is None:
        given_mean = mean(x, axis=axes, keepdims=True, where=mask)
    centred = sub(x, given_mean)
    if np.dtype(centred.dtype).kind == "c":   # |x - mean|^2, real as in NumPy
        re, im = _ops.real(centred), _ops.imag(centred)
        squares = add(mul(re, re), mul(im, im))
    else:
        squares = mul(centred, centred)
    total = sum(_masked(squares, mask, 0), axis=axes, keepdims=k)
    if mask is None or mask is True:
        return div(total, _builtins.max(_count(x, axes) - ddof, 0))
    return div(total, maximum(sub(_mask_count(x, mask, axes, k), ddof), 0.0))


def _numpy_var(name, x, axis, dtype, out, ddof, keepdims, dim, keepdim, correction, unbiased,
               where, mean):
    refuse_out(name, out)
    _float_dtype_only(name, dtype)
    res = _var(x, axis, dim, keepdims, keepdim,
               _correction(ddof if ddof else None, correction, unbiased, 0), where, mean)
    if name == "std":
        res = sqrt(res)
    if dtype is not None and np.dtype(dtype) != np.dtype(res.dtype):
        res = astype(res, dtype)
    return res


@implements(np.var)
def var(x, axis=None, dtype=None, out=None, ddof=0, keepdims=False, *, dim=None, keepdim=None,
        correction=None, unbiased=None, where=None, mean=None):
    """Variance, NumPy's default ``ddof=0`` (two passes, so it stays accurate);
    ``where=`` selects the elements, ``mean=`` is a mean already computed
    (with keepdims=True)."""
    return _numpy_var("var", x, axis, dtype, out, ddof, keepdims, dim, keepdim, correction,
                      unbiased, where, mean)


@implements(np.std)
def std(x, axis=None, dtype=None, out=None, ddof=0, keepdims=False, *, dim=None, keepdim=None,
        correction=None, unbiased=None, where=None, mean=None):
    """Standard deviation, NumPy's default ``ddof=0``."""
    return _numpy_var("std", x, axis, dtype, out, ddof, keepdims, dim, keepdim, correction,
                      unbiased, where, mean)


def _var_method(x, dim=None, unbiased=None, keepdim=False, *, correction=None, axis=None,
                ddof=None, keepdims=None):
    """torch's var: unbiased (correction=1) unless told otherwise."""
    if isinstance(dim, bool):  # x.var(False): the legacy unbiased positional
        dim, unbiased = None, dim
    return _var(x, axis, dim, keepdims, keepdim, _correction(ddof, correction, unbiased, 1))


def _std_method(x, dim=None, unbiased=None, keepdim=False, *, correction=None, axis=None,
                ddof=None, keepdims=None):
    return sqrt(_var_method(x, dim, unbiased, keepdim, correction=correction, axis=axis,
                            ddof=ddof, keepdims=keepdims))


@method("logsumexp")
def logsumexp(x, axis=None, keepdims=False, *, dim=None, keepdim=None):
    """log(sum(exp(x))) without overflow: the maximum is subtracted first
    (behind stop_gradient, so the gradient is exactly softmax)."""
    axes = _axes(x, axis, dim)
    x = _to_float(x)
    m = stop_gradient(amax(x, axis=axes, keepdims=True))
    m = where(isfinite(m), m, 0.0)  # all -inf (or inf) rows: nothing to subtract
    out = add(log(sum(exp(sub(x, m)), axis=axes, keepdims=True)), m)
    if not _keep(keepdims, keepdim):
        out = reshape(out, _reduced_shape(tuple(x.shape), axes, False))
    return out


where_ = where


def _scan(prim, x, axis, dtype, dim):
    """A running reduction along one axis (NumPy: the flattened array when
    axis is None)."""
    a = axis_arg(axis, dim)
    if dtype is not None:
        x = astype(x, dtype)
    if a is None:
        return bind(prim, _ops.ravel(x), axis=0)
    return bind(prim, x, axis=norm_axes(a, len(shape_of(x)))[0])


@method("cumsum")
@implements(np.cumsum)
def cumsum(x, axis=None, dtype=None, out=None, *, dim=None):
    """Running sum along an axis."""
    refuse_out("cumsum", out)
    return _scan(cumsum_p, x, axis, dtype, dim)


@method("cumprod")
@implements(np.cumprod)
def cumprod(x, axis=None, dtype=None, out=None, *, dim=None):
    """Running product; the gradient is exact with zeros, its derivatives too."""
    refuse_out("cumprod", out)
    return _scan(cumprod_p, x, axis, dtype, dim)


@implements(np.nansum)
def nansum(x, axis=None, dtype=None, out=None, keepdims=False, initial=None, where=None, *,
           dim=None, keepdim=None):
    """Sum treating NaN as zero (NaN entries get zero gradient)."""
    refuse_out("nansum", out)
    if np.dtype(getattr(x, "dtype", np.float64)).kind in "fc":   # integers have no NaN
        x = where_(isnan(x), 0.0, x)
    return sum_keywords(x, axis=axis_arg(axis, dim), dtype=dtype,
                        keepdims=_keep(keepdims, keepdim), initial=initial, where=where)


@implements(np.nanmean)
def nanmean(x, axis=None, dtype=None, out=None, keepdims=False, *, dim=None, keepdim=None,
            where=None):
    """Mean over the non-NaN entries (and those ``where=`` selects)."""
    refuse_out("nanmean", out)
    _float_dtype_only("nanmean", dtype)
    a = axis_arg(axis, dim)
    k = _keep(keepdims, keepdim)
    keep = _ops.logical_not(isnan(x))
    if where is not None and where is not True:
        keep = _ops.logical_and(keep, where)
    count = sum(astype(keep, getattr(x, "dtype", np.float64)), axis=a, keepdims=k)
    res = div(nansum(x, axis=a, keepdims=k, where=where), count)
    if dtype is not None and np.dtype(dtype) != np.dtype(res.dtype):
        res = astype(res, dtype)
    return res
