"""torch.special: ``import tracegrad as torch; torch.special.erfinv(x)``,
with torch's names and signatures, eager and compiled alike.

Each function is a registry row (tracegrad.ops.special's gammaln,
polygamma, erfinv, the Bessel row; the elementwise rows) or composed of
rows, so its derivative is theirs.  Integer inputs are computed in the
default dtype, as torch does.  A name torch.special has and tracegrad does
not raises an AttributeError that says so.
"""
from __future__ import annotations

import math

import numpy as np

from tracegrad import ops
from tracegrad.ops import special as _sp
from tracegrad.ops import dtypes as _dtypes
from tracegrad.ops.base import resolve_dtype

__all__ = ["digamma", "entr", "erf", "erfc", "erfcx", "erfinv", "exp2", "expit", "expm1",
           "gammaln", "i0", "i0e", "i1", "i1e", "log1p", "log_ndtr", "log_softmax", "logit",
           "logsumexp", "multigammaln", "ndtr", "ndtri", "polygamma", "psi", "round", "sinc",
           "softmax", "xlog1py", "xlogy"]

_SQRT2 = math.sqrt(2.0)


def _float(x):
    """x as a floating value: integer and bool tensors (and numbers) in the
    default dtype, as torch's special functions compute them."""
    if not hasattr(x, "dtype"):
        x = ops.astype(np.asarray(x), _dtypes.Defaults.dtype) if not hasattr(x, "_face") else x
    if x.dtype.kind in "biu":
        return ops.astype(x, _dtypes.Defaults.dtype)
    return x


def _no_out(out, name):
    if out is not None:
        raise TypeError(f"torch.special.{name}(out=) cannot write into a tracegrad value; "
                        f"assign the result")


def erf(input, *, out=None):
    _no_out(out, "erf")
    return ops.erf(_float(input))


def _upper_tail(u):
    """Q(1/2, u) = erfc(sqrt(u)) for u >= 0, the incomplete gamma row's upper
    tail: accurate where 1 - erf(x) cancels."""
    return _sp.gammainc(0.5, u, upper=True)


def erfc(input, *, out=None):
    """1 - erf(x), accurate for large x (the incomplete gamma row's tail)."""
    _no_out(out, "erfc")
    x = _float(input)
    pos = x > 0
    xs = ops.where(pos, x, 1.0)            # no derivative of the other branch's inputs
    return ops.where(pos, _upper_tail(xs * xs), 1.0 - ops.erf(ops.where(pos, 0.0, x)))


def erfcx(input, *, out=None):
    """exp(x^2) erfc(x) (computed as written: overflows where x^2 does)."""
    _no_out(out, "erfcx")
    x = _float(input)
    return ops.exp(x * x) * (1.0 - ops.erf(x))


def erfinv(input, *, out=None):
    _no_out(out, "erfinv")
    return _sp.erfinv(_float(input))


def expit(input, *, out=None):
    """The logistic sigmoid."""
    _no_out(out, "expit")
    return ops.sigmoid(_float(input))


def logit(input, eps=None, *, out=None):
    """log(p / (1 - p)), p clamped to [eps, 1 - eps] when eps is given."""
    _no_out(out, "logit")
    p = _float(input)
    if eps is not None:
        p = ops.clip(p, eps, 1.0 - eps)
    return ops.log(p / (1.0 - p))


def xlogy(input, other, *, out=None):
    """x * log(y), 0 where x is 0 (y not NaN)."""
    _no_out(out, "xlogy")
    x, y = _promoted(input, other)
    safe_y = ops.where(x == 0, 1.0, y)
    return ops.where(ops.logical_and(x == 0, ops.logical_not(ops.isnan(y))), 0.0,
                     x * ops.log(safe_y))


def xlog1py(input, other, *, out=None):
    """x * log1p(y), 0 where x is 0 (y not NaN)."""
    _no_out(out, "xlog1py")
    x, y = _promoted(input, other)
    safe_y = ops.where(x == 0, 0.0, y)
    return ops.where(ops.logical_and(x == 0, ops.logical_not(ops.isnan(y))), 0.0,
                     x * ops.log1p(safe_y))


def _promoted(a, b):
    """a and b in torch's floating result dtype (numbers stay numbers)."""
    vals = [v for v in (a, b) if hasattr(v, "dtype")]
    dt = _dtypes.result_type(*[v for v in (a, b)]) if vals else _dtypes.Defaults.dtype
    if dt.kind in "biu":
        dt = _dtypes.Defaults.dtype
    conv = [ops.astype(v, dt) if hasattr(v, "dtype") and v.dtype != dt else v for v in (a, b)]
    return conv[0], conv[1]


def gammaln(input, *, out=None):
    _no_out(out, "gammaln")
    return _sp.gammaln(_float(input))


def digamma(input, *, out=None):
    _no_out(out, "digamma")
    return _sp.digamma(_float(input))


psi = digamma


def polygamma(n, input, *, out=None):
    _no_out(out, "polygamma")
    return _sp.polygamma(int(n), _float(input))


def multigammaln(input, p, *, out=None):
    """log of the multivariate gamma function of dimension p."""
    _no_out(out, "multigammaln")
    x = _float(input)
    p = int(p)
    if p < 1:
        raise RuntimeError("p has to be greater than or equal to 1")
    res = p * (p - 1) / 4.0 * math.log(math.pi)
    for j in range(p):
        res = res + _sp.gammaln(x - j / 2.0)
    return res


def i0e(input, *, out=None):
    _no_out(out, "i0e")
    return _sp.ive(0, _float(input))


def i1e(input, *, out=None):
    _no_out(out, "i1e")
    return _sp.ive(1, _float(input))


def i0(input, *, out=None):
    _no_out(out, "i0")
    x = _float(input)
    return _sp.ive(0, x) * ops.exp(ops.abs(x))


def i1(input, *, out=None):
    _no_out(out, "i1")
    x = _float(input)
    return _sp.ive(1, x) * ops.exp(ops.abs(x))


def ndtr(input, *, out=None):
    """The standard normal CDF (its lower tail accurate: erfc's)."""
    _no_out(out, "ndtr")
    return 0.5 * erfc(-_float(input) / _SQRT2)


def ndtri(input, *, out=None):
    """The inverse of ndtr."""
    _no_out(out, "ndtri")
    return _SQRT2 * _sp.erfinv(2.0 * _float(input) - 1.0)


def log_ndtr(input, *, out=None):
    """log(ndtr(x)): log(erfc(-x/sqrt 2) / 2) below 0, log1p(-erfc(x/sqrt 2) / 2)
    above, and the asymptotic series below -20, where erfc underflows."""
    _no_out(out, "log_ndtr")
    x = _float(input)
    tail = x < -20.0
    xt = ops.where(tail, x, -21.0)
    # log Phi(x) = -x^2/2 - log(-x) - log(sqrt(2 pi)) + log(1 - 1/x^2 + 3/x^4 - 15/x^6 ...)
    z = 1.0 / (xt * xt)
    series = ops.log1p(z * (-1.0 + z * (3.0 + z * (-15.0 + z * 105.0))))
    asym = -0.5 * xt * xt - ops.log(-xt) - 0.5 * math.log(2 * math.pi) + series
    neg = x < 0
    xn = ops.where(neg, ops.where(tail, -21.0, x), -1.0)
    xp = ops.where(neg, 1.0, x)
    low = ops.log(0.5 * _upper_tail(xn * xn / 2.0))
    high = ops.log1p(-0.5 * _upper_tail(xp * xp / 2.0))
    return ops.where(tail, asym, ops.where(neg, low, high))


def sinc(input, *, out=None):
    """sin(pi x) / (pi x), 1 at 0."""
    _no_out(out, "sinc")
    return ops.sinc(_float(input))


def entr(input, *, out=None):
    """-x log x for x > 0, 0 at 0, -inf below."""
    _no_out(out, "entr")
    x = _float(input)
    pos = x > 0
    safe = ops.where(pos, x, 1.0)
    return ops.where(pos, -x * ops.log(safe), ops.where(x == 0, 0.0, -np.inf))


def logsumexp(input, dim, keepdim=False, *, out=None):
    _no_out(out, "logsumexp")
    return ops.logsumexp(_float(input), axis=dim, keepdims=keepdim)


def softmax(input, dim, *, dtype=None):
    x = input if dtype is None else ops.astype(input, _resolve(dtype))
    return ops.softmax(_float(x), dim)


def log_softmax(input, dim, *, dtype=None):
    x = input if dtype is None else ops.astype(input, _resolve(dtype))
    return ops.log_softmax(_float(x), dim)


def _resolve(d):
    return resolve_dtype(d)


def expm1(input, *, out=None):
    _no_out(out, "expm1")
    return ops.expm1(_float(input))


def exp2(input, *, out=None):
    _no_out(out, "exp2")
    return ops.exp2(_float(input))


def log1p(input, *, out=None):
    _no_out(out, "log1p")
    return ops.log1p(_float(input))


def round(input, *, decimals=0, out=None):
    """Half to even, as torch.round."""
    _no_out(out, "round")
    return ops.round(input, decimals)


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    raise AttributeError(f"tracegrad does not provide torch.special.{name} (module "
                         f"'tracegrad.special' has no attribute {name!r})")
