"""Random draws inside traced functions: fresh on every call, NumPy's stream.

``np.random.*`` calls met while tracing become ``random_draw`` nodes whose
generated code calls NumPy's own function, so a compiled Monte Carlo
objective draws a new sample per call and, after ``np.random.seed(s)``,
the same numbers as the NumPy function.  Draws have zero gradient; a draw
whose parameters are traced, a Generator the compiler cannot intercept, and
the np.random functions compiled code cannot honour are errors.
"""
from __future__ import annotations

import threading

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.ops import random as tg_random
from tracegrad.ops.random import RandomTraceError
from tracegrad.ops.primitives import Aval

N = 100


def mc_objective(x):
    return np.mean((x + np.random.randn(N)) ** 2)


@pytest.fixture
def x():
    return np.linspace(-1.0, 1.0, N)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACEGRAD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TRACEGRAD_CACHE", raising=False)
    tg.clear_cache()
    yield tmp_path / "cache"
    tg.clear_cache(disk=False)


def _numpy_functions_restored():
    # np.random.normal is a bound method of the global RandomState again
    return all(getattr(np.random, n) == tg_random._NUMPY_FUNCTIONS[n] for n in tg_random._PATCHED)


# --- a fresh draw per call, NumPy's numbers ------------------------------------------------

@pytest.mark.usefixtures("numpy_target")
def test_monte_carlo_objective_is_fresh_per_call_and_matches_numpy(x, cache_dir):
    f = tg.compile(mc_objective)
    values = [f(x) for _ in range(3)]
    assert len(set(values)) == 3, "the compiled objective repeats one frozen sample"
    for seed in (0, 1, 7):
        np.random.seed(seed)
        got = f(x)
        np.random.seed(seed)
        assert got == mc_objective(x)
    # without re-seeding, a sequence of calls follows NumPy's sequence
    np.random.seed(3)
    seq = [f(x) for _ in range(3)]
    np.random.seed(3)
    assert seq == [mc_objective(x) for _ in range(3)]
    assert _numpy_functions_restored()


def test_gradient_matches_numpy_analytic_gradient_with_the_same_seed(x, cache_dir):
    g = tg.grad(mc_objective)
    for seed in (0, 5):
        np.random.seed(seed)
        got = g(x)
        np.random.seed(seed)
        eps = np.random.randn(N)
        np.testing.assert_allclose(got, 2 * (x + eps) / N, rtol=1e-12, atol=1e-15)
    np.random.seed(0)
    a = g(x)
    b = g(x)
    assert not np.allclose(a, b)


def test_value_and_grad_value_is_numpys(x, cache_dir):
    np.random.seed(11)
    v, _ = tg.value_and_grad(mc_objective)(x)
    np.random.seed(11)
    assert v == mc_objective(x)


def test_draws_have_zero_gradient(cache_dir):
    def f(x):
        return np.sum(x) + np.sum(np.random.randn(3) * 10.0)

    x = np.ones(3)
    np.testing.assert_array_equal(tg.grad(f)(x), np.ones(3))
    # forward mode: the draw contributes no tangent either
    _, t = tg.jvp(f, (x,), (np.ones(3),))
    assert float(t) == 3.0


def test_reparameterised_draw_gives_the_pathwise_gradient(cache_dir):
    def elbo_term(mu, log_sigma):
        z = mu + np.exp(log_sigma) * np.random.standard_normal(4)
        return np.sum(z ** 2)

    mu = np.array([0.5, -1.0, 2.0, 0.0])
    log_sigma = np.array([0.1, -0.3, 0.0, 0.2])
    np.random.seed(4)
    gmu, gls = tg.grad(elbo_term, argnums=(0, 1))(mu, log_sigma)
    np.random.seed(4)
    eps = np.random.standard_normal(4)
    z = mu + np.exp(log_sigma) * eps
    np.testing.assert_allclose(gmu, 2 * z, rtol=1e-12)
    np.testing.assert_allclose(gls, 2 * z * np.exp(log_sigma) * eps, rtol=1e-12)


def test_second_derivatives_and_jacobians_see_one_draw_per_call(cache_dir):
    x = np.linspace(0.5, 1.5, 5)
    np.random.seed(2)
    h = tg.hessian(lambda x: np.sum(x ** 2 * np.random.rand(5)))(x)
    np.random.seed(2)
    np.testing.assert_allclose(h, np.diag(2 * np.random.rand(5)), rtol=1e-12)
    np.random.seed(2)
    j = tg.jacobian(lambda x: x * np.random.rand(5))(x)
    np.random.seed(2)
    np.testing.assert_allclose(j, np.diag(np.random.rand(5)), rtol=1e-12)


def test_unused_draw_keeps_numpys_stream(cache_dir):
    def f(x):
        np.random.normal(size=7)  # unused, but NumPy still draws it
        return x + np.random.normal(size=3)

    x = np.zeros(3)
    np.random.seed(9)
    got = tg.compile(f)(x)
    np.random.seed(9)
    np.testing.assert_array_equal(got, f(x))


DRAWS = [
    ("normal", (0.5, 2.0), {"size": (3, 4)}),
    ("normal", (), {}),  # size=None: a scalar
    ("uniform", (-1.0, 3.0, 5), {}),
    ("standard_normal", ((2, 3),), {}),
    ("rand", (2, 3), {}),
    ("randn", (4,), {}),
    ("random", (6,), {}),
    ("random_sample", ((2, 2),), {}),
    ("randint", (0, 10), {"size": 8}),
    ("randint", (0, 10), {"size": 4, "dtype": np.int32}),
    ("choice", (5,), {"size": 6, "p": [0.1, 0.2, 0.3, 0.2, 0.2]}),
    ("choice", (np.array([2.5, -1.0, 4.0]),), {"size": 4, "replace": True}),
    ("binomial", (10, 0.3, 6), {}),
    ("poisson", (3.0, 6), {}),
    ("exponential", (2.0,), {"size": 6}),
    ("gamma", (2.0, 1.5, (2, 3)), {}),
    ("beta", (2.0, 5.0, 4), {}),
    ("permutation", (7,), {}),
    ("multivariate_normal", ([0.0, 1.0], [[1.0, 0.3], [0.3, 2.0]], 5), {}),
    ("dirichlet", ([1.0, 2.0, 3.0], 4), {}),
    ("laplace", (np.array([0.0, 1.0, 2.0]), 0.5), {}),  # a concrete array parameter
    ("lognormal", (0.0, 0.5, 3), {}),
]


@pytest.mark.parametrize("name,args,kwargs", DRAWS, ids=[d[0] for d in DRAWS])
def test_draw_functions_match_numpy_with_the_same_seed(name, args, kwargs, cache_dir):
    def f(x):
        return x, getattr(np.random, name)(*args, **kwargs)

    c = tg.compile(f)
    x = np.zeros(2)
    np.random.seed(21)
    _, got = c(x)
    np.random.seed(21)
    _, want = f(x)
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
    _, again = c(x)
    if got.size > 1 and name not in ("permutation",):
        assert not np.array_equal(np.asarray(again), got)


# --- the generated code ------------------------------------------------------------------

def test_generated_source_draws_and_says_so(x, cache_dir):
    src = tg.compile(mc_objective).lower(x).source
    assert "np.random.randn(100)" in src
    assert "fresh random draw on every call" in src
    gsrc = tg.grad(mc_objective).lower(x).source
    assert "np.random.randn(100)" in gsrc
    # no frozen sample embedded as a constant
    assert "frombuffer" not in src and "frombuffer" not in gsrc


@pytest.mark.usefixtures("numpy_target")
def test_disk_cache_round_trip_keeps_drawing(x, cache_dir):
    f = tg.compile(mc_objective)
    f(x)
    assert tg.cache_info()["disk_entries"] >= 1
    tg.clear_cache(disk=False)          # memory only: the next call reads the disk entry
    f2 = tg.compile(mc_objective)
    np.random.seed(8)
    a = f2(x)
    assert tg.cache_info()["disk_hits"] == 1
    b = f2(x)
    assert a != b
    np.random.seed(8)
    assert a == mc_objective(x)


# --- parameters, refusals, frozen draws -----------------------------------------------------

def test_traced_parameter_is_an_error_showing_the_reparameterisation(cache_dir):
    def f(mu):
        return np.sum(np.random.normal(mu, 1.0))

    with pytest.raises(RandomTraceError) as e:
        tg.compile(f)(np.zeros(3))
    msg = str(e.value)
    assert "np.random.normal() got a traced array" in msg
    assert "loc + scale * np.random.standard_normal(shape)" in msg
    assert "test_random.py" in msg  # where in the user's code
    assert _numpy_functions_restored()


@pytest.mark.parametrize("call,what", [
    (lambda x: np.random.seed(0), "np.random.seed"),
    (lambda x: np.random.shuffle(x), "x[np.random.permutation(len(x))]"),
    (lambda x: np.random.default_rng(0).normal(), "np.random.default_rng"),
    (lambda x: np.random.get_state(), "np.random.get_state"),
])
def test_np_random_functions_compiled_code_cannot_honour_are_errors(call, what, cache_dir):
    def f(x):
        call(x)
        return x * 2

    with pytest.raises(RandomTraceError, match="cannot be used inside a traced function") as e:
        tg.compile(f)(np.zeros(3))
    assert what in str(e.value)
    assert _numpy_functions_restored()


_GLOBAL_RNG = np.random.default_rng(0)


def _uses_global_generator(x):
    return x + _GLOBAL_RNG.normal(size=3)


def test_closure_generator_is_drawn_from_at_run_time(cache_dir):
    # a Generator the compiled function names (a closure variable) is an
    # input read by reference: each call draws from it, as NumPy does
    rng = np.random.default_rng(0)

    def f(x):
        return x + rng.normal(size=3)

    cf = tg.compile(f)
    got = [cf(np.zeros(3)) for _ in range(2)]
    ref = np.random.default_rng(0)
    np.testing.assert_array_equal(got[0], ref.normal(size=3))
    np.testing.assert_array_equal(got[1], ref.normal(size=3))
    assert _numpy_functions_restored()


def test_global_generator_in_the_function_or_a_helper_is_drawn_from_at_run_time(cache_dir):
    _GLOBAL_RNG.bit_generator.state = np.random.default_rng(0).bit_generator.state
    got = tg.compile(_uses_global_generator)(np.zeros(3))
    np.testing.assert_array_equal(got, np.random.default_rng(0).normal(size=3))

    def outer(x):  # the draw happens in a helper the traced function calls
        return _uses_global_generator(x) * 2

    _GLOBAL_RNG.bit_generator.state = np.random.default_rng(1).bit_generator.state
    got = [tg.compile(outer)(np.zeros(3)) for _ in range(2)]
    ref = np.random.default_rng(1)
    np.testing.assert_array_equal(got[0], 2 * ref.normal(size=3))
    np.testing.assert_array_equal(got[1], 2 * ref.normal(size=3))


def test_generator_as_static_argument_is_detected(cache_dir):
    def f(x, rng):
        return x + rng.normal(size=3)

    with pytest.raises(RandomTraceError, match="argument 1"):
        tg.compile(f, static_argnums=1)(np.zeros(3), np.random.default_rng(1))


def test_generator_in_an_object_attribute_is_detected(cache_dir):
    class Model:
        def __init__(self):
            self.rng = np.random.default_rng(2)

        def loss(self, x):
            return np.sum(x * self.rng.standard_normal(3))

    with pytest.raises(RandomTraceError, match=r"self\.rng"):
        tg.compile(Model().loss)(np.ones(3))


def test_legacy_function_bound_before_tracing_is_detected(cache_dir):
    from numpy.random import normal  # bound to NumPy's function, not looked up at call time

    def f(x):
        return x + normal(size=3)

    with pytest.raises(RandomTraceError, match="NumPy's global random state"):
        tg.compile(f)(np.zeros(3))


# --- threads and nesting --------------------------------------------------------------------

def test_other_threads_draw_for_real_while_a_function_is_traced(cache_dir):
    inside = threading.Event()
    drawn = threading.Event()
    seen = {}

    def f(x):
        inside.set()           # the trace is in progress: np.random.* are wrapped now
        assert drawn.wait(10)
        return x + np.random.randn(3)

    def other():
        assert inside.wait(10)
        seen["patched"] = np.random.normal is not tg_random._NUMPY_FUNCTIONS["normal"]
        np.random.seed(5)
        seen["value"] = np.random.normal(size=3)
        drawn.set()

    t = threading.Thread(target=other)
    t.start()
    c = tg.compile(f)
    c(np.zeros(3))             # traces while the other thread draws
    t.join()
    assert seen["patched"]
    assert type(seen["value"]) is np.ndarray
    np.testing.assert_array_equal(seen["value"], np.random.RandomState(5).normal(size=3))
    assert _numpy_functions_restored()
    np.random.seed(6)
    got = c(np.zeros(3))
    np.random.seed(6)
    np.testing.assert_array_equal(got, np.random.randn(3))


def test_nested_traces(cache_dir):
    inner = tg.compile(lambda x: x + np.random.randn(3))

    def outer(x):
        return inner(x) * 2 + np.random.rand(3)

    c = tg.compile(outer)
    x = np.arange(3.0)
    np.random.seed(12)
    got = c(x)
    np.random.seed(12)
    want = (x + np.random.randn(3)) * 2 + np.random.rand(3)
    np.testing.assert_allclose(got, want, rtol=1e-15)
    assert _numpy_functions_restored()


# --- Generator arguments: the proxy and the row, below the public API -------------------------

def test_generator_argument_proxy_draws_from_the_real_generator_at_run_time():
    """A trace input of dtype object stands for a Generator argument: the
    function sees a proxy, the node reads that input, and the generated code
    calls the real Generator's method."""
    from tracegrad.targets.numpy import codegen
    from tracegrad.ir import graph as ir, passes
    from tracegrad.frontend.trace import trace_function

    def f(rng, x):
        return x * rng.normal(1.0, 2.0, size=3) + rng.integers(0, 5, size=3)

    avals = [Aval((), np.dtype(object)), Aval((3,), np.dtype(np.float64))]
    trace, _ = trace_function(f, avals, lambda ts: (ts, {}), ["rng", "x"])
    g = ir.from_trace(trace)
    passes.optimize(g)
    src = codegen.generate_numpy([(g, "forward", ["rng", "x"], "doc")])
    assert "rng.normal(1.0, 2.0, size=3)" in src and "rng.integers(0, 5, size=3)" in src
    ns = {}
    exec(compile(src, "<generated>", "exec"), ns)
    x = np.array([1.0, 2.0, 3.0])
    (got,) = ns["forward"](np.random.default_rng(4), x)
    want = f(np.random.default_rng(4), x)
    np.testing.assert_array_equal(got, want)
    rng = np.random.default_rng(4)
    assert not np.array_equal(ns["forward"](rng, x)[0], ns["forward"](rng, x)[0])


def test_a_generator_argument_of_a_compiled_function_is_drawn_from_each_call(cache_dir):
    def f(w, rng):
        return np.mean((w + rng.normal(0.0, 1.0, size=3)) ** 2)
    w = np.ones(3)
    v, g = tg.value_and_grad(f)(w, np.random.default_rng(0))
    e = np.random.default_rng(0).normal(0.0, 1.0, size=3)
    assert v == f(w, np.random.default_rng(0))
    np.testing.assert_allclose(g, 2 * (w + e) / 3, rtol=1e-14)
    rng = np.random.default_rng(1)
    first = tg.grad(f)(w, rng)
    traces = tg.cache_info()["traces"]
    second = tg.grad(f)(w, rng)
    assert not np.array_equal(first, second)          # the Generator's state moves on
    tg.grad(f)(w, np.random.default_rng(2))            # another Generator: same trace
    assert tg.cache_info()["traces"] == traces
    with pytest.raises(TypeError, match="floating-point"):
        tg.grad(f, argnums=1)(w, rng)


def test_generator_proxy_refuses_what_it_cannot_compile():
    from tracegrad.frontend.trace import trace_function

    avals = [Aval((), np.dtype(object)), Aval((3,), np.dtype(np.float64))]
    with pytest.raises(RandomTraceError, match="Generator.shuffle"):
        trace_function(lambda rng, x: rng.shuffle(x), avals, lambda ts: (ts, {}), ["rng", "x"])
    with pytest.raises(RandomTraceError, match="traced array"):
        trace_function(lambda rng, x: rng.normal(x), avals, lambda ts: (ts, {}), ["rng", "x"])


def test_shape_rule_and_scalar_flag():
    attrs = tg_random.draw_attrs("normal", (0.0, 1.0), {"size": (2, 5)})
    assert tg_random.random_draw_p.shape(**attrs) == Aval((2, 5), np.dtype(np.float64))
    assert attrs["scalar"] is False
    attrs = tg_random.draw_attrs("randint", (0, 3))
    assert tg_random.random_draw_p.shape(**attrs) == Aval((), np.dtype(np.int64))
    assert attrs["scalar"] is True
    assert tg_random.random_draw_p.numpy(["x"], **attrs).startswith("np.asarray(np.random.randint(0, 3))")


def test_shape_rule_leaves_the_users_random_state_alone():
    np.random.seed(0)
    before = np.random.get_state()[1].copy()
    tg_random.draw_attrs("normal", (), {"size": 1000})
    assert np.array_equal(np.random.get_state()[1], before)


# --- the CUDA target ---------------------------------------------------------------------

def test_cuda_target_draws_numpys_numbers_on_the_host(cache_dir):
    """The CuPy driver draws with NumPy on the host and copies the sample to
    the device (CuPy's own generator would give other numbers); checked
    through the CPU emulator of the CUDA target."""
    import shutil
    from tracegrad import testing
    if shutil.which(testing.CXX) is None:
        pytest.skip("the CUDA emulator needs a host C++ compiler")

    def f(x):
        return np.sum((x + np.random.randn(8)) ** 2)

    x = np.linspace(0.0, 1.0, 8)
    with testing.emulated_cupy() as cp:
        xd = cp.asarray(x)
        assert "_numpy.random.randn(8)" in tg.compile(f, backend="cupy").lower(xd).source
        np.random.seed(0)
        got = float(tg.compile(f, backend="cupy")(xd))
        np.random.seed(1)
        g = testing.to_host(tg.grad(f, backend="cupy")(xd))
    np.random.seed(0)
    assert got == f(x)
    np.random.seed(1)
    np.testing.assert_allclose(g, 2 * (x + np.random.randn(8)), rtol=1e-12)


@pytest.mark.parametrize("draw", [
    lambda x: tg.randn(3), lambda x: tg.rand(3), lambda x: tg.randn_like(x),
    lambda x: tg.randint(0, 5, (3,)), lambda x: tg.randperm(3), lambda x: tg.normal(0., 1., (3,)),
], ids=["randn", "rand", "randn_like", "randint", "randperm", "normal"])
def test_torch_style_draws_while_tracing_are_fresh_not_frozen(draw, cache_dir):
    # drawn on every call from the generator tg.manual_seed seeds, as
    # torch.compile draws from torch's
    f = tg.compile(lambda x: x * draw(x))
    tg.manual_seed(4)
    first, second = np.asarray(f(np.ones(3))), np.asarray(f(np.ones(3)))
    tg.manual_seed(4)
    np.testing.assert_array_equal(np.asarray(f(np.ones(3))), first)
    tg.manual_seed(4)
    np.testing.assert_array_equal(np.asarray(draw(tg.ones(3, dtype=tg.float64))), first)  # as eager
    if draw(tg.ones(3)).numel() > 1 and first.dtype.kind == "f":
        assert not np.array_equal(first, second)
    assert tg.randn(3).shape == (3,)     # outside a trace they draw as before
