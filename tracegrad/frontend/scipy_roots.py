"""SciPy's root finders, minimizers, ``quad`` and ODE solvers on
differentiated values: SciPy's solution, and its derivative by the implicit
function theorem (or the integral of the gradient, or forward sensitivities).

``scipy.optimize.brentq(f, a, b, args=(theta,))`` (or an ``f`` that closes
over theta) returns the root x* of f(x, theta) = 0.  SciPy computes x* on
plain numbers (f is called with the differentiated values' current values,
with grad mode off), so the root is exactly SciPy's; then f is evaluated
once more at x* with the tape recording, and the result is

    x* + (t - stop_gradient(t)),   t = -f(x*, theta) / f_x(x*, theta)

whose value is x* and whose derivative is dx*/dtheta = -f_theta / f_x (f_x
from the eager engine, a constant).  That is the first derivative only: a
second derivative through it raises an error (row ``first_order``), never a
silently wrong hessian.  ``fixed_point(g, x0)`` is the root of
g(x) - x.

Vector problems: ``root`` / ``fsolve`` (dx*/dtheta = -J^-1 dF/dtheta with the
Jacobian J = dF/dx at x*), ``minimize`` (unconstrained) and ``minimize_scalar``
(an interior minimum), ``least_squares`` (unbounded, loss='linear'): the root
of the gradient, with the Hessian as J.
``scipy.integrate.quad``: SciPy's integral; its derivative is ``quad_vec`` of
the integrand's gradient plus Leibniz's rule for differentiated limits.
``odeint`` / ``solve_ivp``: SciPy's solution; its derivative by forward
sensitivities (S' = f_y S + f_theta, integrated by the same solver).

This needs values, so it runs eagerly: under compile=False directly, and in a
compiled transform by its eager fallback for that signature (the trace asks
for it with ``ValueDependentTraceError``, said once in the log; with
``fallback=False`` that is the error).  ``newton`` and ``fixed_point`` take a
scalar x0 only.
"""
from __future__ import annotations

import os
import sys
import types

import numpy as np

from tracegrad.ops.base import is_value
from tracegrad.ops.scipy_rows import first_order

_TRACEGRAD_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _values(args, depth=0):
    """The tracegrad values among args (and in the closures of functions among them)."""
    out = []
    for v in args:
        if is_value(v):
            out.append(v)
        elif depth < 2 and isinstance(v, (tuple, list)):
            out += _values(v, depth + 1)
        elif depth < 2 and isinstance(v, dict):
            out += _values(tuple(v.values()), depth + 1)
        elif depth < 2 and isinstance(v, types.FunctionType):
            cells = []
            for c in v.__closure__ or ():
                try:
                    cells.append(c.cell_contents)
                except ValueError:
                    pass
            out += _values(tuple(cells) + tuple(v.__defaults__ or ()), depth + 1)
    if depth == 0:      # a value reached two ways (args and a closure) is one value
        seen = set()
        out = [v for v in out if not (id(v) in seen or seen.add(id(v)))]
    return out


def _where():
    """file:line of the user's call (the first frame outside tracegrad and SciPy)."""
    f = sys._getframe(1)
    while f is not None:
        name = f.f_code.co_filename
        if not name.startswith(_TRACEGRAD_DIR) and f"{os.sep}scipy{os.sep}" not in name:
            return f"{name}:{f.f_lineno}"
        f = f.f_back
    return "?"


def _needs_values(qualname, values, how="the implicit function theorem's"):
    """Under tracing: ask the compiled transform to run the function eagerly."""
    if not any(hasattr(v, "_trace") for v in values):
        return
    trace_mod = sys.modules.get("tracegrad.frontend.trace")
    where = _where()
    reason = (f"{qualname} runs SciPy's solver on values (its derivative is {how}, "
              f"computed eagerly)")
    raise trace_mod.ValueDependentTraceError(
        f"{qualname} at {where} needs the values of its arguments: {reason}. Run the "
        f"function eagerly (compile=False), or let the compiled transform fall back to "
        f"eager mode for this signature (its default)", where=where, reason=reason)


def _float(v):
    from tracegrad.eager.grad_mode import no_grad
    if is_value(v):
        with no_grad():
            return float(np.asarray(v.detach()._data if hasattr(v, "detach") else v))
    return v


def _plain(fn):
    """fn with its result a Python float computed without recording (SciPy's view)."""
    from tracegrad.eager.grad_mode import no_grad
    if fn is None or not callable(fn):
        return fn

    def plain(x, *a):
        with no_grad():
            r = fn(x, *a)
            if is_value(r):
                r = r.detach().numpy() if hasattr(r, "numpy") else r
            return float(np.asarray(r)) if np.ndim(r) == 0 else np.asarray(r, float)
    return plain


def _corrected(qualname, g, root, args):
    """root with the implicit-function derivative of g(root, *args) = 0."""
    from tracegrad.eager import engine
    from tracegrad.eager.tensor import NumpyTensor
    from tracegrad.eager.grad_mode import enable_grad
    with enable_grad():
        x = NumpyTensor(np.asarray(float(root)), requires_grad=True)
        y = g(x, *args)
        if not is_value(y):
            raise TypeError(f"{qualname}: the function does not depend on the values being "
                            f"differentiated at the root")
        if tuple(getattr(y, "shape", ())) != ():
            raise NotImplementedError(f"{qualname}: the function must return a scalar for "
                                      f"tracegrad's implicit derivative")
        (fx,) = engine.grad([y], [x], retain_graph=True, allow_unused=True)
        fx = 0.0 if fx is None else float(np.asarray(fx.detach().numpy()))
        if fx == 0.0 or not np.isfinite(fx):
            raise ZeroDivisionError(
                f"{qualname}: the function's derivative in x is {fx} at the root {root!r}, so "
                f"the root is not a differentiable function of the parameters there")
        t = first_order(y * (-1.0 / fx), qualname)   # f_x is held constant: first order only
        return (t - t.detach()) + float(root)


def _bracketing(name):
    qualname = f"scipy.optimize.{name}"

    def solve(original, f, a, b, args=(), *rest, **kwargs):
        if not isinstance(args, tuple):
            args = (args,)
        values = _values((f, args))
        _needs_values(qualname, values + _values((a, b)))
        full = kwargs.get("full_output", rest[3] if len(rest) > 3 else False)
        res = original(_plain(f), _float(a), _float(b), tuple(args), *rest, **kwargs)
        root = res[0] if full else res
        if not values:
            return res
        out = _corrected(qualname, f, root, args)
        return (out,) + tuple(res[1:]) if full else out
    solve.__name__ = name
    return solve


def _newton(original, func, x0, fprime=None, args=(), *rest, **kwargs):
    qualname = "scipy.optimize.newton"
    if not isinstance(args, tuple):
        args = (args,)
    if np.ndim(x0) != 0:
        raise NotImplementedError(f"{qualname} with an array x0 on differentiated values is "
                                  f"not supported by tracegrad (scalar roots only)")
    values = _values((func, fprime, args, rest, kwargs))
    _needs_values(qualname, values + _values((x0,)))
    kw = dict(kwargs)
    if "fprime2" in kw:
        kw["fprime2"] = _plain(kw["fprime2"])
    rest = list(rest)
    if len(rest) > 3:                     # tol, maxiter, fprime2
        rest[2] = _plain(rest[2])
    full = kw.get("full_output", rest[4] if len(rest) > 4 else False)
    res = original(_plain(func), _float(x0), _plain(fprime), tuple(args), *rest, **kw)
    root = res[0] if full else res
    if not values:
        return res
    out = _corrected(qualname, func, root, args)
    return (out,) + tuple(res[1:]) if full else out


def _root_scalar(original, f, args=(), method=None, bracket=None, fprime=None, fprime2=None,
                 x0=None, x1=None, **kwargs):
    qualname = "scipy.optimize.root_scalar"
    if not isinstance(args, tuple):
        args = (args,)
    values = _values((f, args, fprime, fprime2))
    _needs_values(qualname, values + _values((bracket, x0, x1)))
    fp = fprime if isinstance(fprime, bool) else _plain(fprime)
    fp2 = fprime2 if isinstance(fprime2, bool) else _plain(fprime2)
    res = original(_plain(f), args=tuple(args), method=method,
                   bracket=None if bracket is None else [_float(v) for v in bracket],
                   fprime=fp, fprime2=fp2, x0=_float(x0), x1=_float(x1), **kwargs)
    if values:
        res.root = _corrected(qualname, f, res.root, args)
    return res


def _fixed_point(original, func, x0, args=(), *rest, **kwargs):
    qualname = "scipy.optimize.fixed_point"
    if not isinstance(args, tuple):
        args = (args,)
    if np.ndim(x0) != 0:
        raise NotImplementedError(f"{qualname} with an array x0 on differentiated values is "
                                  f"not supported by tracegrad (scalar fixed points only)")
    values = _values((func, args))
    _needs_values(qualname, values + _values((x0,)))
    root = original(_plain(func), _float(x0), tuple(args), *rest, **kwargs)
    if not values:
        return root
    return _corrected(qualname, lambda x, *a: func(x, *a) - x, np.asarray(root).item(), args)


ROOTS = {n: _bracketing(n) for n in ("brentq", "brenth", "bisect", "ridder", "toms748")}
ROOTS.update(newton=_newton, root_scalar=_root_scalar, fixed_point=_fixed_point)


def _quad(original, func, a, b, args=(), *rest, **kwargs):
    """scipy.integrate.quad: SciPy's integral; its derivative in the values
    the integrand uses is the integral of the integrand's gradient (by
    ``scipy.integrate.quad_vec`` of the eager engine's gradient at each x), and
    in traced limits Leibniz's rule (+f(b) db - f(a) da).  First order only."""
    qualname = "scipy.integrate.quad"
    if not isinstance(args, tuple):
        args = (args,)
    values = _values((func, args))
    _needs_values(qualname, values + _values((a, b)), "the integral of the integrand's gradient")
    af, bf = _float(a), _float(b)
    res = original(_plain(func), af, bf, tuple(args), *rest, **kwargs)
    thetas = [v for v in values if getattr(v, "requires_grad", False)]
    limits = [(v, sign, at) for v, sign, at in ((b, 1.0, bf), (a, -1.0, af))
              if is_value(v) and getattr(v, "requires_grad", False)]
    if not thetas and not limits:
        return res
    from tracegrad.eager import engine
    from tracegrad.eager.grad_mode import enable_grad
    import scipy.integrate
    terms = []
    if thetas:
        sizes = [int(np.prod(tuple(t.shape), dtype=int)) for t in thetas]

        def gradient(x):
            with enable_grad():
                y = func(x, *args)
                if not is_value(y):
                    return np.zeros(sum(sizes))
                gs = engine.grad([y], thetas, retain_graph=True, allow_unused=True)
            return np.concatenate([np.zeros(n) if g is None else
                                   np.ravel(np.asarray(g.detach().numpy(), float))
                                   for g, n in zip(gs, sizes)])
        c, _ = scipy.integrate.quad_vec(gradient, af, bf, epsabs=1e-11, epsrel=1e-11)
        at = 0
        for t, n in zip(thetas, sizes):
            piece = np.asarray(c[at:at + n]).reshape(tuple(t.shape))
            at += n
            terms.append((t * piece).sum())
    plain = _plain(func)
    for v, sign, at in limits:
        terms.append(v * (sign * plain(at, *args)))
    s = terms[0]
    for term in terms[1:]:
        s = s + term
    s = first_order(s, qualname)
    out = (s - s.detach()) + float(res[0])
    return (out,) + tuple(res[1:])


# --- ODEs: forward sensitivities --------------------------------------------------------------

def _sensitivities(qualname, rhs, y0, args, integrate):
    """dy(t)/d(theta, y0) of y' = rhs(y, t, *args) by forward sensitivities:
    S' = f_y S + f_theta, S(0) = [0 | I], integrated by ``integrate(aug, z0)``
    (SciPy's solver, on plain numbers; the Jacobians by the eager engine).
    Returns (S as (..., n, q), the differentiated values theta, y0 differentiated?)."""
    from tracegrad.eager import engine
    from tracegrad.eager.tensor import NumpyTensor
    from tracegrad.eager.grad_mode import enable_grad
    thetas = [v for v in _values((rhs, args)) if getattr(v, "requires_grad", False)]
    y0_diff = is_value(y0) and getattr(y0, "requires_grad", False)
    y0p = np.ravel(np.asarray(_float_array(y0), float))
    n = y0p.size
    sizes = [int(np.prod(tuple(t.shape), dtype=int)) for t in thetas]
    p = sum(sizes)
    q = p + (n if y0_diff else 0)

    def aug(z, t):
        y, S = z[:n], z[n:].reshape(n, q)
        with enable_grad():
            yt = NumpyTensor(y.copy(), requires_grad=True)
            f = rhs(yt, t, *args)
            f = f.reshape(-1) if is_value(f) else np.ravel(np.asarray(f, float))
            fy = np.zeros((n, n))
            ft = np.zeros((n, p))
            if is_value(f):
                for i in range(n):
                    gs = engine.grad([f[i]], [yt] + thetas, retain_graph=True,
                                     allow_unused=True)
                    if gs[0] is not None:
                        fy[i] = np.ravel(gs[0].detach().numpy())
                    at = 0
                    for g, m in zip(gs[1:], sizes):
                        if g is not None:
                            ft[i, at:at + m] = np.ravel(g.detach().numpy())
                        at += m
                fv = np.asarray(f.detach().numpy(), float)
            else:
                fv = f
        dS = fy @ S
        dS[:, :p] += ft
        return np.concatenate([fv, dS.ravel()])
    S0 = np.zeros((n, q))
    if y0_diff:
        S0[:, p:] = np.eye(n)
    Z = integrate(aug, np.concatenate([y0p, S0.ravel()]))
    return Z, n, q, thetas, y0_diff


def _with_sensitivities(qualname, Y, S, thetas, y0, y0_diff):
    """Y (SciPy's values, (..., n)) with the derivative S (..., n, q) in
    (theta..., y0): Y + (s - stop_gradient(s)), s = S @ [theta; y0]."""
    from tracegrad.ops._define import _ops
    parts = [t.reshape(-1) for t in thetas] + ([y0.reshape(-1)] if y0_diff else [])
    v = _ops.concatenate(parts, axis=0) if len(parts) > 1 else parts[0]
    s = first_order((v * S).sum(axis=-1), qualname)
    return (s - s.detach()) + Y


def _odeint(original, func, y0, t, args=(), *rest, **kwargs):
    qualname = "scipy.integrate.odeint"
    if not isinstance(args, tuple):
        args = (args,)
    if kwargs.get("tfirst"):
        rhs = lambda y, tt, *a: func(tt, y, *a)      # noqa: E731
    else:
        rhs = func
    values = _values((func, args))
    _needs_values(qualname, values + _values((y0, t)), "by forward sensitivities")
    if is_value(t) and getattr(t, "requires_grad", False):
        raise NotImplementedError(f"{qualname}: a derivative in the time points is not "
                                  f"supported by tracegrad")
    if rest or any(k in kwargs for k in ("Dfun", "full_output")):
        if rest or kwargs.get("Dfun") is not None or kwargs.get("full_output"):
            raise NotImplementedError(f"{qualname}: Dfun, full_output and positional options "
                                      f"are not supported on differentiated values")
    ts = np.asarray(_float_array(t), float)
    y0p = np.asarray(_float_array(y0), float)
    plain = _plain_vec(func)
    Y = original(plain, y0p, ts, tuple(args), **kwargs)
    if not (any(getattr(v, "requires_grad", False) for v in values)
            or (is_value(y0) and getattr(y0, "requires_grad", False))):
        return Y
    kw = {k: v for k, v in kwargs.items() if k != "tfirst"}
    Z, n, q, thetas, y0_diff = _sensitivities(
        qualname, rhs, y0, args, lambda aug, z0: original(aug, z0, ts, **kw))
    S = Z[:, n:].reshape(len(ts), n, q)
    return _with_sensitivities(qualname, Y, S, thetas, y0, y0_diff)


def _solve_ivp(original, fun, t_span, y0, method="RK45", t_eval=None, dense_output=False,
               events=None, vectorized=False, args=None, **options):
    qualname = "scipy.integrate.solve_ivp"
    args = () if args is None else (args if isinstance(args, tuple) else (args,))
    values = _values((fun, args))
    _needs_values(qualname, values + _values((y0, t_span, t_eval)), "by forward sensitivities")
    if dense_output or events is not None or vectorized:
        if values:
            raise NotImplementedError(f"{qualname}: dense_output, events and vectorized are "
                                      f"not supported on differentiated values")
    span = [_float(v) for v in t_span]
    te = None if t_eval is None else np.asarray(_float_array(t_eval), float)
    y0p = np.asarray(_float_array(y0), float)
    plain = _plain_vec(fun)
    res = original(plain, span, y0p, method, te, dense_output, events, vectorized,
                   tuple(args) or None, **options)
    if not (any(getattr(v, "requires_grad", False) for v in values)
            or (is_value(y0) and getattr(y0, "requires_grad", False))):
        return res
    # the sensitivities at the solver's own output times, by the same method
    times = res.t
    Z, n, q, thetas, y0_diff = _sensitivities(
        qualname, lambda y, tt, *a: fun(tt, y, *a), y0, args,
        lambda aug, z0: original(lambda tt, z: aug(z, tt), span, z0, method, times,
                                 **options).y.T)
    S = Z[:, n:].reshape(len(times), n, q)
    res.y = _with_sensitivities(qualname, res.y.T, S, thetas, y0, y0_diff).T
    return res


INTEGRALS = {"quad": _quad, "odeint": _odeint, "solve_ivp": _solve_ivp}


# --- vector roots and minimizers ------------------------------------------------------------

def _plain_vec(fn):
    """fn with plain array results, computed without recording (SciPy's view)."""
    from tracegrad.eager.grad_mode import no_grad
    if fn is None or isinstance(fn, bool) or not callable(fn):
        return fn

    def plain(x, *a):
        with no_grad():
            r = fn(x, *a)
        if isinstance(r, tuple):
            return tuple(_as_plain(v) for v in r)
        return _as_plain(r)
    return plain


def _as_plain(r):
    if is_value(r):
        r = r.detach().numpy() if hasattr(r, "numpy") else r
    return np.asarray(r, float) if np.ndim(r) else float(np.asarray(r))


def _rows_of(qualname, y, x):
    """The Jacobian dy/dx (y and x flat of sizes m and n) by the eager engine, as an array."""
    from tracegrad.eager import engine
    yf = y.reshape(-1) if tuple(getattr(y, "shape", ())) else y.reshape(1)
    m = int(np.prod(tuple(yf.shape), dtype=int))
    n = int(np.prod(tuple(x.shape), dtype=int))
    J = np.zeros((m, n))
    for i in range(m):
        (gi,) = engine.grad([yf[i]], [x], retain_graph=True, allow_unused=True)
        if gi is not None:
            J[i] = np.ravel(np.asarray(gi.detach().numpy(), float))
    return yf, J


def _implicit(qualname, residual, xstar, args, shape):
    """xstar with the derivative of the solution of residual(x, *args) = 0
    (residual(x) of x's size): dx*/dtheta = -J^-1 dF/dtheta, J = dF/dx at x*."""
    from tracegrad.eager.tensor import NumpyTensor
    from tracegrad.eager.grad_mode import enable_grad
    xs = np.asarray(xstar, float).reshape(shape)
    with enable_grad():
        x = NumpyTensor(xs.copy(), requires_grad=True)
        F = residual(x, *args)
        if not is_value(F):
            raise TypeError(f"{qualname}: the function does not depend on the values being "
                            f"differentiated at the solution")
        Ff, J = _rows_of(qualname, F, x)
        if J.shape[0] != J.shape[1]:
            raise NotImplementedError(f"{qualname}: {J.shape[0]} equations in {J.shape[1]} "
                                      f"unknowns; tracegrad's implicit derivative needs a "
                                      f"square system")
        if not np.all(np.isfinite(J)) or np.linalg.matrix_rank(J) < J.shape[0]:
            raise ZeroDivisionError(
                f"{qualname}: the Jacobian (or Hessian) in x is singular at the solution, so "
                f"the solution is not a differentiable function of the parameters there")
        t = first_order(Ff @ (-np.linalg.inv(J).T), qualname)
        t = t.reshape(shape) if shape else t.reshape(())
        return (t - t.detach()) + (xs if shape else float(xs))


def _fsolve(original, func, x0, args=(), fprime=None, *rest, **kwargs):
    qualname = "scipy.optimize.fsolve"
    if not isinstance(args, tuple):
        args = (args,)
    values = _values((func, args, fprime))
    _needs_values(qualname, values + _values((x0,)))
    full = kwargs.get("full_output", rest[0] if rest else 0)
    res = original(_plain_vec(func), np.asarray(_float_array(x0)), tuple(args),
                   _plain_vec(fprime), *rest, **kwargs)
    xstar = res[0] if full else res
    if not values:
        return res
    out = _implicit(qualname, func, xstar, args, np.shape(xstar))
    return (out,) + tuple(res[1:]) if full else out


def _root(original, fun, x0, args=(), method="hybr", jac=None, *rest, **kwargs):
    qualname = "scipy.optimize.root"
    if not isinstance(args, tuple):
        args = (args,)
    values = _values((fun, args, jac))
    _needs_values(qualname, values + _values((x0,)))
    if jac is True:
        raise NotImplementedError(f"{qualname}(jac=True) on differentiated values is not "
                                  f"supported by tracegrad; pass jac as a function or None")
    res = original(_plain_vec(fun), np.asarray(_float_array(x0)), tuple(args), method,
                   _plain_vec(jac), *rest, **kwargs)
    if values:
        res.x = _implicit(qualname, fun, res.x, args, np.shape(res.x))
    return res


def _stationary(f):
    """x -> the gradient of f in x, recorded (create_graph) so that it keeps its
    dependence on the values being differentiated."""
    from tracegrad.eager import engine

    def grad_of(x, *args):
        fv = f(x, *args)
        if isinstance(fv, tuple):                       # jac=True style: (value, gradient)
            fv = fv[0]
        (g,) = engine.grad([fv], [x], create_graph=True, allow_unused=True)
        return g
    return grad_of


def _minimize(original, fun, x0, args=(), method=None, jac=None, hess=None, hessp=None,
              bounds=None, constraints=(), *rest, **kwargs):
    qualname = "scipy.optimize.minimize"
    if not isinstance(args, tuple):
        args = (args,)
    values = _values((fun, args, jac, hess, hessp))
    _needs_values(qualname, values + _values((x0,)))
    if values and (bounds is not None or constraints not in ((), [], None)):
        raise NotImplementedError(
            f"{qualname} with bounds or constraints on differentiated values is not "
            f"supported by tracegrad (its implicit derivative assumes an unconstrained "
            f"minimum: the gradient is zero there)")
    if jac is True:
        raise NotImplementedError(f"{qualname}(jac=True) on differentiated values is not "
                                  f"supported by tracegrad; pass jac as a function or None")
    res = original(_plain_vec(fun), np.asarray(_float_array(x0)), tuple(args), method,
                   _plain_vec(jac), _plain_vec(hess), _plain_vec(hessp), bounds, constraints,
                   *rest, **kwargs)
    if values:
        shape = np.shape(res.x)
        res.x = _implicit(qualname, _stationary(fun), res.x, args, shape)
        fv = fun(res.x, *args)                  # the envelope: d fun(x*) = fun_theta
        res.fun = (fv - fv.detach()) + float(np.asarray(res.fun)) if is_value(fv) else res.fun
    return res


def _minimize_scalar(original, fun, bracket=None, bounds=None, args=(), method=None, *rest,
                     **kwargs):
    qualname = "scipy.optimize.minimize_scalar"
    if not isinstance(args, tuple):
        args = (args,)
    values = _values((fun, args))
    _needs_values(qualname, values + _values((bracket, bounds)))
    res = original(_plain(fun), None if bracket is None else [_float(v) for v in bracket],
                   None if bounds is None else [_float(v) for v in bounds], tuple(args),
                   method, *rest, **kwargs)
    if values:
        if bounds is not None and min(abs(res.x - _float(bounds[0])),
                                      abs(res.x - _float(bounds[1]))) <= 1e-6 * (
                                          1.0 + abs(res.x)):
            raise NotImplementedError(
                f"{qualname}: the minimum is at a bound, where it is not a differentiable "
                f"function of the parameters through the gradient (tracegrad's implicit "
                f"derivative needs an interior minimum)")
        res.x = _implicit(qualname, _stationary(fun), res.x, args, ())
        fv = fun(res.x, *args)
        res.fun = (fv - fv.detach()) + float(np.asarray(res.fun)) if is_value(fv) else res.fun
    return res


def _least_squares(original, fun, x0, *rest, **kwargs):
    qualname = "scipy.optimize.least_squares"
    names = ("jac", "bounds", "method", "ftol", "xtol", "gtol", "x_scale", "loss")
    kw = dict(zip(names, rest))
    kw.update(kwargs)
    args = kw.get("args", ())
    args = args if isinstance(args, tuple) else (args,)
    fkw = kw.get("kwargs") or {}
    values = _values((fun, args, fkw, kw.get("jac") if callable(kw.get("jac")) else None))
    _needs_values(qualname, values + _values((x0,)))
    if values:
        bounds = kw.get("bounds", (-np.inf, np.inf))
        if not (np.all(np.isneginf(np.asarray(bounds[0], float)))
                and np.all(np.isposinf(np.asarray(bounds[1], float)))):
            raise NotImplementedError(
                f"{qualname} with bounds on differentiated values is not supported by "
                f"tracegrad (its implicit derivative assumes an unconstrained minimum)")
        if kw.get("loss", "linear") != "linear":
            raise NotImplementedError(f"{qualname}(loss={kw['loss']!r}) on differentiated "
                                      f"values is not supported by tracegrad (loss='linear')")
    if callable(kw.get("jac")):
        kw["jac"] = _plain_vec(kw["jac"])

    def plain(x, *a, **k):
        return _plain_vec(lambda x_, *a_: fun(x_, *a_, **k))(x, *a)
    kw["args"] = tuple(args)
    res = original(plain, np.asarray(_float_array(x0)), **kw)
    if values:
        def cost(x, *a):
            r = fun(x, *a, **fkw)
            return 0.5 * (r * r).sum()
        res.x = _implicit(qualname, _stationary(cost), res.x, args, np.shape(res.x))
        r = fun(res.x, *args, **fkw)
        if is_value(r):
            c = 0.5 * (r * r).sum()
            res.cost = (c - c.detach()) + float(res.cost)
            res.fun = (r - r.detach()) + np.asarray(res.fun)
    return res


def _float_array(x0):
    if is_value(x0):
        return np.asarray(_float(x0) if not tuple(x0.shape) else x0.detach().numpy(), float)
    return x0


ROOTS.update(fsolve=_fsolve, root=_root, minimize=_minimize, minimize_scalar=_minimize_scalar,
             least_squares=_least_squares)
