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
comes from rounds that time NumPy, tracegrad and torch one after the other
(``compare.interleaved_row``): a ratio is the median over rounds of the two
times in the same round, so load that drifts during the run cancels out.
BLAS and torch run on one thread.  tracegrad's eager backward replays a
repeated tape through generated code (``tracegrad/autograd/replay.py``);
``--no-replay`` measures the interpreter alone.

    python benchmarks/eager_overhead.py [--rounds 41] [--only mlp|rosenbrock] [--no-replay]
"""
import os

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_v] = "1"

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import tracegrad as tg  # noqa: E402
from compare import interleaved_row  # noqa: E402  (benchmarks/compare.py)

try:
    import torch  # noqa: E402
    torch.set_num_threads(1)
except ImportError:  # pragma: no cover - torch is optional
    torch = None


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
    ap.add_argument("--rounds", type=int, default=41)
    ap.add_argument("--only", choices=("mlp", "rosenbrock"))
    ap.add_argument("--no-replay", action="store_true",
                    help="run every backward in the interpreter (no compiled replay)")
    args = ap.parse_args(argv)
    if args.no_replay:
        tg.autograd.set_backward_replay(False)
    print(f"tracegrad {tg.__version__}, numpy {np.__version__}"
          + (f", torch {torch.__version__} ({torch.get_num_threads()} thread)" if torch else
             ", torch not importable")
          + (", backward replay off" if args.no_replay else ""))
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
        fns = {"tracegrad": tg_step}
        if torch is not None:
            fns["torch"] = mlp_eager(torch, d)[0]
        rows.append(interleaved_row("mlp step (256x64, hidden 256)", np_step, fns,
                                    rounds=args.rounds))

    if args.only in (None, "rosenbrock"):
        x0 = np.random.default_rng(1).uniform(-1.5, 1.5, 16)
        np_vg = rosen_numpy(x0)
        tg_vg = rosen_eager(tg, x0)
        f0, g0 = np_vg()
        for _ in range(4):  # interpreted backwards, then the compiled replay
            f1, g1 = tg_vg()
            check_close("rosenbrock value", f1, f0)
            check_close("rosenbrock grad", g1, g0)
        fns = {"tracegrad": tg_vg}
        if torch is not None:
            fns["torch"] = rosen_eager(torch, x0)
        rows.append(interleaved_row("rosenbrock grad (16 elements)", np_vg, fns,
                                    rounds=args.rounds))

    print()
    print(f"{'workload':32s} {'numpy':>10s} {'tracegrad':>10s} {'torch':>10s}"
          f" {'tg/numpy':>9s} {'torch/numpy':>11s} {'tg/torch':>9s}")
    for r in rows:
        smp = r["samples"]
        med = {k: statistics.median(v) for k, v in smp.items()}
        line = (f"{r['workload']:32s} {med['numpy'] * 1e6:8.1f}us "
                f"{med['tracegrad'] * 1e6:8.1f}us ")
        if "torch" in smp:
            tg_torch = statistics.median(a / b for a, b in zip(smp["tracegrad"], smp["torch"]))
            line += (f"{med['torch'] * 1e6:8.1f}us {r['tracegrad']:8.2f}x {r['torch']:10.2f}x "
                     f"{tg_torch:8.2f}x")
            r["tracegrad/torch"] = tg_torch
        else:
            line += f"{'-':>10s} {r['tracegrad']:8.2f}x"
        print(line)
    print("\n(times: medians over rounds; ratios: medians over rounds of the ratio within a round)")
    return rows


if __name__ == "__main__":
    main()
