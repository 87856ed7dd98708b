"""The torch face's wider surface (issue 27, item 2): torch.special, the
top-level functions and Tensor methods torch has and NumPy does not (or
spells differently), torch.linalg with torch's names and named tuples, the
in-place methods on traced values, eager and compiled (tracegrad.func.grad,
vmap).  The expected values below were taken from torch 2.13; the parity
tests at the end compare with torch itself where it is installed."""
import numpy as np
import pytest

import tracegrad as torch
import tracegrad.func as tf

X = np.array([[0.25, 0.5, 0.75, 0.125], [0.375, 0.625, 0.875, 0.0625],
              [0.1875, 0.3125, 0.4375, 0.5625]])
IDX = [[0, 1, 1, 2], [2, 0, 0, 1]]


def _x(dtype=np.float64):
    return torch.tensor(X.astype(dtype))


# name -> f(T, x) with T the torch module (torch or tracegrad) and x a (3, 4)
# float64 tensor; the result a tensor (or a tuple of tensors) that depends
# smoothly on x
CASES = {
    "quantile": lambda T, x: T.quantile(x, 0.3, dim=1),
    "quantile_list_keepdim": lambda T, x: T.quantile(x, T.tensor([0.2, 0.9], dtype=x.dtype),
                                                     dim=0, keepdim=True),
    "quantile_all_lower": lambda T, x: T.quantile(x, 0.4, interpolation="lower"),
    "quantile_midpoint": lambda T, x: T.quantile(x, 0.4, dim=1, interpolation="midpoint"),
    "nanquantile": lambda T, x: T.nanquantile(T.where(x > 0.8, float("nan"), x), 0.5, dim=1),
    "nanquantile_list": lambda T, x: T.nanquantile(T.where(x > 0.6, float("nan"), x),
                                                   T.tensor([0.25, 0.5], dtype=x.dtype), dim=0,
                                                   keepdim=True,
                                                   interpolation="nearest"),
    "var_mean": lambda T, x: T.var_mean(x, 1),
    "std_mean": lambda T, x: T.std_mean(x, dim=0, correction=0),
    "cov": lambda T, x: T.cov(x),
    "cov_weights": lambda T, x: T.cov(x, correction=0, fweights=T.tensor([1, 2, 1, 3]),
                                      aweights=T.tensor([0.5, 1.0, 2.0, 1.0], dtype=x.dtype)),
    "corrcoef": lambda T, x: T.corrcoef(x),
    "cdist": lambda T, x: T.cdist(x, x[:2] * 2.0),
    "cdist_p1": lambda T, x: T.cdist(x, x[:2] * 2.0, p=1),
    "dist": lambda T, x: T.dist(x, x * x, 3),
    "lerp": lambda T, x: T.lerp(x, x * x, 0.3),
    "addcdiv": lambda T, x: T.addcdiv(x, x, x + 1, value=0.5),
    "addcmul": lambda T, x: x.addcmul(x, x, value=2),
    "take_along_dim": lambda T, x: T.take_along_dim(x, T.tensor([[0], [3], [1]]), 1),
    "take_along_dim_flat": lambda T, x: T.take_along_dim(x, T.tensor([0, 5, 11])),
    "trapezoid": lambda T, x: T.trapezoid(x, dim=1),
    "trapezoid_x": lambda T, x: T.trapezoid(x, T.tensor([0.0, 1.0, 3.0, 3.5], dtype=x.dtype)),
    "meshgrid_xy": lambda T, x: T.meshgrid(x[0], x[1, :3], indexing="xy"),
    "msort": lambda T, x: T.msort(x),
    "diag_embed": lambda T, x: T.diag_embed(x, 1),
    "diag_embed_dims": lambda T, x: T.diag_embed(x, -1, 0, 2),
    "cholesky_solve": lambda T, x: T.cholesky_solve(
        x[:, :2], T.linalg.cholesky(x[:, :3] @ x[:, :3].T + T.eye(3, dtype=x.dtype))),
    "pinverse": lambda T, x: T.pinverse(x),
    "scatter": lambda T, x: x[:2].scatter(1, T.tensor(IDX)[:, :1], x[1:, :1]),
    "scatter_value": lambda T, x: x[:2].scatter(1, T.tensor(IDX)[:, :1], 2.5),
    "scatter_add": lambda T, x: x[:2].scatter_add(1, T.tensor(IDX), x[1:]),
    "scatter_reduce_sum": lambda T, x: x[:2].scatter_reduce(1, T.tensor(IDX), x[1:], "sum",
                                                            include_self=False),
    "scatter_reduce_mean": lambda T, x: x[:2].scatter_reduce(1, T.tensor(IDX), x[1:], "mean"),
    "scatter_reduce_amax": lambda T, x: x[:2].scatter_reduce(1, T.tensor(IDX), x[1:], "amax"),
    "scatter_reduce_amin": lambda T, x: x[:2].scatter_reduce(1, T.tensor(IDX), x[1:], "amin",
                                                             include_self=False),
    "scatter_reduce_prod": lambda T, x: x[:2].scatter_reduce(1, T.tensor(IDX), x[1:], "prod"),
    "index_add": lambda T, x: x.index_add(0, T.tensor([0, 0, 2]), x * 2, alpha=0.5),
    "index_add_dim1": lambda T, x: T.index_add(x, 1, T.tensor([3, 0]), x[:, :2]),
    "index_put_acc": lambda T, x: (x * 1).index_put_((T.tensor([0, 0]),), x[2],
                                                     accumulate=True),
    "index_put": lambda T, x: (x * 1).index_put_((T.tensor([1]), T.tensor([2])), x[0, 0] * 3),
    "masked_fill_": lambda T, x: (x * 1).masked_fill_(x > 0.5, 0.25),
    "masked_select": lambda T, x: x.masked_select(x > 0.4),
    "clamp_min_max": lambda T, x: x.clamp_min(0.3) + x.clamp_max(0.6),
    "logcumsumexp": lambda T, x: T.logcumsumexp(x * 3, 1),
    "mode": lambda T, x: T.tensor([[3.0, 1.0, 3.0, 1.0, 2.0]], dtype=x.dtype).mode(1).values
    + x.sum(),
    "unbind": lambda T, x: x.unbind(1),
    "unflatten": lambda T, x: x.unflatten(1, (2, -1)),
    "inplace_chain": lambda T, x: (x * 1).add_(1).mul_(2).sub_(x, alpha=0.5).div_(3)
    .clamp_(0.5, 0.9),
    "fill_zero_copy": lambda T, x: (x * 1).fill_(2.0) + (x * 1).zero_() + (x * 0).copy_(x * x),
    "new_like": lambda T, x: x + x.new_ones(4) + x.new_full((3, 4), 2.0) + x.new_zeros(3, 4)
    + x.new_tensor([1.0, 2.0, 3.0, 4.0]),
    "argsort_desc": lambda T, x: T.take_along_dim(x, T.argsort(x, dim=1, descending=True), 1),
    "argsort_stable": lambda T, x: T.take_along_dim(x, x.argsort(dim=0, stable=True), 0),
    "sort_desc": lambda T, x: T.sort(x, 1, descending=True).values,
    "topk": lambda T, x: T.topk(x, 2, dim=1).values,
    "max_dim": lambda T, x: T.max(x, 1).values,
    "svd_top": lambda T, x: T.svd(x[:, :3] + T.eye(3, dtype=x.dtype)).S,
    "linalg_multi_dot": lambda T, x: T.linalg.multi_dot([x, x.T, x]),
    "linalg_eigvalsh": lambda T, x: T.linalg.eigvalsh(x @ x.T),
    "linalg_eigh": lambda T, x: T.linalg.eigh(x @ x.T + T.eye(3, dtype=x.dtype)).eigenvalues,
    "linalg_svdvals": lambda T, x: T.linalg.svdvals(x),
    "linalg_slogdet": lambda T, x: T.linalg.slogdet(x[:, :3] + T.eye(3, dtype=x.dtype))
    .logabsdet,
    "linalg_qr_R": lambda T, x: T.linalg.qr(x.T).R.abs(),
    "linalg_solve_triangular": lambda T, x: T.linalg.solve_triangular(
        x[:, :3] + 3 * T.eye(3, dtype=x.dtype), x, upper=True),
    "linalg_solve_triangular_right": lambda T, x: T.linalg.solve_triangular(
        x[:, 1:] + 3 * T.eye(3, dtype=x.dtype), x[:2, :3], upper=False, left=False,
        unitriangular=True),
    "linalg_solve_vectors": lambda T, x: T.linalg.solve(
        T.stack([x[:, :3] + T.eye(3, dtype=x.dtype)] * 2), x[:2, 1:]),
    "linalg_vander": lambda T, x: T.linalg.vander(x[0]),
    "linalg_diagonal": lambda T, x: T.linalg.diagonal(x.reshape(3, 2, 2)),
    "linalg_vector_norm": lambda T, x: T.linalg.vector_norm(x, 3, dim=1),
    "linalg_matrix_norm": lambda T, x: T.linalg.matrix_norm(x.reshape(3, 2, 2), "nuc"),
    "linalg_norm": lambda T, x: T.linalg.norm(x),
    "linalg_lstsq": lambda T, x: T.linalg.lstsq(x[:, :3] + T.eye(3, dtype=x.dtype), x).solution,
    "special_a": lambda T, x: (T.special.erf(x), T.special.erfc(x), T.special.erfinv(x - 0.5),
                               T.special.expit(x), T.special.logit(x, 0.2),
                               T.special.xlogy(x, x + 1), T.special.xlog1py(x, x)),
    "special_b": lambda T, x: (T.special.gammaln(x + 1), T.special.digamma(x + 1),
                               T.special.polygamma(2, x + 1), T.special.multigammaln(x + 2, 3),
                               T.special.i0(x), T.special.i0e(x), T.special.i1(x),
                               T.special.i1e(x)),
    "special_c": lambda T, x: (T.special.ndtr(x), T.special.ndtri(x * 0.5 + 0.2),
                               T.special.log_ndtr(x * 20 - 12), T.special.sinc(x),
                               T.special.entr(x), T.special.logsumexp(x, 1),
                               T.special.softmax(x, 0), T.special.log_softmax(x, 1),
                               T.special.expm1(x), T.special.exp2(x), T.special.log1p(x),
                               T.special.round(x * 10)),
}

# hard-coded from torch 2.13 (float64 inputs X): the sum of every output
EXPECTED_SUMS = {
    'nanquantile_list': 2.125,
    'addcdiv': 6.720593263730631,
    'addcmul': 10.7265625,
    'argsort_desc': 5.0625,
    'argsort_stable': 5.0625,
    'cdist': 7.29726586591043,
    'cdist_p1': 12.75,
    'cholesky_solve': 0.6436236933797909,
    'clamp_min_max': 10.25,
    'corrcoef': 4.332886421281576,
    'cov': 0.3785807291666667,
    'cov_weights': 0.2967708333333333,
    'diag_embed': 5.0625,
    'diag_embed_dims': 5.0625,
    'dist': 0.46514110523348046,
    'fill_zero_copy': 26.83203125,
    'index_add': 10.125,
    'index_add_dim1': 7.3125,
    'index_put': 4.9375,
    'index_put_acc': 8.0625,
    'inplace_chain': 10.041666666666668,
    'lerp': 4.393359375,
    'linalg_diagonal': 1.5625,
    'linalg_eigh': 5.832031250000001,
    'linalg_eigvalsh': 2.8320312500000013,
    'linalg_lstsq': 2.0034722222222223,
    'linalg_matrix_norm': 3.6269662782189402,
    'linalg_multi_dot': 12.97119140625,
    'linalg_norm': 1.6828640022295325,
    'linalg_qr_R': 3.519670049174225,
    'linalg_slogdet': 0.8109302162163289,
    'linalg_solve_triangular': 1.1987943091391366,
    'linalg_solve_triangular_right': 1.8974609375,
    'linalg_solve_vectors': 1.4027777777777777,
    'linalg_svdvals': 2.139502105083929,
    'linalg_vander': 7.080078125,
    'linalg_vector_norm': 2.48388699509358,
    'logcumsumexp': 24.725552283200514,
    'masked_fill_': 3.25,
    'masked_select': 3.75,
    'max_dim': 2.1875,
    'meshgrid_xy': 12.375,
    'mode': 6.0625,
    'msort': 5.0625,
    'nanquantile': 1.125,
    'new_like': 71.0625,
    'pinverse': 1.411764705882355,
    'quantile': 0.8812500000000001,
    'quantile_all_lower': 0.3125,
    'quantile_list_keepdim': 3.5250000000000004,
    'quantile_midpoint': 1.25,
    'scatter': 3.0,
    'scatter_add': 7.0,
    'scatter_reduce_amax': 4.125,
    'scatter_reduce_amin': 2.3125,
    'scatter_reduce_mean': 3.0729166666666665,
    'scatter_reduce_prod': 1.16845703125,
    'scatter_reduce_sum': 3.625,
    'scatter_value': 7.4375,
    'sort_desc': 5.0625,
    'special_a': 19.199954803947286,
    'special_b': 32.75561359323574,
    'special_c': -131.20015632848293,
    'std_mean': 2.30031063558546,
    'svd_top': 4.408574514250044,
    'take_along_dim': 0.625,
    'take_along_dim_flat': 1.4375,
    'topk': 3.75,
    'trapezoid': 4.28125,
    'trapezoid_x': 5.328125,
    'unbind': 5.0625,
    'unflatten': 5.0625,
    'var_mean': 1.4892578125,
}


def _sum(res):
    if isinstance(res, (tuple, list)):
        return sum(_sum(r) for r in res)
    return float(res.double().sum()) if hasattr(res, "double") else float(np.sum(res))


def _loss(res):
    if isinstance(res, (tuple, list)):
        out = None
        for r in res:
            v = _loss(r)
            out = v if out is None else out + v
        return out
    w = torch.tensor(np.linspace(0.5, 1.5, int(np.prod(res.shape)) or 1)[:int(np.prod(
        res.shape))].reshape(res.shape)) if res.shape else 1.3
    return (res * w).sum() if res.dtype.kind == "f" else (res * 0).sum()


@pytest.mark.parametrize("name", sorted(EXPECTED_SUMS))
def test_values_as_torch(name):
    got = _sum(CASES[name](torch, _x()))
    assert got == pytest.approx(EXPECTED_SUMS[name], rel=1e-9, abs=1e-12)


_NO_GRAD = {"masked_select", "mode"}    # (data-dependent shapes, compiled)
_NO_VMAP = {"masked_select", "linalg_lstsq"}


@pytest.mark.parametrize("name", sorted(CASES))
def test_eager_gradient_equals_compiled(name):
    f = CASES[name]
    x = _x().requires_grad_(True)
    _loss(f(torch, x)).backward()
    assert x.grad is not None
    if name in _NO_GRAD:
        return
    g = tf.grad(lambda x: _loss(f(torch, x)))(_x())
    np.testing.assert_allclose(g.numpy(), x.grad.numpy(), rtol=1e-7, atol=1e-10)
    if name in _NO_VMAP:
        return
    xs = torch.stack([_x(), _x() * 0.9])
    gv = tf.vmap(tf.grad(lambda x: _loss(f(torch, x))))(xs)
    np.testing.assert_allclose(gv[0].numpy(), g.numpy(), rtol=1e-7, atol=1e-10)


def test_named_tuples():
    a = torch.tensor(X[:, :3] + np.eye(3))
    s = torch.linalg.slogdet(a)
    assert s.sign.shape == () and s.logabsdet.shape == ()
    e = torch.linalg.eigh(a @ a.T)
    assert e.eigenvalues.shape == (3,) and e.eigenvectors.shape == (3, 3)
    q = torch.linalg.qr(a)
    np.testing.assert_allclose((q.Q @ q.R).numpy(), a.numpy(), atol=1e-12)
    u = torch.linalg.svd(a)
    np.testing.assert_allclose((u.U * u.S @ u.Vh).numpy(), a.numpy(), atol=1e-12)
    v = torch.svd(a)          # torch.svd gives V, not V^H
    np.testing.assert_allclose((v.U * v.S @ v.V.T).numpy(), a.numpy(), atol=1e-12)
    ls = torch.linalg.lstsq(a, a)
    np.testing.assert_allclose(ls.solution.numpy(), np.eye(3), atol=1e-12)
    m = torch.max(a, 1)
    assert m.values.shape == (3,) and m.indices.dtype == np.int64
    for r in (torch.sort(a, 1), torch.topk(a, 2), a.min(0), a.mode(1), a.kthvalue(1, 0)):
        assert hasattr(r, "values") and hasattr(r, "indices")


def test_solve_batch_of_vectors_follows_torchs_rule():
    A = torch.tensor(np.stack([np.eye(3) * 2, np.eye(3) * 4]))
    b = torch.tensor(np.ones((2, 3)))
    assert torch.linalg.solve(A, b).shape == (2, 3)         # (*, n): vectors
    np.testing.assert_allclose(torch.linalg.solve(A, b).numpy(), [[0.5] * 3, [0.25] * 3])
    B = torch.tensor(np.ones((2, 3, 3)))
    assert torch.linalg.solve(A, B).shape == (2, 3, 3)
    assert torch.linalg.solve(A[0], torch.tensor(np.ones(3))).shape == (3,)


def test_removed_and_unknown_names_say_so():
    with pytest.raises(RuntimeError, match="torch.linalg.lstsq"):
        torch.lstsq(torch.ones(2, 2), torch.ones(2, 2))
    with pytest.raises(RuntimeError, match="torch.linalg.solve"):
        torch.solve(torch.ones(2, 2), torch.ones(2, 2))
    for ns, what in ((torch, "torch.xyz_nope"), (torch.linalg, "torch.linalg.xyz_nope"),
                     (torch.special, "torch.special.xyz_nope")):
        with pytest.raises(AttributeError, match=f"tracegrad does not provide {what}"):
            getattr(ns, "xyz_nope")
    with pytest.raises(AttributeError, match="tracegrad does not provide torch.Tensor.xyz_nope"):
        torch.ones(2).xyz_nope
    assert not hasattr(torch.linalg, "einsum")        # NumPy's linalg names are not torch's


def test_no_grad_inside_compiled_function_is_not_differentiated():
    def f(x):
        with torch.no_grad():
            c = (x * x).sum()
        return c * x.sum() + (x ** 3).sum()

    x = _x()
    g = tf.grad(f)(x)
    xe = _x().requires_grad_(True)
    f(xe).backward()
    np.testing.assert_allclose(g.numpy(), xe.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(g.numpy(), float((X * X).sum()) + 3 * X ** 2, rtol=1e-12)


def test_autograd_grad_inside_func_transform():
    def f(x):
        y = (x ** 3).sum()
        (gx,) = torch.autograd.grad(y, x, create_graph=True)
        return (gx * gx).sum()

    g = tf.grad(f)(_x())
    np.testing.assert_allclose(g.numpy(), 36 * X ** 3, rtol=1e-12)

    def h(x):
        return torch.autograd.functional.jacobian(lambda v: v ** 2, x).sum()

    g = tf.grad(h)(torch.tensor(X[0]))
    np.testing.assert_allclose(g.numpy(), 2 * np.ones(4), rtol=1e-12)

    def k(x):      # the Hessian of sum(x^3) is diag(6x): its trace is 6 sum(x)
        return torch.autograd.functional.hessian(lambda v: (v ** 3).sum(), x).trace()

    g = tf.grad(k)(torch.tensor(X[0]))
    np.testing.assert_allclose(g.numpy(), 6 * np.ones(4), rtol=1e-12)

    def u(x):
        out, (vx,) = torch.autograd.functional.vjp(lambda v: v * v, (x,), torch.ones(4,
                                                   dtype=torch.float64))
        return (vx * out).sum()        # sum(2x * x^2)

    g = tf.grad(u)(torch.tensor(X[0]))
    np.testing.assert_allclose(g.numpy(), 6 * X[0] ** 2, rtol=1e-12)


# --- parity with torch (where it is installed) ------------------------------------------------

@pytest.mark.parametrize("name", sorted(CASES))
def test_torch_parity(name):
    real = pytest.importorskip("torch")
    f = CASES[name]
    xt = real.tensor(X, requires_grad=True)
    rt = f(real, xt)
    x = _x().requires_grad_(True)
    ro = f(torch, x)
    flat_t = rt if isinstance(rt, (tuple, list)) else (rt,)
    flat_o = ro if isinstance(ro, (tuple, list)) else (ro,)
    assert len(flat_t) == len(flat_o)
    for a, b in zip(flat_t, flat_o):
        assert tuple(a.shape) == tuple(b.shape), name
        assert str(a.dtype).replace("torch.", "") == str(b.dtype), name
        np.testing.assert_allclose(b.detach().numpy(), a.detach().numpy(), rtol=1e-7,
                                   atol=1e-10, err_msg=name)
    if name in _NO_GRAD:
        return
    lt = _loss_with(real, rt)
    lt.backward()
    _loss(ro).backward()
    np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), rtol=1e-6, atol=1e-9,
                               err_msg=name)


def _loss_with(T, res):
    if isinstance(res, (tuple, list)):
        out = None
        for r in res:
            v = _loss_with(T, r)
            out = v if out is None else out + v
        return out
    n = int(np.prod(res.shape))
    w = T.tensor(np.linspace(0.5, 1.5, n or 1)[:n].reshape(tuple(res.shape))) if res.shape \
        else 1.3
    return (res * w).sum() if res.dtype.is_floating_point else (res * 0).sum()
