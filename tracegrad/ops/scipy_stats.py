"""``scipy.stats`` distributions on tracegrad values: the one implementation
behind ``tracegrad.scipy.stats`` and behind the methods of SciPy's own
distribution objects (``scipy.stats.norm.logpdf(x, loc, scale)``, and frozen
ones, ``scipy.stats.norm(loc, scale).logpdf(x)``) called on traced or
recorded values.

Each distribution is its standardized law (``z = (x - loc) / scale``; a
discrete one shifts by ``loc``) with SciPy's shape parameters, passed as SciPy
takes them (positionally after x, or by name).  Methods: ``logpdf pdf logcdf
cdf sf logsf`` (continuous), ``logpmf pmf logcdf cdf sf logsf`` (discrete).
Outside the support the values are SciPy's (-inf / 0 / 1) with a zero gradient.

The formulas are compositions of rows: SciPy's own values for ndtr, log_ndtr,
stdtr, pdtr, betaincc (``scipy_rows``), NumPy-only rows for gammaln, gammainc,
betainc, xlogy.  As in SciPy and autograd, cdfs through the incomplete gamma and
beta functions have no derivative in the shape parameters (an error, not a zero).
"""
from __future__ import annotations

import math

import numpy as np

from tracegrad.ops._define import _ops as _o
from tracegrad.ops.base import is_value
from tracegrad.ops import scipy_rows as _sr
from tracegrad.ops.scipy_special import (_f, gammaln, betaln, xlogy, xlog1py, gammainc,
                                         gammaincc, betainc)

__all__ = []   # reached through tracegrad.scipy.stats

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)
_INF = np.inf


def _sp(name, *xs):
    return _sr.sp(name, *[_f(x) for x in xs])


def _safe(mask, z, inside):
    return _o.where(mask, z, inside)


def _in(z, lo, hi, lo_open=True, hi_open=True):
    m = None
    if lo is not None:
        m = _o.greater(z, lo) if lo_open else _o.greater_equal(z, lo)
    if hi is not None:
        h = _o.less(z, hi) if hi_open else _o.less_equal(z, hi)
        m = h if m is None else _o.logical_and(m, h)
    return m


class Distribution:
    """A SciPy distribution's methods on tracegrad values.

    ``shapes``: SciPy's shape parameter names; ``support(z, *shapes) ->
    (mask, inside)`` or None (the whole line): where the standardized law
    lives, and a value inside it used where it does not; the standardized
    functions ``logpdf`` (``logpmf``), ``cdf``, and optionally ``logcdf``,
    ``sf``, ``logsf``; each takes (z, *shapes)."""

    def __init__(self, name, shapes=(), discrete=False, support=None, **std):
        self._name = name
        self._shapes = tuple(shapes)
        self._discrete = discrete
        self._support = support
        self._std = std
        self.__name__ = name
        # the methods as the instance's own attributes: vars(norm) is its namespace
        # (tracegrad.autograd_compat.scipy.stats reads it)
        for m in (("logpmf", "pmf") if discrete else ("logpdf", "pdf")) + (
                "cdf", "logcdf", "sf", "logsf"):
            setattr(self, m, getattr(self, m))

    @property
    def name(self):
        return self._name

    @property
    def shapes(self):
        return self._shapes

    @property
    def discrete(self):
        return self._discrete

    # SciPy's argument convention: x, shapes..., loc, scale (positional or by name)
    def _parse(self, method, x, args, kwds):
        names = self.shapes + (("loc",) if self.discrete else ("loc", "scale"))
        vals = dict(zip(names, args))
        if len(args) > len(names):
            raise TypeError(f"scipy.stats.{self.name}.{method}() takes at most "
                            f"{len(names) + 1} positional arguments")
        for k, v in kwds.items():
            if k not in names or k in vals:
                raise TypeError(f"scipy.stats.{self.name}.{method}() got an unexpected or "
                                f"repeated argument {k!r}")
            vals[k] = v
        missing = [n for n in self.shapes if n not in vals]
        if missing:
            raise TypeError(f"scipy.stats.{self.name}.{method}() missing the shape "
                            f"parameter(s) {', '.join(missing)}")
        shapes = [_f(vals[n]) for n in self.shapes]
        loc = vals.get("loc", 0.0)
        if self.discrete:
            return _o.sub(_f(x), loc), shapes, None
        scale = _f(vals.get("scale", 1.0))
        return _o.divide(_o.sub(_f(x), loc), scale), shapes, scale

    def _eval(self, method, kind, x, args, kwds, outside):
        z, shapes, scale = self._parse(method, x, args, kwds)
        if self._support is not None:
            mask, inside = self._support(z, *shapes)
            zs = _safe(mask, z, inside)
        else:
            mask, zs = None, z
        val = self._value(kind, zs, shapes)
        if kind == "logpdf" and scale is not None:
            val = _o.sub(val, _o.log(scale))
        if mask is not None:
            val = _o.where(mask, val, outside(z, shapes) if callable(outside) else outside)
        return val

    def _value(self, kind, z, shapes):
        std = self._std
        if kind in std:
            return std[kind](z, *shapes)
        if kind == "logcdf":
            return _o.log(self._value("cdf", z, shapes))
        if kind == "sf":
            return _o.sub(1.0, self._value("cdf", z, shapes))
        if kind == "logsf":
            return _o.log(self._value("sf", z, shapes))
        raise NotImplementedError(f"scipy.stats.{self.name}: {kind} is not implemented on "
                                  f"tracegrad values")

    def _below(self, z, shapes):
        """Outside the support: below it (True) or above it."""
        lo = self._std.get("lower")
        return _o.less(z, lo(*shapes) if callable(lo) else (lo if lo is not None else -_INF))

    def logpdf(self, x, *args, **kwds):
        return self._eval("logpdf", "logpdf", x, args, kwds, -_INF)

    def pdf(self, x, *args, **kwds):
        return _o.exp(self.logpdf(x, *args, **kwds))

    def logpmf(self, k, *args, **kwds):
        return self._eval("logpmf", "logpdf", k, args, kwds, -_INF)

    def pmf(self, k, *args, **kwds):
        return _o.exp(self.logpmf(k, *args, **kwds))

    def cdf(self, x, *args, **kwds):
        return self._eval("cdf", "cdf", x, args, kwds,
                          lambda z, s: _o.where(self._below(z, s), 0.0, 1.0))

    def logcdf(self, x, *args, **kwds):
        return self._eval("logcdf", "logcdf", x, args, kwds,
                          lambda z, s: _o.where(self._below(z, s), -_INF, 0.0))

    def sf(self, x, *args, **kwds):
        return self._eval("sf", "sf", x, args, kwds,
                          lambda z, s: _o.where(self._below(z, s), 1.0, 0.0))

    def logsf(self, x, *args, **kwds):
        return self._eval("logsf", "logsf", x, args, kwds,
                          lambda z, s: _o.where(self._below(z, s), 0.0, -_INF))

    def __call__(self, *args, **kwds):
        return Frozen(self, args, kwds)

    def __repr__(self):
        return f"<tracegrad's scipy.stats.{self.name}>"


class Frozen:
    """A frozen distribution (``norm(loc, scale)``): its methods take x alone."""

    def __init__(self, dist, args, kwds):
        self.dist, self.args, self.kwds = dist, tuple(args), dict(kwds)

    def __getattr__(self, name):
        if name in ("logpdf", "pdf", "logpmf", "pmf", "cdf", "logcdf", "sf", "logsf"):
            method = getattr(self.dist, name)
            return lambda x: method(x, *self.args, **self.kwds)
        raise AttributeError(f"tracegrad's frozen scipy.stats.{self.dist.name} has no method "
                             f"{name!r} on tracegrad values")


# --- continuous ------------------------------------------------------------------------------

def _pos(z, *s):
    return _in(z, 0.0, None), 1.0


def _nonneg(z, *s):
    return _in(z, 0.0, None, lo_open=False), 1.0


def _unit(z, *s):
    return _in(z, 0.0, 1.0), 0.5


def _unit_closed(z, *s):
    return _in(z, 0.0, 1.0, False, False), 0.5


def _t_logpdf(z, df):
    return _o.sub(_o.sub(_o.sub(gammaln(_o.divide(_o.add(df, 1.0), 2.0)),
                                gammaln(_o.divide(df, 2.0))),
                         _o.multiply(_o.log(_o.multiply(df, math.pi)), 0.5)),
                  _o.multiply(_o.divide(_o.add(df, 1.0), 2.0),
                              _o.log1p(_o.divide(_o.multiply(z, z), df))))


norm = Distribution(
    "norm",
    logpdf=lambda z: _o.sub(_o.multiply(_o.multiply(z, z), -0.5), _LOG_SQRT_2PI),
    cdf=lambda z: _sp("ndtr", z), sf=lambda z: _sp("ndtr", _o.neg(z)),
    logcdf=lambda z: _sp("log_ndtr", z), logsf=lambda z: _sp("log_ndtr", _o.neg(z)))

t = Distribution(
    "t", ("df",), logpdf=_t_logpdf, cdf=lambda z, df: _sp("stdtr", df, z),
    sf=lambda z, df: _sp("stdtr", df, _o.neg(z)))

expon = Distribution(
    "expon", support=_nonneg, lower=0.0, logpdf=lambda z: _o.neg(z),
    cdf=lambda z: _o.neg(_o.expm1(_o.neg(z))), sf=lambda z: _o.exp(_o.neg(z)),
    logsf=lambda z: _o.neg(z), logcdf=lambda z: _o.log(_o.neg(_o.expm1(_o.neg(z)))))

lognorm = Distribution(
    "lognorm", ("s",), support=_pos, lower=0.0,
    logpdf=lambda z, s: _o.sub(_o.sub(_o.divide(_o.multiply(_o.square(_o.log(z)), -0.5),
                                                 _o.square(s)), _o.log(_o.multiply(s, z))),
                               _LOG_SQRT_2PI),
    cdf=lambda z, s: _sp("ndtr", _o.divide(_o.log(z), s)),
    sf=lambda z, s: _sp("ndtr", _o.neg(_o.divide(_o.log(z), s))),
    logcdf=lambda z, s: _sp("log_ndtr", _o.divide(_o.log(z), s)),
    logsf=lambda z, s: _sp("log_ndtr", _o.neg(_o.divide(_o.log(z), s))))

cauchy = Distribution(
    "cauchy", logpdf=lambda z: _o.neg(_o.log(_o.multiply(_o.add(_o.multiply(z, z), 1.0),
                                                         math.pi))),
    cdf=lambda z: _o.add(_o.divide(_o.arctan(z), math.pi), 0.5),
    sf=lambda z: _o.sub(0.5, _o.divide(_o.arctan(z), math.pi)))

laplace = Distribution(
    "laplace", logpdf=lambda z: _o.sub(_o.neg(_o.abs(z)), math.log(2.0)),
    cdf=lambda z: _o.where(_o.less(z, 0.0), _o.multiply(_o.exp(_o.minimum(z, 0.0)), 0.5),
                           _o.sub(1.0, _o.multiply(_o.exp(_o.neg(_o.maximum(z, 0.0))), 0.5))),
    sf=lambda z: _o.where(_o.greater(z, 0.0), _o.multiply(_o.exp(_o.neg(_o.maximum(z, 0.0))),
                                                          0.5),
                          _o.sub(1.0, _o.multiply(_o.exp(_o.minimum(z, 0.0)), 0.5))))

logistic = Distribution(
    "logistic", logpdf=lambda z: _o.add(_sp("log_expit", z), _sp("log_expit", _o.neg(z))),
    cdf=lambda z: _sp("expit", z), sf=lambda z: _sp("expit", _o.neg(z)),
    logcdf=lambda z: _sp("log_expit", z), logsf=lambda z: _sp("log_expit", _o.neg(z)))

uniform = Distribution(
    "uniform", support=_unit_closed, lower=0.0, logpdf=lambda z: _o.multiply(z, 0.0),
    cdf=lambda z: z, sf=lambda z: _o.sub(1.0, z))

gamma = Distribution(
    "gamma", ("a",), support=_pos, lower=0.0,
    logpdf=lambda z, a: _o.sub(_o.sub(xlogy(_o.sub(a, 1.0), z), z), gammaln(a)),
    cdf=lambda z, a: gammainc(a, z), sf=lambda z, a: gammaincc(a, z))

chi2 = Distribution(
    "chi2", ("df",), support=_pos, lower=0.0,
    logpdf=lambda z, df: _o.sub(_o.sub(_o.sub(xlogy(_o.sub(_o.divide(df, 2.0), 1.0), z),
                                              _o.divide(z, 2.0)),
                                       gammaln(_o.divide(df, 2.0))),
                                _o.multiply(_o.divide(df, 2.0), math.log(2.0))),
    cdf=lambda z, df: gammainc(_o.divide(df, 2.0), _o.divide(z, 2.0)),
    sf=lambda z, df: gammaincc(_o.divide(df, 2.0), _o.divide(z, 2.0)))

beta = Distribution(
    "beta", ("a", "b"), support=_unit, lower=0.0,
    logpdf=lambda z, a, b: _o.sub(_o.add(xlog1py(_o.sub(b, 1.0), _o.neg(z)),
                                         xlogy(_o.sub(a, 1.0), z)), betaln(a, b)),
    cdf=lambda z, a, b: betainc(a, b, z), sf=lambda z, a, b: _sp("betaincc", a, b, z))


# --- discrete --------------------------------------------------------------------------------

def _counts(upper=None):
    def support(k, *s):
        m = _o.logical_and(_o.greater_equal(k, 0.0), _o.equal(_o.floor(k), k))
        if upper is not None:
            m = _o.logical_and(m, _o.less_equal(k, upper(*s)))
        return m, 0.0
    return support


def _cdf_counts(cdf, upper=None):
    """A discrete cdf at floor(k), 0 below 0 (1 above ``upper``)."""
    def f(k, *s):
        kk = _o.floor(k)
        v = cdf(_o.maximum(kk, 0.0), *s)
        v = _o.where(_o.less(kk, 0.0), 0.0, v)
        if upper is not None:
            v = _o.where(_o.greater_equal(kk, upper(*s)), 1.0, v)
        return v
    return f


class _Discrete(Distribution):
    """The cdf family is defined for every k (floor), the pmf only on the integers."""

    def _eval(self, method, kind, x, args, kwds, outside):
        if kind == "logpdf":
            return super()._eval(method, kind, x, args, kwds, outside)
        z, shapes, _ = self._parse(method, x, args, kwds)
        return self._value(kind, z, shapes)


poisson = _Discrete(
    "poisson", ("mu",), discrete=True, support=_counts(),
    logpdf=lambda k, mu: _o.sub(_o.sub(xlogy(k, mu), gammaln(_o.add(k, 1.0))), mu),
    cdf=_cdf_counts(lambda k, mu: _sp("pdtr", k, mu)))

binom = _Discrete(
    "binom", ("n", "p"), discrete=True, support=_counts(lambda n, p: n),
    logpdf=lambda k, n, p: _o.add(_o.add(
        _o.sub(_o.sub(gammaln(_o.add(n, 1.0)), gammaln(_o.add(k, 1.0))),
               gammaln(_o.add(_o.sub(n, k), 1.0))), xlogy(k, p)),
        xlog1py(_o.sub(n, k), _o.neg(p))),
    cdf=_cdf_counts(lambda k, n, p: _sp("betaincc", _o.add(k, 1.0),
                                        _o.maximum(_o.sub(n, k), 1e-300), p),
                    lambda n, p: n))

nbinom = _Discrete(
    "nbinom", ("n", "p"), discrete=True, support=_counts(),
    logpdf=lambda k, n, p: _o.add(_o.add(
        _o.sub(_o.sub(gammaln(_o.add(n, k)), gammaln(_o.add(k, 1.0))), gammaln(n)),
        _o.multiply(n, _o.log(p))), xlog1py(k, _o.neg(p))),
    cdf=_cdf_counts(lambda k, n, p: betainc(n, _o.add(k, 1.0), p)))


# --- multivariate ----------------------------------------------------------------------------

class _MultivariateNormal:
    name = __name__ = "multivariate_normal"

    def __init__(self):
        for m in ("logpdf", "pdf", "entropy"):
            setattr(self, m, getattr(self, m))

    def logpdf(self, x, mean=None, cov=1, allow_singular=False):
        x = _f(x)
        xs = tuple(_o.shape_of(x))
        cov = _f(cov)
        if len(tuple(_o.shape_of(cov))) < 2:  # a scalar or the diagonal
            c = cov
            dim = xs[-1] if xs else 1
            cov = _o.multiply(c, np.eye(dim)) if not tuple(_o.shape_of(c)) else _o.diag(c) \
                if is_value(c) else np.diag(c)
        k = tuple(_o.shape_of(cov))[-1]
        if mean is not None:
            x = _o.sub(x, _f(mean))
        if k == 1 and (not xs or xs[-1] != 1):  # SciPy: 1-d x of a univariate law
            x = _o.expand_dims(x, -1)
        L = _o.linalg.cholesky(cov)
        sol = _o.linalg.solve(L, _o.expand_dims(x, -1))[..., 0]
        maha = _o.sum(_o.multiply(sol, sol), axis=-1)
        logdet = _o.multiply(_o.sum(_o.log(_o.diagonal(L, axis1=-2, axis2=-1)), axis=-1), 2.0)
        return _o.sub(_o.multiply(_o.add(maha, logdet), -0.5), k * _LOG_SQRT_2PI)

    def pdf(self, x, mean=None, cov=1, allow_singular=False):
        return _o.exp(self.logpdf(x, mean, cov, allow_singular))

    def entropy(self, mean=None, cov=1):
        cov = _f(cov)
        k = tuple(_o.shape_of(cov))[-1]
        L = _o.linalg.cholesky(cov)
        logdet = _o.multiply(_o.sum(_o.log(_o.diagonal(L, axis1=-2, axis2=-1)), axis=-1), 2.0)
        return _o.add(_o.multiply(logdet, 0.5), k * (0.5 + _LOG_SQRT_2PI))

    def __call__(self, mean=None, cov=1, allow_singular=False):
        return _FrozenMV(self, dict(mean=mean, cov=cov))


class _Dirichlet:
    name = __name__ = "dirichlet"

    def __init__(self):
        for m in ("logpdf", "pdf"):
            setattr(self, m, getattr(self, m))

    def logpdf(self, x, alpha):
        """x: (K,) or (K, ...) quantiles along the first axis (SciPy's layout); alpha: (K,)."""
        x, alpha = _f(x), _f(alpha)
        nd = len(tuple(_o.shape_of(x)))
        a = _o.reshape(alpha, tuple(_o.shape_of(alpha)) + (1,) * (nd - 1))
        lnb = _o.sub(_o.sum(gammaln(alpha)), gammaln(_o.sum(alpha)))
        return _o.sub(_o.sum(xlogy(_o.sub(a, 1.0), x), axis=0), lnb)

    def pdf(self, x, alpha):
        return _o.exp(self.logpdf(x, alpha))

    def __call__(self, alpha):
        return _FrozenMV(self, dict(alpha=alpha))


class _FrozenMV:
    def __init__(self, dist, kwds):
        self.dist, self.kwds = dist, kwds

    def __getattr__(self, name):
        if name in ("logpdf", "pdf"):
            method = getattr(self.dist, name)
            return lambda x: method(x, **self.kwds)
        if name == "entropy" and hasattr(self.dist, "entropy"):
            return lambda: self.dist.entropy(**self.kwds)
        raise AttributeError(f"tracegrad's frozen scipy.stats.{self.dist.name} has no method "
                             f"{name!r} on tracegrad values")


multivariate_normal = _MultivariateNormal()
dirichlet = _Dirichlet()

DISTRIBUTIONS = {d.name: d for d in (norm, t, expon, lognorm, cauchy, laplace, logistic, uniform,
                                      gamma, chi2, beta, poisson, binom, nbinom,
                                      multivariate_normal, dirichlet)}
