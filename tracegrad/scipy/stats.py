"""``scipy.stats`` densities that HIPS autograd differentiates, as compositions of
tracegrad's rows, with SciPy's parameter names and broadcasting.

The cdfs go through the rows ``gammainc`` / ``betainc``, so, as in SciPy and
autograd, they are differentiable in x, loc and scale but not in shape
parameters (df, a, b): asking for that derivative is an error.

Arguments are taken inside the support (outside it SciPy returns 0 / -inf;
these formulas return whatever the algebra gives, often nan).  ``norm.logcdf``
is log(cdf), which underflows for x < about -37 (SciPy's log_ndtr does not).
"""
from __future__ import annotations

import math
import types

import numpy as np

from tracegrad import ops as _o
from tracegrad.scipy.special import (_f, gammaln, betaln, xlogy, xlog1py, gammainc, gammaincc,
                                     betainc)

__all__ = ["norm", "multivariate_normal", "t", "poisson", "beta", "gamma", "chi2", "dirichlet"]

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def _ns(name, **fns):
    return types.SimpleNamespace(__name__=name, **fns)


def _std(x, loc, scale):
    x, loc, scale = _f(x), _f(loc), _f(scale)
    return (x - loc) / scale, _o.log(scale)


# --- norm ---------------------------------------------------------------------------------

def _norm_logpdf(x, loc=0.0, scale=1.0):
    z, ls = _std(x, loc, scale)
    return -0.5 * z * z - _LOG_SQRT_2PI - ls


def _norm_cdf(x, loc=0.0, scale=1.0):
    z, _ = _std(x, loc, scale)
    return 0.5 * (1.0 + _o.erf(z * (1 / math.sqrt(2))))


def _norm_sf(x, loc=0.0, scale=1.0):
    z, _ = _std(x, loc, scale)
    return 0.5 * (1.0 - _o.erf(z * (1 / math.sqrt(2))))


norm = _ns("norm", logpdf=_norm_logpdf, pdf=lambda x, loc=0.0, scale=1.0:
           _o.exp(_norm_logpdf(x, loc, scale)),
           cdf=_norm_cdf, logcdf=lambda x, loc=0.0, scale=1.0: _o.log(_norm_cdf(x, loc, scale)),
           sf=_norm_sf, logsf=lambda x, loc=0.0, scale=1.0: _o.log(_norm_sf(x, loc, scale)))


# --- multivariate_normal -----------------------------------------------------------------

def _mvn_logpdf(x, mean=None, cov=1, allow_singular=False):
    x = _f(x)
    xs = tuple(_o.shape_of(x))
    cov = _f(cov)
    if len(tuple(_o.shape_of(cov))) < 2:  # a scalar or the diagonal
        c = cov
        dim = xs[-1] if xs else 1
        cov = c * np.eye(dim) if not tuple(_o.shape_of(c)) else _o.diag(c) if _o.is_value(c) \
            else np.diag(c)
    k = tuple(_o.shape_of(cov))[-1]
    if mean is not None:
        x = x - _f(mean)
    if k == 1 and (not xs or xs[-1] != 1):  # SciPy: 1-d x of a univariate law
        x = _o.expand_dims(x, -1)
    L = _o.linalg.cholesky(cov)
    sol = _o.linalg.solve(L, _o.expand_dims(x, -1))[..., 0]
    maha = _o.sum(sol * sol, axis=-1)
    logdet = 2.0 * _o.sum(_o.log(_o.diagonal(L, axis1=-2, axis2=-1)), axis=-1)
    return -0.5 * (maha + logdet) - k * _LOG_SQRT_2PI


def _mvn_entropy(mean=None, cov=1):
    cov = _f(cov)
    k = tuple(_o.shape_of(cov))[-1]
    L = _o.linalg.cholesky(cov)
    logdet = 2.0 * _o.sum(_o.log(_o.diagonal(L, axis1=-2, axis2=-1)), axis=-1)
    return 0.5 * logdet + k * (0.5 + _LOG_SQRT_2PI)


multivariate_normal = _ns("multivariate_normal", logpdf=_mvn_logpdf,
                          pdf=lambda x, mean=None, cov=1, allow_singular=False:
                          _o.exp(_mvn_logpdf(x, mean, cov)), entropy=_mvn_entropy)


# --- t ------------------------------------------------------------------------------------

def _t_logpdf(x, df, loc=0.0, scale=1.0):
    z, ls = _std(x, loc, scale)
    df = _f(df)
    return (gammaln((df + 1) / 2) - gammaln(df / 2) - 0.5 * _o.log(df * math.pi)
            - (df + 1) / 2 * _o.log1p(z * z / df) - ls)


def _t_cdf(x, df, loc=0.0, scale=1.0):
    """0.5 + sign(z)/2 * I_{z^2/(df+z^2)}(1/2, df/2); at z == 0 exactly, z is
    moved by 1e-100 so the derivative (the pdf) stays finite."""
    z, _ = _std(x, loc, scale)
    df = _f(df)
    z = z + _o.where(_o.equal(z, 0), 1e-100, 0.0)
    z2 = z * z
    inc = betainc(0.5, df / 2.0, z2 / (df + z2))
    return 0.5 + 0.5 * _o.sign(z) * inc


t = _ns("t", logpdf=_t_logpdf,
        pdf=lambda x, df, loc=0.0, scale=1.0: _o.exp(_t_logpdf(x, df, loc, scale)),
        cdf=_t_cdf, logcdf=lambda x, df, loc=0.0, scale=1.0: _o.log(_t_cdf(x, df, loc, scale)))


# --- poisson ------------------------------------------------------------------------------

def _poisson_logpmf(k, mu, loc=0):
    k = _f(k) - loc
    mu = _f(mu)
    return xlogy(k, mu) - gammaln(k + 1) - mu


def _poisson_cdf(k, mu, loc=0):
    """P(K <= k) = Q(floor(k) + 1, mu) for k >= 0, 0 below; d/dmu = -pmf(floor k)."""
    k = _o.floor(_f(k) - loc)
    mu = _f(mu)
    q = gammaincc(_o.maximum(k, 0.0) + 1.0, mu)
    return _o.where(_o.less(k, 0), 0.0, q)


poisson = _ns("poisson", logpmf=_poisson_logpmf,
              pmf=lambda k, mu, loc=0: _o.exp(_poisson_logpmf(k, mu, loc)), cdf=_poisson_cdf)


# --- beta, gamma, chi2 --------------------------------------------------------------------

def _beta_logpdf(x, a, b, loc=0.0, scale=1.0):
    z, ls = _std(x, loc, scale)
    a, b = _f(a), _f(b)
    return xlog1py(b - 1.0, -z) + xlogy(a - 1.0, z) - betaln(a, b) - ls


def _gamma_logpdf(x, a, loc=0.0, scale=1.0):
    z, ls = _std(x, loc, scale)
    a = _f(a)
    return xlogy(a - 1.0, z) - z - gammaln(a) - ls


def _chi2_logpdf(x, df, loc=0.0, scale=1.0):
    z, ls = _std(x, loc, scale)
    h = _f(df) / 2.0
    return xlogy(h - 1.0, z) - z / 2.0 - gammaln(h) - h * math.log(2.0) - ls


def _beta_cdf(x, a, b, loc=0.0, scale=1.0):
    z, _ = _std(x, loc, scale)
    return betainc(a, b, z)


def _gamma_cdf(x, a, loc=0.0, scale=1.0):
    z, _ = _std(x, loc, scale)
    return gammainc(a, z)


def _chi2_cdf(x, df, loc=0.0, scale=1.0):
    z, _ = _std(x, loc, scale)
    return gammainc(_f(df) / 2.0, z / 2.0)


beta = _ns("beta", logpdf=_beta_logpdf, pdf=lambda x, a, b, loc=0.0, scale=1.0:
           _o.exp(_beta_logpdf(x, a, b, loc, scale)), cdf=_beta_cdf)
gamma = _ns("gamma", logpdf=_gamma_logpdf, pdf=lambda x, a, loc=0.0, scale=1.0:
            _o.exp(_gamma_logpdf(x, a, loc, scale)), cdf=_gamma_cdf)
chi2 = _ns("chi2", logpdf=_chi2_logpdf, pdf=lambda x, df, loc=0.0, scale=1.0:
           _o.exp(_chi2_logpdf(x, df, loc, scale)), cdf=_chi2_cdf)


# --- dirichlet ----------------------------------------------------------------------------

def _dirichlet_logpdf(x, alpha):
    """x: (K,) or (K, ...) quantiles along the first axis (SciPy's layout); alpha: (K,)."""
    x, alpha = _f(x), _f(alpha)
    nd = len(tuple(_o.shape_of(x)))
    a = _o.reshape(alpha, tuple(_o.shape_of(alpha)) + (1,) * (nd - 1))
    lnb = _o.sum(gammaln(alpha)) - gammaln(_o.sum(alpha))
    return _o.sum(xlogy(a - 1.0, x), axis=0) - lnb


dirichlet = _ns("dirichlet", logpdf=_dirichlet_logpdf,
                pdf=lambda x, alpha: _o.exp(_dirichlet_logpdf(x, alpha)))
