"""tracegrad.nn / optim / utils.data side by side with torch (skipped when
torch is not importable): the same torch code, with torch's weights copied
in by load_state_dict, gives the same outputs, gradients, optimizer
trajectories (20 steps, float64) and learning-rate schedules; module reprs
and state_dict keys are torch's."""
from __future__ import annotations

import numpy as np
import pytest

import tracegrad as tg

torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True, scope="module")
def _torch_cache_in_pytests_tmp(tmp_path_factory):
    """torch.optim's first step makes torch's compiler cache folder under the
    temporary folder, which the suite keeps empty: it goes to pytest's own."""
    import os
    old = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path_factory.mktemp("torchinductor"))
    yield
    if old is None:
        os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
    else:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = old


@pytest.fixture(autouse=True)
def _float64():
    old_tg, old_torch = tg.get_default_dtype(), torch.get_default_dtype()
    tg.set_default_dtype(tg.float64)
    torch.set_default_dtype(torch.float64)
    yield
    tg.set_default_dtype(old_tg)
    torch.set_default_dtype(old_torch)


def _copy_state(dst, src):
    """torch module src's state into the tracegrad module dst."""
    dst.load_state_dict({k: tg.tensor(v.detach().numpy().copy()) for k, v in
                         src.state_dict().items()})


def _mlp(lib):
    return lib.nn.Sequential(lib.nn.Linear(5, 8), lib.nn.Tanh(), lib.nn.Linear(8, 3))


def _close(a, b, rtol=1e-6, atol=1e-12):
    a = a.detach().numpy() if hasattr(a, "detach") else np.asarray(a)
    b = b.detach().numpy() if hasattr(b, "detach") else np.asarray(b)
    np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


OPTIMS = {
    "sgd": lambda L, p: L.optim.SGD(p, lr=0.1),
    "sgd_momentum": lambda L, p: L.optim.SGD(p, lr=0.05, momentum=0.9, dampening=0.1,
                                             weight_decay=0.01),
    "sgd_nesterov": lambda L, p: L.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True,
                                             maximize=False),
    "sgd_maximize": lambda L, p: L.optim.SGD(p, lr=0.01, momentum=0.5, maximize=True),
    "adam": lambda L, p: L.optim.Adam(p, lr=0.01),
    "adam_wd_amsgrad": lambda L, p: L.optim.Adam(p, lr=0.01, betas=(0.8, 0.99),
                                                 weight_decay=0.1, amsgrad=True),
    "adamw": lambda L, p: L.optim.AdamW(p, lr=0.01),
    "adamw_amsgrad_max": lambda L, p: L.optim.AdamW(p, lr=0.01, amsgrad=True, maximize=True),
    "rmsprop": lambda L, p: L.optim.RMSprop(p, lr=0.01),
    "rmsprop_centered": lambda L, p: L.optim.RMSprop(p, lr=0.01, momentum=0.5, centered=True,
                                                     weight_decay=0.01),
    "adagrad": lambda L, p: L.optim.Adagrad(p, lr=0.1, lr_decay=0.01, weight_decay=0.01,
                                            initial_accumulator_value=0.1),
}


@pytest.mark.parametrize("name", sorted(OPTIMS))
def test_optimizer_trajectories_match_torch_for_20_steps(name):
    torch.manual_seed(0)
    tm = _mlp(torch)
    gm = _mlp(tg)
    _copy_state(gm, tm)
    rng = np.random.default_rng(1)
    X, Y = rng.standard_normal((16, 5)), rng.standard_normal((16, 3))
    topt, gopt = OPTIMS[name](torch, tm.parameters()), OPTIMS[name](tg, gm.parameters())
    for _ in range(20):
        for L, m, opt in ((torch, tm, topt), (tg, gm, gopt)):
            opt.zero_grad()
            loss = L.nn.functional.mse_loss(m(L.tensor(X)), L.tensor(Y))
            loss.backward()
            opt.step()
    for (n1, p1), (n2, p2) in zip(tm.named_parameters(), gm.named_parameters()):
        assert n1 == n2
        _close(p2, p1)
    # the state has torch's keys
    ts, gs = topt.state_dict(), gopt.state_dict()
    assert sorted(ts["state"]) == sorted(gs["state"])
    for k in ts["state"]:
        assert sorted(ts["state"][k]) == sorted(gs["state"][k])
        for key, v in ts["state"][k].items():
            _close(gs["state"][k][key], v)
    assert [sorted(g) for g in ts["param_groups"]] == [sorted(g) for g in gs["param_groups"]]


@pytest.mark.parametrize("line_search", [None, "strong_wolfe"])
def test_lbfgs_matches_torch(line_search):
    torch.manual_seed(0)
    tm, gm = _mlp(torch), _mlp(tg)
    _copy_state(gm, tm)
    rng = np.random.default_rng(2)
    X, Y = rng.standard_normal((16, 5)), rng.standard_normal((16, 3))
    out = []
    for L, m in ((torch, tm), (tg, gm)):
        opt = L.optim.LBFGS(m.parameters(), lr=0.5, max_iter=10, history_size=5,
                            line_search_fn=line_search)

        def closure():
            opt.zero_grad()
            loss = L.nn.functional.mse_loss(m(L.tensor(X)), L.tensor(Y))
            loss.backward()
            return loss

        losses = [float(opt.step(closure)) for _ in range(3)]
        out.append((losses, [p.detach().numpy().copy() for p in m.parameters()]))
    np.testing.assert_allclose(out[1][0], out[0][0], rtol=1e-6)
    for a, b in zip(out[1][1], out[0][1]):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-10)


SCHEDULERS = {
    "step": lambda L, o: L.optim.lr_scheduler.StepLR(o, step_size=3, gamma=0.5),
    "multistep": lambda L, o: L.optim.lr_scheduler.MultiStepLR(o, [2, 5, 5, 9], gamma=0.3),
    "exponential": lambda L, o: L.optim.lr_scheduler.ExponentialLR(o, gamma=0.9),
    "cosine": lambda L, o: L.optim.lr_scheduler.CosineAnnealingLR(o, T_max=4, eta_min=0.01),
    "lambda": lambda L, o: L.optim.lr_scheduler.LambdaLR(o, lambda e: 1.0 / (e + 1)),
    "linear": lambda L, o: L.optim.lr_scheduler.LinearLR(o, start_factor=0.25, total_iters=4),
    "constant": lambda L, o: L.optim.lr_scheduler.ConstantLR(o, factor=0.5, total_iters=3),
}


@pytest.mark.parametrize("name", sorted(SCHEDULERS))
def test_schedulers_match_torch(name):
    seqs = []
    for L in (torch, tg):
        p = L.nn.Parameter(L.zeros(2))
        opt = L.optim.SGD([p], lr=0.1)
        sched = SCHEDULERS[name](L, opt)
        lrs = []
        for _ in range(12):
            p.grad = L.zeros(2)
            opt.step()
            sched.step()
            lrs.append(sched.get_last_lr()[0])
        seqs.append(lrs)
    np.testing.assert_allclose(seqs[1], seqs[0], rtol=1e-12)


def test_reduce_lr_on_plateau_matches_torch():
    metrics = [1.0, 0.9, 0.95, 0.95, 0.96, 0.97, 0.5, 0.6, 0.6, 0.6, 0.6, 0.6]
    seqs = []
    for L in (torch, tg):
        p = L.nn.Parameter(L.zeros(2))
        opt = L.optim.SGD([p], lr=0.1)
        sched = L.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=1, factor=0.5, cooldown=1)
        lrs = []
        for m in metrics:
            sched.step(m)
            lrs.append(opt.param_groups[0]["lr"])
        seqs.append(lrs)
    assert seqs[0] == seqs[1]


def _both(build, *args):
    torch.manual_seed(0)
    t = build(torch, *args)
    g = build(tg, *args)
    _copy_state(g, t)
    return t, g


LAYERS = {
    "linear": (lambda L: L.nn.Linear(6, 4), (3, 6)),
    "bilinear": None,
    "conv1d": (lambda L: L.nn.Conv1d(3, 4, 3, stride=2, padding=1), (2, 3, 9)),
    "conv2d": (lambda L: L.nn.Conv2d(4, 6, (3, 2), stride=(2, 1), padding=1, dilation=(1, 2),
                                     groups=2), (2, 4, 7, 8)),
    "conv2d_reflect": (lambda L: L.nn.Conv2d(2, 3, 3, padding=1, padding_mode="reflect"),
                       (2, 2, 5, 5)),
    "conv2d_same_circular": (lambda L: L.nn.Conv2d(2, 3, 3, padding="same",
                                                   padding_mode="circular"), (2, 2, 5, 5)),
    "conv_transpose2d": (lambda L: L.nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1,
                                                        output_padding=1, groups=2),
                         (2, 4, 4, 5)),
    "maxpool": (lambda L: L.nn.MaxPool2d(3, stride=2, padding=1, ceil_mode=True), (2, 3, 7, 6)),
    "avgpool": (lambda L: L.nn.AvgPool2d(2), (2, 3, 6, 6)),
    "adaptive": (lambda L: L.nn.AdaptiveAvgPool2d((3, 2)), (2, 3, 7, 5)),
    "batchnorm2d": (lambda L: L.nn.BatchNorm2d(3, momentum=0.2), (4, 3, 5, 5)),
    "batchnorm1d_cma": (lambda L: L.nn.BatchNorm1d(3, momentum=None), (6, 3)),
    "layernorm": (lambda L: L.nn.LayerNorm((5, 4)), (3, 5, 4)),
    "groupnorm": (lambda L: L.nn.GroupNorm(2, 4), (3, 4, 5)),
    "prelu": (lambda L: L.nn.PReLU(3), (2, 3, 4)),
    "pads": (lambda L: L.nn.Sequential(L.nn.ZeroPad2d((1, 0, 2, 1)), L.nn.ReflectionPad2d(1),
                                       L.nn.ReplicationPad2d((0, 1, 1, 0)),
                                       L.nn.CircularPad2d(1), L.nn.ConstantPad2d(1, 0.5)),
             (2, 3, 4, 5)),
    "pads_1d": (lambda L: L.nn.Sequential(L.nn.ZeroPad1d(2), L.nn.ReflectionPad1d((1, 2)),
                                          L.nn.ReplicationPad1d(1), L.nn.CircularPad1d(1),
                                          L.nn.ConstantPad1d((0, 2), -1.0)), (2, 3, 5)),
    "mlp": (lambda L: L.nn.Sequential(L.nn.Linear(4, 5), L.nn.GELU(), L.nn.Dropout(0.0),
                                      L.nn.LayerNorm(5), L.nn.Linear(5, 2), L.nn.Softmax(dim=1)),
            (3, 4)),
}
LAYERS = {k: v for k, v in LAYERS.items() if v is not None}


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_layers_match_torch_forward_backward_and_running_stats(name):
    build, shape = LAYERS[name]
    tm, gm = _both(build)
    assert repr(gm) == repr(tm)
    assert list(gm.state_dict()) == list(tm.state_dict())
    x = np.random.default_rng(3).standard_normal(shape)
    tx, gx = torch.tensor(x, requires_grad=True), tg.tensor(x, requires_grad=True)
    for _ in range(2):      # twice: running statistics move
        to, go = tm(tx), gm(gx)
        _close(go, to, rtol=1e-10, atol=1e-12)
    w = np.cos(np.arange(to.numel())).reshape(tuple(to.shape))
    (to * torch.tensor(w)).sum().backward()
    (go * tg.tensor(w)).sum().backward()
    _close(gx.grad, tx.grad, rtol=1e-9, atol=1e-12)
    for (n1, p1), (n2, p2) in zip(tm.named_parameters(), gm.named_parameters()):
        assert n1 == n2
        _close(p2.grad, p1.grad, rtol=1e-9, atol=1e-12)
    for (n1, b1), (n2, b2) in zip(tm.named_buffers(), gm.named_buffers()):
        assert n1 == n2
        _close(b2, b1, rtol=1e-10, atol=1e-12)
    tm.eval()
    gm.eval()
    _close(gm(gx), tm(tx), rtol=1e-10, atol=1e-12)


def test_embedding_and_bilinear_match_torch():
    te, ge = _both(lambda L: L.nn.Embedding(6, 3, padding_idx=2))
    assert repr(ge) == repr(te)
    idx = np.array([[0, 2, 5], [2, 1, 1]])
    to, go = te(torch.tensor(idx)), ge(tg.tensor(idx))
    _close(go, to)
    (to ** 2).sum().backward()
    (go ** 2).sum().backward()
    _close(ge.weight.grad, te.weight.grad)
    tb, gb = _both(lambda L: L.nn.Bilinear(3, 4, 2))
    assert repr(gb) == repr(tb)
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((5, 3)), rng.standard_normal((5, 4))
    _close(gb(tg.tensor(a), tg.tensor(b)), tb(torch.tensor(a), torch.tensor(b)))


LOSSES = {
    "mse": (lambda L: L.nn.MSELoss(), "float"),
    "l1_sum": (lambda L: L.nn.L1Loss(reduction="sum"), "float"),
    "smoothl1": (lambda L: L.nn.SmoothL1Loss(beta=0.5), "float"),
    "huber": (lambda L: L.nn.HuberLoss(delta=0.7), "float"),
    "bce": (lambda L: L.nn.BCELoss(), "prob"),
    "bce_logits": (lambda L: L.nn.BCEWithLogitsLoss(pos_weight=L.tensor([1.0, 2.0, 0.5])),
                   "float01"),
    "ce": (lambda L: L.nn.CrossEntropyLoss(label_smoothing=0.1), "class"),
    "ce_weight": (lambda L: L.nn.CrossEntropyLoss(weight=L.tensor([1.0, 2.0, 0.5])), "class"),
    "nll": (lambda L: L.nn.NLLLoss(ignore_index=1), "class"),
    "kldiv": (lambda L: L.nn.KLDivLoss(reduction="batchmean"), "prob"),
}


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_loss_modules_match_torch(name):
    build, kind = LOSSES[name]
    rng = np.random.default_rng(4)
    x = rng.standard_normal((4, 3))
    if kind == "prob":
        x = 1 / (1 + np.exp(-x))
        y = rng.random((4, 3))
    elif kind == "float01":
        y = rng.random((4, 3))
    elif kind == "class":
        y = np.array([0, 2, 1, 2])
    else:
        y = rng.standard_normal((4, 3))
    vals = []
    for L in (torch, tg):
        xt = L.tensor(x, requires_grad=True)
        loss = build(L)(xt, L.tensor(y))
        loss.backward()
        vals.append((loss, xt.grad))
    _close(vals[1][0], vals[0][0], rtol=1e-10)
    _close(vals[1][1], vals[0][1], rtol=1e-10)
    assert repr(build(tg)) == repr(build(torch))


def test_reprs_of_a_model_match_torch():
    def build(L):
        return L.nn.Sequential(
            L.nn.Conv2d(1, 8, 3, padding=1, bias=False), L.nn.BatchNorm2d(8),
            L.nn.ReLU(inplace=False), L.nn.MaxPool2d(2), L.nn.Dropout2d(0.25),
            L.nn.Flatten(), L.nn.Linear(8 * 4 * 4, 10), L.nn.LeakyReLU(0.2), L.nn.ELU(),
            L.nn.Softplus(beta=2.0), L.nn.Hardtanh(-2.0, 2.0), L.nn.GELU(approximate="tanh"),
            L.nn.LogSoftmax(dim=1), L.nn.Identity(),
            L.nn.ModuleList([L.nn.Linear(2, 2), L.nn.SiLU()]),
            L.nn.ModuleDict({"a": L.nn.Tanh()}), L.nn.Embedding(4, 2, padding_idx=0),
            L.nn.GroupNorm(2, 4), L.nn.LayerNorm(3), L.nn.ConvTranspose2d(2, 3, 2, stride=2),
            L.nn.AvgPool2d(2), L.nn.AdaptiveAvgPool2d(1), L.nn.Unflatten(1, (2, 5)))
    assert repr(build(tg)) == repr(build(torch))


def test_clip_grad_norm_and_vectors_match_torch():
    tm, gm = _both(_mlp)
    x = np.random.default_rng(5).standard_normal((4, 5))
    for L, m in ((torch, tm), (tg, gm)):
        (m(L.tensor(x)) ** 2).sum().backward()
    for norm_type in (2.0, 1.0, float("inf")):
        tn = torch.nn.utils.clip_grad_norm_(tm.parameters(), 0.5, norm_type=norm_type)
        gn = tg.nn.utils.clip_grad_norm_(gm.parameters(), 0.5, norm_type=norm_type)
        _close(gn, tn, rtol=1e-10)
    for p1, p2 in zip(tm.parameters(), gm.parameters()):
        _close(p2.grad, p1.grad, rtol=1e-10)
    _close(tg.nn.utils.parameters_to_vector(gm.parameters()),
           torch.nn.utils.parameters_to_vector(tm.parameters()))


def test_init_functions_use_torchs_fans_and_gains():
    from tracegrad.nn import init as ginit
    from torch.nn import init as tinit
    for shape in [(4, 3), (6, 2, 3, 3), (5, 4, 7)]:
        w = tg.empty(shape)
        assert ginit._calculate_fan_in_and_fan_out(w) == \
            tinit._calculate_fan_in_and_fan_out(torch.empty(shape))
    for nl, param in [("relu", None), ("leaky_relu", 0.2), ("tanh", None), ("selu", None),
                      ("conv2d", None), ("sigmoid", None), ("leaky_relu", None)]:
        assert ginit.calculate_gain(nl, param) == tinit.calculate_gain(nl, param)


def test_dataloader_batches_match_torch_without_shuffle():
    X = np.arange(20.0).reshape(10, 2)
    y = np.arange(10)
    out = []
    for L in (torch, tg):
        ds = L.utils.data.TensorDataset(L.tensor(X), L.tensor(y))
        dl = L.utils.data.DataLoader(ds, batch_size=4, drop_last=False)
        out.append([(xb.numpy().copy(), yb.numpy().copy()) for xb, yb in dl])
    assert len(out[0]) == len(out[1]) == 3
    for (a, b), (c, d) in zip(out[0], out[1]):
        np.testing.assert_array_equal(a, c)
        np.testing.assert_array_equal(b, d)


def _leaves(o):
    if isinstance(o, (tuple, list)):
        for x in o:
            yield from _leaves(x)
    elif o is not None:
        yield o


_X = np.random.default_rng(0).standard_normal((5, 3, 4))
_Q = np.random.default_rng(1).standard_normal((5, 3, 8))
_K3 = np.random.default_rng(2).standard_normal((6, 3, 3))
_V5 = np.random.default_rng(3).standard_normal((6, 3, 5))
SEQUENCE = {
    "rnn_2layer_bidirectional": (lambda L: L.nn.RNN(4, 6, num_layers=2, bidirectional=True),
                                 [_X], {}),
    "rnn_relu_batch_first": (lambda L: L.nn.RNN(4, 6, nonlinearity="relu", batch_first=True),
                             [_X], {}),
    "lstm_2layer_batch_first": (lambda L: L.nn.LSTM(4, 6, num_layers=2, batch_first=True),
                                [_X], {}),
    "lstm_bidirectional_unbatched": (lambda L: L.nn.LSTM(4, 6, bidirectional=True),
                                     [_X[:, 0]], {}),
    "gru_2layer_bidirectional": (lambda L: L.nn.GRU(4, 5, num_layers=2, bidirectional=True),
                                 [_X], {}),
    "gru_h0": (lambda L: L.nn.GRU(4, 5), [_X, np.ones((1, 3, 5)) * 0.3], {}),
    "rnncell": (lambda L: L.nn.RNNCell(4, 6), [_X[0]], {}),
    "lstmcell": (lambda L: L.nn.LSTMCell(4, 6), [_X[0]], {}),
    "grucell_nobias": (lambda L: L.nn.GRUCell(4, 6, bias=False), [_X[0]], {}),
    "mha": (lambda L: L.nn.MultiheadAttention(8, 2), [_Q, _Q, _Q], {}),
    "mha_causal_mask": (lambda L: L.nn.MultiheadAttention(8, 2), [_Q, _Q, _Q],
                        {"attn_mask": np.triu(np.ones((5, 5), bool), 1)}),
    "mha_batch_first_padding": (lambda L: L.nn.MultiheadAttention(8, 4, batch_first=True),
                                [_Q, _Q, _Q],
                                {"key_padding_mask": np.array([[False, False, True]] * 4
                                                              + [[True, False, False]])}),
    "mha_kdim_vdim": (lambda L: L.nn.MultiheadAttention(8, 2, kdim=3, vdim=5), [_Q, _K3, _V5],
                      {}),
    "encoder_layer": (lambda L: L.nn.TransformerEncoderLayer(8, 2, dim_feedforward=16,
                                                             dropout=0.0), [_Q], {}),
    "encoder_layer_norm_first_gelu": (
        lambda L: L.nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0,
                                               norm_first=True, activation="gelu",
                                               batch_first=True), [_Q], {}),
    "encoder": (lambda L: L.nn.TransformerEncoder(
        L.nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0), 2,
        enable_nested_tensor=False), [_Q], {}),
}


@pytest.mark.parametrize("name", sorted(SEQUENCE))
def test_recurrent_and_attention_layers_match_torch(name):
    build, inputs, kwargs = SEQUENCE[name]
    tm, gm = _both(build)
    assert repr(gm) == repr(tm)
    assert list(gm.state_dict()) == list(tm.state_dict())
    outs = []
    for L, m in ((torch, tm), (tg, gm)):
        xs = [L.tensor(a, requires_grad=a.dtype.kind == "f") for a in inputs]
        kw = {k: L.tensor(v) for k, v in kwargs.items()}
        out = list(_leaves(m(*xs, **kw)))
        sum((o ** 2).sum() for o in out).backward()
        outs.append((out, xs, list(m.parameters())))
    (to, tx, tp), (go, gx, gp) = outs
    assert len(to) == len(go)
    for a, b in zip(go, to):
        _close(a, b, rtol=1e-9, atol=1e-11)
    for a, b in zip(gx + gp, tx + tp):
        _close(a.grad, b.grad, rtol=1e-8, atol=1e-10)
