"""NumPy functions added for issue 24, item 5 (tracegrad/ops/numpy_functions.py):
block, broadcast_arrays, broadcast_to, delete, insert, meshgrid, piecewise,
resize, divmod, modf, ldexp, frexp, positive, nanmax, nanmin, nanstd,
nanvar, nanprod, nancumsum, nancumprod, and np.pad's modes mean, maximum,
minimum, median and linear_ramp.

Each case runs ``test_numpy_functions.check`` (values equal NumPy's
through tg.compile and eagerly on Tensors; gradients of tg.grad,
tg.grad(compile=False) and Tensor.backward equal central finite
differences in float64), and here also the values, shapes and dtypes on
NumPy-face eager values (what ``tg.grad(f, compile=False)`` runs on) and
``tg.value_and_grad``.  Then dtypes, NumPy's errors, the outputs that have
no gradient (frexp's exponent, divmod's quotient), and the edge values.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.eager.tensor import NumpyTensor

from test_numpy_functions import check, _flat, _close, _value, _traced_error

RNG = np.random.default_rng(20261127)


def _r(*shape, lo=-2.0, hi=2.0):
    return RNG.uniform(lo, hi, shape)


def _nan(x, above=1.2):
    """x with NaN wherever it is above ``above`` (a constant mask of a traced x)."""
    return np.where(x > above, np.nan, x)


X = _r(4, 5)
X3 = _r(3, 4, 5)
V = _r(6)
# entries of X3 made NaN: a fixed pattern that leaves at least two numbers in
# every slice along every axis (all-NaN slices have their own test below)
MASK3 = np.zeros((3, 4, 5), bool)
MASK3[0, :2, :3] = RNG.uniform(size=(2, 3)) < 0.5
MASK3[0, 0, 0] = True


def _with_nan3(x):
    return np.where(MASK3, np.nan, x)


CASES = {
    # elementwise
    "positive": (lambda x: np.positive(x), X),
    "divmod": (lambda x, y: np.divmod(x * 3, y), X, _r(5, lo=0.5, hi=1.5), (0, 1)),
    "divmod-negative-divisor-broadcast": (lambda x, y: np.divmod(x, y), X,
                                          _r(4, 1, lo=-1.7, hi=-0.3), (0, 1)),
    "modf": (lambda x: np.modf(x * 3), X),
    "ldexp": (lambda x: np.ldexp(x, np.arange(5) - 2), X),
    "ldexp-broadcast-traced-exponent": (lambda x, e: np.ldexp(x, e), _r(3, 1),
                                        np.array([[-3, 0, 4, 60]]), (0,)),
    "frexp": (lambda x: np.frexp(x * 50), X),
    # NaN-aware reductions
    "nanmax": (lambda x: np.nanmax(_nan(x), axis=1), X),
    "nanmax-none": (lambda x: np.nanmax(_nan(x)), X),
    "nanmin-keepdims": (lambda x: np.nanmin(_nan(x, 0.9), axis=0, keepdims=True), X),
    "nanmin-axes": (lambda x: np.nanmin(_with_nan3(x), axis=(0, 2)), X3),
    "nanmax-initial-where": (lambda x: np.nanmax(_nan(x), axis=1, initial=0.5,
                                                 where=np.arange(5) % 2 == 0), X),
    "nanprod": (lambda x: np.nanprod(_nan(x), axis=1), X),
    "nanprod-keepdims-initial": (lambda x: np.nanprod(_with_nan3(x), axis=(0, 1),
                                                      keepdims=True, initial=2.0), X3),
    "nanprod-where": (lambda x: np.nanprod(_nan(x), axis=0, where=x < 1.5), X),
    "nancumsum": (lambda x: np.nancumsum(_nan(x), axis=1), X),
    "nancumsum-flat": (lambda x: np.nancumsum(_nan(x)), X),
    "nancumprod": (lambda x: np.nancumprod(_with_nan3(x), axis=0), X3),
    "nancumprod-flat": (lambda x: np.nancumprod(_nan(x)), X),
    "nanvar": (lambda x: np.nanvar(_nan(x), axis=1), X),
    "nanvar-ddof-keepdims": (lambda x: np.nanvar(_with_nan3(x), axis=(1, 2), ddof=1,
                                                 keepdims=True), X3),
    "nanvar-none": (lambda x: np.nanvar(_nan(x)), X),
    "nanvar-correction-where": (lambda x: np.nanvar(_nan(x, 1.8), axis=0, correction=1,
                                                    where=np.arange(4)[:, None] < 3), X),
    "nanstd": (lambda x: np.nanstd(_nan(x), axis=0), X),
    "nanstd-ddof": (lambda x: np.nanstd(_with_nan3(x), axis=0, ddof=1), X3),
    "nanstd-mean": (lambda x: np.nanstd(_nan(x), axis=1, keepdims=True,
                                        mean=np.nanmean(_nan(x), axis=1, keepdims=True)), X),
    # arranging
    "block-2x2": (lambda a, b, c, d: np.block([[a, b], [c, d]]), _r(2, 3), _r(2, 2), _r(1, 3),
                  _r(1, 2), (0, 1, 2, 3)),
    "block-1d-scalars": (lambda a, b: np.block([a, 1.5, b]), _r(2), _r(3), (0, 1)),
    "block-promotes-ndim": (lambda a, b: np.block([[a], [b]]), _r(4), _r(2, 4), (0, 1)),
    "block-deep-lists": (lambda a, b: np.block([[[a, b]]]), _r(2), _r(3), (0, 1)),
    "block-3d": (lambda a, b: np.block([[[a, b]], [[b, a]]]), _r(2, 2, 2), _r(2, 2, 2),
                 (0, 1)),
    "block-constant-block": (lambda a: np.block([[a, np.ones((2, 1))]]), _r(2, 3)),
    "block-single": (lambda a: np.block(a), _r(2, 3)),
    "broadcast_arrays": (lambda x, y: np.broadcast_arrays(x, y), _r(3, 1), _r(4), (0, 1)),
    "broadcast_arrays-three": (lambda x, y: np.broadcast_arrays(x, y, np.ones((2, 1, 1))),
                               _r(3, 4), _r(4), (0, 1)),
    "broadcast_arrays-one": (lambda x: np.broadcast_arrays(x), X),
    "broadcast_to": (lambda x: np.broadcast_to(x, (2, 3, 4)), _r(3, 1)),
    "broadcast_to-scalar-shape": (lambda x: np.broadcast_to(x, 5), _r(1)),
    "delete-axis": (lambda x: np.delete(x, [0, 2], axis=1), X),
    "delete-flat-slice": (lambda x: np.delete(x, slice(1, 17, 3)), X),
    "delete-negative-int": (lambda x: np.delete(x, -1, axis=0), X),
    "delete-mask": (lambda x: np.delete(x, np.array([True, False, False, True, False]),
                                        axis=-1), X),
    "insert-scalar-obj": (lambda x, v: np.insert(x, 1, v, axis=1), X, _r(4), (0, 1)),
    "insert-scalar-obj-2d-values": (lambda x, v: np.insert(x, 2, v, axis=1), X, _r(2, 4),
                                    (0, 1)),
    "insert-sequence-flat": (lambda x, v: np.insert(x, [1, 3, 3], v), X, _r(3), (0, 1)),
    "insert-broadcast-values": (lambda x, v: np.insert(x, [0, 5], v, axis=1), X, _r(4, 1),
                                (0, 1)),
    "insert-slice-axis0": (lambda x, v: np.insert(x, slice(0, 4, 2), v, axis=0), X, _r(5),
                           (0, 1)),
    "insert-constant-value": (lambda x: np.insert(x, 2, 7.5, axis=0), X),
    "meshgrid-xy": (lambda x, y: np.meshgrid(x, y), _r(3), _r(4), (0, 1)),
    "meshgrid-ij": (lambda x, y, z: np.meshgrid(x, y, z, indexing="ij"), _r(3), _r(4), _r(2),
                    (0, 1, 2)),
    "meshgrid-xy-sparse-3": (lambda x, y, z: np.meshgrid(x, y, z, sparse=True), _r(3),
                             _r(4), _r(2), (0, 1, 2)),
    "meshgrid-2d-input-copy-false": (lambda x, y: np.meshgrid(x, y, copy=False), _r(2, 2),
                                     _r(3), (0, 1)),
    "resize-grow": (lambda x: np.resize(x, (3, 7)), X),
    "resize-shrink-int-shape": (lambda x: np.resize(x, 7), X),
    "piecewise": (lambda x: np.piecewise(x, [x < 0, x > 1],
                                         [lambda v: v ** 2, np.sin, 0.5]), X),
    "piecewise-otherwise": (lambda x: np.piecewise(x, [x < -1, x > 1],
                                                   [np.exp, lambda v: 3 * v, np.cos]), X),
    "piecewise-args": (lambda x: np.piecewise(x, [x < 0], [lambda v, k: k * v, lambda v, k: v],
                                              2.0), X),
    "piecewise-single-condition": (lambda x: np.piecewise(x, x > 0, [np.tanh, -1.0]), V),
    "piecewise-constant-cond": (lambda x: np.piecewise(x, [V[:, None] > 0, V[:, None] < -1],
                                                       [lambda v: v - v.mean(), np.square]),
                                _r(6, 1)),
    "piecewise-0d": (lambda x: np.piecewise(x, [x < 0, x >= 0], [np.negative, np.exp]),
                     np.array(0.7)),
    # pad's statistics modes
    "pad-mean": (lambda x: np.pad(x, ((1, 2), (2, 1)), mode="mean"), X),
    "pad-mean-stat_length": (lambda x: np.pad(x, 2, mode="mean", stat_length=(1, 3)), X),
    "pad-maximum": (lambda x: np.pad(x, 2, mode="maximum", stat_length=2), X),
    "pad-minimum-per-axis": (lambda x: np.pad(x, ((1, 2), (2, 1)), mode="minimum",
                                              stat_length=((1, 2), (3, 1))), X),
    "pad-median": (lambda x: np.pad(x, ((1, 2), (2, 1)), mode="median", stat_length=3), X),
    "pad-median-3d": (lambda x: np.pad(x, ((0, 1), (2, 0), (1, 1)), mode="median"), X3),
    "pad-maximum-1d-long-stat": (lambda x: np.pad(x, (3, 1), mode="maximum", stat_length=50),
                                 V),
    "pad-linear_ramp": (lambda x: np.pad(x, ((1, 2), (2, 3)), mode="linear_ramp",
                                         end_values=((1, 2), (-1, 0.5))), X),
    "pad-linear_ramp-default": (lambda x: np.pad(x, 3, mode="linear_ramp"), X3),
    "pad-linear_ramp-one-side": (lambda x: np.pad(x, [(0, 4)], mode="linear_ramp",
                                                  end_values=2.0), V),
}


def _case(spec):
    fn, *rest = spec
    diff = rest.pop() if rest and isinstance(rest[-1], tuple) else (0,)
    return fn, rest, diff


def _numpy_face_values(fn, args, diff, want):
    """The values on NumPy-face eager values (requiring grad, as inside
    tg.grad(f, compile=False)) are NumPy's, shapes and dtypes included."""
    xs = [NumpyTensor(np.array(a, dtype=np.float64), requires_grad=True) if i in diff else a
          for i, a in enumerate(args)]
    got = fn(*xs)
    assert type(got) is type(want) or not isinstance(want, (tuple, list)), \
        f"NumPy returns a {type(want).__name__}, tracegrad a {type(got).__name__}"
    assert len(_flat(got)) == len(_flat(want))
    for g, w in zip(_flat(got), _flat(want)):
        _close(_value(g), w, "NumPy-face eager value")


@pytest.mark.parametrize("name", sorted(CASES))
def test_value_and_gradient(name):
    fn, args, diff = _case(CASES[name])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)   # all-NaN slices warn in NumPy
        check(fn, *args, diff=diff)
        want = fn(*[np.asarray(a, dtype=np.float64) if i in diff else a
                    for i, a in enumerate(args)])
        _numpy_face_values(fn, args, diff, want)
        # the compiled result's container is NumPy's too (meshgrid and
        # broadcast_arrays return tuples, divmod/modf/frexp pairs)
        got = tg.compile(fn)(*args)
        assert isinstance(got, tuple) == isinstance(want, tuple)


@pytest.mark.parametrize("name", ["nanvar-ddof-keepdims", "piecewise", "insert-scalar-obj",
                                  "pad-linear_ramp", "block-2x2"])
def test_value_and_grad_returns_numpys_value(name):
    fn, args, diff = _case(CASES[name])
    cts = [np.random.default_rng(3).standard_normal(np.shape(w)) for w in _flat(fn(*args))]

    def loss(*a):
        return sum(np.sum(o * c) for o, c in zip(_flat(fn(*a)), cts))

    v, g = tg.value_and_grad(loss, argnums=diff)(*args)
    np.testing.assert_allclose(v, loss(*args), rtol=1e-12)
    v2, g2 = tg.value_and_grad(loss, argnums=diff, compile=False)(*args)
    np.testing.assert_allclose(_value(v2), loss(*args), rtol=1e-12)
    for a, b in zip(g, g2):
        np.testing.assert_allclose(_value(a), _value(b), rtol=1e-10, atol=1e-12)


# --- dtypes follow NumPy ---------------------------------------------------------------------

DTYPE_FNS = {
    "positive": lambda x: np.positive(x),
    "divmod": lambda x: np.divmod(x, 3),
    "modf": lambda x: np.modf(x),
    "ldexp": lambda x: np.ldexp(x, 3),
    "frexp": lambda x: np.frexp(x),
    "nanmax": lambda x: np.nanmax(x, axis=0),
    "nanmin": lambda x: np.nanmin(x),
    "nanmax-initial": lambda x: np.nanmax(x, axis=1, initial=4),
    "nanprod": lambda x: np.nanprod(x, axis=1),
    "nancumsum": lambda x: np.nancumsum(x, axis=0),
    "nancumprod": lambda x: np.nancumprod(x),
    "nanvar": lambda x: np.nanvar(x, axis=1),
    "nanstd": lambda x: np.nanstd(x),
    "block": lambda x: np.block([[x, x], [x, x]]),
    "block-with-float": lambda x: np.block([x[0], 0.5]),
    "broadcast_arrays": lambda x: np.broadcast_arrays(x, x[:1]),
    "delete": lambda x: np.delete(x, 1, axis=1),
    "insert": lambda x: np.insert(x, 1, 2.7, axis=0),
    "meshgrid": lambda x: np.meshgrid(x[0], x[1]),
    "resize": lambda x: np.resize(x, (5, 5)),
    "piecewise": lambda x: np.piecewise(x, [x < 0], [lambda v: v * 2.5, 1.5]),
    "pad-mean": lambda x: np.pad(x, 2, mode="mean"),
    "pad-median": lambda x: np.pad(x, 1, mode="median", stat_length=2),
    "pad-maximum": lambda x: np.pad(x, 1, mode="maximum"),
    "pad-linear_ramp": lambda x: np.pad(x, (2, 3), mode="linear_ramp", end_values=(7, -5)),
}


@pytest.mark.parametrize("name", sorted(DTYPE_FNS))
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.int8])
def test_dtypes_follow_numpy(name, dtype):
    fn = DTYPE_FNS[name]
    x = (RNG.uniform(-3, 3, (3, 4)) * (10 if dtype != np.float32 else 1)).astype(dtype)
    want = fn(x)
    for mode, got in (("compiled", tg.compile(fn)(x)), ("eager", fn(NumpyTensor(x)))):
        assert len(_flat(got)) == len(_flat(want)), mode
        for g, w in zip(_flat(got), _flat(want)):
            g, w = np.asarray(_value(g)), np.asarray(w)
            assert g.dtype == w.dtype, f"{mode}: dtype {g.dtype}, NumPy {w.dtype}"
            assert g.shape == w.shape, f"{mode}: shape {g.shape}, NumPy {w.shape}"
            np.testing.assert_allclose(g, w, rtol=1e-6 if dtype == np.float32 else 1e-12,
                                       err_msg=mode)


# --- edge values: exactly NumPy's ------------------------------------------------------------

def _same_bits(got, want, what):
    got, want = np.asarray(_value(got)), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape, what
    np.testing.assert_array_equal(got, want, err_msg=what)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want), err_msg=what + " (sign)")


EDGE = np.array([-np.inf, -3.5, -2.0, -0.0, 0.0, 0.25, 1.0, 7.75, np.inf, np.nan, 1e-310,
                 -5e-324, 1.7e308])


@pytest.mark.parametrize("fn", [
    lambda x: np.modf(x), lambda x: np.frexp(x), lambda x: np.ldexp(x, -3),
    lambda x: np.ldexp(x, np.array([1, 2, 5, 0, 3, -1074, 1100, -1, 2000, 3, 60, 1074, -2000])),
    lambda x: np.divmod(x, -1.5), lambda x: np.positive(x),
], ids=["modf", "frexp", "ldexp", "ldexp-extreme", "divmod", "positive"])
def test_edge_values_are_numpys(fn):
    with np.errstate(all="ignore"):
        want = fn(EDGE)
        for mode, got in (("compiled", tg.compile(fn)(EDGE)), ("eager", fn(NumpyTensor(EDGE)))):
            for g, w in zip(_flat(got), _flat(want)):
                _same_bits(g, w, mode)


def test_ldexp_and_frexp_on_the_native_target():
    # the ldexp row has a C emitter (fused kernels); frexp's exponent is a NumPy call
    f = lambda x, e: np.ldexp(np.frexp(x)[0] * 3.0, e) + np.frexp(x)[1]
    x, e = _r(3, 4) * 100, np.array([-2, 0, 5, 40])
    got = tg.compile(f, backend="native")(x, e)   # (no C compiler: the NumPy fallback)
    np.testing.assert_array_equal(got, f(x, e))
    g = tg.grad(lambda x: np.sum(np.ldexp(x, e) ** 2), backend="native")(x)
    np.testing.assert_array_equal(g, 2 * np.ldexp(x, e) * np.ldexp(1.0, e))


def test_ldexp_and_frexp_on_the_cuda_target_emulated(monkeypatch):
    """The CUDA target's kernels (ldexp fused) and driver (frexp's exponent
    through CuPy), run by tracegrad.testing's emulator, match the NumPy target."""
    import shutil
    from tracegrad import testing
    if shutil.which(testing.CXX) is None:
        pytest.skip(f"the emulator needs a host C++ compiler ({testing.CXX})")
    monkeypatch.setenv("TRACEGRAD_CACHE", "0")

    def f(x, e):
        m, k = np.frexp(x * 30)
        return np.sum(np.ldexp(m * np.tanh(x), e) + k * x)

    x, e = _r(3, 4), np.array([1, -2, 3, 0])
    want = tg.value_and_grad(f, backend="numpy")(x, e)
    with testing.emulated_cupy():
        got = tg.value_and_grad(f, backend="cupy")(x, e)
        src = tg.value_and_grad(f, backend="cupy").lower(x, e).cuda_source
    assert "ldexp(" in src
    np.testing.assert_allclose(testing.to_host(got[0]), want[0], rtol=1e-12)
    np.testing.assert_allclose(testing.to_host(got[1]), want[1], rtol=1e-12)


def test_nan_reductions_of_all_nan_slices_and_empty_dof_are_nan():
    x = np.array([[np.nan, np.nan, np.nan], [1.0, np.nan, 3.0], [2.0, 2.0, -np.inf]])
    fns = [lambda a: np.nanmax(a, axis=1), lambda a: np.nanmin(a, axis=1),
           lambda a: np.nanvar(a, axis=1, ddof=2), lambda a: np.nanstd(a, axis=1),
           lambda a: np.nanmax(a, axis=1, initial=-1.0),
           lambda a: np.nanmin(a, axis=1, initial=0.0, where=[True, False, True]),
           lambda a: np.nanprod(a, axis=1), lambda a: np.nancumprod(a, axis=1)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for f in fns:
            want = f(x)
            _close(tg.compile(f)(x), want, "compiled")
            _close(_value(f(NumpyTensor(x))), want, "eager")


def test_nan_gradients_go_to_the_numbers_only():
    # NaN entries (ignored by the reduction) get a zero gradient, never NaN
    x = np.array([[np.nan, 2.0, 3.0], [1.0, np.nan, -3.0]])
    for f in (lambda a: np.sum(np.nanvar(a, axis=1)), lambda a: np.sum(np.nanmax(a, axis=0)),
              lambda a: np.sum(np.nanprod(a, axis=1)), lambda a: np.sum(np.nancumsum(a))):
        for g in (tg.grad(f)(x), tg.grad(f, compile=False)(x)):
            g = _value(g)
            assert np.all(np.isfinite(g))
            assert g[0, 0] == 0.0 and g[1, 1] == 0.0


# --- outputs with no gradient ----------------------------------------------------------------

def test_integer_outputs_have_no_gradient():
    """frexp's exponent and divmod's quotient are piecewise constant (as in
    JAX): tg.grad through them alone is zero, and eagerly they do not
    require grad."""
    x = _r(3, 4) * 10
    for f in (lambda a: np.sum(np.frexp(a)[1] * 1.0), lambda a: np.sum(np.divmod(a, 1.5)[0]),
              lambda a: np.sum(np.modf(a)[1])):
        np.testing.assert_array_equal(tg.grad(f)(x), np.zeros_like(x))
        np.testing.assert_array_equal(_value(tg.grad(f, compile=False)(x)), np.zeros_like(x))
    t = tg.tensor(x, requires_grad=True)
    m, e = np.frexp(t)
    assert m.requires_grad and not e.requires_grad and _value(e).dtype == np.int32
    # the remainder's gradient: 1 for x1, -floor(x1 / x2) for x2
    y = np.array([1.5, -0.7, 2.2, 0.9])
    gx, gy = tg.grad(lambda a, b: np.sum(np.divmod(a, b)[1]), argnums=(0, 1))(x, y)
    np.testing.assert_allclose(gx, np.ones_like(x))
    np.testing.assert_allclose(gy, -np.floor(x / y).sum(axis=0))


# --- piecewise: NumPy's meaning, or a clear error ---------------------------------------------

def test_piecewise_with_traced_conditions_needs_elementwise_functions():
    f = lambda x: np.piecewise(x, [x > 0], [lambda v: v - v.mean(), 0.0])
    with pytest.raises(ValueError, match="elementwise"):
        tg.compile(lambda x: np.piecewise(x, [x > 0], [lambda v: v.sum(axis=0), 0.0]))(X)
    with pytest.raises(ValueError, match="elementwise"):   # same shape, yet not elementwise
        tg.compile(f)(X)
    with pytest.raises(ValueError, match="elementwise"):
        tg.grad(lambda x: np.sum(f(x)))(X)
    # eagerly the conditions are known: each function sees x[cond], as in NumPy
    xs = NumpyTensor(X)
    _close(_value(f(xs)), f(X), "eager piecewise with a non-elementwise function")
    g = tg.grad(lambda x: np.sum(f(x) ** 2), compile=False)(X)
    eps, d = 1e-6, RNG.standard_normal(X.shape)
    fd = (np.sum(f(X + eps * d) ** 2) - np.sum(f(X - eps * d) ** 2)) / (2 * eps)
    np.testing.assert_allclose(np.sum(_value(g) * d), fd, rtol=1e-6)


def test_piecewise_errors_match_numpy():
    _traced_error(lambda x: np.piecewise(x, [x > 0, x < 0], [np.sin]), X, exc=ValueError,
                  match="either 2 or 3 functions")
    with pytest.raises(IndexError, match="x's shape"):
        tg.compile(lambda x, y: np.piecewise(x, [y > 0], [np.sin]))(X, _r(5))


# --- NumPy's errors --------------------------------------------------------------------------

def _same_error(fn, *args):
    """NumPy raises; tracegrad raises the same class, compiled and eagerly."""
    with pytest.raises(Exception) as want:
        fn(*args)
    for mode, run in (("compiled", lambda: tg.compile(fn)(*args)),
                      ("eager", lambda: fn(*[NumpyTensor(a) if isinstance(a, np.ndarray) and
                                             a.dtype.kind == "f" else a for a in args]))):
        with pytest.raises(Exception) as got:
            run()
        assert isinstance(got.value, type(want.value)) or \
            issubclass(type(want.value), type(got.value)), \
            f"{mode}: {type(got.value).__name__}: {got.value}; NumPy " \
            f"{type(want.value).__name__}: {want.value}"


@pytest.mark.parametrize("fn,args", [
    (lambda x: np.block([x, [x]]), (X,)),                       # depths mismatched
    (lambda x: np.block((x, x)), (X,)),                         # tuples are refused
    (lambda x: np.block([x, _r(3, 2)]), (X,)),                  # shapes do not join
    (lambda x: np.block([]), (X,)),
    (lambda x: np.broadcast_arrays(x, np.ones(4)), (X,)),
    (lambda x: np.broadcast_to(x, (5, 4)), (X,)),
    (lambda x: np.delete(x, 7, axis=1), (X,)),
    (lambda x: np.delete(x, 0, axis=2), (X,)),
    (lambda x: np.insert(x, 9, 1.0, axis=1), (X,)),
    (lambda x: np.insert(x, [0, 1], np.ones(3), axis=1), (X,)),
    (lambda x: np.meshgrid(x, x, indexing="xz"), (V,)),
    (lambda x: np.resize(x, (2, -3)), (X,)),
    (lambda x: np.ldexp(x, 2.0), (X,)),
    (lambda x: np.positive(x > 0), (X,)),
    (lambda x: np.nanmax(x, axis=0, where=x > 0), (X,)),
    (lambda x: np.nanvar(x, ddof=1, correction=1), (X,)),
    (lambda x: np.nanvar(x, dtype=np.int64), (X,)),
    (lambda x: np.nanmax(x, axis=3), (X,)),
    (lambda x: np.pad(x, 2, mode="maximum", stat_length=0), (X,)),
    (lambda x: np.pad(x, 2, mode="mean", end_values=1), (X,)),
    (lambda x: np.pad(x, 2, mode="linear_ramp", stat_length=1), (X,)),
    (lambda x: np.pad(x, -1, mode="median"), (X,)),
    (lambda x: np.pad(x[:0], 1, mode="mean"), (X,)),
    (lambda x: np.pad(x, 1, mode="mean", stat_length=-1), (X,)),
    (lambda x: np.pad(x, 1, mode="no-such-mode"), (X,)),
    (lambda x: np.broadcast_to(x, (-1, 5)), (X,)),
    (lambda x: np.nanmax(x, axis=0), (np.zeros((0, 3)),)),
    (lambda x: np.nancumsum(x, axis=(0, 1)), (X,)),
    (lambda x: np.nancumprod(x, axis=2), (X,)),
    (lambda x: np.piecewise(x, [np.sum(x) > 0, np.sum(x) < 0], [np.sin, np.cos]), (X,)),
    (lambda x: np.piecewise(x, [np.array([True, False])], [np.sin]), (X,)),
], ids=["block-depth", "block-tuple", "block-shapes", "block-empty", "broadcast_arrays",
        "broadcast_to", "delete-bounds", "delete-axis", "insert-bounds", "insert-values-shape",
        "meshgrid-indexing", "resize-negative", "ldexp-float-exponent", "positive-bool",
        "nanmax-where-no-initial", "nanvar-ddof-and-correction", "nanvar-int-dtype",
        "nanmax-axis", "pad-stat-length-0", "pad-mean-end_values", "pad-ramp-stat_length",
        "pad-negative", "pad-empty-axis", "pad-negative-stat_length", "pad-unknown-mode",
        "broadcast_to-minus-one", "nanmax-empty", "nancumsum-axes", "nancumprod-axis",
        "piecewise-scalar-conditions", "piecewise-short-mask"])
def test_errors_are_numpys(fn, args):
    _same_error(fn, *args)


def test_traced_positions_are_an_error():
    with pytest.raises(TypeError, match="obj must be constant"):
        tg.compile(lambda x, i: np.delete(x, i))(X, np.array([1, 2]))
    with pytest.raises(TypeError, match="obj must be constant"):
        tg.compile(lambda x, i: np.insert(x, i, 0.0))(X, np.array(1))


def test_resize_and_pad_of_empty_arrays():
    e = np.zeros((0, 3))
    for f in (lambda x: np.resize(x, (2, 2)), lambda x: np.pad(x, ((0, 0), (1, 2)),
                                                                mode="mean")):
        _close(tg.compile(f)(e), f(e), "compiled")
        _close(_value(f(NumpyTensor(e))), f(e), "eager")


@pytest.mark.parametrize("fn", [
    lambda v: np.insert(np.arange(5.0), 2, v[0]),                  # only the values traced
    lambda v: np.block([np.ones(2), v[0]]),                        # a constant block first
    lambda v: np.piecewise(v, True, [lambda t: t * 2]),         # one scalar condition
    lambda v: np.piecewise(v, [np.array(True)], [lambda t: t - t.mean()]),  # 0-d mask
    lambda v: np.piecewise(v, [np.array(False), np.array(True)], [np.sin, 0.5]),
    lambda v: np.meshgrid(v),
    lambda v: np.broadcast_to(v, v.shape) * 1.0,
    lambda v: np.nanmax((v * 10).astype(int), axis=0, where=[True, False], initial=3),
    lambda v: np.insert((v * 10).astype(np.int32), 1, 2.7),    # values cast to arr's dtype
    lambda v: np.pad((v * 100).astype(np.int8), 3, mode="linear_ramp", end_values=-100),
    lambda v: np.pad(v > 0, 1, mode="minimum"),
    lambda v: np.nanmax(v > 0, axis=0),
    lambda v: np.nanstd((v * 10).astype(int), dtype=np.float32),
    lambda v: np.nanprod(v, axis=1, where=[True, False]),
], ids=["insert-constant-arr", "block-constant-first", "piecewise-scalar-True",
        "piecewise-0d-mask", "piecewise-0d-masks", "meshgrid-one", "broadcast_to-same",
        "nanmax-int-where", "insert-int", "pad-ramp-int8", "pad-minimum-bool", "nanmax-bool",
        "nanstd-int-float32", "nanprod-where-broadcast"])
def test_more_values_are_numpys(fn):
    v = np.array([[0.3, -1.2], [1.7, 0.4]])
    want = fn(v)
    for mode, got in (("compiled", tg.compile(fn)(v)), ("eager", fn(NumpyTensor(v)))):
        assert isinstance(got, tuple) == isinstance(want, tuple), mode
        assert len(_flat(got)) == len(_flat(want)), mode
        for g, w in zip(_flat(got), _flat(want)):
            _close(_value(g), w, mode)
