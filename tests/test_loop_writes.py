"""Python loops whose body writes into an array (``out[i] = f(out[i - 1])``,
``acc[i] += v``) rewritten into one scan node (tracegrad.frontend.loop_rewrite):
the array is a carried value updated in place, the loop index reads and writes
the right row, and whatever would make the loop node differ from NumPy (an
array sharing memory with the carried one) traces the loop as written."""
import os

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.frontend import loop_rewrite

X = np.array([0.3, -0.2, 0.5])
A = 0.7


def _ops(g):
    return [d["op"] for _, d in g.nodes(data=True)]


def _graph(fn, *args, argnums=0):
    return tg.grad(fn, argnums=argnums).lower(*args).graph


def _unrolled(fn, *args, argnums=0):
    """fn's value and gradient with neither rewriting nor rolling."""
    old = os.environ.get("TRACEGRAD_ROLL")
    os.environ["TRACEGRAD_ROLL"] = "0"
    try:
        assert "scan" not in _ops(_graph(fn, *args, argnums=argnums))
        return tg.value_and_grad(fn, argnums=argnums)(*args)
    finally:
        if old is None:
            del os.environ["TRACEGRAD_ROLL"]
        else:
            os.environ["TRACEGRAD_ROLL"] = old


def _fd(fn, x, *rest, eps=1e-6):
    """Central finite differences of fn with respect to the array x."""
    g = np.zeros_like(x)
    for k in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[k] = eps
        g[k] = (fn(x + e, *rest) - fn(x - e, *rest)) / (2 * eps)
    return g


def _check(fn, x, *rest, rtol=1e-9, fd_rtol=1e-6, rolled=True):
    """Value and gradient of the compiled fn against NumPy, finite
    differences and the unrolled trace; the forward-mode derivative along a
    direction against the reverse-mode one.  Returns the grad's graph."""
    want = fn(x, *rest)
    np.testing.assert_allclose(tg.compile(fn)(x, *rest), want, rtol=rtol)
    v, g = tg.value_and_grad(fn)(x, *rest)
    np.testing.assert_allclose(v, want, rtol=rtol)
    np.testing.assert_allclose(g, _fd(fn, x, *rest), rtol=fd_rtol, atol=1e-7)
    v0, g0 = _unrolled(fn, x, *rest)
    np.testing.assert_allclose(v0, want, rtol=rtol)
    np.testing.assert_allclose(g, g0, rtol=rtol, atol=1e-12)
    d = np.linspace(1.0, -0.5, x.size).reshape(x.shape)
    out, t = tg.jvp(lambda y: fn(y, *rest), (x,), (d,))
    np.testing.assert_allclose(out, want, rtol=rtol)
    np.testing.assert_allclose(t, np.sum(g * d), rtol=1e-9, atol=1e-10)
    graph = _graph(fn, x, *rest)
    if rolled is not None:      # None: the loop may be rolled after tracing
        assert ("scan" in _ops(graph)) == rolled
    return graph


# --- out[i] = f(out[i - 1], ...) -------------------------------------------------------------

def _sim_rows(n):
    def sim(x, a):
        out = np.zeros((n, 3))
        out[0] = x
        for i in range(1, n):
            out[i] = np.sin(out[i - 1]) * a + x
        return np.sum(out ** 2) + out[-1, 0]
    return sim


def _sim_scalar(n):
    def sim(x, a):
        out = np.zeros(n)
        out[0] = x[0]
        for i in range(1, n):
            out[i] = np.sin(out[i - 1]) * a + x[1] * out[i - 1] + x[2]
        return np.sum(out * np.arange(n) / n)
    return sim


def _sim_cols(n):
    def sim(x, a):
        out = np.zeros((3, n))
        out[:, 0] = x
        for i in range(1, n):
            out[:, i] = np.cos(out[:, i - 1]) * a + x * out[:, i - 1]
        return np.sum(np.tanh(out))
    return sim


def _sim_row_slices(n):
    def sim(x, a):
        out = np.zeros((n, 3))
        out[0, :] = x
        for i in range(1, n):
            out[i, :] = np.sin(out[i - 1, :]) * a + x
            out[i, 1] = out[i, 0] * out[i - 1, 2]       # j a Python int
            out[i, 2] += 0.1 * out[i, 1]
        return np.sum(out ** 2)
    return sim


@pytest.mark.parametrize("make", [_sim_rows, _sim_scalar, _sim_cols, _sim_row_slices])
def test_a_simulation_writing_its_state_rows_is_one_scan_node(make):
    graph = _check(make(200), X, A)
    # the graph does not grow with the number of steps
    big = _graph(make(2000), X, A)
    assert len(big.nodes) == len(graph.nodes)
    lengths = sorted(d["attrs"]["length"] for _, d in big.nodes(data=True) if d["op"] == "scan")
    assert 2000 - 1 - loop_rewrite.PEELED - 1 in lengths


def test_gradient_with_respect_to_a_scalar_parameter_too():
    sim = _sim_rows(100)
    ga = tg.grad(sim, argnums=1)(X, A)
    eps = 1e-6
    np.testing.assert_allclose(ga, (sim(X, A + eps) - sim(X, A - eps)) / (2 * eps), rtol=1e-6)
    np.testing.assert_allclose(ga, _unrolled(sim, X, A, argnums=1)[1], rtol=1e-10)


def test_the_rewritten_loop_is_named_by_explain(capfd, monkeypatch):
    monkeypatch.setenv("TRACEGRAD_EXPLAIN", "1")
    sim = _sim_rows(150)
    tg.grad(sim).lower(X, A)
    err = capfd.readouterr().err
    assert "into one scan node: 146 iterations" in err


def test_accumulating_into_items():
    def f(x, a):
        acc = np.zeros((4, 3))
        tot = np.zeros(40)
        for i in range(40):
            acc[i % 4] += np.sin(x * i) * a
            tot[i] += np.sum(x) * i
            tot[39 - i] -= x[1]
        return np.sum(acc ** 2) + np.sum(np.cos(tot))
    _check(f, X, A)


def test_negative_and_computed_indices_mean_what_they_mean_in_numpy():
    def f(x, a):
        out = np.zeros((120, 3))
        out[0] = x
        for i in range(1, 120):
            # out[-i] wraps around; out[2 * i // 3 + 1, 1] reads a row already written
            out[i] = np.sin(out[i - 1]) * a + x + out[-i][0] + out[2 * i // 3 + 1, 1]
        return np.sum(out)
    _check(f, X, A)


def test_a_step_and_an_offset_range():
    def f(x, a):
        out = np.zeros((61, 3))
        out[1] = x
        for i in range(3, 61, 2):
            out[i] = np.sin(out[i - 2]) * a + x
            out[i - 1] = 0.5 * (out[i] + out[i - 2])
        return np.sum(out ** 2)
    _check(f, X, A)


def test_writes_through_a_row_view_and_elements_as_copies():
    def f(x, a):
        out = np.zeros((100, 3))
        out[0] = x
        for i in range(1, 100):
            row = out[i]            # a view: writing it writes out
            row[:] = np.sin(out[i - 1]) * a + x
            v = out[i - 1, 0]       # an element: a NumPy scalar, a copy
            v *= 3.0
            out[i, 1] += v
        return np.sum(out)
    _check(f, X, A)


def test_an_array_made_inside_the_body():
    def f(x, a):
        s = np.zeros(3)
        for i in range(60):
            t = np.zeros(3)
            t[i % 3] = x[i % 3] * i
            t[0] += a
            s = s + np.sin(t)
        return np.sum(s ** 2)
    _check(f, X, A)


def test_nested_loops_writing_a_matrix():
    def f(x, a):
        m = np.zeros((30, 3))
        m[0] = x
        for i in range(1, 30):
            for j in range(3):
                m[i, j] = np.sin(m[i - 1, (j + 1) % 3]) * a + x[j]
        return np.sum(m ** 2)
    _check(f, X, A)


def test_an_index_out_of_bounds_is_numpys_index_error():
    def f(x):
        out = np.zeros((50, 3))
        for i in range(50):
            out[i + 1] = np.sin(x) * i
        return out.sum()
    with pytest.raises(IndexError):
        f(X)
    with pytest.raises(IndexError):
        tg.grad(f)(X)


# --- aliasing: the loop is traced as written, and the numbers are NumPy's -----------------------

def _view_read_in_body(x, a):
    out = np.zeros((60, 3))
    out[0] = x
    view = out[1:]          # a view of out the body reads: it sees every update
    for i in range(2, 60):
        out[i] = np.sin(view[i - 2]) * a + x
    return np.sum(out ** 2) + np.sum(view)


def _carried_is_a_view(x, a):
    big = np.zeros((61, 3))
    out = big[1:]           # writes into out are writes into big
    out[0] = x
    for i in range(1, 60):
        out[i] = np.sin(out[i - 1]) * a + x
    return 2 * np.sum(big ** 2) + np.sum(out)


def _carried_row_view(x, a):
    out = np.zeros((60, 3))
    out[0] = x
    prev = out[0]           # a carried view of out: out[i - 1] += 1 changes it
    for i in range(1, 60):
        out[i - 1] += a
        out[i] = np.sin(prev) + x
        prev = out[i]
    return np.sum(out ** 2)


def _same_array_by_another_name(x, a):
    out = np.zeros((60, 3))
    other = out
    out[0] = x
    for i in range(1, 60):
        out[i] = np.sin(other[i - 1]) * a + x
    return np.sum(out ** 2)


@pytest.mark.parametrize("fn, why", [
    (_view_read_in_body, "reads a carried array by another name ('out'"),
    (_carried_is_a_view, "'out' is a view of another array"),
    (_carried_row_view, "'prev' is a view of another array"),
    (_same_array_by_another_name, "reads a carried array by another name"),
])
def test_an_aliased_array_traces_the_loop_as_written(fn, why, capfd, monkeypatch):
    monkeypatch.setenv("TRACEGRAD_EXPLAIN", "1")
    _check(fn, X, A, rolled=False)
    err = capfd.readouterr().err
    assert "as written" in err and why in err, err


def test_items_of_a_list_are_not_carried_as_an_array(capfd, monkeypatch):
    monkeypatch.setenv("TRACEGRAD_EXPLAIN", "1")
    monkeypatch.setattr(loop_rewrite, "ROLL_MIN_NODES", 16)

    def f(x, a):
        hist = [None] * 40
        s = x * 0
        for i in range(40):
            hist[i] = np.sin(x * i) * a
            s = s + hist[i]
        return np.sum(s ** 2) + np.sum(hist[7])
    _check(f, X, A, rolled=False)
    assert "items of 'hist', a list" in capfd.readouterr().err


STATE = np.zeros(3)


def test_items_of_a_global_keep_the_loop_as_written(capfd, monkeypatch):
    monkeypatch.setenv("TRACEGRAD_EXPLAIN", "1")

    def f(x):
        for i in range(10):
            STATE[i % 3] = i        # not a local name: the rewrite would make it one
        return np.sum(x * STATE)
    assert loop_rewrite.rewrite(f) is None
    assert "'STATE', which is not a local variable" in capfd.readouterr().err
    np.testing.assert_allclose(tg.compile(f)(X), f(X))


def test_the_eager_mode_gives_the_same_numbers():
    def f(x, a):
        out = np.zeros((80, 3))
        out[0] = x
        for i in range(1, 80):
            out[i] = np.sin(out[i - 1].copy()) * a + x
        acc = np.zeros((4, 3))
        for i in range(80):
            acc[i % 4] += out[i] * i
        return np.sum(out ** 2) + np.sum(np.tanh(acc))
    assert "scan" in _ops(_graph(f, X, A))
    v, g = tg.value_and_grad(f, argnums=(0, 1))(X, A)
    ve, ge = tg.value_and_grad(f, argnums=(0, 1), compile=False)(X, A)
    np.testing.assert_allclose(v, ve, rtol=1e-12)
    np.testing.assert_allclose(g[0], ge[0], rtol=1e-10)
    np.testing.assert_allclose(g[1], ge[1], rtol=1e-10)


def test_an_item_of_an_item_keeps_the_loop_as_written(capfd, monkeypatch):
    monkeypatch.setenv("TRACEGRAD_EXPLAIN", "1")

    def f(x, a):
        out = np.zeros((60, 3))
        out[0] = x
        for i in range(1, 60):
            out[i][0] = np.sin(out[i - 1][1]) * a + x[0]    # out[i] is a view: out changes
            out[i][1:] = np.cos(out[i - 1][:2]) * a
        return np.sum(out ** 2)
    _check(f, X, A, rolled=False)
    assert "item of an expression" in capfd.readouterr().err


def test_an_element_read_by_integers_is_a_copy_as_in_numpy():
    def f(x):
        out = np.zeros(3)
        out[:] = x
        v = out[0]          # a NumPy scalar, not a view of out
        v += 1.0
        m = np.zeros((2, 3))
        m[1] = x
        w = m[1, 2]
        w *= 4.0
        e = m[1, 0, ...]    # with an Ellipsis, a 0-d array: a view, it writes into m
        e += 1.0
        return np.sum(out) + v + np.sum(m) + w
    np.testing.assert_allclose(tg.compile(f)(X), f(X), rtol=1e-12)
    np.testing.assert_allclose(tg.grad(f)(X), _fd(f, X), rtol=1e-6)


PERM = np.array([2, 0, 1, 3, 1, 0] * 10)


def test_rows_at_integers_read_from_an_array_are_views(capfd, monkeypatch):
    # PERM[i] is a NumPy integer: out[PERM[i]] is a view of out, as out[2] is
    monkeypatch.setenv("TRACEGRAD_EXPLAIN", "1")

    def through_a_view(x, a):      # out is not named as written: the loop stays
        out = np.zeros((4, 3))
        out[0] = x
        for i in range(1, 60):
            row = out[PERM[i]]
            row += np.sin(out[i % 4]) * a
        return np.sum(out ** 2)

    def by_item(x, a):
        out = np.zeros((4, 3))
        out[0] = x
        for i in range(1, 60):
            out[PERM[i]] += np.sin(out[i % 4]) * a
            row = out[PERM[(i + 1) % 60]]
            row *= 0.9
        return np.sum(out ** 2)
    _check(through_a_view, X, A, rolled=False)
    assert "of a view, taken inside a loop or branch body, of an array made outside it" \
        in capfd.readouterr().err
    _check(by_item, X, A)


def test_a_row_at_a_0d_array_index_traces_the_loop_as_written(capfd, monkeypatch):
    # k is a 0-d array: out[k] is a copy in NumPy (and in the trace), but a
    # traced 0-d integer could also be a NumPy integer (a view): the loop stays
    monkeypatch.setenv("TRACEGRAD_EXPLAIN", "1")

    def f(x, a, k):
        out = np.zeros((4, 3))
        out[0] = x
        acc = np.zeros(3)
        for i in range(1, 60):
            out[i % 4] = np.sin(out[(i - 1) % 4]) * a + x
            row = out[k]
            row += 1.0          # a copy: out does not change
            acc = acc + row
        return np.sum(out ** 2) + np.sum(acc ** 2)
    _check(f, X, A, np.array(2), rolled=None)
    assert "as written: the body reads part of an array at a traced 0-d integer that may be a " \
        "NumPy integer" in capfd.readouterr().err
