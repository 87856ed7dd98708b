"""Every public name of torch 2.13 (tests/_torch_names.py, written down from
torch so these run without it) either means what it means in torch, or
raises an AttributeError that names it and says tracegrad does not provide
it: never a NumPy function of the same name with another meaning (issue 27,
item 5)."""
import inspect

import numpy as np
import pytest

import tracegrad as torch
from _torch_names import LINALG, SPECIAL, TENSOR, TOP


def _walk(ns, names, prefix):
    provided, missing = {}, []
    for n in names:
        try:
            v = getattr(ns, n)
        except AttributeError as e:
            assert f"tracegrad does not provide {prefix}.{n}" in str(e), (n, str(e))
            missing.append(n)
        else:
            provided[n] = v
    return provided, missing


def _not_numpy(provided):
    for n, v in provided.items():
        if inspect.isfunction(v) or inspect.isbuiltin(v):
            mod = getattr(v, "__module__", "") or ""
            assert mod.startswith("tracegrad"), f"torch.{n} is {mod}.{v.__name__}, not tracegrad's"


def test_top_level_names_are_torchs_or_refused():
    provided, missing = _walk(torch, TOP, "torch")
    _not_numpy(provided)
    assert len(provided) > 280 and missing


def test_linalg_names_are_torchs_or_refused():
    provided, missing = _walk(torch.linalg, LINALG, "torch.linalg")
    _not_numpy(provided)
    for n in ("solve", "eigh", "svd", "qr", "slogdet", "lstsq", "vector_norm", "matrix_norm",
              "eigvalsh", "svdvals", "multi_dot", "solve_triangular", "vander", "diagonal"):
        assert n in provided, n
    # NumPy's linalg spellings that torch.linalg lacks are not there either
    for n in ("einsum", "tensordot", "trace", "outer"):
        with pytest.raises(AttributeError, match=f"tracegrad does not provide torch.linalg.{n}"):
            getattr(torch.linalg, n)


def test_special_names_are_torchs_or_refused():
    provided, missing = _walk(torch.special, SPECIAL, "torch.special")
    _not_numpy(provided)
    for n in ("erf", "erfc", "erfinv", "expit", "logit", "xlogy", "xlog1py", "gammaln",
              "digamma", "polygamma", "multigammaln", "i0", "i0e", "i1", "i1e", "ndtr", "ndtri",
              "log_ndtr", "sinc", "entr", "logsumexp", "softmax", "log_softmax", "expm1",
              "exp2", "log1p", "round"):
        assert n in provided, n


def test_tensor_names_are_torchs_or_refused():
    t = torch.ones(2, 2)
    refused = []
    for n in TENSOR:
        try:
            getattr(t, n)
        except AttributeError as e:
            assert n in str(e), (n, str(e))
            refused.append(n)
        except (RuntimeError, TypeError, ValueError, NotImplementedError):
            pass     # a property torch refuses here too (.H of a 3-D tensor...)
    for n in ("scatter", "scatter_add", "scatter_reduce", "index_add", "index_put_",
              "masked_fill_", "masked_select", "lerp", "addcmul", "clamp_min", "clamp_max",
              "logcumsumexp", "mode", "new_zeros", "new_ones", "new_full", "new_empty",
              "new_tensor", "unbind", "unflatten"):
        assert n not in refused, n
    with pytest.raises(AttributeError, match="tracegrad does not provide torch.Tensor.xyz"):
        t.xyz


# --- names NumPy has with another meaning: torch's here (values from torch 2.13) -----------

A = np.array([[4.0, 1.0, 2.0], [1.0, 5.0, 3.0], [2.0, 3.0, 6.0]])


def _t(a=A):
    return torch.tensor(a)


def test_cumsum_cumprod_need_dim():
    np.testing.assert_allclose(torch.cumsum(_t(), 0).numpy(), np.cumsum(A, 0))
    np.testing.assert_allclose(torch.cumprod(_t(), dim=1).numpy(), np.cumprod(A, 1))
    with pytest.raises(TypeError):
        torch.cumsum(_t())


def test_flip_roll_tile_take_trace():
    np.testing.assert_allclose(torch.flip(_t(), [0]).numpy(), A[::-1])
    with pytest.raises(TypeError):
        torch.flip(_t())
    np.testing.assert_allclose(torch.roll(_t(), 1).numpy(), np.roll(A, 1))
    np.testing.assert_allclose(torch.tile(_t(), (2,)).numpy(), np.tile(A, 2))
    np.testing.assert_allclose(torch.take(_t(), torch.tensor([[0, 8]])).numpy(), [[4.0, 6.0]])
    assert float(torch.trace(_t())) == 15.0
    with pytest.raises(RuntimeError):
        torch.trace(torch.ones(2, 2, 2))


def test_count_nonzero_round_searchsorted_diff():
    c = torch.count_nonzero(torch.tensor([[0, 1], [2, 3]]), dim=0)
    assert c.dtype == np.int64 and c.tolist() == [1, 2]
    assert torch.round(torch.tensor([1.25, 2.5], dtype=torch.float64),
                       decimals=1).tolist() == [1.2, 2.5]
    with pytest.raises(TypeError):
        torch.round(torch.tensor([1.25]), 1)
    s = torch.searchsorted(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([2.0]), right=True)
    assert s.tolist() == [2] and s.dtype == np.int64
    s2 = torch.searchsorted(torch.tensor([[1.0, 2.0], [0.0, 5.0]]), torch.tensor([[1.5], [6.0]]))
    assert s2.tolist() == [[1], [2]]
    np.testing.assert_allclose(torch.diff(_t(), dim=0).numpy(), np.diff(A, axis=0))


def test_linear_algebra_top_level():
    u, s, v = torch.svd(_t())
    np.testing.assert_allclose((u * s @ v.T).numpy(), A, atol=1e-12)
    q, r = torch.qr(_t(np.ones((4, 2)) + np.eye(4, 2)))
    assert q.shape == (4, 2) and r.shape == (2, 2)
    q, r = torch.qr(_t(), some=False)
    np.testing.assert_allclose((q @ r).numpy(), A, atol=1e-12)
    U = torch.cholesky(_t(), upper=True)
    np.testing.assert_allclose((U.T @ U).numpy(), A, atol=1e-12)
    assert torch.tensordot(_t(), _t(), dims=1).shape == (3, 3)
    assert torch.tensordot(_t(), _t(), dims=([0], [1])).shape == (3, 3)
    with pytest.raises(RuntimeError):
        torch.dot(_t(), _t())
    assert float(torch.dot(_t()[0], _t()[1])) == 15.0
    assert torch.logsumexp(_t(), 1).shape == (3,)
    with pytest.raises(TypeError):
        torch.logsumexp(_t())


def test_argsort_and_diagonal():
    idx = torch.argsort(_t(), dim=1, descending=True)
    assert idx.tolist() == [[0, 2, 1], [1, 2, 0], [2, 1, 0]]
    assert torch.argsort(torch.tensor([2, 1, 2, 1]), stable=True).tolist() == [1, 3, 0, 2]
    assert torch.diagonal(_t(), 1).tolist() == [1.0, 3.0]
    b = torch.arange(8.0).reshape(2, 2, 2)
    assert torch.diagonal(b).tolist() == [[0.0, 6.0], [1.0, 7.0]]      # dims 0 and 1
    assert torch.linalg.diagonal(b).tolist() == [[0.0, 3.0], [4.0, 7.0]]  # the last two
    assert torch.linalg.vander(torch.tensor([2.0, 3.0])).tolist() == [[1.0, 2.0], [1.0, 3.0]]
    assert torch.vander(torch.tensor([2.0, 3.0])).tolist() == [[2.0, 1.0], [3.0, 1.0]]


def test_removed_functions_say_where_they_went():
    with pytest.raises(RuntimeError, match="torch.linalg.lstsq"):
        torch.lstsq(_t(), _t())
    with pytest.raises(RuntimeError, match="torch.linalg.solve"):
        torch.solve(_t(), _t())
