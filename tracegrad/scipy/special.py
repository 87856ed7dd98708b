"""``scipy.special``'s differentiable functions (the ones HIPS autograd offers).

Rows: gammaln, polygamma (digamma is n=0), erfinv, bessel_j / bessel_y (integer
order), bessel_ive (real order v >= 0), gammainc, betainc (``tracegrad/ops/special.py``).
Bessel orders are static (Python numbers); gammainc, gammaincc and betainc are
differentiable in x only (as in SciPy and autograd; a derivative in a or b is an
error, not autograd's silent zero).
The rest are compositions, so their derivatives come from those rows' rules.
Precision notes: erfc is 1 - erf (absolute, not relative, accuracy for large
x); erfcinv is erfinv(1 - y) (loses relative accuracy for y near 0).
"""
from __future__ import annotations

import math

import numpy as np

from tracegrad import ops as _o
from tracegrad.ops.special import gammaln, digamma, erfinv
from tracegrad.ops.special import polygamma as _polygamma
from tracegrad.ops import special as _rows

__all__ = ["gammaln", "digamma", "psi", "polygamma", "gamma", "rgamma", "gammasgn",
           "multigammaln", "beta", "betaln", "betainc", "gammainc", "gammaincc",
           "erf", "erfc", "erfinv", "erfcinv", "expit", "logit", "logsumexp", "xlogy",
           "xlog1py", "j0", "j1", "jn", "y0", "y1", "yn", "i0", "i1", "i0e", "i1e", "iv",
           "ive"]

psi = digamma
erf = _o.erf


def _f(x):
    """A float operand: tracegrad values pass; the rest become float arrays."""
    if _o.is_value(x):
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
