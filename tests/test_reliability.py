"""Regressions from the reliability probe: each was a wrong number, a crash
or an unclear error on an ordinary program."""
from __future__ import annotations

import numpy as np
import pytest

import tracegrad as tg


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACEGRAD_CACHE_DIR", str(tmp_path / "cache"))


# --- the buffer planner and views --------------------------------------------------------

def _einsum_view_program(x):
    a = np.cos(x)
    b = np.einsum("ab->ba", a)      # a view of a
    c = np.exp(a)                   # must not be written into a's buffer
    return np.sum(b * np.arange(6.).reshape(3, 2)) + np.sum(c)


def test_one_operand_einsum_view_keeps_its_base_alive():
    x = np.array([[.3, -1.2, .5], [1.1, .7, -.4]])
    want = _einsum_view_program(x)
    assert tg.compile(_einsum_view_program)(x) == pytest.approx(want, rel=1e-14)
    v, g = tg.value_and_grad(_einsum_view_program)(x)
    assert v == pytest.approx(want, rel=1e-14)
    eps = 1e-6
    fd = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        d = np.zeros_like(x)
        d[i] = eps
        fd[i] = (_einsum_view_program(x + d) - _einsum_view_program(x - d)) / (2 * eps)
    np.testing.assert_allclose(g, fd, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("view", [
    lambda a: np.einsum("ab->ba", a), lambda a: a.T, lambda a: a.reshape(-1),
    lambda a: a[1:], lambda a: np.expand_dims(a, 0), lambda a: np.squeeze(a[None]),
    lambda a: np.broadcast_to(a, (2,) + a.shape), lambda a: np.diagonal(a[:, :2]),
], ids=["einsum", "T", "reshape", "slice", "expand_dims", "squeeze", "broadcast_to", "diagonal"])
def test_views_of_dead_temporaries_stay_intact(view):
    def f(x):
        a = np.sin(x)
        b = view(a)
        c = np.exp(a) * 2.0     # a dies here: its buffer must not be reused
        d = np.tanh(c) + 1.0
        return np.sum(b) * 3.0 + np.sum(d * d)
    x = np.linspace(-1, 1, 6).reshape(2, 3)
    assert tg.compile(f)(x) == pytest.approx(f(x), rel=1e-13)


def test_replayed_backward_through_a_one_operand_einsum():
    # From the third backward on, the backward runs as generated code; the
    # einsum's view of its operand once let the planner overwrite it there.
    x = tg.tensor(np.array([.3, -.2, .9, 1.4]), requires_grad=True)
    x0 = x.detach().numpy()
    want = np.cos(np.cos(x0)) * -np.sin(x0) * np.exp(x0) + np.sin(np.cos(x0)) * np.exp(x0)
    for step in range(5):
        x.grad = None
        loss = (np.sin(np.einsum("a->a", np.cos(x))) * np.exp(x)).sum()
        loss.backward()
        np.testing.assert_allclose(x.grad.numpy(), want, rtol=1e-12,
                                   err_msg=f"backward {step + 1}")


# --- static values, crashes and errors -------------------------------------------------

def test_statics_that_compare_equal_do_not_share_a_trace():
    x = np.array([1.0, 2.0])
    f = tg.compile(lambda x, s: x * np.copysign(1., s), static_argnums=1)
    np.testing.assert_array_equal(f(x, 0.), x)
    np.testing.assert_array_equal(f(x, -0.), -x)
    g = tg.compile(lambda x, s: x * (3 if s is True else 2), static_argnums=1)
    np.testing.assert_array_equal(g(x, True), 3 * x)
    np.testing.assert_array_equal(g(x, 1), 2 * x)
    h = tg.compile(lambda x, s: x * (3 if isinstance(s, float) else 2), static_argnames="s")
    np.testing.assert_array_equal(h(x, s=1), 2 * x)
    np.testing.assert_array_equal(h(x, s=1.0), 3 * x)
    # a NaN static is one key, not a retrace per call
    k = tg.compile(lambda x, s: x + s, static_argnums=1)
    k(x, float("nan"))
    traces = tg.cache_info()["traces"]
    k(x, float("nan"))
    assert tg.cache_info()["traces"] == traces


def test_grad_through_an_indexed_element_times_a_number():
    x = np.array([.1, .2, .3])
    np.testing.assert_array_equal(tg.grad(lambda x: np.sum(x[1] * 2.0))(x), [0., 2., 0.])
    g32 = tg.grad(lambda x: np.sum(x[[1, 1]] * 2.0))(x.astype(np.float32))
    assert g32.dtype == np.float32
    np.testing.assert_array_equal(g32, [0., 4., 0.])


@pytest.mark.parametrize("call, message", [
    (lambda x: tg.grad(lambda x: None)(x), "returned None"),
    (lambda x: tg.value_and_grad(lambda x: None)(x), "returned None"),
    (lambda x: tg.grad(lambda x: np.sum(x), has_aux=True)(x), "must return a pair"),
    (lambda x: tg.grad(lambda x: (np.sum(x), x * 2))(x), "pass has_aux=True"),
    (lambda x: tg.grad(lambda x: [np.sum(x)])(x), "a list of 1 value"),
    (lambda x: tg.hessian(lambda x: (np.sum(x), 1.0))(x), "one scalar output"),
    (lambda x: tg.jvp(lambda x: x * 2, np.ones(3), np.ones(3)), r"tg.jvp\(f, \(x,\), \(t,\)\)"),
])
def test_misused_transforms_say_what_to_write(call, message):
    with pytest.raises(TypeError, match=message):
        call(np.ones(3))


def test_item_assignment_on_a_traced_value_names_the_remedy():
    def f(x):
        y = x * 2
        y[0] = 5.0
        return np.sum(y)
    with pytest.raises(tg.TraceError, match=r"y\[0\] = 5.0(.|\n)*tg.setitem(.|\n)*np.where"):
        tg.grad(f)(np.ones(3))

    def g(x):   # what the message suggests works
        return np.sum(tg.setitem(x * 2, 0, 5.0))
    np.testing.assert_array_equal(tg.grad(g)(np.ones(3)), [0., 2., 2.])


def test_a_one_element_output_counts_as_a_scalar():
    x = np.array([.5, -1.0])
    np.testing.assert_allclose(tg.grad(lambda x: np.sum(x ** 2, keepdims=True))(x), 2 * x)
    v, g = tg.value_and_grad(lambda x: (x[None, :1] * 3.0))(x)
    assert v.shape == (1, 1)
    np.testing.assert_array_equal(g, [3., 0.])
