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
