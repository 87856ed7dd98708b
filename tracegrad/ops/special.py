"""Special functions (the rows behind ``tracegrad.scipy.special``).

Three rows, each with a NumPy runtime helper (NumPy and ``math`` only, so
SciPy stays optional):

* ``gammaln``: log|Gamma(x)| (``math.lgamma`` per element, via
  ``np.vectorize``: exact to double precision, ~0.2 us an element); vjp
  ``digamma``.
* ``polygamma`` (static ``n >= 0``; ``n == 0`` is digamma): recurrence up
  to x >= 10 + 2n, then the asymptotic (Bernoulli) series; digamma uses the
  reflection formula below 0.5.  vjp ``polygamma(n + 1)``.
* ``erfinv``: a single-precision start (Giles 2010) refined by Newton
  steps (erfc-based towards +-1) on ``math.erf``; vjp ``sqrt(pi)/2 * exp(erfinv(y)^2)``.

Everything else in ``tracegrad.scipy`` is a composition of existing rows.
The helpers are registered into ``tracegrad.runtime_numpy`` (codegen copies
their source from there), so they are self-contained functions.
"""
from __future__ import annotations

import math

import numpy as np

from tracegrad import runtime_numpy as _rt
from tracegrad.primitives import bind, register
from tracegrad.ops.base import elementwise_shape, mul, exp, add, where, sub, log, neg
from tracegrad.ops.elementwise import square

__all__ = []  # reached through tracegrad.scipy.special (torch spells these differently)


# --- runtime helpers (copied by source into generated modules: self-contained) -----------

def _gammaln(x):
    """log|Gamma(x)| elementwise (inf at the poles, like SciPy).  Keeps float32."""
    x = np.asarray(x)
    dtype = x.dtype if x.dtype.kind == "f" else np.dtype(np.float64)

    def lg(v):
        try:
            return math.lgamma(v)
        except ValueError:  # a pole: 0, -1, -2, ...
            return math.inf
    return np.vectorize(lg, otypes=[dtype])(x) if x.size else x.astype(dtype)


def _polygamma(x, n):
    """The n-th derivative of digamma (n == 0: digamma itself), elementwise."""
    x = np.asarray(x)
    dtype = x.dtype if x.dtype.kind == "f" else np.dtype(np.float64)
    z = np.array(x, dtype=np.float64, copy=True, ndmin=1)
    shape = x.shape
    out = np.zeros(z.shape)
    if n == 0:  # reflection: psi(x) = psi(1 - x) - pi / tan(pi x)
        low = z < 0.5
        with np.errstate(all="ignore"):
            out[low] = -math.pi / np.tan(math.pi * z[low])
        z[low] = 1.0 - z[low]
        pole = low & (z == np.floor(z))
        out[pole] = np.nan
        out[z == 1.0] = -np.inf  # x == 0 (SciPy: -inf there, nan at -1, -2, ...)
    sgn = 1.0 if n % 2 else -1.0  # (-1)^(n+1)
    fact = float(math.factorial(n))
    lim = 10.0 + 2 * n
    with np.errstate(all="ignore"):
        bad = ~(z > -1e4)  # nan, -inf, too far left for the recurrence
        z[bad] = lim
        out[bad] = np.nan
        while True:
            small = z < lim
            if not small.any():
                break
            zs = z[small]
            out[small] += sgn * fact / zs ** (n + 1) if n else -1.0 / zs
            z[small] = zs + 1.0
        b2k = (1 / 6, -1 / 30, 1 / 42, -1 / 30, 5 / 66, -691 / 2730, 7 / 6, -3617 / 510,
               43867 / 798, -174611 / 330)
        r = 1.0 / z
        r2 = r * r
        if n == 0:
            s = np.log(z) - 0.5 * r
            p = np.ones_like(z)
            for k, b in enumerate(b2k, 1):
                p = p * r2
                s = s - b / (2 * k) * p
        else:
            s = math.factorial(n - 1) * r ** n + 0.5 * fact * r ** (n + 1)
            p = r ** n
            for k, b in enumerate(b2k, 1):
                p = p * r2
                s = s + b * (math.factorial(2 * k + n - 1) / math.factorial(2 * k)) * p
            s = sgn * s
        out = out + s
    if n > 0:
        out[np.isinf(np.asarray(x, dtype=np.float64).reshape(-1))[:out.size].reshape(out.shape)
            & ~bad] = 0.0
    return out.reshape(shape).astype(dtype)


def _erfinv(y):
    """The inverse error function, elementwise (+-inf at +-1, nan outside)."""
    y = np.asarray(y)
    dtype = y.dtype if y.dtype.kind == "f" else np.dtype(np.float64)
    v = y.astype(np.float64)
    with np.errstate(all="ignore"):
        w = -np.log((1.0 - v) * (1.0 + v))
        a = w - 2.5
        p = 2.81022636e-08
        for c in (3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087,
                  -0.00125372503, -0.00417768164, 0.246640727, 1.50140941):
            p = c + p * a
        b = np.sqrt(w) - 3.0
        q = -0.000200214257
        for c in (0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773,
                  -0.0076224613, 0.00943887047, 1.00167406, 2.83297682):
            q = c + q * b
        x = np.where(w < 5.0, p, q) * v
        # Newton on |x|: erf(t) = |y| near 0, erfc(t) = 1 - |y| (exact) towards +-1
        erf = np.vectorize(math.erf, otypes=[np.float64])
        erfc = np.vectorize(math.erfc, otypes=[np.float64])
        av = np.abs(v)
        c = 1.0 - av
        near = av > 0.5
        t = np.abs(x)
        ok = np.isfinite(t)
        for _ in range(12):  # quadratic; the start is poorer towards +-1
            if not t.size:
                break
            ts = np.where(ok, t, 0.0)
            f = np.where(near, c - erfc(ts), erf(ts) - av)
            step = np.where(ok, f / (1.1283791670955126 * np.exp(-ts * ts)), 0.0)
            step = np.where(np.isfinite(step), step, 0.0)
            t = t - step
            if not np.any(np.abs(step) > 1e-16 * np.abs(t)):
                break
        x = np.copysign(t, v)
        x = np.where(np.abs(v) == 1.0, np.copysign(np.inf, v), x)
        x = np.where(np.abs(v) > 1.0, np.nan, x)
    return np.asarray(x).astype(dtype)


for _h in (_gammaln, _polygamma, _erfinv):
    setattr(_rt, _h.__name__, _h)


# --- rows ---------------------------------------------------------------------------------

def _gammaln_impl(xp, x):
    if xp is np:
        return _gammaln(x)
    from cupyx.scipy.special import gammaln as _g  # the GPU has its own
    return _g(x)


def _polygamma_impl(xp, x, n):
    if xp is np:
        return _polygamma(x, n)
    from cupyx.scipy.special import polygamma as _pg
    return _pg(n, x).astype(x.dtype)


def _erfinv_impl(xp, x):
    if xp is np:
        return _erfinv(x)
    from cupyx.scipy.special import erfinv as _e
    return _e(x)


def _polygamma_rule(g, out, x, n):
    return mul(g, bind(polygamma_p, x, n=n + 1))


def _erfinv_rule(g, out, x):
    return mul(g, mul(exp(square(out)), math.sqrt(math.pi) / 2))


gammaln_p = register(
    "gammaln", _gammaln_impl, shape=elementwise_shape(_gammaln_impl),
    vjp=(lambda g, out, x: mul(g, bind(polygamma_p, x, n=0)),),
    jvp=(lambda t, out, x: mul(t, bind(polygamma_p, x, n=0)),),
    numpy="_gammaln({0})", helpers=("_gammaln",), cuda="lgamma({0})", elementwise=True)

polygamma_p = register(
    "polygamma", _polygamma_impl, shape=elementwise_shape(_polygamma_impl),
    vjp=(_polygamma_rule,), jvp=(_polygamma_rule,),
    numpy="_polygamma({0}, {n})", helpers=("_polygamma",))

erfinv_p = register(
    "erfinv", _erfinv_impl, shape=elementwise_shape(_erfinv_impl),
    vjp=(_erfinv_rule,), jvp=(_erfinv_rule,), save_out=True, save_inputs=False,
    numpy="_erfinv({0})", helpers=("_erfinv",))


def gammaln(x):
    """log|Gamma(x)| (primitive ``gammaln``)."""
    return bind(gammaln_p, x)


def polygamma(n, x):
    """The n-th derivative of digamma, n a static integer >= 0 (primitive ``polygamma``)."""
    n = int(n)
    if n < 0:
        raise ValueError("polygamma: n must be a non-negative integer")
    return bind(polygamma_p, x, n=n)


def digamma(x):
    """d/dx log Gamma(x) (primitive ``polygamma`` with n=0)."""
    return bind(polygamma_p, x, n=0)


def erfinv(y):
    """The inverse of erf on (-1, 1) (primitive ``erfinv``)."""
    return bind(erfinv_p, y)
