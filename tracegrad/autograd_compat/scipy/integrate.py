"""``autograd.scipy.integrate``: ``odeint(func, y0, t, args=(), **kwargs)``,
SciPy's signature, differentiable in ``y0``, ``t`` and the arrays in ``args``
(nested tuples, lists and dicts, as autograd's ``tuple((params,))``) and in
what ``func`` closes over (each distinct value counted once, however many
ways ``func`` reaches it).

The values are SciPy's (``scipy.integrate.odeint`` on plain numbers).  The
derivative in y0 and the parameters is the one SciPy's own ``odeint``
reaches when called on differentiated values (forward sensitivities,
``tracegrad/frontend/scipy_roots.py``); autograd integrates an adjoint system
backwards instead, which gives the same derivative to the solver's tolerance.
The derivative in the time points is added here: dy(t_i)/dt_i = f(y(t_i),
t_i) for i > 0, and dy(t_i)/dt_0 = -(dy(t_i)/dy0) f(y0, t_0) (the start is
moved by shifting y0 along the flow); dy(t_0)/dt_0 = 0.

Like SciPy's ``odeint`` on differentiated values this needs values, so the
operator that differentiates it runs eagerly (``mode="auto"`` falls back to
eager for it); first derivatives only (a second derivative raises an error
naming ``odeint``).
"""
import functools
import types

import numpy as np
import scipy.integrate

from tracegrad.frontend import scipy_roots as _roots
from tracegrad.frontend.scipy_calls import stand_in_of as _stand_in_of
from tracegrad.ops.base import is_value
from tracegrad.ops.scipy_rows import first_order as _first_order

__all__ = ["odeint"]

_QUALNAME = "autograd.scipy.integrate.odeint"


def _requires_grad(v):
    return is_value(v) and bool(getattr(v, "requires_grad", False))


def _flatten(x):
    """(leaves, rebuild) of nested tuples, lists and dicts (autograd's containers)."""
    if isinstance(x, (tuple, list)):
        parts = [_flatten(v) for v in x]
        sizes = [len(p[0]) for p in parts]
        kind = type(x)

        def rebuild(leaves):
            out, at = [], 0
            for (_, rb), n in zip(parts, sizes):
                out.append(rb(leaves[at:at + n]))
                at += n
            return kind(out) if kind in (tuple, list) else kind(*out)
        return [leaf for p in parts for leaf in p[0]], rebuild
    if isinstance(x, dict):
        keys = list(x)
        leaves, rb = _flatten([x[k] for k in keys])
        return leaves, lambda ls: type(x)(zip(keys, rb(ls)))
    return [x], lambda ls: ls[0]


def _captured_values(f, out, seen, depth=0):
    """The tracegrad values a function reaches through its closure, defaults and
    bound arguments, and the containers and functions in them (any depth)."""
    if id(f) in seen or depth > 8:
        return
    seen.add(id(f))
    if is_value(f):
        out.append(f)
    elif isinstance(f, (tuple, list)):
        for v in f:
            _captured_values(v, out, seen, depth + 1)
    elif isinstance(f, dict):
        for v in f.values():
            _captured_values(v, out, seen, depth + 1)
    elif isinstance(f, functools.partial):
        _captured_values((f.func, f.args, f.keywords), out, seen, depth + 1)
    elif isinstance(f, types.FunctionType):
        cells = []
        for c in f.__closure__ or ():
            try:
                cells.append(c.cell_contents)
            except ValueError:
                pass
        _captured_values((tuple(cells), f.__defaults__ or (), f.__kwdefaults__ or {}), out,
                         seen, depth + 1)


class _Flat:
    """func with its arguments flattened: called as (y, t, *values), the distinct
    tracegrad values of the arguments and of func's closure, once each, so that
    SciPy's odeint stand-in sees every differentiated value as an argument
    exactly once (the closure's are passed only to be seen)."""

    def __init__(self, func, rebuild, leaves, values):
        self.func, self.rebuild, self.leaves = func, rebuild, leaves
        at = {id(v): i for i, v in enumerate(values)}
        self.where = [at.get(id(v)) if is_value(v) else None for v in leaves]

    def __call__(self, a0, a1, *values):
        leaves = [leaf if i is None else values[i] for leaf, i in zip(self.leaves, self.where)]
        return self.func(a0, a1, *self.rebuild(leaves))


def odeint(func, y0, t, args=(), *rest, **kwargs):
    """scipy.integrate.odeint(func, y0, t, args=(), ...), differentiable in y0,
    t, args (nested tuples, lists and dicts of arrays, as autograd's
    ``tuple((params,))``) and the arrays ``func`` closes over."""
    if not isinstance(args, tuple):
        args = (args,)
    leaves, rebuild = _flatten(args)
    seen, captured = set(), []
    _captured_values((leaves, func), captured, seen)    # distinct values, leaves first
    if not (captured or _roots._values((y0, t))):
        return scipy.integrate.odeint(func, y0, t, args, *rest, **kwargs)
    _roots._needs_values(_QUALNAME, captured + _roots._values((y0, t)))   # traced: go eager
    flat = tuple(captured)
    flat_func = _Flat(func, rebuild, leaves, flat).__call__     # a method: SciPy's stand-in
                                                                # sees the values in ``flat``
    solver = _stand_in_of(scipy.integrate.odeint)
    if not _requires_grad(t):
        if is_value(t):
            t = np.asarray(t.detach().numpy(), float)
        return solver(flat_func, y0, t, flat, *rest, **kwargs)
    if kwargs.get("tfirst"):
        rhs = lambda y, tt, *a: flat_func(tt, y, *a)      # noqa: E731
    else:
        rhs = flat_func
    plain_rhs = _roots._plain_vec(rhs)
    tp = np.asarray(t.detach().numpy(), float)
    if tp.ndim != 1:
        raise ValueError(f"{_QUALNAME}: t must be 1-d")
    y0p = np.ravel(np.asarray(y0.detach().numpy() if is_value(y0) else y0, float))
    shift = t - t.detach()                           # value 0, derivative 1 in each t_i
    f0 = np.ravel(np.asarray(plain_rhs(y0p, tp[0], *flat), float))
    # moving t_0 by dt moves the whole solution as moving y0 by -f(y0, t_0) dt
    y0_moved = y0 - _first_order(shift[0] * f0, _QUALNAME)
    Y = solver(flat_func, y0_moved, tp, flat, *rest, **kwargs)
    Yp = np.asarray(Y.detach().numpy(), float)
    F = np.stack([np.ravel(np.asarray(plain_rhs(Yp[i], tp[i], *flat), float))
                  for i in range(len(tp))])
    F[0] = f0                                       # y(t_0) = y0 whatever t_0
    return Y + _first_order(shift[:, None] * F, _QUALNAME)
