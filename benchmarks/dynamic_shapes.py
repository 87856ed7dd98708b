"""Generic sizes on the native target (issue 29, item 2; docs/native.md,
"Generic sizes").

Two tables:

1. **A new size**: the first call of ``value_and_grad`` at a size not seen
   before, after two other sizes were (so the automatic mode has built its
   generic C), for W2 (``compare.chain``, 100,000-ish elements) and W3
   (``compare.mlp``, a new batch size): native with the default
   (``dynamic=None``: a size plan's module, else generic C; no build),
   native with ``dynamic=False``
   (a C build per size) and the NumPy target.  Each round uses sizes no
   system has seen, the systems interleaved; median and min over rounds.
   The disk cache is a fresh temporary folder (each new size writes its
   entry, as a user's would).

2. **Across sizes**: W2 and W3 called at sizes from a few elements to a
   few million, on both sides of every size the C's choices depend on
   (threads, one sum block or several, unrolled loops, row blocks, the stack
   or the heap), after two sizes first: how many of them ran the C compiler
   (processes started are counted) and what each new size cost.

3. **Per call**: the generic code (``dynamic=True``) against the code
   specialised to the size (``dynamic=False``) on W2 and W3 at
   ``compare.py``'s sizes, timed in interleaved rounds; the ratio is the
   median over rounds of generic / specialised in the same round.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OPENBLAS_NUM_THREADS=1 \\
        python benchmarks/dynamic_shapes.py [--rounds 7] [--quick]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _machine import blas_info  # noqa: E402


def _ms(xs):
    return f"{statistics.median(xs) * 1e3:8.2f} (min {min(xs) * 1e3:.2f})"


def _cpu():
    """CPU seconds of this process and its finished children (the C compiler,
    counted in clock ticks)."""
    t = os.times()
    return time.process_time() + t.children_user + t.children_system


def _first_call(f, args):
    """(wall, CPU) seconds of one call."""
    w, c = time.perf_counter(), _cpu()
    f(*args)
    return time.perf_counter() - w, _cpu() - c


def new_size_table(rounds, quick):
    import tracegrad as tg
    from compare import chain, mlp
    rng = np.random.default_rng(0)
    w2_base = 20_000 if quick else 100_000   # not the per-call table's sizes

    def w2_args(n):
        return rng.standard_normal(n), rng.standard_normal(n)

    W1, b1, W2, b2 = (rng.standard_normal((64, 256)) * 0.1, np.zeros(256),
                      rng.standard_normal((256, 10)) * 0.1, np.zeros(10))

    def w3_args(B):
        return W1, b1, W2, b2, rng.standard_normal((B, 64)), rng.standard_normal((B, 10))

    rows = []
    for name, fn, argnums, make, base in (
            ("W2 chain, n", chain, (0, 1), w2_args, w2_base),
            ("W3 MLP, batch", mlp, (0, 1, 2, 3), w3_args, 200)):
        systems = {
            "native (generic)": tg.value_and_grad(fn, argnums=argnums, backend="native"),
            "native dynamic=False": tg.value_and_grad(fn, argnums=argnums, backend="native",
                                                      dynamic=False),
            "numpy target": tg.value_and_grad(fn, argnums=argnums, backend="numpy"),
        }
        # two sizes first: the second builds the generic C (the automatic mode)
        first = {}
        for k, f in systems.items():
            first[k] = [_first_call(f, make(size)) for size in (base, base - 7)]
        times = {k: [] for k in systems}
        cpu = {k: [] for k in systems}
        size = base - 7
        for r in range(rounds):
            for k, f in systems.items():
                size -= 3       # a size no system has seen
                w, c = _first_call(f, make(size))
                times[k].append(w)
                cpu[k].append(c)
        rows.append((name, base, first, times, cpu))
    return rows


SWEEPS = {
    "W2": (100_000, 99_993, [99_990, 50_000, 20_000, 10_000, 5_000, 1_000, 300, 100, 30, 8, 3,
                             200_000, 1_000_000, 3_000_000]),
    "W3": (200, 193, [190, 150, 100, 64, 33, 17, 8, 2, 300, 500, 1_000, 1_500, 2_000, 4_000,
                      10_000, 256, 261, 1_001]),
}


class _CountProcesses:
    """Counts the processes started (the C compiler) while it is entered."""

    def __enter__(self):
        import subprocess
        self.n, self._popen = 0, subprocess.Popen
        outer = self

        class Counted(subprocess.Popen):
            def __init__(self, *a, **k):
                outer.n += 1
                super().__init__(*a, **k)
        subprocess.Popen = Counted
        return self

    def __exit__(self, *exc):
        import subprocess
        subprocess.Popen = self._popen


def sweep_table(quick):
    import tracegrad as tg
    from compare import chain, mlp
    rng = np.random.default_rng(2)
    W1, b1, W2, b2 = (rng.standard_normal((64, 256)) * 0.1, np.zeros(256),
                      rng.standard_normal((256, 10)) * 0.1, np.zeros(10))
    makers = {"W2": (chain, (0, 1), lambda n: (rng.standard_normal(n), rng.standard_normal(n))),
              "W3": (mlp, (0, 1, 2, 3), lambda B: (W1, b1, W2, b2, rng.standard_normal((B, 64)),
                                                   rng.standard_normal((B, 10))))}
    rows = []
    for name, (first, second, sizes) in SWEEPS.items():
        if quick:
            sizes = [s for s in sizes if s <= 20_000]
        fn, argnums, make = makers[name]
        f = tg.value_and_grad(fn, argnums=argnums, backend="native")
        want = tg.value_and_grad(fn, argnums=argnums, backend="numpy")
        f(*make(first))
        f(*make(second))
        built, times, ok, planned = [], [], True, []
        for s in sizes:
            args = make(s)
            plans = tg.cache_info()["size_plans"]
            with _CountProcesses() as c:
                t = time.perf_counter()
                got = f(*args)
                times.append(time.perf_counter() - t)
            built.append(c.n)
            planned.append(tg.cache_info()["size_plans"] > plans)
            ref = want(*args)
            ok = ok and all(np.allclose(a, b, rtol=1e-10, atol=1e-12) for a, b in
                            zip([got[0], *got[1]], [ref[0], *ref[1]]))
        rows.append((name, first, second, sizes, built, times, ok, planned))
    return rows


def per_call_table(rounds, quick):
    import tracegrad as tg
    from compare import chain, mlp, mlp_args
    rng = np.random.default_rng(1)
    n = 10_000 if quick else 1_000_000

    def w2(m):
        return rng.standard_normal(m), rng.standard_normal(m)

    def w3(B):
        a = list(mlp_args())
        a[4], a[5] = rng.standard_normal((B, 64)), rng.standard_normal((B, 10))
        return tuple(a)
    out = []
    # and a few small sizes, where the generic structure's threaded form on
    # one thread, its heap buffers and its sizes read at run time weigh most
    for name, fn, argnums, make, size in ((f"W2 [{n}]", chain, (0, 1), w2, n),
                                          ("W2 [1000]", chain, (0, 1), w2, 1000),
                                          ("W2 [16]", chain, (0, 1), w2, 16),
                                          ("W3 MLP [256x64]", mlp, (0, 1, 2, 3), w3, 256),
                                          ("W3 MLP [8x64]", mlp, (0, 1, 2, 3), w3, 8)):
        args = make(size)
        spec = tg.value_and_grad(fn, argnums=argnums, backend="native", dynamic=False)
        auto = tg.value_and_grad(fn, argnums=argnums, backend="native")
        for other in (size + 5, size + 9):      # two other sizes first: generic at the third
            auto(*make(other))
        forced = tg.value_and_grad(fn, argnums=argnums, backend="native", dynamic=True)
        want = spec(*args)
        systems = {"specialised": spec, "generic (automatic)": auto, "generic (dynamic=True)": forced}
        checks = {}
        for k, f in systems.items():
            got = f(*args)
            ok = all(np.allclose(a, b, rtol=1e-10, atol=1e-12) for a, b in
                     zip([got[0], *got[1]], [want[0], *want[1]]))
            entry = next(e for e in f._fast.values() if getattr(e, "ns", None) is not None and
                         [tuple(a.shape) for a in e.in_avals][:len(args)] ==
                         [np.shape(a) for a in args])
            checks[k] = (ok, "_tg_enter" in entry.ns)
        calls = {k: (lambda f=f: f(*args)) for k, f in systems.items()}
        per = {}
        for k, f in calls.items():
            f()
            t0 = time.perf_counter()
            f()
            per[k] = max(time.perf_counter() - t0, 1e-7)
        batch = {k: max(1, int(0.05 / t)) for k, t in per.items()}
        samples = {k: [] for k in calls}
        for _ in range(rounds):
            for k, f in calls.items():
                t0 = time.perf_counter()
                for _ in range(batch[k]):
                    f()
                samples[k].append((time.perf_counter() - t0) / batch[k])
        ratios = {k: statistics.median(a / b for a, b in zip(samples[k], samples["specialised"]))
                  for k in calls if k != "specialised"}
        out.append((name, samples, ratios, checks))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="small sizes, 3 rounds")
    args = ap.parse_args()
    rounds = 3 if args.quick else args.rounds
    tmp = tempfile.mkdtemp(prefix="tg-dynamic-bench-")
    os.environ["TRACEGRAD_CACHE_DIR"] = tmp     # a fresh disk cache: every size is new
    import tracegrad as tg
    print(f"# tracegrad {tg.__version__}, numpy {np.__version__}; BLAS: {blas_info()}")
    from tracegrad.runtime import toolchain
    rec = toolchain.recipe_or_none() or {}
    print(f"# native: {rec.get('compiler')}, {rec.get('isa')}, threads={rec.get('threads')} "
          f"(TRACEGRAD_NUM_THREADS={os.environ.get('TRACEGRAD_NUM_THREADS')}), "
          f"{os.cpu_count()} CPUs; cache folder {tmp} (fresh)")
    print()
    print("## The first call at a new size (ms, wall / CPU with the compiler's; "
          "later sizes: median over rounds, min)")
    print()
    print("| workload | system | 1st size | 2nd size | each later new size: wall | CPU |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, base, first, times, cpu in new_size_table(rounds, args.quick):
        for k, ts in times.items():
            (w1, c1), (w2, c2) = first[k]
            print(f"| {name} {base}, {base - 7}, then new | {k} | {w1 * 1e3:.1f} / "
                  f"{c1 * 1e3:.1f} | {w2 * 1e3:.1f} / {c2 * 1e3:.1f} | {_ms(ts)} | "
                  f"{_ms(cpu[k])} |")
    print()
    print("## Across sizes: C builds after the first two sizes (each size once, in this order)")
    print()
    print("| workload | first two | sizes then | sizes that ran the compiler | "
          "served by a size plan | ms per size: median (max) | values as the NumPy target's |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, first, second, sizes, built, times, ok, planned in sweep_table(args.quick):
        ran = [str(s) for s, b in zip(sizes, built) if b]
        print(f"| {name} | {first}, {second} | {', '.join(map(str, sizes))} | "
              f"{len(ran)} of {len(sizes)}{': ' + ', '.join(ran) if ran else ''} | "
              f"{sum(planned)} of {len(sizes)} | "
              f"{statistics.median(times) * 1e3:.1f} ({max(times) * 1e3:.1f}) | {ok} |")
    print()
    print("## Per call: generic C against C specialised to the size")
    print()
    print("| workload | code | us per call (median, min) | / specialised (median of "
          "same-round ratios) | same values | generic module used |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, samples, ratios, checks in per_call_table(rounds * 3, args.quick):
        for k, ts in samples.items():
            r = f"{ratios[k]:.3f}" if k in ratios else "1"
            print(f"| {name} | {k} | {statistics.median(ts) * 1e6:.1f} (min {min(ts) * 1e6:.1f}) "
                  f"| {r} | {checks[k][0]} | {checks[k][1]} |")
    tg.clear_cache()
    import shutil
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
