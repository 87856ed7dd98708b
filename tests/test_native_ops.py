"""The native target's own C forms of ops whose registry expression was slow
in C (issue 29: benchmarks/ops.py): np.clip, fmax/fmin (and logaddexp, which
calls fmax), arctan2 and sums over trailing axes.  Values must be the NumPy
target's: bit for bit where the C is compare-and-select (clip, fmax, fmin,
signed zeros and NaN included), within a few ulp where it calls vector math
(arctan2).  Timings are benchmarks/ops.py's business, not these tests'."""
import itertools
import warnings

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.runtime import toolchain

needs_cc = pytest.mark.skipif(toolchain.recipe_or_none() is None,
                              reason="the native target needs a C compiler")

SPECIAL = [-0.0, 0.0, 1.0, -1.0, 0.5, -2.5, np.nan, np.inf, -np.inf]


@pytest.fixture(autouse=True)
def _memory_cache(monkeypatch):
    monkeypatch.setenv("TRACEGRAD_CACHE", "0")


def _pairs(dtype):
    p = np.array(list(itertools.product(SPECIAL, SPECIAL)), dtype=dtype)
    return p[:, 0].copy(), p[:, 1].copy()


def _both(f, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return (tg.compile(f, backend="native")(*args),
                tg.compile(f, backend="numpy")(*args))


def _same_bits(got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    # signed zeros included (the sign of a NaN is not NumPy's promise)
    assert np.array_equal(got[~nan], want[~nan])
    assert np.array_equal(np.signbit(got[~nan]), np.signbit(want[~nan]))


@needs_cc
@pytest.mark.parametrize("whole", ["1", "0"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("lo,hi", [(0.0, np.inf), (-0.0, np.inf), (-np.inf, 0.0),
                                   (-np.inf, -0.0), (-0.5, 0.5), (2.0, 1.0),
                                   (np.nan, 2.0), (0.0, np.nan)])
def test_clip_scalar_bounds_is_numpys(lo, hi, dtype, whole, monkeypatch):
    # the registry's fmin(fmax(..)) ignored a NaN bound and gave +0 for
    # np.clip(-0.0, 0, inf); NumPy's vector loop keeps x unless x < lo or x > hi
    monkeypatch.setenv("TRACEGRAD_NATIVE_WHOLE", whole)
    x = np.array(SPECIAL * 3, dtype=dtype)
    _same_bits(*_both(lambda x: np.clip(x, lo, hi), x))


@needs_cc
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_clip_array_bounds_is_numpys(dtype):
    x, lo = _pairs(dtype)
    for hi in (np.full_like(x, 0.0), np.full_like(x, -0.0), x[::-1].copy()):
        _same_bits(*_both(lambda x, lo, hi: np.clip(x, lo, hi), x, lo, hi))


@needs_cc
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_clip_integers(dtype):
    x = np.arange(-20, 20, dtype=dtype)
    got, want = _both(lambda x: np.clip(x, -3, 7), x)
    assert got.dtype == want.dtype and np.array_equal(got, want)
    got, want = _both(lambda x: np.clip(x, x * 0 - 2, x * 0 + 5), x)
    assert got.dtype == want.dtype and np.array_equal(got, want)


@needs_cc
def test_clip_gradient():
    z = np.array(SPECIAL[:6] * 4 + [3.0, -3.0])
    G = np.linspace(-1, 1, z.size)

    def loss(z):
        return np.sum(np.clip(z, 0, np.inf) * G)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        v1, g1 = tg.value_and_grad(loss, backend="native")(z)
        v2, g2 = tg.value_and_grad(loss, backend="numpy")(z)
    np.testing.assert_allclose(v1, v2, rtol=1e-12, equal_nan=True)
    _same_bits(g1, g2)


@needs_cc
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("op", [np.fmax, np.fmin, np.maximum, np.minimum])
def test_fmax_fmin_are_numpys(op, dtype):
    # fmax/fmin are compare-and-select in C (tg_fmax): the NaN operand loses,
    # a tie (signed zeros too) gives the second operand, as NumPy's array loop
    x, y = _pairs(dtype)
    _same_bits(*_both(lambda x, y: op(x, y), x, y))


@needs_cc
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("op", [np.logaddexp, np.logaddexp2])
def test_logaddexp_special_values(op, dtype):
    x, y = _pairs(dtype)
    got, want = _both(lambda x, y: op(x, y), x, y)
    rtol = 1e-12 if dtype == np.float64 else 2e-6
    np.testing.assert_allclose(got, want, rtol=rtol, equal_nan=True)


@needs_cc
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_arctan2_special_values_and_accuracy(dtype):
    # tg_atan2 (atan of the smaller over the larger magnitude, moved to its
    # octant) where libmvec has atan: zeros of either sign, infinities, NaN
    # exactly as NumPy; finite values within a few ulp
    vals = SPECIAL + [1e300, -1e300, 1e-300, 5e-324, 3.0]
    with np.errstate(over="ignore"):     # 1e300 is inf in float32
        p = np.array(list(itertools.product(vals, vals))).astype(dtype)
    y, x = p[:, 0].copy(), p[:, 1].copy()
    got, want = _both(lambda y, x: np.arctan2(y, x), y, x)
    rtol = 1e-14 if dtype == np.float64 else 1e-6
    np.testing.assert_allclose(got, want, rtol=rtol, atol=0, equal_nan=True)
    nan = np.isnan(want)
    assert np.array_equal(np.signbit(got[~nan]), np.signbit(want[~nan]))
    rng = np.random.default_rng(7)
    y = (rng.standard_normal(4096) * 10.0 ** rng.uniform(-8, 8, 4096)).astype(dtype)
    x = (rng.standard_normal(4096) * 10.0 ** rng.uniform(-8, 8, 4096)).astype(dtype)
    got, want = _both(lambda y, x: np.arctan2(y, x), y, x)
    ulp = np.abs(got - want) / np.spacing(np.abs(want))
    assert ulp.max() <= 4


@needs_cc
@pytest.mark.parametrize("axis", [1, (1, 2), 2, 0, (0, 2)])
def test_sum_over_axes_in_whole_function(axis, monkeypatch):
    # trailing axes: a contiguous run summed by the vector loop in blocks
    monkeypatch.setenv("TRACEGRAD_NATIVE_WHOLE", "1")
    x = np.random.default_rng(3).standard_normal((7, 300, 5))

    def loss(x):
        return np.sum(np.sum(x * x, axis=axis) ** 2)

    (v1, g1), (v2, g2) = tg.value_and_grad(loss, backend="native")(x), \
        tg.value_and_grad(loss, backend="numpy")(x)
    np.testing.assert_allclose(v1, v2, rtol=1e-12)
    np.testing.assert_allclose(g1, g2, rtol=1e-12)
    got = tg.compile(lambda x: np.sum(x, axis=axis), backend="native")(x)
    np.testing.assert_allclose(got, np.sum(x, axis=axis), rtol=1e-13, atol=1e-13)


@needs_cc
def test_arctan2_with_scalar_math_is_libms(monkeypatch):
    # TRACEGRAD_NATIVE_MATH=scalar promises libm's bits: atan2 stays C's atan2
    monkeypatch.setenv("TRACEGRAD_NATIVE_MATH", "scalar")
    import math
    y = np.random.default_rng(5).standard_normal(512)
    x = y[::-1].copy()
    got = tg.compile(lambda y, x: np.arctan2(y, x), backend="native")(y, x)
    assert tg.cache_info()["target"] == "native"
    assert np.array_equal(got, np.array([math.atan2(a, b) for a, b in zip(y, x)]))


@needs_cc
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("e", [3, -5, 0, 127, -126, 200, -1030, 1100])
def test_ldexp_literal_exponent_is_numpys(e, dtype):
    # a literal exponent in [-126, 127] is a multiply by the exact power 2**e
    # (one correctly rounded product, ldexp's result); others stay C's ldexp
    x = np.array(SPECIAL + [3e-310, 1e-40, 1e300, 3e38, 1.5e-45, 7.0], dtype=np.float64)
    with np.errstate(over="ignore", under="ignore"):
        x = x.astype(dtype)
    _same_bits(*_both(lambda x: np.ldexp(x, e), x))
    G = np.linspace(-2, 2, x.size).astype(dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = tg.grad(lambda x: np.sum(np.ldexp(x, e) * G), backend="native")(x)
        want = tg.grad(lambda x: np.sum(np.ldexp(x, e) * G), backend="numpy")(x)
    _same_bits(got, want)


@needs_cc
@pytest.mark.parametrize("n", [0, 1, 2, 3])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_polygamma_in_c_is_the_numpy_helper(n, dtype):
    # digamma and its derivatives (gammaln's gradient) are a C function of
    # the kernels (native_helpers.h tg_polygamma), the NumPy helper's
    # algorithm: the same values, non-finite ones included (poles, 0, +-inf,
    # nan, far left)
    from tracegrad.scipy import special as tsp
    x = np.concatenate([np.linspace(-5.3, 30.0, 401), SPECIAL,
                        [-1.0, -2.0, 1e-8, -1e5, 1e6, 1.4616321449683622]]).astype(dtype)
    f = lambda x: tsp.polygamma(n, x) * 2.0     # noqa: E731  (in a kernel)
    assert "tg_polygamma(" in tg.compile(f, backend="native").lower(x).source
    got, want = _both(f, x)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want))
    fin = np.isfinite(want)
    np.testing.assert_array_equal(got[~fin], want[~fin])
    np.testing.assert_allclose(got[fin], want[fin], rtol=1e-13 if dtype == np.float64 else 1e-6)


@needs_cc
def test_gammaln_gradient_is_one_c_function():
    from tracegrad.scipy import special as tsp
    x = np.linspace(0.3, 20.0, 1000)
    g = tg.grad(lambda x: np.sum(tsp.gammaln(x) * x), backend="native")
    src = g.lower(x).source
    assert "tg_polygamma(v" in src and "= _polygamma(" not in src     # no NumPy helper call
    want = tg.grad(lambda x: np.sum(tsp.gammaln(x) * x), backend="numpy")(x)
    np.testing.assert_allclose(g(x), want, rtol=1e-12, atol=1e-13)


@needs_cc
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_a_bool_cast_to_float_is_a_select(dtype):
    # C's conversion of a bool kept gcc from vectorizing a count of zeros
    # (1 ns an element); a select gives the same 1 and 0
    def count(x):
        return np.sum((x == 0).astype(x.dtype)) + np.sum(np.where(x > 1, x, 0) * (x < 2))
    x = np.array([0.0, -0.0, 1.5, np.nan, 3.0, 0.0, 1.0, -np.inf], dtype=dtype)
    x = np.tile(x, 1000)
    f = tg.compile(count, backend="native")
    np.testing.assert_array_equal(f(x), count(x))
    src = f.lower(x).source
    one = "1.0f" if dtype == np.float32 else "1.0"
    zero = "0.0f" if dtype == np.float32 else "0.0"
    assert f" ? {one} : {zero})" in src


@needs_cc
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("e", [3, 4, 3.0, 0.5, 1.5, 2.5, 3.5, -0.5])
def test_literal_powers_are_products_and_sqrt(e, dtype):
    # x ** e for these literal exponents is products and sqrt in C (libmvec's
    # pow is slower than NumPy's, and glibc's takes a slow path for a
    # negative base): pow's values (NumPy's) at +-0, +-inf, NaN and
    # negatives, signs of zeros included; within 2 ulp of NumPy's elsewhere,
    # the gradient (another literal power) within 4
    x = np.concatenate([SPECIAL, [-1e-78, 1e-78, 1e-310, 1e300, 1e-130, 1e120, 3.7, 0.123]])
    with np.errstate(over="ignore", under="ignore"):
        x = x.astype(dtype)
    f = tg.compile(lambda x: x ** e, backend="native")
    assert "pow(" not in f.lower(x).source.split("// @tg-helpers-end")[-1]
    got, want = _both(lambda x: x ** e, x)
    special = ~np.isfinite(want) | (want == 0) | ~np.isfinite(x) | (x == 0)
    _same_bits(got[special], want[special])
    tiny = np.finfo(dtype).tiny
    rng = np.random.default_rng(7)
    y = np.concatenate([rng.uniform(0, 10, 2000), rng.uniform(-10, 10, 2000) if e in (3, 4, 3.0)
                        else rng.uniform(1e-3, 1, 2000)]).astype(dtype)
    G = rng.standard_normal(y.size).astype(dtype)
    # the gradient's products round once more
    for (got, want), ulps in ((_both(lambda y: y ** e, y), 2),
                              (_both(tg.grad(lambda y: np.sum(y ** e * G)), y), 4)):
        scale = np.spacing(np.maximum(np.abs(want), tiny).astype(dtype)).astype(np.float64)
        assert got.dtype == want.dtype
        assert np.max(np.abs(got.astype(np.float64) - want) / scale) <= ulps


@needs_cc
@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_integer_literal_powers_wrap_as_numpys(dtype):
    x = np.array([-3, 0, 7, 2 ** 20, -2 ** 17, 12345, np.iinfo(dtype).max], dtype=dtype)
    for e in (3, 4):
        got, want = _both(lambda x: x ** e, x)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


@needs_cc
@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint64])
def test_integer_abs_fmax_fmin_pow_keep_every_bit(dtype):
    # C's fabs, fmax, fmin and pow are double (53 bits): np.abs of an int64
    # above 2**53 came out rounded, x ** 5 too; signed integers wrap as
    # NumPy's do (gcc took np.abs(x) >= 0 as true at the most negative value
    # and (x * 2) // 2 as x)
    info = np.iinfo(dtype)
    x = np.array([info.max, info.min, 2 ** 31 - 1, 3001, 0, info.max - 1, 123456], dtype)
    y = np.array([info.max - 2, 3, info.min, 9, 0, info.max, 4], dtype)
    if dtype == np.int64:
        x[4], y[4] = 2 ** 53 + 1, -(2 ** 62 + 1)

    def f(x, y):
        return (np.abs(x), np.fmax(x, y), np.fmin(x, y), np.abs(x) >= 0, -np.abs(y), x ** 5,
                np.power(x, y % 7), (x * 2) // 2, (x + 1) > x)
    with np.errstate(all="ignore"):
        want = f(x, y)
        got = tg.compile(f, backend="native")(x, y)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)


@needs_cc
@pytest.mark.parametrize("op", [np.less, np.less_equal, np.greater, np.greater_equal, np.equal,
                                np.not_equal])
def test_int64_against_uint64_compares_exactly(op):
    # NumPy compares them exactly; their common type, float64, holds 53 bits
    # (2**53 + 1 == 2**53 there), and C converts the signed one to unsigned
    x = np.array([-1, 2 ** 53 + 1, 5, -2 ** 63, 2 ** 63 - 1, 0, 2 ** 53], dtype=np.int64)
    y = np.array([5, 2 ** 53, 5, 2 ** 63, 2 ** 63 - 1, 0, 2 ** 53 + 1], dtype=np.uint64)
    for a, b in ((x, y), (y, x)):
        got = tg.compile(lambda a, b: op(a, b) & (a != 3), backend="native")(a, b)
        np.testing.assert_array_equal(got, op(a, b))


@needs_cc
@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.int8, np.uint64, np.bool_])
def test_integer_division_edges_are_numpys(dtype):
    # the most negative value // -1 (x86's division traps there: SIGFPE
    # killed the interpreter), zero divisors, fmod of integers (C's fmod is
    # double), floor, ceil and trunc of integers (through double: rounded
    # above 2**53), and bools (the helpers had no C form for them: the
    # build failed and the process fell back to the NumPy target)
    if dtype == np.bool_:
        a, b = np.array([True, False, True, False]), np.array([True, True, False, False])
    else:
        info = np.iinfo(dtype)
        a = np.array([info.min, info.max, 7, 0, info.max - 2, info.min + 3], dtype)
        b = np.array([dtype(-1) if info.min < 0 else info.max, 3, 0, 5, 2, 7], dtype)

    def f(a, b):
        return (a // b, a % b, np.fmod(a, b), np.floor(a), np.ceil(a) + np.trunc(b),
                np.floor_divide(a, b) * 2)
    with np.errstate(all="ignore"):
        want = f(a, b)
        got = tg.compile(f, backend="native")(a, b)
    assert tg.cache_info()["target"] == "native"
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)
