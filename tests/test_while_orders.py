"""Derivatives of every order through tg.while_loop whose trip count depends
on the input: compiled (numpy and native targets) and eager (compile=False),
against finite differences of the loop unrolled with the forward run's trip
count (float64) and against each other."""
import numpy as np
import pytest

import tracegrad as tg
from tracegrad.ops import while_loop   # JAX's signature: while_loop(cond_fun, body_fun, init_val)


# --- the loops, and plain NumPy references with a fixed trip count ------------------------

def newton_sqrt(a):
    """Newton's iteration for sqrt(a) to a tolerance: its trip count depends on a."""
    def cond(s):
        x, k = s
        return np.logical_and(np.max(np.abs(x * x - a)) > 1e-12, k < 100)

    def body(s):
        x, k = s
        return (0.5 * (x + a / x), k + 1)
    return while_loop(cond, body, (a + 1.0, np.int64(0)))


def newton_loss(a):
    x, _ = newton_sqrt(a)
    return np.sum(x * np.sin(a)) + np.sum(x * x * x)


def newton_ref(a, n):
    x = a + 1.0
    for _ in range(n):
        x = 0.5 * (x + a / x)
    return np.sum(x * np.sin(a)) + np.sum(x * x * x)


def newton_trips(a):
    x, k = a + 1.0, 0
    while np.max(np.abs(x * x - a)) > 1e-12 and k < 100:
        x, k = 0.5 * (x + a / x), k + 1
    return k


def halvings(p):
    """Shrink x (about halving it) until its norm is small: the number of
    halvings depends on x; w (p[-1]) is a constant of the body."""
    x, w = p[:-1], p[-1]

    def cond(s):
        return np.sum(s[0] * s[0]) > 0.01

    def body(s):
        y, k = s
        return (0.5 * y + 0.05 * np.tanh(w * y), k + 1)
    y, _ = while_loop(cond, body, (x, np.int64(0)))
    return np.sum(np.sin(y) * w) + np.sum(y * y) * w


def halvings_ref(p, n):
    x, w = p[:-1], p[-1]
    y = x
    for _ in range(n):
        y = 0.5 * y + 0.05 * np.tanh(w * y)
    return np.sum(np.sin(y) * w) + np.sum(y * y) * w


def halvings_trips(p):
    x, w = p[:-1], p[-1]
    y, k = x, 0
    while np.sum(y * y) > 0.01:
        y, k = 0.5 * y + 0.05 * np.tanh(w * y), k + 1
    return k


A0 = np.array([2.0, 0.7, 5.0])
P0 = np.array([3.0, -1.5, 2.2, 0.8])
CASES = {"newton": (newton_loss, newton_ref, newton_trips, A0),
         "halvings": (halvings, halvings_ref, halvings_trips, P0)}


def _backends():
    out = ["numpy"]
    from tracegrad.runtime import toolchain
    if toolchain.available()[0] is not None:
        out.append("native")
    return out


BACKENDS = _backends()


def _fd_hessian(f, x, h=1e-4):
    n = x.size
    H = np.empty((n, n))
    for i in range(n):
        for j in range(n):
            ei, ej = np.eye(n)[i] * h, np.eye(n)[j] * h
            H[i, j] = (f(x + ei + ej) - f(x + ei - ej) - f(x - ei + ej)
                       + f(x - ei - ej)) / (4 * h * h)
    return H


def _fixed(case, x):
    """The reference unrolled for the trip count at x (checked constant
    around x, so the finite differences see one smooth function)."""
    _, ref, trips, _ = CASES[case]
    n = trips(x)
    assert n >= 3
    for d in (1e-3, -1e-3):
        assert trips(x + d) == n
    return lambda y: ref(y, n)


# --- second order ------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_hessian_matches_finite_differences_and_eager(case, backend):
    f, _, _, x = CASES[case]
    H = tg.hessian(f, backend=backend)(x)
    H_fd = _fd_hessian(_fixed(case, x), x)
    np.testing.assert_allclose(H, H_fd, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(H, H.T, rtol=1e-10, atol=1e-12)
    H_eager = tg.hessian(f, compile=False)(x)
    np.testing.assert_allclose(H, H_eager, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_every_second_order_composition_agrees(case, backend):
    f, _, _, x = CASES[case]
    H = tg.hessian(f, backend=backend)(x)
    v = np.linspace(-1.0, 1.0, x.size)
    # reverse over reverse
    hvp = tg.grad(lambda y: np.sum(tg.grad(f)(y) * v), backend=backend)(x)
    np.testing.assert_allclose(hvp, H @ v, rtol=1e-10, atol=1e-12)
    val, hvp2 = tg.value_and_grad(lambda y: np.sum(tg.grad(f)(y) * v), backend=backend)(x)
    np.testing.assert_allclose(val, tg.grad(f)(x) @ v, rtol=1e-12)
    np.testing.assert_allclose(hvp2, H @ v, rtol=1e-10, atol=1e-12)
    # forward over reverse, reverse over reverse as whole Jacobians
    np.testing.assert_allclose(tg.jacfwd(tg.grad(f), backend=backend)(x), H,
                               rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(tg.jacrev(tg.grad(f), backend=backend)(x), H,
                               rtol=1e-10, atol=1e-12)
    # jvp and vjp of the gradient
    g, t = tg.jvp(tg.grad(f), (x,), (v,), backend=backend)
    np.testing.assert_allclose(t, H @ v, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(g, tg.grad(f)(x), rtol=1e-12)
    g2, vjp_fn = tg.vjp(tg.grad(f), x, backend=backend)
    (ct,) = vjp_fn(v)
    np.testing.assert_allclose(ct, H.T @ v, rtol=1e-10, atol=1e-12)
    # the same compositions run eagerly
    hvp_e = tg.grad(lambda y: np.sum(tg.grad(f, compile=False)(y) * v), compile=False)(x)
    np.testing.assert_allclose(hvp_e, H @ v, rtol=1e-10, atol=1e-12)
    _, t_e = tg.jvp(tg.grad(f, compile=False), (x,), (v,), compile=False)
    np.testing.assert_allclose(t_e, H @ v, rtol=1e-10, atol=1e-12)


def test_the_trip_count_is_the_forward_runs():
    # the Hessian at two points with different trip counts is each point's own
    far = np.array([30.0, 0.05, 3.0])
    assert newton_trips(far) != newton_trips(A0)
    for a in (A0, far):
        n = newton_trips(a)
        H = tg.hessian(newton_loss)(a)
        np.testing.assert_allclose(H, _fd_hessian(lambda y: newton_ref(y, n), a, h=1e-3),
                                   rtol=1e-4, atol=1e-4)


def test_a_loop_that_never_runs_is_the_identity_to_every_order():
    def f(x):
        y, _ = while_loop(lambda s: np.sum(s[0]) > 100.0,
                             lambda s: (s[0] * s[0], s[1] + 1), (x, np.int64(0)))
        return np.sum(np.exp(y))
    x = np.array([0.1, -0.4])
    np.testing.assert_allclose(tg.hessian(f)(x), np.diag(np.exp(x)), rtol=1e-12)
    np.testing.assert_allclose(tg.grad(lambda y: np.sum(tg.grad(f)(y)))(x), np.exp(x),
                               rtol=1e-12)


# --- third order -------------------------------------------------------------------------

def _scalar_newton(a):
    x, _ = newton_sqrt(a)
    return x * np.sin(a) + x * x * x


def _scalar_newton_ref(a, n):
    x = a + 1.0
    for _ in range(n):
        x = 0.5 * (x + a / x)
    return x * np.sin(a) + x * x * x


@pytest.mark.parametrize("backend", BACKENDS)
def test_third_order(backend):
    a = np.float64(2.5)
    n = newton_trips(np.array([a]))
    d3 = tg.grad(tg.grad(tg.grad(_scalar_newton)), backend=backend)(a)
    h = 1e-3
    f = lambda y: _scalar_newton_ref(y, n)    # noqa: E731
    fd = (f(a + 2 * h) - 2 * f(a + h) + 2 * f(a - h) - f(a - 2 * h)) / (2 * h ** 3)
    np.testing.assert_allclose(d3, fd, rtol=1e-4)
    # forward over reverse over reverse, and forward over forward over reverse
    np.testing.assert_allclose(tg.jacfwd(tg.grad(tg.grad(_scalar_newton)),
                                         backend=backend)(a), d3, rtol=1e-10)
    np.testing.assert_allclose(tg.jacfwd(tg.hessian(_scalar_newton), backend=backend)(a), d3,
                               rtol=1e-10)
    eager = tg.grad(tg.grad(tg.grad(_scalar_newton, compile=False), compile=False),
                    compile=False)(a)
    np.testing.assert_allclose(d3, eager, rtol=1e-10)


def test_third_order_with_a_body_constant():
    # d^3/dw^3 through a loop whose body reads w and whose trip count depends on x
    x = np.array([3.0, -1.5, 2.2])

    def f(w):
        return halvings(np.concatenate([x, w[None]]))
    w = np.float64(0.8)
    fs = lambda w: f(np.asarray(w))  # noqa: E731
    d3 = tg.grad(tg.grad(tg.grad(fs)))(w)
    n = halvings_trips(np.concatenate([x, [w]]))
    ref = lambda w: halvings_ref(np.concatenate([x, [w]]), n)   # noqa: E731
    h = 1e-3
    fd = (ref(w + 2 * h) - 2 * ref(w + h) + 2 * ref(w - h) - ref(w - 2 * h)) / (2 * h ** 3)
    np.testing.assert_allclose(d3, fd, rtol=1e-4, atol=1e-6)


# --- first order stays what it was ------------------------------------------------------

def test_first_order_still_walks_the_recorded_tape():
    src = tg.grad(newton_loss).lower(A0).source
    assert "reversed(" in src and "while " in src
    g = tg.grad(newton_loss).lower(A0).graph
    ops = [d["op"] for _, d in g.nodes(data=True)]
    # one forward run (the tape's), one backward walk: nothing recomputed
    assert ops.count("while_fwd") == 1 and ops.count("while_bwd") == 1
    assert "while" not in ops


def test_vmap_of_a_while_loop_gives_each_element_its_own_trip_count():
    a = np.array([[2.0, 0.7], [50.0, 3.0], [0.2, 9.0]])
    got = tg.func.vmap(lambda r: newton_sqrt(r)[0])(a)
    np.testing.assert_allclose(got, np.sqrt(a), rtol=1e-12)
    J = tg.jacfwd(lambda r: newton_sqrt(r)[0])(a[1])
    np.testing.assert_allclose(J, np.diag(0.5 / np.sqrt(a[1])), rtol=1e-8)


def test_a_while_loop_inside_a_loop_body_and_a_branch():
    from tracegrad.ops import cond, fori_loop

    def newton(a):
        return newton_sqrt(a)[0]

    def f(a):
        c = fori_loop(0, 3, lambda i, c: c + newton(a * c), np.ones_like(a))
        return np.sum(c ** 2)

    def f_eager(a):
        c = np.ones_like(a)
        for _ in range(3):
            c = c + newton(a * c)
        return np.sum(c ** 2)
    a = np.array([2.0, 0.5])
    H = tg.hessian(f)(a)
    np.testing.assert_allclose(H, tg.hessian(f_eager, compile=False)(a), rtol=1e-10,
                               atol=1e-12)
    np.testing.assert_allclose(tg.grad(lambda y: np.sum(tg.grad(f)(y)))(a), H.sum(0),
                               rtol=1e-10)

    def g(a):
        return cond(np.sum(a) > 1.0, lambda a: np.sum(newton(a) ** 3), lambda a: np.sum(a), a)
    np.testing.assert_allclose(tg.hessian(g)(a), np.diag(0.75 / np.sqrt(a)), rtol=1e-9)


def test_second_order_on_the_cuda_target_through_the_emulator(monkeypatch):
    # the loops run on the host and call the bodies' kernels, as in first order
    import shutil
    from tracegrad import testing
    if shutil.which(testing.CXX) is None:
        pytest.skip(f"the CUDA emulator needs a host C++ compiler ({testing.CXX})")
    monkeypatch.setenv("TRACEGRAD_CACHE", "0")
    def fp(a):
        return np.sum(tg.fixed_point(lambda x, a: np.cos(a * x), np.zeros_like(a), a) ** 2)
    a = np.array([0.5, 0.8, 1.1])
    with testing.emulated_cupy() as cp:
        for f in (newton_loss, fp):
            H = tg.hessian(f, backend="cupy")(cp.asarray(a))
            np.testing.assert_allclose(H.get(), tg.hessian(f, backend="numpy")(a), rtol=1e-10,
                                       atol=1e-13)


def test_torch_func_transforms():
    f, _, _, x = CASES["newton"]
    H = tg.hessian(f)(x)
    np.testing.assert_allclose(tg.func.hessian(f)(x), H, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(tg.func.jacfwd(tg.func.grad(f))(x), H, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(tg.func.jacrev(tg.func.grad(f))(x), H, rtol=1e-10, atol=1e-12)
    v = np.linspace(-1.0, 1.0, x.size)
    _, t = tg.func.jvp(tg.func.grad(f), (x,), (v,))
    np.testing.assert_allclose(t, H @ v, rtol=1e-10, atol=1e-12)


def newton_as_written(a):
    # a Python while statement on traced values: the front end converts it
    # into the same while node
    x = a + 1.0
    k = 0
    while np.max(np.abs(x * x - a)) > 1e-12 and k < 100:
        x = 0.5 * (x + a / x)
        k = k + 1
    return np.sum(x * np.sin(a)) + np.sum(x * x * x)


def test_a_while_statement_as_written_to_second_and_third_order():
    ops = [d["op"] for _, d in tg.grad(newton_as_written).lower(A0).graph.nodes(data=True)]
    assert "while_fwd" in ops and "while_bwd" in ops
    H = tg.hessian(newton_as_written)(A0)
    np.testing.assert_allclose(H, tg.hessian(newton_loss)(A0), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(H, tg.hessian(newton_as_written, compile=False)(A0),
                               rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(tg.grad(lambda y: np.sum(tg.grad(newton_as_written)(y)))(A0),
                               H.sum(0), rtol=1e-10)
    d3 = tg.jacfwd(tg.hessian(newton_as_written))(A0)
    d3_ref = tg.jacfwd(tg.hessian(newton_loss))(A0)
    np.testing.assert_allclose(d3, d3_ref, rtol=1e-10, atol=1e-12)
