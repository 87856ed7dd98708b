"""``import tracegrad.numpy as np``: NumPy's namespace where array(), asarray(),
r_ and c_ accept differentiated values (what NumPy itself cannot dispatch)."""
from __future__ import annotations

import numpy as onp
import pytest

import tracegrad as tg
import tracegrad.numpy as np

X = onp.array([0.3, -1.2, 0.5])


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACEGRAD_CACHE_DIR", str(tmp_path / "cache"))


def _fd(f, x, eps=1e-6):
    return onp.array([(f(x + eps * e) - f(x - eps * e)) / (2 * eps) for e in onp.eye(len(x))])


def program(x):
    v = np.array([x[0] * x[1], np.sin(x[2]), 1.5])       # a list mixing values and numbers
    w = np.r_[x, 2.0, v]
    m = np.c_[x, x * 2]
    a = np.asarray(x)                                      # a value stays itself
    return np.sum(w ** 2) + np.sum(m * np.arange(6.0).reshape(3, 2)) + np.sum(a * v)


def test_plain_arrays_get_numpys_results():
    assert np.array([1, 2]).dtype == onp.array([1, 2]).dtype
    assert np.asarray(X) is X
    onp.testing.assert_array_equal(np.r_[X, 1.0], onp.r_[X, 1.0])
    onp.testing.assert_array_equal(np.c_[X, X], onp.c_[X, X])
    onp.testing.assert_array_equal(np.r_[0:3, 5], onp.r_[0:3, 5])
    assert np.linalg is onp.linalg and np.float64 is onp.float64 and np.pi == onp.pi


def test_values_built_into_arrays_stay_differentiable_compiled_and_eager():
    want = program(X)
    assert tg.compile(program)(X) == pytest.approx(want, rel=1e-14)
    g = tg.grad(program)(X)
    onp.testing.assert_allclose(g, tg.grad(program, compile=False)(X), rtol=1e-13)
    onp.testing.assert_allclose(g, _fd(program, X), rtol=1e-6)


def test_array_follows_numpys_dtype_copy_and_ndmin():
    def f(x):
        a = np.array([x[0], 1.5])                 # float64 pieces: float64, as NumPy
        b = np.array(x, ndmin=2)                  # (1, 3)
        c = np.array(x)                           # a copy: updating it leaves x alone
        c += 1.0
        return np.sum(a) + np.sum(b) + np.sum(x) + np.sum(c)
    assert tg.compile(f)(X) == pytest.approx(f(X.copy()), rel=1e-14)
    assert tg.compile(lambda x: np.array([x[0], x[1]], dtype=onp.float32))(X).dtype == onp.float32


def test_float_of_a_zero_d_value_works_eagerly_and_says_what_to_do_when_traced():
    def f(x):
        scale = float(np.sum(x * x))             # a Python number: value-dependent
        return np.sum(x) * scale
    # eagerly, the number would silently cut the gradient (issue 24): refused
    with pytest.raises(TypeError, match="float\\(\\) of a value being differentiated"):
        tg.grad(f, compile=False)(X)

    def f_detached(x):
        scale = float(np.sum(x * x).detach())    # a constant, by request
        return np.sum(x) * scale
    g = tg.grad(f_detached, compile=False)(X)
    onp.testing.assert_allclose(g, onp.full(3, onp.sum(X * X)), rtol=1e-13)   # scale is a constant
    with pytest.raises(tg.TraceError, match="compile=False"):
        tg.grad(f, fallback=False)(X)
    # with the fallback the compiled transform runs eagerly: the same refusal
    with pytest.raises(TypeError, match="float\\(\\) of a value being differentiated"):
        tg.grad(f)(X)


def test_ragged_lists_are_numpys_error():
    with pytest.raises(ValueError, match="inhomogeneous"):
        tg.compile(lambda x: np.array([x, x[:2]]))(X)


@pytest.mark.parametrize("compile", [True, False])
def test_full_with_a_differentiated_fill_value(compile):
    def f(x):
        return np.sum(np.full((2, 3), x[0]) * np.arange(6.0).reshape(2, 3)) + np.sum(
            np.full(3, x, dtype=onp.float64) ** 2)
    onp.testing.assert_allclose(tg.grad(f, compile=compile)(X), _fd(f, X), rtol=1e-6)
    onp.testing.assert_array_equal(np.full((2, 2), 1.5), onp.full((2, 2), 1.5))
    assert np.full(3, 2, dtype=onp.int32).dtype == onp.int32


def test_joining_lists_that_hold_values():
    import tracegrad.numpy as tnp
    x = np.array([1.0, 2.0, 3.0])

    def f(x):
        return tnp.sum(tnp.concatenate([x, [x[1], 2.0]]) ** 2)

    def g(x):
        return tnp.sum(tnp.stack([x, [x[1], 2.0, x[0]]]) ** 2 * tnp.arange(2.0)[:, None])
    for compile_ in (True, False):
        np.testing.assert_allclose(tg.grad(f, compile=compile_)(x), [2.0, 8.0, 6.0], rtol=1e-12)
        np.testing.assert_allclose(tg.grad(g, compile=compile_)(x), [2.0, 4.0, 0.0], rtol=1e-12)
    assert f(x) == 22.0
    # plain pieces: NumPy's own result
    np.testing.assert_array_equal(tnp.concatenate([[1, 2], [3]]), np.array([1, 2, 3]))
    np.testing.assert_array_equal(tnp.vstack([[1, 2], [3, 4]]), np.array([[1, 2], [3, 4]]))
