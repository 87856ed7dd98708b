"""Transforms compose: grad of grad to any order, jacobian of grad, a
gradient inside a compiled step, compiled functions called while tracing,
and transformed functions on Tensors that record the tape."""
from __future__ import annotations

import numpy as np
import pytest

import tracegrad as tg


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACEGRAD_CACHE_DIR", str(tmp_path / "cache"))


X = np.array([0.3, -1.1, 0.8])


def test_derivatives_of_sin_by_nesting_grad():
    x = 0.7
    d = np.sin
    want = [np.cos(x), -np.sin(x), -np.cos(x), np.sin(x)]
    for k in range(4):
        d = tg.grad(d)
        assert d(x) == pytest.approx(want[k], rel=1e-14), f"derivative {k + 1}"


def test_third_derivative_of_a_vector_function_against_closed_form():
    # d^3/dx^3 of sum(x**4 * exp(x)) elementwise, through elementwise grad of grad
    def f(x):
        return np.sum(x ** 4 * np.exp(x))

    def d1(x):
        return tg.grad(f)(x)

    def d2(x):
        return tg.grad(lambda x: np.sum(d1(x)))(x)

    d3 = tg.grad(lambda x: np.sum(d2(x)))
    want = np.exp(X) * (X ** 4 + 12 * X ** 3 + 36 * X ** 2 + 24 * X)
    np.testing.assert_allclose(d3(X), want, rtol=1e-12)


def test_jacobian_of_grad_is_the_hessian():
    def f(x):
        return np.sum(np.tanh(x) ** 2) + x[0] * x[1] * x[2]
    np.testing.assert_allclose(tg.jacobian(tg.grad(f))(X), tg.hessian(f)(X), rtol=1e-12)
    np.testing.assert_allclose(tg.jacfwd(tg.grad(f))(X), tg.hessian(f)(X), rtol=1e-12)


def test_grad_inside_a_compiled_optimiser_step():
    def loss(w, data):
        return np.mean((data @ w - 1.0) ** 2)

    @tg.compile
    def step(w, data):
        return w - 0.1 * tg.grad(loss)(w, data)

    data = np.arange(12.).reshape(4, 3) / 10
    w = X.copy()
    w_ref = X.copy()
    for _ in range(5):
        w = step(w, data)
        w_ref = w_ref - 0.1 * (2 / 4) * data.T @ (data @ w_ref - 1.0)
    np.testing.assert_allclose(w, w_ref, rtol=1e-12)
    assert "tracegrad" not in step.lower(w, data).source.split("def forward")[1]


def test_grad_of_a_function_that_calls_compiled_and_grad_functions():
    inner = tg.compile(lambda x: np.sin(x) * 2.0)
    g = tg.grad(lambda x: np.sum(inner(x) * x))
    np.testing.assert_allclose(g(X), 2 * np.sin(X) + 2 * X * np.cos(X), rtol=1e-13)
    # value_and_grad with has_aux, nested
    vg = tg.value_and_grad(lambda x: (np.sum(x ** 3), x[0]), has_aux=True)
    outer = tg.grad(lambda x: vg(x)[1].sum() + vg(x)[0][1])
    np.testing.assert_allclose(outer(X), 6 * X + np.array([1., 0., 0.]), rtol=1e-13)


def test_vjp_and_jvp_of_a_gradient():
    f = tg.grad(lambda x: np.sum(np.exp(x) * x))
    out, vjp_fn = tg.vjp(f, X)
    np.testing.assert_allclose(out, np.exp(X) * (X + 1), rtol=1e-13)
    np.testing.assert_allclose(vjp_fn(np.ones(3))[0], np.exp(X) * (X + 2), rtol=1e-13)
    _, t = tg.jvp(f, (X,), (np.ones(3),))
    np.testing.assert_allclose(t, np.exp(X) * (X + 2), rtol=1e-13)


def test_a_gradient_on_tensors_records_the_tape():
    def f(x):
        return (x ** 3).sum()
    t = tg.tensor(X, requires_grad=True)
    g = tg.grad(f)(t)                      # 3 x**2, differentiable eagerly
    assert g.requires_grad
    g.sum().backward()
    np.testing.assert_allclose(t.grad.numpy(), 6 * X, rtol=1e-13)
    with tg.no_grad():                     # nothing to record: the compiled code runs
        g = tg.grad(f)(t)
    assert not g.requires_grad
    np.testing.assert_allclose(g.numpy(), 3 * X ** 2, rtol=1e-13)


def test_nested_transforms_trace_once_per_signature():
    g2 = tg.grad(tg.grad(np.sin))
    g2(0.1)
    before = tg.cache_info()["traces"]
    for x in (0.2, 0.3, 0.4):
        g2(x)
    assert tg.cache_info()["traces"] == before
