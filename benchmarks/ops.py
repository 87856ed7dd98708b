"""Per-op timings: native vs the NumPy target vs hand-written NumPy.

For each elementwise, reduction and indexing row of the registry
(``tracegrad.ops.primitives.REGISTRY``), ``value_and_grad`` of a small loss
through that op (``np.sum(op(x) * G)`` for an elementwise op, with G a fixed
random array; the gradient is w.r.t. x), at several sizes:

* ``native``: ``tg.value_and_grad(loss, backend="native")``;
* ``numpy``:  ``tg.value_and_grad(loss, backend="numpy")`` (the NumPy target);
* ``hand``:   the same value and gradient written by hand in NumPy (the
  forward and the obvious backward).

``index_add`` is measured through the gradients of the gather rows (its
adjoint); dynamic_slice/dynamic_update_slice, searchsorted, argsort and
nonzero have no row.

Every candidate is timed in rounds interleaved with the others (so load that
drifts during a run cancels out); the table gives the median per-call time of
each and the ratios native/numpy and native/hand (lower is better for
native).  A row is flagged ``<<`` when native is slower than the NumPy target
by more than 10%, ``<h`` when it is slower than hand-written NumPy by more than
10% at 1e5 elements and up.

    OPENBLAS_NUM_THREADS=1 python benchmarks/ops.py                 # 1e3, 1e5, 1e6
    OPENBLAS_NUM_THREADS=1 python benchmarks/ops.py --quick         # smoke run
    python benchmarks/ops.py --ops clip,maximum,sum --sizes 1e5 --repeat 9

Before the timings, each candidate's value and gradient are checked against
the hand-written ones (rtol 1e-6), so a row is never a timing of a wrong
computation.
"""
from __future__ import annotations

import argparse
import math
import statistics
import re
import sys
import time
import warnings

import numpy as np

import tracegrad as tg
from tracegrad.ops import elementwise as E
from tracegrad.ops import special as S
from tracegrad.ops.primitives import REGISTRY


def _rng():
    return np.random.default_rng(12345)


# --- inputs -------------------------------------------------------------------------------

def _uniform(lo, hi):
    return lambda n: _rng().uniform(lo, hi, n)


NORMAL = lambda n: _rng().standard_normal(n)          # noqa: E731
POS = _uniform(0.1, 3.0)
UNIT = _uniform(-0.9, 0.9)
GT1 = _uniform(1.1, 3.0)


class Spec:
    """One row: ``loss(x, ...)`` traced, ``hand(x, ...)`` -> (value, grad wrt x).

    ``args(n)`` makes the inputs (the first is differentiated), ``op`` the
    registry row it measures."""

    def __init__(self, name, op, loss, hand, args, shape2d=False):
        self.name, self.op, self.loss, self.hand, self.args = name, op, loss, hand, args
        self.shape2d = shape2d


SPECS: list[Spec] = []


def unary(name, traced, fwd, deriv, dom=NORMAL, op=None):
    """np.sum(f(x) * G): value and gradient G * f'(x)."""
    def make(n):
        G = _rng().standard_normal(n) + 0.5

        def loss(x):
            return np.sum(traced(x) * G)

        def hand(x):
            return np.sum(fwd(x) * G), G * deriv(x)
        return loss, hand, (dom(n),)
    SPECS.append(Spec(name, op or name, None, None, make))


def binary(name, traced, fwd, deriv, dom=NORMAL, dom2=None, op=None):
    """np.sum(f(x, y) * G): value and gradient wrt x."""
    def make(n):
        G = _rng().standard_normal(n) + 0.5
        y = (dom2 or dom)(n)[::-1].copy()

        def loss(x):
            return np.sum(traced(x, y) * G)

        def hand(x):
            return np.sum(fwd(x, y) * G), G * deriv(x, y)
        return loss, hand, (dom(n),)
    SPECS.append(Spec(name, op or name, None, None, make))


def piecewise(name, traced, fwd, dom=NORMAL, op=None):
    """An op with a zero (or no) derivative, e.g. floor or a comparison:
    np.sum(f(x) * x * G), gradient f(x) * G."""
    def make(n):
        G = _rng().standard_normal(n) + 0.5

        def loss(x):
            return np.sum(traced(x) * x * G)

        def hand(x):
            f = fwd(x)
            return np.sum(f * x * G), f * G
        return loss, hand, (dom(n),)
    SPECS.append(Spec(name, op or name, None, None, make))


def custom(name, op, make):
    SPECS.append(Spec(name, op, None, None, make))


def _sig(x):
    return 1.0 / (1.0 + np.exp(-x))


def _erf(x):
    try:
        from scipy.special import erf
        return erf(x)
    except ImportError:                     # pragma: no cover
        return np.vectorize(math.erf)(x)


def _gammaln(x):
    from scipy.special import gammaln
    return gammaln(x)


def _digamma(x):
    from scipy.special import digamma
    return digamma(x)


# elementwise, one operand
unary("neg", lambda x: -x, np.negative, lambda x: -np.ones_like(x))
unary("reciprocal", np.reciprocal, np.reciprocal, lambda x: -1.0 / (x * x), POS)
unary("exp", np.exp, np.exp, np.exp)
unary("log", np.log, np.log, lambda x: 1.0 / x, POS)
unary("tanh", np.tanh, np.tanh, lambda x: 1.0 - np.tanh(x) ** 2)
unary("abs", np.abs, np.abs, np.sign)
unary("sqrt", np.sqrt, np.sqrt, lambda x: 0.5 / np.sqrt(x), POS)
unary("square", np.square, np.square, lambda x: 2.0 * x)
unary("rsqrt", E.rsqrt, lambda x: 1.0 / np.sqrt(x), lambda x: -0.5 * x ** -1.5, POS)
unary("exp2", np.exp2, np.exp2, lambda x: np.exp2(x) * math.log(2.0))
unary("expm1", np.expm1, np.expm1, np.exp)
unary("log1p", np.log1p, np.log1p, lambda x: 1.0 / (1.0 + x), POS)
unary("log2", np.log2, np.log2, lambda x: 1.0 / (x * math.log(2.0)), POS)
unary("log10", np.log10, np.log10, lambda x: 1.0 / (x * math.log(10.0)), POS)
unary("sin", np.sin, np.sin, np.cos)
unary("cos", np.cos, np.cos, lambda x: -np.sin(x))
unary("tan", np.tan, np.tan, lambda x: 1.0 + np.tan(x) ** 2, UNIT)
unary("arcsin", np.arcsin, np.arcsin, lambda x: 1.0 / np.sqrt(1.0 - x * x), UNIT)
unary("arccos", np.arccos, np.arccos, lambda x: -1.0 / np.sqrt(1.0 - x * x), UNIT)
unary("arctan", np.arctan, np.arctan, lambda x: 1.0 / (1.0 + x * x))
unary("sinh", np.sinh, np.sinh, np.cosh)
unary("cosh", np.cosh, np.cosh, np.sinh)
unary("arcsinh", np.arcsinh, np.arcsinh, lambda x: 1.0 / np.sqrt(x * x + 1.0))
unary("arccosh", np.arccosh, np.arccosh, lambda x: 1.0 / np.sqrt(x * x - 1.0), GT1)
unary("arctanh", np.arctanh, np.arctanh, lambda x: 1.0 / (1.0 - x * x), UNIT)
unary("sigmoid", E.sigmoid, _sig, lambda x: _sig(x) * (1.0 - _sig(x)))
unary("relu", E.relu, lambda x: np.maximum(x, 0), lambda x: (x > 0).astype(x.dtype))
unary("softplus", E.softplus, lambda x: np.logaddexp(x, 0.0), _sig)
unary("erf", E.erf, _erf, lambda x: 2.0 / math.sqrt(math.pi) * np.exp(-x * x))
unary("sinc", np.sinc, np.sinc,
      lambda x: (np.cos(np.pi * x) * np.pi * x - np.sin(np.pi * x)) / (np.pi * x * x), POS)
unary("deg2rad", np.deg2rad, np.deg2rad, lambda x: np.full_like(x, math.pi / 180))
unary("rad2deg", np.rad2deg, np.rad2deg, lambda x: np.full_like(x, 180 / math.pi))
unary("nan_to_num", np.nan_to_num, np.nan_to_num, lambda x: np.ones_like(x))
unary("gammaln", S.gammaln, _gammaln, _digamma, POS)
unary("clip", lambda x: np.clip(x, -0.5, 0.5), lambda x: np.clip(x, -0.5, 0.5),
      lambda x: ((x >= -0.5) & (x <= 0.5)).astype(x.dtype))
unary("clip(0,inf)", lambda x: np.clip(x, 0, np.inf), lambda x: np.clip(x, 0, np.inf),
      lambda x: (x >= 0).astype(x.dtype), op="clip")
unary("pow(x,3)", lambda x: x ** 3, lambda x: x ** 3, lambda x: 3.0 * x ** 2, op="pow")
unary("pow(x,2.5)", lambda x: x ** 2.5, lambda x: x ** 2.5, lambda x: 2.5 * x ** 1.5, POS,
      op="pow")
unary("ldexp(x,3)", lambda x: np.ldexp(x, 3), lambda x: np.ldexp(x, 3),
      lambda x: np.full_like(x, 8.0), op="ldexp")
unary("astype(f32)", lambda x: x.astype(np.float32).astype(np.float64),
      lambda x: x.astype(np.float32).astype(np.float64), lambda x: np.ones_like(x),
      op="astype")
unary("stop_gradient", lambda x: x * tg.stop_gradient(x), lambda x: x * x, lambda x: x,
      op="stop_gradient")

# elementwise, two operands (gradient wrt the first)
binary("add", np.add, np.add, lambda x, y: np.ones_like(x))
binary("sub", np.subtract, np.subtract, lambda x, y: np.ones_like(x))
binary("mul", np.multiply, np.multiply, lambda x, y: y)
binary("div", np.divide, np.divide, lambda x, y: 1.0 / y, NORMAL, POS)
binary("pow(x,y)", np.power, np.power, lambda x, y: y * x ** (y - 1.0), POS, op="pow")
binary("maximum", np.maximum, np.maximum, lambda x, y: (x > y) + 0.5 * (x == y))
binary("minimum", np.minimum, np.minimum, lambda x, y: (x < y) + 0.5 * (x == y))
binary("fmax", np.fmax, np.fmax, lambda x, y: (x > y) + 0.5 * (x == y))
binary("fmin", np.fmin, np.fmin, lambda x, y: (x < y) + 0.5 * (x == y))
binary("arctan2", np.arctan2, np.arctan2, lambda x, y: y / (x * x + y * y))
binary("hypot", np.hypot, np.hypot, lambda x, y: x / np.hypot(x, y))
binary("logaddexp", np.logaddexp, np.logaddexp, lambda x, y: _sig(x - y))
binary("logaddexp2", np.logaddexp2, np.logaddexp2, lambda x, y: _sig((x - y) * math.log(2.0)))
binary("remainder", np.remainder, np.remainder, lambda x, y: np.ones_like(x), NORMAL, POS)
binary("fmod", np.fmod, np.fmod, lambda x, y: np.ones_like(x), NORMAL, POS)
binary("copysign", np.copysign, np.copysign, lambda x, y: np.sign(x) * np.sign(y))
binary("where", lambda x, y: np.where(y > 0, x, y), lambda x, y: np.where(y > 0, x, y),
       lambda x, y: (y > 0).astype(x.dtype))

# piecewise constant ops and predicates: np.sum(f(x) * x * G)
piecewise("sign", np.sign, np.sign)
piecewise("floor", np.floor, np.floor)
piecewise("ceil", np.ceil, np.ceil)
piecewise("rint", np.rint, np.rint)
piecewise("trunc", np.trunc, np.trunc)
piecewise("round", lambda x: np.round(x, 1), lambda x: np.round(x, 1))
piecewise("isnan", np.isnan, np.isnan)
piecewise("isinf", np.isinf, np.isinf)
piecewise("isfinite", np.isfinite, np.isfinite)
_Y = 0.25
piecewise("less", lambda x: x < _Y, lambda x: x < _Y)
piecewise("less_equal", lambda x: x <= _Y, lambda x: x <= _Y)
piecewise("greater", lambda x: x > _Y, lambda x: x > _Y)
piecewise("greater_equal", lambda x: x >= _Y, lambda x: x >= _Y)
piecewise("equal", lambda x: x == _Y, lambda x: x == _Y)
piecewise("not_equal", lambda x: x != _Y, lambda x: x != _Y)
piecewise("logical_and", lambda x: np.logical_and(x > 0, x < 1),
          lambda x: np.logical_and(x > 0, x < 1))
piecewise("logical_or", lambda x: np.logical_or(x < 0, x > 1),
          lambda x: np.logical_or(x < 0, x > 1))
piecewise("logical_xor", lambda x: np.logical_xor(x < 0, x > -1),
          lambda x: np.logical_xor(x < 0, x > -1))
piecewise("logical_not", lambda x: np.logical_not(x < 0), lambda x: np.logical_not(x < 0))
piecewise("floor_divide", lambda x: x // 0.3, lambda x: x // 0.3)


# reductions: x of shape (n // 100, 100)
def _rows(n):
    return max(n // 100, 1), 100


def reduction(name, op, traced, hand_fn, dom=NORMAL):
    def make(n):
        r, c = _rows(n)
        x = dom(r * c).reshape(r, c)
        return (lambda x: traced(x)), (lambda x: hand_fn(x)), (x,)
    SPECS.append(Spec(name, op, None, None, make))


def _hand_sum_full(x):
    return np.sum(x * x), 2.0 * x


reduction("sum(x*x)", "sum", lambda x: np.sum(x * x), _hand_sum_full)


def _g_rows(x):
    return _rng().standard_normal(x.shape[0]) + 0.5


def _red_axis(name, op, traced, fwd, deriv, dom=NORMAL):
    """np.sum(red(x, axis=1) * g): gradient deriv(x, red, g)."""
    def make(n):
        r, c = _rows(n)
        x = dom(r * c).reshape(r, c)
        g = _g_rows(x)

        def loss(x):
            return np.sum(traced(x) * g)

        def hand(x):
            y = fwd(x)
            return np.sum(y * g), deriv(x, y, g)
        return loss, hand, (x,)
    SPECS.append(Spec(name, op, None, None, make))


_red_axis("sum(axis=1)", "sum", lambda x: np.sum(x, axis=1), lambda x: np.sum(x, axis=1),
          lambda x, y, g: np.broadcast_to(g[:, None], x.shape).copy())
_red_axis("prod(axis=1)", "prod", lambda x: np.prod(x, axis=1), lambda x: np.prod(x, axis=1),
          lambda x, y, g: (g * y)[:, None] / x, _uniform(0.9, 1.1))
_red_axis("amax(axis=1)", "amax", lambda x: np.max(x, axis=1), lambda x: np.max(x, axis=1),
          lambda x, y, g: (x == y[:, None]) * g[:, None])
_red_axis("amin(axis=1)", "amin", lambda x: np.min(x, axis=1), lambda x: np.min(x, axis=1),
          lambda x, y, g: (x == y[:, None]) * g[:, None])
reduction("amax(all)", "amax", lambda x: np.max(x * x),
          lambda x: (np.max(x * x), (x * x == np.max(x * x)) * 2.0 * x))


def _cum(name, op, traced, fwd, deriv, dom=NORMAL):
    def make(n):
        r, c = _rows(n)
        x = dom(r * c).reshape(r, c)
        G = _rng().standard_normal(x.shape) + 0.5

        def loss(x):
            return np.sum(traced(x) * G)

        def hand(x):
            y = fwd(x)
            return np.sum(y * G), deriv(x, y, G)
        return loss, hand, (x,)
    SPECS.append(Spec(name, op, None, None, make))


_cum("cumsum(axis=1)", "cumsum", lambda x: np.cumsum(x, axis=1), lambda x: np.cumsum(x, axis=1),
     lambda x, y, G: np.cumsum(G[:, ::-1], axis=1)[:, ::-1])
_cum("cumprod(axis=1)", "cumprod", lambda x: np.cumprod(x, axis=1),
     lambda x: np.cumprod(x, axis=1),
     lambda x, y, G: np.cumsum((G * y)[:, ::-1], axis=1)[:, ::-1] / x, _uniform(0.9, 1.1))


def _argred(name, op, traced_idx, hand_idx):
    """np.sum(take_along_axis(x, argmax(x)) * g): gradient g at the argmax."""
    def make(n):
        r, c = _rows(n)
        x = NORMAL(r * c).reshape(r, c)
        g = _g_rows(x)

        def loss(x):
            i = traced_idx(x, axis=1)
            return np.sum(np.take_along_axis(x, i[:, None], axis=1)[:, 0] * g)

        def hand(x):
            i = hand_idx(x, axis=1)
            v = np.sum(x[np.arange(x.shape[0]), i] * g)
            d = np.zeros_like(x)
            d[np.arange(x.shape[0]), i] = g
            return v, d
        return loss, hand, (x,)
    SPECS.append(Spec(name, op, None, None, make))


_argred("argmax(axis=1)", "argmax", np.argmax, np.argmax)
_argred("argmin(axis=1)", "argmin", np.argmin, np.argmin)


def _allany(name, op, fn):
    def make(n):
        r, c = _rows(n)
        x = NORMAL(r * c).reshape(r, c)
        g = _g_rows(x)

        def loss(x):
            return np.sum(np.where(fn(x > -3.0, axis=1), 1.0, 2.0) * np.sum(x * x, axis=1) * g)

        def hand(x):
            m = np.where(fn(x > -3.0, axis=1), 1.0, 2.0) * g
            return np.sum(m * np.sum(x * x, axis=1)), 2.0 * x * m[:, None]
        return loss, hand, (x,)
    SPECS.append(Spec(name, op, None, None, make))


_allany("all(axis=1)", "all", np.all)
_allany("any(axis=1)", "any", np.any)


# indexing
def _idx(n):
    return _rng().integers(0, n, n // 2)


def _getitem_slice(n):
    G = _rng().standard_normal(n - 2) + 0.5

    def loss(x):
        return np.sum(x[1:-1] * G)

    def hand(x):
        d = np.zeros_like(x)
        d[1:-1] = G
        return np.sum(x[1:-1] * G), d
    return loss, hand, (NORMAL(n),)


def _getitem_step(n):
    m = len(range(0, n, 2))
    G = _rng().standard_normal(m) + 0.5

    def loss(x):
        return np.sum(x[::2] * G)

    def hand(x):
        d = np.zeros_like(x)
        d[::2] = G
        return np.sum(x[::2] * G), d
    return loss, hand, (NORMAL(n),)


def _getitem_array(n):
    idx = _idx(n)
    G = _rng().standard_normal(idx.size) + 0.5

    def loss(x):
        return np.sum(x[idx] * G)

    def hand(x):
        d = np.zeros_like(x)
        np.add.at(d, idx, G)
        return np.sum(x[idx] * G), d
    return loss, hand, (NORMAL(n),)


def _getitem_array_bincount(n):
    idx = _idx(n)
    G = _rng().standard_normal(idx.size) + 0.5

    def loss(x):
        return np.sum(np.take(x, idx) * G)

    def hand(x):
        return np.sum(np.take(x, idx) * G), np.bincount(idx, G, minlength=n)
    return loss, hand, (NORMAL(n),)


def _getitem_mask(n):
    G = _rng().standard_normal(n) + 0.5

    def loss(x):
        return np.sum(np.where(x > 0, x, 0.0) * G)

    def hand(x):
        m = x > 0
        return np.sum(np.where(m, x, 0.0) * G), np.where(m, G, 0.0)
    return loss, hand, (NORMAL(n),)


def _setitem(n):
    G = _rng().standard_normal(n) + 0.5
    half = n // 2

    def loss(x):
        y = x * 1.0
        y[:half] = 2.0 * x[half:2 * half]
        return np.sum(y * G)

    def hand(x):
        y = x.copy()
        y[:half] = 2.0 * x[half:2 * half]
        d = G.copy()
        d[:half] = 0.0
        d[half:2 * half] += 2.0 * G[:half]
        return np.sum(y * G), d
    return loss, hand, (NORMAL(n),)


def _take_along(n):
    r, c = _rows(n)
    x = NORMAL(r * c).reshape(r, c)
    idx = _rng().integers(0, c, (r, 10))
    G = _rng().standard_normal((r, 10)) + 0.5

    def loss(x):
        return np.sum(np.take_along_axis(x, idx, axis=1) * G)

    def hand(x):
        rows = np.arange(r)[:, None]
        d = np.zeros_like(x)
        np.add.at(d, (rows, idx), G)
        return np.sum(x[rows, idx] * G), d
    return loss, hand, (x,)


def _sort(n):
    G = _rng().standard_normal(n) + 0.5

    def loss(x):
        return np.sum(np.sort(x) * G)

    def hand(x):
        i = np.argsort(x)
        d = np.empty_like(x)
        d[i] = G
        return np.sum(x[i] * G), d
    return loss, hand, (NORMAL(n),)


custom("sort", "sort", _sort)
custom("getitem x[1:-1]", "getitem", _getitem_slice)
custom("getitem x[::2]", "getitem", _getitem_step)
custom("getitem x[idx] (add.at)", "getitem", _getitem_array)
custom("take x[idx] (bincount)", "getitem", _getitem_array_bincount)
custom("where(x>0, x, 0)", "where", _getitem_mask)
custom("setitem y[:h] = 2x[h:]", "setitem", _setitem)
custom("take_along_axis", "getitem", _take_along)


# --- timing -------------------------------------------------------------------------------

def _time(fn, args, number):
    t0 = time.perf_counter()
    for _ in range(number):
        fn(*args)
    return (time.perf_counter() - t0) / number


def _close(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return a.shape == b.shape and np.allclose(a, b, rtol=1e-6, atol=1e-9 * (1 + np.abs(b).max()))


def run_one(spec, n, repeat, budget):
    loss, hand, args = spec.args(n)
    cands = {"native": tg.value_and_grad(loss, backend="native"),
             "numpy": tg.value_and_grad(loss, backend="numpy"),
             "hand": hand}
    ref = hand(*args)
    for k, f in cands.items():
        v, g = f(*args)
        if not (_close(v, ref[0]) and _close(g, ref[1])):
            raise AssertionError(f"{spec.name} [{n}]: {k} disagrees with the hand-written "
                                 f"value/gradient")
    # calls per timing so that one timing takes about `budget` seconds
    t1 = max(_time(cands["hand"], args, 1), _time(cands["numpy"], args, 1), 1e-7)
    number = max(1, min(20000, int(budget / t1)))
    times = {k: [] for k in cands}
    for _ in range(repeat):
        for k, f in cands.items():
            times[k].append(_time(f, args, number))
    med = {k: statistics.median(v) for k, v in times.items()}
    # ratios: median over rounds of the per-round ratio
    r_np = statistics.median(a / b for a, b in zip(times["native"], times["numpy"]))
    r_h = statistics.median(a / b for a, b in zip(times["native"], times["hand"]))
    return med, r_np, r_h


def _fmt_us(t):
    us = t * 1e6
    return f"{us:.1f}" if us < 1000 else f"{us:.0f}"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="1e3,1e5,1e6",
                   help="comma-separated element counts (default 1e3,1e5,1e6)")
    p.add_argument("--ops", default="",
                   help="comma-separated row names or registry ops (default: all rows)")
    p.add_argument("--repeat", type=int, default=7, help="interleaved rounds (default 7)")
    p.add_argument("--budget", type=float, default=0.02,
                   help="seconds per timing of one candidate (default 0.02)")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: sizes 1e3,1e5, 3 rounds, short timings")
    p.add_argument("--markdown", action="store_true", help="print a Markdown table")
    p.add_argument("--list", action="store_true", help="list the rows and exit")
    a = p.parse_args(argv)
    if a.quick:
        a.sizes, a.repeat, a.budget = "1e3,1e5", 3, 0.005
    sizes = [int(float(s)) for s in a.sizes.split(",") if s]
    # commas inside a row's name (pow(x,2.5)) do not separate rows
    want = {s.strip() for s in re.split(r",(?![^()]*\))", a.ops) if s.strip()}
    specs = [s for s in SPECS if not want or s.name in want or s.op in want]
    if a.list:
        for s in SPECS:
            print(f"{s.name:28s} {s.op}")
        return 0
    missing = {s.op for s in SPECS} - set(REGISTRY)
    if missing:
        print(f"rows naming no registry op: {sorted(missing)}", file=sys.stderr)

    import threadpoolctl
    info = [(d.get("internal_api"), d.get("architecture"), d.get("num_threads"))
            for d in threadpoolctl.threadpool_info()]
    print(f"# BLAS: {info}; numpy {np.__version__}; sizes {sizes}; repeat {a.repeat}")
    head = ["op", "n", "native us", "numpy us", "hand us", "nat/np", "nat/hand", ""]
    if a.markdown:
        print("| " + " | ".join(head[:-1]) + " | flag |")
        print("|" + "---|" * len(head))
    else:
        print(f"{'op':28s} {'n':>8s} {'native us':>10s} {'numpy us':>10s} {'hand us':>10s} "
              f"{'nat/np':>7s} {'nat/hand':>8s}")
    slow = []
    for spec in specs:
        for n in sizes:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    med, r_np, r_h = run_one(spec, n, a.repeat, a.budget)
            except Exception as e:           # a row that fails is reported, not fatal
                print(f"{spec.name:28s} {n:8d} ERROR {type(e).__name__}: {e}"[:200])
                continue
            flag = ("<<" if r_np > 1.10 else "") + ("<h" if n >= 100_000 and r_h > 1.10 else "")
            if flag:
                slow.append((spec.name, n, r_np, r_h))
            cells = [spec.name, str(n), _fmt_us(med["native"]), _fmt_us(med["numpy"]),
                     _fmt_us(med["hand"]), f"{r_np:.2f}", f"{r_h:.2f}", flag]
            if a.markdown:
                print("| " + " | ".join(cells) + " |", flush=True)
            else:
                print(f"{cells[0]:28s} {n:8d} {cells[2]:>10s} {cells[3]:>10s} {cells[4]:>10s} "
                      f"{cells[5]:>7s} {cells[6]:>8s} {flag}", flush=True)
    print(f"# slower on native than the NumPy target (>10%) or than hand-written NumPy at "
          f">= 1e5 (>10%): {len(slow)} rows")
    for name, n, r_np, r_h in slow:
        print(f"#   {name} [{n}]: nat/np {r_np:.2f}, nat/hand {r_h:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
