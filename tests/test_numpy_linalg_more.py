"""NumPy 2's np.linalg additions on tracegrad values (tracegrad/ops/linalg.py):
vector_norm, matrix_norm, svdvals, multi_dot, matrix_transpose, vecdot
(np.linalg.vecdot and the np.vecdot ufunc), tensorinv, tensorsolve, and the
named-tuple results of eigh, slogdet, svd and qr.  Values equal NumPy's and
gradients equal central finite differences in float64, compiled (tg.grad,
tg.value_and_grad) and eager (compile=False, torch-face Tensors).
"""
from __future__ import annotations

import numpy as np
import pytest

import tracegrad as tg
from test_numpy_functions import check, _flat, _loss_of, _cotangents

RNG = np.random.default_rng(7_2026)
LA = np.linalg


def _r(*shape):
    return RNG.uniform(-2.0, 2.0, shape)


def _spd(n):
    a = _r(n, n)
    return a @ a.T + n * np.eye(n)


def check_all(fn, *args, diff=(0,), rtol=1e-9, gtol=1e-6):
    check(fn, *args, diff=diff, rtol=rtol, gtol=gtol)
    args = [np.asarray(a, dtype=np.float64) if i in diff else a for i, a in enumerate(args)]
    loss = _loss_of(fn, _cotangents(fn(*args)))
    v, g = tg.value_and_grad(loss, argnums=diff)(*args)
    np.testing.assert_allclose(v, loss(*args), rtol=1e-9, atol=1e-9)
    for a, b in zip(_flat(g), _flat(tg.grad(loss, argnums=diff)(*args))):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


S4 = _spd(4)
A = _r(3, 4, 5)

CASES = {
    "vector_norm": (lambda x: LA.vector_norm(x), A),
    "vector_norm-axis": (lambda x: LA.vector_norm(x, axis=1, keepdims=True), A),
    "vector_norm-axes-ord1": (lambda x: LA.vector_norm(x, axis=(0, 2), ord=1), A),
    "vector_norm-ord3": (lambda x: LA.vector_norm(x, axis=-1, ord=3), A),
    "vector_norm-inf": (lambda x: LA.vector_norm(x, ord=np.inf, axis=(1, 2), keepdims=True), A),
    "vector_norm-keepdims-all": (lambda x: LA.vector_norm(x, keepdims=True, ord=0.5), A),
    "matrix_norm-fro": (lambda x: LA.matrix_norm(x), A),
    "matrix_norm-nuc": (lambda x: LA.matrix_norm(x, ord="nuc", keepdims=True), A),
    "matrix_norm-2": (lambda x: LA.matrix_norm(x, ord=2), A),
    "matrix_norm-1": (lambda x: LA.matrix_norm(x, ord=-1), A),
    "matrix_norm-inf": (lambda x: LA.matrix_norm(x, ord=np.inf, keepdims=True), A),
    "svdvals": (lambda x: LA.svdvals(x), A),
    "multi_dot-3": (lambda a, b, c: LA.multi_dot([a, b, c]), _r(2, 6), _r(6, 3), _r(3, 5),
                    (0, 1, 2)),
    "multi_dot-vectors": (lambda a, b, c, d: LA.multi_dot([a, b, c, d]), _r(4), _r(4, 7),
                          _r(7, 2), _r(2), (0, 1, 2, 3)),
    "multi_dot-row": (lambda a, b: LA.multi_dot([a, b, np.ones((3, 2))]), _r(5), _r(5, 3),
                      (0, 1)),
    "multi_dot-2": (lambda a, b: LA.multi_dot((a, b)), _r(3, 4), _r(4), (0, 1)),
    "matrix_transpose": (lambda x: LA.matrix_transpose(x) * np.arange(20).reshape(5, 4), A),
    "np.matrix_transpose": (lambda x: np.matrix_transpose(x) @ x, A),
    "vecdot": (lambda x, y: LA.vecdot(x, y), A, _r(4, 5), (0, 1)),
    "vecdot-axis": (lambda x, y: LA.vecdot(x, y, axis=0), _r(3, 4), _r(3, 1), (0, 1)),
    "np.vecdot": (lambda x, y: np.vecdot(x, y), A, _r(5), (0, 1)),
    "np.vecdot-broadcast": (lambda x, y: np.vecdot(x, y), _r(3, 1, 5), _r(4, 5), (0, 1)),
    "np.vecdot-constant": (lambda x: np.vecdot(np.arange(5.0), x), A),
    "tensorinv": (lambda a: LA.tensorinv(a, ind=2),
                  (_spd(6)).reshape(2, 3, 6), ),
    "tensorinv-ind1": (lambda a: LA.tensorinv(a, ind=1), _spd(6).reshape(6, 2, 3)),
    "tensorsolve": (lambda a, b: LA.tensorsolve(a, b), _spd(6).reshape(2, 3, 2, 3), _r(2, 3),
                    (0, 1)),
    "tensorsolve-axes": (lambda a, b: LA.tensorsolve(a, b, axes=(0, 2)),
                         _spd(6).reshape(2, 3, 6).transpose(0, 2, 1).reshape(2, 6, 3)
                         .reshape(2, 2, 3, 3).transpose(0, 1, 3, 2), _r(2, 3), (0, 1)),
    # eigh reads one triangle: symmetrised, so finite differences see what it reads
    "eigh-fields": (lambda a: (LA.eigh(a + a.T).eigenvalues,
                               np.abs(LA.eigh(a + a.T).eigenvectors[:, 1:])), S4),
    "eigh-unpack": (lambda a: (lambda w, v: w[1:] * np.abs(v[0]).sum())(*LA.eigh(a + a.T)), S4),
    "slogdet-fields": (lambda a: LA.slogdet(a).logabsdet * LA.slogdet(a).sign, S4 + _r(4, 4)),
    "slogdet-unpack": (lambda a: (lambda s, l: s * l)(*LA.slogdet(a)), S4),
    "svd-fields": (lambda a: (LA.svd(a, full_matrices=False).S,
                              np.abs(LA.svd(a, full_matrices=False).U),
                              np.abs(LA.svd(a, full_matrices=False).Vh)), _r(5, 3)),
    "svd-unpack": (lambda a: (lambda u, s, vh: (u * s) @ vh)(*LA.svd(a)), _r(4, 4)),
    "qr-fields": (lambda a: (LA.qr(a).Q, LA.qr(a).R), _r(5, 3)),
    "qr-unpack": (lambda a: (lambda q, r: q @ r + q)(*LA.qr(a)), _r(3, 3)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_value_and_gradient(name):
    spec = CASES[name]
    fn, rest = spec[0], spec[1:]
    diff = (0,)
    if rest and isinstance(rest[-1], tuple):
        rest, diff = rest[:-1], rest[-1]
    check_all(fn, *rest, diff=diff)


@pytest.mark.parametrize("fn, arg, cls, fields", [
    (lambda a: LA.eigh(a), S4, "EighResult", ("eigenvalues", "eigenvectors")),
    (lambda a: LA.slogdet(a), S4, "SlogdetResult", ("sign", "logabsdet")),
    (lambda a: LA.svd(a, full_matrices=False), _r(5, 3), "SVDResult", ("U", "S", "Vh")),
    (lambda a: LA.qr(a), _r(5, 3), "QRResult", ("Q", "R")),
])
def test_named_tuple_results_in_every_mode(fn, arg, cls, fields):
    want = fn(arg)
    assert type(want).__name__ == cls
    results = {"compiled": tg.compile(fn)(arg),
               "compiled-numpy": tg.compile(fn, backend="numpy")(arg),
               "eager": fn(tg.tensor(arg))}
    seen = {}

    def grab(a):
        seen["out"] = fn(a)
        return np.sum(seen["out"][-1])
    tg.grad(grab, compile=False)(arg)
    results["compile=False"] = seen["out"]
    for mode, got in results.items():
        assert type(got) is type(want), mode
        assert isinstance(got, tuple) and len(got) == len(want), mode
        for f in fields:
            g = getattr(got, f)
            g = g.detach().numpy() if hasattr(g, "detach") else np.asarray(
                g.numpy() if hasattr(g, "numpy") and not isinstance(g, np.ndarray) else g)
            w = getattr(want, f)
            if cls in ("EighResult", "SVDResult", "QRResult") and f not in ("eigenvalues", "S"):
                g, w = np.abs(g), np.abs(w)   # columns are fixed up to sign
            np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-9, err_msg=f"{mode} {f}")


def test_named_tuple_out_tree_with_value_and_grad():
    def f(a):
        r = LA.eigh((a + a.T) / 2)
        return np.sum(r.eigenvalues ** 2), r
    for vg in (tg.value_and_grad(f, has_aux=True), tg.value_and_grad(f, has_aux=True,
                                                                     compile=False)):
        (v, aux), g = vg(S4)
        assert type(aux).__name__ == "EighResult"
        aux_w = aux.eigenvalues
        aux_w = aux_w.numpy() if hasattr(aux_w, "numpy") else aux_w
        np.testing.assert_allclose(aux_w, LA.eigvalsh(S4), rtol=1e-10)
        np.testing.assert_allclose(v, np.sum(S4 * S4), rtol=1e-10)
        np.testing.assert_allclose(g, 2 * S4, rtol=1e-9, atol=1e-9)


def test_svdvals_and_compute_uv_false_are_arrays():
    a = _r(4, 3)
    for fn in (lambda a: LA.svdvals(a), lambda a: LA.svd(a, compute_uv=False)):
        got = tg.compile(fn)(a)
        assert isinstance(got, np.ndarray)
        np.testing.assert_allclose(got, LA.svdvals(a), rtol=1e-10)


@pytest.mark.parametrize("fn, args, exc", [
    (lambda x: LA.matrix_transpose(x), (_r(3),), ValueError),
    (lambda x: LA.matrix_norm(x), (_r(3),), ValueError),
    (lambda x: LA.vector_norm(x, ord="fro"), (_r(3),), ValueError),
    (lambda x: LA.multi_dot([x]), (_r(3, 3),), ValueError),
    (lambda x: LA.multi_dot([x, x, _r(2, 2, 2)]), (_r(2, 2),), LA.LinAlgError),
    (lambda x: LA.vecdot(x, _r(4)), (_r(3),), ValueError),
    (lambda x: LA.tensorinv(x, ind=0), (_r(2, 2),), ValueError),
    (lambda x: LA.tensorinv(x, ind=1), (_r(2, 3),), LA.LinAlgError),
    (lambda x: LA.tensorsolve(x, _r(2)), (_r(2, 3),), LA.LinAlgError),
])
def test_errors_like_numpy(fn, args, exc):
    with pytest.raises(exc):
        fn(*args)
    with pytest.raises(exc):
        tg.compile(fn)(*args)
    with pytest.raises(exc):
        tg.grad(lambda *a: np.sum(fn(*a)), compile=False)(*args)
