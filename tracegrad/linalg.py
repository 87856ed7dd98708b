"""torch.linalg: ``import tracegrad as torch; torch.linalg.solve(A, B)``
with torch's names, signatures, defaults and named-tuple results.

The functions are the registry's linear-algebra ops (tracegrad.ops.linalg,
which also serves ``np.linalg`` code with NumPy's meaning); where torch's
meaning differs from NumPy's (``diagonal`` of the last two dimensions,
``vander`` in increasing powers, ``solve`` of a batch of vectors,
``lstsq``'s result, ``vector_norm(x, ord, dim)``), it is torch's here.  A
name torch.linalg has and tracegrad does not raises an AttributeError
that says so.
"""
from __future__ import annotations

import collections

import numpy as np

from tracegrad import ops
from tracegrad.ops import linalg as _la
from tracegrad.frontend import torch_surface as _ts

__all__ = ["cholesky", "cross", "det", "diagonal", "eigh", "eigvalsh", "inv", "lstsq",
           "matmul", "matrix_norm", "matrix_power", "multi_dot", "norm", "pinv", "qr",
           "slogdet", "solve", "solve_triangular", "svd", "svdvals", "vander", "vecdot",
           "vector_norm"]

_slogdet_t = collections.namedtuple("slogdet", ["sign", "logabsdet"])
_eigh_t = collections.namedtuple("eigh", ["eigenvalues", "eigenvectors"])
_qr_t = collections.namedtuple("qr", ["Q", "R"])
_svd_t = collections.namedtuple("svd", ["U", "S", "Vh"])


def _no_out(out, name):
    if out is not None:
        raise TypeError(f"torch.linalg.{name}(out=) cannot write into a tracegrad value; "
                        f"assign the result")


def _mT(x):
    return ops.swapaxes(x, -1, -2)


def cholesky(A, *, upper=False, out=None):
    """torch.linalg.cholesky: L with A = L L^H (U = L^H with upper=True)."""
    _no_out(out, "cholesky")
    L = _la.cholesky(A)
    return ops.conj(_mT(L)) if upper else L


def cross(input, other, *, dim=-1, out=None):
    """torch.linalg.cross: along ``dim`` (the last by default)."""
    _no_out(out, "cross")
    return _la.cross(input, other, axis=dim)


def det(A, *, out=None):
    _no_out(out, "det")
    return _la.det(A)


def diagonal(A, *, offset=0, dim1=-2, dim2=-1):
    """torch.linalg.diagonal: the diagonal of the last two dimensions."""
    return ops.diagonal(A, offset, dim1, dim2)


def eigh(A, UPLO="L", *, out=None):
    """torch.linalg.eigh: (eigenvalues, eigenvectors) of a Hermitian matrix."""
    _no_out(out, "eigh")
    w, v = _la.eigh(A, UPLO)
    return _eigh_t(w, v)


def eigvalsh(A, UPLO="L", *, out=None):
    """torch.linalg.eigvalsh: the eigenvalues of a Hermitian matrix, ascending."""
    _no_out(out, "eigvalsh")
    return eigh(A, UPLO).eigenvalues


def inv(A, *, out=None):
    _no_out(out, "inv")
    return _la.inv(A)


def lstsq(A, B, rcond=None, *, driver=None):
    """torch.linalg.lstsq: (solution, residuals, rank, singular_values)."""
    return _ts.lstsq(A, B, rcond, driver=driver)


def matmul(input, other, *, out=None):
    _no_out(out, "matmul")
    return ops.matmul(input, other)


def vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None, out=None):
    """torch.linalg.vector_norm(x, ord=2, dim=None, keepdim=False): every
    element when dim is None."""
    _no_out(out, "vector_norm")
    if dtype is not None:
        x = ops.astype(x, _ts.resolve_dtype(dtype))
    if dim is None:
        x, dim = ops.reshape(x, (-1,)), 0
    return _la.vector_norm(x, axis=dim, keepdims=keepdim, ord=ord)


def matrix_norm(A, ord="fro", dim=(-2, -1), keepdim=False, *, dtype=None, out=None):
    """torch.linalg.matrix_norm(A, ord='fro', dim=(-2, -1), keepdim=False)."""
    _no_out(out, "matrix_norm")
    if dtype is not None:
        A = ops.astype(A, _ts.resolve_dtype(dtype))
    d = tuple(dim)
    nd = len(A.shape)
    d = tuple(k % nd for k in d)
    moved = ops.moveaxis(A, d, (nd - 2, nd - 1))
    res = _la.matrix_norm(moved, ord=ord)
    if keepdim:
        res = ops.expand_dims(ops.expand_dims(res, min(d)), max(d))
    return res


def norm(A, ord=None, dim=None, keepdim=False, *, dtype=None, out=None):
    """torch.linalg.norm: a vector norm (1-D or dim an int) or a matrix norm
    (2-D or dim a pair); the 2-norm of everything when ord and dim are None."""
    _no_out(out, "norm")
    if dim is None and ord is None:
        return vector_norm(A, 2, None, keepdim, dtype=dtype)
    if isinstance(dim, int) or (dim is None and len(A.shape) == 1):
        return vector_norm(A, 2 if ord is None else ord, dim, keepdim, dtype=dtype)
    return matrix_norm(A, "fro" if ord is None else ord, (-2, -1) if dim is None else dim,
                       keepdim, dtype=dtype)


def matrix_power(A, n, *, out=None):
    _no_out(out, "matrix_power")
    return _la.matrix_power(A, n)


def multi_dot(tensors, *, out=None):
    """torch.linalg.multi_dot: the product of the matrices in order (the
    first and last may be vectors)."""
    _no_out(out, "multi_dot")
    ts = list(tensors)
    if len(ts) < 2:
        raise RuntimeError("multi_dot(): expected at least 2 tensors but got " + str(len(ts)))
    res = ts[0]
    for t in ts[1:]:
        res = ops.matmul(res, t)
    return res


def pinv(A, *, atol=None, rtol=None, hermitian=False, out=None):
    """torch.linalg.pinv(A, *, atol=None, rtol=None, hermitian=False)."""
    _no_out(out, "pinv")
    if atol is not None:
        raise NotImplementedError("torch.linalg.pinv(atol=) is not provided by tracegrad; "
                                  "pass rtol=")
    return _la.pinv(A, rtol=rtol, hermitian=hermitian) if rtol is not None else \
        _la.pinv(A, hermitian=hermitian)


def qr(A, mode="reduced", *, out=None):
    """torch.linalg.qr: (Q, R)."""
    _no_out(out, "qr")
    if mode == "r":          # torch: an empty Q
        return _qr_t(ops.astype(np.zeros((0,)), A.dtype), _la.qr(A, "r"))
    q, r = _la.qr(A, mode)
    return _qr_t(q, r)


def slogdet(A, *, out=None):
    """torch.linalg.slogdet: (sign, logabsdet)."""
    _no_out(out, "slogdet")
    s, l = _la.slogdet(A)
    return _slogdet_t(s, l)


def solve(A, B, *, left=True, out=None):
    """torch.linalg.solve, with torch's rule for a batch of vectors."""
    return _ts.solve(A, B, left=left, out=out)


def solve_triangular(A, B, *, upper, left=True, unitriangular=False, out=None):
    """torch.linalg.solve_triangular: X with A X = B (X A = B when not
    left), A's upper (or lower) triangle read, its diagonal taken as ones
    when unitriangular."""
    _no_out(out, "solve_triangular")
    T = ops.triu(A) if upper else ops.tril(A)
    if unitriangular:
        n = A.shape[-1]
        T = T - ops.triu(ops.tril(T)) + np.eye(n, dtype=A.dtype)
    if not left:
        return _mT(_la.solve(_mT(T), _mT(B)))
    return _la.solve(T, B)


def svd(A, full_matrices=True, *, driver=None, out=None):
    """torch.linalg.svd: (U, S, Vh)."""
    _no_out(out, "svd")
    u, s, vh = _la.svd(A, full_matrices=full_matrices)
    return _svd_t(u, s, vh)


def svdvals(A, *, driver=None, out=None):
    """torch.linalg.svdvals: the singular values, descending."""
    _no_out(out, "svdvals")
    return _la.svd(A, full_matrices=False)[1]


def vander(x, N=None):
    """torch.linalg.vander: powers x^0, x^1, ..., x^(N-1) (increasing, the
    opposite of np.vander) along a new last dimension."""
    n = x.shape[-1] if N is None else int(N)
    if n <= 1:
        if n < 1:
            raise RuntimeError("N must be greater than 1.")
        return ops.expand_dims(ops.ones_like(x) if hasattr(ops, "ones_like") else x ** 0, -1)
    powers = [x ** 0] + [x] + [x ** k for k in range(2, n)]
    return ops.stack([ops.astype(p, x.dtype) for p in powers], -1)


def vecdot(x, y, *, dim=-1, out=None):
    """torch.linalg.vecdot: sum(conj(x) * y) along ``dim``."""
    _no_out(out, "vecdot")
    return ops.sum(ops.conj(x) * y, axis=dim)


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    raise AttributeError(f"tracegrad does not provide torch.linalg.{name} (module "
                         f"'tracegrad.linalg' has no attribute {name!r})")
