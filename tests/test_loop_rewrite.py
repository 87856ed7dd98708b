"""Python ``for ... in range(...)`` loops rewritten into scan nodes before
they run (tracegrad.frontend.loop_rewrite): tracing no longer grows with the trip
count, and nothing the loop computes changes."""
import numpy as np
import pytest

import tracegrad as tg
from tracegrad.frontend import loop_rewrite

RTOL = 1e-12
V0 = np.array([5., 0., 5.])
G = np.array([0., 0., -9.8])
TARGET = np.array([10., 0., 0.])

CALLS = [0]


def _accel(v):
    CALLS[0] += 1
    return -0.1 * v * np.sqrt(np.sum(v * v)) + G


def miss(v0, n):
    x = np.zeros(3)
    v = v0
    for _ in range(n):
        a = _accel(v)
        v = v + 0.01 * a
        x = x + 0.01 * v
    return np.sum((x - TARGET) ** 2)


def _as_written(fn, *args, **kw):
    """fn's gradient with neither rewriting nor rolling (the unrolled graph)."""
    import os
    old = os.environ.get("TRACEGRAD_ROLL")
    os.environ["TRACEGRAD_ROLL"] = "0"
    try:
        return tg.value_and_grad(fn, **kw)(*args)
    finally:
        if old is None:
            del os.environ["TRACEGRAD_ROLL"]
        else:
            os.environ["TRACEGRAD_ROLL"] = old


def _ops(g):
    return [d["op"] for _, d in g.nodes(data=True)]


def _rewritten(fn, *args, **kw):
    return "scan" in _ops(tg.value_and_grad(fn, **kw).lower(*args).graph)


@pytest.fixture
def small_loops(monkeypatch):
    """Rewrite loops from 16 recorded ops on (256 by default)."""
    monkeypatch.setattr(loop_rewrite, "ROLL_MIN_NODES", 16)


def test_the_projectile_traces_a_few_iterations_whatever_n():
    f = tg.value_and_grad(miss, static_argnums=(1,))
    sizes = {}
    for n in (300, 100_000):
        CALLS[0] = 0
        g = f.lower(V0, n).graph
        # two iterations as written, two traces of the body, the last iteration
        assert CALLS[0] <= 6, CALLS[0]
        sizes[n] = g.number_of_nodes()
        assert "scan" in _ops(g)
    assert sizes[300] == sizes[100_000]
    v, g = f(V0, 300)
    v_ref, g_ref = _as_written(miss, V0, 300, static_argnums=(1,))
    np.testing.assert_allclose(v, v_ref, rtol=RTOL)
    np.testing.assert_allclose(g, g_ref, rtol=RTOL)
    np.testing.assert_allclose(v, miss(V0, 300), rtol=RTOL)


def test_the_explain_log_names_rewritten_loops(monkeypatch, capsys):
    monkeypatch.setenv("TRACEGRAD_EXPLAIN", "1")
    tg.grad(miss, static_argnums=(1,)).lower(V0, 500)
    err = capsys.readouterr().err
    assert "rewrote the Python loop at test_loop_rewrite.py:" in err and "497 iterations" in err


def test_rewriting_is_off_with_rolling(monkeypatch):
    monkeypatch.setenv("TRACEGRAD_ROLL", "0")
    assert loop_rewrite.rewrite(miss) is None
    assert not _rewritten(miss, V0, 300, static_argnums=(1,))


def test_the_generated_code_keeps_the_users_lines():
    import inspect
    lines, first = inspect.getsourcelines(miss)
    line = first + next(k for k, s in enumerate(lines) if "v = v + 0.01 * a" in s)
    text = tg.grad(miss, static_argnums=(1,)).lower(V0, 300).text()
    assert f"test_loop_rewrite.py:{line}" in text and "__tg_" not in text


def test_the_loop_index_and_a_step(small_loops):
    x0 = np.array([0.3, -0.2, 0.9])

    def f(x, n):
        for i in range(3, n, 2):
            x = np.sin(x) * np.cos(0.01 * i) + 0.001 * i
        return np.sum(x ** 2) + i       # the loop variable keeps its last value

    assert _rewritten(f, x0, 200, static_argnums=(1,))
    v, g = tg.value_and_grad(f, static_argnums=(1,))(x0, 200)
    v_ref, g_ref = _as_written(f, x0, 200, static_argnums=(1,))
    np.testing.assert_allclose(v, f(x0, 200), rtol=RTOL)
    np.testing.assert_allclose(g, g_ref, rtol=RTOL)


def test_names_first_assigned_in_the_loop_keep_their_last_value(small_loops):
    x0 = np.array([0.3, -0.2, 0.9])

    def f(x):
        for k in range(50):
            y = np.tanh(x)
            x = x * 0.9 + 0.1 * y
        return np.sum(x) + np.sum(y ** 2) + k

    assert _rewritten(f, x0)
    v, g = tg.value_and_grad(f)(x0)
    np.testing.assert_allclose(v, f(x0), rtol=RTOL)
    np.testing.assert_allclose(g, _as_written(f, x0)[1], rtol=RTOL)


def test_an_empty_range_leaves_names_unbound_as_python_does():
    def f(x, n):
        for _ in range(n):
            y = x * 2.0
        return np.sum(y)

    with pytest.raises(UnboundLocalError):
        f(V0, 0)
    with pytest.raises(UnboundLocalError):
        tg.grad(f, static_argnums=(1,))(V0, 0)
    np.testing.assert_allclose(tg.grad(f, static_argnums=(1,))(V0, 300), 2.0)


def test_nested_loops_closures_defaults_and_branches_on_static_values(small_loops):
    scale = np.array([1.0, 0.5])
    use_drag = True

    def f(x, n=30, c=0.2):
        s = 0.0
        for _ in range(n):
            y = x
            for _ in range(20):
                y = np.tanh(y * 1.3 + x) * scale
            if use_drag:
                x = y * 0.5 + x - c * x
            else:
                x = y
            s = s + np.sum(x)
        return s

    x0 = np.array([0.1, 0.2])
    g = tg.grad(f).lower(x0).graph
    outer = [d["attrs"]["body"] for _, d in g.nodes(data=True) if d["op"] == "scan"]
    assert outer and any("scan" in [n.op for n in b.nodes] for b in outer)
    v, gr = tg.value_and_grad(f)(x0)
    np.testing.assert_allclose(v, f(x0), rtol=RTOL)
    np.testing.assert_allclose(gr, _as_written(f, x0)[1], rtol=RTOL)


def test_a_method_is_rewritten(small_loops):
    class Model:
        def __init__(self):
            self.w = np.array([0.9, 1.1])

        def loss(self, x):
            for _ in range(60):
                x = np.sin(x * self.w) + 0.05
            return np.sum(x)

    m = Model()
    x0 = np.array([0.4, 0.7])
    assert _rewritten(m.loss, x0)
    np.testing.assert_allclose(tg.value_and_grad(m.loss)(x0)[1], _as_written(m.loss, x0)[1],
                               rtol=RTOL)


def test_loops_that_must_stay_as_written(small_loops):
    x0 = np.array([0.3, -0.2, 0.9])

    def appends(x):                     # a call for its side effect
        path = []
        for _ in range(40):
            x = np.tanh(x) * 1.01
            path.append(x)
        return np.sum(np.stack(path) ** 2)

    def breaks(x):
        for k in range(40):
            x = np.tanh(x) * 1.01
            if k == 30:
                break
        return np.sum(x)

    def python_float_changes(x):        # t is a Python float: it must stay one
        t = 0.0
        for _ in range(40):
            x = np.sin(x) * np.float32(1.0) + t
            t = t + 0.01
        return np.sum(x) * t

    def index_used_as_python_int(x):    # range(i) needs a Python int
        for i in range(40):
            x = x * 0.99 + 0.001 * len(range(i))
        return np.sum(x)

    for f in (appends, breaks, python_float_changes, index_used_as_python_int):
        v, g = tg.value_and_grad(f)(x0)
        np.testing.assert_allclose(v, f(x0), rtol=RTOL, err_msg=f.__name__)
        np.testing.assert_allclose(g, _as_written(f, x0)[1], rtol=RTOL, err_msg=f.__name__)


def test_a_dtype_the_traced_index_would_change_is_traced_as_written(small_loops):
    # float32 * (Python float from a Python int) stays float32 in NumPy; with
    # a traced int64 index it would become float64: the loop is traced as written
    def f(x):
        for i in range(40):
            x = x * (1.0 - 0.001 * i)
        return x

    x = np.array([1.0, 2.0], dtype=np.float32)
    out = tg.compile(f)(x)
    assert out.dtype == f(x).dtype == np.float32
    np.testing.assert_allclose(out, f(x), rtol=1e-6)


def test_random_draws_in_the_body_stay_fresh_per_iteration(small_loops):
    def f(x):
        for _ in range(30):
            x = x * 0.9 + np.random.standard_normal(x.shape)
        return x

    x = np.zeros(3)
    np.random.seed(3)
    expect = f(x)
    c = tg.compile(f)
    np.random.seed(3)
    np.testing.assert_allclose(c(x), expect, rtol=RTOL)


def test_an_except_around_the_loop_does_not_swallow_the_retrace(small_loops):
    def f(x):
        t = 0.0
        try:
            for _ in range(40):
                x = np.sin(x) + t
                t = t + 0.5
        except Exception:
            return x * 0.0
        return x

    x = np.array([0.2, 0.4])
    np.testing.assert_allclose(tg.compile(f)(x), f(x), rtol=RTOL)


def test_errors_in_the_body_are_the_users_errors():
    def f(x):
        for _ in range(300):
            x = x + np.ones(4)     # shapes (3,) and (4,): NumPy's broadcasting error
        return np.sum(x)

    with pytest.raises(ValueError, match="broadcast"):
        tg.grad(f)(V0)


def test_loops_whose_iterations_differ(small_loops):
    x = np.array([0.3, -0.2, 0.9])
    w = np.linspace(0.5, 1.5, 30)

    def per_step_input(x):       # w[k] with a traced k: rewritten
        for k in range(30):
            x = np.sin(x * w[k]) + 0.1
        return np.sum(x)

    def two_back(x):             # two carried names: rewritten
        a, b = x, x * 1.1
        for _ in range(40):
            a, b = b, np.sin(a) + b * 0.5
        return np.sum(b)

    def growing(x):              # the shape changes every iteration: as written
        for _ in range(20):
            x = np.concatenate([x, np.sin(x[-1:])])
        return np.sum(x ** 2)

    def alternating(x):          # a branch on the traced index: as written
        for k in range(60):
            x = np.sin(x) * 1.1 if k % 2 else np.cos(x) + 0.2
        return np.sum(x)

    for f, rewritten in ((per_step_input, True), (two_back, True), (growing, False),
                         (alternating, False)):
        v, g = tg.value_and_grad(f)(x)
        np.testing.assert_allclose(v, f(x), rtol=RTOL, err_msg=f.__name__)
        np.testing.assert_allclose(g, _as_written(f, x)[1], rtol=RTOL, err_msg=f.__name__)
        body_ops = [n.op for d in tg.grad(f).lower(x).graph.nodes.values() if d["op"] == "scan"
                    for n in d["attrs"]["body"].nodes]
        assert (len(body_ops) > 0) == rewritten, f.__name__


def test_a_source_file_edited_since_import_is_not_rewritten(tmp_path, monkeypatch, capsys):
    import importlib
    import linecache
    src = ("import numpy as np\n\n"
           "def f(x):\n"
           "    for _ in range(300):\n"
           "        x = np.sin(x) * 0.5 + 0.25\n"
           "    return np.sum(x)\n")
    (tmp_path / "edited_mod.py").write_text(src)
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module("edited_mod")
    x = np.array([0.1, 0.2])
    assert _rewritten(mod.f, x)
    loop_rewrite._MEMO.clear()
    (tmp_path / "edited_mod.py").write_text(src.replace("0.25", "0.75"))
    linecache.checkcache()
    monkeypatch.setenv("TRACEGRAD_EXPLAIN", "1")
    assert loop_rewrite.rewrite(mod.f) is None        # the code in memory is not the file's
    assert "its source file changed" in capsys.readouterr().err
    np.testing.assert_allclose(tg.compile(mod.f)(x), mod.f(x), rtol=RTOL)


def test_a_function_without_source_is_traced_as_written():
    ns = {"np": np}
    exec("def f(x):\n    for _ in range(300):\n        x = np.sin(x) + 0.1\n    return np.sum(x)\n",
         ns)
    assert loop_rewrite.rewrite(ns["f"]) is None
    x = np.array([0.1, 0.2])
    np.testing.assert_allclose(tg.grad(ns["f"])(x), _as_written(ns["f"], x)[1], rtol=RTOL)


def test_in_place_updates_keep_numpys_meaning(small_loops, monkeypatch, capsys):
    # x += ... updates the array every name bound to it sees, as in NumPy
    def updates_an_alias(x0):
        x = x0 * 1.0
        y = x
        for _ in range(40):
            x += np.sin(x) * 0.01
        return np.sum(y) + np.sum(x)

    def reads_the_alias(x0):      # the body reads the carry as y too
        x = x0 * 1.0
        y = x
        for _ in range(40):
            x += np.sin(y) * 0.01
        return np.sum(y) + np.sum(x)

    def rebinds(x0):              # x = x + ...: y keeps the value before the loop
        x = x0 * 1.0
        y = x
        for _ in range(40):
            x = x + np.sin(x) * 0.01
        return np.sum(y) + np.sum(x)

    x0 = np.array([0.3, 0.5])
    monkeypatch.setenv("TRACEGRAD_EXPLAIN", "1")
    for f in (updates_an_alias, reads_the_alias, rebinds):
        v, g = tg.value_and_grad(f)(x0)
        np.testing.assert_allclose(v, f(x0.copy()), rtol=RTOL, err_msg=f.__name__)
        np.testing.assert_allclose(g, _as_written(f, x0)[1], rtol=RTOL, err_msg=f.__name__)
    err = capsys.readouterr().err
    assert "reads a carried array by another name" in err
    assert err.count("rewrote the Python loop") >= 2


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_torch_dialect_loops(dtype):
    torch = tg

    def f(x):
        h = x * 0.0
        for i in range(300):
            h = torch.tanh(h * 0.9 + x * (1 + 0.001 * i))
        return (h ** 2).sum()

    x = tg.tensor([0.1, 0.2, 0.3], dtype=getattr(tg, dtype), requires_grad=True)
    y = f(x)
    y.backward()
    out = tg.compile(f)(x.detach())
    assert type(out) is type(y) and out.dtype == y.dtype
    tol = 1e-5 if dtype == "float32" else RTOL
    np.testing.assert_allclose(out.numpy(), y.detach().numpy(), rtol=tol)
    np.testing.assert_allclose(tg.grad(f)(x.detach()).numpy(), x.grad.numpy(), rtol=tol)
    # the traced index is a torch 0-d int64: float32 stays float32, so the loop is rewritten
    assert "scan" in _ops(tg.grad(f).lower(x.detach()).graph)


def _simulate(v0, n):           # a helper the compiled function calls by its global name
    x = np.zeros(3)
    v = v0
    for _ in range(n):
        v = v + 0.01 * (-0.1 * v * np.sqrt(np.sum(v * v)) + G)
        x = x + 0.01 * v
    return x


def miss_through_a_helper(v0, n):
    return np.sum((_simulate(v0, n) - TARGET) ** 2)


def test_loops_in_the_functions_it_calls_are_rewritten():
    f = tg.value_and_grad(miss_through_a_helper, static_argnums=(1,))
    assert f.lower(V0, 300).graph.number_of_nodes() == f.lower(V0, 30_000).graph.number_of_nodes()
    v, g = f(V0, 300)
    v_ref, g_ref = _as_written(miss_through_a_helper, V0, 300, static_argnums=(1,))
    np.testing.assert_allclose(v, v_ref, rtol=RTOL)
    np.testing.assert_allclose(g, g_ref, rtol=RTOL)
    called = loop_rewrite.CalledFunctions()
    called.enter(np.linspace)                       # not the user's code: left alone
    assert called.mine == []
    code = _simulate.__code__
    called.enter(_simulate)
    assert called.mine == [_simulate] and _simulate.__code__ is not code
    called.restore()
    assert _simulate.__code__ is code


def _euler(v, n):
    for _ in range(n):
        v = v + 0.01 * (-0.1 * v * np.sqrt(np.sum(v * v)) + G)
    return v


def _midpoint(v, n):
    for _ in range(n):
        v = v + 0.01 * (-0.1 * (v + 0.005 * G) * np.sqrt(np.sum(v * v)) + G)
    return v


def _final_speed(v0, method):
    # the function objects keep their identity while their loops are rewritten
    v = _euler(v0, 300) if method is _euler else _midpoint(v0, 300)
    return np.sum(v * v)


def test_called_functions_keep_their_identity():
    for method in (_euler, _midpoint):
        f = tg.value_and_grad(_final_speed, static_argnums=(1,))
        v, g = f(V0, method)
        np.testing.assert_allclose(v, _final_speed(V0, method), rtol=RTOL)
        np.testing.assert_allclose(g, _as_written(_final_speed, V0, method,
                                                  static_argnums=(1,))[1], rtol=RTOL)
        assert "scan" in _ops(f.lower(V0, method).graph)
    assert _euler.__code__.co_name == "_euler" and "__tg_rt" not in _euler.__code__.co_varnames


def test_loops_of_a_function_reached_through_a_closure():
    n = 300
    f = tg.value_and_grad(lambda v: miss(v, n))
    CALLS[0] = 0
    v, g = f(V0)
    assert CALLS[0] <= 6          # rewritten, not traced step by step
    v_ref, g_ref = _as_written(miss, V0, n, static_argnums=(1,))
    np.testing.assert_allclose(v, v_ref, rtol=RTOL)
    np.testing.assert_allclose(g, g_ref, rtol=RTOL)


@pytest.mark.parametrize("seed", [1, 2])
def test_random_loops_match_the_loops_as_written(seed, tmp_path, monkeypatch):
    import importlib
    import warnings
    from _random_loops import module_source
    (tmp_path / f"random_loops_{seed}.py").write_text(module_source(seed, 25))
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module(f"random_loops_{seed}")
    x = np.array([0.3, -0.2, 0.7])
    checked = 0
    for k in range(25):
        f = getattr(mod, f"f{k}")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = f(x.copy())
        if not np.isfinite(ref):
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            v, g = tg.value_and_grad(f)(x)
            g_ref = _as_written(f, x)[1]
        np.testing.assert_allclose(v, ref, rtol=1e-10, atol=1e-12, err_msg=f"f{k}")
        np.testing.assert_allclose(g, g_ref, rtol=1e-9, atol=1e-12, err_msg=f"f{k}")
        checked += 1
    assert checked >= 15


def test_a_range_of_the_users_own_is_iterated_as_written(tmp_path, monkeypatch):
    import importlib
    (tmp_path / "own_range.py").write_text(
        "import builtins\nimport numpy as np\n\n"
        "def range(*args):     # any iterable: no len(), no indexing\n"
        "    return iter(builtins.range(*args))\n\n"
        "def f(x):\n"
        "    for k in range(50):\n"
        "        x = np.sin(x) + 0.01 * k\n"
        "    return np.sum(x) + k\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    f = importlib.import_module("own_range").f
    v, g = tg.value_and_grad(f)(V0)
    np.testing.assert_allclose(v, f(V0), rtol=RTOL)
    np.testing.assert_allclose(g, _as_written(f, V0)[1], rtol=RTOL)


def _drag_energy(v0):
    v = v0
    for _ in range(200):
        v = v + 0.01 * (-0.1 * v * np.sqrt(np.sum(v * v)) + G)
    return np.sum(v * v)


def test_jacobians_and_hessians_through_a_rewritten_loop():
    assert "scan" in _ops(tg.hessian(_drag_energy).lower(V0).graph)
    import os
    as_written = {}
    os.environ["TRACEGRAD_ROLL"] = "0"
    try:
        as_written["hessian"] = tg.hessian(_drag_energy)(V0)
        as_written["jacfwd"] = tg.jacfwd(_drag_energy)(V0)
    finally:
        del os.environ["TRACEGRAD_ROLL"]
    np.testing.assert_allclose(tg.hessian(_drag_energy)(V0), as_written["hessian"], rtol=1e-10)
    np.testing.assert_allclose(tg.jacfwd(_drag_energy)(V0), as_written["jacfwd"], rtol=1e-12)
    np.testing.assert_allclose(tg.jacfwd(_drag_energy)(V0), tg.grad(_drag_energy)(V0),
                               rtol=1e-12)


def _long_state_loop_fn():
    """A new function object each time (the environment is read when a
    function is traced; compiled signatures are kept per function)."""
    def f(x, w):
        for _ in range(400):
            x = x + 0.001 * np.tanh(x * w)
        return np.sum(x * x)
    return f


def test_a_memory_policy_for_rewritten_loops(monkeypatch):
    x = np.linspace(-1.0, 1.0, 1000)
    w = np.linspace(0.5, 1.5, 1000)
    g_ref = tg.grad(_long_state_loop_fn())(x, w)

    def scan_checkpoint():      # of the loop node over the 397 middle steps
        g = tg.grad(_long_state_loop_fn()).lower(x, w).graph
        return [d["attrs"].get("checkpoint") for _, d in g.nodes(data=True)
                if d["op"] == "scan" and d["attrs"]["length"] == 397][:1]

    assert scan_checkpoint() == [None]
    for value, k in (("true", 20), ("25", 25), ("1MB", 20), ("100MB", None)):
        monkeypatch.setenv("TRACEGRAD_LOOP_CHECKPOINT", value)
        assert scan_checkpoint() == [k], value
        np.testing.assert_allclose(tg.grad(_long_state_loop_fn())(x, w), g_ref, rtol=1e-12)
    monkeypatch.setenv("TRACEGRAD_LOOP_CHECKPOINT", "20kB")   # below sqrt checkpointing
    with pytest.raises(ValueError, match="raise the budget"):
        tg.grad(_long_state_loop_fn())(x, w)
    monkeypatch.setenv("TRACEGRAD_LOOP_CHECKPOINT", "lots")
    with pytest.raises(ValueError, match="a memory budget is written like"):
        tg.grad(_long_state_loop_fn())(x, w)
