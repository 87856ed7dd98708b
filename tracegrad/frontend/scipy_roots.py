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

That is the eager path (compile=False, eager Tensors).  Under tracing (a
compiled transform) each call becomes one graph node instead (the section
"under tracing" at the end, rows in ``tracegrad/ops/scipy_solvers.py``): the
callables are traced into bodies, SciPy runs on the compiled bodies, and the
derivatives are the same formulas written over the bodies' derived bodies,
so they are graph nodes of any order.  A call that cannot become a node
(``full_output=True``, callbacks, ...) asks the compiled transform to run the
function eagerly for that signature (``ValueDependentTraceError``, said once
in the log; with ``fallback=False`` that is the error).  On the eager path
``newton`` and ``fixed_point`` take a scalar x0 only.
"""
from __future__ import annotations

import os
import sys
import types

import numpy as np

from tracegrad.ops import scipy_solvers  # noqa: F401  (the rows of the graph path, registered)
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
    """Under tracing: ask the compiled transform to run the function eagerly
    (``tracegrad.autograd_compat.scipy.integrate.odeint``, whose derivative in
    the time points is computed on values)."""
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
        if _tracing(f, args, a, b):
            return _graph_bracketing(name, f, a, b, args, rest, kwargs)
        values = _values((f, args))
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
    if _tracing(func, fprime, args, rest, kwargs, x0):
        return _graph_newton(func, x0, fprime, args, rest, kwargs)
    values = _values((func, fprime, args, rest, kwargs))
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
    if _tracing(f, args, fprime, fprime2, bracket, x0, x1):
        return _graph_root_scalar(f, args, method, bracket, fprime, fprime2, x0, x1, kwargs)
    values = _values((f, args, fprime, fprime2))
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
    if _tracing(func, args, x0):
        return _graph_fixed_point(func, x0, args, rest, kwargs)
    values = _values((func, args))
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
    if _tracing(func, args, a, b):
        return _graph_quad(func, a, b, args, rest, kwargs)
    values = _values((func, args))
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

def _sensitivities(qualname, rhs, y0, args, integrate, with_y0=False):
    """dy(t)/d(theta, y0) of y' = rhs(y, t, *args) by forward sensitivities:
    S' = f_y S + f_theta, S(0) = [0 | I], integrated by ``integrate(aug, z0)``
    (SciPy's solver, on plain numbers; the Jacobians by the eager engine).
    Returns (S as (..., n, q), the differentiated values theta, y0 differentiated?)."""
    from tracegrad.eager import engine
    from tracegrad.eager.tensor import NumpyTensor
    from tracegrad.eager.grad_mode import enable_grad
    thetas = [v for v in _values((rhs, args)) if getattr(v, "requires_grad", False)]
    # with_y0: dy/dy0 too (a derivative in the initial time needs it)
    y0_diff = with_y0 or (is_value(y0) and getattr(y0, "requires_grad", False))
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


def _with_sensitivities(qualname, Y, S, thetas, y0, y0_diff, extra=None):
    """Y (SciPy's values, (..., n)) with the derivative S (..., n, q) in
    (theta..., y0), plus ``extra`` (the time points' terms):
    Y + (s - stop_gradient(s)), s = S @ [theta; y0] + extra."""
    from tracegrad.ops._define import _ops
    y0v = y0 if is_value(y0) else np.asarray(_float_array(y0), float)
    parts = [t.reshape(-1) for t in thetas] + ([y0v.reshape(-1)] if y0_diff else [])
    s = None
    if parts:
        v = _ops.concatenate(parts, axis=0) if len(parts) > 1 else parts[0]
        s = (v * S).sum(axis=-1)
    if extra is not None:
        s = extra if s is None else s + extra
    s = first_order(s, qualname)
    return (s - s.detach()) + Y


def _time_terms(f, Y, times, S, t0, y0, skip_first=False):
    """The time points' part of the derivative of Y[i] = y(times[i]) of an
    ODE y' = f(y, t) from (t0, y0): dY[i] = f(Y[i], t_i) dt_i - S_y0[i]
    f(y0, t0) dt0 (S_y0: dy(t_i)/dy0, the last n columns of S).  ``times``
    and ``t0`` are values or numbers; ``skip_first``: Y[0] is y0 itself
    (odeint), independent of every time point.  A value of shape Y's, or
    None when no time point is differentiated."""
    tv = times if is_value(times) and getattr(times, "requires_grad", False) else None
    t0v = t0 if is_value(t0) and getattr(t0, "requires_grad", False) else None
    if tv is None and t0v is None:
        return None
    n = Y.shape[-1]
    ts = np.ravel(np.asarray(_float_array(times), float))
    F = np.stack([np.ravel(np.asarray(_as_plain(f(Y[i], ts[i])), float)) for i in range(len(ts))])
    G = -(S[..., -n:] @ np.ravel(np.asarray(_as_plain(f(np.asarray(_float_array(y0), float)
                                                          .ravel(), _float(t0))), float)))
    if skip_first:
        F[0] = 0.0
        G[0] = 0.0
    out = None
    if tv is not None:
        out = tv.reshape(-1, 1) * F
    if t0v is not None:
        term = t0v * G
        out = term if out is None else out + term
    return out


def _odeint(original, func, y0, t, args=(), *rest, **kwargs):
    qualname = "scipy.integrate.odeint"
    if not isinstance(args, tuple):
        args = (args,)
    if kwargs.get("tfirst"):
        rhs = lambda y, tt, *a: func(tt, y, *a)      # noqa: E731
    else:
        rhs = func
    if _tracing(func, args, y0, t):
        return _graph_odeint(func, y0, t, args, rest, kwargs)
    values = _values((func, args))
    t_diff = is_value(t) and getattr(t, "requires_grad", False)
    if rest or any(k in kwargs for k in ("Dfun", "full_output")):
        if rest or kwargs.get("Dfun") is not None or kwargs.get("full_output"):
            raise NotImplementedError(f"{qualname}: Dfun, full_output and positional options "
                                      f"are not supported on differentiated values")
    ts = np.asarray(_float_array(t), float)
    y0p = np.asarray(_float_array(y0), float)
    plain = _plain_vec(func)
    Y = original(plain, y0p, ts, tuple(args), **kwargs)
    if not (t_diff or any(getattr(v, "requires_grad", False) for v in values)
            or (is_value(y0) and getattr(y0, "requires_grad", False))):
        return Y
    kw = {k: v for k, v in kwargs.items() if k != "tfirst"}
    Z, n, q, thetas, y0_diff = _sensitivities(
        qualname, rhs, y0, args, lambda aug, z0: original(aug, z0, ts, **kw), with_y0=t_diff)
    S = Z[:, n:].reshape(len(ts), n, q)
    plain_rhs = _plain_vec(rhs)
    extra = _time_terms(lambda y, tt: plain_rhs(y, tt, *args), Y, t, S,
                        t[0] if t_diff else ts[0], y0, skip_first=True)
    return _with_sensitivities(qualname, Y, S, thetas, y0, y0_diff, extra)


def _solve_ivp(original, fun, t_span, y0, method="RK45", t_eval=None, dense_output=False,
               events=None, vectorized=False, args=None, **options):
    qualname = "scipy.integrate.solve_ivp"
    args = () if args is None else (args if isinstance(args, tuple) else (args,))
    if _tracing(fun, args, y0, t_span, t_eval):
        return _graph_solve_ivp(fun, t_span, y0, method, t_eval, dense_output, events,
                                vectorized, args, options)
    values = _values((fun, args))
    t_diff = any(getattr(v, "requires_grad", False) for v in _values((t_span, t_eval)))
    if t_diff and t_eval is None:
        raise NotImplementedError(f"{qualname}: a derivative in t_span at the solver's own "
                                  f"output times (no t_eval) is not defined; pass t_eval "
                                  f"(the times you read the solution at)")
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
    if not (t_diff or any(getattr(v, "requires_grad", False) for v in values)
            or (is_value(y0) and getattr(y0, "requires_grad", False))):
        return res
    # the sensitivities at the solver's own output times, by the same method
    times = res.t
    Z, n, q, thetas, y0_diff = _sensitivities(
        qualname, lambda y, tt, *a: fun(tt, y, *a), y0, args,
        lambda aug, z0: original(lambda tt, z: aug(z, tt), span, z0, method, times,
                                 **options).y.T, with_y0=t_diff)
    S = Z[:, n:].reshape(len(times), n, q)
    plain_fun = _plain_vec(lambda y, tt, *a: fun(tt, y, *a))
    extra = None
    if t_diff:   # the outputs are at t_eval: t_span[1] only bounds them
        extra = _time_terms(lambda y, tt: plain_fun(y, tt, *args), res.y.T, t_eval, S,
                            t_span[0], y0)
    res.y = _with_sensitivities(qualname, res.y.T, S, thetas, y0, y0_diff, extra).T
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
    if _tracing(func, args, fprime, x0):
        return _graph_fsolve(func, x0, args, fprime, rest, kwargs)
    values = _values((func, args, fprime))
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
    if _tracing(fun, args, jac, x0):
        return _graph_root(fun, x0, args, method, jac, rest, kwargs)
    values = _values((fun, args, jac))
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
    if _tracing(fun, args, jac, hess, hessp, x0):
        return _graph_minimize(fun, x0, args, method, jac, hess, hessp, bounds, constraints,
                               rest, kwargs)
    values = _values((fun, args, jac, hess, hessp))
    if values and constraints not in ((), [], None):
        raise NotImplementedError(
            f"{qualname} with constraints on differentiated values is not supported by "
            f"tracegrad (the derivative through the KKT system of general constraints is not "
            f"implemented; bounds are)")
    if values and bounds is not None and _values((bounds,)):
        raise NotImplementedError(f"{qualname}: bounds that depend on differentiated values "
                                  f"are not supported by tracegrad (constant bounds are)")
    if jac is True:
        raise NotImplementedError(f"{qualname}(jac=True) on differentiated values is not "
                                  f"supported by tracegrad; pass jac as a function or None")
    res = original(_plain_vec(fun), np.asarray(_float_array(x0)), tuple(args), method,
                   _plain_vec(jac), _plain_vec(hess), _plain_vec(hessp), bounds, constraints,
                   *rest, **kwargs)
    if values:
        shape = np.shape(res.x)
        residual = _stationary(fun)
        if bounds is not None:      # x on an active bound stays there: x_A - bound_A = 0
            lb, ub = _bound_arrays(qualname, bounds, res.x.size)
            xs = np.asarray(res.x, float)
            tol = 1e-8 * (1.0 + np.abs(xs))
            at_lb, active = xs <= lb + tol, (xs <= lb + tol) | (xs >= ub - tol)
            held = np.where(at_lb, lb, ub)
            gradient = residual

            def residual(x, *a):
                from tracegrad.ops.base import where
                return where(active, x - np.where(active, held, 0.0), gradient(x, *a))
        res.x = _implicit(qualname, residual, res.x, args, shape)
        fv = fun(res.x, *args)                  # the envelope: d fun(x*) = fun_theta
        res.fun = (fv - fv.detach()) + float(np.asarray(res.fun)) if is_value(fv) else res.fun
    return res


def _bound_arrays(qualname, bounds, n):
    """(lb, ub) as float arrays of n elements (None: infinite) from a Bounds
    object or a sequence of (min, max) pairs."""
    if hasattr(bounds, "lb") and hasattr(bounds, "ub"):
        lb = np.broadcast_to(np.asarray(bounds.lb, float), (n,)).copy()
        ub = np.broadcast_to(np.asarray(bounds.ub, float), (n,)).copy()
        return lb, ub
    pairs = list(bounds)
    if len(pairs) != n:
        raise ValueError(f"{qualname}: {len(pairs)} bounds for {n} variables")
    lb = np.array([-np.inf if p[0] is None else float(p[0]) for p in pairs])
    ub = np.array([np.inf if p[1] is None else float(p[1]) for p in pairs])
    return lb, ub


def _minimize_scalar(original, fun, bracket=None, bounds=None, args=(), method=None, *rest,
                     **kwargs):
    qualname = "scipy.optimize.minimize_scalar"
    if not isinstance(args, tuple):
        args = (args,)
    if _tracing(fun, args, bracket, bounds):
        return _graph_minimize_scalar(fun, bracket, bounds, args, method, rest, kwargs)
    values = _values((fun, args))
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
    if _tracing(fun, args, fkw, kw.get("jac") if callable(kw.get("jac")) else None, x0):
        return _graph_least_squares(fun, x0, kw)
    values = _values((fun, args, fkw, kw.get("jac") if callable(kw.get("jac")) else None))
    if values:
        if _values((kw.get("bounds"),)):
            raise NotImplementedError(f"{qualname}: bounds that depend on differentiated "
                                      f"values are not supported by tracegrad (constant bounds "
                                      f"are)")
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
        residual = _stationary(cost)
        active = np.asarray(getattr(res, "active_mask", 0)) != 0
        if kw.get("bounds") is not None:
            bd = kw["bounds"]
            lb, ub = ((bd.lb, bd.ub) if hasattr(bd, "lb") else bd)
            xs = np.asarray(res.x, float)
            tol = 1e-8 * (1.0 + np.abs(xs))
            active = active | (xs <= np.asarray(lb, float) + tol) | (
                xs >= np.asarray(ub, float) - tol)
        if np.any(active):      # x held on an active bound (SciPy's active_mask)
            held, gradient = np.asarray(res.x, float), residual

            def residual(x, *a):
                from tracegrad.ops.base import where
                return where(active, x - np.where(active, held, 0.0), gradient(x, *a))
        res.x = _implicit(qualname, residual, res.x, args, np.shape(res.x))
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


# --- under tracing: the callables traced, one graph node per call ---------------------------
# (tracegrad/ops/scipy_solvers.py: SciPy runs on the compiled callables; the derivatives are
# the implicit function theorem's, the integral of the integrand's derivative, or forward
# sensitivities, all written over the traced bodies, so they are graph nodes too)

def _tracing(*things):
    return any(hasattr(v, "_trace") for v in _values(things))


def _decline(qualname, why):
    """This call cannot become a graph node: the compiled transform runs the
    function eagerly for this signature (said once in the log)."""
    trace_mod = sys.modules.get("tracegrad.frontend.trace")
    where = _where()
    reason = f"{qualname}: {why}, so it runs eagerly"
    raise trace_mod.ValueDependentTraceError(
        f"{qualname} at {where} cannot be compiled: {why}. Run the function eagerly "
        f"(compile=False), or let the compiled transform fall back to eager mode for this "
        f"signature (its default)", where=where, reason=reason)


def _opts(qualname, pairs):
    """The options as a spec tuple (literals only), or decline."""
    from tracegrad.ops.scipy_solvers import literal_ok
    out = []
    for k, v in sorted(pairs.items()):
        if isinstance(v, dict):
            v = tuple(sorted(v.items()))
        elif isinstance(v, list):
            v = tuple(v)
        elif isinstance(v, np.ndarray) and v.ndim == 0:
            v = v.item()
        if is_value(v) or not literal_ok(v):
            _decline(qualname, f"its option {k}={type(v).__name__} is not a constant number, "
                               f"string or tuple")
        out.append((k, v))
    return tuple(out)


def _as_array_out(v):
    from tracegrad.ops._define import _ops
    if isinstance(v, (list, tuple)) and any(is_value(e) for e in v):
        return _ops.stack([e if is_value(e) else np.float64(e) for e in v])
    return v


def _key_of(c):
    return (id(getattr(c, "_trace", None)), getattr(c, "id", id(c)))


def _bodies(qualname, fns, avals):
    """Trace each of ``fns`` (callables of the declared inputs -> one value)
    into a Body with the same inputs (declared, then every traced value any
    of them reads): (bodies, consts)."""
    from tracegrad.ops.control import _Eager, _trace
    from tracegrad.ops.primitives import Aval
    traced = []
    for fn in fns:
        try:
            b, cap, _ = _trace(lambda *x, fn=fn: (_as_array_out(fn(*x)),), avals)
        except _Eager:
            _decline(qualname, "its callable reads a Tensor that requires grad from its closure")
        traced.append((b, cap))
    consts, seen = [], {}
    for _, cap in traced:
        for c in cap:
            k = _key_of(c)
            if k not in seen:
                seen[k] = len(consts)
                consts.append(c)
    if all(len(cap) == len(consts) and [seen[_key_of(c)] for c in cap] == list(range(len(cap)))
           for _, cap in traced):
        return [b for b, _ in traced], consts
    from tracegrad.ops.control import eval_body
    c_av = [Aval(tuple(c.shape), np.dtype(c.dtype)) for c in consts]
    nd = len(avals)
    out = []
    for b, cap in traced:
        pos = [seen[_key_of(c)] for c in cap]

        def wrapped(*a, b=b, pos=pos):
            a = list(a)
            return tuple(eval_body(b, a[:nd] + [a[nd + p] for p in pos]))
        out.append(_trace(wrapped, list(avals) + c_av)[0])
    return out, consts


def _derived(body, make):
    """A body of the same inputs as ``body``: make(eval) -> outputs."""
    from tracegrad.ops.control import _trace, eval_body
    return _trace(lambda *a: make(lambda b, xs: eval_body(b, list(xs)), a), list(body.in_avals))[0]


def _check_out(qualname, body, shape, what):
    got = tuple(body.out_avals[0].shape)
    if got != tuple(shape):
        raise ValueError(f"{qualname}: {what} returned shape {got}, expected {tuple(shape)}")


def _f64(x):
    from tracegrad.ops._define import _ops
    return _ops.astype(x, np.float64) if is_value(x) and np.dtype(x.dtype) != np.float64 else x


def _named(names, values, *pairs):
    """The leading operands: (names, values) of the given ones."""
    for n, v in pairs:
        if v is not None:
            names.append(n)
            values.append(_f64(v) if is_value(v) else np.float64(_float(v)))



def _graph_root_scalar_like(qualname, name, lead, callables, roles, opts):
    """One scalar root: bodies[0] is the residual."""
    from tracegrad.ops.primitives import Aval
    from tracegrad.ops.scipy_solvers import solve_call
    xav = Aval((), np.dtype(np.float64))
    bodies, consts = _bodies(qualname, callables, [xav])
    for b in bodies:
        _check_out(qualname, b, (), "the function")
    names, values = [], []
    _named(names, values, *lead)
    return solve_call(name, names, values, consts, bodies, opts, roles, ())


def _rest_kwargs(rest, names, kwargs):
    kw = dict(zip(names, rest))
    kw.update(kwargs)
    return kw


def _graph_bracketing(name, f, a, b, args, rest, kwargs):
    qualname = f"scipy.optimize.{name}"
    kw = _rest_kwargs(rest, ("xtol", "rtol", "maxiter", "full_output", "disp"), kwargs)
    if kw.pop("full_output", False):
        _decline(qualname, "full_output=True returns SciPy's RootResults")
    if not kw.pop("disp", True):
        _decline(qualname, "disp=False returns an unconverged root without an error")
    opts = _opts(qualname, kw)
    x, *_ = _graph_root_scalar_like(qualname, name, (("a", a), ("b", b)),
                                    [lambda x: f(x, *args)], (("f", 0),), opts)
    return x


def _graph_newton(func, x0, fprime, args, rest, kwargs):
    qualname = "scipy.optimize.newton"
    kw = _rest_kwargs(rest, ("tol", "maxiter", "fprime2", "x1", "rtol", "full_output", "disp"),
                      kwargs)
    fprime2 = kw.pop("fprime2", None)
    x1 = kw.pop("x1", None)
    if kw.pop("full_output", False) or not kw.pop("disp", True):
        _decline(qualname, "full_output / disp=False return SciPy's RootResults")
    if np.ndim(x0) != 0:
        _decline(qualname, "an array x0 (vectorised newton)")
    opts = _opts(qualname, kw)
    fns, roles = [lambda x: func(x, *args)], [("f", 0)]
    for role, fn in (("fprime", fprime), ("fprime2", fprime2)):
        if fn is not None:
            if not callable(fn):
                _decline(qualname, f"{role} is not a function")
            roles.append((role, len(fns)))
            fns.append(lambda x, fn=fn: fn(x, *args))
    x, *_ = _graph_root_scalar_like(qualname, "newton", (("x0", x0), ("x1", x1)), fns,
                                    tuple(roles), opts)
    return x


class _RootResults:
    """scipy.optimize.root_scalar's result under tracing (traced root, converged,
    iterations, function_calls)."""

    def __init__(self, root, converged, iterations, function_calls, method):
        self.root, self.converged = root, converged
        self.iterations, self.function_calls, self.method = iterations, function_calls, method
        self.flag = "converged" if converged is True else None

    def __repr__(self):
        return (f"RootResults(root={self.root!r}, converged={self.converged!r}, "
                f"method={self.method!r}) (traced)")


def _graph_root_scalar(f, args, method, bracket, fprime, fprime2, x0, x1, kwargs):
    qualname = "scipy.optimize.root_scalar"
    if isinstance(fprime, bool) or isinstance(fprime2, bool):
        _decline(qualname, "fprime=True / fprime2=True (f returning derivatives)")
    opts = _opts(qualname, dict(kwargs, method=method))
    fns, roles = [lambda x: f(x, *args)], [("f", 0)]
    for role, fn in (("fprime", fprime), ("fprime2", fprime2)):
        if fn is not None:
            roles.append((role, len(fns)))
            fns.append(lambda x, fn=fn: fn(x, *args))
    br = list(bracket) if bracket is not None else [None, None]
    x, ok, nit, nfev = _graph_root_scalar_like(
        qualname, "root_scalar", (("bracket0", br[0]), ("bracket1", br[1]), ("x0", x0),
                                  ("x1", x1)), fns, tuple(roles), opts)
    return _RootResults(x, ok, nit, nfev, method)


def _graph_fixed_point(func, x0, args, rest, kwargs):
    qualname = "scipy.optimize.fixed_point"
    from tracegrad.ops.primitives import Aval
    from tracegrad.ops.scipy_solvers import solve_call
    kw = _rest_kwargs(rest, ("xtol", "maxiter", "method"), kwargs)
    opts = _opts(qualname, kw)
    shape = tuple(np.shape(x0)) if not is_value(x0) else tuple(x0.shape)
    xav = Aval(shape, np.dtype(np.float64))
    (g,), consts = _bodies(qualname, [lambda x: func(x, *args)], [xav])
    _check_out(qualname, g, shape, "the function")
    R = _derived(g, lambda ev, a: (ev(g, a)[0] - a[0],))
    x0v = _f64(x0) if is_value(x0) else np.asarray(x0, np.float64)
    x, *_ = solve_call("fixed_point", ["x0"], [x0v], consts, [R, g], opts, (("g", 1),), shape)
    return x


def _x0_flat(x0):
    if is_value(x0):
        return _f64(x0).reshape(-1)
    return np.asarray(x0, np.float64).reshape(-1)


def _graph_vector_root(qualname, name, fun, x0, args, jac_name, jac, opts):
    from tracegrad.ops.primitives import Aval
    from tracegrad.ops.scipy_solvers import solve_call
    x0f = _x0_flat(x0)
    n = int(x0f.shape[0])
    xav = Aval((n,), np.dtype(np.float64))
    fn_role = "fun" if name == "root" else "func"
    fns, roles = [lambda x: fun(x, *args)], [(fn_role, 0)]
    if jac is not None:
        if not callable(jac):
            _decline(qualname, f"{jac_name}={jac!r}")
        fns.append(lambda x: jac(x, *args))
        roles.append((jac_name, 1))
    bodies, consts = _bodies(qualname, fns, [xav])
    _check_out(qualname, bodies[0], (n,), "the function (a square system)")
    x, ok, nit, nfev = solve_call(name, ["x0"], [x0f], consts, bodies, opts, tuple(roles), (n,))
    return x, ok, nit, nfev, bodies[0], consts


def _graph_fsolve(func, x0, args, fprime, rest, kwargs):
    qualname = "scipy.optimize.fsolve"
    kw = _rest_kwargs(rest, ("full_output", "col_deriv", "xtol", "maxfev", "band", "epsfcn",
                             "factor", "diag"), kwargs)
    if kw.pop("full_output", 0):
        _decline(qualname, "full_output=True returns SciPy's infodict")
    x, *_ = _graph_vector_root(qualname, "fsolve", func, x0, args, "fprime", fprime,
                               _opts(qualname, kw))
    return x


def _result(**fields):
    import scipy.optimize
    return scipy.optimize.OptimizeResult(**fields)


def _method_kwargs(qualname, method, rest, kwargs):
    """root's and minimize's own keywords (tol, options) and method; a
    callback (run on every iteration's values) declines the graph node."""
    kw = _rest_kwargs(rest, ("tol", "callback", "options"), kwargs)
    if kw.pop("callback", None) is not None:
        _decline(qualname, "a callback")
    kw["method"] = method
    return kw


def _graph_root(fun, x0, args, method, jac, rest, kwargs):
    qualname = "scipy.optimize.root"
    if jac is True:
        _decline(qualname, "jac=True (fun returning its Jacobian)")
    kw = _method_kwargs(qualname, method, rest, kwargs)
    x, ok, nit, nfev, R, consts = _graph_vector_root(qualname, "root", fun, x0, args, "jac",
                                                     jac, _opts(qualname, kw))
    from tracegrad.ops.control import eval_body
    return _result(x=x, success=ok, nfev=nfev, fun=eval_body(R, [x] + consts)[0])


def _graph_minimize(fun, x0, args, method, jac, hess, hessp, bounds, constraints, rest,
                    kwargs):
    qualname = "scipy.optimize.minimize"
    from tracegrad.ops.control import eval_body
    from tracegrad.ops.primitives import Aval
    from tracegrad.ops.scipy_solvers import solve_call
    cons = _constraint_dicts(qualname, constraints)
    if cons and bounds is not None:
        _decline(qualname, "bounds together with constraints")
    if bounds is not None and _values((bounds,)):
        _decline(qualname, "bounds that depend on traced values")
    if jac is True or hess is not None or hessp is not None:
        _decline(qualname, "jac=True, hess or hessp")
    if callable(method):
        _decline(qualname, "a custom method")
    kw = _method_kwargs(qualname, method, rest, kwargs)
    if isinstance(jac, str):
        kw["jac"] = jac
        jac = None
    x0f = _x0_flat(x0)
    n = int(x0f.shape[0])
    if bounds is not None:
        lb, ub = _bound_arrays(qualname, bounds, n)
        kw["bounds"] = tuple((None if np.isneginf(lo) else float(lo),
                              None if np.isposinf(hi) else float(hi)) for lo, hi in zip(lb, ub))
    opts = _opts(qualname, kw)
    xav = Aval((n,), np.dtype(np.float64))
    fns, roles = [lambda x: fun(x, *args)], [("fun", 1)]
    if jac is not None:
        if not callable(jac):
            _decline(qualname, f"jac={jac!r}")
        fns.append(lambda x: jac(x, *args))
        roles.append(("jac", 2))
    for j, c in enumerate(cons):
        cargs = c.get("args", ())
        cargs = cargs if isinstance(cargs, tuple) else (cargs,)
        roles.append((f"con{j}", len(fns) + 1))
        fns.append(lambda x, c=c, a=cargs: c["fun"](x, *a))
        if c.get("jac") is not None:
            if not callable(c["jac"]):
                _decline(qualname, "a constraint jac that is not a function")
            roles.append((f"conjac{j}", len(fns) + 1))
            fns.append(lambda x, c=c, a=cargs: c["jac"](x, *a))
    bodies, consts = _bodies(qualname, fns, [xav])
    _check_out(qualname, bodies[0], (), "the objective")
    kind = "min"
    if cons:
        roled = dict(roles)
        sizes = []
        for j, c in enumerate(cons):
            shape = tuple(bodies[roled[f"con{j}"] - 1].out_avals[0].shape)
            if len(shape) > 1:
                raise ValueError(f"{qualname}: constraint {j} returns shape {shape}; a "
                                 f"constraint returns a number or a 1-D array")
            sizes.append((c["type"], int(np.prod(shape, dtype=int))))
        opts = opts + (("_constraints", tuple(sizes)),)
        kind = "kkt"
    x, ok, nit, nfev, *_ = solve_call("minimize", ["x0"], [x0f], consts, [bodies[0]] + bodies,
                                       opts, tuple(roles), (n,), kind=kind)
    fv = eval_body(bodies[0], [x] + consts)[0]
    return _result(x=x, fun=fv, success=ok, nit=nit, nfev=nfev)


def _constraint_dicts(qualname, constraints):
    """minimize's constraints as a list of dicts ('type' eq / ineq, 'fun',
    optional 'jac' and 'args'); constraint objects decline."""
    if constraints in ((), [], None):
        return []
    cons = [constraints] if isinstance(constraints, dict) else list(constraints)
    for c in cons:
        if not isinstance(c, dict) or c.get("type") not in ("eq", "ineq") \
                or not callable(c.get("fun")):
            _decline(qualname, "constraints that are not dicts with type 'eq' / 'ineq' and "
                               "a fun (NonlinearConstraint, LinearConstraint objects)")
    return cons


def _graph_minimize_scalar(fun, bracket, bounds, args, method, rest, kwargs):
    qualname = "scipy.optimize.minimize_scalar"
    from tracegrad.ops.control import eval_body
    from tracegrad.ops.primitives import Aval
    from tracegrad.ops.scipy_solvers import solve_call
    if bounds is not None:
        _decline(qualname, "bounds (the minimum may lie on a bound)")
    if callable(method):
        _decline(qualname, "a custom method")
    kw = _rest_kwargs(rest, ("tol", "options"), kwargs)
    kw["method"] = method
    opts = _opts(qualname, kw)
    xav = Aval((), np.dtype(np.float64))
    (obj,), consts = _bodies(qualname, [lambda x: fun(x, *args)], [xav])
    _check_out(qualname, obj, (), "the objective")
    names, values = [], []
    br = list(bracket) if bracket is not None else []
    _named(names, values, *[(f"bracket{i}", v) for i, v in enumerate(br)])
    x, ok, nit, nfev = solve_call("minimize_scalar", names, values, consts, [obj, obj], opts,
                                  (("fun", 1),), (), kind="min")
    return _result(x=x, fun=eval_body(obj, [x] + consts)[0], success=ok, nit=nit, nfev=nfev)


def _graph_least_squares(fun, x0, kw):
    qualname = "scipy.optimize.least_squares"
    from tracegrad.ops.control import eval_body
    from tracegrad.ops.primitives import Aval
    from tracegrad.ops.scipy_solvers import solve_call
    kw = dict(kw)
    args = kw.pop("args", ())
    args = args if isinstance(args, tuple) else (args,)
    fkw = kw.pop("kwargs", None) or {}
    bounds = kw.pop("bounds", (-np.inf, np.inf))
    if _values((bounds,)):
        _decline(qualname, "bounds that depend on traced values")
    if hasattr(bounds, "lb") and hasattr(bounds, "ub"):
        bounds = (bounds.lb, bounds.ub)
    if not (np.all(np.isneginf(np.asarray(bounds[0], float)))
            and np.all(np.isposinf(np.asarray(bounds[1], float)))):
        n0 = int(_x0_flat(x0).shape[0])
        kw["bounds"] = tuple(tuple(float(v) for v in np.broadcast_to(np.asarray(b, float),
                                                                     (n0,)))
                             for b in bounds)
    if kw.get("loss", "linear") != "linear":
        _decline(qualname, f"loss={kw['loss']!r}")
    jac = kw.pop("jac", "2-point")
    if callable(jac):
        _decline(qualname, "a jac function")
    kw["jac"] = jac
    for k in ("x_scale",):
        if isinstance(kw.get(k), np.ndarray):
            kw[k] = tuple(float(v) for v in kw[k].ravel())
    opts = _opts(qualname, kw)
    x0f = _x0_flat(x0)
    n = int(x0f.shape[0])
    xav = Aval((n,), np.dtype(np.float64))
    (rb,), consts = _bodies(qualname, [lambda x: fun(x, *args, **fkw)], [xav])
    if len(rb.out_avals[0].shape) > 1:
        raise ValueError(f"{qualname}: fun must return a 1-D residual vector")
    cost = _derived(rb, lambda ev, a: (0.5 * (ev(rb, a)[0] * ev(rb, a)[0]).sum(),))
    x, ok, nit, nfev, *_ = solve_call("least_squares", ["x0"], [x0f], consts, [cost, rb],
                                       opts, (("fun", 1),), (n,), kind="min")
    r = eval_body(rb, [x] + consts)[0]
    return _result(x=x, fun=r, cost=0.5 * (r * r).sum(), success=ok, nfev=nfev)


def _graph_quad(func, a, b, args, rest, kwargs):
    qualname = "scipy.integrate.quad"
    from tracegrad.ops.primitives import Aval
    from tracegrad.ops.scipy_solvers import quad_call
    kw = _rest_kwargs(rest, ("full_output", "epsabs", "epsrel", "limit", "points", "weight",
                             "wvar", "wopts", "maxp1", "limlst", "complex_func"), kwargs)
    if kw.pop("full_output", 0):
        _decline(qualname, "full_output=1 returns SciPy's infodict")
    for k in ("weight", "wvar", "wopts", "complex_func"):
        if kw.get(k) not in (None, False):
            _decline(qualname, f"{k}=")
        kw.pop(k, None)
    if kw.get("points") is not None:
        kw["points"] = tuple(_float(p) for p in kw["points"])
    opts = _opts(qualname, kw)
    xav = Aval((), np.dtype(np.float64))
    (body,), consts = _bodies(qualname, [lambda x: func(x, *args)], [xav])
    _check_out(qualname, body, (), "the integrand")
    av = _f64(a) if is_value(a) else np.float64(a)
    bv = _f64(b) if is_value(b) else np.float64(b)
    v, err = quad_call(av, bv, consts, body, opts)
    return v, err


def _rhs_body(qualname, rhs, n):
    from tracegrad.ops.primitives import Aval
    zav, tav = Aval((n,), np.dtype(np.float64)), Aval((), np.dtype(np.float64))
    (body,), consts = _bodies(qualname, [rhs], [zav, tav])
    _check_out(qualname, body, (n,), "the right-hand side")
    return body, consts


def _graph_odeint(func, y0, t, args, rest, kwargs):
    qualname = "scipy.integrate.odeint"
    from tracegrad.ops.scipy_solvers import ode_call
    if rest or kwargs.get("Dfun") is not None or kwargs.get("full_output"):
        _decline(qualname, "Dfun, full_output or positional options")
    kw = {k: v for k, v in kwargs.items() if k not in ("Dfun", "full_output", "tfirst")}
    opts = _opts(qualname, kw)
    y0f = _x0_flat(y0)
    n = int(y0f.shape[0])
    if kwargs.get("tfirst"):
        rhs = lambda z, tt: func(tt, z, *args)       # noqa: E731
    else:
        rhs = lambda z, tt: func(z, tt, *args)       # noqa: E731
    body, consts = _rhs_body(qualname, rhs, n)
    tv = _f64(t) if is_value(t) else np.asarray(t, np.float64)
    return ode_call("odeint", y0f, [tv], ["t"], consts, body, opts)


def _graph_solve_ivp(fun, t_span, y0, method, t_eval, dense_output, events, vectorized, args,
                     options):
    qualname = "scipy.integrate.solve_ivp"
    from tracegrad.ops.scipy_solvers import ode_call
    if dense_output or events is not None or vectorized:
        _decline(qualname, "dense_output, events or vectorized")
    if t_eval is None:
        _decline(qualname, "no t_eval (the number of output times is known only after "
                           "solving); pass t_eval")
    if not isinstance(method, str):
        _decline(qualname, "a custom method class")
    opts = _opts(qualname, dict(options, method=method))
    y0f = _x0_flat(y0)
    n = int(y0f.shape[0])
    body, consts = _rhs_body(qualname, lambda z, tt: fun(tt, z, *args), n)
    t0, t1 = [(_f64(v) if is_value(v) else np.float64(v)) for v in t_span]
    te = _f64(t_eval) if is_value(t_eval) else np.asarray(t_eval, np.float64)
    Z = ode_call("solve_ivp", y0f, [t0, t1, te], ["t0", "t1", "t_eval"], consts, body, opts)
    import scipy.integrate
    return scipy.integrate._ivp.ivp.OdeResult(
        t=te, y=Z.T, sol=None, t_events=None, y_events=None, status=0,
        message="The solver successfully reached the end of the integration interval.",
        success=True)


def _graph_curve_fit(f, xdata, ydata, p0, sigma, absolute_sigma, check_finite, bounds, method,
                     jac, full_output, nan_policy, kwargs):
    qualname = "scipy.optimize.curve_fit"
    from tracegrad.ops.primitives import Aval
    from tracegrad.ops.scipy_solvers import solve_call
    if jac is not None or full_output or nan_policy is not None:
        _decline(qualname, "jac, full_output or nan_policy")
    if not (np.all(np.isneginf(np.asarray(bounds[0], float)))
            and np.all(np.isposinf(np.asarray(bounds[1], float)))):
        _decline(qualname, "bounds (the derivative on the active set is not implemented)")
    if sigma is not None and len(np.shape(sigma)) > 1:
        _decline(qualname, "a covariance matrix sigma")
    n = _n_params(qualname, f, p0)
    x0 = _x0_flat(p0) if p0 is not None else np.ones(n)
    y = _f64(ydata) if is_value(ydata) else np.asarray(ydata, np.float64)
    if len(y.shape) != 1:
        _decline(qualname, "ydata that is not 1-D")
    s = None if sigma is None else (_f64(sigma) if is_value(sigma) else
                                    np.asarray(sigma, np.float64))
    opts = _opts(qualname, dict(kwargs, absolute_sigma=bool(absolute_sigma),
                                check_finite=check_finite, method=method))
    pav = Aval((n,), np.dtype(np.float64))

    def model(p):
        return _f64(_as_array_out(f(xdata, *[p[i] for i in range(n)])))

    def weighted(p):
        r = model(p) - y
        return r if s is None else r / s

    def cost(p):
        r = weighted(p)
        return 0.5 * (r * r).sum()
    bodies, consts = _bodies(qualname, [cost, model, weighted], [pav])
    _check_out(qualname, bodies[1], tuple(y.shape), "the model")
    names, values = ["x0", "ydata"], [x0, y]
    if s is not None:
        names.append("sigma")
        values.append(s)
    popt, ok, nit, nfev, pcov = solve_call("curve_fit", names, values, consts, bodies, opts,
                                           (("f", 1),), (n,), kind="min")
    return popt, pcov


def _n_params(qualname, f, p0):
    if p0 is not None:
        return int(np.size(p0)) if not is_value(p0) else int(np.prod(tuple(p0.shape)))
    import inspect
    try:
        params = [p for p in inspect.signature(f).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        raise ValueError(f"{qualname}: unable to determine the number of fit parameters; "
                         f"pass p0") from None
    if len(params) < 2:
        raise ValueError(f"{qualname}: unable to determine the number of fit parameters; "
                         f"pass p0")
    return len(params) - 1


def _curve_fit(original, f, xdata, ydata, p0=None, sigma=None, absolute_sigma=False,
               check_finite=None, bounds=(-np.inf, np.inf), method=None, jac=None, *,
               full_output=False, nan_policy=None, **kwargs):
    """scipy.optimize.curve_fit: popt is the minimiser of the weighted squared
    residuals, differentiated by the implicit function theorem (as
    least_squares); compiled, pcov = inv(J^T J) s^2 is differentiated too."""
    qualname = "scipy.optimize.curve_fit"
    if _tracing(f, xdata, ydata, p0, sigma):
        return _graph_curve_fit(f, xdata, ydata, p0, sigma, absolute_sigma, check_finite,
                                bounds, method, jac, full_output, nan_policy, kwargs)
    values = _values((f, xdata, ydata, sigma))
    call = dict(p0=None if p0 is None else _float_array(p0), sigma=_float_array(sigma),
                absolute_sigma=absolute_sigma, check_finite=check_finite, bounds=bounds,
                method=method, jac=jac, full_output=full_output, nan_policy=nan_policy)
    if not values:
        return original(f, xdata, ydata, **call, **kwargs)
    if jac is not None or full_output or nan_policy is not None:
        raise NotImplementedError(f"{qualname} with jac, full_output or nan_policy on "
                                  f"differentiated values is not supported by tracegrad")
    if not (np.all(np.isneginf(np.asarray(bounds[0], float)))
            and np.all(np.isposinf(np.asarray(bounds[1], float)))):
        raise NotImplementedError(f"{qualname} with bounds on differentiated values is not "
                                  f"supported by tracegrad")
    if sigma is not None and len(np.shape(sigma)) > 1:
        raise NotImplementedError(f"{qualname} with a covariance matrix sigma on "
                                  f"differentiated values is not supported by tracegrad")
    n = _n_params(qualname, f, p0)
    if p0 is None:
        call["p0"] = np.ones(n)
    plain_f = _plain_vec(lambda xd, *p: f(xdata, *p))
    popt, pcov = original(lambda xd, *p: plain_f(xd, *p), _float_array(xdata),
                          _float_array(ydata), **call, **kwargs)

    def cost(p):
        r = f(xdata, *[p[i] for i in range(n)]) - ydata
        if sigma is not None:
            r = r / sigma
        return 0.5 * (r * r).sum()
    popt_t = _implicit(qualname, _stationary(cost), popt, (), (n,))
    from tracegrad.ops.scipy_solvers import no_derivative
    return popt_t, no_derivative(pcov, values, f"{qualname}'s pcov (compile=False)",
                                 "a compiled transform differentiates it (tg.grad, tg.jacobian)")


def _dblquad(original, func, a, b, gfun, hfun, args=(), epsabs=1.49e-8, epsrel=1.49e-8):
    """scipy.integrate.dblquad as SciPy computes it (nested quad: the inner
    integral over y from gfun(x) to hfun(x), the outer over x), through the
    quad stand-in, so its derivative is quad's (the integrand's derivative
    integrated, Leibniz's rule for the limits, which may depend on x)."""
    if not isinstance(args, tuple):
        args = (args,)
    if not (_tracing(func, args, a, b, gfun, hfun) or _values((func, args, a, b, gfun, hfun))):
        return original(func, a, b, gfun, hfun, args, epsabs, epsrel)
    import scipy.integrate
    quad = scipy.integrate.quad

    def lim(g, x):
        return g(x) if callable(g) else g

    def inner(x):
        return _quad(quad, lambda y: func(y, x, *args), lim(gfun, x), lim(hfun, x),
                     epsabs=epsabs, epsrel=epsrel)[0]
    return _quad(quad, inner, a, b, epsabs=epsabs, epsrel=epsrel)


ROOTS["curve_fit"] = _curve_fit
INTEGRALS["dblquad"] = _dblquad
