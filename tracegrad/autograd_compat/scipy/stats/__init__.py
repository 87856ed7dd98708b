"""``autograd.scipy.stats``: one module per distribution, so both
``from ...scipy.stats import norm`` and ``import ...scipy.stats.norm as norm``
work; the functions are ``tracegrad.scipy.stats``'s."""
from tracegrad.autograd_compat.scipy.stats import norm, multivariate_normal, t, poisson, beta, gamma, chi2, dirichlet  # noqa: F401

__all__ = ['norm', 'multivariate_normal', 't', 'poisson', 'beta', 'gamma', 'chi2', 'dirichlet']
