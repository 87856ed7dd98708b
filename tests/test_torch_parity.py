"""Side by side with torch (skipped when torch is not importable; it is
never a tracegrad dependency): the same torch-style code on tracegrad and
on torch gives the same values and gradients, first and second order, and
the replayed steps of a loop agree with torch too."""
from __future__ import annotations

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.autograd import replay

torch = pytest.importorskip("torch")


def _rng(seed=0):
    return np.random.default_rng(seed)


# name -> (function of (lib, *tensors), input arrays)
_SPD = _rng(5).standard_normal((3, 3))
CASES = {
    "chain": (lambda L, x, y: (L.tanh(x) * L.exp(-y ** 2) + L.log1p(x ** 2) * L.sin(y)).sum(),
              [(4, 3), (4, 3)]),
    "broadcast": (lambda L, x, b: ((x + b) * (x - b) / (b * b + 1.0)).mean(), [(4, 3), (3,)]),
    "reductions": (lambda L, x: x.sum(dim=1, keepdim=True).exp().sum() + x.max() + x.var()
                   + x.std(dim=0).sum() + L.logsumexp(x, dim=1).sum(), [(4, 3)]),
    "softmax": (lambda L, x: (x.softmax(dim=-1) * x).sum() + x.log_softmax(dim=1)[:, 0].sum(),
                [(4, 5)]),
    "mlp": (lambda L, X, W1, b1, W2: (L.tanh(X @ W1 + b1) @ W2).pow(2).mean(),
            [(8, 5), (5, 6), (6,), (6, 2)]),
    "indexing": (lambda L, x: (x[1:].flip(1) ** 2).sum() + x[[0, 2, 0]].sum() + x[:, 1].prod(),
                 [(4, 3)]),
    "cat_stack": (lambda L, x, y: (L.cat([x, y], dim=0) ** 2).sum()
                  + L.stack([x, y]).sin().sum(), [(2, 3), (2, 3)]),
    "piecewise": (lambda L, x, y: (L.where(x > y, x * y, x - y) + x.clamp(min=-0.5, max=0.5)
                                   + L.maximum(x, y) + x.abs() + x.relu()).sum(),
                  [(5,), (5,)]),
    "cumsum": (lambda L, x: (x.cumsum(dim=0) * x.cumprod(dim=1)).sum(), [(3, 4)]),
    "linalg": (lambda L, A, b: L.linalg.det(A @ A.T + 3 * L.eye(3, dtype=A.dtype))
               + L.linalg.solve(A @ A.T + 3 * L.eye(3, dtype=A.dtype), b).sum()
               + L.linalg.inv(A + 4 * L.eye(3, dtype=A.dtype)).sum()
               + L.linalg.slogdet(A @ A.T + L.eye(3, dtype=A.dtype))[1], [(3, 3), (3,)]),
    "cholesky": (lambda L, A: L.linalg.cholesky(A @ A.T + 3 * L.eye(3, dtype=A.dtype)).sum(),
                 [(3, 3)]),
    "shapes": (lambda L, x: (x.reshape(2, 6).t() @ x.reshape(6, 2).T).sum()
               + x.unsqueeze(0).expand(2, 4, 3).sum() + x.permute(1, 0).flip(0)[0].sum(),
               [(4, 3)]),
}


def _run(L, fn, arrays, order):
    ts = [L.tensor(a, dtype=L.float64, requires_grad=True) for a in arrays]
    out = fn(L, *ts)
    grads = (L.autograd.grad(out, ts, create_graph=order == 2))
    if order == 2:  # the gradient of the sum of the first gradients (Hessian-vector style)
        total = sum((g * g).sum() for g in grads)
        grads = L.autograd.grad(total, ts, allow_unused=True)
    vals = [out.detach().numpy()] + [None if g is None else g.detach().numpy() for g in grads]
    return vals


@pytest.mark.parametrize("order", [1, 2])
@pytest.mark.parametrize("name", sorted(CASES))
def test_values_and_gradients_match_torch(name, order):
    fn, shapes = CASES[name]
    rng = _rng(hash(name) % 1000)
    arrays = [rng.uniform(-1, 1, s) for s in shapes]
    want = _run(torch, fn, arrays, order)
    got = _run(tg, fn, arrays, order)
    for a, b in zip(got, want):
        if b is None:
            assert a is None or not np.any(a)
            continue
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)


def test_a_replayed_training_loop_matches_torch():
    rng = _rng(7)
    X, Y = rng.standard_normal((16, 4)), rng.standard_normal((16, 2))
    init = [rng.standard_normal((4, 8)) * 0.5, np.zeros(8), rng.standard_normal((8, 2)) * 0.5]

    def train(L):
        ps = [L.tensor(p.copy(), dtype=L.float64, requires_grad=True) for p in init]
        Xt, Yt = L.tensor(X, dtype=L.float64), L.tensor(Y, dtype=L.float64)
        losses = []
        for _ in range(20):
            loss = ((L.tanh(Xt @ ps[0] + ps[1]) @ ps[2] - Yt) ** 2).mean()
            loss.backward()
            with L.no_grad():
                for p in ps:
                    p -= 0.1 * p.grad
                    p.grad = None
            losses.append(loss.item())
        return losses, [p.detach().numpy() for p in ps]

    replay.clear()
    got_losses, got_ps = train(tg)
    assert replay.stats["replays"] > 10
    want_losses, want_ps = train(torch)
    np.testing.assert_allclose(got_losses, want_losses, rtol=1e-10)
    for a, b in zip(got_ps, want_ps):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)


def test_hooks_and_retain_grad_match_torch():
    def run(L):
        x = L.tensor([1.0, -2.0, 3.0], dtype=L.float64, requires_grad=True)
        y = x * x
        y.retain_grad()
        y.register_hook(lambda g: g * 3)
        z = (y.sin() * 2).sum()
        z.backward()
        return x.grad.numpy(), y.grad.numpy()

    for a, b in zip(run(tg), run(torch)):
        np.testing.assert_allclose(a, b, rtol=1e-12)
