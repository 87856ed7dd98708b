"""Black-box variational inference for Bayesian linear regression, written
the way HIPS autograd's examples are, with the imports changed:

    import autograd.numpy as np   ->  import tracegrad.numpy as np
    from autograd import grad     ->  from tracegrad import grad

(autograd's ``adam`` from ``autograd.misc.optimizers`` is written out below.)

The objective is a Monte Carlo estimate of the evidence lower bound with the
reparameterisation trick: np.random.randn inside it draws afresh on every
call, also in the compiled gradient.  Linear regression with a Gaussian prior
has a closed-form posterior, so the fit can be checked against it.

    python examples/bayesian_regression_vi.py [--small]
"""
import argparse
import os
import time

import numpy as onp

import tracegrad.numpy as np
from tracegrad import grad


def adam(grad, x, callback=None, num_iters=100, step_size=0.001, b1=0.9, b2=0.999, eps=1e-8):
    """autograd.misc.optimizers.adam: grad(x, i) and callback(x, i, g)."""
    m = onp.zeros(len(x))
    v = onp.zeros(len(x))
    for i in range(num_iters):
        g = grad(x, i)
        if callback:
            callback(x, i, g)
        m = (1 - b1) * g + b1 * m
        v = (1 - b2) * (g ** 2) + b2 * v
        mhat = m / (1 - b1 ** (i + 1))
        vhat = v / (1 - b2 ** (i + 1))
        x = x - step_size * mhat / (onp.sqrt(vhat) + eps)
    return x


def make_data(n, d, noise, seed=0):
    rng = onp.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    w_true = rng.standard_normal(d)
    y = X @ w_true + noise * rng.standard_normal(n)
    return X, y, w_true


def black_box_elbo(X, y, noise, prior_var, num_samples):
    """-ELBO(params) for a diagonal Gaussian q(w) = N(mean, exp(log_std)^2)."""
    d = X.shape[1]

    def log_joint(w):                       # w: (num_samples, d)
        log_prior = -0.5 * np.sum(w ** 2, axis=1) / prior_var
        resid = y[None, :] - w @ X.T
        log_lik = -0.5 * np.sum(resid ** 2, axis=1) / noise ** 2
        return log_prior + log_lik

    def objective(params, t):
        mean, log_std = params[:d], params[d:]
        eps = np.random.randn(num_samples, d)              # fresh draws on every call
        w = mean + np.exp(log_std) * eps                   # reparameterisation
        entropy = np.sum(log_std)
        return -(np.mean(log_joint(w)) + entropy)

    return objective


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--small", action="store_true",
                    default=os.environ.get("TRACEGRAD_SMALL") == "1")
    args = ap.parse_args()
    n, d, iters = (60, 3, 300) if args.small else (400, 8, 1500)
    noise, prior_var = 0.5, 4.0
    X, y, w_true = make_data(n, d, noise)
    onp.random.seed(1)

    objective = black_box_elbo(X, y, noise, prior_var, num_samples=32)
    gradient = grad(objective)

    def callback(params, t, g):
        if t % (iters // 6) == 0:
            print(f"iteration {t:5d}  elbo {-objective(params, t):12.3f}")

    init = onp.concatenate([onp.zeros(d), -2.0 * onp.ones(d)])
    start = time.perf_counter()
    params = adam(gradient, init, step_size=0.05, num_iters=iters, callback=callback)
    took = time.perf_counter() - start

    # the exact posterior of Bayesian linear regression, for comparison
    precision = X.T @ X / noise ** 2 + onp.eye(d) / prior_var
    cov = onp.linalg.inv(precision)
    mean = cov @ X.T @ y / noise ** 2
    print(f"fitted in {took:.2f} s ({1e3 * took / iters:.2f} ms per gradient)")
    print("variational mean ", onp.round(params[:d], 3))
    print("posterior mean   ", onp.round(mean, 3))
    print("variational std  ", onp.round(onp.exp(params[d:]), 3))
    print("posterior std    ", onp.round(onp.sqrt(onp.diag(cov)), 3))
    print(f"largest mean error {onp.max(onp.abs(params[:d] - mean)):.4f}")


if __name__ == "__main__":
    main()
