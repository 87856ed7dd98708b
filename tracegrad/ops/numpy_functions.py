"""NumPy functions written as compositions of the rows, with NumPy's signatures.

Everything here is the NumPy face of a function (``@implements(np.xxx)``):
``np.median(x)``, ``np.interp(x, xp, fp)``, ``np.cov(m)`` on traced values
and eager tensors.  Each is built from existing functional ops, so its
derivative comes from their rules and is never written twice.  Four small
rows live here because a composition would be wrong or slow: ``copysign``
(elementwise, fusible), ``searchsorted`` (no gradient; a composition would
compare every x with every breakpoint), ``ldexp`` (x * 2**e exactly, where
2**e alone overflows or underflows) and ``frexp_exponent`` (no gradient).

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
from tracegrad.ops._define import (implements, norm_axes, numpy_copy, NUMPY_FUNCTIONS,
                                   refuse_argument_write)
from tracegrad.ops.base import (add, sub, mul, div, neg, where, equal, astype, reshape,
                                transpose, sum, broadcast_to, swapaxes, matmul, is_value,
                                shape_of, def_elementwise, zeros_rule, zeros_like_value,
                                less, greater, clone, logical_and, logical_not)
from tracegrad.ops.elementwise import (abs, sign, sqrt, clip, isnan, isinf, floor, trunc, rint,
                                       maximum, minimum)
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
        raise TypeError(f"np.{name}: the argument(s) {bad} are not supported by tracegrad "
                        f"here; assign the result instead (y = np.{name}(...)), or write it "
                        f"into an array the function made with y[...] = np.{name}(...)")


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
    a = _linalg.symmetric_from_triangle(a, UPLO)   # NumPy reads that triangle only
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
    elif np.dtype(dtype).kind not in "fc":   # NumPy's in-place subtraction of the mean fails
        raise TypeError(f"tracegrad does not support np.cov(..., dtype={np.dtype(dtype).name}) "
                        f"(NumPy cannot subtract the float mean in it either); pass a float dtype")
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
        scale = float(np.true_divide(1, fact))  # NumPy multiplies by 1 / fact, in place
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
    s = sort(x, axis=-1, kind="stable")   # ties: the first in x's order is selected (as in JAX)
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
    s = sort(x, axis=-1, kind="stable")   # ties: the first in x's order is selected (as in JAX)
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
    values, edge, reflect, symmetric, wrap (reflect_type 'even' or 'odd'),
    and the statistics modes mean, maximum, minimum, median (stat_length=)
    and linear_ramp (end_values=).  Always a new array, as NumPy's (also
    when nothing is padded)."""
    out = _pad_any(array, pad_width, mode, **kwargs)
    return numpy_copy(out) if out is array else out


def _pad_any(array, pad_width, mode="constant", **kwargs):
    x = _operand(array)
    s = shape_of(x)
    if mode in _PAD_STAT_KW:
        return _pad_stat(x, pad_width, mode, kwargs)
    if isinstance(mode, str) and mode not in _PAD_MODES:
        raise ValueError(f"mode '{mode}' is not supported")
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
    if initial is not _NOVALUE and len(axes) == 1:
        # NumPy folds from initial: ((initial op x0) op x1) ..., which for
        # subtract or divide is not initial op (x0 op x1 ...)
        first = np.asarray(initial).astype(_dtype(x))
        x = concatenate([broadcast_to(first, tuple(1 if i == axes[0] else d
                                                   for i, d in enumerate(shape_of(x)))), x],
                        axis=axes[0])
        initial = _NOVALUE
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


# === more of NumPy: elementwise pairs, NaN-aware reductions, arranging, padding ==============
#
# Compositions of the rows, but for two rows: ``ldexp`` (x * 2**e exactly,
# where 2**e alone may overflow or underflow) and ``frexp_exponent`` (the
# integer exponent of np.frexp: no gradient, as the exponent of JAX's frexp).

ldexp_p = def_elementwise(
    "ldexp", lambda xp, x, e: xp.ldexp(x, e), (None, None),
    "np.ldexp({0}, {1})", "ldexp({0}, {1})",
    vjp=(lambda g, out, x, e: bind(ldexp_p, g, e), None),
    jvp=(lambda t, out, x, e: bind(ldexp_p, t, e), None))

frexp_exponent_p = register(
    "frexp_exponent", lambda xp, x: xp.frexp(x)[1],
    shape=lambda x: Aval(tuple(x.shape), np.frexp(np.zeros((), x.dtype))[1].dtype),
    nondiff=True, save_inputs=False, numpy="np.frexp({0})[1]",
    doc="the integer exponent e of np.frexp(x) = (m, e), x = m * 2**e (no gradient)")


def _traced(x):
    """A symbolic value (its contents are unknown until the compiled call runs)."""
    return hasattr(x, "_trace")


def _np_fn(f):
    return NUMPY_FUNCTIONS[f]


# --- elementwise ------------------------------------------------------------------------------

@implements(np.positive)
def positive(x, out=None, **kw):
    """+x: a fresh copy with the same values (NumPy refuses booleans, as here)."""
    _no_out("positive", out, kw)
    _ufunc_dtype(np.positive, x)  # NumPy's error for booleans
    return numpy_copy(x)


@implements(np.divmod)
def divmod_(x1, x2, out=None, **kw):
    """(x1 // x2, x1 % x2): the quotient is piecewise constant (no gradient),
    the remainder differentiates like np.remainder."""
    _no_out("divmod", out, kw)
    return (_np_fn(np.floor_divide)(x1, x2), _np_fn(np.remainder)(x1, x2))


@implements(np.modf)
def modf(x, out=None, **kw):
    """(fractional, integral) parts, both with x's sign (modf(-2.0) is
    (-0.0, -2.0), modf(inf) is (0.0, inf)); d frac/dx = 1, d int/dx = 0."""
    _no_out("modf", out, kw)
    dt = np.modf(np.zeros((), _dtype(x)))[0].dtype
    x = _cast(_operand(x), dt)
    finite = where(isinf(x), 0.0, x)
    frac = copysign(sub(finite, trunc(finite)), x)
    return _cast(frac, dt), _cast(trunc(x), dt)


@implements(np.ldexp)
def ldexp(x1, x2, out=None, **kw):
    """x1 * 2**x2 for integer x2 (NumPy refuses a float x2); the gradient
    reaches x1 only."""
    _no_out("ldexp", out, kw)
    dt = _ufunc_dtype(np.ldexp, x1, x2)
    return bind(ldexp_p, _cast(_operand(x1), dt), _operand(x2))


@implements(np.frexp)
def frexp(x, out=None, **kw):
    """(mantissa, exponent) with x = mantissa * 2**exponent, 0.5 <= |m| < 1;
    the mantissa is ldexp(x, -exponent), so its gradient is 2**-exponent;
    the integer exponent has none."""
    _no_out("frexp", out, kw)
    dt = np.frexp(np.zeros((), _dtype(x)))[0].dtype
    x = _cast(_operand(x), dt)
    e = bind(frexp_exponent_p, x)
    return bind(ldexp_p, x, neg(e)), e


# --- NaN-aware reductions -----------------------------------------------------------------------

def _inexact(x):
    return _dtype(x).kind in "fc"


def _nan_extreme(name, reduce_, combine, a, axis, keepdims, initial, where_):
    x = _operand(a)
    kd = False if keepdims is _NOVALUE else bool(keepdims)
    axes = norm_axes(axis, len(shape_of(x)))
    if where_ is not _NOVALUE and where_ is not True and initial is _NOVALUE:
        raise ValueError(f"reduction operation '{'maximum' if name == 'nanmax' else 'minimum'}'"
                         f" does not have an identity, so to use a where mask one has to "
                         f"specify 'initial'")
    dt = _dtype(x)
    if dt.kind == "f":
        lo = -np.inf if name == "nanmax" else np.inf
    elif dt.kind in "iu":
        lo = np.iinfo(dt).min if name == "nanmax" else np.iinfo(dt).max
    else:   # booleans
        lo = name != "nanmax"
    y = where(isnan(x), lo, x) if _inexact(x) else x
    if where_ is not _NOVALUE and where_ is not True:
        y = where(_operand(where_), y, lo)
        y = broadcast_to(y, shape_of(x)) if shape_of(y) != shape_of(x) else y
    y = _cast(y, dt)
    r = reduce_(y, axis=axes, keepdims=kd)
    if initial is not _NOVALUE:
        return _cast(combine(r, initial), dt)
    if _inexact(x):  # an all-NaN slice is NaN (NumPy warns)
        r = where(_all_op(isnan(x), axis=axes, keepdims=kd), np.nan, r)
    return _cast(r, dt)


@implements(np.nanmax)
def nanmax(a, axis=None, out=None, keepdims=_NOVALUE, initial=_NOVALUE, where=_NOVALUE):
    """Largest element ignoring NaNs (NaN for an all-NaN slice); the
    gradient goes to the selected element(s) as np.max's."""
    _no_out("nanmax", out)
    return _nan_extreme("nanmax", amax, maximum, a, axis, keepdims, initial, where)


@implements(np.nanmin)
def nanmin(a, axis=None, out=None, keepdims=_NOVALUE, initial=_NOVALUE, where=_NOVALUE):
    """Smallest element ignoring NaNs (NaN for an all-NaN slice)."""
    _no_out("nanmin", out)
    return _nan_extreme("nanmin", amin, minimum, a, axis, keepdims, initial, where)


def _nan_filled(x, value, where_=_NOVALUE):
    """x with NaN (and, with a where mask, the masked-out entries) replaced by value."""
    if _inexact(x):
        x = _cast(where(isnan(x), value, x), _dtype(x))
    if where_ is not _NOVALUE and where_ is not True:
        x = _cast(where(_operand(where_), x, value), _dtype(x))   # (broadcast with the mask)
    return x


@implements(np.nanprod)
def nanprod(a, axis=None, dtype=None, out=None, keepdims=_NOVALUE, initial=_NOVALUE,
            where=_NOVALUE):
    """Product treating NaN as one (NaN entries get a zero gradient)."""
    _no_out("nanprod", out)
    x = _operand(a)
    probe = np.nanprod(np.ones((1,) * len(shape_of(x)), _dtype(x)), axis=axis, dtype=dtype)
    x = _nan_filled(x, 1, where)
    r = prod(x, axis=norm_axes(axis, len(shape_of(x))),
             keepdims=False if keepdims is _NOVALUE else bool(keepdims), dtype=dtype)
    if initial is not _NOVALUE:
        r = mul(r, initial)
    return _cast(r, probe.dtype)


@implements(np.nancumsum)
def nancumsum(a, axis=None, dtype=None, out=None):
    """Running sum treating NaN as zero."""
    _no_out("nancumsum", out)
    x = _operand(a)
    if axis is not None:
        axis = _axis1(axis, len(shape_of(x)), "nancumsum")
    return cumsum(_nan_filled(x, 0), axis=axis, dtype=dtype)


@implements(np.nancumprod)
def nancumprod(a, axis=None, dtype=None, out=None):
    """Running product treating NaN as one."""
    _no_out("nancumprod", out)
    x = _operand(a)
    if axis is not None:
        axis = _axis1(axis, len(shape_of(x)), "nancumprod")
    return cumprod(_nan_filled(x, 1), axis=axis, dtype=dtype)


def _nanvar(fn, a, axis, dtype, out, ddof, keepdims, where_, mean_, correction):
    _no_out(fn, out)
    x = _operand(a)
    if correction is not _NOVALUE:
        if ddof != 0:
            raise ValueError("ddof and correction can't be provided simultaneously.")
        ddof = correction
    if dtype is not None:
        dtype = np.dtype(dtype)
        if _inexact(x) and dtype.kind not in "fc":
            raise TypeError("If a is inexact, then dtype must be inexact")
        x = _cast(x, dtype)
    elif not _inexact(x):
        x = _cast(x, np.float64)
    kd = False if keepdims is _NOVALUE else bool(keepdims)
    nd = len(shape_of(x))
    axes = norm_axes(axis, nd)
    keep = logical_not(isnan(x))
    if where_ is not _NOVALUE and where_ is not True:
        keep = logical_and(keep, _operand(where_))
        if shape_of(keep) != shape_of(x):
            x = broadcast_to(x, shape_of(keep))
            keep = broadcast_to(keep, shape_of(x))
    cnt = sum(_cast(keep, _dtype(x)), axis=axes, keepdims=True)
    xz = where(keep, x, 0.0)
    avg = div(sum(xz, axis=axes, keepdims=True), cnt) if mean_ is _NOVALUE else mean_
    d = where(keep, sub(x, avg), 0.0)
    v = sum(mul(d, d), axis=axes, keepdims=kd)
    dof = sub(cnt if kd else reshape(cnt, shape_of(v)), ddof)
    bad = NUMPY_FUNCTIONS[np.less_equal](dof, 0)
    # a slice with no degrees of freedom is NaN (NumPy warns)
    v = where(bad, np.nan, div(v, where(bad, 1.0, dof)))
    return _cast(v, _dtype(x))


@implements(np.nanvar)
def nanvar(a, axis=None, dtype=None, out=None, ddof=0, keepdims=_NOVALUE, *, where=_NOVALUE,
           mean=_NOVALUE, correction=_NOVALUE):
    """Variance of the non-NaN entries (NaN where fewer than ddof + 1 remain)."""
    return _nanvar("nanvar", a, axis, dtype, out, ddof, keepdims, where, mean, correction)


@implements(np.nanstd)
def nanstd(a, axis=None, dtype=None, out=None, ddof=0, keepdims=_NOVALUE, *, where=_NOVALUE,
           mean=_NOVALUE, correction=_NOVALUE):
    """Standard deviation of the non-NaN entries."""
    return sqrt(_nanvar("nanstd", a, axis, dtype, out, ddof, keepdims, where, mean,
                        correction))


# --- arranging: block, broadcasting, meshgrid, delete, insert, resize, piecewise --------------

def _stand_in(v):
    """A NumPy array of v's shape and dtype that costs no memory (for asking NumPy)."""
    return np.broadcast_to(np.zeros((), _dtype(v)), shape_of(v))


def _block_probe(arrays):
    if type(arrays) is list:
        return [_block_probe(a) for a in arrays]
    return _stand_in(arrays) if is_value(arrays) else arrays


@implements(np.block)
def block(arrays):
    """Nested lists of blocks joined as NumPy does: the innermost lists along
    the last axis, each level out one axis further; blocks of fewer
    dimensions get leading length-1 axes.  NumPy checks the nesting and the
    shapes (its errors) on stand-ins of the blocks."""
    probe = np.block(_block_probe(arrays))
    ndim, dt = probe.ndim, probe.dtype

    def depth(a):
        return 1 + depth(a[0]) if type(a) is list else 0

    list_ndim = depth(arrays)

    def leaf(a):
        a = _cast(_operand(a), dt)
        s = shape_of(a)
        return reshape(a, (1,) * (ndim - len(s)) + s) if len(s) < ndim else a

    leaves = []

    def leaf_kept(a):
        leaves.append(leaf(a))
        return leaves[-1]

    def join_kept(a, level):
        if type(a) is not list:
            return leaf_kept(a)
        parts = [join_kept(b, level + 1) for b in a]
        return concatenate(parts, axis=-(list_ndim - level)) if len(parts) > 1 else parts[0]

    out = join_kept(arrays, 0)
    if not is_value(out):
        return probe.copy()
    if any(out is v for v in leaves):   # nothing joined: NumPy's result is still a copy
        out = numpy_copy(out)
    return _cast(out, dt)


@implements(np.broadcast_to)
def np_broadcast_to(array, shape, subok=False):
    """NumPy's broadcast_to (it replaces the op layer's torch-leaning
    broadcast_to for np.broadcast_to): NumPy checks the shape on a
    stand-in, so a bad shape (-1 included) is NumPy's ValueError."""
    x = _operand(array)
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    shape = np.broadcast_to(_stand_in(x), shape).shape
    return x if shape_of(x) == shape else broadcast_to(x, shape)


@implements(np.broadcast_arrays)
def broadcast_arrays(*args, subok=False):
    """The arguments broadcast to one shape (a tuple, as NumPy 2)."""
    xs = [_operand(a) for a in args]
    shape = np.broadcast_shapes(*[shape_of(x) for x in xs])
    return tuple(x if shape_of(x) == shape else broadcast_to(x, shape) for x in xs)


@implements(np.meshgrid)
def meshgrid(*xi, copy=True, sparse=False, indexing="xy"):
    """Coordinate arrays from 1-D coordinate vectors (indexing 'xy' swaps
    the first two axes, as NumPy); sparse keeps the length-1 axes."""
    if indexing not in ("xy", "ij"):
        raise ValueError("Valid values for `indexing` are 'xy' and 'ij'.")
    n = len(xi)
    ones = (1,) * n
    out = [reshape(_operand(x), ones[:i] + (-1,) + ones[i + 1:]) for i, x in enumerate(xi)]
    if indexing == "xy" and n > 1:
        out[0] = reshape(out[0], (1, -1) + ones[2:])
        out[1] = reshape(out[1], (-1, 1) + ones[2:])
    if not sparse:
        out = list(broadcast_arrays(*out))
    if copy:   # fresh arrays, as NumPy's, not views of the inputs
        out = [numpy_copy(o) for o in out]
    return tuple(out)


def _ids(shape, start=0, sign=1):
    return sign * (np.arange(int(np.prod(shape, dtype=np.int64)), dtype=np.intp) + start) \
        .reshape(shape)


def _positional(obj, fn):
    if isinstance(obj, (tuple, list)):
        if any(is_value(o) for o in obj):
            raise TypeError(f"np.{fn}: obj must be constant (numbers, a slice or an array), "
                            f"not a tracegrad value: it decides the result's shape")
        return obj
    if is_value(obj):
        raise TypeError(f"np.{fn}: obj must be constant (numbers, a slice or an array), not "
                        f"a tracegrad value: it decides the result's shape")
    return obj


@implements(np.delete)
def delete(arr, obj, axis=None):
    """arr without the entries obj (constant: ints, a slice or a mask) along
    axis (of the flattened arr when None): one gather, so the deleted
    entries get no gradient."""
    x = _operand(arr)
    src = np.delete(_ids(shape_of(x)), _positional(obj, "delete"), axis=axis)
    return getitem(ravel(x), src)


@implements(np.insert)
def insert(arr, obj, values, axis=None):
    """values (traced or constant, cast to arr's dtype) inserted before the
    positions obj (constant) along axis.  NumPy places the entries, and so
    checks obj and values, on integer stand-ins; the result is one gather
    from arr and values, so each gets the gradient of its entries."""
    x = _operand(arr)
    v = _operand(values)
    n = int(np.prod(shape_of(x), dtype=np.int64))
    placed = np.insert(_ids(shape_of(x), 1), _positional(obj, "insert"),
                       _ids(shape_of(v), 1, -1), axis=axis)
    src = np.where(placed > 0, placed - 1, n - placed - 1)
    both = concatenate([ravel(x), ravel(_cast(v, _dtype(x)))])
    return getitem(both, src)


@implements(np.resize)
def resize(a, new_shape):
    """a's entries repeated in order to fill new_shape (zeros for an empty
    a); a repeated entry gets the gradient of all its copies."""
    x = _operand(a)
    shape = (new_shape,) if isinstance(new_shape, (int, np.integer)) else tuple(new_shape)
    size = 1
    for d in shape:
        size *= d
        if d < 0:
            raise ValueError("all elements of `new_shape` must be non-negative")
    n = int(np.prod(shape_of(x), dtype=np.int64))
    if n == 0 and size == 0:
        return reshape(x, shape)
    if n == 0:
        return np.zeros(shape, _dtype(x))
    if size == 0:
        return getitem(ravel(x), np.zeros(shape, np.intp))
    return getitem(ravel(x), np.arange(size, dtype=np.intp).reshape(shape) % n)


@implements(np.piecewise)
def piecewise(x, condlist, funclist, *args, **kw):
    """NumPy's piecewise.  Constant conditions (or eager values) select as
    NumPy does: each function is called on x[cond] only.  Conditions that
    are traced (known only when the compiled call runs) cannot select a
    shape, so each function is called on the whole of x and its result
    taken where its condition holds: the functions must then act elementwise
    (return x's shape or a scalar), which is checked."""
    x = _operand(x)
    xshape = shape_of(x)
    # NumPy's rule for a single condition; a 0-d tracegrad value stands for
    # the NumPy scalar (np.bool_) a NumPy function returns there
    def array_like(c):
        return isinstance(c, (list, np.ndarray)) or (is_value(c) and len(shape_of(c)) > 0)

    if (np.isscalar(condlist) or (is_value(condlist) and not shape_of(condlist))
            or (not array_like(condlist[0]) and len(xshape) != 0)):
        condlist = [condlist]
    conds = []
    for c in condlist:
        if isinstance(c, (list, tuple)) and any(is_value(e) for e in c):
            c = stack([_operand(e) for e in c])
        if is_value(c) and _traced(c):
            conds.append(c if _dtype(c) == np.bool_ else NUMPY_FUNCTIONS[np.not_equal](c, 0))
        else:
            conds.append(np.asarray(c, dtype=bool))
    n, n2 = len(conds), len(funclist)
    if n == n2 - 1:
        other = conds[0]
        for c in conds[1:]:
            other = NUMPY_FUNCTIONS[np.logical_or](other, c)
        conds.append(NUMPY_FUNCTIONS[np.logical_not](other))
        n += 1
    elif n != n2:
        raise ValueError(f"with {n} condition(s), either {n} or {n + 1} functions are expected")
    shapes = {shape_of(c) for c in conds}
    dt = _dtype(x)
    if not any(_traced(c) for c in conds):
        if len(shapes) > 1:
            np.asarray([np.zeros(s, bool) for s in shapes])  # NumPy's error for ragged lists
        y = zeros_like_value(x) if is_value(x) else np.zeros_like(x)
        for cond, func in zip(conds, funclist):
            if cond.ndim == 0 and len(xshape):  # x[True] is x with a new first axis
                if cond:
                    val = func(reshape(x, (1,) + xshape), *args, **kw) if callable(func) \
                        else func
                    val = broadcast_to(_cast(_operand(val), dt), (1,) + xshape)
                    y = reshape(val, xshape)
                continue
            if cond.shape != xshape[:cond.ndim]:
                raise IndexError(f"boolean index did not match indexed array: condition of "
                                 f"shape {cond.shape}, x of shape {xshape}")
            if not callable(func):
                y = setitem(y, cond, _cast(_operand(func), dt))
            else:
                vals = getitem(x, cond)
                if int(np.prod(shape_of(vals))) > 0:
                    y = setitem(y, cond, _cast(_operand(func(vals, *args, **kw)), dt))
        return y
    for c in conds:
        if shape_of(c) != xshape:
            raise IndexError(
                f"np.piecewise: a traced condition must have x's shape {xshape}, not "
                f"{shape_of(c)} (boolean index did not match indexed array)")
    y = np.zeros(xshape, dt)
    for cond, func in zip(conds, funclist):
        val = func(x, *args, **kw) if callable(func) else func
        val = _operand(val)
        if shape_of(val) not in ((), xshape) or (callable(func) and shape_of(val) and
                                                  not _acts_elementwise(func, args, kw, dt)):
            raise ValueError(
                f"np.piecewise with traced conditions (computed from traced values or from "
                f"arrays the function captures, which are inputs of the compiled call) calls "
                f"each function on the whole of x and keeps its result where the condition "
                f"holds, so a function must act elementwise, and "
                f"{getattr(func, '__name__', func)!r} does not (NumPy calls it on x[cond] "
                f"only). Compute the conditions from constants (or arguments marked "
                f"static), or run eagerly (tg.grad(f, compile=False))")
        y = where(cond, _cast(val, dt), y)
    return _cast(y, dt)


def _acts_elementwise(func, args, kw, dt):
    """Does func give each element the same result whether it is called on a
    whole vector or on a part of it?  Asked of NumPy on a few sample points;
    a function that cannot be called on plain arrays (it uses traced values
    it captured) is taken to act elementwise, as its shape suggested."""
    p = (np.linspace(0.15, 0.85, 7) if dt.kind in "fc" else np.arange(1, 8)).astype(dt)
    try:
        with np.errstate(all="ignore"):
            whole = func(p, *args, **kw)
            parts = [func(p[:3], *args, **kw), func(p[3:], *args, **kw)]
        if any(is_value(v) for v in [whole] + parts):
            return True
        whole = np.broadcast_to(np.asarray(whole), p.shape)
        got = np.concatenate([np.broadcast_to(np.asarray(parts[0]), (3,)),
                              np.broadcast_to(np.asarray(parts[1]), (4,))])
    except Exception:
        return True
    return bool(np.allclose(whole, got, rtol=1e-6, atol=1e-12, equal_nan=True))


# --- pad: statistics and linear ramps ---------------------------------------------------------

_PAD_MODES = ("constant", "edge", "linear_ramp", "maximum", "mean", "median", "minimum",
              "reflect", "symmetric", "wrap", "empty")
_PAD_STAT_KW = {"mean": "stat_length", "maximum": "stat_length", "minimum": "stat_length",
                "median": "stat_length", "linear_ramp": "end_values"}


def _as_pairs(x, ndim, as_index=False):
    """NumPy's pairing of pad arguments: one value, one (before, after)
    pair, or one pair per axis."""
    if x is None:
        return ((None, None),) * ndim
    x = _constant(x, "pad", "pad_width, stat_length and end_values")
    if as_index:
        x = np.round(x).astype(np.intp, copy=False)
    if x.ndim < 3:
        if x.size == 1:
            x = x.ravel()
            if as_index and x < 0:
                raise ValueError("index can't contain negative values")
            return ((x[0], x[0]),) * ndim
        if x.size == 2 and x.shape != (2, 1):
            x = x.ravel()
            if as_index and (x[0] < 0 or x[1] < 0):
                raise ValueError("index can't contain negative values")
            return ((x[0], x[1]),) * ndim
    if as_index and x.min() < 0:
        raise ValueError("index can't contain negative values")
    return np.broadcast_to(x, (ndim, 2)).tolist()


def _pad_stat(x, pad_width, mode, kwargs):
    """NumPy pads one axis after the other, each from the array padded along
    the axes before it; so does this, with concatenation."""
    s = shape_of(x)
    nd = len(s)
    width = [(int(a), int(b)) for a, b in _as_pairs(pad_width, nd, as_index=True)]
    extra = set(kwargs) - {_PAD_STAT_KW[mode]}
    if extra:
        raise ValueError(f"unsupported keyword arguments for mode '{mode}': {extra}")
    if int(np.prod(s, dtype=np.int64)) == 0:
        for ax, (a, b) in enumerate(width):
            if s[ax] == 0 and (a or b):
                raise ValueError(f"can't extend empty axis {ax} using modes other than "
                                 f"'constant' or 'empty'")
        return reshape(x, tuple(d + a + b for d, (a, b) in zip(s, width)))  # empty too
    dt = _dtype(x)
    if mode == "linear_ramp":
        ends = _as_pairs(kwargs.get("end_values", 0), nd)
    else:
        lengths = _as_pairs(kwargs.get("stat_length", None), nd, as_index=True)
    for ax, (a, b) in enumerate(width):
        n = shape_of(x)[ax]
        if mode == "linear_ramp":
            if not (a or b):
                continue
            parts = []
            if a:
                edge = reshape(x[_sl(nd, ax, 0)], shape_of(x)[:ax] + shape_of(x)[ax + 1:])
                parts.append(_cast(linspace(ends[ax][0], edge, a, endpoint=False, dtype=dt,
                                            axis=ax), dt))
            parts.append(x)
            if b:
                edge = reshape(x[_sl(nd, ax, n - 1)], shape_of(x)[:ax] + shape_of(x)[ax + 1:])
                ramp = linspace(ends[ax][1], edge, b, endpoint=False, dtype=dt, axis=ax)
                parts.append(_cast(flip(ramp, ax), dt))
            x = concatenate(parts, axis=ax)
            continue
        lo_len, hi_len = lengths[ax]
        lo_len = n if lo_len is None or n < lo_len else lo_len
        hi_len = n if hi_len is None or n < hi_len else hi_len
        if (lo_len == 0 or hi_len == 0) and mode in ("maximum", "minimum"):
            raise ValueError("stat_length of 0 yields no value for padding")
        if not (a or b):
            continue
        stats = []
        for length, start in ((lo_len, 0), (hi_len, n - hi_len)):
            chunk = x[_sl(nd, ax, slice(start, start + length))]
            if mode == "mean":
                st = _np_fn(np.mean)(chunk, axis=ax, keepdims=True)
            elif mode == "median":
                st = median(chunk, axis=ax, keepdims=True)
            else:
                st = (amax if mode == "maximum" else amin)(chunk, axis=(ax,), keepdims=True)
            if dt.kind in "iub" and mode in ("mean", "median"):
                st = rint(st)
            stats.append(_cast(st, dt))
        parts = []
        if a:
            parts.append(broadcast_to(stats[0], shape_of(x)[:ax] + (a,) + shape_of(x)[ax + 1:]))
        parts.append(x)
        if b:
            parts.append(broadcast_to(stats[1], shape_of(x)[:ax] + (b,) + shape_of(x)[ax + 1:]))
        x = concatenate(parts, axis=ax)
    return x


# --- writes into an array: np.put, np.copyto, np.place, np.putmask, np.fill_diagonal ------
#
# NumPy writes into its first argument and returns None.  On a tracegrad
# value (an array the function created, or a view of one) the new value
# replaces it for every name and view bound to it (``a._assign``, as
# ``a[idx] = v`` does); a plain ndarray cannot hold a traced or recorded
# value: an error that names np.copy.  Which positions are written must be
# known while tracing (constant indices and masks), except for np.putmask
# and np.copyto(where=), whose masks may be traced values.

_select = where     # (np.copyto's where= shadows the op's name)


def _write_target(a, name):
    if not is_value(a):
        raise TypeError(
            f"np.{name}(a, ...) with a plain NumPy array a and a traced or differentiated "
            f"tracegrad value would write that value into a plain array, which NumPy would "
            f"convert and lose (tracegrad cannot write into an array it does not track). "
            f"Write into an array tracegrad tracks: create it in the function "
            f"(np.zeros/np.empty/np.zeros_like...) or copy it first with a = np.copy(a)")
    refuse_argument_write(a, f"np.{name}", "compute the new array with np.where or tg.setitem")
    return a


def _known_positions(v, name, what):
    """The values of an index or mask argument, which say where to write."""
    if is_value(v):
        known = getattr(v, "known_value", None)
        kv = known() if known is not None else (
            np.asarray(v._data) if hasattr(v, "_data") and not getattr(v, "requires_grad", 0)
            else None)
        if kv is None:
            instead = ("np.putmask(a, mask, values) or a = np.where(mask, values, a) for a "
                       "traced mask" if what == "mask" else
                       "a = tg.setitem(a, index, values) for traced indices")
            raise TypeError(f"np.{name}: tracegrad needs the {what} as constants (they say "
                            f"which elements are written, and how many); pass a NumPy array "
                            f"(a global, a default or an argument marked static), or write "
                            f"{instead}")
        return np.asarray(kv)
    return np.asarray(v)


def _flat_write(a, pos, values, cycle, name):
    """``a`` with ``a.flat[pos[i]] = values.flat[cycle[i]]`` (positions
    unique), the values cast to a's dtype as NumPy's flat assignment does."""
    shp = shape_of(a)
    if len(pos) == 0:
        return a
    v = values if is_value(values) else np.asarray(values)
    flat_v = reshape(v, (-1,)) if is_value(v) else v.reshape(-1)
    sel = getitem(flat_v, cycle) if is_value(flat_v) else flat_v[cycle]
    if not shp:
        from tracegrad.ops.indexing import assign_index
        return assign_index(a, (), reshape(sel, ()) if is_value(sel) else sel.reshape(()))
    from tracegrad.ops.indexing import assign_index
    return assign_index(a, np.unravel_index(pos, shp), sel)


def _size(a):
    return int(np.prod(shape_of(a), dtype=np.int64))


@implements(np.put)
def put(a, ind, v, mode="raise"):
    """np.put / ndarray.put: ``a.flat[ind] = v``, v repeated as needed; the
    last of repeated indices wins."""
    _write_target(a, "put")
    if mode not in ("raise", "wrap", "clip"):
        raise ValueError(f"clipmode must be one of 'clip', 'raise', or 'wrap' (got {mode!r})")
    ind = _known_positions(ind, "put", "indices").reshape(-1)
    if ind.size and ind.dtype.kind not in "iu":
        if ind.dtype.kind == "b" or not np.can_cast(ind.dtype, np.intp, "same_kind"):
            raise TypeError(f"Cannot cast array data from {ind.dtype!r} to dtype('int64') "
                            f"according to the rule 'safe'")
    ind = ind.astype(np.intp)
    n = _size(a)
    nv = _size(v) if is_value(v) else np.size(v)
    if nv == 0 or ind.size == 0:
        return None
    if mode == "raise":
        bad = (ind < -n) | (ind >= n)
        if bad.any():
            raise IndexError(f"index {int(ind[bad][0])} is out of bounds for axis 0 with size {n}")
        pos = ind % n if n else ind
    elif mode == "wrap":
        if n == 0:
            raise IndexError("cannot replace elements of an empty array")
        pos = ind % n
    else:
        if n == 0:
            raise IndexError("cannot replace elements of an empty array")
        pos = np.clip(ind, 0, n - 1)
    cycle = np.arange(len(pos)) % nv
    # the last write to a position wins
    last = {}
    for i, p in enumerate(pos.tolist()):
        last[p] = i
    keep = np.array(sorted(last.values()), dtype=np.intp)
    a._assign(_flat_write(a, pos[keep], v, cycle[keep], "put"), "np.put(a, ind, v)",
              "a = tg.setitem(a, index, value)")
    return None


@implements(np.place)
def place(arr, mask, vals):
    """np.place: the elements where ``mask`` is true get ``vals`` in turn,
    repeated as needed."""
    _write_target(arr, "place")
    m = _known_positions(mask, "place", "mask")
    if m.size != _size(arr):
        raise ValueError("place: mask and data must be the same size")
    pos = np.flatnonzero(m.reshape(-1))
    nv = _size(vals) if is_value(vals) else np.size(vals)
    if len(pos) and nv == 0:
        raise ValueError("Cannot insert from an empty array!")
    if not len(pos):
        return None
    arr._assign(_flat_write(arr, pos, vals, np.arange(len(pos)) % nv, "place"),
                "np.place(arr, mask, vals)", "arr = np.where(mask, values, arr)")
    return None


@implements(np.putmask)
def putmask(a, mask, values):
    """np.putmask: ``a.flat[n] = values.flat[n % len(values)]`` where
    ``mask.flat[n]`` is true (the mask may be a traced value)."""
    _write_target(a, "putmask")
    n = _size(a)
    msize = _size(mask) if is_value(mask) else np.size(mask)
    if msize != n:
        raise ValueError("putmask: mask and data must be the same size")
    nv = _size(values) if is_value(values) else np.size(values)
    if nv == 0 or n == 0:
        return None
    shp = shape_of(a)
    v = values if is_value(values) else np.asarray(values)
    flat_v = reshape(v, (-1,)) if is_value(v) else v.reshape(-1)
    cyc = np.arange(n) % nv
    full = getitem(flat_v, cyc) if is_value(flat_v) else flat_v[cyc]
    full = reshape(full, shp) if is_value(full) else full.reshape(shp)
    if _dtype(full) != _dtype(a):
        full = astype(full, _dtype(a)) if is_value(full) else full.astype(_dtype(a))
    m = reshape(mask, shp) if is_value(mask) else np.asarray(mask).reshape(shp)
    if _dtype(m) != np.bool_:
        m = astype(m, np.bool_) if is_value(m) else m.astype(bool)
    a._assign(where(m, full, clone(a) if hasattr(a, "_data") else a),
              "np.putmask(a, mask, values)", "a = np.where(mask, values, a)")
    return None


@implements(np.copyto)
def copyto(dst, src, casting="same_kind", where=True):
    """np.copyto: ``dst[...] = src`` (broadcast, cast under ``casting``),
    only where ``where`` is true."""
    _write_target(dst, "copyto")
    from tracegrad.ops._define import _stand_in
    # NumPy's own checks (broadcasting, casting) on stand-ins
    np.copyto(np.empty(shape_of(dst), _dtype(dst)), _stand_in(src), casting=casting,
              where=_stand_in(where))
    s = _operand(src)
    if _dtype(s) != _dtype(dst):
        s = astype(s, _dtype(dst)) if is_value(s) else s.astype(_dtype(dst))
    old = clone(dst) if hasattr(dst, "_data") else dst   # eager: read from a copy
    dst._assign(_select(where, s, old), "np.copyto(dst, src)", "dst = np.where(mask, src, dst)")
    return None


@implements(np.fill_diagonal)
def fill_diagonal(a, val, wrap=False):
    """np.fill_diagonal: the main diagonal of ``a`` (all dimensions equal
    when ndim > 2) gets ``val`` in turn, repeated as needed."""
    _write_target(a, "fill_diagonal")
    shp = shape_of(a)
    marks = np.zeros(shp, dtype=bool)
    np.fill_diagonal(marks, True, wrap=wrap)      # NumPy's checks and positions
    pos = np.flatnonzero(marks.reshape(-1))
    nv = _size(val) if is_value(val) else np.size(val)
    if not len(pos) or nv == 0:
        return None
    a._assign(_flat_write(a, pos, val, np.arange(len(pos)) % nv, "fill_diagonal"),
              "np.fill_diagonal(a, val)", "a = tg.setitem(a, index, value)")
    return None
