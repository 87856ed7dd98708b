"""graph.saved_tensors_hooks and graph.save_on_cpu."""
import numpy as np
import pytest

import tracegrad as tg
from tracegrad.autograd import Function
from tracegrad.eager.graph import saved_tensors_hooks, save_on_cpu


def test_reference_example_pack_and_unpack_order():
    log = []

    def pack_hook(x):
        log.append(("pack", x))
        return x

    def unpack_hook(x):
        log.append(("unpack", x))
        return x

    a = tg.ones(5, requires_grad=True)
    b = tg.ones(5, requires_grad=True) * 2
    with saved_tensors_hooks(pack_hook, unpack_hook):
        y = a * b
    assert [k for k, _ in log] == ["pack", "pack"]
    assert log[0][1] is a and log[1][1] is b
    y.sum().backward()
    assert [k for k, _ in log] == ["pack", "pack", "unpack", "unpack"]
    np.testing.assert_allclose(a.grad.numpy(), np.full(5, 2.0))


def test_hooks_can_transform_what_is_kept():
    packed = []

    def pack(t):
        arr = np.array(t.detach().numpy(), copy=True)   # keep a private host copy
        packed.append(arr)
        return arr

    def unpack(arr):
        return tg.tensor(arr)

    xv = np.array([0.5, -1.5, 2.0])
    x = tg.tensor(xv, requires_grad=True)
    w = tg.tensor([2.0, 3.0, 4.0], requires_grad=True)
    with saved_tensors_hooks(pack, unpack):
        y = (x * w).sum()
    y.backward()
    assert len(packed) == 2
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 3.0, 4.0])
    np.testing.assert_allclose(w.grad.numpy(), xv)


def test_hooks_apply_to_function_save_for_backward():
    log = []

    class Exp(Function):
        @staticmethod
        def forward(ctx, i):
            r = i.exp()
            ctx.save_for_backward(r)
            return r

        @staticmethod
        def backward(ctx, g):
            r, = ctx.saved_tensors
            return g * r

    def pack(t):
        log.append("pack")
        return ("boxed", t.detach().numpy().copy())

    def unpack(p):
        log.append("unpack")
        assert p[0] == "boxed"
        return tg.tensor(p[1])

    xv = np.array([0.1, 0.2])
    x = tg.tensor(xv, requires_grad=True)
    with saved_tensors_hooks(pack, unpack):
        y = Exp.apply(x)
    assert log == ["pack"]
    y.sum().backward()
    assert log == ["pack", "unpack"]
    np.testing.assert_allclose(x.grad.numpy(), np.exp(xv))


def test_innermost_hooks_win_and_nothing_leaks():
    log = []
    outer = saved_tensors_hooks(lambda t: log.append("outer") or t, lambda t: t)
    inner = saved_tensors_hooks(lambda t: log.append("inner") or t, lambda t: t)
    x = tg.tensor([1.0], requires_grad=True)
    with outer:
        with inner:
            x * x
        x * x
    x * x
    assert log == ["inner", "inner", "outer", "outer"]
    assert tg.autograd.graph.current_saved_hooks() is None


def test_unpack_hook_returning_wrong_type_is_reported():
    class Keep(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * 2

        @staticmethod
        def backward(ctx, g):
            x, = ctx.saved_tensors
            return g * 2

    x = tg.tensor([1.0], requires_grad=True)
    with saved_tensors_hooks(lambda t: t, lambda p: "not a tensor"):
        y = Keep.apply(x)
    with pytest.raises(TypeError, match="unpack hook must return a Tensor, got str"):
        y.sum().backward()


@pytest.mark.parametrize("pin_memory", [False, True])
def test_save_on_cpu_numpy_path_keeps_values_and_graph(pin_memory):
    xv = np.array([0.3, 1.2, -0.4])
    wv = np.array([[1.0, 2.0], [0.5, -1.0], [3.0, 0.25]])

    def loss(x, w):
        return (tg.tanh(x @ w) * x.sum()).sum()

    x0 = tg.tensor(xv, requires_grad=True)
    w0 = tg.tensor(wv, requires_grad=True)
    g_ref = tg.autograd.grad(loss(x0, w0), (x0, w0), create_graph=True)
    h_ref = tg.autograd.grad(g_ref[0].sum(), x0)[0]

    x = tg.tensor(xv, requires_grad=True)
    w = tg.tensor(wv, requires_grad=True)
    hooks = save_on_cpu(pin_memory=pin_memory)
    assert isinstance(hooks, saved_tensors_hooks)
    # host tensors pass through unchanged
    assert hooks.pack_hook(x) is x and hooks.unpack_hook(x) is x
    with hooks:
        out = loss(x, w)
    g = tg.autograd.grad(out, (x, w), create_graph=True)
    for a, b in zip(g, g_ref):
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy())
    h = tg.autograd.grad(g[0].sum(), x)[0]
    np.testing.assert_allclose(h.numpy(), h_ref.numpy())


def test_save_on_cpu_moves_gpu_tensors_to_host():
    cupy = pytest.importorskip("cupy")
    try:
        if cupy.cuda.runtime.getDeviceCount() == 0:
            pytest.skip("no GPU")
    except cupy.cuda.runtime.CUDARuntimeError:
        pytest.skip("no GPU")
    xv = np.array([0.5, 1.0, 2.0])
    x = tg.tensor(xv, device="cuda", requires_grad=True)
    hooks = save_on_cpu()
    packed = hooks.pack_hook(x)
    assert isinstance(packed[2], np.ndarray)   # (type, device id, host copy, ...)
    back = hooks.unpack_hook(packed)
    assert type(back._data).__module__.startswith("cupy")
    np.testing.assert_allclose(cupy.asnumpy(back._data), xv)
    with hooks:
        y = (x * x).exp().sum()
    y.backward()
    np.testing.assert_allclose(cupy.asnumpy(x.grad._data), 2 * xv * np.exp(xv ** 2))


# --- a pack hook that computes does not call itself (issue 27) ----------------------

def test_pack_hook_that_computes_runs_with_the_hooks_off():
    # torch 2.13: the hooks are off while the pack hook runs, so x * 4 inside
    # it saves nothing through them (before: recursion without end)
    a = tg.ones(5, requires_grad=True)
    b = tg.ones(5, requires_grad=True) * 2
    with saved_tensors_hooks(lambda x: x * 4, lambda x: x / 4):
        y = a * b
    y.sum().backward()
    assert a.grad.tolist() == [2.0] * 5
    x = tg.tensor([1.5, -2.0, 0.25], requires_grad=True)
    with saved_tensors_hooks(lambda t: t * 4, lambda t: t / 4):
        y = x.pow(2)
        w = (x.exp() * x).sum()
    assert tg.allclose(y.grad_fn._saved_self, x)
    w.backward()
    np.testing.assert_allclose(x.grad.tolist(), np.exp([1.5, -2.0, 0.25]) * ([1.5, -2.0, 0.25])
                               + np.exp([1.5, -2.0, 0.25]), rtol=1e-6)
    # the hooks are on again afterwards, and for nested contexts too
    calls = []
    with saved_tensors_hooks(lambda t: (calls.append("outer"), t)[1], lambda t: t):
        with saved_tensors_hooks(lambda t: (calls.append("inner"), t * 1)[1], lambda t: t):
            (x * x).sum()
        (x * x).sum()
    assert calls == ["inner", "inner", "outer", "outer"]


def test_custom_function_saves_through_a_computing_pack_hook():
    class Mul(Function):
        @staticmethod
        def forward(ctx, x, y):
            ctx.save_for_backward(x, y)
            return x * y

        @staticmethod
        def backward(ctx, g):
            x, y = ctx.saved_tensors
            return g * y, g * x

    x = tg.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = tg.tensor([4.0, 5.0, 6.0], requires_grad=True)
    with saved_tensors_hooks(lambda t: t * 4, lambda t: t / 4):
        z = Mul.apply(x, y)
    z.sum().backward()
    assert x.grad.tolist() == [4.0, 5.0, 6.0]     # torch 2.13
    assert y.grad.tolist() == [1.0, 2.0, 3.0]
    # register_hooks on one saved tensor: a computing pack hook, once
    x.grad = None
    y2 = x.pow(2)
    y2.grad_fn._raw_saved_self.register_hooks(lambda t: t * 2, lambda t: t / 2)
    y2.sum().backward()
    assert x.grad.tolist() == [2.0, 4.0, 6.0]
