"""tg.fixed_point: x* = f(x*, *params) by iteration, derivatives by the
implicit function theorem at x* (never through the iterations), compiled
and eager, forward and reverse mode, to higher orders; and its errors."""
import numpy as np
import pytest

import tracegrad as tg


def _backends():
    out = ["numpy"]
    from tracegrad.runtime import toolchain
    if toolchain.available()[0] is not None:
        out.append("native")
    return out


BACKENDS = _backends()


# --- known fixed points --------------------------------------------------------------------

def cos_fp(a):
    """x = cos(a x), elementwise."""
    return tg.fixed_point(lambda x, a: np.cos(a * x), np.zeros_like(a), a)


def cos_fp_grad(a):
    # x = cos(a x)  =>  dx/da = -x sin(a x) / (1 + a sin(a x))
    x = _solve_cos(a)
    s = np.sin(a * x)
    return -x * s / (1 + a * s)


def _solve_cos(a):
    x = np.zeros_like(a)
    for _ in range(10000):
        x = np.cos(a * x)
    return x


def babylonian(a):
    """x = (x + a / x) / 2: sqrt(a)."""
    return tg.fixed_point(lambda x, a: 0.5 * (x + a / x), np.ones_like(a), a)


A = np.array([0.5, 0.8, 1.1])
S = np.array([2.0, 3.0, 0.5])


@pytest.mark.parametrize("backend", BACKENDS)
def test_known_fixed_points_and_their_gradients(backend):
    x = tg.compile(cos_fp, backend=backend)(A)
    np.testing.assert_allclose(x, np.cos(A * x), rtol=1e-9)
    g = tg.grad(lambda a: np.sum(cos_fp(a)), backend=backend)(A)
    np.testing.assert_allclose(g, cos_fp_grad(A), rtol=1e-8)
    np.testing.assert_allclose(tg.compile(babylonian, backend=backend)(S), np.sqrt(S),
                               rtol=1e-12)
    g = tg.grad(lambda a: np.sum(babylonian(a)), backend=backend)(S)
    np.testing.assert_allclose(g, 0.5 / np.sqrt(S), rtol=1e-10)
    # value_and_grad, and the Jacobians by both modes
    v, g2 = tg.value_and_grad(lambda a: np.sum(babylonian(a)), backend=backend)(S)
    np.testing.assert_allclose(v, np.sum(np.sqrt(S)), rtol=1e-12)
    np.testing.assert_allclose(g2, g, rtol=1e-12)
    for jac in (tg.jacfwd, tg.jacrev):
        np.testing.assert_allclose(jac(babylonian, backend=backend)(S), np.diag(0.5 / np.sqrt(S)),
                                   rtol=1e-10, atol=1e-14)


def test_a_linear_contraction_against_the_linear_solve():
    rng = np.random.default_rng(1)
    M = rng.normal(size=(4, 4))
    M *= 0.6 / np.linalg.norm(M, 2)
    b = rng.normal(size=4)
    w = rng.normal(size=4)

    def loss(M, b):
        x = tg.fixed_point(lambda x, M, b: M @ x + b, np.zeros(4), M, b, tol=1e-13)
        return w @ x
    x_star = np.linalg.solve(np.eye(4) - M, b)
    gM, gb = tg.grad(loss, argnums=(0, 1))(M, b)
    u = np.linalg.solve((np.eye(4) - M).T, w)    # the adjoint
    np.testing.assert_allclose(gb, u, rtol=1e-9)
    np.testing.assert_allclose(gM, np.outer(u, x_star), rtol=1e-9, atol=1e-12)
    # the Jacobian dx*/db = (I - M)^-1, forward and reverse
    solve = lambda b: tg.fixed_point(lambda x, b: M @ x + b, np.zeros(4), b, tol=1e-13)  # noqa
    inv = np.linalg.inv(np.eye(4) - M)
    np.testing.assert_allclose(tg.jacfwd(solve)(b), inv, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(tg.jacrev(solve)(b), inv, rtol=1e-9, atol=1e-12)
    # eagerly, the same numbers
    gM_e, gb_e = tg.grad(loss, argnums=(0, 1), compile=False)(M, b)
    np.testing.assert_allclose(gb_e, gb, rtol=1e-12)
    np.testing.assert_allclose(gM_e, gM, rtol=1e-12)


def _tanh_solve(W, b, x0):
    x = x0
    for _ in range(500):
        x = np.tanh(W @ x + b)
    return x


def test_a_nonlinear_system_against_finite_differences():
    rng = np.random.default_rng(2)
    W = 0.4 * rng.normal(size=(3, 3)) / np.sqrt(3)
    b = rng.normal(size=3)
    c = rng.normal(size=3)

    def loss(W, b):
        x = tg.fixed_point(lambda x, W, b: np.tanh(W @ x + b), np.zeros(3), W, b)
        return np.sum(c * x ** 2)

    def ref(W, b):
        return np.sum(c * _tanh_solve(W, b, np.zeros(3)) ** 2)
    gW, gb = tg.grad(loss, argnums=(0, 1))(W, b)
    h = 1e-6
    fd_b = np.array([(ref(W, b + h * e) - ref(W, b - h * e)) / (2 * h) for e in np.eye(3)])
    fd_W = np.array([(ref(W + h * E, b) - ref(W - h * E, b)) / (2 * h)
                     for E in np.eye(9).reshape(9, 3, 3)]).reshape(3, 3)
    np.testing.assert_allclose(gb, fd_b, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(gW, fd_W, rtol=1e-6, atol=1e-9)
    # forward mode agrees
    _, t = tg.jvp(lambda b: loss(W, b), (b,), (np.ones(3),))
    np.testing.assert_allclose(t, gb.sum(), rtol=1e-9)


def test_the_iterations_are_not_differentiated():
    g = tg.grad(lambda a: np.sum(babylonian(a))).lower(S).graph
    ops = [d["op"] for _, d in g.nodes(data=True)]
    # no tape of the iterations, no backward walk through them
    assert "while_fwd" not in ops and "while_bwd" not in ops
    assert "fixed_point" in ops
    # and x* does not depend on x0
    gx0 = tg.grad(lambda x0, a: np.sum(tg.fixed_point(lambda x, a: 0.5 * (x + a / x), x0, a)))(
        np.ones(3), S)
    np.testing.assert_array_equal(gx0, np.zeros(3))


# --- closures and trees --------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_a_traced_value_the_map_closes_over_is_differentiated(backend):
    def loss(a):
        return np.sum(tg.fixed_point(lambda x: np.cos(a * x), np.zeros_like(a)))
    np.testing.assert_allclose(tg.grad(loss, backend=backend)(A), cos_fp_grad(A), rtol=1e-8)
    # eagerly, a Tensor the map closes over cannot join the traced map: it says what to do
    with pytest.raises(TypeError, match="pass it in params"):
        tg.grad(loss, compile=False)(A)
    np.testing.assert_allclose(tg.grad(lambda a: np.sum(cos_fp(a)), compile=False)(A),
                               cos_fp_grad(A), rtol=1e-8)


def test_a_tree_of_arrays():
    # x = 0.5 cos(y) + a, y = 0.5 sin(x): a coupled pair
    def solve(a):
        return tg.fixed_point(lambda s, a: (0.5 * np.cos(s[1]) + a, 0.5 * np.sin(s[0])),
                              (np.zeros(2), np.zeros(2)), a)

    def ref(a):
        x, y = np.zeros(2), np.zeros(2)
        for _ in range(300):
            x, y = 0.5 * np.cos(y) + a, 0.5 * np.sin(x)
        return np.sum(x * y)
    a = np.array([0.3, -0.7])
    x, y = tg.compile(solve)(a)
    np.testing.assert_allclose(x, 0.5 * np.cos(y) + a, rtol=1e-9)
    g = tg.grad(lambda a: np.sum(solve(a)[0] * solve(a)[1]))(a)
    h = 1e-6
    fd = np.array([(ref(a + h * e) - ref(a - h * e)) / (2 * h) for e in np.eye(2)])
    np.testing.assert_allclose(g, fd, rtol=1e-6)


# --- eager ---------------------------------------------------------------------------------

def test_eager_on_tensors_and_on_plain_arrays():
    np.testing.assert_allclose(babylonian(S), np.sqrt(S), rtol=1e-12)
    assert type(babylonian(S)) is np.ndarray
    a = tg.tensor(S, requires_grad=True)
    x = babylonian(a)
    x.sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), 0.5 / np.sqrt(S), rtol=1e-10)
    # create_graph: the gradient is differentiable again (by the same theorem)
    a = tg.tensor(S, requires_grad=True)
    (g,) = tg.autograd.grad(babylonian(a).sum(), a, create_graph=True)
    (h,) = tg.autograd.grad(g.sum(), a)
    np.testing.assert_allclose(h.numpy(), -0.25 * S ** -1.5, rtol=1e-9)


def test_a_tensor_that_requires_grad_in_the_closure_is_refused_clearly():
    w = tg.tensor(0.5, requires_grad=True)
    with pytest.raises(TypeError, match="pass it in params"):
        tg.fixed_point(lambda x: np.cos(w * x), np.zeros(2))


# --- higher orders -------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_second_and_third_order(backend):
    f = lambda a: np.sum(babylonian(a))  # noqa: E731
    H = tg.hessian(f, backend=backend)(S)
    np.testing.assert_allclose(H, np.diag(-0.25 * S ** -1.5), rtol=1e-9, atol=1e-14)
    gg = tg.grad(lambda a: np.sum(tg.grad(f)(a)), backend=backend)(S)
    np.testing.assert_allclose(gg, -0.25 * S ** -1.5, rtol=1e-9)
    _, t = tg.jvp(tg.grad(f), (S,), (np.ones(3),), backend=backend)
    np.testing.assert_allclose(t, -0.25 * S ** -1.5, rtol=1e-9)
    np.testing.assert_allclose(tg.hessian(f, compile=False)(S), H, rtol=1e-9, atol=1e-14)
    s = lambda a: babylonian(a)   # noqa: E731
    d3 = tg.grad(tg.grad(tg.grad(s)), backend=backend)(np.float64(2.0))
    np.testing.assert_allclose(d3, 0.375 * 2.0 ** -2.5, rtol=1e-8)
    # the cosine fixed point: second derivative against differences of the analytic gradient
    h = 1e-5
    fd = (cos_fp_grad(A + h) - cos_fp_grad(A - h)) / (2 * h)
    H = tg.hessian(lambda a: np.sum(cos_fp(a)), backend=backend)(A)
    np.testing.assert_allclose(np.diag(H), fd, rtol=1e-6)
    np.testing.assert_allclose(H - np.diag(np.diag(H)), 0.0, atol=1e-12)


# --- errors --------------------------------------------------------------------------------

def test_no_convergence_is_an_error_in_every_mode():
    f = lambda x, a: 2.0 * x + a   # noqa: E731 -- expanding: never converges
    with pytest.raises(RuntimeError, match="no convergence within max_iter=20"):
        tg.fixed_point(f, np.ones(2), np.ones(2), max_iter=20)
    with pytest.raises(RuntimeError, match="no convergence within max_iter=20"):
        tg.compile(lambda a: tg.fixed_point(f, np.ones(2), a, max_iter=20))(np.ones(2))
    with pytest.raises(RuntimeError, match="no convergence within max_iter=20"):
        tg.fixed_point(f, np.ones(2), tg.tensor(np.ones(2), requires_grad=True), max_iter=20)
    with pytest.raises(RuntimeError, match="not finite .* after 1 iteration"):
        tg.fixed_point(lambda x: x * np.nan, np.ones(2))
    # converging, but not within the iterations allowed
    with pytest.raises(RuntimeError, match="max_iter=3"):
        tg.fixed_point(lambda x: 0.5 * x + 1.0, np.zeros(2), max_iter=3)


def test_a_map_that_changes_x_is_refused():
    with pytest.raises(TypeError, match=r"f changes x from float64\[2\] to float64\[1\]"):
        tg.fixed_point(lambda x: x[:1], np.ones(2))
    with pytest.raises(TypeError, match=r"float64\[2\] to float32\[2\]"):
        tg.compile(lambda a: tg.fixed_point(lambda x: (x * a).astype(np.float32),
                                            np.ones(2)))(np.ones(2))
    with pytest.raises(TypeError, match="another structure"):
        tg.fixed_point(lambda s: s[0], (np.ones(2), np.ones(2)))
    with pytest.raises(TypeError, match="floating-point"):
        tg.fixed_point(lambda x: x, np.ones(2, dtype=np.int64))
    with pytest.raises(ValueError, match="max_iter"):
        tg.fixed_point(lambda x: x, np.ones(2), max_iter=0)
    with pytest.raises(ValueError, match="tol"):
        tg.fixed_point(lambda x: x, np.ones(2), tol=-1.0)
    with pytest.raises(TypeError, match="callable"):
        tg.fixed_point(None, np.ones(2))


def test_float32_uses_a_float32_tolerance():
    a = S.astype(np.float32)
    x = tg.compile(babylonian)(a)
    assert x.dtype == np.float32
    np.testing.assert_allclose(x, np.sqrt(a), rtol=1e-5)
    g = tg.grad(lambda a: np.sum(babylonian(a)))(a)
    np.testing.assert_allclose(g, 0.5 / np.sqrt(S), rtol=1e-4)


def test_eager_use_in_a_fresh_process_loads_what_it_needs():
    # tg.fixed_point on Tensors, with nothing compiled before: the first use
    # loads the tracer and the derivations its rules need
    import subprocess
    import sys
    code = ("import numpy as np, tracegrad as tg\n"
            "a = tg.tensor(np.array([2.0, 3.0]), requires_grad=True)\n"
            "x = tg.fixed_point(lambda x, a: 0.5 * (x + a / x), np.ones(2), a)\n"
            "x.sum().backward()\n"
            "print(repr(a.grad.numpy().tolist()))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    np.testing.assert_allclose(eval(out.stdout), 0.5 / np.sqrt([2.0, 3.0]), rtol=1e-10)


def test_a_fixed_point_inside_a_loop_body():
    from tracegrad.ops import scan

    def h(a):
        def step(c, _):
            x = tg.fixed_point(lambda x, a: np.cos(a * x), np.zeros_like(a), a * c)
            return c + x, None
        return np.sum(scan(step, np.ones_like(a), None, length=3)[0])

    def h_ref(a):
        c = np.ones_like(a)
        for _ in range(3):
            x = np.zeros_like(a)
            for _ in range(500):
                x = np.cos(a * c * x)
            c = c + x
        return np.sum(c)
    a = np.array([0.1, 0.2])
    eps = 1e-6
    fd = np.array([(h_ref(a + eps * e) - h_ref(a - eps * e)) / (2 * eps) for e in np.eye(2)])
    np.testing.assert_allclose(tg.grad(h)(a), fd, rtol=1e-7)
    gh = tg.grad(h)
    fd2 = np.array([(gh(a + eps * e) - gh(a - eps * e)) / (2 * eps) for e in np.eye(2)])
    H = tg.hessian(h)(a)
    np.testing.assert_allclose(H, fd2, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(tg.hessian(h, compile=False)(a), H, rtol=1e-9, atol=1e-12)


def test_vmap_gives_each_element_its_own_fixed_point():
    S2 = np.array([[2.0, 3.0], [0.5, 9.0], [100.0, 1e-3]])
    f = lambda a: babylonian(a)   # noqa: E731
    np.testing.assert_allclose(tg.func.vmap(f)(S2), np.sqrt(S2), rtol=1e-12)
    g = tg.func.vmap(tg.func.grad(lambda a: babylonian(a).sum()))(S2)
    np.testing.assert_allclose(g, 0.5 / np.sqrt(S2), rtol=1e-10)
