"""tracegrad.func: torch.func's transforms on the compiler.  Expected values
come from the mathematics; the last section compares with torch.func itself
and skips without torch."""
import numpy as np
import pytest

import tracegrad as tg
from tracegrad import func as F

RNG = np.random.default_rng(16)



def T(a):
    return tg.tensor(np.asarray(a, dtype=np.float64))


def close(a, b, tol=1e-10):
    a = a.numpy() if hasattr(a, "grad_fn") else np.asarray(a)
    np.testing.assert_allclose(a, np.asarray(b), rtol=tol, atol=tol)


X = RNG.standard_normal(4)
Y = RNG.standard_normal(4)


def sinx(x):
    return (x.sin() * x).sum()


# --- grad / grad_and_value -------------------------------------------------------------

def test_reachable_as_tracegrad_func():
    assert tg.func.grad is F.grad and tg.func.vmap is F.vmap


def test_grad_tensor_in_tensor_out_and_ndarray_in_ndarray_out():
    g = F.grad(sinx)(T(X))
    assert isinstance(g, tg.Tensor) and g.dtype == np.float64
    close(g, np.sin(X) + X * np.cos(X))
    ga = F.grad(lambda x: np.sum(np.sin(x) * x))(X)
    assert type(ga) is np.ndarray
    close(ga, np.sin(X) + X * np.cos(X))


def test_grad_keeps_float32():
    g = F.grad(lambda x: (x * x).sum())(tg.tensor(X, dtype=tg.float32))
    assert g.dtype == np.float32
    close(g, 2 * X.astype(np.float32), 1e-6)


def test_grad_argnums_tuple_and_has_aux():
    def f(x, y):
        return (x * y ** 2).sum(), {"y2": y ** 2}
    g, aux = F.grad(f, argnums=(0, 1), has_aux=True)(T(X), T(Y))
    assert isinstance(g, tuple) and len(g) == 2
    close(g[0], Y ** 2)
    close(g[1], 2 * X * Y)
    assert set(aux) == {"y2"}
    close(aux["y2"], Y ** 2)
    g1 = F.grad(lambda x, y: (x * y ** 2).sum(), argnums=1)(T(X), T(Y))
    close(g1, 2 * X * Y)


def test_grad_and_value_structures():
    g, v = F.grad_and_value(sinx)(T(X))
    close(g, np.sin(X) + X * np.cos(X))
    close(v, np.sum(np.sin(X) * X))
    g, (v, aux) = F.grad_and_value(lambda x: ((x ** 2).sum(), x * 3), has_aux=True)(T(X))
    close(g, 2 * X)
    close(v, np.sum(X ** 2))
    close(aux, 3 * X)
    (gx, gy), v = F.grad_and_value(lambda x, y: (x * y).sum(), argnums=(0, 1))(T(X), T(Y))
    close(gx, Y)
    close(gy, X)
    close(v, X @ Y)


def test_grad_errors_are_clear():
    with pytest.raises(TypeError, match="scalar"):
        F.grad(lambda x: x * 2)(T(X))
    with pytest.raises(TypeError, match=r"0-d.*shape \(1,\)"):   # torch refuses one element too
        F.grad(lambda x: x.sum(dim=0, keepdim=True))(T(X))
    with pytest.raises(TypeError, match="0-d"):
        F.grad_and_value(lambda x: (x * 2, x), has_aux=True)(T(X))
    with pytest.raises(TypeError, match="has_aux=True"):
        F.grad(lambda x: (x.sum(), x))(T(X))
    with pytest.raises(TypeError, match="argnums must be an int or a tuple"):
        F.grad(sinx, argnums=[0])
    with pytest.raises(TypeError, match="expected a function"):
        F.grad(3)
    with pytest.raises(TypeError, match="floating-point"):
        F.jacrev(lambda x: x * 2)(tg.arange(3))


# --- vjp / jvp -------------------------------------------------------------------------

def test_vjp_returns_output_and_a_tuple_of_cotangents():
    out, vjp_fn = F.vjp(lambda x: x.sin() * 2, T(X))
    close(out, 2 * np.sin(X))
    ct = vjp_fn(T(Y))
    assert isinstance(ct, tuple) and len(ct) == 1 and isinstance(ct[0], tg.Tensor)
    close(ct[0], 2 * np.cos(X) * Y)


def test_vjp_two_primals_tuple_output_and_aux():
    def f(x, y):
        return (x * y, x.exp()), {"n": x.sum()}
    out, vjp_fn, aux = F.vjp(f, T(X), T(Y), has_aux=True)
    close(out[0], X * Y)
    close(out[1], np.exp(X))
    close(aux["n"], X.sum())
    u, w = RNG.standard_normal(4), RNG.standard_normal(4)
    gx, gy = vjp_fn((T(u), T(w)))
    close(gx, u * Y + w * np.exp(X))
    close(gy, u * X)


def test_vjp_fn_checks_the_cotangent():
    _, vjp_fn = F.vjp(lambda x: x * 2, T(X))
    with pytest.raises(ValueError, match="cotangent of shape"):
        vjp_fn(T(np.ones(5)))
    with pytest.raises(ValueError, match="structure"):
        vjp_fn((T(X), T(X)))


def test_jvp_and_has_aux():
    out, t = F.jvp(lambda x, y: x * y.sin(), (T(X), T(Y)), (T(Y), T(X)))
    close(out, X * np.sin(Y))
    close(t, Y * np.sin(Y) + X * np.cos(Y) * X)
    out, t, aux = F.jvp(lambda x: (x.exp(), x * 2), (T(X),), (T(np.ones(4)),), has_aux=True)
    close(out, np.exp(X))
    close(t, np.exp(X))
    close(aux, 2 * X)


def test_jvp_errors():
    with pytest.raises(TypeError, match="primals to be a tuple"):
        F.jvp(lambda x: x, T(X), T(X))
    with pytest.raises(ValueError, match="same structure"):
        F.jvp(lambda x, y: x, (T(X), T(X)), (T(X),))
    with pytest.raises(ValueError, match="tangent of shape"):
        F.jvp(lambda x: x, (T(X),), (T(np.ones(3)),))


# --- Jacobians and Hessians ------------------------------------------------------------

def jac_f(x):
    return x.sin() * x.sum()


def jac_expected(x):
    return np.diag(np.cos(x)) * x.sum() + np.sin(x)[:, None]


@pytest.mark.parametrize("jac", [F.jacrev, F.jacfwd])
def test_jacobians(jac):
    close(jac(jac_f)(T(X)), jac_expected(X))
    jx, jy = jac(lambda x, y: x * y, argnums=(0, 1))(T(X), T(Y))
    close(jx, np.diag(Y))
    close(jy, np.diag(X))
    (a, b) = jac(lambda x: (x.exp(), x * 2))(T(X))        # one block per output
    close(a, np.diag(np.exp(X)))
    close(b, 2 * np.eye(4))
    J, aux = jac(lambda x: (jac_f(x), {"s": x.sum()}), has_aux=True)(T(X))
    close(J, jac_expected(X))
    close(aux["s"], X.sum())
    with pytest.raises(TypeError, match="must return a pair"):
        jac(lambda x: x, has_aux=True)(T(X))


def test_hessian_scalar_vector_and_argnums_tuple():
    close(F.hessian(lambda x: (x ** 3).sum())(T(X)), np.diag(6 * X))
    H = F.hessian(lambda x, y: (x ** 2 * y).sum(), argnums=(0, 1))(T(X), T(Y))
    close(H[0][0], np.diag(2 * Y))
    close(H[0][1], np.diag(2 * X))
    close(H[1][0], np.diag(2 * X))
    close(H[1][1], np.zeros((4, 4)))
    Hv = F.hessian(lambda x: x ** 3)(T(X))          # a vector output: out + in + in
    expected = np.zeros((4, 4, 4))
    expected[np.arange(4), np.arange(4), np.arange(4)] = 6 * X
    close(Hv, expected)


# --- nesting -------------------------------------------------------------------------

def test_grad_of_grad_and_jacrev_of_jacrev():
    d2 = F.grad(F.grad(lambda x: (x ** 3).sum()))
    close(d2(T(2.0)), 12.0)
    close(F.jacrev(F.jacrev(lambda x: (x ** 3).sum()))(T(X)), np.diag(6 * X))
    close(F.jacfwd(F.jacrev(jac_f))(T(X)), F.jacrev(F.jacrev(jac_f))(T(X)))


def test_hvp_and_vhp_as_the_torch_func_tutorial_writes_them():
    f = lambda x: x.sin().sum()                 # Hessian: diag(-sin x)
    _, hv = F.jvp(F.grad(f), (T(X),), (T(Y),))   # forward-over-reverse
    close(hv, -np.sin(X) * Y)
    _, vjp_fn = F.vjp(F.grad(f), T(X))           # reverse-over-reverse
    close(vjp_fn(T(Y))[0], -np.sin(X) * Y)
    W0 = RNG.standard_normal((4, 4))
    J = F.vmap(F.jacrev(lambda w, x: (w @ x).tanh(), argnums=1), in_dims=(None, 0))(
        T(W0), T(np.stack([X, Y])))
    for b, xb in enumerate((X, Y)):
        close(J[b], (1 - np.tanh(W0 @ xb) ** 2)[:, None] * W0)


def test_per_sample_gradients_vmap_of_grad():
    w, xs, ys = RNG.standard_normal(3), RNG.standard_normal((5, 3)), RNG.standard_normal(5)

    def loss(w, x, y):
        return ((x * w).sum() - y) ** 2

    g = F.vmap(F.grad(loss), in_dims=(None, 0, 0))(T(w), T(xs), T(ys))
    expected = 2 * (xs @ w - ys)[:, None] * xs
    close(g, expected)
    g2 = F.vmap(F.grad(loss), in_dims=(None, 0, 0))(T(w), T(xs), T(ys))   # cached
    close(g2, expected)


def test_grad_of_vmap_and_vmap_of_vjp_rows():
    close(F.grad(lambda x: F.vmap(lambda r: r.sin())(x).sum())(T(X)), np.cos(X))
    _, vjp_fn = F.vjp(lambda x: x.sin() * 2, T(X))
    (J,) = F.vmap(vjp_fn)(T(np.eye(4)))
    close(J, np.diag(2 * np.cos(X)))


def test_a_closure_over_an_enclosing_transform_is_a_clear_error():
    xs = T(M)
    with pytest.raises(tg.TraceError, match="Pass that value as an argument"):
        F.grad(lambda w: F.vmap(lambda x: (x * w).sum())(xs).sum())(T(Y[:3]))
    g = F.grad(lambda w: F.vmap(lambda x, w: (x * w).sum(), in_dims=(0, None))(xs, w).sum())
    close(g(T(Y[:3])), M.sum(0))


def test_vmap_result_on_the_tape():
    x = tg.tensor(X, requires_grad=True)
    F.vmap(lambda r: r.exp())(x).sum().backward()
    close(x.grad, np.exp(X))


# --- vmap ------------------------------------------------------------------------------

M = RNG.standard_normal((2, 3))


def test_vmap_in_dims():
    close(F.vmap(lambda r: r.sum())(T(M)), M.sum(1))
    close(F.vmap(lambda c: c.sum(), in_dims=1)(T(M)), M.sum(0))
    close(F.vmap(lambda c: c.sum(), in_dims=-1)(T(M)), M.sum(0))
    close(F.vmap(lambda r, v: r * v, in_dims=(0, None))(T(M), T(Y[:3])), M * Y[:3])
    close(F.vmap(lambda r, s: r * s, in_dims=(0, None))(T(M), 2.5), 2.5 * M)
    d = {"a": T(M), "b": T(Y[:3])}
    close(F.vmap(lambda d: d["a"] * d["b"], in_dims=({"a": 0, "b": None},))(d), M * Y[:3])
    close(F.vmap(lambda d: d["a"] + d["b"], in_dims=(1,))({"a": T(M), "b": T(M * 2)}),
          (3 * M).T)
    close(F.vmap(lambda r, scale=1.0: r * scale)(T(M), scale=T(3.0)), 3 * M)


def test_vmap_out_dims_and_tuples():
    a, s = F.vmap(lambda r: (r * 2, r.sum()), out_dims=(1, 0))(T(M))
    close(a, (2 * M).T)
    close(s, M.sum(1))
    c = F.vmap(lambda r: tg.tensor(7.0), out_dims=None)(T(M))
    close(c, 7.0)


def test_nested_vmap_is_an_outer_product():
    outer = F.vmap(F.vmap(lambda a, b: a * b, in_dims=(0, None)), in_dims=(None, 0))
    close(outer(T(X), T(Y)), np.outer(Y, X))


def test_vmap_is_one_compiled_call_and_cached():
    f = F.vmap(lambda r: r.exp().sum())
    f(T(M))
    before = tg.cache_info()["traces"]
    close(f(T(M)), np.exp(M).sum(1))
    assert tg.cache_info()["traces"] == before
    g = F.vmap(f.__wrapped__)        # the same function again: the same compiled code
    g(T(M))
    assert tg.cache_info()["traces"] == before


def test_vmap_randomness():
    def noisy(x):
        return x + np.random.standard_normal(())
    with pytest.raises(RuntimeError, match="randomness error mode"):
        F.vmap(noisy)(M)
    r = F.vmap(noisy, randomness="same")(M) - M
    close(r, np.full_like(M, r[0, 0]))     # one draw for the whole batch
    with pytest.raises(NotImplementedError, match="randomness='different'"):
        F.vmap(noisy, randomness="different")
    with pytest.raises(ValueError, match="randomness must be"):
        F.vmap(noisy, randomness="sometimes")


@pytest.mark.parametrize("call, match", [
    (lambda: F.vmap(lambda x: x)(T(1.0)), "dimensionality 0"),
    (lambda: F.vmap(lambda x, y: x + y)(T(X), T(np.ones(3))), r"sizes \[4, 3\]"),
    (lambda: F.vmap(lambda x: x * 2, out_dims=None)(T(X)), "out_dim is None"),
    (lambda: F.vmap(lambda x: x, in_dims=None)(T(X)), "at least one input"),
    (lambda: F.vmap(lambda x: x, in_dims=[0])(T(X)), "got list"),
    (lambda: F.vmap(lambda x: x, in_dims=(0, 0))(T(X)), "not compatible"),
    (lambda: F.vmap(lambda x, s: x * s)(T(X), 2.0), "non-Tensor arguments"),
    (lambda: F.vmap(lambda x: 2.0)(T(X)), "must only return Tensors"),
    (lambda: F.vmap(lambda x: x, in_dims=2)(T(X)), "in_dim=2"),
    (lambda: F.vmap(lambda x: x, chunk_size=0), "chunk_size"),
])
def test_vmap_errors(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()


@pytest.mark.usefixtures("numpy_target")
def test_vmap_chunk_size_gives_identical_results():
    close(F.vmap(lambda r: r.sin(), chunk_size=1)(T(M)), np.sin(M), 0)


# --- functional_call -------------------------------------------------------------------

def model(params, x):
    return (x @ params["w"] + params["b"]).tanh()


W, B, XB = RNG.standard_normal((3, 2)), RNG.standard_normal(2), RNG.standard_normal((5, 3))


def test_functional_call_and_its_gradient():
    params = {"w": T(W), "b": T(B)}
    close(F.functional_call(model, params, (T(XB),)), np.tanh(XB @ W + B))
    close(F.functional_call(model, ({"w": T(W)}, {"b": T(B)}), T(XB)), np.tanh(XB @ W + B))
    g = F.grad(lambda p, x: F.functional_call(model, p, (x,)).sum())(params, T(XB))
    assert set(g) == {"w", "b"}
    d = 1 - np.tanh(XB @ W + B) ** 2
    close(g["w"], XB.T @ d)
    close(g["b"], d.sum(0))


def test_functional_call_errors():
    class Module:
        def named_parameters(self):
            return []

        def __call__(self, x):
            return x
    with pytest.raises(TypeError, match="no nn.Module"):
        F.functional_call(Module(), {}, (T(X),))
    with pytest.raises(TypeError, match="function of a dict"):
        F.functional_call(3, {}, ())
    with pytest.raises(ValueError, match="multiple"):
        F.functional_call(model, ({"w": T(W)}, {"w": T(W)}), (T(XB),))
    with pytest.raises(ValueError, match="dict, or a tuple/list of dicts"):
        F.functional_call(model, [T(W)], (T(XB),))


# --- torch parity ----------------------------------------------------------------------

def _tt(torch, a):
    return torch.tensor(np.asarray(a, dtype=np.float64))


def _same(ours, theirs, tol=1e-10):
    """Same structure and values (Tensors compared as arrays)."""
    if isinstance(theirs, (tuple, list)):
        assert type(ours) is type(theirs) and len(ours) == len(theirs), (ours, theirs)
        for o, t in zip(ours, theirs):
            _same(o, t, tol)
    elif isinstance(theirs, dict):
        assert isinstance(ours, dict) and list(ours) == list(theirs)   # torch's order too
        for k in theirs:
            _same(ours[k], theirs[k], tol)
    else:
        assert isinstance(ours, tg.Tensor), type(ours)
        np.testing.assert_allclose(ours.numpy(), theirs.detach().numpy(), rtol=tol, atol=tol)
        assert ours.shape == tuple(theirs.shape)


def test_dict_order_numpy_face_sorted_torch_face_kept():
    """NumPy arrays: a dict's entries in sorted-key order (JAX's rule);
    Tensors: in insertion order (torch.func's)."""
    f = lambda p: np.sum(p["b"] * p["a"])
    g = tg.grad(f)({"b": X, "a": Y})
    assert list(g) == ["a", "b"] and isinstance(g["a"], np.ndarray)
    close(g["a"], X)
    g = F.grad(f)({"b": T(X), "a": T(Y)})
    assert list(g) == ["b", "a"]
    close(g["b"], Y)
    g = tg.grad(f)({"b": T(X), "a": T(Y)})   # tg.grad of Tensors: the torch face
    assert list(g) == ["b", "a"]


def test_parity_with_torch_func():
    torch = pytest.importorskip("torch")
    tf = torch.func

    def f(x, y):
        return (x.sin() * y).sum()

    def g(x, y):
        return (x * y).exp(), {"s": x.sum()}

    x, y, t = X, Y, RNG.standard_normal(4)
    both = (lambda m, *a: tuple(_tt(torch, v) if m is torch else T(v) for v in a))
    for name, run in [
        ("grad", lambda m, fn: fn.grad(f, argnums=(0, 1))(*both(m, x, y))),
        ("grad_and_value", lambda m, fn: fn.grad_and_value(
            lambda a: (f(a, a), {"a": a * 2}), has_aux=True)(*both(m, x))),
        ("vjp", lambda m, fn: fn.vjp(lambda a, b: a * b.cos(), *both(m, x, y))[1](
            both(m, t)[0])),
        ("jvp", lambda m, fn: fn.jvp(lambda a: (a.exp(), a * 3), both(m, x), both(m, t),
                                     has_aux=True)),
        ("jacrev", lambda m, fn: fn.jacrev(g, argnums=(0, 1), has_aux=True)(*both(m, x, y))),
        ("jacfwd", lambda m, fn: fn.jacfwd(lambda a: (a.sin(), a * a))(*both(m, x))),
        ("hessian", lambda m, fn: fn.hessian(f, argnums=(0, 1))(*both(m, x, y))),
        ("hessian vector", lambda m, fn: fn.hessian(lambda a: a.sin() * a)(*both(m, x))),
        ("vmap", lambda m, fn: fn.vmap(lambda r, v: (r * v, r.sum()), in_dims=(1, None),
                                       out_dims=(1, 0))(*both(m, M, Y[:2]))),
        ("per-sample grads", lambda m, fn: fn.vmap(fn.grad(f), in_dims=(0, None))(
            *both(m, M.T, Y[:2]))),
        ("nested vmap", lambda m, fn: fn.vmap(fn.vmap(lambda a, b: a * b, in_dims=(0, None)),
                                              in_dims=(None, 0))(*both(m, x, y))),
        ("grad of grad", lambda m, fn: fn.grad(fn.grad(lambda a: (a ** 3).sin()))(
            *both(m, 0.7))),
        ("dict in, dict out", lambda m, fn: (
            fn.jacrev(lambda p: p["a"].sin() * p["b"])(dict(zip("ab", both(m, x, y)))),
            fn.jacfwd(lambda a: {"s": a.sin(), "c": a.cos()})(*both(m, x)),
            fn.hessian(lambda p: (p["a"] ** 2 * p["b"]).sum())(dict(zip("ab", both(m, x, y)))),
            fn.vjp(lambda p: p["a"] * 2, dict(zip("a", both(m, x))))[1](*both(m, y)),
            fn.jvp(lambda p: p["a"] * 2, (dict(zip("a", both(m, x))),),
                   (dict(zip("a", both(m, y))),)),
            fn.vmap(lambda p: p["a"].sum(), in_dims=({"a": 1},))(dict(zip("a", both(m, M)))))),
        # a dict keeps its insertion order (torch's), in and out, nested too
        ("dict order", lambda m, fn: (
            fn.grad(lambda p: (p["b"] * p["a"]).sum())(dict(zip("ba", both(m, x, y)))),
            fn.grad(lambda p: (p["z"]["y"] * p["a"]).sum())(
                {"z": dict(zip("yx", both(m, x, y))), "a": both(m, t)[0]}),
            fn.vmap(lambda p: {"z": p["b"] * 2, "a": p["a"].sum()},
                    in_dims=({"b": 0, "a": 1},))(dict(zip("ba", both(m, M.T, M)))),
            fn.jacrev(lambda a: {"s": a.sin(), "c": {"y": a, "x": a.cos()}})(*both(m, x)))),
        # torch.func.functional_call needs an nn.Module: torch calls the function itself
        ("functional_call", lambda m, fn: fn.grad(
            lambda p, xb: (fn.functional_call(model, p, (xb,)) if m is tg else model(p, xb)
                           ).sum())(dict(zip("wb", both(m, W, B))), *both(m, XB))),
    ]:
        ours = run(tg, F)
        theirs = run(torch, tf)
        try:
            _same(ours, theirs)
        except AssertionError as e:
            raise AssertionError(f"{name}: {e}") from None
