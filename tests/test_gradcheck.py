"""gradcheck / gradgradcheck."""
import numpy as np
import pytest

import tracegrad as tg
from tracegrad.autograd import Function, gradcheck, gradgradcheck, GradcheckError
from tracegrad.eager.gradcheck import get_numerical_jacobian


def rng():
    return np.random.default_rng(1234)


class LinearFunction(Function):
    # the "extending torch.autograd" example, checked with gradcheck there
    @staticmethod
    def forward(ctx, input, weight, bias=None):
        ctx.save_for_backward(input, weight, bias)
        output = input @ weight.t()
        if bias is not None:
            output = output + bias
        return output

    @staticmethod
    def backward(ctx, grad_output):
        input, weight, bias = ctx.saved_tensors
        grad_input = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_input = grad_output @ weight
        if ctx.needs_input_grad[1]:
            grad_weight = grad_output.t() @ input
        if bias is not None and ctx.needs_input_grad[2]:
            grad_bias = grad_output.sum(0)
        return grad_input, grad_weight, grad_bias


def test_gradcheck_linear_function_example():
    r = rng()
    inp = (tg.tensor(r.standard_normal((4, 3)), requires_grad=True),
           tg.tensor(r.standard_normal((2, 3)), requires_grad=True),
           tg.tensor(r.standard_normal(2), requires_grad=True))
    assert gradcheck(LinearFunction.apply, inp, eps=1e-6, atol=1e-4) is True
    assert gradcheck(LinearFunction.apply, inp, fast_mode=True) is True


def test_gradcheck_plain_double_function_and_single_tensor_input():
    r = rng()
    x = tg.tensor(r.standard_normal(5), requires_grad=True)
    assert gradcheck(lambda t: (t.tanh() * t.exp()).sum(), x)
    w = tg.tensor(r.standard_normal((5, 3)), requires_grad=True)
    assert gradcheck(lambda a, b: tg.tanh(a @ b) / (1.0 + b.sum()), (x, w))


def test_gradcheck_noncontiguous_input():
    base = np.asfortranarray(rng().standard_normal((3, 4)))
    x = tg.tensor(base, requires_grad=True)
    x._data = base   # keep the Fortran-ordered (non C-contiguous) array itself
    assert not x.is_contiguous()
    assert gradcheck(lambda t: (t @ t.T).exp().sum(0), (x,))


class WrongExp(Function):
    @staticmethod
    def forward(ctx, x):
        r = x.exp()
        ctx.save_for_backward(r)
        return r

    @staticmethod
    def backward(ctx, g):
        r, = ctx.saved_tensors
        return g * r * 1.1


def test_gradcheck_failure_message_shows_both_jacobians():
    xv = np.array([0.2, -0.5, 1.0])
    x = tg.tensor(xv, requires_grad=True)
    with pytest.raises(GradcheckError) as info:
        gradcheck(WrongExp.apply, (x,))
    assert isinstance(info.value, RuntimeError)
    msg = str(info.value)
    assert msg.startswith("Jacobian mismatch for output 0 with respect to input 0,")
    assert "numerical:" in msg and "analytical:" in msg
    # the worst entry, side by side: numerical exp(1.0) and analytical 1.1 exp(1.0)
    row = [ln for ln in msg.splitlines() if ln.strip().startswith("(2, 2)")][0]
    num, ana = float(row.split()[2]), float(row.split()[3])
    assert num == pytest.approx(np.exp(1.0), rel=1e-6)
    assert ana == pytest.approx(1.1 * np.exp(1.0), rel=1e-9)
    assert gradcheck(WrongExp.apply, (x,), raise_exception=False) is False


def test_gradcheck_fast_mode_failure():
    x = tg.tensor([0.2, -0.5, 1.0], dtype=tg.float64, requires_grad=True)
    with pytest.raises(GradcheckError, match=r"(?s)output 0 with respect to input 0.*fast mode"):
        gradcheck(WrongExp.apply, (x,), fast_mode=True)
    assert gradcheck(WrongExp.apply, (x,), fast_mode=True, raise_exception=False) is False


def test_gradcheck_names_the_failing_pair():
    class Pair(Function):
        @staticmethod
        def forward(ctx, x, y):
            ctx.save_for_backward(x, y)
            return x * y, x + y

        @staticmethod
        def backward(ctx, g_prod, g_sum):
            x, y = ctx.saved_tensors
            return g_prod * y + g_sum, g_prod * x + 2 * g_sum   # d(x+y)/dy is 1, not 2

    x = tg.tensor([1.0, 2.0], dtype=tg.float64, requires_grad=True)
    y = tg.tensor([3.0, 4.0], dtype=tg.float64, requires_grad=True)
    with pytest.raises(GradcheckError, match="Jacobian mismatch for output 1 with respect to "
                                             "input 1,"):
        gradcheck(Pair.apply, (x, y))
    # a non-tensor argument in the middle keeps input numbering by position
    with pytest.raises(GradcheckError, match="output 0 with respect to input 2,"):
        gradcheck(lambda a, k, b: WrongExp.apply(b) * k, (x, 3.0, y))


def test_gradcheck_warns_for_single_precision():
    x = tg.tensor(np.array([0.1, 0.2], dtype=np.float32), requires_grad=True)
    with pytest.warns(UserWarning, match="Input #0 requires gradient and is not a double "
                                         "precision floating point"):
        gradcheck(lambda t: t * 2, (x,), eps=1e-2, atol=1e-2, rtol=1e-2)


def test_gradcheck_needs_an_input_that_requires_grad():
    with pytest.raises(ValueError, match="gradcheck expects at least one input tensor to require "
                                         "gradient"):
        gradcheck(lambda t: t * 2, (tg.tensor([1.0]),))


def test_gradcheck_nondeterministic_backward():
    noise = np.random.default_rng(7)

    class Noisy(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * (2 + float(noise.uniform(-1e-8, 1e-8)))

    x = tg.tensor([1.0, 2.0], dtype=tg.float64, requires_grad=True)
    with pytest.raises(GradcheckError, match="Backward is not reentrant, i.e., running backward "
                                             "with same input and grad_output multiple times "
                                             "gives different values.*tolerance for "
                                             "nondeterminism was 0.0"):
        gradcheck(Noisy.apply, (x,))
    assert gradcheck(Noisy.apply, (x,), nondet_tol=1e-6)


def test_gradcheck_output_without_grad_must_not_depend_on_inputs():
    class Leaky(Function):
        @staticmethod
        def forward(ctx, x):
            aux = x * 3    # depends on x, yet declared non-differentiable
            ctx.mark_non_differentiable(aux)
            return x * 2, aux

        @staticmethod
        def backward(ctx, g, g_aux):
            return g * 2

    x = tg.tensor([1.0], dtype=tg.float64, requires_grad=True)
    with pytest.raises(GradcheckError, match="Numerical gradient for function expected to be "
                                             "zero: output 1 does not require grad"):
        gradcheck(Leaky.apply, (x,))


def test_check_undefined_grad():
    class NoMaterialize(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.set_materialize_grads(False)
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2          # fails when g is None

    class Handles(NoMaterialize):
        @staticmethod
        def backward(ctx, g):
            return None if g is None else g * 2

    x = tg.tensor([1.0, 2.0], dtype=tg.float64, requires_grad=True)
    with pytest.raises(GradcheckError, match="Expected backward function to handle undefined "
                                             "output grads"):
        gradcheck(NoMaterialize.apply, (x,))
    assert gradcheck(NoMaterialize.apply, (x,), check_undefined_grad=False)
    assert gradcheck(Handles.apply, (x,))


def test_check_batched_grad():
    x = tg.tensor([0.5, 1.5], dtype=tg.float64, requires_grad=True)
    f = lambda t: (t * t).exp()  # noqa: E731
    if hasattr(tg.ops, "stack"):
        assert gradcheck(f, (x,), check_batched_grad=True)
    else:
        with pytest.raises(NotImplementedError, match="check_batched_grad=True needs the 'stack' "
                                                      "op"):
            gradcheck(f, (x,), check_batched_grad=True)


def test_unsupported_modes_say_so():
    x = tg.tensor([0.5], dtype=tg.float64, requires_grad=True)
    with pytest.raises(NotImplementedError, match="no batched forward-mode AD"):
        gradcheck(lambda t: t * 2, (x,), check_forward_ad=True, check_batched_forward_grad=True)
    with pytest.raises(NotImplementedError, match="no sparse tensors"):
        gradcheck(lambda t: t * 2, (x,), check_sparse_nnz=True)


def test_check_forward_ad_compares_forward_mode_with_finite_differences():
    x = tg.tensor([0.5, -1.25, 2.0], dtype=tg.float64, requires_grad=True)
    assert gradcheck(lambda t: (t * t).sin() * t.exp(), (x,), check_forward_ad=True)
    assert gradcheck(lambda t: t.tanh(), (x,), check_forward_ad=True, check_backward_ad=False)
    with pytest.raises(ValueError, match="nothing to check"):
        gradcheck(lambda t: t * 2, (x,), check_forward_ad=False, check_backward_ad=False)


def test_numerical_jacobian_values():
    xv = np.array([1.0, -2.0, 0.5])
    x = tg.tensor(xv, requires_grad=True)
    (jac,), = get_numerical_jacobian(lambda t: t * t, (x,))
    np.testing.assert_allclose(jac, np.diag(2 * xv), atol=1e-6)
    np.testing.assert_array_equal(x.detach().numpy(), xv)   # inputs restored


class Cube(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x * x

    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        return g * 3.0 * x * x


class CubeFirstOrderOnly(Cube):
    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        return g * 3.0 * x.detach() * x.detach()   # right values, wrong second derivative


def test_gradgradcheck():
    r = rng()
    x = tg.tensor(r.standard_normal(4), requires_grad=True)
    w = tg.tensor(r.standard_normal((4, 2)), requires_grad=True)
    assert gradgradcheck(lambda a, b: tg.tanh(a @ b) * a.sum(), (x, w))
    assert gradgradcheck(lambda a, b: tg.tanh(a @ b), (x, w), gen_non_contig_grad_outputs=True)
    go = tg.tensor(r.standard_normal(2), requires_grad=True)
    assert gradgradcheck(lambda a, b: tg.tanh(a @ b), (x, w), (go,))
    assert gradgradcheck(Cube.apply, (x,))
    assert gradcheck(CubeFirstOrderOnly.apply, (x,))
    with pytest.raises(GradcheckError, match="Jacobian mismatch for output 0 with respect to "
                                             "input 0"):
        gradgradcheck(CubeFirstOrderOnly.apply, (x,))
    assert gradgradcheck(CubeFirstOrderOnly.apply, (x,), raise_exception=False) is False
