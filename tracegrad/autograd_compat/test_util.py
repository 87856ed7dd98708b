"""``autograd.test_util``: ``check_grads``, ``check_vjp(f, x)``,
``check_jvp(f, x)``, ``check_equivalent``, ``combo_check``: derivatives
against central finite differences along random directions, with
autograd's tolerances (absolute or relative 1e-6, step 1e-6)."""
from __future__ import annotations

from itertools import product

import numpy as onp

from tracegrad.autograd_compat.differential_operators import make_vjp, make_jvp, _plain_tree
from tracegrad.autograd_compat.misc.flatten import flatten

__all__ = ["check_grads", "check_vjp", "check_jvp", "check_equivalent", "combo_check",
           "scalar_close"]

TOL = 1e-6
RTOL = 1e-6
EPS = 1e-6
_rng = onp.random.default_rng(0)


def scalar_close(a, b):
    return abs(a - b) < TOL or abs(a - b) / abs(a + b) < RTOL


def _flat(v):
    return onp.asarray(flatten(_plain_tree(v))[0], dtype=float)


def _select(args, argnum):
    return tuple(args[a] for a in argnum) if isinstance(argnum, tuple) else args[argnum]


def _with(args, argnum, x):
    args = list(args)
    if isinstance(argnum, tuple):
        for a, v in zip(argnum, x):
            args[a] = v
    else:
        args[argnum] = x
    return args


def _numerical_jvp(f, args, kwargs, argnum):
    x = _select(args, argnum)
    fx, unflatten = flatten(x)

    def jvp(v):
        v = _flat(v)
        hi = f(*_with(args, argnum, unflatten(onp.asarray(fx) + EPS / 2 * v)), **kwargs)
        lo = f(*_with(args, argnum, unflatten(onp.asarray(fx) - EPS / 2 * v)), **kwargs)
        return (_flat(hi) - _flat(lo)) / EPS
    return jvp


def _randn_like(x):
    fx, unflatten = flatten(_plain_tree(x))
    return unflatten(_rng.standard_normal(onp.shape(fx)))


def _check_vjp(f, args, kwargs, argnum):
    vjp, y = make_vjp(f, argnum)(*args, **kwargs)
    x = _select(args, argnum)
    x_v, y_v = _randn_like(x), _randn_like(y)
    vjp_y = vjp(y_v)
    exact = float(_flat(x_v) @ _flat(vjp_y))
    numeric = float(_flat(y_v) @ _numerical_jvp(f, args, kwargs, argnum)(x_v))
    assert scalar_close(numeric, exact), \
        (f"derivative (VJP) check of {getattr(f, '__name__', 'f')} failed with arg {x}:\n"
         f"analytic: {exact}\nnumeric:  {numeric}")


def _check_jvp(f, args, kwargs, argnum):
    x = _select(args, argnum)
    x_v = _randn_like(x)
    got = _flat(make_jvp(f, argnum)(*args, **kwargs)(x_v)[1])
    want = _numerical_jvp(f, args, kwargs, argnum)(x_v)
    ok = onp.allclose(got, want, rtol=RTOL * 10, atol=TOL * 10)
    assert ok, (f"derivative (JVP) check of {getattr(f, '__name__', 'f')} failed with arg "
                f"{x}:\nanalytic: {got}\nnumeric:  {want}")


def check_vjp(f, x):
    """autograd's ``check_vjp(f, x)``: the reverse derivative of f at x
    against finite differences along a random direction."""
    _check_vjp(f, (x,), {}, 0)


def check_jvp(f, x):
    """autograd's ``check_jvp(f, x)``: the forward derivative of f at x
    against finite differences along a random direction."""
    _check_jvp(f, (x,), {}, 0)


def check_equivalent(x, y):
    """Same structure and shapes, and the same values along a random
    direction (autograd's tolerances)."""
    fx, fy = _flat(x), _flat(y)
    assert fx.shape == fy.shape, f"shape mismatch:\nx: {fx.shape}\ny: {fy.shape}"
    v = _rng.standard_normal(fx.shape)
    assert scalar_close(float(fx @ v), float(fy @ v)), f"Value mismatch:\nx: {x}\ny: {y}"


def combo_check(fun, *args, **kwargs):
    """``combo_check(fun, argnum, modes=..., order=...)(arg_choices..., kw=choices)``:
    check_grads over every combination of the listed argument values."""
    def _combo_check(*arg_lists, **kwarg_lists):
        kv = [[(k, x) for x in xs] for k, xs in kwarg_lists.items()]
        for _args in product(*arg_lists):
            for _kwargs in product(*kv):
                check_grads(fun, *args, **kwargs)(*_args, **dict(_kwargs))
    return _combo_check


def check_grads(f, argnum=0, modes=("fwd", "rev"), order=2):
    """``check_grads(f, modes=['fwd', 'rev'], order=2)(*args)``: forward and
    reverse derivatives of f w.r.t. argument ``argnum`` against finite
    differences, and (order > 1) the derivatives of those derivatives.
    Raises AssertionError naming the function and both numbers."""
    if not (isinstance(argnum, int) or (isinstance(argnum, tuple)
                                        and all(isinstance(a, int) for a in argnum))):
        raise TypeError(f"check_grads(f, argnum=0, modes=..., order=...)(*args): argnum must "
                        f"be an int or a tuple of ints, got {type(argnum).__name__} (the form "
                        f"check_grads(f, x) is autograd 1.1's; write check_grads(f)(x))")
    modes = list(modes)
    if not all(m in ("fwd", "rev") for m in modes):
        raise ValueError(f"modes must be a subset of ['fwd', 'rev'], got {modes}")

    def check(*args, **kwargs):
        x = _select(args, argnum)
        if "fwd" in modes:
            _check_jvp(f, args, kwargs, argnum)
            if order > 1:
                def jvp_f(x_, v):
                    return make_jvp(f, argnum)(*_with(args, argnum, x_), **kwargs)(v)[1]
                jvp_f.__name__ = f"jvp_{getattr(f, '__name__', 'f')}"
                check_grads(jvp_f, (0, 1), modes, order - 1)(x, _randn_like(x))
        if "rev" in modes:
            _check_vjp(f, args, kwargs, argnum)
            if order > 1:
                def vjp_f(x_, v):
                    return make_vjp(f, argnum)(*_with(args, argnum, x_), **kwargs)[0](v)
                vjp_f.__name__ = f"vjp_{getattr(f, '__name__', 'f')}"
                y = f(*args, **kwargs)
                check_grads(vjp_f, (0, 1), modes, order - 1)(x, _randn_like(y))
    return check
