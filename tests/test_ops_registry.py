"""Every row of the primitive registry, checked against its own impl.

For each row there is at least one case below (a new row without a case
fails ``test_every_row_has_a_case``).  Each case binds the primitive
directly and checks:

* vjp: ``autograd.grad`` with random cotangents against a central finite
  difference along random directions (<ct, J d> == <J^T ct, d>), float64;
* jvp: ``jvp_apply`` against the finite difference along a random direction;
* the shape rule against the impl's real output (shape and dtype);
* the NumPy emitter, evaluated with ``np`` and its helpers, against impl;
* a float32 run: outputs and gradients stay float32.
"""
from __future__ import annotations

import importlib.util
import os
import zlib

import warnings

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.ops import runtime_numpy
from tracegrad.ops.primitives import REGISTRY, Aval, bind
from tracegrad.ops.base import jvp_apply
from tracegrad.ops.indexing import parse_index


# --- operand specs -----------------------------------------------------------------------

class Rand:
    """A differentiable float operand drawn uniformly from [lo, hi)."""
    def __init__(self, shape, lo=-2.0, hi=2.0, make=None):
        self.shape, self.lo, self.hi, self.make = tuple(shape), lo, hi, make

    def draw(self, rng):
        x = rng.uniform(self.lo, self.hi, self.shape)
        return self.make(x) if self.make else x


def P(*shape):  # positive
    return Rand(shape, 0.5, 2.0)


def U(*shape):  # inside (-1, 1)
    return Rand(shape, -0.8, 0.8)


def A(*shape):
    return Rand(shape)


def SPD(n, batch=()):
    def make(x):
        return x @ np.swapaxes(x, -1, -2) + n * np.eye(n)
    return Rand(batch + (n, n), make=make)


def SYM(n):
    return Rand((n, n), make=lambda x: x + x.T)


def WELL(n, batch=()):  # well-conditioned square matrices
    return Rand(batch + (n, n), -1, 1, make=lambda x: x + 3 * np.eye(n))


class Const:
    """A non-differentiable operand passed as is (index arrays, masks, scalars)."""
    def __init__(self, value):
        self.value = value


class Case:
    def __init__(self, prim, operands, attrs=None, id=None, proj=None, f32=True, tol=1e-6):
        self.prim, self.operands, self.attrs = prim, operands, attrs or {}
        self.id = id or prim
        self.proj = proj  # projection of tangent directions (e.g. symmetrise)
        self.f32 = f32
        self.tol = tol

    def __repr__(self):
        return self.id


def sym_proj(d):
    return (d + np.swapaxes(d, -1, -2)) / 2


# --- the cases ------------------------------------------------------------------------------

UNARY_DOMAIN = {
    "log": P, "sqrt": P, "rsqrt": P, "reciprocal": P, "log2": P, "log10": P, "log1p": P,
    "arcsin": U, "arccos": U, "arctanh": U, "arccosh": lambda *s: Rand(s, 1.5, 3.0),
    "tan": lambda *s: Rand(s, -1.2, 1.2),
}
UNARY = ["neg", "reciprocal", "exp", "log", "tanh", "abs", "sign", "sqrt", "square", "rsqrt",
         "exp2", "expm1", "log1p", "log2", "log10", "sin", "cos", "tan", "arcsin", "arccos",
         "arctan", "sinh", "cosh", "arcsinh", "arccosh", "arctanh", "sigmoid", "relu", "softplus",
         "erf", "sinc", "deg2rad", "rad2deg", "floor", "ceil", "rint", "trunc"]
BINARY_DOMAIN = {"pow": (P, A), "div": (A, P), "floor_divide": (A, P), "remainder": (A, P),
                 "fmod": (A, P)}
BINARY = ["add", "sub", "mul", "div", "pow", "maximum", "minimum", "fmax", "fmin", "arctan2",
          "hypot", "logaddexp", "logaddexp2", "floor_divide", "remainder", "fmod"]
COMPARE = ["less", "less_equal", "greater", "greater_equal", "equal", "not_equal"]
LOGICAL = ["logical_and", "logical_or", "logical_xor"]

CASES = []
for name in UNARY:
    mk = UNARY_DOMAIN.get(name, A)
    CASES.append(Case(name, [mk(3, 4)]))
for name in BINARY:
    mx, my = BINARY_DOMAIN.get(name, (A, A))
    CASES += [
        Case(name, [mx(3, 4), my(3, 4)], id=f"{name}-same"),
        Case(name, [mx(3, 1), my(1, 4)], id=f"{name}-(3,1)x(1,4)"),
        Case(name, [mx(4), my(3, 4)], id=f"{name}-(4,)x(3,4)"),
        Case(name, [Const(1.5), my(3, 4)], id=f"{name}-scalar-x"),
        Case(name, [mx(3, 4), Const(1.5)], id=f"{name}-x-scalar"),
    ]
CASES += [Case("pow", [A(3, 4), Const(2)], id="pow-square"),
          Case("pow", [A(3, 4), Const(3)], id="pow-int3"),
          Case("pow", [P(3, 4), Const(-0.5)], id="pow-neg-half")]
for name in COMPARE:
    CASES.append(Case(name, [A(3, 1), A(4)]))
_mask = Const(np.array([[True, False, True, False]] * 3))
for name in LOGICAL:
    CASES.append(Case(name, [_mask, Const(np.eye(3, 4, dtype=bool))]))
CASES += [
    Case("logical_not", [_mask]),
    Case("isnan", [A(3, 4)]), Case("isinf", [A(3, 4)]), Case("isfinite", [A(3, 4)]),
    Case("where", [_mask, A(3, 4), A(3, 1)]),
    Case("where", [Const(np.array([True, False, True, True])), A(3, 4), Const(0.0)],
         id="where-scalar"),
    Case("clip", [A(3, 4), Rand((3, 1), -1, -0.2), Rand((1, 4), 0.2, 1)]),
    Case("clip", [A(3, 4), Const(-0.5), Const(0.5)], id="clip-scalars"),
    Case("round", [A(3, 4)], {"decimals": 1}),
    Case("nan_to_num", [A(3, 4)], {"nan": 0.0, "posinf": 1e30, "neginf": -1e30}),
    Case("astype", [A(3, 4)], {"dtype": "float64"}, f32=False),
    Case("stop_gradient", [A(3, 4)]),
    Case("clone", [A(3, 4)]),
    Case("zeros_like", [A(3, 4)]),
    Case("plus_identity", [A(3, 3)]),
    Case("basis", [], {"shape": (2, 3), "dtype": "float64"}, f32=False),
    Case("sum", [A(2, 3, 4)], {"axis": (0, 2), "keepdims": False}),
    Case("sum", [A(2, 3, 4)], {"axis": (1,), "keepdims": True}, id="sum-keepdims"),
    Case("reshape", [A(3, 4)], {"shape": (2, 6)}),
    Case("broadcast_to", [A(3, 1)], {"shape": (2, 3, 4)}),
    Case("transpose", [A(2, 3, 4)], {"axes": (2, 0, 1)}),
    Case("matmul", [A(3, 4), A(4, 5)]),
    Case("matmul", [A(4), A(4, 5)], id="matmul-vec-mat"),
    Case("matmul", [A(3, 4), A(4)], id="matmul-mat-vec"),
    Case("matmul", [A(4), A(4)], id="matmul-vec-vec"),
    Case("matmul", [A(2, 3, 4), A(4, 5)], id="matmul-batched"),
    Case("matmul", [A(2, 1, 3, 4), A(5, 4, 2)], id="matmul-broadcast-batch"),
    Case("matmul", [A(4), A(2, 4, 3)], id="matmul-vec-batch"),
    Case("matmul", [A(2, 3, 4), A(4)], id="matmul-batch-vec"),
    # reductions and scans
    Case("prod", [A(3, 4)], {"axis": (1,), "keepdims": False}),
    Case("prod", [Rand((2, 3, 4), make=lambda x: np.where(np.arange(4) == 1, 0.0, x))],
         {"axis": (0, 2), "keepdims": True}, id="prod-zeros"),
    # one zero in a row, two in another, none in the third
    Case("prod", [Rand((3, 4), make=lambda x: x * np.array([[1, 0, 1, 1], [0, 1, 1, 0],
                                                            [1, 1, 1, 1]]))],
         {"axis": (1,), "keepdims": False}, id="prod-zeros-counted"),
    Case("amax", [A(3, 4)], {"axis": (1,), "keepdims": False}),
    Case("amax", [A(2, 3, 4)], {"axis": (0, 2), "keepdims": True}, id="amax-multi"),
    Case("amin", [A(3, 4)], {"axis": (0, 1), "keepdims": False}),
    Case("argmax", [A(3, 4)], {"axis": 1, "keepdims": False}),
    Case("argmin", [A(3, 4)], {"axis": None, "keepdims": False}),
    Case("all", [Const(np.array([[1.0, 0.0], [2.0, 3.0]]))], {"axis": (1,), "keepdims": False}),
    Case("any", [Const(np.array([[1.0, 0.0], [0.0, 0.0]]))], {"axis": (0, 1), "keepdims": True}),
    Case("cumsum", [A(3, 4)], {"axis": 1}),
    Case("cumprod", [A(3, 4)], {"axis": 1}),
    Case("cumprod", [Rand((4, 3), make=lambda x: np.where(np.arange(4)[:, None] == 1, 0.0, x))],
         {"axis": 0}, id="cumprod-zeros"),
    # the linear rules' cases: zeros first, last, two in a column, none in another
    Case("cumprod", [Rand((5, 4), make=lambda x: x * np.array([[0, 1, 1, 1], [1, 1, 1, 1],
                                                               [1, 0, 1, 1], [1, 1, 0, 1],
                                                               [1, 1, 0, 0]]))],
         {"axis": 0}, id="cumprod-zeros-placed"),
    # shapes
    Case("concatenate", [A(3, 2), A(3, 1), A(3, 4)], {"axis": 1}),
    Case("split", [A(3, 6)], {"axis": 1, "indices": (1, 4)}),
    Case("flip", [A(3, 4, 2)], {"axes": (0, 2)}),
    Case("roll", [A(3, 4)], {"shift": (1, -2), "axis": (0, 1)}),
    Case("roll", [A(5)], {"shift": 2, "axis": None}, id="roll-flat"),
    Case("tile", [A(2, 3)], {"reps": (2, 3)}),
    Case("repeat", [A(2, 3)], {"repeats": 3, "axis": 1}),
    Case("pad", [A(2, 3)], {"pad_width": ((1, 0), (2, 1)), "value": 0.5}),
    Case("sort", [A(3, 5)], {"axis": 1, "kind": "stable"}),
    Case("sort", [A(5, 3)], {"axis": 0, "kind": "quicksort"}, id="sort-axis0"),
    Case("sort", [A(3, 5)], {"axis": 1, "kind": "heapsort"}, id="sort-heap"),
    Case("argsort", [A(3, 5)], {"axis": 1, "kind": "stable"}),
    Case("argsort", [A(3, 5)], {"axis": 1, "kind": "quicksort"}, id="argsort-quick"),
    Case("invert_permutation", [Const(np.array([[2, 0, 3, 1], [0, 1, 2, 3], [3, 2, 1, 0]]))],
         {"axis": 1}),
    Case("permute_along", [A(3, 4), Const(np.array([[2, 0, 3, 1], [0, 1, 2, 3], [3, 2, 1, 0]]))],
         {"axis": 1, "kind": None}),
    Case("permute_along", [A(3, 4), Const(np.array([[2, 0, 3, 1], [0, 1, 2, 3], [3, 2, 1, 0]]))],
         {"axis": 1, "kind": "quicksort"}, id="permute_along-sorted"),
    Case("unpermute_along",
         [A(3, 4), Const(np.array([[2, 0, 3, 1], [0, 1, 2, 3], [3, 2, 1, 0]]))], {"axis": 1}),
    Case("unpermute_along",
         [A(4, 3), Const(np.array([[2, 0, 3], [0, 1, 2], [3, 2, 1], [1, 3, 0]]))], {"axis": 0},
         id="unpermute_along-axis0"),
    Case("argpartition", [A(3, 5)], {"kth": 2, "axis": 1}),
    Case("partition", [A(3, 5)], {"kth": 2, "axis": 1}),
    Case("partition", [A(6, 3)], {"kth": (1, 4), "axis": 0}, id="partition-two-kth"),
    Case("partition_positions", [A(3, 5), Const(np.partition(
        np.random.default_rng(1).standard_normal((3, 5)), 2, axis=1))], {"kth": 2, "axis": 1}),
    # linear algebra
    Case("einsum", [A(3, 4), A(4, 5)], {"subscripts": "ij,jk->ik"}),
    Case("einsum", [A(3, 3)], {"subscripts": "ii->i"}, id="einsum-diag"),
    Case("einsum", [A(3, 4)], {"subscripts": "ab->ba"}, id="einsum-transpose"),
    Case("einsum", [A(4)], {"subscripts": "a->a"}, id="einsum-identity"),
    Case("einsum", [A(3, 3)], {"subscripts": "ii->"}, id="einsum-trace"),
    Case("einsum", [A(3, 4), A(5)], {"subscripts": "ij,k->ik"}, id="einsum-summed-alone"),
    Case("einsum", [A(2, 3, 4), A(2, 4, 5)], {"subscripts": "bij,bjk->bik"}, id="einsum-bmm"),
    Case("einsum", [A(3), A(3), A(4)], {"subscripts": "i,i,j->j"}, id="einsum-three"),
    Case("inv", [WELL(3)]),
    Case("inv", [WELL(3, (2,))], id="inv-batched"),
    Case("solve", [WELL(3), A(3)], id="solve-vector"),
    Case("solve", [WELL(3), A(3, 2)], id="solve-matrix"),
    Case("solve", [WELL(3, (2,)), A(2, 3, 2)], id="solve-batched"),
    Case("solve", [WELL(3, (2,)), A(3)], id="solve-batched-vector"),
    Case("det", [WELL(3)]),
    Case("det", [WELL(3, (2,))], id="det-batched"),
    Case("slogdet", [Rand((3, 3), -1, 1, make=lambda x: x - 3 * np.eye(3))]),
    Case("cholesky", [SPD(3)], proj=sym_proj),
    Case("cholesky", [SPD(3, (2,))], proj=sym_proj, id="cholesky-batched"),
    Case("eigh", [SYM(4)], proj=sym_proj),
    Case("svd", [A(4, 3)], id="svd-tall"),
    Case("svd", [A(3, 5)], id="svd-wide"),
    Case("svd", [A(2, 3, 3)], id="svd-batched"),
    Case("qr", [WELL(3)], id="qr-square"),
    Case("qr", [A(5, 3)], id="qr-tall"),
    Case("qr", [A(3, 5)], id="qr-wide"),
    Case("qr", [A(2, 4, 3)], id="qr-batched"),
]


def _gi(shape, idx, id):
    spec, arrays = parse_index(idx)
    return Case("getitem", [A(*shape)] + [Const(a) for a in arrays], {"index": spec}, id=id)


CASES += [
    _gi((4, 5), (slice(1, None), slice(None, None, -2)), "getitem-slices-negstep"),
    _gi((4, 5), 2, "getitem-int"),
    _gi((4, 5), (None, Ellipsis, -1), "getitem-none-ellipsis-int"),
    _gi((4, 5), np.array([0, 2, 2, 3, 0]), "getitem-repeated-ints"),
    _gi((4, 5), (slice(None), np.array([[1, 1], [4, 0]])), "getitem-slice-array"),
    _gi((4, 5), np.arange(20).reshape(4, 5) % 3 == 0, "getitem-bool-mask"),
    _gi((3, 4, 5), (np.array([0, 2, 0]), slice(None), np.array([1, 1, 4])),
        "getitem-split-arrays"),
    _gi((4, 5), (np.array([True, False, True, True]), 1), "getitem-bool-int"),
]


def _ia(gshape, shape, idx, id):
    spec, arrays = parse_index(idx)
    return Case("index_add", [A(*gshape)] + [Const(a) for a in arrays],
                {"index": spec, "shape": shape}, id=id)


def _si(shape, vshape, idx, id):
    spec, arrays = parse_index(idx)
    v = A(*vshape) if vshape is not None else Const(0.25)
    return Case("setitem", [A(*shape), v] + [Const(a) for a in arrays], {"index": spec}, id=id)


CASES += [
    _ia((5, 5), (4, 5), np.array([0, 2, 2, 3, 0]), "index_add-repeated"),
    _ia((2, 3), (4, 5), (slice(1, 3), slice(None, None, 2)), "index_add-basic"),
    _si((4, 5), (2, 5), slice(1, 3), "setitem-slice"),
    _si((4, 5), (3,), (np.array([0, 3, 1]), 2), "setitem-array"),
    _si((4, 5), (5,), (np.array([True, False, True, False]),), "setitem-mask-broadcast"),
    _si((4, 5), None, (Ellipsis, 1), "setitem-scalar"),
    Case("nonzero", [Const(np.array([[1.0, 0.0], [0.0, 2.0]]))], {"ndim": 2}),
]
if "basis" in REGISTRY:  # the Jacobian seed row of the batching pass (no operands)
    CASES.append(Case("basis", [], {"shape": (2, 3), "dtype": "float64"}))


def _random_draw(method, args, kwargs=None):
    # random_draw: distributions of one value, so emitter and impl agree
    # exactly; the operand is the ordering token.  NumPy's streams, fresh
    # draws per call and the errors: tests/test_random.py.
    from tracegrad.ops.random import draw_attrs
    return Case("random_draw", [Const(np.zeros(2))], draw_attrs(method, args, kwargs),
                id=f"random_draw-{method}")


CASES += [
    _random_draw("normal", (2.5, 0.0), {"size": (3, 4)}),
    _random_draw("uniform", (1.5, 1.5, (2, 3))),
    _random_draw("binomial", (5, 1.0), {"size": 4}),
    _random_draw("randint", (3, 4), {"size": 3, "dtype": np.int32}),
    _random_draw("choice", ([7.5],), {"size": (2, 2)}),
    _random_draw("poisson", (0.0,)),  # size=None: NumPy returns a Python scalar
]

# dynamic_slice / dynamic_update_slice: a start known only at run time (a
# traced step counter), here as a 0-d integer array; static length delta.
CASES += [
    Case("dynamic_slice", [A(6, 4), Const(np.array(2))], {"axis": 0, "delta": 3, "step": 1}),
    Case("dynamic_slice", [A(3, 7), Const(np.array(-5))], {"axis": 1, "delta": 4, "step": 2},
         id="dynamic_slice-negative-start-step2"),
    Case("dynamic_slice", [A(3, 7), Const(np.array(6))], {"axis": 1, "delta": -4, "step": -1},
         id="dynamic_slice-reversed"),
    Case("dynamic_update_slice", [A(6, 4), A(3, 4), Const(np.array(1))],
         {"axis": 0, "delta": 3, "step": 1}),
    Case("dynamic_update_slice", [A(3, 7), A(3, 1), Const(np.array(0))],
         {"axis": 1, "delta": 6, "step": 3}, id="dynamic_update_slice-broadcast-step3"),
]

# tracegrad/ops/numpy_functions.py: copysign (x2 only gives a sign: its
# gradient is zero) and searchsorted (no gradient).
CASES += [
    Case("copysign", [A(3, 4), A(3, 4)]),
    Case("copysign", [A(3, 1), Const(np.array([1.0, -0.0, -2.0, 0.0]))],
         id="copysign-signed-zero", f32=False),  # the float64 constant promotes
    Case("searchsorted", [Const(np.array([0.0, 1.0, 1.0, 3.0])),
                          Const(np.array([[-1.0, 1.0], [2.0, 5.0]]))], {"side": "right"}),
    Case("searchsorted", [Const(np.array([0.0, 1.0, 1.0, 3.0])), Const(1.0)], {"side": "left"},
         id="searchsorted-scalar"),
    # ldexp (the integer exponent has no gradient) and frexp's exponent (none)
    Case("ldexp", [A(3, 4), Const(np.array([-2, 0, 3, 60]))]),
    Case("ldexp", [A(3, 1), Const(np.array([[1], [-1], [4]]))], id="ldexp-broadcast"),
    Case("frexp_exponent", [A(3, 4)]),
]

# tracegrad/ops/special.py (tracegrad.scipy.special): gammaln, polygamma (n=0 is
# digamma; its vjp is the n+1 row), erfinv.
CASES += [
    Case("gammaln", [Rand((3, 4), -3.7, 6.0)]),
    Case("polygamma", [Rand((3, 4), -3.7, 6.0)], {"n": 0}, id="polygamma-digamma"),
    Case("polygamma", [Rand((3, 4), 0.3, 6.0)], {"n": 1}, id="polygamma-1"),
    Case("polygamma", [Rand((3, 4), 0.3, 6.0)], {"n": 3}, id="polygamma-3"),
    Case("erfinv", [U(3, 4)]),
    # Bessel functions (static order), incomplete gamma / beta (vjp in x only:
    # the parameters are constants here, as in SciPy and autograd)
    Case("bessel_j", [Rand((3, 4), -12.0, 12.0)], {"n": 0}, id="bessel_j-0"),
    Case("bessel_j", [Rand((3, 4), -12.0, 12.0)], {"n": 3}, id="bessel_j-3"),
    Case("bessel_y", [Rand((3, 4), 0.3, 12.0)], {"n": 0}, id="bessel_y-0"),
    Case("bessel_y", [Rand((3, 4), 0.3, 12.0)], {"n": 2}, id="bessel_y-2"),
    Case("bessel_ive", [Rand((3, 4), -8.0, 60.0)], {"v": 1.0}, id="bessel_ive-1"),
    Case("bessel_ive", [Rand((3, 4), 0.2, 8.0)], {"v": 0.5}, id="bessel_ive-half"),
    Case("gammainc", [Const(np.array([[0.7], [2.5], [9.0]])), Rand((3, 4), 0.1, 12.0)],
         {"upper": False}, id="gammainc-lower", f32=False),
    Case("gammainc", [Const(np.array([0.5, 1.0, 3.0, 20.0])), Rand((3, 4), 0.1, 25.0)],
         {"upper": True}, id="gammainc-upper", f32=False),
    Case("betainc", [Const(np.array([[0.6], [2.0], [5.0]])), Const(np.array([0.8, 1.5, 3.0, 7.0])),
                     Rand((3, 4), 0.05, 0.95)], id="betainc", f32=False),
    # SciPy-valued rows (tracegrad/ops/scipy_rows.py)
    Case("scipy_ufunc1", [A(3, 4)], {"name": "log_ndtr"}, id="scipy_ufunc1-log_ndtr"),
    Case("scipy_ufunc1", [A(3, 4)], {"name": "erfcx"}, id="scipy_ufunc1-erfcx"),
    Case("scipy_ufunc1", [A(3, 4)], {"name": "i1e"}, id="scipy_ufunc1-i1e"),
    Case("scipy_ufunc1", [Rand((3, 4), 0.05, 0.95)], {"name": "ndtri"}, id="scipy_ufunc1-ndtri"),
    Case("scipy_ufunc2", [P(3, 4), P(3, 1)], {"name": "kl_div"}, id="scipy_ufunc2-kl_div"),
    Case("scipy_ufunc2", [Const(np.array([0.5, 1.0, 2.5, 3.0])), Rand((3, 4), 0.3, 4.0)],
         {"name": "kv"}, id="scipy_ufunc2-kv", f32=False),
    Case("scipy_ufunc2", [Const(np.array([[1.5], [2.0], [4.0]])), Rand((3, 4), 0.3, 4.0)],
         {"name": "zeta"}, id="scipy_ufunc2-zeta", f32=False),
    Case("scipy_ufunc3", [Const(np.array([[0.6], [2.0], [5.0]])),
                          Const(np.array([0.8, 1.5, 3.0, 7.0])), Rand((3, 4), 0.05, 0.95)],
         {"name": "betaincc"}, id="scipy_ufunc3-betaincc", f32=False),
    Case("matrix_function", [Rand((3, 3), -0.7, 0.7)], {"fn": "expm"}, id="matrix_function-expm"),
    Case("matrix_function", [Rand((2, 3, 3), -0.7, 0.7)], {"fn": "expm"},
         id="matrix_function-expm-batched"),
    Case("matrix_function", [SPD(3)], {"fn": "sqrtm"}, id="matrix_function-sqrtm", f32=False),
    Case("matrix_function", [Rand((3, 3), -0.2, 0.2, make=lambda x: x + np.eye(3))],
         {"fn": "logm"}, id="matrix_function-logm", f32=False),
    Case("sylvester", [WELL(3), WELL(2), A(3, 2)]),
    Case("lu_factor", [WELL(4)], f32=False),
    Case("lu_pivots_to_perm", [Const(np.array([2, 2, 3, 3], dtype=np.int32))]),
    Case("first_order", [A(3, 4)], {"what": "a test"}),
]
# rows whose values come from SciPy (tracegrad/ops/scipy_rows.py): without SciPy their
# cases are left out (tests/test_scipy_as_written.py skips too)
SCIPY_ROWS = {"scipy_ufunc1", "scipy_ufunc2", "scipy_ufunc3", "matrix_function", "sylvester",
              "lu_factor", "lu_pivots_to_perm"}
if importlib.util.find_spec("scipy") is None:
    CASES = [c for c in CASES if c.prim not in SCIPY_ROWS]


# --- helpers ---------------------------------------------------------------------------------

def _rng(case, salt=""):
    return np.random.default_rng(zlib.crc32((case.id + salt).encode()))


def _draw(case, dtype=np.float64):
    rng = _rng(case)
    vals = []
    for op in case.operands:
        if isinstance(op, Rand):
            vals.append(op.draw(rng).astype(dtype))
        else:
            vals.append(op.value)
    return vals


def _diff_positions(case):
    return [i for i, op in enumerate(case.operands) if isinstance(op, Rand)]


def _impl(case, vals):
    prim = REGISTRY[case.prim]
    with np.errstate(all="ignore"):
        out = prim.impl(np, *vals, **case.attrs)
    return tuple(np.asarray(o) for o in out) if isinstance(out, tuple) else (np.asarray(out),)


def _float_outs(outs):
    return [i for i, o in enumerate(outs) if o.dtype.kind == "f"]


def _fd(case, vals, dirs, eps=1e-6):
    """Central difference of every output along the directions ``dirs``."""
    pos = _diff_positions(case)
    plus, minus = list(vals), list(vals)
    for i, d in zip(pos, dirs):
        plus[i] = vals[i] + eps * d
        minus[i] = vals[i] - eps * d
    return [(a - b) / (2 * eps) for a, b in zip(_impl(case, plus), _impl(case, minus))]


def _directions(case, vals, salt):
    rng = _rng(case, salt)
    dirs = []
    for i in _diff_positions(case):
        d = rng.standard_normal(np.shape(vals[i]))
        dirs.append(case.proj(d) if case.proj else d)
    return dirs


def _bind(case, vals, requires_grad=True):
    ops = []
    for i, (op, v) in enumerate(zip(case.operands, vals)):
        ops.append(tg.tensor(v, requires_grad=requires_grad) if isinstance(op, Rand) else v)
    return ops, bind(REGISTRY[case.prim], *ops, **case.attrs)


def _close(a, b, tol, what):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    scale = max(1.0, float(np.max(np.abs(b))) if b.size else 1.0)
    err = float(np.max(np.abs(a - b))) if a.size else 0.0
    assert err <= tol * scale * 10 + 1e-9, f"{what}: max error {err:.3g} (scale {scale:.3g})"


DIFF_CASES = [c for c in CASES if not REGISTRY[c.prim].nondiff]


# --- the tests -------------------------------------------------------------------------------

# Rows whose derivative is by design not the derivative of their impl, each
# checked where its behaviour is defined.
TESTED_ELSEWHERE = {
    # the vjp is a user's hand-written backward: tests/test_compile.py
    "custom_vjp",
    # device moves need a GPU (or the CuPy stand-in): tests/test_cuda_device.py
    "to_device",
    # control flow carries subgraphs, not arrays drawn at random: their values
    # and derivatives are checked against unrolled loops and finite
    # differences in tests/test_loops.py (every order: tests/test_while_orders.py)
    "cond", "scan", "while", "while_fwd", "while_bwd",
    # an iteration's answer whose derivative is the implicit function theorem's,
    # not its impl's (the identity): tests/test_fixed_point.py
    "fixed_point",
    # complex operands or results (the cases here draw real values and
    # difference real outputs): tests/test_numpy_fft.py checks each row's
    # shape rule and NumPy emitter on complex values, and its vjp and jvp
    # through real losses of real inputs against finite differences
    "real", "imag", "conj", "complex_abs", "fft", "ifft", "rfft", "irfft",
    # the cotangent of first_order, whose own derivative is refused by design (a second
    # derivative through scipy.optimize's roots): tests/test_scipy_as_written.py
    "first_order_grad",
    # SciPy's solvers, integrators and optimisers over traced callables (subgraphs),
    # and a value whose derivative is refused by name: closed forms of every order in
    # tests/test_scipy_solvers_compiled.py
    "scipy_solve", "scipy_quad", "scipy_ode", "no_derivative",
}
if importlib.util.find_spec("scipy") is None:
    TESTED_ELSEWHERE |= SCIPY_ROWS


def test_every_row_has_a_case():
    covered = {c.prim for c in CASES} | TESTED_ELSEWHERE
    missing = sorted(set(REGISTRY) - covered)
    assert not missing, f"registry rows without a test case: {missing}"


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_row_is_complete(name):
    p = REGISTRY[name]
    assert callable(p.impl), name
    assert p.shape is not None, f"{name}: no shape rule"
    assert p.numpy is not None, f"{name}: no numpy emitter"
    if not p.nondiff:
        assert p.vjp is not None, f"{name}: no vjp rule"
        assert p.jvp is not None, f"{name}: no jvp rule"
    if p.elementwise and name != "astype":
        assert p.cuda, f"{name}: elementwise row without a cuda expression"
    for h in p.helpers:
        assert hasattr(runtime_numpy, h) and h.startswith("_"), f"{name}: unknown helper {h}"


@pytest.mark.parametrize("case", DIFF_CASES, ids=repr)
def test_vjp_matches_finite_differences(case):
    vals = _draw(case)
    ops, out = _bind(case, vals)
    outs = out if isinstance(out, tuple) else (out,)
    ref = _impl(case, vals)
    fl = _float_outs(ref)
    rng = _rng(case, "ct")
    cts = [rng.standard_normal(ref[i].shape) for i in fl]
    inputs = [ops[i] for i in _diff_positions(case)]
    grads = tg.autograd.grad([outs[i] for i in fl], inputs,
                             grad_outputs=[tg.tensor(c) for c in cts], allow_unused=True)
    for inp, g in zip(inputs, grads):
        if g is not None:
            assert tuple(g.shape) == tuple(inp.shape), f"gradient shape {g.shape} for {inp.shape}"
    if case.prim == "stop_gradient":
        assert all(g is None for g in grads)
        return
    for k in range(2):
        dirs = _directions(case, vals, f"dir{k}")
        fd = _fd(case, vals, dirs)
        lhs = sum(float(np.sum(c * fd[i])) for c, i in zip(cts, fl))
        rhs = sum(float(np.sum(g.detach().numpy() * d)) for g, d in zip(grads, dirs)
                  if g is not None)
        assert abs(lhs - rhs) <= case.tol * max(1.0, abs(lhs)) * 10, \
            f"<ct, J d> = {lhs!r} but <J^T ct, d> = {rhs!r}"


@pytest.mark.parametrize("case", DIFF_CASES, ids=repr)
def test_jvp_matches_finite_differences(case):
    vals = _draw(case)
    prim = REGISTRY[case.prim]
    ops, out = _bind(case, vals, requires_grad=False)
    dirs = _directions(case, vals, "jvp")
    tangents = [None] * len(ops)
    for i, d in zip(_diff_positions(case), dirs):
        tangents[i] = tg.tensor(d)
    tans = jvp_apply(prim, case.attrs, tangents, out, ops)
    outs = out if isinstance(out, tuple) else (out,)
    tans = tans if isinstance(out, tuple) else (tans,)
    fd = _fd(case, vals, dirs)
    if case.prim == "stop_gradient":
        assert tans[0] is None
        return
    for i in _float_outs(_impl(case, vals)):
        t = np.zeros(outs[i].shape) if tans[i] is None else tans[i].numpy()
        if tans[i] is not None:
            assert tuple(tans[i].shape) == tuple(outs[i].shape)
            assert tans[i].dtype == outs[i].dtype
        _close(t, fd[i], case.tol, f"jvp of output {i}")


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_shape_rule_matches_impl(case):
    vals = _draw(case)
    prim = REGISTRY[case.prim]
    avals = [Aval(np.shape(v), np.asarray(v).dtype) if isinstance(v, np.ndarray) else v
             for v in vals]
    rule = prim.shape(*avals, **case.attrs)
    rules = rule if isinstance(rule, tuple) and not isinstance(rule, Aval) else (rule,)
    outs = _impl(case, vals)
    if case.prim == "nonzero":  # data-dependent length: only the count and dtype
        assert len(rules) == len(outs) and all(r.dtype == o.dtype for r, o in zip(rules, outs))
        return
    assert len(rules) == len(outs)
    for r, o in zip(rules, outs):
        assert tuple(r.shape) == o.shape, f"shape rule {r.shape}, impl {o.shape}"
        assert np.dtype(r.dtype) == o.dtype, f"shape rule {r.dtype}, impl {o.dtype}"


def _emit(prim, names, attrs):
    if callable(prim.numpy):
        return prim.numpy(names, **attrs)
    return prim.numpy.format(*names, **{k: repr(v) for k, v in attrs.items()})


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_numpy_emitter_evaluates_like_impl(case):
    prim = REGISTRY[case.prim]
    vals = _draw(case)
    names = [f"v{i}" for i in range(len(vals))]
    expr = _emit(prim, names, case.attrs)
    compile(expr, "<emitted>", "eval")  # a single valid Python expression
    env = {"np": np, "math": __import__("math")}
    for h in prim.helpers:
        env[h] = getattr(runtime_numpy, h)
    env.update(zip(names, vals))
    with np.errstate(all="ignore"):
        got = eval(expr, env)
    got = tuple(got) if isinstance(got, tuple) else (got,)
    want = _impl(case, vals)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        g = np.asarray(g)
        assert g.shape == w.shape and g.dtype == w.dtype, expr
        np.testing.assert_array_equal(g, w, err_msg=expr)


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_emitted_views_are_known_to_the_buffer_planner(case):
    """A row whose emitted NumPy call returns memory of an operand must say
    so (view, may_view or a "{0}" emitter): the buffer planner would
    otherwise write into that operand with out= while the view lives."""
    prim = REGISTRY[case.prim]
    vals = _draw(case)
    names = [f"v{i}" for i in range(len(vals))]
    env = {"np": np, "math": __import__("math")}
    for h in prim.helpers:
        env[h] = getattr(runtime_numpy, h)
    env.update(zip(names, vals))
    with np.errstate(all="ignore"):
        got = eval(_emit(prim, names, case.attrs), env)
    got = got if isinstance(got, tuple) else (got,)
    shares = any(isinstance(g, np.ndarray) and isinstance(v, np.ndarray) and np.shares_memory(g, v)
                 for g in got for v in vals)
    if shares:
        assert prim.aliases_operands, f"{case.prim}: the emitted call returns a view"


def test_eager_one_operand_einsum_owns_its_memory():
    x = tg.tensor(np.arange(6.).reshape(2, 3))
    y = tg.einsum("ab->ba", x)
    assert not np.shares_memory(y.numpy(), x.numpy())


F32_CASES = [c for c in DIFF_CASES if c.f32]


@pytest.mark.parametrize("case", F32_CASES, ids=repr)
def test_float32_stays_float32(case):
    vals = _draw(case, np.float32)
    ops, out = _bind(case, vals)
    outs = out if isinstance(out, tuple) else (out,)
    fl = [i for i, o in enumerate(outs) if o.dtype.kind == "f"]
    for i in fl:
        assert outs[i].dtype == np.float32, f"output {i} is {outs[i].dtype}"
    if case.prim == "stop_gradient":
        return
    inputs = [ops[i] for i in _diff_positions(case)]
    cts = [tg.ones(outs[i].shape, dtype=tg.float32) for i in fl]
    grads = tg.autograd.grad([outs[i] for i in fl], inputs, grad_outputs=cts, allow_unused=True)
    for g in grads:
        if g is not None:
            assert g.dtype == np.float32, f"gradient is {g.dtype}"
    tangents = [None] * len(ops)
    for i in _diff_positions(case):
        tangents[i] = tg.ones(np.shape(vals[i]), dtype=tg.float32)
    tans = jvp_apply(REGISTRY[case.prim], case.attrs, tangents, out, ops)
    for t in (tans if isinstance(tans, tuple) else (tans,)):
        if t is not None:
            assert t.dtype == np.float32, f"tangent is {t.dtype}"


# Device-only math that host C++ lacks, so g++ can check the expressions' syntax and
# float/double overloads (the real compile happens on the GPU backend).
def test_cuda_expressions_compile_for_float_and_double(tmp_path):
    import shutil
    import subprocess
    cxx = shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no host C++ compiler to check the CUDA expressions' syntax")
    attrs = {c.prim: c.attrs for c in CASES}
    lines = []
    for name, p in sorted(REGISTRY.items()):
        if not p.cuda:
            continue
        expr = p.cuda.format("a", "b", "c", **{k: repr(v) for k, v in attrs[name].items()})
        for t in ("float", "double"):
            lines.append(f"{t} k_{name}_{t}({t} a, {t} b, {t} c) {{ return ({t})({expr}); }}")
    from tracegrad.targets.templates import environment
    # rendered as the code generator includes it (it includes tg_polygamma.h)
    helpers = environment().get_template("cuda_helpers.cuh").render().replace(
        "__device__ __forceinline__", "inline")
    src = tmp_path / "exprs.cpp"
    # the emulator's header stands in for CUDA's built-ins (and, like NVRTC,
    # leaves out <math.h>'s INFINITY and NAN)
    from tracegrad import testing
    src.write_text(f'#include "{testing.header_path()}"\nusing namespace std;\n'
                   + helpers + "\n".join(lines) + "\n")
    r = subprocess.run([cxx, "-std=c++17", "-fsyntax-only", str(src)], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr[-3000:]


@pytest.mark.parametrize("fn", [lambda x: np.cumprod(x, axis=1), lambda x: np.prod(x, axis=1),
                                lambda x: np.cumprod(x, axis=0), lambda x: np.prod(x),
                                lambda x: np.prod(x, axis=(0, 1), keepdims=True),
                                lambda x: np.prod(x.T, axis=0)],
                         ids=["cumprod", "prod", "cumprod-axis0", "prod-all", "prod-keepdims",
                              "prod-transposed"])
@pytest.mark.parametrize("power", [2, 1], ids=["squared", "linear"])
@pytest.mark.parametrize("backend", ["numpy", "native"])
def test_product_rules_second_order_with_zeros(fn, power, backend):
    # cumprod's and prod's rules branch on whether x holds a zero: their own
    # derivatives must be right there too.  (Linear losses: a rule that set
    # the zeros to 1 and divided had the right gradient and a wrong Hessian,
    # which a squared loss hid where the product is 0.)
    x = np.array([[0.7, 0.0, 1.3, -0.4], [0.0, 1.1, 0.0, 0.9], [1.2, -0.8, 0.5, 1.6]])
    w = np.linspace(0.5, 1.5, fn(x).size).reshape(fn(x).shape)

    def loss(x):
        return np.sum(fn(x) ** power * w)

    with warnings.catch_warnings():
        warnings.simplefilter("error")      # no division by the zeros on the way
        h = tg.hessian(loss, backend=backend)(x)
    grad = tg.grad(loss, backend=backend)
    eps = 1e-6
    fd = np.zeros_like(h)
    for idx in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[idx] = eps
        fd[(...,) + idx] = (grad(x + e) - grad(x - e)) / (2 * eps)
    np.testing.assert_allclose(h, fd, rtol=1e-6, atol=1e-8)
