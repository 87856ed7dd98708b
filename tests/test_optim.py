"""tracegrad.optim without torch: each optimizer's first steps against the
formulas worked by hand, the Optimizer base (param groups, zero_grad,
state_dict round trips, closures, hooks, errors), LBFGS converging, and the
learning-rate schedulers' sequences.  (Side by side with torch, 20 steps:
tests/test_nn_parity.py.)"""
from __future__ import annotations

import math

import numpy as np
import pytest

import tracegrad as tg
from tracegrad import optim


@pytest.fixture(autouse=True)
def _float64():
    old = tg.get_default_dtype()
    tg.set_default_dtype(tg.float64)
    yield
    tg.set_default_dtype(old)


def _param(values):
    return tg.nn.Parameter(tg.tensor(np.asarray(values, dtype=np.float64)))


def _step_with_grad(opt, p, g):
    p.grad = tg.tensor(np.asarray(g, dtype=np.float64))
    opt.step()


def test_sgd_plain_momentum_nesterov_weight_decay_maximize_by_hand():
    p = _param([1.0, -2.0])
    opt = optim.SGD([p], lr=0.1)
    _step_with_grad(opt, p, [0.5, 1.0])
    np.testing.assert_allclose(p.detach().numpy(), [0.95, -2.1])

    p = _param([1.0])
    opt = optim.SGD([p], lr=0.1, momentum=0.9, dampening=0.5)
    _step_with_grad(opt, p, [1.0])          # buf = g = 1
    _step_with_grad(opt, p, [2.0])          # buf = 0.9 + 0.5 * 2 = 1.9
    np.testing.assert_allclose(p.detach().numpy(), [1.0 - 0.1 - 0.19])
    np.testing.assert_allclose(opt.state[p]["momentum_buffer"].numpy(), [1.9])

    p = _param([1.0])
    opt = optim.SGD([p], lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.1)
    _step_with_grad(opt, p, [1.0])          # g = 1 + 0.1 = 1.1, buf = 1.1, step 1.1 + .99
    np.testing.assert_allclose(p.detach().numpy(), [1.0 - 0.1 * (1.1 + 0.9 * 1.1)])

    p = _param([1.0])
    opt = optim.SGD([p], lr=0.1, maximize=True)
    _step_with_grad(opt, p, [1.0])
    np.testing.assert_allclose(p.detach().numpy(), [1.1])


def test_adam_adamw_amsgrad_first_steps_by_hand():
    g = np.array([0.5, -2.0])
    p = _param([1.0, 1.0])
    opt = optim.Adam([p], lr=0.01, eps=1e-8)
    _step_with_grad(opt, p, g)
    # m_hat = g, v_hat = g**2: the first step is lr * g / (|g| + eps)
    np.testing.assert_allclose(p.detach().numpy(), 1.0 - 0.01 * g / (np.abs(g) + 1e-8))
    assert float(opt.state[p]["step"]) == 1.0
    np.testing.assert_allclose(opt.state[p]["exp_avg"].numpy(), 0.1 * g)
    np.testing.assert_allclose(opt.state[p]["exp_avg_sq"].numpy(), 0.001 * g ** 2)

    p = _param([1.0])
    opt = optim.AdamW([p], lr=0.1, weight_decay=0.5)
    _step_with_grad(opt, p, [1.0])
    np.testing.assert_allclose(p.detach().numpy(), [1.0 * (1 - 0.05) - 0.1 / (1 + 1e-8)])

    p = _param([1.0])
    opt = optim.Adam([p], lr=0.1, weight_decay=0.5)     # L2: the gradient gets 0.5 * p
    _step_with_grad(opt, p, [1.0])
    np.testing.assert_allclose(p.detach().numpy(), [1.0 - 0.1 * 1.5 / (1.5 + 1e-8)])

    p = _param([0.0])
    opt = optim.Adam([p], lr=0.1, amsgrad=True, betas=(0.9, 0.5))
    _step_with_grad(opt, p, [2.0])
    _step_with_grad(opt, p, [0.0])
    st = opt.state[p]
    np.testing.assert_allclose(st["exp_avg_sq"].numpy(), [0.5 * 0.5 * 4.0])
    np.testing.assert_allclose(st["max_exp_avg_sq"].numpy(), [0.5 * 4.0])   # kept the max
    m = 0.9 * 0.2
    v_hat = 2.0 / (1 - 0.25)
    expected = -0.1 - 0.1 / (1 - 0.81) * m / (math.sqrt(v_hat) + 1e-8)
    np.testing.assert_allclose(p.detach().numpy(), [expected])


def test_rmsprop_and_adagrad_first_steps_by_hand():
    p = _param([1.0])
    opt = optim.RMSprop([p], lr=0.01, alpha=0.9)
    _step_with_grad(opt, p, [2.0])
    np.testing.assert_allclose(p.detach().numpy(), [1.0 - 0.01 * 2.0 / (math.sqrt(0.4) + 1e-8)])

    p = _param([1.0])
    opt = optim.RMSprop([p], lr=0.01, alpha=0.9, centered=True, momentum=0.5)
    _step_with_grad(opt, p, [2.0])
    avg = math.sqrt(0.1 * 4 - 0.2 ** 2) + 1e-8
    np.testing.assert_allclose(p.detach().numpy(), [1.0 - 0.01 * 2.0 / avg])

    p = _param([1.0])
    opt = optim.Adagrad([p], lr=0.1, initial_accumulator_value=1.0, lr_decay=0.5)
    _step_with_grad(opt, p, [2.0])
    _step_with_grad(opt, p, [2.0])
    first = 1.0 - 0.1 * 2.0 / (math.sqrt(5.0) + 1e-10)
    np.testing.assert_allclose(p.detach().numpy(),
                               [first - 0.1 / 1.5 * 2.0 / (math.sqrt(9.0) + 1e-10)])


@pytest.mark.parametrize("line_search", [None, "strong_wolfe"])
def test_lbfgs_minimises_the_rosenbrock_function(line_search):
    p = _param([-1.5, 2.0])
    opt = optim.LBFGS([p], lr=1 if line_search else 0.2, max_iter=50,
                      line_search_fn=line_search, history_size=10)

    def closure():
        opt.zero_grad()
        x, y = p[0], p[1]
        loss = (1 - x) ** 2 + 100 * (y - x ** 2) ** 2
        loss.backward()
        return loss

    for _ in range(40 if line_search else 200):
        opt.step(closure)
    np.testing.assert_allclose(p.detach().numpy(), [1.0, 1.0], atol=1e-3)


def test_zero_grad_param_groups_and_add_param_group():
    a, b = _param([1.0]), _param([1.0])
    opt = optim.SGD([{"params": [a]}, {"params": [b], "lr": 1.0}], lr=0.1)
    a.grad, b.grad = tg.tensor([1.0]), tg.tensor([1.0])
    opt.step()
    np.testing.assert_allclose([float(a), float(b)], [0.9, 0.0])
    assert opt.param_groups[0]["lr"] == 0.1 and opt.param_groups[1]["momentum"] == 0
    opt.zero_grad(set_to_none=False)
    assert a.grad is not None and float(a.grad) == 0.0
    opt.zero_grad()
    assert a.grad is None and b.grad is None
    c = _param([3.0])
    opt.add_param_group({"params": c, "lr": 0.5})
    assert opt.param_groups[2]["params"] == [c] and opt.param_groups[2]["dampening"] == 0
    with pytest.raises(ValueError, match="more than one parameter group"):
        opt.add_param_group({"params": [a]})
    with pytest.raises(ValueError, match="empty parameter list"):
        optim.SGD([], lr=0.1)
    with pytest.raises(ValueError, match="Invalid learning rate"):
        optim.Adam([c], lr=-1.0)
    with pytest.raises(TypeError, match="iterable of Tensors"):
        optim.SGD(c, lr=0.1)
    with pytest.raises(ValueError, match="Nesterov"):
        optim.SGD([c], lr=0.1, nesterov=True)


def test_a_state_dict_round_trip_continues_the_same_trajectory():
    def run(steps, opt_state=None, params=None):
        p = _param(params if params is not None else [1.0, -1.0])
        opt = optim.Adam([p], lr=0.05, amsgrad=True)
        if opt_state is not None:
            opt.load_state_dict(opt_state)
        for _ in range(steps):
            opt.zero_grad()
            ((p - tg.tensor([0.3, 0.7])) ** 2).sum().backward()
            opt.step()
        return p, opt

    p_full, _ = run(6)
    p_half, opt_half = run(3)
    sd = opt_half.state_dict()
    assert sorted(sd) == ["param_groups", "state"] and sd["param_groups"][0]["params"] == [0]
    assert sorted(sd["state"][0]) == ["exp_avg", "exp_avg_sq", "max_exp_avg_sq", "step"]
    p_resumed, _ = run(3, sd, p_half.detach().numpy().copy())
    np.testing.assert_allclose(p_resumed.detach().numpy(), p_full.detach().numpy(), rtol=1e-12)


def test_step_with_a_closure_returns_its_loss_and_hooks_run():
    p = _param([2.0])
    opt = optim.SGD([p], lr=0.25)
    calls = []
    h1 = opt.register_step_pre_hook(lambda o, a, k: calls.append("pre"))
    opt.register_step_post_hook(lambda o, a, k: calls.append("post"))

    def closure():
        opt.zero_grad()
        loss = (p ** 2).sum()
        loss.backward()
        return loss

    loss = opt.step(closure)
    assert float(loss) == 4.0 and float(p) == 1.0 and calls == ["pre", "post"]
    h1.remove()
    opt.step(closure)
    assert calls == ["pre", "post", "post"]


def test_an_optimizer_trains_a_module():
    tg.manual_seed(0)
    model = tg.nn.Sequential(tg.nn.Linear(2, 16), tg.nn.Tanh(), tg.nn.Linear(16, 1))
    x = tg.tensor(np.random.default_rng(0).uniform(-1, 1, (64, 2)))
    y = (x[:, :1] * x[:, 1:]).detach()
    opt = optim.Adam(model.parameters(), lr=0.02)
    first = None
    for _ in range(200):
        opt.zero_grad()
        loss = tg.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        first = first if first is not None else float(loss)
    assert float(loss) < first / 10


def _lrs(make, steps=10, lr=1.0):
    p = _param([0.0])
    opt = optim.SGD([p], lr=lr)
    sched = make(opt)
    out = [opt.param_groups[0]["lr"]]
    for _ in range(steps):
        opt.step()
        sched.step()
        out.append(sched.get_last_lr()[0])
    return out


def test_schedulers_by_hand():
    lr_sched = optim.lr_scheduler
    np.testing.assert_allclose(_lrs(lambda o: lr_sched.StepLR(o, 3, 0.5), 7),
                               [1, 1, 1, .5, .5, .5, .25, .25])
    np.testing.assert_allclose(_lrs(lambda o: lr_sched.MultiStepLR(o, [2, 4, 4], 0.1), 5),
                               [1, 1, .1, .1, .001, .001])
    np.testing.assert_allclose(_lrs(lambda o: lr_sched.ExponentialLR(o, 0.9), 4),
                               [0.9 ** k for k in range(5)])
    np.testing.assert_allclose(_lrs(lambda o: lr_sched.LambdaLR(o, lambda e: 1 / (e + 1)), 4),
                               [1 / (k + 1) for k in range(5)])
    cos = _lrs(lambda o: lr_sched.CosineAnnealingLR(o, T_max=5, eta_min=0.1), 5)
    np.testing.assert_allclose(cos, [0.1 + 0.9 * (1 + math.cos(math.pi * k / 5)) / 2
                                     for k in range(6)], rtol=1e-12)
    np.testing.assert_allclose(_lrs(lambda o: lr_sched.LinearLR(o, 0.5, 1.0, 2), 3),
                               [0.5, 0.75, 1.0, 1.0])


def test_reduce_lr_on_plateau():
    p = _param([0.0])
    opt = optim.SGD([p], lr=1.0)
    sched = optim.lr_scheduler.ReduceLROnPlateau(opt, patience=2, factor=0.5, min_lr=0.2)
    lrs = []
    for metric in [5, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4]:
        sched.step(metric)
        lrs.append(opt.param_groups[0]["lr"])
    # 3 epochs without improvement (more than patience=2) halve the lr, down to min_lr
    assert lrs == [1, 1, 1, 1, 0.5, 0.5, 0.5, 0.25, 0.25, 0.25, 0.2, 0.2, 0.2, 0.2]
    assert sched.get_last_lr() == [0.2]
    with pytest.raises(ValueError, match="Factor should be < 1.0"):
        optim.lr_scheduler.ReduceLROnPlateau(opt, factor=1.0)
