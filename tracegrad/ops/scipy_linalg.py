"""``scipy.linalg`` on tracegrad values, with SciPy's signatures and
defaults: the one implementation behind ``tracegrad.scipy.linalg`` and
behind SciPy's own functions called on traced or recorded values.

Everything is a composition of rows: NumPy's linear algebra rows
(``tracegrad/ops/linalg.py``: solve, inv, det, cholesky, eigh, svd, qr) and the
SciPy-valued rows of ``tracegrad/ops/scipy_rows.py`` (``matrix_function`` for
expm / logm / sqrtm with Fréchet-derivative rules, ``sylvester``, ``lu_factor``).

Where LAPACK reads one triangle of a matrix (``cholesky``, ``eigh``, ``solve``
with ``assume_a='pos'``, ``solve_triangular``), the composition reads the same
triangle, so values and gradients are those of the function SciPy computes
(the other triangle gets no gradient).  Keywords that only tune memory or
checks (``overwrite_a``, ``check_finite``, ``lapack_driver``...) are accepted;
keywords that change the result and are not implemented raise an error.
"""
from __future__ import annotations

import numpy as np

from tracegrad.ops import linalg as _la
from tracegrad.ops import scipy_rows as _sr
from tracegrad.ops._define import _ops as _o
from tracegrad.ops.base import is_value

__all__ = []   # reached through tracegrad.scipy.linalg

_HARMLESS = {"overwrite_a", "overwrite_b", "check_finite", "lapack_driver", "lwork", "driver"}


def _kw(name, kwargs, **supported):
    """Refuse keywords that would change SciPy's result and are not implemented here."""
    for k, v in kwargs.items():
        if k in _HARMLESS:
            continue
        if k in supported and v == supported[k]:
            continue
        raise NotImplementedError(
            f"scipy.linalg.{name}({k}={v!r}) is not supported on tracegrad values; call it "
            f"without {k}= (or on plain arrays, outside the differentiated code)")


def _f(x):
    if is_value(x):
        return x if np.dtype(x.dtype).kind in "fc" else _o.astype(x, np.float64)
    x = np.asarray(x)
    return x if x.dtype.kind in "fc" else x.astype(np.float64)


def _mT(x):
    return _o.swapaxes(x, -1, -2)


def _shape(x):
    return tuple(_o.shape_of(x)) if is_value(x) else np.shape(x)


def _eye(n, like):
    return np.eye(n, dtype=np.result_type(like.dtype, np.float64)
                  if np.dtype(like.dtype).kind not in "fc" else like.dtype)


def _unit_diag(a):
    n = _shape(a)[-1]
    return _o.add(_o.sub(a, _o.multiply(a, np.eye(n))), np.eye(n))


def _tri(a, lower):
    return _la.tril(a) if lower else _la.triu(a)


def _triangle_sym(a, lower):
    return _la.symmetric_from_triangle(a, "L" if lower else "U")


# --- solving ------------------------------------------------------------------------------

def solve(a, b, lower=False, assume_a=None, transposed=False, **kwargs):
    """scipy.linalg.solve: a general, symmetric/positive definite (one triangle
    read), diagonal or triangular ``a``; ``transposed`` solves a^T x = b."""
    _kw("solve", kwargs)
    a, b = _f(a), _f(b)
    kind = (assume_a or "gen").lower()
    if kind in ("gen", "general"):
        m = a
    elif kind in ("sym", "her", "pos", "symmetric", "hermitian", "positive definite"):
        m = _triangle_sym(a, lower)
    elif kind in ("diagonal",):
        m = _o.multiply(a, np.eye(_shape(a)[-1]))
    elif kind in ("upper triangular", "lower triangular"):
        m = _tri(a, kind.startswith("lower"))
    else:
        raise NotImplementedError(f"scipy.linalg.solve(assume_a={assume_a!r}) is not "
                                  f"supported on tracegrad values")
    if transposed:
        m = _mT(m)
    return _la.solve(m, b)


def solve_triangular(a, b, trans=0, lower=False, unit_diagonal=False, **kwargs):
    """scipy.linalg.solve_triangular: only the ``lower``/upper triangle of a is read."""
    _kw("solve_triangular", kwargs)
    a, b = _f(a), _f(b)
    m = _tri(a, lower)
    if unit_diagonal:
        m = _unit_diag(m)
    if trans in (1, 2, "T", "C"):
        m = _mT(m)
    elif trans not in (0, "N"):
        raise ValueError(f"scipy.linalg.solve_triangular: invalid trans {trans!r}")
    return _la.solve(m, b)


def cholesky(a, lower=False, **kwargs):
    """scipy.linalg.cholesky: the upper factor U (a = U^T U) by default, the
    lower L (a = L L^T) with lower=True; only that triangle of a is read."""
    _kw("cholesky", kwargs)
    a = _f(a)
    low = _la.cholesky(_triangle_sym(a, lower))
    return low if lower else _mT(low)


def cho_factor(a, lower=False, **kwargs):
    """scipy.linalg.cho_factor: (c, lower), c holding the factor in its
    triangle and a's entries in the other (as LAPACK leaves them)."""
    _kw("cho_factor", kwargs)
    a = _f(a)
    fac = cholesky(a, lower=lower)
    rest = _la.triu(a, 1) if lower else _la.tril(a, -1)
    return _o.add(fac, rest), lower


def cho_solve(c_and_lower, b, **kwargs):
    """scipy.linalg.cho_solve: x with (L L^T) x = b, reading only the factor's triangle."""
    _kw("cho_solve", kwargs)
    c, lower = c_and_lower
    c, b = _f(c), _f(b)
    low = _la.tril(c) if lower else _mT(_la.triu(c))
    return _la.solve(_mT(low), _la.solve(low, b))


def _perm_of(piv):
    if is_value(piv):
        return _sr.lu_pivots_to_perm(piv)
    return _sr._lu_perm(np.asarray(piv))


def lu_factor(a, **kwargs):
    """scipy.linalg.lu_factor: (lu, piv), LAPACK's packed factors and pivots."""
    _kw("lu_factor", kwargs)
    lu, piv, _ = _sr.lu_factor(_f(a))
    return lu, piv


def _rows(x, idx):
    """x[idx] along the first (row) axis of a vector or a matrix."""
    if len(_shape(x)) == 1:
        return _o.take(x, idx, axis=0) if is_value(x) else x[np.asarray(idx)] \
            if not is_value(idx) else _o.take(x, idx, axis=0)
    return _sr.take_rows(x, idx) if is_value(idx) or is_value(x) else x[np.asarray(idx)]


def lu_solve(lu_and_piv, b, trans=0, **kwargs):
    """scipy.linalg.lu_solve: x with a x = b (trans=1 or 2: a^T x = b)."""
    _kw("lu_solve", kwargs)
    lu, piv = lu_and_piv
    lu, b = _f(lu), _f(b)
    perm = _perm_of(piv)
    L, U = _sr.unpack_lu(lu)
    if trans in (0, "N"):
        return _la.solve(U, _la.solve(L, _rows(b, perm)))
    if trans not in (1, 2, "T", "C"):
        raise ValueError(f"scipy.linalg.lu_solve: invalid trans {trans!r}")
    y = _la.solve(_mT(L), _la.solve(_mT(U), b))
    iperm = _sr.inverse_perm(perm) if is_value(perm) else np.argsort(perm)
    return _rows(y, iperm)


def lu(a, permute_l=False, p_indices=False, **kwargs):
    """scipy.linalg.lu of a square matrix: (P, L, U) with a = P L U, or (P L, U)
    with permute_l, or (perm, L, U) with p_indices."""
    _kw("lu", kwargs)
    a = _f(a)
    s = _shape(a)
    if len(s) != 2 or s[0] != s[1]:
        raise NotImplementedError(f"scipy.linalg.lu of a matrix of shape {s} is not supported "
                                  f"on tracegrad values (square matrices only)")
    lu_, _, perm = _sr.lu_factor(a)
    L, U = _sr.unpack_lu(lu_)
    n = s[0]
    if p_indices and not permute_l:
        return _sr.inverse_perm(perm), L, U
    P = _o.astype(_o.equal(np.arange(n)[:, None], _o.reshape(perm, (1, n))), L.dtype)
    if permute_l:
        return _o.matmul(P, L), U
    return P, L, U


def inv(a, assume_a=None, lower=False, **kwargs):
    _kw("inv", kwargs)
    a = _f(a)
    if assume_a in ("sym", "her", "pos", "pos upper", "pos lower"):
        a = _triangle_sym(a, lower if assume_a in ("sym", "her", "pos") else
                          assume_a == "pos lower")
    elif assume_a not in (None, "gen", "general"):
        raise NotImplementedError(f"scipy.linalg.inv(assume_a={assume_a!r}) is not supported "
                                  f"on tracegrad values")
    return _la.inv(a)


def det(a, **kwargs):
    _kw("det", kwargs)
    return _la.det(_f(a))


def pinv(a, atol=None, rtol=None, return_rank=False, **kwargs):
    """scipy.linalg.pinv: singular values <= atol + rtol * max(s) are dropped."""
    _kw("pinv", kwargs)
    if atol not in (None, 0, 0.0):
        raise NotImplementedError("scipy.linalg.pinv(atol=) is not supported on tracegrad "
                                  "values; use rtol=")
    a = _f(a)
    if rtol is None:
        rtol = max(_shape(a)[-2:]) * np.finfo(np.dtype(a.dtype)).eps
    out = _la.pinv(a, rcond=rtol)
    if return_rank:
        s = _la.svd(_o.stop_gradient(a), full_matrices=False, compute_uv=False)
        rank = _o.sum(_o.greater(s, _o.multiply(_o.amax(s), rtol)))
        return out, rank
    return out


def lstsq(a, b, cond=None, **kwargs):
    """scipy.linalg.lstsq: (x, residues, rank, s); residues as SciPy gives them
    (empty when a is not tall)."""
    _kw("lstsq", kwargs)
    a, b = _f(a), _f(b)
    x, res, rank, s = _la.lstsq(a, b, rcond=cond)
    if len(_shape(b)) == 1 and _shape(a)[0] > _shape(a)[1]:
        res = _o.reshape(res, ())
    return x, res, rank, s


def eigh(a, b=None, *, lower=True, eigvals_only=False, type=1, subset_by_index=None,
         **kwargs):
    """scipy.linalg.eigh: the ``lower`` (default) triangle of a is read; a
    positive definite b gives the generalized problem a v = w b v."""
    _kw("eigh", kwargs, subset_by_value=None)
    a = _triangle_sym(_f(a), lower)
    if b is not None:
        if type != 1:
            raise NotImplementedError("scipy.linalg.eigh(type=2 or 3) is not supported on "
                                      "tracegrad values")
        L = _la.cholesky(_triangle_sym(_f(b), lower))
        li = _la.inv(L)
        w, v = _la.eigh(_o.matmul(li, _o.matmul(a, _mT(li))))
        v = _o.matmul(_mT(li), v)
    else:
        w, v = _la.eigh(a)
    if subset_by_index is not None:
        lo, hi = (int(i) for i in subset_by_index)
        w, v = w[..., lo:hi + 1], v[..., lo:hi + 1]
    return w if eigvals_only else (w, v)


def eigvalsh(a, b=None, *, lower=True, **kwargs):
    return eigh(a, b, lower=lower, eigvals_only=True, **kwargs)


def svd(a, full_matrices=True, compute_uv=True, **kwargs):
    _kw("svd", kwargs)
    r = _la.svd(_f(a), full_matrices=full_matrices, compute_uv=compute_uv)
    return tuple(r) if compute_uv else r


def svdvals(a, **kwargs):
    _kw("svdvals", kwargs)
    return _la.svd(_f(a), full_matrices=False, compute_uv=False)


def qr(a, mode="full", pivoting=False, **kwargs):
    """scipy.linalg.qr: mode 'full' (square or wide a), 'economic', 'r' (a 1-tuple)."""
    _kw("qr", kwargs)
    if pivoting:
        raise NotImplementedError("scipy.linalg.qr(pivoting=True) is not supported on "
                                  "tracegrad values")
    a = _f(a)
    if mode == "r":
        return (_la.qr(a, mode="r"),)
    if mode == "full":
        return tuple(_la.qr(a, mode="complete"))
    if mode == "economic":
        return tuple(_la.qr(a))
    raise NotImplementedError(f"scipy.linalg.qr(mode={mode!r}) is not supported on tracegrad "
                              f"values")


def norm(a, ord=None, axis=None, keepdims=False, **kwargs):
    _kw("norm", kwargs)
    return _la.norm(_f(a), ord=ord, axis=axis, keepdims=keepdims)


# --- matrix functions ---------------------------------------------------------------------

def expm(A):
    """scipy.linalg.expm (batched); derivative: the Fréchet derivative."""
    return _sr.matrix_function("expm", _f(A))


def logm(A, disp=True):
    """scipy.linalg.logm (the principal logarithm; real for a real matrix with
    no eigenvalue on the closed negative real axis)."""
    if disp is not True and disp is not _sentinel(disp):
        raise NotImplementedError("scipy.linalg.logm(disp=False) is not supported on "
                                  "tracegrad values")
    return _sr.matrix_function("logm", _f(A))


def sqrtm(A, disp=True, blocksize=64):
    """scipy.linalg.sqrtm (the principal square root)."""
    if disp is not True and disp is not _sentinel(disp):
        raise NotImplementedError("scipy.linalg.sqrtm(disp=False) is not supported on "
                                  "tracegrad values")
    return _sr.matrix_function("sqrtm", _f(A))


def _sentinel(v):
    """SciPy 1.16+ marks the deprecated ``disp`` default with a private object."""
    return v if type(v) is object else True


def expm_frechet(A, E, method=None, compute_expm=True, **kwargs):
    """scipy.linalg.expm_frechet: (expm(A), L(A, E)), or L(A, E) alone."""
    _kw("expm_frechet", kwargs)
    fa, l_ = _sr.frechet("expm", _f(A), _f(E))
    return (fa, l_) if compute_expm else l_


def solve_sylvester(a, b, q):
    return _sr.sylvester(_f(a), _f(b), _f(q))


def solve_continuous_lyapunov(a, q):
    """X with a X + X a^T = q."""
    a = _f(a)
    return _sr.sylvester(a, _mT(a), _f(q))


# --- special matrices ---------------------------------------------------------------------

def block_diag(*arrs):
    """scipy.linalg.block_diag: the arrays (0-, 1- or 2-d) on the diagonal."""
    if not arrs:
        return np.empty((1, 0))
    mats = []
    for x in arrs:
        x = _f(x) if is_value(x) else np.atleast_2d(np.asarray(x))
        s = _shape(x)
        if len(s) < 2:
            x = _o.reshape(x, (1, -1) if len(s) == 1 else (1, 1))
        elif len(s) > 2:
            raise ValueError("scipy.linalg.block_diag: arguments must have 2 or fewer "
                             "dimensions")
        mats.append(x)
    rows = [_shape(m)[0] for m in mats]
    cols = [_shape(m)[1] for m in mats]
    total = sum(cols)
    dtype = np.result_type(*[np.dtype(m.dtype) for m in mats])
    out = []
    c0 = 0
    for m, r, c in zip(mats, rows, cols):
        parts = []
        if c0:
            parts.append(np.zeros((r, c0), dtype))
        parts.append(_o.astype(m, dtype) if is_value(m) else m.astype(dtype))
        if total - c0 - c:
            parts.append(np.zeros((r, total - c0 - c), dtype))
        out.append(_o.concatenate(parts, axis=1) if len(parts) > 1 else parts[0])
        c0 += c
    return _o.concatenate(out, axis=0)


def _ravel(x):
    x = _f(x)
    return _o.reshape(x, (-1,)) if is_value(x) else np.ravel(x)


def toeplitz(c, r=None):
    """scipy.linalg.toeplitz: first column c, first row r (default: c); T[i, j]
    = c[i - j] below the diagonal, r[j - i] above."""
    c = _ravel(c)
    r = c if r is None else _ravel(r)
    m, n = _shape(c)[0], _shape(r)[0]
    vals = _o.concatenate([c[::-1], r[1:]], axis=0)
    idx = (m - 1) - np.arange(m)[:, None] + np.arange(n)[None, :]
    return vals[idx]


def hankel(c, r=None):
    """scipy.linalg.hankel: H[i, j] = c[i + j] for i + j < len(c), else r[i + j - len(c) + 1]."""
    c = _ravel(c)
    m = _shape(c)[0]
    r = np.zeros_like(np.asarray(0.0), shape=(m,)) if r is None else _ravel(r)
    n = _shape(r)[0]
    vals = _o.concatenate([c, r[1:]], axis=0)
    return vals[np.arange(m)[:, None] + np.arange(n)[None, :]]


def circulant(c):
    """scipy.linalg.circulant: C[i, j] = c[(i - j) mod n]."""
    c = _ravel(c)
    n = _shape(c)[0]
    return c[(np.arange(n)[:, None] - np.arange(n)[None, :]) % n]


FUNCTIONS = {n: globals()[n] for n in (
    "solve", "solve_triangular", "cholesky", "cho_factor", "cho_solve", "lu_factor", "lu_solve",
    "lu", "inv", "det", "pinv", "lstsq", "eigh", "eigvalsh", "svd", "svdvals", "qr", "norm",
    "expm", "logm", "sqrtm", "expm_frechet", "solve_sylvester", "solve_continuous_lyapunov",
    "block_diag", "toeplitz", "hankel", "circulant")}
