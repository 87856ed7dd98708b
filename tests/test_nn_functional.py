"""tracegrad.nn.functional: torch.nn.functional's meaning, as compositions of ops.

Values are checked against formulas written here in NumPy, first derivatives
against central finite differences in float64, second derivatives (of the
smooth functions) against finite differences of the first, compiled
gradients (tg.grad) against eager ones, dtypes (float32 in, float32 out),
reductions and argument errors.  The last section compares values,
gradients and dtypes with torch itself and skips without it.
"""
import math
import warnings

import numpy as np
import pytest

import tracegrad as tg
import tracegrad.nn.functional as F


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACEGRAD_CACHE_DIR", str(tmp_path / "cache"))


R = np.random.default_rng(1234)

# --- the mathematics, in NumPy ----------------------------------------------------------------

_erf = np.vectorize(math.erf)


def np_sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def np_log_softmax(x, axis):
    m = np.max(x, axis=axis, keepdims=True)
    return x - m - np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True))


def np_reduce(loss, reduction):
    return {"none": loss, "sum": np.sum(loss), "mean": np.mean(loss)}[reduction]


def np_nll(logp, target, weight=None, ignore_index=-100, reduction="mean"):
    """-w[t] logp[n, t, ...]; the class dim is 1 (0 for an unbatched input)."""
    cdim = 0 if logp.ndim == 1 else 1
    C = logp.shape[cdim]
    w = np.ones(C) if weight is None else weight
    lp = np.moveaxis(logp, cdim, -1)              # class dim last
    keep = target != ignore_index
    t = np.where(keep, target, 0)
    picked = np.take_along_axis(lp, t[..., None], axis=-1)[..., 0]
    wt = np.where(keep, w[t], 0.0)
    loss = -picked * wt
    if reduction == "mean":
        return loss.sum() / wt.sum()
    return np_reduce(loss, reduction)


def np_cross_entropy(x, target, weight=None, ignore_index=-100, reduction="mean",
                     label_smoothing=0.0):
    cdim = 0 if x.ndim == 1 else 1
    C = x.shape[cdim]
    logp = np_log_softmax(x, cdim)
    w = np.ones(C) if weight is None else weight
    wshape = (C,) + (1,) * (x.ndim - cdim - 1)
    if target.dtype.kind == "f":                     # class probabilities
        q = target * (1 - label_smoothing) + label_smoothing / C
        loss = -np.sum(logp * q * w.reshape(wshape), axis=cdim)
        if reduction == "mean":
            return loss.sum() / (x.size / C)
        return np_reduce(loss, reduction)
    nll = np_nll(logp, target, weight, ignore_index, reduction)
    if label_smoothing == 0:
        return nll
    keep = target != ignore_index
    smooth = np.where(keep, -np.sum(logp * w.reshape(wshape), axis=cdim), 0.0)
    if reduction == "mean":
        smooth = smooth.sum() / np.where(keep, w[np.where(keep, target, 0)], 0.0).sum()
    else:
        smooth = np_reduce(smooth, reduction)
    return (1 - label_smoothing) * nll + label_smoothing / C * smooth


def np_bce(p, y, weight=None, reduction="mean"):
    loss = -(y * np.maximum(np.log(p), -100) + (1 - y) * np.maximum(np.log(1 - p), -100))
    if weight is not None:
        loss = loss * weight
    return np_reduce(loss, reduction)


def np_bce_logits(x, y, weight=None, pos_weight=None, reduction="mean"):
    pw = 1.0 if pos_weight is None else pos_weight
    p = np_sigmoid(x)
    loss = -(pw * y * np.log(p) + (1 - y) * np.log(1 - p))
    if weight is not None:
        loss = loss * weight
    return np_reduce(loss, reduction)


def np_smooth_l1(x, y, beta=1.0, reduction="mean"):
    d = np.abs(x - y)
    loss = d if beta == 0 else np.where(d < beta, 0.5 * d ** 2 / beta, d - 0.5 * beta)
    return np_reduce(loss, reduction)


def np_huber(x, y, delta=1.0, reduction="mean"):
    d = np.abs(x - y)
    return np_reduce(np.where(d < delta, 0.5 * d ** 2, delta * (d - 0.5 * delta)), reduction)


def np_norm(x, p, dim):
    return np.sum(np.abs(x) ** p, axis=dim, keepdims=True) ** (1.0 / p)


def np_pad(x, pad, mode="constant", value=0.0):
    width = [(0, 0)] * x.ndim
    for i in range(len(pad) // 2):
        width[x.ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1])
    if mode == "constant":
        return np.pad(x, width, constant_values=value)
    return np.pad(x, width, mode={"reflect": "reflect", "replicate": "edge",
                                  "circular": "wrap"}[mode])


# --- the cases ---------------------------------------------------------------------------------
# (id, F name, positional inputs, kwargs, number of leading inputs differentiated,
#  NumPy reference, smooth: check second derivatives)

def x34():
    return R.standard_normal((3, 4))


def probs(shape):
    return R.uniform(0.05, 0.95, shape)


IDX3 = np.array([0, 3, 1])
IDX_IGN = np.array([2, -100, 1])
IDX_ND = np.array([[0, 2, 1, 2, 0], [1, 1, 0, 2, 2]])
W4 = np.array([0.5, 1.0, 2.0, 1.5])
W3 = np.array([0.3, 1.2, 2.0])
PROB_T = np.exp(np_log_softmax(R.standard_normal((3, 4)), 1))
RED = ("mean", "sum", "none")


def _cases():
    c = []
    # activations
    c.append(("relu", "relu", [x34()], {}, 1, lambda x: np.maximum(x, 0), False))
    c.append(("leaky_relu", "leaky_relu", [x34()], {"negative_slope": 0.2}, 1,
              lambda x: np.where(x > 0, x, 0.2 * x), False))
    c.append(("elu", "elu", [x34()], {"alpha": 1.3}, 1,
              lambda x: np.where(x > 0, x, 1.3 * (np.exp(x) - 1)), False))
    c.append(("gelu", "gelu", [x34()], {}, 1, lambda x: 0.5 * x * (1 + _erf(x / math.sqrt(2))),
              True))
    c.append(("gelu_tanh", "gelu", [x34()], {"approximate": "tanh"}, 1,
              lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))),
              True))
    c.append(("silu", "silu", [x34()], {}, 1, lambda x: x * np_sigmoid(x), True))
    c.append(("tanh", "tanh", [x34()], {}, 1, np.tanh, True))
    c.append(("sigmoid", "sigmoid", [x34()], {}, 1, np_sigmoid, True))
    c.append(("logsigmoid", "logsigmoid", [3 * x34()], {}, 1, lambda x: np.log(np_sigmoid(x)),
              True))
    c.append(("softplus", "softplus", [x34()], {}, 1, lambda x: np.log1p(np.exp(x)), True))
    xs = np.array([[-3.0, -0.4, 0.3, 2.6], [1.2, 4.1, -6.0, 0.7]])  # 2x = 5 is the switch
    c.append(("softplus_beta", "softplus", [xs], {"beta": 2.0, "threshold": 5.0}, 1,
              lambda x: np.where(2 * x > 5, x, np.log1p(np.exp(2 * x)) / 2), True))
    x3 = R.standard_normal((2, 3, 4))
    for d in (0, 1, -1):
        c.append((f"softmax_dim{d}", "softmax", [x3], {"dim": d}, 1,
                  lambda x, d=d: np.exp(np_log_softmax(x, d)), True))
        c.append((f"log_softmax_dim{d}", "log_softmax", [x3], {"dim": d}, 1,
                  lambda x, d=d: np_log_softmax(x, d), True))
    # regression losses
    for r in RED:
        c.append((f"mse_{r}", "mse_loss", [x34(), x34()], {"reduction": r}, 2,
                  lambda x, y, r=r: np_reduce((x - y) ** 2, r), True))
        c.append((f"l1_{r}", "l1_loss", [x34(), x34()], {"reduction": r}, 2,
                  lambda x, y, r=r: np_reduce(np.abs(x - y), r), False))
        c.append((f"smooth_l1_{r}", "smooth_l1_loss", [x34(), x34()],
                  {"reduction": r, "beta": 0.7}, 2,
                  lambda x, y, r=r: np_smooth_l1(x, y, 0.7, r), False))
        c.append((f"huber_{r}", "huber_loss", [x34(), x34()], {"reduction": r, "delta": 0.8}, 2,
                  lambda x, y, r=r: np_huber(x, y, 0.8, r), False))
    W34 = R.uniform(0.5, 2, (3, 4))
    c.append(("mse_weight", "mse_loss", [x34(), x34()], {"weight": W34}, 2,
              lambda x, y: np.sum(W34 * (x - y) ** 2) / W34.sum(), True))
    c.append(("l1_weight_sum", "l1_loss", [x34(), x34()], {"weight": W34, "reduction": "sum"}, 2,
              lambda x, y: np.sum(W34 * np.abs(x - y)), False))
    c.append(("huber_weight", "huber_loss", [x34(), x34()], {"weight": W34}, 2,
              lambda x, y: np.mean(W34 * np_huber(x, y, 1.0, "none")), False))
    c.append(("smooth_l1_beta0", "smooth_l1_loss", [x34(), x34()], {"beta": 0.0}, 2,
              lambda x, y: np.mean(np.abs(x - y)), False))
    # binary cross-entropy
    for r in RED:
        c.append((f"bce_{r}", "binary_cross_entropy", [probs((3, 4)), probs((3, 4))],
                  {"reduction": r}, 2, lambda p, y, r=r: np_bce(p, y, None, r), True))
        c.append((f"bce_logits_{r}", "binary_cross_entropy_with_logits",
                  [3 * x34(), probs((3, 4))], {"reduction": r}, 2,
                  lambda x, y, r=r: np_bce_logits(x, y, reduction=r), True))
    c.append(("bce_weight", "binary_cross_entropy", [probs((3, 4)), probs((3, 4))],
              {"weight": W4}, 2, lambda p, y: np_bce(p, y, W4), True))
    c.append(("bce_logits_weights", "binary_cross_entropy_with_logits",
              [3 * x34(), probs((3, 4))], {"weight": W34, "pos_weight": W4}, 2,
              lambda x, y: np_bce_logits(x, y, W34, W4), True))
    # classification losses
    for r in RED:
        c.append((f"ce_{r}", "cross_entropy", [x34(), IDX3], {"reduction": r}, 1,
                  lambda x, t, r=r: np_cross_entropy(x, t, reduction=r), True))
        c.append((f"ce_all_{r}", "cross_entropy", [x34(), IDX_IGN],
                  {"reduction": r, "weight": np.array([0.5, 1.0, 2.0, 1.5]), "ignore_index": -100,
                   "label_smoothing": 0.2}, 1,
                  lambda x, t, r=r: np_cross_entropy(x, t, W4, -100, r, 0.2), True))
        c.append((f"ce_nd_{r}", "cross_entropy", [R.standard_normal((2, 3, 5)), IDX_ND],
                  {"reduction": r, "weight": W3, "ignore_index": 1, "label_smoothing": 0.1}, 1,
                  lambda x, t, r=r: np_cross_entropy(x, t, W3, 1, r, 0.1), True))
        c.append((f"ce_probs_{r}", "cross_entropy", [x34(), PROB_T],
                  {"reduction": r, "weight": W4, "label_smoothing": 0.1}, 2,
                  lambda x, t, r=r: np_cross_entropy(x, t, W4, -100, r, 0.1), True))
        c.append((f"nll_{r}", "nll_loss", [x34(), IDX_IGN], {"reduction": r, "weight": W4}, 1,
                  lambda x, t, r=r: np_nll(x, t, W4, -100, r), True))
    pnd = np.exp(np_log_softmax(R.standard_normal((2, 3, 5)), 1))
    c.append(("ce_probs_nd", "cross_entropy", [R.standard_normal((2, 3, 5)), pnd],
              {"weight": W3}, 2, lambda x, t: np_cross_entropy(x, t, W3), True))
    c.append(("ce_unbatched", "cross_entropy", [R.standard_normal(4), np.array(2)], {}, 1,
              lambda x, t: np_cross_entropy(x, t), True))
    c.append(("nll_nd", "nll_loss", [R.standard_normal((2, 3, 5)), IDX_ND], {}, 1,
              lambda x, t: np_nll(x, t), True))
    # layers and helpers
    Wl, bl = R.standard_normal((5, 4)), R.standard_normal(5)
    c.append(("linear", "linear", [R.standard_normal((2, 3, 4)), Wl, bl], {}, 3,
              lambda x, w, b: x @ w.T + b, True))
    c.append(("linear_nobias", "linear", [x34(), Wl], {}, 2, lambda x, w: x @ w.T, True))
    for p, d in ((2.0, 1), (1.0, 0), (3.0, -1)):
        c.append((f"normalize_p{p:g}_dim{d}", "normalize", [x34()], {"p": p, "dim": d}, 1,
                  lambda x, p=p, d=d: x / np.maximum(np_norm(x, p, d), 1e-12), p != 1.0))
    c.append(("cosine_similarity", "cosine_similarity", [x34(), x34()], {}, 2,
              lambda u, v: np.sum(u * v, 1) / (np_norm(u, 2, 1) * np_norm(v, 2, 1))[:, 0], True))
    c.append(("cosine_similarity_dim0", "cosine_similarity", [x34(), R.standard_normal(4)],
              {"dim": 0}, 2,
              lambda u, v: np.sum(u * v, 0) / (np_norm(u, 2, 0)
                                                * np_norm(np.broadcast_to(v, u.shape), 2, 0))[0],
              True))
    xp = R.standard_normal((2, 3, 5))
    for mode, pad in (("constant", (1, 2)), ("constant", (2, 0, 1, 3, 0, 1)),
                      ("reflect", (2, 3)), ("replicate", (1, 2, 2, 0)), ("circular", (2, 1))):
        c.append((f"pad_{mode}_{len(pad)}", "pad", [xp, pad], {"mode": mode}, 1,
                  lambda x, pad, mode=mode: np_pad(x, pad, mode), False))
    c.append(("pad_value_crop", "pad", [xp, (-1, 2, 1, -1)], {"value": 2.5}, 1,
              lambda x, pad: np.pad(x[:, :2, 1:], ((0, 0), (1, 0), (0, 2)), constant_values=2.5),
              False))
    return c


CASES = _cases()
IDS = [c[0] for c in CASES]
CASE = {c[0]: c for c in CASES}


def _tg(v, dtype=None, requires_grad=False):
    if isinstance(v, np.ndarray):
        if dtype is not None and v.dtype.kind == "f":
            v = v.astype(dtype)
        return tg.tensor(v, requires_grad=requires_grad)
    return v


def _call(case, args, dtype=None):
    _, name, _, kwargs, _, _, _ = case
    kw = {k: _tg(v, dtype) for k, v in kwargs.items()}
    return getattr(F, name)(*args, **kw)


def _tensors(case, dtype=np.float64):
    _, _, inputs, _, ndiff, _, _ = case
    return [_tg(v, dtype, requires_grad=i < ndiff) for i, v in enumerate(inputs)]


def _scalar(case, arrays, weights):
    """sum(F(...) * weights) evaluated at these float64 arrays, without grad."""
    with tg.no_grad():
        out = _call(case, [_tg(a) for a in arrays])
    return float(np.sum(out.numpy() * weights))


def _fd(fun, arrays, i, eps=1e-6):
    x = arrays[i]
    g = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        plus = [a.copy() if j == i else a for j, a in enumerate(arrays)]
        minus = [a.copy() if j == i else a for j, a in enumerate(arrays)]
        plus[i][idx] += eps
        minus[i][idx] -= eps
        g[idx] = (fun(plus) - fun(minus)) / (2 * eps)
    return g


# --- values, first and second derivatives ---------------------------------------------------

@pytest.mark.parametrize("cid", IDS)
def test_values_match_numpy(cid):
    case = CASE[cid]
    out = _call(case, _tensors(case))
    want = case[5](*case[2])
    assert isinstance(out, tg.Tensor)
    assert out.shape == np.shape(want)
    np.testing.assert_allclose(out.detach().numpy(), want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("cid", IDS)
def test_first_derivatives_match_finite_differences(cid):
    case = CASE[cid]
    args = _tensors(case)
    out = _call(case, args)
    weights = R.standard_normal(out.shape)
    (out * tg.tensor(weights)).sum().backward()
    arrays = [a.copy() if isinstance(a, np.ndarray) else a for a in case[2]]
    for i in range(case[4]):
        fd = _fd(lambda arrs: _scalar(case, arrs, weights), arrays, i)
        np.testing.assert_allclose(args[i].grad.numpy(), fd, rtol=1e-5, atol=1e-6,
                                   err_msg=f"{cid}: input {i}")


@pytest.mark.parametrize("cid", [c[0] for c in CASES if c[6]])
def test_second_derivatives_match_finite_differences(cid):
    case = CASE[cid]
    arrays = [a.copy() if isinstance(a, np.ndarray) else a for a in case[2]]
    out_shape = case[5](*arrays).shape
    weights = R.standard_normal(out_shape)
    v = R.standard_normal(arrays[0].shape)

    def grad_dot_v(arrs, create_graph=False):
        args = [_tg(a, requires_grad=(i == 0)) for i, a in enumerate(arrs)]
        s = (_call(case, args) * tg.tensor(weights)).sum()
        (g,) = tg.autograd.grad(s, [args[0]], create_graph=create_graph)
        return (g * tg.tensor(v)).sum(), args

    gv, args = grad_dot_v(arrays, create_graph=True)
    fd = _fd(lambda arrs: float(grad_dot_v(arrs)[0].numpy()), arrays, 0, eps=1e-5)
    if not gv.requires_grad:  # linear in x: the gradient does not depend on x
        np.testing.assert_allclose(fd, 0.0, atol=1e-6)
        return
    (h,) = tg.autograd.grad(gv, [args[0]])
    np.testing.assert_allclose(h.numpy(), fd, rtol=1e-4, atol=1e-5)


def _compiled_case_ids():
    # one per function and kind of target: compiling is the slow part
    seen, ids = set(), []
    for c in CASES:
        key = (c[1], c[0] if c[1] == "pad" else None, "probs" in c[0], "nd" in c[0])
        if key not in seen:
            seen.add(key)
            ids.append(c[0])
    return ids


@pytest.mark.parametrize("cid", _compiled_case_ids())
def test_compiled_gradient_equals_eager(cid):
    case = CASE[cid]
    _, name, inputs, kwargs, ndiff, _, _ = case
    arrays = [a for a in inputs]
    weights = R.standard_normal(case[5](*inputs).shape)
    n = len([a for a in inputs if isinstance(a, np.ndarray)])

    def loss(*arrs):
        args = list(arrs) + list(inputs[n:])
        return np.sum(getattr(F, name)(*args, **kwargs) * weights)

    grads = tg.grad(loss, argnums=tuple(range(ndiff)))(*arrays[:n])
    args = _tensors(case)
    (_call(case, args) * tg.tensor(weights)).sum().backward()
    for i in range(ndiff):
        np.testing.assert_allclose(np.asarray(grads[i]), args[i].grad.numpy(), rtol=1e-10,
                                   atol=1e-12, err_msg=f"{cid}: input {i}")
    value = tg.compile(loss)(*arrays[:n])
    np.testing.assert_allclose(value, np.sum(case[5](*inputs) * weights), rtol=1e-10)


@pytest.mark.parametrize("cid", IDS)
def test_float32_in_float32_out(cid):
    case = CASE[cid]
    args = _tensors(case, np.float32)
    out = _call(case, args, np.float32)
    assert out.dtype == np.float32
    (out * 1.5).sum().backward()
    for i in range(case[4]):
        assert args[i].grad.dtype == np.float32
    np.testing.assert_allclose(out.detach().numpy(), case[5](*case[2]), rtol=2e-4, atol=2e-5)


# --- reductions, stability and special behaviour ------------------------------------------

def test_reachable_as_torch_nn_functional():
    import tracegrad.nn
    assert tg.nn.functional is F and tracegrad.nn.functional is F
    assert set(F.__all__) >= {"cross_entropy", "binary_cross_entropy_with_logits", "dropout",
                              "one_hot", "pad", "softmax", "linear", "gelu"}


def test_bad_reduction_and_legacy_arguments():
    x, y = tg.tensor(x34()), tg.tensor(x34())
    for fn in (F.mse_loss, F.l1_loss, F.smooth_l1_loss, F.huber_loss):
        with pytest.raises(ValueError, match="avg is not a valid value for reduction"):
            fn(x, y, reduction="avg")
    with pytest.raises(ValueError, match="not a valid value for reduction"):
        F.cross_entropy(x, tg.tensor(IDX3), reduction="mean ")
    with pytest.warns(UserWarning, match="reduction='sum'"):
        s = F.mse_loss(x, y, size_average=False)
    np.testing.assert_allclose(s.numpy(), np.sum((x.numpy() - y.numpy()) ** 2))
    with pytest.warns(UserWarning, match="reduction='none'"):
        assert F.nll_loss(x, tg.tensor(IDX3), reduce=False).shape == (3,)


def test_target_shape_errors():
    x = tg.tensor(x34())
    with pytest.raises(ValueError, match=r"Target size \(torch.Size\(\[4\]\)\) must be the same"):
        F.binary_cross_entropy_with_logits(x, tg.tensor(R.uniform(size=4)))
    with pytest.raises(ValueError, match="different to the input size"):
        F.binary_cross_entropy(tg.tensor(probs(3)), tg.tensor(probs(4)))
    with pytest.warns(UserWarning, match="likely lead to incorrect results due to broadcasting"):
        out = F.mse_loss(x, tg.tensor(np.zeros(4)))
    np.testing.assert_allclose(out.numpy(), np.mean(x.numpy() ** 2))
    with pytest.raises(ValueError, match=r"batch_size \(3\) to match target batch_size \(4\)"):
        F.cross_entropy(x, tg.tensor(np.array([0, 1, 2, 3])))
    with pytest.raises(ValueError, match=r"Expected target size \[2, 5\], got \[2, 4\]"):
        F.nll_loss(tg.tensor(R.standard_normal((2, 3, 5))), tg.tensor(np.zeros((2, 4), np.int64)))
    with pytest.raises(ValueError, match="float target holds class probabilities"):
        F.cross_entropy(x, tg.tensor(R.uniform(size=(3, 5))))
    with pytest.raises(TypeError, match="expected target dtype to be Long"):
        F.nll_loss(x, tg.tensor(np.array([0.0, 1.0, 2.0])))
    with pytest.raises(RuntimeError):  # torch's class, too
        F.nll_loss(x, tg.tensor(np.array([0.0, 1.0, 2.0])))


def test_argument_errors():
    x = tg.tensor(x34())
    t = tg.tensor(IDX3)
    with pytest.raises(IndexError, match="Target 7 is out of bounds"):
        F.cross_entropy(x, tg.tensor(np.array([0, 7, 1])))
    with pytest.raises(ValueError, match="for all 4 classes or no classes"):
        F.cross_entropy(x, t, weight=tg.tensor(np.ones(3)))
    with pytest.raises(ValueError, match="label_smoothing must be between 0.0 and 1.0"):
        F.cross_entropy(x, t, label_smoothing=1.5)
    with pytest.raises(ValueError, match="ignore_index is not supported for floating point"):
        F.cross_entropy(x, tg.tensor(PROB_T), ignore_index=0)
    with pytest.raises(ValueError, match="between 0 and 1"):
        F.binary_cross_entropy(tg.tensor(np.array([1.5, 0.5])), tg.tensor(np.array([1.0, 0.0])))
    with pytest.raises(ValueError, match="negative values for beta"):
        F.smooth_l1_loss(x, x, beta=-1.0)
    with pytest.raises(ValueError, match="non-positive values for delta"):
        F.huber_loss(x, x, delta=0.0)
    with pytest.raises(ValueError, match="Weights and input must have the same size"):
        F.mse_loss(x, x, weight=tg.tensor(np.ones(4)))
    with pytest.raises(ValueError, match="approximate argument must be either none or tanh"):
        F.gelu(x, approximate="fast")
    with pytest.raises(ValueError, match="dropout probability has to be between 0 and 1"):
        F.dropout(x, p=1.5)
    with pytest.raises(NotImplementedError, match="inplace=True"):
        F.relu(x, inplace=True)
    with pytest.raises(ValueError, match="must equal weight's in_features"):
        F.linear(x, tg.tensor(R.standard_normal((5, 3))))
    with pytest.raises(TypeError, match="floating-point input"):
        F.softmax(tg.tensor(np.array([1, 2])), dim=0)
    with pytest.raises(ValueError, match="Expected 1 or more dimensions"):
        F.nll_loss(tg.tensor(np.array(1.0)), tg.tensor(np.array(1)))


def test_pad_errors():
    x = tg.tensor(x34())
    with pytest.raises(ValueError, match="divisible by 2"):
        F.pad(x, (1, 2, 3))
    with pytest.raises(ValueError, match="padding length 6 and input of dimension 2"):
        F.pad(x, (1, 1, 1, 1, 1, 1))
    with pytest.raises(ValueError, match="less than the corresponding input dimension"):
        F.pad(x, (4, 1), mode="reflect")
    with pytest.raises(NotImplementedError, match="Padding size 4 is not supported for 2D"):
        F.pad(x, (1, 1, 1, 1), mode="reflect")
    with pytest.raises(NotImplementedError, match="Unrecognised padding mode foo"):
        F.pad(x, (1, 1), mode="foo")
    with pytest.raises(ValueError, match="doesn't take in value argument"):
        F.pad(x, (1, 1), mode="replicate", value=1.0)


def test_softmax_implicit_dim_follows_torch_and_warns():
    for shape, dim in (((4,), 0), ((3, 4), 1), ((2, 3, 4), 0), ((2, 3, 4, 2), 1)):
        x = R.standard_normal(shape)
        with pytest.warns(UserWarning, match="Implicit dimension choice for softmax"):
            out = F.softmax(tg.tensor(x))
        np.testing.assert_allclose(out.numpy(), np.exp(np_log_softmax(x, dim)), rtol=1e-12)
        with pytest.warns(UserWarning, match="Implicit dimension choice for log_softmax"):
            out = F.log_softmax(tg.tensor(x))
        np.testing.assert_allclose(out.numpy(), np_log_softmax(x, dim), rtol=1e-12)
    x = tg.tensor(x34().astype(np.float32))
    assert F.softmax(x, dim=1, dtype=np.float64).dtype == np.float64
    assert F.log_softmax(tg.tensor(np.array([1, 2])), 0, dtype=tg.float32).dtype == np.float32


def test_losses_are_stable_at_extremes():
    big = tg.tensor(np.array([[1000.0, -1000.0, 0.0], [-800.0, 800.0, 5.0]]), requires_grad=True)
    t = tg.tensor(np.array([1, 1]))
    loss = F.cross_entropy(big, t, reduction="none")
    np.testing.assert_allclose(loss.detach().numpy(), [2000.0, 0.0], atol=1e-12)
    loss.sum().backward()
    assert np.all(np.isfinite(big.grad.numpy()))
    x = tg.tensor(np.array([-200.0, -30.0, 0.0, 30.0, 200.0]), requires_grad=True)
    y = tg.tensor(np.array([1.0, 0.0, 1.0, 1.0, 0.0]))
    loss = F.binary_cross_entropy_with_logits(x, y, reduction="none")
    np.testing.assert_allclose(loss.detach().numpy(),
                               [200.0, np.log1p(np.exp(-30.0)), np.log(2.0),
                                np.log1p(np.exp(-30.0)), 200.0], rtol=1e-12, atol=2e-15)
    loss.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np_sigmoid(x.detach().numpy()) - y.numpy(),
                               rtol=1e-12, atol=1e-16)
    # BCE clamps each log at -100: p of exactly 0 or 1 is finite, also its gradient
    p = tg.tensor(np.array([0.0, 1.0, 0.5, 1.0]), requires_grad=True)
    yy = tg.tensor(np.array([1.0, 0.0, 1.0, 1.0]))
    loss = F.binary_cross_entropy(p, yy, reduction="none")
    np.testing.assert_allclose(loss.detach().numpy(), [100.0, 100.0, np.log(2.0), 0.0])
    loss.sum().backward()
    assert np.all(np.isfinite(p.grad.numpy()))
    # elu, logsigmoid, softplus far out: no overflow, no NaN gradient
    z = tg.tensor(np.array([-800.0, 800.0]), requires_grad=True)
    out = F.elu(z) + F.logsigmoid(z) + F.softplus(z) + F.silu(z)
    assert np.all(np.isfinite(out.detach().numpy()))
    out.sum().backward()
    assert np.all(np.isfinite(z.grad.numpy()))
    # normalize and cosine_similarity of a zero vector: finite, torch's zero-norm gradient
    zero = tg.tensor(np.zeros((1, 3)), requires_grad=True)
    n = F.normalize(zero)
    np.testing.assert_array_equal(n.detach().numpy(), np.zeros((1, 3)))
    (n * tg.tensor(np.array([[1.0, 2.0, 3.0]]))).sum().backward()
    np.testing.assert_allclose(zero.grad.numpy(), [[1e12, 2e12, 3e12]])
    zero.grad = None
    c = F.cosine_similarity(zero, tg.tensor(np.ones((1, 3))))
    c.sum().backward()
    assert np.all(np.isfinite(zero.grad.numpy())) and c.item() == 0.0


def test_out_of_range_target_in_compiled_code_is_nan_not_zero():
    x = R.standard_normal((3, 4))
    f = tg.compile(lambda x, t: F.cross_entropy(x, t, reduction="none"))
    with np.errstate(invalid="ignore"):
        out = f(x, np.array([1, 9, -100]))
    np.testing.assert_allclose(out[0], -np_log_softmax(x, 1)[0, 1])
    assert np.isnan(out[1]) and out[2] == 0.0
    g = tg.grad(lambda x, t: F.nll_loss(x, t))(x, np.array([1, 3, 2]))
    np.testing.assert_allclose(g, -np.eye(4)[[1, 3, 2]] / 3)


def test_ignored_targets_count_for_nothing():
    x = tg.tensor(x34(), requires_grad=True)
    t = tg.tensor(np.array([1, -100, -100]))
    loss = F.cross_entropy(x, t)
    np.testing.assert_allclose(loss.detach().numpy(), -np_log_softmax(x.detach().numpy(), 1)[0, 1])
    loss.backward()
    np.testing.assert_array_equal(x.grad.numpy()[1:], 0.0)
    with np.errstate(invalid="ignore"):
        all_ignored = F.nll_loss(x, tg.tensor(np.array([-100, -100, -100])))
    assert np.isnan(all_ignored.item())  # 0 / 0, as torch


def test_one_hot():
    t = tg.tensor(np.array([[0, 3], [1, 1]]))
    out = F.one_hot(t)
    assert out.dtype == np.int64 and out.shape == (2, 2, 4)
    np.testing.assert_array_equal(out.numpy(), np.eye(4, dtype=np.int64)[t.numpy()])
    assert F.one_hot(t, num_classes=6).shape == (2, 2, 6)
    with pytest.raises(ValueError, match="smaller than num_classes"):
        F.one_hot(t, 3)
    with pytest.raises(ValueError, match="non-negative"):
        F.one_hot(tg.tensor(np.array([1, -2])))
    with pytest.raises(TypeError, match="LongTensor"):
        F.one_hot(tg.tensor(np.array([1.0, 2.0])))
    # traced: num_classes must be given
    f = tg.compile(lambda i: F.one_hot(i, num_classes=4).sum(0))
    np.testing.assert_array_equal(f(np.array([0, 3, 3])), [1, 0, 0, 2])
    with pytest.raises(ValueError, match="pass num_classes="):
        tg.compile(lambda i: F.one_hot(i))(np.array([0, 3, 3]))


def test_dropout_eager():
    x = tg.tensor(np.ones((200, 50), np.float32), requires_grad=True)
    assert F.dropout(x, p=0.0) is x
    assert F.dropout(x, p=0.7, training=False) is x
    tg.manual_seed(3)
    out = F.dropout(x, p=0.3)
    vals = out.detach().numpy()
    assert out.dtype == np.float32
    assert set(np.unique(vals)) <= {np.float32(0.0), np.float32(1 / 0.7)}
    assert abs((vals == 0).mean() - 0.3) < 0.02
    out.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), vals)  # the gradient is the scaled mask
    tg.manual_seed(3)
    np.testing.assert_array_equal(F.dropout(x, p=0.3).detach().numpy(), vals)  # seeded
    assert not np.array_equal(F.dropout(x, p=0.3).detach().numpy(), vals)      # fresh draws
    np.testing.assert_array_equal(F.dropout(x, p=1.0).detach().numpy(), 0.0)


def test_dropout_compiled_draws_afresh_each_call():
    x = np.arange(1.0, 401.0).reshape(20, 20)

    def f(x):
        return np.sum(F.dropout(x, p=0.5) ** 2)

    g = tg.grad(f)
    tg.manual_seed(0)
    g1 = g(x)
    g2 = g(x)
    for gr in (g1, g2):  # 2 * x * m**2 with m in {0, 2}
        assert set(np.unique(np.round(gr / x, 12))) <= {0.0, 8.0}
        assert 0.35 < np.mean(gr == 0) < 0.65
    assert not np.array_equal(g1, g2)
    tg.manual_seed(0)
    np.testing.assert_array_equal(g(x), g1)  # tracegrad's generator reproduces it, as torch's


def test_torch_style_training_step():
    """A tutorial's loop after `import tracegrad as torch`."""
    import tracegrad as torch
    Fn = torch.nn.functional
    torch.manual_seed(0)
    X = torch.randn(16, 5, dtype=torch.float32)
    y = torch.tensor(np.arange(16) % 3)
    W1 = torch.randn(8, 5, dtype=torch.float32, requires_grad=True)
    b1 = torch.zeros(8, dtype=torch.float32, requires_grad=True)
    W2 = torch.randn(3, 8, dtype=torch.float32, requires_grad=True)
    losses = []
    for _ in range(30):
        h = Fn.dropout(Fn.gelu(Fn.linear(X, W1, b1)), p=0.1, training=False)
        loss = Fn.cross_entropy(Fn.linear(h, W2), y, label_smoothing=0.05)
        loss.backward()
        with torch.no_grad():
            for p in (W1, b1, W2):
                p -= 0.5 * p.grad
                p.grad = None
        losses.append(loss.item())
    assert loss.dtype == torch.float32 and W1.dtype == torch.float32
    assert losses[-1] < 0.7 * losses[0]


def test_compiled_on_tensors_joins_the_tape():
    """tg.compile on Tensors (torch-face tracers): one node on the tape whose
    backward equals the eager one."""
    x = R.standard_normal((4, 3))
    t = np.array([0, 2, 1, 2])
    W = R.standard_normal((3, 3))

    def loss(x, W, t):
        z = F.linear(F.silu(x), W)
        return F.cross_entropy(z, t, label_smoothing=0.1) + F.mse_loss(F.softmax(z, dim=1),
                                                                         F.one_hot(t, 3).float())

    xe, We = tg.tensor(x, requires_grad=True), tg.tensor(W, requires_grad=True)
    loss(xe, We, tg.tensor(t)).backward()
    xc, Wc = tg.tensor(x, requires_grad=True), tg.tensor(W, requires_grad=True)
    out = tg.compile(loss)(xc, Wc, tg.tensor(t))
    out.backward()
    np.testing.assert_allclose(xc.grad.numpy(), xe.grad.numpy(), rtol=1e-10)
    np.testing.assert_allclose(Wc.grad.numpy(), We.grad.numpy(), rtol=1e-10)


def test_compiled_hessian_equals_eager():
    t = np.array([0, 2])

    def f(z):
        z = z.reshape(2, 3)
        return (F.cross_entropy(z, t, label_smoothing=0.1) + F.softplus(z, beta=2.0).sum()
                + F.binary_cross_entropy_with_logits(z, np.full((2, 3), 0.3)))

    z = R.standard_normal(6)
    H = tg.hessian(f)(z)
    He = tg.autograd.functional.hessian(f, tg.tensor(z))
    np.testing.assert_allclose(H, He.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(H, H.T, atol=1e-12)


# --- parity with torch -------------------------------------------------------------------------

def _torch_case(case):
    """The same call on torch: ids whose function torch spells differently map here."""
    return case[1], dict(case[3])


@pytest.mark.parametrize("cid", IDS)
def test_torch_parity(cid):
    torch = pytest.importorskip("torch")
    TF = torch.nn.functional
    case = CASE[cid]
    _, name, inputs, kwargs, ndiff, _, _ = case

    def to_torch(v, grad=False):
        if isinstance(v, np.ndarray):
            a = v.astype(np.float32) if v.dtype.kind == "f" else v
            return torch.tensor(a, requires_grad=grad)
        return v

    targs = [to_torch(v, i < ndiff) for i, v in enumerate(inputs)]
    tkw = {k: to_torch(v) for k, v in kwargs.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = getattr(TF, name)(*targs, **tkw)
    args = _tensors(case, np.float32)
    out = _call(case, args, np.float32)
    assert str(out.dtype) == str(want.dtype).replace("torch.", "")
    assert tuple(out.shape) == tuple(want.shape)
    np.testing.assert_allclose(out.detach().numpy(), want.detach().numpy(), rtol=1e-5,
                               atol=1e-6)
    weights = R.standard_normal(tuple(want.shape)).astype(np.float32)
    (want * torch.tensor(weights)).sum().backward()
    (out * tg.tensor(weights)).sum().backward()
    for i in range(ndiff):
        assert args[i].grad.dtype == np.float32
        np.testing.assert_allclose(args[i].grad.numpy(), targs[i].grad.numpy(), rtol=1e-4,
                                   atol=1e-5, err_msg=f"{cid}: input {i}")


def test_torch_parity_stability_and_special_cases():
    torch = pytest.importorskip("torch")
    TF = torch.nn.functional
    # extremes where torch clamps or is stable
    p = np.array([0.0, 1.0, 1e-30, 0.5], np.float32)
    y = np.array([1.0, 0.0, 1.0, 0.3], np.float32)
    np.testing.assert_allclose(
        F.binary_cross_entropy(tg.tensor(p), tg.tensor(y), reduction="none").numpy(),
        TF.binary_cross_entropy(torch.tensor(p), torch.tensor(y), reduction="none").numpy(),
        rtol=1e-5)
    z = np.array([-300.0, -20.0, 0.0, 20.0, 300.0], np.float32)
    for name, kw in (("softplus", {}), ("softplus", {"beta": 3.0, "threshold": 4.0}),
                     ("logsigmoid", {}), ("elu", {}), ("silu", {}), ("gelu", {})):
        zt = torch.tensor(z, requires_grad=True)
        zg = tg.tensor(z, requires_grad=True)
        a = getattr(TF, name)(zt, **kw)
        b = getattr(F, name)(zg, **kw)
        np.testing.assert_allclose(b.detach().numpy(), a.detach().numpy(), rtol=1e-5,
                                   err_msg=name)
        a.sum().backward()
        b.sum().backward()
        np.testing.assert_allclose(zg.grad.numpy(), zt.grad.numpy(), rtol=1e-5, atol=1e-7,
                                   err_msg=name)
    # cosine similarity below eps: torch clamps the norms in value only
    u = np.array([[1e-5, 0.0], [3.0, 4.0]])
    v = np.array([[1e-5, 1e-5], [1.0, 2.0]])
    ut, ug = torch.tensor(u, requires_grad=True), tg.tensor(u, requires_grad=True)
    a = TF.cosine_similarity(ut, torch.tensor(v), eps=1e-4)
    b = F.cosine_similarity(ug, tg.tensor(v), eps=1e-4)
    np.testing.assert_allclose(b.detach().numpy(), a.detach().numpy(), rtol=1e-12)
    a.sum().backward()
    b.sum().backward()
    np.testing.assert_allclose(ug.grad.numpy(), ut.grad.numpy(), rtol=1e-10)
    # dtypes of mixed calls: BCE weights take the input's dtype, other weights promote
    x = R.standard_normal((3, 4)).astype(np.float32)
    y = R.uniform(size=(3, 4)).astype(np.float32)
    w = R.uniform(size=(3, 4))
    for name, a, kw in (("binary_cross_entropy_with_logits", x, {"weight": w}),
                        ("binary_cross_entropy_with_logits", x, {"pos_weight": w[0]}),
                        ("binary_cross_entropy", 1 / (1 + np.exp(-x)), {"weight": w}),
                        ("mse_loss", x, {"weight": w}), ("huber_loss", x, {"weight": w}),
                        ("cross_entropy", x, {"weight": w[0]})):
        tgt = np.array([0, 1, 3]) if name == "cross_entropy" else y
        if name == "cross_entropy":
            with pytest.raises(RuntimeError):  # torch refuses a double class weight
                TF.cross_entropy(torch.tensor(a), torch.tensor(tgt), weight=torch.tensor(w[0]))
            continue
        want = getattr(TF, name)(torch.tensor(a), torch.tensor(tgt),
                                 **{k: torch.tensor(v) for k, v in kw.items()})
        got = getattr(F, name)(tg.tensor(a), tg.tensor(tgt),
                               **{k: tg.tensor(v) for k, v in kw.items()})
        assert str(got.dtype) == str(want.dtype).replace("torch.", ""), name
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5)
    # one_hot and implicit softmax dims
    idx = np.array([[0, 3], [2, 1]])
    np.testing.assert_array_equal(F.one_hot(tg.tensor(idx)).numpy(),
                                  TF.one_hot(torch.tensor(idx)).numpy())
    for shape in ((4,), (3, 4), (2, 3, 4), (2, 3, 2, 2)):
        x = R.standard_normal(shape).astype(np.float32)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            np.testing.assert_allclose(F.softmax(tg.tensor(x)).numpy(),
                                       TF.softmax(torch.tensor(x)).numpy(), rtol=1e-5)
