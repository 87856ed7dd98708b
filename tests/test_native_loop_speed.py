"""Issue 29 (3, 4): what makes a whole function's loops fast and what splits
large kernels among threads, checked in the generated C and against the
NumPy target: loop-body kernels inlined and small loops unrolled, one-block
sums without the pairwise counter, fusion cut (not dissolved) where a cycle
runs through a third kernel, the fast call path with static arguments, and
the thread count of each kernel from its size."""
import numpy as np
import pytest

import tracegrad as tg
from tracegrad.ir import graph as ir, passes
from tracegrad.targets.native import codegen as codegen_c

from test_native import _assert_close, _c_source, needs_cc


def projectile(v0, n):
    """benchmarks/loops.py's miss_fori: a float64[3] state, n steps."""
    dt = v0.dtype

    def body(i, s):
        x, v = s
        a = dt.type(-0.1) * v * np.sqrt(np.sum(v * v)) + np.array([0., 0., -9.8], dtype=dt)
        v = v + dt.type(0.01) * a
        x = x + dt.type(0.01) * v
        return (x, v)
    x, v = tg.fori_loop(0, n, body, (np.zeros(3, dtype=dt), v0))
    return np.sum((x - np.array([10., 0., 0.], dtype=dt)) ** 2)


@pytest.fixture(autouse=True)
def _whole(monkeypatch):
    monkeypatch.setenv("TRACEGRAD_NATIVE_WHOLE", "1")
    monkeypatch.delenv("TRACEGRAD_NUM_THREADS", raising=False)


@needs_cc
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_loop_body_kernels_are_inlined_and_unrolled(dtype):
    v0 = np.array([5., 0., 5.], dtype=dtype)
    f = tg.value_and_grad(projectile, static_argnums=(1,), backend="native")
    want = tg.value_and_grad(projectile, static_argnums=(1,), backend="numpy")(v0, 300)
    _assert_close(f(v0, 300), want, dtype)
    src = _c_source(f, v0, 300)
    assert "static inline void tg_wk" in src          # the loop bodies' kernels
    assert "#pragma GCC unroll 3" in src              # float[3]: unrolled, not a vector loop
    # sums of one block finish without the pairwise counter
    assert "one block (at most TG_BLOCK elements)" in src
    # the forward loop stores the velocities the reverse loop reads, not the
    # positions it never uses
    whole = src.split("int tg_whole(", 1)[1]
    assert whole.count("scan ys") == 1 and whole.count("));  // ys ") == 1
    body = src.split("int tg_whole(", 1)[0]
    assert "tg_pw_f64 pw" not in body and "tg_pw_f32 pw" not in body
    # top-level kernels of a large graph stay calls: only loop bodies inline
    g = tg.compile(lambda x: np.sum(np.sin(x) * 2.0), backend="native")
    xs = np.linspace(0.0, 1.0, 1000)
    assert "static inline void tg_wk" not in _c_source(g, xs)
    np.testing.assert_allclose(g(xs), np.sum(np.sin(xs) * 2.0), rtol=1e-12)


@needs_cc
def test_one_block_sum_of_negative_zeros_matches_the_numpy_target():
    # the pairwise sum's last step adds 0; a one-block sum begun at +0
    # never gives -0 either
    for n in (1, 3, 200, 256):
        x = -np.zeros(n)
        for fn in (lambda x: np.sum(x * 1.0), lambda x: np.sum(x * x)):
            got = tg.compile(fn, backend="native")(x)
            want = tg.compile(fn, backend="numpy")(x)
            assert got == want and np.signbit(got) == np.signbit(want)


def _reverse_body(n=20):
    f = tg.value_and_grad(projectile, static_argnums=(1,), backend="numpy")
    g = f.lower(np.array([5., 0., 5.]), n).graph
    for v, d in g.nodes(data=True):
        if d["op"] == "scan" and d["attrs"]["reverse"]:
            bg = ir.from_trace(d["attrs"]["body"])
            passes.optimize(bg)
            return bg
    raise AssertionError("no reverse scan")


def test_a_cycle_through_a_third_kernel_cuts_one_group_instead_of_dissolving_them():
    bg = _reverse_body()
    groups = passes.fusion_groups(bg)
    fusible = [v for v in bg.nodes if passes.fusible(bg, v)]
    # every fusible node in exactly one group, and the contracted graph acyclic
    members = [v for grp in groups for v in grp.nodes]
    assert sorted(members) == sorted(fusible)
    import networkx as nx
    unit = {v: k for k, grp in enumerate(groups) for v in list(grp.nodes) + list(grp.reductions)}
    c = nx.DiGraph()
    for a, b in bg.edges():
        ua, ub = unit.get(a, ("n", a)), unit.get(b, ("n", b))
        if ua != ub:
            c.add_edge(ua, ub)
    assert nx.is_directed_acyclic_graph(c)
    # before the cut the [3]-shaped chain of the adjoint fell apart into one
    # kernel per node: now it stays one kernel (with the sum it feeds)
    assert max(len(grp.nodes) for grp in groups) >= 5
    assert len(groups) <= len(fusible) // 2
    # the cut groups compute the NumPy target's values
    v0 = np.array([5., 0., 5.])
    for whole in ("1", "0"):
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("TRACEGRAD_NATIVE_WHOLE", whole)
            if not _have_cc():
                continue
            got = tg.value_and_grad(projectile, static_argnums=(1,), backend="native")(v0, 20)
            want = tg.value_and_grad(projectile, static_argnums=(1,), backend="numpy")(v0, 20)
            _assert_close(got, want, np.float64)


def _have_cc():
    from test_native import HAVE_CC
    return HAVE_CC


def test_calls_with_static_ints_take_the_fast_path():
    calls = []

    def f(x, n, scale):
        calls.append(n)
        return np.sum(x * n) * (2.0 if scale else 1.0)
    g = tg.value_and_grad(f, static_argnums=(1, 2), backend="numpy")
    x = np.arange(3.0)
    assert g(x, 2, True)[0] == 12.0 and g(x, 3, True)[0] == 18.0
    traced = len(calls)
    hits = tg.cache_info()["memory_hits"]
    for _ in range(3):
        assert g(x, 2, True)[0] == 12.0 and g(x, 3, True)[0] == 18.0
    assert len(calls) == traced                       # no new trace
    assert tg.cache_info()["memory_hits"] - hits == 6
    # 1 and True, 2 and 2.0: equal values of other types are other signatures
    assert g(x, 2, 1)[0] == 12.0 and g(x, 2, 0)[0] == 6.0 and g(x, 2, False)[0] == 6.0
    assert g(x, 2.0, True)[0] == 12.0
    np.testing.assert_array_equal(g(x, 3, False)[1], np.full(3, 3.0))
    # an unhashable static takes the general path and its error
    with pytest.raises(TypeError, match="unhashable"):
        g(x, [2], True)


@needs_cc
def test_thread_count_of_a_kernel_follows_its_size(monkeypatch):
    monkeypatch.setenv("TRACEGRAD_NUM_THREADS", "4")
    lo, lo_math = codegen_c.PARALLEL_MIN, codegen_c.PARALLEL_MIN_MATH
    for n, fn, want in ((lo - 1, lambda x: x * 2 + 1, None),
                        (lo, lambda x: x * 2 + 1, 2),
                        (4 * lo, lambda x: x * 2 + 1, 8),
                        (lo_math, lambda x: np.sin(x) * 2, 2),
                        (lo_math * 3 // 2, lambda x: np.sum(np.exp(x)), 3)):
        x = np.linspace(-1.0, 1.0, n)
        f = tg.compile(fn, backend="native", dynamic=False)     # sizes as literals
        src = _c_source(f, x)
        if want is None:
            assert "#pragma omp parallel" not in src
        else:
            assert f", TG_THREADS({want}), &tg_t0);" in src, (n, want)
            assert "num_threads(tg_nt) if(tg_nt > 1)" in src
        np.testing.assert_allclose(f(x), tg.compile(fn, backend="numpy")(x), rtol=1e-12,
                                   atol=1e-13)


@needs_cc
@pytest.mark.parametrize("threads", ["1", "2", "3"])
def test_threaded_sums_do_not_depend_on_the_thread_count(monkeypatch, threads):
    # dynamic schedule, block sums added in block order: the same bits
    n = 2 * codegen_c.PARALLEL_MIN_MATH + 4099
    x = np.linspace(-1.0, 2.0, n)
    monkeypatch.setenv("TRACEGRAD_NUM_THREADS", "1")
    one = tg.value_and_grad(lambda x: np.sum(np.sin(x) * x), backend="native")(x)
    monkeypatch.setenv("TRACEGRAD_NUM_THREADS", threads)
    f = tg.value_and_grad(lambda x: np.sum(np.sin(x) * x), backend="native")
    for _ in range(3):
        got = f(x)
        assert got[0] == one[0]
        np.testing.assert_array_equal(got[1], one[1])


_ADAPT = r"""
#include "native_helpers.h"
#include <stdio.h>
static tg_par p;
static void calls(int n, long long par_ns, long long solo_ns)
{
    for (int c = 0; c < n; c++) {
        long long t0;
        const int nt = tg_par_threads(&p, 2, &t0);
        tg_par_done(&p, 2, nt, t0 - (nt > 1 ? par_ns : solo_ns));   /* a call of that long */
        putchar(nt > 1 ? 'T' : '1');
    }
    putchar(' ');
}
static void pause_ms(long ms)
{
    struct timespec t = {0, ms * 1000000L};
    nanosleep(&t, NULL);
}
int main(void)
{
    calls(8, 1000000, 2000000);      /* threads pay: 1 ms against 2 ms */
    calls(8, 3000000, 2000000);      /* load arrives: the threads take 3 ms */
    pause_ms(300);                   /* past the next try (100 x 2 ms) */
    calls(3, 3000000, 2000000);      /* a try on threads: still slower */
    pause_ms(700);                   /* past the next try (twice as late) */
    calls(3, 1000000, 2000000);      /* a try: threads pay again */
    putchar('\n');
    return 0;
}
"""


@needs_cc
def test_a_threaded_kernel_runs_the_faster_way_and_tries_the_other_now_and_then(tmp_path):
    import subprocess
    from tracegrad.runtime import toolchain
    from test_native import _have_openmp
    if not _have_openmp():
        pytest.skip("the C compiler has no OpenMP")
    from tracegrad.targets import templates
    # native_helpers.h as the code generator pastes it (its includes rendered)
    (tmp_path / "native_helpers.h").write_text(
        templates.environment().get_template("native_helpers.h").render())
    helpers = str(tmp_path)
    (tmp_path / "adapt.c").write_text(_ADAPT)
    cc = toolchain.recipe()["cc"]
    subprocess.run([*cc, "-O2", "-std=gnu11", "-fopenmp", "-DTG_NUM_THREADS=2", "-I", helpers,
                    str(tmp_path / "adapt.c"), "-o", str(tmp_path / "adapt"), "-lm"],
                   check=True)
    out = subprocess.run([str(tmp_path / "adapt")], capture_output=True, text=True,
                         check=True).stdout.split()
    # first call starts the threads (not counted), then each way once, then the faster
    assert out[0] == "TT1TTTTT"
    # 3 ms on threads: the smoothed time passes one thread's 2 ms after a few calls
    assert out[1].startswith("T") and out[1].endswith("111") and "1T" not in out[1]
    assert out[2] == "T11"             # the try: threads still slower, back to one thread
    assert out[3] == "TTT"             # the try: threads faster again, and kept
