"""Linear algebra: products, contractions and np.linalg.

Rows: einsum, inv, solve, det, slogdet, cholesky, eigh, svd, qr (matmul lives
in base).  dot, vdot, inner, outer, tensordot, kron, cross, trace, diagonal,
diag, triu, tril, norm, pinv, lstsq and matrix_power are compositions, so their
gradients come from the rows they use.  The matrix rules follow the standard
results (Giles 2008 for inv/det/solve, Murray 2016 for cholesky, Townsend
2016 for svd, Walter & Lehmann 2018 and Liao et al. 2019 for qr); rules for
eigh and svd are exact for distinct eigen/singular
values and, like torch's, infinite where two coincide.
"""
from __future__ import annotations

import builtins as _builtins
import collections
import string

import numpy as np

from tracegrad.ops.primitives import Aval, bind, register, broadcast_shapes, result_dtype
from tracegrad.ops._define import method, implements, norm_axes, _ops, refuse_out
from tracegrad.ops.base import (add, sub, mul, neg, matmul, swapaxes, reshape, transpose,
                                sum, where, equal, stop_gradient, astype,
                                is_value, shape_of, shape_by_eval, _reduced_shape, zeros_like_p)
from tracegrad.ops.elementwise import abs, sqrt, reciprocal, square
from tracegrad.ops.reductions import amax, amin
from tracegrad.ops.shape import moveaxis, expand_dims, ravel, stack
from tracegrad.ops.indexing import getitem, index_add

__all__ = ["einsum", "inv", "inverse", "solve", "det", "slogdet", "cholesky", "eigh", "svd", "qr",
           "lstsq",
           "pinv", "norm", "matrix_power", "dot", "vdot", "inner", "outer", "tensordot", "kron",
           "cross", "trace", "diagonal", "diag", "triu", "tril", "bmm", "mv", "addmm"]


def _mT(x):
    return swapaxes(x, -1, -2)


def _diag_embed(v):
    """(..., k) -> (..., k, k) with v on the diagonal."""
    k = shape_of(v)[-1]
    return mul(expand_dims(v, -1), np.eye(k, dtype=v.dtype))


def _diag_part(x):
    return diagonal(x, 0, -2, -1)


def _gap_inverse(w):
    """F[..., i, j] = 1 / (w_j - w_i) off the diagonal, 0 on it."""
    k = shape_of(w)[-1]
    eye = np.eye(k, dtype=bool)
    gap = sub(expand_dims(w, -2), expand_dims(w, -1))
    return where(eye, 0.0, reciprocal(where(eye, 1.0, gap)))


def _square_check(name, x):
    s = shape_of(x)
    if len(s) < 2 or s[-1] != s[-2]:
        raise np.linalg.LinAlgError(
            f"{name}: expected a square matrix (or a stack of them) in the last two "
            f"dimensions, got shape {list(s)}")


def _float_dtype(*avals):
    dt = result_dtype(*avals)
    return dt if dt.kind in "fc" else np.dtype(np.float64)


# --- einsum -----------------------------------------------------------------------------------

def _einsum_parts(subscripts):
    lhs, rhs = subscripts.split("->")
    return lhs.split(","), rhs


def _einsum_vjp(g, out, *xs, subscripts):
    ins, rhs = _einsum_parts(subscripts)
    used = set(subscripts) - set(",->")
    cts = []
    for i, s_i in enumerate(ins):
        others = [s for j, s in enumerate(ins) if j != i]
        other_ops = [x for j, x in enumerate(xs) if j != i]
        avail = set(rhs).union(*others)
        uniq = list(dict.fromkeys(s_i))
        present = "".join(c for c in uniq if c in avail)
        r = einsum(",".join([rhs] + others) + "->" + present, g, *other_ops)
        if present == s_i:
            cts.append(r)
            continue
        # letters repeated in s_i (a diagonal) get a fresh letter tied by an
        # identity; letters summed only inside x_i broadcast back by ones
        fresh = (c for c in string.ascii_letters if c not in used)
        terms, operands, out_letters, seen = [present], [r], [], set()
        size = dict(zip(s_i, xs[i].shape))
        for pos, c in enumerate(s_i):
            if c in seen:
                f = next(fresh)
                out_letters.append(f)
                terms.append(c + f)
                operands.append(np.eye(xs[i].shape[pos], dtype=g.dtype))
            else:
                seen.add(c)
                out_letters.append(c)
        for c in uniq:
            if c not in avail:
                terms.append(c)
                operands.append(np.ones(size[c], dtype=g.dtype))
        cts.append(einsum(",".join(terms) + "->" + "".join(out_letters), *operands))
    return tuple(cts)


def _einsum_jvp(ts, out, *xs, subscripts):
    total = None
    for i, t in enumerate(ts):
        if t is None:
            continue
        ops = list(xs)
        ops[i] = t
        c = einsum(subscripts, *ops)  # multilinear: one term per operand
        total = c if total is None else add(total, c)
    return total


def _einsum_impl(xp, *xs, subscripts):
    r = xp.einsum(subscripts, *xs)
    # One operand: NumPy may return a view of it ('ab->ba', 'ii->i'); an
    # eager result owns its memory (in-place ops on it must not reach x).
    if len(xs) == 1 and xp.may_share_memory(r, xs[0]):
        r = r.copy()
    return r


# may_view: the emitted np.einsum of one operand can be a view of it, so
# the buffer planner keeps that operand's memory alive.
einsum_p = register(
    "einsum", _einsum_impl,
    shape=shape_by_eval(lambda xp, *xs, subscripts: xp.einsum(subscripts, *xs)),
    vjp=_einsum_vjp, jvp=_einsum_jvp, may_view=True,
    numpy=lambda names, subscripts: f"np.einsum({subscripts!r}, {', '.join(names)})")


def _normalize_einsum(subscripts, shapes):
    """Explicit form without '...': 'ij,jk' -> 'ij,jk->ik'."""
    s = subscripts.replace(" ", "")
    lhs, rhs = s.split("->") if "->" in s else (s, None)
    ins = lhs.split(",")
    if len(ins) != len(shapes):
        raise ValueError(f"einsum: the subscripts {subscripts!r} name {len(ins)} operands but "
                         f"{len(shapes)} were given")
    used = {c for c in s if c.isalpha()}
    free = (c for c in string.ascii_letters if c not in used)
    n_ell = _builtins.max([len(sh) - (len(t) - 3) for t, sh in zip(ins, shapes) if "..." in t],
                          default=0)
    ell = "".join(next(free) for _ in range(n_ell))
    new_ins = []
    for t, sh in zip(ins, shapes):
        if "..." in t:
            k = len(sh) - (len(t) - 3)
            t = t.replace("...", ell[n_ell - k:])
        if len(t) != len(sh):
            raise ValueError(f"einsum: operand subscripts {t!r} do not match an operand of "
                             f"shape {list(sh)}")
        new_ins.append(t)
    if rhs is None:
        counts = collections.Counter("".join(new_ins))
        rhs = ell + "".join(sorted(c for c, n in counts.items() if n == 1 and c not in ell))
    else:
        rhs = rhs.replace("...", ell)
    return ",".join(new_ins) + "->" + rhs


@implements(np.einsum)
def einsum(subscripts, *operands, out=None, optimize=False, **kw):
    """Einstein summation (string subscripts, '...' allowed)."""
    if not isinstance(subscripts, str):
        raise TypeError("einsum: pass the subscripts as a string, e.g. einsum('ij,jk->ik', a, b)")
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])  # torch.einsum(eq, [a, b])
    ops = [x if is_value(x) or isinstance(x, np.ndarray) else np.asarray(x) for x in operands]
    refuse_out("einsum", out)
    dtype, casting = kw.pop("dtype", None), kw.pop("casting", "safe")
    kw.pop("order", None)   # the memory layout of the result, not its values
    if kw:
        raise TypeError(f"einsum() got an unexpected keyword argument {next(iter(kw))!r}")
    if dtype is not None:   # NumPy's: every operand cast to dtype under the casting rule
        dtype = np.dtype(dtype)
        for i, x in enumerate(ops):
            if not np.can_cast(np.dtype(x.dtype), dtype, casting):
                raise TypeError(f"Iterator operand {i} dtype could not be cast from "
                                f"dtype({str(np.dtype(x.dtype))!r}) to dtype({str(dtype)!r}) "
                                f"according to the rule {casting!r}")
        ops = [x if np.dtype(x.dtype) == dtype else astype(x, dtype) for x in ops]
    spec = _normalize_einsum(subscripts, [shape_of(x) for x in ops])
    return bind(einsum_p, *ops, subscripts=spec)


# --- inverse, solve, determinants ---------------------------------------------------------------

inv_p = register(
    "inv", lambda xp, a: xp.linalg.inv(a),
    shape=lambda a: Aval(a.shape, _float_dtype(a)),
    # d(A^-1) = -A^-1 dA A^-1
    vjp=(lambda g, out, a: neg(matmul(_mT(out), matmul(g, _mT(out)))),),
    jvp=(lambda t, out, a: neg(matmul(out, matmul(t, out))),),
    numpy="np.linalg.inv({0})", save_out=True, save_inputs=False)


def _solve_shape(a, b):
    if len(b.shape) == 1:
        return Aval(broadcast_shapes(a.shape[:-2]) + (a.shape[-1],), _float_dtype(a, b))
    return Aval(broadcast_shapes(a.shape[:-2], b.shape[:-2]) + tuple(b.shape[-2:]),
                _float_dtype(a, b))


def _as_mat(x, vector):
    return expand_dims(x, -1) if vector else x


def _solve_vjp_b(g, out, a, b):
    vec = len(b.shape) == 1
    gb = bind(solve_p, _mT(a), _as_mat(g, vec))
    return gb[..., 0] if vec else gb


def _solve_vjp_a(g, out, a, b):
    # dA = -A^-T g x^T
    vec = len(b.shape) == 1
    gb = bind(solve_p, _mT(a), _as_mat(g, vec))
    return neg(matmul(gb, _mT(_as_mat(out, vec))))


def _solve_jvp_a(t, out, a, b):
    vec = len(b.shape) == 1
    r = neg(bind(solve_p, a, matmul(t, _as_mat(out, vec))))
    return r[..., 0] if vec else r


solve_p = register(
    "solve", lambda xp, a, b: xp.linalg.solve(a, b), shape=_solve_shape,
    vjp=(_solve_vjp_a, _solve_vjp_b),
    jvp=(_solve_jvp_a, lambda t, out, a, b: bind(solve_p, a, t)),
    numpy="np.linalg.solve({0}, {1})", save_out=True)


def _inv_T(a):
    return _mT(inv(a))


det_p = register(
    "det", lambda xp, a: xp.linalg.det(a),
    shape=lambda a: Aval(a.shape[:-2], _float_dtype(a)),
    # d det = det * tr(A^-1 dA)
    vjp=(lambda g, out, a: mul(expand_dims(mul(g, out), (-1, -2)), _inv_T(a)),),
    jvp=(lambda t, out, a: mul(out, sum(mul(_inv_T(a), t), axis=(-2, -1))),),
    numpy="np.linalg.det({0})", save_out=True)


def _slogdet_vjp(g, out, a):
    gsign, glog = g  # the sign is piecewise constant: no gradient
    if glog is None:
        return (None,)
    return (mul(expand_dims(glog, (-1, -2)), _inv_T(a)),)


slogdet_p = register(
    "slogdet", lambda xp, a: tuple(xp.linalg.slogdet(a)),
    shape=lambda a: (Aval(a.shape[:-2], _float_dtype(a)), Aval(a.shape[:-2], _float_dtype(a))),
    n_out=2, vjp=_slogdet_vjp,
    jvp=lambda ts, out, a: (None, sum(mul(_inv_T(a), ts[0]), axis=(-2, -1))),
    numpy="tuple(np.linalg.slogdet({0}))")


# --- factorizations -------------------------------------------------------------------------------

def _phi(x):
    """Lower triangle with the diagonal halved."""
    n = shape_of(x)[-1]
    return mul(x, np.tril(np.ones((n, n)), -1) + 0.5 * np.eye(n))


def _sym(x):
    return mul(add(x, _mT(x)), 0.5)


def _cholesky_vjp(g, out, a):
    # Murray (2016): A_bar = L^-T Phi(L^T L_bar) L^-1, symmetrised
    linv = inv(out)
    return _sym(matmul(_mT(linv), matmul(_phi(matmul(_mT(out), g)), linv)))


def _cholesky_jvp(t, out, a):
    linv = inv(out)
    return matmul(out, _phi(matmul(linv, matmul(t, _mT(linv)))))


cholesky_p = register(
    "cholesky", lambda xp, a: xp.linalg.cholesky(a),
    shape=lambda a: Aval(a.shape, _float_dtype(a)),
    vjp=(_cholesky_vjp,), jvp=(_cholesky_jvp,),
    numpy="np.linalg.cholesky({0})", save_out=True, save_inputs=False)


def _eigh_vjp(g, out, a):
    # A_bar = V (diag(w_bar) + F * (V^T V_bar)) V^T
    gw, gv = g
    w, v = out
    inner = None
    if gw is not None:
        inner = _diag_embed(gw)
    if gv is not None:
        term = mul(_gap_inverse(w), matmul(_mT(v), gv))
        inner = term if inner is None else add(inner, term)
    if inner is None:
        return (None,)
    return (matmul(v, matmul(inner, _mT(v))),)


def _eigh_jvp(ts, out, a):
    w, v = out
    p = matmul(_mT(v), matmul(ts[0], v))
    return _diag_part(p), matmul(v, mul(_gap_inverse(w), p))


eigh_p = register(
    "eigh", lambda xp, a: tuple(xp.linalg.eigh(a)),
    shape=lambda a: (Aval(a.shape[:-1], _float_dtype(a)), Aval(a.shape, _float_dtype(a))),
    n_out=2, vjp=_eigh_vjp, jvp=_eigh_jvp,
    numpy="tuple(np.linalg.eigh({0}))", save_out=True, save_inputs=False)


def _svd_vjp(g, out, a):
    gu, gs, gvh = g
    u, s, vh = out
    v = _mT(vh)
    f = _gap_inverse(square(s))
    sinv = reciprocal(s)
    smat = _diag_embed(s)
    inner = None if gs is None else _diag_embed(gs)
    extra = None
    if gu is not None:
        utgu = matmul(_mT(u), gu)
        j = matmul(mul(f, sub(utgu, _mT(utgu))), smat)
        inner = j if inner is None else add(inner, j)
        # (I - U U^T) U_bar S^-1 V^T
        extra = matmul(mul(sub(gu, matmul(u, utgu)), expand_dims(sinv, -2)), vh)
    if gvh is not None:
        gv = _mT(gvh)
        vtgv = matmul(vh, gv)
        k = matmul(smat, mul(f, sub(vtgv, _mT(vtgv))))
        inner = k if inner is None else add(inner, k)
        # U S^-1 V_bar^T (I - V V^T)
        e = matmul(u, mul(expand_dims(sinv, -1), _mT(sub(gv, matmul(v, vtgv)))))
        extra = e if extra is None else add(extra, e)
    total = None if inner is None else matmul(u, matmul(inner, vh))
    if extra is not None:
        total = extra if total is None else add(total, extra)
    return (total,)


def _svd_jvp(ts, out, a):
    t = ts[0]
    u, s, vh = out
    v = _mT(vh)
    f = _gap_inverse(square(s))
    sinv = reciprocal(s)
    smat = _diag_embed(s)
    p = matmul(_mT(u), matmul(t, v))
    ds = _diag_part(p)
    du = add(matmul(u, mul(f, add(matmul(p, smat), matmul(smat, _mT(p))))),
             mul(sub(matmul(t, v), matmul(u, p)), expand_dims(sinv, -2)))
    dv = add(matmul(v, mul(f, add(matmul(smat, p), matmul(_mT(p), smat)))),
             mul(sub(matmul(_mT(t), u), matmul(v, _mT(p))), expand_dims(sinv, -2)))
    return du, ds, _mT(dv)


def _svd_shape(a):
    m, n = a.shape[-2:]
    k = _builtins.min(m, n)
    b, dt = tuple(a.shape[:-2]), _float_dtype(a)
    return Aval(b + (m, k), dt), Aval(b + (k,), dt), Aval(b + (k, n), dt)


svd_p = register(
    "svd", lambda xp, a: tuple(xp.linalg.svd(a, full_matrices=False)), shape=_svd_shape,
    n_out=3, vjp=_svd_vjp, jvp=_svd_jvp,
    numpy="tuple(np.linalg.svd({0}, full_matrices=False))", save_out=True, save_inputs=False)


def _tril_mask(n, k):
    return np.tril(np.ones((n, n)), k)


def _qr_tall_vjp(gq, gr, q, r):
    """A = QR with A m x n, m >= n.  A_bar = (Q_bar + Q copyltu(M)) R^-T with
    M = R R_bar^T - Q_bar^T Q, copyltu mirroring M's lower triangle upwards."""
    n = shape_of(r)[-1]
    m = None
    if gr is not None:
        m = matmul(r, _mT(gr))
    if gq is not None:
        qtq = matmul(_mT(gq), q)
        m = neg(qtq) if m is None else sub(m, qtq)
    low = mul(m, _tril_mask(n, -1))
    sym = add(add(low, _mT(low)), mul(m, np.eye(n)))
    b = matmul(q, sym)
    if gq is not None:
        b = add(gq, b)
    # b R^-T, as the solve R X = b^T, transposed
    return _mT(bind(solve_p, r, _mT(b)))


def _qr_vjp(g, out, a):
    gq, gr = g
    q, r = out
    m, n = shape_of(a)[-2:]
    if gq is None and gr is None:
        return (None,)
    if m >= n:
        return (_qr_tall_vjp(gq, gr, q, r),)
    # wide: A = [X | Y], R = [U | V] with X = QU square and V = Q^T Y, so Y's
    # gradient is Q V_bar and Q gets Y V_bar^T more (Liao et al. 2019)
    y = a[..., :, m:]
    gu = None if gr is None else gr[..., :, :m]
    gv = None if gr is None else gr[..., :, m:]
    if gv is not None:
        extra = matmul(y, _mT(gv))
        gq = extra if gq is None else add(gq, extra)
    gx = _qr_tall_vjp(gq, gu, q, r[..., :, :m])
    gy = matmul(q, gv) if gv is not None else mul(y, 0.0)
    return (_ops.concatenate([gx, gy], axis=-1),)


def _qr_tall_jvp(t, q, r):
    n = shape_of(r)[-1]
    dx_rinv = matmul(t, inv(r))
    qt_dx_rinv = matmul(_mT(q), dx_rinv)
    low = mul(qt_dx_rinv, _tril_mask(n, -1))
    skew = sub(low, _mT(low))
    dq = add(matmul(q, sub(skew, qt_dx_rinv)), dx_rinv)
    dr = matmul(sub(qt_dx_rinv, skew), r)
    return dq, dr


def _qr_jvp(ts, out, a):
    t = ts[0]
    q, r = out
    m, n = shape_of(a)[-2:]
    if m >= n:
        return _qr_tall_jvp(t, q, r)
    dq, du = _qr_tall_jvp(t[..., :, :m], q, r[..., :, :m])
    dv = add(matmul(_mT(dq), a[..., :, m:]), matmul(_mT(q), t[..., :, m:]))
    return dq, _ops.concatenate([du, dv], axis=-1)


def _qr_shape(a):
    m, n = a.shape[-2:]
    k = _builtins.min(m, n)
    b, dt = tuple(a.shape[:-2]), _float_dtype(a)
    return Aval(b + (m, k), dt), Aval(b + (k, n), dt)


qr_p = register(
    "qr", lambda xp, a: tuple(xp.linalg.qr(a)), shape=_qr_shape, n_out=2,
    vjp=_qr_vjp, jvp=_qr_jvp, numpy="tuple(np.linalg.qr({0}))", save_out=True)


# --- np.linalg functions ------------------------------------------------------------------------

def _real_only(name, a):
    """The factorizations' rules are those of real matrices (a complex one
    needs conjugate transposes): a complex matrix is refused, never given a
    wrong gradient."""
    if np.dtype(getattr(a, "dtype", np.float64)).kind == "c":
        raise TypeError(f"np.linalg.{name} of a complex matrix is not supported by tracegrad "
                        f"(its rules are for real matrices); np.linalg.inv, solve and det "
                        f"take complex matrices")


def _result(name, parts):
    """NumPy 2's named tuple of that name (EighResult, SVDResult...), which
    unpacks as the plain tuple; a plain tuple where this NumPy has none."""
    cls = getattr(getattr(np.linalg, "_linalg", None), name, None)
    return cls(*parts) if cls is not None else tuple(parts)


@method("inverse")
@implements(np.linalg.inv)
def inv(a):
    """Matrix inverse (batched over leading dimensions)."""
    _square_check("inv", a)
    return bind(inv_p, a)


inverse = inv


@implements(np.linalg.solve)
def solve(a, b):
    """x with a @ x = b (b a vector when 1-D, else a stack of matrices)."""
    _square_check("solve", a)
    sa, sb = shape_of(a), shape_of(b)
    rows = sb[0] if len(sb) == 1 else sb[-2] if len(sb) >= 2 else None
    if rows != sa[-1]:
        raise ValueError(f"solve: a of shape {list(sa)} cannot solve for b of shape {list(sb)} "
                         f"(b needs {sa[-1]} rows)")
    return bind(solve_p, a, b)


@method("det")
@implements(np.linalg.det)
def det(a):
    _square_check("det", a)
    return bind(det_p, a)


@method("slogdet")
@implements(np.linalg.slogdet)
def slogdet(a):
    """(sign, log|det|); only log|det| carries a gradient."""
    _square_check("slogdet", a)
    _real_only("slogdet", a)
    return _result("SlogdetResult", bind(slogdet_p, a))


@method("cholesky")
@implements(np.linalg.cholesky)
def cholesky(a, upper=False):
    """Lower Cholesky factor L with a = L L^T (the gradient is symmetric)."""
    _square_check("cholesky", a)
    _real_only("cholesky", a)
    low = bind(cholesky_p, a)
    return _mT(low) if upper else low


@implements(np.linalg.eigh)
def eigh(a, UPLO="L"):
    """Eigenvalues (ascending) and eigenvectors of a symmetric matrix."""
    _square_check("eigh", a)
    _real_only("eigh", a)
    if UPLO != "L":
        raise NotImplementedError("eigh: only UPLO='L' (the NumPy default) is supported")
    return _result("EighResult", bind(eigh_p, a))


def symmetric_from_triangle(a, UPLO="L"):
    """The symmetric matrix LAPACK's eigh sees when it reads only the lower
    (UPLO='L') or upper ('U') triangle of ``a``: NumPy's eigh/eigvalsh are
    functions of that triangle alone, and so is their gradient through this
    (the other triangle gets none; an off-diagonal entry counts twice)."""
    if UPLO not in ("L", "U"):
        raise ValueError("UPLO argument must be 'L' or 'U'")
    if UPLO == "L":
        return add(tril(a), _mT(tril(a, -1)))
    return add(triu(a), _mT(triu(a, 1)))


@implements(np.linalg.svd)
def svd(a, full_matrices=True, compute_uv=True, hermitian=False):
    """Thin SVD (U, S, Vh).  full_matrices=True is not supported (its extra
    columns have no gradient); pass full_matrices=False."""
    _real_only("svd", a)
    if len(shape_of(a)) < 2:
        raise np.linalg.LinAlgError(f"svd: expected a matrix, got shape {list(shape_of(a))}")
    if full_matrices and compute_uv and _builtins.min(shape_of(a)[-2:]) != _builtins.max(shape_of(a)[-2:]):
        raise NotImplementedError("svd(full_matrices=True) of a non-square matrix is not "
                                  "supported by tracegrad; pass full_matrices=False")
    u, s, vh = bind(svd_p, a)
    return _result("SVDResult", (u, s, vh)) if compute_uv else s


@method("qr")
@implements(np.linalg.qr)
def qr(a, mode="reduced"):
    """Reduced QR: (Q, R) with Q's columns orthonormal and R upper
    triangular (R alone for mode="r").  The gradient is defined where A has
    full rank, for tall, square and wide matrices."""
    _real_only("qr", a)
    if len(shape_of(a)) < 2:
        raise np.linalg.LinAlgError(f"qr: expected a matrix, got shape {list(shape_of(a))}")
    m, n = shape_of(a)[-2:]
    if mode == "complete" and m > n:
        raise NotImplementedError("qr(mode='complete') of a tall matrix is not supported by "
                                  "tracegrad (its extra columns of Q have no gradient); use "
                                  "mode='reduced'")
    if mode not in ("reduced", "complete", "r"):
        raise NotImplementedError(f"qr: mode={mode!r} is not supported; use 'reduced' or 'r'")
    q, r = bind(qr_p, a)
    return r if mode == "r" else _result("QRResult", (q, r))


@implements(np.linalg.lstsq)
def lstsq(a, b, rcond=None):
    """Least squares as NumPy returns it: (x, residuals, rank, s), with x =
    pinv(a) @ b (the minimum-norm solution, so rank-deficient a is fine) and
    its gradient through the SVD.  residuals, the squared norm of each
    column of a @ x - b, is given whenever a is tall (NumPy leaves it empty
    when a is rank-deficient); rank is not differentiable."""
    _real_only("lstsq", a)
    sa, sb = shape_of(a), shape_of(b)
    if len(sa) != 2 or len(sb) not in (1, 2) or sb[0] != sa[0]:
        raise np.linalg.LinAlgError(
            f"lstsq: a must be a matrix and b a vector or matrix with as many rows; got "
            f"a of shape {list(sa)} and b of shape {list(sb)}")
    m, n = sa
    if rcond is None:
        rcond = np.finfo(_float_dtype(Aval(sa, a.dtype))).eps * _builtins.max(m, n)
    x = matmul(pinv(a, rcond), b)
    s = bind(svd_p, a)[1]
    rank = astype(sum(_ops.greater(stop_gradient(s), stop_gradient(mul(amax(s), rcond)))),
                  np.int32)   # LAPACK's integer, as NumPy returns it
    if m > n:
        residuals = sum(square(sub(matmul(a, x), b)), axis=0)
        if len(sb) == 1:
            residuals = reshape(residuals, (1,))
    else:
        residuals = bind(zeros_like_p, s[:0])  # empty, as NumPy gives it
    return x, residuals, rank, s


@implements(np.linalg.pinv)
def pinv(a, rcond=None, hermitian=False, *, rtol=None):
    """Moore-Penrose pseudo-inverse through the SVD; singular values below
    rcond * largest are treated as zero."""
    _real_only("pinv", a)
    sh = shape_of(a)
    if hermitian and (len(sh) < 2 or sh[-1] != sh[-2]):
        raise np.linalg.LinAlgError("Last 2 dimensions of the array must be square")
    if rcond is None and rtol is None:
        rcond = _builtins.max(sh[-2:]) * np.finfo(_float_dtype(Aval(sh, a.dtype))).eps
    rcond = rtol if rcond is None else rcond
    u, s, vh = bind(svd_p, a)
    cutoff = stop_gradient(mul(amax(s, axis=-1, keepdims=True), rcond))
    keep = _ops.greater(stop_gradient(s), cutoff)
    sinv = where(keep, reciprocal(where(keep, s, 1.0)), 0.0)
    return matmul(_mT(vh), mul(expand_dims(sinv, -1), _mT(u)))


method("pinverse")(lambda a, rcond=1e-15: pinv(a, rcond))


@method("matrix_power")
@implements(np.linalg.matrix_power)
def matrix_power(a, n):
    """a @ a @ ... (n times) by repeated squaring; n < 0 uses the inverse."""
    _square_check("matrix_power", a)
    n = int(n)
    if n == 0:
        k = shape_of(a)[-1]
        return add(mul(a, 0.0), np.eye(k, dtype=a.dtype))
    if n < 0:
        a, n = inv(a), -n
    result, base = None, a
    while n:
        if n & 1:
            result = base if result is None else matmul(result, base)
        n >>= 1
        if n:
            base = matmul(base, base)
    return result


def _safe_sqrt(s):
    """sqrt with a zero (not NaN) gradient at 0, so norm(0) has gradient 0 as in torch."""
    zero = equal(s, 0)
    return where(zero, 0.0, sqrt(where(zero, 1.0, s)))


def _vector_norm(x, ord, axes, keepdims):
    if ord is None or ord == 2:
        r = _safe_sqrt(sum(square(x), axis=axes, keepdims=True))
    elif ord == np.inf:
        r = amax(abs(x), axis=axes, keepdims=True)
    elif ord == -np.inf:
        r = amin(abs(x), axis=axes, keepdims=True)
    elif ord == 0:
        r = sum(astype(_ops.not_equal(x, 0), x.dtype), axis=axes, keepdims=True)
    elif ord == 1:
        r = sum(abs(x), axis=axes, keepdims=True)
    elif isinstance(ord, str):
        raise ValueError(f"norm: ord={ord!r} is a matrix norm; give two axes for it")
    else:
        r = _ops.pow(sum(_ops.pow(abs(x), ord), axis=axes, keepdims=True), 1.0 / ord)
    return r if keepdims else reshape(r, _reduced_shape(tuple(shape_of(x)), axes, False))


def _matrix_norm(x, ord, axes, keepdims):
    r0, c0 = axes
    if ord is None or ord == "fro":
        return _vector_norm(x, None, tuple(sorted(axes)), keepdims)
    if ord in ("nuc", 2, -2):
        m = moveaxis(x, (r0, c0), (-2, -1))
        s = bind(svd_p, m)[1]
        r = sum(s, axis=-1) if ord == "nuc" else amax(s, axis=-1) if ord == 2 else amin(s, axis=-1)
    elif ord in (1, -1, np.inf, -np.inf):
        # 1: largest column sum (sum over rows); inf: largest row sum
        over, pick = (r0, c0) if ord in (1, -1) else (c0, r0)
        sums = sum(abs(x), axis=over, keepdims=True)
        r = amax(sums, axis=pick, keepdims=True) if ord > 0 else amin(sums, axis=pick,
                                                                       keepdims=True)
        r = reshape(r, _reduced_shape(tuple(shape_of(x)), tuple(sorted(axes)), False))
    else:
        raise ValueError(f"norm: invalid norm order {ord!r} for matrices")
    if keepdims:
        r = reshape(r, _reduced_shape(tuple(shape_of(x)), tuple(sorted(axes)), True))
    return r


@implements(np.linalg.norm)
def norm(x, ord=None, axis=None, keepdims=False):
    """np.linalg.norm: vector norms along one axis, matrix norms over two
    (ord None/'fro', 'nuc', 1, -1, 2, -2, inf, -inf)."""
    nd = len(shape_of(x))
    if axis is None and ord is not None and nd == 2 or axis is not None and len(
            (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)) == 2:
        _complex_svd_check("norm", x, ord)
    x = _norm_input(x)
    if axis is None:
        if ord is None:
            return _vector_norm(x, None, tuple(range(nd)), keepdims)
        if nd == 1:
            return _vector_norm(x, ord, (0,), keepdims)
        if nd == 2:
            return _matrix_norm(x, ord, (0, 1), keepdims)
        raise ValueError("norm: improper number of dimensions to norm (give axis=)")
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    axes = tuple(int(a) % nd for a in axes)
    if len(axes) == 1:
        return _vector_norm(x, ord, axes, keepdims)
    if len(axes) == 2:
        return _matrix_norm(x, ord, axes, keepdims)
    raise ValueError("norm: improper number of dimensions to norm")


@method("norm")
def _norm_method(x, p="fro", dim=None, keepdim=False, dtype=None):
    """torch's norm: p='fro' is the 2-norm; a numeric p is a vector norm over dim (all when None)."""
    if dtype is not None:
        x = astype(x, dtype)
    nd = len(shape_of(x))
    axes = norm_axes(dim, nd)
    if p == "fro":
        p = None
    if p == "nuc":
        return _matrix_norm(x, "nuc", axes, keepdim)
    return _vector_norm(x, p, axes, keepdim)


# --- products ------------------------------------------------------------------------------------

@implements(np.tensordot)
def tensordot(a, b, axes=2, *, dims=None):
    """Contract a's ``axes[0]`` with b's ``axes[1]`` (or the last/first n axes)."""
    if dims is not None:
        axes = dims
    sa, sb = shape_of(a), shape_of(b)
    if isinstance(axes, (int, np.integer)):
        n = int(axes)
        ax_a, ax_b = list(range(len(sa) - n, len(sa))), list(range(n))
    else:
        ax_a, ax_b = axes
        ax_a = [ax_a] if isinstance(ax_a, (int, np.integer)) else list(ax_a)
        ax_b = [ax_b] if isinstance(ax_b, (int, np.integer)) else list(ax_b)
    ax_a = [int(i) % len(sa) for i in ax_a]
    ax_b = [int(i) % len(sb) for i in ax_b]
    for i, j in zip(ax_a, ax_b):
        if sa[i] != sb[j]:
            raise ValueError(f"tensordot: shape mismatch for sum: a{list(sa)} axis {i} "
                             f"has {sa[i]} but b{list(sb)} axis {j} has {sb[j]}")
    free_a = [i for i in range(len(sa)) if i not in ax_a]
    free_b = [j for j in range(len(sb)) if j not in ax_b]
    k = int(np.prod([sa[i] for i in ax_a]))
    am = reshape(transpose(a, tuple(free_a + ax_a)), (-1, k))
    bm = reshape(transpose(b, tuple(ax_b + free_b)), (k, -1))
    return reshape(matmul(am, bm), tuple(sa[i] for i in free_a) + tuple(sb[j] for j in free_b))


@method("dot")
@implements(np.dot)
def dot(a, b, out=None):
    """np.dot: products for scalars, matmul up to 2-D, else a sum over a's
    last and b's second-to-last axis."""
    refuse_out("dot", out)
    na, nb = len(shape_of(a)), len(shape_of(b))
    if na == 0 or nb == 0:
        return mul(a, b)
    if na <= 2 and nb <= 2:
        return matmul(a, b)
    return tensordot(a, b, ([-1], [0 if nb == 1 else -2]))


@implements(np.vdot)
def vdot(a, b):
    """sum(conj(a) * b) of the flattened operands."""
    return sum(mul(_conj(ravel(a)), ravel(b)))


@method("inner")
@implements(np.inner)
def inner(a, b):
    if len(shape_of(a)) == 0 or len(shape_of(b)) == 0:
        return mul(a, b)
    return tensordot(a, b, ([-1], [-1]))


@method("outer", "ger")
@implements(np.outer)
def outer(a, b, out=None):
    return mul(reshape(ravel(a), (-1, 1)), ravel(b))


@method("kron")
@implements(np.kron)
def kron(a, b):
    """Kronecker product: interleave the axes of a and b, then merge pairs."""
    sa, sb = shape_of(a), shape_of(b)
    nd = _builtins.max(len(sa), len(sb))
    sa, sb = (1,) * (nd - len(sa)) + sa, (1,) * (nd - len(sb)) + sb
    ai = reshape(a, tuple(d for x in sa for d in (x, 1)))
    bi = reshape(b, tuple(d for x in sb for d in (1, x)))
    return reshape(mul(ai, bi), tuple(x * y for x, y in zip(sa, sb)))


@implements(np.cross)
def cross(a, b, axisa=-1, axisb=-1, axisc=-1, axis=None, *, dim=None):
    """Cross product of 3-vectors along an axis."""
    if dim is not None:
        axis = dim
    if axis is not None:
        axisa = axisb = axisc = axis
    axisa, axisb, axisc = (v.__index__() if hasattr(v, "__index__") else _not_an_int(v)
                           for v in (axisa, axisb, axisc))
    a, b = moveaxis(a, axisa, -1), moveaxis(b, axisb, -1)
    if shape_of(a)[-1] != 3 or shape_of(b)[-1] != 3:
        raise ValueError(f"cross: both operands need length 3 along the axis; got shapes "
                         f"{list(shape_of(a))} and {list(shape_of(b))}")
    a0, a1, a2 = (a[..., i] for i in range(3))
    b0, b1, b2 = (b[..., i] for i in range(3))
    c = stack([sub(mul(a1, b2), mul(a2, b1)), sub(mul(a2, b0), mul(a0, b2)),
               sub(mul(a0, b1), mul(a1, b0))], axis=-1)
    return moveaxis(c, -1, axisc)


def _not_an_int(v):
    raise TypeError(f"'{type(v).__name__}' object cannot be interpreted as an integer")


@implements(np.diagonal)
def diagonal(x, offset=0, axis1=0, axis2=1, *, dim1=None, dim2=None):
    """The diagonal at ``offset`` of the (axis1, axis2) planes, as the last axis."""
    axis1 = axis1 if dim1 is None else dim1
    axis2 = axis2 if dim2 is None else dim2
    m = moveaxis(x, (axis1, axis2), (-2, -1))
    s = shape_of(m)
    r, c = s[-2:]
    r0, c0 = _builtins.max(-offset, 0), _builtins.max(offset, 0)
    n = _builtins.max(0, _builtins.min(r - r0, c - c0))
    # every (c + 1)-th element of the flattened planes: a strided slice, so
    # on eager values whose planes are contiguous it is a view of x (torch's
    # diagonal is one: an in-place op on it writes into x)
    start = r0 * c + c0
    out = getitem(reshape(m, tuple(s[:-2]) + (r * c,)),
                  (Ellipsis, slice(start, start + (n - 1) * (c + 1) + 1, c + 1) if n
                   else slice(0, 0)))
    _diagonal_memory(x, out)
    return out


def _root(t):
    base = getattr(t, "_base", None)
    return t if base is None else base


def _diagonal_memory(x, out):
    """NumPy's diagonal is a read-only view; torch's a writable view.  An
    eager diagonal that is a copy (its planes were not contiguous) could
    not write into x, so it is read-only: an in-place op on it is an error,
    not an update x never sees.  NumPy-face values: read-only always."""
    data = getattr(out, "_data", None)
    if isinstance(data, np.ndarray) and (getattr(out, "_face", "numpy") != "torch"
                                         or _root(out) is not _root(x)):
        data.flags.writeable = False


method("diagonal")(lambda x, offset=0, dim1=0, dim2=1, *, axis1=None, axis2=None:  # torch, NumPy
                   diagonal(x, offset, dim1 if axis1 is None else axis1,
                            dim2 if axis2 is None else axis2))


@method("trace")
@implements(np.trace)
def trace(x, offset=0, axis1=0, axis2=1, dtype=None, out=None):
    refuse_out("trace", out)
    return sum(diagonal(x, offset, axis1, axis2), axis=-1, dtype=dtype)


@method("diag")
@implements(np.diag)
def diag(v, k=0, *, diagonal=None):
    """1-D: a matrix with v on diagonal k.  2-D: its k-th diagonal."""
    if diagonal is not None:
        k = diagonal
    s = shape_of(v)
    if len(s) == 2:
        d = globals()["diagonal"](v, k)
        # torch.diag of a matrix is a new tensor (NumPy's np.diag a read-only view)
        return _ops.clone(d) if getattr(d, "_face", None) == "torch" else d
    if len(s) != 1:
        raise ValueError(f"diag: input must be 1-D or 2-D, got shape {list(s)}")
    n = s[0] + _builtins.abs(k)
    i = np.arange(s[0])
    return index_add(v, (i + _builtins.max(-k, 0), i + _builtins.max(k, 0)), (n, n))


def _tri(x, k, lower):
    s = shape_of(x)
    if len(s) < 2:
        raise ValueError(f"{'tril' if lower else 'triu'}: input must be at least 2-D, got "
                         f"shape {list(s)}")
    ones = np.ones(s[-2:], dtype=bool)
    return where(np.tril(ones, k) if lower else np.triu(ones, k), x, 0)


@method("triu")
@implements(np.triu)
def triu(x, k=0, *, diagonal=None):
    return _tri(x, k if diagonal is None else diagonal, False)


@method("tril")
@implements(np.tril)
def tril(x, k=0, *, diagonal=None):
    return _tri(x, k if diagonal is None else diagonal, True)


@method("bmm")
def bmm(a, b):
    sa, sb = shape_of(a), shape_of(b)
    if len(sa) != 3 or len(sb) != 3 or sa[0] != sb[0] or sa[2] != sb[1]:
        raise RuntimeError(f"bmm: expected batches of matrices (b, n, k) @ (b, k, m), got "
                           f"{list(sa)} and {list(sb)}")
    return matmul(a, b)


@method("mv")
def mv(a, v):
    if len(shape_of(a)) != 2 or len(shape_of(v)) != 1:
        raise RuntimeError(f"mv: expected a matrix and a vector, got shapes "
                           f"{list(shape_of(a))} and {list(shape_of(v))}")
    return matmul(a, v)


@method("addmm")
def addmm(x, mat1, mat2, *, beta=1, alpha=1):
    """beta * x + alpha * (mat1 @ mat2)."""
    prod = matmul(mat1, mat2)
    if alpha != 1:
        prod = mul(prod, alpha)
    return add(x if beta == 1 else mul(x, beta), prod)


# --- NumPy 2's np.linalg array-API functions (compositions) -------------------------------------

def _ndim_at_least_2(name, x):
    if len(shape_of(x)) < 2:
        raise ValueError(f"{name}: input array must be at least 2-dimensional, got shape "
                         f"{list(shape_of(x))}")


@implements(np.linalg.matrix_transpose, getattr(np, "matrix_transpose", None))
def matrix_transpose(x, /):
    """Swap the last two axes (a stack of matrices transposed)."""
    _ndim_at_least_2("matrix_transpose", x)
    return swapaxes(x, -1, -2)


def _conj(x):
    return _ops.conj(x) if np.dtype(getattr(x, "dtype", np.float64)).kind == "c" else x


def _operand(x):
    """A tracegrad value as it is; anything else as a NumPy array."""
    return x if is_value(x) else np.asarray(x)


@implements(np.linalg.vecdot)
def vecdot(x1, x2, /, *, axis=-1):
    """sum(conj(x1) * x2) along ``axis`` (of each operand), broadcasting the rest."""
    x1, x2 = _operand(x1), _operand(x2)
    s1, s2 = shape_of(x1), shape_of(x2)
    if not s1 or not s2:
        raise ValueError("vecdot: operands must have at least one dimension (the vector axis)")
    a, b = moveaxis(x1, axis, -1), moveaxis(x2, axis, -1)
    if shape_of(a)[-1] != shape_of(b)[-1]:
        raise ValueError(f"vecdot: the vector axes differ in length ({shape_of(a)[-1]} and "
                         f"{shape_of(b)[-1]}) for operands of shapes {list(s1)} and {list(s2)}")
    return sum(mul(_conj(a), b), axis=-1)


def _vecdot_ufunc(x1, x2, /, *, axis=None, axes=None, keepdims=False, **kw):
    """np.vecdot, the generalized ufunc: axis= (or axes=[(a,), (b,), ()]) and keepdims."""
    if kw:
        raise TypeError(f"np.vecdot: the keyword(s) {sorted(kw)} are not supported on tracegrad "
                        f"values; pass axis= and keepdims= only")
    if axes is not None:
        if axis is not None:
            raise TypeError("np.vecdot: pass axis= or axes=, not both")
        (i1,), (i2,) = axes[0], axes[1]
        a, b = moveaxis(x1, i1, -1), moveaxis(x2, i2, -1)
        r = vecdot(a, b)
    else:
        r = vecdot(x1, x2, axis=-1 if axis is None else axis)
    return expand_dims(r, -1) if keepdims else r


if isinstance(getattr(np, "vecdot", None), np.ufunc):
    implements(np.vecdot)(_vecdot_ufunc)


def _norm_input(x):
    """What a norm measures: x (float), |x| (complex: every norm is one of
    the moduli), or x in float64 (integers and booleans, as NumPy)."""
    kind = np.dtype(getattr(x, "dtype", np.float64)).kind
    if kind == "c":
        return abs(x)
    return x if kind == "f" else astype(x, np.float64)


def _complex_svd_check(name, x, ord):
    if ord in ("nuc", 2, -2) and np.dtype(getattr(x, "dtype", np.float64)).kind == "c":
        raise TypeError(f"np.linalg.{name}(..., ord={ord!r}) of a complex matrix needs the "
                        f"complex SVD, which tracegrad does not support; use ord='fro' or a "
                        f"real matrix")


@implements(np.linalg.vector_norm)
def vector_norm(x, /, *, axis=None, keepdims=False, ord=2):
    """The vector norm over ``axis`` (an int, a tuple of axes, or all of
    them), as one vector."""
    nd = len(shape_of(x))
    x = _norm_input(x)
    if ord is not None and isinstance(ord, str):
        raise ValueError(f"vector_norm: invalid norm order {ord!r} for vectors")
    axes = norm_axes(axis, nd)
    return _vector_norm(x, ord, axes, keepdims)


@implements(np.linalg.matrix_norm)
def matrix_norm(x, /, *, keepdims=False, ord="fro"):
    """The matrix norm of each matrix of a stack (the last two axes)."""
    _ndim_at_least_2("matrix_norm", x)
    _complex_svd_check("matrix_norm", x, ord)
    nd = len(shape_of(x))
    return _matrix_norm(_norm_input(x), ord, (nd - 2, nd - 1), keepdims)


@implements(np.linalg.svdvals)
def svdvals(x, /):
    """The singular values, descending (svd's S)."""
    return svd(x, compute_uv=False)


def _chain_order(dims):
    """The cheapest parenthesization of a matrix chain (dims[i] x dims[i+1]):
    split[i][j] is where the product of matrices i..j is cut (as NumPy's)."""
    n = len(dims) - 1
    cost = [[0] * n for _ in range(n)]
    split = [[0] * n for _ in range(n)]
    for length in range(1, n):
        for i in range(n - length):
            j = i + length
            cost[i][j] = None
            for k in range(i, j):
                c = cost[i][k] + cost[k + 1][j] + dims[i] * dims[k + 1] * dims[j + 1]
                if cost[i][j] is None or c < cost[i][j]:
                    cost[i][j], split[i][j] = c, k
    return split


@implements(np.linalg.multi_dot)
def multi_dot(arrays, *, out=None):
    """The product of a chain of matrices in the cheapest order; the first
    may be a row vector and the last a column vector (1-D), as in NumPy."""
    if out is not None:
        raise TypeError("np.linalg.multi_dot(..., out=) cannot write into a tracegrad value; "
                        "assign the result instead")
    arrays = [_operand(a) for a in arrays]
    n = len(arrays)
    if n < 2:
        raise ValueError("Expecting at least two arrays.")
    if n == 2:
        return dot(arrays[0], arrays[1])
    first, last = arrays[0], arrays[-1]
    nd0, nd1 = len(shape_of(first)), len(shape_of(last))
    if nd0 == 1:
        arrays[0] = reshape(first, (1, -1))
    if nd1 == 1:
        arrays[-1] = reshape(last, (-1, 1))
    for a in arrays:
        if len(shape_of(a)) != 2:
            raise np.linalg.LinAlgError(f"{len(shape_of(a))}-dimensional array given. Array "
                                        f"must be two-dimensional")
    dims = [shape_of(a)[0] for a in arrays] + [shape_of(arrays[-1])[1]]
    split = _chain_order(dims)

    def prod(i, j):
        if i == j:
            return arrays[i]
        k = split[i][j]
        return matmul(prod(i, k), prod(k + 1, j))

    r = prod(0, n - 1)
    if nd0 == 1 and nd1 == 1:
        return reshape(r, ())
    if nd0 == 1 or nd1 == 1:
        return ravel(r)
    return r


def _prod(shape):
    p = 1
    for d in shape:
        p *= d
    return p


@implements(np.linalg.tensorinv)
def tensorinv(a, ind=2):
    """The inverse of ``a`` seen as a matrix of its first ``ind`` axes by the rest."""
    if ind <= 0:
        raise ValueError("Invalid ind argument.")
    old = tuple(shape_of(a))
    inv_shape = old[ind:] + old[:ind]
    rows = _prod(old[ind:])
    if _prod(old[:ind]) != rows:
        raise np.linalg.LinAlgError("Last 2 dimensions of the array must be square")
    return reshape(inv(reshape(a, (rows, -1) if rows else (0, 0))), inv_shape)


@implements(np.linalg.tensorsolve)
def tensorsolve(a, b, axes=None):
    """x with tensordot(a, x, x.ndim) = b."""
    a, b = _operand(a), _operand(b)
    an, bn = len(shape_of(a)), len(shape_of(b))
    if axes is not None:
        allaxes = list(range(an))
        for k in axes:
            allaxes.remove(k)
            allaxes.insert(an, k)
        a = transpose(a, tuple(allaxes))
    old = tuple(shape_of(a))[-(an - bn):]
    p = _prod(old)
    if _prod(shape_of(a)) != p ** 2:
        raise np.linalg.LinAlgError(
            "Input arrays must satisfy the requirement "
            "prod(a.shape[b.ndim:]) == prod(a.shape[:b.ndim])")
    return reshape(solve(reshape(a, (p, p)), ravel(b)), old)
