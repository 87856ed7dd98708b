"""The native CPU target (backend="native", tracegrad/targets/native/): C
kernels built by the C compiler, compared with the NumPy target over the
CUDA tests' corpus; the fallback without a compiler; the cache; and the
near-linear fusion grouping both targets share."""
import json
import logging
import math
import os
import re
import shutil
import subprocess
import sys
import textwrap

import networkx as nx
import numpy as np
import pytest

import tracegrad as tg
from tracegrad.runtime import graph_call, toolchain
from tracegrad.targets.native import builder, codegen as codegen_c
from tracegrad.ir import passes

from test_cuda import CORPUS, FLOAT32, _args, _leaves, _run, _transforms, w2, rosenbrock

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HAVE_CC = toolchain.recipe_or_none() is not None
needs_cc = pytest.mark.skipif(not HAVE_CC, reason="the native target needs a C compiler")

CASES = [(n, t, np.float64) for n in CORPUS for t in _transforms(n)] + \
        [(n, t, np.float32) for n in FLOAT32 for t in _transforms(n)
         if t in ("forward", "value_and_grad")]
IDS = [f"{n}-{t}-{np.dtype(d).name}" for n, t, d in CASES]


@pytest.fixture(autouse=True)
def _memory_cache(monkeypatch):
    monkeypatch.setenv("TRACEGRAD_CACHE", "0")


def _assert_close(got, want, dtype):
    g, w = _leaves(got), _leaves(want)
    assert len(g) == len(w)
    # values within a few ulp of NumPy's (vector math is within 3 ulp per
    # element; sums are blocked and pairwise, so they round differently)
    tol = dict(rtol=1e-12, atol=1e-13) if dtype == np.float64 else dict(rtol=2e-5, atol=2e-6)
    for a, b in zip(g, w):
        a, b = np.asarray(a), np.asarray(b)
        assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, a.dtype, b.shape, b.dtype)
        scale = max(1.0, float(np.max(np.abs(b)))) if b.size else 1.0
        np.testing.assert_allclose(a, b, rtol=tol["rtol"], atol=tol["atol"] * scale)


@needs_cc
@pytest.mark.parametrize("whole", ["0", "1"])
@pytest.mark.parametrize("name,transform,dtype", CASES, ids=IDS)
def test_native_target_matches_numpy_target(name, transform, dtype, whole, monkeypatch):
    # whole="1": graphs whose every node has a C form are one C function
    monkeypatch.setenv("TRACEGRAD_NATIVE_WHOLE", whole)
    with_numpy = _run(name, transform, dtype, "numpy")
    # tg.vjp/tg.jvp keep one compiled graph per traced structure, whatever
    # the backend (graph_call._VJP_CACHE): start afresh for the native run
    graph_call._VJP_CACHE.clear()
    native = _run(name, transform, dtype, "native")
    assert tg.cache_info()["target"] == "native"
    _assert_close(native, with_numpy, dtype)


@needs_cc
@pytest.mark.parametrize("whole", ["1", "0"])
def test_w2_is_one_c_kernel_with_fused_pairwise_sum(whole, monkeypatch):
    # "1": the graph is one C function calling its one kernel; "0": the
    # driver calls the kernel (TRACEGRAD_NATIVE_WHOLE=0)
    monkeypatch.setenv("TRACEGRAD_NATIVE_WHOLE", whole)
    x = np.linspace(-1, 2, 10000)
    low = tg.value_and_grad(w2, argnums=(0, 1), backend="native").lower(x, x)
    src = low.source
    assert 'TARGET = "native"' in src
    k = "tg_wk" if whole == "1" else "tg_k"
    assert src.count(f"void {k}") == 1, src
    assert "#pragma omp simd reduction(+:" in src and "tg_pw_push_f64" in src
    assert ("        return _tg_whole(" if whole == "1" else "    _tg_k0(") in src
    # the sum is accurate: blocked, then pairwise (a sequential sum is not)
    x = np.full(1_000_003, 0.1)
    f = tg.compile(lambda x: np.sum(x * 1.5), backend="native")
    assert ("sum (fused epilogue)" if whole == "1" else "sum, finished in tg_k0") \
        in f.lower(x).source
    exact = math.fsum(x * 1.5)
    sequential = np.cumsum(x * 1.5)[-1]
    assert abs(sequential - exact) > 1000 * np.spacing(exact)
    assert abs(f(x) - exact) <= 16 * np.spacing(exact)


@needs_cc
def test_vector_math_and_isa_in_the_recipe():
    rec = toolchain.recipe()
    assert "-O2" in rec["flags"] and "-fopenmp-simd" in rec["flags"]
    assert "-fno-builtin-sin" in rec["flags"] and "-ffast-math" not in rec["flags"]
    for part in ("compiler", "isa", "glibc", "python", "math"):
        assert f"{part}=" in rec["identity"]


@needs_cc
def test_scalar_libm_option_matches_numpy_bit_for_bit(monkeypatch):
    monkeypatch.setenv("TRACEGRAD_NATIVE_MATH", "scalar")
    x = np.linspace(-3, 3, 1001)
    f = tg.compile(lambda x: (np.exp(x), np.log1p(x + 3.5), np.sin(x), np.cos(x)),
                   backend="native")
    out = f(x)
    assert tg.cache_info()["target"] == "native"
    assert toolchain.recipe()["vector_math"] == []
    # Scalar libm, element by element, is what the option promises; Python's
    # math module calls the same libm.  NumPy agrees to 1 ulp (bit for bit
    # where it calls libm itself; with AVX-512 it has its own exp and log).
    libm = [np.array([fn(v) for v in xs]) for fn, xs in
            ((math.exp, x), (math.log1p, x + 3.5), (math.sin, x), (math.cos, x))]
    for got, want in zip(out, libm):
        np.testing.assert_array_equal(got, want)
    for got, want in zip(out, (np.exp(x), np.log1p(x + 3.5), np.sin(x), np.cos(x))):
        np.testing.assert_array_max_ulp(got, want, maxulp=1)


def test_bad_math_option_is_a_clear_fallback(monkeypatch, caplog):
    monkeypatch.setenv("TRACEGRAD_NATIVE_MATH", "fast")
    with caplog.at_level(logging.WARNING, logger="tracegrad.native"):
        out = tg.compile(lambda x: np.exp(x) * 2, backend="native")(np.ones(3))
    np.testing.assert_allclose(out, 2 * np.e)
    assert tg.cache_info()["target"] == "numpy"
    assert any("TRACEGRAD_NATIVE_MATH" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("asked", ["backend='native'", "the default"])
def test_no_compiler_falls_back_to_numpy_with_one_log_line(tmp_path, asked):
    # a fresh process whose PATH has no C compiler and no CC (nor the
    # pip-installed Zig the native extra brings)
    code = textwrap.dedent("""
        import sys
        sys.modules["ziglang"] = None
        import logging, numpy as np, tracegrad as tg
        logging.basicConfig(level=logging.WARNING, format="%(name)s|%(message)s")
        f = tg.grad(lambda x: np.sum(np.sin(x) ** 2), BACKEND)
        for n in (3, 4):
            print(repr(f(np.ones(n)).tolist()))
        print("TARGET", tg.cache_info()["target"])
    """).replace("BACKEND", "backend='native'" if asked == "backend='native'" else "")
    env = dict(os.environ, PATH=str(tmp_path), TRACEGRAD_CACHE="0")
    env.pop("CC", None)
    env.pop("TRACEGRAD_BACKEND", None)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "TARGET numpy" in r.stdout
    expect = float(2 * np.sin(1.0) * np.cos(1.0))
    assert repr([expect] * 3) in r.stdout
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("tracegrad.native|")]
    assert len(lines) == 1, r.stderr     # one line, however many functions compile
    assert "backend 'native' is not available" in lines[0] and "no C compiler" in lines[0]
    assert "NumPy target" in lines[0]


def test_the_native_extras_zig_compiles_where_no_cc_is_on_the_path(tmp_path):
    # pip install "tracegrad[native]" brings ziglang: `python -m ziglang cc`
    # builds the native target on a machine without a C compiler
    pytest.importorskip("ziglang")
    code = textwrap.dedent("""
        import numpy as np, shutil, tracegrad as tg
        from tracegrad.runtime import toolchain
        assert shutil.which("cc") is None
        rec = toolchain.recipe()
        print("CC", rec["cc"][1:], rec["compiler"].split()[0])
        x = np.linspace(0.1, 1.0, 1001)
        f = lambda x: np.sum(np.tanh(x) * np.exp(-x ** 2) + np.log1p(x ** 2) * np.sin(x))
        v, g = tg.value_and_grad(f, backend="native")(x)
        print("TARGET", tg.cache_info()["target"])
        v0, g0 = tg.value_and_grad(f)(x)
        np.testing.assert_allclose(v, v0, rtol=1e-13)
        np.testing.assert_allclose(g, g0, rtol=1e-12)
        print("OK")
    """)
    env = dict(os.environ, PATH=str(tmp_path), TRACEGRAD_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("CC", None)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    assert "CC ['-m', 'ziglang', 'cc'] clang" in r.stdout
    assert "TARGET native" in r.stdout and "OK" in r.stdout


def test_failing_compiler_falls_back(tmp_path, monkeypatch, caplog):
    fake = tmp_path / "badcc"
    fake.write_text("#!/bin/sh\necho 'fake cc 1.0'; exit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CC", str(fake))
    with caplog.at_level(logging.WARNING, logger="tracegrad.native"):
        out = tg.compile(lambda x: np.exp(x) + 1, backend="native")(np.zeros(2))
    np.testing.assert_allclose(out, 2.0)
    assert tg.cache_info()["target"] == "numpy"
    assert any("not available" in r.getMessage() for r in caplog.records)


def test_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="'native'"):
        tg.compile(w2, backend="clang")


@needs_cc
def test_shared_object_beside_the_entry_and_private(tmp_path):
    d = tmp_path / "cache"
    code = textwrap.dedent("""
        import numpy as np, tracegrad as tg
        from test_cuda import rosenbrock
        g = tg.grad(rosenbrock, backend="native")(np.linspace(0.1, 1.0, 16))
        info = tg.cache_info()
        print(repr(g.tolist()), info["disk_hits"], info["compiles"], info["target"])
    """)

    def fresh_process():
        # separate processes, started close together: the package's files
        # (part of every key) are the same for both
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=120, cwd=os.path.dirname(__file__),
                           env=dict(os.environ, TRACEGRAD_CACHE_DIR=str(d), TRACEGRAD_CACHE="1"))
        assert r.returncode == 0, r.stderr
        return r.stdout.split("] ")[1].strip(), r.stdout.split("] ")[0]

    first, g1 = fresh_process()
    assert first == "0 1 native"
    sos = [p for p in os.listdir(d) if p.endswith(".so")]
    entries = [p for p in os.listdir(d) if p.endswith(".py")]
    assert len(sos) == 1 and len(entries) == 1
    assert sos[0].startswith(entries[0][:-3] + "-")      # beside its entry
    assert os.stat(d / sos[0]).st_mode & 0o077 == 0       # private
    assert not [p for p in os.listdir(d) if p.startswith(".tmp-")]
    # the next process loads the entry and its object: no compile
    assert fresh_process() == ("1 0 native", g1)
    # an object writable by others is never loaded: it is rebuilt in its place
    os.chmod(d / sos[0], 0o766)
    assert fresh_process() == ("1 0 native", g1)
    assert os.stat(d / sos[0]).st_mode & 0o077 == 0
    # a damaged object (a crash of another tool, a full disk) is rebuilt
    (d / sos[0]).write_bytes(b"\x7fELF not really")
    assert fresh_process() == ("1 0 native", g1)
    assert (d / sos[0]).stat().st_size > 1000
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRACEGRAD_CACHE", "1")
        mp.setenv("TRACEGRAD_CACHE_DIR", str(d))
        tg.clear_cache()
    assert not [p for p in os.listdir(d) if p.endswith((".so", ".py"))]


@needs_cc
def test_concurrent_builds_see_a_complete_object(tmp_path):
    d = tmp_path / "cache"
    code = textwrap.dedent("""
        import numpy as np, tracegrad as tg
        from test_cuda import w2
        x = np.linspace(-1, 1, 999)
        gx, gy = tg.grad(w2, argnums=(0, 1), backend="native")(x, x)
        print(tg.cache_info()["target"], float(gx.sum()), float(gy.sum()))
    """)
    env = dict(os.environ, TRACEGRAD_CACHE_DIR=str(d), TRACEGRAD_CACHE="1")
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env,
                              cwd=os.path.dirname(__file__)) for _ in range(3)]
    outs = [p.communicate(timeout=180) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
    assert len({o for o, _ in outs}) == 1 and outs[0][0].startswith("native ")
    assert len([p for p in os.listdir(d) if p.endswith(".so")]) == 1
    assert not [p for p in os.listdir(d) if p.startswith(".tmp-")]


# --- fusion grouping is near-linear and convex --------------------------------------------

def _chain(n):
    """A graph of n sin/scale/add links over float64[4], with a full sum
    every 25 links broadcast back into the chain (a path out of a group and
    back, which convexity must keep apart), built directly (tracing would
    roll the Python loop into one loop node)."""
    g = nx.MultiDiGraph()
    f8 = np.dtype(np.float64)
    g.add_node(0, op="input", attrs={}, shape=(4,), dtype=f8, name="x", loc=None)
    g.graph["inputs"] = [0]
    x = 0
    for i in range(n):
        s = passes.add_node(g, "sin", [x], {}, (4,), f8)
        c = passes.add_node(g, "const", [], {}, (), f8, value=1.0001)
        x = passes.add_node(g, "mul", [s, c], {}, (4,), f8)
        if i % 25 == 0:
            t = passes.add_node(g, "sum", [x], {"axis": (0,), "keepdims": False}, (), f8)
            x = passes.add_node(g, "add", [x, t], {}, (4,), f8)
    g.graph["outputs"] = [passes.add_node(g, "sum", [x], {"axis": (0,), "keepdims": False},
                                          (), f8)]
    return g


def _check_groups(g, groups):
    seen = set()
    for grp in groups:
        assert not seen & set(grp.nodes)
        seen |= set(grp.nodes)
        assert all(g.nodes[v]["shape"] == grp.shape for v in grp.nodes)
    assert seen == {v for v in g.nodes if passes.fusible(g, v)}
    c = nx.DiGraph()
    unit = {v: i for i, grp in enumerate(groups) for v in list(grp.nodes) + list(grp.reductions)}
    for a, b in g.edges():
        ua, ub = unit.get(a, ("n", a)), unit.get(b, ("n", b))
        if ua != ub:
            c.add_edge(ua, ub)
    assert nx.is_directed_acyclic_graph(c)   # convex: a launch order exists


def test_fusion_groups_of_long_chains_are_valid():
    # how the grouping's time grows with the graph is measured by
    # benchmarks/scaling.py (a timing has no place in a test)
    small, large = _chain(200), _chain(2000)
    assert len(large) > 8 * len(small)
    _check_groups(small, passes.fusion_groups(small))
    _check_groups(large, passes.fusion_groups(large))


@needs_cc
def test_extension_entry_checks_its_arguments(monkeypatch):
    # the kernel-per-group driver (the whole-graph entry is checked below)
    monkeypatch.setenv("TRACEGRAD_NATIVE_WHOLE", "0")
    if toolchain.recipe()["entry"] != "python":
        pytest.skip("Python's headers are not installed: the kernels are called through ctypes")
    x = np.linspace(-1, 1, 50)
    src = tg.grad(w2, argnums=(0, 1), backend="native").lower(x, x).source
    ns = {"__name__": "native_test"}
    exec(compile(src, "<native>", "exec"), ns)
    assert ns["_ENTRY"] == "python"
    k = ns["_tg_k0"]
    # x, y in; the two gradients and the sum out
    with pytest.raises(TypeError, match="tg_k0 takes 5 arrays, got 1"):
        k(x)
    with pytest.raises(ValueError, match="argument 0 holds 392 bytes, the kernel needs 400"):
        k(x[1:].copy(), x, np.empty(50), np.empty(50), np.empty(1))
    ro = np.empty(50)
    ro.flags.writeable = False
    with pytest.raises((ValueError, BufferError)):   # a store into a read-only array
        k(x, x, ro, np.empty(50), np.empty(1))
    with pytest.raises((ValueError, BufferError)):   # a strided view is not C-contiguous
        k(np.linspace(0, 1, 100)[::2], x, np.empty(50), np.empty(50), np.empty(1))
    g1, g2, s = np.empty(50), np.empty(50), np.empty(1)
    k(x, x, g1, g2, s)
    vg = tg.value_and_grad(w2, argnums=(0, 1))(x, x)
    np.testing.assert_allclose(s[0], vg[0], atol=1e-13)
    np.testing.assert_allclose(sorted([g1.sum(), g2.sum()]), sorted([vg[1][0].sum(), vg[1][1].sum()]),
                               rtol=1e-12)


@needs_cc
def test_a_sum_read_by_its_own_kernel_is_not_fused_into_it(monkeypatch):
    # x / sqrt(sum(x * x)) and the projectile's step: grouping the sum with
    # the kernel that reads it, or a kernel entered and left through a third
    # one, would leave no launch order (the contracted graph must be acyclic).
    monkeypatch.setenv("TRACEGRAD_CACHE", "0")

    def normalise(x, w):
        return np.sum(w * x / np.sqrt(np.sum(x * x)))

    def step(v):
        a = -0.1 * v * np.sqrt(np.sum(v * v)) + np.array([0., 0., -9.8])
        v2 = v + 0.01 * a
        return np.sum(v2 * v2)
    x, w = np.linspace(0.5, 2.0, 7), np.linspace(-1.0, 1.0, 7)
    for f, args in [(normalise, (x, w)), (step, (np.array([5., 0., 5.]),))]:
        argnums = tuple(range(len(args)))
        ref = tg.value_and_grad(f, argnums=argnums)(*args)
        got = tg.value_and_grad(f, argnums=argnums, backend="native")(*args)
        np.testing.assert_allclose(got[0], ref[0], rtol=1e-12)
        for a, b in zip(got[1], ref[1]):
            np.testing.assert_allclose(a, b, rtol=1e-12)
        g = tg.value_and_grad(f, argnums=argnums).lower(*args).graph
        groups = passes.fusion_groups(g)
        unit = {v: ("g", i) for i, grp in enumerate(groups)
                for v in list(grp.nodes) + list(grp.reductions)}
        c = nx.DiGraph((unit.get(a, a), unit.get(b, b)) for a, b in g.edges()
                       if unit.get(a, a) != unit.get(b, b))
        assert nx.is_directed_acyclic_graph(c)


# --- whole graphs as one C function (loops as C loops) ----------------------------------------
# On by default (TRACEGRAD_NATIVE_WHOLE=0 turns them off).

def _miss(v0, n):
    x = np.zeros(3)
    v = v0
    for _ in range(n):
        a = -0.1 * v * np.sqrt(np.sum(v * v)) + np.array([0., 0., -9.8])
        v = v + 0.01 * a
        x = x + 0.01 * v
    return np.sum((x - np.array([10., 0., 0.])) ** 2)


def _miss_fori(v0, n):
    def body(i, s):
        x, v = s
        a = -0.1 * v * np.sqrt(np.sum(v * v)) + np.array([0., 0., -9.8])
        v = v + 0.01 * a
        return (x + 0.01 * v, v)
    x, v = tg.fori_loop(0, n, body, (np.zeros(3), v0))
    return np.sum((x - np.array([10., 0., 0.])) ** 2)


@pytest.fixture
def whole_on(monkeypatch):
    monkeypatch.setenv("TRACEGRAD_NATIVE_WHOLE", "1")


def _whole_vs_numpy(f, args, argnums=0, static=(), dtype=np.float64, transform="vg"):
    make = {"vg": lambda b: tg.value_and_grad(f, argnums=argnums, static_argnums=static,
                                               backend=b),
            "fwd": lambda b: tg.compile(f, static_argnums=static, backend=b)}[transform]
    graph_call._VJP_CACHE.clear()
    want = make("numpy")(*args)
    fn = make("native")
    got = fn(*args)
    assert tg.cache_info()["target"] == "native"
    src = fn.lower(*args).source
    assert "the whole graph: one C call" in src, src[-3000:]
    _assert_close(got, want, dtype)
    return src


@needs_cc
@pytest.mark.parametrize("n", [1, 2, 3, 17, 3000])
def test_projectile_gradient_is_one_c_function(n, whole_on):
    v0 = np.array([5., 0., 5.])
    for f in (_miss, _miss_fori):
        src = _whole_vs_numpy(f, (v0, n), static=(1,))
        if n == 3000 or (f is _miss_fori and n > 1):
            assert "for (long long _s" in src          # the loop is a C loop
            assert "def _scan_body" not in src         # no Python loop, no body function


@needs_cc
def test_whole_c_scan_with_index_xs_ys_reverse_and_nesting(whole_on):
    xs = np.linspace(-1.0, 1.0, 24).reshape(8, 3)
    w = np.array([0.3, -0.2, 0.5])

    def index_loop(w):
        return np.sum(tg.fori_loop(2, 9, lambda i, c: c * 0.9 + np.sin(w * i), w) ** 2)

    def scanned(w, xs, reverse):
        def step(c, x):
            c = np.tanh(c * w + x)
            return c, c * x
        c, ys = tg.scan(step, np.zeros(3), xs, reverse=reverse)
        return np.sum(c) + np.sum(ys ** 2) + np.sum(np.sum(ys, axis=0) * w)

    def nested(w):
        def outer(i, c):
            return tg.fori_loop(0, 4, lambda j, d: d * 0.5 + np.cos(d) * w, c) + 0.1
        return np.sum(tg.fori_loop(0, 5, outer, w))

    _whole_vs_numpy(index_loop, (w,))
    for reverse in (False, True):
        _whole_vs_numpy(scanned, (w, xs, reverse), argnums=(0, 1), static=(2,))
    src = _whole_vs_numpy(nested, (w,))
    assert src.count("for (long long _s") >= 4


@needs_cc
def test_whole_c_broadcasting_partial_sums_slices_transpose_float32(whole_on):
    x = np.linspace(0.1, 2.0, 12).reshape(3, 4)
    b = np.linspace(-1.0, 1.0, 4)

    def f(x, b):
        y = np.exp(x * 0.3) + b                           # broadcast (4,) over (3, 4)
        s = np.sum(y, axis=1, keepdims=True) * np.sum(y.T, axis=1)[None, :4]
        return np.sum(s) + np.sum(y[1:, ::2] ** 2) + np.sum(x[0] * b)

    _whole_vs_numpy(f, (x, b), argnums=(0, 1))
    _whole_vs_numpy(f, (x.astype(np.float32), b.astype(np.float32)), argnums=(0, 1),
                    dtype=np.float32)
    _whole_vs_numpy(rosenbrock, (np.linspace(0.1, 1.0, 16),))
    # large arrays: heap buffers, blocked pairwise sums
    big = np.linspace(-1.0, 1.0, 300_000).reshape(600, 500)
    _whole_vs_numpy(lambda x: np.sum(np.sin(x), axis=0) + np.sum(x.T ** 2, axis=1), (big,),
                    transform="fwd")


@needs_cc
def test_graphs_without_a_c_form_keep_the_driver(whole_on):
    A = np.linspace(-1, 1, 12).reshape(3, 4)
    f = tg.value_and_grad(lambda x: np.sum(np.tanh(A @ x)), backend="native")
    x = np.linspace(0.0, 1.0, 4)
    src = f.lower(x).source
    assert "one C call" not in src and "np.matmul" in src
    _assert_close(f(x), tg.value_and_grad(lambda x: np.sum(np.tanh(A @ x)))(x), np.float64)


@needs_cc
def test_whole_function_takes_arrays_as_they_come_and_converts_the_rest(whole_on):
    x = np.linspace(0.1, 1.0, 16)
    src = tg.value_and_grad(rosenbrock, backend="native").lower(x).source
    ns = {"__name__": "native_whole_test"}
    exec(compile(src, "<native>", "exec"), ns)
    want = tg.value_and_grad(rosenbrock)(x)
    # float64, float32, int64 and a list: the element type is checked, the
    # rest converted by NumPy, as the NumPy target would
    for arg in (x, x.astype(np.float32).astype(np.float64), np.arange(16), list(x),
                np.linspace(0.1, 1.0, 32)[::2]):
        got = ns["value_and_grad"](arg)
        ref = tg.value_and_grad(rosenbrock)(np.asarray(arg, dtype=np.float64))
        _assert_close(got, ref, np.float64)
    _assert_close(ns["value_and_grad"](x), want, np.float64)
    if ns["_ENTRY"] == "python":
        with pytest.raises(TypeError, match="argument 0 has dtype int64, the function needs "
                                            "float64"):
            ns["_tg_whole"](np.arange(16))


def _whole_module(src, entry):
    """The generated module run with the given entry ("python", or "ctypes"
    as on a machine without Python's headers)."""
    if entry == "ctypes":
        src = src.replace("'entry': 'python'", "'entry': 'ctypes'").replace(
            "entry=python", "entry=ctypes")
    ns = {"__name__": f"native_whole_{entry}"}
    exec(compile(src, "<native>", "exec"), ns)
    return ns


@needs_cc
@pytest.mark.parametrize("entry", ["python", "ctypes"])
def test_whole_entry_allocates_fresh_outputs_and_returns_numpy_scalars(entry, whole_on):
    # the entry takes the inputs only, allocates the outputs itself (fresh
    # arrays every call) and returns a computed 0-d value as a NumPy scalar,
    # as `a[()]` gives; a 0-d value that is a view (reshape) stays a 0-d array
    if entry == "python" and toolchain.recipe()["entry"] != "python":
        pytest.skip("Python's headers are not installed: whole functions go through ctypes")
    x = np.linspace(0.1, 1.0, 16)
    src = tg.value_and_grad(rosenbrock, backend="native").lower(x).source
    ns = _whole_module(src, entry)
    assert ns["_ENTRY"] == entry
    want = tg.value_and_grad(rosenbrock)(x)
    vg = ns["value_and_grad"]
    a, b = vg(x), vg(x)
    assert type(a) is tuple and len(a) == 2
    assert type(a[0]) is np.float64 and type(b[0]) is np.float64
    assert a[1] is not b[1] and not np.shares_memory(a[1], b[1])
    assert not np.shares_memory(a[1], x)
    assert a[1].dtype == np.float64 and a[1].shape == (16,) and a[1].flags.c_contiguous
    assert a[1].flags.writeable and a[1].flags.owndata
    a[1][:] = 7.0                                   # the caller owns its arrays
    _assert_close(vg(x), want, np.float64)
    _assert_close(b, want, np.float64)
    # the fallback converts what the entry refuses: another dtype, a
    # non-contiguous view, swapped bytes, a list, float32
    for arg in (np.arange(16), np.linspace(0.1, 1.0, 32)[::2], x.astype(">f8"), list(x),
                x.astype(np.float32)):
        ref = tg.value_and_grad(rosenbrock)(np.asarray(arg, dtype=np.float64))
        got = vg(arg)
        assert type(got[0]) is np.float64
        _assert_close(got, ref, np.float64)
    # a wrong size is an error, from the entry and through the fallback
    with pytest.raises(ValueError, match="argument 0 holds 120 bytes, the function needs 128"):
        vg(np.linspace(0.1, 1.0, 15))
    with pytest.raises(ValueError, match="holds 120 bytes"):
        ns["_tg_whole"](np.linspace(0.1, 1.0, 15))
    with pytest.raises(TypeError, match="takes 1 array"):
        ns["_tg_whole"](x, x)

    # float32, int64 and bool outputs; a 0-d view output; several outputs
    def f(x, k):
        y = np.sum(x * 2.0)
        return y, np.reshape(np.sum(x, keepdims=True), ()), (k * 3) % 5, k > 2

    xf = np.linspace(0.5, 1.5, 6, dtype=np.float32)
    k = np.arange(6)
    fn = tg.compile(f, backend="native")
    src = fn.lower(xf, k).source
    assert "the whole graph: one C call" in src
    ns = _whole_module(src, entry)
    got = ns["forward"](xf, k)
    want = tg.compile(f)(xf, k)
    for g_, w_ in zip(got, want):
        assert type(g_) is type(w_), (type(g_), type(w_))
        assert np.asarray(g_).dtype == np.asarray(w_).dtype
        np.testing.assert_allclose(g_, w_, rtol=1e-6)
    again = ns["forward"](xf, k)
    assert again[2] is not got[2] and not np.shares_memory(again[2], got[2])


@needs_cc
def test_whole_entry_keeps_the_gil_for_tiny_work_only(whole_on):
    x = np.linspace(0.1, 1.0, 16)
    csrc = _c_source(tg.value_and_grad(rosenbrock, backend="native"), x)
    entry = csrc[csrc.index("static PyObject* py_tg_whole"):]
    # if (work >= GIL_MIN_WORK): the GIL is released; the compiler folds the
    # test (a generic-size module makes it at run time, docs/native.md)
    work, least = map(int, re.search(r"if \((\d+)LL >= (\d+)LL\) \{", entry).groups())
    assert least == codegen_c.GIL_MIN_WORK and work < least
    big = np.linspace(0.1, 1.0, 100_000)
    csrc = _c_source(tg.value_and_grad(rosenbrock, backend="native"), big)
    entry = csrc[csrc.index("static PyObject* py_tg_whole"):]
    work, least = map(int, re.search(r"if \((\d+)LL >= (\d+)LL\) \{", entry).groups())
    assert work >= least and "Py_BEGIN_ALLOW_THREADS" in entry


# --- threads (TRACEGRAD_NUM_THREADS) for large kernels --------------------------------------

def _c_source(fn, *args):
    ns = {"__name__": "native_threads_test"}
    exec(compile(fn.lower(*args).source, "<native>", "exec"), ns)
    return ns["C_SOURCE"]


def _have_openmp():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRACEGRAD_NUM_THREADS", "2")
        return toolchain.recipe()["threads"] == 2


@needs_cc
@pytest.mark.parametrize("whole", ["1", "0"])
def test_threads_on_and_off_match_the_numpy_target(whole, monkeypatch):
    monkeypatch.setenv("TRACEGRAD_NATIVE_WHOLE", whole)
    n = 3 * codegen_c.PARALLEL_MIN + 17           # threaded, with a partial last block
    x, y = np.linspace(-1.0, 2.0, n), np.linspace(-2.0, 1.0, n)
    want = tg.value_and_grad(w2, argnums=(0, 1))(x, y)
    want32 = tg.value_and_grad(w2, argnums=(0, 1))(x.astype(np.float32), y.astype(np.float32))
    got = {}
    for threads in ("1", "2"):
        monkeypatch.setenv("TRACEGRAD_NUM_THREADS", threads)
        f = tg.value_and_grad(w2, argnums=(0, 1), backend="native")
        got[threads] = f(x, y)
        assert tg.cache_info()["target"] == "native"
        assert toolchain.recipe()["threads"] == (int(threads) if _have_openmp() else 1)
        src = _c_source(f, x, y)
        assert "\n#pragma omp parallel for schedule(dynamic, TG_CHUNK_OF(tg_nt, TG_CHUNK)) " \
            "num_threads(tg_nt)" in src
        assert "tg_par_threads(&" in src          # threads only while they come when called
        _assert_close(got[threads], want, np.float64)
        # the same thread count gives the same bits (block sums in block order)
        again = f(x, y)
        for a, b in zip(_leaves(again), _leaves(got[threads])):
            np.testing.assert_array_equal(a, b)
        _assert_close(f(x.astype(np.float32), y.astype(np.float32)), want32, np.float32)
        # an elementwise kernel without a sum
        g = tg.compile(lambda x, y: np.tanh(x) * y + 1.0, backend="native")
        np.testing.assert_allclose(g(x, y), np.tanh(x) * y + 1.0, rtol=1e-12)
    _assert_close(got["2"], got["1"], np.float64)


@needs_cc
def test_thread_count_is_part_of_the_recipe_identity(monkeypatch):
    if not _have_openmp():
        pytest.skip("the C compiler has no OpenMP")
    recs = {}
    for threads in ("1", "2", "3"):
        monkeypatch.setenv("TRACEGRAD_NUM_THREADS", threads)
        recs[threads] = toolchain.recipe()
    assert len({r["identity"] for r in recs.values()}) == 3
    assert "threads=1" in recs["1"]["identity"] and "openmp=none" in recs["1"]["identity"]
    assert "-fopenmp" not in recs["1"]["flags"]
    assert "threads=2" in recs["2"]["identity"] and "openmp=-fopenmp" in recs["2"]["identity"]
    assert "-fopenmp" in recs["2"]["flags"] and "-DTG_NUM_THREADS=2" in recs["2"]["flags"]
    # the key of a native entry changes with it
    from tracegrad.runtime import pipeline
    keys = set()
    for threads in ("1", "2"):
        monkeypatch.setenv("TRACEGRAD_NUM_THREADS", threads)
        keys.add(pipeline.native_parts({"backend": "native"})["native"])
    assert len(keys) == 2


@needs_cc
def test_default_thread_count_and_a_bad_setting(monkeypatch, caplog):
    monkeypatch.delenv("TRACEGRAD_NUM_THREADS", raising=False)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    # the cores this process may use (one where the compiler has no OpenMP)
    assert toolchain.recipe()["threads"] == (cores if _have_openmp() else 1)
    monkeypatch.setenv("TRACEGRAD_NUM_THREADS", "two")
    with caplog.at_level(logging.WARNING, logger="tracegrad.native"):
        out = tg.compile(lambda x: np.exp(x) * 3, backend="native")(np.ones(3))
    np.testing.assert_allclose(out, 3 * np.e)
    assert tg.cache_info()["target"] == "numpy"
    assert any("TRACEGRAD_NUM_THREADS" in r.getMessage() for r in caplog.records)


@needs_cc
def test_small_kernels_stay_single_threaded(monkeypatch):
    monkeypatch.setenv("TRACEGRAD_NUM_THREADS", "2")
    par = "\n#pragma omp parallel"
    for whole in ("1", "0"):
        monkeypatch.setenv("TRACEGRAD_NATIVE_WHOLE", whole)
        f = tg.value_and_grad(w2, argnums=(0, 1), backend="native")
        small = np.linspace(-1.0, 2.0, 1000)
        src = _c_source(f, small, small)
        assert par not in src and "#pragma omp simd reduction(+:" in src
        np.testing.assert_allclose(f(small, small)[0], tg.value_and_grad(w2)(small, small)[0],
                                   rtol=1e-12)
        # between the two thresholds: threaded only where the loop calls math
        n = (codegen_c.PARALLEL_MIN + codegen_c.PARALLEL_MIN_MATH) // 2
        mid = np.linspace(-1.0, 1.0, n)
        assert par in _c_source(tg.compile(lambda x: np.sin(x) * 2, backend="native"), mid)
        assert par not in _c_source(tg.compile(lambda x: x * 2 + 1, backend="native"), mid)
        big = np.linspace(-1.0, 1.0, codegen_c.PARALLEL_MIN)
        assert par in _c_source(tg.compile(lambda x: x * 2 + 1, backend="native"), big)


@needs_cc
def test_compiler_without_openmp_falls_back_to_one_thread(tmp_path, monkeypatch, caplog):
    real = os.environ.get("CC") or "cc"
    fake = tmp_path / "noompcc"
    fake.write_text("#!/bin/sh\n"
                    "for a in \"$@\"; do\n"
                    "  case \"$a\" in -fopenmp) echo \"noompcc: error: unsupported option "
                    "'-fopenmp'\" >&2; exit 1;; esac\n"
                    "done\n"
                    f"exec {real} \"$@\"\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CC", str(fake))
    monkeypatch.setenv("TRACEGRAD_NUM_THREADS", "2")
    with caplog.at_level(logging.WARNING, logger="tracegrad.native"):
        n = 2 * codegen_c.PARALLEL_MIN
        x = np.linspace(-1.0, 2.0, n)
        f = tg.value_and_grad(w2, argnums=(0, 1), backend="native")
        got = f(x, x)
        rec = toolchain.recipe()     # the build with the presumed recipe failed: probed
    assert rec["threads"] == 1 and rec["openmp"] == "none" and "-fopenmp" not in rec["flags"]
    assert tg.cache_info()["target"] == "native"
    assert not [r for r in caplog.records if "not available" in r.getMessage()]
    _assert_close(got, tg.value_and_grad(w2, argnums=(0, 1))(x, x), np.float64)


@needs_cc
def test_threaded_kernels_work_in_a_forked_child(tmp_path):
    if not _have_openmp():
        pytest.skip("the C compiler has no OpenMP")
    # GNU OpenMP's threads do not survive fork(): the child runs the kernels
    # on its own thread instead of waiting for them forever
    code = textwrap.dedent("""
        import os, numpy as np, tracegrad as tg
        f = tg.compile(lambda x: np.sum(np.sin(x) * 2), backend="native")
        x = np.ones(200_000)
        want = f(x)
        pid = os.fork()
        if pid == 0:
            os._exit(0 if f(x) == want else 3)
        _, status = os.waitpid(pid, 0)
        print("CHILD", os.waitstatus_to_exitcode(status), tg.cache_info()["target"])
    """)
    env = dict(os.environ, TRACEGRAD_NUM_THREADS="2", TRACEGRAD_CACHE="0")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "CHILD 0 native" in r.stdout


# --- the driver's buffers (issue 11, W3): reused within a call, kept between calls -------

def _mlp(W1, b1, W2, b2, X, Y):
    h = np.tanh(X @ W1 + b1)
    return np.mean((h @ W2 + b2 - Y) ** 2)


def _mlp_args(seed, n=64, d=16, k=32, m=5):
    r = np.random.default_rng(seed)
    return (r.standard_normal((d, k)) * 0.3, r.standard_normal(k) * 0.1,
            r.standard_normal((k, m)) * 0.3, r.standard_normal(m) * 0.1,
            r.standard_normal((n, d)), r.standard_normal((n, m)))


def _mlp_by_hand(W1, b1, W2, b2, X, Y):
    h = np.tanh(X @ W1 + b1)
    r = h @ W2 + b2 - Y
    d = (2.0 / r.size) * r
    dh = (d @ W2.T) * (1 - h * h)
    return np.mean(r * r), (X.T @ dh, dh.sum(0), h.T @ d, d.sum(0))


def _driver(fn, *args, name="value_and_grad", **kw):
    """The generated driver module of tg.value_and_grad(fn) run as a namespace."""
    src = tg.value_and_grad(fn, backend="native", **kw).lower(*args).source
    ns = {"__name__": "native_test"}
    exec(compile(src, "<native>", "exec"), ns)
    return src, ns, ns[name]


def _flat(result):
    return [np.asarray(a) for a in _leaves(result)]


@needs_cc
def test_w3_gradient_is_right_called_again_and_again(monkeypatch):
    monkeypatch.setenv("TRACEGRAD_NATIVE_WHOLE", "1")   # a matmul: the driver structure anyway
    vn = tg.value_and_grad(_mlp, argnums=(0, 1, 2, 3), backend="native")
    sets = [_mlp_args(s) for s in range(3)]
    for k in range(7):   # alternate the inputs: a stale buffer would show
        args = sets[k % 3]
        got, want = vn(*args), _mlp_by_hand(*args)
        assert tg.cache_info()["target"] == "native"
        for a, b in zip(_flat(got), _flat(want)):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
    src, ns, _ = _driver(_mlp, *sets[0], argnums=(0, 1, 2, 3))
    # the hidden layer's intermediates live in buffers kept between calls
    # (into which a matmul writes with out=); outputs are allocated per call
    assert "_s = _scratch_value_and_grad.take()" in src and "out=_s[" in src
    assert "_scratch_value_and_grad.give(_s)" in src


def _no_sharing(outs, others):
    for i, a in enumerate(outs):
        for j, b in enumerate(outs):
            if i < j:
                assert not np.shares_memory(a, b), (i, j)
        for b in others:
            assert not np.shares_memory(a, b)


@needs_cc
def test_outputs_are_fresh_and_survive_later_calls(monkeypatch):
    monkeypatch.setenv("TRACEGRAD_NATIVE_WHOLE", "1")

    def f(W, X):
        # a view of h and h's sum leave the call: h may not be kept
        h = np.tanh(X @ W)
        z = np.exp(-h * h) @ W.T
        return np.sum(z * z), (h.T, np.sin(z) * 2.0)

    r = np.random.default_rng(1)
    a1 = (r.standard_normal((6, 6)) * 0.4, r.standard_normal((9, 6)))
    a2 = (r.standard_normal((6, 6)) * 0.4, r.standard_normal((9, 6)))
    src, ns, fn = _driver(f, *a1, argnums=(0, 1), has_aux=True)
    ref1 = tg.value_and_grad(f, argnums=(0, 1), has_aux=True)(*a1)
    got1 = fn(*a1)
    keep1 = [a.copy() for a in _flat(got1)]
    got2 = fn(*a2)
    for a, b in zip(_flat(got1), keep1):   # the second call wrote none of the first's results
        np.testing.assert_array_equal(a, b)
    for a, b in zip(_flat(got1), _flat(ref1)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
    kept = [b for s in ns["_scratch_value_and_grad"]._free for b in s]
    assert kept, "no buffer kept between calls"
    _no_sharing(_flat(got1) + _flat(got2), kept)
    # the compiled function as users call it
    vn = tg.value_and_grad(f, argnums=(0, 1), has_aux=True, backend="native")
    out1 = vn(*a1)
    snap = [a.copy() for a in _flat(out1)]
    out2 = vn(*a2)
    for a, b in zip(_flat(out1), snap):
        np.testing.assert_array_equal(a, b)
    _no_sharing(_flat(out1) + _flat(out2), [])


@needs_cc
def test_two_threads_call_one_driver_at_once(monkeypatch):
    import threading
    monkeypatch.setenv("TRACEGRAD_NATIVE_WHOLE", "1")
    # big enough that the kernels (which run without the GIL) overlap
    sets = [_mlp_args(s, n=256, d=64, k=256, m=10) for s in (5, 6)]
    vn = tg.value_and_grad(_mlp, argnums=(0, 1, 2, 3), backend="native")
    want = [_flat(_mlp_by_hand(*a)) for a in sets]
    vn(*sets[0])
    start = threading.Barrier(2)
    errors, results = [], {0: [], 1: []}

    def work(t):
        try:
            start.wait()
            for _ in range(30):
                results[t].append(vn(*sets[t]))
        except BaseException as e:   # noqa: BLE001 -- reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in (0, 1)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    for t in (0, 1):
        for res in results[t]:
            for a, b in zip(_flat(res), want[t]):
                np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
    # every result its own memory
    allout = [a for t in (0, 1) for res in results[t][-3:] for a in _flat(res)]
    _no_sharing([a for a in allout if a.ndim], [])


@needs_cc
def test_a_loop_body_driver_keeps_its_buffers_and_a_cap_turns_them_off(monkeypatch):
    monkeypatch.setenv("TRACEGRAD_NATIVE_WHOLE", "1")

    def f(W, x):
        def body(i, h):
            return np.tanh(h @ W + 0.1) * 0.9
        return np.sum(tg.fori_loop(0, 4, body, x) ** 2)

    r = np.random.default_rng(3)
    args = (r.standard_normal((8, 8)) * 0.5, r.standard_normal((5, 8)))
    want = tg.value_and_grad(f, argnums=(0, 1))(*args)
    for cap in (codegen_c.KEPT_MAX_BYTES, 0):
        monkeypatch.setattr(codegen_c, "KEPT_MAX_BYTES", cap)
        vn = tg.value_and_grad(f, argnums=(0, 1), backend="native")
        for _ in range(3):
            got = vn(*args)
            for a, b in zip(_flat(got), _flat(want)):
                np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
        src = vn.lower(*args).source
        assert ("_Scratch(" in src) == (cap > 0)
        tg.clear_cache()


def test_isa_level_is_the_best_the_cpu_runs(monkeypatch):
    ns = builder.loader()["_cpu_levels"].__globals__   # the loader's own namespace
    flags_v3 = "fpu sse2 avx avx2 fma bmi1 bmi2 movbe f16c abm xsave"
    for flags, want in ((flags_v3, ["x86-64-v3"]),
                        (flags_v3 + " avx512f avx512bw avx512cd avx512dq avx512vl",
                         ["x86-64-v4", "x86-64-v3"]),
                        (flags_v3 + " avx512f", ["x86-64-v3"]),   # no BW/CD/DQ/VL: not v4
                        ("fpu sse2 avx", [])):
        import io
        monkeypatch.setitem(ns, "open", lambda *a, _t=flags, **k: io.StringIO(f"flags\t: {_t}\n"))
        monkeypatch.setattr(ns["_platform"], "machine", lambda: "x86_64")
        assert ns["_cpu_levels"]() == want
        monkeypatch.undo()


@needs_cc
def test_recipe_isa_flag_matches_its_identity():
    rec = toolchain.recipe()
    levels = builder.loader()["_cpu_levels"]()
    assert rec["isa"] == "baseline" or rec["isa"] in levels
    if rec["isa"] != "baseline":
        assert f"-march={rec['isa']}" in rec["flags"]
        # never a level above what the CPU runs
        assert levels.index(rec["isa"]) >= 0
    assert f"isa={rec['isa']}" in rec["identity"]


@needs_cc
@pytest.mark.parametrize("name", sorted(CORPUS))
def test_driver_results_survive_a_later_call(name, monkeypatch):
    # every corpus graph in the driver structure: a second call with other
    # inputs leaves the first call's results as they were, and no result
    # shares memory with another or with a buffer kept between calls
    monkeypatch.setenv("TRACEGRAD_NATIVE_WHOLE", "0")
    fn, _, argnums, _ = CORPUS[name]
    a1 = _args(name, np.float64)
    a2 = tuple(a * 1.25 + 0.125 if np.asarray(a).dtype.kind == "f" else a for a in a1)
    if argnums is None:
        compiled, fname = tg.compile(fn, backend="native"), "forward"
    else:
        compiled, fname = tg.value_and_grad(fn, argnums=argnums, backend="native"), "value_and_grad"
    ns = {"__name__": "native_test"}
    exec(compile(compiled.lower(*a1).source, "<native>", "exec"), ns)
    f = ns[fname]
    r1 = _flat(f(*a1))
    snap = [a.copy() for a in r1]
    r2 = _flat(f(*a2))
    for a, b in zip(r1, snap):
        np.testing.assert_array_equal(a, b)
    kept = [b for k, v in ns.items() if k.startswith("_scratch_") for s in v._free for b in s]
    _no_sharing([a for a in r1 + r2 if a.ndim], kept)
    for a, b in zip(r2, _flat(compiled(*a2))):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-13 * max(1.0, float(np.max(np.abs(b)))))


def _refusing_cc(tmp_path, refuse):
    """A compiler that refuses one flag, as an older or partial toolchain
    does; refuse="Python.h": one without Python's headers (it fails where
    they are included: a probe, or the extension entry)."""
    cc = tmp_path / "cc"
    real = shutil.which("cc")
    if refuse == "Python.h":
        test = ('case "$f" in -DTG_PYTHON_ENTRY) exit 1;; *.c) grep -q TG_PYTHON_ENTRY "$f" || '
                '{ grep -q "Python.h" "$f" && exit 1; };; esac')
        cc.write_text(f'#!/bin/sh\nfor f in "$@"; do {test}; done\nexec {real} "$@"\n')
    else:
        cc.write_text(f'#!/bin/sh\nfor a in "$@"; do [ "$a" = "{refuse}" ] && exit 1; done\n'
                      f'exec {real} "$@"\n')
    cc.chmod(0o755)
    return cc


@needs_cc
@pytest.mark.parametrize("refuse, isa_ok, mvec_ok", [
    ("-march=x86-64-v4", False, True),      # an older compiler: the next level down
    ("-lmvec", True, False),                # no libmvec: scalar libm
    ("Python.h", True, True),               # no Python headers: the ctypes entry
])
def test_the_recipe_probes_fall_back_one_by_one(tmp_path, monkeypatch, refuse, isa_ok, mvec_ok):
    # a compiler that refuses one thing, as an older or partial toolchain does
    real = shutil.which("cc")
    cc = _refusing_cc(tmp_path, refuse)
    ns = builder.loader()
    base = ns["recipe"](cc=real)
    rec = ns["recipe"](cc=str(cc))
    levels = ns["_cpu_levels"]()
    if isa_ok or not levels or base["isa"] != "x86-64-v4":
        assert rec["isa"] == base["isa"]
    else:
        assert rec["isa"] == (levels[1] if len(levels) > 1 else "baseline")
    assert (rec["vector_math"] == base["vector_math"]) if mvec_ok else rec["vector_math"] == []
    assert rec["entry"] == (base["entry"] if refuse != "Python.h" else "ctypes")


@needs_cc
@pytest.mark.parametrize("setting", [None, "native"])
def test_native_is_the_default_and_tracegrad_backend_selects_it(monkeypatch, setting):
    # native is the default wherever a compiler works; TRACEGRAD_BACKEND
    # names it (or numpy) for every transform given no backend=
    if setting is None:
        monkeypatch.delenv("TRACEGRAD_BACKEND", raising=False)
    else:
        monkeypatch.setenv("TRACEGRAD_BACKEND", setting)
    x = np.linspace(0.1, 1.0, 7 if setting else 6)

    def f(x):
        return np.sum(np.sin(x) * np.exp(-x))
    expect = np.cos(x) * np.exp(-x) - np.sin(x) * np.exp(-x)
    np.testing.assert_allclose(tg.grad(f)(x), expect, rtol=1e-13)
    assert tg.cache_info()["target"] == "native"
    y, pullback = tg.vjp(lambda x: np.sin(x) * np.exp(-x), x)
    np.testing.assert_allclose(pullback(np.ones_like(x))[0], expect, rtol=1e-13)
    assert tg.cache_info()["target"] == "native"
    jac = tg.autograd.functional.jacobian(lambda t: (t * t).sin(), tg.tensor(x))
    np.testing.assert_allclose(np.diag(jac.numpy()), 2 * x * np.cos(x * x), rtol=1e-13)
    assert tg.cache_info()["target"] == "native"
    monkeypatch.setenv("TRACEGRAD_BACKEND", "numpy")
    tg.grad(lambda x: np.sum(np.cos(x) * x))(x)
    assert tg.cache_info()["target"] == "numpy"
    monkeypatch.setenv("TRACEGRAD_BACKEND", "fortran")
    with pytest.raises(ValueError, match="TRACEGRAD_BACKEND must be one of numpy, native"):
        tg.grad(lambda x: np.sum(np.tan(x)))(x)


@needs_cc
def test_presumed_recipe_is_the_probed_one_where_every_probe_passes():
    # the first build uses the presumed recipe (no probe builds); its
    # identity is part of every cache key, so it must be the probes' own
    ns = builder.loader()
    real = shutil.which("cc")
    presumed = ns["recipe"](cc=real, presume=True)
    probed = ns["recipe"](cc=real)
    assert presumed.pop("presumed") is True
    assert presumed == probed


@needs_cc
@pytest.mark.parametrize("refuse", ["-march=x86-64-v4", "-lmvec", "Python.h"])
def test_a_presumed_recipe_that_fails_to_build_is_probed_and_built_again(tmp_path, monkeypatch,
                                                                         caplog, refuse):
    ns = builder.loader()
    real = shutil.which("cc")
    if refuse == "-march=x86-64-v4" and ns["recipe"](cc=real)["isa"] != "x86-64-v4":
        pytest.skip("this CPU has no AVX-512: the presumed level is v3 or none")
    cc = _refusing_cc(tmp_path, refuse)
    monkeypatch.setenv("CC", str(cc))
    monkeypatch.setenv("TRACEGRAD_CACHE", "1")
    monkeypatch.setenv("TRACEGRAD_CACHE_DIR", str(tmp_path / "cache"))
    assert toolchain.recipe()["presumed"] is True
    x = np.linspace(0.1, 1.0, 9 + len(refuse))      # a shape no other test compiled
    with caplog.at_level(logging.WARNING, logger="tracegrad.native"):
        got = tg.value_and_grad(w2, argnums=(0, 1), backend="native")(x, x)
    assert tg.cache_info()["target"] == "native"
    assert not [r for r in caplog.records if "not available" in r.getMessage()]
    rec = toolchain.recipe()
    assert "presumed" not in rec
    assert {"-march=x86-64-v4": rec["isa"] != "x86-64-v4", "-lmvec": rec["vector_math"] == [],
            "Python.h": rec["entry"] == "ctypes"}[refuse]
    remembered = list((tmp_path / "cache").glob("native-recipe-*.json"))
    assert len(remembered) == 1 and "presumed" not in json.loads(remembered[0].read_text())
    _assert_close(got, tg.value_and_grad(w2, argnums=(0, 1))(x, x), np.float64)
    # a later process starts from the remembered recipe: no probe, no failed build
    toolchain._memo.clear()
    assert toolchain.recipe() == rec


@needs_cc
def test_a_working_presumed_recipe_is_remembered_after_its_first_build(tmp_path, monkeypatch):
    cc = tmp_path / "cc"
    cc.write_text(f'#!/bin/sh\nexec {shutil.which("cc")} "$@"\n')
    cc.chmod(0o755)
    monkeypatch.setenv("CC", str(cc))
    monkeypatch.setenv("TRACEGRAD_CACHE", "1")
    monkeypatch.setenv("TRACEGRAD_CACHE_DIR", str(tmp_path / "cache"))
    presumed = toolchain.recipe()
    assert presumed["presumed"] is True
    assert not list((tmp_path / "cache").glob("native-recipe-*.json"))
    tg.grad(lambda x: np.sum(np.sin(x)), backend="native")(np.ones(3))
    assert tg.cache_info()["target"] == "native"
    toolchain._memo.clear()
    rec = toolchain.recipe()
    assert "presumed" not in rec and rec["identity"] == presumed["identity"]


@needs_cc
@pytest.mark.parametrize("threads", ["1", "2"])
def test_broadcast_kernels_loop_by_rows_and_match_the_numpy_target(monkeypatch, threads):
    # operands broadcast along every axis pattern of a 3-D iteration space:
    # the row loop computes the outer coordinates once per row
    monkeypatch.setenv("TRACEGRAD_NUM_THREADS", threads)
    rng = np.random.default_rng(3)
    big = threads == "2"           # past PARALLEL_MIN_MATH: the rows split among threads
    S = (40, 30, 20) if big else (3, 5, 20)
    x = rng.standard_normal(S)
    a, b, c, d = (rng.standard_normal(s) for s in ((S[1], 1), (S[2],), (S[0], 1, S[2]),
                                                   (1, S[1], S[2])))

    def f(x, a, b, c, d):
        return np.sum(np.tanh(x * a + b) * np.exp(-c * c) + np.sin(x - d) * a)
    args = (x, a, b, c, d)
    want = tg.value_and_grad(f, argnums=(0, 1, 2, 3, 4), backend="numpy")(*args)
    vg = tg.value_and_grad(f, argnums=(0, 1, 2, 3, 4), backend="native")
    _assert_close(vg(*args), want, np.float64)
    # the forward without the sum: one kernel with broadcast operands (the
    # gradient's main kernel finishes the sum, so it keeps the flat loop)
    def fwd(x, a, b, c, d):
        return np.tanh(x * a + b) * np.exp(-c * c) + np.sin(x - d) * a
    np.testing.assert_allclose(tg.compile(fwd, backend="native")(*args), fwd(*args),
                               rtol=1e-12, atol=1e-13)
    csrc = codegen_c.translation_unit(tg.compile(fwd).lower(*args).graph,
                                      rec=toolchain.recipe_or_none())
    assert "by rows of the last axis" in csrc
    assert "once per row" in csrc            # the outer coordinates, hoisted
    # rows shorter than ROW_MIN keep the flat loop
    short = (x[..., :3], a, b[:3], c[..., :3], d[..., :3])
    _assert_close(tg.value_and_grad(f, argnums=(0, 1, 2, 3, 4), backend="native")(*short),
                  tg.value_and_grad(f, argnums=(0, 1, 2, 3, 4), backend="numpy")(*short),
                  np.float64)


@needs_cc
@pytest.mark.parametrize("how", ["exit", "fork"])
def test_a_process_without_a_disk_cache_keeps_one_private_folder_and_removes_it(tmp_path, how):
    # shared objects built without an on-disk module go to one private
    # folder per process, removed when the process exits (not by a forked
    # child that exits first)
    code = textwrap.dedent("""
        import os, sys, tempfile, numpy as np, tracegrad as tg
        x = np.linspace(0.1, 1.0, 7)
        tg.grad(lambda x: np.sum(np.tanh(x) * x), backend="native")(x)
        tg.grad(lambda x: np.sum(np.exp(-x) * np.sin(x)), backend="native")(x)
        tg.value_and_grad(lambda x: np.sum(np.log1p(x * x)), backend="native")(x)
        assert tg.cache_info()["target"] == "native"
        folders = [n for n in os.listdir(tempfile.gettempdir()) if n.startswith("tracegrad-native-")]
        print("FOLDERS", folders)
        if sys.argv[1] == "fork":
            pid = os.fork()
            if pid == 0:
                sys.exit(0)          # the child's exit runs the inherited atexit hooks
            os.waitpid(pid, 0)
            assert os.path.isdir(os.path.join(tempfile.gettempdir(), folders[0])), "removed"
            tg.grad(lambda x: np.sum(np.cos(x) * x), backend="native")(x)   # still builds
    """)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = dict(os.environ, TMPDIR=str(tmp), TRACEGRAD_CACHE="0")
    r = subprocess.run([sys.executable, "-c", code, how], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    folders = [line for line in r.stdout.splitlines() if line.startswith("FOLDERS")][0]
    assert folders.count("tracegrad-native-") == 1, folders      # one per process
    assert os.listdir(tmp) == []                                  # and gone at exit


@needs_cc
@pytest.mark.parametrize("index, in_place", [
    ((slice(1, -1),), True),                    # x[1:-1] of a vector
    ((slice(2, 5), slice(None)), True),         # whole rows
    ((3,), True),                               # one row
    ((slice(None), slice(1, None)), False),     # columns: not one run
    ((slice(None, None, -1),), False),          # reversed
    ((slice(None, None, 2),), False),           # strided
])
def test_a_contiguous_slice_is_read_in_place_in_a_whole_function(index, in_place):
    # a basic getitem that reads one contiguous run of its operand is a
    # pointer into it (no buffer, no copy); any other is a strided copy
    x = np.linspace(-1.0, 2.0, 60).reshape(6, 10) if len(index) == 2 or index == (3,) \
        else np.linspace(-1.0, 2.0, 60)
    w = np.cos(np.arange(x[index].size)).reshape(x[index].shape)

    def f(x):
        return np.sum(np.sin(x[index]) * w)
    vg = tg.value_and_grad(f, backend="native")
    want = tg.value_and_grad(f, backend="numpy")(x)
    got = vg(x)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-13)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-13, atol=1e-15)
    src = vg.lower(x).source
    assert "tg_whole" in src
    whole_c = src[src.index("int tg_whole("):src.index("#ifdef TG_PYTHON_ENTRY")]
    assert ("getitem" not in whole_c) == in_place, whole_c


@needs_cc
@pytest.mark.parametrize("entry", ["python", "ctypes"])
def test_an_output_of_zeros_and_a_scatter_is_allocated_zeroed(entry, whole_on):
    # x[1:-1]'s gradient is zeros with the cotangent in the middle: the
    # entry allocates it zeroed (no memset pass), through either entry
    if entry == "python" and toolchain.recipe()["entry"] != "python":
        pytest.skip("Python's headers are not installed: whole functions go through ctypes")
    x = np.linspace(-1.0, 2.0, 50)
    w = np.cos(np.arange(48))

    def f(x):
        return np.sum(np.sin(x[1:-1]) * w)
    # (specialised: a generic-size text needs the extension entry)
    src = tg.value_and_grad(f, backend="native", dynamic=False).lower(x).source
    assert "is allocated zeroed by the entry" in src
    ns = _whole_module(src, entry)
    want = tg.value_and_grad(f, backend="numpy")(x)
    for _ in range(2):
        got = ns["value_and_grad"](x, w)      # w: captured, read at each call
        _assert_close(got, want, np.float64)
        got[1][:] = np.nan     # a fresh array each call: no state between calls
