"""Captured state is read at call time (DESIGN.md, "Code as written").

A compiled function that reads an array from a global or a closure sees it
updated in place between calls, as NumPy does; Python values it reads from
captured containers and attributes are guarded (a change retraces); random
generators it names are drawn from at run time, by reference.  Where a
captured array cannot be an input (the function uses it as a Python value),
it is frozen into the code, checked by value, and TRACEGRAD_EXPLAIN says so.
"""
from __future__ import annotations

import types

import numpy as np
import pytest

import tracegrad as tg

BACKENDS = ["numpy", "native"]

X = np.arange(3.0)
BATCH = np.ones((4, 3))
TARGET = np.zeros(4)
CFG = {"lr": 0.5, "opt": {"momentum": 0.9}}
K = [3.0]
RS = np.random.RandomState(0)
RNG = np.random.default_rng(0)


def uses_x(w):
    return np.sum(X * w)


def mse(w):
    return np.mean((BATCH @ w - TARGET) ** 2)


def mse_numpy_grad(w):
    return 2 * BATCH.T @ (BATCH @ w - TARGET) / len(TARGET)


@pytest.fixture(autouse=True)
def _fresh_globals():
    X[:] = np.arange(3.0)
    BATCH[:] = 1.0
    TARGET[:] = 0.0
    CFG.update(lr=0.5, opt={"momentum": 0.9})
    K[:] = [3.0]
    yield


# --- arrays updated in place between calls --------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_a_global_array_updated_in_place_is_read_at_call_time(backend):
    f = tg.compile(uses_x, backend=backend)
    w = np.ones(3)
    assert f(w) == uses_x(w) == 3.0
    X[:] *= 10                                   # the issue's `data *= 10`: NumPy gives 30.0
    assert f(w) == uses_x(w) == 30.0
    X[:] = [1.0, -2.0, 0.5]                      # `X[:] = next_batch`
    assert f(w) == uses_x(w)
    assert tg.cache_info()["traces"] >= 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_closure_array_updated_in_place_is_read_at_call_time(backend):
    def make(data):
        def loss(w):
            return np.sum(np.tanh(data @ w))
        return loss

    data = np.linspace(-1, 1, 12).reshape(4, 3)
    loss = make(data)
    vg = tg.value_and_grad(loss, backend=backend)
    w = np.array([0.3, -0.2, 0.1])
    for step in range(3):
        v, g = vg(w)
        np.testing.assert_allclose(v, loss(w), rtol=1e-12)
        np.testing.assert_allclose(g, data.T @ (1 - np.tanh(data @ w) ** 2), rtol=1e-12)
        data *= 2.0
    traces = tg.cache_info()["traces"]
    vg(w)
    assert tg.cache_info()["traces"] == traces    # in-place updates never retrace


@pytest.mark.parametrize("backend", BACKENDS)
def test_grad_of_a_loss_over_a_global_batch_that_changes(backend):
    g = tg.grad(mse, backend=backend)
    w = np.array([1.0, 2.0, -1.0])
    rng = np.random.default_rng(1)
    for _ in range(3):
        BATCH[:] = rng.standard_normal(BATCH.shape)   # next batch, in place
        TARGET[:] = rng.standard_normal(TARGET.shape)
        np.testing.assert_allclose(g(w), mse_numpy_grad(w), rtol=1e-12)


def test_values_computed_from_a_captured_array_are_computed_at_call_time():
    def f(w):
        centred = X - X.mean()           # plain NumPy on the captured array
        return np.sum(centred * w) + float(len(X))

    cf = tg.compile(f)
    w = np.array([1.0, 2.0, 3.0])
    assert cf(w) == f(w)
    X[:] = [5.0, -1.0, 2.0]
    assert cf(w) == f(w)


def test_the_generated_code_takes_captured_arrays_as_parameters():
    lowered = tg.compile(uses_x, backend="numpy").lower(np.ones(3))
    assert lowered.captured == ["X"]
    assert "def forward(w, X)" in lowered.source
    assert not any(d["op"] == "const" and np.ndim(d["value"]) == 1
                   for _, d in lowered.graph.nodes(data=True))


def test_closures_over_different_data_share_compiled_code():
    def make(data):
        return lambda w: np.sum(data * w)
    f1, f2 = make(np.ones(3)), make(np.full(3, 2.0))
    tg.compile(f1)(np.ones(3))
    compiles = tg.cache_info()["compiles"]
    assert tg.compile(f2)(np.ones(3)) == 6.0
    assert tg.cache_info()["compiles"] == compiles   # same code, other data


# --- shapes, rebinding ---------------------------------------------------------------------------

def test_a_captured_array_of_another_shape_retraces():
    ns = {"np": np, "D": np.ones(3)}
    exec("def f(w):\n    return np.sum(D) * w\n", ns)
    f = tg.compile(ns["f"])
    w = np.array(2.0)
    assert f(w) == 6.0
    ns["D"] = np.ones(5)                      # rebound, another shape
    assert f(w) == 10.0
    ns["D"].shape = (5, 1)                    # reshaped in place
    assert f(w) == 10.0
    ns["D"].shape = (1, 5)
    assert f(w) == ns["f"](w)


def test_an_array_in_a_captured_list_or_dict_rebound_or_updated():
    params = {"W": np.eye(2), "b": np.zeros(2)}
    layers = [np.eye(2), 2 * np.eye(2)]

    def f(x):
        h = params["W"] @ x + params["b"]
        for M in layers:                     # reached through a container, by a loop
            h = M @ h
        return np.sum(h)

    cf = tg.compile(f)
    x = np.array([1.0, 2.0])
    assert cf(x) == f(x)
    params["b"] += 1.0                       # in place
    assert cf(x) == f(x)
    params["W"] = 3 * np.eye(2)              # rebound entry
    assert cf(x) == f(x)
    layers[1] = -np.eye(2)                   # rebound element
    assert cf(x) == f(x)
    layers[0][0, 0] = 7.0                    # in place, through the container
    assert cf(x) == f(x)


def test_attributes_of_self_are_read_at_call_time_and_guarded():
    class Model:
        def __init__(self):
            self.W = np.array([[1.0, 2.0], [3.0, 4.0]])
            self.scale = 2.0

        def loss(self, x):
            return self.scale * np.sum(self.W @ x)

    m = Model()
    g = tg.value_and_grad(m.loss)
    x = np.array([1.0, -1.0])
    np.testing.assert_allclose(g(x)[0], m.loss(x))
    m.W *= 3                                # in place
    np.testing.assert_allclose(g(x)[0], m.loss(x))
    m.scale = 5.0                           # a Python value read from self
    v, dx = g(x)
    np.testing.assert_allclose(v, m.loss(x))
    np.testing.assert_allclose(dx, 5.0 * m.W.sum(axis=0))


def test_a_helper_functions_global_array_is_read_at_call_time():
    def outer(w):
        return uses_x(w) * 2

    cf = tg.compile(outer)
    w = np.ones(3)
    assert cf(w) == outer(w)
    X[1] = 100.0
    assert cf(w) == outer(w)


def test_a_captured_tensor_updated_in_place_or_rebound():
    W = tg.tensor(np.array([[1.0, 2.0], [3.0, 4.0]]))

    def f(x):
        return (W @ x).sum()

    def g(x):
        return helper_row(W, x)

    cf, cg = tg.compile(f), tg.compile(g)
    x = tg.tensor(np.array([1.0, -1.0]))
    for step in range(3):
        assert float(cf(x)) == float(f(x))
        assert float(cg(x)) == float(g(x))
        with tg.no_grad():
            W.mul_(2.0)                    # an optimizer's in-place step
    W.data = tg.tensor(np.ones((2, 2)))    # rebound: retraces
    assert float(cf(x)) == float(f(x)) == 0.0


def helper_row(W, x):
    return (x * W[1]).sum()              # W[1]: a view of the captured tensor's memory


# --- Python values read from captured containers and attributes: guarded ------------------------

def test_a_captured_list_element_changed_between_calls():
    def f(w):
        return np.sum(w * K[0])

    cf = tg.compile(f)
    g = tg.grad(f)
    w = np.ones(2)
    assert cf(w) == 6.0
    K[0] = 30.0
    assert cf(w) == f(w) == 60.0
    np.testing.assert_array_equal(g(w), [30.0, 30.0])
    traces = tg.cache_info()["traces"]
    cf(w)
    assert tg.cache_info()["traces"] == traces     # unchanged: no retrace


def test_values_in_a_captured_dict_nested_and_iterated():
    def f(w):
        step = CFG["lr"] * CFG["opt"]["momentum"]
        total = sum(v for v in K)          # the list used whole
        return np.sum(w) * step + total

    cf = tg.compile(f)
    w = np.ones(3)
    assert cf(w) == f(w)
    CFG["opt"]["momentum"] = 0.5
    assert cf(w) == f(w)
    CFG["lr"] = 2.0
    assert cf(w) == f(w)
    K.append(1.0)
    assert cf(w) == f(w)


def test_a_config_object_and_a_numpy_scalar_are_guarded():
    cfg = types.SimpleNamespace(scale=np.float64(2.0), power=2)

    def f(w):
        return np.sum(w ** cfg.power) * cfg.scale

    cf = tg.compile(f)
    w = np.array([1.0, 2.0])
    assert cf(w) == f(w)
    cfg.scale = np.float64(-1.0)
    assert cf(w) == f(w)
    cfg.power = 3
    assert cf(w) == f(w)


def test_functions_reading_no_captured_state_keep_the_fast_path():
    def rosen(x):
        return np.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2)

    vg = tg.value_and_grad(rosen)
    vg(np.zeros(4))
    assert vg._tables.guard is None             # nothing to check on each call


# --- random generators in closures and globals ---------------------------------------------------

def draws(n):
    return RS.randn(n)


def test_a_global_random_state_is_drawn_from_at_run_time():
    f = tg.compile(lambda w: w * RS.randn(3))
    RS.seed(7)
    got = [f(np.ones(3)) for _ in range(3)]
    RS.seed(7)
    want = [np.ones(3) * RS.randn(3) for _ in range(3)]
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


def test_a_helper_that_draws_from_a_global_random_state():
    f = tg.compile(lambda w: w * draws(3) + draws(3))
    RS.seed(8)
    got = [f(np.ones(3)) for _ in range(2)]
    RS.seed(8)
    want = [np.ones(3) * draws(3) + draws(3) for _ in range(2)]
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


def test_a_global_generator_drawn_at_run_time_after_reseeding():
    def f(w):
        return w + RNG.normal(size=3)

    cf = tg.compile(f)
    RNG.bit_generator.state = np.random.default_rng(3).bit_generator.state
    got = [cf(np.zeros(3)) for _ in range(2)]
    ref = np.random.default_rng(3)
    np.testing.assert_array_equal(got[0], ref.normal(size=3))
    np.testing.assert_array_equal(got[1], ref.normal(size=3))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_closure_random_state_in_a_hips_style_objective(backend):
    # HIPS autograd's examples: rs = npr.RandomState(0) beside the objective
    def black_box_objective(D, num_samples):
        rs = np.random.RandomState(0)

        def objective(params):
            mean, log_std = params[:D], params[D:]
            samples = rs.randn(num_samples, D) * np.exp(log_std) + mean
            return -np.mean(np.sum(-0.5 * samples ** 2, axis=1)) - np.sum(log_std)
        return objective, rs

    objective, rs = black_box_objective(2, 5)
    vg = tg.value_and_grad(objective, backend=backend)
    params = np.array([0.5, -0.5, 0.1, 0.2])
    rs.seed(0)
    got = [vg(params) for _ in range(3)]
    rs.seed(0)
    want = [objective(params) for _ in range(3)]
    assert len({float(v) for v, _ in got}) == 3           # fresh samples on every call
    for (v, _), w in zip(got, want):
        np.testing.assert_allclose(v, w, rtol=1e-12)
    # the gradient of the reparameterised samples
    rs.seed(1)
    eps = rs.randn(5, 2)
    rs.seed(1)
    _, g = vg(params)
    mean, log_std = params[:2], params[2:]
    s = eps * np.exp(log_std) + mean
    np.testing.assert_allclose(g[:2], np.mean(s, axis=0), rtol=1e-12)
    np.testing.assert_allclose(g[2:], np.mean(s * eps * np.exp(log_std), axis=0) - 1, rtol=1e-12)


# --- every entry point that compiles --------------------------------------------------------------

def test_vjp_and_jvp_read_captured_arrays_at_call_time():
    w = np.array([1.0, 2.0, 3.0])
    for _ in range(2):
        out, vjp_fn = tg.vjp(uses_x, w)
        assert out == uses_x(w)
        np.testing.assert_array_equal(vjp_fn(1.0)[0], X)
        out, t = tg.jvp(uses_x, (w,), (np.ones(3),))
        assert t == X.sum()
        X[:] += 1.0


def test_torch_func_transforms_read_captured_arrays_at_call_time():
    w = np.array([1.0, 2.0, 3.0])
    grad = tg.func.grad(uses_x)
    batched = tg.func.vmap(uses_x)
    jvp_of = tg.func.jvp
    for _ in range(2):
        np.testing.assert_array_equal(grad(w), X)
        np.testing.assert_array_equal(batched(np.stack([w, 2 * w])), [uses_x(w), uses_x(2 * w)])
        _, t = jvp_of(uses_x, (w,), (np.ones(3),))
        assert t == X.sum()
        X[:] *= -2.0


def test_autograd_functional_reads_captured_arrays_at_call_time():
    from tracegrad.autograd import functional as F

    def f(x):
        return (x * tg.tensor(np.zeros(3)) + (x * x) * tg.from_numpy(X)).sum()

    def g(x):
        return x * x * tg.from_numpy(X) if False else (x * x) * X[0] + x * X[1]

    x = tg.tensor(np.array([1.0, 2.0, 3.0]))
    for _ in range(2):
        J = F.jacobian(g, x)
        np.testing.assert_allclose(J.numpy(), np.diag(2 * X[0] * x.numpy() + X[1]))
        _, hv = F.hvp(lambda t: (t * t * X[2]).sum(), x, tg.tensor(np.ones(3)))
        np.testing.assert_allclose(hv.numpy(), 2 * X[2] * np.ones(3))
        X[:] += 1.5
    assert f is not None


def test_a_compiled_call_on_the_tape_reads_captured_arrays():
    f = tg.compile(uses_x)
    for _ in range(2):
        w = tg.tensor(np.array([1.0, 2.0, 3.0]), requires_grad=True)
        y = f(w)
        y.backward()
        np.testing.assert_array_equal(w.grad.numpy(), X)
        assert float(y) == uses_x(w.detach().numpy())
        X[:] += 2.0


def uses_x_twice(w):
    return np.sum((X * 2.0) * w) + np.sum(X * w)


@pytest.mark.parametrize("f, times", [(uses_x, 1.0), (uses_x_twice, 3.0)])
def test_nested_transforms_read_captured_arrays_at_call_time(f, times):
    # the inner gradient (X, or 3 * X from captured arrays alone) is replayed
    # into the outer trace: it was once folded there into a constant, a
    # snapshot of X at trace time
    inner = tg.grad(f)

    @tg.compile
    def outer(w):
        return np.sum(inner(w) * w)

    w = np.array([1.0, 2.0, 3.0])
    for _ in range(3):
        assert outer(w) == np.sum(times * X * w)
        X[:] = X[::-1] + 1.0
    h = tg.hessian(lambda w: np.sum(X * w ** 2))
    np.testing.assert_array_equal(h(w), np.diag(2 * X))
    X[:] = 1.0
    np.testing.assert_array_equal(h(w), np.diag(2 * X))


def test_eager_and_compiled_agree_on_captured_state():
    def f(w):
        return np.sum(np.sin(BATCH @ w) * CFG["lr"]) + K[0]

    eager = tg.value_and_grad(f, compile=False)
    compiled = tg.value_and_grad(f)
    w = np.array([0.1, 0.2, 0.3])
    rng = np.random.default_rng(5)
    for _ in range(3):
        (ve, ge), (vc, gc) = eager(w), compiled(w)
        np.testing.assert_allclose(vc, ve, rtol=1e-12)
        np.testing.assert_allclose(gc, ge, rtol=1e-12)
        BATCH[:] = rng.standard_normal(BATCH.shape)
        CFG["lr"] = float(rng.random())
        K[0] = float(rng.random())


# --- what is frozen, and says so ---------------------------------------------------------------

def test_an_array_used_as_a_python_value_is_frozen_checked_and_explained(monkeypatch, capsys):
    monkeypatch.setenv("TRACEGRAD_EXPLAIN", "1")
    sign = np.array([1.0])

    def f(w):
        if sign[0] > 0:                       # a Python branch on the captured array
            return np.sum(w * X)
        return -np.sum(w * X)

    cf = tg.compile(f)
    w = np.ones(3)
    assert cf(w) == f(w)
    err = capsys.readouterr().err
    assert "captured array sign (float64[1]) is frozen into the compiled code" in err
    assert "Python truth value" in err and "checked by value" in err
    assert "reads at call time, by reference: X (float64[3])" in err
    sign[0] = -1.0                            # a change of the frozen array retraces
    assert cf(w) == f(w) == -3.0
    assert "the values of the captured array sign" in capsys.readouterr().err


def test_a_captured_array_the_function_writes_into_is_frozen_and_explained(monkeypatch, capsys):
    monkeypatch.setenv("TRACEGRAD_EXPLAIN", "1")
    buf = np.zeros(3)

    def f(w):
        buf[0] = 1.0                          # a write into captured state
        return np.sum(w * buf)

    assert tg.compile(f)(np.ones(3)) == 1.0
    assert "captured array buf (float64[3]) is frozen" in capsys.readouterr().err


def test_a_large_captured_array_that_never_meets_a_traced_value_is_explained(monkeypatch,
                                                                             capsys):
    monkeypatch.setenv("TRACEGRAD_EXPLAIN", "1")
    holder = types.SimpleNamespace(big=np.ones(5000))

    def helper():
        return float(holder.big.sum())           # computed in NumPy while tracing

    def f(w):
        return w * helper()

    assert tg.compile(f)(np.ones(1))[0] == 5000.0
    err = capsys.readouterr().err
    assert "holder.big (float64[5000]) never met a traced value" in err
    assert "not checked" in err


def test_the_command_line_module_freezes_captured_arrays_and_says_so(tmp_path):
    import subprocess
    import sys
    (tmp_path / "model.py").write_text(
        "import numpy as np\nDATA = np.arange(3.0)\n"
        "def loss(w):\n    return np.sum(DATA * w)\n")
    out = tmp_path / "out.py"
    r = subprocess.run([sys.executable, "-m", "tracegrad.cli", "compile", "model.py:loss",
                        "--arg", "w=float64[3]", "--grad", "--backend", "numpy", "-o", str(out)],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "frozen" in r.stderr and "DATA (float64[3])" in r.stderr
    text = out.read_text()
    assert "Captured arrays frozen in" in text and "DATA (float64[3])" in text

