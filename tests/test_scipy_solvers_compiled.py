"""SciPy's solvers, integrators and optimisers as graph nodes (issue 26):
inside tg.grad / tg.hessian / tg.jvp the user's callables are traced into
bodies, SciPy runs on the compiled bodies, and the derivatives are graph
nodes (tracegrad/ops/scipy_solvers.py).  No eager fallback (every call here
passes ``fallback=False``), both targets, closed-form gradients and
Hessians, and calls inside Python loops that roll into one scan node."""
import numpy as np
import pytest

scipy = pytest.importorskip("scipy")
import scipy.integrate  # noqa: E402
import scipy.optimize  # noqa: E402

import tracegrad as tg  # noqa: E402

BACKENDS = ["numpy", None]          # None: the default target (native where a C compiler works)
IDS = ["numpy", "default"]


def _ops(f, *args, kind="grad"):
    lo = getattr(tg, kind)(f, fallback=False).lower(*args)
    return [d["op"] for _, d in lo.graph.nodes(data=True)]


def _fd(f, x, h=1e-6):
    x = np.asarray(x, float)
    g = np.zeros_like(x)
    for i in range(x.size):
        e = np.zeros_like(x)
        e.flat[i] = h
        g.flat[i] = (f(x + e) - f(x - e)) / (2 * h)
    return g


# --- a polynomial root: x^3 + a x - b = 0 ----------------------------------------------------

def _cubic(x, th):
    return x ** 3 + th[0] * x - th[1]


def _root_brentq(th):
    return scipy.optimize.brentq(_cubic, -10.0, 10.0, args=(th,), xtol=1e-14)


def _root_newton(th):
    return scipy.optimize.newton(lambda x: _cubic(x, th), 1.0, fprime=lambda x: 3 * x ** 2 + th[0],
                                 tol=1e-14)


def _root_scalar(th):
    return scipy.optimize.root_scalar(lambda x: _cubic(x, th), bracket=[-10.0, 10.0],
                                      method="brenth", xtol=1e-14).root


def _root_exact_grad(th):
    x = np.real([r for r in np.roots([1.0, 0.0, th[0], -th[1]]) if abs(r.imag) < 1e-12][0])
    d = 3 * x * x + th[0]
    return x, np.array([-x / d, 1.0 / d])


@pytest.mark.parametrize("backend", BACKENDS, ids=IDS)
@pytest.mark.parametrize("f", [_root_brentq, _root_newton, _root_scalar])
def test_polynomial_root_closed_form(f, backend):
    th = np.array([1.0, 3.0])
    x, exact = _root_exact_grad(th)
    value, g = tg.value_and_grad(f, backend=backend, fallback=False)(th)
    np.testing.assert_allclose(value, x, rtol=1e-12)
    np.testing.assert_allclose(g, exact, rtol=1e-10)
    np.testing.assert_allclose(g, tg.grad(f, compile=False)(th), rtol=1e-10)
    assert "scipy_solve" in _ops(f, th)


def test_polynomial_root_second_derivative_and_jvp():
    """d2x/db2 of x^3 + a x = b: x' = 1/d, x'' = -6 x x'^3 (d = 3x^2 + a)."""
    th = np.array([1.0, 3.0])
    x, (dxa, dxb) = _root_exact_grad(th)
    d = 3 * x * x + th[0]
    H = tg.hessian(_root_brentq, fallback=False)(th)
    np.testing.assert_allclose(H[1, 1], -6 * x / d ** 3, rtol=1e-8)
    np.testing.assert_allclose(H, H.T, rtol=1e-10)
    np.testing.assert_allclose(H, np.array([_fd(lambda t: tg.grad(_root_brentq)(t)[i], th)
                                            for i in range(2)]), rtol=1e-5)
    v = np.array([0.3, -0.7])
    _, t = tg.jvp(_root_brentq, (th,), (v,))
    np.testing.assert_allclose(t, dxa * v[0] + dxb * v[1], rtol=1e-10)


def test_fixed_point_square_root():
    """scipy.optimize.fixed_point of Heron's map: sqrt(a), derivative 1 / (2 sqrt(a))."""
    def f(a):
        return scipy.optimize.fixed_point(lambda x: 0.5 * (x + a / x), 1.0, xtol=1e-14)
    value, g = tg.value_and_grad(f, fallback=False)(2.0)
    np.testing.assert_allclose(value, np.sqrt(2.0), rtol=1e-12)
    np.testing.assert_allclose(g, 0.5 / np.sqrt(2.0), rtol=1e-10)


# --- a quadratic minimum: x* = A^-1 theta ------------------------------------------------------

_A = np.array([[3.0, 0.5], [0.5, 2.0]])
_W = np.array([1.0, -2.0])


def _quadratic(x, th):
    return 0.5 * x @ _A @ x - th @ x


def _minimum(th):
    r = scipy.optimize.minimize(_quadratic, np.zeros(2), args=(th,), method="BFGS",
                                options={"gtol": 1e-12})
    return r.x @ _W + r.fun


@pytest.mark.parametrize("backend", BACKENDS, ids=IDS)
def test_quadratic_minimum_closed_form(backend):
    """f* = -th A^-1 th / 2 and x* = A^-1 th: grad (x* W + f*) = A^-1 W - A^-1 th,
    Hessian -A^-1."""
    th = np.array([0.7, -0.4])
    Ainv = np.linalg.inv(_A)
    value, g = tg.value_and_grad(_minimum, backend=backend, fallback=False)(th)
    # (BFGS with SciPy's difference gradient stops within about 1e-8 of x*)
    np.testing.assert_allclose(value, Ainv @ th @ _W - 0.5 * th @ Ainv @ th, rtol=1e-7)
    np.testing.assert_allclose(g, Ainv @ _W - Ainv @ th, rtol=1e-6)
    H = tg.hessian(_minimum, backend=backend, fallback=False)(th)
    np.testing.assert_allclose(H, -Ainv, rtol=1e-6, atol=1e-9)


def test_vector_root_fsolve_least_squares_minimize_scalar_closed_form():
    th = np.array([0.7, -0.4])
    Ainv = np.linalg.inv(_A)

    def by_root(t):
        return scipy.optimize.root(lambda x: _A @ x - t, np.zeros(2), tol=1e-13).x @ _W

    def by_fsolve(t):
        return scipy.optimize.fsolve(lambda x, u: _A @ x - u, np.zeros(2), args=(t,),
                                     xtol=1e-13) @ _W

    B = np.array([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])

    def by_lsq(t):
        y = np.array([t[0], t[1], t[0] + t[1]])
        r = scipy.optimize.least_squares(lambda x: B @ x - y, np.ones(2), xtol=1e-15,
                                         ftol=1e-15, gtol=1e-15)
        return r.x @ _W

    for f in (by_root, by_fsolve):
        np.testing.assert_allclose(tg.grad(f, fallback=False)(th), Ainv @ _W, rtol=1e-9)
    P = np.linalg.pinv(B) @ np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    np.testing.assert_allclose(tg.grad(by_lsq, fallback=False)(th), P.T @ _W, rtol=1e-7)

    def by_scalar(t):          # min (x - a)^2 + b x^2: x* = a / (1 + b)
        return scipy.optimize.minimize_scalar(lambda x: (x - t[0]) ** 2 + t[1] * x ** 2,
                                              tol=1e-12).x
    g = tg.grad(by_scalar, fallback=False)(th)
    np.testing.assert_allclose(g, [1 / (1 + th[1]), -th[0] / (1 + th[1]) ** 2], rtol=1e-6)


# --- a linear ODE: y' = -k y, y(t) = y0 exp(-k t) ------------------------------------------------

_T = np.linspace(0.0, 2.0, 6)


def _decay(y, t, k):
    return -k[0] * y


def _odeint_sum(p):       # p = (k, y0)
    Y = scipy.integrate.odeint(_decay, np.array([p[1]]), _T, args=(p,), rtol=1e-12, atol=1e-12)
    return np.sum(Y)


def _solve_ivp_sum(p):
    r = scipy.integrate.solve_ivp(lambda t, y: -p[0] * y, (0.0, 2.0), np.array([p[1]]),
                                  t_eval=_T, rtol=1e-12, atol=1e-12, method="DOP853")
    return np.sum(r.y)


@pytest.mark.parametrize("backend", BACKENDS, ids=IDS)
@pytest.mark.parametrize("f", [_odeint_sum, _solve_ivp_sum])
def test_linear_ode_closed_form(f, backend):
    k, y0 = 0.8, 1.5
    p = np.array([k, y0])
    e = np.exp(-k * _T)
    value, g = tg.value_and_grad(f, backend=backend, fallback=False)(p)
    np.testing.assert_allclose(value, y0 * e.sum(), rtol=1e-9)
    np.testing.assert_allclose(g, [-(y0 * _T * e).sum(), e.sum()], rtol=1e-8)
    np.testing.assert_allclose(g, tg.grad(f, compile=False)(p), rtol=1e-8)
    H = tg.hessian(f, backend=backend, fallback=False)(p)
    np.testing.assert_allclose(H, [[(y0 * _T ** 2 * e).sum(), -(_T * e).sum()],
                                   [-(_T * e).sum(), 0.0]], rtol=1e-7, atol=1e-9)
    assert "scipy_ode" in _ops(f, p)


def _odeint_times(t):
    return np.sum(scipy.integrate.odeint(_decay, np.array([1.5]), t, args=(np.array([0.8]),),
                                         rtol=1e-12, atol=1e-12))


def _solve_ivp_times(ts):       # ts = (t0, t_eval...)
    r = scipy.integrate.solve_ivp(lambda t, y: -0.8 * y, (ts[0], 5.0), np.array([1.5]),
                                  t_eval=ts[1:], rtol=1e-12, atol=1e-12)
    return np.sum(r.y)


@pytest.mark.parametrize("f", [_odeint_times, _solve_ivp_times])
def test_linear_ode_time_points_closed_form(f):
    """y(t) = y0 exp(-k (t - t0)): d/dt_i = -k y(t_i), d/dt0 = k sum_i y(t_i)
    (odeint: t[0] is t0 and y(t[0]) = y0)."""
    t = np.array([0.2, 0.7, 1.1, 2.0])
    k, y0 = 0.8, 1.5
    y = y0 * np.exp(-k * (t[1:] - t[0]))
    value, g = tg.value_and_grad(f, fallback=False)(t)
    if f is _odeint_times:
        np.testing.assert_allclose(value, y0 + y.sum(), rtol=1e-9)
    else:
        np.testing.assert_allclose(value, y.sum(), rtol=1e-9)
    np.testing.assert_allclose(g, np.concatenate([[k * y.sum()], -k * y]), rtol=1e-8)
    H = tg.hessian(f, fallback=False)(t)
    np.testing.assert_allclose(np.diag(H)[1:], k * k * y, rtol=1e-7)
    # compile=False: the same first derivative (f(y_i, t_i) and -S_y0 f(y0, t0))
    value, g = tg.value_and_grad(f, compile=False)(t)
    np.testing.assert_allclose(g, np.concatenate([[k * y.sum()], -k * y]), rtol=1e-8)


def test_solve_ivp_time_points_need_t_eval_with_compile_false():
    def f(ts):
        return np.sum(scipy.integrate.solve_ivp(lambda t, y: -y, (ts[0], ts[1]),
                                                np.array([1.0])).y)
    with pytest.raises(NotImplementedError, match="t_eval"):
        tg.grad(f, compile=False)(np.array([0.0, 1.0]))


# --- quad: the integral of the integrand's derivative, Leibniz for the limits ------------------

def _quad(p):            # int_0^b exp(-a x) dx = (1 - exp(-a b)) / a
    return scipy.integrate.quad(lambda x: np.exp(-p[0] * x), 0.0, p[1], epsabs=1e-13,
                                epsrel=1e-13)[0]


@pytest.mark.parametrize("backend", BACKENDS, ids=IDS)
def test_quad_closed_form(backend):
    a, b = 0.7, 1.3
    p = np.array([a, b])
    e = np.exp(-a * b)
    value, g = tg.value_and_grad(_quad, backend=backend, fallback=False)(p)
    np.testing.assert_allclose(value, (1 - e) / a, rtol=1e-12)
    np.testing.assert_allclose(g, [b * e / a - (1 - e) / a ** 2, e], rtol=1e-9)
    H = tg.hessian(_quad, backend=backend, fallback=False)(p)
    # d2/da2 = -b^2 e/a - 2 b e/a^2 + 2 (1 - e)/a^3; d2/dadb = -b e; d2/db2 = -a e
    np.testing.assert_allclose(H, [[-b * b * e / a - 2 * b * e / a ** 2 + 2 * (1 - e) / a ** 3,
                                    -b * e], [-b * e, -a * e]], rtol=1e-7)


# --- inside Python loops that roll into one scan node --------------------------------------------

def _roots_in_loop(th):
    s = 0.0
    for i in range(80):
        s = s + scipy.optimize.brentq(_cubic, -10.0, 10.0, args=(th + 0.01 * i,), xtol=1e-14)
    return s


def _odeint_per_step(p):
    y = np.array([p[1]])
    for i in range(150):
        y = scipy.integrate.odeint(_decay, y, np.array([0.0, 0.01]), args=(p,), rtol=1e-12,
                                   atol=1e-12)[-1] * 1.0 + 0.0
    return y[0]


def test_solves_in_a_rolled_loop():
    th = np.array([1.0, 3.0])
    ops = _ops(_roots_in_loop, th)
    assert "scan" in ops and ops.count("scipy_solve") < 10
    exact = sum(_root_exact_grad(th + 0.01 * i)[1] for i in range(80))
    np.testing.assert_allclose(tg.grad(_roots_in_loop, fallback=False)(th), exact, rtol=1e-9)

    p = np.array([0.8, 1.5])
    ops = _ops(_odeint_per_step, p)
    assert "scan" in ops and ops.count("scipy_ode") < 10
    value, g = tg.value_and_grad(_odeint_per_step, fallback=False)(p)
    e = np.exp(-p[0] * 1.5)
    np.testing.assert_allclose(value, p[1] * e, rtol=1e-8)
    np.testing.assert_allclose(g, [-1.5 * p[1] * e, e], rtol=1e-7)


# --- what stays eager says why -------------------------------------------------------------------

def test_declined_call_says_why():
    def f(t):
        return scipy.optimize.brentq(lambda x: x ** 3 - t, 0.0, 10.0, full_output=True)[0]
    with pytest.raises(tg.TraceError, match=r"brentq.*full_output"):
        tg.grad(f, fallback=False)(2.0)
    np.testing.assert_allclose(tg.grad(f)(2.0), 1 / (3 * 2.0 ** (2 / 3)), rtol=1e-8)


# --- minimize with bounds: the implicit function theorem on the free elements ------------------

def _bounded(th):
    r = scipy.optimize.minimize(_quadratic, np.zeros(2), args=(th,), method="L-BFGS-B",
                                bounds=[(None, 0.1), (-1.0, 1.0)],
                                options={"ftol": 1e-15, "gtol": 1e-12})
    return r.x @ _W + r.fun


@pytest.mark.parametrize("compile", [True, False], ids=["compiled", "eager"])
def test_minimize_with_bounds_closed_form(compile):
    """x0 held at its bound 0.1, x1 = (th1 - 0.05) / 2 free: d(x W + f*)/dth =
    (0, W1 / 2) - x*."""
    th = np.array([0.7, -0.4])
    x1 = (th[1] - 0.05) / 2
    g = tg.grad(_bounded, compile=compile, fallback=not compile)(th)
    np.testing.assert_allclose(g, [-0.1, _W[1] / 2 - x1], rtol=1e-6)
    if compile:
        H = tg.hessian(_bounded, fallback=False)(th)
        np.testing.assert_allclose(H, [[0.0, 0.0], [0.0, -0.5]], atol=1e-7)


# --- curve_fit: a linear model, popt = (X^T X)^-1 X^T y, pcov = (X^T X)^-1 s^2 --------------

_XD = np.linspace(0.0, 2.0, 9)
_X = np.stack([np.ones_like(_XD), _XD], axis=1)


def _line(x, a, b):
    return a + b * x


def _fit(y):
    popt, pcov = scipy.optimize.curve_fit(_line, _XD, y)
    return popt @ _W + 10.0 * np.sum(pcov)


def _fit_popt(y):
    return scipy.optimize.curve_fit(_line, _XD, y, p0=[0.5, 0.5])[0] @ _W


def test_curve_fit_closed_form():
    y = 1.0 + 0.5 * _XD + 0.1 * np.sin(7 * _XD)
    G = np.linalg.inv(_X.T @ _X)
    p = G @ _X.T @ y
    r = _X @ p - y
    m, n = _X.shape
    value, g = tg.value_and_grad(_fit, fallback=False)(y)
    np.testing.assert_allclose(value, p @ _W + 10 * G.sum() * (r @ r) / (m - n), rtol=1e-6)
    # d popt/dy = G X^T; d (r.r)/dy = -2 r (r is orthogonal to X's columns)
    np.testing.assert_allclose(g, _X @ G @ _W + 10 * G.sum() * (-2 * r) / (m - n),
                               rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(tg.grad(_fit_popt, compile=False)(y), _X @ G @ _W, rtol=1e-6)
    with pytest.raises(NotImplementedError, match=r"curve_fit's pcov"):
        tg.grad(_fit, compile=False)(y)


# --- dblquad: nested quad, the inner limits functions of x ----------------------------------

def _dblquad(p):          # int_0^b int_0^x a dy dx = a b^2 / 2
    return scipy.integrate.dblquad(lambda y, x: p[0] * (1.0 + 0.0 * y), 0.0, p[1],
                                   lambda x: 0.0, lambda x: x)[0]


@pytest.mark.parametrize("compile", [True, False], ids=["compiled", "eager"])
def test_dblquad_closed_form(compile):
    a, b = 0.7, 1.3
    value, g = tg.value_and_grad(_dblquad, compile=compile, fallback=not compile)(
        np.array([a, b]))
    np.testing.assert_allclose(value, a * b * b / 2, rtol=1e-10)
    np.testing.assert_allclose(g, [b * b / 2, a * b], rtol=1e-8)


# --- an import statement inside the differentiated function ---------------------------------

def _imports_inside(a):
    import scipy.linalg
    import scipy.optimize as so
    from scipy.special import gammaln
    r = so.brentq(lambda x: x ** 3 - a[0, 0], 0.0, 10.0)
    return np.sum(scipy.linalg.expm(a)) + np.sum(gammaln(a + 2)) + r


@pytest.mark.parametrize("compile", [True, False], ids=["compiled", "eager"])
def test_import_inside_the_function(compile):
    a = np.array([[0.3, 0.1], [0.2, 0.4]])
    g = tg.grad(_imports_inside, compile=compile, fallback=not compile)(a)
    np.testing.assert_allclose(g, _fd(_imports_inside, a), rtol=1e-6)


# --- least_squares with bounds ---------------------------------------------------------------

_B = np.array([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])


def _lsq_bounded(t):
    y = np.array([t[0], t[1], t[0] + t[1]])
    r = scipy.optimize.least_squares(lambda x: _B @ x - y, np.zeros(2),
                                     bounds=([-np.inf, -0.1], [np.inf, np.inf]),
                                     xtol=1e-15, ftol=1e-15, gtol=1e-15)
    return r.x @ _W


@pytest.mark.parametrize("compile", [True, False], ids=["compiled", "eager"])
def test_least_squares_with_bounds_closed_form(compile):
    """x1 held at -0.1: x0 = t0 + (t1 + 0.1) / 2, so d(x W)/dt = (1, 1/2)."""
    g = tg.grad(_lsq_bounded, compile=compile, fallback=not compile)(np.array([0.7, -0.4]))
    np.testing.assert_allclose(g, [1.0, 0.5], rtol=1e-7)


# --- minimize with constraints: the KKT system ------------------------------------------------

def _eq_constrained(th):
    r = scipy.optimize.minimize(
        _quadratic, np.zeros(2), args=(th,), method="SLSQP",
        constraints=[{"type": "eq", "fun": lambda x: x[0] + x[1] - 0.5 * th[0]},
                     {"type": "ineq", "fun": lambda x: 5.0 - x[0]}],      # inactive
        options={"ftol": 1e-14})
    return r.x @ _W + r.fun


def _eq_constrained_exact(th):
    a = np.ones(2)
    M = np.block([[_A, -a[:, None]], [a[None, :], np.zeros((1, 1))]])
    x = np.linalg.solve(M, np.concatenate([th, [0.5 * th[0]]]))[:2]
    return x @ _W + _quadratic(x, th)


def _on_circle(th):          # max th.x on the unit disc: x* = th / |th| (active inequality)
    r = scipy.optimize.minimize(lambda x: -(th @ x), np.array([0.1, 0.1]), method="SLSQP",
                                constraints={"type": "ineq", "fun": lambda x: 1.0 - x @ x},
                                options={"ftol": 1e-14})
    return r.x @ _W


def test_minimize_with_constraints_kkt():
    th = np.array([0.7, -0.4])
    np.testing.assert_allclose(tg.grad(_eq_constrained, fallback=False)(th),
                               _fd(_eq_constrained_exact, th), rtol=1e-6)
    H = tg.hessian(_eq_constrained, fallback=False)(th)
    Hf = np.array([_fd(lambda t: _fd(_eq_constrained_exact, t, 1e-4)[i], th, 1e-4)
                   for i in range(2)])
    np.testing.assert_allclose(H, Hf, rtol=1e-4, atol=1e-6)
    u = th / np.linalg.norm(th)
    np.testing.assert_allclose(tg.grad(_on_circle, fallback=False)(th),
                               (_W - (_W @ u) * u) / np.linalg.norm(th), rtol=1e-6)
    with pytest.raises(NotImplementedError, match=r"minimize.*constraints"):
        tg.grad(_on_circle, compile=False)(th)


# --- the same functions under tracegrad.scipy --------------------------------------------------

@pytest.mark.parametrize("compile", [True, False], ids=["compiled", "eager"])
def test_explicit_namespace(compile):
    import tracegrad.scipy as tsp

    def f(t):          # t^(1/3) + t/2 + exp(-t)
        return (tsp.optimize.brentq(lambda x: x ** 3 - t, 0.0, 10.0, xtol=1e-14)
                + tsp.integrate.quad(lambda x: t * x, 0.0, 1.0)[0]
                + tsp.integrate.odeint(lambda y, s: -t * y, np.array([1.0]), np.array([0.0, 1.0]),
                                       rtol=1e-12, atol=1e-12)[-1, 0])
    g = tg.grad(f, compile=compile, fallback=not compile)(2.0)
    np.testing.assert_allclose(g, 2.0 ** (-2 / 3) / 3 + 0.5 - np.exp(-2.0), rtol=1e-8)
    assert tsp.optimize.brentq(lambda x: x - 1.0, 0.0, 3.0) == 1.0
