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

* ``bessel_j`` / ``bessel_y`` (static integer order ``n``): J_n and Y_n;
  vjp ``(J_{n-1} - J_{n+1}) / 2`` (and for Y).
* ``bessel_ive`` (static real order ``v >= 0``): exp(-|x|) I_v(x); vjp
  ``ive_{v+1} + (v/x - sign x) ive_v`` (``(ive_{v-1} + ive_{v+1}) / 2 - sign x
  ive_v`` for v >= 1, so x = 0 stays finite).
* ``gammainc`` (``upper`` static: P or Q = 1 - P) and ``betainc``: the
  regularized incomplete gamma and beta functions; vjp in x only, the
  integrand (``exp(-x) x^(a-1) / Gamma(a)``, ``x^(a-1) (1-x)^(b-1) / B(a,b)``).
  SciPy, and HIPS autograd, have no derivative in the parameters a, b:
  asking for one is an error here (autograd silently gives zero).

Everything else in ``tracegrad.scipy`` is a composition of existing rows.
The helpers are registered into ``tracegrad.ops.runtime_numpy`` (codegen copies
their source from there), so they are self-contained functions.
"""
from __future__ import annotations

import math

import numpy as np

from tracegrad.ops import runtime_numpy as _rt
from tracegrad.ops.primitives import bind, register
from tracegrad.ops.base import elementwise_shape, mul, exp, add, where, sub, log, neg, div
from tracegrad.ops.elementwise import square, log1p, sign as _sign

__all__ = []  # reached through tracegrad.scipy.special (torch spells these differently)


# --- rows ---------------------------------------------------------------------------------

def _gammaln_impl(xp, x):
    if xp is np:
        return _rt._gammaln(x)
    from cupyx.scipy.special import gammaln as _g  # the GPU has its own
    return _g(x)


def _polygamma_impl(xp, x, n):
    if xp is np:
        return _rt._polygamma(x, n)
    from cupyx.scipy.special import polygamma as _pg
    return _pg(n, x).astype(x.dtype)


def _erfinv_impl(xp, x):
    if xp is np:
        return _rt._erfinv(x)
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
    numpy="_polygamma({0}, {n})", helpers=("_polygamma",),
    cuda="tg_polygamma({0}, {n})", elementwise=True)     # the helpers' C, same algorithm

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


# --- Bessel functions, incomplete gamma and beta -------------------------------------------

def _on_host(xp, fn, *arrays, **kw):
    """A NumPy helper for CuPy operands: computed on the host, returned to the GPU."""
    if xp is np:
        return fn(*arrays, **kw)
    return xp.asarray(fn(*[xp.asnumpy(a) if hasattr(a, "device") else a for a in arrays], **kw))


def _bessel_j_impl(xp, x, n):
    return _on_host(xp, _rt._bessel_jy, x, n, "j")


def _bessel_y_impl(xp, x, n):
    return _on_host(xp, _rt._bessel_jy, x, n, "y")


def _bessel_ive_impl(xp, x, v):
    return _on_host(xp, _rt._bessel_ive, x, v)


def _j_rule(t, out, x, n):
    return mul(t, mul(sub(bind(bessel_j_p, x, n=n - 1), bind(bessel_j_p, x, n=n + 1)), 0.5))


def _y_rule(t, out, x, n):
    return mul(t, mul(sub(bind(bessel_y_p, x, n=n - 1), bind(bessel_y_p, x, n=n + 1)), 0.5))


def _ive_rule(t, out, x, v):
    up = bind(bessel_ive_p, x, v=v + 1.0)
    if v >= 1.0:
        d = mul(add(bind(bessel_ive_p, x, v=v - 1.0), up), 0.5)
    elif v == 0.0:
        d = up
    else:
        d = add(up, mul(div(v, x), out))
    return mul(t, sub(d, mul(_sign(x), out)))


bessel_j_p = register(
    "bessel_j", _bessel_j_impl, shape=elementwise_shape(_bessel_j_impl),
    vjp=(_j_rule,), jvp=(_j_rule,),
    numpy="_bessel_jy({0}, {n}, 'j')", helpers=("_bessel_jy",))
bessel_y_p = register(
    "bessel_y", _bessel_y_impl, shape=elementwise_shape(_bessel_y_impl),
    vjp=(_y_rule,), jvp=(_y_rule,),
    numpy="_bessel_jy({0}, {n}, 'y')", helpers=("_bessel_jy",))

bessel_ive_p = register(
    "bessel_ive", _bessel_ive_impl, shape=elementwise_shape(_bessel_ive_impl),
    vjp=(_ive_rule,), jvp=(_ive_rule,), save_out=True,
    numpy="_bessel_ive({0}, {v})", helpers=("_bessel_ive",))


def _no_parameter_derivative(name, what):
    def rule(*args, **kw):
        raise NotImplementedError(
            f"{name}: the derivative with respect to {what} is not implemented (SciPy "
            f"and HIPS autograd have none either; autograd returns zero, which is "
            f"wrong). Differentiate with respect to x only, or pass {what} as a "
            f"constant (a plain array, or detach() / tg.stop_gradient).")
    return rule


def _gammainc_impl(xp, a, x, upper):
    return _on_host(xp, _rt._gammainc, a, x, upper)


def _gammainc_dx(t, out, a, x, upper):
    # d/dx P(a, x) = exp(-x) x^(a-1) / Gamma(a); Q = 1 - P
    d = exp(sub(sub(mul(sub(a, 1.0), log(x)), x), gammaln(a)))
    return mul(t, neg(d) if upper else d)


def _betainc_impl(xp, a, b, x):
    return _on_host(xp, _rt._betainc, a, b, x)


def _betainc_dx(t, out, a, b, x):
    # d/dx I_x(a, b) = x^(a-1) (1-x)^(b-1) / B(a, b)
    lb = sub(add(gammaln(a), gammaln(b)), gammaln(add(a, b)))
    return mul(t, exp(sub(add(mul(sub(a, 1.0), log(x)), mul(sub(b, 1.0), log1p(neg(x)))), lb)))


gammainc_p = register(
    "gammainc", _gammainc_impl, shape=elementwise_shape(_gammainc_impl),
    vjp=(_no_parameter_derivative("gammainc", "a"), _gammainc_dx),
    jvp=(_no_parameter_derivative("gammainc", "a"), _gammainc_dx),
    numpy="_gammainc({0}, {1}, {upper})", helpers=("_gammainc",))

betainc_p = register(
    "betainc", _betainc_impl, shape=elementwise_shape(_betainc_impl),
    vjp=(_no_parameter_derivative("betainc", "a"), _no_parameter_derivative("betainc", "b"),
         _betainc_dx),
    jvp=(_no_parameter_derivative("betainc", "a"), _no_parameter_derivative("betainc", "b"),
         _betainc_dx),
    numpy="_betainc({0}, {1}, {2})", helpers=("_betainc",))


def jv(n, x):
    """J_n(x) for a static integer order n (primitive ``bessel_j``)."""
    return bind(bessel_j_p, x, n=_static_int(n, "jv"))


def yv(n, x):
    """Y_n(x) for a static integer order n (primitive ``bessel_y``)."""
    return bind(bessel_y_p, x, n=_static_int(n, "yv"))


def ive(v, x):
    """exp(-|x|) I_v(x) for a static real order v >= 0 (primitive ``bessel_ive``)."""
    v = float(np.asarray(v))
    if v < 0 and v != int(v):
        raise ValueError("ive: a negative order must be an integer")
    return bind(bessel_ive_p, x, v=abs(v) if v == int(v) else v)


def gammainc(a, x, upper=False):
    """The regularized incomplete gamma function P(a, x) (upper: Q(a, x))."""
    return bind(gammainc_p, a, x, upper=bool(upper))


def betainc(a, b, x):
    """The regularized incomplete beta function I_x(a, b)."""
    return bind(betainc_p, a, b, x)


def _static_int(n, what):
    n = np.asarray(n)
    if n.ndim or (n.dtype.kind not in "iu" and float(n) != int(n)):
        raise NotImplementedError(f"{what}: the order must be one static integer "
                                  f"(a Python int), got {n!r}")
    return int(n)
