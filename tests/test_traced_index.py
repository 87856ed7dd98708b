"""Integer and boolean arguments as traced values in indexing.

A step counter or batch index passed to a compiled function is traced (one
compilation for every value): ``data[i]``, ``data[idx]``, ``data[i * n:(i + 1)
* n]``, ``np.take`` and arithmetic on it record graph nodes.  Values follow
NumPy; gradients are checked against central finite differences or a
gradient written out with NumPy.
"""
from __future__ import annotations

import numpy as np
import pytest

import tracegrad as tg

RNG = np.random.default_rng(0)
DATA = RNG.random((100, 5))
W = RNG.random(5)


def fd_grad(f, w, eps=1e-6):
    """Central finite differences of a scalar function of the array w."""
    g = np.zeros_like(w)
    for j in np.ndindex(w.shape):
        d = np.zeros_like(w)
        d[j] = eps
        g[j] = (f(w + d) - f(w - d)) / (2 * eps)
    return g


def check(fn, w, *rest):
    """fn compiled gives NumPy's value and a gradient equal to finite differences."""
    value, grad = tg.value_and_grad(fn)(w, *rest)
    np.testing.assert_allclose(value, fn(w, *rest), rtol=1e-12)
    np.testing.assert_allclose(grad, fd_grad(lambda v: fn(v, *rest), w), rtol=1e-6, atol=1e-8)
    return grad


# --- the reproducers ------------------------------------------------------------------

def batch_loss(w, i):
    xb = DATA[i * 10:(i + 1) * 10]      # a slice with traced bounds, fixed length 10
    return np.sum((xb @ w) ** 2)


def pick(w, idx):
    return np.sum(DATA[idx] @ w)        # a global constant indexed by a traced int array


@pytest.mark.parametrize("i", [0, 3, 9])
def test_global_sliced_by_traced_bounds(i):
    grad = check(batch_loss, W, i)
    xb = DATA[i * 10:(i + 1) * 10]
    np.testing.assert_allclose(grad, 2 * xb.T @ (xb @ W), rtol=1e-12)


def test_global_indexed_by_traced_int_array():
    idx = np.array([1, 5, 7])
    grad = check(pick, W, idx)
    np.testing.assert_allclose(grad, DATA[idx].sum(axis=0), rtol=1e-12)


def test_traced_scalar_index_into_traced_array():
    g = check(lambda w, k: np.sum(w[k] * 2.0), W, 2)
    np.testing.assert_array_equal(g, [0, 0, 2, 0, 0])


def test_np_take_with_traced_indices_accumulates_duplicates():
    g = check(lambda w, k: np.sum(np.take(w, k) * np.array([1.0, 2.0, 3.0])), W,
              np.array([0, 0, 4]))
    np.testing.assert_array_equal(g, [3, 0, 0, 0, 3])


def test_slice_of_traced_array_by_traced_start():
    for k in (0, 1, 3):
        g = check(lambda w, k: (w[k:k + 2] * np.array([1.0, 5.0])).sum(), W, k)
        ref = np.zeros(5)
        ref[k:k + 2] = [1.0, 5.0]
        np.testing.assert_array_equal(g, ref)


def test_boolean_mask_argument_through_where():
    m = np.array([True, False, True, True, False])
    g = check(lambda w, m: np.sum(np.where(m, w, 0.0) ** 2), W, m)
    np.testing.assert_allclose(g, 2 * W * m, rtol=1e-12)


def test_int_argument_in_arithmetic():
    g = check(lambda w, s: np.sum(w * s + s ** 2), W, 3)
    np.testing.assert_array_equal(g, [3.0] * 5)


# --- one trace for every value ------------------------------------------------------------------

def test_minibatch_loop_traces_once_and_matches_numpy():
    X = RNG.standard_normal((100, 5))
    y = X @ np.array([1.0, -2.0, 0.5, 3.0, 0.0]) + 0.1 * RNG.standard_normal(100)

    def loss(w, i):
        xb, yb = X[i * 10:(i + 1) * 10], y[i * 10:(i + 1) * 10]
        return np.mean((xb @ w - yb) ** 2)

    step = tg.value_and_grad(loss)
    before = tg.cache_info()["traces"]
    w, w_ref, lr = np.zeros(5), np.zeros(5), 0.05
    losses, ref = [], []
    for t in range(20):
        i = t % 10
        value, g = step(w, i)
        w = w - lr * g
        losses.append(value)
        xb, yb = X[i * 10:(i + 1) * 10], y[i * 10:(i + 1) * 10]
        r = xb @ w_ref - yb
        ref.append(np.mean(r ** 2))
        w_ref = w_ref - lr * (2 / len(yb)) * xb.T @ r
    assert tg.cache_info()["traces"] - before == 1
    np.testing.assert_allclose(losses, ref, rtol=1e-10)
    np.testing.assert_allclose(w, w_ref, rtol=1e-10)
    assert ref[-1] < ref[0] / 2  # it trains


def test_traced_index_array_traces_once_per_shape():
    f = tg.grad(pick)
    before = tg.cache_info()["traces"]
    for idx in ([0, 1, 2], [97, 3, 3], [-1, -100, 50]):
        np.testing.assert_allclose(f(W, np.array(idx)), DATA[idx].sum(axis=0), rtol=1e-12)
    assert tg.cache_info()["traces"] - before == 1


def test_batch_index_into_a_closure_and_a_default():
    images = RNG.random((6, 4))
    labels = np.arange(6.0)

    def loss(w, idx, table=labels):
        return np.sum((images[idx] @ w - table[idx]) ** 2)

    idx = np.array([5, 0, 0, 2])
    w = RNG.random(4)
    g = check(loss, w, idx)
    r = images[idx] @ w - labels[idx]
    np.testing.assert_allclose(g, 2 * images[idx].T @ r, rtol=1e-12)


def test_np_take_of_a_global_and_a_list_of_traced_indices():
    f = lambda w, k: np.sum(np.take(DATA, k, axis=0) @ w)
    g = check(f, W, np.array([3, 3, 99]))
    np.testing.assert_allclose(g, DATA[[3, 3, 99]].sum(axis=0), rtol=1e-12)
    g = check(lambda w, a, b: np.sum(w[[a, b, 0]] ** 2), W, 4, -1)
    np.testing.assert_allclose(g, [2 * W[0], 0, 0, 0, 4 * W[4]], rtol=1e-12)
    # a global meeting a traced value in a NumPy function dispatched on both
    h = lambda w, i: np.sum(np.concatenate([DATA[i], w]))
    np.testing.assert_allclose(tg.compile(h)(W, 7), h(W, 7), rtol=1e-12)


# --- NumPy's semantics: negative and repeated indices, errors at run time ----------------------

def test_negative_traced_indices_wrap():
    f = tg.compile(lambda w, k: w[k])
    np.testing.assert_array_equal(f(W, np.array([-1, -5, 0])), W[[-1, -5, 0]])
    np.testing.assert_array_equal(f(DATA, -3), DATA[-3])
    g = check(lambda w, k: np.sum(w[k] ** 2), W, np.array([-1, 4, -1]))
    np.testing.assert_allclose(g, [0, 0, 0, 0, 6 * W[4]], rtol=1e-12)


def test_repeated_gather_indices_accumulate_in_the_gradient():
    x = RNG.random((4, 3))
    idx = np.array([[2, 2], [0, 2]])
    g = tg.grad(lambda x, i: np.sum(x[i] * np.arange(6.0).reshape(2, 1, 3)))(x, idx)
    ref = np.zeros_like(x)
    np.add.at(ref, idx, np.broadcast_to(np.arange(6.0).reshape(2, 1, 3), (2, 2, 3)))
    np.testing.assert_array_equal(g, ref)


def test_out_of_range_traced_index_raises_index_error_at_run_time():
    f = tg.grad(lambda w, k: np.sum(w[k]))
    np.testing.assert_array_equal(f(W, np.array([4])), [0, 0, 0, 0, 1])  # traced fine
    with pytest.raises(IndexError):
        f(W, np.array([5]))
    with pytest.raises(IndexError):
        f(W, np.array([-6]))
    with pytest.raises(IndexError):
        tg.grad(pick)(W, np.array([0, 100, 1]))


def test_slice_that_numpy_would_shorten_gives_numpys_shorter_result():
    """The compiled code keeps the length it was traced for; a call where
    NumPy's slice is shorter runs code specialised on the integer's value."""
    f = tg.grad(batch_loss)
    f(W, 9)  # the last full batch
    np.testing.assert_array_equal(f(W, 10), np.zeros_like(W))   # NumPy: an empty batch
    g = tg.compile(lambda w, k: w[k:k + 2])
    for k in (-3, -2, 4, -1, 1):
        np.testing.assert_array_equal(g(W, k), W[k:k + 2])
    # a start read from an array (not an integer argument) cannot specialise
    h = tg.compile(lambda w, ks: w[ks[0]:ks[0] + 2])
    np.testing.assert_array_equal(h(W, np.array([1])), W[1:3])
    with pytest.raises(IndexError, match=r"holds 1 elements.*traced for 2.*start in 0\.\.3"):
        h(W, np.array([4]))


def test_mixed_advanced_indices_follow_numpy():
    x = RNG.random((3, 4, 5, 6))
    i, j = np.array([[0, 2], [1, 1]]), np.array([4, -1])
    ct = RNG.random((2, 2, 4, 6))   # separated advanced axes go first (NumPy's rule)
    cases = [
        (lambda x, i, j: x[i, :, j], ct),
        (lambda x, i, j: x[:, 1:3, i, None][..., j], None),
        (lambda x, i, j: x[1, i, ..., ::-2][:, :, j], None),
        (lambda x, i, j: x[..., i, 2:5], None),
    ]
    for fn, c in cases:
        out = tg.compile(fn)(x, i, j)
        np.testing.assert_array_equal(out, fn(x, i, j))
        c = RNG.random(out.shape) if c is None else c
        g = tg.grad(lambda x, i, j: np.sum(fn(x, i, j) * c))(x, i, j)
        ref = np.zeros_like(x)
        pos = np.arange(x.size).reshape(x.shape)
        np.add.at(ref.reshape(-1), fn(pos, i, j).reshape(-1), c.reshape(-1))
        np.testing.assert_array_equal(g, ref)


def test_several_traced_slices_in_one_index():
    x = RNG.random((8, 9))
    fn = lambda x, a, b: x[a + 1:a + 4, ..., 2 * b:2 * b + 6:2]
    out = tg.compile(fn)(x, 2, 1)
    np.testing.assert_array_equal(out, fn(x, 2, 1))
    g = check(lambda x, a, b: np.sum(fn(x, a, b) ** 2), x, 2, 1)
    ref = np.zeros_like(x)
    ref[3:6, 2:8:2] = 2 * x[3:6, 2:8:2]
    np.testing.assert_allclose(g, ref, rtol=1e-12)


# --- what cannot be compiled: clear errors at trace time -----------------------------------------

def test_traced_boolean_mask_index_points_to_where():
    m = np.array([True, False, True, True, False])
    with pytest.raises(tg.TraceError, match=r"boolean array.*used as an index(.|\n)*np\.where"):
        tg.grad(lambda w, m: np.mean(w[m]))(W, m)   # (np.sum(w[m]) works: test_writes.py)
    with pytest.raises(tg.TraceError, match="np.where"):
        tg.compile(lambda w, m: DATA[m[:100 // 20 * 0 + 5]])(W, m)


def test_nonzero_of_a_traced_array_is_a_trace_error():
    with pytest.raises(tg.TraceError, match="nonzero"):
        tg.compile(lambda w: np.nonzero(w > 0.5))(W)


def test_slice_length_that_depends_on_a_value_is_a_trace_error():
    for fn in (lambda w, k: w[k:], lambda w, k: w[:k], lambda w, k: w[k:2 * k],
               lambda w, k: w[1:k + 1]):
        with pytest.raises(tg.TraceError, match=r"start \+ n.*tg\.dynamic_slice"):
            tg.compile(fn)(W, 1)
    with pytest.raises(tg.TraceError, match="traced step"):
        tg.compile(lambda w, k: w[0:4:k])(W, 1)


def test_float_start_is_rejected_like_numpy():
    with pytest.raises(TypeError, match="integer scalar"):
        tg.compile(lambda w, s: w[s:s + 2])(W, 1.0)


def test_a_slice_longer_than_the_axis_fails_at_trace_time():
    with pytest.raises(IndexError, match="NumPy would return fewer for every start"):
        tg.compile(lambda w, k: w[k:k + 6])(W, 0)


# --- the functional form, eager mode, the generated code --------------------------------------------

def test_dynamic_slice_and_update_functions():
    x = RNG.random((4, 7))
    f = tg.compile(lambda x, s: tg.dynamic_slice(x, s, 3, axis=1))
    np.testing.assert_array_equal(f(x, 2), x[:, 2:5])
    u = RNG.random((4, 2))
    h = tg.compile(lambda x, u, s: tg.dynamic_update_slice(x, u, s, axis=-1))
    ref = x.copy()
    ref[:, 5:7] = u
    np.testing.assert_array_equal(h(x, u, 5), ref)
    gu = tg.grad(lambda u, x, s: np.sum(tg.dynamic_update_slice(x, u, s, axis=1) ** 2))(u, x, 1)
    np.testing.assert_allclose(gu, 2 * u, rtol=1e-12)
    # eagerly on Tensors, with a gradient through the tape
    t = tg.tensor(x, requires_grad=True)
    tg.dynamic_slice(t, tg.tensor(np.array(1)), 2).sum().backward()
    ref = np.zeros_like(x)
    ref[1:3] = 1
    np.testing.assert_array_equal(t.grad.numpy(), ref)


def test_eager_tensor_indexed_by_int_tensor():
    t = tg.tensor(W, requires_grad=True)
    k = tg.tensor(np.array([4, 4, 0]))
    (t[k] * tg.tensor(np.array([1.0, 2.0, 3.0]))).sum().backward()
    np.testing.assert_array_equal(t.grad.numpy(), [3, 0, 0, 0, 3])
    np.testing.assert_array_equal(t[1:3].detach().numpy(), W[1:3])


def test_second_derivatives_and_jacobian_through_dynamic_slice():
    x = RNG.random(6)
    f = lambda x, k: np.sum(x[k:k + 3] ** 3)
    H = tg.hessian(f)(x, 2)
    np.testing.assert_allclose(H, np.diag(np.where((np.arange(6) >= 2) & (np.arange(6) < 5),
                                                   6 * x, 0.0)), rtol=1e-12)
    J = tg.jacobian(lambda x, k: x[k:k + 2] * 2.0)(x, 3)
    np.testing.assert_array_equal(J, 2.0 * np.eye(6)[3:5])


def test_generated_code_is_plain_numpy_indexing():
    src = tg.grad(batch_loss).lower(W, 3).source
    assert "_dynamic_slice_index(" in src and "def _dynamic_slice_index" in src
    src = tg.grad(pick).lower(W, np.array([1, 2])).source
    assert "[idx]" in src or "[idx," in src


def test_constants_are_left_untouched():
    tg.grad(pick)(W, np.array([1, 2]))
    assert type(DATA) is np.ndarray and type(globals()["DATA"]) is np.ndarray

    # inside the trace the array behaves as NumPy's: concrete results, plain ndarrays
    seen = {}

    def f(w, i):
        seen["type_of_sum"] = type(DATA.sum())
        seen["slice"] = type(DATA[2:4] * 2)
        seen["branch"] = bool(DATA[0, 0] >= 0)
        return np.sum(DATA[i] * w)

    tg.grad(f)(W, 1)
    assert seen == {"type_of_sum": np.float64, "slice": np.ndarray, "branch": True}


def test_global_assignment_and_nonlocal_state_in_a_traced_function():
    calls = [0]

    def f(w, i):
        calls[0] += 1
        return np.sum(DATA[i] * w)

    tg.grad(f)(W, 0)
    tg.grad(f)(W, 1)
    assert calls[0] == 1  # one trace, the list mutated in place


TRACES_SEEN = 0


def test_a_global_the_traced_function_assigns_reaches_the_module():
    def f(w, i):
        global TRACES_SEEN
        TRACES_SEEN += 1            # a side effect at trace time, as without tracing
        return np.sum(DATA[i] * w)
    before = TRACES_SEEN
    tg.grad(f)(W, 0)
    assert TRACES_SEEN == before + 1
    assert type(DATA) is np.ndarray   # the module's array stays itself


def test_flat_positions_wrap_negative_indices_as_indexing_does():
    # the gradient of a gather scatters to these positions: negative indices
    # wrap (some, all or none negative), index arrays broadcast, and a
    # leading slice or an empty dimension keeps its meaning
    from tracegrad.ops.runtime_numpy import _flat_positions
    rng = np.random.default_rng(0)
    cases = [((5, 7), (np.arange(5)[:, None], rng.integers(-7, 7, (5, 3)))),
             ((5, 7), (rng.integers(-5, 5, (1, 4)), rng.integers(-7, 7, (3, 1)))),
             ((5, 7), (rng.integers(-5, 0, (4,)), rng.integers(-7, 0, (4,)))),
             ((2, 5, 7), (slice(None), rng.integers(-5, 5, (4,)), rng.integers(0, 7, (4,)))),
             ((3, 4, 5), (rng.integers(0, 3, (2, 2)), rng.integers(-4, 4, (2, 1)),
                          rng.integers(0, 5, (1, 2)))),
             ((6,), (rng.integers(-6, 6, (40,)),)), ((6,), (rng.integers(0, 6, (4,)),)),
             ((0, 3), (np.zeros((0,), np.int64), np.zeros((0,), np.int64)))]
    for shape, idx in cases:
        size = int(np.prod(shape))
        want = np.arange(size).reshape(shape)[idx]
        got = _flat_positions(shape, size, idx)
        assert got.shape == want.shape and np.array_equal(got, want), (shape, idx)
