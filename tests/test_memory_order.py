"""The statement order and buffer reuse of generated NumPy code (issue 29,
item 6): few buffers alive at once, never a buffer reused while something
still reads it, and draws from NumPy's random state in the order written."""
import re
import tracemalloc

import networkx as nx
import numpy as np
import pytest

import tracegrad as tg
from tracegrad.ir import graph as ir


def chain(x, y):
    return np.sum(np.tanh(x) * np.exp(-y ** 2) + np.log1p(x ** 2) * np.sin(y))


def mlp(W1, b1, W2, b2, X, Y):
    h = np.tanh(X @ W1 + b1)
    return np.mean((h @ W2 + b2 - Y) ** 2)


def _mlp_args(b, hid, seed):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((64, hid)) * 0.1, np.zeros(hid),
            rng.standard_normal((hid, 10)) * 0.1, np.zeros(10),
            rng.standard_normal((b, 64)), rng.standard_normal((b, 10))]


def _equals_eager(got, args):
    v, grads = got
    eager = tg.value_and_grad(mlp, argnums=(0, 1, 2, 3), compile=False)(*args)
    np.testing.assert_allclose(v, eager[0], rtol=1e-12)
    for a, e in zip(grads, eager[1]):
        np.testing.assert_allclose(a, e, rtol=1e-10, atol=1e-14)


def _peak(call):
    call()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        out = call()
        return tracemalloc.get_traced_memory()[1], out
    finally:
        tracemalloc.stop()


def test_backward_statements_run_as_soon_as_they_end_a_buffer():
    # forward then backward held seven float64[n] arrays at once; the order
    # that frees as it goes holds five (two of them the gradients)
    n = 200_000
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal(n), rng.standard_normal(n)
    vg = tg.value_and_grad(chain, argnums=(0, 1), backend="numpy")
    peak, (v, (gx, gy)) = _peak(lambda: vg(x, y))
    assert peak <= 5.3 * x.nbytes, peak / x.nbytes
    t, e, l1, s = np.tanh(x), np.exp(-y * y), np.log1p(x * x), np.sin(y)
    np.testing.assert_allclose(v, np.sum(t * e + l1 * s), rtol=1e-12)
    np.testing.assert_allclose(gx, (1 - t * t) * e + 2 * x / (1 + x * x) * s, rtol=1e-10, atol=1e-15)
    np.testing.assert_allclose(gy, -2 * y * t * e + l1 * np.cos(y), rtol=1e-12, atol=1e-15)


def test_a_buffer_with_dead_views_is_reused_and_freed():
    # h is read through h.T (a view) by the gradient of W2; once that view
    # is dead, 1 - h*h goes into h's buffer, and dead buffers are deleted
    b, hid = 512, 256
    args = _mlp_args(b, hid, seed=1)
    vg = tg.value_and_grad(mlp, argnums=(0, 1, 2, 3), backend="numpy")
    src = vg.lower(*args).source
    assert "del " in src
    peak, got = _peak(lambda: vg(*args))
    assert peak <= 2.3 * b * hid * 8, peak / (b * hid * 8)   # two batch x hidden arrays
    _equals_eager(got, args)


def test_a_pooled_buffer_no_later_value_takes_is_freed():
    # r*r (batch x 10) dies at the sum; it waited in the pool for the one
    # later value of its shape, which went into r's own buffer instead
    # (out=): it is now freed before the batch x hidden product d @ W2.T
    args = _mlp_args(1024, 64, seed=2)
    vg = tg.value_and_grad(mlp, argnums=(0, 1, 2, 3), backend="numpy")
    lines = [ln.split("#")[0].strip() for ln in vg.lower(*args).source.splitlines()]
    square = next(m.group(1) for ln in lines
                  if (m := re.fullmatch(r"(t\d+) = np\.multiply\((t\d+), \2\)", ln)))
    w2t = next(ln.split(" = ")[0] for ln in lines if ln.endswith("= W2.transpose((1, 0))"))
    product = next(i for i, ln in enumerate(lines) if f", {w2t})" in ln and "np.matmul(" in ln)
    assert f"del {square}" in lines[:product], "\n".join(lines)
    _equals_eager(vg(*args), args)


@pytest.mark.parametrize("backend", ["numpy", "native"])
@pytest.mark.parametrize("n", [0.0, 2.0])
def test_a_loop_that_hands_its_operand_back_keeps_it(backend, n):
    # with no iterations the loop's result IS its operand's buffer: that
    # buffer must not be reused while the result lives
    def f(x, n):
        a = np.sin(x)
        c = tg.while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1.0, c[1] * 2.0),
                          (np.float64(0.0), a))
        b = np.cos(x) * 3.0
        return c[1] + b
    x = np.linspace(0, 1, 5)
    got = tg.compile(f, backend=backend)(x, n)
    np.testing.assert_allclose(got, 2.0 ** n * np.sin(x) + 3 * np.cos(x), rtol=1e-14)


@pytest.mark.parametrize("backend", ["numpy", "native"])
def test_random_draws_keep_the_order_written(backend):
    # the small draw would free nothing and allocate little: a scheduler that
    # only counted bytes would move it before the large one
    def f(w):
        big = np.random.normal(size=50_000)
        small = np.random.uniform(size=3)
        return np.sum(w * small) + np.mean(big) * np.sum(w)
    w = np.arange(3.0)
    cf = tg.compile(f, backend=backend)
    cf(w)
    np.random.seed(5)
    got = cf(w)
    np.random.seed(5)
    want = f(w)
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_memory_order_is_a_topological_order_of_every_node():
    vg = tg.value_and_grad(mlp, argnums=(0, 2), backend="numpy")
    rng = np.random.default_rng(2)
    args = [rng.standard_normal((8, 16)), np.zeros(16), rng.standard_normal((16, 3)),
            np.zeros(3), rng.standard_normal((5, 8)), rng.standard_normal((5, 3))]
    g = vg.lower(*args).graph
    order = ir.memory_order(g)
    assert sorted(order) == sorted(g.nodes)
    pos = {v: i for i, v in enumerate(order)}
    assert all(pos[a] < pos[b] for a, b in g.edges())
    assert order == ir.memory_order(g)         # deterministic
    cyc = nx.MultiDiGraph(g)
    a, b = order[-1], order[0]
    cyc.add_edge(a, b, key=99, pos=99)
    with pytest.raises(nx.NetworkXUnfeasible):
        ir.memory_order(cyc)


def test_eager_gradient_sums_added_in_place_stay_separate():
    # the sum for n's gradient (two readers) passes through add's backward to
    # a and b unchanged; a has two more readers: adding into that sum in place
    # would change b's gradient too
    def f(x):
        a = np.sin(x)
        b = np.cos(x)
        n = a + b
        m = n * n + n * 3.0
        return np.sum(m + a * a + a * 2.0 + b)
    x = np.linspace(-1, 1, 7)
    eager = tg.grad(f, compile=False)(x)
    compiled = tg.grad(f, backend="numpy")(x)
    np.testing.assert_allclose(eager, compiled, rtol=1e-12)


def test_compile_false_reads_the_arguments_without_copying_them():
    n = 200_000
    x = np.linspace(0, 1, n)
    vg = tg.value_and_grad(lambda x: np.sum(x * 2.0), compile=False)
    peak, (v, g) = _peak(lambda: vg(x))
    assert peak < 2.6 * x.nbytes, peak / x.nbytes    # x * 2.0 and the gradient
    np.testing.assert_allclose(g, np.full(n, 2.0))
    assert x.flags.writeable     # the caller's array is untouched

    def writes(x):
        x[0] = 1.0
        return np.sum(x)
    with pytest.raises(TypeError, match=r"into an argument of the function"):
        tg.grad(writes, compile=False)(x)
    assert x[0] == 0.0
