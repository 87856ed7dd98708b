"""A compiled function's outputs share memory with its arguments only where
NumPy's would: where the function returns an argument, or a view of one, as
written.  Elsewhere (a gradient that is another argument, `x * 1.0` that a
pass made `x`, `np.array(x)`, a constant array made in the function) the
result is a new array each call, so writing into it (`g *= lr`) changes
neither the caller's data nor a later call's result."""
import numpy as np
import pytest

import tracegrad as tg
from tracegrad.runtime import toolchain

BACKENDS = ["numpy", pytest.param("native", marks=pytest.mark.skipif(
    toolchain.recipe_or_none() is None, reason="the native target needs a C compiler"))]


@pytest.fixture(autouse=True)
def _memory_cache(monkeypatch):
    monkeypatch.setenv("TRACEGRAD_CACHE", "0")


FRESH = {   # NumPy returns a new array for each of these
    "x * 1.0": lambda x: x * 1.0,
    "x + 0.0": lambda x: x + 0.0,
    "np.array(x)": lambda x: np.array(x),
    "np.copy(x)": lambda x: np.copy(x),
    "x.astype(its dtype)": lambda x: x.astype(np.float64),
    "+x": lambda x: +x,
}
ALIASED = {  # ... and the argument itself, or a view of it, for these
    "x": lambda x: x,
    "np.asarray(x)": lambda x: np.asarray(x),
    "x.astype(copy=False)": lambda x: x.astype(np.float64, copy=False),
    "x.T": lambda x: x.T,
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(FRESH))
def test_a_fresh_numpy_result_is_fresh(name, backend):
    fn = FRESH[name]
    x = np.arange(6.0).reshape(2, 3)
    assert not np.shares_memory(fn(x), x)
    r = tg.compile(fn, backend=backend)(x)
    assert not np.shares_memory(r, x)
    r[...] = -1.0
    np.testing.assert_array_equal(x, np.arange(6.0).reshape(2, 3))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(ALIASED))
def test_an_argument_returned_as_written_is_the_argument(name, backend):
    fn = ALIASED[name]
    x = np.arange(6.0).reshape(2, 3)
    r = tg.compile(fn, backend=backend)(x)
    np.testing.assert_array_equal(r, fn(x))
    if name in ("x", "np.asarray(x)", "x.astype(copy=False)"):
        assert r is x


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_gradient_is_never_the_callers_array(backend):
    # d/dx sum(x * y) is y; d/dx sum(x * c) is c (captured); d/dx sum(x * y.T)
    # is a view of y: each is returned as a new array, so an optimiser's
    # `g *= lr` leaves y and c as they were
    x, y = np.ones((3, 3)), np.arange(9.0).reshape(3, 3)
    c = np.linspace(0, 1, 9).reshape(3, 3)
    y0, c0 = y.copy(), c.copy()
    for f, args in ((tg.grad(lambda x, y: np.sum(x * y), backend=backend), (x, y)),
                    (tg.grad(lambda x: np.sum(x * c), backend=backend), (x,)),
                    (tg.grad(lambda x, y: np.sum(x * y.T), backend=backend), (x, y)),
                    (tg.grad(lambda x, y: np.sum(x * y[::-1]), backend=backend), (x, y))):
        for _ in range(2):
            g = f(*args)
            assert not np.shares_memory(g, y) and not np.shares_memory(g, c)
            g *= 0.5
    np.testing.assert_array_equal(y, y0)
    np.testing.assert_array_equal(c, c0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_constant_result_is_new_each_call(backend):
    f = tg.compile(lambda x: (np.zeros(3), x * 2.0), backend=backend)
    x = np.ones(3)
    r, _ = f(x)
    r[0] = 5.0
    np.testing.assert_array_equal(f(x)[0], np.zeros(3))
    # a linear function's gradient is a constant of the module
    g = tg.grad(lambda x: np.sum(x * 3.0), backend=backend)
    d = g(x)
    d *= 0.0
    np.testing.assert_array_equal(g(x), np.full(3, 3.0))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_captured_array_returned_as_written_is_that_array(backend):
    c = np.arange(3.0)
    r, _ = tg.compile(lambda x: (c, x * 2.0), backend=backend)(np.ones(3))
    assert r is c


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_results_of_one_node_are_two_arrays(backend):
    # (x * 2, x * 2) is one node after hash-consing, two arrays in NumPy
    x = np.ones(3)
    a, b = tg.compile(lambda x: (x * 2.0, x * 2.0), backend=backend)(x)
    assert not np.shares_memory(a, b)
    a *= 0.0
    np.testing.assert_array_equal(b, np.full(3, 2.0))
    p, q = tg.compile(lambda x: (x, x), backend=backend)(x)
    assert p is x and q is x


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_broadcast_gradient_is_a_writable_array(backend):
    # the gradient of a sum is a broadcast: a writable array, as eager
    # mode's and the native target's are (the NumPy target returned
    # NumPy's read-only broadcast view)
    x = np.ones((4, 3))
    w = np.arange(4.0)
    for f in (tg.grad(lambda x: np.sum(x), backend=backend),
              tg.grad(lambda x: np.sum(np.sum(x, axis=1) * w), backend=backend),
              tg.grad(lambda x: np.sum(np.sum(x, axis=1) ** 2), backend=backend)):
        d = f(x)
        assert d.flags.writeable and d.flags.c_contiguous
        want = f(x).copy()
        d *= 2.0
        np.testing.assert_array_equal(f(x), want)
    # a broadcast the function returns as written stays NumPy's view
    r = tg.compile(lambda x: np.broadcast_to(x[:, :1], (4, 3)), backend=backend)(x)
    np.testing.assert_array_equal(r, np.ones((4, 3)))
