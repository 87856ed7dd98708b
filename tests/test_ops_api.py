"""The public op functions: composites, torch-style methods, NumPy protocols,
second derivatives, zero gradients of piecewise-constant ops, and errors.

Values are compared with NumPy; gradients with central finite differences
along random directions (<ct, J d> == <J^T ct, d>).
"""
from __future__ import annotations

import numpy as np
import pytest

import tracegrad as tg
from tracegrad import ops

RNG = np.random.default_rng(1234)


def rand(*shape, lo=-2.0, hi=2.0):
    return RNG.uniform(lo, hi, shape)


def _np(x):
    return x.detach().numpy() if isinstance(x, tg.Tensor) else np.asarray(x)


def check_grad(f, *arrays, proj=None, tol=1e-6):
    """autograd.grad of f against a finite difference along random directions."""
    rng = np.random.default_rng(7)
    ts = [tg.tensor(a, requires_grad=True) for a in arrays]
    out = f(*ts)
    ct = rng.standard_normal(out.shape)
    grads = tg.autograd.grad(out, ts, grad_outputs=tg.tensor(ct), allow_unused=True)
    for _ in range(2):
        dirs = [rng.standard_normal(a.shape) for a in arrays]
        if proj:
            dirs = [proj(d) for d in dirs]
        eps = 1e-6
        with tg.no_grad():
            fp = _np(f(*[tg.tensor(a + eps * d) for a, d in zip(arrays, dirs)]))
            fm = _np(f(*[tg.tensor(a - eps * d) for a, d in zip(arrays, dirs)]))
        lhs = float(np.sum(ct * (fp - fm) / (2 * eps)))
        rhs = sum(float(np.sum(_np(g) * d)) for g, d in zip(grads, dirs) if g is not None)
        assert abs(lhs - rhs) <= tol * 10 * max(1.0, abs(lhs)), (lhs, rhs)
    return out


def check(f, ref, *arrays, grad=True, **kw):
    """Value equals the NumPy reference; gradient matches finite differences."""
    out = f(*[tg.tensor(a) for a in arrays])
    np.testing.assert_allclose(_np(out), ref(*arrays), rtol=1e-10, atol=1e-12)
    if grad:
        check_grad(f, *arrays, **kw)


# --- reductions -------------------------------------------------------------------------------

@pytest.mark.parametrize("axis,keepdims", [(None, False), (1, False), ((0, 2), True), (-1, True)])
def test_mean_var_std(axis, keepdims):
    x = rand(2, 3, 4)
    check(lambda t: ops.mean(t, axis=axis, keepdims=keepdims),
          lambda a: np.mean(a, axis=axis, keepdims=keepdims), x)
    check(lambda t: np.var(t, axis=axis, keepdims=keepdims, ddof=1),
          lambda a: np.var(a, axis=axis, keepdims=keepdims, ddof=1), x)
    check(lambda t: np.std(t, axis=axis, keepdims=keepdims),
          lambda a: np.std(a, axis=axis, keepdims=keepdims), x)


def test_torch_var_std_defaults_are_unbiased():
    x = rand(3, 4)
    t = tg.tensor(x)
    np.testing.assert_allclose(t.var().numpy(), np.var(x, ddof=1))
    np.testing.assert_allclose(t.std(dim=1).numpy(), np.std(x, axis=1, ddof=1))
    np.testing.assert_allclose(t.var(dim=0, unbiased=False).numpy(), np.var(x, axis=0))
    np.testing.assert_allclose(t.var(0, correction=0, keepdim=True).numpy(),
                               np.var(x, axis=0, keepdims=True))
    np.testing.assert_allclose(np.var(t).numpy(), np.var(x))  # NumPy's ddof=0
    np.testing.assert_allclose(t.mean(dim=1, keepdim=True).numpy(), x.mean(1, keepdims=True))


def test_logsumexp_softmax_are_stable_and_exact():
    x = rand(3, 5) * 5
    check(lambda t: ops.logsumexp(t, axis=1), lambda a: np.log(np.exp(a).sum(1)), x)
    check(lambda t: t.softmax(dim=1), lambda a: np.exp(a) / np.exp(a).sum(1, keepdims=True), x)
    check(lambda t: t.log_softmax(dim=0),
          lambda a: a - np.log(np.exp(a).sum(0, keepdims=True)), x)
    big = tg.tensor([1000.0, 1000.0, -np.inf], requires_grad=True)
    v = ops.logsumexp(big)
    assert np.isclose(v.item(), 1000 + np.log(2))
    (g,) = tg.autograd.grad(v, big)
    np.testing.assert_allclose(g.numpy(), [0.5, 0.5, 0.0])
    np.testing.assert_allclose(ops.softmax(tg.tensor([1e4, 0.0])).numpy(), [1.0, 0.0])
    assert ops.logsumexp(tg.tensor([-np.inf, -np.inf])).item() == -np.inf


def test_prod_cumsum_cumprod_nan_reductions():
    x = rand(3, 4)
    x[1, 2] = 0.0
    check(lambda t: np.prod(t, axis=1), lambda a: np.prod(a, axis=1), x)
    check(lambda t: t.prod(), lambda a: np.prod(a), x)
    check(lambda t: np.cumsum(t), lambda a: np.cumsum(a), x)
    check(lambda t: t.cumprod(dim=1), lambda a: np.cumprod(a, axis=1), x)
    y = x.copy()
    y[0, 0] = np.nan
    np.testing.assert_allclose(ops.nansum(tg.tensor(y)).numpy(), np.nansum(y))
    np.testing.assert_allclose(np.nanmean(tg.tensor(y), axis=0).numpy(), np.nanmean(y, axis=0))
    t = tg.tensor(y, requires_grad=True)
    (g,) = tg.autograd.grad(ops.nansum(t), t)
    assert g.numpy()[0, 0] == 0 and np.all(g.numpy().ravel()[1:] == 1)


def test_max_min_numpy_and_torch_styles():
    x = rand(3, 4)
    t = tg.tensor(x, requires_grad=True)
    np.testing.assert_allclose(np.max(t, axis=0).numpy(force=True), x.max(0))
    r = t.max(dim=1)
    assert isinstance(r, tuple) and r._fields == ("values", "indices")
    np.testing.assert_allclose(r.values.numpy(force=True), x.max(1))
    np.testing.assert_array_equal(r.indices.numpy(), x.argmax(1))
    v, i = t.min(1, keepdim=True)
    assert v.shape == (3, 1) and i.shape == (3, 1)
    assert t.max().shape == ()
    np.testing.assert_allclose(t.max(tg.tensor(np.zeros((3, 4)))).numpy(force=True),
                               np.maximum(x, 0))
    np.testing.assert_array_equal(np.argmin(t, axis=1).numpy(), x.argmin(1))
    check(lambda a: a.amax(dim=(0, 1)), lambda a: a.max(), x)
    # ties share the gradient evenly
    tie = tg.tensor([1.0, 3.0, 3.0], requires_grad=True)
    (g,) = tg.autograd.grad(tie.max(), tie)
    np.testing.assert_allclose(g.numpy(), [0, 0.5, 0.5])


def test_all_any_count_nonzero():
    x = np.array([[1.0, 0.0], [2.0, 3.0]])
    t = tg.tensor(x)
    np.testing.assert_array_equal(np.all(t, axis=1).numpy(), [False, True])
    assert bool(t.any()) and not bool(np.all(t))
    assert np.count_nonzero(t).item() == 3


# --- elementwise API --------------------------------------------------------------------------

def test_clip_variants():
    x = rand(3, 4)
    check(lambda t: t.clamp(min=-0.5), lambda a: np.maximum(a, -0.5), x)
    check(lambda t: t.clip(max=0.5), lambda a: np.minimum(a, 0.5), x)
    check(lambda t: np.clip(t, -0.3, 0.4), lambda a: np.clip(a, -0.3, 0.4), x)
    lo, hi = rand(3, 1, lo=-1, hi=-0.2), rand(1, 4, lo=0.2, hi=1)
    check(lambda t, l, h: ops.clamp(t, min=l, max=h), lambda a, l, h: np.clip(a, l, h), x, lo, hi)
    ints = tg.tensor(np.arange(6))
    np.testing.assert_array_equal(ints.clamp(min=2).numpy(), np.maximum(np.arange(6), 2))
    with pytest.raises(ValueError, match="at least one"):
        ops.clip(tg.tensor(x))
    # the gradient passes at the bounds themselves, as torch.clamp
    t = tg.tensor([0.0, 1.0, 2.0], requires_grad=True)
    (g,) = tg.autograd.grad(t.clamp(0.0, 1.0).sum(), t)
    np.testing.assert_allclose(g.numpy(), [1, 1, 0])


def test_misc_elementwise_functions():
    x = rand(3, 4)
    t = tg.tensor(x)
    np.testing.assert_allclose(np.round(t, 1).numpy(), np.round(x, 1))
    np.testing.assert_allclose(np.around(t).numpy(), np.round(x))
    np.testing.assert_allclose(np.fix(t).numpy(), np.fix(x))
    np.testing.assert_allclose(t.sigmoid().numpy(), 1 / (1 + np.exp(-x)))
    np.testing.assert_allclose(ops.softplus(t).numpy(), np.log1p(np.exp(x)))
    np.testing.assert_allclose(t.relu().numpy(), np.maximum(x, 0))
    np.testing.assert_allclose(ops.erf(t).numpy(), np.vectorize(__import__("math").erf)(x))
    np.testing.assert_allclose((t % 0.7).numpy(), x % 0.7)
    np.testing.assert_allclose((t // 0.7).numpy(), x // 0.7)
    np.testing.assert_allclose(np.conj(t).numpy(), x)
    np.testing.assert_allclose(np.real(t).numpy(), x)
    y = np.array([np.nan, np.inf, -np.inf, 1.0])
    np.testing.assert_array_equal(np.nan_to_num(tg.tensor(y)).numpy(), np.nan_to_num(y))
    np.testing.assert_array_equal(tg.tensor(y).nan_to_num(nan=2.0, posinf=3.0).numpy(),
                                  np.nan_to_num(y, nan=2.0, posinf=3.0))
    assert tg.sigmoid(tg.tensor([-1000.0, 1000.0])).numpy().tolist() == [0.0, 1.0]
    check(lambda a: ops.div(a, 0.7, rounding_mode="floor") + a, lambda a: np.floor(a / 0.7) + a, x)


PIECEWISE = [ops.floor, ops.ceil, ops.rint, ops.trunc, ops.fix, ops.sign, ops.round,
             lambda t: ops.round(t, decimals=2), lambda t: t // 0.3, lambda t: 0.3 // t]


@pytest.mark.parametrize("fn", PIECEWISE)
def test_piecewise_constant_ops_have_zero_gradient(fn):
    t = tg.tensor(rand(3, 4), requires_grad=True)
    out = fn(t)
    assert out.requires_grad
    (g,) = tg.autograd.grad(out.sum(), t)
    assert g.shape == t.shape and not np.any(g.numpy())


@pytest.mark.parametrize("fn", [lambda a, b: a < b, lambda a, b: a <= b, lambda a, b: a > b,
                                lambda a, b: a >= b, lambda a, b: a == b, lambda a, b: a != b,
                                lambda a, b: ops.isnan(a), lambda a, b: np.isinf(a),
                                lambda a, b: np.isfinite(a), lambda a, b: a.argmax(),
                                lambda a, b: np.argsort(a), lambda a, b: (a > 0) & (b > 0),
                                lambda a, b: ~(a > 0), lambda a, b: np.any(a > b)])
def test_comparisons_and_predicates_are_not_differentiable(fn):
    a = tg.tensor(rand(3, 4), requires_grad=True)
    b = tg.tensor(rand(3, 4), requires_grad=True)
    out = fn(a, b)
    assert not out.requires_grad and out.grad_fn is None
    assert out.dtype in (np.bool_, np.int64, np.intp)


# --- shapes -----------------------------------------------------------------------------------

def test_shape_functions():
    x = rand(2, 3, 4)
    check(lambda t: t.flatten(1), lambda a: a.reshape(2, 12), x)
    check(lambda t: np.ravel(t), np.ravel, x)
    check(lambda t: np.expand_dims(t, (0, -1)), lambda a: np.expand_dims(a, (0, -1)), x)
    check(lambda t: t.unsqueeze(1).squeeze(1), lambda a: a, x)
    check(lambda t: np.moveaxis(t, 0, -1), lambda a: np.moveaxis(a, 0, -1), x)
    check(lambda t: t.movedim((0, 1), (2, 0)), lambda a: np.moveaxis(a, (0, 1), (2, 0)), x)
    assert tg.tensor(x).squeeze(0).shape == (2, 3, 4)  # torch: not size 1, no-op
    with pytest.raises(ValueError, match="size not equal to one"):
        np.squeeze(tg.tensor(x), 0)
    check(lambda t: np.stack([t, t * 2], axis=1), lambda a: np.stack([a, a * 2], axis=1), x)
    check(lambda t: tg.cat([t, t], dim=-1), lambda a: np.concatenate([a, a], -1), x)
    v = rand(3)
    check(lambda t: np.hstack([t, t]), lambda a: np.hstack([a, a]), v)
    check(lambda t: np.vstack([t, t]), lambda a: np.vstack([a, a]), v)
    check(lambda t: np.column_stack([t, t]), lambda a: np.column_stack([a, a]), v)
    check(lambda t: np.concatenate([t, t], axis=None), lambda a: np.concatenate([a, a], None), x)
    assert [a.shape for a in np.atleast_2d(tg.tensor(v), tg.tensor(1.0))] == [(1, 3), (1, 1)]
    assert np.atleast_3d(tg.tensor(v)).shape == (1, 3, 1)
    t = tg.tensor(x)
    assert t.expand_as(tg.tensor(np.zeros((5, 2, 3, 4)))).shape == (5, 2, 3, 4)
    assert t.view_as(tg.tensor(np.zeros((6, 4)))).shape == (6, 4)
    assert t.type_as(tg.tensor(np.zeros(1, np.float32))).dtype == np.float32


def test_split_family():
    x = rand(6, 4)
    t = tg.tensor(x, requires_grad=True)
    parts = np.split(t, 3)
    assert [p.shape for p in parts] == [(2, 4)] * 3
    assert [p.shape for p in np.split(t, [1, 4], axis=0)] == [(1, 4), (3, 4), (2, 4)]
    assert [p.shape for p in np.array_split(t, 4)] == [(2, 4), (2, 4), (1, 4), (1, 4)]
    assert [p.shape for p in t.split(4)] == [(4, 4), (2, 4)]
    assert [p.shape for p in t.split([1, 5])] == [(1, 4), (5, 4)]
    assert [p.shape for p in t.chunk(4, dim=1)] == [(6, 1)] * 4
    with pytest.raises(ValueError, match="equal division"):
        np.split(t, 4)
    # only one piece used: the others get zero gradient
    (g,) = tg.autograd.grad(parts[1].sum(), t)
    np.testing.assert_array_equal(g.numpy(), np.repeat([0.0, 1.0, 0.0], 2)[:, None] * np.ones(4))
    check(lambda a: tg.stack(np.split(a, 2, axis=1)[::-1]).sum(0),
          lambda a: a[:, 2:] + a[:, :2], x)


def test_reorder_and_repeat_functions():
    x = rand(3, 4)
    check(lambda t: np.flip(t), np.flip, x)
    check(lambda t: t.flip(0), lambda a: a[::-1], x)
    check(lambda t: np.fliplr(t) + np.flipud(t), lambda a: np.fliplr(a) + np.flipud(a), x)
    for k in range(-1, 4):
        check(lambda t: np.rot90(t, k), lambda a: np.rot90(a, k), x)
    check(lambda t: np.roll(t, 2), lambda a: np.roll(a, 2), x)
    check(lambda t: t.roll(1, dims=1), lambda a: np.roll(a, 1, axis=1), x)
    check(lambda t: np.tile(t, 2), lambda a: np.tile(a, 2), x)
    check(lambda t: np.tile(t, (2, 1, 2)), lambda a: np.tile(a, (2, 1, 2)), x)
    check(lambda t: t.repeat(2, 1, 3), lambda a: np.tile(a, (2, 1, 3)), x)
    check(lambda t: np.repeat(t, 2), lambda a: np.repeat(a, 2), x)
    check(lambda t: np.repeat(t, [1, 0, 3], axis=0), lambda a: np.repeat(a, [1, 0, 3], axis=0), x)
    check(lambda t: t.repeat_interleave(2, dim=1), lambda a: np.repeat(a, 2, axis=1), x)
    for mode in ("constant", "edge", "reflect", "symmetric", "wrap"):
        check(lambda t: np.pad(t, ((1, 2), (2, 1)), mode=mode),
              lambda a: np.pad(a, ((1, 2), (2, 1)), mode=mode), x)
    check(lambda t: np.pad(t, 1, constant_values=3.0), lambda a: np.pad(a, 1, constant_values=3.0),
          x)
    check(lambda t: np.diff(t, n=2, axis=1), lambda a: np.diff(a, n=2, axis=1), x)
    check(lambda t: np.diff(t, prepend=0.0, axis=0), lambda a: np.diff(a, prepend=0.0, axis=0), x)


def test_sorting():
    x = rand(3, 5)
    check(lambda t: np.sort(t), np.sort, x)
    check(lambda t: np.sort(t, axis=None), lambda a: np.sort(a, axis=None), x)
    t = tg.tensor(x, requires_grad=True)
    vals, idx = t.sort(dim=1, descending=True)
    np.testing.assert_allclose(vals.numpy(force=True), -np.sort(-x, axis=1))
    np.testing.assert_array_equal(idx.numpy(), np.argsort(-x, axis=1, kind="stable"))
    check(lambda a: a.sort(dim=0, descending=True).values, lambda a: -np.sort(-a, axis=0), x)
    p = np.partition(tg.tensor(x), 2, axis=1).numpy()
    np.testing.assert_allclose(p[:, 2], np.partition(x, 2, axis=1)[:, 2])
    check(lambda a: np.partition(a, 2, axis=1)[:, 2], lambda a: np.sort(a, axis=1)[:, 2], x)
    np.testing.assert_array_equal(np.argsort(tg.tensor(x), axis=0).numpy(), np.argsort(x, 0))


# --- indexing ---------------------------------------------------------------------------------

INDICES = [np.s_[1:, ::-2], np.s_[2], np.s_[None, ..., -1], np.s_[[0, 2, 2, 3, 0]],
           np.s_[:, [[1, 1], [4, 0]]], np.s_[[True, False, True, True], 1:3], np.s_[..., None],
           np.s_[[1, 2], [0, 4]], np.s_[()], np.s_[-1, ::2]]


@pytest.mark.parametrize("idx", INDICES, ids=str)
def test_getitem(idx):
    x = rand(4, 5)
    check(lambda t: t[idx], lambda a: a[idx], x)


def test_getitem_with_tensor_indices_and_masks():
    x = rand(4, 5)
    t = tg.tensor(x, requires_grad=True)
    mask = t > 0
    np.testing.assert_allclose(t[mask].numpy(force=True), x[x > 0])
    i = tg.tensor(np.array([3, 3, 0]))
    out = t[i]
    (g,) = tg.autograd.grad(out.sum(), t)
    np.testing.assert_allclose(g.numpy()[:, 0], [1, 0, 0, 2])
    with pytest.raises(IndexError, match="integer or boolean"):
        t[tg.tensor([0.5])]
    with pytest.raises(IndexError, match="valid indices"):
        t["a"]


def test_setitem_out_of_place_and_in_tensor():
    x, v = rand(4, 5), rand(2, 5)
    check(lambda a, b: ops.setitem(a, np.s_[1:3], b) * 2,
          lambda a, b: np.concatenate([a[:1], b, a[3:]]) * 2, x, v)
    a = tg.tensor(x, requires_grad=True)
    b = tg.tensor(v, requires_grad=True)
    y = a * 1.0
    y[[0, 3]] = b
    y[:, 0] = 0.0
    ref = x.copy()
    ref[[0, 3]] = v
    ref[:, 0] = 0.0
    np.testing.assert_allclose(y.numpy(force=True), ref)
    ga, gb = tg.autograd.grad((y * y).sum(), [a, b])
    want_a = 2 * ref
    want_a[[0, 3]] = 0
    want_a[:, 0] = 0
    np.testing.assert_allclose(ga.numpy(), want_a)
    want_b = 2 * v
    want_b[:, 0] = 0
    np.testing.assert_allclose(gb.numpy(), want_b)
    assert np.array_equal(a.numpy(force=True), x)  # the original is untouched


def test_gathers():
    x = rand(3, 5)
    idx = np.array([[0, 4], [2, 2], [1, 3]])
    check(lambda t: np.take(t, [4, 0, 4]), lambda a: np.take(a, [4, 0, 4]), x)
    check(lambda t: np.take(t, [1, 1], axis=1), lambda a: np.take(a, [1, 1], axis=1), x)
    check(lambda t: np.take_along_axis(t, idx, axis=1), lambda a: np.take_along_axis(a, idx, 1), x)
    check(lambda t: t.gather(1, tg.tensor(idx[:2])), lambda a: np.take_along_axis(a[:2], idx[:2], 1),
          x)
    check(lambda t: t.index_select(0, tg.tensor([2, 0])), lambda a: a[[2, 0]], x)
    check(lambda t: t.masked_fill(t > 0, 0.5), lambda a: np.where(a > 0, 0.5, a), x)
    check(lambda t: t.narrow(1, 1, 3), lambda a: a[:, 1:4], x)
    m = tg.tensor(np.array([[1.0, 0.0], [0.0, 2.0]]))
    assert [a.tolist() for a in np.nonzero(m)] == [[0, 1], [0, 1]]
    assert m.nonzero().tolist() == [[0, 0], [1, 1]]
    assert np.argwhere(m).shape == (2, 2)
    assert [a.tolist() for a in ops.where(m)] == [[0, 1], [0, 1]]


# --- linear algebra ---------------------------------------------------------------------------

def _spd(n):
    a = rand(n, n)
    return a @ a.T + n * np.eye(n)


def _sym(d):
    return (d + d.T) / 2


def test_products():
    a, b = rand(3, 4), rand(4, 5)
    check(lambda x, y: np.dot(x, y), np.dot, a, b)
    check(lambda x, y: np.dot(x, y), np.dot, rand(2, 3, 4), rand(5, 4, 2))
    check(lambda x, y: np.dot(x, y), np.dot, rand(2, 3, 4), rand(4))
    check(lambda x, y: np.vdot(x, y), np.vdot, a, rand(3, 4))
    check(lambda x, y: np.inner(x, y), np.inner, a, rand(2, 4))
    check(lambda x, y: np.outer(x, y), np.outer, rand(3), rand(4))
    check(lambda x, y: np.tensordot(x, y, axes=([0, 2], [2, 0])),
          lambda x, y: np.tensordot(x, y, axes=([0, 2], [2, 0])), rand(2, 3, 4), rand(4, 5, 2))
    check(lambda x, y: np.tensordot(x, y, 1), lambda x, y: np.tensordot(x, y, 1), a, b)
    check(lambda x, y: np.kron(x, y), np.kron, rand(2, 3), rand(3, 2))
    check(lambda x, y: np.kron(x, y), np.kron, rand(3), rand(2, 2))
    check(lambda x, y: np.cross(x, y), np.cross, rand(4, 3), rand(3))
    check(lambda x, y: ops.cross(x, y, dim=0), lambda x, y: np.cross(x, y, axis=0),
          rand(3, 2), rand(3, 2))
    check(lambda x, y: x.mm(y), np.matmul, a, b)
    check(lambda x, y: x.bmm(y), np.matmul, rand(2, 3, 4), rand(2, 4, 2))
    check(lambda x, y: x.mv(y), np.matmul, a, rand(4))
    check(lambda c, x, y: ops.addmm(c, x, y, beta=0.5, alpha=2),
          lambda c, x, y: 0.5 * c + 2 * x @ y, rand(3, 5), a, b)
    check(lambda x, y: x @ y, np.matmul, rand(2, 1, 3, 4), rand(5, 4, 2))


@pytest.mark.parametrize("eq,shapes", [
    ("ij,jk->ik", [(3, 4), (4, 5)]), ("ij,jk", [(3, 4), (4, 5)]), ("ii", [(3, 3)]),
    ("ii->i", [(3, 3)]), ("...ij,...jk->...ik", [(2, 3, 4), (4, 5)]), ("i,j", [(3,), (4,)]),
    ("bij->", [(2, 3, 4)]), ("ij,ij->i", [(3, 4), (3, 4)]), ("...i,i", [(2, 3), (3,)]),
])
def test_einsum(eq, shapes):
    arrays = [rand(*s) for s in shapes]
    check(lambda *ts: np.einsum(eq, *ts), lambda *a: np.einsum(eq, *a), *arrays)


def test_trace_diag_tri():
    x = rand(4, 5)
    check(lambda t: np.trace(t), np.trace, x)
    check(lambda t: t.trace(), np.trace, x)
    check(lambda t: np.trace(t, 1), lambda a: np.trace(a, 1), x)
    check(lambda t: np.diagonal(t, -1), lambda a: np.diagonal(a, -1), x)
    check(lambda t: np.diagonal(t, 0, 0, 2), lambda a: np.diagonal(a, 0, 0, 2), rand(3, 2, 4))
    check(lambda t: np.diag(t), np.diag, x)
    check(lambda t: np.diag(t, 2), lambda a: np.diag(a, 2), rand(3))
    check(lambda t: t.diag(-1), lambda a: np.diag(a, -1), rand(3))
    check(lambda t: np.triu(t, 1), lambda a: np.triu(a, 1), x)
    check(lambda t: t.tril(), np.tril, rand(2, 3, 3))


def test_linalg_functions():
    a = rand(3, 3) + 3 * np.eye(3)
    check(lambda t: np.linalg.inv(t), np.linalg.inv, a)
    check(lambda t: t.inverse(), np.linalg.inv, a)
    check(lambda t, b: np.linalg.solve(t, b), np.linalg.solve, a, rand(3))
    check(lambda t: np.linalg.det(t), np.linalg.det, a)
    check(lambda t: np.linalg.slogdet(t)[1], lambda m: np.linalg.slogdet(m)[1], a)
    check(lambda t: np.linalg.cholesky(t), np.linalg.cholesky, _spd(3), proj=_sym)
    check(lambda t: tg.linalg.cholesky(t, upper=True), lambda m: np.linalg.cholesky(m).T,
          _spd(3), proj=_sym)
    check(lambda t: np.linalg.eigh(t)[0], lambda m: np.linalg.eigh(m)[0], _sym(rand(4, 4)),
          proj=_sym)
    # eigenvectors up to sign: compare |V|
    check(lambda t: abs(np.linalg.eigh(t)[1]), lambda m: abs(np.linalg.eigh(m)[1]),
          _sym(rand(3, 3)), proj=_sym)
    check(lambda t: np.linalg.svd(t, full_matrices=False)[1],
          lambda m: np.linalg.svd(m, compute_uv=False), rand(4, 3))
    check(lambda t: np.linalg.svd(t, compute_uv=False), lambda m: np.linalg.svd(m, compute_uv=False),
          rand(3, 4))
    check(lambda t: np.linalg.pinv(t), np.linalg.pinv, rand(4, 3))
    for n in (0, 1, 3, -2):
        check(lambda t: np.linalg.matrix_power(t, n), lambda m: np.linalg.matrix_power(m, n), a)
    with pytest.raises(NotImplementedError, match="full_matrices=False"):
        np.linalg.svd(tg.tensor(rand(4, 3)))
    with pytest.raises(np.linalg.LinAlgError, match="square"):
        np.linalg.inv(tg.tensor(rand(3, 4)))


def test_qr():
    for shape in ((5, 3), (3, 3), (3, 5), (2, 4, 3)):
        a = rand(*shape)
        check(lambda t: np.linalg.qr(t)[0], lambda m: np.linalg.qr(m)[0], a)
        check(lambda t: np.linalg.qr(t)[1], lambda m: np.linalg.qr(m)[1], a)
    a = rand(4, 3)
    check(lambda t: t.qr()[1], lambda m: np.linalg.qr(m)[1], a)
    check(lambda t: tg.linalg.qr(t, mode="r").R, lambda m: np.linalg.qr(m, mode="r"), a)
    # Q^T Q = I and QR = A hold on the tape too (their gradients vanish/pass through)
    q, r = tg.linalg.qr(tg.tensor(a))
    np.testing.assert_allclose((q.T @ q).numpy(), np.eye(3), atol=1e-12)
    np.testing.assert_allclose((q @ r).numpy(), a, atol=1e-12)
    with pytest.raises(NotImplementedError, match="mode='reduced'"):
        np.linalg.qr(tg.tensor(a), mode="complete")
    with pytest.raises(np.linalg.LinAlgError, match="expected a matrix"):
        tg.linalg.qr(tg.tensor(rand(3)))


@pytest.mark.parametrize("shape,bshape", [((6, 3), (6,)), ((6, 3), (6, 2)), ((3, 5), (3,)),
                                          ((4, 4), (4, 2))])
def test_lstsq_matches_numpy_and_its_gradient_finite_differences(shape, bshape):
    a, b = rand(*shape), rand(*bshape)
    x, res, rank, s = np.linalg.lstsq(tg.tensor(a), tg.tensor(b), rcond=None)
    xw, resw, rankw, sw = np.linalg.lstsq(a, b, rcond=None)
    np.testing.assert_allclose(x.numpy(), xw, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(res.numpy(), resw, rtol=1e-9, atol=1e-12)
    assert int(rank) == rankw
    np.testing.assert_allclose(s.numpy(), sw, rtol=1e-12)
    check_grad(lambda t, u: np.linalg.lstsq(t, u, rcond=None)[0], a, b)
    if shape[0] > shape[1]:
        check_grad(lambda t, u: np.linalg.lstsq(t, u, rcond=None)[1], a, b)


def test_lstsq_rank_deficient_gives_the_minimum_norm_solution():
    a = rand(5, 2) @ rand(2, 4)  # rank 2
    b = rand(5)
    x, _, rank, _ = tg.linalg.lstsq(tg.tensor(a), tg.tensor(b))
    np.testing.assert_allclose(x.numpy(), np.linalg.lstsq(a, b, rcond=None)[0], atol=1e-10)
    assert int(rank) == 2


def test_a_fit_with_lstsq_compiles_and_differentiates_like_eager():
    A, y = rand(20, 3), rand(20)

    def misfit(w):
        coef = np.linalg.lstsq(A * w, y, rcond=None)[0]
        return np.sum((A @ coef - y) ** 2) + np.sum(coef ** 2)

    w = rand(3) + 1.5
    g_compiled = tg.grad(misfit)(w)
    t = tg.tensor(w, requires_grad=True)
    misfit(t).backward()
    np.testing.assert_allclose(g_compiled, t.grad.numpy(), rtol=1e-9, atol=1e-12)
    check_grad(lambda t: misfit(t), w)


NORMS = [(None, None), (1, None), (2, None), (np.inf, None), (-np.inf, None), (3, None),
         (0, None), (None, 1), (1, 0), ("fro", None), ("nuc", None), (2, (0, 1)),
         (-2, (0, 1)), (1, (1, 0)), (-1, (0, 1)), (np.inf, (0, 1)), (-np.inf, (1, 0))]


@pytest.mark.parametrize("ord,axis", NORMS, ids=str)
def test_norm(ord, axis):
    x = rand(4, 3)
    if axis is None and ord in (3, 0, -np.inf):
        x = x[0]  # vector-only orders
    for keep in (False, True):
        check(lambda t: np.linalg.norm(t, ord, axis, keep),
              lambda a: np.linalg.norm(a, ord, axis, keep), x, grad=ord != 0)


def test_torch_norm_method_and_zero_gradient():
    x = rand(3, 4)
    t = tg.tensor(x)
    np.testing.assert_allclose(t.norm().numpy(), np.linalg.norm(x))
    np.testing.assert_allclose(t.norm(p=1, dim=1).numpy(), np.abs(x).sum(1))
    np.testing.assert_allclose(t.norm(dim=0, keepdim=True).numpy(),
                               np.linalg.norm(x, axis=0, keepdims=True))
    z = tg.tensor(np.zeros(3), requires_grad=True)
    (g,) = tg.autograd.grad(z.norm(), z)
    np.testing.assert_array_equal(g.numpy(), 0.0)  # 0, not NaN, as torch


# --- NumPy protocols --------------------------------------------------------------------------

def test_numpy_protocols_return_tensors_in_autograd():
    x = rand(3, 3) + 3 * np.eye(3)
    w = rand(3, 2)
    t = tg.tensor(x, requires_grad=True)
    outs = [np.sin(t), np.sum(t, axis=0), t @ w, w.T @ t, x * t, np.linalg.inv(t),
            np.maximum(t, 0.5), np.exp2(t), np.add.reduce(t, axis=1), np.mean(t)]
    for o in outs:
        assert isinstance(o, tg.Tensor) and o.requires_grad
    loss = sum(o.sum() for o in outs)
    (g,) = tg.autograd.grad(loss, t)
    inv = np.linalg.inv(x)
    want = (np.cos(x) + 1 + w.sum(1)[None, :] + w.sum(1)[:, None] + x
            - (inv.T @ np.ones((3, 3)) @ inv.T) + (x > 0.5) + np.exp2(x) * np.log(2) + 1 + 1 / 9)
    np.testing.assert_allclose(g.numpy(), want)


def test_unsupported_ufunc_keyword_is_explained():
    t = tg.tensor(rand(3))
    with pytest.raises(TypeError, match="unsupported keyword"):
        np.sin(t, where=np.ones(3, bool))


# --- second derivatives -----------------------------------------------------------------------

SECOND = {
    "exp": (lambda x: ops.exp(x).sum(), [rand(3)]),
    "tanh": (lambda x: (ops.tanh(x) ** 2).sum(), [rand(3)]),
    "mul": (lambda x, y: (x * y * x).sum(), [rand(3), rand(3)]),
    "div": (lambda x, y: (x / y).sum(), [rand(3), rand(3, lo=0.5, hi=2)]),
    "pow": (lambda x, y: (x ** y).sum() + (x ** 3).sum(), [rand(3, lo=0.5, hi=2), rand(3)]),
    "matmul": (lambda a, b: ((a @ b) ** 2).sum(), [rand(2, 3), rand(3, 2)]),
    "log_softmax": (lambda x: (ops.log_softmax(x, dim=1) * np.arange(4.0)).sum(), [rand(2, 4)]),
    "sum": (lambda x: (x.sum(1) ** 2).sum(), [rand(2, 3)]),
    "getitem": (lambda x: (x[[0, 0, 2], 1:] ** 3).sum(), [rand(3, 3)]),
    "norm": (lambda x: np.linalg.norm(x) * x.sum(), [rand(3, 2)]),
    "amax": (lambda x: (x.amax(0) ** 2).sum(), [rand(3, 2)]),
    "inv": (lambda x: np.linalg.inv(x).sum(), [rand(3, 3) + 3 * np.eye(3)]),
    "sort": (lambda x: (np.sort(x) ** 2 * np.arange(4.0)).sum(), [rand(4)]),
    "prod": (lambda x: np.prod(x), [rand(4)]),
    "cumprod": (lambda x: np.cumprod(x).sum(), [rand(4)]),
    "sigmoid": (lambda x: ops.sigmoid(x).sum(), [rand(3)]),
    "einsum": (lambda a, b: (np.einsum("ij,jk->ik", a, b) ** 2).sum(), [rand(2, 3), rand(3, 2)]),
}


@pytest.mark.parametrize("name", sorted(SECOND))
def test_second_derivatives_match_finite_differences(name):
    f, arrays = SECOND[name]
    rng = np.random.default_rng(3)
    ts = [tg.tensor(a, requires_grad=True) for a in arrays]
    grads = tg.autograd.grad(f(*ts), ts, create_graph=True)
    v = [rng.standard_normal(a.shape) for a in arrays]
    gv = sum((g * tg.tensor(d)).sum() for g, d in zip(grads, v))
    hv = tg.autograd.grad(gv, ts, allow_unused=True)
    eps = 1e-5

    def grad_at(shift):
        xs = [tg.tensor(a + shift * d, requires_grad=True) for a, d in zip(arrays, v)]
        return [g.numpy() for g in tg.autograd.grad(f(*xs), xs)]
    fd = [(p - m) / (2 * eps) for p, m in zip(grad_at(eps), grad_at(-eps))]
    for h, want in zip(hv, fd):
        got = np.zeros_like(want) if h is None else h.detach().numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


# --- errors -----------------------------------------------------------------------------------

def test_shape_errors_name_the_shapes():
    a, b = tg.tensor(rand(3, 4)), tg.tensor(rand(5, 2))
    with pytest.raises(ValueError, match=r"\[3, 4\] and \[5, 2\]"):
        a @ b
    with pytest.raises(ValueError, match="must match except along axis"):
        np.concatenate([a, b])
    with pytest.raises(ValueError, match="shape mismatch"):
        np.tensordot(a, b, 1)
    with pytest.raises(ValueError, match="cannot solve"):
        np.linalg.solve(tg.tensor(np.eye(3)), tg.tensor(rand(4)))
    with pytest.raises(ValueError, match="could not be broadcast"):
        a + tg.tensor(rand(3))


def test_elementwise_result_dtypes_follow_numpy_with_weak_python_scalars():
    # the shape rule remembers dtypes per operand dtypes: each combination
    # must still get NumPy's own answer, a Python int's range included
    from tracegrad.ops.primitives import Aval
    from tracegrad.ops.base import add_p
    f32, f64, i8, u8 = (Aval((3,), np.dtype(t)) for t in ("f4", "f8", "i1", "u1"))
    for args, want in [((f32, 1.5), "f4"), ((f32, f64), "f8"), ((i8, 1.5), "f8"),
                       ((u8, 3), "u1"), ((i8, u8), "i2"), ((f32, np.float64(2.0)), "f8"),
                       ((f32, np.ones(2, "f8")), "f8"), ((u8, True), "u1")]:
        for _ in range(2):      # computed, then remembered
            assert add_p.shape(*args).dtype == np.dtype(want), (args, want)
    with pytest.raises(OverflowError):
        add_p.shape(u8, 300)    # out of range for uint8, as NumPy says
