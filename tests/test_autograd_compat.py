"""tracegrad.autograd_compat: HIPS autograd's names and conventions on
tracegrad.  Expected numbers come from the mathematics (closed-form
derivatives) or from NumPy, never from running autograd.  Each operator is
checked on the compiled path and on the eager path (mode="eager"), and
autograd-style programs (its tanh, logistic regression and fixed-point
examples, re-typed) run through both."""
from __future__ import annotations

import os
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path

import numpy as onp
import pytest

import tracegrad as tg
import tracegrad.autograd_compat as autograd
import tracegrad.autograd_compat.numpy as np
import tracegrad.autograd_compat.numpy.random as npr
from tracegrad.autograd_compat import (grad, value_and_grad, elementwise_grad, jacobian, hessian,
                                       hessian_tensor_product, hessian_vector_product, make_hvp,
                                       make_vjp, make_jvp, make_ggnvp, holomorphic_grad,
                                       grad_named, multigrad_dict, grad_and_aux, deriv,
                                       tensor_jacobian_product)
from tracegrad.autograd_compat.extend import primitive, defvjp, defjvp, defvjp_argnum
from tracegrad.autograd_compat.misc import flatten, flatten_func, fixed_point
from tracegrad.autograd_compat.misc.optimizers import adam, sgd, rmsprop
from tracegrad.autograd_compat.test_util import (check_grads, check_vjp, check_jvp,
                                                 check_equivalent, combo_check)

MODES = ["compiled", "eager"]
X = onp.array([0.3, -0.7, 1.1])


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACEGRAD_CACHE_DIR", str(tmp_path / "cache"))


def close(a, b, tol=1e-10):
    onp.testing.assert_allclose(onp.asarray(a, dtype=float), onp.asarray(b, dtype=float),
                                rtol=tol, atol=tol)


def sumsin2(x):
    return np.sum(np.sin(x) ** 2)


# --- the differential operators, both paths -----------------------------------------------

@pytest.mark.parametrize("mode", MODES)
def test_grad_and_argnum(mode):
    g = grad(sumsin2, mode=mode)
    close(g(X), onp.sin(2 * X))                          # d/dx sin^2 = sin 2x
    ga, gb = grad(lambda a, b: np.sum(a * b ** 2), argnum=(0, 1), mode=mode)(X, 2 * X)
    close(ga, 4 * X ** 2)
    close(gb, 4 * X * X)
    close(grad(lambda a, b: np.sum(a * b ** 2), 1, mode=mode)(X, 2 * X), 4 * X * X)
    # a scalar in, a scalar out; a one-element array out counts as a scalar
    close(grad(np.tanh, mode=mode)(0.5), 1 - onp.tanh(0.5) ** 2)
    close(grad(lambda x: np.sin(x) * 2.0, mode=mode)(onp.array([0.3])), [2 * onp.cos(0.3)])
    # structured arguments: the gradient has the argument's structure
    gd = grad(lambda p: np.sum(p["w"] ** 2) + p["b"][0] * 3.0, mode=mode)(
        {"w": X, "b": [0.5]})
    close(gd["w"], 2 * X)
    close(gd["b"][0], 3.0)


@pytest.mark.parametrize("mode", MODES)
def test_grad_refuses_what_autograd_refuses(mode):
    with pytest.raises(TypeError):
        grad(np.sin, mode=mode)(X)                       # not a scalar output
    with pytest.raises(TypeError, match="floating-point"):
        grad(lambda x: x * 2.0, mode=mode)(3)            # an integer input
    with pytest.raises(TypeError, match="complex"):
        holomorphic_grad(lambda z: z ** 2)(1.0 + 1.0j)
    for op in (grad, jacobian, make_vjp, make_jvp):           # refused, not misread
        with pytest.raises(TypeError, match="complex"):
            op(lambda z: np.sum(np.abs(z) ** 2), mode=mode)(onp.array([1.0 + 1.0j]))


@pytest.mark.parametrize("mode", MODES)
def test_value_and_grad_and_aux(mode):
    v, g = value_and_grad(sumsin2, mode=mode)(X)
    close(v, onp.sum(onp.sin(X) ** 2))
    close(g, onp.sin(2 * X))
    g, aux = grad_and_aux(lambda x: (np.sum(x ** 3), x * 2.0), mode=mode)(X)
    close(g, 3 * X ** 2)
    close(aux, 2 * X)


@pytest.mark.parametrize("mode", MODES)
def test_elementwise_grad_and_jacobian(mode):
    close(elementwise_grad(np.tanh, mode=mode)(X), 1 - onp.tanh(X) ** 2)
    A = onp.arange(6.0).reshape(2, 3) / 5
    J = jacobian(lambda x: np.tanh(A @ x), mode=mode)(X)
    close(J, (1 - onp.tanh(A @ X) ** 2)[:, None] * A)
    assert J.shape == (2, 3)
    close(jacobian(lambda x: x ** 2, mode=mode)(0.5), 1.0)
    close(deriv(np.sin, mode=mode)(0.4), onp.cos(0.4))


@pytest.mark.parametrize("mode", MODES)
def test_tuple_argnum_of_value_and_grad_and_jacobian(mode):
    v, (ga, gb) = value_and_grad(lambda a, b: np.sum(a * b ** 2), argnum=(0, 1),
                                 mode=mode)(X, 2 * X)
    close(v, onp.sum(4 * X ** 3))
    close(ga, 4 * X ** 2)
    close(gb, 4 * X * X)
    # d(a * b^2)/da = diag(b^2), d/db = diag(2ab): one block per argument
    Ja, Jb = jacobian(lambda a, b: a * b ** 2, argnum=(0, 1), mode=mode)(X, 2 * X)
    close(Ja, onp.diag(4 * X ** 2))
    close(Jb, onp.diag(4 * X * X))


@pytest.mark.parametrize("mode", MODES)
def test_hessian_and_products(mode):
    H = onp.diag(2 * onp.cos(2 * X))                     # of sum(sin^2)
    close(hessian(sumsin2, mode=mode)(X), H)
    v = onp.array([1.0, -2.0, 0.5])
    close(hessian_vector_product(sumsin2, mode=mode)(X, v), H @ v)
    assert hessian_tensor_product is hessian_vector_product
    hvp, g = make_hvp(sumsin2, mode=mode)(X)
    close(g, onp.sin(2 * X))
    close(hvp(v), H @ v)
    # the Hessian of a quadratic form in a second argument
    Q = onp.array([[2.0, 0.5], [0.5, 1.0]])
    close(hessian(lambda a, x: 0.5 * x @ Q @ x * a, 1, mode=mode)(3.0, onp.ones(2)), 3 * Q)
    with pytest.raises(TypeError, match="one argnum"):
        hessian(sumsin2, (0, 1))


@pytest.mark.parametrize("mode", MODES)
def test_make_vjp_make_jvp(mode):
    vjp, ans = make_vjp(np.sin, mode=mode)(X)
    close(ans, onp.sin(X))
    u = onp.array([1.0, 2.0, 3.0])
    close(vjp(u), u * onp.cos(X))
    vjp, ans = make_vjp(lambda a, b: a * np.exp(b), argnum=(0, 1), mode=mode)(X, -X)
    ga, gb = vjp(u)
    close(ga, u * onp.exp(-X))
    close(gb, u * X * onp.exp(-X))
    ans, t = make_jvp(lambda x, s: np.sin(x) * s, mode=mode)(X, 2.0)(u)
    close(ans, 2 * onp.sin(X))
    close(t, 2 * u * onp.cos(X))
    A = onp.array([[1.0, 2.0, 0.0], [0.0, 1.0, -1.0]])
    close(tensor_jacobian_product(lambda x: A @ x, mode=mode)(X, onp.array([1.0, 1.0])),
          A.sum(0))


def test_make_ggnvp():
    # f(x) = A x, g = 0.5 ||y||^2: the GGN is A^T A
    A = onp.array([[1.0, 2.0, 0.0], [0.0, 1.0, -1.0]])
    v = onp.array([1.0, -1.0, 2.0])
    close(make_ggnvp(lambda x: A @ x)(X)(v), A.T @ A @ v)


@pytest.mark.parametrize("mode", MODES)
def test_grad_named_and_multigrad_dict(mode):
    def f(x, y, z=2.0):
        return np.sum(x * y) * z
    close(grad_named(f, "y", mode=mode)(X, 2 * X), X * 2.0)          # x * z
    d = multigrad_dict(f, mode=mode)(X, 2 * X)
    assert isinstance(d, OrderedDict) and list(d) == ["x", "y", "z"]
    close(d["x"], 2 * X * 2.0)                                           # y * z
    close(d["y"], X * 2.0)
    close(d["z"], onp.sum(2 * X * X))
    with pytest.raises(TypeError, match="no argument 'w'"):
        grad_named(f, "w")


# --- compiled where it traces, eager where values steer -------------------------------------

def halve_until_small(x):
    while np.sum(x ** 2) > 0.1:                # value-dependent loop
        x = x / 2.0
    return np.sum(x ** 3)


def halve_and_keep(x):
    kept = []
    while np.sum(x ** 2) > 0.1:                # value-dependent, with a list of steps
        x = x / 2.0
        kept.append(x)
    return np.sum(x ** 3) + 0.0 * len(kept)


def test_auto_mode_falls_back_to_eager_and_stays_right():
    # a while loop on values compiles into a while node (issue 25)
    g = grad(halve_until_small)
    # ||X||^2 = 1.79: three halvings reach 0.028, so f = sum(x^3) / 512
    close(g(X), 3 * X ** 2 / 512)
    assert g.went_eager is None
    close(g(X / 4), 3 * (X / 4) ** 2 / 8)      # one halving, the same compiled code
    close(grad(halve_until_small, mode="compiled")(X), 3 * X ** 2 / 512)
    # one that appends to a list cannot be a graph node: auto goes eager
    g = grad(halve_and_keep)
    close(g(X), 3 * X ** 2 / 512)
    assert isinstance(g.went_eager, tg.TraceError)
    close(g(X / 4), 3 * (X / 4) ** 2 / 8)
    with pytest.raises(tg.TraceError, match="kept.append"):
        grad(halve_and_keep, mode="compiled")(X)
    ok = grad(sumsin2)
    ok(X)
    assert ok.went_eager is None               # traced: compiled


def test_nested_operators_with_value_dependent_code():
    def g2(x):
        if x > 0:
            return x ** 3
        return -x
    close(grad(grad(g2))(0.5), 3.0)            # d2/dx2 x^3 = 6x
    close(grad(grad(g2))(-0.5), 0.0)
    close(jacobian(jacobian(g2))(0.5), 3.0)
    # a compiled inner gradient inside an eager outer one, and the reverse
    close(grad(lambda x: grad(sumsin2)(x)[0] * (1.0 if float(x[0]) > 0 else 2.0))(X),
          [2 * onp.cos(2 * X[0]), 0, 0])
    close(elementwise_grad(elementwise_grad(np.tanh))(X),
          -2 * onp.tanh(X) * (1 - onp.tanh(X) ** 2))


def test_set_mode():
    before = autograd.get_mode()
    try:
        autograd.set_mode("eager")
        g = grad(sumsin2)
        assert g.mode == "eager"
        close(g(X), onp.sin(2 * X))
        with pytest.raises(ValueError):
            autograd.set_mode("fast")
    finally:
        autograd.set_mode(before)


def test_static_arguments_of_any_type():
    def f(x, how, scale=None):
        y = np.sin(x) if how == "sin" else np.cos(x)
        return np.sum(y) * (1.0 if scale is None else scale)
    g = grad(f)
    close(g(X, "sin"), onp.cos(X))
    close(g(X, "cos", scale=2.0), -2 * onp.sin(X))
    assert g.went_eager is None


def test_number_arguments_are_traced():
    """An iteration counter does not retrace; range() over a number goes
    eager, and fixing the number with functools.partial compiles."""
    import functools

    def objective(p, t):
        return np.sum(p ** 2) * (1.0 + 0.5 * t)
    g = grad(objective)
    g(X, 0)
    before = tg.cache_info()["traces"]
    for t in range(1, 4):
        close(g(X, t), 2 * X * (1.0 + 0.5 * t))
    assert tg.cache_info()["traces"] == before and g.went_eager is None

    def loop(x, n):
        s = 0.0
        for i in range(n):
            s = s + np.sum(x) * i
        return s
    g = grad(loop)
    close(g(X, 3), onp.full(3, 3.0))                 # 0 + 1 + 2
    assert isinstance(g.went_eager, tg.TraceError)
    g = grad(functools.partial(loop, n=3))
    close(g(X), onp.full(3, 3.0))
    assert g.went_eager is None


# --- primitive / defvjp / defjvp -------------------------------------------------------------

@primitive
def logsumexp(x):
    """autograd's tutorial primitive."""
    max_x = np.max(x)
    return max_x + np.log(np.sum(np.exp(x - max_x)))


def logsumexp_vjp(ans, x):
    x_shape = x.shape
    return lambda g: np.full(x_shape, g) * np.exp(x - np.full(x_shape, ans))


defvjp(logsumexp, logsumexp_vjp)


@primitive
def cube_via_python(x):
    """A body only plain arrays can run (it converts and loops in Python)."""
    return onp.array([float(v) ** 3 for v in onp.asarray(x)])


defvjp(cube_via_python, lambda ans, x: lambda g: g * 3 * x ** 2)


@primitive
def scaled(x, s):
    return x * s


defjvp(scaled, lambda g, ans, x, s: g * s, lambda g, ans, x, s: g * x)


@primitive
def mul2(a, b):
    return a * b


defvjp_argnum(mul2, lambda argnum, ans, args, kwargs:
              (lambda g: g * args[1 - argnum]))


@pytest.mark.parametrize("mode", MODES)
def test_primitive_defvjp(mode):
    p = onp.exp(X) / onp.exp(X).sum()
    g = grad(lambda x: logsumexp(x) * 2.0, mode=mode)
    close(g(X), 2 * p)
    if mode == "compiled":
        assert g.went_eager is None            # the body traced, the rule is the vjp
    # the vjp is written with the numpy module, so it differentiates again
    close(hessian(logsumexp, mode=mode)(X), onp.diag(p) - onp.outer(p, p))
    close(logsumexp(X), onp.log(onp.exp(X).sum()))      # a plain call: the function itself
    g = grad(lambda x: np.sum(cube_via_python(x)), mode=mode)
    if mode == "compiled":
        # a conversion of the traced value (np.asarray, float()) is refused
        with pytest.raises(tg.TraceError, match=r"float\(\) requested|conversion to a NumPy"):
            g(X)
        g = grad(lambda x: np.sum(cube_via_python(x)))           # auto: goes eager
    close(g(X), 3 * X ** 2)
    close(grad(lambda a, b: np.sum(mul2(a, b)), (0, 1), mode=mode)(X, 2 * X)[1], X)


def test_primitive_rules_missing_or_derived():
    @primitive
    def only_first(a, b):
        return a * b
    defvjp(only_first, lambda ans, a, b: lambda g: g * b)
    close(grad(lambda a, b: np.sum(only_first(a, b)))(X, 2 * X), 2 * X)
    with pytest.raises(NotImplementedError, match="VJP of only_first wrt argnum 1"):
        grad(lambda a, b: np.sum(only_first(a, b)), 1, mode="eager")(X, 2 * X)
    # only jvps given: the vjp is their transpose (eager)
    gx, gs = grad(lambda x, s: np.sum(scaled(x, s)), (0, 1))(X, 3.0)
    close(gx, onp.full(3, 3.0))
    close(gs, X.sum())
    with pytest.raises(TypeError, match="@primitive"):
        defvjp(onp.sin, None)


@primitive
def round_ste(x):
    """A straight-through round: the body's derivative is 0, the rule's 1."""
    return np.round(x)


defvjp(round_ste, lambda ans, x: lambda g: g)


@primitive
def mul_jvp_only(a, b):
    return a * b


defjvp(mul_jvp_only, lambda g, ans, a, b: g * b, "same")


@pytest.mark.parametrize("mode", ["compiled", "eager", "auto"])
def test_forward_mode_uses_the_rules_not_the_body(mode):
    """autograd differentiates a primitive by its rules in both directions;
    the body's own derivative (here 0) must never leak into forward mode."""
    x = onp.array([0.3, -0.7, 1.6])
    want = onp.round(x) + x                    # d/dx (round_ste(x) * x), straight through
    close(grad(lambda v: np.sum(round_ste(v) * v), mode=mode)(x), want)
    ans, t = make_jvp(lambda v: round_ste(v) * v, mode=mode)(x)(onp.ones(3))
    close(ans, onp.round(x) * x)
    close(t, want)
    # a tuple output, and deriv (forward mode along ones)
    (a1, a2), (t1, t2) = make_jvp(lambda v: (round_ste(v), v * 2.0), mode=mode)(x)(
        onp.array([1.0, 2.0, 3.0]))
    close(a1, onp.round(x))
    close(t1, [1.0, 2.0, 3.0])
    close(t2, [2.0, 4.0, 6.0])
    close(deriv(lambda v: round_ste(v) * v, mode=mode)(1.6), 2.0 + 1.6)
    # forward over reverse through a rule written with np: H v of logsumexp
    p = onp.exp(X) / onp.exp(X).sum()
    u = onp.array([1.0, 2.0, 3.0])
    close(make_jvp(grad(logsumexp, mode=mode), mode=mode)(X)(u)[1],
          (onp.diag(p) - onp.outer(p, p)) @ u)
    close(make_ggnvp(lambda v: round_ste(v) * 2.0, mode=mode)(x)(u), 4 * u)


@pytest.mark.parametrize("mode", ["compiled", "eager"])
def test_jvp_only_primitive_in_compiled_and_eager_code(mode):
    """defjvp alone: the vjp is the rule transposed, in compiled code too."""
    g = grad(lambda a, b: np.sum(mul_jvp_only(a, b) ** 2), (0, 1), mode=mode)
    ga, gb = g(X, 2 * X)
    close(ga, 2 * (2 * X ** 2) * 2 * X)        # d/da (ab)^2 = 2ab * b
    close(gb, 2 * (2 * X ** 2) * X)
    if mode == "compiled":
        assert g.went_eager is None
    _, t = make_jvp(lambda b: mul_jvp_only(X, b), mode=mode)(2 * X)(onp.ones(3))
    close(t, X)


def test_primitive_inside_tracegrads_own_transforms():
    """A primitive is a tracegrad custom Function: tg.grad, tg.compile and
    tg.hessian (compiled) use its rule."""
    x = onp.array([0.3, -0.7, 1.6])
    close(tg.grad(lambda v: np.sum(round_ste(v) * v))(x), onp.round(x) + x)
    close(tg.compile(lambda v: np.sum(round_ste(v)))(x), onp.sum(onp.round(x)))
    # d2/dv2 of logsumexp through its rule written with np: diag(p) - p p^T
    p = onp.exp(X) / onp.exp(X).sum()
    close(tg.hessian(logsumexp)(X), onp.diag(p) - onp.outer(p, p))


# --- misc ------------------------------------------------------------------------------------

def test_flatten_and_flatten_func():
    val = {"b": [onp.ones((2, 2)), 3.0], "a": onp.array([1.0, 2.0])}
    flat, unflatten = flatten(val)
    close(flat, [1, 2, 1, 1, 1, 1, 3])                  # dict keys sorted
    back = unflatten(flat)
    close(back["a"], val["a"])
    close(back["b"][0], val["b"][0])
    assert back["b"][1] == 3.0
    # unflatten is differentiable
    close(grad(lambda v: np.sum(unflatten(v)["b"][0] ** 2))(flat), [0, 0, 2, 2, 2, 2, 0])
    f, unf, ex = flatten_func(lambda p, k: {"w": p["a"] * k}, val)
    close(f(ex, 2.0), [2.0, 4.0])
    with pytest.raises(ValueError, match="length 7"):
        unflatten(onp.ones(3))


def _quadratic(params, i):
    return np.sum((params["a"] - 3.0) ** 2) + np.sum((params["b"] + 1.0) ** 2)


@pytest.mark.parametrize("opt,kw", [(adam, dict(step_size=0.1, num_iters=400)),
                                    (sgd, dict(step_size=0.1, num_iters=400)),
                                    (rmsprop, dict(step_size=0.05, num_iters=400))])
def test_optimizers(opt, kw):
    seen = []

    def callback(x, i, g):
        seen.append((i, sorted(x), sorted(g)))
    x0 = {"a": onp.zeros(2), "b": onp.ones(3)}
    out = opt(grad(_quadratic), x0, callback=callback, **kw)
    close(out["a"], [3, 3], tol=2e-2)
    close(out["b"], [-1, -1, -1], tol=2e-2)
    assert seen[0] == (0, ["a", "b"], ["a", "b"]) and len(seen) == kw["num_iters"]


def test_optimizer_callback_sees_the_gradient_at_x():
    for opt in (adam, sgd, rmsprop):
        seen = []

        def callback(x, i, g):
            close(g["a"], 2 * (x["a"] - 3.0))
            close(g["b"], 2 * (x["b"] + 1.0))
            seen.append(i)
        opt(grad(_quadratic), {"a": onp.zeros(2), "b": onp.ones(3)}, callback=callback,
            num_iters=3)
        assert seen == [0, 1, 2]


def test_sgd_and_rmsprop_steps_match_the_formulas():
    g = onp.array([2.0, -4.0])

    def const(x, i):
        return g
    # sgd: v1 = -(1 - mass) g, x1 = x0 + step v1; v2 = mass v1 - (1 - mass) g
    v1 = -(1 - 0.9) * g
    v2 = 0.9 * v1 - (1 - 0.9) * g
    close(sgd(const, onp.zeros(2), num_iters=2, step_size=0.5), 0.5 * v1 + 0.5 * v2,
          tol=1e-14)
    # rmsprop: avg = gamma * 1 + (1 - gamma) g^2, x1 = -step g / (sqrt(avg) + eps)
    avg = 0.9 + 0.1 * g ** 2
    close(rmsprop(const, onp.zeros(2), num_iters=1, step_size=0.5),
          -0.5 * g / (onp.sqrt(avg) + 1e-8), tol=1e-14)


def test_adam_first_steps_match_the_formula():
    # one step of adam from x0 moves by step_size * sign(g) (bias-corrected)
    out = adam(lambda x, i: onp.array([2.0, -4.0]), onp.array([0.0, 0.0]), num_iters=1,
               step_size=0.5)
    close(out, [-0.5, 0.5], tol=1e-7)


def newton_sqrt_iter(a):
    return lambda x: 0.5 * (x + a / x)


def distance(x, y):
    return np.abs(x - y)


def sqrt(a, guess=10.0):
    return fixed_point(newton_sqrt_iter, a, guess, distance, 1e-8)


@pytest.mark.parametrize("mode", ["auto", "eager"])
def test_fixed_point(mode):
    """autograd's fixed_points example: Newton iterations for sqrt, and its
    derivative 1 / (2 sqrt(a)) by the implicit function theorem."""
    close(sqrt(2.0), onp.sqrt(2.0))
    with pytest.raises(tg.TraceError):        # the iteration steers by values
        grad(sqrt, mode="compiled")(2.0)
    close(grad(sqrt, mode=mode)(2.0), 0.5 / onp.sqrt(2.0), tol=1e-8)
    close(grad(lambda a: sqrt(a) * a, mode=mode)(3.0), 1.5 * onp.sqrt(3.0), tol=1e-8)


# --- test_util ------------------------------------------------------------------------------

def test_check_grads():
    check_grads(np.sin, modes=["fwd", "rev"], order=2)(X)
    check_grads(lambda a, b: np.sum(np.tanh(a) * b), modes=["rev"], order=2)(X, 2 * X)
    check_grads(logsumexp)(X)                             # fwd and rev, order 2
    check_grads(mul_jvp_only, argnum=(0, 1))(X, 2 * X)

    @primitive
    def wrong(x):
        return x ** 2
    defvjp(wrong, lambda ans, x: lambda g: g * 3 * x)     # should be 2x
    with pytest.raises(AssertionError, match="VJP"):
        check_grads(wrong, modes=["rev"], order=1)(X)
    with pytest.raises(AssertionError, match="JVP"):         # forward mode uses the rule too
        check_grads(wrong, modes=["fwd"], order=1)(X)
    with pytest.raises(ValueError):
        check_grads(np.sin, modes=["backwards"])(X)
    # autograd's one-argument helpers
    check_vjp(np.tanh, X)
    check_jvp(np.tanh, X)
    with pytest.raises(AssertionError, match="VJP"):
        check_vjp(wrong, X)
    with pytest.raises(AssertionError):
        check_jvp(wrong, X)
    check_equivalent((X, {"a": 2.0}), (X.copy(), {"a": 2.0}))
    with pytest.raises(AssertionError, match="Value mismatch"):
        check_equivalent(X, X + 1e-3)

    def power(x, k=2.0):
        return x ** k
    combo_check(power, 0, modes=["rev"], order=1)([X, 2 * X], k=[2.0, 3.0])
    # every combination is checked: the wrong rule is caught at the second x
    with pytest.raises(AssertionError, match="VJP"):
        combo_check(lambda x, s: wrong(x) * s, 0, modes=["rev"], order=1)(
            [onp.zeros(3), X], [1.0])
    with pytest.raises(TypeError, match="check_grads\\(f\\)\\(x\\)"):
        check_grads(np.sin, X)


# --- the namespaces ---------------------------------------------------------------------------

def test_numpy_and_scipy_namespaces():
    import tracegrad.autograd_compat.scipy.stats.norm as norm
    from tracegrad.autograd_compat.scipy.stats import multivariate_normal as mvn
    from tracegrad.autograd_compat.scipy.special import gammaln, logsumexp as lse
    from tracegrad.autograd_compat.scipy.misc import logsumexp as lse2
    assert np.linalg.solve is onp.linalg.solve and npr.randn is onp.random.randn
    assert np.fft.fft is onp.fft.fft and np.pi == onp.pi
    close(np.array([1.0, 2.0]), [1.0, 2.0])
    # array() of a list of differentiated values, through the compat namespace
    close(grad(lambda x: np.sum(np.array([x[0] * x[1], np.sin(x[2])]) ** 2))(X),
          [2 * X[0] * X[1] ** 2, 2 * X[0] ** 2 * X[1], 2 * onp.sin(X[2]) * onp.cos(X[2])])
    close(grad(lambda m: np.sum(norm.logpdf(X, m, 2.0)))(0.5), onp.sum(X - 0.5) / 4)
    close(grad(lambda m: mvn.logpdf(X, m, onp.eye(3)))(onp.zeros(3)), X)
    close(grad(lambda x: np.sum(gammaln(x)))(onp.array([1.0, 2.0])),
          [-0.5772156649015329, 1 - 0.5772156649015329])
    assert lse is lse2
    # one import line: `import tracegrad.autograd_compat as autograd` reaches every name
    assert autograd.misc.optimizers.adam is adam and autograd.misc.fixed_point is fixed_point
    assert autograd.extend.defvjp is defvjp and autograd.test_util.check_grads is check_grads
    assert autograd.scipy.stats.norm.logpdf is norm.logpdf and autograd.numpy.sin is onp.sin
    assert autograd.primitive is primitive and autograd.make_jvp is make_jvp


@pytest.mark.parametrize("mode", MODES)
def test_numpy_namespace_builds_arrays_of_differentiated_values(mode):
    """What plain NumPy cannot dispatch (it converts first) stays
    differentiable through the compat namespace, compiled and eager."""
    cases = [  # (function, its gradient at X from the calculus)
        (lambda x: np.sum(np.asarray(x) ** 2), 2 * X),
        (lambda x: np.sum(np.array([x[0], 2.0, x[1] * x[2]]) ** 2),
         [2 * X[0], 2 * X[1] * X[2] ** 2, 2 * X[1] ** 2 * X[2]]),
        (lambda x: np.sum(np.r_[x, x[0] * 3.0, 5.0]), [4.0, 1.0, 1.0]),
        (lambda x: np.sum(np.c_[x, 2.0 * x] ** 2), 10 * X),
        (lambda x: np.sum(np.concatenate([x, x ** 2])), 1 + 2 * X),
        (lambda x: np.sum(np.stack([x[0], x[2]]) * 2.0), [2.0, 0.0, 2.0]),
        (lambda x: np.sum(np.full((2, 2), x[1]) * x[0]), [4 * X[1], 4 * X[0], 0.0]),
    ]
    for f, want in cases:
        close(grad(f, mode=mode)(X), want)


def test_python_numbers_from_values_go_the_eager_way():
    """float(x) and x.item() need a value: auto runs them eagerly, where a
    value being differentiated is refused (the number would silently cut the
    gradient, issue 24) and a detached one is a constant; compiled refuses
    clearly."""
    def f(x):
        return x[0] * float(x[1]) + x[2] * x[1].item()
    with pytest.raises(TypeError, match="float\\(\\) of a value being differentiated"):
        grad(f)(X)

    def f_detached(x):
        return x[0] * float(x[1].detach()) + x[2] * x[1].detach().item()
    g = grad(f_detached)
    close(g(X), [X[1], 0.0, X[1]])
    assert isinstance(g.went_eager, tg.TraceError)
    with pytest.raises(tg.TraceError, match="float"):
        grad(f, mode="compiled")(X)


def test_item_assignment_compiles_and_setitem_too():
    """autograd refuses y[i] = v; tracegrad gives it NumPy's meaning, views
    included, compiled and eagerly; tg.setitem is the functional spelling."""
    def assign(x):
        y = x * 1.0
        y[0] = 2 * y[0]
        v = y[1:]                              # a write through a view
        v[0] = 3.0 * x[2]
        return np.sum(y ** 2)
    # y = (2 x0, 3 x2, x2): d/dx = (8 x0, 0, 18 x2 + 2 x2)
    want = [8 * X[0], 0.0, 20 * X[2]]
    g = grad(assign)
    close(g(X), want)
    close(grad(assign, mode="compiled")(X), want)
    close(grad(assign, mode="eager")(X), want)

    def with_setitem(x):
        y = tg.setitem(x * 1.0, 0, 2 * x[0])
        y = tg.setitem(y, 1, 3.0 * x[2])
        return np.sum(y ** 2)
    g = grad(with_setitem, mode="compiled")
    close(g(X), want)


# --- autograd-style programs ----------------------------------------------------------------

def _logistic_program(mode):
    """autograd's README logistic regression, re-typed."""
    def sigmoid(x):
        return 0.5 * (np.tanh(x / 2.0) + 1)

    def logistic_predictions(weights, inputs):
        return sigmoid(np.dot(inputs, weights))

    inputs = np.array([[0.52, 1.12, 0.77], [0.88, -1.08, 0.15], [0.52, 0.06, -1.30],
                       [0.74, -2.49, 1.39]])
    targets = np.array([True, True, False, True])

    def training_loss(weights):
        preds = logistic_predictions(weights, inputs)
        label_probabilities = preds * targets + (1 - preds) * (1 - targets)
        return -np.sum(np.log(label_probabilities))

    training_gradient_fun = grad(training_loss, mode=mode)
    weights = np.array([0.0, 0.0, 0.0])
    first = training_loss(weights)
    for i in range(100):
        weights -= training_gradient_fun(weights) * 0.01
    # the gradient at 0 from the closed form: -X^T (t - 1/2)
    g0 = training_gradient_fun(onp.zeros(3))
    close(g0, -inputs.T @ (targets - 0.5))
    return first, training_loss(weights), weights


def test_logistic_regression_program_compiled_equals_eager():
    f_c, l_c, w_c = _logistic_program("compiled")
    f_e, l_e, w_e = _logistic_program("eager")
    close(f_c, 4 * onp.log(2.0))
    assert l_c < f_c / 2
    close(w_c, w_e, tol=1e-12)
    close(l_c, l_e, tol=1e-12)


def test_tanh_derivatives_program():
    """autograd's tanh example: elementwise_grad four times over."""
    def tanh(x):
        y = np.exp(-2.0 * x)
        return (1.0 - y) / (1.0 + y)
    x = np.linspace(-2, 2, 9)
    t = onp.tanh(x)
    d1 = elementwise_grad(tanh)
    d2 = elementwise_grad(d1)
    d3 = elementwise_grad(d2)
    close(d1(x), 1 - t ** 2)
    close(d2(x), -2 * t * (1 - t ** 2))
    close(d3(x), (1 - t ** 2) * (6 * t ** 2 - 2), tol=1e-9)
    d3e = elementwise_grad(elementwise_grad(elementwise_grad(tanh, mode="eager"), mode="eager"),
                           mode="eager")
    close(d3e(x), d3(x), tol=1e-12)


def test_gaussian_process_example_runs(tmp_path):
    path = Path(__file__).resolve().parent.parent / "examples" / "gaussian_process_autograd.py"
    env = dict(os.environ, TRACEGRAD_CACHE_DIR=str(tmp_path / "cache"))
    r = subprocess.run([sys.executable, str(path), "--small"], env=env, capture_output=True,
                       text=True, timeout=120, cwd=str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    import re
    ls = [float(v) for v in re.findall(r"loss\s+(-?[0-9.]+)", r.stdout)]
    assert len(ls) >= 3 and ls[-1] < ls[0] - 20
    assert "(compiled: True)" in r.stdout


def test_gaussian_process_example_objective_against_scipy():
    """The example's log marginal likelihood is SciPy's multivariate normal
    log density of the data, and its compiled gradient matches central
    differences of that SciPy value."""
    import importlib.util
    ss = pytest.importorskip("scipy.stats")
    path = Path(__file__).resolve().parent.parent / "examples" / "gaussian_process_autograd.py"
    spec = importlib.util.spec_from_file_location("gp_example", path)
    gp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gp)
    _, _, lml = gp.make_gp_funs(gp.rbf_covariance, num_cov_params=2)
    x, y = gp.build_toy_dataset(D=1, n_data=20)

    def scipy_lml(p):
        d = (x[:, None, :] - x[None, :, :]) / onp.exp(p[3])
        K = onp.exp(p[2]) * onp.exp(-0.5 * onp.sum(d ** 2, axis=2))
        K = K + (onp.exp(p[1]) + 0.0001) * onp.eye(len(y))
        return ss.multivariate_normal.logpdf(y, p[0] * onp.ones(len(y)), K)
    params = onp.array([0.1, -1.0, 0.2, -0.3])
    v, g = value_and_grad(lambda p: lml(p, x, y), mode="compiled")(params)
    close(v, scipy_lml(params), tol=1e-9)
    eps = 1e-6
    fd = [(scipy_lml(params + eps * e) - scipy_lml(params - eps * e)) / (2 * eps)
          for e in onp.eye(4)]
    close(g, fd, tol=1e-5)


def test_editing_a_primitive_rule_changes_the_compiled_key():
    """The generated code of a primitive is cached on disk, keyed by the code
    of its body and rules: a new rule must never be served the old gradient."""
    from tracegrad.frontend.code_deps import fingerprint as _source_hash

    @primitive
    def sq(x):
        return x * x
    defvjp(sq, lambda ans, x: lambda g: g * 2.0 * x)
    before = _source_hash(sq._function)
    G = grad(lambda x: np.sum(sq(x)))
    close(G(X), 2 * X)
    defvjp(sq, lambda ans, x: lambda g: g * 3.0 * x)      # a different (wrong) rule
    assert _source_hash(sq._function) != before
    close(G(X), 3 * X)                       # the new rule, not the code built with the old
