"""Control flow on values (issue 25): a Newton iteration written as a user writes it.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OPENBLAS_NUM_THREADS=1 \\
        python benchmarks/control_flow.py [--n 1000] [--steps 30] [--repeat 30]

``newton(a, tol)`` solves ``x**3 + a*x = 1`` elementwise on a float64[n]
state by damped Newton steps (``x -= 0.25 * f(x) / f'(x)``), in a Python
``while`` loop on a traced tolerance with a Python counter:

    while np.max(np.abs(step)) > tol and k < steps:

(the damping keeps the iteration from converging before ``steps`` steps, so
every call runs all of them), and returns ``np.sum(x ** 2)``.  Timed per
call of value and gradient (w.r.t. ``a``):

* ``tg.value_and_grad(newton)``, compiled (the ``while`` statement becomes a
  while node: ``tracegrad/frontend/branch_rewrite.py``), NumPy and native
  targets;
* the same function with ``compile=False`` (NumPy run eagerly on values
  that record the tape);
* the same loop written with ``tg.while_loop`` by hand, compiled, NumPy and
  native targets;
* where ``import jax`` works (never a dependency of tracegrad):
  ``jax.jit`` of ``jax.lax.while_loop`` (value only: JAX cannot
  reverse-differentiate while_loop) and ``jax.jit(jax.value_and_grad)`` of
  the same steps as ``jax.lax.fori_loop``.

The systems are measured interleaved (one call of each in turn, ``--repeat``
rounds; the median per system); ratios are to the compile=False time and to
the tg.while_loop time on the same target.  Targets of issue 25: compiled at
least 5x faster than compile=False, and within 1.5x of tg.while_loop.  The
values and gradients are checked against compile=False first.
"""
import os

os.environ.setdefault("TRACEGRAD_CACHE", "0")   # a cold compile each run

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import tracegrad as tg  # noqa: E402

STEPS = 30


def newton(a, tol):
    """Damped Newton for x**3 + a*x = 1, as a user writes it."""
    x = np.ones_like(a)
    step = np.ones_like(a)
    k = 0
    while np.max(np.abs(step)) > tol and k < STEPS:
        fx = x ** 3 + a * x - 1.0
        step = fx / (3.0 * x ** 2 + a)
        x = x - 0.25 * step
        k += 1
    return np.sum(x ** 2)


def newton_while_loop(a, tol):
    """The same iteration with tg.while_loop."""
    def cond(c):
        x, step, k = c
        return (np.max(np.abs(step)) > tol) & (k < STEPS)

    def body(c):
        x, step, k = c
        fx = x ** 3 + a * x - 1.0
        step = fx / (3.0 * x ** 2 + a)
        return x - 0.25 * step, step, k + 1
    x, _, _ = tg.while_loop(cond, body, (np.ones_like(a), np.ones_like(a), np.int64(0)))
    return np.sum(x ** 2)


def jax_systems():
    try:
        import jax
    except ImportError:
        return []
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp

    def body(c):
        x, step, k, a = c
        fx = x ** 3 + a * x - 1.0
        step = fx / (3.0 * x ** 2 + a)
        return x - 0.25 * step, step, k + 1, a

    def jwhile(a, tol):
        def cond(c):
            return (jnp.max(jnp.abs(c[1])) > tol) & (c[2] < STEPS)
        x = jax.lax.while_loop(cond, body, (jnp.ones_like(a), jnp.ones_like(a), 0, a))[0]
        return jnp.sum(x ** 2)

    def jfori(a):
        def step(i, c):
            return body(c)
        x = jax.lax.fori_loop(0, STEPS, step, (jnp.ones_like(a), jnp.ones_like(a), 0, a))[0]
        return jnp.sum(x ** 2)
    fw = jax.jit(jwhile)
    fg = jax.jit(jax.value_and_grad(jfori))
    return [("jax.jit lax.while_loop (value only)",
             lambda a, tol: jax.block_until_ready(fw(a, tol)), "value"),
            ("jax.jit value_and_grad lax.fori_loop",
             lambda a, tol: jax.block_until_ready(fg(a)), "both")]


def main(argv=None):
    global STEPS
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--no-native", action="store_true")
    args = ap.parse_args(argv)
    STEPS = args.steps

    rng = np.random.default_rng(0)
    a = rng.uniform(0.5, 2.0, args.n)
    tol = np.float64(1e-12)

    systems = [("compile=False", tg.value_and_grad(newton, compile=False), "both"),
               ("compiled, numpy target", tg.value_and_grad(newton, backend="numpy"), "both"),
               ("tg.while_loop, numpy target",
                tg.value_and_grad(newton_while_loop, backend="numpy"), "both")]
    if not args.no_native:
        systems += [("compiled, native target", tg.value_and_grad(newton, backend="native"),
                     "both"),
                    ("tg.while_loop, native target",
                     tg.value_and_grad(newton_while_loop, backend="native"), "both")]
    systems += jax_systems()

    import threadpoolctl
    blas = [(d.get("internal_api"), d.get("architecture"), d.get("num_threads"))
            for d in threadpoolctl.threadpool_info()]
    print(f"# tracegrad {tg.__version__}, numpy {np.__version__}, BLAS {blas}")
    print(f"# newton(a, tol): float64[{args.n}] state, {STEPS} damped Newton steps in a while "
          f"loop on a traced tolerance; value and gradient per call; median of {args.repeat} "
          f"interleaved rounds")

    # first calls (compile) and the check against compile=False
    ref_v, ref_g = systems[0][1](a, tol)
    first = {}
    for name, fn, what in systems:
        t0 = time.perf_counter()
        r = fn(a, tol)
        first[name] = time.perf_counter() - t0
        if what == "value":
            v, g = r, None
        else:
            v, g = r
        ok = np.allclose(float(v), float(ref_v), rtol=1e-10)
        if g is not None:
            ok = ok and np.allclose(np.asarray(g), ref_g, rtol=1e-8, atol=1e-12)
        if not ok:
            print(f"!! {name} disagrees with compile=False", file=sys.stderr)
            return 1
    times = {name: [] for name, _, _ in systems}
    for _ in range(args.repeat):
        for name, fn, _ in systems:
            t0 = time.perf_counter()
            fn(a, tol)
            times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    eager = med["compile=False"]
    print(f"{'system':40s} {'first call s':>12s} {'per call ms':>12s} {'vs compile=False':>17s} "
          f"{'vs tg.while_loop':>17s}")
    rows = []
    for name, _, what in systems:
        wl = None
        if name.startswith("compiled,"):
            wl = med.get("tg.while_loop, " + name.split(", ")[1])
        vs_wl = f"{med[name] / wl:.2f}x" if wl else ""
        speed = f"{eager / med[name]:.1f}x faster"
        print(f"{name:40s} {first[name]:12.2f} {1e3 * med[name]:12.3f} {speed:>17s} {vs_wl:>17s}")
        rows.append((name, med[name], wl))
    verdicts = []
    for name, t, wl in rows:
        if name.startswith("compiled,"):
            verdicts.append(f"{name}: {eager / t:.1f}x faster than compile=False (target >= 5x: "
                            f"{'met' if eager / t >= 5 else 'NOT met'}); {t / wl:.2f}x the "
                            f"tg.while_loop time (target <= 1.5x: "
                            f"{'met' if t / wl <= 1.5 else 'NOT met'})")
    for v in verdicts:
        print("# " + v)
    return 0


if __name__ == "__main__":
    sys.exit(main())
