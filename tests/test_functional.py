"""tg.autograd.functional: the reference's examples with numbers recomputed,
return structures, strict mode, create_graph, and the eager fallback."""
import numpy as np
import pytest

import tracegrad as tg
from tracegrad.autograd import functional as F


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACEGRAD_CACHE_DIR", str(tmp_path / "cache"))


def exp_reducer(x):
    return x.exp().sum(dim=1)


def exp_adder(x, y):
    return 2 * x.exp() + 3 * y


def pow_reducer(x):
    return x.pow(3).sum()


def pow_adder_reducer(x, y):
    return (2 * x.pow(2) + 3 * y.pow(2)).sum()


def adder(x, y):
    return 2 * x + 3 * y


def test_jacobian_exp_reducer():
    x = tg.rand(2, 2)
    J = F.jacobian(exp_reducer, x)
    e = np.exp(x.numpy())
    want = np.zeros((2, 2, 2))
    want[0, 0], want[1, 1] = e[0], e[1]
    np.testing.assert_allclose(J.numpy(), want, rtol=1e-12)
    assert isinstance(J, tg.Tensor) and J.shape == (2, 2, 2)


def test_jacobian_tuple_inputs_and_outputs():
    x, y = tg.rand(2), tg.rand(2)
    jx, jy = F.jacobian(exp_adder, (x, y))
    np.testing.assert_allclose(jx.numpy(), np.diag(2 * np.exp(x.numpy())))
    np.testing.assert_allclose(jy.numpy(), 3 * np.eye(2))
    both = F.jacobian(lambda a, b: (a * b, a + b), (x, y))
    assert len(both) == 2 and len(both[0]) == 2
    np.testing.assert_allclose(both[0][1].numpy(), np.diag(x.numpy()))
    np.testing.assert_allclose(both[1][0].numpy(), np.eye(2))
    single_in = F.jacobian(lambda a: (a * 2, a.sum()), x)
    assert isinstance(single_in, tuple) and single_in[1].shape == (2,)


def test_jacobian_forward_strategy_and_vectorize_agree():
    x = tg.rand(3, 2)
    a = F.jacobian(exp_reducer, x)
    b = F.jacobian(exp_reducer, x, strategy="forward-mode")
    c = F.jacobian(exp_reducer, x, vectorize=True)
    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-12)
    np.testing.assert_allclose(a.numpy(), c.numpy(), rtol=1e-12)


def test_hessian_examples():
    x = tg.rand(2, 2)
    H = F.hessian(pow_reducer, x)
    want = np.zeros((2, 2, 2, 2))
    for i in range(2):
        for j in range(2):
            want[i, j, i, j] = 6 * x.numpy()[i, j]
    np.testing.assert_allclose(H.numpy(), want, rtol=1e-12)
    (hxx, hxy), (hyx, hyy) = F.hessian(pow_adder_reducer, (tg.rand(2), tg.rand(2)))
    np.testing.assert_allclose(hxx.numpy(), 4 * np.eye(2))
    np.testing.assert_allclose(hyy.numpy(), 6 * np.eye(2))
    np.testing.assert_allclose(hxy.numpy(), np.zeros((2, 2)))
    np.testing.assert_allclose(hyx.numpy(), np.zeros((2, 2)))


def test_hessian_create_graph_is_differentiable():
    x = tg.rand(3, requires_grad=True)
    H = F.hessian(pow_reducer, x, create_graph=True)
    assert H.requires_grad
    H.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 6 * np.ones(3))


def test_vjp_examples():
    x = tg.rand(4, 4)
    out, v = F.vjp(exp_reducer, x, tg.ones(4))
    np.testing.assert_allclose(out.numpy(), np.exp(x.numpy()).sum(1))
    np.testing.assert_allclose(v.numpy(), np.exp(x.numpy()))
    assert not v.requires_grad
    out, (gx, gy) = F.vjp(adder, (tg.rand(2), tg.rand(2)), tg.ones(2))
    np.testing.assert_allclose(gx.numpy(), [2, 2])
    np.testing.assert_allclose(gy.numpy(), [3, 3])


def test_vjp_create_graph():
    x = tg.rand(4, 4, requires_grad=True)
    out, v = F.vjp(exp_reducer, x, tg.ones(4), create_graph=True)
    assert out.requires_grad and v.requires_grad
    v.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.exp(x.detach().numpy()), rtol=1e-12)


def test_jvp_uses_forward_mode_and_matches():
    x = tg.rand(4, 4)
    out, jv = F.jvp(exp_reducer, x, tg.ones(4, 4))
    np.testing.assert_allclose(jv.numpy(), np.exp(x.numpy()).sum(1), rtol=1e-12)
    # the forward-mode graph has no backward nodes
    from tracegrad.autograd.functional import _CACHE
    keys = [k for k in _CACHE if k[1] == "jvp"]
    assert keys
    src = _CACHE[keys[-1]].source()
    assert "backward of" not in src and "tangent of" in src


def test_vhp_and_hvp():
    x, v = tg.rand(3, dtype=tg.float64), tg.rand(3, dtype=tg.float64)
    f = lambda x: (x.pow(3) * x.sum()).sum()  # noqa: E731  (a non-diagonal Hessian)
    out, vh = F.vhp(f, x, v)
    out2, hv = F.hvp(f, x, v)
    H = F.hessian(f, x).numpy()
    np.testing.assert_allclose(vh.numpy(), v.numpy() @ H, rtol=1e-10)
    np.testing.assert_allclose(hv.numpy(), H @ v.numpy(), rtol=1e-10)
    np.testing.assert_allclose(out.numpy(), out2.numpy())


def test_strict_mode_errors_on_independent_input():
    with pytest.raises(RuntimeError, match="independent of input 1"):
        F.jacobian(lambda x, y: x * 2, (tg.rand(2), tg.rand(2)), strict=True)
    # not strict: zeros, the mathematical value
    _, jy = F.jacobian(lambda x, y: x * 2, (tg.rand(2), tg.rand(2)))
    np.testing.assert_allclose(jy.numpy(), np.zeros((2, 2)))


def test_argument_errors():
    with pytest.raises(TypeError, match="must be either a Tensor or a tuple of Tensors"):
        F.jacobian(exp_reducer, [1, 2])
    with pytest.raises(RuntimeError, match="v can only be None"):
        F.vjp(exp_reducer, tg.rand(2, 2))
    with pytest.raises(RuntimeError, match="invalid size"):
        F.vjp(exp_reducer, tg.rand(2, 2), tg.ones(3))
    with pytest.raises(RuntimeError, match="single Tensor"):
        F.hessian(exp_reducer, tg.rand(2, 2))


def test_untraceable_function_falls_back_to_eager():
    def f(x):
        if x.sum().item() > 0:       # value-dependent: cannot be traced
            return x.exp().sum(dim=1)
        return x.sum(dim=1)

    x = tg.rand(2, 2)
    J = F.jacobian(f, x)
    e = np.exp(x.numpy())
    np.testing.assert_allclose(J.numpy()[0, 0], e[0])
    H = F.hessian(lambda x: (x.pow(3).sum() if x.sum().item() > 0 else x.sum()), tg.rand(2))
    assert H.shape == (2, 2)
    out, jv = F.jvp(f, x, tg.ones(2, 2))
    np.testing.assert_allclose(jv.numpy(), e.sum(1), rtol=1e-12)


@pytest.mark.usefixtures("numpy_target")
def test_jacobian_is_one_compiled_call():
    """All rows in one call: the generated Jacobian has no per-row code."""
    from tracegrad.autograd.functional import _CACHE
    x = tg.rand(50)
    F.jacobian(lambda x: x.tanh() * x.sum(), x)
    src = _CACHE[[k for k in _CACHE if k[1] == "jacrev"][-1]].source()
    statements = [l for l in src.splitlines() if " = " in l and not l.strip().startswith("#")]
    assert len(statements) < 40, len(statements)
    assert "np.eye(50" in src


# --- x.data in the function: a value cut from the gradient (issue 27) ---------------

def _do_stuff(x):
    y = x * 2
    while y.data.norm() < 1000:
        y = y * 2
    return y


def test_vjp_jvp_jacobian_of_a_loop_on_y_data():
    # The Fundamentals-of-Autograd tutorial; numbers from torch 2.13.
    v = tg.tensor([0.1, 1.0, 0.0001])
    for inp, out, grad in (
            ([0.1, 0.2, 0.3], [409.6000061035156, 819.2000122070312, 1228.800048828125],
             [409.6000061035156, 4096.0, 0.40959998965263367]),
            ([1.5, -2.0, 3.0], [768.0, -1024.0, 1536.0],
             [51.20000076293945, 512.0, 0.05119999870657921]),
            ([100.0, 0.0, 0.0], [1600.0, 0.0, 0.0],
             [1.600000023841858, 16.0, 0.0015999999595806003])):
        o, g = F.vjp(_do_stuff, tg.tensor(inp), v)
        np.testing.assert_allclose(o.tolist(), out, rtol=1e-6)
        np.testing.assert_allclose(g.tolist(), grad, rtol=1e-6)
    assert F.jvp(_do_stuff, tg.tensor([1.5, -2.0, 3.0]), tg.ones(3))[1].tolist() == [512.0] * 3
    assert F.jacobian(_do_stuff, tg.tensor([0.1, 0.2, 0.3])).tolist() == \
        (np.eye(3) * 4096).tolist()


def test_data_of_a_traced_value_is_detached():
    # y.data inside the function: the value without its gradient, as torch's
    def f(x):
        return (x * x.data).sum()
    x = tg.tensor([1.0, 2.0, 3.0])
    assert F.jacobian(f, x).tolist() == [1.0, 2.0, 3.0]
    assert tg.func.grad(f)(x).tolist() == [1.0, 2.0, 3.0]
