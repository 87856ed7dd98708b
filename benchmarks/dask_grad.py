"""Seconds per gradient of a logistic-regression loss over data that fits in
memory: tracegrad's compiled gradient on NumPy arrays in one process, against
the same call on dask arrays (one task per chunk, tree sum) on Dask's threaded
scheduler with one thread, and on a LocalCluster of 1 and 2 worker processes
with the data persisted in the workers' memory, and against dask-glm's
hand-written logistic gradient when dask_glm imports.

The overhead of the Dask path is (seconds on Dask with 1 worker) / (seconds on
one machine) - 1: the same arithmetic on the same number of cores, plus
scheduling, the per-call trip of the parameters, and the tree sum.  BLAS runs
on one thread everywhere, so 1 worker and one process do the same work.

    python benchmarks/dask_grad.py [--rows 2000000] [--features 20]
                                   [--chunk 250000] [--repeats 7]

On a shared machine the numbers are noisy: each figure is the median of
``--repeats`` calls after a warm-up call.
"""
import os

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_v] = "1"

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import tracegrad as tg  # noqa: E402

import dask  # noqa: E402
import dask.array as da  # noqa: E402
from distributed import Client, LocalCluster, wait  # noqa: E402


def loss(w, x, y):
    z = x @ w
    return np.sum(np.logaddexp(0.0, z) - y * z)


def seconds(f, repeats):
    f()                                   # warm-up: trace, compile, load on workers
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--features", type=int, default=20)
    p.add_argument("--chunk", type=int, default=250_000)
    p.add_argument("--repeats", type=int, default=7)
    a = p.parse_args()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(a.rows, a.features))
    w = rng.normal(size=a.features) / np.sqrt(a.features)
    y = (rng.random(a.rows) < 1 / (1 + np.exp(-(x @ w)))).astype(np.float64)
    print(f"logistic regression: {a.rows} rows x {a.features} features "
          f"({x.nbytes / 1e6:.0f} MB), chunks of {a.chunk} rows; median of {a.repeats}")

    vg = tg.value_and_grad(loss)
    base = seconds(lambda: vg(w, x, y), a.repeats)
    v0, g0 = vg(w, x, y)
    print(f"  one machine, tracegrad compiled, NumPy arrays: {base:8.4f} s per gradient")

    X = da.from_array(x, chunks=(a.chunk, a.features))
    Y = da.from_array(y, chunks=a.chunk)
    with dask.config.set(scheduler="threads", num_workers=1):
        t = seconds(lambda: vg(w, X, Y), a.repeats)
    print(f"  Dask threaded scheduler (1 thread), tracegrad:    {t:8.4f} s per gradient "
          f"({t / base:.2f}x one machine)")

    try:
        from dask_glm.families import Logistic
    except ImportError:
        Logistic = None
        print("  dask-glm: not importable, skipped")

    for n_workers in (1, 2):
        with LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True,
                          host="127.0.0.1", dashboard_address=None, silence_logs=40) as cluster, \
                Client(cluster) as client:
            X = da.from_array(x, chunks=(a.chunk, a.features))
            Y = da.from_array(y, chunks=a.chunk)
            X, Y = client.persist([X, Y])
            wait([X, Y])
            t = seconds(lambda: vg(w, X, Y), a.repeats)
            v, g = vg(w, X, Y)
            ok = np.allclose(v, v0, rtol=1e-10) and np.allclose(g, g0, rtol=1e-10)
            print(f"  Dask, {n_workers} worker{'s' if n_workers > 1 else ' '}, tracegrad:"
                  f"           {t:8.4f} s per gradient ({t / base:.2f}x one machine; "
                  f"equal to it: {ok})")
            if Logistic is not None:
                tg_glm = seconds(lambda: dask.compute(Logistic().pointwise_gradient(w, X, Y)),
                                 a.repeats)
                print(f"  Dask, {n_workers} worker{'s' if n_workers > 1 else ' '}, dask-glm "
                      f"hand-written:   {tg_glm:8.4f} s per gradient")


if __name__ == "__main__":
    main()
