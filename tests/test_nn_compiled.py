"""``tg.compile(model)`` as ``torch.compile(model)``: an OptimizedModule
around the model whose compiled call returns the buffers it updates in
place (BatchNorm's running statistics and num_batches_tracked in training
mode) as extra outputs and writes them into the buffers.  Checked against
eager tracegrad always, and against torch where it is importable."""
from __future__ import annotations

import numpy as np
import pytest

import tracegrad as tg
from tracegrad import nn

try:
    import torch
except ImportError:   # the parity half is skipped, the eager half still runs
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")



@pytest.fixture(autouse=True)
def _float64():
    old = tg.get_default_dtype()
    tg.set_default_dtype(tg.float64)
    if torch is not None:
        old_t = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
    yield
    tg.set_default_dtype(old)
    if torch is not None:
        torch.set_default_dtype(old_t)


def _arrays(t):
    return {k: v.detach().numpy().copy() for k, v in t.state_dict().items()}


def _load(dst, arrays):
    dst.load_state_dict({k: tg.tensor(v.copy()) for k, v in arrays.items()})


class _Twice(nn.Module):
    """One BatchNorm used twice in a forward: its second update starts from
    the first's."""

    def __init__(self, momentum):
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.bn = nn.BatchNorm1d(3, momentum=momentum)

    def forward(self, x):
        return self.bn(self.bn(self.lin(x)).tanh() * 2.0)


def _models(lib, kind):
    nn_ = lib.nn
    if kind == "mlp":
        return nn_.Sequential(nn_.Linear(4, 3), nn_.BatchNorm1d(3), nn_.Tanh(), nn_.Linear(3, 2))
    if kind == "cumulative":          # momentum=None: a cumulative average
        return nn_.Sequential(nn_.Linear(4, 3), nn_.BatchNorm1d(3, momentum=None))
    if kind == "cnn":
        return nn_.Sequential(nn_.Conv2d(2, 3, 3), nn_.BatchNorm2d(3, momentum=0.3), nn_.ReLU(),
                              nn_.Flatten(), nn_.Linear(3 * 4 * 4, 2))
    if kind == "untracked":           # batch statistics, no buffers to write
        return nn_.Sequential(nn_.Linear(4, 3), nn_.BatchNorm1d(3, track_running_stats=False))
    raise KeyError(kind)


def _input(kind, rng):
    return rng.standard_normal((6, 2, 6, 6) if kind == "cnn" else (6, 4))


def _eager_and_compiled(kind, steps=4):
    """The same training steps (SGD) eagerly and through tg.compile(model):
    the outputs, gradients, parameters and buffers after each step."""
    rng = np.random.default_rng(0)
    tg.manual_seed(0)
    ref = _models(tg, kind)
    model = _models(tg, kind)
    _load(model, _arrays(ref))
    cm = tg.compile(model)
    assert isinstance(cm, nn.OptimizedModule) and cm._orig_mod is model
    opts = [tg.optim.SGD(m.parameters(), lr=0.1) for m in (ref, model)]
    for _ in range(steps):
        x = tg.tensor(_input(kind, rng))
        got = []
        for m, call, opt in ((ref, ref, opts[0]), (model, cm, opts[1])):
            opt.zero_grad()
            out = call(x)
            (out ** 2).sum().backward()
            got.append((out.detach().numpy(), [p.grad.numpy().copy() for p in m.parameters()]))
            opt.step()
        np.testing.assert_allclose(got[1][0], got[0][0], rtol=1e-10, atol=1e-12)
        for a, b in zip(got[1][1], got[0][1]):
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)
        a, b = _arrays(model), _arrays(ref)
        assert list(a) == list(b)
        for k in a:
            np.testing.assert_allclose(a[k], b[k], rtol=1e-10, atol=1e-12, err_msg=k)
            assert a[k].dtype == b[k].dtype, k
    return ref, model, cm


@pytest.mark.parametrize("kind", ["mlp", "cumulative", "cnn", "untracked"])
def test_compiled_batch_norm_in_training_mode_matches_eager(kind):
    ref, model, cm = _eager_and_compiled(kind)
    for bn in [m for m in model.modules() if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d))]:
        if bn.track_running_stats:
            assert int(bn.num_batches_tracked) == 4
    # eval mode after training: the compiled call reads the written statistics
    ref.eval()
    model.eval()
    x = tg.tensor(_input(kind, np.random.default_rng(1)))
    np.testing.assert_allclose(cm(x).detach().numpy(), ref(x).detach().numpy(), rtol=1e-10,
                               atol=1e-12)
    assert not cm.training
    cm.train()
    assert model.training and all(m.training for m in model.modules())


@pytest.mark.parametrize("momentum", [0.1, None])
def test_a_batch_norm_called_twice_in_one_compiled_call(momentum):
    rng = np.random.default_rng(2)
    tg.manual_seed(0)
    ref, model = _Twice(momentum), _Twice(momentum)
    _load(model, _arrays(ref))
    cm = tg.compile(model)
    for _ in range(3):
        x = tg.tensor(rng.standard_normal((5, 4)))
        np.testing.assert_allclose(cm(x).detach().numpy(), ref(x).detach().numpy(),
                                   rtol=1e-10, atol=1e-12)
    assert int(model.bn.num_batches_tracked) == int(ref.bn.num_batches_tracked) == 6
    for k, v in _arrays(ref).items():
        np.testing.assert_allclose(_arrays(model)[k], v, rtol=1e-10, atol=1e-12, err_msg=k)


def test_the_optimized_module_is_torchs():
    tg.manual_seed(0)
    model = _models(tg, "mlp")
    cm = tg.compile(model)
    assert list(cm.state_dict()) == ["_orig_mod." + k for k in model.state_dict()]
    assert [id(p) for p in cm.parameters()] == [id(p) for p in model.parameters()]
    assert len(cm) == 4 and cm.training is model.training   # the original's, as torch
    with pytest.raises(TypeError, match="not subscriptable"):   # torch's OptimizedModule too
        cm[1]
    assert repr(cm).startswith("OptimizedModule(\n  (_orig_mod): Sequential(")
    cm.eval()
    assert not model.training and not cm.training


def test_batch_norm_training_inside_other_compiled_functions_says_what_to_do():
    tg.manual_seed(0)
    model = _models(tg, "mlp")
    x = tg.tensor(np.random.default_rng(0).standard_normal((6, 4)))
    before = _arrays(model)
    with pytest.raises(NotImplementedError, match=r"tg.compile\(model\)"):
        tg.compile(lambda x: model(x).sum())(x)
    with pytest.raises(NotImplementedError, match=r"model.eval\(\)"):
        tg.grad(lambda x: model(x).sum())(x)
    # nothing was written by the refused calls
    for k, v in _arrays(model).items():
        np.testing.assert_array_equal(v, before[k])
    # a compiled model inside another transform joins its trace: refused the same way
    with pytest.raises(NotImplementedError, match=r"tg.compile\(model\)"):
        tg.grad(lambda x: tg.compile(model)(x).sum())(x)


@needs_torch
@pytest.mark.parametrize("kind", ["mlp", "cumulative", "cnn", "untracked"])
def test_compiled_batch_norm_training_matches_torch(kind):
    """Five SGD steps of the compiled model against torch's eager model (what
    torch.compile computes): outputs, gradients, parameters, running
    statistics and num_batches_tracked."""
    rng = np.random.default_rng(3)
    torch.manual_seed(0)
    tm = _models(torch, kind)
    model = _models(tg, kind)
    _load(model, _arrays(tm))
    cm = tg.compile(model)
    topt = torch.optim.SGD(tm.parameters(), lr=0.05)
    gopt = tg.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(5):
        xa = _input(kind, rng)
        topt.zero_grad()
        gopt.zero_grad()
        to = tm(torch.tensor(xa))
        go = cm(tg.tensor(xa))
        (to ** 2).sum().backward()
        (go ** 2).sum().backward()
        np.testing.assert_allclose(go.detach().numpy(), to.detach().numpy(), rtol=1e-9,
                                   atol=1e-12)
        for (n, tp), gp in zip(tm.named_parameters(), model.parameters()):
            np.testing.assert_allclose(gp.grad.numpy(), tp.grad.numpy(), rtol=1e-8,
                                       atol=1e-11, err_msg=n)
        topt.step()
        gopt.step()
    a, b = _arrays(model), _arrays(tm)
    assert list(a) == list(b)
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-9, atol=1e-12, err_msg=k)
        assert a[k].dtype == b[k].dtype, k


def test_functional_call_with_batch_norm_buffers_under_grad_says_what_to_do():
    tg.manual_seed(0)
    model = _models(tg, "mlp")
    x = tg.tensor(np.random.default_rng(0).standard_normal((6, 4)))
    params = {k: v.detach() for k, v in model.named_parameters()}
    bufs = {k: v.clone() for k, v in model.named_buffers()}

    def loss(p, b, x):
        return tg.func.functional_call(model, (p, b), (x,)).pow(2).sum()

    with pytest.raises(NotImplementedError, match="replace_all_batch_norm_modules_"):
        tg.func.grad(loss)(params, bufs, x)


@needs_torch
def test_replace_all_batch_norm_modules_matches_torch_under_grad():
    torch.manual_seed(0)
    tm = _models(torch, "cnn")
    model = _models(tg, "cnn")
    _load(model, _arrays(tm))
    assert torch.func.replace_all_batch_norm_modules_(tm) is tm
    assert tg.func.replace_all_batch_norm_modules_(model) is model
    assert list(model.state_dict()) == list(tm.state_dict())
    assert model[1].running_mean is None and not model[1].track_running_stats
    xa = np.random.default_rng(4).standard_normal((6, 2, 6, 6))

    def loss(lib, m):
        return lambda p, x: lib.func.functional_call(m, p, (x,)).pow(2).sum()

    tp = {k: v.detach() for k, v in tm.named_parameters()}
    gp = {k: v.detach() for k, v in model.named_parameters()}
    tgrad = torch.func.grad(loss(torch, tm))(tp, torch.tensor(xa))
    ggrad = tg.func.grad(loss(tg, model))(gp, tg.tensor(xa))
    assert list(ggrad) == list(tgrad)
    for k in tgrad:
        np.testing.assert_allclose(np.asarray(ggrad[k]), tgrad[k].numpy(), rtol=1e-8,
                                   atol=1e-11, err_msg=k)


def test_padded_max_pooling_and_new_layers_compile():
    """Max pooling pads with -inf, which the generated code must spell
    (-np.inf); unfold, fold and interpolate compile too."""
    rng = np.random.default_rng(8)
    x = tg.tensor(rng.standard_normal((2, 3, 7, 6)))
    F = nn.functional
    for f in (lambda x: F.max_pool2d(x, 3, stride=2, padding=1),
              lambda x: F.max_pool1d(x[:, :, 0], 2, padding=1),
              lambda x: F.unfold(x, (2, 3), padding=1, stride=(2, 1)),
              lambda x: F.fold(F.unfold(x, (2, 3), padding=1) * 1.5, (7, 6), (2, 3), padding=1),
              lambda x: F.interpolate(x, scale_factor=1.5, mode="bilinear"),
              lambda x: F.interpolate(x, size=(9, 4), mode="bicubic")):
        want = f(x)
        np.testing.assert_allclose(np.asarray(tg.compile(f)(x)), want.numpy(), rtol=1e-12)
        xe = tg.tensor(x.numpy(), requires_grad=True)
        (f(xe) ** 2).sum().backward()
        g = tg.func.grad(lambda x: (f(x) ** 2).sum())(x)
        np.testing.assert_allclose(g.numpy(), xe.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_module_compile_compiles_the_call_in_place():
    # torch.nn.Module.compile(): the module itself, its call compiled
    import copy
    import pickle
    tg.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.BatchNorm1d(8), nn.Linear(8, 1))
    x = tg.randn(6, 4)
    start = m[2].running_mean.numpy().copy()
    want = m(x)
    stats = m[2].running_mean.numpy().copy()
    m[2].running_mean.copy_(tg.tensor(start))   # the eager call updated them: undo for equality
    m[2].num_batches_tracked.zero_()
    def loads():   # generated modules built, read from disk or found in memory
        info = tg.cache_info()
        return info["compiles"] + info["disk_hits"] + info["memory_hits"]
    before = loads()
    assert m.compile() is None
    got = m(x)
    assert loads() > before           # the call ran compiled code
    np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(m[2].running_mean.numpy(), stats, rtol=1e-12)  # buffers written
    got.sum().backward()
    assert m[0].weight.grad is not None
    assert list(m.state_dict()) == ["0.weight", "0.bias", "2.weight", "2.bias",
                                    "2.running_mean", "2.running_var", "2.num_batches_tracked",
                                    "3.weight", "3.bias"]   # no _orig_mod. prefix: still m
    # copies and pickles are not compiled (as torch); disable=True leaves it eager
    assert "_compiled_call_impl" not in copy.deepcopy(m).__dict__
    assert "_compiled_call_impl" not in pickle.loads(pickle.dumps(m)).__dict__
    lin = nn.Linear(2, 2)
    lin.compile(disable=True)
    assert lin.__dict__["_compiled_call_impl"] is None and lin(tg.ones(1, 2)).shape == (1, 2)
