"""Loops and branches as graph nodes: tg.fori_loop, tg.scan, tg.while_loop,
tg.cond, tg.switch (tracegrad/ops/control.py).

Every loop is checked against the same computation written as an unrolled
Python loop (to rtol 1e-12) and against finite differences; compiled and
eager results agree."""
from __future__ import annotations

import numpy as np
import pytest

import tracegrad as tg

RTOL = 1e-12


def _fd_grad(f, x, eps=1e-6):
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[i] = eps
        g[i] = (f(x + e) - f(x - e)) / (2 * eps)
    return g


# --- the projectile of the issue: a dozen NumPy ops a step ---------------------------------

def _step(v, x):
    a = -0.1 * v * np.sqrt(np.sum(v * v)) + np.array([0., 0., -9.8])
    v = v + 0.01 * a
    x = x + 0.01 * v
    return v, x


def miss_unrolled(v0, n):
    x = np.zeros(3)
    v = v0
    for _ in range(n):
        v, x = _step(v, x)
    return np.sum((x - np.array([10., 0., 0.])) ** 2)


def miss_loop(v0, n):
    def body(i, s):
        x, v = s
        v, x = _step(v, x)
        return (x, v)
    x, v = tg.fori_loop(0, n, body, (np.zeros(3), v0))
    return np.sum((x - np.array([10., 0., 0.])) ** 2)


V0 = np.array([5., 0., 5.])


def test_fori_loop_value_and_grad_match_the_unrolled_loop():
    n = 40
    v, g = tg.value_and_grad(miss_loop, static_argnums=(1,))(V0, n)
    v_ref, g_ref = tg.value_and_grad(miss_unrolled, static_argnums=(1,))(V0, n)
    np.testing.assert_allclose(v, v_ref, rtol=RTOL)
    np.testing.assert_allclose(g, g_ref, rtol=RTOL)
    np.testing.assert_allclose(v, miss_unrolled(V0, n), rtol=RTOL)
    np.testing.assert_allclose(g, _fd_grad(lambda z: miss_unrolled(z, n), V0), rtol=1e-6,
                               atol=1e-8)


@pytest.mark.usefixtures("numpy_target")
def test_fori_loop_is_one_node_whatever_the_trip_count():
    g10 = tg.grad(miss_loop, static_argnums=(1,)).lower(V0, 10).graph
    g5000 = tg.grad(miss_loop, static_argnums=(1,)).lower(V0, 5000).graph
    assert g10.number_of_nodes() == g5000.number_of_nodes()
    assert any(d["op"] == "scan" for _, d in g5000.nodes(data=True))
    src = tg.grad(miss_loop, static_argnums=(1,)).lower(V0, 5000).source
    assert "for " in src and "range(5000)" in src


def test_fori_loop_runs_eagerly_on_arrays_and_tensors():
    np.testing.assert_allclose(miss_loop(V0, 30), miss_unrolled(V0, 30), rtol=RTOL)
    x = tg.tensor(V0.copy(), requires_grad=True)
    y = miss_loop(x, 30)
    y.backward()
    g = tg.grad(miss_loop, static_argnums=(1,))(V0, 30)
    np.testing.assert_allclose(x.grad.numpy(), g, rtol=RTOL)
    # the NumPy-speaking eager path (compile=False) records the tape too
    g2 = tg.grad(miss_loop, static_argnums=(1,), compile=False)(V0, 30)
    np.testing.assert_allclose(g2, g, rtol=RTOL)


def test_hessian_and_jacobian_through_a_loop():
    n = 12
    H = tg.hessian(miss_loop, static_argnums=(1,))(V0, n)
    H_ref = tg.hessian(miss_unrolled, static_argnums=(1,))(V0, n)
    np.testing.assert_allclose(H, H_ref, rtol=1e-10, atol=1e-12)

    def traj(v0):
        def body(i, s):
            x, v = s
            v, x = _step(v, x)
            return (x, v)
        return tg.fori_loop(0, n, body, (np.zeros(3), v0))[0]

    def traj_ref(v0):
        x, v = np.zeros(3), v0
        for _ in range(n):
            v, x = _step(v, x)
        return x
    J = tg.jacobian(traj)(V0)
    np.testing.assert_allclose(J, tg.jacobian(traj_ref)(V0), rtol=RTOL, atol=1e-14)
    np.testing.assert_allclose(J, np.stack([_fd_grad(lambda z: traj_ref(z)[i], V0)
                                            for i in range(3)]), rtol=1e-6, atol=1e-9)


def test_jvp_through_a_loop():
    t = np.array([0.3, -1.0, 0.5])
    out, tan = tg.jvp(lambda v: miss_loop(v, 20), (V0,), (t,))
    out_r, tan_r = tg.jvp(lambda v: miss_unrolled(v, 20), (V0,), (t,))
    np.testing.assert_allclose(out, out_r, rtol=RTOL)
    np.testing.assert_allclose(tan, tan_r, rtol=RTOL)


def test_loop_index_and_closure_values():
    # the body reads the index and a traced value of the enclosing function
    def f(w, x):
        return np.sum(tg.fori_loop(2, 9, lambda i, c: np.sin(c * w) + i * 0.1, x))

    def ref(w, x):
        c = x
        for i in range(2, 9):
            c = np.sin(c * w) + i * 0.1
        return np.sum(c)
    w, x = np.array([0.7, 1.1]), np.array([0.2, -0.4])
    v, (gw, gx) = tg.value_and_grad(f, argnums=(0, 1))(w, x)
    v_r, (gw_r, gx_r) = tg.value_and_grad(ref, argnums=(0, 1))(w, x)
    np.testing.assert_allclose([v, *gw, *gx], [v_r, *gw_r, *gx_r], rtol=RTOL)


def test_nested_loops():
    def f(x, w):
        def outer(i, c):
            return tg.fori_loop(0, 3, lambda j, d: np.tanh(d * w + j) + 0.1 * c, c)
        return np.sum(tg.fori_loop(0, 4, outer, x) ** 2)

    def ref(x, w):
        c = x
        for i in range(4):
            d = c
            for j in range(3):
                d = np.tanh(d * w + j) + 0.1 * c
            c = d
        return np.sum(c ** 2)
    x, w = np.array([0.3, -0.2, 0.5]), np.array([1.2, 0.4, -0.7])
    v, g = tg.value_and_grad(f, argnums=(0, 1))(x, w)
    v_r, g_r = tg.value_and_grad(ref, argnums=(0, 1))(x, w)
    np.testing.assert_allclose(v, v_r, rtol=RTOL)
    for a, b in zip(g, g_r):
        np.testing.assert_allclose(a, b, rtol=RTOL)
    H = tg.hessian(f)(x, w)
    np.testing.assert_allclose(H, tg.hessian(ref)(x, w), rtol=1e-10, atol=1e-12)


def test_scan_with_xs_and_ys():
    def f(h0, xs, w):
        def cell(h, x):
            h = np.tanh(w * h + x)
            return h, h * h
        h, ys = tg.scan(cell, h0, xs)
        return np.sum(h) + np.sum(ys * np.arange(1.0, 6.0)[:, None])

    def ref(h0, xs, w):
        h, ys = h0, []
        for k in range(xs.shape[0]):
            h = np.tanh(w * h + xs[k])
            ys.append(h * h)
        return np.sum(h) + np.sum(np.stack(ys) * np.arange(1.0, 6.0)[:, None])
    rng = np.random.default_rng(0)
    h0, xs, w = rng.standard_normal(2), rng.standard_normal((5, 2)), rng.standard_normal(2)
    v, g = tg.value_and_grad(f, argnums=(0, 1, 2))(h0, xs, w)
    v_r, g_r = tg.value_and_grad(ref, argnums=(0, 1, 2))(h0, xs, w)
    np.testing.assert_allclose(v, v_r, rtol=RTOL)
    for a, b in zip(g, g_r):
        np.testing.assert_allclose(a, b, rtol=RTOL)
    np.testing.assert_allclose(g[1], _fd_grad(lambda z: ref(h0, z, w), xs), rtol=1e-6)
    np.testing.assert_allclose(f(h0, xs, w), v_r, rtol=RTOL)   # eagerly on arrays


def test_scan_reverse_and_pytrees():
    def f(a, xs):
        (s, p), ys = tg.scan(lambda c, x: ((c[0] + x["u"], c[1] * x["v"]), c[0] * x["u"]),
                             (a, a), {"u": xs, "v": xs + 1.0}, reverse=True)
        return np.sum(s * p) + np.sum(ys[0] * 2.0 + ys[-1])

    def ref(a, xs):
        s, p = a, a
        ys = [None] * xs.shape[0]
        for k in reversed(range(xs.shape[0])):
            ys[k] = s * xs[k]
            s, p = s + xs[k], p * (xs[k] + 1.0)
        return np.sum(s * p) + np.sum(ys[0] * 2.0 + ys[-1])
    rng = np.random.default_rng(1)
    a, xs = rng.standard_normal(3), rng.standard_normal((4, 3))
    v, g = tg.value_and_grad(f, argnums=(0, 1))(a, xs)
    v_r, g_r = tg.value_and_grad(ref, argnums=(0, 1))(a, xs)
    np.testing.assert_allclose(v, v_r, rtol=RTOL)
    for x, y in zip(g, g_r):
        np.testing.assert_allclose(x, y, rtol=RTOL)


def test_a_carry_that_changes_its_type_is_an_error():
    def f(x):
        return tg.fori_loop(0, 3, lambda i, c: np.stack([c, c]), x)
    with pytest.raises(TypeError, match="carry 0 .* entered as float64\\[3\\]"):
        tg.compile(f)(np.ones(3))


# --- branches ---------------------------------------------------------------------------

def _branchy(x, w):
    return tg.cond(np.sum(x) > 0, lambda a, b: np.sin(a) * b, lambda a, b: a * a - b, x, w)


def _branchy_ref(x, w):
    return np.sin(x) * w if np.sum(x) > 0 else x * x - w


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_cond_compiled_eager_and_gradients(sign):
    x, w = sign * np.array([0.5, 1.5]), np.array([0.3, -0.8])

    def f(x, w):
        return np.sum(_branchy(x, w) ** 2)

    def ref(x, w):
        return np.sum(_branchy_ref(x, w) ** 2)
    v, g = tg.value_and_grad(f, argnums=(0, 1))(x, w)
    np.testing.assert_allclose(v, ref(x, w), rtol=RTOL)
    for i, a in enumerate((x, w)):
        fd = _fd_grad(lambda z: ref(*[z if j == i else b for j, b in enumerate((x, w))]), a)
        np.testing.assert_allclose(g[i], fd, rtol=1e-6, atol=1e-9)
    # eager Tensors: the Python branch runs and the tape records it
    xt, wt = tg.tensor(x, requires_grad=True), tg.tensor(w, requires_grad=True)
    (_branchy(xt, wt) ** 2).sum().backward()
    np.testing.assert_allclose(xt.grad.numpy(), g[0], rtol=RTOL)
    np.testing.assert_allclose(wt.grad.numpy(), g[1], rtol=RTOL)
    # second order and the vmap-based Hessian
    H = tg.hessian(f)(x, w)
    H_ref = tg.hessian(lambda x, w: np.sum((np.sin(x) * w if sign > 0 else x * x - w) ** 2))(x, w)
    np.testing.assert_allclose(H, H_ref, rtol=1e-10, atol=1e-12)
    assert "cond" in {d["op"] for _, d in tg.grad(f).lower(x, w).graph.nodes(data=True)}


def test_switch_clamps_its_index_and_reads_closures():
    def f(x, k):
        i = (np.sum(k) * 1).astype(np.int64)
        return np.sum(tg.switch(i, [lambda a: a * x, lambda a: np.exp(a), lambda a: -a], x))
    x = np.array([0.2, 0.7])
    for kv, ref in [(0, np.sum(x * x)), (1, np.sum(np.exp(x))), (2, -np.sum(x)),
                    (7, -np.sum(x)), (-3, np.sum(x * x))]:
        k = np.array([kv])
        np.testing.assert_allclose(tg.compile(f)(x, k), ref, rtol=RTOL)
        np.testing.assert_allclose(f(x, k), ref, rtol=RTOL)
    np.testing.assert_allclose(tg.grad(f)(x, np.array([0])), 2 * x, rtol=RTOL)
    np.testing.assert_allclose(tg.grad(f)(x, np.array([1])), np.exp(x), rtol=RTOL)


def test_cond_branches_of_different_shapes_are_an_error():
    def f(x):
        return tg.cond(np.sum(x) > 0, lambda a: a, lambda a: a[:1], x)
    with pytest.raises(TypeError, match="branches return different shapes"):
        tg.compile(f)(np.ones(3))


def test_a_loop_inside_a_branch_and_a_branch_inside_a_loop():
    def f(x):
        def body(i, c):
            return tg.cond(np.sum(c) > 1.0, lambda a: a * 0.5, lambda a: a * 1.5 + 0.1, c)
        y = tg.fori_loop(0, 6, body, x)
        return np.sum(tg.cond(np.sum(y) > 0, lambda a: tg.fori_loop(0, 3, lambda i, c: c * a, a),
                              lambda a: a, y))

    def ref(x):
        c = x
        for _ in range(6):
            c = c * 0.5 if np.sum(c) > 1.0 else c * 1.5 + 0.1
        if np.sum(c) > 0:
            a = c
            for _ in range(3):
                c = c * a
        return np.sum(c)
    x = np.array([0.3, 0.2])
    v, g = tg.value_and_grad(f)(x)
    np.testing.assert_allclose(v, ref(x), rtol=RTOL)
    np.testing.assert_allclose(g, _fd_grad(ref, x), rtol=1e-6, atol=1e-9)


# --- while loops --------------------------------------------------------------------------

def _newton_sqrt(a):
    # Newton's iteration for sqrt(a), to a tolerance: a value-dependent trip count
    def cond(s):
        x, k = s
        return np.logical_and(np.abs(x * x - a) > 1e-10, k < 100)

    def body(s):
        x, k = s
        return (0.5 * (x + a / x), k + 1)
    return tg.while_loop(cond, body, (a + 1.0, np.int64(0)))


def _newton_ref(a):
    x, k = a + 1.0, 0
    while abs(x * x - a) > 1e-10 and k < 100:
        x, k = 0.5 * (x + a / x), k + 1
    return x, k


def test_while_loop_compiled_eager_and_reverse_mode():
    a = np.float64(3.0)
    x, k = tg.compile(_newton_sqrt)(a)
    x_ref, k_ref = _newton_ref(3.0)
    assert int(k) == k_ref and k_ref > 2
    np.testing.assert_allclose(x, x_ref, rtol=RTOL)
    x2, k2 = _newton_sqrt(a)   # plain NumPy: the Python loop
    np.testing.assert_allclose(x2, x_ref, rtol=RTOL)

    def f(a, w):
        x, k = _newton_sqrt(a * w)
        return x * w

    def f_ref(a, w):
        x, k = _newton_ref(a * w)
        return x * w
    # reverse mode records the trip count of the forward run (JAX refuses this)
    v, (ga, gw) = tg.value_and_grad(f, argnums=(0, 1))(a, np.float64(2.0))
    np.testing.assert_allclose(v, f_ref(3.0, 2.0), rtol=RTOL)
    # the unrolled iteration with the same trip count gives the same derivative
    def unrolled(a, w):
        x = a * w + 1.0
        for _ in range(_newton_ref(6.0)[1]):
            x = 0.5 * (x + a * w / x)
        return x * w
    ga_r, gw_r = tg.grad(unrolled, argnums=(0, 1))(a, np.float64(2.0))
    np.testing.assert_allclose([ga, gw], [ga_r, gw_r], rtol=RTOL)
    # forward mode
    _, t = tg.jvp(lambda a: f(a, np.float64(2.0)), (a,), (np.float64(1.0),))
    np.testing.assert_allclose(t, ga_r, rtol=1e-12)
    src = tg.grad(f).lower(a, np.float64(2.0)).source
    assert "while " in src and "reversed(" in src


def test_while_loop_on_tensors_records_the_tape():
    a = tg.tensor(3.0, dtype=tg.float64, requires_grad=True)
    x, k = _newton_sqrt(a)
    x.backward()
    np.testing.assert_allclose(a.grad.numpy(), 0.5 / np.sqrt(3.0), rtol=1e-8)


def test_fori_loop_with_a_traced_trip_count_becomes_a_while_loop():
    def f(x, n):
        return np.sum(tg.fori_loop(0, n[0], lambda i, c: c * 1.5 + 1.0, x))
    x = np.array([1.0, 2.0])
    for n in (0, 3, 7):
        ref = x.copy()
        for _ in range(n):
            ref = ref * 1.5 + 1.0
        np.testing.assert_allclose(tg.compile(f)(x, np.array([n])), np.sum(ref), rtol=RTOL)
        np.testing.assert_allclose(tg.grad(f)(x, np.array([n])), 1.5 ** n * np.ones(2),
                                   rtol=RTOL)


def _kernel_target(kind, monkeypatch):
    """(backend, array maker) for the native target (the C compiler) or the
    CUDA target through the emulator (a host C++ compiler), or a skip."""
    import shutil
    from tracegrad import testing
    from tracegrad.runtime import toolchain
    monkeypatch.setenv("TRACEGRAD_CACHE", "0")
    if kind == "native":
        if toolchain.available()[0] is None:
            pytest.skip("no working C compiler")
        return "native", np.asarray, None
    if shutil.which(testing.CXX) is None:
        pytest.skip(f"the CUDA emulator needs a host C++ compiler ({testing.CXX})")
    ctx = testing.emulated_cupy()
    fake = ctx.__enter__()
    return "cupy", fake.asarray, ctx


@pytest.mark.parametrize("kind", ["native", "cuda"])
def test_loops_and_branches_run_on_the_kernel_targets(kind, monkeypatch):
    # The loop stays on the host: a Python loop calling the body's own
    # function, whose elementwise work is fused into the target's kernels.
    backend, to_device, ctx = _kernel_target(kind, monkeypatch)
    try:
        host = lambda a: np.asarray(a.get() if hasattr(a, "get") else a)  # noqa: E731
        v0 = to_device(V0)
        for f, args in [(miss_loop, (V0, 40)), (miss_unrolled, (V0, 60))]:
            ref = tg.value_and_grad(f, static_argnums=(1,))(*args)
            fk = tg.value_and_grad(f, static_argnums=(1,), backend=backend)
            got = fk(v0, args[1])
            src = fk.lower(v0, args[1]).source
            if backend == "native":   # the whole graph, loop included, is one C function
                assert "for (long long _s" in src, src[:2000]
            else:
                assert "for _" in src and "def _scan_body" in src, src[:2000]
            np.testing.assert_allclose(float(host(got[0])), ref[0], rtol=RTOL)
            np.testing.assert_allclose(host(got[1]), ref[1], rtol=RTOL)
        x, w = np.array([0.5, 1.5]), np.array([0.3, -0.8])
        for sign in (1.0, -1.0):
            g = tg.grad(lambda x, w: np.sum(_branchy(x, w) ** 2), argnums=(0, 1),
                        backend=backend)(to_device(sign * x), to_device(w))
            ref = tg.grad(lambda x, w: np.sum(_branchy(x, w) ** 2), argnums=(0, 1))(sign * x, w)
            for a, b in zip(g, ref):
                np.testing.assert_allclose(host(a), b, rtol=RTOL)
        def f(a, w):
            x, k = _newton_sqrt(a * w)
            return x * w
        a, w2 = np.array(3.0), np.array(2.0)
        got = tg.value_and_grad(f, argnums=(0, 1), backend=backend)(to_device(a), to_device(w2))
        ref = tg.value_and_grad(f, argnums=(0, 1))(a, w2)
        np.testing.assert_allclose(float(host(got[0])), ref[0], rtol=RTOL)
        np.testing.assert_allclose([float(host(t)) for t in got[1]], ref[1], rtol=RTOL)
    finally:
        if ctx is not None:
            ctx.__exit__(None, None, None)


# --- Python loops rolled automatically -------------------------------------------------------

def _ops(g):
    return [d["op"] for _, d in g.nodes(data=True)]


def test_a_python_loop_is_rolled_into_one_scan_node():
    f = tg.value_and_grad(miss_unrolled, static_argnums=(1,))
    g100, g2000 = f.lower(V0, 100).graph, f.lower(V0, 2000).graph
    assert "scan" in _ops(g100) and g100.number_of_nodes() == g2000.number_of_nodes()
    for n in (7, 100):
        v, g = f(V0, n)
        v_ref, g_ref = tg.value_and_grad(miss_loop, static_argnums=(1,))(V0, n)
        np.testing.assert_allclose(v, v_ref, rtol=RTOL)
        np.testing.assert_allclose(g, g_ref, rtol=RTOL)
    np.testing.assert_allclose(f(V0, 100)[0], miss_unrolled(V0, 100), rtol=RTOL)


def test_rolling_can_be_switched_off(monkeypatch):
    monkeypatch.setenv("TRACEGRAD_ROLL", "0")
    g = tg.grad(miss_unrolled, static_argnums=(1,)).lower(V0, 20).graph
    assert "scan" not in _ops(g)


def test_the_explain_log_names_rolled_loops(monkeypatch, capsys):
    monkeypatch.setenv("TRACEGRAD_EXPLAIN", "1")
    tg.grad(miss_unrolled, static_argnums=(1,)).lower(V0, 30)
    assert "rewrote the Python loop at test_loops.py" in capsys.readouterr().err

    def recorded(v0, n):      # a list of every step: rolled after tracing, not rewritten
        path = [v0]
        for _ in range(n):
            path.append(_step(path[-1], v0)[0])
        return np.sum(path[-1] ** 2)
    tg.grad(recorded, static_argnums=(1,)).lower(V0, 60)
    err = capsys.readouterr().err
    assert "is a call made for its effect" in err and "rolled a Python loop at test_loops.py" in err


@pytest.fixture
def small_loops_roll(monkeypatch):
    """Roll loops from 48 recorded ops on (256 by default), to test the rule
    on small programs."""
    import tracegrad.frontend.trace
    from tracegrad.frontend import loop_rewrite
    monkeypatch.setattr(tracegrad.frontend.trace, "ROLL_MIN_NODES", 48)
    monkeypatch.setattr(loop_rewrite, "ROLL_MIN_NODES", 48)


def _check_same(f, *args, rolled):
    """f compiled (maybe rolled) against f eagerly on NumPy, and its gradient
    against the unrolled graph's; whether a scan node appeared."""
    v, g = tg.value_and_grad(f)(*args)
    np.testing.assert_allclose(v, f(*args), rtol=RTOL)
    import os
    old = os.environ.get("TRACEGRAD_ROLL")
    os.environ["TRACEGRAD_ROLL"] = "0"
    try:
        g_ref = tg.grad(f)(*args)
    finally:
        if old is None:
            del os.environ["TRACEGRAD_ROLL"]
        else:
            os.environ["TRACEGRAD_ROLL"] = old
    np.testing.assert_allclose(g, g_ref, rtol=RTOL)
    assert ("scan" in _ops(tg.grad(f).lower(*args).graph)) == rolled


def test_iterations_that_differ_are_not_rolled_wrongly(small_loops_roll, monkeypatch):
    # rolling after tracing alone (the source rewrite would take most of these
    # loops first: tests/test_loop_rewrite.py)
    from tracegrad.frontend import loop_rewrite
    monkeypatch.setattr(loop_rewrite, "rewrite", lambda fn, *a, **k: None)
    x = np.array([0.3, -0.2, 0.9])
    w = np.linspace(0.5, 1.5, 30)

    def per_step_input(x):       # each iteration reads another element: not rolled
        for k in range(30):
            x = np.sin(x * w[k]) + 0.1
        return np.sum(x)
    _check_same(per_step_input, x, rolled=False)

    def two_back(x):             # reads two iterations back: not rolled
        a, b = x, x * 1.1
        for _ in range(40):
            a, b = b, np.sin(a) + b * 0.5
        return np.sum(b)
    _check_same(two_back, x, rolled=False)

    def every_value_kept(x):     # every iteration's value is read after the loop
        path = []
        for _ in range(40):
            x = np.tanh(x) * 1.01 + 0.01
            path.append(x)
        return np.sum(np.stack(path) ** 2)
    _check_same(every_value_kept, x, rolled=False)

    def growing(x):              # the shape changes every iteration: not rolled
        for _ in range(20):
            x = np.concatenate([x, np.sin(x[-1:])])
        return np.sum(x ** 2)
    _check_same(growing, x, rolled=False)

    def alternating(x):          # two different iterations alternate: rolled in pairs
        for k in range(60):
            x = np.sin(x) * 1.1 if k % 2 else np.cos(x) + 0.2
        return np.sum(x)
    _check_same(alternating, x, rolled=True)

    def last_iteration_read(x):  # a non-carried value of the last iteration is read
        for _ in range(40):
            y = np.sin(x)
            x = x * 0.9 + y * 0.2
        return np.sum(x) + np.sum(y ** 2)
    _check_same(last_iteration_read, x, rolled=True)


def test_nested_python_loops_roll_inside_out(small_loops_roll):
    x = np.array([0.1, 0.2])

    def f(x):
        for _ in range(12):
            y = x
            for _ in range(20):
                y = np.tanh(y * 1.3 + x)
            x = y * 0.5 + x
        return np.sum(x ** 2)
    _check_same(f, x, rolled=True)
    g = tg.compile(f).lower(x).graph
    bodies = [d["attrs"]["body"] for _, d in g.nodes(data=True) if d["op"] == "scan"]
    # one loop node for the outer loop, holding the inner loop's; the outer
    # loop's first two and last iterations run as written, each with its
    # inner loop node
    outer = [b for b in bodies if "scan" in [n.op for n in b.nodes]]
    assert len(outer) == 1 and len(bodies) == 4 and g.number_of_nodes() < 60


# --- checkpointing ---------------------------------------------------------------------

@pytest.mark.usefixtures("numpy_target")
@pytest.mark.parametrize("k", [True, 3, 7])
def test_checkpointed_loops_give_the_same_derivatives(k):
    n = 23

    def f(v0, w, ck):
        def body(i, s):
            x, v = s
            v, x = _step(v * w, x)
            return (x, v + 0.001 * i)
        x, v = tg.fori_loop(0, n, body, (np.zeros(3), v0), checkpoint=ck)
        return np.sum((x - np.array([10., 0., 0.])) ** 2) + np.sum(v)
    w = np.array([1.0, 0.99, 1.01])
    v, g = tg.value_and_grad(f, argnums=(0, 1), static_argnums=(2,))(V0, w, k)
    v_r, g_r = tg.value_and_grad(f, argnums=(0, 1), static_argnums=(2,))(V0, w, None)
    np.testing.assert_allclose(v, v_r, rtol=RTOL)
    for a, b in zip(g, g_r):
        np.testing.assert_allclose(a, b, rtol=RTOL)
    H = tg.hessian(f, static_argnums=(2,))(V0, w, k)
    np.testing.assert_allclose(H, tg.hessian(f, static_argnums=(2,))(V0, w, None), rtol=1e-10)
    # the backward pass keeps one carry per segment, not one per step
    src = tg.grad(f, static_argnums=(2,)).lower(V0, w, k).source
    kk = int(np.ceil(np.sqrt(n))) if k is True else k
    assert f"np.empty(({n // kk}, 3)" in src and f"np.empty(({n}, 3)" not in src


@pytest.mark.usefixtures("numpy_target")
def test_a_memory_budget_chooses_the_checkpointing():
    n = 100          # a float64[3] carry pair: 48 bytes a step, 4.8 kB for all

    def f(v0, ck):
        def body(i, s):
            x, v = s
            v, x = _step(v, x)
            return (x, v)
        x, v = tg.fori_loop(0, n, body, (np.zeros(3), v0), checkpoint=ck)
        return np.sum((x - np.array([10., 0., 0.])) ** 2)
    ref = tg.grad(f, static_argnums=(1,))(V0, None)
    for budget, stored in (("1MB", n), ("1.5kB", 10)):   # all fit / every 10th
        np.testing.assert_allclose(tg.grad(f, static_argnums=(1,))(V0, budget), ref, rtol=RTOL)
        src = tg.grad(f, static_argnums=(1,)).lower(V0, budget).source
        assert f"np.empty(({stored}, 3)" in src
    with pytest.raises(ValueError, match="needs at least .* MB with checkpointing"):
        tg.grad(f, static_argnums=(1,))(V0, "500B")
    with pytest.raises(ValueError, match="a memory budget is written like"):
        tg.grad(f, static_argnums=(1,))(V0, "lots")
    with pytest.raises(ValueError, match="checkpoint= must be"):
        f(V0, -2)    # eagerly too


def test_checkpointed_scan_with_xs_and_ys():
    def f(h0, xs, ck):
        h, ys = tg.scan(lambda h, x: (np.tanh(h * 0.9 + x), h * x), h0, xs, checkpoint=ck)
        return np.sum(h) + np.sum(ys ** 2)
    rng = np.random.default_rng(3)
    h0, xs = rng.standard_normal(4), rng.standard_normal((17, 4))
    g = tg.grad(f, argnums=(0, 1), static_argnums=(2,))(h0, xs, 5)
    g_r = tg.grad(f, argnums=(0, 1), static_argnums=(2,))(h0, xs, None)
    for a, b in zip(g, g_r):
        np.testing.assert_allclose(a, b, rtol=RTOL)
    with pytest.raises(ValueError, match="checkpoint= must be"):
        tg.compile(f, static_argnums=(2,))(h0, xs, -2)


def test_checkpoint_rematerialises_a_function():
    def block(x, w):
        for _ in range(3):
            x = np.tanh(x @ w) + x
        return x

    def f(x, w, remat):
        b = tg.checkpoint(block) if remat else block
        return np.sum(b(b(x, w), w * 0.5) ** 2)
    rng = np.random.default_rng(4)
    x, w = rng.standard_normal((5, 4)), rng.standard_normal((4, 4)) * 0.3
    g = tg.grad(f, argnums=(0, 1), static_argnums=(2,))(x, w, True)
    g_r = tg.grad(f, argnums=(0, 1), static_argnums=(2,))(x, w, False)
    for a, b in zip(g, g_r):
        np.testing.assert_allclose(a, b, rtol=RTOL)
    graph = tg.grad(f, argnums=(0, 1), static_argnums=(2,)).lower(x, w, True).graph
    assert [d["op"] for _, d in graph.nodes(data=True)].count("cond") >= 2
    np.testing.assert_allclose(tg.checkpoint(block)(x, w), block(x, w), rtol=RTOL)
    with pytest.raises(TypeError, match="checkpoint: expected a function"):
        tg.checkpoint(3)


# --- loops over tiny arrays run on Python floats (the NumPy target) ------------------------

def test_a_tiny_state_loop_runs_on_python_floats_bit_for_bit():
    # +, -, *, /, sqrt and sums are IEEE's in Python as in NumPy, and a sum
    # adds in NumPy's order: the forward value equals plain NumPy's exactly
    def f(v0, w):
        def body(i, s):
            x, v = s
            a = -0.1 * v * np.sqrt(np.sum(v * v)) / w + np.array([0., 0., -9.8])
            v = v + 0.01 * a
            return (x + 0.01 * v, v)
        x, v = tg.fori_loop(0, 500, body, (np.zeros(3), v0))
        return np.sum((x - np.array([10., 0., 0.])) ** 2)
    w = np.array([1.0, 1.1, 0.9])
    low = tg.value_and_grad(f, argnums=(0, 1)).lower(V0, w)
    assert "_floats" in low.source and "try:" in low.source
    v, (g0, g1) = tg.value_and_grad(f, argnums=(0, 1))(V0, w)
    assert v == f(V0, w)      # plain NumPy, eagerly: the same bits
    for i, (a, g) in enumerate(((V0, g0), (w, g1))):
        fd = _fd_grad(lambda z: f(*[z if j == i else b for j, b in enumerate((V0, w))]), a)
        np.testing.assert_allclose(g, fd, rtol=1e-6)
    # reverse mode and the rolled Python loop agree with the unrolled graph
    import os
    os.environ["TRACEGRAD_ROLL"] = "0"
    try:
        ref = tg.value_and_grad(lambda v: miss_unrolled(v, 200))(V0)
    finally:
        del os.environ["TRACEGRAD_ROLL"]
    got = tg.value_and_grad(miss_unrolled, static_argnums=(1,))(V0, 200)
    np.testing.assert_allclose(got[0], ref[0], rtol=RTOL)
    np.testing.assert_allclose(got[1], ref[1], rtol=RTOL)


@pytest.mark.usefixtures("numpy_target")
def test_a_float_loop_that_overflows_gives_numpys_inf_and_nan():
    # math.exp raises where np.exp returns inf: the loop reruns on arrays
    def f(x):
        return tg.fori_loop(0, 12, lambda i, c: np.exp(c) - 1.0, x)
    x = np.array([1.0, -1.0, 0.5])
    with np.errstate(over="ignore", invalid="ignore"):
        got = tg.compile(f)(x)
        ref = x.copy()
        for _ in range(12):
            ref = np.exp(ref) - 1.0
    np.testing.assert_array_equal(got, ref)
    assert np.isinf(got[0]) and "_floats" in tg.compile(f).lower(x).source


def test_scan_with_xs_ys_reverse_and_closures_on_floats():
    w = np.array([0.5, -0.25])

    def f(c0, xs):
        def step(c, x):
            c = c * 0.9 + x * w
            return c, np.sum(c * c)
        c, ys = tg.scan(step, c0, xs, reverse=True)
        return np.sum(c) + np.sum(ys * np.arange(1.0, 6.0))
    c0, xs = np.array([1.0, 2.0]), np.linspace(-1, 1, 10).reshape(5, 2)
    assert "_floats" in tg.grad(f, argnums=(0, 1)).lower(c0, xs).source

    def ref(c0, xs):
        c, ys = c0, [None] * 5
        for k in range(4, -1, -1):
            c = c * 0.9 + xs[k] * w
            ys[k] = np.sum(c * c)
        return np.sum(c) + np.sum(np.array(ys) * np.arange(1.0, 6.0))
    assert tg.compile(f)(c0, xs) == ref(c0, xs)
    g0, g1 = tg.grad(f, argnums=(0, 1))(c0, xs)
    np.testing.assert_allclose(g0, _fd_grad(lambda z: ref(z, xs), c0), rtol=1e-7)
    np.testing.assert_allclose(g1, _fd_grad(lambda z: ref(c0, z), xs), rtol=1e-7, atol=1e-9)


def test_a_body_reading_its_loop_index_stays_on_arrays():
    def f(x):
        return tg.fori_loop(0, 5, lambda i, c: c + 0.5 * i, x)
    assert "_floats" not in tg.compile(f).lower(np.ones(2)).source
    np.testing.assert_allclose(tg.compile(f)(np.ones(2)), np.ones(2) + 5.0, rtol=RTOL)
