"""NumPy functions on tracegrad values (tracegrad/ops/numpy_functions.py and
what the op modules already give): every case runs the same NumPy function

* on plain arrays (the reference value),
* through ``tg.compile`` (value) and ``tg.grad`` (traced gradient),
* eagerly on ``tg.tensor(..., requires_grad=True)`` (torch face) and through
  ``tg.grad(..., compile=False)`` (NumPy-face eager values),

and checks the values against NumPy and each gradient against central
finite differences of the NumPy function in float64, along random
directions.  The loss is sum(out * C) with fixed random cotangents C, so
every output element is weighed differently.
"""
from __future__ import annotations

import numpy as np
import pytest

import tracegrad as tg

RNG = np.random.default_rng(20240601)


def _r(*shape, lo=-2.0, hi=2.0):
    return RNG.uniform(lo, hi, shape)


def _flat(out):
    if isinstance(out, (tuple, list)):
        return [o for x in out for o in _flat(x)]
    return [out]


def _cotangents(want):
    rng = np.random.default_rng(7)
    return [rng.standard_normal(np.shape(w)) if np.asarray(w).dtype.kind == "f" else None
            for w in _flat(want)]


def _loss_of(fn, cts):
    def loss(*args):
        total = 0.0
        for o, c in zip(_flat(fn(*args)), cts):
            if c is not None:
                total = total + np.sum(o * c)
        return total
    return loss


def _value(v):
    return v.detach().numpy() if hasattr(v, "detach") else np.asarray(v)


def _close(got, want, what, rtol=1e-9):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, NumPy {want.shape}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, NumPy {want.dtype}"
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol, err_msg=what, equal_nan=True)


def check(fn, *args, diff=(0,), rtol=1e-9, gtol=1e-6, eager=True):
    """Values equal NumPy's; gradients equal finite differences in every mode."""
    args = [np.asarray(a, dtype=np.float64) if i in diff else a for i, a in enumerate(args)]
    want = fn(*args)
    cts = _cotangents(want)
    loss = _loss_of(fn, cts)

    got = tg.compile(fn)(*args)
    assert len(_flat(got)) == len(_flat(want))
    for g, w in zip(_flat(got), _flat(want)):
        _close(g, w, "compiled value", rtol)

    grads = {"traced": tg.grad(loss, argnums=diff)(*args)}
    if eager:
        grads["compile=False"] = tg.grad(loss, argnums=diff, compile=False)(*args)
        ts = [tg.tensor(a, requires_grad=True) if i in diff else a for i, a in enumerate(args)]
        out = fn(*ts)
        for g, w in zip(_flat(out), _flat(want)):
            _close(_value(g), w, "eager value", rtol)
        total = loss(*ts)
        total.backward()
        grads["eager"] = tuple(ts[i].grad.numpy() if ts[i].grad is not None
                               else np.zeros_like(args[i]) for i in diff)

    rng = np.random.default_rng(11)
    eps = 1e-6
    for _ in range(2):
        dirs = [rng.standard_normal(np.shape(args[i])) for i in diff]
        plus, minus = list(args), list(args)
        for i, d in zip(diff, dirs):
            plus[i], minus[i] = args[i] + eps * d, args[i] - eps * d
        fd = (float(loss(*plus)) - float(loss(*minus))) / (2 * eps)
        for mode, g in grads.items():
            g = g if isinstance(g, tuple) else (g,)
            dot = sum(float(np.sum(np.asarray(gi) * d)) for gi, d in zip(g, dirs))
            assert abs(dot - fd) <= gtol * max(1.0, abs(fd)), \
                f"{mode} gradient: <g, d> = {dot!r}, finite difference {fd!r}"


# --- the cases --------------------------------------------------------------------------------

X2 = _r(4, 5)
X3 = _r(3, 4, 5)
V6 = _r(6)
SQ = _r(4, 4)

CASES = {
    # elementwise
    "fabs": (lambda x: np.fabs(x), X2),
    "copysign": (lambda x, y: np.copysign(x, y), _r(3, 4), np.array([1.0, -0.0, -2.0, 0.0])),
    "copysign-both": (lambda x, y: np.copysign(x, y), _r(3, 4), _r(3, 1), (0, 1)),
    # x1 is a step: finite differences across 0 are meaningless, so x1 is
    # differentiated (gradient zero) only away from 0
    "heaviside-x2": (lambda x, h: np.heaviside(x, h), np.array([[-1.0, 0.0, 2.0], [0.0, 3.0, -4.0]]),
                     _r(2, 3), (1,)),
    "heaviside-x1": (lambda x: np.heaviside(x, 0.5) * x, np.array([-1.0, 2.0, -0.3, 4.0])),
    "real_if_close": (lambda x: np.real_if_close(x) * 2, X2),
    # einsum, linear algebra
    "einsum-sublist": (lambda x, y: np.einsum(x, [0, 1], y, [1, 2], [0, 2]), _r(3, 4), _r(4, 2),
                       (0, 1)),
    "einsum-sublist-implicit": (lambda x: np.einsum(x, [1, 0], x, [1, 0]), _r(3, 4)),
    "einsum-sublist-ellipsis": (lambda x: np.einsum(x, [Ellipsis, 0], [Ellipsis]), X3),
    "eigh-U-values": (lambda a: np.linalg.eigh(a + a.T, UPLO="U")[0], SQ),
    "eigh-U-vec-squares": (lambda a: np.linalg.eigh(a + a.T, UPLO="U")[1] ** 2, SQ),
    "eigvalsh": (lambda a: np.linalg.eigvalsh(a + a.T), SQ),
    "eigvalsh-U": (lambda a: np.linalg.eigvalsh(a + a.T, UPLO="U"), SQ),
    "ptp": (lambda x: np.ptp(x, axis=1), X2),
    "ptp-keepdims": (lambda x: np.ptp(x, axis=(0, 2), keepdims=True), X3),
    # shapes
    "rollaxis": (lambda x: np.rollaxis(x, 2), X3),
    "rollaxis-start": (lambda x: np.rollaxis(x, 0, 3), X3),
    "rollaxis-neg": (lambda x: np.rollaxis(x, -1, 1), X3),
    "column_stack": (lambda x, y: np.column_stack([x, y]), _r(4), _r(4, 2), (0, 1)),
    "dstack": (lambda x, y: np.dstack([x, y]), _r(4, 5), _r(4, 5), (0, 1)),
    "dstack-1d": (lambda x: np.dstack([x, 2 * x]), V6),
    "append": (lambda x, y: np.append(x, y), X2, _r(3), (0, 1)),
    "append-axis": (lambda x, y: np.append(x, y, axis=0), X2, _r(2, 5), (0, 1)),
    "hsplit": (lambda x: np.hsplit(x[:, :4], 2), X2),
    "hsplit-1d": (lambda x: np.hsplit(x, [2, 5]), V6),
    "vsplit": (lambda x: np.vsplit(x, [1, 3]), X2),
    "dsplit": (lambda x: np.dsplit(x, 5), X3),
    "select": (lambda x: np.select([x > 1, x < -1], [x ** 2, np.sin(x)], x), X2),
    "select-default": (lambda x: np.select([x > 0], [x], 0.5), X2),
    "select-broadcast": (lambda x, y: np.select([x > 0, y < 0], [x, y]), _r(4, 1), _r(5),
                         (0, 1)),
    "linspace": (lambda a, b: np.linspace(a, b, 7), np.array(0.3), np.array(2.5), (0, 1)),
    "linspace-arrays-axis": (lambda a, b: np.linspace(a, b, 4, axis=1), _r(3), _r(3), (0, 1)),
    "linspace-no-endpoint": (lambda a, b: np.linspace(a, b, 5, endpoint=False, retstep=True),
                             np.array(-1.0), np.array(2.0), (0, 1)),
    "linspace-scalar-start": (lambda b: np.linspace(0.0, b, 6), _r(2)),
    "vander": (lambda x: np.vander(x), _r(4)),
    "vander-N-increasing": (lambda x: np.vander(x, 3, increasing=True),
                            np.array([0.0, 1.5, -2.0])),
    "polyval": (lambda p, x: np.polyval(p, x), _r(4), X2, (0, 1)),
    "polyval-scalar-x": (lambda p: np.polyval(p, 0.7), _r(5)),
    # calculus
    "gradient-1d": (lambda f: np.gradient(f), V6),
    "gradient-2d": (lambda f: np.gradient(f), X2),
    "gradient-spacing": (lambda f: np.gradient(f, 0.5, 2.0, edge_order=2), X2),
    "gradient-axis": (lambda f: np.gradient(f, axis=-1), X3),
    "gradient-coords": (lambda f: np.gradient(f, np.array([0.0, 0.5, 1.5, 1.7, 3.0, 4.1]),
                                              edge_order=2), V6),
    "gradient-coords-order1": (lambda f: np.gradient(f, np.array([0.0, 1.0, 3.0, 3.5]),
                                                     axis=0), X2),
    "gradient-traced-coords": (lambda f, x: np.gradient(f, x, edge_order=2), V6,
                               np.cumsum(RNG.uniform(0.5, 1.5, 6)), (0, 1)),
    "trapezoid": (lambda y: np.trapezoid(y), X2),
    "trapezoid-dx-axis": (lambda y: np.trapezoid(y, dx=0.3, axis=0), X3),
    "trapezoid-x": (lambda y, x: np.trapezoid(y, x), X2, np.cumsum(RNG.uniform(0.2, 1, 5)),
                    (0, 1)),
    "trapezoid-x-nd": (lambda y, x: np.trapezoid(y, x, axis=0), X2, _r(4, 5), (0, 1)),
    "interp": (lambda x, fp: np.interp(x, np.linspace(-2, 2, 7), fp), X2, _r(7), (0, 1)),
    "interp-xp-traced": (lambda x, xp, fp: np.interp(x, xp, fp),
                         np.array([-3.0, -1.3, 0.2, 0.9, 2.5, 7.0]),
                         np.array([-2.0, -0.5, 0.4, 1.1, 3.0]), _r(5), (0, 1, 2)),
    "interp-left-right": (lambda x, fp: np.interp(x, [0.0, 1.0, 2.0], fp, left=-5.0, right=5.0),
                          np.array([-1.0, 0.5, 1.2, 1.9, 3.0]), _r(3), (0, 1)),
    "interp-one-point": (lambda x, fp: np.interp(x, [0.5], fp), np.array([-1.0, 0.5, 2.0]),
                         _r(1), (0, 1)),
    "interp-period": (lambda x, fp: np.interp(x, [10.0, 200.0, 300.0, 350.0], fp, period=360),
                      np.array([-170.0, 20.0, 250.0, 355.0, 400.0]), _r(4), (0, 1)),
    "convolve": (lambda a, v: np.convolve(a, v), _r(6), _r(3), (0, 1)),
    "convolve-same-swap": (lambda a, v: np.convolve(a, v, "same"), _r(3), _r(7), (0, 1)),
    "convolve-valid": (lambda a, v: np.convolve(a, v, mode="valid"), _r(7), _r(4), (0, 1)),
    "correlate": (lambda a, v: np.correlate(a, v), _r(6), _r(3), (0, 1)),
    "correlate-full-swap": (lambda a, v: np.correlate(a, v, "full"), _r(3), _r(6), (0, 1)),
    "correlate-same": (lambda a, v: np.correlate(a, v, "same"), _r(6), _r(4), (0, 1)),
    # statistics
    "average": (lambda x: np.average(x), X2),
    "average-weights": (lambda x: np.average(x, axis=0, weights=np.arange(1.0, 5.0)), X2),
    "average-weights-traced": (lambda x, w: np.average(x, axis=(2, 0), weights=w,
                                                       returned=True),
                               X3, _r(5, 3, lo=0.5), (0, 1)),
    "average-keepdims": (lambda x, w: np.average(x, weights=w, keepdims=True), X2,
                         _r(4, 5, lo=0.1), (0, 1)),
    "cov": (lambda m: np.cov(m), X2),
    "cov-y-rowvar": (lambda m, y: np.cov(m, y, rowvar=False), X2, _r(4), (0, 1)),
    "cov-bias-ddof": (lambda m: np.cov(m, bias=True) + np.cov(m, ddof=2), X2),
    "cov-weights": (lambda m: np.cov(m, fweights=[1, 2, 1, 3, 1], aweights=[0.5, 1, 2, 1, .3]),
                    X2),
    "cov-1d": (lambda m: np.cov(m), V6),
    "corrcoef": (lambda m: np.corrcoef(m), X2),
    "corrcoef-y": (lambda x, y: np.corrcoef(x, y), V6, _r(6), (0, 1)),
    "median": (lambda x: np.median(x), X2),
    "median-odd-axis": (lambda x: np.median(x, axis=1), X2),
    "median-axes-keepdims": (lambda x: np.median(x, axis=(0, 2), keepdims=True), X3),
    "quantile": (lambda x: np.quantile(x, 0.3), X2),
    "quantile-array-axis": (lambda x: np.quantile(x, [0.1, 0.5, 1.0], axis=1), X2),
    "quantile-keepdims": (lambda x: np.quantile(x, [[0.25], [0.8]], axis=(0, 2), keepdims=True),
                          X3),
    "quantile-lower": (lambda x: np.quantile(x, 0.3, axis=0, method="lower"), X2),
    "quantile-higher": (lambda x: np.quantile(x, 0.3, axis=0, method="higher"), X2),
    "quantile-midpoint": (lambda x: np.quantile(x, 0.3, axis=0, method="midpoint"), X2),
    "quantile-nearest": (lambda x: np.quantile(x, [0.3, 0.62], axis=0, method="nearest"), X2),
    "percentile": (lambda x: np.percentile(x, [10, 90], axis=-1), X3),
    "nansum": (lambda x: np.nansum(np.where(x > 1.5, np.nan, x), axis=0), X2),
    "nanmean": (lambda x: np.nanmean(np.where(x > 1.5, np.nan, x), axis=1), X2),
    # already there: checked here with the rest
    "sort": (lambda x: np.sort(x, axis=0), X2),
    "sort-none": (lambda x: np.sort(x, axis=None), X2),
    "argsort-take_along_axis": (lambda x: np.take_along_axis(x, np.argsort(x, axis=1), axis=1),
                                X2),
    "cumprod": (lambda x: np.cumprod(x, axis=1), X2),
    "pad-constant-per-axis": (lambda x: np.pad(x, ((1, 2), (2, 0)),
                                               constant_values=((1, 2), (3, 4))), X2),
    "pad-constant-pairs": (lambda x: np.pad(x, 1, constant_values=(-1.0, 5.0)), X3),
    "pad-edge": (lambda x: np.pad(x, (2, 3), mode="edge"), X2),
    "pad-reflect": (lambda x: np.pad(x, [(3, 1), (6, 2)], mode="reflect"), X2),
    "pad-symmetric": (lambda x: np.pad(x, 2, mode="symmetric"), X2),
    "pad-wrap": (lambda x: np.pad(x, ((0, 7), (2, 1)), mode="wrap"), X2),
    "pad-reflect-odd": (lambda x: np.pad(x, ((2, 1), (1, 3)), mode="reflect",
                                         reflect_type="odd"), X2),
    "pad-symmetric-odd-1d": (lambda x: np.pad(x, 3, mode="symmetric", reflect_type="odd"), V6),
    # ufunc methods
    "add.reduce-default-axis": (lambda x: np.add.reduce(x), X2),
    "add.reduce-axes-keepdims": (lambda x: np.add.reduce(x, axis=(0, 2), keepdims=True), X3),
    "add.reduce-where": (lambda x: np.add.reduce(x, axis=1, where=x > 0), X2),
    "multiply.reduce-initial": (lambda x: np.multiply.reduce(x, axis=1, initial=2.0), X2),
    "maximum.reduce": (lambda x: np.maximum.reduce(x, axis=None), X2),
    "minimum.reduce-where": (lambda x: np.minimum.reduce(x, axis=0, initial=1.0,
                                                         where=[[True], [False], [True], [True]]),
                             X2),
    "logaddexp.reduce": (lambda x: np.logaddexp.reduce(x, axis=1), X2),
    "logaddexp2.reduce": (lambda x: np.logaddexp2.reduce(x, axis=0), X2),
    "subtract.reduce": (lambda x: np.subtract.reduce(x, axis=1), X2),
    "hypot.reduce": (lambda x: np.hypot.reduce(x, axis=(0, 1)), X2),
    "add.accumulate": (lambda x: np.add.accumulate(x), X2),
    "multiply.accumulate": (lambda x: np.multiply.accumulate(x, axis=1), X2),
    "maximum.accumulate": (lambda x: np.maximum.accumulate(x, axis=1), X2),
    "minimum.accumulate": (lambda x: np.minimum.accumulate(x, axis=0), X2),
    "logaddexp.accumulate": (lambda x: np.logaddexp.accumulate(x, axis=-1), X3),
    "add.outer": (lambda x, y: np.add.outer(x, y), _r(3), _r(2, 2), (0, 1)),
    "multiply.outer": (lambda x, y: np.multiply.outer(x, y), _r(3), _r(4), (0, 1)),
    "maximum.outer": (lambda x, y: np.maximum.outer(x, y), _r(3), _r(4), (0, 1)),
    "add.reduceat": (lambda x: np.add.reduceat(x, [0, 4, 1, 5]), _r(8)),
    "multiply.reduceat-axis": (lambda x: np.multiply.reduceat(x, [0, 2, 3], axis=1), X2),
    "maximum.reduceat": (lambda x: np.maximum.reduceat(x, [1, 3], axis=0), X2),
}


def _add_at(x, v):
    x = x * 1.0  # a copy: np.add.at updates it in place
    np.add.at(x, [0, 2, 0, 0], v)
    return x


def _multiply_at(x, v):
    x = x * 1.0
    np.multiply.at(x, (np.array([0, 1, 0]), np.array([2, 2, 2])), v)
    return x


def _maximum_at(x, v):
    x = x + 0.0
    np.maximum.at(x, [1, 1, 3], v)
    return x


def _negative_at(x):
    x = x * 1.0
    np.negative.at(x, [0, 0, 1])
    return x


def _subtract_at_2d(x, v):
    x = x * 1.0
    np.subtract.at(x, (slice(None), [1, 1]), v)
    return x


CASES.update({
    "add.at": (_add_at, _r(4), _r(4), (0, 1)),
    "add.at-scalar-b": (lambda x: _add_at(x, 1.5), _r(4)),
    "multiply.at": (_multiply_at, _r(3, 4), _r(3), (0, 1)),
    "maximum.at": (_maximum_at, _r(5), _r(3), (0, 1)),
    "negative.at": (_negative_at, _r(3)),
    "subtract.at-2d": (_subtract_at_2d, _r(3, 4), _r(3, 2), (0, 1)),
})


def _case_args(spec):
    fn, *rest = spec
    diff = (0,)
    if rest and isinstance(rest[-1], tuple):
        diff = rest.pop()
    return fn, rest, diff


@pytest.mark.parametrize("name", sorted(CASES))
def test_value_and_gradient(name):
    fn, args, diff = _case_args(CASES[name])
    check(fn, *args, diff=diff)


# --- norms: every ord, axis and keepdims ----------------------------------------------------

VECTOR_ORDS = [None, np.inf, -np.inf, 1, 2, 3, 0.5, -1, -2.5]
MATRIX_ORDS = [None, "fro", "nuc", 1, -1, 2, -2, np.inf, -np.inf]


@pytest.mark.parametrize("ord", VECTOR_ORDS, ids=repr)
@pytest.mark.parametrize("axis,keepdims", [(None, False), (1, True), (-1, False), ((0,), True)])
def test_vector_norm(ord, axis, keepdims):
    x = X3 if axis is not None else V6
    check(lambda a: np.linalg.norm(a, ord=ord, axis=axis, keepdims=keepdims), x)


@pytest.mark.parametrize("ord", MATRIX_ORDS, ids=repr)
@pytest.mark.parametrize("axis,keepdims", [(None, False), ((0, 1), True), ((2, 0), False),
                                           ((-1, -2), True)])
def test_matrix_norm(ord, axis, keepdims):
    x = X3 if axis is not None else X2
    check(lambda a: np.linalg.norm(a, ord=ord, axis=axis, keepdims=keepdims), x)


def test_vector_norm_ord_0_counts_and_has_no_gradient():
    """ord=0 counts the nonzero entries, a piecewise-constant integer count:
    it has no gradient.  tg.grad gives zeros (the output does not depend
    differentiably on x, as JAX); eagerly the result does not require grad
    (as torch's count_nonzero), so backward through it alone is an error."""
    x = np.array([[1.0, 0.0, -2.0], [0.0, 0.0, 3.0]])
    f = lambda a: np.linalg.norm(a, ord=0, axis=1)
    _close(tg.compile(f)(x), f(x), "ord=0")
    np.testing.assert_array_equal(tg.grad(lambda a: np.sum(f(a)))(x), np.zeros_like(x))
    t = tg.tensor(x, requires_grad=True)
    assert not f(t).requires_grad


# --- dtypes follow NumPy ---------------------------------------------------------------------

@pytest.mark.parametrize("fn", [
    lambda x: np.fabs(x), lambda x: np.copysign(x, -1.0), lambda x: np.heaviside(x, 0.5),
    lambda x: np.median(x, axis=0), lambda x: np.quantile(x, 0.4, axis=1),
    lambda x: np.gradient(x, axis=0), lambda x: np.trapezoid(x), lambda x: np.vander(x[0]),
    lambda x: np.linspace(x[0, 0], x[1, 1], 4), lambda x: np.polyval(x[0], x),
    lambda x: np.add.accumulate(x, axis=1), lambda x: np.maximum.reduce(x),
    lambda x: np.pad(x, 1, constant_values=((1, 2), (3, 4))),
], ids=["fabs", "copysign", "heaviside", "median", "quantile", "gradient", "trapezoid",
        "vander", "linspace", "polyval", "add.accumulate", "maximum.reduce", "pad"])
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_dtypes_follow_numpy(fn, dtype):
    x = (RNG.uniform(-3, 3, (3, 4)) * (10 if dtype == np.int64 else 1)).astype(dtype)
    want = np.asarray(fn(x))
    got = tg.compile(fn)(x)
    assert np.asarray(got).dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-5)
    eager = fn(tg.tensor(x))
    assert np.asarray(_value(eager)).dtype == want.dtype


def test_interp_is_float64_like_numpy():
    x = np.float32([0.2, 1.7])
    got = tg.compile(lambda x: np.interp(x, [0.0, 1.0, 2.0], [1.0, 3.0, 2.0]))(x)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, np.interp(x, [0.0, 1.0, 2.0], [1.0, 3.0, 2.0]))


# --- median and quantile pick elements: the gradient goes to them -----------------------------

def test_median_gradient_at_ties_goes_to_the_selected_element():
    # three equal middle values: sort is stable, so the selected one is the
    # first of them in x's order; it alone gets the gradient (as in JAX)
    x = np.array([5.0, 1.0, 1.0, 1.0, 0.0])
    g = tg.grad(lambda a: np.median(a))(x)
    np.testing.assert_array_equal(g, [0.0, 0.0, 1.0, 0.0, 0.0])
    t = tg.tensor(x, requires_grad=True)
    np.median(t).backward()
    np.testing.assert_array_equal(t.grad.numpy(), g)


def test_median_and_quantile_of_a_slice_with_nan_are_nan():
    x = np.array([[1.0, np.nan, 3.0], [4.0, 5.0, 6.0]])
    for f in (lambda a: np.median(a, axis=1), lambda a: np.quantile(a, 0.2, axis=1)):
        np.testing.assert_array_equal(tg.compile(f)(x), f(x))


# --- errors that say what to do ---------------------------------------------------------------

def _traced_error(fn, *args, exc=Exception, match=None):
    with pytest.raises(exc, match=match):
        tg.compile(fn)(*args)
    with pytest.raises(exc, match=match):
        fn(*[tg.tensor(a) if isinstance(a, np.ndarray) else a for a in args])


def test_quantile_methods_other_than_the_supported_are_an_error():
    _traced_error(lambda x: np.quantile(x, 0.5, method="weibull"), X2,
                  exc=NotImplementedError, match="weibull.*linear")
    _traced_error(lambda x: np.quantile(x, 1.5), X2, exc=ValueError, match=r"\[0, 1\]")


def test_traced_q_is_an_error():
    with pytest.raises(TypeError, match="q must be a constant"):
        tg.compile(lambda x, q: np.quantile(x, q))(X2, np.array(0.5))


def test_real_if_close_refuses_complex():
    from tracegrad.ops.numpy_functions import real_if_close
    with pytest.raises(TypeError, match="complex"):
        real_if_close(np.array([1 + 2j]))


X_PLAIN = np.zeros(3)


def test_at_on_a_plain_array_with_a_traced_value_points_to_index_add():
    def f(v):
        np.add.at(X_PLAIN, [0, 0], v)      # a global array: not one the function made
        return X_PLAIN
    with pytest.raises(TypeError, match="tg.index_add"):
        tg.compile(f)(np.array([1.0, 2.0]))


def test_at_on_an_array_the_function_made_accumulates():
    def f(v):
        x = np.zeros(3)
        np.add.at(x, [0, 0, 2], v)
        return x
    v = np.array([1.0, 2.0, 4.0])
    np.testing.assert_allclose(tg.compile(f)(v), [3.0, 0.0, 4.0])
    np.testing.assert_allclose(tg.grad(lambda v: np.sum(f(v) ** 2))(v), [6.0, 6.0, 8.0])


def test_add_at_on_a_leaf_that_requires_grad_is_torchs_error():
    t = tg.tensor(np.zeros(3), requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf Variable"):
        np.add.at(t, [0], 1.0)


def test_add_at_with_traced_indices():
    def f(x, i):
        y = x * 2.0
        np.add.at(y, i, x[:2])
        return y
    x, i = _r(4), np.array([3, 3])
    want = f(x, i)
    np.testing.assert_allclose(tg.compile(f)(x, i), want)
    g = tg.grad(lambda x, i: np.sum(f(x, i) ** 2))(x, i)
    eps = 1e-6
    fd = [(np.sum(f(x + eps * e, i) ** 2) - np.sum(f(x - eps * e, i) ** 2)) / (2 * eps)
          for e in np.eye(4)]
    np.testing.assert_allclose(g, fd, rtol=1e-6)


def test_multiply_at_with_traced_indices_is_an_error():
    def f(x, i):
        y = x * 1.0
        np.multiply.at(y, i, 2.0)
        return y
    with pytest.raises(TypeError, match="indices must be constants"):
        tg.compile(f)(_r(4), np.array([0, 1]))


def test_ufunc_methods_of_non_binary_or_unknown_ufuncs_are_errors():
    _traced_error(lambda x: np.bitwise_and.outer(x, x), V6, exc=NotImplementedError,
                  match="has no rule")


def test_reduce_where_without_identity_needs_initial():
    _traced_error(lambda x: np.maximum.reduce(x, axis=0, where=x > 0), X2, exc=ValueError,
                  match="initial")


def test_eig_of_a_general_matrix_points_to_eigh():
    _traced_error(lambda a: np.linalg.eig(a)[0], SQ, exc=TypeError, match="eigvalsh")
    _traced_error(lambda a: np.linalg.eigvals(a), SQ, exc=TypeError, match="complex")


def test_unsupported_pad_mode_is_an_error():
    _traced_error(lambda x: np.pad(x, 1, mode="empty"), X2, exc=NotImplementedError,
                  match="empty")


def test_shape_errors_match_numpy():
    _traced_error(lambda x: np.vsplit(x, 2), V6, exc=ValueError, match="2 or more")
    _traced_error(lambda x: np.dsplit(x, 2), X2, exc=ValueError, match="3 or more")
    _traced_error(lambda x: np.vander(x), X2, exc=ValueError, match="one-dimensional")
    _traced_error(lambda x: np.select([x > 0], [x, x]), X2, exc=ValueError, match="same length")
    _traced_error(lambda x: np.gradient(x, edge_order=2), np.ones(2), exc=ValueError,
                  match="too small")
    _traced_error(lambda x: np.average(x, weights=np.ones(5)), X2, exc=TypeError,
                  match="Axis must be specified")


def test_top_level_names():
    x = _r(5)
    np.testing.assert_allclose(tg.interp(x, [-1.0, 1.0], [0.0, 2.0]),
                               np.interp(x, [-1.0, 1.0], [0.0, 2.0]))
    np.testing.assert_allclose(tg.vander(x, 3), np.vander(x, 3))
    np.testing.assert_array_equal(tg.searchsorted(np.sort(x), [0.0, 0.5]),
                                  np.searchsorted(np.sort(x), [0.0, 0.5]))
