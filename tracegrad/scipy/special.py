"""``scipy.special``'s differentiable functions (the ones HIPS autograd offers).

Rows: gammaln, polygamma (digamma is n=0), erfinv (``tracegrad/ops/special.py``).
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

__all__ = ["gammaln", "digamma", "psi", "polygamma", "gamma", "rgamma", "multigammaln",
           "beta", "betaln", "erf", "erfc", "erfinv", "erfcinv", "expit", "logit",
           "logsumexp", "xlogy", "xlog1py"]

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
