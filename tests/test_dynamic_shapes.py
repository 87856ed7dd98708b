"""Generic sizes on the native target (issue 29, item 2; docs/native.md,
"Generic sizes"): a function whose C text at a new size differs from an
earlier size's only in numbers is served by one generic C build, whose
numbers are read at run time.

* every registry row (the cases of tests/test_ops_registry.py, grouped a
  few to a function) gives the same values and gradients through generic
  code as through code specialised to each size;
* a third size does not invoke the C compiler (subprocess is watched);
* ``dynamic=True`` is generic from the first call, ``dynamic=False``
  never; a text whose numbers the template keeps as literals, or whose
  structure differs (another fusion, the heap instead of the stack), gets a
  build of its own; a generic text that does not build falls back to the
  size's own C.
"""
from __future__ import annotations

import subprocess
import threading
import warnings

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.ops.primitives import REGISTRY, bind
from tracegrad.runtime import pipeline, toolchain
from tracegrad.targets.native import generic

from test_ops_registry import CASES, Rand, _rng

needs_cc = pytest.mark.skipif(toolchain.recipe_or_none() is None,
                              reason="the native target needs a C compiler")
# generic modules take their sizes through the extension entry
needs_entry = pytest.mark.skipif(
    (toolchain.recipe_or_none() or {}).get("entry") != "python",
    reason="generic sizes need the extension entry (Python's and NumPy's headers)")


@pytest.fixture(autouse=True)
def _fresh(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACEGRAD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TRACEGRAD_BACKEND", raising=False)
    tg.clear_cache(disk=False)      # the registry of C texts too
    yield
    tg.clear_cache(disk=False)


class _NoCompiler:
    """Fails the test if anything starts a process (the C compiler) inside."""

    def __enter__(self):
        self.calls = []
        self._run, self._popen = subprocess.run, subprocess.Popen

        def refuse(*a, **k):
            self.calls.append(a[0] if a else k.get("args"))
            raise AssertionError(f"the C compiler was started: {self.calls[-1]}")
        subprocess.run = refuse
        subprocess.Popen = refuse
        return self

    def __exit__(self, *exc):
        subprocess.run, subprocess.Popen = self._run, self._popen


def chain(x, y):
    return np.sum(np.tanh(x) * np.exp(-y ** 2) + np.log1p(x ** 2) * np.sin(y))


def mlp(W1, b1, W2, b2, X, Y):
    h = np.tanh(X @ W1 + b1)
    return np.mean((h @ W2 + b2 - Y) ** 2)


def _mlp_args(B, rng=None):
    rng = rng or np.random.default_rng(B)
    return (rng.standard_normal((8, 32)) * 0.1, rng.standard_normal(32),
            rng.standard_normal((32, 3)) * 0.1, rng.standard_normal(3),
            rng.standard_normal((B, 8)), rng.standard_normal((B, 3)))


def _leaves(x):
    if isinstance(x, (tuple, list)):
        return [y for e in x for y in _leaves(e)]
    return [np.asarray(x)]


def _same(got, want, rtol=1e-12):
    """Generic and specialised C: the same statements, so equal but for what
    the compiler may do differently with a literal (a vector loop's
    remainder, a sum's reassociation within its blocks)."""
    g, w = _leaves(got), _leaves(want)
    assert len(g) == len(w)
    for a, b in zip(g, w):
        assert a.shape == b.shape and a.dtype == b.dtype
        if b.dtype.kind != "f":
            assert np.array_equal(a, b)
            continue
        scale = max(1.0, float(np.max(np.abs(b[np.isfinite(b)]), initial=0.0)))
        np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * scale, equal_nan=True)


def _generic_source(f, *args):
    """Would a build of this signature now be generic (the registry as it is)?"""
    return "\n_lib, _ENTRY = _builder.shared_library(" in f.lower(*args).source


def _loaded_generic(f, *args):
    """Does the loaded code of this signature use a generic C module?"""
    shapes = [np.shape(a) for a in args]
    for e in f._fast.values():
        avals = getattr(e, "in_avals", None)
        if avals is not None and [tuple(a.shape) for a in avals][:len(shapes)] == shapes:
            return "_tg_enter" in e.ns
    raise AssertionError(f"no signature {shapes} was built")


# --- every registry row ------------------------------------------------------------------

SIZES = (100, 150, 200)     # past the one-block and unrolled kernels' sizes
TINY = 5


def _sized(case, s):
    """The case's operands with every dimension 4 made ``s`` (its constants
    as they are), or None where the row's impl refuses those shapes (an
    index array, a mask or a shape attribute tied to the size)."""
    rng = _rng(case)
    vals = []
    for op in case.operands:
        if isinstance(op, Rand):
            shape = tuple(s if d == 4 else d for d in op.shape)
            try:
                vals.append(Rand(shape, op.lo, op.hi, op.make).draw(rng))
            except ValueError:      # the operand's maker is tied to its size
                return None
        else:
            vals.append(op.value)
    try:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            REGISTRY[case.prim].impl(np, *vals, **case.attrs)
    except Exception:   # noqa: BLE001 -- the row's own shape checks: not a size it takes
        return None
    return vals


def _group_function(cases):
    """A function of every random operand of ``cases`` returning (loss, aux):
    the loss sums tanh of each float output, aux holds the other outputs."""
    def f(*xs):
        it = iter(xs)
        loss, aux = 0.0, []
        for case in cases:
            ops = [next(it) if isinstance(op, Rand) else op.value for op in case.operands]
            out = bind(REGISTRY[case.prim], *ops, **case.attrs)
            for o in (out if isinstance(out, (tuple, list)) else (out,)):
                if np.dtype(o.dtype).kind == "f":
                    loss = loss + np.sum(np.tanh(o))
                else:
                    aux.append(o)
        return loss, tuple(aux)
    return f


# random_draw bound directly is refused while tracing (draws compile from the
# np.random calls of user code, tests/test_random.py)
_LEFT_OUT = {"random_draw"}
ROW_CASES = [c for c in CASES if c.prim not in _LEFT_OUT]
GROUPS = [ROW_CASES[i:i + 8] for i in range(0, len(ROW_CASES), 8)]


@needs_cc
@needs_entry
@pytest.mark.parametrize("cases", GROUPS, ids=[f"{g[0].id}..{g[-1].id}" for g in GROUPS])
def test_every_row_generic_equals_specialised(cases):
    f = _group_function(cases)
    varying = [c for c in cases if all(_sized(c, s) is not None for s in SIZES)]
    args_at = {}
    for s in SIZES:
        vals = []
        for c in cases:
            sized = _sized(c, s) if c in varying else _sized(c, 4)
            vals += [v for op, v in zip(c.operands, sized) if isinstance(op, Rand)]
        args_at[s] = vals
    n = len(args_at[SIZES[0]])
    if n == 0:
        pytest.skip("no differentiable operand in this group")
    argnums = tuple(range(n))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        auto = tg.value_and_grad(f, argnums=argnums, has_aux=True, backend="native")
        forced = tg.value_and_grad(f, argnums=argnums, has_aux=True, backend="native",
                                   dynamic=True)
        spec = tg.value_and_grad(f, argnums=argnums, has_aux=True, backend="native",
                                 dynamic=False)
        generic_used, made = 0, pipeline.SIZES.made
        planned = tg.cache_info()["size_plans"]
        for s in SIZES:
            want = spec(*args_at[s])
            assert not _generic_source(spec, *args_at[s])
            for g in (auto, forced):
                _same(g(*args_at[s]), want)
                generic_used += _loaded_generic(g, *args_at[s])
        # a few elements in the generic structure (threaded form on one
        # thread, sums in blocks, no unrolled loops, heap buffers), against
        # the NumPy target (no build of its own)
        tiny = []
        for c in cases:
            sized = (_sized(c, TINY) if c in varying else None) or _sized(c, 4)
            tiny += [v for op, v in zip(c.operands, sized) if isinstance(op, Rand)]
        got = auto(*tiny)
        assert tg.cache_info()["target"] == "native"
        numpy_target = tg.value_and_grad(f, argnums=argnums, has_aux=True, backend="numpy")
        _same(got, numpy_target(*tiny), rtol=1e-10)
    # a generic text made for these sizes, or a size plan, serves them (none
    # is made where the C is the same at every size, or its structure changes
    # with the size)
    assert (generic_used > 0) == (pipeline.SIZES.made > made or
                                  tg.cache_info()["size_plans"] > planned)
    assert not pipeline.SIZES.refused


# --- no compiler for a third size ---------------------------------------------------------

@needs_cc
@needs_entry
@pytest.mark.parametrize("whole", ["1", "0"])
def test_a_third_size_does_not_invoke_the_compiler(whole, monkeypatch):
    monkeypatch.setenv("TRACEGRAD_NATIVE_WHOLE", whole)
    vg = tg.value_and_grad(chain, argnums=(0, 1), backend="native")
    ref = tg.value_and_grad(chain, argnums=(0, 1), backend="native", dynamic=False)
    rng = np.random.default_rng(0)
    for n in (1000, 1300):              # the second size builds the generic C
        x, y = rng.standard_normal(n), rng.standard_normal(n)
        _same(vg(x, y), ref(x, y))
    assert not _loaded_generic(vg, np.ones(1000), np.ones(1000))
    assert _loaded_generic(vg, np.ones(1300), np.ones(1300))
    sizes = (1700, 2500, 4000, 1001)
    data = [(rng.standard_normal(n), rng.standard_normal(n)) for n in sizes]
    got = []
    with _NoCompiler():
        for x, y in data:
            got.append(vg(x, y))
            assert tg.cache_info()["target"] == "native"
    for (x, y), g in zip(data, got):
        assert _loaded_generic(vg, x, y)
        _same(g, ref(x, y))
        want = tg.value_and_grad(chain, argnums=(0, 1), backend="numpy")(x, y)
        _same(g, want, rtol=1e-12 * 100)


@needs_cc
@needs_entry
def test_a_new_batch_size_of_an_mlp_does_not_invoke_the_compiler():
    # the driver structure (matrix products stay NumPy calls): the kernels'
    # sizes and the mean's 1/n are the generic numbers; the widths stay literals
    vg = tg.value_and_grad(mlp, argnums=(0, 1, 2, 3), backend="native")
    ref = tg.value_and_grad(mlp, argnums=(0, 1, 2, 3), backend="native", dynamic=False)
    for B in (64, 48):
        _same(vg(*_mlp_args(B)), ref(*_mlp_args(B)))
    src = vg.lower(*_mlp_args(48)).source
    assert "tg_f[0]" in src               # the mean's 1/(B*3): read at run time
    with _NoCompiler():
        got = {B: vg(*_mlp_args(B)) for B in (40, 57, 33)}
    for B, g in got.items():
        _same(g, ref(*_mlp_args(B)))


@needs_cc
@needs_entry
def test_dynamic_true_is_generic_at_once_and_false_never():
    rng = np.random.default_rng(1)
    vt = tg.value_and_grad(chain, argnums=(0, 1), backend="native", dynamic=True)
    vf = tg.value_and_grad(chain, argnums=(0, 1), backend="native", dynamic=False)
    x, y = rng.standard_normal(700), rng.standard_normal(700)
    _same(vt(x, y), vf(x, y))
    assert _loaded_generic(vt, x, y) and not _loaded_generic(vf, x, y)
    x2, y2 = rng.standard_normal(900), rng.standard_normal(900)
    with _NoCompiler():
        g2 = vt(x2, y2)                   # the second size: no build
    _same(g2, vf(x2, y2))
    for n in (901, 902):
        assert not _generic_source(vf, np.ones(n), np.ones(n))
    # the setting is part of the key: the three never share an entry
    keys = {f.lower(x, y).key for f in (vt, vf, tg.value_and_grad(chain, argnums=(0, 1),
                                                                  backend="native"))}
    assert len(keys) == 3
    with pytest.raises(TypeError, match="dynamic must be"):
        tg.compile(chain, dynamic="yes")


@needs_cc
@needs_entry
def test_tg_compile_dynamic_keyword_and_the_numpy_target():
    f = tg.compile(lambda x: np.tanh(x) * 2.0 + x.sum(), dynamic=True, backend="native")
    for n in (300, 400, 500):
        x = np.linspace(-1, 1, n)
        np.testing.assert_allclose(f(x), np.tanh(x) * 2.0 + x.sum(), rtol=1e-12, atol=1e-12)
    # the NumPy target has no sizes to make generic: the keyword changes nothing there
    g = tg.compile(lambda x: np.tanh(x) * 2.0, dynamic=True, backend="numpy")
    np.testing.assert_array_equal(g(np.ones(3)), np.tanh(np.ones(3)) * 2.0)


# --- when the generic C does not serve ----------------------------------------------------

@needs_cc
@needs_entry
def test_a_structural_change_gets_its_own_build():
    # y of one element broadcasts: another graph, so another skeleton and
    # another build, with right values
    def f(x, y):
        return np.sum(np.tanh(x)[1:] * y[:-1])
    vg = tg.value_and_grad(f, argnums=(0, 1), backend="native")
    want = tg.value_and_grad(f, argnums=(0, 1), backend="numpy")
    for n, m in ((500, 500), (600, 600), (700, 2)):
        x, y = np.linspace(-2, 2, n), np.linspace(-1, 3, m)
        _same(vg(x, y), want(x, y), rtol=1e-11)
    assert _loaded_generic(vg, np.ones(600), np.ones(600))
    assert not _loaded_generic(vg, np.ones(700), np.ones(2))


@needs_cc
@needs_entry
def test_the_structure_stays_across_sizes():
    # from the second size on, no choice of the C is made from a size (the
    # stack or the heap, threads, one block or several, unrolled loops, row
    # blocks): the sizes from 3 to 3e5 elements, on both sides of every
    # threshold, are served by the one generic build
    def f(x):
        return np.sum(np.tanh(x)[1:] * x[:-1])
    vg = tg.value_and_grad(f, backend="native")
    want = tg.value_and_grad(f, backend="numpy")
    for n in (500, 600):
        x = np.linspace(-2, 2, n)
        _same(vg(x), want(x), rtol=1e-11)
    sizes = (3, 9, 200, 300, 17_000, 60_000, 300_000)
    with _NoCompiler():
        got = [vg(np.linspace(-2, 2, n)) for n in sizes]
    for n, g in zip(sizes, got):
        x = np.linspace(-2, 2, n)
        assert _loaded_generic(vg, x)
        _same(g, want(x), rtol=1e-11)


@needs_cc
@needs_entry
def test_a_number_the_template_keeps_is_a_mismatch():
    # x * c with c a static argument: a number in the C that differs between
    # the first two calls (the size stays) becomes a hole; a later text that
    # differs in a number the template keeps as a literal is not served by it
    def f(x, c):
        return np.sum(np.sin(x) * c)
    vg = tg.value_and_grad(f, backend="native", static_argnums=(1,))
    x = np.linspace(0, 1, 300)
    for c in (2.0, 3.0, 5.0):
        _same(vg(x, c), (np.sum(np.sin(x) * c), np.cos(x) * c))
    # now the size differs too: the generic structure, its template made
    # against the first size at c = 7.0, which stays a literal
    x4 = np.linspace(0, 1, 400)
    _same(vg(x4, 7.0), (np.sum(np.sin(x4) * 7.0), np.cos(x4) * 7.0))
    assert _loaded_generic(vg, x4)
    x5 = np.linspace(0, 1, 500)     # another c: a mismatch, a new, wider template
    _same(vg(x5, 11.0), (np.sum(np.sin(x5) * 11.0), np.cos(x5) * 11.0))
    assert _loaded_generic(vg, x5)
    x6 = np.linspace(0, 1, 600)     # both read at run time now: no build
    with _NoCompiler():
        got = vg(x6, 13.0)
    _same(got, (np.sum(np.sin(x6) * 13.0), np.cos(x6) * 13.0))


def test_templates_match_only_their_own_numbers():
    a = generic.Text("void k(double* o) {\n    for (long long i = 0; i < 100LL; i++)\n"
                     "        o[i] = 2.0 * i;  // [100]\n}\n")
    b = generic.Text(a_src := "void k(double* o) {\n    for (long long i = 0; i < 150LL; i++)\n"
                     "        o[i] = 2.0 * i;  // [150]\n}\n")
    c = generic.Text(a_src.replace("150LL", "170LL").replace("2.0", "3.0"))
    d = generic.Text(a_src.replace("150LL", "170LL").replace("i++", "i += 2"))
    holes = generic.holes_between([a, b])
    assert [a.nums[i] for i in sorted(holes)] == ["100LL"]
    tp = generic.Template(a, holes, [b])
    assert tp.values(b) == ([150], [])
    assert tp.values(c) is None          # 2.0 is a literal of the template
    assert tp.values(d) is None          # another skeleton
    assert "i < tg_d[0]" in tp.source and "// [?]" in tp.source
    # numbers on preprocessor lines are never holes
    p = generic.Text("#pragma GCC unroll 4\nint x = 4;\n")
    q = generic.Text("#pragma GCC unroll 5\nint x = 5;\n")
    assert generic.holes_between([p, q]) is None


@needs_cc
@needs_entry
def test_a_generic_text_that_does_not_build_falls_back(monkeypatch, caplog):
    real = generic.Template._render

    def broken(self):
        return real(self) + "\nthis is not C;\n"
    monkeypatch.setattr(generic.Template, "_render", broken)
    vg = tg.value_and_grad(chain, argnums=(0, 1), backend="native")
    rng = np.random.default_rng(2)
    for n in (500, 800, 900):
        x, y = rng.standard_normal(n), rng.standard_normal(n)
        want = tg.value_and_grad(chain, argnums=(0, 1), backend="numpy")(x, y)
        _same(vg(x, y), want, rtol=1e-10)
        assert tg.cache_info()["target"] == "native"
    assert pipeline.SIZES.refused
    assert not any(_loaded_generic(vg, np.ones(n), np.ones(n)) for n in (500, 800, 900))


# --- sharing ----------------------------------------------------------------------------------

@needs_cc
@needs_entry
def test_threads_calling_one_generic_module_with_different_sizes():
    vg = tg.value_and_grad(chain, argnums=(0, 1), backend="native", dynamic=True)
    rng = np.random.default_rng(4)
    data = {n: (rng.standard_normal(n), rng.standard_normal(n)) for n in (20_000, 30_000, 50_000)}
    want = {n: tg.value_and_grad(chain, argnums=(0, 1), backend="numpy")(*xy)
            for n, xy in data.items()}
    for n, xy in data.items():
        vg(*xy)     # built (one generic object) before the threads start
    errors = []

    def work(n):
        try:
            for _ in range(30):
                _same(vg(*data[n]), want[n], rtol=1e-10)
        except Exception as e:  # noqa: BLE001 -- reported below, in the test's thread
            errors.append(e)
    threads = [threading.Thread(target=work, args=(n,)) for n in data for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


@needs_cc
@needs_entry
def test_per_size_entries_load_from_disk_without_a_build():
    vg = tg.value_and_grad(chain, argnums=(0, 1), backend="native", dynamic=True)
    rng = np.random.default_rng(5)
    data = {n: (rng.standard_normal(n), rng.standard_normal(n)) for n in (600, 700)}
    first = {n: vg(*xy) for n, xy in data.items()}
    tg.clear_cache(disk=False)          # this process forgets; the disk keeps the entries
    with _NoCompiler():
        for n, xy in data.items():
            _same(tg.value_and_grad(chain, argnums=(0, 1), backend="native",
                                    dynamic=True)(*xy), first[n], rtol=0)
    # each size from the disk, or (a size after the first of its structure)
    # from the function's size plan, which this process still holds
    info = tg.cache_info()
    assert info["disk_hits"] + info["size_plans"] >= 2


@needs_cc
@needs_entry
def test_a_new_size_after_sizes_loaded_from_disk_does_not_invoke_the_compiler():
    # a new process finds the first two sizes' entries on disk, so it made
    # no template of its own: the new size's C is compared with the first
    # call's sizes (traced once more), which gives the template built before
    rng = np.random.default_rng(6)
    data = [(rng.standard_normal(n), rng.standard_normal(n)) for n in (600, 700, 500, 900)]
    vg = tg.value_and_grad(chain, argnums=(0, 1), backend="native")
    want = [vg(*xy) for xy in data[:2]]
    tg.clear_cache(disk=False)          # this process forgets; the disk keeps the entries
    vg = tg.value_and_grad(chain, argnums=(0, 1), backend="native")
    with _NoCompiler():
        for xy, w in zip(data, want):
            _same(vg(*xy), w, rtol=0)
        got = [vg(*xy) for xy in data[2:]]
    for xy, g in zip(data[2:], got):
        assert _loaded_generic(vg, *xy)
        _same(g, tg.value_and_grad(chain, argnums=(0, 1), backend="numpy")(*xy), rtol=1e-12 * 100)
