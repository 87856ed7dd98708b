"""The functional API side by side: a Jacobian of a function R^200 -> R^200
and the Hessian of a scalar function of 200 variables.

tracegrad's ``tg.autograd.functional`` (torch-style code on Tensors) and
``tg.jacobian``/``tg.hessian`` (NumPy code) against
``torch.autograd.functional`` with vectorize off and on, and
``jax.jit(jax.jacrev)`` / ``jax.jit(jax.hessian)``, when importable.
Printed as medians and as ratios to tracegrad's functional call, measured
in one run.

    OPENBLAS_NUM_THREADS=1 python benchmarks/functional.py [--n 200]
"""
import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

import tracegrad as tg  # noqa: E402


def median_time(fn, min_time=0.5, max_repeats=200):
    fn()
    fn()
    times = []
    start = time.perf_counter()
    while (len(times) < 3 or time.perf_counter() - start < min_time) and len(times) < max_repeats:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def optional(name):
    try:
        return __import__(name)
    except Exception:
        return None


def run(n):
    rng = np.random.default_rng(0)
    W = rng.standard_normal((n, n)) / np.sqrt(n)
    x = rng.standard_normal(n)
    Wt = tg.tensor(W)

    def vec_fn(x):                       # R^n -> R^n, torch-style code
        return (Wt @ x).tanh() * x

    def scalar_fn(x):                    # R^n -> R
        return ((Wt @ x).tanh() ** 2).sum() + 0.5 * (x * x).sum()

    def vec_np(x, W):
        return np.tanh(W @ x) * x

    def scalar_np(x, W):
        return np.sum(np.tanh(W @ x) ** 2) + 0.5 * np.sum(x * x)

    xt = tg.tensor(x)
    results = {"jacobian": {}, "hessian": {}}
    results["jacobian"]["tracegrad functional"] = median_time(
        lambda: tg.autograd.functional.jacobian(vec_fn, xt))
    results["hessian"]["tracegrad functional"] = median_time(
        lambda: tg.autograd.functional.hessian(scalar_fn, xt))
    jf, hf = tg.jacobian(vec_np), tg.hessian(scalar_np)
    results["jacobian"]["tg.jacobian"] = median_time(lambda: jf(x, W))
    results["hessian"]["tg.hessian"] = median_time(lambda: hf(x, W))
    # agreement with the compiled NumPy transforms
    np.testing.assert_allclose(tg.autograd.functional.jacobian(vec_fn, xt).numpy(), jf(x, W),
                               rtol=1e-10, atol=1e-12)

    torch = optional("torch")
    if torch is not None:
        torch.set_num_threads(1)
        Wq, xq = torch.tensor(W), torch.tensor(x)
        tv = lambda x: torch.tanh(Wq @ x) * x  # noqa: E731
        ts = lambda x: (torch.tanh(Wq @ x) ** 2).sum() + 0.5 * (x * x).sum()  # noqa: E731
        F = torch.autograd.functional
        results["jacobian"]["torch (vectorize=False)"] = median_time(lambda: F.jacobian(tv, xq),
                                                                     max_repeats=5)
        results["jacobian"]["torch (vectorize=True)"] = median_time(
            lambda: F.jacobian(tv, xq, vectorize=True))
        results["hessian"]["torch (vectorize=False)"] = median_time(lambda: F.hessian(ts, xq),
                                                                    max_repeats=5)
        results["hessian"]["torch (vectorize=True)"] = median_time(
            lambda: F.hessian(ts, xq, vectorize=True))
    jax = optional("jax")
    if jax is not None:
        jax.config.update("jax_enable_x64", True)
        import jax.numpy as jnp
        Wj, xj = jnp.asarray(W), jnp.asarray(x)
        jj = jax.jit(jax.jacrev(lambda x: jnp.tanh(Wj @ x) * x))
        jh = jax.jit(jax.hessian(lambda x: jnp.sum(jnp.tanh(Wj @ x) ** 2) + 0.5 * jnp.sum(x * x)))
        results["jacobian"]["jax.jit(jacrev)"] = median_time(lambda: jax.block_until_ready(jj(xj)))
        results["hessian"]["jax.jit(hessian)"] = median_time(lambda: jax.block_until_ready(jh(xj)))
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=200)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        os.environ["TRACEGRAD_CACHE_DIR"] = d
        results = run(args.n)
    for what, rows in results.items():
        base = rows["tracegrad functional"]
        print(f"\n{what} (n={args.n})")
        print(f"| {'system':28s} | {'median (s)':>11s} | {'/ tracegrad':>11s} |")
        print(f"|{'-' * 30}|{'-' * 13}|{'-' * 13}|")
        for name, t in rows.items():
            print(f"| {name:28s} | {t:11.3e} | {t / base:11.2f} |")


if __name__ == "__main__":
    main()
