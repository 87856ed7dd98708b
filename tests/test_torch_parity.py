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


# --- issue 16: torch.nn.functional, forward_ad, grad_fn, torch.func, side by side --------

def _probs(rng, shape):
    return rng.uniform(0.05, 0.95, shape)


def _nnf_cases():
    """(id, F name, inputs, kwargs, number of leading inputs differentiated)."""
    r = _rng(16)
    x34, y34 = r.standard_normal((3, 4)), r.standard_normal((3, 4))
    w34, w4 = r.uniform(0.5, 2, (3, 4)), r.uniform(0.5, 2, 4)
    idx, idx_ign = np.array([0, 3, 1]), np.array([2, -100, 1])
    x235, idx25 = r.standard_normal((2, 3, 5)), np.array([[0, 2, 1, 2, 0], [1, 1, 0, 2, 2]])
    soft = np.exp(x34) / np.exp(x34).sum(1, keepdims=True)
    c = []
    for red in ("mean", "sum", "none"):
        c += [(f"bce_logits_{red}", "binary_cross_entropy_with_logits",
               [3 * x34, _probs(r, (3, 4))], {"reduction": red}, 2),
              (f"bce_{red}", "binary_cross_entropy", [_probs(r, (3, 4)), _probs(r, (3, 4))],
               {"reduction": red}, 1),
              (f"ce_{red}", "cross_entropy", [x34, idx], {"reduction": red}, 1),
              (f"ce_smooth_{red}", "cross_entropy", [x34, idx_ign],
               {"reduction": red, "weight": w4, "ignore_index": -100, "label_smoothing": 0.2}, 1),
              (f"ce_probs_{red}", "cross_entropy", [x34, soft],
               {"reduction": red, "label_smoothing": 0.1}, 2),
              (f"nll_{red}", "nll_loss", [x34, idx_ign], {"reduction": red, "weight": w4}, 1),
              (f"mse_{red}", "mse_loss", [x34, y34], {"reduction": red}, 2),
              (f"l1_{red}", "l1_loss", [x34, y34], {"reduction": red}, 2),
              (f"smooth_l1_{red}", "smooth_l1_loss", [x34, y34], {"reduction": red, "beta": 0.7},
               2)]
    c += [("bce_logits_weights", "binary_cross_entropy_with_logits", [3 * x34, _probs(r, (3, 4))],
           {"weight": w34, "pos_weight": w4}, 2),
          ("bce_weight", "binary_cross_entropy", [_probs(r, (3, 4)), _probs(r, (3, 4))],
           {"weight": w34}, 1),
          ("ce_nd", "cross_entropy", [x235, idx25], {"ignore_index": 1}, 1),
          ("nll_nd", "nll_loss", [x235, idx25], {"reduction": "sum"}, 1),
          ("ce_unbatched", "cross_entropy", [r.standard_normal(4), np.array(2)], {}, 1),
          ("softmax", "softmax", [x235], {"dim": 1}, 1),
          ("softmax_last", "softmax", [x235], {"dim": -1}, 1),
          ("log_softmax", "log_softmax", [x235], {"dim": 0}, 1),
          ("relu", "relu", [x34], {}, 1),
          ("gelu", "gelu", [x34], {}, 1),
          ("gelu_tanh", "gelu", [x34], {"approximate": "tanh"}, 1),
          ("silu", "silu", [x34], {}, 1),
          ("tanh", "tanh", [x34], {}, 1),
          ("sigmoid", "sigmoid", [x34], {}, 1),
          ("softplus", "softplus", [x34], {}, 1),
          ("softplus_beta", "softplus", [4 * x34], {"beta": 2.0, "threshold": 3.0}, 1),
          ("linear", "linear", [x235.transpose(0, 2, 1), r.standard_normal((4, 3)),
                                r.standard_normal(4)], {}, 3),
          ("linear_nobias", "linear", [x34, r.standard_normal((2, 4))], {}, 2),
          ("dropout_eval", "dropout", [x34], {"p": 0.5, "training": False}, 1),
          ("dropout_p0", "dropout", [x34], {"p": 0.0}, 1),
          ("dropout_p1", "dropout", [x34], {"p": 1.0}, 1),
          ("normalize", "normalize", [x34], {}, 1),
          ("normalize_p3_dim0", "normalize", [x34], {"p": 3.0, "dim": 0}, 1),
          ("pad_constant", "pad", [x235, (1, 2, 0, 1)], {"value": 0.5}, 1),
          ("pad_reflect", "pad", [x235, (2, 1)], {"mode": "reflect"}, 1),
          ("pad_replicate", "pad", [x235, (1, 2, 2, 0)], {"mode": "replicate"}, 1),
          ("pad_circular", "pad", [x235, (2, 1)], {"mode": "circular"}, 1)]
    return c


NNF = {c[0]: c for c in _nnf_cases()}


def _nnf_run(L, cid, order):
    """Value, first derivatives (with a random cotangent) and, for order 2, the
    derivatives of the first ones' weighted sum, all float64."""
    _, name, inputs, kwargs, ndiff = NNF[cid]
    args = [L.tensor(a, dtype=L.float64 if a.dtype.kind == "f" else None,
                     requires_grad=i < ndiff) if isinstance(a, np.ndarray) else a
            for i, a in enumerate(inputs)]
    kw = {k: L.tensor(v, dtype=L.float64) if isinstance(v, np.ndarray) else v
          for k, v in kwargs.items()}
    out = getattr(L.nn.functional, name)(*args, **kw)
    r = _rng(len(cid))
    ct = L.tensor(r.standard_normal(tuple(out.shape)), dtype=L.float64)
    grads = L.autograd.grad((out * ct).sum(), args[:ndiff], create_graph=order == 2,
                            allow_unused=True)
    res = [_arr(out)] + [None if g is None else _arr(g) for g in grads]
    if order == 2:
        vs = [L.tensor(r.standard_normal(tuple(a.shape)), dtype=L.float64) for a in args[:ndiff]]
        total = sum((g * v).sum() for g, v in zip(grads, vs) if g is not None and g.requires_grad)
        if isinstance(total, int):   # every first derivative is constant
            return res + [None] * ndiff
        second = L.autograd.grad(total, args[:ndiff], allow_unused=True)
        res += [None if g is None else _arr(g) for g in second]
    return res


def _arr(t):
    """A Tensor's values (torch's zero tensors, its symbolic zero gradients, included)."""
    return t.detach().numpy(force=True) if isinstance(t, torch.Tensor) else t.detach().numpy()


@pytest.mark.parametrize("order", [1, 2])
@pytest.mark.parametrize("cid", sorted(NNF))
def test_nn_functional_matches_torch(cid, order):
    got, want = _nnf_run(tg, cid, order), _nnf_run(torch, cid, order)
    assert got[0].shape == want[0].shape and got[0].dtype == want[0].dtype
    for a, b in zip(got, want):
        if a is None or b is None:   # no dependence on one side: zeros on the other
            assert not np.any(a if b is None else b)
            continue
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)


def test_nn_functional_signatures_match_torch():
    import inspect
    for name in ("binary_cross_entropy_with_logits", "binary_cross_entropy", "cross_entropy",
                 "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "softmax",
                 "log_softmax", "relu", "leaky_relu", "elu", "silu", "tanh", "sigmoid",
                 "dropout", "normalize", "pad"):
        want = [(p.name, p.default) for p in
                inspect.signature(getattr(torch.nn.functional, name)).parameters.values()]
        got = [(p.name, p.default) for p in
               inspect.signature(getattr(tg.nn.functional, name)).parameters.values()]
        assert got == want, name


def test_dropout_and_one_hot_match_torch():
    x = _rng(3).standard_normal((200, 5)) + 3.0
    for L in (tg, torch):
        t = L.tensor(x, dtype=L.float64, requires_grad=True)
        out = L.nn.functional.dropout(t, p=0.25)
        kept = out.detach().numpy() != 0
        # the kept entries are scaled by 1 / (1 - p); the gradient is the mask, scaled
        np.testing.assert_allclose(out.detach().numpy()[kept], x[kept] / 0.75, rtol=1e-12)
        assert 0.6 < kept.mean() < 0.9
        out.sum().backward()
        np.testing.assert_allclose(t.grad.numpy(), kept / 0.75, rtol=1e-12)
    idx = np.array([[0, 3], [2, 1]])
    for kw in ({}, {"num_classes": 6}):
        a = tg.nn.functional.one_hot(tg.tensor(idx), **kw)
        b = torch.nn.functional.one_hot(torch.tensor(idx), **kw)
        assert str(a.dtype) == str(b.dtype).replace("torch.", "")
        np.testing.assert_array_equal(a.numpy(), b.numpy())


_FW_CASES = ["bce_logits_mean", "bce_mean", "ce_smooth_sum", "ce_probs_none", "nll_mean",
             "mse_none", "smooth_l1_mean", "softmax", "log_softmax", "gelu", "gelu_tanh",
             "silu", "softplus_beta", "linear", "normalize", "pad_reflect", "pad_circular"]


@pytest.mark.parametrize("cid", _FW_CASES)
def test_nn_functional_forward_ad_matches_torch(cid):
    _, name, inputs, kwargs, _ = NNF[cid]
    tangent = _rng(9).standard_normal(inputs[0].shape)

    def run(L):
        fw = L.autograd.forward_ad
        kw = {k: L.tensor(v, dtype=L.float64) if isinstance(v, np.ndarray) else v
              for k, v in kwargs.items()}
        rest = [L.tensor(a) if isinstance(a, np.ndarray) else a for a in inputs[1:]]
        with fw.dual_level():
            x = fw.make_dual(L.tensor(inputs[0], dtype=L.float64),
                             L.tensor(tangent, dtype=L.float64))
            primal, tan = fw.unpack_dual(getattr(L.nn.functional, name)(x, *rest, **kw))
            return primal.numpy(), tan.numpy()

    for a, b in zip(run(tg), run(torch)):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)


def test_forward_ad_tutorial_matches_torch():
    """The steps of torch's forward-mode AD tutorial, on both."""
    r = _rng(11)
    primal, tangent, plain = (r.standard_normal((4, 4)) for _ in range(3))
    results = []
    for L in (tg, torch):
        fw = L.autograd.forward_ad
        p, t = L.tensor(primal), L.tensor(tangent)
        with fw.dual_level() as level:
            assert level == 0
            dual = fw.make_dual(p, t)
            unpacked = fw.unpack_dual(dual)
            assert type(unpacked).__name__ == "UnpackedDualTensor"
            assert unpacked._fields == ("primal", "tangent")
            assert unpacked.tangent is t and unpacked.primal is not p
            assert fw.unpack_dual(fw.make_dual(p, t.T)).tangent is not t
            out = dual ** 2 + L.tensor(plain) ** 2
            jvp = fw.unpack_dual(out).tangent
            assert fw.unpack_dual(p).tangent is None
        assert fw.unpack_dual(out).tangent is None
        results.append(jvp.detach().numpy())

        class Fn(L.autograd.Function):   # state kept on ctx, and freed by jvp
            @staticmethod
            def forward(ctx, foo):
                result = L.exp(foo)
                ctx.result = result
                return result

            @staticmethod
            def jvp(ctx, gI):
                gO = gI * ctx.result
                del ctx.result
                return gO

        x = L.tensor(primal, requires_grad=True)
        with fw.dual_level():
            results.append(fw.unpack_dual(Fn.apply(fw.make_dual(x, L.tensor(tangent))))
                           .tangent.detach().numpy())
        assert L.autograd.gradcheck(Fn.apply, (x,), check_forward_ad=True,
                                    check_backward_ad=False, check_undefined_grad=False,
                                    check_batched_grad=False)

        class NoJvp(L.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x * 2

            @staticmethod
            def backward(ctx, g):
                return g * 2

        with fw.dual_level():
            with pytest.raises(NotImplementedError, match="(?i)you must implement the jvp"):
                NoJvp.apply(fw.make_dual(L.tensor(primal), L.tensor(tangent)))
            with pytest.raises(RuntimeError, match="Nested forward mode AD is not supported"):
                fw.enter_dual_level()
            with pytest.raises(RuntimeError, match="different size"):
                fw.make_dual(L.zeros(3), L.zeros(2))
            with pytest.raises(ValueError, match="Expected primal to be floating point"):
                fw.make_dual(L.tensor([1, 2]), L.tensor([1.0, 2.0]))
            d = fw.make_dual(L.tensor(primal), L.tensor(tangent))
            with pytest.raises(RuntimeError, match="already has a forward gradient"):
                fw.make_dual(d, L.tensor(tangent))
        with pytest.raises(RuntimeError, match="no level exists"):
            fw.make_dual(L.tensor(primal), L.tensor(tangent))
    np.testing.assert_allclose(results[0], results[2], rtol=1e-12)
    np.testing.assert_allclose(results[1], results[3], rtol=1e-12)
    np.testing.assert_allclose(results[0], 2 * primal * tangent, rtol=1e-12)


def _walk(fn):
    """Every node under ``fn`` as (name, its _saved_* names, the nodes its
    next_functions lead to).  Edges to nothing are left out: tracegrad keeps a
    (None, 0) edge for a Python number operand (x ** 2) where torch has none."""
    order, index = [], {}

    def visit(n):
        if n is None or n in index:
            return
        index[n] = len(order)
        order.append(n)
        for m, _ in n.next_functions:
            visit(m)

    visit(fn)
    return [(n.name(), sorted(a for a in dir(n) if a.startswith("_saved_")),
             [index[m] for m, _ in n.next_functions if m is not None]) for n in order]


def test_grad_fn_graphs_match_torch():
    """Every node of a few tutorial graphs: its name, its _saved_* names and where
    its next_functions lead; and the leaves behind the AccumulateGrad nodes."""
    r = _rng(12)
    xv, wv, bv = r.standard_normal((4, 5)), r.standard_normal((5, 3)), r.standard_normal(3)
    programs = [
        lambda L, x, w, b: ((x @ w + b).tanh() ** 2).sum(),
        lambda L, x, w, b: (x.exp() * x.sin()).sum() / (x * x).sum(),
        lambda L, x, w, b: (w.transpose(0, 1) @ x[0]).sigmoid().log().sum(),
        lambda L, x, w, b: (w[1] * b - b.view(3, 1)).abs().sum(dim=1, keepdim=True),
        lambda L, x, w, b: (x.transpose(0, 1).expand(2, 5, 4).clone() / 2
                            - x.transpose(0, 1).cos()).relu().sum(),
        # the loss itself is a composition of ops in tracegrad: the same leaves only
        lambda L, x, w, b: L.nn.functional.binary_cross_entropy_with_logits(
            L.matmul(x, w) + b, L.zeros(4, 3, dtype=L.float64)),
    ]
    for i, f in enumerate(programs):
        graphs = []
        for L in (tg, torch):
            x, w, b = (L.tensor(v, requires_grad=True) for v in (xv, wv, bv))
            out = f(L, x, w, b)
            acc = [n for n in _iter_nodes(out.grad_fn)
                   if n.name() == "torch::autograd::AccumulateGrad"]
            leaves = sorted(k for k, v in enumerate((x, w, b)) for n in acc if n.variable is v)
            graphs.append((leaves, _walk(out.grad_fn)))
            assert acc and all(repr(n).startswith("<AccumulateGrad object at") for n in acc)
        assert graphs[0][0] == graphs[1][0], i
        if i < len(programs) - 1:
            assert graphs[0][1] == graphs[1][1], i


def _iter_nodes(fn):
    seen, stack = set(), [fn]
    while stack:
        n = stack.pop()
        if n is None or n in seen:
            continue
        seen.add(n)
        yield n
        stack.extend(m for m, _ in n.next_functions)


def test_saved_tensor_hooks_on_nodes_match_torch():
    xv = _rng(13).uniform(0.5, 1.5, 4)
    logs = []
    for L in (tg, torch):
        log = []
        x = L.tensor(xv, requires_grad=True)
        y = x.pow(2)
        assert y.grad_fn._saved_self is x
        e = x.exp()
        assert e.grad_fn._saved_result is not e
        np.testing.assert_allclose(e.grad_fn._saved_result.detach().numpy(), np.exp(xv))
        y.grad_fn._raw_saved_self.register_hooks(lambda t: (log.append("pack"), t * 2)[1],
                                                 lambda t: (log.append("unpack"), t)[1])
        (y.sum() + e.sum()).backward()
        logs.append((log, x.grad.numpy()))
        with pytest.raises(RuntimeError, match="after they have already been freed"):
            y.grad_fn._saved_self
    assert logs[0][0] == logs[1][0] == ["pack", "unpack"]
    np.testing.assert_allclose(logs[0][1], logs[1][1], rtol=1e-12)


def test_node_hooks_match_torch():
    xv = _rng(14).standard_normal(3)
    results = []
    for L in (tg, torch):
        seen = []
        x = L.tensor(xv, requires_grad=True)
        s = x.sin()
        s.grad_fn.register_prehook(lambda go: (go[0] * 3,))
        s.grad_fn.register_hook(lambda gi, go: seen.append((len(gi), len(go))))
        m = s.grad_fn.metadata
        m["tag"] = "sin"
        (s * 2).sum().backward()
        results.append((seen, s.grad_fn.metadata, x.grad.numpy()))
    assert results[0][:2] == results[1][:2]
    np.testing.assert_allclose(results[0][2], results[1][2], rtol=1e-12)


def test_functional_call_matches_torch_on_a_module():
    """tracegrad's functional_call on a function of a dict against torch's on an
    nn.Module holding the same parameters."""
    r = _rng(15)
    wv, bv, xv = r.standard_normal((3, 2)), r.standard_normal(2), r.standard_normal((5, 3))

    def model(params, x):
        return (x @ params["w"] + params["b"]).tanh()

    class Module(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(3, 2, dtype=torch.float64))
            self.b = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))

        def forward(self, x):
            return model({"w": self.w, "b": self.b}, x)

    mod = Module()
    for L, call in ((tg, lambda p, x: tg.func.functional_call(model, p, (x,))),
                    (torch, lambda p, x: torch.func.functional_call(mod, p, (x,)))):
        p = {"w": L.tensor(wv), "b": L.tensor(bv)}
        x = L.tensor(xv)
        out = call(p, x)
        g = L.func.grad(lambda p, x: (call(p, x) ** 2).sum())(p, x)
        h = L.func.jacrev(lambda b: call({"w": p["w"], "b": b}, x).sum(0))(p["b"])
        (jvp_out, jvp_t) = L.func.jvp(lambda b: call({"w": p["w"], "b": b}, x), (p["b"],),
                                      (L.ones(2, dtype=L.float64),))
        if L is tg:
            ours = (out, g, h, jvp_t)
        else:
            theirs = (out, g, h, jvp_t)
    for a, b in zip(ours, theirs):
        if isinstance(b, dict):
            assert set(a) == set(b)
            for k in b:
                np.testing.assert_allclose(a[k].numpy(), b[k].detach().numpy(), rtol=1e-10)
        else:
            np.testing.assert_allclose(a.numpy(), b.detach().numpy(), rtol=1e-10)


def test_device_and_default_dtype_queries_match_torch():
    assert tg.cuda.is_available() == torch.cuda.is_available() or tg.cuda.is_available()
    assert callable(tg.accelerator.current_accelerator)
    before, tg_before = torch.get_default_dtype(), tg.get_default_dtype()
    try:
        for name in ("float32", "float64"):
            torch.set_default_dtype(getattr(torch, name))
            tg.set_default_dtype(getattr(tg, name))
            assert str(tg.get_default_dtype()) == str(torch.get_default_dtype())[6:] == name
            assert str(tg.randn(2).dtype) == name == str(torch.randn(2).dtype)[6:]
        torch.set_default_device("cpu")
        tg.set_default_device("cpu")
        assert tg.get_default_device().type == torch.get_default_device().type == "cpu"
    finally:
        torch.set_default_dtype(before)
        tg.set_default_dtype(tg_before)
        torch.set_default_device(None)
        tg.set_default_device(None)


_PROMOTION_CASES = [
    # (what, build(m) with m the torch-like module), a 0-d tensor beside dimensioned ones
    ("f32[3] * f64[]", lambda m: m.ones(3, dtype=m.float32) * m.tensor(2.0, dtype=m.float64)),
    ("i32[3] + i64[]", lambda m: m.ones(3, dtype=m.int32) + m.tensor(2)),
    ("f32[3] + i64[]", lambda m: m.ones(3, dtype=m.float32) + m.tensor(2)),
    ("i32[3] * f64[]", lambda m: m.ones(3, dtype=m.int32) * m.tensor(2.0, dtype=m.float64)),
    ("f64[3] - f32[]", lambda m: m.ones(3, dtype=m.float64) - m.tensor(2.0, dtype=m.float32)),
    ("f32[] * f64[]", lambda m: m.tensor(1.0, dtype=m.float32) * m.tensor(2.0, dtype=m.float64)),
    ("f32[3] ** f64[]", lambda m: m.ones(3, dtype=m.float32) ** m.tensor(2.0, dtype=m.float64)),
    ("maximum", lambda m: m.maximum(m.ones(3, dtype=m.float32), m.tensor(0.5, dtype=m.float64))),
    ("where", lambda m: m.where(m.tensor(True), m.ones(3, dtype=m.float32),
                                m.tensor(0.0, dtype=m.float64))),
    ("b[3] + f64[]", lambda m: m.ones(3, dtype=m.bool) + m.tensor(2.0, dtype=m.float64)),
]


@pytest.mark.parametrize("what, build", _PROMOTION_CASES, ids=[c[0] for c in _PROMOTION_CASES])
def test_zero_dim_tensors_promote_as_in_torch(what, build):
    want = build(torch)
    got = build(tg)
    assert str(got.dtype).replace("torch.", "") == str(want.dtype).replace("torch.", "")
    np.testing.assert_allclose(got.numpy(), want.numpy())


def test_zero_dim_promotion_in_compiled_code_and_gradients():
    def f(x, s):
        return (x * s + s).sum()
    x32 = np.linspace(0.1, 1.0, 4).astype(np.float32)
    xt, st = torch.tensor(x32, requires_grad=True), torch.tensor(0.3, dtype=torch.float64,
                                                                 requires_grad=True)
    yt = f(xt, st)
    yt.backward()
    x, s = tg.tensor(x32), tg.tensor(0.3, dtype=tg.float64)
    y = tg.compile(f)(x, s)
    gx, gs = tg.grad(f, argnums=(0, 1))(x, s)
    assert str(y.dtype) == "float32" and str(yt.dtype) == "torch.float32"
    np.testing.assert_allclose(y.numpy(), yt.detach().numpy(), rtol=1e-6)
    assert gx.dtype == np.float32 and gs.dtype == np.float64
    np.testing.assert_allclose(np.asarray(gx), xt.grad.numpy(), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(gs), st.grad.numpy(), rtol=1e-6)
