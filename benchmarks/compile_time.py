"""How long a compiled call takes to build as its graph grows, stage by
stage, for the NumPy target and the native (C) target.

    env TRACEGRAD_ROLL=0 python benchmarks/compile_time.py [--nodes 100,1000,10000,100000]
        [--families ew,mm,wide] [--backends numpy,native]

Graphs are generated programmatically, unrolled (``TRACEGRAD_ROLL=0`` is set
here before tracegrad is imported: loop rolling would fold the repeated
steps into one loop node), and differentiated (``tg.value_and_grad``):

* ``ew``: a chain of elementwise steps ``h = tanh(h * c_i + b)`` over
  float64[16, 8] with ``b: float64[8]`` broadcast (every node has a C form:
  the native target makes the graph one C function);
* ``mm``: the same chain with a small matrix product ``h @ W`` (8x8) every
  8 steps (matrix products stay NumPy calls: the native target makes a
  NumPy driver calling one C kernel per fused group);
* ``wide``: independent branches ``sin(x * a_i + b) * cos(x - a_i)`` summed
  by a pairwise tree (a wide graph, not a chain).

``--nodes`` counts the nodes of the traced forward graph (the steps are
chosen to give about that many); the table also gives the nodes of the
value-and-gradient graph the targets compile.  Stages, timed with
``time.perf_counter`` around the existing stage functions: trace
(``trace_function``), graph (``pipeline.graph_of``: IR and passes on the
forward graph), adjoint (``pipeline.transform``: adjoint and passes),
codegen (``pipeline.generate``) and build (``cache.store``: writing and
executing the module, for native the C compiler's build and the load; its
"cc cpu" column is the compiler processes' CPU time).  Each size runs the
NumPy target, then the native target, in one process, with a fresh cache
folder, and the values and gradients of the two are compared.

Target (issue 29): no graph takes more than 5x its NumPy-target compile
time or 2 s of C build, whichever is larger.
"""
import argparse
import os
import platform
import resource
import sys
import tempfile
import time

os.environ["TRACEGRAD_ROLL"] = "0"
os.environ.setdefault("TRACEGRAD_CACHE_DIR", tempfile.mkdtemp(prefix="tracegrad-compile-time-"))

import numpy as np  # noqa: E402

import tracegrad as tg  # noqa: E402
from tracegrad import api  # noqa: E402
from tracegrad.runtime import cache, pipeline  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _machine import blas_info  # noqa: E402

STAGES = ("trace", "graph", "adjoint", "codegen", "build")
_times = {}


def _timed(mod, name, stage):
    fn = getattr(mod, name)

    def wrapper(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            _times[stage] = _times.get(stage, 0.0) + time.perf_counter() - t
    setattr(mod, name, wrapper)


_timed(api, "trace_function", "trace")
_timed(pipeline, "graph_of", "graph")
_timed(pipeline, "transform", "adjoint")
_timed(pipeline, "generate", "codegen")
_timed(cache, "store", "build")

# forward nodes per step of each family, measured on the traced graph
PER_STEP = {"ew": 4, "mm": 4, "wide": 8}


def family(kind, steps):
    """(function, arguments, argnums) of ``steps`` steps of family ``kind``."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 8))
    b = rng.standard_normal(8)
    W = rng.standard_normal((8, 8)) * 0.3
    cs = [1.0 + 1e-3 * i for i in range(steps)]
    if kind == "ew":
        def f(x, b):
            h = x
            for c in cs:
                h = np.tanh(h * c + b)
            return np.sum(h * h)
        return f, (x, b), (0, 1)
    if kind == "mm":
        def f(x, W, b):
            h = x
            for i, c in enumerate(cs):
                h = np.tanh(h * c + b)
                if i % 8 == 7:
                    h = h @ W
            return np.sum(h * h)
        return f, (x, W, b), (1, 2)
    if kind == "wide":
        def f(x, b):
            terms = [np.sin(x * c + b) * np.cos(x - c) for c in cs]
            while len(terms) > 1:
                terms = [terms[k] + terms[k + 1] if k + 1 < len(terms) else terms[k]
                         for k in range(0, len(terms), 2)]
            return np.sum(terms[0])
        return f, (x, b), (0, 1)
    raise ValueError(kind)


def compile_once(kind, steps, backend):
    """(stage times, cc cpu seconds, graph nodes, results) of one build."""
    f, args, argnums = family(kind, steps)
    f.__qualname__ = f"{kind}_{steps}"
    _times.clear()
    g = tg.value_and_grad(f, argnums=argnums, backend=backend)
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    out = g(*args)
    total = time.perf_counter() - t
    ru2 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cc_cpu = (ru2.ru_utime - ru.ru_utime) + (ru2.ru_stime - ru.ru_stime)
    times = dict(_times)
    lowered = g.lower(*args)     # the graph's size (lowering it again is not timed)
    return times, total, cc_cpu, len(lowered.graph), out


def _same(a, b):
    fa = [np.asarray(a[0])] + [np.asarray(t) for t in a[1]]
    fb = [np.asarray(b[0])] + [np.asarray(t) for t in b[1]]
    return all(np.allclose(x, y, rtol=1e-9, atol=1e-12) for x, y in zip(fa, fb))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", default="100,1000,10000")
    ap.add_argument("--families", default="ew,mm,wide")
    ap.add_argument("--backends", default="numpy,native")
    a = ap.parse_args()
    from tracegrad.runtime import toolchain
    rec = toolchain.recipe_or_none()
    print(f"# machine: {platform.machine()} {platform.processor() or ''}, "
          f"{os.cpu_count()} cores; python {platform.python_version()}; numpy {np.__version__}")
    print(f"# C compiler: {rec['compiler'] if rec else 'none'}; flags "
          f"{' '.join(rec['flags']) if rec else ''}")
    print(f"# BLAS: {blas_info()}")
    for backend in a.backends.split(","):     # imports and the compiler's recipe: not timed
        compile_once("ew", 2, backend)
    print("| family | nodes (fwd) | nodes (v&g) | backend | trace | graph | adjoint | codegen "
          "| build | cc cpu | total | native / numpy | same values |")
    print("|---|--:|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|---|")
    for n in [int(float(s)) for s in a.nodes.split(",")]:
        for kind in a.families.split(","):
            steps = max(1, n // PER_STEP[kind])
            res = {}
            for backend in a.backends.split(","):
                times, total, cc_cpu, nodes, out = compile_once(kind, steps, backend)
                res[backend] = (total, out)
                ratio, same = "", ""
                if backend != "numpy" and "numpy" in res:
                    ratio = f"{total / res['numpy'][0]:.2f}"
                    same = "yes" if _same(out, res["numpy"][1]) else "NO"
                cells = " | ".join(f"{times.get(s, 0.0):.3f}" for s in STAGES)
                print(f"| {kind} | {n} | {nodes} | {backend} | {cells} | "
                      f"{cc_cpu:.2f} | {total:.3f} | {ratio} | {same} |", flush=True)
    print("# seconds; build = cache.store (writing and executing the module: for native the "
          "C build and load); cc cpu = the C compiler's CPU time; total = the first call")


if __name__ == "__main__":
    main()
