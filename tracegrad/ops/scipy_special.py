"""``scipy.special``'s differentiable functions on tracegrad values: the one
implementation behind ``tracegrad.scipy.special`` and behind SciPy's own
functions called on traced or recorded values (``tracegrad.frontend.scipy_calls``).

NumPy-only rows (``tracegrad/ops/special.py``): gammaln, polygamma (digamma is
n=0), erfinv, bessel_j / bessel_y (integer order), bessel_ive (real order v >= 0),
gammainc, betainc; the functions built on them below need no SciPy.  Bessel orders
there are static (Python numbers); gammainc, gammaincc and betainc are
differentiable in x only (as in SciPy and autograd; a derivative in a or b is an
error, not autograd's silent zero).  Precision notes: erfc is 1 - erf (absolute,
not relative, accuracy for large x); erfcinv is erfinv(1 - y) (loses relative
accuracy for y near 0).

The other ufuncs (``ndtr``, ``ndtri``, ``log_ndtr``, ``erfcx``, ``entr``,
``rel_entr``, ``kl_div``, ``kv``, ``jv`` with array orders, ...) are the rows
``scipy_ufunc1/2/3`` (``tracegrad/ops/scipy_rows.py``): SciPy's values, tracegrad's
derivative rules; they need SciPy at run time.

``UFUNCS`` maps each ``scipy.special`` ufunc name to its implementation here;
``FUNCTIONS`` the other (Python) functions.
"""
from __future__ import annotations

import math
import sys

import numpy as np

from tracegrad.ops import _define
from tracegrad.ops._define import _ops as _o
from tracegrad.ops.special import gammaln, digamma, erfinv
from tracegrad.ops.special import polygamma as _polygamma
from tracegrad.ops import special as _rows
from tracegrad.ops import scipy_rows as _sr
from tracegrad.ops.base import is_value

PUBLIC = ["gammaln", "digamma", "psi", "polygamma", "gamma", "rgamma", "gammasgn",
          "multigammaln", "beta", "betaln", "betainc", "gammainc", "gammaincc",
          "erf", "erfc", "erfinv", "erfcinv", "expit", "logit", "logsumexp", "xlogy",
          "xlog1py", "j0", "j1", "jn", "y0", "y1", "yn", "i0", "i1", "i0e", "i1e", "iv",
          "ive", "softmax", "log_softmax", "zeta", "sinc", "softplus"]
__all__ = []   # reached through tracegrad.scipy.special (torch spells these differently)

psi = digamma
erf = _o.erf


def _f(x):
    """A float operand: tracegrad values pass; the rest become float arrays."""
    if is_value(x):
        return x if np.dtype(x.dtype).kind in "fc" else _o.astype(x, np.float64)
    x = np.asarray(x)
    return x if x.dtype.kind in "fc" else x.astype(np.float64)


def polygamma(n, x):
    """scipy.special.polygamma with a static integer order n (a scalar)."""
    n = np.asarray(n)
    if n.ndim or n.dtype.kind not in "iu" and float(n) != int(n):
        raise NotImplementedError("polygamma: n must be one static integer")
    return _polygamma(int(n), x)


def gammasgn(x):
    """The sign of Gamma(x), as SciPy: -1 where x < 0 and floor(x) is odd,
    nan at the poles -1, -2, ..., at -inf and nan, the sign of zero at 0; its
    derivative is 0."""
    x = _f(x)
    k = _o.floor(_o.where(_o.isfinite(x), x, 0.0))   # no warnings from inf and nan
    neg = _o.logical_and(_o.less(x, 0), _o.not_equal(_o.remainder(k, 2.0), 0))
    pole = _o.logical_or(_o.logical_and(_o.less(x, 0), _o.logical_or(_o.equal(x, k),
                                                                      _o.isinf(x))),
                         _o.isnan(x))
    sgn = _o.where(neg, -1.0, 1.0)
    sgn = _o.where(_o.equal(x, 0), _o.copysign(1.0, x), sgn)
    return _o.where(pole, np.nan, sgn)


def gamma(x):
    """Gamma(x) = sign * exp(gammaln(x)); the sign is (-1)^floor(x) for x < 0."""
    x = _f(x)
    k = _o.floor(x)
    neg = _o.logical_and(_o.less(x, 0), _o.not_equal(_o.remainder(k, 2.0), 0))
    return _o.where(neg, -1.0, 1.0) * _o.exp(gammaln(x))


def rgamma(x):
    """1 / Gamma(x) (0 at the poles, like SciPy)."""
    return 1.0 / gamma(x)


def betaln(a, b):
    a, b = _f(a), _f(b)
    return gammaln(a) + gammaln(b) - gammaln(a + b)


def beta(a, b):
    """B(a, b) for a, b > 0 (as exp(betaln))."""
    return _o.exp(betaln(a, b))


def multigammaln(a, d):
    """log of the multivariate gamma function of dimension d (static)."""
    d = int(d)
    a = _f(a)
    out = d * (d - 1) / 4.0 * math.log(math.pi)
    for j in range(d):
        out = out + gammaln(a - j / 2.0)
    return out


def erfc(x):
    return 1.0 - _o.erf(_f(x))


def erfcinv(y):
    return erfinv(1.0 - _f(y))


def expit(x):
    return _o.sigmoid(_f(x))


def logit(p):
    p = _f(p)
    return _o.log(p) - _o.log1p(-p)


def _safe(x, y, fill):
    """y where x != 0, fill where x == 0: the gradient never sees log(0) there."""
    return _o.where(_o.equal(x, 0), fill, y)


def xlogy(x, y):
    """x * log(y), 0 where x == 0."""
    x, y = _f(x), _f(y)
    return _o.where(_o.equal(x, 0), 0.0, x * _o.log(_safe(x, y, 1.0)))


def xlog1py(x, y):
    """x * log1p(y), 0 where x == 0."""
    x, y = _f(x), _f(y)
    return _o.where(_o.equal(x, 0), 0.0, x * _o.log1p(_safe(x, y, 0.0)))


def logsumexp(a, axis=None, b=None, keepdims=False, return_sign=False):
    """scipy.special.logsumexp (b: weights >= 0; return_sign is not supported)."""
    if return_sign:
        raise NotImplementedError("logsumexp: return_sign=True is not supported")
    a = _f(a)
    if b is None:
        return _o.logsumexp(a, axis=axis, keepdims=keepdims)
    b = _f(b)
    shape = np.broadcast_shapes(tuple(_o.shape_of(a)), tuple(_o.shape_of(b)))
    a = _o.broadcast_to(a, shape)
    b = _o.broadcast_to(b, shape)
    axes = tuple(range(len(shape))) if axis is None else axis
    m = _o.stop_gradient(_o.amax(_o.where(_o.equal(b, 0), -np.inf, a), axis=axes,
                                 keepdims=True))
    m = _o.where(_o.isfinite(m), m, 0.0)
    out = _o.log(_o.sum(b * _o.exp(a - m), axis=axes, keepdims=True)) + m
    if not keepdims:
        out = _o.squeeze(out, axis=axes)
    return out


# --- incomplete gamma and beta (differentiable in x) --------------------------------------

def gammainc(a, x):
    """The regularized lower incomplete gamma function P(a, x)."""
    return _rows.gammainc(_f(a), _f(x))


def gammaincc(a, x):
    """The regularized upper incomplete gamma function Q(a, x) = 1 - P(a, x)."""
    return _rows.gammainc(_f(a), _f(x), upper=True)


def betainc(a, b, x):
    """The regularized incomplete beta function I_x(a, b)."""
    return _rows.betainc(_f(a), _f(b), _f(x))


# --- Bessel functions (static orders) ------------------------------------------------------

def jn(n, x):
    """J_n(x), n a static integer."""
    return _rows.jv(n, _f(x))


def yn(n, x):
    """Y_n(x), n a static integer (nan for x < 0, -inf at 0)."""
    return _rows.yv(n, _f(x))


def j0(x):
    return _rows.jv(0, _f(x))


def j1(x):
    return _rows.jv(1, _f(x))


def y0(x):
    return _rows.yv(0, _f(x))


def y1(x):
    return _rows.yv(1, _f(x))


def ive(v, x):
    """exp(-|x|) I_v(x), v a static real order >= 0 (or a negative integer)."""
    return _rows.ive(v, _f(x))


def iv(v, x):
    """I_v(x) = exp(|x|) ive(v, x)."""
    x = _f(x)
    return _o.exp(_o.abs(x)) * _rows.ive(v, x)


def i0(x):
    return iv(0, x)


def i1(x):
    return iv(1, x)


def i0e(x):
    return ive(0, x)


def i1e(x):
    return ive(1, x)


# --- the rest of SciPy's ufuncs: SciPy's values, tracegrad's rules (scipy_rows) ------------

def _row(name):
    def f(*xs):
        return _sr.sp(name, *[_f(x) for x in xs])
    f.__name__ = f.__qualname__ = name
    f.__doc__ = f"scipy.special.{name} (row scipy_ufunc{{n}}: SciPy's values)"
    return f


for _name in sorted(_sr.UFUNC_NAMES):
    if _name not in globals():
        globals()[_name] = _row(_name)
        PUBLIC.append(_name)


def _axes(x, axis):
    nd = len(tuple(_o.shape_of(x)))
    if axis is None:
        return tuple(range(nd))
    return tuple(a % nd for a in ((axis,) if isinstance(axis, int) else tuple(axis)))


def softmax(x, axis=None):
    """scipy.special.softmax: exp(x) / sum(exp(x)) over ``axis`` (None: all elements)."""
    x = _f(x)
    axes = _axes(x, axis)
    e = _o.exp(x - _o.stop_gradient(_o.amax(x, axis=axes, keepdims=True)))
    return e / _o.sum(e, axis=axes, keepdims=True)


def log_softmax(x, axis=None):
    """scipy.special.log_softmax: x - logsumexp(x) over ``axis`` (None: all elements)."""
    x = _f(x)
    return x - _o.logsumexp(x, axis=_axes(x, axis), keepdims=True)


def zeta(x, q=None, out=None):
    """scipy.special.zeta: the Riemann zeta function (q None) or Hurwitz's
    zeta(x, q); differentiable in q (Riemann's: no derivative in x)."""
    if out is not None:
        raise TypeError("scipy.special.zeta(..., out=) is not supported on tracegrad values; "
                        "assign the result instead")
    return _sr.sp("zeta", _f(x), _f(1.0 if q is None else q))


def sinc(x):
    """np.sinc (scipy.special.sinc is NumPy's)."""
    return _o.sinc(_f(x))


def softplus(x, **kwargs):
    """scipy.special.softplus: log(1 + exp(x))."""
    if kwargs:
        raise TypeError(f"scipy.special.softplus: the keywords {sorted(kwargs)} are not "
                        f"supported on tracegrad values")
    return _o.softplus(_f(x))


# SciPy name -> implementation, for the ufuncs (reached through __array_ufunc__) and the
# Python functions (reached by name: tracegrad.frontend.scipy_calls)
_UFUNC_LIST = ("gammaln", "psi", "gamma", "rgamma", "beta", "betaln", "betainc", "gammainc",
               "gammaincc", "erf", "erfc", "erfinv", "erfcinv", "expit", "logit", "xlogy",
               "xlog1py", "j0", "j1", "y0", "y1", "i0", "i1", "i0e", "i1e", "gammasgn") \
    + tuple(sorted(_sr.UFUNC_NAMES))
UFUNCS = {n: globals()[n] for n in _UFUNC_LIST if n != "zeta"}   # zeta: a function


def _orders(name, static):
    """``name``(v, x): a static order tracegrad's NumPy rows take goes there
    (``static(v)`` says which), any other order to SciPy's values (row scipy_ufunc2)."""
    own = globals()[name] if name in ("iv", "ive") else None

    def f(v, x):
        if not is_value(v) and np.ndim(v) == 0 and static(float(np.asarray(v))):
            return own(v, x) if own is not None else \
                (_rows.jv if name == "jv" else _rows.yv)(int(np.asarray(v)), _f(x))
        return _sr.sp(name, _f(v), _f(x))
    f.__name__ = f.__qualname__ = name
    f.__doc__ = (f"scipy.special.{name}(v, x), differentiable in x (a static order: "
                 f"tracegrad's NumPy row; an array order: SciPy's values)")
    return f


_int = lambda v: v == int(v)          # noqa: E731
for _name, _static in (("iv", lambda v: v >= 0 or _int(v)), ("ive", lambda v: v >= 0 or _int(v)),
                       ("jv", _int), ("yv", _int)):
    UFUNCS[_name] = _orders(_name, _static)
for _name in ("iv", "ive", "jv", "yv"):
    globals()[_name] = UFUNCS[_name]
FUNCTIONS = {n: globals()[n] for n in ("logsumexp", "softmax", "log_softmax", "polygamma",
                                       "multigammaln", "zeta", "sinc", "softplus")}


def _scipy_ufunc(ufunc):
    """The override of a ``scipy.special`` ufunc met by ``__array_ufunc__``
    (tracegrad.ops._define), or None for a ufunc that is not SciPy's."""
    mod = sys.modules.get("scipy.special")
    name = getattr(ufunc, "__name__", None)
    if mod is None or name is None or getattr(mod, name, None) is not ufunc:
        return None
    fn = UFUNCS.get(name)
    if fn is None:
        def refuse(*args, **kwargs):
            raise NotImplementedError(
                f"scipy.special.{name} was called on a value tracegrad follows (traced, or "
                f"recorded for a gradient), and tracegrad has no derivative rule for it; "
                f"see docs/scipy.md for the SciPy functions tracegrad differentiates, or "
                f"wrap the call in tg.autograd.Function with a hand-written backward")
        return refuse
    _define.NUMPY_FUNCTIONS[ufunc] = fn
    return fn


_define.FOREIGN_UFUNCS.append(_scipy_ufunc)
