"""A differential check of every NumPy ufunc tracegrad compiles against
NumPy itself, on the values where C and NumPy part ways: signed zeros,
infinities, NaN, subnormals and the extremes of each integer type.

For each unary and binary ufunc (all pairs of the special values), each
float and integer dtype: the compiled function's result on a target
(native by default, or the CUDA target through the emulator) against
NumPy's.  Floats must agree within 4 ulp, with NaN where NumPy has NaN, the
same infinities and the same signs of zero; integers and bools exactly, and
dtypes always.  A ufunc tracegrad refuses is skipped (its error is the
refusal's business, tests/test_bad_input.py).

    python benchmarks/ufunc_edges.py                  # native
    python benchmarks/ufunc_edges.py --backend numpy
    python benchmarks/ufunc_edges.py --backend cuda-emulated

Found on its first run (2026-11-27, all fixed, tests/test_native_ops.py and
tests/test_cuda.py): logical_xor of floats; abs, fmax, fmin, fmod, floor,
ceil and trunc of int64 through double; x ** 5 of integers; the most
negative value // -1 (SIGFPE); bool floor_divide (a failed C build).
Known and left: np.reciprocal of an integer 0 (NumPy's value there is the
division's undefined result; NumPy warns).
"""
from __future__ import annotations

import argparse
import itertools
import os
import sys
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tracegrad as tg  # noqa: E402
from tracegrad import testing  # noqa: E402

FLOATS = [-0.0, 0.0, 1.0, -1.0, 0.5, -2.5, np.nan, np.inf, -np.inf, 1e-310, -1e-310, 1e308,
          -1e308, 3.0, 1e-20, 710.0, -745.5, 0.7, 100.0, -100.0, 2.0 ** 53 + 2]
UNARY = ["negative", "positive", "absolute", "fabs", "sign", "sqrt", "square", "cbrt",
         "reciprocal", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos",
         "tan", "arcsin", "arccos", "arctan", "sinh", "cosh", "tanh", "arcsinh", "arccosh",
         "arctanh", "floor", "ceil", "trunc", "rint", "deg2rad", "rad2deg", "isnan", "isinf",
         "isfinite", "signbit", "spacing", "logical_not", "invert"]
BINARY = ["add", "subtract", "multiply", "divide", "floor_divide", "remainder", "fmod", "power",
          "float_power", "maximum", "minimum", "fmax", "fmin", "arctan2", "hypot", "logaddexp",
          "logaddexp2", "copysign", "nextafter", "heaviside", "equal", "not_equal", "less",
          "less_equal", "greater", "greater_equal", "logical_and", "logical_or", "logical_xor",
          "bitwise_and", "bitwise_or", "bitwise_xor", "left_shift", "right_shift", "gcd", "lcm"]
KNOWN = {("reciprocal", "int64"), ("reciprocal", "int32")}


def _integers(dt):
    if dt == np.bool_:
        return [True, False]
    info = np.iinfo(dt)
    vals = {info.min, info.max, 0, 1, 2, 3, 7, info.max - 1, info.min + 1}
    if info.min < 0:
        vals |= {-1, -7}
    if info.bits == 64:
        vals.add(2 ** 53 + 1)
        if info.min < 0:
            vals.add(-(2 ** 53) - 3)
    return sorted(vals)


def _bad(got, want, dt):
    """Indices where got is not NumPy's want (None if they agree)."""
    got, want = np.asarray(got), np.asarray(want)
    if got.dtype != want.dtype or got.shape != want.shape:
        return f"dtype/shape {got.dtype}{got.shape}, NumPy {want.dtype}{want.shape}"
    if want.dtype.kind != "f":
        bad = got != want
    else:
        w, g = want.astype(np.float64), got.astype(np.float64)
        nan_w, nan_g = np.isnan(w), np.isnan(g)
        bad = nan_w != nan_g
        both = ~nan_w & ~nan_g
        exact = both & (np.isinf(w) | np.isinf(g) | (w == 0) | (g == 0))
        bad |= exact & ((g != w) | (np.signbit(g) != np.signbit(w)))
        near = both & ~exact
        tol = 4 * np.spacing(np.abs(want[near]))
        bad[near] |= np.abs(g[near] - w[near]) > tol
    return np.nonzero(bad)[0] if bad.any() else None


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="native", choices=["native", "numpy", "cuda-emulated"])
    a = p.parse_args(argv)
    warnings.simplefilter("ignore")
    emulated = a.backend == "cuda-emulated"
    ctx = testing.emulated_cupy() if emulated else None
    xp = ctx.__enter__() if emulated else np
    backend = "cupy" if emulated else a.backend
    found = checked = refused = 0

    def run(fn, args):
        got = tg.compile(fn, backend=backend)(*[xp.asarray(t) for t in args])
        return testing.to_host(got) if emulated else got

    try:
        for dt in (np.float64, np.float32, np.int64, np.int32, np.int8, np.uint64, np.uint8,
                   np.bool_):
            vals = FLOATS if np.dtype(dt).kind == "f" else _integers(dt)
            x = np.array(vals, dtype=dt)
            pa, pb = zip(*itertools.product(vals, vals))
            pairs = (np.array(pa, dtype=dt), np.array(pb, dtype=dt))
            for name, args in [(n, (x,)) for n in UNARY] + [(n, pairs) for n in BINARY]:
                fn = getattr(np, name)
                try:
                    with np.errstate(all="ignore"):
                        want = fn(*args)
                except (TypeError, ValueError):
                    continue        # NumPy has no loop for these dtypes
                try:
                    with np.errstate(all="ignore"):
                        got = run(lambda *t: fn(*t), args)
                except (NotImplementedError, TypeError, ValueError):
                    refused += 1    # refused with an error (not this script's business)
                    continue
                except AttributeError as e:
                    if not emulated:
                        raise
                    print(f"{np.dtype(dt).name:8s} {name:14s} not run: {e}")
                    continue        # a name the emulator's CuPy stand-in lacks
                checked += 1
                bad = _bad(got, want, dt)
                if bad is None or (name, np.dtype(dt).name) in KNOWN:
                    continue
                found += 1
                if isinstance(bad, str):
                    print(f"{np.dtype(dt).name:8s} {name:14s} {bad}")
                    continue
                eg = [tuple(np.asarray(t)[i].item() for t in args) + (got[i].item(), want[i].item())
                      for i in bad[:3]]
                print(f"{np.dtype(dt).name:8s} {name:14s} {len(bad)} differ, e.g. "
                      f"(operands, got, NumPy): {eg}")
    finally:
        if emulated:
            ctx.__exit__(None, None, None)
    print(f"# {a.backend}: {checked} (ufunc, dtype) cases checked, {found} differ from NumPy; "
          f"{refused} refused with an error")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
