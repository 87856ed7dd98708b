"""Build time that grows gently with the graph (issue 29, item 5;
benchmarks/compile_time.py measures it, docs/benchmarks.md "Compile time").

A large graph's native C is cut where the C compiler's time would grow
faster than linearly: fused groups of at most ``passes.FUSION_MAX_NODES``
nodes, a whole-graph function in parts of about ``whole.PART_LINES`` lines,
and a large file compiled as several translation units at once.  These
tests check that a large generated graph is cut so, still gives the NumPy
target's values and gradients, and that its C build stays within a
generous multiple of the NumPy target's compile of the same graph."""
import re
import resource
import subprocess
import time

import networkx as nx
import numpy as np
import pytest

import tracegrad as tg
from tracegrad.ir import passes
from tracegrad.runtime import toolchain
from tracegrad.targets import cstyle
from tracegrad.targets.native import builder, whole

needs_cc = pytest.mark.skipif(toolchain.recipe_or_none() is None,
                              reason="the native target needs a C compiler")


def _chain(steps, matmul_every=0):
    """tanh(h * c_i + b) chained ``steps`` times over float64[16, 8] (b
    broadcast), with ``h @ W`` every ``matmul_every`` steps: unrolled (no
    loop rolling: TRACEGRAD_ROLL=0)."""
    cs = [1.0 + 1e-3 * i for i in range(steps)]

    def f(x, W, b):
        h = x
        for i, c in enumerate(cs):
            h = np.tanh(h * c + b)
            if matmul_every and i % matmul_every == matmul_every - 1:
                h = h @ W
        return np.sum(h * h)
    f.__qualname__ = f"chain_{steps}_{matmul_every}"
    rng = np.random.default_rng(1)
    args = (rng.standard_normal((16, 8)), rng.standard_normal((8, 8)) * 0.3,
            rng.standard_normal(8))
    return f, args


def _c_source(module_source):
    i = module_source.index("C_SOURCE = ") + len("C_SOURCE = ")
    return eval(module_source[i:module_source.index("\n\n# The build recipe")])


def _same(a, b):
    va, (ga, gb_) = a
    vb, (gb, gbb) = b
    np.testing.assert_allclose(va, vb, rtol=1e-12)
    np.testing.assert_allclose(ga, gb, rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(gb_, gbb, rtol=1e-10, atol=1e-13)


@pytest.fixture
def unrolled(monkeypatch):
    monkeypatch.setenv("TRACEGRAD_ROLL", "0")


def test_large_fused_groups_are_cut_into_bounded_convex_kernels(unrolled, monkeypatch):
    f, args = _chain(400)
    g = tg.value_and_grad(f, argnums=(0, 2), backend="numpy").lower(*args).graph
    with monkeypatch.context() as m:
        m.setattr(passes, "FUSION_MAX_NODES", 10 ** 9)
        unbounded = max(len(grp.nodes) for grp in passes.fusion_groups(g))
    assert unbounded > 4 * passes.FUSION_MAX_NODES
    groups = passes.fusion_groups(g)
    sizes = [len(grp.nodes) for grp in groups]
    assert max(sizes) <= passes.FUSION_MAX_NODES
    assert sum(s > passes.FUSION_MAX_NODES // 2 for s in sizes) >= 4
    # every fusible node in exactly one group, one shape per group
    seen = set()
    for grp in groups:
        assert not seen & set(grp.nodes)
        seen |= set(grp.nodes)
        assert all(g.nodes[v]["shape"] == grp.shape for v in grp.nodes)
        for r in grp.reductions:        # a fused sum stays with its operand
            assert list(g.predecessors(r))[0] in grp.nodes
    assert seen == {v for v in g.nodes if passes.fusible(g, v)}
    # the contracted graph is acyclic (a launch order exists)
    units = cstyle.schedule(g, groups)
    assert len(units) == len(set(units))
    c = nx.DiGraph()
    unit_of = {v: gi for gi, grp in enumerate(groups) for v in list(grp.nodes) + grp.reductions}
    for a, b in g.edges():
        ua, ub = unit_of.get(a, ("n", a)), unit_of.get(b, ("n", b))
        if ua != ub:
            c.add_edge(ua, ub)
    assert nx.is_directed_acyclic_graph(c)


@needs_cc
@pytest.mark.parametrize("matmul_every", [0, 8], ids=["whole", "driver"])
def test_a_large_graph_is_split_and_matches_the_numpy_target(matmul_every, unrolled,
                                                            monkeypatch, tmp_path):
    monkeypatch.setenv("TRACEGRAD_BUILD_JOBS", "2")
    f, args = _chain(300, matmul_every)
    want = tg.value_and_grad(f, argnums=(0, 2), backend="numpy")(*args)
    native = tg.value_and_grad(f, argnums=(0, 2), backend="native")
    csrc = _c_source(native.lower(*args).source)
    kernels = re.findall(r"^void (tg_\w*k\d+)\(\n", csrc, re.M)
    assert len(kernels) >= 3
    if matmul_every == 0:
        # one graph, every node with a C form: one entry calling several parts
        parts = re.findall(r"^void (tg_whole_p\d+)\(", csrc, re.M)
        assert len(parts) >= 5
        assert "struct tg_whole_stack" in csrc and "struct tg_whole_heap" in csrc
    # marked for the builder, which compiles it as two translation units
    assert "// @tg-prelude-end" in csrc
    units = builder.loader()["_units"](csrc, 2)
    assert len(units) == 2
    for u in units:     # each unit: the prelude and some of the functions
        assert u.startswith(csrc.split("// @tg-prelude-end")[0])
    defined = [set(re.findall(r"^void (tg_\w+)\([^;]*?\)\n\{", u, re.M)) for u in units]
    assert defined[0] and defined[1] and not defined[0] & defined[1]
    # each unit compiles on its own: everything it calls is declared in it
    rec = toolchain.recipe()
    for j, u in enumerate(units):
        path = tmp_path / f"unit{j}.c"
        path.write_text(u)
        extra = ["-DTG_PYTHON_ENTRY", "-DTG_MODULE_NAME=tg_unit_test",
                 "-I" + rec["python_include"], "-I" + np.get_include()] \
            if rec.get("python_include") else []
        r = subprocess.run(rec["cc"] + rec["flags"] + extra +
                           ["-fsyntax-only", "-Werror=implicit-function-declaration", str(path)],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-2000:]
    got = native(*args)
    _same(got, want)


@needs_cc
def test_the_split_whole_function_runs_on_the_heap_frame(unrolled, monkeypatch):
    """A graph whose buffers pass the stack budget: the parts share one heap
    block; the results match one C function's (no parts) to the last bit."""
    f, args = _chain(120)
    monkeypatch.setattr(whole, "PART_LINES", 10 ** 9)
    one = tg.value_and_grad(f, argnums=(0, 2), backend="native")
    src_one = _c_source(one.lower(*args).source)
    assert "tg_whole_p0" not in src_one
    want = one(*args)
    monkeypatch.setattr(whole, "PART_LINES", 60)
    f2, _ = _chain(120)
    f2.__qualname__ += "_parts"
    parts = tg.value_and_grad(f2, argnums=(0, 2), backend="native")
    src = _c_source(parts.lower(*args).source)
    assert len(re.findall(r"^void tg_whole_p\d+\(", src, re.M)) >= 10
    heap = re.search(r"struct tg_whole_heap \{(.*?)\};", src, re.S).group(1)
    assert heap.count(";") > 2          # buffers past the stack budget
    got = parts(*args)
    assert float(got[0]) == float(want[0])
    for a, b in zip(got[1], want[1]):
        assert np.array_equal(a, b)


def _cpu_children():
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


@needs_cc
def test_c_build_of_ten_thousand_nodes_stays_near_the_numpy_compile(unrolled, monkeypatch):
    """The compiler's CPU time on a graph of about 1e4 nodes, as a ratio to
    the CPU time of the NumPy target's whole compile of the same graph
    (trace, passes, adjoint, code generation, loading) in this test: one
    C function took over 50x (minutes) before large graphs were cut."""
    monkeypatch.setenv("TRACEGRAD_CACHE", "0")
    f, args = _chain(900)
    t = time.process_time()
    want = tg.value_and_grad(f, argnums=(0, 2), backend="numpy")(*args)
    numpy_cpu = time.process_time() - t
    native = tg.value_and_grad(f, argnums=(0, 2), backend="native")
    assert len(native.lower(*args).graph) > 8000
    c0 = _cpu_children()
    got = native(*args)
    cc_cpu = _cpu_children() - c0
    print(f"C build {cc_cpu:.2f} s of compiler CPU; NumPy target compile {numpy_cpu:.2f} s CPU")
    _same(got, want)
    assert cc_cpu < 8 * numpy_cpu, (cc_cpu, numpy_cpu)


def test_units_keep_a_small_or_unmarked_file_whole():
    units = builder.loader()["_units"]
    assert units("int f(void) { return 0; }\n", 4) == ["int f(void) { return 0; }\n"]
    marked = "// pre\n// @tg-prelude-end\n" + "\n// @tg-unit\n".join(
        f"void f{j}(void) {{}}" for j in range(10))
    assert units(marked, 4) == [marked]          # too small to be worth a second unit
    big = "// pre\n// @tg-prelude-end\n" + "\n// @tg-unit\n".join(
        "void f%d(void) {\n%s}" % (j, "    ;\n" * 800) for j in range(8))
    got = units(big, 3)
    assert len(got) == 3
    assert sum(len(re.findall(r"void f\d", u)) for u in got) == 8
    assert all(len(re.findall(r"void f\d", u)) >= 2 for u in got)
    assert all(u.startswith("// pre\n// @tg-prelude-end\n") for u in got)
    assert units(big, 1) == [big]
