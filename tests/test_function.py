"""tg.autograd.Function: custom ops with hand-written backward."""
import numpy as np
import pytest

import tracegrad as tg
from tracegrad.autograd import Function, once_differentiable
from tracegrad.eager import function as function_mod


class Exp(Function):
    # the reference's example
    @staticmethod
    def forward(ctx, i):
        result = i.exp()
        ctx.save_for_backward(result)
        return result

    @staticmethod
    def backward(ctx, grad_output):
        result, = ctx.saved_tensors
        return grad_output * result


def test_exp_example_values_grad_and_node():
    xv = np.array([-1.0, 0.5, 2.0])
    x = tg.tensor(xv, requires_grad=True)
    y = Exp.apply(x)
    np.testing.assert_allclose(y.detach().numpy(), np.exp(xv))
    assert y.requires_grad and y.grad_fn.name() == "ExpBackward"
    assert type(y.grad_fn).__name__ == "ExpBackward"
    assert y.grad_fn.next_functions[0][0] is x._edge()[0]
    (y * tg.tensor([1.0, 2.0, 3.0])).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.exp(xv) * [1, 2, 3])


def test_exp_double_backward_through_saved_output():
    xv = np.array([0.3, -0.7])
    x = tg.tensor(xv, requires_grad=True)
    y = Exp.apply(x).sum()
    g, = tg.autograd.grad(y, x, create_graph=True)
    np.testing.assert_allclose(g.detach().numpy(), np.exp(xv))
    assert g.requires_grad
    gg, = tg.autograd.grad(g.sum(), x)
    np.testing.assert_allclose(gg.numpy(), np.exp(xv))


class Cube(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x * x

    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        return g * 3.0 * x * x


def test_double_backward_of_differentiable_backward():
    xv = np.array([1.5, -2.0])
    x = tg.tensor(xv, requires_grad=True)
    g, = tg.autograd.grad(Cube.apply(x).sum(), x, create_graph=True)
    np.testing.assert_allclose(g.detach().numpy(), 3 * xv ** 2)
    h, = tg.autograd.grad(g.sum(), x, create_graph=True)
    np.testing.assert_allclose(h.detach().numpy(), 6 * xv)
    t, = tg.autograd.grad(h.sum(), x)
    np.testing.assert_allclose(t.numpy(), [6.0, 6.0])


def test_forward_runs_without_recording():
    seen = {}

    class Probe(Function):
        @staticmethod
        def forward(ctx, x):
            seen["grad_enabled"] = tg.is_grad_enabled()
            y = x * 2
            seen["inner_grad_fn"] = y.grad_fn
            return y

        @staticmethod
        def backward(ctx, g):
            seen["backward_grad_enabled"] = tg.is_grad_enabled()
            return g * 2

    x = tg.tensor([1.0], requires_grad=True)
    Probe.apply(x).sum().backward()
    assert seen == {"grad_enabled": False, "inner_grad_fn": None, "backward_grad_enabled": False}
    x.grad = None
    y = Probe.apply(x).sum()
    tg.autograd.grad(y, x, create_graph=True)
    assert seen["backward_grad_enabled"] is True
    assert tg.is_grad_enabled()


class Scale(Function):
    @staticmethod
    def forward(ctx, x, factor, name):
        ctx.factor = factor
        ctx.tag = name
        return x * factor

    @staticmethod
    def backward(ctx, g):
        assert ctx.tag == "scale"
        return g * ctx.factor, None, None


def test_non_tensor_arguments_get_none():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    y = Scale.apply(x, 3.0, "scale")
    assert len(y.grad_fn.next_functions) == 3
    assert y.grad_fn.next_functions[1] == (None, 0)
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [3.0, 3.0])


def test_gradient_for_non_tensor_argument_is_an_error():
    class Bad(Function):
        @staticmethod
        def forward(ctx, x, k):
            return x * k

        @staticmethod
        def backward(ctx, g):
            return g, g

    x = tg.tensor([1.0], requires_grad=True)
    with pytest.raises(RuntimeError, match=r"function BadBackward returned a gradient different "
                                           r"than None at position 2, but the corresponding "
                                           r"forward input was not a Variable"):
        Bad.apply(x, 2.0).sum().backward()


def test_wrong_number_of_gradients():
    class TooFew(Function):
        @staticmethod
        def forward(ctx, x, y):
            return x * y

        @staticmethod
        def backward(ctx, g):
            return g

    x = tg.tensor([1.0], requires_grad=True)
    y = tg.tensor([2.0], requires_grad=True)
    with pytest.raises(RuntimeError, match=r"function TooFewBackward returned an incorrect number "
                                           r"of gradients \(expected 2, got 1\)"):
        TooFew.apply(x, y).sum().backward()

    class ExtraNone(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2, None, None   # extra Nones are allowed, as in torch

    ExtraNone.apply(x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [2.0])

    class ExtraValue(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2, g

    with pytest.raises(RuntimeError, match=r"expected 1, got 2"):
        ExtraValue.apply(x).sum().backward()


class SumProd(Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return a + b, a * b

    @staticmethod
    def backward(ctx, g_sum, g_prod):
        a, b = ctx.saved_tensors
        ctx.received = (g_sum, g_prod)
        if g_prod is None:
            return g_sum, g_sum
        return g_sum + g_prod * b, g_sum + g_prod * a


def test_several_outputs():
    av, bv = np.array([1.0, 2.0]), np.array([3.0, -1.0])
    a = tg.tensor(av, requires_grad=True)
    b = tg.tensor(bv, requires_grad=True)
    s, p = SumProd.apply(a, b)
    assert s.grad_fn is p.grad_fn and (s.output_nr, p.output_nr) == (0, 1)
    np.testing.assert_allclose(p.detach().numpy(), av * bv)
    (s.sum() * 2 + (p * p).sum()).backward()
    # d/da [2 sum(a+b) + sum((ab)^2)] = 2 + 2 a b^2
    np.testing.assert_allclose(a.grad.numpy(), 2 + 2 * av * bv ** 2)
    np.testing.assert_allclose(b.grad.numpy(), 2 + 2 * bv * av ** 2)


def test_unused_output_gets_zeros_then_none_without_materialize():
    a = tg.tensor([1.0, 2.0], requires_grad=True)
    b = tg.tensor([3.0, 4.0], requires_grad=True)
    s, p = SumProd.apply(a, b)
    s.sum().backward()
    g_sum, g_prod = s.grad_fn.received
    assert isinstance(g_prod, tg.Tensor)
    np.testing.assert_array_equal(g_prod.numpy(), [0.0, 0.0])
    np.testing.assert_allclose(a.grad.numpy(), [1.0, 1.0])

    class NoMat(SumProd):
        @staticmethod
        def forward(ctx, a, b):
            ctx.set_materialize_grads(False)
            return SumProd.forward(ctx, a, b)

    a.grad = None
    s, p = NoMat.apply(a, b)
    s.sum().backward()
    assert s.grad_fn.received[1] is None
    np.testing.assert_allclose(a.grad.numpy(), [1.0, 1.0])


def test_needs_input_grad():
    seen = []

    class Probe(Function):
        @staticmethod
        def forward(ctx, x, y, k):
            seen.append(ctx.needs_input_grad)
            return x * y * k

        @staticmethod
        def backward(ctx, g):
            seen.append(ctx.needs_input_grad)
            return g, None, None

    x = tg.tensor([1.0], requires_grad=True)
    y = tg.tensor([2.0])
    Probe.apply(x, y, 3).sum().backward()
    assert seen == [(True, False, False), (True, False, False)]
    with tg.no_grad():
        out = Probe.apply(x, y, 3)
    assert seen[-1] == (False, False, False)
    assert out.grad_fn is None and not out.requires_grad


def test_no_input_requires_grad_gives_plain_outputs():
    out = Exp.apply(tg.tensor([0.0]))
    assert out.grad_fn is None and not out.requires_grad
    np.testing.assert_allclose(out.numpy(), [1.0])


def test_mark_non_differentiable():
    class WithIndex(Function):
        @staticmethod
        def forward(ctx, x):
            out = x * 2
            idx = x * 0 + 1
            ctx.mark_non_differentiable(idx)
            return out, idx

        @staticmethod
        def backward(ctx, g, g_idx):
            ctx.g_idx = g_idx
            return g * 2

    x = tg.tensor([1.0, 5.0], requires_grad=True)
    out, idx = WithIndex.apply(x)
    assert out.requires_grad and not idx.requires_grad and idx.grad_fn is None
    out.sum().backward()
    np.testing.assert_array_equal(out.grad_fn.g_idx.numpy(), [0.0, 0.0])
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 2.0])


class Double_(Function):
    @staticmethod
    def forward(ctx, x):
        x.mul_(2)
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx, g):
        return g * 2


def test_mark_dirty_rebases_history():
    x = tg.tensor([1.0, 3.0], requires_grad=True)
    a = x * 1.0
    out = Double_.apply(a)
    assert out is a
    assert a.grad_fn.name() == "Double_Backward"
    np.testing.assert_allclose(a.detach().numpy(), [2.0, 6.0])
    (a * a).sum().backward()
    # a = 2 x  ->  d/dx sum(a^2) = 2 a * 2
    np.testing.assert_allclose(x.grad.numpy(), [8.0, 24.0])


def test_mark_dirty_on_leaf_that_requires_grad():
    x = tg.tensor([1.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad has been used "
                                           "in an in-place operation"):
        Double_.apply(x)


def test_mark_dirty_not_returned():
    class Sneaky(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.mark_dirty(x)
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g

    x = tg.tensor([1.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="marked as dirty during the forward method were not "
                                           "returned as output"):
        Sneaky.apply(x * 1.0)


def test_input_returned_unchanged_is_a_new_tensor():
    class Identity(Function):
        @staticmethod
        def forward(ctx, x):
            return x

        @staticmethod
        def backward(ctx, g):
            return g * 5

    x = tg.tensor([1.0, 2.0], requires_grad=True)
    y = Identity.apply(x)
    assert y is not x and x.grad_fn is None and y.grad_fn.name() == "IdentityBackward"
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [5.0, 5.0])


def test_saved_tensor_modified_in_place_is_caught():
    class SaveInput(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, g):
            x, = ctx.saved_tensors
            return g * 2 * x

    x = tg.tensor([1.0, 2.0], dtype=tg.float64, requires_grad=True)
    y = SaveInput.apply(x)
    with tg.no_grad():
        x.add_(1.0)
    with pytest.raises(RuntimeError, match=r"one of the variables needed for gradient computation "
                                           r"has been modified by an inplace operation: \[tensor "
                                           r"of shape \[2\] and dtype float64\].*is at version 1; "
                                           r"expected version 0"):
        y.sum().backward()

    # a saved output modified in place is caught as well
    x2 = tg.tensor([0.0], requires_grad=True)
    e = Exp.apply(x2)
    with tg.no_grad():
        e.mul_(3.0)
    with pytest.raises(RuntimeError, match="which is output 0 of ExpBackward"):
        e.sum().backward()


def test_save_for_backward_rejects_non_tensors_and_keeps_none():
    class SaveInt(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x, 3)
            return x

        @staticmethod
        def backward(ctx, g):
            return g

    with pytest.raises(TypeError, match="save_for_backward can only save variables, but argument "
                                        "1 is of type int"):
        SaveInt.apply(tg.tensor([1.0], requires_grad=True))

    class SaveNone(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(None, x)
            return x * 2

        @staticmethod
        def backward(ctx, g):
            none, x = ctx.saved_tensors
            assert none is None
            return g * 2

    x = tg.tensor([1.0], requires_grad=True)
    SaveNone.apply(x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [2.0])


def test_saved_tensors_freed_after_backward():
    x = tg.tensor([1.0], requires_grad=True)
    y = Exp.apply(x).sum()
    y.backward(retain_graph=True)
    y.backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * np.exp([1.0]))
    with pytest.raises(RuntimeError, match="Trying to backward through the graph a second time"):
        y.backward()


def test_gradient_shape_and_dtype_are_checked():
    class WrongShape(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 1.0

        @staticmethod
        def backward(ctx, g):
            return tg.ones(5)

    x = tg.tensor([1.0, 2.0, 3.0], dtype=tg.float64, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"Function WrongShapeBackward returned an invalid "
                                           r"gradient at index 0 - got \[5\] but expected shape "
                                           r"compatible with \[3\]"):
        WrongShape.apply(x).sum().backward()

    class Broadcasted(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 1.0

        @staticmethod
        def backward(ctx, g):
            return tg.ones(2, 3, dtype=tg.float32)  # summed down to [3], cast to float64

    x.grad = None
    Broadcasted.apply(x).sum().backward()
    assert x.grad.dtype == np.float64
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 2.0, 2.0])


def test_setup_context_style_and_keyword_arguments():
    class Mul(Function):
        @staticmethod
        def forward(x, y, scale=1.0):
            return x * y * scale

        @staticmethod
        def setup_context(ctx, inputs, output):
            x, y, scale = inputs
            ctx.save_for_backward(x, y)
            ctx.scale = scale

        @staticmethod
        def backward(ctx, g):
            x, y = ctx.saved_tensors
            return g * y * ctx.scale, g * x * ctx.scale, None

    x = tg.tensor([2.0], requires_grad=True)
    y = tg.tensor([5.0], requires_grad=True)
    out = Mul.apply(x, y=y, scale=3.0)
    np.testing.assert_allclose(out.detach().numpy(), [30.0])
    out.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [15.0])
    np.testing.assert_allclose(y.grad.numpy(), [6.0])
    fwd, bwd, setup = function_mod.function_rules(Mul)
    assert fwd is Mul.forward and bwd is Mul.backward and setup is Mul.setup_context
    assert function_mod.function_rules(Exp)[2] is None


def test_once_differentiable():
    class Sq(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        @once_differentiable
        def backward(ctx, g):
            x, = ctx.saved_tensors
            return g * 2 * x

    x = tg.tensor([3.0], requires_grad=True)
    # as in torch, the error node is only put in when a grad_output requires grad
    v = tg.tensor([1.0], requires_grad=True)
    g, = tg.autograd.grad(Sq.apply(x), x, grad_outputs=v, create_graph=True)
    np.testing.assert_allclose(g.detach().numpy(), [6.0])
    assert g.grad_fn.name() == "DelayedError"
    with pytest.raises(RuntimeError, match="trying to differentiate twice a function that was "
                                           "marked with @once_differentiable"):
        g.sum().backward()


def test_legacy_call_and_missing_forward():
    with pytest.raises(RuntimeError, match="Legacy autograd function with non-static forward "
                                           "method is deprecated"):
        Exp()(tg.tensor([1.0]))

    class NoForward(Function):
        pass

    with pytest.raises(NotImplementedError, match="NoForward does not implement forward"):
        NoForward.apply(tg.tensor([1.0]))


def test_trace_hook_receives_traced_calls(monkeypatch):
    calls = []

    class FakeTracer:
        _trace = object()

    monkeypatch.setattr(function_mod, "_trace_apply",
                        lambda cls, args, setup_ctx: calls.append((cls, args, setup_ctx)) or "traced")
    t = FakeTracer()
    assert Exp.apply(t) == "traced"
    assert calls == [(Exp, (t,), False)]   # keyword arguments arrive bound to positions
    # eager values still go the eager way with the hook installed
    np.testing.assert_allclose(Exp.apply(tg.tensor([0.0])).numpy(), [1.0])


def test_anomaly_trace_points_at_apply_line():
    with pytest.warns(UserWarning, match="Anomaly Detection has been enabled"):
        mode = tg.autograd.detect_anomaly()
    with mode:
        y = Exp.apply(tg.tensor([1.0], requires_grad=True))  # LINE-MARK
    assert "LINE-MARK" in y.grad_fn.anomaly_trace
