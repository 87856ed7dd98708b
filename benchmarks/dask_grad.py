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

    OPENBLAS_NUM_THREADS=1 python benchmarks/dask_grad.py [--rows 4000000]
        [--features 20] [--chunk 500000] [--repeats 9]

The data is generated chunk by chunk from a seed (dask.array.random), so each
cluster's workers draw their own chunks, and the NumPy copy for one machine
is the same numbers computed in this process.  Shared machines are noisy:
each comparison alternates the two calls ``--repeats`` times after a warm-up
and reports both medians, so a slow spell hits both sides alike.

Worker processes are started as docs/dask.md recommends for gradient loops,
without Dask's default ``MALLOC_TRIM_THRESHOLD_=65536``: that setting also
turns off glibc's adaptive mmap threshold, so every temporary array above
128 KB of the generated code is mapped and page-faulted afresh in each call
(about a third more time per chunk here).  One more 1-worker cluster with
Dask's default environment shows the difference.
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

TARGET = 0.20     # the bound on the Dask path's overhead (1 worker)


def loss(w, x, y):
    z = x @ w
    return np.sum(np.logaddexp(0.0, z) - y * z)


def make_data(rows, features, chunk):
    """Lazy (x, y, w): each chunk is drawn from the seed where its task runs."""
    rng = da.random.default_rng(0)
    x = rng.normal(size=(rows, features), chunks=(chunk, features))
    w = np.random.default_rng(1).normal(size=features) / np.sqrt(features)
    y = (rng.random(rows, chunks=chunk) < 1 / (1 + np.exp(-(x @ w)))).astype(np.float64)
    return x, y, w


def alternate(repeats, *calls):
    """Median seconds of each call, the calls taken in turn ``repeats`` times
    after one warm-up each (trace, compile, load on the workers)."""
    for f in calls:
        f()
    ts = [[] for _ in calls]
    for _ in range(repeats):
        for f, t in zip(calls, ts):
            s = time.perf_counter()
            f()
            t.append(time.perf_counter() - s)
    return [statistics.median(t) for t in ts]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=4_000_000)
    p.add_argument("--features", type=int, default=20)
    p.add_argument("--chunk", type=int, default=500_000)
    p.add_argument("--repeats", type=int, default=9)
    a = p.parse_args()
    X0, Y0, w = make_data(a.rows, a.features, a.chunk)
    x, y = dask.compute(X0, Y0, scheduler="threads")
    print(f"logistic regression: {a.rows} rows x {a.features} features "
          f"({x.nbytes / 1e6:.0f} MB), chunks of {a.chunk} rows; medians of {a.repeats}, "
          f"each against one machine measured alongside")

    vg = tg.value_and_grad(loss)
    v0, g0 = vg(w, x, y)

    def one_machine():
        return vg(w, x, y)

    try:
        from dask_glm.families import Logistic
    except ImportError:
        Logistic = None

    X, Y = da.from_array(x, chunks=(a.chunk, a.features)), da.from_array(y, chunks=a.chunk)

    def threaded():
        with dask.config.set(scheduler="threads", num_workers=1):
            return vg(w, X, Y)

    base, t = alternate(a.repeats, one_machine, threaded)
    print(f"  one machine, tracegrad compiled, NumPy arrays: {base:8.4f} s per gradient")
    print(f"  Dask threaded scheduler, 1 thread, tracegrad:  {t:8.4f} s per gradient "
          f"({t / base:.2f}x one machine)")

    overhead = None
    trim = "distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_"
    for n_workers, env in ((1, None), (2, None), (1, dask.config.get(trim))):
        label = "" if env is None else " (Dask's default MALLOC_TRIM_THRESHOLD_)"
        with dask.config.set({trim: env}), \
                LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True,
                             host="127.0.0.1", dashboard_address=None,
                             silence_logs=40) as cluster, \
                Client(cluster) as client:
            # the workers draw the chunks themselves; spread them evenly, as
            # data read from files would be
            X, Y = client.persist([X0, Y0])
            wait([X, Y])
            if n_workers > 1:
                client.rebalance([X, Y])
            v, g = vg(w, X, Y)
            ok = bool(np.allclose(v, v0, rtol=1e-10, atol=0)
                      and np.allclose(g, g0, rtol=1e-10, atol=0))
            calls = [one_machine, lambda: vg(w, X, Y)]
            if Logistic is not None:
                calls.append(lambda: dask.compute(Logistic.pointwise_gradient(w, X, Y)))
            base, t, *glm = alternate(a.repeats, *calls)
            s = "s" if n_workers > 1 else " "
            print(f"  Dask, {n_workers} worker{s}, tracegrad:            {t:8.4f} s per gradient "
                  f"({t / base:.2f}x one machine at {base:.4f} s; equal to it to 1e-10: "
                  f"{ok}){label}")
            if glm:
                print(f"  Dask, {n_workers} worker{s}, dask-glm hand-written:{glm[0]:8.4f} s "
                      f"per gradient{label}")
            if n_workers == 1 and env is None:
                overhead = t / base - 1
    if Logistic is None:
        print("  dask-glm: not importable, skipped")
    print(f"overhead of the Dask path (1 worker against one machine): {overhead:+.0%} "
          f"(target: at most {TARGET:+.0%}): {'met' if overhead <= TARGET else 'missed'}")


if __name__ == "__main__":
    main()
