"""grad_fn internals as torch shows them: name(), next_functions,
AccumulateGrad.variable, metadata, _saved_*, _raw_saved_* with
register_hooks, node hooks, and torchviz.make_dot on our graphs."""
import numpy as np
import pytest

import tracegrad as tg

FREED = "Trying to backward through the graph a second time"


def _x(*shape, seed=0):
    return tg.tensor(np.random.default_rng(seed).standard_normal(shape), requires_grad=True)


def test_names_of_common_nodes():
    x, w, b = _x(3), _x(3, 3, seed=1), _x(2, 3, 3, seed=2)
    cases = [(x * x, "MulBackward0"), (x + 1, "AddBackward0"), (x - x, "SubBackward0"),
             (x / 2, "DivBackward0"), (-x, "NegBackward0"), (x ** 3, "PowBackward0"),
             (x.abs() ** x, "PowBackward1"), (x.exp(), "ExpBackward0"), (x.sin(), "SinBackward0"),
             (x.cos(), "CosBackward0"), (x.tanh(), "TanhBackward0"),
             (x.sigmoid(), "SigmoidBackward0"), (x.abs().log(), "LogBackward0"),
             (w @ w, "MmBackward0"), (w @ x, "MvBackward0"), (x @ x, "DotBackward0"),
             (b @ b, "BmmBackward0"), (x.sum(), "SumBackward0"), (w.sum(0), "SumBackward1"),
             (x.view(3), "ViewBackward0"), (x.reshape(3, 1), "ViewBackward0"),
             (x.expand(2, 3), "ExpandBackward0"), (w.transpose(0, 1), "TransposeBackward0"),
             (b.permute(2, 0, 1), "PermuteBackward0"), (x[0], "SelectBackward0"),
             (x[0:2], "SliceBackward0"), (x[[0, 2]], "IndexBackward0"),
             (x.float(), "ToCopyBackward0"), (x.clone(), "CloneBackward0"),
             (x.relu(), "ReluBackward0")]
    for y, name in cases:
        assert y.grad_fn.name() == name
        assert type(y.grad_fn).__name__ == name
        assert repr(y.grad_fn).startswith(f"<{name} object at")
    acc = (x * 2).grad_fn.next_functions[0][0]
    assert acc.name() == "torch::autograd::AccumulateGrad"
    assert type(acc).__name__ == "AccumulateGrad" and acc.variable is x
    assert repr(acc).startswith("<AccumulateGrad object at")   # torch's repr, not name()
    assert acc.next_functions == ()


def test_identity_views_of_a_leaf_get_a_node():
    """x.view(x.shape) of a leaf that requires grad is a non-leaf view, as in torch."""
    x = _x(3)
    for y in (x.view(3), x.reshape(3), x.expand(3), x.permute(0), x.transpose(0, 0)):
        assert y is not x and not y.is_leaf and y.grad_fn is not None
        assert y.grad_fn.next_functions[0][0].variable is x
        y.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [5.0, 5.0, 5.0])
    z = tg.zeros(3)
    assert z.view(3) is z   # nothing recorded: the tensor itself


def test_next_functions_walk_to_leaves():
    x, w = _x(3), _x(3, 3, seed=1)
    y = (w @ x).exp().sum()
    s = y.grad_fn
    assert len(s.next_functions) == 1
    e = s.next_functions[0][0]
    assert e.name() == "ExpBackward0"
    mv = e.next_functions[0][0]
    assert [nf[0].variable for nf in mv.next_functions] == [w, x]
    m = (x * 2).grad_fn
    assert m.next_functions[1] == (None, 0)
    assert m.metadata == {} and isinstance(m.metadata, dict)
    m.metadata["k"] = 1
    assert m.metadata["k"] == 1


def test_saved_values():
    x = _x(3)
    xv = x.detach().numpy()
    m = (x * x).grad_fn
    assert m._saved_self is x and m._saved_other is x
    m2 = (x * 2).grad_fn
    assert m2._saved_self is None
    assert m2._saved_other.item() == 2 and m2._saved_other.shape == ()
    p = (x ** 3).grad_fn
    assert p._saved_self is x and p._saved_exponent == 3
    y = x.exp()
    r = y.grad_fn._saved_result
    assert r is not y
    np.testing.assert_allclose(r.numpy(), np.exp(xv))
    np.testing.assert_allclose(x.tanh().grad_fn._saved_result.numpy(), np.tanh(xv))
    np.testing.assert_allclose(x.sigmoid().grad_fn._saved_result.numpy(), 1 / (1 + np.exp(-xv)))
    assert x.sin().grad_fn._saved_self is x and x.cos().grad_fn._saved_self is x
    d = (x / x).grad_fn
    assert d._saved_self is x and d._saved_other is x
    w = _x(3, 4, seed=3)
    v = _x(4, 2, seed=4)
    mm = (w @ v).grad_fn
    assert mm._saved_self is w and mm._saved_mat2 is v
    assert mm._saved_self_sym_sizes == (3, 4) and mm._saved_mat2_sym_strides == (2, 1)
    s1 = w.sum(1, keepdim=True).grad_fn
    assert s1._saved_dim == (1,) and s1._saved_keepdim is True and s1._saved_self_sym_sizes == (3, 4)
    assert (x + x).grad_fn._saved_alpha == 1
    names = [n for n in dir(mm) if n.startswith("_saved_")]
    assert names == ["_saved_mat2", "_saved_mat2_sym_sizes", "_saved_mat2_sym_strides",
                     "_saved_self", "_saved_self_sym_sizes", "_saved_self_sym_strides"]
    assert "_raw_saved_self" in dir(mm) and "_raw_saved_self_sym_sizes" not in dir(mm)
    with pytest.raises(AttributeError, match="MmBackward0"):
        mm._saved_nothing


def test_saved_values_freed_after_backward():
    x = _x(3)
    y = x * x
    z = y.sum()
    z.backward()
    with pytest.raises(RuntimeError, match=FREED):
        y.grad_fn._saved_self
    assert z.grad_fn._saved_self_sym_sizes == (3,)   # sizes are not freed
    e = x.exp()
    e.sum().backward(retain_graph=True)
    np.testing.assert_allclose(e.grad_fn._saved_result.numpy(), np.exp(x.detach().numpy()))


def test_names_survive_backward():
    """Printing grad_fn after backward (a tutorial habit) shows torch's names."""
    x, w = _x(3), _x(3, 3, seed=1)
    ys = [w @ w, w @ x, x @ x, x ** 3, x.abs() ** _x(3, seed=2), x.exp()]
    sum(y.sum() for y in ys).backward()
    assert [y.grad_fn.name() for y in ys] == ["MmBackward0", "MvBackward0", "DotBackward0",
                                              "PowBackward0", "PowBackward1", "ExpBackward0"]
    assert type(ys[0].grad_fn).__name__ == "MmBackward0"


def test_saved_value_modified_in_place():
    a = _x(3)
    x = a * 1.0
    y = x * x
    x.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.grad_fn._saved_self


def test_raw_saved_register_hooks():
    x = _x(3)
    calls = []
    y = x * x
    raw = y.grad_fn._raw_saved_self

    def pack(t):
        calls.append("pack")
        return t.detach().numpy().copy()

    def unpack(a):
        calls.append("unpack")
        return tg.tensor(a)

    raw.register_hooks(pack, unpack)
    assert calls == ["pack"]
    y.sum().backward()
    assert calls == ["pack", "unpack"]
    np.testing.assert_allclose(x.grad.numpy(), 2 * x.detach().numpy())
    with pytest.raises(RuntimeError, match=FREED):
        raw.register_hooks(pack, unpack)


def test_raw_saved_result_hooks_change_what_backward_reads():
    x = _x(3)
    y = x.exp()
    y.grad_fn._raw_saved_result.register_hooks(lambda t: t * 2, lambda t: t)
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * np.exp(x.detach().numpy()))


def test_raw_saved_register_hooks_errors():
    x = _x(3)
    y = x * x
    raw = y.grad_fn._raw_saved_self
    with pytest.raises(TypeError, match="callable"):
        raw.register_hooks(1, lambda t: t)
    raw.register_hooks(lambda t: t, lambda t: t)
    with pytest.raises(RuntimeError, match="hooks have already been set"):
        raw.register_hooks(lambda t: t, lambda t: t)
    with pytest.raises(RuntimeError, match="value None is forbidden"):
        (x * 2).grad_fn._raw_saved_self.register_hooks(lambda t: t, lambda t: t)


def test_node_hooks():
    x = _x(3)
    s = x.sin()
    seen = []
    s.grad_fn.register_prehook(lambda go: seen.append(("pre", go[0].numpy().tolist())))
    h = s.grad_fn.register_hook(lambda gi, go: seen.append(("post", len(gi), len(go))))
    s.sum().backward(retain_graph=True)
    assert seen == [("pre", [1.0, 1.0, 1.0]), ("post", 1, 1)]
    np.testing.assert_allclose(x.grad.numpy(), np.cos(x.detach().numpy()))
    h.remove()
    x.grad = None
    s.grad_fn.register_prehook(lambda go: (go[0] * 3,))
    s.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 3 * np.cos(x.detach().numpy()))


def test_introspection_keeps_replay_and_backward_results():
    x = _x(4)
    for _ in range(3):
        y = (x.tanh() * x).sum()
        y.grad_fn.name(), y.grad_fn.next_functions[0][0]._saved_self
        x.grad = None
        y.backward()
    t = np.tanh(x.detach().numpy())
    np.testing.assert_allclose(x.grad.numpy(), t + x.detach().numpy() * (1 - t * t))


def test_a_graph_keeps_its_leaves_alive():
    """As in torch, AccumulateGrad holds its leaf: a leaf only the graph
    reaches is still there to show (and to receive its gradient)."""
    import gc
    import weakref
    y = tg.tensor(1.5, requires_grad=True).clone() * 2
    gc.collect()
    acc = y.grad_fn.next_functions[0][0].next_functions[0][0]
    assert acc.name() == "torch::autograd::AccumulateGrad"
    assert acc.variable is not None and acc.variable.shape == () and acc.variable.item() == 1.5
    y.backward()
    assert acc.variable.grad.item() == 2.0
    # and nothing else keeps it: no reference cycle between a leaf and its node
    gc.disable()
    try:
        x = tg.tensor([1.0], requires_grad=True)
        z = x * 2
        ref = weakref.ref(x)
        del x
        assert ref() is z.grad_fn.next_functions[0][0].variable
        del z
        assert ref() is None
    finally:
        gc.enable()


def test_leaf_hooks_outlive_each_graph():
    x = _x(2)
    seen = []
    x.register_hook(lambda g: seen.append(g.numpy().tolist()))
    x.register_post_accumulate_grad_hook(lambda t: seen.append("acc"))
    for _ in range(2):
        (x * 3).sum().backward()   # each graph gets the leaf's node, with its hooks
    assert seen == [[3.0, 3.0], "acc", [3.0, 3.0], "acc"]
    np.testing.assert_array_equal(x.grad.numpy(), [6.0, 6.0])


def test_built_in_nodes_have_no_saved_tensors():
    """Only a custom Function's node has saved_tensors (torchviz draws those)."""
    x = _x(3)
    y = x * x
    assert not hasattr(y.grad_fn, "saved_tensors")
    y.sum().backward()
    assert y.grad_fn.name() == "MulBackward0"   # introspection still works after backward


# --- torchviz ------------------------------------------------------------------------

def test_torchviz_make_dot():
    torchviz = pytest.importorskip("torchviz")
    w, b = _x(3, 2, seed=1), _x(2, seed=2)
    x = tg.tensor(np.random.default_rng(3).standard_normal((4, 3)))
    y = ((x @ w + b).tanh() ** 2).sum()
    dot = torchviz.make_dot(y)
    src = dot.source
    for name in ("SumBackward0", "PowBackward0", "TanhBackward0", "AddBackward0", "MmBackward0",
                 "AccumulateGrad"):
        assert name in src, name
    assert "(3, 2)" in src and "(2)" in src   # the leaves, with their sizes
    src = torchviz.make_dot(y, show_attrs=True, show_saved=True).source
    assert "exponent" in src and "mat2_sym_sizes" in src and "result" in src
    # built-in nodes draw no saved tensors by default, as in torch, and the
    # graph can be drawn after backward
    assert "orange" not in torchviz.make_dot(y).source
    y.backward()
    assert "MmBackward0" in torchviz.make_dot(y).source


def test_torchviz_double_backward_tutorial():
    """torch's "Double Backward with Custom Functions" tutorial draws the graph of
    a gradient whose leaf only the graph holds."""
    torchviz = pytest.importorskip("torchviz")

    class Square(tg.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x ** 2

        @staticmethod
        def backward(ctx, grad_out):
            x, = ctx.saved_tensors
            return grad_out * 2 * x

    x = tg.tensor(1., requires_grad=True).clone()
    out = Square.apply(x)
    grad_x, = tg.autograd.grad(out, x, create_graph=True)
    src = torchviz.make_dot((grad_x, x, out)).source
    for name in ("SquareBackward", "MulBackward0", "CloneBackward0", "AccumulateGrad"):
        assert name in src, name
    assert "orange" in src   # the Function's saved tensor


# --- parity with torch ---------------------------------------------------------------

def test_torch_parity_structure_and_saved_values():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    xv, wv = rng.uniform(0.5, 1.5, 3), rng.standard_normal((3, 3))
    x, w = tg.tensor(xv, requires_grad=True), tg.tensor(wv, requires_grad=True)
    tx, tw = torch.tensor(xv, requires_grad=True), torch.tensor(wv, requires_grad=True)
    fs = [lambda x, w: x * x, lambda x, w: x * 2, lambda x, w: x + x, lambda x, w: x / x,
          lambda x, w: x ** 3, lambda x, w: x ** x, lambda x, w: x.exp(), lambda x, w: x.sin(),
          lambda x, w: x.cos(), lambda x, w: x.tanh(), lambda x, w: x.sigmoid(),
          lambda x, w: x.log(), lambda x, w: w @ w, lambda x, w: w @ x, lambda x, w: x @ x,
          lambda x, w: x.sum(), lambda x, w: w.sum(0), lambda x, w: x.view(3),
          lambda x, w: x[0], lambda x, w: w.transpose(0, 1), lambda x, w: -x]
    for f in fs:
        ours, theirs = f(x, w).grad_fn, f(tx, tw).grad_fn
        assert ours.name() == theirs.name()
        saved = sorted(n for n in dir(theirs) if n.startswith("_saved_"))
        assert sorted(n for n in dir(ours) if n.startswith("_saved_")) == saved, ours.name()
        for n in saved:
            a, b = getattr(ours, n), getattr(theirs, n)
            if isinstance(b, torch.Tensor):
                np.testing.assert_allclose(np.asarray(a.detach().numpy()), b.detach().numpy())
            elif b is None:
                assert a is None
            else:
                assert tuple(np.atleast_1d(a)) == tuple(np.atleast_1d(b)), (ours.name(), n)
        assert [nf[0] is None for nf in ours.next_functions][:len(theirs.next_functions)] == \
               [nf[0] is None for nf in theirs.next_functions]
        assert [type(nf[0]).__name__ for nf in ours.next_functions if nf[0] is not None] == \
               [type(nf[0]).__name__ for nf in theirs.next_functions if nf[0] is not None]
    acc, tacc = (x * 2).grad_fn.next_functions[0][0], (tx * 2).grad_fn.next_functions[0][0]
    assert acc.name() == tacc.name()


def test_indexing_nodes_are_named_and_saved_as_torch_does():
    # torch's values: w[:, 0] is a select along dim 1; w[0, 1] the select
    # (dim 0, index 1) after another; a slice saves dim, start, end, step
    w = tg.ones(3, 4, 5, requires_grad=True)
    for y, dim, index in [(w[:, 0], 1, 0), (w[0], 0, 0), (w[1:, 0], 1, 0), (w[0, 1], 0, 1),
                          (w[1, :, 2], 1, 2)]:
        assert y.grad_fn.name() == "SelectBackward0"
        assert (y.grad_fn._saved_dim, y.grad_fn._saved_index) == (dim, index)
    for y, want in [(w[:, 1:], (1, 1, (1 << 63) - 1, 1)), (w[1:3], (0, 1, 3, 1)),
                    (w[:, 1:3:2], (1, 1, 3, 2))]:
        g = y.grad_fn
        assert g.name() == "SliceBackward0"
        assert (g._saved_dim, g._saved_start, g._saved_end, g._saved_step) == want
        assert g._saved_self_sym_sizes == (3, 4, 5)
    (w[:, 1] * 2).sum().backward()
    expected = np.zeros((3, 4, 5))
    expected[:, 1] = 2
    np.testing.assert_array_equal(w.grad.numpy(), expected)


def test_nodes_are_named_after_the_method_that_made_them_as_in_torch():
    # the same transpose or reduction primitive, named as torch names the
    # method's node (torch 2.13's names)
    x = tg.ones(2, 3, requires_grad=True)
    for y, name in [(x.t(), "TBackward0"), (x.T, "PermuteBackward0"),
                    (x.permute(1, 0), "PermuteBackward0"), (x.mT, "TransposeBackward0"),
                    (x.transpose(0, 1), "TransposeBackward0"), (x.max(), "MaxBackward1"),
                    (x.max(1)[0], "MaxBackward0"), (x.amax(), "AmaxBackward0")]:
        assert y.grad_fn.name() == name
    assert x.T.grad_fn._saved_dims == (1, 0) and x.permute(1, 0).grad_fn._saved_dims == (1, 0)
    v = x.max(1)[0]
    assert (v.grad_fn._saved_dim, v.grad_fn._saved_keepdim) == (1, False)
    assert v.grad_fn._saved_self_sym_sizes == (2, 3)
    # the gradients are the primitives' own
    z = tg.tensor([[1.0, 5.0, 2.0], [7.0, 0.0, 1.0]], requires_grad=True)
    (z.max(1)[0].sum() + z.t().sum() * 2).backward()
    np.testing.assert_array_equal(z.grad.numpy(), [[2, 3, 2], [3, 2, 2]])


# --- reflected operators record the tensor first, as torch does (issue 27) ----------

def _edge_names(t):
    return [(None if f is None else f.name(), i) for f, i in t.grad_fn.next_functions]


def test_reflected_operators_record_torch_next_functions():
    # torch 2.13: 2 * b is b.__rmul__(2) = mul(b, 2), so the tensor's edge is first
    a = tg.tensor([0.5, 1.0], requires_grad=True)
    b = a.sin()
    want = {
        "2*b": ("MulBackward0", [("SinBackward0", 0), (None, 0)]),
        "b*2": ("MulBackward0", [("SinBackward0", 0), (None, 0)]),
        "2.0*b": ("MulBackward0", [("SinBackward0", 0), (None, 0)]),
        "True*b": ("MulBackward0", [("SinBackward0", 0), (None, 0)]),
        "2+b": ("AddBackward0", [("SinBackward0", 0), (None, 0)]),
        "b+2": ("AddBackward0", [("SinBackward0", 0), (None, 0)]),
        "b-2": ("SubBackward0", [("SinBackward0", 0), (None, 0)]),
        "2/b": ("MulBackward0", [("ReciprocalBackward0", 0), (None, 0)]),
        "b/2": ("DivBackward0", [("SinBackward0", 0), (None, 0)]),
    }
    got = {"2*b": 2 * b, "b*2": b * 2, "2.0*b": 2.0 * b, "True*b": True * b, "2+b": 2 + b,
           "b+2": b + 2, "b-2": b - 2, "2/b": 2 / b, "b/2": b / 2}
    for k, (name, edges) in want.items():
        assert got[k].grad_fn.name() == name, k
        assert _edge_names(got[k]) == edges, k
    # 2 / b is b.reciprocal() * 2, whose reciprocal node follows b
    r = (2 / b).grad_fn.next_functions[0][0]
    assert r.next_functions[0][0] is b.grad_fn
    # the Gentle-introduction walk: d = 2 * sin(a) + 1
    d = 2 * b + 1
    walk = d.grad_fn.next_functions[0][0].next_functions[0][0]
    assert walk is b.grad_fn
    assert walk.next_functions[0][0].name() == "torch::autograd::AccumulateGrad"
    assert (2 ** b).grad_fn.name() == "PowBackward2"
    assert (2.5 ** b).grad_fn.name() == "PowBackward2"
    assert (b ** 2).grad_fn.name() == "PowBackward0"


def test_reflected_operators_values_and_gradients_match_torch():
    # torch 2.13, float32 (2 / b is computed as b.reciprocal() * 2)
    a = tg.tensor([0.3, 0.7, 1.1], requires_grad=True)
    assert (2 / a.sin()).tolist() == [6.767726421356201, 3.1045408248901367, 2.2441465854644775]
    (2 / a.sin()).sum().backward()
    np.testing.assert_allclose(a.grad.tolist(), [-21.878219604492188, -3.6858410835266113,
                                                 -1.1421990394592285], rtol=1e-6)
    a.grad = None
    (2 ** a.sin()).sum().backward()
    np.testing.assert_allclose(a.grad.tolist(), [0.8127225041389465, 0.8285642266273499,
                                                 0.583142876625061], rtol=1e-6)
    a.grad = None
    (3 - a.sin() + 2 * a.sin() + (1 + a)).sum().backward()
    np.testing.assert_allclose(a.grad.tolist(), np.cos([0.3, 0.7, 1.1]) + 1, rtol=1e-6)
    # an integer tensor divided into a number stays torch's true division
    i = tg.tensor([1, 2, 4])
    assert (2 / i).tolist() == [2.0, 1.0, 0.5]


# Expressions whose node torch names and wires as below (a number in a Scalar
# position has no edge at all: 2 - b is rsub(b, 2), b ** 2 pow(b, 2)).
_SLOT_CASES = {
    "2 - b": lambda t, b, c: 2 - b, "b - 2": lambda t, b, c: b - 2,
    "b ** 2": lambda t, b, c: b ** 2, "2 ** b": lambda t, b, c: 2 ** b,
    "b ** 0.5": lambda t, b, c: b ** 0.5, "b ** c": lambda t, b, c: b ** c,
    "2 / b": lambda t, b, c: 2 / b, "b / 2": lambda t, b, c: b / 2,
    "2 * b": lambda t, b, c: 2 * b, "b + 2": lambda t, b, c: b + 2,
    "b.pow(2)": lambda t, b, c: b.pow(2), "torch.pow(2, b)": lambda t, b, c: t.pow(2, b),
    "torch.pow(c, 2)": lambda t, b, c: t.pow(c, 2), "b.pow(c)": lambda t, b, c: b.pow(c),
    "b.clamp(0)": lambda t, b, c: b.clamp(0), "b.clamp(0, 1)": lambda t, b, c: b.clamp(0, 1),
    "b.clamp(max=1)": lambda t, b, c: b.clamp(max=1),
    "b.clamp_min(0)": lambda t, b, c: b.clamp_min(0),
    "b.clamp_max(0.9)": lambda t, b, c: b.clamp_max(0.9),
    "b.clamp(c)": lambda t, b, c: b.clamp(c),
    "b.clamp(min=c)": lambda t, b, c: b.clamp(min=c),
    "torch.rsub(b, 2)": lambda t, b, c: t.rsub(b, 2),
    "b.remainder(2)": lambda t, b, c: b.remainder(2), "b % 2": lambda t, b, c: b % 2,
    "b.fmod(2)": lambda t, b, c: b.fmod(2),
    "torch.where(b > 0.9, b, c)": lambda t, b, c: t.where(b > 0.9, b, c),
    "torch.where(b > 0.9, b, 0.)": lambda t, b, c: t.where(b > 0.9, b, 0.),
    "torch.atan2(b, c)": lambda t, b, c: t.atan2(b, c),
    "torch.cat([b, c])": lambda t, b, c: t.cat([b, c]),
    "b.mul(c)": lambda t, b, c: b.mul(c),
}


def _torch_view(node):
    """(name, [(edge name, nr)]) with torch's names for both libraries."""
    def nm(n):
        return None if n is None else n.name()
    return nm(node), [(nm(n), i) for n, i in node.next_functions]


@pytest.mark.parametrize("case", sorted(_SLOT_CASES))
def test_node_names_and_next_functions_match_torch(case):
    torch = pytest.importorskip("torch")
    got = {}
    for lib in (torch, tg):
        a = lib.tensor([0.5, 1.5], dtype=lib.float64, requires_grad=True)
        c = lib.tensor([2.0, 0.25], dtype=lib.float64, requires_grad=True)
        b = a.sin()
        out = _SLOT_CASES[case](lib, b, c)
        view = _torch_view(out.grad_fn)
        out.sum().backward()
        got[lib.__name__] = [view] + [None if v.grad is None else v.grad.detach().numpy().copy()
                                      for v in (a, c)]
    theirs, ours = got["torch"], got["tracegrad"]
    assert ours[0] == theirs[0]
    for t, g in zip(theirs[1:], ours[1:]):
        assert (t is None) == (g is None)
        if t is not None:
            np.testing.assert_allclose(g, t, rtol=1e-12)


def test_dropped_slots_keep_hooks_grad_and_double_backward():
    """A node without the number's slot runs backward, autograd.grad with
    create_graph, its post hook (one gradient per torch slot) and the
    replayed (compiled) backward of a repeated tape as before."""
    a = tg.tensor([0.5, 1.5], requires_grad=True)
    for f, d1 in [(lambda b: 2 - b, -np.cos([0.5, 1.5])),
                  (lambda b: b ** 2, 2 * np.sin([0.5, 1.5]) * np.cos([0.5, 1.5])),
                  (lambda b: b.clamp(0, 0.9),
                   np.where(np.sin([0.5, 1.5]) <= 0.9, np.cos([0.5, 1.5]), 0))]:
        out = f(a.sin())
        seen = []
        out.grad_fn.register_hook(lambda gi, go: seen.append(len(gi)))
        g, = tg.autograd.grad(out.sum(), a, create_graph=True)
        np.testing.assert_allclose(g.detach().numpy(), d1, rtol=1e-6)
        assert seen == [1]
        g.sum().backward()      # the second derivative through the same nodes
        assert a.grad is not None
        a.grad = None
    for _ in range(3):          # replay: the same tape shape, compiled after the first runs
        x = tg.tensor([0.2, 0.4], requires_grad=True)
        ((2 - x.sin()) ** 2 + x.clamp(0.3)).sum().backward()
        np.testing.assert_allclose(x.grad.numpy(),
                                   -2 * (2 - np.sin([0.2, 0.4])) * np.cos([0.2, 0.4]) +
                                   np.array([0.0, 1.0]), rtol=1e-6)
