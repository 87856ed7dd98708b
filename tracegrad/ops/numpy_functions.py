"""NumPy functions written as compositions of the rows, with NumPy's signatures.

Everything here is the NumPy face of a function (``@implements(np.xxx)``):
``np.median(x)``, ``np.interp(x, xp, fp)``, ``np.cov(m)`` on traced values
and eager tensors.  Each is built from existing functional ops, so its
derivative comes from their rules and is never written twice.  Two small
rows live here because a composition would be wrong or slow: ``copysign``
(elementwise, fusible) and ``searchsorted`` (no gradient; a composition would
compare every x with every breakpoint).

The ufunc methods (``np.add.reduce/accumulate/outer/reduceat/at`` and the
same on the other differentiable binary ufuncs) are ``ufunc_method``, which
``ArrayMethods.__array_ufunc__`` calls for every method but ``__call__``.

The top-level names exported (``tg.interp``, ``tg.vander``...) are those that
torch either lacks or spells with the same meaning; NumPy's median, select,
gradient, cov and quantile mean something else in torch, so they are reached
through ``np.*`` only.
"""
from __future__ import annotations

import builtins as _builtins
import operator
import string

import numpy as np

from tracegrad.ops.primitives import Aval, bind, register
from tracegrad.ops._define import implements, norm_axes, NUMPY_FUNCTIONS
from tracegrad.ops.base import (add, sub, mul, div, neg, where, equal, astype, reshape,
                                transpose, sum, broadcast_to, swapaxes, matmul, is_value,
                                shape_of, def_elementwise, zeros_rule, zeros_like_value,
                                less, greater, clone)
from tracegrad.ops.elementwise import abs, sign, sqrt, clip, isnan, floor
from tracegrad.ops.reductions import amax, amin, prod, cumsum, cumprod, logsumexp
from tracegrad.ops.reductions import all as _all_op, any as _any_op
from tracegrad.ops.shape import (concatenate, stack, split, moveaxis, expand_dims, ravel,
                                 atleast_3d, flip, sort, argsort)
from tracegrad.ops.shape import pad as _pad_modes, pad_p
from tracegrad.ops.indexing import getitem, setitem, index_add, take
from tracegrad.ops import linalg as _linalg

__all__ = ["fabs", "real_if_close", "rollaxis", "dstack", "append", "hsplit", "vsplit",
           "dsplit", "interp", "polyval", "convolve", "correlate", "average", "vander",
           "heaviside", "copysign", "searchsorted"]

_NOVALUE = np._NoValue


# --- small helpers ----------------------------------------------------------------------

def _operand(x):
    """A tracegrad value or an ndarray (lists and scalars become arrays)."""
    return x if is_value(x) or isinstance(x, np.ndarray) else np.asarray(x)


def _dtype(x):
    return np.dtype(getattr(x, "dtype", None) or np.asarray(x).dtype)


def _ufunc_dtype(ufunc, *xs):
    """The dtype NumPy's ufunc gives for these operands (asked on 0-d stand-ins)."""
    with np.errstate(all="ignore"):
        return np.asarray(ufunc(*[np.zeros((), _dtype(x)) if hasattr(x, "dtype") else x
                                  for x in xs])).dtype


def _cast(x, dtype):
    return x if _dtype(x) == np.dtype(dtype) else astype(x, dtype)


def _no_out(name, out, kw=None):
    if out is not None or (kw and any(v is not None for v in kw.values())):
        bad = sorted(["out"] if out is not None else []) + sorted(k for k, v in (kw or {}).items()
                                                                    if v is not None)
        raise TypeError(f"np.{name}: the argument(s) {bad} cannot be honoured on a tracegrad "
                        f"value (it is never written in place); assign the result instead")


def _constant(v, fn, what):
    """A NumPy value for an argument that decides shapes or is checked for values."""
    if is_value(v):
        raise TypeError(f"np.{fn}: {what} must be a constant (a number, list or ndarray), not "
                        f"a tracegrad value: it decides the result's shape or is checked for "
                        f"values NumPy rejects")
    return np.asarray(v)


def _sl(ndim, axis, s):
    return (slice(None),) * axis + (s,) + (slice(None),) * (ndim - axis - 1)


def _axis1(axis, ndim, fn):
    a = operator.index(axis)
    if not -ndim <= a < _builtins.max(ndim, 1):
        raise np.exceptions.AxisError(f"np.{fn}: axis {a} is out of bounds for array of "
                                      f"dimension {ndim}")
    return a % _builtins.max(ndim, 1)


# --- rows --------------------------------------------------------------------------------

# d copysign(x, y)/dx = sign(x) * sign(result) (0 at x == 0); y only sets a
# sign, so its gradient is zero (a piecewise-constant input, not an error).
copysign_p = def_elementwise(
    "copysign", lambda xp, x, y: xp.copysign(x, y), (None, None),
    "np.copysign({0}, {1})", "copysign({0}, {1})", save_out=True,
    vjp=(lambda g, out, x, y: mul(g, mul(sign(out), sign(x))), zeros_rule),
    jvp=(lambda t, out, x, y: mul(t, mul(sign(out), sign(x))), zeros_rule))

searchsorted_p = register(
    "searchsorted", lambda xp, a, v, side: xp.searchsorted(a, v, side=side),
    shape=lambda a, v, side: Aval(tuple(getattr(v, "shape", ())), np.dtype(np.intp)),
    nondiff=True, save_inputs=False, numpy="np.searchsorted({0}, {1}, side={side})",
    doc="indices where v would be inserted into the sorted 1-D a (no gradient)")


# --- elementwise ---------------------------------------------------------------------------

@implements(np.fabs)
def fabs(x, out=None, **kw):
    """np.fabs: |x| as a float (integers become NumPy's float type for them)."""
    _no_out("fabs", out, kw)
    return abs(_cast(x, _ufunc_dtype(np.fabs, x)))


@implements(np.copysign)
def copysign(x1, x2, out=None, **kw):
    """|x1| with the sign of x2 (its sign bit: -0.0 counts as negative)."""
    _no_out("copysign", out, kw)
    return bind(copysign_p, x1, x2)


@implements(np.heaviside)
def heaviside(x1, x2, out=None, **kw):
    """0 where x1 < 0, x2 where x1 == 0, 1 where x1 > 0 (NaN stays NaN).  A
    step: x1's gradient is zero (through sign), x2's is 1 where x1 == 0."""
    _no_out("heaviside", out, kw)
    dt = _ufunc_dtype(np.heaviside, x1, x2)
    step = mul(add(sign(_cast(x1, dt)), 1.0), 0.5)
    return _cast(where(equal(x1, 0), x2, step), dt)


@implements(np.real_if_close)
def real_if_close(a, tol=100):
    """Real input is returned as is (NumPy does the same); tracegrad has no
    complex values, so there is nothing to drop."""
    if _dtype(a).kind == "c":
        raise TypeError("np.real_if_close: tracegrad does not support complex values; take "
                        "np.real(a) of the complex array before it reaches tracegrad")
    return a


# --- einsum in NumPy's sublist form ---------------------------------------------------------

def _sublist_letters(sub):
    # NumPy numbers labels 0-25 as 'A'-'Z' and 26-51 as 'a'-'z' (the implicit
    # output is alphabetical, so the order must be the same as NumPy's)
    out = []
    for s in sub:
        if s is Ellipsis:
            out.append("...")
            continue
        k = operator.index(s)
        if not 0 <= k < 52:
            raise ValueError(f"np.einsum: subscript {k} is not in [0, 52)")
        out.append(string.ascii_uppercase[k] if k < 26 else string.ascii_lowercase[k - 26])
    return "".join(out)


@implements(np.einsum)
def einsum(*operands, out=None, optimize=False, **kw):
    """np.einsum in both forms: ``einsum('ij,jk->ik', a, b)`` and the sublist
    form ``einsum(a, [0, 1], b, [1, 2], [0, 2])`` (rewritten to the first)."""
    if operands and isinstance(operands[0], str):
        return _linalg.einsum(*operands, out=out, optimize=optimize, **kw)
    rest = list(operands)
    output = rest.pop() if len(rest) % 2 else None  # an odd count: the output sublist
    ops = rest[0::2]
    spec = ",".join(_sublist_letters(s) for s in rest[1::2])
    if output is not None:
        spec += "->" + _sublist_letters(output)
    return _linalg.einsum(spec, *ops, out=out, optimize=optimize, **kw)


@implements(np.linalg.eigh)
def eigh(a, UPLO="L"):
    """np.linalg.eigh reading the lower (UPLO='L') or upper ('U') triangle.
    'U' is eigh of the transpose's lower triangle: the same eigenvalues;
    each eigenvector may differ from NumPy's 'U' result in sign (LAPACK
    picks signs per call), and the gradient is the symmetric one, as for 'L'."""
    if UPLO not in ("L", "U"):
        raise ValueError("np.linalg.eigh: UPLO argument must be 'L' or 'U'")
    return _linalg.eigh(swapaxes(a, -1, -2) if UPLO == "U" else a)


@implements(np.linalg.eigvalsh)
def eigvalsh(a, UPLO="L"):
    """Eigenvalues of a symmetric matrix, ascending (eigh's first output)."""
    return eigh(a, UPLO)[0]


@implements(np.linalg.eig, np.linalg.eigvals)
def eig(a):
    raise TypeError("np.linalg.eig/eigvals: the eigenvalues of a general matrix are complex, "
                    "and tracegrad has no complex values; for a symmetric matrix use "
                    "np.linalg.eigh or np.linalg.eigvalsh")


@implements(np.ptp)
def ptp(a, axis=None, out=None, keepdims=False):
    """Peak to peak: max - min along the axis (the gradient goes to both)."""
    _no_out("ptp", out)
    return sub(amax(a, axis=axis, keepdims=keepdims), amin(a, axis=axis, keepdims=keepdims))


# --- shapes: joining and splitting ------------------------------------------------------------

@implements(np.rollaxis)
def rollaxis(a, axis, start=0):
    """Move ``axis`` to the position before ``start`` (the older form of moveaxis)."""
    n = len(shape_of(a))
    axis = _axis1(axis, n, "rollaxis")
    if start < 0:
        start += n
    if not 0 <= start < n + 1:
        raise np.exceptions.AxisError(f"np.rollaxis: 'start' arg requires {-n} <= start < "
                                      f"{n + 1}, but {start} was passed in")
    if axis < start:
        start -= 1
    if axis == start:
        return a
    axes = [i for i in range(n) if i != axis]
    axes.insert(start, axis)
    return transpose(a, tuple(axes))


@implements(np.dstack)
def dstack(tup):
    """Stack along the third axis (1-D and 2-D inputs are made 3-D first)."""
    xs = atleast_3d(*tup)
    return concatenate(xs if isinstance(xs, list) else [xs], axis=2)


@implements(np.append)
def append(arr, values, axis=None):
    """arr with values added at the end (both flattened when axis is None)."""
    arr, values = _operand(arr), _operand(values)
    if axis is None:
        if len(shape_of(arr)) != 1:
            arr = ravel(arr)
        values = ravel(values)
        axis = len(shape_of(arr)) - 1
    return concatenate([arr, values], axis=axis)


def _split_along(name, ary, ios, axis, min_ndim):
    nd = len(shape_of(ary))
    if nd < min_ndim:
        raise ValueError(f"{name} only works on arrays of {min_ndim} or more dimensions")
    return split(ary, ios, axis)


@implements(np.hsplit)
def hsplit(ary, indices_or_sections):
    """Split along the second axis (the first for 1-D arrays)."""
    if len(shape_of(ary)) == 0:
        raise ValueError("hsplit only works on arrays of 1 or more dimensions")
    return split(ary, indices_or_sections, 1 if len(shape_of(ary)) > 1 else 0)


@implements(np.vsplit)
def vsplit(ary, indices_or_sections):
    return _split_along("vsplit", ary, indices_or_sections, 0, 2)


@implements(np.dsplit)
def dsplit(ary, indices_or_sections):
    return _split_along("dsplit", ary, indices_or_sections, 2, 3)


# --- choosing and generating ----------------------------------------------------------------

@implements(np.select)
def select(condlist, choicelist, default=0):
    """The first choice whose condition holds, ``default`` where none does:
    nested where, so each choice gets the gradient where it is picked."""
    if len(condlist) != len(choicelist):
        raise ValueError("list of cases must be same length as list of conditions")
    if not condlist:
        raise ValueError("select with an empty condition list is not possible")
    for i, c in enumerate(condlist):
        if _dtype(c) != np.bool_:
            raise TypeError(f"invalid entry {i} in condlist: should be boolean ndarray")
    # NumPy's dtype: ask np.select on 0-d stand-ins of the same dtypes
    dt = np.select([np.zeros((), bool)] * len(condlist),
                   [np.zeros((), _dtype(_operand(c))) for c in choicelist],
                   np.zeros((), _dtype(default)) if is_value(default) else default).dtype
    out = default
    for cond, choice in zip(reversed(condlist), reversed(choicelist)):
        out = where(cond, choice, out)
    shape = np.broadcast_shapes(*[shape_of(_operand(v)) for v in
                                  list(condlist) + list(choicelist) + [default]])
    out = _cast(_operand(out), dt)
    return out if shape_of(out) == shape else broadcast_to(out, shape)


@implements(np.linspace)
def linspace(start, stop, num=50, endpoint=True, retstep=False, dtype=None, axis=0, *,
             device=None):
    """Evenly spaced values between traced (or constant) endpoints; each
    value is start + k * step, so its gradient reaches both endpoints."""
    num = operator.index(num)
    if num < 0:
        raise ValueError(f"Number of samples, {num}, must be non-negative.")
    div_ = (num - 1) if endpoint else num
    dt = np.result_type(*[v.dtype if hasattr(v, "dtype") else v for v in (start, stop)])
    if dt.kind not in "fc":
        dt = np.dtype(np.float64)
    start, stop = _cast(_operand(start), dt), _cast(_operand(stop), dt)
    delta = sub(stop, start)
    extra = (1,) * len(shape_of(delta))
    k = np.arange(num, dtype=dt).reshape((-1,) + extra)
    if div_ > 0:
        step = div(delta, div_)
        y = add(mul(k, step), start)
    else:
        step = np.nan
        y = add(mul(k, delta), start)
    if endpoint and num > 1:  # the last value is exactly stop, as in NumPy
        last = expand_dims(broadcast_to(stop, shape_of(y)[1:]), 0)
        y = concatenate([y[:-1], last], axis=0)
    if axis != 0:
        y = moveaxis(y, 0, axis)
    if dtype is not None:
        if np.issubdtype(dtype, np.integer):
            y = floor(y)
        y = _cast(y, dtype)
    return (y, step) if retstep else y


@implements(np.vander)
def vander(x, N=None, increasing=False):
    """Columns of powers of x, built as NumPy does (a running product), so
    x**0 = 1 has a zero gradient even at x = 0."""
    x = _operand(x)
    if len(shape_of(x)) != 1:
        raise ValueError("x must be a one-dimensional array or sequence.")
    n = shape_of(x)[0]
    N = n if N is None else operator.index(N)
    dt = np.promote_types(_dtype(x), int)
    x = _cast(x, dt)
    if N == 0:
        return np.zeros((n, 0), dt)
    cols = [np.ones((n, 1), dt)]
    if N > 1:
        cols.append(cumprod(broadcast_to(expand_dims(x, 1), (n, N - 1)), axis=1))
    v = concatenate(cols, axis=1)
    return v if increasing else flip(v, 1)


@implements(np.polyval)
def polyval(p, x):
    """Horner's rule, as NumPy evaluates it: y = y * x + c for each coefficient."""
    p, x = _operand(p), _operand(x)
    y = np.zeros(shape_of(x), _dtype(x))
    for i in range(shape_of(p)[0] if shape_of(p) else 0):
        y = add(mul(y, x), p[i])
    return y


# --- searching and interpolation ---------------------------------------------------------------

@implements(np.searchsorted)
def searchsorted(a, v, side="left", sorter=None):
    """Insertion indices into the sorted 1-D a (no gradient)."""
    if side not in ("left", "right"):
        raise ValueError(f"side must be 'left' or 'right' (got {side!r})")
    a = _operand(a)
    if len(shape_of(a)) != 1:
        raise ValueError("object too deep for desired array: np.searchsorted needs a 1-D a")
    if sorter is not None:
        a = take(a, sorter)
    return bind(searchsorted_p, a, _operand(v), side=side)


@implements(np.interp)
def interp(x, xp, fp, left=None, right=None, period=None):
    """Piecewise-linear interpolation (float64, as NumPy).  Differentiable
    in x (the slope of its segment), in fp and in xp; left/right default to
    fp[0]/fp[-1]; with period the breakpoints wrap around."""
    x, xp, fp = (_cast(_operand(v), np.float64) for v in (x, xp, fp))
    if len(shape_of(xp)) != 1 or len(shape_of(fp)) != 1:
        raise ValueError("np.interp: xp and fp must be 1-D sequences")
    if shape_of(xp)[0] != shape_of(fp)[0]:
        raise ValueError("fp and xp are not of the same length.")
    if shape_of(xp)[0] == 0:
        raise ValueError("array of sample points is empty")
    if period is not None:
        period = float(np.abs(_constant(period, "interp", "period")))
        if period == 0:
            raise ValueError("period must be a non-zero value")
        left = right = None
        x = _ops_remainder(x, period)
        xp = _ops_remainder(xp, period)
        order = argsort(xp)
        xp, fp = take(xp, order), take(fp, order)
        xp = concatenate([sub(xp[-1:], period), xp, add(xp[0:1], period)])
        fp = concatenate([fp[-1:], fp, fp[0:1]])
    n = shape_of(xp)[0]
    left = fp[0] if left is None else left
    right = fp[-1] if right is None else right
    if n == 1:
        inside = fp[0]
    else:
        j = clip(sub(bind(searchsorted_p, xp, x, side="right"), 1), 0, n - 2)
        x0, x1, f0, f1 = getitem(xp, j), getitem(xp, add(j, 1)), getitem(fp, j), \
            getitem(fp, add(j, 1))
        inside = add(mul(div(sub(f1, f0), sub(x1, x0)), sub(x, x0)), f0)
        inside = where(equal(x, xp[-1]), fp[-1], inside)  # exactly fp[-1], as NumPy
    out = where(less(x, xp[0]), left, where(greater(x, xp[-1]), right, inside))
    return _cast(out, np.float64)


def _ops_remainder(x, m):
    return NUMPY_FUNCTIONS[np.remainder](x, m)


# --- convolution -----------------------------------------------------------------------------

def _correlate_core(a, v, mode):
    """NumPy's correlate of a with v for len(a) >= len(v): each output is a
    window of a (a constant gather, whose transpose is a scatter-add) times v."""
    n, m = shape_of(a)[0], shape_of(v)[0]
    if mode == "full":
        lo, hi = m - 1, m - 1
    elif mode == "same":
        lo, hi = m // 2, m - 1 - m // 2
    else:
        lo, hi = 0, 0
    if lo or hi:
        a = bind(pad_p, a, pad_width=((lo, hi),), value=0)
    k = n + lo + hi - m + 1
    windows = getitem(a, np.arange(k)[:, None] + np.arange(m)[None, :])
    return matmul(windows, v)


_MODES = {"valid": "valid", "same": "same", "full": "full", 0: "valid", 1: "same", 2: "full"}


def _conv_args(name, a, v, mode):
    if mode not in _MODES:
        raise ValueError(f"np.{name}: mode must be one of 'valid', 'same', 'full'; got {mode!r}")
    a, v = _operand(a), _operand(v)
    a = reshape(a, (-1,)) if len(shape_of(a)) == 0 else a
    v = reshape(v, (-1,)) if len(shape_of(v)) == 0 else v
    if len(shape_of(a)) != 1 or len(shape_of(v)) != 1:
        raise ValueError(f"np.{name}: object too deep for desired array (1-D inputs only)")
    if shape_of(a)[0] == 0:
        raise ValueError("a cannot be empty")
    if shape_of(v)[0] == 0:
        raise ValueError("v cannot be empty")
    return a, v, _MODES[mode]


@implements(np.correlate)
def correlate(a, v, mode="valid"):
    """Cross-correlation of two 1-D sequences: c[k] = sum_n a[n + k] * v[n]."""
    a, v, mode = _conv_args("correlate", a, v, mode)
    if shape_of(a)[0] < shape_of(v)[0]:  # NumPy swaps and reverses the result
        return flip(_correlate_core(v, a, mode), 0)
    return _correlate_core(a, v, mode)


@implements(np.convolve)
def convolve(a, v, mode="full"):
    """Discrete linear convolution of two 1-D sequences."""
    a, v, mode = _conv_args("convolve", a, v, mode)
    if shape_of(v)[0] > shape_of(a)[0]:
        a, v = v, a
    return _correlate_core(a, flip(v, 0), mode)


# --- calculus --------------------------------------------------------------------------------

@implements(getattr(np, "trapezoid", None), getattr(np, "trapz", None))
def trapezoid(y, x=None, dx=1.0, axis=-1):
    """Integral by the trapezoidal rule along ``axis`` (spacing dx, or the
    sample points x: 1-D along the axis, or shaped like y)."""
    y = _operand(y)
    nd = len(shape_of(y))
    axis = _axis1(axis, nd, "trapezoid")
    if x is None:
        d = dx
    else:
        x = _operand(x)
        if len(shape_of(x)) == 1:
            shape = [1] * nd
            shape[axis] = shape_of(x)[0] - 1
            d = reshape(sub(x[1:], x[:-1]), tuple(shape))
        else:
            d = NUMPY_FUNCTIONS[np.diff](x, axis=axis)
    mid = add(y[_sl(nd, axis, slice(1, None))], y[_sl(nd, axis, slice(None, -1))])
    return sum(div(mul(d, mid), 2.0), axis=axis)


def _gradient_axis(f, axis, h, edge_order):
    """NumPy's second-order differences along one axis: h is a number (even
    spacing) or the 1-D coordinates along the axis."""
    nd = len(shape_of(f))

    def at(s):
        return f[_sl(nd, axis, s)]

    def coef(c):  # a coefficient per position along the axis, broadcast against f
        if np.ndim(c) == 0 and not is_value(c):
            return c
        shape = [1] * nd
        shape[axis] = -1
        return reshape(c, tuple(shape))

    uniform = not isinstance(h, tuple)
    if uniform:
        interior = div(sub(at(slice(2, None)), at(slice(None, -2))), 2.0 * h)
    else:
        dx = h[1]
        dx1, dx2 = dx[:-1], dx[1:]
        a = neg(div(dx2, mul(dx1, add(dx1, dx2))))
        b = div(sub(dx2, dx1), mul(dx1, dx2))
        c = div(dx1, mul(dx2, add(dx1, dx2)))
        interior = add(add(mul(coef(a), at(slice(None, -2))), mul(coef(b), at(slice(1, -1)))),
                       mul(coef(c), at(slice(2, None))))
    f0, f1, f2 = at(slice(0, 1)), at(slice(1, 2)), at(slice(2, 3))
    l1, l2, l3 = at(slice(-1, None)), at(slice(-2, -1)), at(slice(-3, -2))
    if edge_order == 1:
        d0 = h if uniform else dx[0:1]
        dn = h if uniform else dx[-1:]
        first = div(sub(f1, f0), coef(d0))
        last = div(sub(l1, l2), coef(dn))
    elif uniform:  # NumPy divides the coefficients by h first
        first = add(add(mul(f0, -1.5 / h), mul(f1, 2.0 / h)), mul(f2, -0.5 / h))
        last = add(add(mul(l3, 0.5 / h), mul(l2, -2.0 / h)), mul(l1, 1.5 / h))
    else:
        dx1, dx2 = dx[0:1], dx[1:2]
        a = neg(div(add(mul(dx1, 2.0), dx2), mul(dx1, add(dx1, dx2))))
        b = div(add(dx1, dx2), mul(dx1, dx2))
        c = neg(div(dx1, mul(dx2, add(dx1, dx2))))
        first = add(add(mul(coef(a), f0), mul(coef(b), f1)), mul(coef(c), f2))
        dx1, dx2 = dx[-2:-1], dx[-1:]
        a = div(dx2, mul(dx1, add(dx1, dx2)))
        b = neg(div(add(dx2, dx1), mul(dx1, dx2)))
        c = div(add(mul(dx2, 2.0), dx1), mul(dx2, add(dx1, dx2)))
        last = add(add(mul(coef(a), l3), mul(coef(b), l2)), mul(coef(c), l1))
    return concatenate([first, interior, last], axis=axis)


@implements(np.gradient)
def gradient(f, *varargs, axis=None, edge_order=1):
    """Central differences inside, one-sided (edge_order 1 or 2) at the ends,
    with unit spacing, one spacing per axis, or coordinate arrays; one array
    per axis (a list, or the array itself for one axis)."""
    f = _operand(f)
    nd = len(shape_of(f))
    axes = tuple(range(nd)) if axis is None else tuple(
        _axis1(a, nd, "gradient") for a in (axis if isinstance(axis, (tuple, list)) else (axis,)))
    if len(set(axes)) != len(axes):
        raise ValueError("np.gradient: repeated axis")
    n = len(axes)
    if not varargs:
        spacing = [1.0] * n
    elif len(varargs) == 1 and np.ndim(varargs[0]) == 0 and not is_value(varargs[0]):
        spacing = [varargs[0]] * n
    elif len(varargs) == n:
        spacing = list(varargs)
    else:
        raise TypeError("invalid number of arguments")
    if edge_order > 2:
        raise ValueError("'edge_order' greater than 2 not supported")
    otype = _dtype(f) if _dtype(f).kind == "f" else np.dtype(np.float64)
    f = _cast(f, otype)
    outs = []
    for ax, h in zip(axes, spacing):
        length = shape_of(f)[ax]
        if length < edge_order + 1:
            raise ValueError("Shape of array too small to calculate a numerical gradient, at "
                             "least (edge_order + 1) elements are required.")
        if np.ndim(h) == 0 and not is_value(h):
            h = float(h)
        else:
            h = _operand(h)
            if len(shape_of(h)) != 1:
                raise ValueError("distances must be either scalars or 1d")
            if shape_of(h)[0] != length:
                raise ValueError("when 1d, distances must match the length of the "
                                 "corresponding dimension")
            if _dtype(h).kind != "f":
                h = _cast(h, np.float64)
            dx = sub(h[1:], h[:-1])
            if not is_value(dx) and np.all(dx == dx[0]):
                h = float(dx[0])  # even spacing: NumPy uses the scalar formula
            else:
                h = (h, dx)
        outs.append(_cast(_gradient_axis(f, ax, h, edge_order), otype))
    return outs[0] if n == 1 else tuple(outs)


# --- statistics -------------------------------------------------------------------------------

@implements(np.average)
def average(a, axis=None, weights=None, returned=False, *, keepdims=_NOVALUE):
    """Weighted mean; ``weights`` may be traced too (then the zero-sum check
    NumPy makes cannot be done while tracing)."""
    a = _operand(a)
    nd = len(shape_of(a))
    kd = False if keepdims is _NOVALUE else bool(keepdims)
    if axis is not None:  # in the order given: weights' axes follow it
        axis = tuple(_axis1(ax, nd, "average") for ax in
                     (axis if isinstance(axis, (tuple, list)) else (axis,)))
    axes = tuple(range(nd)) if axis is None else axis
    if weights is None:
        avg = NUMPY_FUNCTIONS[np.mean](a, axis=axes, keepdims=kd)
        n = 1
        for ax in axes:
            n *= shape_of(a)[ax]
        scl = np.asarray(n, dtype=_dtype(avg))
    else:
        w = _operand(weights)
        if _dtype(a).kind in "biu":
            rdt = np.result_type(_dtype(a), _dtype(w), "f8")
        else:
            rdt = np.result_type(_dtype(a), _dtype(w))
        if shape_of(a) != shape_of(w):
            if axis is None:
                raise TypeError("Axis must be specified when shapes of a and weights differ.")
            if shape_of(w) != tuple(shape_of(a)[ax] for ax in axis):
                raise ValueError("Shape of weights must be consistent with shape of a along "
                                 "specified axis.")
            w = transpose(w, tuple(np.argsort(axis).tolist()))
            w = reshape(w, tuple(s if ax in axis else 1 for ax, s in enumerate(shape_of(a))))
        scl = sum(_cast(w, rdt), axis=axes, keepdims=kd)
        if not is_value(scl) and np.any(np.asarray(scl) == 0.0):
            raise ZeroDivisionError("Weights sum to zero, can't be normalized")
        avg = div(sum(mul(_cast(a, rdt), _cast(w, rdt)), axis=axes, keepdims=kd), scl)
    if returned:
        if shape_of(scl) != shape_of(avg):
            scl = broadcast_to(scl, shape_of(avg))
        return avg, scl
    return avg


def _weights(v, fn, name, n, integer):
    w = _constant(v, fn, name).astype(float)
    if integer and not np.all(w == np.around(w)):
        raise TypeError("fweights must be integer")
    if w.ndim > 1:
        raise RuntimeError(f"cannot handle multidimensional {name}")
    if w.shape[0] != n:
        raise RuntimeError(f"incompatible numbers of samples and {name}")
    if np.any(w < 0):
        raise ValueError(f"{name} cannot be negative")
    return w


@implements(np.cov)
def cov(m, y=None, rowvar=True, bias=False, ddof=None, fweights=None, aweights=None, *,
        dtype=None):
    """Covariance matrix of the rows (rowvar) or columns of m (and y), with
    NumPy's ddof, bias and frequency/analytic weights (constants)."""
    if ddof is not None and ddof != int(ddof):
        raise ValueError("ddof must be integer")
    m = _operand(m)
    if len(shape_of(m)) > 2:
        raise ValueError("m has more than 2 dimensions")
    if y is not None:
        y = _operand(y)
        if len(shape_of(y)) > 2:
            raise ValueError("y has more than 2 dimensions")
    if dtype is None:
        dtype = np.result_type(_dtype(m), *([_dtype(y)] if y is not None else []), np.float64)
    X = _cast(m, dtype)
    if len(shape_of(X)) < 2:
        X = reshape(X, (1, -1))
    if not rowvar and len(shape_of(m)) != 1:
        X = transpose(X)
    if shape_of(X)[0] == 0:
        return np.array([], dtype=dtype).reshape(0, 0)
    if y is not None:
        Y = _cast(y, dtype)
        if len(shape_of(Y)) < 2:
            Y = reshape(Y, (1, -1))
        if not rowvar and shape_of(Y)[0] != 1:
            Y = transpose(Y)
        X = concatenate([X, Y], axis=0)
    if ddof is None:
        ddof = 0 if bias else 1
    n = shape_of(X)[1]
    w = fw = aw = None
    if fweights is not None:
        w = fw = _weights(fweights, "cov", "fweights", n, True)
    if aweights is not None:
        aw = _weights(aweights, "cov", "aweights", n, False)
        w = aw if w is None else w * aw
    if w is None:
        avg = NUMPY_FUNCTIONS[np.mean](X, axis=1)
        fact = n - ddof
    else:
        w_sum = float(np.sum(w))
        avg = div(sum(mul(X, w), axis=1), w_sum)
        if ddof == 0:
            fact = w_sum
        elif aw is None:
            fact = w_sum - ddof
        else:
            fact = w_sum - ddof * float(np.sum(w * aw)) / w_sum
    if fact <= 0:
        import warnings
        warnings.warn("Degrees of freedom <= 0 for slice", RuntimeWarning, stacklevel=2)
        fact = 0.0
    X = sub(X, expand_dims(avg, 1))
    X_T = transpose(X if w is None else mul(X, w))
    with np.errstate(divide="ignore"):
        scale = np.true_divide(1, fact)  # NumPy multiplies by 1 / fact
    c = mul(matmul(X, X_T), scale)
    return NUMPY_FUNCTIONS[np.squeeze](c)


@implements(np.corrcoef)
def corrcoef(x, y=None, rowvar=True, *, dtype=None):
    """Pearson correlation coefficients: cov / (std_i std_j), clipped to [-1, 1]."""
    c = cov(x, y, rowvar, dtype=dtype)
    if len(shape_of(c)) == 0:
        return div(c, c)
    std = sqrt(_linalg.diagonal(c))
    c = div(div(c, expand_dims(std, 1)), expand_dims(std, 0))
    return clip(c, -1, 1)


def _to_last(a, axis, fn):
    """a with the reduced axes merged into one last axis, and the shapes of
    the result without and with keepdims."""
    a = _operand(a)
    s = shape_of(a)
    if axis is None:
        return reshape(a, (-1,)), (), (1,) * len(s)
    axes = norm_axes(axis, len(s))
    rest = [i for i in range(len(s)) if i not in axes]
    k = 1
    for ax in axes:
        k *= s[ax]
    moved = transpose(a, tuple(rest) + axes) if tuple(rest) + axes != tuple(range(len(s))) else a
    out = tuple(s[i] for i in rest)
    return (reshape(moved, out + (k,)), out,
            tuple(1 if i in axes else d for i, d in enumerate(s)))


@implements(np.median)
def median(a, axis=None, out=None, overwrite_input=False, keepdims=False):
    """The middle value (the mean of the two middle values for an even count);
    its gradient goes to the selected element(s), NaN if the slice has one."""
    _no_out("median", out)
    x, shape, kshape = _to_last(a, axis, "median")
    if _dtype(x).kind in "biu":
        x = _cast(x, np.float64)
    n = shape_of(x)[-1]
    if n == 0:
        raise ValueError("np.median of an empty slice: NumPy returns NaN with a warning; "
                         "tracegrad refuses (there is no element to differentiate)")
    s = sort(x, axis=-1)
    half = n // 2
    med = s[..., half] if n % 2 else div(add(s[..., half - 1], s[..., half]), 2.0)
    med = where(isnan(s[..., -1]), np.nan, med)  # NaN sorts last: any NaN gives NaN
    med = _cast(med, _dtype(x))
    return reshape(med, kshape if keepdims else shape)


_QUANTILE_METHODS = ("linear", "lower", "higher", "midpoint", "nearest")


def _quantile(fn, a, q, axis, method, keepdims, weights, interpolation):
    if interpolation is not None:
        method = interpolation
    if weights is not None:
        raise NotImplementedError(f"np.{fn}(weights=) needs method='inverted_cdf', which "
                                  f"tracegrad does not differentiate; weight the data yourself")
    if method not in _QUANTILE_METHODS:
        raise NotImplementedError(
            f"np.{fn}: method={method!r} is not supported by tracegrad; use one of "
            f"{', '.join(_QUANTILE_METHODS)} (the default 'linear' is NumPy's)")
    x, shape, kshape = _to_last(a, axis, fn)
    if _dtype(x).kind in "biu" and method in ("linear", "midpoint"):
        x = _cast(x, np.float64)
    n = shape_of(x)[-1]
    if n == 0:
        raise ValueError(f"np.{fn} of an empty slice has no element to select")
    s = sort(x, axis=-1)
    qs = q.reshape(-1)
    results = []
    for qi in qs:
        if method == "linear":  # NumPy's virtual index and its lerp, exactly
            v = n * qi + (1 + qi * (1 - 1 - 1)) - 1
        else:
            v = (n - 1) * qi
        if method == "lower":
            v = np.floor(v)
        elif method == "higher":
            v = np.ceil(v)
        elif method == "nearest":
            v = np.around(v)
        lo = int(np.clip(np.floor(v), 0, n - 1))
        hi = int(np.clip(np.floor(v) + 1, 0, n - 1))
        gamma = float(v - np.floor(v))
        if method == "midpoint":
            gamma = 0.0 if v % 1 == 0 else 0.5
        a_, b_ = s[..., lo], s[..., hi]
        if gamma == 0.0:
            r = a_
        else:
            d = sub(b_, a_)
            r = sub(b_, mul(d, 1 - gamma)) if gamma >= 0.5 else add(a_, mul(d, gamma))
        r = where(isnan(s[..., -1]), np.nan, r)
        results.append(reshape(_cast(r, _dtype(x)), kshape if keepdims else shape))
    out = stack(results, axis=0)
    return reshape(out, q.shape + shape_of(out)[1:])


def _q_arg(q, fn, scale):
    q = _constant(q, fn, "q").astype(np.float64) / scale
    if not (np.all(q >= 0) and np.all(q <= 1)):
        raise ValueError("Quantiles must be in the range [0, 1]" if scale == 1 else
                         "Percentiles must be in the range [0, 100]")
    return q


@implements(np.quantile)
def quantile(a, q, axis=None, out=None, overwrite_input=False, method="linear",
             keepdims=False, *, weights=None, interpolation=None):
    """q-th quantiles (constant q) by the methods linear (NumPy's default),
    lower, higher, midpoint and nearest; the gradient goes to the one or
    two order statistics each quantile interpolates."""
    _no_out("quantile", out)
    return _quantile("quantile", a, _q_arg(q, "quantile", 1), axis, method, keepdims, weights,
                     interpolation)


@implements(np.percentile)
def percentile(a, q, axis=None, out=None, overwrite_input=False, method="linear",
               keepdims=False, *, weights=None, interpolation=None):
    """np.quantile with q in percent."""
    _no_out("percentile", out)
    return _quantile("percentile", a, _q_arg(q, "percentile", 100), axis, method, keepdims,
                     weights, interpolation)


# --- pad: per-axis constants and odd reflection ----------------------------------------------

@implements(np.pad)
def pad(array, pad_width, mode="constant", **kwargs):
    """np.pad: mode constant with one value or per-axis (before, after)
    values, and edge, reflect, symmetric, wrap (reflect_type 'even' or 'odd')."""
    x = _operand(array)
    s = shape_of(x)
    width = np.broadcast_to(np.asarray(pad_width, dtype=np.int64), (len(s), 2))
    if np.any(width < 0):
        raise ValueError("index can't contain negative values")
    width = tuple((int(a), int(b)) for a, b in width)
    if mode == "constant":
        extra = sorted(set(kwargs) - {"constant_values"})
        if extra:
            raise ValueError(f"unsupported keyword arguments for mode 'constant': {extra}")
        cv = _constant(kwargs.get("constant_values", 0), "pad", "constant_values")
        if cv.ndim == 0:
            return bind(pad_p, x, pad_width=width, value=cv.item())
        # NumPy pads axis after axis, so later axes own the corners: pad a
        # constant array of zeros the same way and add it to the zero padding
        fill = np.pad(np.zeros(s, dtype=_dtype(x)), width, mode="constant",
                      constant_values=cv)
        return add(bind(pad_p, x, pad_width=width, value=0), fill)
    if mode in ("reflect", "symmetric") and kwargs.get("reflect_type", "even") == "odd":
        if set(kwargs) - {"reflect_type"}:
            raise ValueError(f"unsupported keyword arguments for mode {mode!r}: "
                             f"{sorted(set(kwargs) - {'reflect_type'})}")
        # odd reflection is linear in the values: per axis, the matrix NumPy's
        # own pad makes of the identity
        for ax, (a, b) in enumerate(width):
            if a or b:
                n = s[ax]
                P = np.pad(np.eye(n), ((a, b), (0, 0)), mode=mode, reflect_type="odd")
                x = moveaxis(matmul(P.astype(_dtype(x)), moveaxis(x, ax, -2)), -2, ax) \
                    if len(s) > 1 else matmul(P.astype(_dtype(x)), x)
        return x
    kw = {k: v for k, v in kwargs.items() if not (k == "reflect_type" and v == "even")}
    return _pad_modes(x, width, mode=mode, **kw)


# --- ufunc methods -----------------------------------------------------------------------------

def _binary_fn(ufunc, method):
    fn = NUMPY_FUNCTIONS.get(ufunc)
    if fn is None or ufunc.nin != 2:
        raise NotImplementedError(
            f"np.{ufunc.__name__}.{method} is not supported by tracegrad: "
            f"{'it is not a binary ufunc' if fn is not None else 'the ufunc has no rule'}; "
            f"the methods reduce, accumulate, outer, reduceat and at work on the "
            f"differentiable binary ufuncs (np.add, np.multiply, np.maximum, np.logaddexp...)")
    return fn


def _reduce_one(ufunc, x, axes, keepdims):
    """Reduce x over axes: the rows of add, multiply, maximum, minimum,
    logaddexp, all, any; any other binary ufunc folds left to right."""
    fast = {np.add: sum, np.multiply: prod, np.maximum: amax, np.minimum: amin,
            np.logaddexp: logsumexp, np.logical_and: _all_op, np.logical_or: _any_op}.get(ufunc)
    if fast is not None:
        return fast(x, axis=axes, keepdims=keepdims)
    fn = _binary_fn(ufunc, "reduce")
    s = shape_of(x)
    rest = tuple(i for i in range(len(s)) if i not in axes)
    k = 1
    for ax in axes:
        k *= s[ax]
    if k == 0:
        raise ValueError(f"zero-size array to reduction operation {ufunc.__name__} which has "
                         f"no identity")
    xs = reshape(transpose(x, axes + rest), (k,) + tuple(s[i] for i in rest))
    r = xs[0]
    for i in range(1, k):
        r = fn(r, xs[i])
    if keepdims:
        r = reshape(r, tuple(1 if i in axes else d for i, d in enumerate(s)))
    return r


def _ufunc_reduce(ufunc, array, axis=0, dtype=None, out=None, keepdims=False,
                  initial=_NOVALUE, where=True):
    _no_out(f"{ufunc.__name__}.reduce", out)
    x = _operand(array)
    s = shape_of(x)
    # NumPy on a stand-in of the same rank and dtype: its errors (several
    # axes for a non-reorderable ufunc, no identity) and its result dtype
    probe_kw = {} if initial is _NOVALUE else {"initial": initial}
    probe = ufunc.reduce(np.zeros(tuple(_builtins.min(d, 1) for d in s), _dtype(x)), axis=axis,
                         dtype=dtype, keepdims=keepdims, **probe_kw)
    axes = norm_axes(axis, len(s))
    if dtype is not None:
        x = _cast(x, dtype)
    if where is not True:
        fill = initial if initial is not _NOVALUE else ufunc.identity
        if fill is None:
            raise ValueError(f"reduction operation '{ufunc.__name__}' does not have an "
                             f"identity, so to use a where mask one has to specify 'initial'")
        x = NUMPY_FUNCTIONS[np.where](_operand(where), x, fill)
        x = broadcast_to(x, s) if shape_of(x) != s else x
    r = _reduce_one(ufunc, x, axes, keepdims)
    if initial is not _NOVALUE:
        r = _binary_fn(ufunc, "reduce")(initial, r)
    return _cast(r, np.asarray(probe).dtype)


def _ufunc_accumulate(ufunc, array, axis=0, dtype=None, out=None):
    _no_out(f"{ufunc.__name__}.accumulate", out)
    x = _operand(array)
    nd = len(shape_of(x))
    if nd == 0:
        raise TypeError("cannot accumulate on a scalar")
    axis = _axis1(axis, nd, f"{ufunc.__name__}.accumulate")
    if dtype is not None:
        x = _cast(x, dtype)
    if ufunc is np.add:
        return cumsum(x, axis=axis)
    if ufunc is np.multiply:
        return cumprod(x, axis=axis)
    fn = _binary_fn(ufunc, "accumulate")  # a left fold, one node per step
    r = x[_sl(nd, axis, 0)]
    parts = [r]
    for i in range(1, shape_of(x)[axis]):
        r = fn(r, x[_sl(nd, axis, i)])
        parts.append(r)
    dt = np.asarray(ufunc.accumulate(np.zeros((1,) * nd, _dtype(x)), axis=axis)).dtype
    return _cast(stack(parts, axis=axis), dt)


def _ufunc_outer(ufunc, A, B, **kw):
    fn = _binary_fn(ufunc, "outer")
    _no_out(f"{ufunc.__name__}.outer", kw.pop("out", None))
    A, B = _operand(A), _operand(B)
    return fn(reshape(A, shape_of(A) + (1,) * len(shape_of(B))), B, **kw)


def _ufunc_reduceat(ufunc, array, indices, axis=0, dtype=None, out=None):
    _no_out(f"{ufunc.__name__}.reduceat", out)
    x = _operand(array)
    nd = len(shape_of(x))
    axis = _axis1(axis, nd, f"{ufunc.__name__}.reduceat")
    idx = _constant(indices, f"{ufunc.__name__}.reduceat", "indices").astype(np.intp).ravel()
    n = shape_of(x)[axis]
    if dtype is not None:
        x = _cast(x, dtype)
    parts = []
    for i, start in enumerate(idx):
        if not 0 <= start < n:
            raise IndexError(f"index {start} out-of-bounds in {ufunc.__name__}.reduceat "
                             f"[0, {n})")
        stop = idx[i + 1] if i + 1 < len(idx) else n
        if stop <= start:  # NumPy's rule: the element itself
            parts.append(x[_sl(nd, axis, slice(start, start + 1))])
        else:
            parts.append(_reduce_one(ufunc, x[_sl(nd, axis, slice(start, stop))], (axis,),
                                     True))
    return concatenate(parts, axis=axis)


def _ufunc_at(ufunc, a, indices, b=None):
    """NumPy's unbuffered in-place a[indices] op= b: on a tracegrad value the
    new value replaces a for every name bound to it (as x += 1 does)."""
    name = f"np.{ufunc.__name__}.at"
    if not is_value(a):
        raise TypeError(
            f"{name}(a, indices, b) with a NumPy array a and a tracegrad value b would write "
            f"a traced or recorded value into a plain array; compute it functionally: "
            f"a = a + tg.index_add(b, indices, a.shape) for np.add.at, or "
            f"a = tg.setitem(a, indices, value)")
    if ufunc in (np.add, np.subtract) and b is not None:
        # repeated indices accumulate: exactly the transpose of a gather
        # the shape a[indices] has (from zeros: a view of a itself would mark
        # a as shared memory, and a's in-place update would be refused)
        target = shape_of(getitem(zeros_like_value(a), indices))
        upd = index_add(broadcast_to(_operand(b), target), indices, shape_of(a))
        new = (add if ufunc is np.add else sub)(a, upd)
    else:
        if ufunc.nin == 2 and b is None:
            raise TypeError(f"{name} of a binary ufunc needs the second operand b")
        fn = NUMPY_FUNCTIONS.get(ufunc)
        if fn is None:
            raise NotImplementedError(f"{name}: tracegrad has no rule for np.{ufunc.__name__}")
        pos = np.arange(int(np.prod(shape_of(a)))).reshape(shape_of(a))[
            _constant_index(indices, name)]
        flat_b = None if b is None else reshape(broadcast_to(_operand(b), pos.shape), (-1,))
        pos = pos.ravel()
        # occurrences of a position are applied in order: round r updates
        # every position's r-th occurrence at once
        rank = np.zeros(len(pos), dtype=np.intp)
        seen = {}
        for i, p in enumerate(pos.tolist()):
            rank[i] = seen.get(p, 0)
            seen[p] = rank[i] + 1
        flat = ravel(clone(a))  # reading a itself would mark it a shared view
        for r in range(int(rank.max()) + 1 if len(pos) else 0):
            sel = np.flatnonzero(rank == r)
            cur = getitem(flat, pos[sel])
            val = fn(cur) if b is None else fn(cur, getitem(flat_b, sel))
            flat = setitem(flat, pos[sel], _cast(val, _dtype(a)))
        new = reshape(flat, shape_of(a))
    a._assign(_cast(new, _dtype(a)), f"{name}(a, ...) (in place)",
              "a = a + tg.index_add(b, indices, a.shape)")
    return None


def _constant_index(indices, name):
    items = indices if isinstance(indices, tuple) else (indices,)
    if any(is_value(i) for i in items):
        raise TypeError(f"{name}: the indices must be constants for this ufunc (only "
                        f"np.add.at and np.subtract.at take traced indices, through "
                        f"tg.index_add); write the update with tg.setitem")
    return indices


_METHODS = {"reduce": _ufunc_reduce, "accumulate": _ufunc_accumulate, "outer": _ufunc_outer,
            "reduceat": _ufunc_reduceat, "at": _ufunc_at}


def ufunc_method(ufunc, method, inputs, kwargs):
    """``np.<ufunc>.<method>(...)`` with a tracegrad value among the operands."""
    impl = _METHODS.get(method)
    if impl is None:
        raise NotImplementedError(f"np.{ufunc.__name__}.{method} is not supported by tracegrad")
    if method != "at" and method != "outer" and ufunc.nin != 2:
        raise NotImplementedError(f"np.{ufunc.__name__}.{method}: only binary ufuncs have "
                                  f"{method} (NumPy says the same)")
    return impl(ufunc, *inputs, **kwargs)
