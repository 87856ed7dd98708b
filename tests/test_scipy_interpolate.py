"""scipy.interpolate as written (tracegrad/ops/scipy_interpolate.py, routed by
tracegrad/frontend/scipy_calls.py): CubicSpline, interp1d, make_interp_spline /
BSpline, PchipInterpolator, RegularGridInterpolator and interpn, written as
``scipy.interpolate.X(...)`` and as ``from scipy.interpolate import X``,
compiled and with compile=False.  Values equal SciPy's; float64 gradients in
the query points, the data values (and the breakpoints) equal central finite
differences; extrapolation and out-of-bounds behaviour is SciPy's; bad input
gets a clear error."""
from __future__ import annotations

import zlib

import numpy as np
import pytest

import tracegrad as tg

scipy = pytest.importorskip("scipy")
import scipy.interpolate  # noqa: E402
from scipy.interpolate import (CubicSpline, PchipInterpolator,  # noqa: E402
                               RegularGridInterpolator, interp1d, make_interp_spline)

MODES = [True, False]
STYLES = ["attribute", "name"]


def R(name):
    return np.random.default_rng(zlib.crc32(name.encode()))


def _fd(f, args, i, eps=1e-6):
    x = np.asarray(args[i], float)
    g = np.zeros_like(x)
    for k in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[k] = eps
        hi, lo = list(args), list(args)
        hi[i], lo[i] = x + e, x - e
        g[k] = (f(*hi) - f(*lo)) / (2 * eps)
    return g


def _sum(out):
    return np.sum(np.sin(out) * np.linspace(0.5, 1.5, np.size(out)).reshape(np.shape(out)))


X7 = np.array([0.0, 0.3, 0.7, 1.2, 1.5, 2.1, 2.5])
Q = np.array([-0.25, 0.1, 0.33, 0.77, 1.49, 2.2, 2.45, 2.8])     # with extrapolation
Q_IN = np.array([0.05, 0.3, 0.77, 1.49, 2.2, 2.45])


def _y(r, n=7, *trail):
    return r.uniform(-1, 1, (n,) + trail)


# name -> (SciPy name, build(cls, q, y, x) -> result, makers of (q, y, x), argnums, rtol)
CASES = {
    "cubic_not_a_knot": ("CubicSpline", lambda C, q, y, x: C(x, y)(q), None, (0, 1, 2)),
    "cubic_natural": ("CubicSpline", lambda C, q, y, x: C(x, y, bc_type="natural")(q), None,
                      (0, 1, 2)),
    "cubic_clamped": ("CubicSpline", lambda C, q, y, x: C(x, y, bc_type="clamped")(q), None,
                      (0, 1, 2)),
    "cubic_values_bc": ("CubicSpline", lambda C, q, y, x: C(
        x, y, bc_type=((1, 0.5), (2, -1.0)))(q), None, (0, 1, 2)),
    "cubic_traced_bc": ("CubicSpline", lambda C, q, y, x: C(
        x, y, bc_type=((1, 0.3 * y[0]), (2, y[1] - 1.0)))(q), None, (0, 1, 2)),
    "cubic_periodic": ("CubicSpline", lambda C, q, y, x: C(
        x, np.concatenate([y[:-1], y[:1]]), bc_type="periodic")(q), None, (0, 1, 2)),
    "cubic_nu1": ("CubicSpline", lambda C, q, y, x: C(x, y)(q, 1), None, (0, 1, 2)),
    "cubic_nu2": ("CubicSpline", lambda C, q, y, x: C(x, y, bc_type="natural")(q, nu=2),
                  None, (0, 1)),
    "cubic_derivative": ("CubicSpline", lambda C, q, y, x: C(x, y).derivative()(q), None,
                         (0, 1, 2)),
    "cubic_2d_axis1": ("CubicSpline", lambda C, q, y, x: C(x, y.T, axis=1)(q),
                       lambda r: (Q, _y(r, 7, 2), X7), (0, 1, 2)),
    "cubic_n3": ("CubicSpline", lambda C, q, y, x: C(x[:3], y[:3])(q), None, (0, 1, 2)),
    "cubic_n2": ("CubicSpline", lambda C, q, y, x: C(x[:2], y[:2])(q), None, (0, 1)),
    "pchip": ("PchipInterpolator", lambda C, q, y, x: C(x, y)(q), None, (0, 1, 2)),
    "pchip_flat": ("PchipInterpolator", lambda C, q, y, x: C(x, y)(q),
                   lambda r: (Q, np.array([0.0, 0.5, 0.5, 0.2, 0.9, 1.0, 0.4]), X7), (0,)),
    "interp1d_linear": ("interp1d", lambda C, q, y, x: C(x, y, bounds_error=False,
                                                          fill_value=(-2.0, 3.0))(q),
                        None, (0, 1, 2)),
    "interp1d_extrapolate": ("interp1d", lambda C, q, y, x: C(
        x, y, fill_value="extrapolate")(q), None, (0, 1, 2)),
    "interp1d_nearest": ("interp1d", lambda C, q, y, x: C(
        x, y, kind="nearest", fill_value="extrapolate")(q), None, (0, 1)),
    "interp1d_previous": ("interp1d", lambda C, q, y, x: C(
        x, y, kind="previous", bounds_error=False)(q[1:-1]), None, (0, 1)),
    "interp1d_next": ("interp1d", lambda C, q, y, x: C(
        x, y, kind="next", bounds_error=False, fill_value=0.5)(q), None, (0, 1)),
    "interp1d_cubic": ("interp1d", lambda C, q, y, x: C(
        x, y, kind="cubic", fill_value="extrapolate")(q), None, (0, 1, 2)),
    "interp1d_quadratic": ("interp1d", lambda C, q, y, x: C(
        x, y, kind="quadratic", bounds_error=False, fill_value=np.array([0.1, 0.2]))(q),
                           lambda r: (Q, _y(r, 7, 2).T, X7), (0, 1)),
    "interp1d_unsorted": ("interp1d", lambda C, q, y, x: C(
        x[::-1], y[::-1], bounds_error=False, fill_value=0.0)(q), None, (0, 1)),
    "spline_k1": ("make_interp_spline", lambda C, q, y, x: C(x, y, k=1)(q), None, (0, 1, 2)),
    "spline_k2": ("make_interp_spline", lambda C, q, y, x: C(x, y, k=2)(q), None, (0, 1, 2)),
    "spline_k3": ("make_interp_spline", lambda C, q, y, x: C(x, y)(q), None, (0, 1, 2)),
    "spline_k3_nu1": ("make_interp_spline", lambda C, q, y, x: C(x, y)(q, nu=1), None,
                      (0, 1)),
    "spline_k3_derivative": ("make_interp_spline", lambda C, q, y, x: C(x, y).derivative(2)(q),
                             None, (0, 1)),
    "spline_2d": ("make_interp_spline", lambda C, q, y, x: C(x, y, k=3, axis=1)(q),
                  lambda r: (Q, _y(r, 7, 2).T, X7), (0, 1)),
    "spline_k0": ("make_interp_spline", lambda C, q, y, x: C(x, y, k=0)(q), None, (0, 1)),
    "spline_k5": ("make_interp_spline", lambda C, q, y, x: C(x, y, k=5)(q), None, (0, 1, 2)),
    "spline_t_given": ("make_interp_spline", lambda C, q, y, x: C(
        x, y, k=3, t=np.r_[[0.0] * 4, 0.9, 1.4, 1.8, [2.5] * 4])(q), None, (0, 1)),
    "ppoly": ("PPoly", lambda C, q, y, x: C(np.stack([y[:-1], y[1:], y[:-1] * y[1:]]), x)(q),
              None, (0, 1, 2)),
    "hermite": ("CubicHermiteSpline", lambda C, q, y, x: C(x, y, np.sin(y))(q), None,
                (0, 1, 2)),
    "pchip_interpolate_der": ("pchip_interpolate", lambda C, q, y, x: C(x, y, q, der=1), None,
                              (0, 1, 2)),
    "cubic_derivative3": ("CubicSpline", lambda C, q, y, x: C(x, y).derivative(3)(q), None,
                          (1, 2)),
    "interp1d_order": ("interp1d", lambda C, q, y, x: C(
        x, y, kind=3, fill_value="extrapolate")(q), None, (0, 1, 2)),
    "interp1d_nearest_up": ("interp1d", lambda C, q, y, x: C(
        x, y, kind="nearest-up", fill_value="extrapolate")(q), None, (0, 1)),
    "interp1d_zero": ("interp1d", lambda C, q, y, x: C(
        x, y, kind="zero", bounds_error=False, fill_value=0.0)(q), None, (0, 1)),
    "interp1d_slinear": ("interp1d", lambda C, q, y, x: C(
        x, y, kind="slinear", fill_value="extrapolate")(q), None, (0, 1, 2)),
    "bspline_direct": ("BSpline", lambda C, q, y, x: C(
        np.array([0.0, 0, 0, 0, 0.8, 1.4, 2.5, 2.5, 2.5, 2.5]), y[:6], 3)(q), None, (0, 1)),
    "bspline_k2_periodic": ("BSpline", lambda C, q, y, x: C(
        np.linspace(-1.0, 3.5, 9), y[:6], 2, extrapolate="periodic")(q), None, (0, 1)),
}

GRID = (np.array([0.0, 0.5, 1.2, 2.0]), np.array([-1.0, 0.0, 0.4, 1.0, 1.5]))
XI = np.array([[0.1, -0.45], [1.9, 1.4], [0.7, 0.22], [1.1, 0.05], [0.3, 0.99]])
XI_OUT = np.array([[0.1, -0.45], [2.3, 1.4], [0.7, -1.2], [1.1, 0.05]])

GRID_CASES = {
    "rgi_linear": ("RegularGridInterpolator", lambda C, q, v: C(
        GRID, v, bounds_error=False)(q),
                   lambda r: (XI, r.uniform(-1, 1, (4, 5)))),
    "rgi_linear_trailing": ("RegularGridInterpolator", lambda C, q, v: C(
        GRID, v, bounds_error=False)(q[:3]),
                            lambda r: (XI, r.uniform(-1, 1, (4, 5, 2)))),
    "rgi_nearest": ("RegularGridInterpolator", lambda C, q, v: C(
        GRID, v, method="nearest", bounds_error=False)(q),
                    lambda r: (XI, r.uniform(-1, 1, (4, 5)))),
    "rgi_fill": ("RegularGridInterpolator", lambda C, q, v: C(
        GRID, v, bounds_error=False, fill_value=0.25)(q),
                 lambda r: (XI_OUT, r.uniform(-1, 1, (4, 5)))),
    "rgi_extrapolate": ("RegularGridInterpolator", lambda C, q, v: C(
        GRID, v, bounds_error=False, fill_value=None)(q),
                        lambda r: (XI_OUT, r.uniform(-1, 1, (4, 5)))),
    "rgi_tuple_query": ("RegularGridInterpolator", lambda C, q, v: C(
        GRID, v, bounds_error=False, fill_value=None)((q[:, 0], q[:, 1])),
                        lambda r: (XI, r.uniform(-1, 1, (4, 5)))),
    "rgi_3d": ("RegularGridInterpolator", lambda C, q, v: C(
        GRID + (np.array([0.0, 1.0, 3.0]),), v, bounds_error=False, fill_value=None)(
        np.concatenate([q, q[:, :1] * 1.3], axis=1)),
               lambda r: (XI, r.uniform(-1, 1, (4, 5, 3)))),
    "interpn": ("interpn", lambda C, q, v: C(GRID, v, q, bounds_error=False,
                                                     fill_value=0.5), lambda r: (
        XI_OUT, r.uniform(-1, 1, (4, 5)))),
}


def _written(style, sciname, build):
    """The user's function, written as scipy.interpolate.X(...) or with X
    imported by name (a closure variable holding SciPy's class)."""
    if style == "attribute":
        def f(*args):
            return _sum(build(getattr(scipy.interpolate, sciname), *args))
    else:
        cls = getattr(scipy.interpolate, sciname)

        def f(*args):
            return _sum(build(cls, *args))
    return f


def _args(case, makers):
    r = R(case)
    return list(makers(r)) if makers else [Q, _y(r), X7]


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("compile", MODES, ids=["compiled", "eager"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_spline_as_written(case, compile, style):
    sciname, build, makers, wrt = CASES[case]
    args = _args(case, makers)
    f = _written(style, sciname, build)
    want = f(*args)                          # plain arrays: SciPy itself
    value, grads = tg.value_and_grad(f, argnums=wrt, compile=compile,
                                     fallback=not compile)(*args)
    np.testing.assert_allclose(value, want, rtol=1e-10, atol=1e-12)
    for i, g in zip(wrt, grads):
        np.testing.assert_allclose(g, _fd(f, args, i), rtol=1e-6, atol=1e-7,
                                   err_msg=f"{case}: d/d argument {i}")


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("compile", MODES, ids=["compiled", "eager"])
@pytest.mark.parametrize("case", sorted(GRID_CASES))
def test_grid_as_written(case, compile, style):
    sciname, build, makers = GRID_CASES[case]
    args = list(makers(R(case)))
    f = _written(style, sciname, build)
    want = f(*args)
    value, grads = tg.value_and_grad(f, argnums=(0, 1), compile=compile,
                                     fallback=not compile)(*args)
    np.testing.assert_allclose(value, want, rtol=1e-10, atol=1e-12)
    for i, g in zip((0, 1), grads):
        np.testing.assert_allclose(g, _fd(f, args, i), rtol=1e-6, atol=1e-7,
                                   err_msg=f"{case}: d/d argument {i}")


@pytest.mark.parametrize("case", sorted(CASES))
def test_full_values_equal_scipy(case):
    """The whole traced result, extrapolated points included, is SciPy's."""
    sciname, build, makers, _ = CASES[case]
    args = _args(case, makers)
    cls = getattr(scipy.interpolate, sciname)
    want = build(cls, *args)
    got = tg.compile(lambda *a: build(cls, *a), fallback=False)(*args)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-11, atol=1e-12)


# --- literal import styles, SciPy objects made outside, attributes --------------------------

def spline_by_name(q, y):
    return np.sum(CubicSpline(X7, y, bc_type="natural")(q) ** 2)


def spline_by_attribute(q, y):
    return np.sum(scipy.interpolate.CubicSpline(X7, y, bc_type="natural")(q) ** 2)


def grid_by_name(xi, v):
    return np.sum(RegularGridInterpolator(GRID, v)(xi) ** 2)


@pytest.mark.parametrize("compile", MODES, ids=["compiled", "eager"])
@pytest.mark.parametrize("f", [spline_by_name, spline_by_attribute, grid_by_name])
def test_literal_import_styles(f, compile):
    args = [Q_IN, np.cos(X7)] if f is not grid_by_name else [XI, np.add.outer(*GRID) ** 2]
    value, g = tg.value_and_grad(f, argnums=(0, 1), compile=compile)(*args)
    np.testing.assert_allclose(value, f(*args), rtol=1e-12)
    for i in (0, 1):
        np.testing.assert_allclose(g[i], _fd(f, args, i), rtol=1e-6, atol=1e-8)


MADE_OUTSIDE = {
    "CubicSpline": CubicSpline(X7, np.sin(X7)),
    "Pchip": PchipInterpolator(X7, np.sin(X7)),
    "BSpline": make_interp_spline(X7, np.sin(X7), k=3),
    "interp1d": interp1d(X7, np.sin(X7), kind="cubic", bounds_error=False, fill_value=0.0),
    "RGI": RegularGridInterpolator(GRID, np.add.outer(*GRID) ** 2, bounds_error=False),
}


@pytest.mark.parametrize("compile", MODES, ids=["compiled", "eager"])
@pytest.mark.parametrize("which", sorted(MADE_OUTSIDE))
def test_scipy_object_made_outside(which, compile):
    """A SciPy interpolator made from plain data outside the function is
    evaluated on traced / recorded query points (its coefficients constants)."""
    spl = MADE_OUTSIDE[which]
    q = XI if which == "RGI" else Q_IN

    def f(q):
        return np.sum(np.sin(spl(q)))
    value, g = tg.value_and_grad(f, compile=compile, fallback=not compile)(q)
    np.testing.assert_allclose(value, f(q), rtol=1e-12)
    np.testing.assert_allclose(g, _fd(f, [q], 0), rtol=1e-6, atol=1e-8)


def test_made_inside_from_constants_eager():
    """compile=False: a spline built inside from plain data is SciPy's (adopted),
    evaluated on the recorded query points."""
    def f(q):
        cs = scipy.interpolate.CubicSpline(X7, np.sin(X7))
        return np.sum(cs(q) ** 2) + np.sum(cs.derivative()(q))
    value, g = tg.value_and_grad(f, compile=False)(Q_IN)
    np.testing.assert_allclose(value, f(Q_IN), rtol=1e-12)
    np.testing.assert_allclose(g, _fd(f, [Q_IN], 0), rtol=1e-6, atol=1e-8)


def _plain(v):
    return np.asarray(v.detach().numpy()) if hasattr(v, "detach") else np.asarray(v)


def _outputs(f, args, compile):
    """f's outputs: a compiled transform's (no fallback), or f run eagerly on
    recorded values (inside tg.grad(compile=False))."""
    if compile:
        return [_plain(o) for o in tg.compile(f, fallback=False)(*args)]
    seen = {}

    def loss(*a):
        seen["out"] = [_plain(o) for o in f(*a)]
        return np.sum(a[-1])
    tg.grad(loss, argnums=len(args) - 1, compile=False)(*args)
    return seen["out"]


@pytest.mark.parametrize("compile", MODES, ids=["compiled", "eager"])
def test_attributes_as_scipy(compile):
    y = np.cos(X7)

    def f(y):
        cs = scipy.interpolate.CubicSpline(X7, y)
        b = scipy.interpolate.make_interp_spline(X7, y, k=3)
        return cs.c, cs.x, b.t, b.c, b.derivative().c

    got = _outputs(f, [y], compile)
    cs, b = CubicSpline(X7, y), make_interp_spline(X7, y, k=3)
    for g, w in zip(got, (cs.c, cs.x, b.t, b.c, b.derivative().c)):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)


# --- extrapolation and bounds ----------------------------------------------------------------

@pytest.mark.parametrize("compile", MODES, ids=["compiled", "eager"])
def test_no_extrapolation_gives_nan_as_scipy(compile):
    y = np.cos(X7)

    def f(q, y):
        return (scipy.interpolate.CubicSpline(X7, y, extrapolate=False)(q),
                scipy.interpolate.make_interp_spline(X7, y)(q, extrapolate=False),
                scipy.interpolate.interp1d(X7, y, bounds_error=False)(q))
    got = _outputs(f, [Q, y], compile)
    for g, w in zip(got, f(Q, y)):
        assert np.isnan(w).sum() == 2
        np.testing.assert_allclose(g, w, rtol=1e-11, atol=1e-12)


def test_bounds_error_as_scipy():
    """interp1d's and RegularGridInterpolator's default bounds_error=True:
    SciPy's ValueError eagerly; a compiled transform needs the query values
    and runs eagerly for that signature (fallback=False: the error says so)."""
    def f(q, y):
        return np.sum(scipy.interpolate.interp1d(X7, y)(q))
    y = np.cos(X7)
    with pytest.raises(ValueError, match=r"in x_new is below the interpolation range"):
        tg.grad(f, argnums=1, compile=False)(Q, y)
    with pytest.raises(ValueError, match=r"in x_new is below the interpolation range"):
        tg.grad(f, argnums=1)(Q, y)                     # (eager fallback)
    np.testing.assert_allclose(tg.grad(f, argnums=1)(Q_IN, y), _fd(f, [Q_IN, y], 1),
                               rtol=1e-6, atol=1e-8)
    with pytest.raises(tg.TraceError, match=r"interp1d with bounds_error=True"):
        tg.grad(f, argnums=1, fallback=False)(Q_IN, y)

    def g(xi, v):
        return np.sum(scipy.interpolate.RegularGridInterpolator(GRID, v)(xi))
    with pytest.raises(ValueError, match="out of bounds in dimension 0"):
        tg.grad(g, argnums=1, compile=False)(XI_OUT, np.ones((4, 5)))
    v = np.add.outer(*GRID) ** 2
    for c in MODES:
        gx, gv = tg.grad(g, argnums=(0, 1), compile=c)(XI, v)      # compiled: eager fallback
        np.testing.assert_allclose(gx, _fd(g, [XI, v], 0), rtol=1e-6, atol=1e-8)
        np.testing.assert_allclose(gv, _fd(g, [XI, v], 1), rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("compile", MODES, ids=["compiled", "eager"])
def test_second_derivative_and_forward_mode(compile):
    """A composition of rows: the hessian in the query points is the
    spline's second derivative (diagonal), forward mode its first."""
    y = np.cos(X7)

    def f(q):
        return np.sum(scipy.interpolate.CubicSpline(X7, y)(q))
    h = tg.hessian(f, compile=compile)(Q_IN)
    np.testing.assert_allclose(h, np.diag(CubicSpline(X7, y)(Q_IN, 2)), rtol=1e-9, atol=1e-10)

    def g(y):
        return scipy.interpolate.CubicSpline(X7, y)(Q_IN)
    t = np.sin(3 * X7)
    out = tg.jvp(g, (y,), (t,), compile=compile)
    np.testing.assert_allclose(_plain(out[0]), CubicSpline(X7, y)(Q_IN), rtol=1e-12)
    np.testing.assert_allclose(_plain(out[1]), CubicSpline(X7, t)(Q_IN), rtol=1e-9, atol=1e-12)


# --- bad input -------------------------------------------------------------------------------

@pytest.mark.parametrize("compile", MODES, ids=["compiled", "eager"])
def test_bad_input_clear_errors(compile):
    def decreasing(y, x):
        return np.sum(scipy.interpolate.CubicSpline(x, y)(Q_IN))
    if compile:     # x's values are not known while tracing: NaN, never a wrong number
        assert np.isnan(tg.compile(decreasing, fallback=False)(np.cos(X7), X7[::-1]))
    else:
        with pytest.raises(ValueError, match="strictly increasing"):
            tg.grad(decreasing, compile=False)(np.cos(X7), X7[::-1])

    def cubic_grid(v):
        return np.sum(scipy.interpolate.RegularGridInterpolator(GRID, v, method="cubic")(XI))
    with pytest.raises(NotImplementedError, match=r"RegularGridInterpolator\(method='cubic'\)"):
        tg.grad(cubic_grid, compile=compile, fallback=False)(np.ones((4, 5)))

    def natural_bspline(y):
        return np.sum(scipy.interpolate.make_interp_spline(X7, y, bc_type="natural")(Q_IN))
    with pytest.raises(NotImplementedError, match=r"make_interp_spline\(bc_type='natural'\)"):
        tg.grad(natural_bspline, compile=compile, fallback=False)(np.cos(X7))

    def periodic(y):
        return np.sum(scipy.interpolate.CubicSpline(X7, y, bc_type="periodic")(Q_IN))
    if compile:     # y's ends are not known while tracing: NaN, never a wrong number
        assert np.isnan(tg.compile(periodic, fallback=False)(np.cos(X7)))
    else:
        with pytest.raises(ValueError, match="must be identical"):
            tg.grad(periodic, compile=False)(np.cos(X7))

    def integrate(y):
        return scipy.interpolate.CubicSpline(X7, y).integrate(0.0, 1.0)
    with pytest.raises(NotImplementedError, match=r"CubicSpline\.integrate"):
        tg.grad(integrate, compile=compile, fallback=False)(np.cos(X7))

    def bad_bc(y):
        return np.sum(scipy.interpolate.CubicSpline(X7, y, bc_type=((3, 0.0), "natural"))(Q))
    with pytest.raises(ValueError, match="derivative order must be 1 or 2"):
        tg.grad(bad_bc, compile=compile, fallback=False)(np.cos(X7))


def test_tracegrad_scipy_interpolate_is_the_same_table():
    from tracegrad.frontend import scipy_calls
    import tracegrad.scipy.interpolate as ti
    assert scipy_calls.substitute(scipy.interpolate.CubicSpline).__tracegrad_implementation__ \
        is ti.CubicSpline
    y = np.cos(X7)
    np.testing.assert_allclose(tg.grad(lambda y: np.sum(ti.CubicSpline(X7, y)(Q)))(y),
                               _fd(lambda y: np.sum(CubicSpline(X7, y)(Q)), [y], 0),
                               rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("compile", MODES, ids=["compiled", "eager"])
def test_gradients_in_grid_points_and_knots(compile):
    """Breakpoints are differentiated too: RegularGridInterpolator's grid
    points, a BSpline's interior knots."""
    v = np.random.default_rng(0).uniform(-1, 1, (4, 5))
    xi = np.concatenate([XI, [[2.3, 1.7]]])

    def f(a, b):
        return _sum(scipy.interpolate.RegularGridInterpolator(
            (a, b), v, bounds_error=False, fill_value=None)(xi))
    ga, gb = tg.grad(f, argnums=(0, 1), compile=compile, fallback=not compile)(*GRID)
    np.testing.assert_allclose(ga, _fd(f, list(GRID), 0), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(gb, _fd(f, list(GRID), 1), rtol=1e-6, atol=1e-8)

    c = np.cos(np.arange(6.0))

    def h(inner):
        t = np.concatenate([np.zeros(4), inner, np.full(4, 2.5)])
        return _sum(scipy.interpolate.BSpline(t, c, 3)(Q))
    inner = np.array([0.8, 1.4])
    np.testing.assert_allclose(tg.grad(h, compile=compile, fallback=not compile)(inner),
                               _fd(h, [inner], 0), rtol=1e-6, atol=1e-8)
