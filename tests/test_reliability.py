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
