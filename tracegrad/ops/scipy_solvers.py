"""SciPy's solvers, integrators and optimisers as graph nodes.

The user's callables (the function whose root is found, the objective, the
integrand, the ODE's right-hand side) are traced into ``Body``s, the
subgraphs loops and branches hold (``tracegrad.ops.control``), so a compiled
graph holds the whole computation.  The forward runs SciPy's own routine on
the compiled bodies (a host call of the generated code, as a loop runs on
the host: ``targets.pysource.CONTROL_FLOW``); the derivatives are written
with tracegrad's ops over the bodies' own derived bodies (the adjoint pass's
vjp and jvp bodies, batching), so they are graph nodes too, and derivatives
of any order follow.  Three rows:

* ``scipy_solve``: a root finder or minimiser (``spec[0]``: brentq, brenth,
  bisect, ridder, toms748, newton, root_scalar, fixed_point, root, fsolve,
  minimize, minimize_scalar, least_squares).  Operands: the leading values
  SciPy is handed (x0, a bracket: ``spec[1]`` names them), then the values
  the callables read.  ``bodies[0]`` is the residual R(x, *consts), zero at
  the answer (the function itself for a root, the objective's gradient for a
  minimum); the other bodies are the callables SciPy calls (``spec[3]``
  maps SciPy's role to a body).  Outputs (x*, converged, nit, nfev).
  Derivatives by the implicit function theorem at x*: J = dR/dx from the
  residual's tangent body batched over the identity, then
  vjp: ct_k = -(dR/dk)^T J^-T g;  jvp: dx = -J^-1 (dR/dk) dk.
  Both read the node's own output x*, so differentiating them goes through
  this rule again.  A fifth output, where there is one: the elements held on
  a bound (``minimize`` / ``least_squares`` with bounds: their rows and
  columns of the system are the identity's), the active constraints
  (``minimize`` with constraints, ``spec[5]`` 'kkt': the unknowns are
  (x*, lam), the residual the KKT system's, lam fitted at x* to the active
  constraints), or ``curve_fit``'s pcov (SciPy's value; the derivative of
  inv(J^T J) s^2 as a body of (p, consts)).
* ``scipy_quad``: ``quad`` (one scalar integrand: outputs value, abserr) or
  ``quad_vec`` (several array outputs, each integrated: outputs the
  integrals, abserr) of body(x, *consts) over [a, b].  The derivative in a
  value the integrand reads is the integral of the integrand's vjp (jvp)
  body, by ``quad_vec``: the same row again; in the limits Leibniz's rule
  (+f(b) db - f(a) da).
* ``scipy_ode``: ``odeint`` / ``solve_ivp`` of z' = body(z, t, *consts) from
  z0 at the time points (``spec[1]`` names the time operands); output Z
  (len(t), len(z0)).  Derivative in z0 or in one value k the right-hand side
  reads by forward sensitivities: S' = f_z S + f_k (S(0) = I for z0, 0 for
  k), the augmented system being the same row over a body traced from the
  right-hand side's tangent body batched over S's columns, integrated by the
  same SciPy method and tolerances; then ct_k = sum_t g(t) S(t), tangent
  S(t) dk.  Time points: dY_k/dt_k = f(Y_k, t_k) (a scan of the right-hand
  side over the outputs), and the start moves Y_k by -S_z0(k) f(z0, t0).

``no_derivative``: a value (curve_fit's pcov with compile=False) whose
derivative raises an error naming it.

``spec`` holds only literals (method names, tolerances, option dicts as
tuples), printed into the generated code by ``_lit``.
"""
from __future__ import annotations

import math

import numpy as np

from tracegrad.ops import runtime_numpy as _rt
from tracegrad.ops.base import (add, mul, neg, div, reshape, sum as _sum, transpose, where,
                                matmul, zeros_like_value)
from tracegrad.ops.control import _need, _trace, eval_body, run_body, scan_p as _scan_p
from tracegrad.ops.linalg import inv as _inv, solve as _solve
from tracegrad.ops.primitives import Aval, aval_of, bind, is_float, register
from tracegrad.ops.shape import concatenate

__all__ = ["solve_call", "quad_call", "ode_call", "literal_ok", "no_derivative"]


# --- runtime helpers (copied into generated code; self-contained) ------------------------

def _sp_solve(spec, fns, *ops):
    """SciPy's root finder or minimiser ``spec[0]`` on the compiled callables
    ``fns`` (each f(x, *consts) -> a tuple; ``spec[3]`` says which is which):
    returns (x*, converged, nit, nfev)."""
    if any(type(v).__module__.startswith("cupy") for v in ops):
        raise NotImplementedError("scipy.optimize: SciPy's solvers run on the host on NumPy "
                                  "arrays; compile with backend='numpy' or 'native'")
    import numpy as np
    import scipy.optimize as so
    name, lead, opts, roles, xshape = spec[:5]
    opts = {k: (dict(v) if isinstance(v, tuple) and k == "options" else v) for k, v in opts}
    nl = len(lead)
    given = dict(zip(lead, ops[:nl]))
    consts = ops[nl:]
    scalar = xshape == ()

    def callback(role, kind="x"):
        i = dict(roles).get(role)
        if i is None:
            return None
        f = fns[i]

        def call(x, *_):
            r = f(np.asarray(x, np.float64).reshape(xshape), *consts)[0]
            if kind == "scalar":
                return float(r)
            return float(r) if scalar else np.array(r, np.float64).reshape(np.shape(r))
        return call

    def num(v):
        return float(np.asarray(v))
    nit = nfev = -1
    extra = None
    if name in ("brentq", "brenth", "bisect", "ridder", "toms748"):
        x, info = getattr(so, name)(callback("f"), num(given["a"]), num(given["b"]),
                                    full_output=True, **opts)
        ok, nit, nfev = info.converged, info.iterations, info.function_calls
    elif name == "newton":
        kw = dict(opts)
        if "x1" in given:
            kw["x1"] = num(given["x1"])
        x, info = so.newton(callback("f"), num(given["x0"]), fprime=callback("fprime"),
                            fprime2=callback("fprime2"), full_output=True, **kw)
        ok, nit, nfev = info.converged, info.iterations, info.function_calls
    elif name == "root_scalar":
        kw = dict(opts)
        if "bracket0" in given:
            kw["bracket"] = [num(given["bracket0"]), num(given["bracket1"])]
        for k in ("x0", "x1"):
            if k in given:
                kw[k] = num(given[k])
        r = so.root_scalar(callback("f"), fprime=callback("fprime"),
                           fprime2=callback("fprime2"), **kw)
        x, ok, nit, nfev = r.root, r.converged, r.iterations, r.function_calls
    elif name == "fixed_point":
        x = so.fixed_point(callback("g"), np.asarray(given["x0"], np.float64), **opts)
        ok = True
    elif name == "root":
        r = so.root(callback("fun"), np.asarray(given["x0"], np.float64).reshape(-1),
                    jac=callback("jac"), **opts)
        x, ok, nfev = r.x, r.success, r.get("nfev", -1)
    elif name == "fsolve":
        x, info, ier, msg = so.fsolve(callback("func"),
                                      np.asarray(given["x0"], np.float64).reshape(-1),
                                      fprime=callback("fprime"), full_output=True, **opts)
        ok, nfev = ier == 1, info["nfev"]
        if not ok:
            import warnings
            warnings.warn(msg, RuntimeWarning, stacklevel=2)
    elif name == "minimize":
        cons = opts.pop("_constraints", None)
        if cons is not None:        # ((type, size), ...): roles con<j>, conjac<j>
            opts["constraints"] = [
                {k: v for k, v in (("type", t), ("fun", callback(f"con{j}")),
                                   ("jac", callback(f"conjac{j}"))) if v is not None}
                for j, (t, _) in enumerate(cons)]
        if opts.get("bounds") is not None:
            opts["bounds"] = [tuple(b) for b in opts["bounds"]]
        r = so.minimize(callback("fun", "scalar"), np.asarray(given["x0"], np.float64).reshape(-1),
                        jac=callback("jac"), **opts)
        x, ok, nit, nfev = r.x, r.success, r.get("nit", -1), r.get("nfev", -1)
        if cons is not None:        # the active constraints: equalities, c(x*) ~ 0
            act = []
            for j, (t, size) in enumerate(cons):
                c = np.ravel(np.asarray(callback(f"con{j}")(x), np.float64))
                act.append(np.ones(size, bool) if t == "eq" else
                           c <= 1e-7 * (1.0 + np.abs(x).max()))
            extra = np.concatenate(act) if act else np.zeros(0, bool)
        elif opts.get("bounds") is not None:     # the active set: x on a bound
            lb = np.array([-np.inf if b[0] is None else b[0] for b in opts["bounds"]], float)
            ub = np.array([np.inf if b[1] is None else b[1] for b in opts["bounds"]], float)
            tol = 1e-8 * (1.0 + np.abs(x))
            extra = (x <= lb + tol) | (x >= ub - tol)
    elif name == "curve_fit":
        model = fns[dict(roles)["f"]]
        ydata = np.asarray(given["ydata"], np.float64)

        def f(_xdata, *p):
            return np.array(model(np.asarray(p, np.float64).reshape(xshape), *consts)[0],
                            np.float64)
        sigma = given.get("sigma")
        x, extra = so.curve_fit(f, np.zeros(ydata.shape), ydata,
                                p0=np.asarray(given["x0"], np.float64).reshape(-1),
                                sigma=None if sigma is None else np.asarray(sigma, np.float64),
                                **opts)
        ok = True
    elif name == "minimize_scalar":
        kw = dict(opts)
        br = [num(given[k]) for k in ("bracket0", "bracket1", "bracket2") if k in given]
        if br:
            kw["bracket"] = br
        r = so.minimize_scalar(callback("fun", "scalar"), **kw)
        x, ok, nit, nfev = r.x, r.success, r.get("nit", -1), r.get("nfev", -1)
    elif name == "least_squares":
        if opts.get("bounds") is not None:
            opts["bounds"] = tuple(np.asarray(b, np.float64) for b in opts["bounds"])
        r = so.least_squares(callback("fun"), np.asarray(given["x0"], np.float64).reshape(-1),
                             **opts)
        x, ok, nfev = r.x, r.success, r.nfev
        if opts.get("bounds") is not None:     # SciPy's active set, or x on a bound
            lb, ub = (np.broadcast_to(b, x.shape) for b in opts["bounds"])
            tol = 1e-8 * (1.0 + np.abs(x))
            extra = (np.asarray(r.active_mask) != 0) | (x <= lb + tol) | (x >= ub - tol)
    else:
        raise ValueError(f"_sp_solve: unknown solver {name!r}")
    out = (np.asarray(x, np.float64).reshape(xshape), np.asarray(bool(ok)),
           np.asarray(nit if nit is not None else -1, np.int64),
           np.asarray(nfev if nfev is not None else -1, np.int64))
    return out if extra is None else out + (np.asarray(extra),)


def _sp_quad(spec, fns, *ops):
    """``quad`` (spec[0] 'quad': one scalar output; returns value, abserr) or
    ``quad_vec`` ('quad_vec': every output integrated; returns the integrals,
    abserr) of fns[0](x, *consts) over [a, b] = ops[:2]."""
    if any(type(v).__module__.startswith("cupy") for v in ops):
        raise NotImplementedError("scipy.integrate.quad: SciPy's solvers run on the host on "
                                  "NumPy arrays; compile with backend='numpy' or 'native'")
    import numpy as np
    import scipy.integrate as si
    name, opts, shapes = spec
    opts = dict(opts)
    a, b = float(np.asarray(ops[0])), float(np.asarray(ops[1]))
    consts = ops[2:]
    f = fns[0]
    if name == "quad":
        def g(x):
            return float(f(np.asarray(x, np.float64), *consts)[0])
        r = si.quad(g, a, b, **opts)
        return np.asarray(r[0], np.float64), np.asarray(r[1], np.float64)
    sizes = [int(np.prod(s)) for s in shapes]

    def h(x):
        outs = f(np.asarray(x, np.float64), *consts)
        return np.concatenate([np.ravel(np.asarray(o, np.float64)) for o in outs])
    if sum(sizes) == 0 or a == b:
        c, err = np.zeros(sum(sizes)), 0.0
    else:
        c, err = si.quad_vec(h, a, b, **opts)
    c = np.asarray(c, np.float64).reshape(-1)
    outs, at = [], 0
    for s, n in zip(shapes, sizes):
        outs.append(c[at:at + n].reshape(s))
        at += n
    return tuple(outs) + (np.asarray(err, np.float64),)


def _sp_ode(spec, fns, *ops):
    """``odeint`` or ``solve_ivp`` (spec[0]) of z' = fns[0](z, t, *consts)
    from z0 = ops[0]: the solution at the time points, as (len(t), len(z0))."""
    if any(type(v).__module__.startswith("cupy") for v in ops):
        raise NotImplementedError("scipy.integrate.odeint / solve_ivp: SciPy's solvers run on "
                                  "the host on NumPy arrays; compile with backend='numpy' or "
                                  "'native'")
    import numpy as np
    import scipy.integrate as si
    name, lead, opts = spec
    opts = dict(opts)
    nl = len(lead)
    z0 = np.asarray(ops[0], np.float64)
    given = dict(zip(lead, ops[1:1 + nl]))
    consts = ops[1 + nl:]
    f = fns[0]

    def rhs(z, t):
        return np.array(f(np.asarray(z, np.float64), np.asarray(t, np.float64), *consts)[0],
                        np.float64)
    if name == "odeint":
        t = np.asarray(given["t"], np.float64)
        return np.asarray(si.odeint(rhs, z0, t, **opts), np.float64).reshape(len(t), z0.size)
    t_eval = np.asarray(given["t_eval"], np.float64)
    span = (float(np.asarray(given["t0"])), float(np.asarray(given["t1"])))
    sol = si.solve_ivp(lambda t, z: rhs(z, t), span, z0, t_eval=t_eval, **opts)
    if not sol.success or sol.y.shape[1] != t_eval.size:
        raise RuntimeError(f"scipy.integrate.solve_ivp: {sol.message}")
    return np.ascontiguousarray(sol.y.T)


for _h in (_sp_solve, _sp_quad, _sp_ode):
    setattr(_rt, _h.__name__, _h)   # codegen copies helpers from runtime_numpy


# --- literals in the spec -------------------------------------------------------------------

def literal_ok(v):
    """Can ``v`` be printed into generated code as a literal (``_lit``)?"""
    if v is None or isinstance(v, (bool, int, float, str)):
        return True
    if isinstance(v, (np.floating, np.integer, np.bool_)):
        return True
    if isinstance(v, tuple):
        return all(literal_ok(x) for x in v)
    return False


def _lit(v):
    if isinstance(v, (bool, np.bool_)):
        return repr(bool(v))
    if isinstance(v, (int, np.integer)):
        return repr(int(v))
    if isinstance(v, (float, np.floating)):
        v = float(v)
        return repr(v) if math.isfinite(v) else f"float({str(v)!r})"
    if isinstance(v, str) or v is None:
        return repr(v)
    if isinstance(v, tuple):
        return "(" + "".join(_lit(x) + ", " for x in v) + ")"
    raise TypeError(f"not a literal: {v!r}")


def _emitter(helper):
    def emit(names, fns, **attrs):
        spec = attrs["spec"]
        return f"{helper}({_lit(spec)}, ({''.join(f + ', ' for f in fns)}), {', '.join(names)})"
    return emit


def _runner(body):
    def f(*a):
        return tuple(run_body(body, np, list(a)))
    return f


# --- shared derivations ---------------------------------------------------------------------

def _memo(body, key, make):
    b = body.memo.get(key)
    if b is None:
        b = body.memo[key] = make()
    return b


def _float_consts(consts):
    return tuple(i for i, c in enumerate(consts) if is_float(aval_of(c).dtype))


def _basis(n, shape, dtype):
    """The identity as n tangents of ``shape`` (a constant)."""
    return np.eye(n, dtype=dtype).reshape((n,) + tuple(shape))


def _size(shape):
    n = 1
    for d in shape:
        n *= int(d)
    return n


# --- scipy_solve: roots and minima by the implicit function theorem ------------------------

def _columns(jb, inputs, tangents, k):
    """Output ``k`` of the tangent body ``jb`` for each column of tangents
    (``tangents``: one list of tangent values per column), stacked: the
    primal part of the unrolled evaluations is one computation (hash-consed
    in a trace)."""
    from tracegrad.ops.shape import stack
    return stack([eval_body(jb, list(inputs) + list(t))[k] for t in tangents], axis=0)


def _jacobian_t(R, x, consts):
    """J^T of the residual R in x at (x, consts), as (n, m): row j is J e_j
    (m = n: the implicit system)."""
    xa = aval_of(x)
    n = _size(xa.shape)
    jb = _memo(R, ("ift_jvp_x",), lambda: _need("jvp_body")(R, (0,)))
    E = _basis(n, xa.shape, xa.dtype)
    t = _columns(jb, [x] + list(consts), [[E[j]] for j in range(n)], 1)
    m = _size(R.out_avals[0].shape)
    return reshape(t, (n, m))


def _system(R, x, consts, out, spec):
    """J^T (n, n) of the implicit system at x*, and the mask of the elements
    held on a bound (minimize with bounds) or None: there the system's rows
    and columns are the identity's (x on an active bound does not move), and
    the right-hand sides are zero."""
    Jt = _jacobian_t(R, x, consts)
    active = out[4] if _extra(spec) == "active" else None
    if active is not None:
        n = Jt.shape[0]
        eye = np.eye(n, dtype=aval_of(Jt).dtype)
        Jt = where(reshape(active, (n, 1)), eye, where(reshape(active, (1, n)), eye, Jt))
    return Jt, active


def _masked(v, active):
    return v if active is None else where(active, np.zeros((), aval_of(v).dtype), v)


def _lin_solve(A, b):
    n = A.shape[0]
    if n == 1:
        return div(b, reshape(A, (1,)))
    return _solve(A, b)


def _residual(bodies, spec):
    """R(x, *consts), zero at the answer: bodies[0] itself for a root
    (spec[5] 'root'), its gradient in x for a minimum ('min')."""
    b = bodies[0]
    if spec[5] == "root":
        return b

    def make():
        vb = _need("vjp_body")(b, (0,))
        one = np.ones((), b.out_avals[0].dtype)
        return _trace(lambda *a: (eval_body(vb, list(a) + [one])[0],), list(b.in_avals))[0]
    return _memo(b, ("gradient_residual",), make)


def _pcov_body(bodies, spec):
    """curve_fit's covariance as a function of (p, *consts): inv(J^T J), times
    the residual variance unless absolute_sigma (J: the weighted residual's
    Jacobian, bodies[2])."""
    rb = bodies[2]
    absolute = bool(dict(spec[2]).get("absolute_sigma", False))

    def make():
        jb = _need("jvp_body")(rb, (0,))
        pa = rb.in_avals[0]
        n, m = _size(pa.shape), _size(rb.out_avals[0].shape)

        def f(p, *k):
            E = _basis(n, pa.shape, pa.dtype)
            Jt = reshape(_columns(jb, [p] + list(k), [[E[j]] for j in range(n)], 1), (n, m))
            P = _inv(matmul(Jt, transpose(Jt, (1, 0))))
            if not absolute:
                r = reshape(eval_body(rb, [p] + list(k))[0], (m,))
                P = mul(P, div(_sum(mul(r, r)), float(m - n)))
            return (P,)
        return _trace(f, list(rb.in_avals))[0]
    return _memo(rb, ("pcov", absolute), make)


def _n_constraints(spec):
    return sum(size for _, size in dict(spec[2])["_constraints"])


def _kkt_bodies(bodies, spec):
    """C(x, *k): the constraints, concatenated (K,); R(z, *k) with z = (x, lam):
    (grad f - A^T lam, C(x)), A = dC/dx: the KKT system of SciPy's convention
    L = f - lam . c."""
    roles = dict(spec[3])
    cons = [bodies[roles[f"con{j}"]] for j in range(len(dict(spec[2])["_constraints"]))]
    obj = bodies[0]

    def make():
        x_av, k_av = obj.in_avals[0], list(obj.in_avals[1:])
        n, K = _size(x_av.shape), _n_constraints(spec)

        def cfun(x, *k):
            parts = [reshape(eval_body(cb, [x] + list(k))[0], (-1,)) for cb in cons]
            return (concatenate(parts, axis=0) if len(parts) > 1 else parts[0],)
        C = _trace(cfun, [x_av] + k_av)[0]
        vf = _need("vjp_body")(obj, (0,))
        vc = _need("vjp_body")(C, (0,))
        one = np.ones((), obj.out_avals[0].dtype)

        def kkt(z, *k):
            x, lam = z[:n], z[n:]
            gx = add(eval_body(vf, [x] + list(k) + [one])[0],
                     neg(eval_body(vc, [x] + list(k) + [lam])[0]))
            return (concatenate([gx, eval_body(C, [x] + list(k))[0]], axis=0),)
        R = _trace(kkt, [Aval((n + K,), x_av.dtype)] + k_av)[0]
        return C, vf, R
    return _memo(obj, ("kkt", tuple(c.key for c in cons)), make)


def _implicit_system(bodies, spec, out, consts):
    """(R, z, J^T, held): the implicit system R(z, *consts) = 0 at the node's
    answer, its transposed Jacobian with the held elements' rows and columns
    the identity's, and the held mask (or None).  For a minimum under
    constraints z = (x*, lam): lam from the active constraints' least squares
    fit of grad f, the inactive ones' lam held at 0."""
    x = out[0]
    if spec[5] != "kkt":
        R = _residual(bodies, spec)
        Jt, active = _system(R, x, consts, out, spec)
        return R, x, Jt, active
    C, vf, R = _kkt_bodies(bodies, spec)
    act = out[4]
    n, K = _size(aval_of(x).shape), _n_constraints(spec)
    one = np.ones((), aval_of(x).dtype)
    G = eval_body(vf, [x] + consts + [one])[0]
    jc = _memo(C, ("jvp_x",), lambda: _need("jvp_body")(C, (0,)))
    E = _basis(n, (n,), aval_of(x).dtype)
    At = reshape(_columns(jc, [x] + consts, [[E[j]] for j in range(n)], 1), (n, K))
    zero = np.zeros((), aval_of(x).dtype)
    Aat = where(reshape(act, (1, K)), At, zero)                        # active columns
    M = add(matmul(transpose(Aat, (1, 0)), Aat),
            where(act, zero, np.ones((), aval_of(x).dtype)) * np.eye(K))
    lam = _lin_solve(M, matmul(transpose(Aat, (1, 0)), G))
    z = concatenate([x, lam], axis=0)
    held = concatenate([np.zeros(n, bool), where(act, np.zeros((), bool), np.ones((), bool))],
                       axis=0)
    Jt = _jacobian_t(R, z, consts)
    eye = np.eye(n + K, dtype=aval_of(Jt).dtype)
    Jt = where(reshape(held, (n + K, 1)), eye, where(reshape(held, (1, n + K)), eye, Jt))
    return R, z, Jt, held


def _solve_vjp_for(i):
    def rule(g, out, *ops, bodies, spec):
        nl = len(spec[1])
        if i < nl:          # the start point / bracket: x* does not depend on it
            return None
        consts = list(ops[nl:])
        fk = _float_consts(consts)
        if (i - nl) not in fk:
            return None
        gx = g[0]
        gP = g[4] if _extra(spec) == "pcov" else None
        if gx is None and gP is None:
            return None
        x = out[0]
        direct = None
        if gP is not None:      # pcov(x*, consts): its own vjp, and through x*
            Pb = _pcov_body(bodies, spec)
            vP = _memo(Pb, ("vjp", fk),
                       lambda: _need("vjp_body")(Pb, (0,) + tuple(1 + j for j in fk)))
            r = eval_body(vP, [x] + consts + [gP])
            gx = r[0] if gx is None else add(gx, r[0])
            direct = r[1 + fk.index(i - nl)]
        R, z, Jt, active = _implicit_system(bodies, spec, out, consts)
        n = Jt.shape[0]
        gz = reshape(gx, (-1,))
        if n > gz.shape[0]:         # the multipliers' cotangent: zero
            gz = concatenate([gz, np.zeros(n - gz.shape[0], aval_of(gz).dtype)], axis=0)
        w = _lin_solve(Jt, _masked(gz, active))
        vb = _memo(R, ("ift_vjp", fk), lambda: _need("vjp_body")(R, tuple(1 + j for j in fk)))
        r = eval_body(vb, [z] + consts + [reshape(w, R.out_avals[0].shape)])
        ct = neg(r[fk.index(i - nl)])
        return ct if direct is None else add(ct, direct)
    return rule


def _solve_jvp(tangents, out, *ops, bodies, spec):
    nl = len(spec[1])
    consts = list(ops[nl:])
    tk = list(tangents[nl:])
    fk = tuple(j for j in _float_consts(consts) if tk[j] is not None)
    n_out = 4 + (_extra(spec) is not None)
    if not fk:
        return (None,) * n_out
    x = out[0]
    R, z, Jt, active = _implicit_system(bodies, spec, out, consts)
    jb = _memo(R, ("ift_jvp_k", fk), lambda: _need("jvp_body")(R, tuple(1 + j for j in fk)))
    v = eval_body(jb, [z] + consts + [tk[j] for j in fk])[1]       # dR/dk dk
    n = Jt.shape[0]
    dz = neg(_lin_solve(transpose(Jt, (1, 0)), _masked(reshape(v, (n,)), active)))
    nx = _size(aval_of(x).shape)
    dx = reshape(dz if n == nx else dz[:nx], tuple(aval_of(x).shape))
    res = [dx, None, None, None]
    if _extra(spec) == "pcov":
        Pb = _pcov_body(bodies, spec)
        jP = _memo(Pb, ("jvp", fk), lambda: _need("jvp_body")(Pb, (0,) + tuple(1 + j for j in fk)))
        res.append(eval_body(jP, [x] + consts + [dx] + [tk[j] for j in fk])[1])
    elif n_out == 5:
        res.append(None)
    return tuple(res)


def _extra(spec):
    """The fifth output: 'active' (minimize with bounds: the bound-active
    elements of x*), 'pcov' (curve_fit's covariance), or None."""
    if spec[0] == "curve_fit":
        return "pcov"
    if spec[5] == "kkt":
        return "active"
    if spec[0] in ("minimize", "least_squares") and dict(spec[2]).get("bounds") is not None:
        return "active"
    return None


def _solve_shape(*avals, bodies, spec):
    x = Aval(tuple(spec[4]), np.dtype(np.float64))
    out = (x, Aval((), np.dtype(bool)), Aval((), np.dtype(np.int64)),
           Aval((), np.dtype(np.int64)))
    n = _size(spec[4])
    extra = _extra(spec)
    if extra == "active":
        k = _n_constraints(spec) if spec[5] == "kkt" else n
        out += (Aval((k,), np.dtype(bool)),)
    elif extra == "pcov":
        out += (Aval((n, n), np.dtype(np.float64)),)
    return out


def _solve_impl(xp, *ops, bodies, spec):
    return _sp_solve(spec, tuple(_runner(b) for b in bodies), *ops)


_N_MAX_OPS = 64
scipy_solve_p = register(
    "scipy_solve", _solve_impl, shape=_solve_shape,
    vjp=tuple(_solve_vjp_for(i) for i in range(_N_MAX_OPS)), jvp=_solve_jvp,
    numpy=_emitter("_sp_solve"), helpers=("_sp_solve",),
    n_out=lambda bodies, spec: 4 + (_extra(spec) is not None), save_out=True,
    doc="A SciPy root finder or minimiser over traced callables (the bodies); derivatives "
        "by the implicit function theorem on the residual body at the node's own answer.")


def solve_call(name, lead_names, lead, consts, bodies, opts, roles, xshape, kind="root"):
    """Bind ``scipy_solve``: returns (x*, converged, nit, nfev).  ``kind``:
    'root' (bodies[0] is zero at x*) or 'min' (bodies[0] is minimal there)."""
    spec = (name, tuple(lead_names), tuple(opts), tuple(roles), tuple(int(d) for d in xshape),
            kind)
    if len(lead) + len(consts) > _N_MAX_OPS:
        raise NotImplementedError(f"scipy.optimize.{name}: the callables read more than "
                                  f"{_N_MAX_OPS - len(lead)} traced values")
    return list(bind(scipy_solve_p, *lead, *consts, bodies=tuple(bodies), spec=spec))


# --- scipy_quad -------------------------------------------------------------------------------

_TIGHT = (("epsabs", 1e-11), ("epsrel", 1e-11))


def _quad_spec_vec(body):
    return ("quad_vec", _TIGHT, tuple(tuple(a.shape) for a in body.out_avals))


def _quad_vjp_for(i):
    def rule(g, out, *ops, body, spec):
        n_int = len(out) - 1
        gs = list(g[:n_int])
        if all(gi is None for gi in gs):
            return None
        gs = [zeros_like_value(o) if gi is None else gi for gi, o in zip(gs, out[:n_int])]
        a, b, consts = ops[0], ops[1], list(ops[2:])
        if i < 2:           # Leibniz: +f(b) db, -f(a) da
            f_at = eval_body(body, [ops[i]] + consts)
            s = None
            for fo, gi in zip(f_at, gs):
                term = _sum(mul(fo, gi))
                s = term if s is None else add(s, term)
            return s if i == 1 else neg(s)
        j = i - 2
        if not is_float(aval_of(consts[j]).dtype):
            return None
        vb = _memo(body, ("quad_vjp", j), lambda: _need("vjp_body")(body, (1 + j,)))
        xa = body.in_avals[0]
        k_av = list(body.in_avals[1:])
        g_av = [aval_of(v) for v in gs]

        def integrand(x, *kg):
            kg = list(kg)
            return tuple(eval_body(vb, [x] + kg[:len(k_av)] + kg[len(k_av):]))
        ib = _memo(body, ("quad_vjp_integrand", j, tuple(g_av)),
                   lambda: _trace(integrand, [xa] + k_av + g_av)[0])
        return bind(scipy_quad_p, a, b, *consts, *gs, body=ib, spec=_quad_spec_vec(ib))[0]
    return rule


def _quad_jvp(tangents, out, *ops, body, spec):
    n_int = len(out) - 1
    a, b, consts = ops[0], ops[1], list(ops[2:])
    tk = list(tangents[2:])
    fk = tuple(j for j in _float_consts(consts) if tk[j] is not None)
    total = [None] * n_int
    if fk:
        jb = _memo(body, ("quad_jvp", fk),
                   lambda: _need("jvp_body")(body, tuple(1 + j for j in fk)))
        xa = body.in_avals[0]
        k_av = list(body.in_avals[1:])
        t_av = [k_av[j] for j in fk]

        def integrand(x, *kt):
            kt = list(kt)
            return tuple(eval_body(jb, [x] + kt)[n_int:])
        ib = _memo(body, ("quad_jvp_integrand", fk),
                   lambda: _trace(integrand, [xa] + k_av + t_av)[0])
        r = bind(scipy_quad_p, a, b, *consts, *[tk[j] for j in fk], body=ib,
                 spec=_quad_spec_vec(ib))
        total = list(r[:n_int])
    for pos, sign in ((1, 1.0), (0, -1.0)):
        t = tangents[pos]
        if t is None:
            continue
        f_at = eval_body(body, [ops[pos]] + consts)
        for k in range(n_int):
            term = mul(f_at[k], t if sign > 0 else neg(t))
            total[k] = term if total[k] is None else add(total[k], term)
    return tuple(total) + (None,)


def _quad_shape(*avals, body, spec):
    f64 = np.dtype(np.float64)
    return tuple(Aval(tuple(a.shape), f64) for a in body.out_avals) + (Aval((), f64),)


def _quad_impl(xp, *ops, body, spec):
    return _sp_quad(spec, (_runner(body),), *ops)


scipy_quad_p = register(
    "scipy_quad", _quad_impl, shape=_quad_shape,
    vjp=tuple(_quad_vjp_for(i) for i in range(_N_MAX_OPS)), jvp=_quad_jvp,
    numpy=_emitter("_sp_quad"), helpers=("_sp_quad",),
    n_out=lambda body, spec: len(body.outputs) + 1, save_out=True,
    doc="scipy.integrate.quad / quad_vec of a traced integrand over [a, b]; derivatives: "
        "the integral of the integrand's derivative body (this row again) and Leibniz's rule.")


def quad_call(a, b, consts, body, opts):
    """Bind ``scipy_quad`` for ``quad``: returns (value, abserr)."""
    return list(bind(scipy_quad_p, a, b, *consts, body=body, spec=("quad", tuple(opts), ((),))))


# --- scipy_ode --------------------------------------------------------------------------------

_GROUP_MAX = 64     # sensitivities of operands of at most this many elements in all: one system


def _sens_body(body, group):
    """The augmented right-hand side (z; vec S) -> (f; f_z S + f_k) for the
    sensitivities S = dz/d(group) (``group``: 'z0' and const indices), one
    column per element of each operand in the group, in order."""
    def make():
        z_av, t_av = body.in_avals[0], body.in_avals[1]
        k_av = list(body.in_avals[2:])
        m = _size(z_av.shape)
        ks = [w for w in group if w != "z0"]
        sizes = [m if w == "z0" else _size(k_av[w].shape) for w in group]
        q = sum(sizes)
        jb = _need("jvp_body")(body, (0,) + tuple(2 + w for w in ks))
        # the tangents of the consts in the group, column by column: a basis
        # vector of the column's own operand, zeros for the others
        cols_k = []
        for w, n in zip(group, sizes):
            for e in range(n):
                cols_k.append([(_basis(n, k_av[c].shape, k_av[c].dtype)[e] if c == w else
                                np.zeros(k_av[c].shape, k_av[c].dtype)) for c in ks])

        vb = _need("vjp_body")(body, (0,) + tuple(2 + w for w in ks)) if m < q else None
        f_av = body.out_avals[0]

        def aug(zs, t, *k):
            z = zs[:m]
            S = reshape(zs[m:], (m, q))
            if vb is None:      # q tangents (columns): f_z S + f_k column by column
                cols = [[S[:, j]] + cols_k[j] for j in range(q)]
                f = reshape(eval_body(jb, [z, t] + list(k) + cols[0])[0], (m,))
                dS = transpose(reshape(_columns(jb, [z, t] + list(k), cols, 1), (q, m)),
                               (1, 0))
            else:               # fewer states than columns: m rows [f_z | f_k] by vjps
                from tracegrad.ops.shape import stack
                E = _basis(m, f_av.shape, f_av.dtype)
                rows = [eval_body(vb, [z, t] + list(k) + [E[i]]) for i in range(m)]
                f = reshape(eval_body(body, [z, t] + list(k))[0], (m,))
                fz = reshape(stack([r[0] for r in rows], axis=0), (m, m))
                blocks = []
                for w, n in zip(group, sizes):
                    if w == "z0":
                        blocks.append(np.zeros((m, n), z_av.dtype))
                    else:
                        j = 1 + ks.index(w)
                        blocks.append(reshape(stack([r[j] for r in rows], axis=0), (m, n)))
                fk = concatenate(blocks, axis=1) if len(blocks) > 1 else blocks[0]
                dS = add(matmul(fz, S), fk)
            return (concatenate([f, reshape(dS, (m * q,))], axis=0),)
        return _trace(aug, [Aval((m + m * q,), z_av.dtype), t_av] + k_av)[0], m, sizes
    return _memo(body, ("ode_sens", group), make)


def _group(ops, nl, i):
    """The operands whose sensitivities are integrated with operand i's:
    z0 and every float const, when they are small together, else i alone."""
    def key(j):
        return "z0" if j == 0 else j - 1 - nl
    cands = [0] + [j for j in range(1 + nl, len(ops)) if is_float(aval_of(ops[j]).dtype)]
    if sum(_size(aval_of(ops[j]).shape) for j in cands) <= _GROUP_MAX and i in cands:
        return tuple(key(j) for j in cands)
    return (key(i),)


def _ode_sens(out, ops, body, spec, i):
    """S(t) = dz(t)/d(operand i), (T, m, size), from the augmented system of its group."""
    nl = len(spec[1])
    z0 = ops[0]
    consts = list(ops[1 + nl:])
    group = _group(ops, nl, i)
    sb, m, sizes = _sens_body(body, group)
    q = sum(sizes)
    S0 = np.zeros((m, q))
    at = 0
    for w, n in zip(group, sizes):
        if w == "z0":
            S0[:, at:at + n] = np.eye(m)
        at += n
    zs0 = concatenate([reshape(z0, (m,)), S0.reshape(-1).astype(aval_of(z0).dtype)], axis=0)
    Z = bind(scipy_ode_p, zs0, *ops[1:1 + nl], *consts, body=sb, spec=spec)
    T = aval_of(out).shape[0]
    me = "z0" if i == 0 else i - 1 - nl
    at = sum(sizes[:group.index(me)])
    n = sizes[group.index(me)]
    return reshape(Z[:, m + 0:], (T, m, q))[:, :, at:at + n], n


def _ode_time_parts(out, ops, body, spec):
    """F (T, m) = f(Y_k, t_k) at the output times (a scan of the right-hand
    side's body over them), f0 = f(z0, t_start), and S_z0 (T, m, m)."""
    names = spec[1]
    nl = len(names)
    consts = list(ops[1 + nl:])
    times = ops[1 + names.index("t" if "t" in names else "t_eval")]
    t_start = times[0] if "t" in names else ops[1 + names.index("t0")]
    T, m = aval_of(out).shape
    F = bind(_scan_p, out, times, *consts, body=body, length=T, n_carry=0, n_xs=2, start=None,
             reverse=False)[0]
    f0 = reshape(eval_body(body, [ops[0], t_start] + consts)[0], (m,))
    S0, _ = _ode_sens(out, ops, body, spec, 0)
    return F, f0, S0, T


def _ode_time_vjp(g, out, ops, body, spec, name):
    """Moving an output time t_k moves Y_k by f(Y_k, t_k); moving the start
    moves every Y_k by -S_z0(k) f(z0, t_start); the end of a span with t_eval
    moves nothing."""
    if name == "t1":
        return zeros_like_value(ops[1 + spec[1].index("t1")])
    F, f0, S0, T = _ode_time_parts(out, ops, body, spec)
    ct_z0 = _sum(mul(S0, reshape(g, tuple(g.shape) + (1,))), axis=(0, 1))
    start = neg(_sum(mul(ct_z0, f0)))
    if name == "t0":
        return start
    ct = _sum(mul(g, F), axis=1)
    if name == "t":         # odeint: t[0] is the start too
        ct = add(ct, mul(np.eye(T)[0], start))
    return ct


def _ode_time_jvp(tangents, out, ops, body, spec):
    names = spec[1]
    total = None
    parts = None
    for name, t in zip(names, tangents[1:1 + len(names)]):
        if t is None or name == "t1":
            continue
        if parts is None:
            parts = _ode_time_parts(out, ops, body, spec)
        F, f0, S0, T = parts
        moved = neg(_sum(mul(S0, reshape(f0, (1, 1, -1))), axis=2))     # dY/dt_start
        if name == "t0":
            c = mul(moved, t)
        else:
            c = mul(F, reshape(t, (T, 1)))
            if name == "t":
                c = add(c, mul(moved, t[0]))
        total = c if total is None else add(total, c)
    return total


def _ode_vjp_for(i):
    def rule(g, out, *ops, body, spec):
        nl = len(spec[1])
        if 1 <= i <= nl:
            return _ode_time_vjp(g, out, ops, body, spec, spec[1][i - 1])
        if i > 0 and not is_float(aval_of(ops[i]).dtype):
            return None
        S, q = _ode_sens(out, ops, body, spec, i)
        ct = _sum(mul(S, reshape(g, tuple(g.shape) + (1,))), axis=(0, 1))
        return reshape(ct, tuple(aval_of(ops[i]).shape))
    return rule


def _ode_jvp(tangents, out, *ops, body, spec):
    nl = len(spec[1])
    total = _ode_time_jvp(tangents, out, ops, body, spec)
    for i, t in enumerate(tangents):
        if t is None or (i > 0 and i <= nl):
            continue
        S, q = _ode_sens(out, ops, body, spec, i)
        c = _sum(mul(S, reshape(t, (1, 1, q))), axis=2)
        total = c if total is None else add(total, c)
    return total


def _ode_shape(*avals, body, spec):
    z0 = avals[0]
    names = spec[1]
    tpos = names.index("t") if "t" in names else names.index("t_eval")
    T = _size(avals[1 + tpos].shape)
    return Aval((T, _size(z0.shape)), np.dtype(np.float64))


def _ode_impl(xp, *ops, body, spec):
    return _sp_ode(spec, (_runner(body),), *ops)


scipy_ode_p = register(
    "scipy_ode", _ode_impl, shape=_ode_shape,
    vjp=tuple(_ode_vjp_for(i) for i in range(_N_MAX_OPS)), jvp=_ode_jvp,
    numpy=_emitter("_sp_ode"), helpers=("_sp_ode",), save_out=True,
    doc="scipy.integrate.odeint / solve_ivp of a traced right-hand side; derivatives by "
        "forward sensitivities, integrated by this row over the augmented system.")


def ode_call(name, z0, times, time_names, consts, body, opts):
    """Bind ``scipy_ode``: Z (len(t), len(z0))."""
    spec = (name, tuple(time_names), tuple(opts))
    if 1 + len(times) + len(consts) > _N_MAX_OPS:
        raise NotImplementedError(f"scipy.integrate.{name}: the right-hand side reads more "
                                  f"than {_N_MAX_OPS - 1 - len(times)} traced values")
    return bind(scipy_ode_p, z0, *times, *consts, body=body, spec=spec)


# --- a value whose derivative is refused by name ------------------------------------------------

def _refuse(what, instead):
    raise NotImplementedError(f"the derivative of {what} is not implemented by tracegrad; "
                              f"{instead}")


def _refuse_rule(*args, what, instead):
    _refuse(what, instead)


no_derivative_p = register(
    "no_derivative", lambda xp, x, *deps, what, instead: x,
    shape=lambda x, *deps, what, instead: Aval(tuple(x.shape), x.dtype),
    vjp=tuple(_refuse_rule for _ in range(_N_MAX_OPS)),
    jvp=tuple(_refuse_rule for _ in range(_N_MAX_OPS)), numpy="{0}",
    doc="x, a value that depends on the operands after it, whose derivative is not "
        "implemented: differentiating through it raises an error naming it.")


def no_derivative(x, deps, what, instead):
    """``x`` (a plain array) as a value depending on ``deps`` whose derivative
    raises an error naming ``what`` (never a silently zero gradient)."""
    deps = list(deps)[:_N_MAX_OPS - 1]
    return bind(no_derivative_p, np.asarray(x), *deps, what=str(what), instead=str(instead))
