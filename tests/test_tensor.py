"""Eager Tensor: constructors, attributes, methods, operators, NumPy
protocols, in-place ops and version counters (torch.autograd semantics)."""
import numpy as np
import pytest

import tracegrad as tg


def arr(t):
    return np.asarray(t.detach().numpy())


# --- constructors ------------------------------------------------------------------

def test_tensor_copies_and_follows_numpy_dtype():
    a = np.array([1.0, 2.0, 3.0])
    t = tg.tensor(a)
    a[0] = 100.0
    assert arr(t).tolist() == [1.0, 2.0, 3.0]
    assert t.dtype == tg.float64 and tg.tensor([1, 2]).dtype == tg.int64
    assert tg.tensor([1, 2], dtype=tg.float).dtype == np.float32
    assert tg.float is tg.float32 and tg.double is tg.float64
    assert tg.tensor(3.5).shape == () and tg.tensor(3.5).item() == 3.5


@pytest.mark.parametrize("make, expect", [
    (lambda **kw: tg.zeros(2, 3, **kw), np.zeros((2, 3))),
    (lambda **kw: tg.zeros((2, 3), **kw), np.zeros((2, 3))),
    (lambda **kw: tg.ones([2, 3], **kw), np.ones((2, 3))),
    (lambda **kw: tg.full((2, 2), 7.0, **kw), np.full((2, 2), 7.0)),
    (lambda **kw: tg.arange(0.0, 1.0, 0.25, **kw), np.arange(0, 1, 0.25)),
    (lambda **kw: tg.linspace(0, 1, 5, **kw), np.linspace(0, 1, 5)),
    (lambda **kw: tg.eye(3, **kw), np.eye(3)),
])
def test_constructors_values_and_keywords(make, expect):
    t = make()
    np.testing.assert_array_equal(arr(t), expect)
    # torch's default dtype, float32
    assert t.dtype == np.float32 and t.is_leaf and not t.requires_grad
    t32 = make(dtype=tg.float64, device=tg.device("cpu"), requires_grad=True)
    assert t32.dtype == np.float64 and t32.requires_grad and t32.is_leaf
    assert t32.device == tg.device("cpu") and str(t32.device) == "cpu"
    np.testing.assert_allclose(arr(t32), expect.astype(np.float32))


def test_arange_int_and_empty_and_like():
    assert arr(tg.arange(5)).tolist() == [0, 1, 2, 3, 4] and tg.arange(5).dtype == np.int64
    e = tg.empty(3, 2, dtype=tg.float32)
    assert e.shape == (3, 2) and e.dtype == np.float32
    base = tg.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=tg.float32)
    z, o = tg.zeros_like(base), tg.ones_like(base, dtype=tg.float64, requires_grad=True)
    f = tg.full_like(base, 2.5)
    assert z.dtype == np.float32 and arr(z).sum() == 0
    assert o.dtype == np.float64 and o.requires_grad and arr(o).sum() == 4
    assert arr(f).tolist() == [[2.5, 2.5], [2.5, 2.5]] and tg.empty_like(base).shape == (2, 2)
    r = tg.rand_like(base)
    assert r.shape == (2, 2) and r.dtype == np.float32 and 0 <= arr(r).min() < 1


def test_manual_seed_reproducible():
    tg.manual_seed(123)
    a, b = tg.rand(4), tg.randn(2, 3)
    tg.manual_seed(123)
    c, d = tg.rand(4), tg.randn(2, 3)
    np.testing.assert_array_equal(arr(a), arr(c))
    np.testing.assert_array_equal(arr(b), arr(d))
    assert not np.array_equal(arr(tg.rand(4)), arr(a))
    assert 0 <= arr(a).min() and arr(a).max() < 1
    x = tg.randn(3, requires_grad=True, dtype=tg.float32)
    assert x.requires_grad and x.dtype == np.float32


def test_int_tensors_cannot_require_grad():
    with pytest.raises(RuntimeError, match="only Tensors of floating point and complex dtype "
                                           "can require gradients"):
        tg.tensor([1, 2], requires_grad=True)


# --- attributes ----------------------------------------------------------------------

def test_attributes_and_shape_methods():
    x = tg.tensor(np.arange(6.0).reshape(2, 3), requires_grad=True)
    assert x.shape == (2, 3) and x.ndim == 2 and x.dim() == 2 and x.numel() == 6
    assert x.size() == (2, 3) and x.size(1) == 3 and len(x) == 2
    assert x.is_leaf and x.grad is None and x.grad_fn is None
    y = x * 2
    assert not y.is_leaf and y.requires_grad and y.grad_fn.name() == "MulBackward0"
    (fn, idx), (none_fn, none_idx) = y.grad_fn.next_functions
    assert type(fn).__name__ == "AccumulateGrad" and fn.variable is x and idx == 0
    assert none_fn is None and none_idx == 0  # the constant operand, as torch shows it
    z = (y + 1).sum()
    assert z.grad_fn.name() == "SumBackward0"
    assert z.grad_fn.next_functions[0][0].name() == "AddBackward0"
    assert "grad_fn=<SumBackward0>" in repr(z)
    assert "requires_grad=True" in repr(x)


def test_data_is_detached_and_shares_memory():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    d = x.data
    assert not d.requires_grad and d.grad_fn is None
    d[0] = 5.0  # no error: .data is outside autograd
    assert arr(x).tolist() == [5.0, 2.0]
    assert x._version == 0  # .data changes are not tracked, as in torch


def test_detach_shares_memory_and_version_counter():
    x = tg.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = x * 1
    d = y.detach()
    assert not d.requires_grad and d.is_leaf
    d.add_(1.0)
    assert arr(y).tolist() == [2.0, 3.0, 4.0]
    assert y._version == 1 and d._version == 1
    # detach_ makes a non-leaf a leaf
    z = x * 3
    z.detach_()
    assert z.is_leaf and not z.requires_grad and z.grad_fn is None


def test_requires_grad_flags():
    x = tg.ones(2)
    assert x.requires_grad_() is x and x.requires_grad
    x.requires_grad = False
    assert not x.requires_grad
    y = tg.ones(2, requires_grad=True) * 2
    with pytest.raises(RuntimeError, match="you can only change requires_grad flags of leaf "
                                           "variables"):
        y.requires_grad_(False)


def test_grad_assignment_checks_and_zero():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    (x * x).sum().backward()
    np.testing.assert_array_equal(arr(x.grad), [2.0, 4.0])
    x.grad.zero_()
    assert arr(x.grad).tolist() == [0.0, 0.0]
    (x * x).sum().backward()
    np.testing.assert_array_equal(arr(x.grad), [2.0, 4.0])
    x.grad = None
    assert x.grad is None
    with pytest.raises(RuntimeError, match="assigned grad has data of a different size"):
        x.grad = tg.zeros(3)
    with pytest.raises(RuntimeError, match="assigned grad has data of a different type"):
        x.grad = tg.zeros(2, dtype=tg.float64)


def test_conversions():
    x = tg.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    with pytest.raises(RuntimeError, match=r"Can't call numpy\(\) on Tensor that requires grad"):
        x.numpy()
    assert x.detach().numpy().tolist() == [[1.0, 2.0], [3.0, 4.0]]
    assert x.tolist() == [[1.0, 2.0], [3.0, 4.0]]
    assert x.sum().item() == 10.0 and float(x.sum()) == 10.0
    with pytest.raises(RuntimeError, match="a Tensor with 4 elements cannot be converted to Scalar"):
        x.item()
    with pytest.raises(RuntimeError, match="ambiguous"):
        bool(x > 0)


# --- operators and methods ----------------------------------------------------------

def test_arithmetic_and_comparison_operators():
    a_np, b_np = np.array([1.0, -2.0, 3.0]), np.array([0.5, 4.0, -1.0])
    a, b = tg.tensor(a_np), tg.tensor(b_np)
    cases = {
        "add": (a + b, a_np + b_np), "radd": (2 + a, 2 + a_np),
        "sub": (a - b, a_np - b_np), "rsub": (2 - a, 2 - a_np),
        "mul": (a * b, a_np * b_np), "rmul": (3 * a, 3 * a_np),
        "div": (a / b, a_np / b_np), "rdiv": (1 / b, 1 / b_np),
        "pow": (a ** 2, a_np ** 2), "neg": (-a, -a_np), "abs": (abs(a), np.abs(a_np)),
        "lt": (a < b, a_np < b_np), "le": (a <= b, a_np <= b_np),
        "gt": (a > b, a_np > b_np), "ge": (a >= b, a_np >= b_np),
        "eq": (a == a, a_np == a_np), "ne": (a != b, a_np != b_np),
        "ndarray_op": (a_np * b, a_np * b_np),
    }
    for name, (got, want) in cases.items():
        assert isinstance(got, tg.Tensor), name
        np.testing.assert_allclose(arr(got), want, err_msg=name)
    assert (a < b).dtype == np.bool_


def test_matmul_transpose_and_torch_methods():
    rng = np.random.default_rng(0)
    w_np, x_np = rng.standard_normal((3, 4)), rng.standard_normal((2, 3))
    w, x = tg.tensor(w_np, requires_grad=True), tg.tensor(x_np)
    np.testing.assert_allclose(arr(x @ w), x_np @ w_np)
    np.testing.assert_allclose(arr(x_np @ w), x_np @ w_np)  # ndarray @ Tensor
    np.testing.assert_allclose(arr(w.T), w_np.T)
    np.testing.assert_allclose(arr(w.t()), w_np.T)
    np.testing.assert_allclose(arr(x.mm(w)), x_np @ w_np)
    np.testing.assert_allclose(arr(w.exp().sum(dim=1, keepdim=True)),
                               np.exp(w_np).sum(axis=1, keepdims=True))
    np.testing.assert_allclose(arr(w.clone()), w_np)
    np.testing.assert_allclose(arr(w.clamp(min=0.0)), np.clip(w_np, 0.0, None))
    assert w.float().dtype == np.float32 and w.double().dtype == np.float64
    assert w.to(tg.float32).dtype == np.float32 and w.to("cpu") is w
    with pytest.raises(RuntimeError, match=r"t\(\) expects a tensor with <= 2 dimensions"):
        tg.zeros(2, 2, 2).t()


def test_numpy_protocols_take_part_in_autograd():
    x_np = np.array([[0.1, 0.2], [0.3, 0.4]])
    x = tg.tensor(x_np, requires_grad=True)
    s = np.sin(x)
    assert isinstance(s, tg.Tensor) and s.grad_fn.name() == "SinBackward0"
    total = np.sum(np.sum(s, axis=0) * np.array([1.0, 2.0]))
    assert isinstance(total, tg.Tensor)
    total.backward()
    np.testing.assert_allclose(arr(x.grad), np.cos(x_np) * np.array([1.0, 2.0]))
    w = tg.tensor(np.ones((2, 1)), requires_grad=True)
    out = x @ w
    out.sum().backward()
    np.testing.assert_allclose(arr(w.grad), x_np.sum(axis=0, keepdims=True).T)


def test_import_as_torch_style_training_loop():
    import tracegrad as torch
    torch.manual_seed(0)
    w = torch.randn(3, 1, dtype=torch.float64, requires_grad=True)
    b = torch.zeros(1, requires_grad=True)
    x = torch.randn(32, 3, dtype=torch.float64)
    true_w = torch.tensor([[1.0], [-2.0], [0.5]])
    y = x @ true_w + 0.3
    losses = []
    for _ in range(300):
        loss = ((x @ w + b - y) ** 2).mean()
        loss.backward()
        with torch.no_grad():
            w -= 0.1 * w.grad
            b -= 0.1 * b.grad
        w.grad.zero_()
        b.grad = None
        losses.append(loss.item())
    assert losses[-1] < 1e-8 < losses[0]
    np.testing.assert_allclose(arr(w).ravel(), [1.0, -2.0, 0.5], atol=1e-4)
    np.testing.assert_allclose(arr(b), [0.3], atol=1e-4)


# --- in-place ops and version counters ----------------------------------------------

@pytest.mark.parametrize("op, expect", [
    (lambda t: t.add_(2.0), [3.0, 4.0, 5.0]),
    (lambda t: t.add_(tg.tensor([1.0, 1.0, 1.0]), alpha=3), [4.0, 5.0, 6.0]),
    (lambda t: t.sub_(1.0), [0.0, 1.0, 2.0]),
    (lambda t: t.mul_(2.0), [2.0, 4.0, 6.0]),
    (lambda t: t.div_(2.0), [0.5, 1.0, 1.5]),
    (lambda t: t.zero_(), [0.0, 0.0, 0.0]),
    (lambda t: t.fill_(7.0), [7.0, 7.0, 7.0]),
    (lambda t: t.copy_(tg.tensor([9.0, 8.0, 7.0])), [9.0, 8.0, 7.0]),
    (lambda t: t.clamp_(min=1.5, max=2.5), [1.5, 2.0, 2.5]),
    (lambda t: t.__iadd__(1.0), [2.0, 3.0, 4.0]),
    (lambda t: t.__isub__(1.0), [0.0, 1.0, 2.0]),
    (lambda t: t.__imul__(3.0), [3.0, 6.0, 9.0]),
    (lambda t: t.__itruediv__(4.0), [0.25, 0.5, 0.75]),
    (lambda t: t.__setitem__(1, 10.0), [1.0, 10.0, 3.0]),
    (lambda t: t.__setitem__(slice(0, 2), tg.tensor([5.0, 6.0])), [5.0, 6.0, 3.0]),
])
def test_inplace_ops_values_and_version(op, expect):
    t = tg.tensor([1.0, 2.0, 3.0])
    view = t[0:2]
    data_before = t._data
    r = op(t)
    assert r is None or r is t
    assert t._data is data_before  # really in place
    assert arr(t).tolist() == expect
    assert t._version == 1 and view._version == 1  # shared with views
    assert arr(view).tolist() == expect[:2]


def test_inplace_on_leaf_requiring_grad():
    w = tg.tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad is being used in "
                                           "an in-place operation."):
        w.add_(1.0)
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad"):
        w[0] = 3.0
    with pytest.raises(RuntimeError, match="a view of a leaf Variable that requires grad"):
        w[0:1].mul_(2.0)
    with tg.no_grad():
        w.mul_(3.0)
        w[1] = 0.5
    assert arr(w).tolist() == [3.0, 0.5] and w.is_leaf and w.requires_grad


def test_sgd_update_under_no_grad():
    w = tg.tensor([1.0, -1.0], requires_grad=True)
    for _ in range(3):
        loss = (w * w).sum()
        loss.backward()
        with tg.no_grad():
            w -= 0.25 * w.grad
        w.grad = None
    np.testing.assert_allclose(arr(w), [0.125, -0.125])  # w *= (1 - 0.5) each step


def test_modified_saved_input_raises_with_versions():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    y = x * 1
    z = y * y  # saves y (version 0)
    y.add_(1.0)
    with pytest.raises(RuntimeError, match=r"one of the variables needed for gradient "
                                           r"computation has been modified by an inplace "
                                           r"operation: .*which is an input of MulBackward0, "
                                           r"is at version 1; expected version 0 instead"):
        z.sum().backward()


def test_modified_saved_output_raises():
    x = tg.tensor([0.5, 1.0], requires_grad=True)
    e = x.exp()  # exp saves its output
    e.mul_(2.0)
    with pytest.raises(RuntimeError, match=r"which is output 0 of ExpBackward0, is at version 1; "
                                           r"expected version 0 instead"):
        e.sum().backward()


def test_modification_through_detached_alias_is_caught():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    y = x * 1
    z = (y * y).sum()
    y.detach().zero_()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z.backward()


def test_inplace_op_recorded_on_non_leaf():
    x_np = np.array([0.5, -1.0, 2.0])
    x = tg.tensor(x_np, requires_grad=True)
    y = x * 2
    y.mul_(y)          # y = (2x)^2, the op sees the old value twice
    y.add_(x, alpha=3)  # + 3x
    assert y.grad_fn.name() == "AddBackward0"
    y.sum().backward()
    np.testing.assert_allclose(arr(x.grad), 8 * x_np + 3)
    np.testing.assert_allclose(arr(y), 4 * x_np ** 2 + 3 * x_np)


def test_zero_and_fill_and_copy_with_grad():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    s = tg.tensor(3.0, requires_grad=True)
    y = x * 1
    y.fill_(s)                     # y = [s, s]
    (y * tg.tensor([1.0, 2.0])).sum().backward()
    assert x.grad is None or arr(x.grad).tolist() == [0.0, 0.0]
    assert s.grad.item() == 3.0
    x2 = tg.tensor([np.inf, 2.0], requires_grad=True)
    z = x2 * 1
    z.zero_()                      # no NaN from inf * 0
    assert arr(z).tolist() == [0.0, 0.0]
    src = tg.tensor([4.0, 5.0], requires_grad=True)
    c = tg.zeros(2)
    c.copy_(src * 2)
    assert c.requires_grad and not c.is_leaf
    c.sum().backward()
    assert arr(src.grad).tolist() == [2.0, 2.0]


def test_setitem_records_and_differentiates():
    x_np = np.array([1.0, 2.0, 3.0, 4.0])
    x = tg.tensor(x_np, requires_grad=True)
    y = x * 1
    y[0] = x[3] * 5
    y[1:3] = y[1:3].clone() ** 2
    assert y.grad_fn is not None
    y.sum().backward()
    np.testing.assert_allclose(arr(x.grad), [0.0, 2 * x_np[1], 2 * x_np[2], 6.0])
    np.testing.assert_allclose(arr(y), [20.0, 4.0, 9.0, 4.0])
    # without the clone, pow saved a view that the assignment then changed (torch raises too)
    y = x * 1
    y[1:3] = y[1:3] ** 2
    with pytest.raises(RuntimeError, match="is at version 1; expected version 0 instead"):
        y.sum().backward()


def test_inplace_on_view_rebases_the_base():
    x_np = np.array([1.0, 2.0, 3.0, 4.0])
    x = tg.tensor(x_np, requires_grad=True)
    y = x * 1
    v = y[1:3]
    assert v._base is y and v._version == y._version
    v.mul_(10.0)
    np.testing.assert_allclose(arr(y), [1.0, 20.0, 30.0, 4.0])
    assert y.grad_fn.name() == "CopySlices"
    (y * tg.tensor([1.0, 2.0, 3.0, 4.0])).sum().backward()
    np.testing.assert_allclose(arr(x.grad), [1.0, 20.0, 30.0, 4.0])
    x.grad = None
    y = x * 1
    v = y.reshape(2, 2)
    v.add_(x.reshape(2, 2))  # the whole base through a reshape view
    v.sum().backward()
    np.testing.assert_allclose(arr(x.grad), [2.0, 2.0, 2.0, 2.0])


def test_advanced_index_is_a_copy_not_a_view():
    x = tg.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = x * 1
    c = y[[0, 2]]
    c.mul_(5.0)
    np.testing.assert_allclose(arr(y), [1.0, 2.0, 3.0])  # y untouched
    (y.sum() + c.sum()).backward()
    np.testing.assert_allclose(arr(x.grad), [6.0, 1.0, 6.0])


def test_inplace_shape_and_dtype_errors():
    t = tg.zeros(3)
    with pytest.raises(RuntimeError, match=r"output with shape \[3\] doesn't match the "
                                           r"broadcast shape \[2, 3\]"):
        t.add_(tg.ones(2, 3))
    i = tg.tensor([1, 2])
    with pytest.raises(RuntimeError):
        i.add_(0.5)
    assert arr(i).tolist() == [1, 2]


def test_zero_dim_tensors_take_the_dimensioned_dtype_as_in_torch():
    # torch's rule (no torch needed to check it): within a category the
    # dimensioned tensors decide; a 0-d tensor of a higher category does
    x32 = tg.ones(3, dtype=tg.float32)
    assert (x32 * tg.tensor(2.0, dtype=tg.float64)).dtype == tg.float32
    assert (tg.ones(3, dtype=tg.int32) + tg.tensor(2)).dtype == tg.int32
    assert (tg.ones(3, dtype=tg.int32) * tg.tensor(2.5)).dtype == tg.float32  # the default
    assert (tg.ones(3, dtype=tg.int32) * tg.tensor(2.5, dtype=tg.float64)).dtype == tg.float64
    assert (x32 + tg.ones(1, dtype=tg.float64)).dtype == tg.float64     # dimensioned: promotes
    s = tg.tensor(2.0, dtype=tg.float64, requires_grad=True)
    x = tg.ones(3, dtype=tg.float32, requires_grad=True)
    (x * s).sum().backward()
    assert x.grad.dtype == tg.float32 and s.grad.dtype == tg.float64
    assert float(s.grad) == 3.0
    # NumPy code keeps NumPy's rule (NEP 50): the 0-d float64 array promotes
    assert (np.ones(3, np.float32) * np.array(2.0)).dtype == np.float64
    assert tg.compile(lambda a, b: a * b)(np.ones(3, np.float32), np.array(2.0)).dtype \
        == np.float64


# --- unary in-place methods and torch.autograd.Variable (issue 27) -----------------

def test_unary_inplace_methods_record_as_torch():
    a = tg.tensor([0.5, 1.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        a.sin_()
    b = a * 1
    assert b.sin_() is b
    assert b.grad_fn.name() == "SinBackward0"
    b.sum().backward()
    np.testing.assert_allclose(a.grad.tolist(), np.cos([0.5, 1.0]), rtol=1e-6)
    c = tg.tensor([-0.5, 2.0])
    c.relu_()
    assert c.tolist() == [0.0, 2.0]
    c.sqrt_()
    np.testing.assert_allclose(c.tolist(), [0.0, np.sqrt(2.0)], rtol=1e-6)


def test_variable_is_every_tensor():
    from tracegrad.autograd import Variable
    t = tg.ones(2)
    assert isinstance(t, Variable) and not isinstance(3, Variable)
    v = Variable(t, requires_grad=True)
    assert v is not t and v.requires_grad and v.grad_fn is None
    assert not Variable(tg.ones(2, requires_grad=True) * 2).requires_grad
