"""Gaussian process regression with its hyperparameters learned by
maximising the marginal likelihood, written the way HIPS autograd's
examples are (autograd's examples/gaussian_process.py is the model), with
only the imports changed:

    import autograd.numpy as np                 ->  import tracegrad.autograd_compat.numpy as np
    import autograd.numpy.random as npr         ->  import tracegrad.autograd_compat.numpy.random as npr
    from autograd import value_and_grad         ->  from tracegrad.autograd_compat import value_and_grad
    from autograd.misc.optimizers import adam   ->  from tracegrad.autograd_compat.misc.optimizers import adam
    from autograd.scipy.stats import multivariate_normal as mvn  -> ...autograd_compat.scipy.stats...

The objective traces, so tracegrad compiles it (one trace, generated NumPy
code for the value and gradient); the optimiser is autograd's adam.

    python examples/gaussian_process_autograd.py [--small]
"""
import argparse
import os
import time

import tracegrad.autograd_compat.numpy as np
import tracegrad.autograd_compat.numpy.random as npr
from tracegrad.autograd_compat import value_and_grad
from tracegrad.autograd_compat.misc.optimizers import adam
from tracegrad.autograd_compat.scipy.stats import multivariate_normal as mvn


def make_gp_funs(cov_func, num_cov_params):
    """Functions that unpack the parameters, predict and score (autograd's
    example, re-typed)."""

    def unpack_kernel_params(params):
        mean = params[0]
        cov_params = params[2:]
        noise_scale = np.exp(params[1]) + 0.0001
        return mean, cov_params, noise_scale

    def predict(params, x, y, xstar):
        """The marginal posterior distribution at the points xstar."""
        mean, cov_params, noise_scale = unpack_kernel_params(params)
        cov_f_f = cov_func(cov_params, xstar, xstar)
        cov_y_f = cov_func(cov_params, x, xstar)
        cov_y_y = cov_func(cov_params, x, x) + noise_scale * np.eye(len(y))
        pred_mean = mean + np.dot(np.linalg.solve(cov_y_y, cov_y_f).T, y - mean)
        pred_cov = cov_f_f - np.dot(np.linalg.solve(cov_y_y, cov_y_f).T, cov_y_f)
        return pred_mean, pred_cov

    def log_marginal_likelihood(params, x, y):
        mean, cov_params, noise_scale = unpack_kernel_params(params)
        cov_y_y = cov_func(cov_params, x, x) + noise_scale * np.eye(len(y))
        prior_mean = mean * np.ones(len(y))
        return mvn.logpdf(y, prior_mean, cov_y_y)

    return num_cov_params + 2, predict, log_marginal_likelihood


def rbf_covariance(kernel_params, x, xp):
    output_scale = np.exp(kernel_params[0])
    lengthscales = np.exp(kernel_params[1:])
    diffs = np.expand_dims(x / lengthscales, 1) - np.expand_dims(xp / lengthscales, 0)
    return output_scale * np.exp(-0.5 * np.sum(diffs**2, axis=2))


def build_toy_dataset(D=1, n_data=20, noise_std=0.1, seed=0):
    rs = npr.RandomState(seed)
    inputs = np.concatenate([np.linspace(0, 3, num=n_data // 2),
                             np.linspace(6, 8, num=n_data // 2)])
    targets = (np.cos(inputs) + rs.randn(n_data) * noise_std) / 2.0
    inputs = (inputs - 4.0) / 2.0
    return inputs.reshape((len(inputs), D)), targets


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--small", action="store_true", help="a run of a few seconds")
    args = ap.parse_args()
    small = args.small or os.environ.get("TRACEGRAD_SMALL") == "1"
    D = 1
    num_params, predict, log_marginal_likelihood = make_gp_funs(rbf_covariance, num_cov_params=D + 1)
    X, y = build_toy_dataset(D=D, n_data=20)

    def objective(params, t):
        return -log_marginal_likelihood(params, X, y)

    value_and_gradient = value_and_grad(objective)
    losses = []

    def grad_only(params, t):
        v, g = value_and_gradient(params, t)
        losses.append(float(v))
        return g

    def callback(params, t, g):
        if t % 20 == 0:
            print(f"iteration {t:4d}  loss {losses[-1]:.4f}")

    rs = npr.RandomState(0)
    init_params = 0.1 * rs.randn(num_params)
    t0 = time.perf_counter()
    params = adam(grad_only, init_params, callback=callback, step_size=0.1,
                  num_iters=60 if small else 300)
    elapsed = time.perf_counter() - t0
    print(f"iteration  end  loss {-log_marginal_likelihood(params, X, y):.4f}")
    mean, cov_params, noise = params[0], params[2:], np.exp(params[1]) + 0.0001
    print(f"learned: mean {mean:.3f}  output scale {np.exp(cov_params[0]):.3f}  "
          f"length scale {np.exp(cov_params[1]):.3f}  noise {noise:.4f}")
    xs = np.linspace(-3, 3, 7).reshape(-1, 1)
    pred_mean, pred_cov = predict(params, X, y, xs)
    print("posterior mean at", np.round(xs[:, 0], 1), ":", np.round(pred_mean, 3))
    print(f"{len(losses)} value-and-gradient calls in {elapsed:.2f} s "
          f"(compiled: {value_and_gradient.went_eager is None})")


if __name__ == "__main__":
    main()
