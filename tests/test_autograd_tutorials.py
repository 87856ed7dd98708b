"""The PyTorch autograd tutorials, run to their last cell with only
``import torch`` changed to ``import tracegrad as torch`` (issue 27).

Each test is one tutorial's code (its random inputs replaced by fixed
values, its sizes shrunk where the tutorial's only point is speed, and a
torchvision model replaced by a small module); ``rec`` notes what the
tutorial prints, and the test compares it with what real torch 2.13 prints
for the same code (``EXPECTED``, at the end of this file, was produced by
running the functions below under real torch).

Tutorials:
  * A Gentle Introduction to torch.autograd (beginner/blitz)
  * The Fundamentals of Autograd (introyt), with the high-level API section
  * Automatic Differentiation with torch.autograd (basics)
  * Autograd mechanics (notes): saved tensors, hooks, grad modes
  * Forward-mode Automatic Differentiation
  * Double Backward with Custom Functions (torchviz's walk of the graph)
  * Hooks for saved tensors
  * Jacobians, Hessians, hvp, vhp, and more (torch.func)
  * Per-sample-gradients (torch.func)
Not here: "Fusing Convolution and Batch Norm using Custom Function" needs
``torch.nn.grad.conv2d_input`` / ``conv2d_weight``, which tracegrad lacks,
and the disk-offloading cell of the saved-tensor-hooks tutorial needs
``torch.save`` / ``torch.load``.
"""
import functools
import math

import numpy as np
import pytest

import tracegrad as torch

nn = torch.nn
F = torch.nn.functional


def _plain(v):
    """A printed value as plain Python (nested lists of floats, bools, str)."""
    if isinstance(v, (bool, str, int, float)) or v is None:
        return v
    if isinstance(v, (tuple, list)):
        return [_plain(e) for e in v]
    if isinstance(v, dict):
        return {k: _plain(e) for k, e in v.items()}
    if hasattr(v, "detach"):
        return np.asarray(v.detach().cpu().numpy(), dtype=float).tolist()
    return v


class _Rec:
    def __init__(self):
        self.out = []

    def __call__(self, name, value):
        self.out.append((name, _plain(value)))


def _close(got, want, path=""):
    if isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), (path, got, want)
        for i, (g, w) in enumerate(zip(got, want)):
            _close(g, w, f"{path}[{i}]")
    elif isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want), (path, got, want)
        for k in want:
            _close(got[k], want[k], f"{path}.{k}")
    elif isinstance(want, float) and not isinstance(got, bool):
        assert isinstance(got, (int, float)), (path, got, want)
        assert math.isclose(got, want, rel_tol=1e-5, abs_tol=1e-5), (path, got, want)
    else:
        assert got == want, (path, got, want)


def _check(name, fn):
    rec = _Rec()
    fn(rec)
    got = dict(rec.out)
    assert [n for n, _ in rec.out] == [n for n, _ in EXPECTED[name]]
    for n, want in EXPECTED[name]:
        _close(got[n], want, n)


def _fixed(*shape, seed=0, scale=1.0):
    """Fixed "random" values (the tutorials' torch.randn / torch.rand)."""
    rng = np.random.default_rng(seed)
    return torch.tensor((rng.standard_normal(shape) * scale).astype(np.float32))


def _names(fn):
    """The node's name as printing it shows: ``<MulBackward0 object at 0x...>``."""
    return None if fn is None else repr(fn)[1:].split(" ")[0]


def _edges(fn):
    return [[_names(f), i] for f, i in fn.next_functions]


# --- A Gentle Introduction to torch.autograd -------------------------------------------

def tutorial_gentle(rec):
    a = torch.tensor([2., 3.], requires_grad=True)
    b = torch.tensor([6., 4.], requires_grad=True)
    Q = 3 * a ** 3 - b ** 2
    external_grad = torch.tensor([1., 1.])
    Q.backward(gradient=external_grad)
    rec("9a^2 == a.grad", 9 * a ** 2 == a.grad)
    rec("-2b == b.grad", -2 * b == b.grad)
    rec("Q.grad_fn", Q.grad_fn.name())

    x = _fixed(5, 5, seed=1)
    y = _fixed(5, 5, seed=2)
    z = _fixed(5, 5, seed=3).requires_grad_()
    a = x + y
    rec("a requires grad", a.requires_grad)
    b = x + z
    rec("b requires grad", b.requires_grad)

    # the frozen "pretrained" model (resnet18 in the tutorial) and its new head
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Linear(6, 4)
            self.fc = nn.Linear(4, 3)

        def forward(self, x):
            return self.fc(self.body(x).relu())

    model = Net()
    for param in model.parameters():
        param.requires_grad = False
    model.fc = nn.Linear(4, 2)
    with torch.no_grad():
        model.body.weight.copy_(_fixed(4, 6, seed=4))
        model.body.bias.copy_(_fixed(4, seed=5))
        model.fc.weight.copy_(_fixed(2, 4, seed=6))
        model.fc.bias.copy_(_fixed(2, seed=7))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
    data = _fixed(3, 6, seed=8)
    labels = _fixed(3, 2, seed=9)
    prediction = model(data)
    loss = (prediction - labels).sum()
    loss.backward()
    optimizer.step()
    rec("frozen weight grad", model.body.weight.grad is None)
    rec("fc weight grad", model.fc.weight.grad)
    rec("fc weight after step", model.fc.weight)


def test_gentle_introduction():
    _check("gentle", tutorial_gentle)


# --- The Fundamentals of Autograd -------------------------------------------------------

def tutorial_fundamentals(rec):
    a = torch.linspace(0., 2. * math.pi, steps=25, requires_grad=True)
    rec("a", a)
    b = torch.sin(a)
    rec("b.grad_fn", b.grad_fn.name())
    c = 2 * b
    rec("c", c)
    d = c + 1
    rec("d", d)
    out = d.sum()
    rec("out", out)
    rec("d.grad_fn", d.grad_fn.name())
    rec("d.next", _edges(d.grad_fn))
    rec("d.next.next", _edges(d.grad_fn.next_functions[0][0]))
    rec("d.next.next.next", _edges(d.grad_fn.next_functions[0][0].next_functions[0][0]))
    rec("d.next^4", _edges(d.grad_fn.next_functions[0][0].next_functions[0][0]
                           .next_functions[0][0]))
    rec("c.grad_fn", c.grad_fn.name())
    rec("b.grad_fn.name", b.grad_fn.name())
    rec("a.grad_fn", a.grad_fn)
    out.backward()
    rec("a.grad", a.grad)

    BATCH_SIZE, DIM_IN, HIDDEN_SIZE, DIM_OUT = 4, 20, 12, 5

    class TinyModel(torch.nn.Module):
        def __init__(self):
            super(TinyModel, self).__init__()
            self.layer1 = torch.nn.Linear(DIM_IN, HIDDEN_SIZE)
            self.relu = torch.nn.ReLU()
            self.layer2 = torch.nn.Linear(HIDDEN_SIZE, DIM_OUT)

        def forward(self, x):
            x = self.layer1(x)
            x = self.relu(x)
            x = self.layer2(x)
            return x

    some_input = _fixed(BATCH_SIZE, DIM_IN, seed=10).requires_grad_(False)
    ideal_output = _fixed(BATCH_SIZE, DIM_OUT, seed=11).requires_grad_(False)
    model = TinyModel()
    with torch.no_grad():
        model.layer1.weight.copy_(_fixed(HIDDEN_SIZE, DIM_IN, seed=12, scale=0.2))
        model.layer1.bias.copy_(_fixed(HIDDEN_SIZE, seed=13, scale=0.2))
        model.layer2.weight.copy_(_fixed(DIM_OUT, HIDDEN_SIZE, seed=14, scale=0.2))
        model.layer2.bias.copy_(_fixed(DIM_OUT, seed=15, scale=0.2))
    rec("layer2.weight[0][0:10]", model.layer2.weight[0][0:10])
    rec("layer2.weight.grad", model.layer2.weight.grad)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.001)
    prediction = model(some_input)
    loss = (ideal_output - prediction).pow(2).sum()
    rec("loss", loss)
    loss.backward()
    rec("layer2.weight[0][0:10] after backward", model.layer2.weight[0][0:10])
    rec("layer2.weight.grad[0][0:10]", model.layer2.weight.grad[0][0:10])
    optimizer.step()
    rec("layer2.weight[0][0:10] after step", model.layer2.weight[0][0:10])
    rec("grad before zero", model.layer2.weight.grad[0][0:10])
    for i in range(0, 5):
        prediction = model(some_input)
        loss = (ideal_output - prediction).pow(2).sum()
        loss.backward()
    rec("grad after 5 more", model.layer2.weight.grad[0][0:10])
    optimizer.zero_grad(set_to_none=False)
    rec("grad after zero_grad", model.layer2.weight.grad[0][0:10])

    a = torch.ones(2, 3, requires_grad=True)
    rec("a ones", a)
    b1 = 2 * a
    rec("b1", b1)
    a.requires_grad = False
    b2 = 2 * a
    rec("b2", b2)
    rec("b2 requires grad", b2.requires_grad)

    a = torch.ones(2, 3, requires_grad=True) * 2
    b = torch.ones(2, 3, requires_grad=True) * 3
    c1 = a + b
    rec("c1", c1)
    rec("c1 requires grad", c1.requires_grad)
    with torch.no_grad():
        c2 = a + b
    rec("c2 requires grad", c2.requires_grad)
    c3 = a * b
    rec("c3 grad_fn", c3.grad_fn.name())

    def add_tensors1(x, y):
        return x + y

    @torch.no_grad()
    def add_tensors2(x, y):
        return x + y

    a = torch.ones(2, 3, requires_grad=True) * 2
    b = torch.ones(2, 3, requires_grad=True) * 3
    c1 = add_tensors1(a, b)
    rec("add_tensors1 requires grad", c1.requires_grad)
    c2 = add_tensors2(a, b)
    rec("add_tensors2 requires grad", c2.requires_grad)

    x = _fixed(5, seed=16).requires_grad_()
    y = x.detach()
    rec("x requires grad", x.requires_grad)
    rec("y requires grad", y.requires_grad)

    a = torch.linspace(0., 2. * math.pi, steps=25, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        a.sin_()   # the tutorial's torch.sin_(a): tracegrad has no function torch.sin_
    rec("in-place on a leaf raises", True)

    x = _fixed(2, 3, seed=17).requires_grad_()
    y = x * 2
    z = y.sum()
    z.backward()
    rec("x.grad", x.grad)

    # the high-level API
    def exp_adder(x, y):
        return 2 * x.exp() + 3 * y

    inputs = (torch.tensor([0.1, 0.2]), torch.tensor([0.3, 0.4]))
    rec("jacobian exp_adder", torch.autograd.functional.jacobian(exp_adder, inputs))

    def exp_reducer(x):
        return x.exp().sum(dim=1)

    inputs = torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]])
    rec("jacobian exp_reducer", torch.autograd.functional.jacobian(exp_reducer, inputs))

    def do_stuff(x):
        y = x * 2
        while y.data.norm() < 1000:
            y = y * 2
        return y

    inputs = torch.tensor([0.1, 0.2, 0.3])
    my_gradients = torch.tensor([0.1, 1.0, 0.0001])
    rec("vjp do_stuff", torch.autograd.functional.vjp(do_stuff, inputs, my_gradients))
    inputs = torch.tensor([1.5, -2.0, 3.0])
    rec("vjp do_stuff 2", torch.autograd.functional.vjp(do_stuff, inputs, my_gradients))
    rec("jacobian do_stuff", torch.autograd.functional.jacobian(do_stuff, inputs))


def test_fundamentals_of_autograd():
    _check("fundamentals", tutorial_fundamentals)


# --- Automatic Differentiation with torch.autograd --------------------------------------

def tutorial_basics(rec):
    x = torch.ones(5)
    y = torch.zeros(3)
    w = _fixed(5, 3, seed=20).requires_grad_()
    b = _fixed(3, seed=21).requires_grad_()
    z = torch.matmul(x, w) + b
    loss = torch.nn.functional.binary_cross_entropy_with_logits(z, y)
    rec("z.grad_fn", z.grad_fn.name())
    # (the tutorial prints loss.grad_fn too: torch's
    # BinaryCrossEntropyWithLogitsBackward0, where tracegrad's loss, built
    # from smaller ops, ends in the mean's DivBackward0)
    rec("loss", loss)
    loss.backward()
    rec("w.grad", w.grad)
    rec("b.grad", b.grad)
    z = torch.matmul(x, w) + b
    rec("z requires grad", z.requires_grad)
    with torch.no_grad():
        z = torch.matmul(x, w) + b
    rec("z requires grad under no_grad", z.requires_grad)
    z = torch.matmul(x, w) + b
    z_det = z.detach()
    rec("z_det requires grad", z_det.requires_grad)

    inp = torch.eye(4, 5, requires_grad=True)
    out = (inp + 1).pow(2).t()
    out.backward(torch.ones_like(out), retain_graph=True)
    rec("First call", inp.grad)
    out.backward(torch.ones_like(out), retain_graph=True)
    rec("Second call", inp.grad)
    inp.grad.zero_()
    out.backward(torch.ones_like(out), retain_graph=True)
    rec("Call after zeroing gradients", inp.grad)


def test_automatic_differentiation_basics():
    _check("basics", tutorial_basics)


# --- Autograd mechanics (notes) ---------------------------------------------------------

def tutorial_mechanics(rec):
    x = _fixed(5, seed=30).requires_grad_()
    y = x.pow(2)
    rec("x equal _saved_self", x.equal(y.grad_fn._saved_self))
    rec("x is _saved_self", x is y.grad_fn._saved_self)
    y = x.exp()
    rec("y equal _saved_result", y.equal(y.grad_fn._saved_result))
    rec("y is _saved_result", y is y.grad_fn._saved_result)

    # grad modes
    x = torch.ones(3, requires_grad=True)
    with torch.no_grad():
        rec("no_grad", (x * 2).requires_grad)
    with torch.inference_mode():
        rec("inference_mode", (x * 2).requires_grad)
    with torch.set_grad_enabled(False):
        rec("set_grad_enabled(False)", (x * 2).requires_grad)
    rec("grad enabled", torch.is_grad_enabled())

    # in-place correctness checks
    a = torch.tensor([1., 2., 3.], requires_grad=True)
    b = a.sigmoid()
    b.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        b.sum().backward()
    rec("inplace check raises", True)

    # hooks on saved tensors of one node
    x = torch.tensor([1., 2., 3.], requires_grad=True)
    y = x.pow(2)
    seen = []
    y.grad_fn._raw_saved_self.register_hooks(lambda t: (seen.append("pack"), t * 2)[1],
                                             lambda t: (seen.append("unpack"), t / 2)[1])
    y.sum().backward()
    rec("raw saved hooks", seen)
    rec("x.grad", x.grad)

    # backward hooks: tensor hooks, node pre-hooks and hooks, in order
    order = []
    a = torch.tensor([1., 2.], requires_grad=True)
    b = a.mul(2)
    b.register_hook(lambda g: (order.append("tensor hook"), g * 3)[1])
    b.grad_fn.register_prehook(lambda gO: (order.append("prehook"), None)[1])
    b.grad_fn.register_hook(lambda gI, gO: (order.append("hook"), None)[1])
    b.sum().backward()
    rec("hook order", order)
    rec("a.grad with hook", a.grad)

    # retain_grad and post-accumulate-grad hooks
    a = torch.tensor([1., 2.], requires_grad=True)
    b = a * a
    b.retain_grad()
    acc = []
    a.register_post_accumulate_grad_hook(lambda p: acc.append(p.grad.clone()))
    b.sum().backward()
    rec("b.grad retained", b.grad)
    rec("post accumulate", acc)


def test_autograd_mechanics():
    _check("mechanics", tutorial_mechanics)


# --- Forward-mode Automatic Differentiation ---------------------------------------------

def tutorial_forward_ad(rec):
    import tracegrad.autograd.forward_ad as fwAD   # torch.autograd.forward_ad

    primal = torch.tensor([[0.1, 0.2], [0.3, -0.4]])
    tangent = torch.tensor([[1.0, 0.5], [-0.25, 2.0]])

    def fn(x, y):
        return x ** 2 + y ** 2

    with fwAD.dual_level():
        dual_input = fwAD.make_dual(primal, tangent)
        rec("tangent is tangent", fwAD.unpack_dual(dual_input).tangent is tangent)
        dual_input_alt = fwAD.make_dual(primal, tangent.T)
        rec("tangent.T is not tangent",
            fwAD.unpack_dual(dual_input_alt).tangent is not tangent)
        plain_tensor = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
        dual_output = fn(dual_input, plain_tensor)
        jvp = fwAD.unpack_dual(dual_output).tangent
        rec("jvp", jvp)
    rec("tangent after level", fwAD.unpack_dual(dual_output).tangent is None)

    w = torch.tensor([[0.1 * (i - j) for j in range(5)] for i in range(5)])
    bias = torch.tensor([0.1, -0.2, 0.3, -0.4, 0.5])
    input = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0], [0.5, -0.5, 1.5, -1.5, 2.0],
                          [0.0, 1.0, 0.0, 1.0, 0.0], [1.0] * 5, [-1.0] * 5])

    def make_model():
        model = nn.Linear(5, 5)
        with torch.no_grad():
            model.weight.copy_(w)
            model.bias.copy_(bias)
        return model

    model = make_model()
    params = {name: p for name, p in model.named_parameters()}
    tangents = {name: torch.ones_like(p) * 0.5 for name, p in params.items()}
    with fwAD.dual_level():
        for name, p in params.items():
            delattr(model, name)
            setattr(model, name, fwAD.make_dual(p, tangents[name]))
        out = model(input)
        jvp = fwAD.unpack_dual(out).tangent
    rec("module jvp", jvp)

    functional_call = torch.func.functional_call   # from torch.func import functional_call
    model = make_model()
    params = {name: p for name, p in model.named_parameters()}
    dual_params = {}
    with fwAD.dual_level():
        for name, p in params.items():
            dual_params[name] = fwAD.make_dual(p, tangents[name])
        out = functional_call(model, dual_params, input)
        jvp2 = fwAD.unpack_dual(out).tangent
    rec("functional_call jvp matches", torch.allclose(jvp, jvp2))
    rec("model keeps its parameters", model.weight is params["weight"])

    class Fn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, foo):
            result = torch.exp(foo)
            ctx.result = result
            return result

        @staticmethod
        def jvp(ctx, gI):
            gO = gI * ctx.result
            del ctx.result
            return gO

    fn = Fn.apply
    primal = torch.tensor([[0.1, 0.2], [0.3, -0.4]], dtype=torch.double, requires_grad=True)
    tangent = torch.tensor([[1.0, 0.5], [-0.25, 2.0]], dtype=torch.double)
    with fwAD.dual_level():
        dual_input = fwAD.make_dual(primal, tangent)
        dual_output = fn(dual_input)
        jvp = fwAD.unpack_dual(dual_output).tangent
    rec("custom Function jvp", jvp)
    rec("gradcheck forward AD", torch.autograd.gradcheck(
        Fn.apply, (primal,), check_forward_ad=True, check_backward_ad=False,
        check_undefined_grad=False, check_batched_grad=False))

    # functorch API
    primal = torch.tensor([[0.1, 0.2], [0.3, -0.4]])
    tangent = torch.tensor([[1.0, 0.5], [-0.25, 2.0]])
    y = torch.tensor([[1.0, 2.0], [3.0, 4.0]])

    def fn(x, y):
        return x ** 2 + y ** 2

    new_fn = functools.partial(fn, y=y)
    primal_out, tangent_out = torch.func.jvp(new_fn, (primal,), (tangent,))
    rec("func.jvp primal", primal_out)
    rec("func.jvp tangent", tangent_out)

    model = make_model()
    params = {k: v.detach() for k, v in model.named_parameters()}

    def func_params_only(p):
        return torch.func.functional_call(model, p, input)

    _, jvp_out = torch.func.jvp(func_params_only, (params,), (tangents,))
    rec("func.jvp over a module", jvp_out)


def test_forward_mode_ad():
    _check("forward_ad", tutorial_forward_ad)


# --- Double Backward with Custom Functions ----------------------------------------------

def _make_dot_labels(var, params):
    """torchviz.make_dot's walk of the graph (torchviz 0.0.3, show_attrs and
    show_saved off), giving the labels of its nodes and how many edges it
    draws: what it reads of grad_fn (next_functions, ``variable``,
    ``saved_tensors``) and of tensors (size, grad_fn, _is_view, _base)."""
    param_map = {id(v): k for k, v in params.items()}
    seen = set()
    nodes, edges = [], []

    def var_name(v, name=None):
        if not name:
            name = param_map[id(v)] if id(v) in param_map else ""
        return "%s\n (%s)" % (name, ", ".join("%d" % s for s in v.size()))

    def add_nodes(fn):
        assert not torch.is_tensor(fn)
        if fn in seen:
            return
        seen.add(fn)
        if hasattr(fn, "variable"):
            v = fn.variable
            seen.add(v)
            nodes.append((var_name(v), "lightblue"))
            edges.append((id(v), id(fn)))
        nodes.append((str(type(fn).__name__), None))
        if hasattr(fn, "next_functions"):
            for u in fn.next_functions:
                if u[0] is not None:
                    edges.append((id(u[0]), id(fn)))
                    add_nodes(u[0])
        if hasattr(fn, "saved_tensors"):
            for t in fn.saved_tensors:
                seen.add(t)
                edges.append((id(t), id(fn)))
                nodes.append((var_name(t), "orange"))

    def add_base_tensor(v, color="darkolivegreen1"):
        if v in seen:
            return
        seen.add(v)
        nodes.append((var_name(v), color))
        if v.grad_fn:
            add_nodes(v.grad_fn)
            edges.append((id(v.grad_fn), id(v)))
        if v._is_view():
            add_base_tensor(v._base, color="darkolivegreen3")
            edges.append((id(v._base), id(v)))

    for v in var:
        add_base_tensor(v)
    return [sorted(nodes, key=repr), len(edges)]


def tutorial_double_backward(rec):
    class Square(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x ** 2

        @staticmethod
        def backward(ctx, grad_out):
            x, = ctx.saved_tensors
            return grad_out * 2 * x

    x = _fixed(3, 3, seed=40).double().requires_grad_()
    rec("Square gradcheck", torch.autograd.gradcheck(Square.apply, x))
    rec("Square gradgradcheck", torch.autograd.gradgradcheck(Square.apply, x))
    x = torch.tensor(1., requires_grad=True).clone()
    out = Square.apply(x)
    grad_x, = torch.autograd.grad(out, x, create_graph=True)
    rec("Square graph", _make_dot_labels((grad_x, x, out),
                                         {"grad_x": grad_x, "x": x, "out": out}))

    class Exp(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            result = torch.exp(x)
            ctx.save_for_backward(result)
            return result

        @staticmethod
        def backward(ctx, grad_out):
            result, = ctx.saved_tensors
            return result * grad_out

    x = torch.tensor(1., requires_grad=True, dtype=torch.double).clone()
    out = Exp.apply(x)
    grad_x, = torch.autograd.grad(out, x, create_graph=True)
    rec("Exp gradcheck", torch.autograd.gradcheck(Exp.apply, x))
    rec("Exp gradgradcheck", torch.autograd.gradgradcheck(Exp.apply, x))
    rec("Exp graph", _make_dot_labels((grad_x, x, out),
                                      {"grad_x": grad_x, "x": x, "out": out}))

    class Sinh(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            expx = torch.exp(x)
            expnegx = torch.exp(-x)
            ctx.save_for_backward(expx, expnegx)
            return (expx - expnegx) / 2, expx, expnegx

        @staticmethod
        def backward(ctx, grad_out, _grad_out_exp, _grad_out_negexp):
            expx, expnegx = ctx.saved_tensors
            grad_input = grad_out * (expx + expnegx) / 2
            grad_input += _grad_out_exp * expx
            grad_input -= _grad_out_negexp * expnegx
            return grad_input

    def sinh(x):
        return Sinh.apply(x)[0]

    x = _fixed(3, 3, seed=41).double().requires_grad_()
    rec("Sinh gradcheck", torch.autograd.gradcheck(sinh, x))
    rec("Sinh gradgradcheck", torch.autograd.gradgradcheck(sinh, x))
    x = torch.tensor(1., requires_grad=True, dtype=torch.double).clone()
    out = sinh(x)
    grad_x, = torch.autograd.grad(out.sum(), x, create_graph=True)
    rec("Sinh grad", grad_x)
    rec("Sinh graph", _make_dot_labels((grad_x, x, out),
                                       {"grad_x": grad_x, "x": x, "out": out}))

    class SinhBad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            expx = torch.exp(x)
            expnegx = torch.exp(-x)
            ctx.expx = expx
            ctx.expnegx = expnegx
            return (expx - expnegx) / 2

        @staticmethod
        def backward(ctx, grad_out):
            expx = ctx.expx
            expnegx = ctx.expnegx
            grad_input = grad_out * (expx + expnegx) / 2
            return grad_input

    x = torch.tensor(1., requires_grad=True, dtype=torch.double).clone()
    out = SinhBad.apply(x)
    grad_x, = torch.autograd.grad(out, x, create_graph=True)
    rec("SinhBad graph", _make_dot_labels((grad_x, x, out),
                                          {"grad_x": grad_x, "x": x, "out": out}))

    class CubeBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, grad_out, x):
            ctx.save_for_backward(x, grad_out)
            return grad_out * 3 * x ** 2

        @staticmethod
        def backward(ctx, grad_out):
            x, grad_out_prev = ctx.saved_tensors
            dx = grad_out * grad_out_prev * 6 * x
            dgrad_out = grad_out * 3 * x ** 2
            return dgrad_out, dx

    class Cube(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x ** 3

        @staticmethod
        def backward(ctx, grad_out):
            x, = ctx.saved_tensors
            return CubeBackward.apply(grad_out, x)

    x = torch.tensor(2., requires_grad=True, dtype=torch.double)
    rec("Cube gradcheck", torch.autograd.gradcheck(Cube.apply, x))
    rec("Cube gradgradcheck", torch.autograd.gradgradcheck(Cube.apply, x))
    out = Cube.apply(x)
    grad_x, = torch.autograd.grad(out, x, create_graph=True)
    rec("Cube grad", grad_x)
    rec("Cube graph", _make_dot_labels((grad_x, x, out),
                                       {"grad_x": grad_x, "x": x, "out": out}))


def test_double_backward_with_custom_functions():
    _check("double_backward", tutorial_double_backward)


# --- Hooks for saved tensors ------------------------------------------------------------

def tutorial_saved_tensor_hooks(rec):
    a = torch.randn(5, requires_grad=True)
    y = a.exp()
    rec("saved result equals", y.equal(y.grad_fn._saved_result))
    rec("saved result is not y", y is not y.grad_fn._saved_result)

    x = torch.randn(5, requires_grad=True)
    y = x.pow(2)
    rec("saved self is x", y.grad_fn._saved_self is x)

    printed = []

    def pack_hook(x):
        printed.append(("Packing", x.tolist()))
        return x

    def unpack_hook(x):
        printed.append(("Unpacking", x.tolist()))
        return x

    a = torch.ones(5, requires_grad=True)
    b = torch.ones(5, requires_grad=True) * 2
    y = a * b
    y.grad_fn._raw_saved_self.register_hooks(pack_hook, unpack_hook)
    y.sum().backward()
    rec("register_hooks printed", printed)

    printed.clear()
    a = torch.ones(5, requires_grad=True)
    b = torch.ones(5, requires_grad=True) * 2
    with torch.autograd.graph.saved_tensors_hooks(pack_hook, unpack_hook):
        y = a * b
    y.sum().backward()
    rec("context printed, sorted", sorted(printed))

    def pack_hook2(x):
        printed.append("pack")
        return x

    def unpack_hook2(x):
        printed.append("unpack")
        return x

    printed.clear()
    with torch.autograd.graph.saved_tensors_hooks(pack_hook2, unpack_hook2):
        a = torch.ones(5, requires_grad=True)
        y = a * a
    y.sum().backward()
    rec("a * a hooks", printed)

    # a pack hook that computes: its own ops save nothing through the hooks
    a = torch.tensor([1., 2., 3.], requires_grad=True)
    b = torch.tensor([4., 5., 6.], requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(lambda x: x * 4, lambda x: x / 4):
        y = a * b
    y.sum().backward()
    rec("x*4 / x/4 a.grad", a.grad)
    rec("x*4 / x/4 b.grad", b.grad)
    x = torch.tensor([1.5, -2.0], requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(lambda x: x * 4, lambda x: x / 4):
        y = x.pow(2)
    rec("_saved_self after hooks", torch.allclose(y.grad_fn._saved_self, x))
    y.sum().backward()
    rec("pow grad", x.grad)

    # nested hooks: the innermost pair applies
    seen = []
    with torch.autograd.graph.saved_tensors_hooks(lambda x: (seen.append("outer"), x)[1],
                                                  lambda x: x):
        with torch.autograd.graph.saved_tensors_hooks(
                lambda x: (seen.append("inner"), x)[1], lambda x: x):
            y = x * x
    rec("nested", seen)

    # save_on_cpu (tensors already on the host stay as they are)
    with torch.autograd.graph.save_on_cpu(pin_memory=False):
        y = (x * x).sum()
    x.grad = None
    y.backward()
    rec("save_on_cpu grad", x.grad)


def test_saved_tensor_hooks():
    _check("saved_tensor_hooks", tutorial_saved_tensor_hooks)


# --- Jacobians, Hessians, hvp, vhp, and more --------------------------------------------

def tutorial_jacobians_hessians(rec):
    from tracegrad.func import vmap, vjp, jacrev, jacfwd, hessian, jvp, grad   # torch.func

    def predict(weight, bias, x):
        return F.linear(x, weight, bias).tanh()

    D = 4
    weight = _fixed(D, D, seed=50)
    bias = _fixed(D, seed=51)
    x = _fixed(D, seed=52)
    xp = x.clone().requires_grad_()
    unit_vectors = torch.eye(D)

    def compute_jac(xp):
        jacobian_rows = [torch.autograd.grad(predict(weight, bias, xp), xp, vec)[0]
                         for vec in unit_vectors]
        return torch.stack(jacobian_rows)

    jacobian = compute_jac(xp)
    rec("jacobian shape", list(jacobian.shape))
    rec("jacobian[0]", jacobian[0])
    _, vjp_fn = vjp(functools.partial(predict, weight, bias), x)
    ft_jacobian, = vmap(vjp_fn)(unit_vectors)
    rec("vmap(vjp) == loop", torch.allclose(ft_jacobian, jacobian))
    ft_jacobian = jacrev(predict, argnums=2)(weight, bias, x)
    rec("jacrev == loop", torch.allclose(ft_jacobian, jacobian))
    ft_jac_weight, ft_jac_bias = jacrev(predict, argnums=(0, 1))(weight, bias, x)
    rec("jac weight shape", list(ft_jac_weight.shape))
    rec("jac bias", ft_jac_bias)
    rec("jac weight [1]", ft_jac_weight[1])
    jacfwd_out = jacfwd(predict, argnums=2)(weight, bias, x)
    jacrev_out = jacrev(predict, argnums=2)(weight, bias, x)
    rec("jacfwd == jacrev", torch.allclose(jacfwd_out, jacrev_out))

    hess_api = hessian(predict, argnums=2)(weight, bias, x)
    hess_fwdfwd = jacfwd(jacfwd(predict, argnums=2), argnums=2)(weight, bias, x)
    hess_revrev = jacrev(jacrev(predict, argnums=2), argnums=2)(weight, bias, x)
    rec("hessian shape", list(hess_api.shape))
    rec("hessian[0]", hess_api[0])
    rec("hessian fwdfwd", torch.allclose(hess_api, hess_fwdfwd, atol=1e-6))
    rec("hessian revrev", torch.allclose(hess_api, hess_revrev, atol=1e-6))

    batch_size = 3
    Din, Dout = 4, 2
    weight = _fixed(Dout, Din, seed=53)
    bias = _fixed(Dout, seed=54)
    x = _fixed(batch_size, Din, seed=55)
    compute_batch_jacobian = vmap(jacrev(predict, argnums=2), in_dims=(None, None, 0))
    batch_jacobian0 = compute_batch_jacobian(weight, bias, x)
    rec("batch jacobian", batch_jacobian0)

    def predict_with_output_summed(weight, bias, x):
        return predict(weight, bias, x).sum(0)

    batch_jacobian1 = jacrev(predict_with_output_summed, argnums=2)(weight, bias, x) \
        .movedim(1, 0)
    rec("batch jacobian summed", torch.allclose(batch_jacobian0, batch_jacobian1))
    compute_batch_hessian = vmap(hessian(predict, argnums=2), in_dims=(None, None, 0))
    batch_hess = compute_batch_hessian(weight, bias, x)
    rec("batch hessian shape", list(batch_hess.shape))
    rec("batch hessian [0][1]", batch_hess[0][1])

    def hvp(f, primals, tangents):
        return jvp(grad(f), primals, tangents)[1]

    def f(x):
        return x.sin().sum()

    x = _fixed(8, seed=56)
    tangent = _fixed(8, seed=57)
    result = hvp(f, (x,), (tangent,))
    rec("hvp", result)
    rec("hvp == -sin(x) * t", torch.allclose(result, -x.sin() * tangent))


def test_jacobians_hessians():
    _check("jacobians_hessians", tutorial_jacobians_hessians)


# --- Per-sample-gradients ---------------------------------------------------------------

def tutorial_per_sample_grads(rec):
    class SimpleCNN(nn.Module):
        def __init__(self):
            super(SimpleCNN, self).__init__()
            self.conv1 = nn.Conv2d(1, 4, 3, 1)
            self.conv2 = nn.Conv2d(4, 8, 3, 1)
            self.fc1 = nn.Linear(72, 16)
            self.fc2 = nn.Linear(16, 10)

        def forward(self, x):
            x = self.conv1(x)
            x = F.relu(x)
            x = self.conv2(x)
            x = F.relu(x)
            x = F.max_pool2d(x, 2)
            x = torch.flatten(x, 1)
            x = self.fc1(x)
            x = F.relu(x)
            x = self.fc2(x)
            output = F.log_softmax(x, dim=1)
            return output

    def loss_fn(predictions, targets):
        return F.nll_loss(predictions, targets)

    batch_size = 4
    data = _fixed(batch_size, 1, 10, 10, seed=60)
    targets = torch.tensor([3, 7, 0, 9])
    model = SimpleCNN()
    with torch.no_grad():
        for i, (name, p) in enumerate(model.named_parameters()):
            p.copy_(_fixed(*p.shape, seed=61 + i, scale=0.3))

    def compute_grad(sample, target):
        sample = sample.unsqueeze(0)
        target = target.unsqueeze(0)
        prediction = model(sample)
        loss = loss_fn(prediction, target)
        return torch.autograd.grad(loss, list(model.parameters()))

    def compute_sample_grads(data, targets):
        sample_grads = [compute_grad(data[i], targets[i]) for i in range(batch_size)]
        sample_grads = zip(*sample_grads)
        sample_grads = [torch.stack(shards) for shards in sample_grads]
        return sample_grads

    per_sample_grads = compute_sample_grads(data, targets)
    rec("shapes", [list(g.shape) for g in per_sample_grads])
    rec("fc2.bias grads", per_sample_grads[3 + 4])
    rec("grad sums", [g.sum(dim=tuple(range(1, g.dim()))) for g in per_sample_grads])

    from tracegrad.func import functional_call, vmap, grad   # from torch.func import ...
    params = {k: v.detach() for k, v in model.named_parameters()}
    buffers = {k: v.detach() for k, v in model.named_buffers()}

    def compute_loss(params, buffers, sample, target):
        batch = sample.unsqueeze(0)
        targets = target.unsqueeze(0)
        predictions = functional_call(model, (params, buffers), (batch,))
        loss = loss_fn(predictions, targets)
        return loss

    ft_compute_grad = grad(compute_loss)
    ft_compute_sample_grad = vmap(ft_compute_grad, in_dims=(None, None, 0, 0))
    ft_per_sample_grads = ft_compute_sample_grad(params, buffers, data, targets)
    # as the tutorial: torch.func's dicts keep their insertion order
    rec("vmap(grad) matches", [
        torch.allclose(per_sample_grad, ft_per_sample_grad, atol=3e-3, rtol=1e-5)
        for per_sample_grad, ft_per_sample_grad in zip(per_sample_grads,
                                                       ft_per_sample_grads.values())])
    rec("vmap(grad) fc2.bias", ft_per_sample_grads["fc2.bias"])


def test_per_sample_gradients():
    _check("per_sample_grads", tutorial_per_sample_grads)


def test_func_grad_keeps_dict_order():
    g = torch.func.grad(lambda p: (p["b"] * p["a"]).sum())(
        {"b": torch.ones(2), "a": torch.ones(2) * 2})
    assert list(g) == ["b", "a"]


# What real torch 2.13 records for the functions above (see the module docstring).
EXPECTED = {'basics': [('z.grad_fn', 'AddBackward0'), ('loss', 0.6590185761451721),
            ('w.grad',
             [[0.14115659892559052, 0.2490844577550888, 0.01656121015548706],
              [0.14115659892559052, 0.2490844577550888, 0.01656121015548706],
              [0.14115659892559052, 0.2490844577550888, 0.01656121015548706],
              [0.14115659892559052, 0.2490844577550888, 0.01656121015548706],
              [0.14115659892559052, 0.2490844577550888, 0.01656121015548706]]),
            ('b.grad', [0.14115659892559052, 0.2490844577550888, 0.01656121015548706]),
            ('z requires grad', True), ('z requires grad under no_grad', False),
            ('z_det requires grad', False),
            ('First call',
             [[4.0, 2.0, 2.0, 2.0, 2.0], [2.0, 4.0, 2.0, 2.0, 2.0], [2.0, 2.0, 4.0, 2.0, 2.0],
              [2.0, 2.0, 2.0, 4.0, 2.0]]),
            ('Second call',
             [[8.0, 4.0, 4.0, 4.0, 4.0], [4.0, 8.0, 4.0, 4.0, 4.0], [4.0, 4.0, 8.0, 4.0, 4.0],
              [4.0, 4.0, 4.0, 8.0, 4.0]]),
            ('Call after zeroing gradients',
             [[4.0, 2.0, 2.0, 2.0, 2.0], [2.0, 4.0, 2.0, 2.0, 2.0], [2.0, 2.0, 4.0, 2.0, 2.0],
              [2.0, 2.0, 2.0, 4.0, 2.0]])],
 'double_backward': [('Square gradcheck', True), ('Square gradgradcheck', True),
                     ('Square graph',
                      [[['AccumulateGrad', None], ['CloneBackward0', None], ['MulBackward0', None],
                        ['SquareBackward', None], ['\n ()', 'lightblue'],
                        ['grad_x\n ()', 'darkolivegreen1'], ['out\n ()', 'darkolivegreen1'],
                        ['x\n ()', 'darkolivegreen1'], ['x\n ()', 'orange']],
                       8]),
                     ('Exp gradcheck', True), ('Exp gradgradcheck', True),
                     ('Exp graph',
                      [[['AccumulateGrad', None], ['CloneBackward0', None], ['ExpBackward', None],
                        ['MulBackward0', None], ['\n ()', 'lightblue'], ['\n ()', 'orange'],
                        ['grad_x\n ()', 'darkolivegreen1'], ['out\n ()', 'darkolivegreen1'],
                        ['x\n ()', 'darkolivegreen1']],
                       8]),
                     ('Sinh gradcheck', True), ('Sinh gradgradcheck', True),
                     ('Sinh grad', 1.5430806348152437),
                     ('Sinh graph',
                      [[['AccumulateGrad', None], ['AddBackward0', None], ['AddBackward0', None],
                        ['CloneBackward0', None], ['DivBackward0', None], ['MulBackward0', None],
                        ['MulBackward0', None], ['MulBackward0', None], ['SinhBackward', None],
                        ['SubBackward0', None], ['\n ()', 'lightblue'], ['\n ()', 'orange'],
                        ['\n ()', 'orange'], ['grad_x\n ()', 'darkolivegreen1'],
                        ['out\n ()', 'darkolivegreen1'], ['x\n ()', 'darkolivegreen1']],
                       18]),
                     ('SinhBad graph',
                      [[['AccumulateGrad', None], ['CloneBackward0', None],
                        ['SinhBadBackward', None], ['\n ()', 'lightblue'],
                        ['grad_x\n ()', 'darkolivegreen1'], ['out\n ()', 'darkolivegreen1'],
                        ['x\n ()', 'darkolivegreen1']],
                       5]),
                     ('Cube gradcheck', True), ('Cube gradgradcheck', True), ('Cube grad', 12.0),
                     ('Cube graph',
                      [[['AccumulateGrad', None], ['CubeBackward', None],
                        ['CubeBackwardBackward', None], ['\n ()', 'orange'],
                        ['grad_x\n ()', 'darkolivegreen1'], ['out\n ()', 'darkolivegreen1'],
                        ['x\n ()', 'lightblue'], ['x\n ()', 'orange'], ['x\n ()', 'orange']],
                       8])],
 'forward_ad': [('tangent is tangent', True), ('tangent.T is not tangent', True),
                ('jvp',
                 [[0.20000000298023224, 0.20000000298023224],
                  [-0.15000000596046448, -1.600000023841858]]),
                ('tangent after level', True),
                ('module jvp',
                 [[8.0, 8.0, 8.0, 8.0, 8.0], [1.5, 1.5, 1.5, 1.5, 1.5], [1.5, 1.5, 1.5, 1.5, 1.5],
                  [3.0, 3.0, 3.0, 3.0, 3.0], [-2.0, -2.0, -2.0, -2.0, -2.0]]),
                ('functional_call jvp matches', True), ('model keeps its parameters', True),
                ('custom Function jvp',
                 [[1.1051709180756477, 0.6107013790800849],
                  [-0.3374647018940008, 1.3406400920712787]]),
                ('gradcheck forward AD', True),
                ('func.jvp primal',
                 [[1.0099999904632568, 4.039999961853027], [9.09000015258789, 16.15999984741211]]),
                ('func.jvp tangent',
                 [[0.20000000298023224, 0.20000000298023224],
                  [-0.15000000596046448, -1.600000023841858]]),
                ('func.jvp over a module',
                 [[8.0, 8.0, 8.0, 8.0, 8.0], [1.5, 1.5, 1.5, 1.5, 1.5], [1.5, 1.5, 1.5, 1.5, 1.5],
                  [3.0, 3.0, 3.0, 3.0, 3.0], [-2.0, -2.0, -2.0, -2.0, -2.0]])],
 'fundamentals': [('a',
                   [0.0, 0.2617993950843811, 0.5235987901687622, 0.7853981852531433,
                    1.0471975803375244, 1.3089969158172607, 1.5707963705062866, 1.8325958251953125,
                    2.094395160675049, 2.356194496154785, 2.6179938316345215, 2.879793405532837,
                    3.1415927410125732, 3.4033920764923096, 3.665191650390625, 3.9269909858703613,
                    4.188790321350098, 4.450589656829834, 4.71238899230957, 4.974188327789307,
                    5.235987663269043, 5.4977874755859375, 5.759586811065674, 6.02138614654541,
                    6.2831854820251465]),
                  ('b.grad_fn', 'SinBackward0'),
                  ('c',
                   [0.0, 0.517638087272644, 1.0, 1.4142135381698608, 1.7320507764816284,
                    1.9318516254425049, 2.0, 1.9318516254425049, 1.7320507764816284,
                    1.4142135381698608, 1.0000001192092896, 0.5176378488540649,
                    -1.7484555314695172e-07, -0.5176381468772888, -1.0000003576278687,
                    -1.41421377658844, -1.732050895690918, -1.9318517446517944, -2.0,
                    -1.9318516254425049, -1.732050895690918, -1.4142130613327026,
                    -0.9999995231628418, -0.5176376700401306, 3.4969110629390343e-07]),
                  ('d',
                   [1.0, 1.517638087272644, 2.0, 2.4142136573791504, 2.732050895690918,
                    2.931851625442505, 3.0, 2.931851625442505, 2.732050895690918,
                    2.4142136573791504, 2.0, 1.517637848854065, 0.9999998211860657,
                    0.4823618531227112, -3.5762786865234375e-07, -0.41421377658843994,
                    -0.732050895690918, -0.9318517446517944, -1.0, -0.9318516254425049,
                    -0.732050895690918, -0.41421306133270264, 4.76837158203125e-07,
                    0.4823623299598694, 1.0000003576278687]),
                  ('out', 25.0), ('d.grad_fn', 'AddBackward0'),
                  ('d.next', [['MulBackward0', 0], [None, 0]]),
                  ('d.next.next', [['SinBackward0', 0], [None, 0]]),
                  ('d.next.next.next', [['AccumulateGrad', 0]]), ('d.next^4', []),
                  ('c.grad_fn', 'MulBackward0'), ('b.grad_fn.name', 'SinBackward0'),
                  ('a.grad_fn', None),
                  ('a.grad',
                   [2.0, 1.9318516254425049, 1.7320507764816284, 1.4142135381698608,
                    0.9999999403953552, 0.5176381468772888, -8.742277657347586e-08,
                    -0.5176383256912231, -1.0000001192092896, -1.4142135381698608,
                    -1.7320507764816284, -1.9318517446517944, -2.0, -1.9318516254425049,
                    -1.7320505380630493, -1.4142132997512817, -0.9999998211860657,
                    -0.5176379680633545, 2.384976127700611e-08, 0.5176380276679993,
                    0.9999998211860657, 1.414214015007019, 1.732051134109497, 1.9318517446517944,
                    2.0]),
                  ('layer2.weight[0][0:10]',
                   [0.1391039490699768, -0.19589483737945557, -0.31469807028770447,
                    -0.5849941372871399, -0.07064643502235413, 0.24952127039432526,
                    0.006614524871110916, 0.1023688018321991, 0.20464764535427094,
                    -0.1764291673898697]),
                  ('layer2.weight.grad', None), ('loss', 15.978878021240234),
                  ('layer2.weight[0][0:10] after backward',
                   [0.1391039490699768, -0.19589483737945557, -0.31469807028770447,
                    -0.5849941372871399, -0.07064643502235413, 0.24952127039432526,
                    0.006614524871110916, 0.1023688018321991, 0.20464764535427094,
                    -0.1764291673898697]),
                  ('layer2.weight.grad[0][0:10]',
                   [0.7940166592597961, 0.0, 0.025719448924064636, -1.2690743207931519,
                    -1.2838411331176758, 0.249349907040596, -2.6315019130706787,
                    -2.8696486949920654, -0.971732497215271, -3.483600616455078]),
                  ('layer2.weight[0][0:10] after step',
                   [0.13830992579460144, -0.19589483737945557, -0.31472378969192505,
                    -0.5837250351905823, -0.0693625956773758, 0.2492719143629074,
                    0.00924602709710598, 0.10523845255374908, 0.20561937987804413,
                    -0.17294557392597198]),
                  ('grad before zero',
                   [0.7940166592597961, 0.0, 0.025719448924064636, -1.2690743207931519,
                    -1.2838411331176758, 0.249349907040596, -2.6315019130706787,
                    -2.8696486949920654, -0.971732497215271, -3.483600616455078]),
                  ('grad after 5 more',
                   [4.7318830490112305, 0.0, 0.22465264797210693, -7.032651901245117,
                    -7.287474632263184, 1.4560089111328125, -15.37934684753418, -16.583248138427734,
                    -5.708730697631836, -20.18047332763672]),
                  ('grad after zero_grad', [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]),
                  ('a ones', [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]),
                  ('b1', [[2.0, 2.0, 2.0], [2.0, 2.0, 2.0]]),
                  ('b2', [[2.0, 2.0, 2.0], [2.0, 2.0, 2.0]]), ('b2 requires grad', False),
                  ('c1', [[5.0, 5.0, 5.0], [5.0, 5.0, 5.0]]), ('c1 requires grad', True),
                  ('c2 requires grad', False), ('c3 grad_fn', 'MulBackward0'),
                  ('add_tensors1 requires grad', True), ('add_tensors2 requires grad', False),
                  ('x requires grad', True), ('y requires grad', False),
                  ('in-place on a leaf raises', True),
                  ('x.grad', [[2.0, 2.0, 2.0], [2.0, 2.0, 2.0]]),
                  ('jacobian exp_adder',
                   [[[2.2103419303894043, 0.0], [0.0, 2.442805528640747]],
                    [[3.0, 0.0], [0.0, 3.0]]]),
                  ('jacobian exp_reducer',
                   [[[1.1051709651947021, 1.2214027643203735, 1.3498588800430298], [0.0, 0.0, 0.0]],
                    [[0.0, 0.0, 0.0], [1.491824746131897, 1.6487212181091309, 1.822118878364563]]]),
                  ('vjp do_stuff',
                   [[409.6000061035156, 819.2000122070312, 1228.800048828125],
                    [409.6000061035156, 4096.0, 0.40959998965263367]]),
                  ('vjp do_stuff 2',
                   [[768.0, -1024.0, 1536.0], [51.20000076293945, 512.0, 0.05119999870657921]]),
                  ('jacobian do_stuff', [[512.0, 0.0, 0.0], [0.0, 512.0, 0.0], [0.0, 0.0, 512.0]])],
 'gentle': [('9a^2 == a.grad', [1.0, 1.0]), ('-2b == b.grad', [1.0, 1.0]),
            ('Q.grad_fn', 'SubBackward0'), ('a requires grad', False), ('b requires grad', True),
            ('frozen weight grad', True),
            ('fc weight grad',
             [[2.781205415725708, 2.643559455871582, 8.876502990722656, 2.4421536922454834],
              [2.781205415725708, 2.643559455871582, 8.876502990722656, 2.4421536922454834]]),
            ('fc weight after step',
             [[1.0253037214279175, 1.7500556707382202, -2.642056941986084, -0.16238661110401154],
              [0.9859073758125305, 1.3257062435150146, 0.5650233626365662, 1.472696304321289]])],
 'jacobians_hessians': [('jacobian shape', [4, 4]),
                        ('jacobian[0]',
                         [0.2028905302286148, -0.19914066791534424, 0.27921023964881897,
                          -0.5787000060081482]),
                        ('vmap(vjp) == loop', True), ('jacrev == loop', True),
                        ('jac weight shape', [4, 4, 4]),
                        ('jac bias',
                         [[0.4171428680419922, 0.0, 0.0, 0.0], [0.0, 0.05265222489833832, 0.0, 0.0],
                          [0.0, 0.0, 0.9993979334831238, 0.0],
                          [0.0, 0.0, 0.0, 0.06796570122241974]]),
                        ('jac weight [1]',
                         [[-0.0, 0.0, -0.0, -0.0],
                          [-0.043488115072250366, 0.012768464162945747, -0.0033619015011936426,
                           -0.004968458786606789],
                          [-0.0, 0.0, -0.0, -0.0], [-0.0, 0.0, -0.0, -0.0]]),
                        ('jacfwd == jacrev', True), ('hessian shape', [4, 4, 4]),
                        ('hessian[0]',
                         [[0.15067799389362335, -0.14789313077926636, 0.20735731720924377,
                           -0.42977532744407654],
                          [-0.14789311587810516, 0.14515972137451172, -0.2035248875617981,
                           0.4218321144580841],
                          [0.20735731720924377, -0.2035248875617981, 0.285357266664505,
                           -0.5914404988288879],
                          [-0.4297753572463989, 0.4218321740627289, -0.5914404988288879,
                           1.225838303565979]]),
                        ('hessian fwdfwd', True), ('hessian revrev', True),
                        ('batch jacobian',
                         [[[0.10361974686384201, -0.7983635067939758, 0.8829247355461121,
                            -0.919131338596344],
                           [-0.32692909240722656, 0.147811159491539, 0.3797202408313751,
                            0.36727461218833923]],
                          [[0.027976548299193382, -0.21555212140083313, 0.23838301002979279,
                            -0.2481585144996643],
                           [-0.1340235471725464, 0.060594718903303146, 0.15566511452198029,
                            0.1505630761384964]],
                          [[0.00035755522549152374, -0.0027548710349947214, 0.0030466620810329914,
                            -0.003171598305925727],
                           [-0.02873608097434044, 0.012992155738174915, 0.033376265317201614,
                            0.03228233382105827]]]),
                        ('batch jacobian summed', True), ('batch hessian shape', [3, 2, 4, 4]),
                        ('batch hessian [0][1]',
                         [[0.6266329884529114, -0.2833132743835449, -0.7278190851211548,
                           -0.7039642930030823],
                          [-0.2833132743835449, 0.12809158861637115, 0.3290615379810333,
                           0.3182763159275055],
                          [-0.7278191447257996, 0.3290615677833557, 0.8453443646430969,
                           0.81763756275177],
                          [-0.7039642930030823, 0.3182763159275055, 0.81763756275177,
                           0.790838897228241]]),
                        ('hvp',
                         [0.24914675951004028, -0.14570948481559753, -1.5209412574768066,
                          -1.027514934539795, -0.057439155876636505, -0.36461690068244934,
                          0.7892537713050842, 0.3448024392127991]),
                        ('hvp == -sin(x) * t', True)],
 'mechanics': [('x equal _saved_self', True), ('x is _saved_self', True),
               ('y equal _saved_result', True), ('y is _saved_result', False), ('no_grad', False),
               ('inference_mode', False), ('set_grad_enabled(False)', False),
               ('grad enabled', True), ('inplace check raises', True),
               ('raw saved hooks', ['pack', 'unpack']), ('x.grad', [2.0, 4.0, 6.0]),
               ('hook order', ['tensor hook', 'prehook', 'hook']), ('a.grad with hook', [6.0, 6.0]),
               ('b.grad retained', [1.0, 1.0]), ('post accumulate', [[2.0, 4.0]])],
 'per_sample_grads': [('shapes',
                       [[4, 4, 1, 3, 3], [4, 4], [4, 8, 4, 3, 3], [4, 8], [4, 16, 72], [4, 16],
                        [4, 10, 16], [4, 10]]),
                      ('fc2.bias grads',
                       [[0.011334098875522614, 0.008829766884446144, 0.0005283512873575091,
                         -0.9760718941688538, 0.0005443327827379107, 0.03381306305527687,
                         0.00405525229871273, 0.344312459230423, 0.4879882037639618,
                         0.08466644585132599],
                        [0.011318275704979897, 0.13541364669799805, 0.019304141402244568,
                         0.08405367285013199, 0.0025797372218221426, 0.05503655970096588,
                         0.010621706023812294, -0.8728107213973999, 0.39311569929122925,
                         0.161367267370224],
                        [-0.9938676953315735, 4.8849873564904556e-05, 3.091742837568745e-05,
                         0.0008491434855386615, 2.9192954116297187e-06, 0.0016024102224037051,
                         0.0002175622939830646, 0.9842270016670227, 0.005603297147899866,
                         0.0012855231761932373],
                        [0.006043590605258942, 0.0036068246699869633, 7.305662438739091e-05,
                         0.00151738035492599, 4.7735402404214256e-06, 0.2632157802581787,
                         0.003127805422991514, 0.00423005037009716, 0.347359836101532,
                         -0.629179060459137]]),
                      ('grad sums',
                       [[3.300607681274414, -7.710642337799072, 10.37985897064209,
                         1.5106946229934692],
                        [1.1300733089447021, 3.756594181060791, 5.5292463302612305,
                         0.717003583908081],
                        [23.139122009277344, -18.734853744506836, 26.23201560974121,
                         3.6768264770507812],
                        [2.486269950866699, -1.1086068153381348, 3.851052761077881,
                         0.6903516054153442],
                        [43.8605842590332, -70.591552734375, 128.31246948242188,
                         -1.8822729587554932],
                        [0.6845754384994507, -1.2342007160186768, 2.002504348754883,
                         -0.027137458324432373],
                        [1.4044344425201416e-06, -2.7567148208618164e-07, -1.3113021850585938e-06,
                         7.450580596923828e-07],
                        [1.1920928955078125e-07, 0.0, -5.960464477539063e-08,
                         2.0023435354232788e-08]]),
                      ('vmap(grad) matches', [True, True, True, True, True, True, True, True]),
                      ('vmap(grad) fc2.bias',
                       [[0.011334098875522614, 0.008829771541059017, 0.0005283515201881528,
                         -0.976071834564209, 0.0005443335976451635, 0.03381304815411568,
                         0.00405525416135788, 0.3443126082420349, 0.4879879653453827,
                         0.0846664309501648],
                        [0.011318264529109001, 0.13541360199451447, 0.019304122775793076,
                         0.0840536504983902, 0.0025797372218221426, 0.05503658205270767,
                         0.010621706023812294, -0.8728110194206238, 0.39311593770980835,
                         0.16136735677719116],
                        [-0.9938676953315735, 4.884977897745557e-05, 3.0917395633878186e-05,
                         0.0008491422631777823, 2.9192926831456134e-06, 0.0016024071956053376,
                         0.00021756207570433617, 0.9842270016670227, 0.00560328084975481,
                         0.001285520731471479],
                        [0.006043581757694483, 0.0036068211775273085, 7.305647886823863e-05,
                         0.0015173789579421282, 4.773535692947917e-06, 0.2632157802581787,
                         0.0031278009992092848, 0.00423004012554884, 0.347359836101532,
                         -0.6291791796684265]])],
 'saved_tensor_hooks': [('saved result equals', True), ('saved result is not y', True),
                        ('saved self is x', True),
                        ('register_hooks printed',
                         [['Packing', [1.0, 1.0, 1.0, 1.0, 1.0]],
                          ['Unpacking', [1.0, 1.0, 1.0, 1.0, 1.0]]]),
                        ('context printed, sorted',
                         [['Packing', [1.0, 1.0, 1.0, 1.0, 1.0]],
                          ['Packing', [2.0, 2.0, 2.0, 2.0, 2.0]],
                          ['Unpacking', [1.0, 1.0, 1.0, 1.0, 1.0]],
                          ['Unpacking', [2.0, 2.0, 2.0, 2.0, 2.0]]]),
                        ('a * a hooks', ['pack', 'pack', 'unpack', 'unpack']),
                        ('x*4 / x/4 a.grad', [4.0, 5.0, 6.0]),
                        ('x*4 / x/4 b.grad', [1.0, 2.0, 3.0]), ('_saved_self after hooks', True),
                        ('pow grad', [3.0, -4.0]), ('nested', ['inner', 'inner']),
                        ('save_on_cpu grad', [3.0, -4.0])]}
