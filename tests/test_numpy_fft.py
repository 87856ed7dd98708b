"""np.fft on tracegrad values (tracegrad/ops/fft.py), with complex
intermediates and real losses: values equal NumPy's, gradients equal
central finite differences in float64, compiled (tg.grad, tg.value_and_grad,
default backend) and eager (tg.grad(..., compile=False), torch-face Tensors).
"""
from __future__ import annotations

import numpy as np
import pytest

import tracegrad as tg
from test_numpy_functions import check, _flat, _loss_of, _cotangents

RNG = np.random.default_rng(20261127)


def _r(*shape):
    return RNG.uniform(-2.0, 2.0, shape)


def check_all(fn, *args, diff=(0,), rtol=1e-9, gtol=1e-6):
    """``check`` (values, tg.grad, compile=False, eager Tensors), and
    tg.value_and_grad against tg.grad."""
    check(fn, *args, diff=diff, rtol=rtol, gtol=gtol)
    args = [np.asarray(a, dtype=np.float64) if i in diff else a for i, a in enumerate(args)]
    loss = _loss_of(fn, _cotangents(fn(*args)))
    v, g = tg.value_and_grad(loss, argnums=diff)(*args)
    np.testing.assert_allclose(v, loss(*args), rtol=1e-9, atol=1e-9)
    for a, b in zip(_flat(g), _flat(tg.grad(loss, argnums=diff)(*args))):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


X8 = _r(8)
X7 = _r(7)
M = _r(4, 6)
T = _r(3, 4, 5)
H8 = _r(8)
F = np.fft

CASES = {
    "rfft-power": (lambda x: np.abs(F.rfft(x)) ** 2, X8),
    "rfft-power-sum": (lambda x: np.sum(np.abs(F.rfft(x)) ** 2), X7),
    "fft-filter": (lambda x, h: np.real(F.ifft(F.fft(x) * h)), X8, H8, (0, 1)),
    "fft-real-imag": (lambda x: (np.real(F.fft(x)), np.imag(F.fft(x)), np.abs(F.fft(x))), X7),
    "fft-conj": (lambda x: np.real(F.fft(x) * np.conj(F.fft(x * x))), X8),
    "fft-n-pad": (lambda x: np.imag(F.fft(x, n=11)), X8),
    "fft-n-crop": (lambda x: np.real(F.fft(x, n=5)), X8),
    "fft-axis0-ortho": (lambda x: np.real(F.fft(x, axis=0, norm="ortho")), M),
    "fft-forward": (lambda x: np.imag(F.fft(x, norm="forward")), M),
    "ifft-n": (lambda x: np.real(F.ifft(x, n=6, axis=0)) + np.imag(F.ifft(x, norm="ortho")).sum(),
               M),
    "ifft-forward": (lambda x: np.abs(F.ifft(x, norm="forward")), X7),
    "rfft-n-axis": (lambda x: np.real(F.rfft(x, n=9, axis=0)) * 2
                    + np.imag(F.rfft(x, n=3, axis=0)).sum(0),
                    M),
    "rfft-ortho": (lambda x: np.imag(F.rfft(x, norm="ortho")) + np.real(F.rfft(x, norm="forward")),
                   M),
    "irfft-of-complex": (lambda x, y: F.irfft(x + 1j * y), _r(5), _r(5), (0, 1)),
    "irfft-odd-n": (lambda x, y: F.irfft(x + 1j * y, n=9), _r(5), _r(5), (0, 1)),
    "irfft-n-crop-pad": (lambda x, y: F.irfft(x - 1j * y, n=4) + F.irfft(x * 1j + y, n=12).sum(),
                         _r(5), _r(5), (0, 1)),
    "irfft-norms": (lambda x: F.irfft(F.rfft(x) * x[:5], norm="ortho")
                    + F.irfft(F.rfft(x) ** 2, norm="forward"), X8),
    "irfft-axis0": (lambda x: F.irfft(F.fft(x, axis=0) * 1j, n=7, axis=0), M),
    "fft2": (lambda x: np.real(F.fft2(x)) + np.imag(F.fft2(x, norm="ortho")), M),
    "ifft2-s": (lambda x: np.abs(F.ifft2(x, s=(5, 3))) ** 2, M),
    "fftn": (lambda x: np.real(F.fftn(x)) * np.imag(F.fftn(x, axes=(0, 2), norm="forward")), T),
    "fftn-s-axes": (lambda x: np.imag(F.fftn(x, s=(2, 6), axes=(2, 0))), T),
    "ifftn": (lambda x: np.real(F.ifftn(x, axes=(1,))) + np.imag(F.ifftn(x)), T),
    "rfftn": (lambda x: np.abs(F.rfftn(x))
              + np.real(F.rfftn(x, s=(3, 6), axes=(0, 1), norm="ortho")).sum(),
              T),
    "rfftn-axes": (lambda x: np.imag(F.rfftn(x, axes=(2, 0))), T),
    "irfftn": (lambda x: F.irfftn(F.rfftn(x) * np.cos(F.rfftn(x).real), T.shape,
                                  axes=(0, 1, 2)), T),
    "irfftn-s-axes": (lambda x, y: F.irfftn(x + 1j * y, s=(4, 7), axes=(0, 1), norm="forward"),
                      _r(4, 4), _r(4, 4), (0, 1)),
    "rfft2-irfft2": (lambda x: F.irfft2(F.rfft2(x) * F.rfft2(x).imag, s=x.shape), M),
    "hfft-ihfft": (lambda x: F.hfft(F.ihfft(x) * 2j + x[:5], n=10), X8),
    "fftshift": (lambda x: F.fftshift(x) * np.arange(20).reshape(4, 5)
                 + F.fftshift(x, axes=1) + F.fftshift(x, axes=(0,)), _r(4, 5)),
    "ifftshift": (lambda x: F.ifftshift(x) * np.arange(20).reshape(4, 5)
                  + F.ifftshift(x, axes=-1) + F.fftshift(F.ifftshift(x, axes=(1, 0))), _r(4, 5)),
    "shift-spectrum": (lambda x: np.abs(F.fftshift(F.fft(x))), X7),
    "fftfreq-traced-d": (lambda d: F.fftfreq(9, d) + F.rfftfreq(8, d=d).sum(), np.array(0.37)),
    "fftfreq-constant": (lambda x: x * F.fftfreq(8) + F.rfftfreq(15, 0.1)[3], X8),
    # complex intermediates through the other ops (holomorphic rows keep their
    # real rules; |z|, var, norm and vdot measure moduli as NumPy does)
    "complex-mean-var-std": (lambda x: (np.real(np.mean(F.fft(x))), np.var(F.fft(x * x)),
                                        np.std(F.fft(x), axis=0)), M),
    "complex-norms": (lambda x: (np.linalg.norm(F.fft(x)), np.linalg.norm(F.fft(x), axis=0),
                                 np.linalg.vector_norm(F.fft(x), ord=1, axis=1),
                                 np.linalg.norm(F.fft(x), "fro"), np.linalg.norm(F.fft(x), 1)),
                      M),
    "complex-vdot-dot": (lambda x: (np.real(np.vdot(F.fft(x), F.fft(x) * x)),
                                    np.imag(np.vdot(F.fft(x), F.fft(x) * x)),
                                    np.real(np.dot(F.fft(x), x)),
                                    np.imag(np.linalg.vecdot(F.fft(x), F.fft(x * x)))), X8),
    "complex-holomorphic": (lambda x: np.real(np.exp(F.fft(x) / 8) + np.sqrt(F.fft(x) + 9)
                                              + np.log(F.fft(x) + 9) * F.fft(x) ** 3 / 100
                                              + np.tanh(F.fft(x) / 4) + np.cumsum(F.fft(x))
                                              + np.prod(F.fft(x[:3])) / (1 + 1j * x)), X8),
    "complex-matrix": (lambda x: np.real(np.linalg.inv(F.fft(x[:, :4]) + 8 * np.eye(4))
                                         @ F.fft2(x)) + np.abs(np.linalg.det(F.fft(x[:, 2:])))
                       + np.imag(np.einsum("ij,kj->ik", F.fft(x), F.ifft(x))).sum(1)[:, None]
                       + np.real(np.linalg.solve(F.fft(x[:, 1:5]) + 9 * np.eye(4), F.fft(x))),
                       M),
    "complex-angle": (lambda x: (np.angle(F.fft(x)), np.angle(F.fft(x) * 1j, deg=True)), X7),
    "complex-built": (lambda x, y: np.abs(x + 1j * y) + np.angle(x - y * 1j)
                      + np.real((x + 0j) * (y - 2j)), X7, _r(7), (0, 1)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_value_and_gradient(name):
    spec = CASES[name]
    fn, rest = spec[0], spec[1:]
    diff = (0,)
    if rest and isinstance(rest[-1], tuple):
        rest, diff = rest[:-1], rest[-1]
    check_all(fn, *rest, diff=diff)


@pytest.mark.parametrize("fn", [
    lambda x: F.fft(x), lambda x: F.ifft(x, n=5, norm="ortho"), lambda x: F.rfft(x, axis=0),
    lambda x: F.fft2(x, s=(3, 3)), lambda x: F.rfftn(x, norm="forward"),
    lambda x: F.irfftn(x), lambda x: F.ifftn(F.fft(x) * 1j + 2),
    lambda x: F.ihfft(x), lambda x: F.hfft(x, norm="ortho")])
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.int64])
def test_values_and_dtypes_of_complex_results(fn, dtype):
    x = (M * 3).astype(dtype)
    want = fn(x)
    for got in (tg.compile(fn)(x), tg.compile(fn, backend="numpy")(x),
                fn(tg.tensor(x)).numpy()):
        got = np.asarray(got)
        assert got.dtype == want.dtype and got.shape == want.shape
        tol = 1e-5 if want.dtype in (np.complex64, np.float32) else 1e-10
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def test_float32_gradient_is_float32():
    x = X8.astype(np.float32)
    loss = lambda x: np.sum(np.abs(F.rfft(x)) ** 2)
    for g in (tg.grad(loss)(x), tg.grad(loss, compile=False)(x)):
        assert g.dtype == np.float32
        np.testing.assert_allclose(g, tg.grad(loss)(x.astype(np.float64)), rtol=1e-4, atol=1e-4)


def test_parseval_gradient_is_exact():
    # sum |fft(x)|^2 = n sum x^2 (n: the transform's length), so the gradient is 2 n x
    cases = [(lambda x: np.sum(np.abs(F.fft(x)) ** 2), M.shape[-1]),
             (lambda x: np.sum(np.abs(F.fftn(x)) ** 2), M.size),
             (lambda x: np.sum(np.abs(F.ifft2(x, norm="ortho")) ** 2), 1)]
    for f, n in cases:
        for g in (tg.grad(f)(M), tg.grad(f, compile=False)(M)):
            np.testing.assert_allclose(g, 2 * n * M, rtol=1e-10, atol=1e-10)


def test_complex_result_returned_from_eager_numpy_face():
    # compile=False: the loss is real; a complex intermediate lives on the tape
    def loss(x, h):
        z = F.fft(x) * h
        return np.sum(z.real ** 2 - z.imag) + np.abs(z).max()
    g = tg.grad(loss, argnums=(0, 1), compile=False)(X8, H8)
    g2 = tg.grad(loss, argnums=(0, 1))(X8, H8)
    for a, b in zip(g, g2):
        assert a.dtype == np.float64
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-10)


_PLAIN_OUT = np.zeros(8, complex)


def test_errors_match_numpy():
    with pytest.raises(ValueError, match="Invalid norm value"):
        tg.compile(lambda x: F.fft(x, norm="bogus"))(X8)
    with pytest.raises(ValueError, match="Invalid number of FFT data points"):
        tg.compile(lambda x: F.fft(x, n=0))(X8)
    with pytest.raises(ValueError, match="Shape and axes have different lengths"):
        tg.compile(lambda x: F.fftn(x, s=(2, 2), axes=(0,)))(M)
    with pytest.raises(TypeError, match="out="):    # a plain array (one made inside is written)
        tg.compile(lambda x: F.fft(x, out=_PLAIN_OUT))(X8)
    f = lambda x: F.fft(x, out=np.zeros(8, complex))   # noqa: E731
    np.testing.assert_allclose(tg.compile(f)(X8), f(X8), rtol=1e-12, atol=1e-12)
    with pytest.raises(TypeError, match="must be real"):
        tg.compile(lambda x: F.rfft(F.fft(x)))(X8)
    with pytest.raises(IndexError):   # NumPy: IndexError (AxisError is one)
        tg.compile(lambda x: F.fft(x, axis=2))(M)
    with pytest.raises(TypeError):
        tg.compile(lambda x: F.fft(x, n=4.0))(M)
    with pytest.raises(TypeError):
        tg.compile(lambda x: F.fft(x, axis=0.0))(M)
    with pytest.raises(ValueError):
        tg.compile(lambda x: F.fftshift(x[0, 0]))(M)
    for fn in (lambda x: F.fftn(x, axes=()), lambda x: F.rfftn(x, axes=())):
        try:
            want = fn(M)
        except IndexError:
            with pytest.raises(IndexError):
                tg.compile(fn)(M)
        else:
            got = tg.compile(fn)(M)
            assert got.dtype == want.dtype
            np.testing.assert_array_equal(got, want)


def test_grad_of_a_complex_output_is_refused():
    with pytest.raises(Exception, match="complex"):
        tg.grad(lambda x: np.sum(F.fft(x)))(X8)


# --- the rows themselves (tests/test_ops_registry.py draws real values only) ---------------------

def _complex(shape, dtype):
    return (RNG.standard_normal(shape) + 1j * RNG.standard_normal(shape)).astype(dtype)


ROW_CASES = [
    ("real", lambda dt: _complex((3, 4), dt), {}),
    ("imag", lambda dt: _complex((3, 4), dt), {}),
    ("conj", lambda dt: _complex((3, 4), dt), {}),
    ("complex_abs", lambda dt: _complex((3, 4), dt), {}),
    ("fft", lambda dt: _complex((3, 4), dt), {"axis": 1, "norm": "backward"}),
    ("ifft", lambda dt: _complex((3, 4), dt), {"axis": 0, "norm": "ortho"}),
    ("rfft", lambda dt: RNG.standard_normal((3, 5)).astype(np.finfo(dt).dtype),
     {"axis": 1, "norm": "forward"}),
    ("irfft", lambda dt: _complex((3, 4), dt), {"n": 6, "axis": 1, "norm": "backward"}),
    ("irfft", lambda dt: _complex((4, 2), dt), {"n": 3, "axis": 0, "norm": "ortho"}),
]


@pytest.mark.parametrize("name, make, attrs", ROW_CASES)
@pytest.mark.parametrize("dtype", [np.complex128, np.complex64])
def test_row_shape_rule_and_numpy_emitter_match_impl(name, make, attrs, dtype):
    from tracegrad.ops.primitives import REGISTRY, Aval
    prim = REGISTRY[name]
    x = make(dtype)
    want = prim.impl(np, x, **attrs)
    rule = prim.shape(Aval(x.shape, x.dtype), **attrs)
    assert tuple(rule.shape) == want.shape and np.dtype(rule.dtype) == want.dtype
    expr = prim.numpy.format("v0", **{k: repr(v) for k, v in attrs.items()})
    got = eval(expr, {"np": np, "v0": x})
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
    assert not np.shares_memory(got, x)   # the buffer planner may reuse x
    assert not prim.elementwise           # never fused into a C/CUDA kernel


def test_forward_mode():
    def fn(x):
        z = F.fft(x) * np.arange(8)
        return (np.real(F.ifft(z)) + F.irfft(F.rfft(x), n=8) + np.imag(z) + np.abs(z)
                + np.real(np.conj(z) * z))
    t = RNG.standard_normal(8)
    out, tout = tg.jvp(fn, (X8,), (t,))
    np.testing.assert_allclose(out, fn(X8), rtol=1e-12, atol=1e-12)
    eps = 1e-6
    np.testing.assert_allclose(tout, (fn(X8 + eps * t) - fn(X8 - eps * t)) / (2 * eps),
                               rtol=1e-6, atol=1e-6)


def test_jacobian_and_hessian():
    # jacobian batches the cotangents (each row's batch rule); hessian is forward over reverse
    x = _r(3, 6)
    def f(x):
        return ((np.abs(F.rfft(x, axis=0)) ** 2).sum(0)
                + np.imag(F.fft(np.conj(F.fft(x)) * 1j)).sum(0)
                + F.irfft(F.rfft(x) * 1j, n=6, axis=1).sum(0))
    J = tg.jacobian(f)(x)
    eps = 1e-6
    Jfd = np.zeros(J.shape)
    for idx in np.ndindex(x.shape):
        d = np.zeros_like(x)
        d[idx] = eps
        Jfd[(...,) + idx] = (f(x + d) - f(x - d)) / (2 * eps)
    np.testing.assert_allclose(J, Jfd, rtol=1e-6, atol=1e-6)
    h = lambda v: np.sum(np.abs(F.fft(v)) ** 3)
    H = tg.hessian(h)(X8)
    g = tg.grad(h)
    Hfd = np.stack([(g(X8 + eps * e) - g(X8 - eps * e)) / (2 * eps) for e in np.eye(8)])
    np.testing.assert_allclose(H, Hfd, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["rfft-power", "fft-filter", "irfftn", "fft-conj"])
def test_native_target_calls_numpy_for_complex_values(name):
    spec = CASES[name]
    fn, rest = spec[0], spec[1:]
    diff = (0, 1) if isinstance(rest[-1], tuple) else (0,)
    args = [a for a in rest if not isinstance(a, tuple)]
    loss = lambda *a: np.sum(fn(*a) ** 2)
    want = tg.grad(loss, argnums=diff, backend="numpy")(*args)
    lowered = tg.grad(loss, argnums=diff, backend="native").lower(*args)
    assert "np.fft." in lowered.source
    got = tg.grad(loss, argnums=diff, backend="native")(*args)
    for a, b in zip(_flat(got), _flat(want)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_complexity_predicates():
    def f(x):
        z = F.fft(x)
        w = z.real + 0j
        assert np.iscomplexobj(z) and not np.isrealobj(z) and np.isrealobj(x)
        assert not np.iscomplexobj(x)
        return np.iscomplex(z), np.isreal(z), np.iscomplex(w), np.isreal(w), np.isreal(x)
    x = X8.copy()
    want = f(x)
    for got in (tg.compile(f)(x), tg.compile(f, backend="numpy")(x)):
        for g, w in zip(got, want):
            assert np.asarray(g).dtype == np.bool_
            np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("fn", [
    lambda x: np.linalg.slogdet(F.fft(x)), lambda x: np.linalg.eigh(F.fft(x)),
    lambda x: np.linalg.eigvalsh(F.fft(x)), lambda x: np.linalg.svd(F.fft(x)),
    lambda x: np.linalg.qr(F.fft(x)), lambda x: np.linalg.cholesky(F.fft(x)),
    lambda x: np.linalg.pinv(F.fft(x)), lambda x: np.linalg.lstsq(F.fft(x), x[0]),
    lambda x: np.linalg.norm(F.fft(x), 2), lambda x: np.linalg.matrix_norm(F.fft(x), ord="nuc"),
])
def test_complex_factorizations_are_refused_not_wrong(fn):
    x = _r(3, 3)
    for run in (tg.compile(fn), tg.grad(lambda x: np.sum(np.abs(_flat(fn(x))[-1])),
                                        compile=False)):
        with pytest.raises(TypeError, match="complex"):
            run(x)


def test_cuda_target_calls_cupy_for_complex_values(monkeypatch):
    """The CUDA target (run by tracegrad.testing's emulator): complex values
    are CuPy calls between the kernels, never kernel code."""
    import shutil
    from tracegrad import testing
    if shutil.which(testing.CXX) is None:
        pytest.skip(f"the emulator needs a host C++ compiler ({testing.CXX})")
    monkeypatch.setenv("TRACEGRAD_CACHE", "0")

    def f(x, h):
        return (np.sum(np.real(F.ifft(F.fft(x) * h)) ** 2) + np.sum(np.abs(F.rfft(x)) ** 2)
                + np.sum(F.irfft(F.rfft(x) * h[:5] * 1j, n=8) ** 2))
    want = tg.value_and_grad(f, argnums=(0, 1), backend="numpy")(X8, H8)
    with testing.emulated_cupy() as cp:
        vg = tg.value_and_grad(f, argnums=(0, 1), backend="cupy")
        got = vg(cp.asarray(X8), cp.asarray(H8))
        low = vg.lower(cp.asarray(X8), cp.asarray(H8))
    assert "__global__" in low.cuda_source    # the real parts still run as kernels
    for line in low.cuda_source.splitlines():  # ... and no kernel code touches a complex value
        assert "complex" not in line.split("//")[0], line
    assert "np.fft.fft(" in low.source and "np.fft.irfft(" in low.source
    np.testing.assert_allclose(float(got[0]), want[0], rtol=1e-12)
    for a, b in zip(got[1], want[1]):
        np.testing.assert_allclose(a.get(), b, rtol=1e-10, atol=1e-12)
