"""Forward-mode AD in eager mode: tg.autograd.forward_ad (dual_level,
make_dual, unpack_dual), tangents through the registry's jvp rules, custom
Function.jvp, and gradcheck(check_forward_ad=True)."""
import numpy as np
import pytest

import tracegrad as tg
from tracegrad.ops import primitives
from tracegrad.eager import forward_ad as fwAD
from tracegrad.eager.gradcheck import gradcheck


def _t(a, **kw):
    return tg.tensor(np.asarray(a, dtype=np.float64), **kw)


def test_tangent_of_elementwise_chain():
    xv = np.array([0.5, 1.0, 2.0])
    vv = np.array([1.0, -2.0, 0.5])
    with fwAD.dual_level():
        x = fwAD.make_dual(_t(xv), _t(vv))
        y = (x * x).sin() + x.exp() / 2
        primal, tangent = fwAD.unpack_dual(y)
    np.testing.assert_allclose(primal.numpy(), np.sin(xv ** 2) + np.exp(xv) / 2)
    np.testing.assert_allclose(tangent.numpy(), (2 * xv * np.cos(xv ** 2) + np.exp(xv) / 2) * vv)


def test_tangent_of_matmul_reductions_and_broadcasting():
    rng = np.random.default_rng(0)
    W, b, xv, vx = (rng.standard_normal(s) for s in ((3, 4), (4,), (5, 3), (5, 3)))
    with fwAD.dual_level():
        x = fwAD.make_dual(_t(xv), _t(vx))
        h = (x @ _t(W) + _t(b)).tanh()
        loss = (h ** 2).mean()
        t_h = fwAD.unpack_dual(h).tangent
        t_loss = fwAD.unpack_dual(loss).tangent
    hv = np.tanh(xv @ W + b)
    dh = (1 - hv ** 2) * (vx @ W)
    np.testing.assert_allclose(t_h.numpy(), dh)
    np.testing.assert_allclose(t_loss.item(), np.mean(2 * hv * dh))


def test_two_dual_inputs_add_their_contributions():
    with fwAD.dual_level():
        x = fwAD.make_dual(_t([2.0]), _t([1.0]))
        y = fwAD.make_dual(_t([3.0]), _t([10.0]))
        z = x * y          # dz = y dx + x dy = 3 + 20
        w = x ** y         # dw = y x^(y-1) dx + x^y log x dy
        assert fwAD.unpack_dual(z).tangent.item() == pytest.approx(23.0)
        assert fwAD.unpack_dual(w).tangent.item() == pytest.approx(3 * 4 + 8 * np.log(2) * 10)


def test_views_indexing_and_multi_output_ops():
    xv = np.arange(6.0).reshape(2, 3)
    vv = np.arange(6.0).reshape(2, 3) * 10 + 1
    with fwAD.dual_level():
        x = fwAD.make_dual(_t(xv), _t(vv))
        np.testing.assert_array_equal(fwAD.unpack_dual(x[1]).tangent.numpy(), vv[1])
        np.testing.assert_array_equal(fwAD.unpack_dual(x.t()).tangent.numpy(), vv.T)
        np.testing.assert_array_equal(fwAD.unpack_dual(x.reshape(3, 2)).tangent.numpy(),
                                      vv.reshape(3, 2))
        a, b = tg.split(x, [1, 2], dim=1)
        np.testing.assert_array_equal(fwAD.unpack_dual(b).tangent.numpy(), vv[:, 1:])
        assert fwAD.unpack_dual(x.argmax()).tangent is None   # integers carry no tangent
        np.testing.assert_array_equal(fwAD.unpack_dual(x.sum(0)).tangent.numpy(), vv.sum(0))


def test_in_place_op_carries_the_tangent():
    with fwAD.dual_level():
        x = fwAD.make_dual(_t([1.0, 2.0]), _t([1.0, 1.0]))
        y = x * 1.0
        y.mul_(x)           # y = x^2
        y += 1.0
        np.testing.assert_array_equal(fwAD.unpack_dual(y).tangent.numpy(), [2.0, 4.0])
        z = tg.zeros(2, dtype=tg.float64)
        z.add_(x)           # a plain tensor takes the tangent of what is added
        np.testing.assert_array_equal(fwAD.unpack_dual(z).tangent.numpy(), [1.0, 1.0])


def test_unpack_outside_and_plain_tensors():
    x = _t([1.0])
    assert fwAD.unpack_dual(x) == (x, None)
    with fwAD.dual_level():
        u = fwAD.unpack_dual(x)
        assert isinstance(u, fwAD.UnpackedDualTensor) and u.primal is x and u.tangent is None
        d = fwAD.make_dual(x, _t([5.0]))
        assert d is not x
        assert fwAD.unpack_dual(d.detach()).tangent is None
        y = d * 2
    # leaving the level forgets every tangent
    assert fwAD.unpack_dual(y).tangent is None and fwAD.unpack_dual(d).tangent is None
    assert fwAD.UnpackedDualTensor._fields == ("primal", "tangent")


def test_enter_exit_functions_and_nesting():
    assert fwAD.enter_dual_level() == 0
    try:
        with pytest.raises(RuntimeError, match="Nested forward mode AD is not supported"):
            fwAD.enter_dual_level()
        d = fwAD.make_dual(_t([1.0]), _t([2.0]))
        assert fwAD.unpack_dual(d * 3).tangent.item() == 6.0
    finally:
        fwAD.exit_dual_level()
    with pytest.raises(RuntimeError, match="no level"):
        fwAD.exit_dual_level()
    # no level open: the ordinary binder is back
    from tracegrad.eager.bind import eager_bind
    assert primitives._eager_bind is eager_bind


def test_make_dual_errors():
    x = _t([1.0, 2.0, 3.0])
    with pytest.raises(RuntimeError, match="no level exists, make sure to enter_dual_level"):
        fwAD.make_dual(x, _t([1.0, 1.0, 1.0]))
    with fwAD.dual_level():
        with pytest.raises(RuntimeError, match=r"Tensor is of size \[3\] while the given forward "
                                               r"gradient is of size \[2\]"):
            fwAD.make_dual(x, _t([1.0, 1.0]))
        with pytest.raises(ValueError, match="Expected tangent to be floating point"):
            fwAD.make_dual(x, tg.tensor([1, 2, 3]))
        with pytest.raises(ValueError, match="Expected primal to be floating point"):
            fwAD.make_dual(tg.tensor([1, 2, 3]), x)
        with pytest.raises(RuntimeError, match="level 3"):
            fwAD.make_dual(x, x, level=3)
        d = fwAD.make_dual(x, x)
        with pytest.raises(RuntimeError, match="already has a forward gradient"):
            fwAD.make_dual(d, x)
        # a float tangent of another precision takes the primal's dtype
        f = fwAD.make_dual(x, tg.tensor(np.ones(3, np.float32)))
        assert fwAD.unpack_dual(f).tangent.dtype == np.float64


def test_reverse_mode_through_a_tangent():
    """d/dx of the directional derivative: the tangent is recorded on the tape."""
    xv = np.array([0.5, 1.0, 2.0])
    x = _t(xv, requires_grad=True)
    with fwAD.dual_level():
        d = fwAD.make_dual(x, tg.ones(3, dtype=tg.float64))
        assert d.grad_fn.name() == "ViewBackward0"
        y = (d.sin() * d).sum()
        t = fwAD.unpack_dual(y).tangent       # sum(cos(x) x + sin(x))
        assert t.requires_grad
        t.backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * np.cos(xv) - xv * np.sin(xv))


# --- custom Functions --------------------------------------------------------------

class MulConst(tg.autograd.Function):
    @staticmethod
    def forward(ctx, x, y, k):
        ctx.save_for_forward(x, y)
        ctx.save_for_backward(x, y)
        ctx.k = k
        return x * y * k

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        return g * y * ctx.k, g * x * ctx.k, None

    @staticmethod
    def jvp(ctx, tx, ty, tk):
        assert tk is None
        x, y = ctx.saved_tensors
        return (tx * y + x * ty) * ctx.k


def test_function_jvp():
    with fwAD.dual_level():
        x = fwAD.make_dual(_t([1.0, 2.0]), _t([1.0, 0.5]))
        out = MulConst.apply(x, _t([3.0, 4.0]), 2.0)
        np.testing.assert_array_equal(fwAD.unpack_dual(out).primal.numpy(), [6.0, 16.0])
        # the input without a tangent gets zeros
        np.testing.assert_array_equal(fwAD.unpack_dual(out).tangent.numpy(), [6.0, 4.0])
        # and ops after it carry on
        np.testing.assert_array_equal(fwAD.unpack_dual(out.exp()).tangent.numpy(),
                                      np.exp([6.0, 16.0]) * [6.0, 4.0])


def test_function_jvp_torch2_style_and_backward_unchanged():
    class Square(tg.autograd.Function):
        @staticmethod
        def forward(x):
            return x * x

        @staticmethod
        def setup_context(ctx, inputs, output):
            ctx.save_for_forward(inputs[0])
            ctx.save_for_backward(inputs[0])

        @staticmethod
        def backward(ctx, g):
            x, = ctx.saved_tensors
            return 2 * g * x

        @staticmethod
        def jvp(ctx, t):
            x, = ctx.saved_tensors
            return 2 * x * t

    with fwAD.dual_level():
        x = fwAD.make_dual(_t([3.0]), _t([2.0]))
        assert fwAD.unpack_dual(Square.apply(x)).tangent.item() == 12.0
    a = _t([3.0], requires_grad=True)
    Square.apply(a).sum().backward()
    assert a.grad.item() == 6.0


def test_function_without_jvp():
    class NoJvp(tg.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2

    with fwAD.dual_level():
        assert NoJvp.apply(_t([1.0])).item() == 2.0    # no tangent: no jvp needed
        x = fwAD.make_dual(_t([1.0]), _t([1.0]))
        with pytest.raises(NotImplementedError, match="(?i)you must implement the jvp function"):
            NoJvp.apply(x)


def test_jvp_result_checked():
    class BadShape(tg.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def jvp(ctx, t):
            return t.sum()

    with fwAD.dual_level():
        x = fwAD.make_dual(_t([1.0, 2.0]), _t([1.0, 1.0]))
        with pytest.raises(RuntimeError, match="tangent of shape"):
            BadShape.apply(x)


# --- gradcheck(check_forward_ad=True) -----------------------------------------------

def test_gradcheck_forward_ad():
    rng = np.random.default_rng(1)
    x = _t(rng.uniform(0.5, 1.5, 3), requires_grad=True)
    w = _t(rng.standard_normal((3, 2)), requires_grad=True)

    def f(x, w):
        return ((x @ w).tanh() * x.sum()).exp(), (x.log() / x.sqrt()).max()

    assert gradcheck(f, (x, w), check_forward_ad=True)
    assert gradcheck(f, (x, w), check_forward_ad=True, check_backward_ad=False)


def test_gradcheck_forward_ad_catches_a_wrong_jvp():
    class WrongJvp(tg.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2

        @staticmethod
        def jvp(ctx, t):
            return t * 3

    x = _t([0.5, 1.5], requires_grad=True)
    assert gradcheck(WrongJvp.apply, (x,))
    with pytest.raises(tg.autograd.GradcheckError, match="forward mode mismatch"):
        gradcheck(WrongJvp.apply, (x,), check_forward_ad=True)
    assert not gradcheck(WrongJvp.apply, (x,), check_forward_ad=True, raise_exception=False)
    with pytest.raises(NotImplementedError, match="check_batched_forward_grad"):
        gradcheck(WrongJvp.apply, (x,), check_batched_forward_grad=True)


# Every differentiable registry op that eager Tensor code reaches with simple
# arguments: its eager tangent against finite differences (gradcheck).
_UNARY = ["exp", "log", "sin", "cos", "tan", "tanh", "sigmoid", "sqrt", "abs", "relu",
          "arcsin", "arctan", "sinh", "cosh", "log1p", "expm1", "square", "reciprocal",
          "rsqrt", "softplus", "erf"]


@pytest.mark.parametrize("name", _UNARY)
def test_unary_ops_forward_ad(name):
    fn = getattr(tg, name, None)
    if fn is None:
        pytest.skip(f"tracegrad has no tg.{name}")
    x = _t(np.random.default_rng(2).uniform(0.2, 0.8, (2, 3)), requires_grad=True)
    assert gradcheck(fn, (x,), check_forward_ad=True, check_backward_ad=False)


def test_binary_and_shape_ops_forward_ad():
    rng = np.random.default_rng(3)
    a = _t(rng.uniform(0.5, 1.5, (2, 3)), requires_grad=True)
    b = _t(rng.uniform(0.5, 1.5, (3,)), requires_grad=True)
    for f in (lambda a, b: a + b, lambda a, b: a - b, lambda a, b: a * b, lambda a, b: a / b,
              lambda a, b: a ** b, lambda a, b: tg.maximum(a, b), lambda a, b: a @ b,
              lambda a, b: tg.where(a > 1.0, a, b), lambda a, b: a.transpose(0, 1) * b[:2],
              lambda a, b: tg.cat([a.reshape(-1), b]), lambda a, b: tg.stack([a[0], b]),
              lambda a, b: a.max(1)[0] + b.prod(), lambda a, b: a.std(1) + b.var(),
              lambda a, b: a.cumsum(1), lambda a, b: a.expand(4, 2, 3).sum(0) * b):
        assert gradcheck(f, (a, b), check_forward_ad=True, check_backward_ad=False)


# --- parity with torch ---------------------------------------------------------------

def test_torch_parity_forward_ad():
    torch = pytest.importorskip("torch")
    tfw = torch.autograd.forward_ad
    rng = np.random.default_rng(4)
    xv, vv, wv = rng.uniform(0.5, 1.5, (4, 3)), rng.standard_normal((4, 3)), rng.standard_normal((3, 2))
    fs = [lambda x, w: (x @ w).tanh().sum(), lambda x, w: x.sin() * x.exp(),
          lambda x, w: (x ** 3).mean(1), lambda x, w: x.sigmoid() / x.log(),
          lambda x, w: x.softmax(1) if hasattr(x, "softmax") else x.exp() / x.exp().sum(1, keepdim=True),
          lambda x, w: x.std(0), lambda x, w: x.max(1)[0], lambda x, w: x[1:, ::2].t() @ x[1:]]
    for f in fs:
        with fwAD.dual_level():
            y = f(fwAD.make_dual(_t(xv), _t(vv)), _t(wv))
            ours = fwAD.unpack_dual(y)
        with tfw.dual_level():
            ty = f(tfw.make_dual(torch.tensor(xv), torch.tensor(vv)), torch.tensor(wv))
            theirs = tfw.unpack_dual(ty)
        np.testing.assert_allclose(ours.primal.numpy(), theirs.primal.numpy(), rtol=1e-12)
        np.testing.assert_allclose(ours.tangent.numpy(), theirs.tangent.numpy(), rtol=1e-10,
                                   atol=1e-12)
    # the same errors
    with tfw.dual_level():
        with pytest.raises(RuntimeError, match="different size"):
            tfw.make_dual(torch.zeros(3), torch.zeros(2))
    with fwAD.dual_level():
        with pytest.raises(RuntimeError, match="different size"):
            fwAD.make_dual(tg.zeros(3), tg.zeros(2))

    class TJ(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g

    with tfw.dual_level():
        with pytest.raises(NotImplementedError, match="(?i)you must implement the jvp function"):
            TJ.apply(tfw.make_dual(torch.zeros(1), torch.ones(1)))


def test_repr_and_decorator():
    with fwAD.dual_level():
        d = fwAD.make_dual(tg.tensor([1.0, 2.0]), tg.tensor([3.0, 4.0]))   # float32
        assert repr(d) == "tensor([1., 2.], tangent=tensor([3., 4.]))"
        assert repr(d * 2) == "tensor([2., 4.], tangent=tensor([6., 8.]))"

    @fwAD.dual_level()
    def directional_exp(x, v):
        return fwAD.unpack_dual(fwAD.make_dual(x, v).exp()).tangent

    np.testing.assert_allclose(directional_exp(_t([0.0, 1.0]), _t([2.0, 1.0])).numpy(),
                               [2.0, np.e])
    assert primitives._eager_bind is not fwAD._dual_bind


def test_no_level_means_the_plain_binder():
    """Forward AD costs nothing outside a level: the eager binder is the plain one."""
    from tracegrad.eager.bind import eager_bind
    assert primitives._eager_bind is eager_bind
    with fwAD.dual_level():
        assert primitives._eager_bind is fwAD._dual_bind
    assert primitives._eager_bind is eager_bind
    with pytest.raises(ZeroDivisionError):
        with fwAD.dual_level():
            1 / 0
    assert primitives._eager_bind is eager_bind


def test_unpack_dual_levels_and_arguments_as_torch():
    x = _t([1.0, 2.0])
    assert fwAD.unpack_dual(3.0) == (3.0, None)   # no level open: anything passes through
    with fwAD.dual_level():
        d = fwAD.make_dual(x, _t([1.0, 1.0]))
        # a level that is not open holds no tangent; torch answers so too
        u = fwAD.unpack_dual(d, level=1)
        assert u.primal is d and u.tangent is None
        assert fwAD.unpack_dual(d, level=0).tangent is not None
        with pytest.raises(TypeError, match="expects a Tensor"):
            fwAD.unpack_dual(3.0)


def test_tangents_flow_under_no_grad():
    """Forward AD does not depend on grad mode (torch's no_grad stops only the tape)."""
    with fwAD.dual_level():
        d = fwAD.make_dual(_t([0.0, 1.0]), _t([2.0, 3.0]))
        with tg.no_grad():
            y = d.exp() * d
        np.testing.assert_allclose(fwAD.unpack_dual(y).tangent.numpy(),
                                   np.array([1.0, 2 * np.e]) * [2.0, 3.0])


def test_a_compiled_function_passes_tangents_through():
    f = tg.compile(lambda x: np.sum(np.sin(x) * x))
    xv, tv = np.array([0.5, 1.0, 2.0]), np.array([1.0, 0.0, -1.0])
    with fwAD.dual_level():
        y = f(fwAD.make_dual(tg.tensor(xv), tg.tensor(tv)))
        tangent = fwAD.unpack_dual(y).tangent
        assert tangent is not None      # never silently dropped
        np.testing.assert_allclose(tangent.numpy(), np.sum((np.cos(xv) * xv + np.sin(xv)) * tv),
                                   rtol=1e-12)
        # a compiled derivative cannot carry them: said, not dropped
        with pytest.raises(NotImplementedError, match="dual tensors"):
            tg.grad(lambda x: np.sum(np.sin(x)))(fwAD.make_dual(tg.tensor(xv), tg.tensor(tv)))


# --- the forward-mode AD tutorial's nn.Linear and functional_call (issue 27) --------

def _linear():
    model = tg.nn.Linear(5, 5)
    with tg.no_grad():
        model.weight.copy_(tg.tensor([[0.1 * (i - j) for j in range(5)] for i in range(5)]))
        model.bias.copy_(tg.tensor([0.1, -0.2, 0.3, -0.4, 0.5]))
    return model


_INPUT = [[1.0, 2.0, 3.0, 4.0, 5.0], [0.5, -0.5, 1.5, -1.5, 2.0], [0.0, 1.0, 0.0, 1.0, 0.0]]
# torch 2.13: the tangent of Linear with every parameter's tangent 0.5
_JVP = [[8.0] * 5, [1.5] * 5, [1.5] * 5]


def test_dual_parameters_of_a_module():
    model = _linear()
    params = dict(model.named_parameters())
    with fwAD.dual_level():
        for name, p in params.items():
            delattr(model, name)
            setattr(model, name, fwAD.make_dual(p, tg.ones_like(p) * 0.5))
        out = model(tg.tensor(_INPUT))
        np.testing.assert_allclose(fwAD.unpack_dual(out).tangent.tolist(), _JVP, rtol=1e-6)


def test_functional_call_of_a_module_with_dual_parameters():
    model = _linear()
    params = dict(model.named_parameters())
    with fwAD.dual_level():
        dual = {k: fwAD.make_dual(p, tg.ones_like(p) * 0.5) for k, p in params.items()}
        out = tg.func.functional_call(model, dual, tg.tensor(_INPUT))
        np.testing.assert_allclose(fwAD.unpack_dual(out).tangent.tolist(), _JVP, rtol=1e-6)
    # the module gets its own parameters back
    assert model.weight is params["weight"] and model.bias is params["bias"]
    # torch.func.jvp over the module's parameters
    detached = {k: v.detach() for k, v in params.items()}
    tangents = {k: tg.ones_like(v) * 0.5 for k, v in params.items()}
    _, t = tg.func.jvp(lambda p: tg.func.functional_call(model, p, tg.tensor(_INPUT)),
                       (detached,), (tangents,))
    np.testing.assert_allclose(t.tolist(), _JVP, rtol=1e-6)
    # strict names the missing and unexpected keys
    with pytest.raises(RuntimeError, match="Missing key"):
        tg.func.functional_call(model, {"weight": params["weight"]}, tg.tensor(_INPUT),
                                strict=True)
