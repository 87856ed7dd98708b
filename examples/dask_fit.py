"""Fit a logistic regression and a small MLP to data that does not fit in a
worker's memory: the data is a dask array generated chunk by chunk, the
gradient comes from tracegrad (one Dask task per chunk, a tree sum), and
scipy.optimize.minimize(jac=True) drives the fit.  The same fit then runs on
one machine on NumPy arrays, for comparison.

    python examples/dask_fit.py --small      # seconds: what the tests run
    python examples/dask_fit.py              # the same, small (the default)
    python examples/dask_fit.py --big        # 8 million rows (~770 MB of data),
                                             # 2 workers limited to 300 MB each

Needs dask[distributed] and scipy (pip install 'tracegrad[dask,examples]').
"""
import argparse
import os
import time

import numpy as np
import scipy.optimize

import dask
import dask.array as da
from distributed import Client, LocalCluster

import tracegrad as tg

D = 10          # features
H = 8           # hidden units of the MLP


def logistic_loss(w, x, y):
    """Mean negative log-likelihood; y in {0, 1}."""
    z = x @ w[:-1] + w[-1]
    return np.mean(np.logaddexp(0.0, z) - y * z)


def mlp_loss(theta, x, y):
    """Mean squared error of a one-hidden-layer tanh network (parameters flat)."""
    W1 = theta[:D * H].reshape(D, H)
    b1 = theta[D * H:D * H + H]
    w2 = theta[D * H + H:D * H + 2 * H]
    b2 = theta[-1]
    return 0.5 * np.mean((np.tanh(x @ W1 + b1) @ w2 + b2 - y) ** 2)


def make_data(n, chunk, seed=0):
    """Lazily generated data: each chunk is drawn when a task needs it and
    dropped after, so the whole set never sits in one worker's memory."""
    rng = da.random.default_rng(seed)
    x = rng.normal(size=(n, D), chunks=(chunk, D))
    w_true = np.linspace(-1.0, 1.0, D)
    noise = rng.logistic(size=n, chunks=chunk)
    y_class = (x @ w_true + 0.5 + noise > 0).astype(np.float64)
    y_reg = np.sin(x @ w_true) + 0.1 * rng.normal(size=n, chunks=chunk)
    return x, y_class, y_reg


def fit(name, loss, theta0, x, y, maxiter):
    value_and_grad = tg.value_and_grad(loss)
    times = []
    history = []

    def fun(theta):
        t = time.perf_counter()
        v, g = value_and_grad(theta, x, y)
        times.append(time.perf_counter() - t)
        return float(v), g

    def show(theta):
        print(f"  {name:<24} iter {len(history):2d}  loss {loss_at[0]:.6f}  "
              f"{times[-1] * 1e3:8.1f} ms per gradient", flush=True)

    loss_at = [fun(theta0)[0]]
    history.append(loss_at[0])
    show(theta0)

    def callback(intermediate_result):
        loss_at[0] = intermediate_result.fun
        history.append(loss_at[0])
        show(intermediate_result.x)

    res = scipy.optimize.minimize(fun, theta0, jac=True, method="L-BFGS-B", callback=callback,
                                  options={"maxiter": maxiter})
    first = times[1:] or times   # the first call traces and compiles
    print(f"  {name:<24} final loss {res.fun:.6f} after {res.nit} iterations; "
          f"{np.median(first) * 1e3:.1f} ms per gradient (median)", flush=True)
    return res.x, res.fun


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--small", action="store_true", help="tiny sizes (the default)")
    p.add_argument("--big", action="store_true",
                   help="8 million rows, larger than the workers' memory limits together")
    p.add_argument("--address", help="the address of a running Dask scheduler to use "
                                     "instead of a LocalCluster")
    args = p.parse_args()
    big = args.big or os.environ.get("TRACEGRAD_DASK_FIT_BIG") == "1"
    n, chunk, memory, maxiter = ((8_000_000, 200_000, "300MB", 20) if big and not args.small
                                 else (20_000, 5_000, "500MB", 8))
    nbytes = n * (D + 2) * 8
    print(f"{n} rows x {D} features ({nbytes / 1e6:.0f} MB of data) in chunks of {chunk} rows")

    if args.address:
        client = Client(args.address)
        cluster = None
    else:
        cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                               memory_limit=memory, host="127.0.0.1", dashboard_address=None,
                               silence_logs=40)
        client = Client(cluster)
        print(f"LocalCluster: 2 workers, memory limit {memory} each")

    x, y_class, y_reg = make_data(n, chunk)
    rng = np.random.default_rng(1)
    w0 = np.zeros(D + 1)
    theta0 = 0.3 * rng.normal(size=D * H + 2 * H + 1)
    results = {}
    print("on Dask (one task per chunk, tree sum):")
    results["logistic dask"] = fit("logistic regression", logistic_loss, w0, x, y_class, maxiter)
    results["mlp dask"] = fit("MLP", mlp_loss, theta0, x, y_reg, maxiter)
    client.close()
    if cluster is not None:
        cluster.close()

    print("on one machine, NumPy arrays, no Dask:")
    with dask.config.set(scheduler="threads"):
        xn, ycn, yrn = dask.compute(x, y_class, y_reg)
    results["logistic numpy"] = fit("logistic regression", logistic_loss, w0, xn, ycn, maxiter)
    results["mlp numpy"] = fit("MLP", mlp_loss, theta0, xn, yrn, maxiter)

    for model in ("logistic", "mlp"):
        (wd, fd), (wn, fn) = results[f"{model} dask"], results[f"{model} numpy"]
        print(f"{model}: final loss on Dask {fd:.10f}, on one machine {fn:.10f}, largest "
              f"parameter difference {np.max(np.abs(wd - wn)):.1e}")


if __name__ == "__main__":
    main()
