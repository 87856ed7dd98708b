"""Size plans (runtime.shape_plan, docs/native.md "Sizes as parameters"):
after the first size of a structure, a new size passes the plan's guards
and takes its module with its own numbers: no trace of the pipeline, no
compiler, the values of the ordinary path."""
import subprocess

import numpy as np
import pytest

import tracegrad as tg
from tracegrad import api
from tracegrad.ops import symbolic
from tracegrad.runtime import pipeline, shape_plan, toolchain


def chain(x, y):
    h = np.tanh(x) * np.sin(y) + x * y
    return np.sum(h * h)


# a plan's module takes its sizes through the extension entry
needs_native = pytest.mark.skipif(
    (toolchain.recipe_or_none() or {}).get("entry") != "python",
    reason="size plans need a C compiler and the extension entry (Python's and NumPy's headers)")


@pytest.fixture(autouse=True)
def _fresh(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACEGRAD_CACHE_DIR", str(tmp_path / "cache"))
    tg.clear_cache(disk=False)
    yield
    tg.clear_cache(disk=False)


class _NoPipeline:
    """Fails the test if the transform or a C compiler runs."""

    def __enter__(self):
        self._transform, self._popen, self._run = pipeline.transform, subprocess.Popen, \
            subprocess.run

        def no_transform(*a, **k):
            raise AssertionError("the pipeline ran for a size its plan serves")

        class NoCompiler(subprocess.Popen):
            def __init__(self, *a, **k):
                raise AssertionError(f"a process started: {a[0] if a else k}")
        pipeline.transform = no_transform
        subprocess.Popen = subprocess.run = NoCompiler
        return self

    def __exit__(self, *exc):
        pipeline.transform, subprocess.Popen, subprocess.run = \
            self._transform, self._popen, self._run


@needs_native
def test_a_new_size_runs_neither_the_pipeline_nor_the_compiler():
    vg = tg.value_and_grad(chain, argnums=(0, 1), backend="native")
    want = tg.value_and_grad(chain, argnums=(0, 1), backend="numpy")
    rng = np.random.default_rng(0)
    for n in (2000, 1993):          # the second makes the plan
        x, y = rng.standard_normal(n), rng.standard_normal(n)
        np.testing.assert_allclose(vg(x, y)[0], want(x, y)[0], rtol=1e-12)
    before = tg.cache_info()["size_plans"]
    sizes = (1000, 777, 4096, 30_000)
    with _NoPipeline():
        got = {n: vg(*(xy := (rng.standard_normal(n), rng.standard_normal(n)))) + xy
               for n in sizes}
    assert tg.cache_info()["size_plans"] - before == len(sizes)
    for n, (v, g, x, y) in got.items():
        wv, wg = want(x, y)
        np.testing.assert_allclose(v, wv, rtol=1e-12)
        for a, b in zip(g, wg):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-15)
            assert a.shape == (n,)


@needs_native
def test_a_size_its_guards_refuse_takes_the_ordinary_path():
    vg = tg.value_and_grad(chain, argnums=(0, 1), backend="native")
    want = tg.value_and_grad(chain, argnums=(0, 1), backend="numpy")
    rng = np.random.default_rng(1)
    # 2 and 3 elements: no longer sizes of 2 or more everywhere (a slice of
    # one), or sizes the plan's decisions did not cover: values as before
    for n in (900, 901, 902, 3, 2, 5_000_000 // 50):
        x, y = rng.standard_normal(n), rng.standard_normal(n)
        got, w = vg(x, y), want(x, y)
        np.testing.assert_allclose(got[0], w[0], rtol=1e-12)
        for a, b in zip(got[1], w[1]):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-15)


def test_symbols_record_formulas_guards_and_markers():
    rec = symbolic.Recording()
    prev = symbolic.ACTIVE.rec
    symbolic.ACTIVE.rec = rec
    try:
        n, m = rec.symbol(200), rec.symbol(64)
        k = n * m + 1
        assert k > 5 and not (n == m)
        text = f"for (i = 0; i < {k}LL; i++)"
        threads = symbolic.if_less(n, 100, 1, symbolic.larger(2, n // 50))
        assert threads.hint == 4
        assert hash(n) == hash(m)           # every symbol hashes alike (compared, guarded)
        assert int(m) == 64                 # a plain int: the size is specialised
    finally:
        symbolic.ACTIVE.rec = prev
    assert text.startswith("for (i = 0; i < @TG0@LL")
    assert rec.guards == {"(s1 > 5)": True, "(v[0] == v[1])": False, "(v[1] == 64)": True}
    # outside its recording a symbol is its hint in every way
    assert str(k) == "12801" and k * 2 == 25602 and f"{n:>5}" == "  200"


def test_a_number_glued_to_a_name_is_no_hole():
    # a size written into an identifier cannot be read at run time: no plan
    rec = symbolic.Recording()
    prev = symbolic.ACTIVE.rec
    symbolic.ACTIVE.rec = rec
    try:
        n = rec.symbol(40)
        src = f"static double buf{n}[{n}];\nvoid f(void) {{ double t = buf{n}[0]; }}\n"
    finally:
        symbolic.ACTIVE.rec = prev
    with pytest.raises(shape_plan.NoPlan):
        shape_plan._c_template(src, shape_plan._Formulas(rec))


def mlp(W1, b1, W2, b2, X, Y):
    h = np.tanh(X @ W1 + b1)
    return np.mean((h @ W2 + b2 - Y) ** 2)


@needs_native
def test_a_new_batch_size_of_an_mlp_with_a_mean():
    # the mean's count (a constant of the trace) is a size of the plan too
    rng = np.random.default_rng(3)
    params = [rng.standard_normal((8, 32)) * 0.3, rng.standard_normal(32),
              rng.standard_normal((32, 3)) * 0.3, rng.standard_normal(3)]
    vg = tg.value_and_grad(mlp, argnums=(0, 1, 2, 3), backend="native")
    want = tg.value_and_grad(mlp, argnums=(0, 1, 2, 3), backend="numpy")

    def batch(b):
        return params + [rng.standard_normal((b, 8)), rng.standard_normal((b, 3))]
    for b in (50, 47):
        vg(*batch(b))
    before = tg.cache_info()["size_plans"]
    args = {b: batch(b) for b in (44, 45, 61, 100)}
    with _NoPipeline():
        got = {b: vg(*a) for b, a in args.items()}
    assert tg.cache_info()["size_plans"] - before == len(args)
    for b, a in args.items():
        wv, wg = want(*a)
        np.testing.assert_allclose(got[b][0], wv, rtol=1e-12)
        for x, y in zip(got[b][1], wg):
            np.testing.assert_allclose(x, y, rtol=1e-11, atol=1e-14)


@needs_native
def test_float32_and_sizes_across_regions_keep_their_values():
    # wherever a plan serves or not (float32 constants, small and large
    # sizes on both sides of the kernels' thresholds), values are the
    # ordinary path's
    def f(x, y):
        return np.mean(np.tanh(x) * y) + np.sum(x * x) / x.shape[0]
    vg = tg.value_and_grad(f, argnums=(0, 1), backend="native")
    spec = tg.value_and_grad(f, argnums=(0, 1), backend="native", dynamic=False)
    rng = np.random.default_rng(4)
    for dt in (np.float64, np.float32):
        for n in (300, 310, 2, 3, 17, 64, 5000, 70_000, 299):
            x, y = rng.standard_normal(n).astype(dt), rng.standard_normal(n).astype(dt)
            got, w = vg(x, y), spec(x, y)
            tol = 1e-12 if dt == np.float64 else 1e-5
            np.testing.assert_allclose(got[0], w[0], rtol=tol)
            for a, b in zip(got[1], w[1]):
                assert a.dtype == b.dtype
                np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


@needs_native
def test_dynamic_false_makes_no_plan_and_a_changing_structure_few():
    rng = np.random.default_rng(5)
    spec = tg.value_and_grad(chain, argnums=(0, 1), backend="native", dynamic=False)
    before = tg.cache_info()["size_plans"]
    for n in (100, 110, 120):
        spec(rng.standard_normal(n), rng.standard_normal(n))
    assert tg.cache_info()["size_plans"] == before

    def g(x):       # a constant of the size's own values: a new structure every size
        return np.sum(np.sin(x) * np.arange(x.shape[0]))
    vg = tg.grad(g, backend="native")
    for n in (100, 101, 102, 103, 104, 105):
        x = rng.standard_normal(n)
        np.testing.assert_allclose(vg(x), np.cos(x) * np.arange(n), rtol=1e-12)
    plans = [t.plans for per in api._TABLES.values()
             for t in per.values() if any(True for _ in t.plans)]
    assert all(len(p) <= 3 for p in plans)
