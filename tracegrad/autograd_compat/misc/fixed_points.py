"""``autograd.misc.fixed_point``: iterate to a fixed point and differentiate
through it by the implicit function theorem (the reverse pass is itself a
fixed-point iteration, not a replay of the forward iterations)."""
from __future__ import annotations

import numpy as onp

from tracegrad.autograd_compat.differential_operators import make_vjp
from tracegrad.autograd_compat.extend import primitive, defvjp

__all__ = ["fixed_point"]


@primitive
def fixed_point(f, a, x0, distance, tol):
    """x* = f(a)(x*), iterating from x0 until distance(x, x_prev) <= tol;
    differentiable in ``a``."""
    _f = f(a)
    x, x_prev = _f(x0), x0
    while distance(x, x_prev) > tol:
        x, x_prev = _f(x), x
    return x


def _fixed_point_vjp(ans, f, a, x0, distance, tol):
    vjp_x, _ = make_vjp(f(a))(ans)
    vjp_a, _ = make_vjp(lambda a_, x: f(a_)(x))(a, ans)

    def vjp(g):
        # w = g + (df/dx)^T w, by the same iteration as the forward
        w_prev = onp.zeros(onp.shape(ans)) if not hasattr(ans, "grad_fn") else ans * 0.0
        w = vjp_x(w_prev) + g
        while distance(w, w_prev) > tol:
            w, w_prev = vjp_x(w) + g, w
        return vjp_a(w)
    return vjp


defvjp(fixed_point, None, _fixed_point_vjp, None)
