"""Side-by-side timings of tracegrad against hand-written NumPy and peers.

Workloads (value and gradient unless said otherwise):
  W1  Rosenbrock, x float64[16]
  W2  sum(tanh(x)*exp(-y**2) + log1p(x**2)*sin(y)), x, y float64[1_000_000],
      gradients for both (also peak memory, via tracemalloc)
  W3  two-layer MLP loss (X 256x64, hidden 256, 10 outputs, tanh, MSE),
      gradients for all four parameters
  W4  full Hessian of logsumexp(A@x) + 0.5*sum(x**2), A 50x100
  W5  a fresh process from start to the first W3 gradient, with an empty
      cache and then with a warm disk cache

"tracegrad native" is the native CPU target (backend="native": C kernels
built by the C compiler, docs/native.md), the default wherever a C compiler
works; "tracegrad numpy" the NumPy target (backend="numpy").  W3's "its
matmuls alone" times the gradient's five matrix products by themselves:
the floor of any code that keeps NumPy's BLAS.  W5 reports each target's
cold and warm start in seconds on the last line.

Each candidate is timed in rounds interleaved with hand-written NumPy and
printed as the median over rounds of its time / NumPy's time in the same
round, so load that drifts during the run cancels out of the ratios.  torch eager, jax.jit and HIPS
autograd join when importable (install them in a separate environment; they
are never tracegrad dependencies).

    OPENBLAS_NUM_THREADS=1 python benchmarks/compare.py [--quick]
"""
import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import tracemalloc  # noqa: E402

import numpy as np  # noqa: E402

import tracegrad as tg  # noqa: E402


def peak_memory(fn):
    fn()
    tracemalloc.start()
    fn()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


def optional(name):
    try:
        return __import__(name)
    except Exception:
        return None


torch = optional("torch")
jax = optional("jax")
hips = optional("autograd")
if torch is not None:
    torch.set_num_threads(1)
if jax is not None:
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp


# --- the workloads as users write them -------------------------------------------------

def rosen(x):
    return np.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2)


def rosen_by_hand(x):
    a = x[1:] - x[:-1] ** 2
    b = 1 - x[:-1]
    f = np.sum(100.0 * a * a + b * b)
    g = np.zeros_like(x)
    g[:-1] = -400.0 * x[:-1] * a - 2.0 * b
    g[1:] += 200.0 * a
    return f, g


def chain(x, y):
    return np.sum(np.tanh(x) * np.exp(-y ** 2) + np.log1p(x ** 2) * np.sin(y))


def chain_by_hand(x, y):
    t = np.tanh(x)
    e = np.exp(-y * y)
    l1 = np.log1p(x * x)
    s = np.sin(y)
    f = np.sum(t * e + l1 * s)
    gx = (1 - t * t) * e + 2 * x / (1 + x * x) * s
    gy = -2 * y * t * e + l1 * np.cos(y)
    return f, gx, gy


def mlp(W1, b1, W2, b2, X, Y):
    h = np.tanh(X @ W1 + b1)
    return np.mean((h @ W2 + b2 - Y) ** 2)


def mlp_by_hand(W1, b1, W2, b2, X, Y):
    h = np.tanh(X @ W1 + b1)
    r = h @ W2 + b2 - Y
    f = np.mean(r * r)
    d = (2.0 / r.size) * r
    gW2 = h.T @ d
    gb2 = d.sum(0)
    dh = (d @ W2.T) * (1 - h * h)
    return f, X.T @ dh, dh.sum(0), gW2, gb2


def lse_quad(x, A):
    z = A @ x
    m = np.max(z)
    return np.log(np.sum(np.exp(z - m))) + m + 0.5 * np.sum(x ** 2)


def lse_quad_hessian_by_hand(x, A):
    z = A @ x
    p = np.exp(z - z.max())
    p /= p.sum()
    return A.T @ ((np.diag(p) - np.outer(p, p)) @ A) + np.eye(x.size)


# --- rows -------------------------------------------------------------------------------------

def interleaved_row(name, base_fn, fns, rounds=21, batch_time=0.02):
    """Time the hand-written baseline and every candidate in interleaved
    rounds (baseline, A, B, ..., baseline, A, B, ...), and report each
    candidate as the median over rounds of its time / the baseline's time
    in the same round: load that drifts during the run moves both sides of
    each ratio alike."""
    calls = {"numpy": base_fn, **fns}
    per_call = {}
    for k, fn in calls.items():  # warm up; size a batch to ~batch_time
        fn()
        fn()
        best = float("inf")
        for _ in range(3):  # the fastest of three: a late compile does not shrink the batch
            t0 = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t0)
        per_call[k] = max(best, 1e-7)
    batch = {k: max(1, int(batch_time / t)) for k, t in per_call.items()}
    samples = {k: [] for k in calls}
    for _ in range(rounds):
        for k, fn in calls.items():
            n = batch[k]
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            samples[k].append((time.perf_counter() - t0) / n)
    out = {"workload": name, "numpy_s": statistics.median(samples["numpy"]),
           "samples": samples}
    for k in fns:
        out[k] = statistics.median(a / b for a, b in zip(samples[k], samples["numpy"]))
    return out


def _default_threads():
    """The thread count of native kernels by default (TRACEGRAD_NUM_THREADS,
    else the cores this process may use)."""
    v = os.environ.get("TRACEGRAD_NUM_THREADS", "").strip()
    if v:
        return int(v)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def w1():
    x = np.random.default_rng(0).standard_normal(16)
    vg = tg.value_and_grad(rosen, backend="numpy")
    entries = {"tracegrad numpy": lambda: vg(x)}
    vn = tg.value_and_grad(rosen, backend="native")
    entries["tracegrad native"] = lambda: vn(x)
    xt = tg.tensor(x, requires_grad=True)

    def eager():
        xt.grad = None
        rosen(xt).backward()
    entries["tracegrad eager"] = eager
    if torch is not None:
        xtt = torch.tensor(x, requires_grad=True)

        def te():
            xtt.grad = None
            y = torch.sum(100.0 * (xtt[1:] - xtt[:-1] ** 2) ** 2 + (1 - xtt[:-1]) ** 2)
            y.backward()
        entries["torch eager"] = te
    if jax is not None:
        jf = jax.jit(jax.value_and_grad(lambda x: jnp.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2
                                                          + (1 - x[:-1]) ** 2)))
        xj = jnp.asarray(x)
        entries["jax.jit"] = lambda: jax.block_until_ready(jf(xj))
    if hips is not None:
        import autograd.numpy as anp
        hf = hips.value_and_grad(lambda x: anp.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2
                                                   + (1 - x[:-1]) ** 2))
        entries["HIPS autograd"] = lambda: hf(x)
    return interleaved_row("W1 Rosenbrock grad [16]", lambda: rosen_by_hand(x), entries)


def w2(n):
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal(n), rng.standard_normal(n)
    vg = tg.value_and_grad(chain, argnums=(0, 1), backend="numpy")
    entries = {"tracegrad numpy": lambda: vg(x, y)}
    vn = tg.value_and_grad(chain, argnums=(0, 1), backend="native")
    entries["tracegrad native"] = lambda: vn(x, y)
    if _default_threads() > 1:
        # the same on one thread (TRACEGRAD_NUM_THREADS=1 while it builds; a
        # function object of its own, so it does not share vn's built code)
        saved = os.environ.get("TRACEGRAD_NUM_THREADS")
        os.environ["TRACEGRAD_NUM_THREADS"] = "1"
        try:
            vn1 = tg.value_and_grad(lambda x, y: chain(x, y), argnums=(0, 1), backend="native")
            vn1(x, y)
        finally:
            if saved is None:
                del os.environ["TRACEGRAD_NUM_THREADS"]
            else:
                os.environ["TRACEGRAD_NUM_THREADS"] = saved
        entries["native 1 thread"] = lambda: vn1(x, y)
    xt, yt = tg.tensor(x, requires_grad=True), tg.tensor(y, requires_grad=True)

    def eager():
        xt.grad = yt.grad = None
        chain(xt, yt).backward()
    entries["tracegrad eager"] = eager
    if torch is not None:
        a, b = torch.tensor(x, requires_grad=True), torch.tensor(y, requires_grad=True)

        def te():
            a.grad = b.grad = None
            torch.sum(torch.tanh(a) * torch.exp(-b ** 2) + torch.log1p(a ** 2) * torch.sin(b)).backward()
        entries["torch eager"] = te
    if jax is not None:
        jf = jax.jit(jax.value_and_grad(lambda x, y: jnp.sum(jnp.tanh(x) * jnp.exp(-y ** 2)
                                                             + jnp.log1p(x ** 2) * jnp.sin(y)),
                                        argnums=(0, 1)))
        xj, yj = jnp.asarray(x), jnp.asarray(y)
        entries["jax.jit"] = lambda: jax.block_until_ready(jf(xj, yj))
    r = interleaved_row(f"W2 elementwise chain [{n}]", lambda: chain_by_hand(x, y), entries,
                        rounds=7)
    if "native 1 thread" in r:
        s = r["samples"]
        r["native threads_s"] = statistics.median(
            a / b for a, b in zip(s["tracegrad native"], s["native 1 thread"]))
    r["peak_memory_ratio"] = peak_memory(lambda: vg(x, y)) / peak_memory(lambda: chain_by_hand(x, y))
    return r


def mlp_args():
    rng = np.random.default_rng(0)
    return (rng.standard_normal((64, 256)) * 0.1, np.zeros(256), rng.standard_normal((256, 10)) * 0.1,
            np.zeros(10), rng.standard_normal((256, 64)), rng.standard_normal((256, 10)))


def w3():
    args = mlp_args()
    vg = tg.value_and_grad(mlp, argnums=(0, 1, 2, 3), backend="numpy")
    entries = {"tracegrad numpy": lambda: vg(*args)}
    vn = tg.value_and_grad(mlp, argnums=(0, 1, 2, 3), backend="native")
    entries["tracegrad native"] = lambda: vn(*args)
    # the floor of any code that keeps NumPy's BLAS: the five matrix products
    # of the gradient alone, on the same operands
    W1, b1, W2, b2, X, Y = args
    h = np.tanh(X @ W1 + b1)
    d = (2.0 / Y.size) * (h @ W2 + b2 - Y)
    dh = (d @ W2.T) * (1 - h * h)
    entries["its matmuls alone"] = lambda: (X @ W1, h @ W2, h.T @ d, d @ W2.T, X.T @ dh)
    ts = [tg.tensor(a, requires_grad=i < 4) for i, a in enumerate(args)]

    def eager():
        for t in ts[:4]:
            t.grad = None
        mlp(*ts).backward()
    entries["tracegrad eager"] = eager
    if torch is not None:
        tt = [torch.tensor(a, requires_grad=i < 4) for i, a in enumerate(args)]

        def te():
            for t in tt[:4]:
                t.grad = None
            W1, b1, W2, b2, X, Y = tt
            torch.mean((torch.tanh(X @ W1 + b1) @ W2 + b2 - Y) ** 2).backward()
        entries["torch eager"] = te
    if jax is not None:
        jf = jax.jit(jax.value_and_grad(
            lambda W1, b1, W2, b2, X, Y: jnp.mean((jnp.tanh(X @ W1 + b1) @ W2 + b2 - Y) ** 2),
            argnums=(0, 1, 2, 3)))
        ja = [jnp.asarray(a) for a in args]
        entries["jax.jit"] = lambda: jax.block_until_ready(jf(*ja))
    return interleaved_row("W3 MLP grad", lambda: mlp_by_hand(*args), entries)


def w4():
    rng = np.random.default_rng(0)
    x, A = rng.standard_normal(100), rng.standard_normal((50, 100)) * 0.1
    h = tg.hessian(lse_quad, backend="numpy")
    H = h(x, A)
    np.testing.assert_allclose(H, lse_quad_hessian_by_hand(x, A), rtol=1e-8, atol=1e-10)
    entries = {"tracegrad numpy": lambda: h(x, A)}
    hn = tg.hessian(lse_quad, backend="native")
    np.testing.assert_allclose(hn(x, A), H, rtol=1e-10, atol=1e-12)
    entries["tracegrad native"] = lambda: hn(x, A)
    if torch is not None:
        At = torch.tensor(A)
        xt = torch.tensor(x)
        f = lambda x: torch.logsumexp(At @ x, 0) + 0.5 * torch.sum(x ** 2)  # noqa: E731
        entries["torch functional"] = lambda: torch.autograd.functional.hessian(f, xt)
    if jax is not None:
        jh = jax.jit(jax.hessian(lambda x, A: jax.nn.logsumexp(A @ x) + 0.5 * jnp.sum(x ** 2)))
        xj, Aj = jnp.asarray(x), jnp.asarray(A)
        entries["jax.jit"] = lambda: jax.block_until_ready(jh(xj, Aj))
    return interleaved_row("W4 Hessian [100x100]", lambda: lse_quad_hessian_by_hand(x, A), entries)


# The W5 programs are self-contained: importing this file would import the
# peers (torch, JAX), whose start-up is not what W5 measures.
_W5_COMMON = """
import time
t0 = time.perf_counter()
import numpy as np
rng = np.random.default_rng(0)
args = (rng.standard_normal((64, 256)) * 0.1, np.zeros(256), rng.standard_normal((256, 10)) * 0.1,
        np.zeros(10), rng.standard_normal((256, 64)), rng.standard_normal((256, 10)))
"""

W5_SCRIPT = _W5_COMMON + """
import os
import tracegrad as tg
def mlp(W1, b1, W2, b2, X, Y):
    h = np.tanh(X @ W1 + b1)
    return np.mean((h @ W2 + b2 - Y) ** 2)
g = tg.value_and_grad(mlp, argnums=(0, 1, 2, 3),
                      backend=os.environ.get("W5_BACKEND") or None)(*args)
print(time.perf_counter() - t0)
"""

W5_NUMPY = _W5_COMMON + """
W1, b1, W2, b2, X, Y = args
h = np.tanh(X @ W1 + b1)
r = h @ W2 + b2 - Y
d = (2.0 / r.size) * r
dh = (d @ W2.T) * (1 - h * h)
g = (np.mean(r * r), X.T @ dh, dh.sum(0), h.T @ d, d.sum(0))
print(time.perf_counter() - t0)
"""


def _process_time(code, env, repeats=5):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def w5():
    # Python's own bytecode cache on, as after a pip install (some shells set
    # PYTHONDONTWRITEBYTECODE: every start would then recompile tracegrad's
    # modules from source); one start first writes it.  Each target (the
    # default, native where a C compiler works, and the NumPy target) starts
    # three times with an empty cache, then from a warm one.
    base_env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    base_env["OPENBLAS_NUM_THREADS"] = "1"
    with tempfile.TemporaryDirectory() as d:
        _process_time(W5_SCRIPT, dict(base_env, TRACEGRAD_CACHE_DIR=d), repeats=1)
    out = {"workload": "W5 fresh process to first W3 grad",
           "numpy_s": _process_time(W5_NUMPY, base_env)}
    for target in ("native", "numpy"):
        env = dict(base_env, W5_BACKEND=target)
        cold = []
        for _ in range(3):
            with tempfile.TemporaryDirectory() as d:
                cold.append(_process_time(W5_SCRIPT, dict(env, TRACEGRAD_CACHE_DIR=d), repeats=1))
        with tempfile.TemporaryDirectory() as d:
            _process_time(W5_SCRIPT, dict(env, TRACEGRAD_CACHE_DIR=d), repeats=1)
            warm = _process_time(W5_SCRIPT, dict(env, TRACEGRAD_CACHE_DIR=d))
        out[f"{target} cold_s"] = statistics.median(cold)
        out[f"{target} warm_s"] = warm
    return out


def print_table(rows):
    cols = []
    for r in rows:
        for k in r:
            if k not in ("workload", "numpy_s", "samples") and not k.endswith("_s") \
                    and k not in cols:
                cols.append(k)
    head = f"| {'workload':36s} | {'NumPy (s)':>10s} | " + " | ".join(f"{c:>16s}" for c in cols) + " |"
    print(head)
    print("|" + "-" * 38 + "|" + "-" * 12 + "|" + "|".join("-" * 18 for _ in cols) + "|")
    for r in rows:
        cells = []
        for c in cols:
            v = r.get(c)
            cells.append(f"{v:16.2f}" if isinstance(v, float) else f"{'':16s}")
        print(f"| {r['workload']:36s} | {r['numpy_s']:10.2e} | " + " | ".join(cells) + " |")
    print("\nratios are time / hand-written NumPy time (lower is better); "
          "peak_memory_ratio is tracemalloc peak / hand-written's")
    for r in rows:
        if "native threads_s" in r:
            print(f"{r['workload']}: native with {_default_threads()} threads / native with one "
                  f"thread, per round: {r['native threads_s']:.2f}")
        if "native cold_s" in r:
            print(f"W5 (seconds): native target cold {r['native cold_s']:.3f}, warm "
                  f"{r['native warm_s']:.3f}; NumPy target cold {r['numpy cold_s']:.3f}, warm "
                  f"{r['numpy warm_s']:.3f}; hand-written NumPy alone {r['numpy_s']:.3f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small W2 and no W5 (for a smoke test)")
    ap.add_argument("--json", help="also write the rows to this file")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        os.environ["TRACEGRAD_CACHE_DIR"] = d
        rows = [w1(), w2(10_000 if args.quick else 1_000_000), w3(), w4()]
        if not args.quick:
            rows.append(w5())
    print_table(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
