"""The backward engine: tg.autograd.backward / grad with every parameter of
torch.autograd, their errors, accumulation, hooks, retain_grad, higher
derivatives, pruning, gradient aliasing and freeing of the tape."""
import gc
import warnings
import weakref

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.eager.graph import FREED_MSG, Node


def arr(t):
    return np.asarray(t.detach().numpy())


X = np.array([0.3, -0.7, 1.2])


def leaf(values=X, **kw):
    return tg.tensor(np.array(values, dtype=np.float64), requires_grad=True, **kw)


# --- backward -----------------------------------------------------------------------

def test_backward_scalar_and_accumulation():
    x = leaf()
    (x ** 3).sum().backward()
    np.testing.assert_allclose(arr(x.grad), 3 * X ** 2)
    (x * 2).sum().backward()  # accumulates
    np.testing.assert_allclose(arr(x.grad), 3 * X ** 2 + 2)


def test_backward_nonscalar_needs_gradient():
    x = leaf()
    y = x * x
    with pytest.raises(RuntimeError, match="^grad can be implicitly created only for scalar "
                                           "outputs$"):
        y.backward()
    y.backward(tg.tensor([1.0, 10.0, 100.0]))
    np.testing.assert_allclose(arr(x.grad), 2 * X * [1.0, 10.0, 100.0])
    x.grad = None
    (x * x).backward(np.array([1.0, 1.0, 1.0]))  # a plain array is accepted too
    np.testing.assert_allclose(arr(x.grad), 2 * X)


def test_backward_gradient_shape_mismatch():
    x = leaf()
    with pytest.raises(RuntimeError, match=r"Mismatch in shape: grad_output\[0\] has a shape of "
                                           r"\[2\] and output\[0\] has a shape of \[3\]\."):
        (x * 2).backward(tg.ones(2))
    with pytest.raises(RuntimeError, match=r"grad_output\[1\] has a shape of \[1\] and "
                                           r"output\[1\] has a shape of \[3\]"):
        tg.autograd.backward([x.sum(), x * 2], [None, tg.ones(1)])


def test_backward_on_tensor_without_grad():
    with pytest.raises(RuntimeError, match="element 0 of tensors does not require grad and does "
                                           "not have a grad_fn"):
        tg.ones(2).sum().backward()
    x = leaf()
    with pytest.raises(RuntimeError, match="element 1 of tensors does not require grad"):
        tg.autograd.backward([x.sum(), tg.ones(1).sum()])


def test_second_backward_through_freed_graph():
    x = leaf()
    y = (x * x).sum()
    y.backward()
    with pytest.raises(RuntimeError) as e:
        y.backward()
    assert str(e.value) == FREED_MSG
    assert "Specify retain_graph=True" in str(e.value)
    # with retain_graph the graph survives and gradients add up
    x.grad = None
    z = (x.exp()).sum()
    z.backward(retain_graph=True)
    z.backward()
    np.testing.assert_allclose(arr(x.grad), 2 * np.exp(X))
    # a graph that saved nothing (x + 1) can run again, as in torch
    x.grad = None
    w = (x + 1).sum()
    w.backward()
    w.backward()
    np.testing.assert_allclose(arr(x.grad), [2.0, 2.0, 2.0])


def test_autograd_backward_several_tensors_and_grad_tensors():
    x = leaf()
    a, b = x * 2, (x ** 2).sum()
    tg.autograd.backward([a, b], grad_tensors=[tg.tensor([1.0, 0.0, 1.0]), None])
    np.testing.assert_allclose(arr(x.grad), np.array([2.0, 0.0, 2.0]) + 2 * X)
    with pytest.raises(RuntimeError, match="`inputs` argument to `backward\\(\\)` cannot be empty"):
        tg.autograd.backward(b, inputs=[])


def test_backward_inputs_leaf_and_non_leaf():
    x, w = leaf(), leaf([2.0, 3.0, 4.0])
    y = x * w
    z = (y * y).sum()
    z.backward(inputs=[x], retain_graph=True)
    np.testing.assert_allclose(arr(x.grad), 2 * (X * [2, 3, 4]) * [2, 3, 4])
    assert w.grad is None  # only the given inputs accumulate
    z.backward(inputs=[y])  # a non-leaf input gets .grad too (as in torch 2)
    np.testing.assert_allclose(arr(y.grad), 2 * X * [2, 3, 4])
    np.testing.assert_allclose(arr(x.grad), 2 * (X * [2, 3, 4]) * [2, 3, 4])  # unchanged
    assert w.grad is None
    with pytest.raises(RuntimeError, match="One of the differentiated Tensors does not require "
                                           "grad"):
        (x * 2).sum().backward(inputs=[tg.ones(3)])


def test_backward_create_graph_grad_has_graph():
    x = leaf()
    (x ** 3).sum().backward(create_graph=True)
    g = x.grad
    assert g.requires_grad and g.grad_fn is not None
    np.testing.assert_allclose(arr(g), 3 * X ** 2)
    x.grad = None
    g.sum().backward()
    np.testing.assert_allclose(arr(x.grad), 6 * X)


# --- autograd.grad ---------------------------------------------------------------------

def test_grad_returns_tuple_and_leaves_dot_grad_alone():
    x, w = leaf(), leaf([1.0, 2.0, 3.0])
    out = (x * w).sum()
    gx, gw = tg.autograd.grad(out, [x, w])
    np.testing.assert_allclose(arr(gx), [1.0, 2.0, 3.0])
    np.testing.assert_allclose(arr(gw), X)
    assert x.grad is None and w.grad is None
    (g,) = tg.autograd.grad((x * x).sum(), x)
    np.testing.assert_allclose(arr(g), 2 * X)


def test_grad_outputs_and_non_leaf_inputs():
    x = leaf()
    y = x * 3
    z = y * y
    (gy,) = tg.autograd.grad(z, y, grad_outputs=tg.tensor([1.0, 2.0, 3.0]), retain_graph=True)
    np.testing.assert_allclose(arr(gy), 2 * 3 * X * [1.0, 2.0, 3.0])
    gx, gy2 = tg.autograd.grad([z.sum(), y.sum()], [x, y])
    np.testing.assert_allclose(arr(gx), 18 * X + 3)
    np.testing.assert_allclose(arr(gy2), 6 * X + 1)
    assert x.grad is None
    with pytest.raises(RuntimeError, match="Mismatch in shape"):
        tg.autograd.grad(x * 2, x, grad_outputs=[tg.ones(4)])


def test_grad_unused_input():
    x, unused = leaf(), leaf()
    out = (x * 2).sum()
    with pytest.raises(RuntimeError, match=r"^One of the differentiated Tensors appears to not "
                                           r"have been used in the graph\. Set "
                                           r"allow_unused=True if this is the desired behavior\.$"):
        tg.autograd.grad(out, [x, unused], retain_graph=True)
    gx, gu = tg.autograd.grad(out, [x, unused], allow_unused=True, retain_graph=True)
    assert gu is None and arr(gx).tolist() == [2.0, 2.0, 2.0]
    gx, gu = tg.autograd.grad(out, [x, unused], materialize_grads=True, retain_graph=True)
    assert arr(gu).tolist() == [0.0, 0.0, 0.0] and gu.shape == unused.shape
    with pytest.raises(ValueError, match="Expected allow_unused to be True or not passed when "
                                         "materialize_grads=True, but got: allow_unused=False."):
        tg.autograd.grad(out, [x, unused], allow_unused=False, materialize_grads=True)


def test_grad_errors():
    x = leaf()
    with pytest.raises(RuntimeError, match="element 0 of tensors does not require grad and does "
                                           "not have a grad_fn"):
        tg.autograd.grad(tg.ones(3).sum(), x)
    with pytest.raises(RuntimeError, match="One of the differentiated Tensors does not require "
                                           "grad"):
        tg.autograd.grad((x * 2).sum(), tg.ones(3))
    with pytest.raises(RuntimeError, match="`inputs` argument to `grad\\(\\)` cannot be empty"):
        tg.autograd.grad((x * 2).sum(), [])
    with pytest.raises(RuntimeError, match="grad can be implicitly created only for scalar"):
        tg.autograd.grad(x * 2, x)


def test_grad_is_grads_batched():
    x = leaf()
    y = x ** 2
    eye = tg.tensor(np.eye(3))
    (jac,) = tg.autograd.grad(y, x, eye, is_grads_batched=True)
    np.testing.assert_allclose(arr(jac), np.diag(2 * X))
    with pytest.raises(RuntimeError, match="If `is_grads_batched=True`, we interpret the first "
                                           "dimension"):
        tg.autograd.grad(x ** 2, x, tg.ones(3, 2), is_grads_batched=True)


def test_grad_prunes_branches_that_lead_to_no_input():
    x, w = leaf(), leaf([1.0, 1.0, 1.0])
    calls = []
    a = x * 2
    b = w.exp()
    b.register_hook(lambda g: calls.append("w-branch"))
    out = (a * b).sum()
    (gx,) = tg.autograd.grad(out, x)
    np.testing.assert_allclose(arr(gx), 2 * np.e * np.ones(3))
    assert calls == []  # the exp branch was never executed
    assert w.grad is None and x.grad is None


# --- higher derivatives -----------------------------------------------------------------

@pytest.mark.parametrize("f, d1, d2, d3", [
    (lambda x: x ** 3, lambda v: 3 * v ** 2, lambda v: 6 * v, lambda v: 6 + 0 * v),
    (lambda x: x.sin(), np.cos, lambda v: -np.sin(v), lambda v: -np.cos(v)),
    (lambda x: (2 * x).exp(), lambda v: 2 * np.exp(2 * v), lambda v: 4 * np.exp(2 * v),
     lambda v: 8 * np.exp(2 * v)),
    (lambda x: x.tanh(), lambda v: 1 - np.tanh(v) ** 2,
     lambda v: -2 * np.tanh(v) * (1 - np.tanh(v) ** 2),
     lambda v: (1 - np.tanh(v) ** 2) * (6 * np.tanh(v) ** 2 - 2)),
    (lambda x: (x * x).sin().exp(), lambda v: np.exp(np.sin(v * v)) * np.cos(v * v) * 2 * v,
     None, None),
])
def test_higher_derivatives_match_analytic(f, d1, d2, d3):
    x = leaf()
    y = f(x).sum()
    (g1,) = tg.autograd.grad(y, x, create_graph=True)
    np.testing.assert_allclose(arr(g1), d1(X), rtol=1e-12)
    if d2 is None:
        return
    (g2,) = tg.autograd.grad(g1.sum(), x, create_graph=True)
    np.testing.assert_allclose(arr(g2), d2(X), rtol=1e-12, atol=1e-14)
    (g3,) = tg.autograd.grad(g2.sum(), x, allow_unused=True, materialize_grads=True)
    np.testing.assert_allclose(arr(g3), d3(X), rtol=1e-12, atol=1e-14)


def test_mixed_second_derivative_and_hessian_vector_product():
    x, y = leaf([1.5]), leaf([-0.5])
    f = (x * x * y + y.exp() * x).sum()
    gx, gy = tg.autograd.grad(f, [x, y], create_graph=True)
    np.testing.assert_allclose(arr(gx), 2 * 1.5 * -0.5 + np.exp(-0.5))
    (gxy,) = tg.autograd.grad(gx.sum(), y)
    np.testing.assert_allclose(arr(gxy), 2 * 1.5 + np.exp(-0.5))


# --- hooks and retain_grad ---------------------------------------------------------------

def test_reference_example_hook_doubles_gradient():
    v = tg.tensor([0.0, 0.0, 0.0], requires_grad=True)
    h = v.register_hook(lambda grad: grad * 2)  # double the gradient
    v.backward(tg.tensor([1.0, 2.0, 3.0]))
    assert arr(v.grad).tolist() == [2.0, 4.0, 6.0]
    h.remove()  # removes the hook
    v.grad = None
    v.backward(tg.tensor([1.0, 2.0, 3.0]))
    assert arr(v.grad).tolist() == [1.0, 2.0, 3.0]


def test_hooks_run_in_registration_order_and_replace_the_gradient():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    y = x * 3
    seen = []
    y.register_hook(lambda g: seen.append(arr(g).tolist()) or g + 1)
    y.register_hook(lambda g: seen.append(arr(g).tolist()) or g * 10)
    y.register_hook(lambda g: seen.append(arr(g).tolist()))  # returns None: keeps g
    y.sum().backward()
    assert seen == [[1.0, 1.0], [2.0, 2.0], [20.0, 20.0]]
    assert arr(x.grad).tolist() == [60.0, 60.0]


def test_retain_grad_sees_hooked_gradient_and_non_leaf_grad_warning():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    y = x * 3
    y.retain_grad()
    assert y.retains_grad and not x.retains_grad
    y.register_hook(lambda g: g * 2)
    (y * y).sum().backward()
    # retain_grad hooks run after the tensor's own hooks (torch >= 2)
    np.testing.assert_allclose(arr(y.grad), 2 * 2 * 3 * np.array([1.0, 2.0]))
    np.testing.assert_allclose(arr(x.grad), 3 * 2 * 2 * 3 * np.array([1.0, 2.0]))
    z = x * 2
    with pytest.warns(UserWarning, match="The .grad attribute of a Tensor that is not a leaf "
                                         "Tensor is being accessed"):
        assert z.grad is None
    z.sum().backward()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert z.grad is None


def test_retain_grad_accumulates_and_is_private():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    y = x * 1
    y.retain_grad()
    out = y.sum()
    out.backward(retain_graph=True)
    out.backward()
    assert arr(y.grad).tolist() == [2.0, 2.0]
    assert arr(x.grad).tolist() == [2.0, 2.0]
    y.grad.zero_()
    assert arr(x.grad).tolist() == [2.0, 2.0]


def test_leaf_hook_changes_what_accumulates():
    w = tg.tensor([1.0, 1.0], requires_grad=True)
    w.register_hook(lambda g: g * 0.5)
    (w * 4).sum().backward()
    assert arr(w.grad).tolist() == [2.0, 2.0]


def test_register_hook_on_tensor_without_grad():
    with pytest.raises(RuntimeError, match="cannot register a hook on a tensor that doesn't "
                                           "require gradient"):
        tg.ones(2).register_hook(lambda g: g)
    with pytest.raises(RuntimeError, match="can't retain_grad on Tensor that has "
                                           "requires_grad=False"):
        tg.ones(2).retain_grad()


def test_node_hooks():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    y = x * 5
    seen = {}
    y.grad_fn.register_prehook(lambda gouts: seen.update(pre=arr(gouts[0]).tolist()))
    y.grad_fn.register_hook(lambda gins, gouts: (gins[0] * 0 + 7, gins[1]))
    y.sum().backward()
    assert seen["pre"] == [1.0, 1.0]
    assert arr(x.grad).tolist() == [7.0, 7.0]


# --- aliasing -------------------------------------------------------------------------

def test_two_leaves_never_share_a_grad_array():
    a, b = leaf(), leaf()
    (a + b).sum().backward()  # add passes one gradient object to both inputs
    assert a.grad._data is not b.grad._data
    a.grad.mul_(10.0)
    assert arr(b.grad).tolist() == [1.0, 1.0, 1.0]
    c, d = leaf(), leaf()
    (c + d).sum().backward(create_graph=True)
    assert c.grad is not d.grad and c.grad._data is not d.grad._data


def test_user_gradient_is_never_modified():
    x = leaf()
    g = tg.tensor([1.0, 2.0, 3.0], dtype=tg.float64)
    x.backward(g)  # x is a leaf: the root gradient goes straight to AccumulateGrad
    x.backward(g)
    assert arr(g).tolist() == [1.0, 2.0, 3.0]
    assert arr(x.grad).tolist() == [2.0, 4.0, 6.0]
    y = x * 1
    y.retain_grad()
    y.backward(g)
    y.grad.add_(100.0)
    assert arr(g).tolist() == [1.0, 2.0, 3.0]
    x.grad = tg.zeros(3, dtype=tg.float64)
    user = x.grad
    (x * 2).sum().backward()  # accumulates into the assigned .grad in place (torch rule 3)
    assert x.grad is user and arr(user).tolist() == [2.0, 2.0, 2.0]


# --- multi-output nodes ---------------------------------------------------------------------

def test_multi_output_node_with_gradient_for_some_outputs():
    x = tg.tensor(np.arange(6.0), requires_grad=True)
    a, b, c = tg.split(x, 2)   # torch: pieces of size 2
    assert a.grad_fn is b.grad_fn and a.grad_fn.name() == "SplitBackward0"
    assert (a.output_nr, b.output_nr, c.output_nr) == (0, 1, 2)
    (a * 2).sum().backward()
    assert arr(x.grad).tolist() == [2.0, 2.0, 0.0, 0.0, 0.0, 0.0]
    x.grad = None
    (a.sum() + (c * c).sum()).backward()
    assert arr(x.grad).tolist() == [1.0, 1.0, 0.0, 0.0, 8.0, 10.0]
    y = x * 1
    p, q, r = tg.split(y, 2)
    with pytest.raises(RuntimeError, match="Output 0 of SplitBackward0 is a view and is being "
                                           "modified inplace"):
        p.mul_(2.0)
    assert arr(y).tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


# --- the tape is freed ------------------------------------------------------------------

def test_backward_frees_saved_values():
    x = leaf()
    y = x.exp()
    z = (y * x).sum()
    mul = z.grad_fn.next_functions[0][0]
    assert mul.saved is not None and y.grad_fn.out_saved is not None
    z.backward()
    assert mul.saved is None and y.grad_fn.out_saved is None


def test_training_loop_does_not_grow():
    rng = np.random.default_rng(0)
    W = tg.tensor(rng.standard_normal((4, 3)) * 0.1, requires_grad=True)
    b = tg.zeros(3, requires_grad=True)
    X_ = tg.tensor(rng.standard_normal((8, 4)))
    Y_ = tg.tensor(rng.standard_normal((8, 3)))
    nodes = weakref.WeakSet()  # drops each node when it dies

    def step(track):
        loss = ((X_ @ W + b).tanh() - Y_).pow(2).sum()
        if track:
            nodes.add(loss.grad_fn)
            nodes.add(loss.grad_fn.next_functions[0][0])
        loss.backward()
        with tg.no_grad():
            W.sub_(0.01 * W.grad)
            b.sub_(0.01 * b.grad)
        W.grad.zero_()
        b.grad = None
        return loss.item()

    # Replayed tapes are kept in a bounded table: plans of earlier tests
    # evicted during the loop would count as objects freed here.
    from tracegrad.autograd import replay
    replay.clear()
    first = step(True)
    for _ in range(100):
        step(False)
    gc.collect()
    objects_before = len(gc.get_objects())
    tensors_before = sum(isinstance(o, (tg.Tensor, Node)) for o in gc.get_objects())
    for i in range(10_000):
        last = step(i % 100 == 0)
    gc.collect()
    objects_after = len(gc.get_objects())
    tensors_after = sum(isinstance(o, (tg.Tensor, Node)) for o in gc.get_objects())
    assert len(nodes) == 0  # every step's graph is gone (tracked every 100th step)
    assert tensors_before >= 4 and tensors_after == tensors_before  # nothing outlives its step
    # Growth is the leak; earlier tests' entries evicted from bounded tables
    # during the loop may free objects (the count may fall).
    assert objects_after - objects_before < 50, (objects_before, objects_after)
    assert last < first
