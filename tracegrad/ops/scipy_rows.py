"""Rows whose values come from SciPy itself (so a traced or recorded call of
a SciPy function gives exactly SciPy's numbers), with derivative rules
written, as every rule is, with tracegrad's ops.

* ``scipy_ufunc1`` / ``scipy_ufunc2`` / ``scipy_ufunc3``: a ``scipy.special``
  ufunc of one, two or three operands, named by the static attribute
  ``name``.  Each name's derivatives are in ``_D`` below, written with the
  same rows (``d erfcx = 2 x erfcx(x) - 2/sqrt(pi)``, ``d kv(v, x) =
  -(kv(v-1, x) + kv(v+1, x)) / 2``), so higher derivatives come for free.
  A derivative SciPy's mathematics does not give here (in a Bessel order, in
  the ``a`` of ``gammainc``) is an error naming the function and the operand,
  never a zero.
* ``matrix_function`` (static ``fn``: ``expm``, ``logm`` or ``sqrtm``): the
  primary matrix function, batched over leading axes.  Its Fréchet
  derivative is the upper right block of ``f([[A, E], [0, A]])`` (Higham,
  *Functions of Matrices*, 3.16), so the jvp is that block of the same row
  and the vjp is ``L_f(A^T, G)`` (f has real Taylor coefficients).
* ``sylvester``: X with ``A X + X B = Q``; vjp ``Q_bar = sylvester(A^T, B^T,
  G)``, ``A_bar = -Q_bar X^T``, ``B_bar = -X^T Q_bar``.
* ``lu_factor``: ``(lu, piv, perm)`` as ``scipy.linalg.lu_factor`` with the
  row permutation ``perm`` (``a[perm] = L U``); only ``lu`` carries a
  gradient: ``A_bar[perm] = L^-T (tril_-1(L^T L_bar) + triu(U_bar U^T)) U^-T``.
* ``lu_pivots_to_perm``: LAPACK's pivots as a permutation (no gradient).

The values need SciPy at run time (the generated code imports it where it
calls one of these rows); the rest of tracegrad does not.
"""
from __future__ import annotations

import math

import numpy as np

from tracegrad.ops import runtime_numpy as _rt
from tracegrad.ops.primitives import Aval, bind, register
from tracegrad.ops.base import (elementwise_shape, mul, add, sub, div, neg, exp, log, where,
                                matmul, swapaxes, equal, less_equal, broadcast_to)
from tracegrad.ops.elementwise import square, log1p, sqrt, sign, floor, abs as _abs
from tracegrad.ops.shape import concatenate, expand_dims, invert_permutation_p
from tracegrad.ops.indexing import take_along_axis
from tracegrad.ops import linalg as _la

__all__ = []   # reached through tracegrad.ops.scipy_special / scipy_linalg


# --- runtime helpers (copied into generated code; self-contained) ------------------------

def _sp_ufunc(name, *xs):
    """scipy.special.<name>(*xs) (on the host for CuPy operands)."""
    import scipy.special
    import numpy as np
    f = getattr(scipy.special, name)
    host = [x.get() if type(x).__module__.startswith("cupy") else x for x in xs]
    out = f(*host)
    if any(a is not b for a, b in zip(host, xs)):    # the GPU: computed on the host
        import cupy
        return cupy.asarray(out)
    return np.asarray(out) if np.ndim(out) == 0 else out


def _sp_matfunc(a, fn):
    """The matrix function ``fn`` (expm, logm, sqrtm) of each matrix in a
    stack, by scipy.linalg; a real input gives a real result (the principal
    logarithm / square root of a matrix with no eigenvalue on the closed
    negative real axis is real: SciPy's tiny imaginary rounding is dropped)."""
    import numpy as np
    import scipy.linalg
    if type(a).__module__.startswith("cupy"):         # the GPU: computed on the host
        import cupy
        return cupy.asarray(_sp_matfunc(a.get(), fn))
    a = np.asarray(a)
    f = getattr(scipy.linalg, fn)
    flat = a.reshape((-1,) + a.shape[-2:])
    outs = []
    for m in flat:
        r = f(m)
        if isinstance(r, tuple):
            r = r[0]
        r = np.asarray(r)
        if a.dtype.kind != "c" and r.dtype.kind == "c":
            r = r.real
        outs.append(r.astype(np.result_type(a.dtype, np.float64) if a.dtype.kind in "iub"
                             else a.dtype, copy=False))
    return np.stack(outs).reshape(a.shape) if outs else np.zeros(a.shape, a.dtype)


def _sp_sylvester(a, b, q):
    """X with a X + X b = q for each matrix in a stack (scipy.linalg)."""
    import numpy as np
    import scipy.linalg
    if any(type(v).__module__.startswith("cupy") for v in (a, b, q)):   # on the host
        import cupy
        host = [v.get() if type(v).__module__.startswith("cupy") else v for v in (a, b, q)]
        return cupy.asarray(_sp_sylvester(*host))
    a, b, q = np.asarray(a), np.asarray(b), np.asarray(q)
    lead = np.broadcast_shapes(a.shape[:-2], b.shape[:-2], q.shape[:-2])
    a = np.broadcast_to(a, lead + a.shape[-2:]).reshape((-1,) + a.shape[-2:])
    b = np.broadcast_to(b, lead + b.shape[-2:]).reshape((-1,) + b.shape[-2:])
    q2 = np.broadcast_to(q, lead + q.shape[-2:]).reshape((-1,) + q.shape[-2:])
    outs = [scipy.linalg.solve_sylvester(x, y, z) for x, y, z in zip(a, b, q2)]
    dt = np.result_type(a.dtype, b.dtype, q.dtype)
    dt = dt if dt.kind in "fc" else np.dtype(np.float64)
    return np.stack(outs).reshape(lead + q.shape[-2:]).astype(dt, copy=False)


def _sp_lu_factor(a):
    """scipy.linalg.lu_factor of each matrix in a stack, and the row
    permutation perm with a[perm] = L U."""
    import numpy as np
    import scipy.linalg
    if type(a).__module__.startswith("cupy"):         # the GPU: computed on the host
        import cupy
        return tuple(cupy.asarray(r) for r in _sp_lu_factor(a.get()))
    a = np.asarray(a)
    flat = a.reshape((-1,) + a.shape[-2:])
    lus, pivs, perms = [], [], []
    for m in flat:
        lu, piv = scipy.linalg.lu_factor(m)
        perm = np.arange(m.shape[0])
        for i, p in enumerate(piv):
            perm[i], perm[p] = perm[p], perm[i]
        lus.append(lu)
        pivs.append(piv)
        perms.append(perm)
    return (np.stack(lus).reshape(a.shape), np.stack(pivs).reshape(a.shape[:-1]),
            np.stack(perms).reshape(a.shape[:-1]))


def _lu_perm(piv):
    """LAPACK pivots (row i swapped with row piv[i], in order) as the
    permutation perm with a[perm] = L U."""
    import numpy as np
    if type(piv).__module__.startswith("cupy"):       # the GPU: computed on the host
        import cupy
        return cupy.asarray(_lu_perm(piv.get()))
    piv = np.asarray(piv)
    flat = piv.reshape(-1, piv.shape[-1]) if piv.ndim else piv.reshape(1, 1)
    out = np.empty(flat.shape, np.int64)
    for k, pv in enumerate(flat):
        perm = np.arange(pv.shape[0])
        for i, p in enumerate(pv):
            perm[i], perm[p] = perm[p], perm[i]
        out[k] = perm
    return out.reshape(piv.shape)


for _h in (_sp_ufunc, _sp_matfunc, _sp_sylvester, _sp_lu_factor, _lu_perm):
    setattr(_rt, _h.__name__, _h)   # codegen copies helpers from runtime_numpy


# --- scipy.special ufuncs ----------------------------------------------------------------

def _impl(xp, *xs, name):
    return _sp_ufunc(name, *xs)


_UFUNC_ROWS = {}


def sp(name, *xs):
    """scipy.special.<name>(*xs) as a row of this table (float operands)."""
    return bind(_UFUNC_ROWS[len(xs)], *xs, name=name)


def _none(name, what):
    def rule(*a, **k):
        raise NotImplementedError(
            f"scipy.special.{name}: tracegrad has no derivative with respect to {what} "
            f"(differentiate with respect to the other operand, or pass {what} as a "
            f"constant: a plain array, or tg.stop_gradient(...))")
    return rule


_RSQRT_2PI = 1.0 / math.sqrt(2 * math.pi)
_TWO_RSQRT_PI = 2.0 / math.sqrt(math.pi)


def _bessel(kind):
    """d/dx of the Bessel-type function ``kind``(v, x), with its sign."""
    def d(v, x, out):
        lo, hi = sp(kind, sub(v, 1.0), x), sp(kind, add(v, 1.0), x)
        if kind in ("jv", "yv"):
            return mul(sub(lo, hi), 0.5)
        if kind == "iv":
            return mul(add(lo, hi), 0.5)
        if kind == "ive":
            return sub(mul(add(lo, hi), 0.5), mul(sign(x), out))
        if kind == "kv":
            return mul(add(lo, hi), -0.5)
        if kind == "kve":
            return add(mul(add(lo, hi), -0.5), out)
        raise AssertionError(kind)
    return d


def _psi_d(x, out):
    return sp("zeta", 2.0, x)


# name -> one derivative function per operand: d(*operands, out) -> partial derivative
# (None: the operand has no derivative; a refusing rule is built from it)
_D = {
    # one operand
    "expit": (lambda x, o: mul(o, sub(1.0, o)),),
    "log_expit": (lambda x, o: sp("expit", neg(x)),),
    "logit": (lambda x, o: div(1.0, mul(x, sub(1.0, x))),),
    "erf": (lambda x, o: mul(exp(neg(square(x))), _TWO_RSQRT_PI),),
    "erfc": (lambda x, o: mul(exp(neg(square(x))), -_TWO_RSQRT_PI),),
    "erfcx": (lambda x, o: sub(mul(mul(x, o), 2.0), _TWO_RSQRT_PI),),
    "erfinv": (lambda x, o: mul(exp(square(o)), math.sqrt(math.pi) / 2),),
    "erfcinv": (lambda x, o: mul(exp(square(o)), -math.sqrt(math.pi) / 2),),
    "ndtr": (lambda x, o: mul(exp(mul(square(x), -0.5)), _RSQRT_2PI),),
    "ndtri": (lambda x, o: mul(exp(mul(square(o), 0.5)), 1.0 / _RSQRT_2PI),),
    "log_ndtr": (lambda x, o: mul(exp(sub(mul(square(x), -0.5), o)), _RSQRT_2PI),),
    "gammaln": (lambda x, o: sp("psi", x),),
    "psi": (_psi_d,),
    "gamma": (lambda x, o: mul(o, sp("psi", x)),),
    "rgamma": (lambda x, o: neg(mul(o, sp("psi", x))),),
    "entr": (lambda x, o: neg(add(log(x), 1.0)),),
    "dawsn": (lambda x, o: sub(1.0, mul(mul(x, o), 2.0)),),
    "exp2": (lambda x, o: mul(o, math.log(2.0)),),
    "exp10": (lambda x, o: mul(o, math.log(10.0)),),
    "cbrt": (lambda x, o: div(o, mul(x, 3.0)),),
    "expm1": (lambda x, o: add(o, 1.0),),
    "log1p": (lambda x, o: div(1.0, add(x, 1.0)),),
    "i0": (lambda x, o: sp("i1", x),),
    "i1": (lambda x, o: mul(add(sp("i0", x), sp("iv", 2.0, x)), 0.5),),
    "i0e": (lambda x, o: sub(sp("i1e", x), mul(sign(x), o)),),
    "i1e": (lambda x, o: sub(mul(add(sp("i0e", x), sp("ive", 2.0, x)), 0.5), mul(sign(x), o)),),
    "k0": (lambda x, o: neg(sp("k1", x)),),
    "k1": (lambda x, o: mul(add(sp("k0", x), sp("kv", 2.0, x)), -0.5),),
    "k0e": (lambda x, o: sub(o, sp("k1e", x)),),
    "k1e": (lambda x, o: add(mul(add(sp("k0e", x), sp("kve", 2.0, x)), -0.5), o),),
    "j0": (lambda x, o: neg(sp("j1", x)),),
    "j1": (lambda x, o: mul(sub(sp("j0", x), sp("jv", 2.0, x)), 0.5),),
    "y0": (lambda x, o: neg(sp("y1", x)),),
    "y1": (lambda x, o: mul(sub(sp("y0", x), sp("yv", 2.0, x)), 0.5),),
    # two operands
    "xlogy": (lambda x, y, o: where(equal(x, 0), 0.0, log(y)),
              lambda x, y, o: where(equal(x, 0), 0.0, div(x, y))),
    "xlog1py": (lambda x, y, o: where(equal(x, 0), 0.0, log1p(y)),
                lambda x, y, o: where(equal(x, 0), 0.0, div(x, add(y, 1.0)))),
    "rel_entr": (lambda x, y, o: where(equal(x, 0), 0.0, add(log(div(x, y)), 1.0)),
                 lambda x, y, o: neg(div(x, y))),
    "kl_div": (lambda x, y, o: where(equal(x, 0), 0.0, log(div(x, y))),
               lambda x, y, o: sub(1.0, div(x, y))),
    "beta": (lambda a, b, o: mul(o, sub(sp("psi", a), sp("psi", add(a, b)))),
             lambda a, b, o: mul(o, sub(sp("psi", b), sp("psi", add(a, b))))),
    "betaln": (lambda a, b, o: sub(sp("psi", a), sp("psi", add(a, b))),
               lambda a, b, o: sub(sp("psi", b), sp("psi", add(a, b)))),
    "gammainc": (None, lambda a, x, o: exp(sub(sub(mul(sub(a, 1.0), log(x)), x),
                                               sp("gammaln", a)))),
    "gammaincc": (None, lambda a, x, o: neg(exp(sub(sub(mul(sub(a, 1.0), log(x)), x),
                                                    sp("gammaln", a))))),
    "gammaincinv": (None, lambda a, y, o: exp(add(sub(o, mul(sub(a, 1.0), log(o))),
                                                  sp("gammaln", a)))),
    "gammainccinv": (None, lambda a, y, o: neg(exp(add(sub(o, mul(sub(a, 1.0), log(o))),
                                                       sp("gammaln", a))))),
    "zeta": (None, lambda s, q, o: mul(neg(s), sp("zeta", add(s, 1.0), q))),
    "iv": (None, lambda v, x, o: _bessel("iv")(v, x, o)),
    "ive": (None, lambda v, x, o: _bessel("ive")(v, x, o)),
    "kv": (None, lambda v, x, o: _bessel("kv")(v, x, o)),
    "kve": (None, lambda v, x, o: _bessel("kve")(v, x, o)),
    "jv": (None, lambda v, x, o: _bessel("jv")(v, x, o)),
    "yv": (None, lambda v, x, o: _bessel("yv")(v, x, o)),
    "huber": (None, lambda d, r, o: where(_le_abs(r, d), r, mul(d, sign(r)))),
    "pseudo_huber": (None, lambda d, r, o: div(r, sqrt(add(1.0, square(div(r, d)))))),
    "stdtr": (None, lambda df, t, o: exp(sub(sub(sub(
        sp("gammaln", mul(add(df, 1.0), 0.5)), sp("gammaln", mul(df, 0.5))),
        mul(log(mul(df, math.pi)), 0.5)), mul(mul(add(df, 1.0), 0.5), log1p(div(square(t),
                                                                                 df)))))),
    "pdtr": (None, lambda k, m, o: neg(exp(sub(sub(mul(_floor(k), log(m)), m),
                                               sp("gammaln", add(_floor(k), 1.0)))))),
    # three operands
    "betaincc": (None, None, lambda a, b, x, o: neg(exp(sub(
        add(mul(sub(a, 1.0), log(x)), mul(sub(b, 1.0), log1p(neg(x)))), sp("betaln", a, b))))),
    "betainc": (None, None, lambda a, b, x, o: exp(sub(
        add(mul(sub(a, 1.0), log(x)), mul(sub(b, 1.0), log1p(neg(x)))), sp("betaln", a, b)))),
}
_ARGS = {"gammainc": ("a", "x"), "gammaincc": ("a", "x"), "gammaincinv": ("a", "y"),
         "gammainccinv": ("a", "y"), "zeta": ("s", "q"), "iv": ("the order v", "x"),
         "ive": ("the order v", "x"), "kv": ("the order v", "x"), "kve": ("the order v", "x"),
         "jv": ("the order v", "x"), "yv": ("the order v", "x"), "huber": ("delta", "r"),
         "pseudo_huber": ("delta", "r"), "betainc": ("a", "b", "x"),
         "betaincc": ("a", "b", "x"), "stdtr": ("df", "t"), "pdtr": ("k", "m")}


def _floor(k):
    return floor(k)


def _le_abs(r, d):
    return less_equal(_abs(r), d)


UFUNC_NAMES = frozenset(_D)


def _rules(n):
    def entry(i):
        def rule(g, out, *xs, name):
            d = _D[name][i] if i < len(_D[name]) else None
            if d is None:
                _none(name, _ARGS.get(name, ("operand 1", "operand 2", "operand 3"))[i])()
            return mul(g, d(*xs, out))
        return rule
    return tuple(entry(i) for i in range(n))


for _n in (1, 2, 3):
    _UFUNC_ROWS[_n] = register(
        f"scipy_ufunc{_n}", _impl, shape=elementwise_shape(_impl),
        vjp=_rules(_n), jvp=_rules(_n), save_out=True,
        numpy="_sp_ufunc({name}, " + ", ".join("{%d}" % i for i in range(_n)) + ")",
        helpers=("_sp_ufunc",))


# --- matrix functions ---------------------------------------------------------------------

def _mT(x):
    return swapaxes(x, -1, -2)


def _block_upper(a, e):
    """[[a, e], [0, a]] for stacks of square matrices."""
    z = mul(a, 0.0)
    top = concatenate([a, e], axis=-1)
    bottom = concatenate([z, a], axis=-1)
    return concatenate([top, bottom], axis=-2)


def frechet(fn, a, e):
    """The Fréchet derivative L_f(a, e) of the matrix function ``fn``, and f(a)."""
    n = tuple(a.shape)[-1] if hasattr(a, "shape") else np.shape(a)[-1]
    m = matrix_function(fn, _block_upper(a, e))
    return m[..., :n, :n], m[..., :n, n:]


def _matfunc_vjp(g, out, a, fn):
    return frechet(fn, _mT(a), g)[1]


def _matfunc_jvp(t, out, a, fn):
    return frechet(fn, a, t)[1]


def _matfunc_impl(xp, a, fn):
    return _sp_matfunc(a, fn)


def _square(name, a):
    if len(a.shape) < 2 or a.shape[-1] != a.shape[-2]:
        raise ValueError(f"scipy.linalg.{name}: expected square matrices, got shape "
                         f"{tuple(a.shape)}")


def _matfunc_shape(a, fn):
    _square(fn, a)
    dt = np.dtype(a.dtype)
    return Aval(tuple(a.shape), dt if dt.kind in "fc" else np.dtype(np.float64))


matrix_function_p = register(
    "matrix_function", _matfunc_impl, shape=_matfunc_shape,
    vjp=(_matfunc_vjp,), jvp=(_matfunc_jvp,),
    numpy="_sp_matfunc({0}, {fn})", helpers=("_sp_matfunc",))


def matrix_function(fn, a):
    """expm / logm / sqrtm of each matrix in ``a`` (primitive ``matrix_function``)."""
    if fn not in ("expm", "logm", "sqrtm"):
        raise ValueError(f"matrix_function: unknown function {fn!r}")
    return bind(matrix_function_p, a, fn=fn)


# --- Sylvester equations ------------------------------------------------------------------

def _sylvester_impl(xp, a, b, q):
    return _sp_sylvester(a, b, q)


def _sylvester_shape(a, b, q):
    _square("solve_sylvester", a)
    _square("solve_sylvester", b)
    if len(q.shape) < 2 or q.shape[-2] != a.shape[-1] or q.shape[-1] != b.shape[-1]:
        raise ValueError(f"scipy.linalg.solve_sylvester: q of shape {tuple(q.shape)} does "
                         f"not match a {tuple(a.shape)} and b {tuple(b.shape)}")
    lead = np.broadcast_shapes(tuple(a.shape[:-2]), tuple(b.shape[:-2]), tuple(q.shape[:-2]))
    dt = np.result_type(a.dtype, b.dtype, q.dtype, np.float64 if np.dtype(q.dtype).kind in "iub"
                        else q.dtype)
    return Aval(lead + tuple(q.shape[-2:]), dt)


def _qbar(g, a, b):
    return sylvester(_mT(a), _mT(b), g)


def _sylvester_vjp(g, out, a, b, q):
    qb = _qbar(g, a, b)
    return (neg(matmul(qb, _mT(out))), neg(matmul(_mT(out), qb)), qb)


def _sylvester_jvp(ts, out, a, b, q):
    ta, tb, tq = ts
    rhs = tq if tq is not None else None
    for t, term in ((ta, lambda t: matmul(t, out)), (tb, lambda t: matmul(out, t))):
        if t is not None:
            rhs = neg(term(t)) if rhs is None else sub(rhs, term(t))
    return sylvester(a, b, rhs)


sylvester_p = register(
    "sylvester", _sylvester_impl, shape=_sylvester_shape,
    vjp=_sylvester_vjp, jvp=_sylvester_jvp, save_out=True,
    numpy="_sp_sylvester({0}, {1}, {2})", helpers=("_sp_sylvester",))


def sylvester(a, b, q):
    """X with a X + X b = q (primitive ``sylvester``)."""
    return bind(sylvester_p, a, b, q)


# --- LU -----------------------------------------------------------------------------------

def _lu_impl(xp, a):
    return _sp_lu_factor(a)


def _lu_shape(a):
    _square("lu_factor", a)
    dt = np.dtype(a.dtype)
    dt = dt if dt.kind in "fc" else np.dtype(np.float64)
    return (Aval(tuple(a.shape), dt), Aval(tuple(a.shape[:-1]), np.dtype(np.int32)),
            Aval(tuple(a.shape[:-1]), np.dtype(np.int64)))


def unpack_lu(lu):
    """(L, U) from a packed LU factor (L unit lower triangular)."""
    n = tuple(lu.shape)[-1]
    return add(_la.tril(lu, -1), np.eye(n, dtype=np.dtype(lu.dtype))), _la.triu(lu)


def _take_rows(x, idx):
    return take_along_axis(x, _expand_last(idx, tuple(x.shape)[-1]), axis=-2)


def _expand_last(idx, n):
    return broadcast_to(expand_dims(idx, -1), tuple(idx.shape) + (n,))


def _inverse_perm(perm):
    return bind(invert_permutation_p, perm, axis=-1)


def _lu_vjp(g, out, a):
    glu = g[0]
    if glu is None:
        return (None,)
    lu, _, perm = out
    L, U = unpack_lu(lu)
    x = add(_la.tril(matmul(_mT(L), _la.tril(glu, -1)), -1), _la.triu(matmul(glu, _mT(U))))
    # y = L^-T x U^-T
    y = _mT(_la.solve(U, _mT(_la.solve(_mT(L), x))))
    return (_take_rows(y, _inverse_perm(perm)),)


def _lu_jvp(ts, out, a):
    # a[perm] = L U: M = L^-1 da[perm] U^-1, dL = L tril_-1(M), dU = triu(M) U
    lu, _, perm = out
    L, U = unpack_lu(lu)
    x = _la.solve(L, _take_rows(ts[0], perm))
    m = _mT(_la.solve(_mT(U), _mT(x)))
    return (add(matmul(L, _la.tril(m, -1)), matmul(_la.triu(m), U)), None, None)


lu_factor_p = register(
    "lu_factor", _lu_impl, shape=_lu_shape, n_out=3,
    vjp=_lu_vjp, jvp=_lu_jvp, save_out=True, save_inputs=False,
    numpy="_sp_lu_factor({0})", helpers=("_sp_lu_factor",))

lu_pivots_to_perm_p = register(
    "lu_pivots_to_perm", lambda xp, piv: _lu_perm(piv),
    shape=lambda piv: Aval(tuple(piv.shape), np.dtype(np.int64)), nondiff=True,
    numpy="_lu_perm({0})", helpers=("_lu_perm",))


def lu_factor(a):
    """(lu, piv, perm): scipy.linalg.lu_factor and the permutation a[perm] = L U."""
    return bind(lu_factor_p, a)


def lu_pivots_to_perm(piv):
    return bind(lu_pivots_to_perm_p, piv)


def take_rows(x, idx):
    """x[..., idx, :] per matrix (idx: (..., n) integer rows)."""
    return _take_rows(x, idx)


def inverse_perm(perm):
    return _inverse_perm(perm)


# --- first-order-only values ----------------------------------------------------------------

def _first_order_refuse(what):
    raise NotImplementedError(
        f"{what}: tracegrad gives its first derivative only (the implicit function "
        f"theorem's, with the derivative of the function in x held constant); a second "
        f"derivative through it (hessian, create_graph=True, grad of grad) is not implemented")


def _first_order_grad_vjp(g, out, ct, x, what):
    _first_order_refuse(what)


# first_order_grad(ct, x) is ct; it also depends on x, so that a derivative of the
# gradient (which would need the second derivative) always reaches its refusing rule
first_order_grad_p = register(
    "first_order_grad", lambda xp, ct, x, what: ct,
    shape=lambda ct, x, what: Aval(ct.shape, ct.dtype),
    vjp=(_first_order_grad_vjp, _first_order_grad_vjp),
    jvp=(_first_order_grad_vjp, _first_order_grad_vjp),
    numpy="{0}")

first_order_p = register(
    "first_order", lambda xp, x, what: x, shape=lambda x, what: Aval(x.shape, x.dtype),
    vjp=(lambda g, out, x, what: bind(first_order_grad_p, g, x, what=what),),
    jvp=(lambda t, out, x, what: bind(first_order_grad_p, t, x, what=what),),
    numpy="{0}")


def first_order(x, what):
    """x, whose derivative may be taken once: a second derivative through it
    raises an error naming ``what`` (the rows ``first_order`` / ``first_order_grad``)."""
    return bind(first_order_p, x, what=str(what))
