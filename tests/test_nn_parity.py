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
    "maxpool1d": (lambda L: L.nn.MaxPool1d(3, stride=2, padding=1, dilation=2), (2, 3, 11)),
    "avgpool1d": (lambda L: L.nn.AvgPool1d(3, stride=2, padding=1, ceil_mode=True,
                                           count_include_pad=False), (2, 3, 10)),
    "avgpool2d_pad": (lambda L: L.nn.AvgPool2d((3, 2), stride=(2, 1), padding=(1, 0)),
                      (2, 3, 7, 6)),
    "adaptive1d": (lambda L: L.nn.AdaptiveAvgPool1d(4), (2, 3, 9)),
    "conv3d": (lambda L: L.nn.Conv3d(2, 3, (2, 3, 2), stride=(1, 2, 1), padding=1),
               (1, 2, 4, 5, 4)),
    "conv_transpose1d": (lambda L: L.nn.ConvTranspose1d(4, 2, 3, stride=2, padding=1,
                                                        output_padding=1, dilation=1),
                         (2, 4, 5)),
    "batchnorm1d_3d": (lambda L: L.nn.BatchNorm1d(3, affine=False), (4, 3, 5)),
    "unfold": (lambda L: L.nn.Unfold((2, 3), padding=1, stride=(1, 2)), (2, 3, 5, 6)),
    "fold": (lambda L: L.nn.Fold((5, 6), (2, 3), padding=1, stride=(1, 2)), (2, 18, 18)),
    "upsample_nearest": (lambda L: L.nn.Upsample(scale_factor=2), (2, 3, 4, 5)),
    "upsample_bilinear": (lambda L: L.nn.Upsample(size=(3, 7), mode="bilinear",
                                                  align_corners=True), (2, 3, 4, 5)),
    "upsample_linear_tuple": (lambda L: L.nn.Upsample(scale_factor=(1.5,), mode="linear"),
                              (2, 3, 5)),
    "instancenorm2d": (lambda L: L.nn.InstanceNorm2d(3, affine=True), (2, 3, 4, 5)),
    "flatten_unflatten_identity": (lambda L: L.nn.Sequential(
        L.nn.Flatten(), L.nn.Identity(), L.nn.Unflatten(1, (4, 15)), L.nn.Flatten(0, 1),
        L.nn.Dropout(0.0)), (2, 3, 4, 5)),
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


ACTIVATIONS = {
    "ReLU": {}, "ReLU6": {}, "LeakyReLU": {"negative_slope": 0.2}, "ELU": {"alpha": 0.7},
    "CELU": {"alpha": 0.5}, "SELU": {}, "GELU": {}, "GELU_tanh": {"approximate": "tanh"},
    "SiLU": {}, "Mish": {}, "Tanh": {}, "Sigmoid": {}, "LogSigmoid": {},
    "Softplus": {"beta": 2.0, "threshold": 3.0}, "Softsign": {}, "Tanhshrink": {},
    "Hardtanh": {"min_val": -0.5, "max_val": 0.7}, "Hardswish": {}, "Hardsigmoid": {},
    "Hardshrink": {"lambd": 0.3}, "Softshrink": {"lambd": 0.3},
    "Threshold": {"threshold": 0.1, "value": -2.0}, "GLU": {"dim": 1}, "Softmax": {"dim": 1},
    "LogSoftmax": {"dim": 0}, "Softmin": {"dim": 1}, "PReLU": {"num_parameters": 4},
}


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activation_modules_match_torch(name):
    """Every activation module: repr, output, and gradients (input and, for
    PReLU, weight) as torch's."""
    kw = ACTIVATIONS[name]
    cls = name.split("_")[0]
    x = np.random.default_rng(6).standard_normal((3, 4)) * 2
    got = {}
    for lib in (torch, tg):
        m = getattr(lib.nn, cls)(**kw)
        xt = lib.tensor(x, requires_grad=True)
        out = m(xt)
        (out * lib.tensor(np.cos(np.arange(out.numel())).reshape(tuple(out.shape)))).sum() \
            .backward()
        got[lib] = (repr(m), out, xt.grad, [p.grad for p in m.parameters()])
    assert got[tg][0] == got[torch][0]
    _close(got[tg][1], got[torch][1], rtol=1e-9, atol=1e-12)
    tol = 1e-7 if cls in ("CELU", "Hardsigmoid") else 1e-9   # torch's float constants
    _close(got[tg][2], got[torch][2], rtol=tol, atol=1e-12)
    for a, b in zip(got[tg][3], got[torch][3]):
        _close(a, b, rtol=1e-9, atol=1e-12)


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


NN_GRAD_CASES = [
    (1, dict(), (2, 4, 9), (6, 4, 3)),
    (1, dict(stride=2, padding=1, dilation=2, groups=2), (2, 4, 11), (6, 2, 3)),
    (2, dict(), (2, 3, 6, 5), (4, 3, 3, 2)),
    (2, dict(stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=1), (1, 3, 7, 6),
     (2, 3, 3, 3)),
    (2, dict(stride=2, padding=1, groups=3), (2, 6, 7, 7), (3, 2, 3, 3)),
    (3, dict(padding=1), (1, 2, 4, 3, 3), (2, 2, 2, 2, 2)),
]


@pytest.mark.parametrize("case", range(len(NN_GRAD_CASES)))
def test_nn_grad_conv_input_and_weight_match_torch(case):
    """torch.nn.grad.conv*d_input / conv*d_weight: values, and their own
    gradients (they are differentiable in the weight, input and grad_output)."""
    nd, kw, xs, ws = NN_GRAD_CASES[case]
    rng = np.random.default_rng(case)
    x, w = rng.standard_normal(xs), rng.standard_normal(ws)
    ys = tuple(torch.nn.functional.__dict__[f"conv{nd}d"](torch.tensor(x), torch.tensor(w),
                                                            **kw).shape)
    gy = rng.standard_normal(ys)
    got = {}
    for lib in (torch, tg):
        tx, tw, tgy = (lib.tensor(a, requires_grad=True) for a in (x, w, gy))
        gi = getattr(lib.nn.grad, f"conv{nd}d_input")(xs, tw, tgy, **kw)
        gw = getattr(lib.nn.grad, f"conv{nd}d_weight")(tx, ws, tgy, **kw)
        ((gi ** 2).sum() + (gw ** 3).sum()).backward()
        got[lib] = [v.detach().numpy().copy() for v in (gi, gw, tx.grad, tw.grad, tgy.grad)]
        assert tuple(gi.shape) == xs and tuple(gw.shape) == ws
        assert gi.dtype == tw.dtype and gw.dtype == tx.dtype
    for a, b in zip(got[tg], got[torch]):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-10)


def test_nn_grad_inside_compiled_functions_and_its_errors():
    rng = np.random.default_rng(7)
    x, w = rng.standard_normal((2, 3, 6, 6)), rng.standard_normal((4, 3, 3, 3))
    gy = rng.standard_normal((2, 4, 4, 4))
    want = torch.nn.grad.conv2d_input(x.shape, torch.tensor(w), torch.tensor(gy)).numpy()
    f = tg.compile(lambda w, gy: tg.nn.grad.conv2d_input((2, 3, 6, 6), w, gy))
    np.testing.assert_allclose(np.asarray(f(w, gy)), want, rtol=1e-10)
    # d/dw sum(conv2d_weight(x, w.shape, gy) * w) = conv2d_weight(x, w.shape, gy)
    g = tg.grad(lambda w, gy: (tg.nn.grad.conv2d_weight(tg.tensor(x), w.shape, gy) * w).sum())(
        tg.tensor(w), tg.tensor(gy))
    np.testing.assert_allclose(
        g.numpy(), torch.nn.grad.conv2d_weight(torch.tensor(x), w.shape, torch.tensor(gy)).numpy(),
        rtol=1e-10)
    with pytest.raises(RuntimeError, match="grad_output has shape"):
        tg.nn.grad.conv2d_input((2, 3, 7, 7), tg.tensor(w), tg.tensor(gy))


# --- torch.nn.functional, one call each, side by side ------------------------------------------
# name -> (F function, input shapes (float arrays, differentiated), extra positional arguments
# (arrays or values, not differentiated), keywords)
_U = "uniform"   # an input in (0.05, 0.95): probabilities


def _idx(*a):
    return ("index", np.array(a))


FUNCTIONAL = {
    "batch_norm_eval": ("batch_norm", [(4, 3, 5)], [("pos", (3,)), ("pos", (3,))],
                        {"training": False, "eps": 1e-3}),
    "batch_norm_affine": (lambda F, x, w, b: F.batch_norm(x, None, None, w, b, training=True),
                          [(4, 3, 5), (3,), (3,)], [], {}),
    "layer_norm": (lambda F, x, w, b: F.layer_norm(x, (4, 5), w, b, eps=1e-4),
                   [(3, 4, 5), (4, 5), (4, 5)], [], {}),
    "group_norm": (lambda F, x, w, b: F.group_norm(x, 3, w, b), [(3, 6, 4), (6,), (6,)], [],
                   {}),
    "instance_norm": ("instance_norm", [(3, 4, 5, 2)], [], {}),
    "conv1d": ("conv1d", [(2, 4, 9), (6, 2, 3), (6,)], [],
               {"stride": 2, "padding": 2, "dilation": 2, "groups": 2}),
    "conv2d": ("conv2d", [(2, 3, 7, 6), (4, 3, 3, 2)], [], {"padding": "same"}),
    "conv3d": ("conv3d", [(1, 2, 4, 5, 4), (3, 2, 2, 3, 2)], [], {"stride": (1, 2, 1)}),
    "conv_transpose1d": ("conv_transpose1d", [(2, 4, 5), (4, 3, 3)], [],
                         {"stride": 2, "padding": 1, "output_padding": 1}),
    "conv_transpose2d": ("conv_transpose2d", [(2, 2, 4, 3), (2, 3, 2, 3), (3,)], [],
                         {"stride": (2, 1), "dilation": (1, 2)}),
    "max_pool1d": ("max_pool1d", [(2, 3, 9)], [], {"kernel_size": 3, "stride": 2,
                                                   "padding": 1}),
    "max_pool2d": ("max_pool2d", [(2, 3, 7, 6)], [], {"kernel_size": (3, 2), "stride": 2,
                                                      "ceil_mode": True}),
    "max_pool2d_dilated": ("max_pool2d", [(1, 2, 7, 7)], [], {"kernel_size": 2,
                                                              "dilation": 2}),
    "avg_pool1d": ("avg_pool1d", [(2, 3, 9)], [], {"kernel_size": 3, "stride": 2, "padding": 1,
                                                   "count_include_pad": False}),
    "avg_pool2d": ("avg_pool2d", [(2, 3, 7, 6)], [], {"kernel_size": 3, "stride": 2,
                                                      "padding": 1, "ceil_mode": True}),
    "adaptive_avg_pool1d": ("adaptive_avg_pool1d", [(2, 3, 7)], [], {"output_size": 3}),
    "adaptive_avg_pool2d": ("adaptive_avg_pool2d", [(2, 3, 7, 5)], [], {"output_size": (2, 4)}),
    "embedding": ("embedding", [], [_idx([0, 3, 1], [3, 3, 2]), ("float", (4, 5))],
                  {"padding_idx": 1}),
    "kl_div": ("kl_div", [(4, 5)], [(_U, (4, 5))], {"reduction": "batchmean"}),
    "kl_div_log_target": ("kl_div", [(4, 5), (4, 5)], [], {"reduction": "sum",
                                                           "log_target": True}),
    "bilinear": ("bilinear", [(5, 3), (5, 4), (2, 3, 4), (2,)], [], {}),
    "interpolate_nearest": ("interpolate", [(2, 3, 4, 5)], [], {"scale_factor": 1.5}),
    "interpolate_bilinear": ("interpolate", [(2, 3, 4, 5)], [],
                             {"size": (7, 3), "mode": "bilinear"}),
    "interpolate_linear_corners": ("interpolate", [(2, 3, 5)], [],
                                   {"size": 9, "mode": "linear", "align_corners": True}),
    "interpolate_bicubic": ("interpolate", [(2, 3, 5, 6)], [],
                            {"scale_factor": (1.7, 0.6), "mode": "bicubic"}),
    "interpolate_bicubic_corners": ("interpolate", [(2, 3, 5, 6)], [],
                                    {"size": (8, 3), "mode": "bicubic", "align_corners": True}),
    "unfold": ("unfold", [(2, 3, 6, 7)], [], {"kernel_size": (2, 3), "dilation": (1, 2),
                                              "padding": 1, "stride": (2, 1)}),
    "fold": ("fold", [(2, 12, 20)], [], {"output_size": (6, 7), "kernel_size": (2, 3),
                                         "dilation": (1, 2), "padding": 1, "stride": (2, 1)}),
    "glu": ("glu", [(3, 6)], [], {"dim": 1}),
    "prelu": ("prelu", [(2, 3, 4), (3,)], [], {}),
    "selu": ("selu", [(3, 4)], [], {}),
    "celu": ("celu", [(3, 4)], [], {"alpha": 0.7}),
    "mish": ("mish", [(3, 4)], [], {}),
    "softsign": ("softsign", [(3, 4)], [], {}),
    "hardtanh": ("hardtanh", [(3, 4)], [], {"min_val": -0.5, "max_val": 0.7}),
    "relu6": ("relu6", [(3, 4)], [], {}),
    "hardsigmoid": ("hardsigmoid", [(3, 4)], [], {}),
    "hardswish": ("hardswish", [(3, 4)], [], {}),
    "tanhshrink": ("tanhshrink", [(3, 4)], [], {}),
    "hardshrink": ("hardshrink", [(3, 4)], [], {"lambd": 0.3}),
    "softshrink": ("softshrink", [(3, 4)], [], {"lambd": 0.3}),
    "threshold": ("threshold", [(3, 4)], [], {"threshold": 0.1, "value": -2.0}),
    "softmin": ("softmin", [(3, 4)], [], {"dim": 0}),
    "normalize": ("normalize", [(3, 4)], [], {"p": 3.0, "dim": 0}),
    "cosine_similarity": ("cosine_similarity", [(3, 4), (3, 4)], [], {"dim": 1}),
    "one_hot_linear": ("linear", [(3, 4), (2, 4)], [], {}),
    "pad_reflect": ("pad", [(2, 3, 5)], [], {"pad": (2, 1), "mode": "reflect"}),
    "sdpa": ("scaled_dot_product_attention", [(2, 3, 4, 5), (2, 3, 6, 5), (2, 3, 6, 4)], [], {}),
    "sdpa_causal_scale": ("scaled_dot_product_attention", [(2, 4, 5), (2, 4, 5), (2, 4, 3)],
                          [], {"is_causal": True, "scale": 0.3}),
    "sdpa_mask": ("scaled_dot_product_attention", [(3, 4, 5), (3, 6, 5), (3, 6, 2)],
                  [("bool_mask", (4, 6))], {}),
}


def _extra(lib, spec, rng):
    kind, a = spec
    if kind == "index":
        return lib.tensor(a)
    if kind == "pos":
        return lib.tensor(rng.uniform(0.5, 2.0, a))
    if kind == _U:
        return lib.tensor(rng.uniform(0.05, 0.95, a))
    if kind == "bool_mask":
        m = rng.random(a) < 0.7
        m[:, 0] = True
        return lib.tensor(m)
    return lib.tensor(rng.standard_normal(a))


@pytest.mark.parametrize("name", sorted(FUNCTIONAL))
def test_functional_matches_torch(name):
    fname, shapes, extras, kw = FUNCTIONAL[name]
    got = {}
    for lib in (torch, tg):
        rng = np.random.default_rng(sorted(FUNCTIONAL).index(name))
        xs = [lib.tensor(rng.standard_normal(s), requires_grad=True) for s in shapes]
        more = [_extra(lib, e, rng) for e in extras]
        if name == "embedding":      # the weight takes the gradient
            more[1].requires_grad_(True)
            xs = [more[1]]
        fn = fname if callable(fname) else getattr(lib.nn.functional, fname)
        out = fn(lib.nn.functional, *xs) if callable(fname) else \
            fn(*(xs if name != "embedding" else []), *more, **kw)
        w = np.cos(np.arange(out.numel())).reshape(tuple(out.shape))
        (out * lib.tensor(w)).sum().backward()
        got[lib] = (out, [x.grad for x in xs])
    (to, tgrads), (go, ggrads) = got[torch], got[tg]
    assert tuple(go.shape) == tuple(to.shape) and str(go.dtype) == str(to.dtype)[6:]
    _close(go, to, rtol=1e-9, atol=1e-12)
    # torch's celu and hardsigmoid backward use float constants (1/6, 1/alpha) in float64
    tol = 1e-7 if name in ("celu", "hardsigmoid") else 1e-8
    for a, b in zip(ggrads, tgrads):
        _close(a, b, rtol=tol, atol=1e-11)
    if name == "embedding":
        return
    # compiled: the gradients of the same weighted sum from torch.func.grad
    rng = np.random.default_rng(sorted(FUNCTIONAL).index(name))
    xs = [tg.tensor(rng.standard_normal(s)) for s in shapes]
    more = [_extra(tg, e, rng) for e in extras]
    w = tg.tensor(np.cos(np.arange(to.numel())).reshape(tuple(to.shape)))

    def weighted(*xs):
        out = fname(tg.nn.functional, *xs) if callable(fname) else \
            getattr(tg.nn.functional, fname)(*xs, *more, **kw)
        return (out * w).sum()

    compiled = tg.func.grad(weighted, argnums=tuple(range(len(xs))))(*xs)
    for a, b in zip(compiled, tgrads):
        _close(a, b, rtol=tol, atol=1e-11)


def test_functional_batch_norm_training_updates_the_given_statistics_as_torch():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((6, 3, 4))
    stats = {}
    for lib in (torch, tg):
        rm, rv = lib.zeros(3), lib.ones(3)
        xt = lib.tensor(x, requires_grad=True)
        out = lib.nn.functional.batch_norm(xt, rm, rv, training=True, momentum=0.3)
        (out ** 3).sum().backward()
        stats[lib] = (out, xt.grad, rm, rv)
    for a, b in zip(stats[tg], stats[torch]):
        _close(a, b, rtol=1e-9, atol=1e-12)
