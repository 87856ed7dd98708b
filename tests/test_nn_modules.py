"""tracegrad.nn without torch: Module's registration, traversal, modes,
state_dict, hooks and conversions; the layers against NumPy references and
finite differences (gradcheck); torch's initialisation formulas; nn.utils;
compiled modules reading their parameters at call time; and the CNN example.
(Side by side with torch: tests/test_nn_parity.py.)"""
from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest

import tracegrad as tg
from tracegrad import nn
from tracegrad.nn import functional as F
from tracegrad.autograd import gradcheck


@pytest.fixture(autouse=True)
def _float64():
    old = tg.get_default_dtype()
    tg.set_default_dtype(tg.float64)
    yield
    tg.set_default_dtype(old)


def _rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 4)
        self.block = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
        self.scale = nn.Parameter(tg.ones(1))
        self.register_buffer("steps", tg.zeros(1))
        self.register_buffer("scratch", tg.zeros(2), persistent=False)
        self.plain = 5

    def forward(self, x):
        return self.block(self.fc(x)) * self.scale


# --- Module ---------------------------------------------------------------------------------

def test_registration_traversal_and_names():
    m = Net()
    assert [n for n, _ in m.named_parameters()] == ["scale", "fc.weight", "fc.bias",
                                                    "block.0.weight", "block.0.bias"]
    assert all(isinstance(p, nn.Parameter) and isinstance(p, tg.Tensor) and p.requires_grad
               for p in m.parameters())
    assert [n for n, _ in m.named_buffers()] == ["steps", "scratch"]
    assert [n for n, _ in m.named_children()] == ["fc", "block"]
    assert [n for n, _ in m.named_modules()] == ["", "fc", "block", "block.0", "block.1"]
    assert len(list(m.parameters(recurse=False))) == 1
    assert m.plain == 5 and "plain" not in m._parameters
    assert m.get_submodule("block.0") is m.block[0]
    assert m.get_parameter("block.0.bias") is m.block[0].bias
    # shared parameters are listed once; a module twice is one child
    shared = nn.Sequential(m.fc, m.fc)
    assert len(list(shared.parameters())) == 2 and len(list(shared.children())) == 1
    # reassigning and deleting
    m.scale = None
    assert "scale" in m._parameters and m.scale is None
    with pytest.raises(TypeError, match="cannot assign 'Tensor' as parameter 'fc_w'|"
                                        "cannot assign"):
        m.fc.weight = tg.zeros(4, 3)
    del m.fc
    assert "fc" not in m._modules
    with pytest.raises(AttributeError, match="has no attribute 'fc'"):
        m.fc
    with pytest.raises(KeyError, match=r'contain "\."'):
        m.register_buffer("a.b", tg.zeros(1))
    with pytest.raises(KeyError, match="already exists"):
        m.register_parameter("plain", nn.Parameter(tg.zeros(1)))
    with pytest.raises(TypeError, match="not a Module subclass"):
        m.add_module("x", 3)


def test_train_eval_zero_grad_requires_grad_apply_and_dtype_moves():
    m = Net()
    m.eval()
    assert not m.training and not m.block[1].training
    m.train()
    assert m.block[0].training
    m(tg.tensor(_rand(2, 3))).sum().backward()
    assert all(p.grad is not None for p in m.parameters())
    m.zero_grad(set_to_none=False)
    assert all(float(p.grad.abs().sum()) == 0 for p in m.parameters())
    m.zero_grad()
    assert all(p.grad is None for p in m.parameters())
    m.requires_grad_(False)
    assert not any(p.requires_grad for p in m.parameters())
    seen = []
    m.apply(lambda mod: seen.append(type(mod).__name__))
    assert seen == ["Linear", "Linear", "ReLU", "Sequential", "Net"]
    w = m.fc.weight
    assert m.float() is m and m.fc.weight is w and w.dtype == np.float32
    assert m.steps.dtype == np.float32
    m.double()
    assert m.fc.weight is w and w.dtype == np.float64
    with pytest.raises(TypeError, match="floating point"):
        m.to(tg.int64)


def test_state_dict_and_strict_loading():
    a, b = Net(), Net()
    sd = a.state_dict()
    assert list(sd) == ["scale", "steps", "fc.weight", "fc.bias", "block.0.weight",
                        "block.0.bias"]          # non-persistent buffers are not saved
    assert not sd["fc.weight"].requires_grad
    w = b.fc.weight
    res = b.load_state_dict(sd)
    assert repr(res) == "<All keys matched successfully>"
    assert b.fc.weight is w                      # copied into the same Parameter
    np.testing.assert_array_equal(w.detach().numpy(), a.fc.weight.detach().numpy())
    bad = OrderedDict(sd)
    del bad["fc.bias"]
    bad["extra"] = tg.zeros(1)
    with pytest.raises(RuntimeError, match=r'Missing key\(s\) in state_dict: "fc.bias"'):
        b.load_state_dict(bad)
    with pytest.raises(RuntimeError, match=r'Unexpected key\(s\) in state_dict: "extra"'):
        b.load_state_dict(bad)
    res = b.load_state_dict(bad, strict=False)      # loads what matches, lists the rest
    assert res.missing_keys == ["fc.bias"] and res.unexpected_keys == ["extra"]
    np.testing.assert_array_equal(b.fc.weight.detach().numpy(), sd["fc.weight"].numpy())
    c = Net()
    c.load_state_dict({k: v.clone() for k, v in sd.items()}, assign=True)
    np.testing.assert_array_equal(c.fc.weight.detach().numpy(), sd["fc.weight"].numpy())
    assert isinstance(c.fc.weight, nn.Parameter) and c.fc.weight.requires_grad
    wrong = OrderedDict(sd)
    wrong["fc.weight"] = tg.zeros(2, 2)
    with pytest.raises(RuntimeError, match="size mismatch for fc.weight"):
        b.load_state_dict(wrong)


def test_forward_hooks_and_pre_hooks():
    lin = nn.Linear(2, 2)
    x = tg.tensor(_rand(1, 2))
    h1 = lin.register_forward_pre_hook(lambda mod, args: (args[0] * 0,))
    np.testing.assert_allclose(lin(x).detach().numpy(), lin.bias.detach().numpy()[None])
    h1.remove()
    calls = []
    h2 = lin.register_forward_hook(lambda mod, args, out: calls.append(out.shape) or out + 1)
    out = lin(x)
    np.testing.assert_allclose(out.detach().numpy(),
                               F.linear(x, lin.weight, lin.bias).detach().numpy() + 1)
    assert calls == [(1, 2)]
    h2.remove()
    lin.register_forward_pre_hook(lambda mod, args, kwargs: (args, kwargs), with_kwargs=True)
    lin(x)


def test_reprs_follow_torch():
    m = nn.Sequential(nn.Linear(3, 4, bias=False), nn.ReLU(), nn.Dropout(0.2),
                      nn.ModuleList([nn.Tanh(), nn.Tanh()]))
    assert repr(m) == (
        "Sequential(\n"
        "  (0): Linear(in_features=3, out_features=4, bias=False)\n"
        "  (1): ReLU()\n"
        "  (2): Dropout(p=0.2, inplace=False)\n"
        "  (3): ModuleList(\n"
        "    (0-1): 2 x Tanh()\n"
        "  )\n"
        ")")
    assert repr(nn.Parameter(tg.tensor([1.0]))).startswith("Parameter containing:\ntensor(")
    assert repr(nn.Conv2d(1, 2, 3, stride=2, bias=False)) == \
        "Conv2d(1, 2, kernel_size=(3, 3), stride=(2, 2), bias=False)"


def test_containers():
    s = nn.Sequential(OrderedDict([("a", nn.Linear(2, 3)), ("b", nn.ReLU())]))
    assert isinstance(s[0], nn.Linear) and isinstance(s[-1], nn.ReLU) and len(s) == 2
    assert list(s[:1]._modules) == ["a"]
    s.append(nn.Identity())
    assert len(s) == 3
    ml = nn.ModuleList([nn.Linear(1, 1)])
    ml.append(nn.Linear(1, 1))
    ml.insert(0, nn.ReLU())
    assert [type(x).__name__ for x in ml] == ["ReLU", "Linear", "Linear"]
    assert len(list(ml.parameters())) == 4
    md = nn.ModuleDict({"x": nn.Linear(1, 1)})
    md["y"] = nn.Tanh()
    assert list(md.keys()) == ["x", "y"] and "x" in md
    pl = nn.ParameterList([tg.zeros(2), nn.Parameter(tg.ones(1))])
    assert len(list(pl.parameters())) == 2 and isinstance(pl[0], nn.Parameter)
    pd = nn.ParameterDict({"w": tg.zeros(2)})
    assert isinstance(pd["w"], nn.Parameter) and [n for n, _ in pd.named_parameters()] == ["w"]


# --- initialisation ------------------------------------------------------------------------

def test_default_initialisation_follows_torchs_formulas():
    tg.manual_seed(0)
    lin = nn.Linear(400, 300)
    bound = 1 / math.sqrt(400)   # kaiming_uniform(a=sqrt(5)): gain sqrt(1/3) * sqrt(3 / fan_in)
    w, b = lin.weight.detach().numpy(), lin.bias.detach().numpy()
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.99 * bound
    assert abs(w.std() - bound / math.sqrt(3)) < 0.01 * bound
    assert np.abs(b).max() <= bound
    conv = nn.Conv2d(8, 16, 3)
    cb = 1 / math.sqrt(8 * 9)
    assert np.abs(conv.weight.detach().numpy()).max() <= cb
    bn = nn.BatchNorm2d(3)
    assert bn.weight.tolist() == [1, 1, 1] and bn.bias.tolist() == [0, 0, 0]
    emb = nn.Embedding(1000, 8, padding_idx=3)
    e = emb.weight.detach().numpy()
    assert abs(e.std() - 1) < 0.05 and not e[3].any()
    rnn = nn.LSTM(5, 10)
    assert all(np.abs(p.detach().numpy()).max() <= 1 / math.sqrt(10) for p in rnn.parameters())
    # the seed reproduces the draws
    tg.manual_seed(7)
    a = nn.Linear(3, 3).weight.detach().numpy()
    tg.manual_seed(7)
    np.testing.assert_array_equal(nn.Linear(3, 3).weight.detach().numpy(), a)


def test_init_functions():
    init = nn.init
    assert init._calculate_fan_in_and_fan_out(tg.empty(6, 2, 3, 3)) == (18, 54)
    assert init.calculate_gain("relu") == math.sqrt(2)
    assert init.calculate_gain("leaky_relu", 0.2) == math.sqrt(2 / 1.04)
    assert init.calculate_gain("tanh") == 5 / 3
    with pytest.raises(ValueError, match="Unsupported nonlinearity"):
        init.calculate_gain("bogus")
    with pytest.raises(ValueError, match="fewer than 2 dimensions"):
        init.xavier_uniform_(tg.empty(3))
    g = tg.Generator().manual_seed(1)
    t = tg.empty(500, 300)
    init.xavier_uniform_(t, gain=2.0, generator=g)
    a = 2.0 * math.sqrt(6 / 800)
    assert np.abs(t.numpy()).max() <= a and np.abs(t.numpy()).max() > 0.99 * a
    init.kaiming_normal_(t, mode="fan_out", nonlinearity="relu")
    assert abs(t.numpy().std() - math.sqrt(2 / 500)) < 0.02 * math.sqrt(2 / 500)
    init.xavier_normal_(t)
    assert abs(t.numpy().std() - math.sqrt(2 / 800)) < 0.02 * math.sqrt(2 / 800)
    init.trunc_normal_(t, std=1.0, a=-0.5, b=0.5)
    assert np.abs(t.numpy()).max() <= 0.5
    for fill, value in ((init.zeros_, 0), (init.ones_, 1), (lambda x: init.constant_(x, 2.5),
                                                           2.5)):
        fill(t)
        assert (t.numpy() == value).all()
    q = tg.empty(4, 6)
    init.orthogonal_(q)
    np.testing.assert_allclose(q.numpy() @ q.numpy().T, np.eye(4), atol=1e-12)
    e = tg.empty(3, 4)
    init.eye_(e)
    np.testing.assert_array_equal(e.numpy(), np.eye(3, 4))
    v = t._version
    init.uniform_(t, -1, 1)
    assert t._version == v + 1 and np.abs(t.numpy()).max() <= 1


# --- layers against NumPy and finite differences -------------------------------------------

def _conv2d_ref(x, w, b, stride, pad, dil, groups):
    x = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    N, C, H, W = x.shape
    O, Cg, KH, KW = w.shape
    Ho = (H - dil * (KH - 1) - 1) // stride + 1
    Wo = (W - dil * (KW - 1) - 1) // stride + 1
    out = np.zeros((N, O, Ho, Wo))
    Og = O // groups
    for o in range(O):
        g = o // Og
        for i in range(Ho):
            for j in range(Wo):
                patch = x[:, g * Cg:(g + 1) * Cg, i * stride:i * stride + dil * (KH - 1) + 1:dil,
                          j * stride:j * stride + dil * (KW - 1) + 1:dil]
                out[:, o, i, j] = (patch * w[o]).sum(axis=(1, 2, 3)) + b[o]
    return out


def test_conv2d_against_a_loop_and_conv_transpose_as_its_adjoint():
    x, w, b = _rand(2, 4, 7, 6), _rand(6, 2, 3, 2, seed=1), _rand(6, seed=2)
    got = F.conv2d(tg.tensor(x), tg.tensor(w), tg.tensor(b), stride=2, padding=1, dilation=2,
                   groups=2)
    np.testing.assert_allclose(got.numpy(), _conv2d_ref(x, w, b, 2, 1, 2, 2), atol=1e-12)
    # <conv(x), y> = <x, conv_transpose(y)> for the same weight
    x = _rand(2, 3, 7, 7, seed=3)
    w = _rand(4, 3, 3, 3, seed=4)
    y = F.conv2d(tg.tensor(x), tg.tensor(w), stride=2, padding=1)
    yy = _rand(*y.shape, seed=5)
    xt = F.conv_transpose2d(tg.tensor(yy), tg.tensor(w), stride=2, padding=1)
    assert xt.shape == x.shape
    np.testing.assert_allclose((y.numpy() * yy).sum(), (x * xt.numpy()).sum(), rtol=1e-10)


def test_pooling_against_numpy():
    x = _rand(2, 3, 6, 6)
    mp = F.max_pool2d(tg.tensor(x), 2).numpy()
    np.testing.assert_allclose(mp, x.reshape(2, 3, 3, 2, 3, 2).max(axis=(3, 5)))
    ap = F.avg_pool2d(tg.tensor(x), 3).numpy()
    np.testing.assert_allclose(ap, x.reshape(2, 3, 2, 3, 2, 3).mean(axis=(3, 5)))
    ad = F.adaptive_avg_pool2d(tg.tensor(x), 1).numpy()
    np.testing.assert_allclose(ad, x.mean(axis=(2, 3), keepdims=True))
    # padding=1, count_include_pad=False: the corner window averages its 4 real pixels
    ap = F.avg_pool2d(tg.tensor(x), 3, stride=1, padding=1, count_include_pad=False).numpy()
    np.testing.assert_allclose(ap[..., 0, 0], x[..., :2, :2].mean(axis=(-1, -2)))
    m1 = F.max_pool1d(tg.tensor(x[:, :, 0]), 3, stride=3).numpy()
    np.testing.assert_allclose(m1, x[:, :, 0].reshape(2, 3, 2, 3).max(axis=3))


def test_normalisations_against_numpy():
    x = _rand(4, 3, 5)
    w, b = _rand(3, seed=1), _rand(3, seed=2)
    mean, var = x.mean(axis=(0, 2), keepdims=True), x.var(axis=(0, 2), keepdims=True)
    want = (x - mean) / np.sqrt(var + 1e-5) * w[None, :, None] + b[None, :, None]
    rm, rv = tg.zeros(3), tg.ones(3)
    got = F.batch_norm(tg.tensor(x), rm, rv, tg.tensor(w), tg.tensor(b), training=True,
                       momentum=0.1)
    np.testing.assert_allclose(got.numpy(), want, atol=1e-12)
    np.testing.assert_allclose(rm.numpy(), 0.1 * mean.ravel())
    np.testing.assert_allclose(rv.numpy(), 0.9 + 0.1 * var.ravel() * 20 / 19)   # unbiased
    ln = F.layer_norm(tg.tensor(x), (5,)).numpy()
    np.testing.assert_allclose(ln, (x - x.mean(-1, keepdims=True)) /
                               np.sqrt(x.var(-1, keepdims=True) + 1e-5), atol=1e-12)
    x4 = _rand(2, 4, 3)
    gn = F.group_norm(tg.tensor(x4), 2).numpy()
    g = x4.reshape(2, 2, 6)
    want = ((g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + 1e-5))
    np.testing.assert_allclose(gn, want.reshape(2, 4, 3), atol=1e-12)


def test_batchnorm_module_running_stats_and_eval():
    bn = nn.BatchNorm1d(2, momentum=None)        # a cumulative moving average
    xs = [_rand(8, 2, seed=s) for s in range(3)]
    for x in xs:
        bn(tg.tensor(x))
    np.testing.assert_allclose(bn.running_mean.numpy(), np.mean([x.mean(0) for x in xs], 0))
    assert int(bn.num_batches_tracked) == 3
    bn.eval()
    x = xs[0]
    want = (x - bn.running_mean.numpy()) / np.sqrt(bn.running_var.numpy() + 1e-5)
    np.testing.assert_allclose(bn(tg.tensor(x)).detach().numpy(), want, atol=1e-12)
    with pytest.raises(ValueError, match="expected 4D input"):
        nn.BatchNorm2d(2)(tg.zeros(3, 2))


def test_embedding_attention_bilinear_against_numpy():
    w = _rand(5, 3)
    idx = np.array([[0, 4], [2, 2]])
    np.testing.assert_array_equal(F.embedding(tg.tensor(idx), tg.tensor(w)).numpy(), w[idx])
    with pytest.raises(IndexError, match="index out of range"):
        F.embedding(tg.tensor([5]), tg.tensor(w))
    q, k, v = _rand(2, 4, 3), _rand(2, 5, 3, seed=1), _rand(2, 5, 2, seed=2)
    s = q @ k.transpose(0, 2, 1) / math.sqrt(3)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    got = F.scaled_dot_product_attention(tg.tensor(q), tg.tensor(k), tg.tensor(v))
    np.testing.assert_allclose(got.numpy(), p @ v, atol=1e-12)
    x1, x2, A = _rand(3, 2), _rand(3, 4, seed=1), _rand(5, 2, 4, seed=2)
    np.testing.assert_allclose(F.bilinear(tg.tensor(x1), tg.tensor(x2), tg.tensor(A)).numpy(),
                               np.einsum("ni,oij,nj->no", x1, A, x2), atol=1e-12)


def test_lstm_cell_against_numpy():
    cell = nn.LSTMCell(3, 2)
    x, h, c = _rand(4, 3), _rand(4, 2, seed=1), _rand(4, 2, seed=2)
    P = {n: p.detach().numpy() for n, p in cell.named_parameters()}
    gates = x @ P["weight_ih"].T + P["bias_ih"] + h @ P["weight_hh"].T + P["bias_hh"]
    sig = lambda z: 1 / (1 + np.exp(-z))  # noqa: E731
    i, f, g, o = np.split(gates, 4, axis=1)
    c2 = sig(f) * c + sig(i) * np.tanh(g)
    h2 = sig(o) * np.tanh(c2)
    gh, gc = cell(tg.tensor(x), (tg.tensor(h), tg.tensor(c)))
    np.testing.assert_allclose(gh.detach().numpy(), h2, atol=1e-12)
    np.testing.assert_allclose(gc.detach().numpy(), c2, atol=1e-12)
    lstm = nn.LSTM(3, 2, num_layers=2, batch_first=True, bidirectional=True)
    out, (hn, cn) = lstm(tg.tensor(_rand(4, 6, 3)))
    assert out.shape == (4, 6, 4) and hn.shape == (4, 4, 2) and cn.shape == (4, 4, 2)
    mha = nn.MultiheadAttention(6, 3, batch_first=True)
    y, w = mha(*(tg.tensor(_rand(2, 5, 6)),) * 3)
    assert y.shape == (2, 5, 6) and w.shape == (2, 5, 5)
    np.testing.assert_allclose(w.detach().numpy().sum(-1), 1.0)
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(6, 2, 12, dropout=0.0), 2)
    assert enc(tg.tensor(_rand(5, 2, 6))).shape == (5, 2, 6)
    assert enc.layers[0].linear1.weight is not enc.layers[1].linear1.weight


tg.manual_seed(0)
_GRU = nn.GRU(2, 3, batch_first=True).double()
_MHA = nn.MultiheadAttention(4, 2).double()
GRADCHECKS = {
    "conv2d": (lambda x, w, b: F.conv2d(x, w, b, stride=(2, 1), padding=1, groups=2),
               [(2, 4, 5, 4), (4, 2, 3, 2), (4,)]),
    "conv1d_dilated": (lambda x, w: F.conv1d(x, w, padding="same", dilation=2),
                       [(2, 2, 7), (3, 2, 3)]),
    "conv_transpose2d": (lambda x, w: F.conv_transpose2d(x, w, stride=2, padding=1,
                                                         output_padding=1),
                         [(1, 2, 3, 3), (2, 3, 3, 3)]),
    "max_pool2d": (lambda x: F.max_pool2d(x, 3, stride=2, padding=1, ceil_mode=True),
                   [(1, 2, 5, 5)]),
    "avg_pool2d": (lambda x: F.avg_pool2d(x, 2, padding=1, count_include_pad=False),
                   [(1, 2, 5, 4)]),
    "adaptive_avg_pool2d": (lambda x: F.adaptive_avg_pool2d(x, (2, 3)), [(1, 2, 5, 4)]),
    "batch_norm": (lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True),
                   [(4, 3, 2), (3,), (3,)]),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (3,), w, b), [(2, 3), (3,), (3,)]),
    "group_norm": (lambda x, w: F.group_norm(x, 2, w), [(2, 4, 3), (4,)]),
    "embedding": (lambda w: F.embedding(tg.tensor([[0, 2], [1, 1]]), w), [(3, 2)]),
    "sdpa_causal": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                    [(1, 3, 2), (1, 3, 2), (1, 3, 2)]),
    "bilinear": (F.bilinear, [(2, 3), (2, 2), (4, 3, 2), (4,)]),
    "glu_prelu": (lambda x, a: F.prelu(F.glu(x, 1), a), [(2, 4, 3), (2,)]),
    "activations": (lambda x: F.selu(x) + F.celu(x, 0.5) + F.mish(x) + F.softsign(x)
                    + F.hardswish(x) + F.softmin(x, 1), [(3, 4)]),
    "kl_div": (lambda x, y: F.kl_div(x, y.sigmoid(), reduction="batchmean"), [(3, 4), (3, 4)]),
    "gru": (lambda x: _GRU(x)[0], [(2, 3, 2)]),
    "mha": (lambda x: _MHA(x, x, x)[0], [(3, 2, 4)]),
}


@pytest.mark.parametrize("name", sorted(GRADCHECKS))
def test_layers_gradcheck(name):
    fn, shapes = GRADCHECKS[name]
    tg.manual_seed(0)
    rng = np.random.default_rng(1)
    # values away from the kinks of max / hardswish (finite differences)
    inputs = [tg.tensor(rng.uniform(0.2, 1.0, s) * rng.choice([-1, 1], s), requires_grad=True)
              for s in shapes]
    assert gradcheck(fn, inputs, eps=1e-6, atol=1e-5)


def test_dropout_modules():
    tg.manual_seed(0)
    x = tg.ones(200, 50)
    d = nn.Dropout(0.25)
    y = d(x).numpy()
    assert set(np.unique(y)) <= {0.0, 1 / 0.75} and abs((y == 0).mean() - 0.25) < 0.02
    d.eval()
    assert d(x) is x
    y = nn.Dropout2d(0.5)(tg.ones(40, 30, 2, 2)).numpy()
    assert (y.reshape(40, 30, 4).std(-1) == 0).all()          # whole channels
    with pytest.raises(ValueError, match="between 0 and 1"):
        nn.Dropout(1.5)


# --- nn.utils ------------------------------------------------------------------------------

def test_clip_grad_and_vector_conversions():
    a, b = nn.Parameter(tg.tensor([3.0, 0.0])), nn.Parameter(tg.tensor([[4.0]]))
    a.grad, b.grad = tg.tensor([3.0, 0.0]), tg.tensor([[4.0]])
    total = nn.utils.clip_grad_norm_([a, b], max_norm=1.0)
    assert float(total) == 5.0
    np.testing.assert_allclose(a.grad.numpy(), [3 / (5 + 1e-6), 0.0])
    np.testing.assert_allclose(b.grad.numpy(), [[4 / (5 + 1e-6)]])
    a.grad = tg.tensor([3.0, -7.0])
    nn.utils.clip_grad_value_(a, 2.0)
    assert a.grad.tolist() == [2.0, -2.0]
    assert float(nn.utils.clip_grad_norm_([a], 10.0, norm_type="inf")) == 2.0
    v = nn.utils.parameters_to_vector([a, b])
    assert v.tolist() == [3.0, 0.0, 4.0]
    nn.utils.vector_to_parameters(tg.tensor([1.0, 2.0, 3.0]), [a, b])
    assert a.tolist() == [1.0, 2.0] and b.tolist() == [[3.0]]


# --- compiled modules ----------------------------------------------------------------------

def test_a_compiled_module_reads_its_parameters_at_call_time_and_trains():
    tg.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.LayerNorm(8), nn.Linear(8, 2))
    cm = tg.compile(model)
    x = tg.tensor(_rand(5, 4))
    np.testing.assert_allclose(cm(x).detach().numpy(), model(x).detach().numpy(), atol=1e-12)
    opt = tg.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        loss = (cm(x) ** 2).sum()                 # the compiled call is on the tape
        loss.backward()
        grads = [p.grad.numpy().copy() for p in model.parameters()]
        opt.zero_grad()
        (model(x) ** 2).sum().backward()          # eager gradients agree
        for g, p in zip(grads, model.parameters()):
            np.testing.assert_allclose(g, p.grad.numpy(), rtol=1e-10, atol=1e-12)
        opt.step()
        # the step (in place) is seen by the next compiled call
        np.testing.assert_allclose(cm(x).detach().numpy(), model(x).detach().numpy(),
                                   atol=1e-12)
    # a rebinding of a parameter's data (a dtype move) is seen too
    model.float()
    assert cm(x.float()).dtype == np.float32

    @tg.compile
    def loss_of(x):
        return (model(x) ** 2).sum()

    model.double()
    np.testing.assert_allclose(float(loss_of(x)), float((model(x) ** 2).sum()), rtol=1e-12)
    g = tg.grad(lambda x: (model(x) ** 2).sum())(x.numpy())
    xt = tg.tensor(x.numpy(), requires_grad=True)
    (model(xt) ** 2).sum().backward()
    np.testing.assert_allclose(np.asarray(g), xt.grad.numpy(), rtol=1e-10)


def test_cnn_example_runs_a_few_batches(tmp_path):
    pytest.importorskip("sklearn")
    example = Path(__file__).resolve().parent.parent / "examples" / "digits_cnn.py"
    env = dict(os.environ, TRACEGRAD_CACHE_DIR=str(tmp_path / "cache"))
    r = subprocess.run([sys.executable, str(example), "--small"], env=env,
                       capture_output=True, text=True, timeout=120, cwd=str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    losses = [float(v) for v in re.findall(r"mean loss ([0-9.]+)", r.stdout)]
    assert len(losses) == 2 and losses[1] < losses[0], r.stdout
    assert re.search(r"test accuracy [0-9.]+", r.stdout) and "training time" in r.stdout


def test_a_compiled_module_sees_mode_attribute_and_hook_changes():
    tg.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.ReLU(), nn.Flatten(),
                      nn.Dropout(0.5), nn.Linear(2 * 4 * 4, 3))
    x = tg.tensor(_rand(4, 1, 6, 6))
    m(x)
    m.eval()
    cm = tg.compile(m)
    np.testing.assert_allclose(cm(x).detach().numpy(), m(x).detach().numpy(), atol=1e-12)
    m[4].p = 0.0
    m.train()       # batch_norm on the batch's statistics, the running ones written back
    nbt = int(m[1].num_batches_tracked)
    np.testing.assert_allclose(cm(x).detach().numpy(), m(x).detach().numpy(), atol=1e-12)
    assert int(m[1].num_batches_tracked) == nbt + 2
    m.train()
    m[1].eval()     # dropout(p=0) in training mode, batch norm on running statistics
    np.testing.assert_allclose(cm(x).detach().numpy(), m(x).detach().numpy(), atol=1e-12)
    h = m.register_forward_hook(lambda mod, args, out: out * 0)
    assert float(cm(x).abs().sum()) == 0.0
    h.remove()
    np.testing.assert_allclose(cm(x).detach().numpy(), m(x).detach().numpy(), atol=1e-12)
