"""Eager-mode overhead: tracegrad eager vs hand-written NumPy (vs torch eager).

Two workloads, each timed in this one run and printed as ratios:

* ``mlp``: one training step of a two-layer MLP (X 256x64, hidden 256,
  10 outputs, tanh, mean squared error): forward, backward, SGD update.
* ``rosenbrock``: value and gradient of the Rosenbrock function on 16
  elements, ``sum(100*(x[1:]-x[:-1]**2)**2 + (1-x[:-1])**2)``.  Tiny arrays,
  so this measures the per-op cost of the eager tape and engine.

The baseline is a hand-written NumPy forward with its analytic gradient.
torch eager (CPU) joins in when ``import torch`` works (install it in a
separate environment; it is never a dependency of tracegrad).  Every number
is the median over many repeats of a batch of calls; BLAS and torch run on
one thread.

    python benchmarks/eager_overhead.py [--repeats 200] [--only mlp|rosenbrock]
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

try:
    import torch  # noqa: E402
    torch.set_num_threads(1)
except ImportError:  # pragma: no cover - torch is optional
    torch = None


def bench(fn, repeats, inner, warmup=3):
    for _ in range(warmup * inner):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        times.append((time.perf_counter() - t0) / inner)
    return statistics.median(times)


# --- MLP training step -----------------------------------------------------------

N, D, H, O = 256, 64, 256, 10
LR = 1e-3


def mlp_data():
    rng = np.random.default_rng(0)
    return dict(X=rng.standard_normal((N, D)), Y=rng.standard_normal((N, O)),
                W1=rng.standard_normal((D, H)) * 0.1, b1=np.zeros(H),
                W2=rng.standard_normal((H, O)) * 0.1, b2=np.zeros(O))


def mlp_numpy(d):
    X, Y, W1, b1, W2, b2 = (d[k].copy() for k in ("X", "Y", "W1", "b1", "W2", "b2"))
    scale = 2.0 / (N * O)

    def step():
        h = np.tanh(X @ W1 + b1)
        diff = h @ W2 + b2 - Y
        loss = np.mean(diff * diff)
        g_out = diff * scale
        gW2 = h.T @ g_out
        gb2 = g_out.sum(axis=0)
        g_z = (g_out @ W2.T) * (1.0 - h * h)
        gW1 = X.T @ g_z
        gb1 = g_z.sum(axis=0)
        for p, g in ((W1, gW1), (b1, gb1), (W2, gW2), (b2, gb2)):
            p -= LR * g
        return loss
    return step, (W1, b1, W2, b2)


def _mse(lib, out, Y):
    d = out - Y
    sq = d ** 2
    return sq.mean() if hasattr(sq, "mean") else sq.sum() * (1.0 / sq.numel())


def mlp_eager(lib, d):
    """The same step for tracegrad or torch (``lib``), written torch-style."""
    t = (lambda a, rg=False: lib.tensor(a, dtype=lib.float64, requires_grad=rg))
    X, Y = t(d["X"]), t(d["Y"])
    params = [t(d[k], True) for k in ("W1", "b1", "W2", "b2")]
    W1, b1, W2, b2 = params

    def step():
        h = lib.tanh(X @ W1 + b1)
        loss = _mse(lib, h @ W2 + b2, Y)
        loss.backward()
        with lib.no_grad():
            for p in params:
                p -= LR * p.grad
                p.grad = None
        return loss
    return step, params


# --- Rosenbrock gradient ---------------------------------------------------------

def rosen_numpy(x0):
    x = x0.copy()

    def value_and_grad():
        xm, xp = x[:-1], x[1:]
        a = xp - xm * xm
        b = 1.0 - xm
        f = np.sum(100.0 * a * a + b * b)
        g = np.zeros_like(x)
        g[:-1] = -400.0 * a * xm - 2.0 * b
        g[1:] += 200.0 * a
        return f, g
    return value_and_grad


def rosen_eager(lib, x0):
    x = lib.tensor(x0, dtype=lib.float64, requires_grad=True)

    def value_and_grad():
        f = (100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2).sum()
        x.grad = None
        f.backward()
        return f, x.grad
    return value_and_grad


def check_close(name, a, b):
    a = np.asarray(a.detach().numpy() if hasattr(a, "detach") else a)
    b = np.asarray(b.detach().numpy() if hasattr(b, "detach") else b)
    if not np.allclose(a, b, rtol=1e-9, atol=1e-12):
        raise SystemExit(f"{name}: results disagree with the NumPy reference")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--only", choices=("mlp", "rosenbrock"))
    args = ap.parse_args(argv)
    print(f"tracegrad {tg.__version__}, numpy {np.__version__}"
          + (f", torch {torch.__version__} ({torch.get_num_threads()} thread)" if torch else
             ", torch not importable"))
    rows = []

    if args.only in (None, "mlp"):
        d = mlp_data()
        np_step, np_params = mlp_numpy(d)
        tg_step, tg_params = mlp_eager(tg, d)
        # one step each from the same start must agree
        np_step()
        tg_step()
        for a, b in zip(np_params, tg_params):
            check_close("mlp", b, a)
        timings = {"numpy": bench(np_step, args.repeats, 5),
                   "tracegrad": bench(tg_step, args.repeats, 5)}
        if torch is not None:
            th_step, _ = mlp_eager(torch, d)
            timings["torch"] = bench(th_step, args.repeats, 5)
        rows.append(("mlp step (256x64, hidden 256)", timings))

    if args.only in (None, "rosenbrock"):
        x0 = np.random.default_rng(1).uniform(-1.5, 1.5, 16)
        np_vg = rosen_numpy(x0)
        if not hasattr(tg.Tensor, "__getitem__") or "getitem" not in tg.primitives.REGISTRY:
            print("rosenbrock: skipped (tracegrad has no getitem op yet)")
        else:
            tg_vg = rosen_eager(tg, x0)
            f0, g0 = np_vg()
            f1, g1 = tg_vg()
            check_close("rosenbrock value", f1, f0)
            check_close("rosenbrock grad", g1, g0)
            timings = {"numpy": bench(np_vg, args.repeats, 50),
                       "tracegrad": bench(tg_vg, args.repeats, 50)}
            if torch is not None:
                timings["torch"] = bench(rosen_eager(torch, x0), args.repeats, 50)
            rows.append(("rosenbrock grad (16 elements)", timings))

    print()
    print(f"{'workload':32s} {'numpy':>10s} {'tracegrad':>10s} {'torch':>10s}"
          f" {'tg/numpy':>9s} {'torch/numpy':>11s} {'tg/torch':>9s}")
    for name, t in rows:
        th = t.get("torch")
        print(f"{name:32s} {t['numpy'] * 1e6:8.1f}us {t['tracegrad'] * 1e6:8.1f}us "
              + (f"{th * 1e6:8.1f}us" if th else f"{'-':>10s}")
              + f" {t['tracegrad'] / t['numpy']:8.2f}x"
              + (f" {th / t['numpy']:10.2f}x {t['tracegrad'] / th:8.2f}x" if th else ""))
    return rows


if __name__ == "__main__":
    main()
