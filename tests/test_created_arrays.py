"""Arrays the user's function creates, and writes into them and through
their views (tracegrad/frontend/created.py, ``Tracer._assign`` in
tracegrad/frontend/trace.py, the eager view histories in
tracegrad/eager/torch_methods.py): NumPy's meaning compiled and with
compile=False, gradients equal to finite differences."""
from __future__ import annotations

import numpy as np
import pytest

import tracegrad as tg

RNG = np.random.default_rng(24)
MODES = [True, False]


def _fd(f, x, eps=1e-6):
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[i] = eps
        g[i] = (f(x + e) - f(x - e)) / (2 * eps)
    return g


def _check(f, x, compile):
    """f's value and gradient through tracegrad against NumPy and finite
    differences (NumPy gets a copy: its writes must not reach x)."""
    value, grad = tg.value_and_grad(f, compile=compile)(x.copy())
    np.testing.assert_allclose(value, f(x.copy()), rtol=1e-12)
    np.testing.assert_allclose(grad, _fd(lambda v: f(v.copy()), x), rtol=1e-6, atol=1e-8)


def max_into_zeros(x):
    y = np.zeros(2)
    y[0] = np.max(x)
    y[1] = 2.0
    return np.sum(y ** 2)


def simulation(x):
    out = np.zeros(6)
    out[0] = x[0]
    for i in range(1, 6):
        out[i] = np.sin(out[i - 1]) * x[1] + x[2]
    return np.sum(out * np.arange(6.0))


def two_d_state(x):
    s = np.zeros((3, 4))
    s[:, 0] = x
    for t in range(1, 4):
        s[:, t] = np.tanh(s[:, t - 1]) + 0.5 * x
    s[1, 2] += x[0] * x[2]
    return np.sum(s ** 2)


def every_creator(x):
    a = np.ones(3) * 2.0
    a[1] = x[0]
    b = np.empty((2, 3))
    b[...] = x
    c = np.full(3, 0.5)
    c[::2] *= x[1]
    d = np.zeros_like(a)
    d[[0, 2]] = x[1:]
    e = np.copy(a)
    e[0] = x[2] ** 2
    f = np.array([x[0], 2 * x[1], 1.0])
    f[2] = x[2]
    return np.sum(a * c) + np.sum(b ** 2) + np.sum(d * e) + np.sum(f ** 3)


def through_views(x):
    y = np.zeros((3, 3))
    row = y[1]
    row[:] = x                  # seen through y
    y.T[0, 2] = x[0] * 3        # a transposed view
    col = y[:, 2]
    y[2, 2] = 7.0 * x[1]        # a write into the base is seen through col
    flat = y.reshape(-1)
    flat[0] = x[2]
    return np.sum(col * x) + np.sum(y ** 2)


def helper_makes_buffer(n, v):
    buf = np.zeros(n)
    buf[1:] = v[:-1]
    return buf


def with_helper(x):
    return np.sum(helper_makes_buffer(3, x) * x)


def masks_and_ranges(x):
    y = x * 1.0
    y[range(2)] -= 1.0          # a range is an integer index
    y[x > 0.0] = 0.5            # a traced mask, a scalar value
    z = np.zeros(3, dtype=np.int64)
    z[1] = 2.7                  # cast to the array's dtype, as NumPy does
    return np.sum(y * x) + z[1]


def concrete_until_written(x):
    counts = np.zeros(3, dtype=int)
    counts[1] += 2              # still a constant: usable as a count
    acc = np.zeros(3)
    for _ in range(counts[1]):
        acc = acc + x
    mask = np.zeros(3, bool)
    mask[[0, 2]] = True
    return np.sum(acc * x) + np.sum(x[mask])


def row_simulation(x):
    out = np.zeros((5, 3))      # out[i - 1] is a view that a later write changes
    out[0] = x
    for i in range(1, 5):
        out[i] = np.sin(out[i - 1]) * 0.9 + x
    return np.sum(out ** 2)


CASES = [max_into_zeros, simulation, row_simulation, two_d_state, every_creator, through_views, with_helper,
         masks_and_ranges, concrete_until_written]


@pytest.mark.parametrize("compile", MODES, ids=["compiled", "eager"])
@pytest.mark.parametrize("f", CASES, ids=lambda f: f.__name__)
def test_writes_into_created_arrays_mean_what_numpy_means(f, compile):
    _check(f, RNG.uniform(-1.5, 1.5, 3), compile)


@pytest.mark.parametrize("f", [simulation, through_views], ids=lambda f: f.__name__)
def test_forward_mode_through_writes(f):
    x, v = RNG.uniform(-1, 1, 3), RNG.standard_normal(3)
    _, tangent = tg.jvp(f, (x,), (v,))
    np.testing.assert_allclose(tangent, _fd(f, x) @ v, rtol=1e-6, atol=1e-8)


def test_nested_eager_transforms_see_writes():
    def f(x):
        y = np.zeros(2)
        y[0] = np.sin(x)
        y[1] = x ** 3
        return np.sum(y)
    for outer, inner in [(False, False), (True, False), (False, True)]:
        g2 = tg.grad(tg.grad(f, compile=inner), compile=outer)(0.7)
        np.testing.assert_allclose(g2, -np.sin(0.7) + 6 * 0.7, rtol=1e-12)


GLOBAL_PLAIN = np.zeros(3)


@pytest.mark.parametrize("compile", MODES, ids=["compiled", "eager"])
def test_a_write_into_a_plain_array_is_a_clear_error(compile):
    def f(x):
        GLOBAL_PLAIN[0] = np.sum(x)
        return np.sum(GLOBAL_PLAIN)
    with pytest.raises(TypeError, match=r"plain NumPy array(.|\n)*GLOBAL_PLAIN\[0\] = np.sum"
                                        r"(.|\n)*np.copy"):
        tg.grad(f, compile=compile)(np.ones(3))
    np.testing.assert_array_equal(GLOBAL_PLAIN, 0.0)


def test_a_write_into_an_argument_is_a_clear_error_naming_the_copy():
    def f(x):
        x[0] = 1.0
        return np.sum(x)
    with pytest.raises(tg.TraceError, match=r"caller's array(.|\n)*x = x.copy\(\)"):
        tg.grad(f)(np.ones(3))

    def g(x):                   # what the message suggests
        x = x.copy()
        x[0] = 1.0
        return np.sum(x * x)
    np.testing.assert_allclose(tg.grad(g)(np.full(3, 2.0)), [0.0, 4.0, 4.0])


def test_a_body_cannot_write_into_an_outer_array():
    def f(x):
        y = np.zeros(3)

        def body(i, c):
            y[0] = c            # y belongs to the enclosing trace
            return c + x
        c = tg.fori_loop(0, 3, body, x)
        return np.sum(c) + np.sum(y)
    with pytest.raises(tg.TraceError, match="outside a loop or branch body"):
        tg.grad(f)(np.ones(3))


def test_creators_outside_a_trace_are_numpys_own():
    import tracegrad.frontend.created as created
    assert np.zeros is created._ORIGINALS["zeros"]
    assert type(np.zeros(3)) is np.ndarray


def test_asarray_of_a_traced_value_is_the_value():
    f = tg.compile(lambda x: np.asarray(x) * 2 + np.array(x)[::-1])
    np.testing.assert_allclose(f(np.arange(3.0)), [2.0, 3.0, 4.0])


def test_the_last_partial_minibatch_gets_numpys_shorter_slice():
    X = RNG.standard_normal((1500, 3))

    def batch_loss(w, X, i):
        b = 256
        return np.sum(np.tanh(X[i * b:(i + 1) * b] @ w))

    def epoch(w, X):
        total = 0.0
        for i in range(6):          # a rolled loop: its last iteration is partial
            total = total + batch_loss(w, X, i)
        return total
    w = RNG.standard_normal(3)
    for compile in MODES:
        for i in (0, 5):            # 5: rows 1280..1499, 220 of them
            v, g = tg.value_and_grad(batch_loss, compile=compile)(w, X, i)
            np.testing.assert_allclose(v, batch_loss(w, X, i), rtol=1e-12)
            np.testing.assert_allclose(g, _fd(lambda u: batch_loss(u, X, i), w), rtol=1e-6)
        v, g = tg.value_and_grad(epoch, compile=compile)(w, X)
        np.testing.assert_allclose(v, epoch(w, X), rtol=1e-12)
        np.testing.assert_allclose(g, _fd(lambda u: epoch(u, X), w), rtol=1e-6)
