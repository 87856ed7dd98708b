"""Long loops: the gradient of the issue's 3-D projectile for n = 10 ... 100,000 steps.

    python benchmarks/loops.py [--steps 10,100,1000,10000,100000] [--calls 5]
                               [--unrolled-max N] [--memory-steps 100000]
                               [--memory-size 1000]

``miss(v0, n)`` steps a float64[3] state with quadratic drag by explicit
Euler (a dozen NumPy ops a step) and returns the squared miss distance.  For
each n it prints, per system:

* compile: the first call minus a later call (tracing, the adjoint, the
  passes, code generation and loading; the disk cache is off);
* per call: the median of ``--calls`` later calls of value_and_grad;
* peak: the peak of Python-allocated memory during one later call
  (tracemalloc: NumPy's arrays are counted, the interpreter's own are not).

Systems: tracegrad (NumPy target, and the native C target: ``backend="native"``,
where the whole gradient, loops included, is one C function) with ``tg.fori_loop`` (one loop node: compile time does
not depend on n), tracegrad on the plain Python loop (its source is
rewritten into the same loop node before it runs: the first two and the
last iterations are traced as written, the body twice symbolically, so the
first call does not depend on n either; ``--unrolled-max`` caps n for it,
every n by default), jax.jit with
``lax.fori_loop`` and HIPS autograd on the Python loop when they are
importable (never installed by tracegrad).  The fori_loop gradients are
checked against the Python loop's to rtol 1e-12 where both run.

Then the memory run: reverse mode through ``--memory-steps`` steps of a
float64[``--memory-size``] state with ``checkpoint=True`` (every
ceil(sqrt(n))-th carry stored), against storing every carry at a tenth of
the steps.

Then the loop that writes into an array, ``out[i] = np.sin(out[i - 1]) * a +
x`` over a float64[n, 3] ``out`` the function made (``--writes-steps``):
the time to build its gradient (trace, adjoint, passes and code generation:
``value_and_grad(...).lower``) with the loop rewritten into one scan node,
against the loop traced as written (then rolled after tracing, as before the
rewrite took item assignments; up to ``--writes-written-max`` steps), and a
later call up to ``--writes-call-max`` steps (the scan stores its carry,
the whole array, every step for reverse mode: time and memory grow as n^2).

``--versus-jax ROUNDS`` prints only the native fori_loop gradient against
jax.jit + lax.fori_loop at ``--steps``, timed interleaved in ROUNDS rounds
(the ratio per round, then its median): issue 29's loop target.

Timings on a shared machine are noisy; compare within one run.
"""
import os

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_v] = "1"
os.environ.setdefault("TRACEGRAD_CACHE", "0")   # measure compiling, not the disk cache
# the native rows: the whole gradient, loops included, as one C function
os.environ.setdefault("TRACEGRAD_NATIVE_WHOLE", "1")

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import tracemalloc  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import tracegrad as tg  # noqa: E402

TARGET = np.array([10., 0., 0.])
G = np.array([0., 0., -9.8])


def miss(v0, n):
    """The issue's function, as a user writes it: a plain Python loop."""
    x = np.zeros(3)
    v = v0
    for _ in range(n):
        a = -0.1 * v * np.sqrt(np.sum(v * v)) + np.array([0., 0., -9.8])
        v = v + 0.01 * a
        x = x + 0.01 * v
    return np.sum((x - np.array([10., 0., 0.])) ** 2)


def miss_fori(v0, n):
    """The same with tg.fori_loop: one loop node whatever n is."""
    def body(i, s):
        x, v = s
        a = -0.1 * v * np.sqrt(np.sum(v * v)) + np.array([0., 0., -9.8])
        v = v + 0.01 * a
        x = x + 0.01 * v
        return (x, v)
    x, v = tg.fori_loop(0, n, body, (np.zeros(3), v0))
    return np.sum((x - np.array([10., 0., 0.])) ** 2)


def measure(make, n, calls):
    """(compile s, per-call s, peak bytes, (value, grad)) for a fresh function."""
    f = make()
    v0 = np.array([5., 0., 5.])
    t0 = time.perf_counter()
    res = f(v0, n)
    first = time.perf_counter() - t0
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        res = f(v0, n)
        times.append(time.perf_counter() - t0)
    per = statistics.median(times)
    tracemalloc.start()
    f(v0, n)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return max(first - per, 0.0), per, peak, res


def systems(unrolled_max):
    out = [("tracegrad fori_loop", lambda: tg.value_and_grad(miss_fori, static_argnums=(1,)),
            None),
           ("tracegrad Python loop", lambda: tg.value_and_grad(miss, static_argnums=(1,)),
            unrolled_max),
           ("tracegrad native fori_loop",
            lambda: tg.value_and_grad(miss_fori, static_argnums=(1,), backend="native"), None),
           ("tracegrad native Python loop",
            lambda: tg.value_and_grad(miss, static_argnums=(1,), backend="native"),
            unrolled_max)]
    try:
        import jax
        jax.config.update("jax_enable_x64", True)
        import jax.numpy as jnp

        def jmiss(v0, n):
            def body(i, s):
                x, v = s
                a = -0.1 * v * jnp.sqrt(jnp.sum(v * v)) + jnp.array([0., 0., -9.8])
                v = v + 0.01 * a
                return (x + 0.01 * v, v)
            x, v = jax.lax.fori_loop(0, n, body, (jnp.zeros(3), v0))
            return jnp.sum((x - jnp.array([10., 0., 0.])) ** 2)

        def make_jax():
            f = jax.jit(jax.value_and_grad(jmiss), static_argnums=(1,))
            return lambda v0, n: jax.block_until_ready(f(v0, n))
        out.append(("jax.jit + fori_loop", make_jax, None))
    except ImportError:
        pass
    try:
        import autograd
        import autograd.numpy as anp

        def amiss(v0, n):
            x = anp.zeros(3)
            v = v0
            for _ in range(n):
                a = -0.1 * v * anp.sqrt(anp.sum(v * v)) + anp.array([0., 0., -9.8])
                v = v + 0.01 * a
                x = x + 0.01 * v
            return anp.sum((x - anp.array([10., 0., 0.])) ** 2)
        out.append(("HIPS autograd", lambda: autograd.value_and_grad(amiss), 10000))
    except ImportError:
        pass
    out.append(("tracegrad eager (compile=False)",
                lambda: tg.value_and_grad(miss, static_argnums=(1,), compile=False), 10000))
    return out


def versus_jax(steps, rounds):
    """The native fori_loop gradient against jax.jit + lax.fori_loop, timed
    interleaved (a batch of each per round) so load that drifts during the
    run moves both alike; the ratio is per round, then the median."""
    named = dict((name, make) for name, make, _ in systems(0))
    if "jax.jit + fori_loop" not in named:
        print("\n--versus-jax: jax is not importable")
        return
    v0 = np.array([5., 0., 5.])
    print(f"\nper call, interleaved with jax.jit in {rounds} rounds (median, min; ratio: the "
          f"median over rounds of native / jax in the same round)")
    print(f"{'steps':>7}  {'native ms':>10}{'min':>9}{'jax.jit ms':>12}{'min':>9}{'native/jax':>12}")
    for n in steps:
        fs = [named["tracegrad native fori_loop"](), named["jax.jit + fori_loop"]()]
        for f in fs:
            f(v0, n)
            f(v0, n)
        batch = max(1, int(0.02 / max(n * 5e-8, 2e-6)))
        ts = [[], []]
        for _ in range(rounds):
            for k, f in enumerate(fs):
                t0 = time.perf_counter()
                for _ in range(batch):
                    f(v0, n)
                ts[k].append((time.perf_counter() - t0) / batch)
        ratio = statistics.median(a / b for a, b in zip(*ts))
        print(f"{n:>7}  {statistics.median(ts[0]) * 1e3:>10.4f}{min(ts[0]) * 1e3:>9.4f}"
              f"{statistics.median(ts[1]) * 1e3:>12.4f}{min(ts[1]) * 1e3:>9.4f}{ratio:>12.2f}")


def rollout(x0, w, n, ck):
    """A float64[D] state stepped n times; reverse mode through it."""
    def body(i, x):
        return x + 0.001 * np.tanh(x * w)
    return np.sum(tg.fori_loop(0, n, body, x0, checkpoint=ck) ** 2)


def memory(n, d):
    """Peak memory of reverse mode through n steps of a float64[d] state,
    storing every carry and with checkpoint=True (every ceil(sqrt(n))-th)."""
    rng = np.random.default_rng(0)
    x0, w = rng.standard_normal(d), rng.standard_normal(d)
    print(f"\nreverse mode through n steps of a float64[{d}] state "
          f"(x = x + 0.001 tanh(x w)); peak memory of one later call (tracemalloc)")
    print(f"{'steps':>7}  {'policy':<34}{'per call s':>11}{'peak MiB':>10}")
    for steps, ck, label in ((n // 10, None, "every carry stored"),
                             (n // 10, True, "checkpoint=True"),
                             (n, True, "checkpoint=True")):
        f = tg.grad(rollout, static_argnums=(2, 3))
        g = f(x0, w, steps, ck)
        t0 = time.perf_counter()
        tracemalloc.start()
        g2 = f(x0, w, steps, ck)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        dt = time.perf_counter() - t0
        assert np.array_equal(g, g2)
        print(f"{steps:>7}  {label:<34}{dt:>11.2f}{peak / 2**20:>10.1f}")
        if ck is True and steps == n // 10:
            ref = tg.grad(rollout, static_argnums=(2, 3))(x0, w, steps, None)
            same = np.allclose(g, ref, rtol=1e-12, atol=0)
            print(f"{'':>9}gradient == every-carry gradient (rtol 1e-12): {same}")


def sim_writes(x, a, n):
    """A simulation that writes its state into the rows of an array."""
    out = np.zeros((n, 3))
    out[0] = x
    for i in range(1, n):
        out[i] = np.sin(out[i - 1]) * a + x
    return np.sum(out ** 2)


def _build_time(n, rewrite=True):
    """Seconds to trace and generate sim_writes's gradient; whether it has a scan node."""
    from tracegrad.frontend import loop_rewrite
    saved = loop_rewrite.rewrite
    if not rewrite:     # the loop traced as written (then rolled after tracing)
        loop_rewrite.rewrite = lambda fn: None
    try:
        x = np.array([0.3, -0.2, 0.5])
        f = tg.value_and_grad(sim_writes, argnums=(0, 1), static_argnums=(2,), backend="numpy")
        t0 = time.perf_counter()
        low = f.lower(x, 0.7, n)
        dt = time.perf_counter() - t0
    finally:
        loop_rewrite.rewrite = saved
    return dt, any(d["op"] == "scan" for _, d in low.graph.nodes(data=True))


def writes(steps, written_max, call_max, calls):
    print("\nout[i] = np.sin(out[i - 1]) * a + x, out float64[n, 3]: building the gradient "
          "(value_and_grad(...).lower: trace, adjoint, passes, codegen)")
    print(f"{'steps':>7}  {'how':<44}{'build s':>9}{'scan':>6}{'per call ms':>13}")
    x = np.array([0.3, -0.2, 0.5])
    for n in steps:
        _build_time(n)      # the first build of a size pays imports and first paths
        dt = min(_build_time(n)[0] for _ in range(3))
        rolled = _build_time(n)[1]
        per = ""
        if n <= call_max:
            f = tg.value_and_grad(sim_writes, argnums=(0, 1), static_argnums=(2,),
                                  backend="numpy")
            v, g = f(x, 0.7, n)
            ts = []
            for _ in range(calls):
                t0 = time.perf_counter()
                f(x, 0.7, n)
                ts.append(time.perf_counter() - t0)
            per = f"{statistics.median(ts) * 1e3:.2f}"
            assert np.isclose(v, sim_writes(x, 0.7, n), rtol=1e-12)
        print(f"{n:>7}  {'loop rewritten into one scan node':<44}{dt:>9.3f}"
              f"{'yes' if rolled else 'no':>6}{per:>13}")
        if n <= written_max:
            dt, rolled = _build_time(n, rewrite=False)
            print(f"{n:>7}  {'traced as written (rolled after tracing)':<44}{dt:>9.3f}"
                  f"{'yes' if rolled else 'no':>6}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", default="10,100,1000,10000,100000")
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--unrolled-max", type=int, default=10 ** 9,
                    help="largest n for the plain Python loop (every n by default)")
    ap.add_argument("--memory-steps", type=int, default=100000,
                    help="steps of the memory run (0: skip it)")
    ap.add_argument("--memory-size", type=int, default=1000, help="state size of the memory run")
    ap.add_argument("--writes-steps", default="100,1000,10000,100000",
                    help="steps of the out[i] = f(out[i - 1]) loop (empty: skip it)")
    ap.add_argument("--writes-written-max", type=int, default=10000,
                    help="largest n for that loop traced as written")
    ap.add_argument("--writes-call-max", type=int, default=1000,
                    help="largest n for which that loop's gradient is called")
    ap.add_argument("--writes-only", action="store_true", help="only the writes table")
    ap.add_argument("--versus-jax", type=int, default=0, metavar="ROUNDS",
                    help="only the native fori_loop gradient against jax.jit, interleaved "
                         "in ROUNDS rounds, at --steps")
    args = ap.parse_args()
    wsteps = [int(s) for s in args.writes_steps.split(",") if s]
    if args.versus_jax:
        versus_jax([int(s) for s in args.steps.split(",") if s], args.versus_jax)
        return
    if args.writes_only:
        writes(wsteps, args.writes_written_max, args.writes_call_max, args.calls)
        return
    steps = [int(s) for s in args.steps.split(",") if s]
    print(f"{'steps':>7}  {'system':<32}{'compile s':>10}{'per call ms':>13}{'peak KiB':>10}")
    for n in steps:
        ref = None
        for name, make, limit in systems(args.unrolled_max):
            if limit is not None and n > limit:
                print(f"{n:>7}  {name:<32}{'(skipped: n > ' + str(limit) + ')':>33}")
                continue
            comp, per, peak, res = measure(make, n, args.calls)
            note = ""
            if name.startswith("tracegrad fori"):
                ref = res
            elif ref is not None and name.startswith("tracegrad"):
                ok = np.allclose(res[0], ref[0], rtol=1e-12) and \
                    np.allclose(res[1], ref[1], rtol=1e-12, atol=0)
                note = "  grad == fori_loop's (rtol 1e-12)" if ok else "  GRADIENT DIFFERS"
            print(f"{n:>7}  {name:<32}{comp:>10.3f}{per * 1e3:>13.3f}{peak / 1024:>10.1f}{note}")
    if args.memory_steps:
        memory(args.memory_steps, args.memory_size)
    if wsteps:
        writes(wsteps, args.writes_written_max, args.writes_call_max, args.calls)


if __name__ == "__main__":
    main()
