"""SciPy as written: unmodified ``scipy.*`` calls inside a differentiated
function (tracegrad/frontend/scipy_calls.py, the ufuncs through
tracegrad/ops/scipy_special.py), compiled and with compile=False, reached as a
module attribute (``scipy.linalg.expm(a)``), through a module object the
function holds (``from scipy import linalg``) and as a function imported by
name (``from scipy.linalg import expm``): values equal to SciPy's, float64
gradients equal to central finite differences.  Then the walk: every public
callable of the SciPy modules either works on a traced / recorded value or
refuses it with an error naming it, never a silently lost gradient."""
from __future__ import annotations

import inspect
import zlib

import numpy as np
import pytest

import tracegrad as tg

scipy = pytest.importorskip("scipy")
import scipy.special  # noqa: E402  (after tracegrad, as a user may)
import scipy.linalg  # noqa: E402
import scipy.signal  # noqa: E402
import scipy.fft  # noqa: E402
import scipy.integrate  # noqa: E402
import scipy.stats  # noqa: E402
import scipy.optimize  # noqa: E402
import scipy.interpolate  # noqa: E402
from scipy.linalg import expm  # noqa: E402
from scipy.special import expit  # noqa: E402
from scipy import linalg as sla  # noqa: E402
from scipy.optimize import brenth, bisect, ridder, toms748  # noqa: E402
from scipy.integrate import quad  # noqa: E402

MODES = [True, False]


def R(name):
    return np.random.default_rng(zlib.crc32(name.encode()))


def U(lo, hi, *shape):
    return lambda r: r.uniform(lo, hi, shape)


def SPD(n):
    def make(r):
        a = r.normal(size=(n, n))
        return a @ a.T + n * np.eye(n)
    return make


def NEAR_I(n, s=0.3):
    return lambda r: np.eye(n) + s * r.normal(size=(n, n)) / n


def GEN(n):
    return lambda r: r.normal(size=(n, n)) + 3 * np.eye(n)


def C(v):
    return lambda r: v


def _sum(out):
    """A scalar that depends on every element (complex parts included)."""
    if isinstance(out, (tuple, list)):
        total = 0.0
        for o in out:
            if isinstance(o, (bool, int, np.integer)) or (
                    hasattr(o, "dtype") and np.dtype(o.dtype).kind in "biu"):
                continue
            total = total + _sum(o)
        return total
    if np.dtype(getattr(out, "dtype", np.float64)).kind == "c":
        return np.sum(np.sin(np.real(out))) + np.sum(np.cos(np.imag(out)))
    return np.sum(np.sin(out))


# id -> (module, name, operand makers, differentiated positions, keywords, post, rtol)
# post(result) picks what has a defined derivative (eigenvectors up to sign...)
CASES = {
    # scipy.special: ufuncs
    "expit": ("special", "expit", [U(-4, 4, 3, 2)], [0], {}, None, 1e-7),
    "logit": ("special", "logit", [U(0.1, 0.9, 4)], [0], {}, None, 1e-7),
    "erf": ("special", "erf", [U(-2, 2, 4)], [0], {}, None, 1e-7),
    "erfc": ("special", "erfc", [U(-2, 2, 4)], [0], {}, None, 1e-7),
    "erfinv": ("special", "erfinv", [U(-0.9, 0.9, 4)], [0], {}, None, 1e-6),
    "erfcinv": ("special", "erfcinv", [U(0.1, 1.9, 4)], [0], {}, None, 1e-6),
    "erfcx": ("special", "erfcx", [U(-1, 3, 4)], [0], {}, None, 1e-7),
    "ndtr": ("special", "ndtr", [U(-3, 3, 4)], [0], {}, None, 1e-7),
    "ndtri": ("special", "ndtri", [U(0.05, 0.95, 4)], [0], {}, None, 1e-6),
    "log_ndtr": ("special", "log_ndtr", [U(-10, 3, 4)], [0], {}, None, 1e-7),
    "gammaln": ("special", "gammaln", [U(0.5, 8, 4)], [0], {}, None, 1e-7),
    "digamma": ("special", "digamma", [U(0.5, 8, 4)], [0], {}, None, 1e-7),
    "psi": ("special", "psi", [U(0.5, 8, 4)], [0], {}, None, 1e-7),
    "polygamma": ("special", "polygamma", [C(2), U(0.5, 5, 4)], [1], {}, None, 1e-6),
    "gamma": ("special", "gamma", [U(0.5, 4, 4)], [0], {}, None, 1e-7),
    "beta": ("special", "beta", [U(0.5, 3, 4), U(0.5, 3, 4)], [0, 1], {}, None, 1e-7),
    "betaln": ("special", "betaln", [U(0.5, 3, 4), U(0.5, 3, 4)], [0, 1], {}, None, 1e-7),
    "xlogy": ("special", "xlogy", [U(0.1, 2, 4), U(0.1, 2, 4)], [0, 1], {}, None, 1e-7),
    "xlog1py": ("special", "xlog1py", [U(0.1, 2, 4), U(0.1, 2, 4)], [0, 1], {}, None, 1e-7),
    "entr": ("special", "entr", [U(0.1, 2, 4)], [0], {}, None, 1e-7),
    "rel_entr": ("special", "rel_entr", [U(0.1, 2, 4), U(0.1, 2, 4)], [0, 1], {}, None, 1e-7),
    "kl_div": ("special", "kl_div", [U(0.1, 2, 4), U(0.1, 2, 4)], [0, 1], {}, None, 1e-7),
    "i0": ("special", "i0", [U(-3, 3, 4)], [0], {}, None, 1e-7),
    "i0e": ("special", "i0e", [U(-3, 3, 4)], [0], {}, None, 1e-7),
    "i1": ("special", "i1", [U(-3, 3, 4)], [0], {}, None, 1e-7),
    "i1e": ("special", "i1e", [U(-3, 3, 4)], [0], {}, None, 1e-7),
    "sinc": ("special", "sinc", [U(-3, 3, 4)], [0], {}, None, 1e-7),
    "gammainc": ("special", "gammainc", [C(np.array([1.5, 2.0, 3.0])), U(0.5, 4, 3)], [1], {},
                 None, 1e-7),
    "gammaincc": ("special", "gammaincc", [C(np.array([1.5, 2.0, 3.0])), U(0.5, 4, 3)], [1],
                  {}, None, 1e-7),
    "iv": ("special", "iv", [C(np.array([0.5, 1.0, 2.5])), U(0.2, 3, 3)], [1], {}, None, 1e-7),
    "kv": ("special", "kv", [C(np.array([0.5, 1.0, 2.5])), U(0.2, 3, 3)], [1], {}, None, 1e-7),
    "jv": ("special", "jv", [C(np.array([0.5, 1.0, 2.5])), U(0.2, 3, 3)], [1], {}, None, 1e-7),
    "yv": ("special", "yv", [C(np.array([0.5, 1.0, 2.5])), U(0.2, 3, 3)], [1], {}, None, 1e-7),
    # scipy.special: Python functions
    "logsumexp": ("special", "logsumexp", [U(-2, 2, 3, 4)], [0], {"axis": 1}, None, 1e-7),
    "logsumexp_b": ("special", "logsumexp", [U(-2, 2, 3, 4)], [0],
                    {"b": np.array([0.5, 1.0, 2.0, 0.1])}, None, 1e-7),
    "softmax": ("special", "softmax", [U(-2, 2, 3, 4)], [0], {}, None, 1e-7),
    "softmax_axis": ("special", "softmax", [U(-2, 2, 3, 4)], [0], {"axis": 0}, None, 1e-7),
    "log_softmax": ("special", "log_softmax", [U(-2, 2, 3, 4)], [0], {"axis": -1}, None, 1e-7),
    # scipy.linalg
    "solve": ("linalg", "solve", [GEN(3), U(-1, 1, 3, 2)], [0, 1], {}, None, 1e-6),
    "solve_vec": ("linalg", "solve", [GEN(3), U(-1, 1, 3)], [0, 1], {}, None, 1e-6),
    "solve_pos": ("linalg", "solve", [SPD(3), U(-1, 1, 3)], [0, 1], {"assume_a": "pos"}, None,
                  1e-6),
    "solve_T": ("linalg", "solve", [GEN(3), U(-1, 1, 3)], [0, 1], {"transposed": True}, None,
                1e-6),
    "solve_triangular": ("linalg", "solve_triangular", [GEN(3), U(-1, 1, 3, 2)], [0, 1],
                         {"lower": True}, None, 1e-6),
    "solve_triangular_T": ("linalg", "solve_triangular", [GEN(3), U(-1, 1, 3)], [0, 1],
                           {"trans": "T", "unit_diagonal": True}, None, 1e-6),
    "cholesky": ("linalg", "cholesky", [SPD(3)], [0], {}, None, 1e-6),
    "cholesky_lower": ("linalg", "cholesky", [SPD(3)], [0], {"lower": True}, None, 1e-6),
    "cho_factor": ("linalg", "cho_factor", [SPD(3)], [0], {}, lambda r: r[0], 1e-6),
    "lu_factor": ("linalg", "lu_factor", [GEN(4)], [0], {}, lambda r: r[0], 1e-6),
    "lu": ("linalg", "lu", [GEN(4)], [0], {}, None, 1e-6),
    "lu_permute_l": ("linalg", "lu", [GEN(4)], [0], {"permute_l": True}, None, 1e-6),
    "inv": ("linalg", "inv", [GEN(3)], [0], {}, None, 1e-6),
    "det": ("linalg", "det", [GEN(3)], [0], {}, None, 1e-6),
    "eigh": ("linalg", "eigh", [SPD(3)], [0], {}, lambda r: (r[0], r[1] ** 2), 1e-6),
    "eigh_upper": ("linalg", "eigh", [SPD(3)], [0], {"lower": False, "eigvals_only": True},
                   None, 1e-6),
    "eigvalsh": ("linalg", "eigvalsh", [SPD(3)], [0], {}, None, 1e-6),
    "svd": ("linalg", "svd", [U(-1, 1, 3, 3)], [0], {}, lambda r: r[1], 1e-6),
    "svdvals": ("linalg", "svdvals", [U(-1, 1, 4, 3)], [0], {}, None, 1e-6),
    "qr": ("linalg", "qr", [GEN(3)], [0], {}, lambda r: r[0] * np.sign(np.diag(r[1])), 1e-6),
    "qr_economic": ("linalg", "qr", [U(-1, 1, 4, 3)], [0], {"mode": "economic"},
                    lambda r: r[1] * np.sign(np.diag(r[1]))[:, None], 1e-6),
    "expm": ("linalg", "expm", [U(-1, 1, 3, 3)], [0], {}, None, 1e-6),
    "expm_batched": ("linalg", "expm", [U(-1, 1, 2, 3, 3)], [0], {}, None, 1e-6),
    "expm_frechet": ("linalg", "expm_frechet", [U(-1, 1, 3, 3), U(-1, 1, 3, 3)], [0, 1], {},
                     None, 1e-6),
    "sqrtm": ("linalg", "sqrtm", [SPD(3)], [0], {}, None, 1e-6),
    "logm": ("linalg", "logm", [NEAR_I(3)], [0], {}, None, 1e-6),
    "block_diag": ("linalg", "block_diag", [U(-1, 1, 2, 2), U(-1, 1, 1, 3)], [0, 1], {}, None,
                   1e-7),
    "toeplitz": ("linalg", "toeplitz", [U(-1, 1, 3), U(-1, 1, 4)], [0, 1], {}, None, 1e-7),
    "circulant": ("linalg", "circulant", [U(-1, 1, 4)], [0], {}, None, 1e-7),
    "hankel": ("linalg", "hankel", [U(-1, 1, 3), U(-1, 1, 4)], [0, 1], {}, None, 1e-7),
    "norm": ("linalg", "norm", [U(-1, 1, 3, 3)], [0], {}, None, 1e-7),
    "norm_ord": ("linalg", "norm", [U(-1, 1, 3, 4)], [0], {"ord": 1, "axis": 1}, None, 1e-7),
    "pinv": ("linalg", "pinv", [U(-1, 1, 4, 3)], [0], {}, None, 1e-6),
    "lstsq": ("linalg", "lstsq", [U(-1, 1, 5, 3), U(-1, 1, 5)], [0, 1], {},
              lambda r: (r[0], r[1]), 1e-6),
    "solve_continuous_lyapunov": ("linalg", "solve_continuous_lyapunov",
                                  [lambda r: -SPD(3)(r), U(-1, 1, 3, 3)], [0, 1], {}, None,
                                  1e-6),
    "solve_sylvester": ("linalg", "solve_sylvester", [GEN(3), GEN(2), U(-1, 1, 3, 2)],
                        [0, 1, 2], {}, None, 1e-6),
    # scipy.signal
    "convolve": ("signal", "convolve", [U(-1, 1, 6), U(-1, 1, 3)], [0, 1], {}, None, 1e-7),
    "convolve_same": ("signal", "convolve", [U(-1, 1, 6), U(-1, 1, 3)], [0, 1],
                      {"mode": "same"}, None, 1e-7),
    "convolve_valid_2d": ("signal", "convolve", [U(-1, 1, 4, 5), U(-1, 1, 2, 3)], [0, 1],
                          {"mode": "valid"}, None, 1e-7),
    "correlate": ("signal", "correlate", [U(-1, 1, 6), U(-1, 1, 3)], [0, 1], {}, None, 1e-7),
    "correlate_valid": ("signal", "correlate", [U(-1, 1, 3), U(-1, 1, 6)], [0, 1],
                        {"mode": "valid"}, None, 1e-7),
    "fftconvolve": ("signal", "fftconvolve", [U(-1, 1, 6), U(-1, 1, 3)], [0, 1],
                    {"mode": "same"}, None, 1e-7),
    "oaconvolve": ("signal", "oaconvolve", [U(-1, 1, 6), U(-1, 1, 3)], [0, 1], {}, None, 1e-7),
    "lfilter": ("signal", "lfilter", [U(-1, 1, 3), C(np.array([1.0, -0.5, 0.2])),
                                      U(-1, 1, 8)], [0, 2], {}, None, 1e-6),
    "lfilter_a": ("signal", "lfilter", [C(np.array([0.5, 0.3])), lambda r: np.array(
        [1.0, -0.4, 0.1]) + 0.05 * r.normal(size=3), U(-1, 1, 2, 7)], [1, 2], {"axis": 1}, None,
                  1e-6),
    "sosfilt": ("signal", "sosfilt", [lambda r: np.array(
        [[0.2, 0.3, 0.1, 1.0, -0.3, 0.1], [1.0, 0.5, 0.0, 1.0, 0.2, 0.05]]), U(-1, 1, 9)],
                [1], {}, None, 1e-6),      # (SciPy refuses sos[:, 3] != 1: no FD in sos)
    # scipy.fft
    "fft": ("fft", "fft", [U(-1, 1, 6)], [0], {}, None, 1e-7),
    "rfft": ("fft", "rfft", [U(-1, 1, 6)], [0], {"norm": "ortho"}, None, 1e-7),
    "irfft": ("fft", "irfft", [U(-1, 1, 5)], [0], {"n": 8}, None, 1e-7),
    "fft2": ("fft", "fft2", [U(-1, 1, 3, 4)], [0], {}, None, 1e-7),
    "ifftn": ("fft", "ifftn", [U(-1, 1, 3, 4)], [0], {"workers": 2}, None, 1e-7),
    # scipy.integrate
    "trapezoid": ("integrate", "trapezoid", [U(-1, 1, 7)], [0], {"dx": 0.3}, None, 1e-7),
    "trapezoid_x": ("integrate", "trapezoid", [U(-1, 1, 2, 5), lambda r: np.sort(
        r.uniform(0, 2, 5))], [0, 1], {}, None, 1e-7),
    "simpson_odd": ("integrate", "simpson", [U(-1, 1, 7)], [0], {"dx": 0.3}, None, 1e-7),
    "simpson_even_x": ("integrate", "simpson", [U(-1, 1, 8), lambda r: np.sort(
        r.uniform(0, 2, 8))], [0, 1], {}, None, 1e-6),
    "cumulative_trapezoid": ("integrate", "cumulative_trapezoid", [U(-1, 1, 6), lambda r:
                             np.sort(r.uniform(0, 2, 6))], [0, 1], {"initial": 0}, None, 1e-7),
}


def _call_as(style, module, name, kwargs, post):
    """The user's function, written three ways."""
    if style == "attribute":        # import scipy.linalg; scipy.linalg.expm(a)
        def f(*xs):
            r = getattr(getattr(scipy, module), name)(*xs, **kwargs)
            return _sum(post(r) if post else r)
    elif style == "module":         # from scipy import linalg; linalg.expm(a)
        mod = getattr(scipy, module)

        def f(*xs):
            r = getattr(mod, name)(*xs, **kwargs)
            return _sum(post(r) if post else r)
    else:                           # from scipy.linalg import expm; expm(a)
        fn = getattr(getattr(scipy, module), name)

        def f(*xs):
            r = fn(*xs, **kwargs)
            return _sum(post(r) if post else r)
    return f


def _fd(f, args, i, eps=1e-6):
    x = np.asarray(args[i], float)
    g = np.zeros_like(x)
    for k in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[k] = eps
        hi = list(args)
        lo = list(args)
        hi[i], lo[i] = x + e, x - e
        g[k] = (f(*hi) - f(*lo)) / (2 * eps)
    return g


def _compare_values(got, want, rtol):
    if isinstance(want, tuple) or (isinstance(want, list) and isinstance(got, (tuple, list))):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            _compare_values(g, w, rtol)
        return
    if isinstance(want, (bool, int)):
        assert got == want
        return
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("style", ["attribute", "module", "name"])
@pytest.mark.parametrize("compile", MODES, ids=["compiled", "eager"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_scipy_as_written(case, compile, style):
    module, name, makers, wrt, kwargs, post, rtol = CASES[case]
    r = R(case)
    args = [m(r) for m in makers]
    f = _call_as(style, module, name, kwargs, post)
    want = f(*args)              # plain arrays: SciPy itself
    static = tuple(i for i, a in enumerate(args) if isinstance(a, int))   # polygamma's n
    value, grads = tg.value_and_grad(f, argnums=tuple(wrt), compile=compile,
                                     fallback=not compile, static_argnums=static)(*args)
    np.testing.assert_allclose(value, want, rtol=1e-10, atol=1e-12)
    for i, g in zip(wrt, grads):
        np.testing.assert_allclose(g, _fd(f, args, i), rtol=rtol, atol=rtol * 0.1,
                                   err_msg=f"d/d argument {i}")


@pytest.mark.parametrize("case", sorted(CASES))
def test_values_equal_scipy(case):
    """The full result (every output of a tuple) of the traced call is SciPy's."""
    module, name, makers, wrt, kwargs, post, rtol = CASES[case]
    args = [m(R(case)) for m in makers]
    fn = getattr(getattr(scipy, module), name)
    if case.startswith("eigh"):   # eigenvectors up to sign (LAPACK drivers differ)
        post = post or (lambda r: r)
    else:
        post = lambda r: r  # noqa: E731
    want = post(fn(*args, **kwargs))
    static = tuple(i for i, a in enumerate(args) if isinstance(a, int))
    got = tg.compile(lambda *xs: post(fn(*xs, **kwargs)), static_argnums=static,
                     fallback=False)(*args)
    if isinstance(want, tuple) and not isinstance(got, tuple):
        got = tuple(got)
    _compare_values(got, want, rtol)


# --- the literal import styles, in the test module's own globals -----------------------------

def uses_from_import(a):
    return np.sum(expm(a) * expit(a))


def uses_module_object(a):
    return np.sum(sla.expm(a)) + np.sum(scipy.special.expit(a))


def _helper(a):
    return scipy.linalg.expm(a)


def uses_helper(a):
    return np.sum(np.cos(_helper(a)))


@pytest.mark.parametrize("compile", MODES, ids=["compiled", "eager"])
@pytest.mark.parametrize("f", [uses_from_import, uses_module_object, uses_helper])
def test_import_styles_and_helpers(f, compile):
    a = np.array([[0.1, 0.3, -0.2], [-0.2, 0.4, 0.1], [0.05, 0.2, -0.3]])
    value, g = tg.value_and_grad(f, compile=compile, fallback=not compile)(a)
    np.testing.assert_allclose(value, f(a), rtol=1e-12)
    np.testing.assert_allclose(g, _fd(f, [a], 0), rtol=1e-6, atol=1e-8)


def test_plain_arrays_go_to_scipy():
    """Inside a traced function, SciPy on constants is SciPy's own call: its
    exact result, folded into the trace."""
    c = np.array([[1.0, 0.5], [0.2, 2.0]])

    def f(x):
        return np.sum(x * expm(c))
    np.testing.assert_allclose(tg.grad(f)(np.ones((2, 2))), scipy.linalg.expm(c), rtol=0,
                               atol=0)


@pytest.mark.parametrize("compile", MODES, ids=["compiled", "eager"])
def test_created_constants_go_to_scipy(compile):
    """An array the function made and filled with constants is no
    differentiated value: any SciPy function computes on it, as before."""
    def f(x):
        buf = np.zeros(4)
        buf[1] = 2.0
        return np.sum(x * scipy.signal.detrend(buf)) + np.sum(
            scipy.linalg.expm(np.outer(buf, buf) * 0.1))
    g = tg.grad(f, compile=compile, fallback=not compile)(np.ones(4))
    np.testing.assert_allclose(g, scipy.signal.detrend(np.array([0.0, 2.0, 0.0, 0.0])),
                               rtol=1e-12)


def test_forward_mode_and_second_derivative():
    a = np.array([[0.1, 0.3], [-0.2, 0.4]])
    t = np.array([[0.5, -1.0], [0.3, 0.2]])
    out, tan = tg.jvp(lambda x: scipy.linalg.expm(x), (a,), (t,))
    np.testing.assert_allclose(out, scipy.linalg.expm(a), rtol=1e-12)
    np.testing.assert_allclose(tan, scipy.linalg.expm_frechet(a, t)[1], rtol=1e-10)
    x = np.array([0.3, -1.2, 2.0])
    h = tg.hessian(lambda v: np.sum(scipy.special.log_ndtr(v)))(x)
    eps = 1e-5
    fd = (scipy.special.log_ndtr(x + eps) - 2 * scipy.special.log_ndtr(x)
          + scipy.special.log_ndtr(x - eps)) / eps ** 2
    np.testing.assert_allclose(np.diag(h), fd, rtol=1e-4)


# --- scipy.stats: methods of the distribution objects, and frozen ones ------------------------

# name: (shape parameters, x maker, differentiated: x and the parameters given)
STATS = {
    "norm": ((), U(-2, 2, 4), ("logpdf", "pdf", "logcdf", "cdf", "sf", "logsf")),
    "t": ((4.5,), U(-2, 2, 4), ("logpdf", "pdf", "cdf", "sf")),
    "gamma": ((2.5,), U(0.2, 4, 4), ("logpdf", "pdf", "cdf", "sf")),
    "beta": ((2.0, 3.5), U(0.1, 0.9, 4), ("logpdf", "pdf", "cdf", "sf")),
    "expon": ((), U(0.1, 3, 4), ("logpdf", "pdf", "logcdf", "cdf", "sf", "logsf")),
    "lognorm": ((0.7,), U(0.2, 3, 4), ("logpdf", "pdf", "logcdf", "cdf", "sf", "logsf")),
    "cauchy": ((), U(-2, 2, 4), ("logpdf", "pdf", "cdf", "sf")),
    "laplace": ((), U(-2, 2, 4), ("logpdf", "pdf", "cdf", "sf")),
    "logistic": ((), U(-2, 2, 4), ("logpdf", "pdf", "logcdf", "cdf", "sf", "logsf")),
    "chi2": ((3.0,), U(0.2, 5, 4), ("logpdf", "pdf", "cdf", "sf")),
    "uniform": ((), U(0.05, 0.95, 4), ("logpdf", "pdf", "cdf", "sf")),
}
DISCRETE = {
    "poisson": ((2.5,), "mu", np.array([0.0, 1.0, 3.0, 5.0])),
    "binom": ((8, 0.3), "p", np.array([0.0, 2.0, 3.0, 8.0])),
    "nbinom": ((4, 0.4), "p", np.array([0.0, 2.0, 3.0, 7.0])),
}


@pytest.mark.parametrize("compile", MODES, ids=["compiled", "eager"])
@pytest.mark.parametrize("dist", sorted(STATS))
def test_stats_methods(dist, compile):
    shapes, make, methods = STATS[dist]
    x = make(R(dist))
    loc, scale = 0.3, 1.7
    d = getattr(scipy.stats, dist)
    for m in methods:
        def f(x, loc, scale, _m=m):
            return np.sum(getattr(d, _m)(x, *shapes, loc=loc, scale=scale))
        xx = x * scale + loc
        value, grads = tg.value_and_grad(f, argnums=(0, 1, 2), compile=compile,
                                         fallback=not compile)(xx, loc, scale)
        np.testing.assert_allclose(value, f(xx, loc, scale), rtol=1e-9, err_msg=m)
        for i, g in enumerate(grads):
            np.testing.assert_allclose(g, _fd(f, [xx, loc, scale], i), rtol=2e-6, atol=1e-8,
                                       err_msg=f"{dist}.{m} d/d argument {i}")


@pytest.mark.parametrize("compile", MODES, ids=["compiled", "eager"])
@pytest.mark.parametrize("dist", sorted(DISCRETE))
def test_stats_discrete(dist, compile):
    shapes, param, k = DISCRETE[dist]
    d = getattr(scipy.stats, dist)
    for m in ("logpmf", "pmf", "cdf"):
        def f(p, _m=m):
            args = list(shapes)
            args[-1] = p
            return np.sum(getattr(d, _m)(k, *args))
        p = float(shapes[-1])
        value, g = tg.value_and_grad(f, compile=compile, fallback=not compile)(p)
        np.testing.assert_allclose(value, f(p), rtol=1e-9, err_msg=m)
        np.testing.assert_allclose(g, _fd(f, [p], 0), rtol=1e-6, atol=1e-9, err_msg=m)


@pytest.mark.parametrize("compile", MODES, ids=["compiled", "eager"])
def test_stats_frozen_and_multivariate(compile):
    from scipy.stats import norm, multivariate_normal, dirichlet
    frozen = norm(0.5, 2.0)                       # made outside: plain parameters

    def f(x, mu):
        inner = norm(loc=mu, scale=1.5)           # frozen inside, on a traced parameter
        return (np.sum(frozen.logpdf(x)) + np.sum(inner.cdf(x))
                + multivariate_normal.logpdf(x[:2], mean=np.array([0.1, 0.2]),
                                             cov=np.array([[2.0, 0.3], [0.3, 1.0]]))
                + dirichlet.logpdf(np.array([0.2, 0.3, 0.5]), x[1:] ** 2 + 1.0))
    x = np.array([0.3, -0.4, 1.1, 0.7])
    value, (gx, gmu) = tg.value_and_grad(f, argnums=(0, 1), compile=compile,
                                         fallback=not compile)(x, 0.2)
    np.testing.assert_allclose(value, f(x, 0.2), rtol=1e-10)
    np.testing.assert_allclose(gx, _fd(f, [x, 0.2], 0), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(gmu, _fd(f, [x, 0.2], 1), rtol=1e-6, atol=1e-8)


# --- refusals -------------------------------------------------------------------------------

@pytest.mark.parametrize("compile", MODES, ids=["compiled", "eager"])
def test_unsupported_refuses_by_name(compile):
    """quad / minimize_scalar on a differentiated value: an error naming the
    function, never SciPy's plain result with a zero gradient."""
    def integral(t):
        return scipy.integrate.fixed_quad(lambda x: np.sin(t * x), 0.0, 1.0)[0]

    def minimum(t):
        return scipy.optimize.linprog(t * np.array([1.0, 2.0]), bounds=[(0, 1), (0, 1)]).x[0]

    def via_args(t):
        return scipy.integrate.tplquad(lambda z, y, x, k: k * x * y * z, 0.0, 1.0, 0.0, 1.0,
                                       0.0, 1.0, args=(t,))[0]

    for f, name in ((integral, "scipy.integrate.fixed_quad"),
                    (minimum, "scipy.optimize.linprog"),
                    (via_args, "scipy.integrate.tplquad")):
        with pytest.raises(NotImplementedError, match=name.replace(".", r"\.")):
            tg.grad(f, compile=compile, fallback=not compile)(2.0)


# --- scipy.optimize's scalar root finders: SciPy's root, the implicit function theorem -------

def _cube_root(t):
    return scipy.optimize.brentq(lambda x: x ** 3 - t, 0.0, 10.0)


def _kepler(t):          # parameters through args=, the root used further on
    return np.sin(brenth(lambda e, m, ecc: e - ecc * np.sin(e) - m, 0.0, 4.0,
                         args=(t, 0.3))) * t


def _newton(t):
    return scipy.optimize.newton(lambda x: x ** 3 - t * x - 1.0, 1.5,
                                 fprime=lambda x: 3 * x ** 2 - t)


def _root_scalar(t):
    return scipy.optimize.root_scalar(lambda x: np.exp(x) - t, bracket=[-5.0, 5.0],
                                      method="brentq").root


def _fixed_point(t):
    return scipy.optimize.fixed_point(lambda x: np.cos(t * x), 0.5)


def _bisect(t):
    return (bisect(lambda x: x ** 2 - t, 0.0, 5.0, xtol=1e-14)
            + ridder(lambda x: x ** 2 - t, 0.0, 5.0) + toms748(lambda x: x ** 2 - t, 0.0, 5.0))


@pytest.mark.parametrize("compile", MODES, ids=["compiled", "eager"])
@pytest.mark.parametrize("f", [_cube_root, _kepler, _newton, _root_scalar, _fixed_point,
                               _bisect])
def test_scalar_roots_implicit_gradient(f, compile):
    """The value is SciPy's root; the gradient equals finite differences
    (compiled: SciPy's solver on the compiled function, one graph node)."""
    t = 2.0
    value, g = tg.value_and_grad(f, compile=compile, fallback=not compile)(t)
    assert value == f(t)
    np.testing.assert_allclose(g, _fd(f, [t], 0), rtol=1e-6)


def test_scalar_roots_compiled_without_fallback():
    """A graph node, no eager fallback: x = t^(1/3), x' = t^(-2/3) / 3."""
    np.testing.assert_allclose(tg.grad(_cube_root, fallback=False)(2.0),
                               2.0 ** (-2 / 3) / 3, rtol=1e-8)


def test_scalar_roots_second_derivative():
    """Compiled: the implicit function theorem's rule again (x'' = -2/9 t^(-5/3));
    compile=False (the eager path) gives the first derivative only, and says so."""
    np.testing.assert_allclose(tg.hessian(_cube_root, fallback=False)(2.0),
                               -2 / 9 * 2.0 ** (-5 / 3), rtol=1e-7)
    with pytest.raises(NotImplementedError, match=r"scipy\.optimize\.brentq.*first derivative"):
        tg.hessian(_cube_root, compile=False)(2.0)


# --- vector roots and minimizers: -J^-1 dF/dtheta, the Hessian for a minimum ---------------

_A = np.array([[3.0, 0.5], [0.5, 2.0]])
_W = np.array([1.0, 2.0])


def _solution(th):
    """The exact x with A x + 0.4 x^3 = th (the stationary point of _objective)."""
    return scipy.optimize.fsolve(lambda x: _A @ x + 0.4 * x ** 3 - th, np.zeros(2),
                                 xtol=1e-14)


def _objective(x, th):
    return 0.5 * x @ _A @ x - th @ x + 0.1 * np.sum(x ** 4)


def _minimize(th):
    r = scipy.optimize.minimize(_objective, np.zeros(2), args=(th,), method="BFGS",
                                options={"gtol": 1e-12})
    return np.sum(r.x * _W) + r.fun


def _minimize_exact(th):
    x = _solution(th)
    return np.sum(x * _W) + _objective(x, th)


def _root(th):
    r = scipy.optimize.root(lambda x: _A @ x + 0.4 * x ** 3 - th, np.zeros(2), tol=1e-13)
    return np.sum(np.sin(r.x) * _W)


def _fsolve(th):
    x = scipy.optimize.fsolve(lambda x, t: _A @ x + 0.4 * x ** 3 - t, np.zeros(2), args=(th,),
                              xtol=1e-13)
    return np.sum(np.sin(x) * _W)


def _exact_sin(th):
    return np.sum(np.sin(_solution(th)) * _W)


def _minimize_scalar(th):
    r = scipy.optimize.minimize_scalar(lambda x: (x - th[0]) ** 2 + th[1] ** 2 * x ** 4,
                                       tol=1e-12)
    return r.x + r.fun


def _minimize_scalar_exact(th):
    x = scipy.optimize.brentq(lambda x: 2 * (x - th[0]) + 4 * th[1] ** 2 * x ** 3, -10.0, 10.0,
                              xtol=1e-15)
    return x + (x - th[0]) ** 2 + th[1] ** 2 * x ** 4


_TS = np.linspace(0.0, 1.0, 6)


def _least_squares(th):
    r = scipy.optimize.least_squares(
        lambda p, t: p[0] * np.exp(-p[1] * t) - (th[0] + th[1] * t ** 2), np.array([1.0, 0.5]),
        args=(_TS,), xtol=1e-15, ftol=1e-15, gtol=1e-15)
    return np.sum(r.x * np.array([1.0, 3.0])) + r.cost


def _least_squares_exact(th):
    y = th[0] + th[1] * _TS ** 2

    def gradient(p):
        e = np.exp(-p[1] * _TS)
        r = p[0] * e - y
        return np.array([np.sum(r * e), np.sum(r * (-p[0] * _TS * e))])
    p = scipy.optimize.fsolve(gradient, np.array([1.0, 0.5]), xtol=1e-14)
    r = p[0] * np.exp(-p[1] * _TS) - y
    return np.sum(p * np.array([1.0, 3.0])) + 0.5 * np.sum(r * r)


@pytest.mark.parametrize("compile", MODES, ids=["compiled", "eager"])
@pytest.mark.parametrize("f, exact", [(_minimize, _minimize_exact), (_root, _exact_sin),
                                      (_fsolve, _exact_sin),
                                      (_minimize_scalar, _minimize_scalar_exact),
                                      (_least_squares, _least_squares_exact)])
def test_vector_roots_and_minima(f, exact, compile):
    """SciPy's solution as the value; the gradient against finite differences
    of the exact solution (differences of an optimizer's output are as noisy
    as its tolerance)."""
    th = np.array([0.7, -0.4])
    value, g = tg.value_and_grad(f, compile=compile, fallback=not compile)(th)
    # compiled: SciPy's solver on the compiled function, whose last bits may differ
    np.testing.assert_allclose(value, f(th), rtol=1e-9 if compile else 0)
    np.testing.assert_allclose(g, _fd(exact, [th], 0), rtol=1e-6, atol=1e-9)


def test_minimize_with_constraints_refused_eagerly():
    """compile=False refuses constraints by name (compiled: the KKT system,
    tests/test_scipy_solvers_compiled.py); constraint objects stay eager, and
    so are refused there too."""
    def f(th):
        return scipy.optimize.minimize(_objective, np.zeros(2), args=(th,),
                                       constraints=[{"type": "eq",
                                                     "fun": lambda x: x[0] - x[1]}]).fun
    with pytest.raises(NotImplementedError, match=r"scipy\.optimize\.minimize.*constraints"):
        tg.grad(f, compile=False)(np.array([0.7, -0.4]))

    def g(th):
        c = scipy.optimize.NonlinearConstraint(lambda x: x[0] - x[1], 0.0, 0.0)
        return scipy.optimize.minimize(_objective, np.zeros(2), args=(th,),
                                       constraints=[c]).fun
    with pytest.raises(tg.TraceError, match=r"scipy\.optimize\.minimize.*NonlinearConstraint"):
        tg.grad(g, fallback=False)(np.array([0.7, -0.4]))
    with pytest.raises(NotImplementedError, match=r"scipy\.optimize\.minimize.*constraints"):
        tg.grad(g)(np.array([0.7, -0.4]))


# --- scipy.integrate.quad: the integral of the integrand's gradient, Leibniz for the limits ---

def _quad_closure(t):
    return scipy.integrate.quad(lambda x: np.sin(t * x) * x, 0.0, 1.0)[0]


def _quad_args_infinite(t):
    return scipy.integrate.quad(lambda x, s: np.exp(-s * x * x), 0.0, np.inf, args=(t,))[0]


def _quad_limit(t):
    return scipy.integrate.quad(lambda x: np.cos(x) * t, 0.0, t)[0] ** 2


def _quad_vector(v):      # quad imported by name (from scipy.integrate import quad)
    return quad(lambda x: np.sum(v * np.array([x, x * x])), -1.0, 2.0)[0]


@pytest.mark.parametrize("compile", MODES, ids=["compiled", "eager"])
@pytest.mark.parametrize("f, x", [(_quad_closure, 2.0), (_quad_args_infinite, 2.0),
                                  (_quad_limit, 1.3), (_quad_vector, np.array([0.5, 1.5]))])
def test_quad_gradient(f, x, compile):
    value, g = tg.value_and_grad(f, compile=compile, fallback=not compile)(x)
    assert value == f(x)
    np.testing.assert_allclose(g, _fd(f, [x], 0), rtol=1e-6)


# --- ODEs: SciPy's solution, forward sensitivities for the derivative -----------------------

_T = np.linspace(0.0, 2.0, 5)


def _odeint(th):
    Y = scipy.integrate.odeint(lambda y, t, k: np.array([-k[0] * y[0] + y[1],
                                                          -k[1] * y[1] * y[0]]),
                               np.array([1.0, 0.5]), _T, args=(th,), rtol=1e-12, atol=1e-12)
    return np.sum(np.sin(Y))


def _solve_ivp(th):          # parameters in the closure and in y0
    r = scipy.integrate.solve_ivp(lambda t, y: np.array([-th[0] * y[0] + y[1],
                                                         -th[1] * y[1] * y[0]]),
                                  (0.0, 2.0), th * 2.0, t_eval=_T, rtol=1e-12, atol=1e-12,
                                  method="DOP853")
    return np.sum(np.sin(r.y))


@pytest.mark.parametrize("compile", MODES, ids=["compiled", "eager"])
@pytest.mark.parametrize("f", [_odeint, _solve_ivp])
def test_ode_sensitivities(f, compile):
    th = np.array([0.7, 0.3])
    value, g = tg.value_and_grad(f, compile=compile, fallback=not compile)(th)
    np.testing.assert_allclose(value, f(th), rtol=1e-12 if compile else 0)
    np.testing.assert_allclose(g, _fd(f, [th], 0), rtol=1e-6, atol=1e-9)


def test_quad_second_derivative_refused():
    with pytest.raises(NotImplementedError, match=r"scipy\.integrate\.quad.*first derivative"):
        tg.hessian(_quad_closure, compile=False)(2.0)


def test_roots_on_plain_values_are_scipy():
    def f(x):
        return x * scipy.optimize.brentq(lambda y: y ** 3 - 2.0, 0.0, 10.0)
    assert tg.grad(f)(1.0) == scipy.optimize.brentq(lambda y: y ** 3 - 2.0, 0.0, 10.0)


@pytest.mark.parametrize("compile", MODES, ids=["compiled", "eager"])
def test_unsupported_keyword_refuses(compile):
    def f(a):
        return np.sum(scipy.linalg.qr(a, pivoting=True)[0])
    with pytest.raises(NotImplementedError, match="pivoting"):
        tg.grad(f, compile=compile, fallback=not compile)(np.eye(3) + 0.1)


def test_parameter_without_derivative_refuses():
    def f(v):
        return np.sum(scipy.special.kv(v, np.array([1.0, 2.0])))
    with pytest.raises(NotImplementedError, match=r"scipy\.special\.kv.*order"):
        tg.grad(f)(np.array([0.5, 1.5]))


# --- the walk -------------------------------------------------------------------------------

WALKED = ("special", "linalg", "signal", "integrate", "optimize", "interpolate", "stats", "fft")


def _public(module):
    mod = getattr(scipy, module)
    for name in sorted(getattr(mod, "__all__", None) or dir(mod)):
        if name.startswith("_"):
            continue
        obj = getattr(mod, name, None)
        if obj is None or inspect.ismodule(obj):
            continue
        if isinstance(obj, type) and issubclass(obj, BaseException):
            continue
        if callable(obj) or type(obj).__module__.startswith("scipy.stats"):
            yield name, obj


def _walk_calls(mod_stand_in, module, x):
    """Call each public callable of ``module`` (as the traced function reads
    it) on ``x``: returns {name: 'works' | 'refused' | 'error'} and the
    unexpected errors.  A distribution's methods are called too."""
    from tracegrad.frontend import scipy_calls
    outcome, bad = {}, []
    for name, obj in _public(module):
        target = getattr(mod_stand_in, name)
        calls = []
        if isinstance(obj, np.ufunc):
            calls = [(name, lambda t=target: t(*([x] * obj.nin)))]
        elif not isinstance(obj, type) and (hasattr(obj, "logpdf") or hasattr(obj, "logpmf")):
            for m in ("logpdf", "logpmf", "cdf", "mean", "fit"):
                if hasattr(obj, m):
                    calls.append((f"{name}.{m}", lambda t=target, m=m: getattr(t, m)(x)))
        else:
            calls = [(name, lambda t=target: t(x))]
        for label, call in calls:
            try:
                call()
                outcome[label] = "works"
            except NotImplementedError as e:
                msg = str(e)
                outcome[label] = "refused"
                if label.split(".")[0] not in msg and "tracegrad" not in msg:
                    bad.append((label, msg[:200]))
            except Exception as e:   # SciPy's own complaint about the argument (shape...)
                msg = f"{type(e).__name__}: {e}"
                outcome[label] = "error"
                if (isinstance(e, tg.TraceError) or type(e).__name__ == "ConversionError") \
                        and f"{module}" not in msg:
                    bad.append((label, msg[:300]))
    assert scipy_calls is not None
    return outcome, bad


@pytest.mark.parametrize("compile", MODES, ids=["compiled", "eager"])
@pytest.mark.parametrize("module", WALKED)
def test_walk_public_callables(module, compile):
    """Every public callable of the module, handed a traced value (compiled)
    or a value recorded for the gradient (compile=False), works (tracegrad's
    implementation) or raises an error naming it: no silently lost gradient
    (an error from SciPy itself about the argument is allowed)."""
    import warnings
    from tracegrad.frontend import scipy_calls
    stand_in = scipy_calls.substitute(getattr(scipy, module))
    results = {}

    def run(x):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            results["outcome"], results["bad"] = _walk_calls(stand_in, module, x)
        return np.sum(x)

    x = np.array([[0.3, 0.1], [0.2, 0.7]])
    if compile:
        tg.grad(run, fallback=False)(x)
    else:
        tg.grad(run, compile=False)(x)
    assert not results["bad"], results["bad"][:10]
    outcome = results["outcome"]
    # every callable was tried, and tracegrad's own functions of the module work
    assert len(outcome) >= 5
    ours = scipy_calls.IMPLEMENTED.get(f"scipy.{module}", {})
    for name in ours:
        if name in outcome:
            assert outcome[name] in ("works", "error"), (name, outcome[name])


def test_walk_no_silent_zero_gradients():
    """A SciPy function tracegrad does not know, called eagerly on a value
    that requires grad, is refused before SciPy converts it."""
    def f(x):
        return np.sum(scipy.signal.detrend(x))
    with pytest.raises(NotImplementedError, match=r"scipy\.signal\.detrend"):
        tg.grad(f, compile=False)(np.array([1.0, 2.0, 4.0]))
    with pytest.raises(NotImplementedError, match=r"scipy\.signal\.detrend"):
        tg.grad(f)(np.array([1.0, 2.0, 4.0]))


def test_unknown_ufunc_refuses_by_name():
    def f(x):
        return np.sum(scipy.special.struve(1.0, x))
    for c in MODES:
        with pytest.raises(NotImplementedError, match=r"scipy\.special\.struve"):
            tg.grad(f, compile=c, fallback=not c)(np.array([1.0, 2.0]))


def test_tracegrad_scipy_is_the_same_table():
    from tracegrad.frontend import scipy_calls
    import tracegrad.scipy.linalg as tl
    import tracegrad.scipy.special as ts
    assert scipy_calls.substitute(scipy.linalg.expm).__tracegrad_implementation__ is tl.expm
    assert scipy_calls.substitute(scipy.special.logsumexp).__tracegrad_implementation__ \
        is ts.logsumexp
