"""No keyword is ever ignored (issue 24, item 4).

Every NumPy callable tracegrad registers for the NumPy face (the keys of
``tracegrad.ops._define.NUMPY_FUNCTIONS``, ufuncs included) and every
ndarray method the NumPy face offers is called here with each of NumPy's
own parameters (read from NumPy: ``inspect.signature`` of the function, the
ufunc keywords, the first line of an ndarray method's docstring), one
representative non-default value at a time, on plain arrays (the
reference), through ``tg.compile`` and eagerly on NumPy-face values
(``NumpyTensor``, what ``tg.grad(f, compile=False)`` runs on).  Each mode
must either

* honour the parameter: the same values, shape and dtype as NumPy (an
  error where NumPy raises one, of the same class), or
* refuse it clearly: an error whose message names the parameter and
  tracegrad (never a silently different result, never a bare "unexpected
  keyword argument").

Tables, to extend when a function is registered:

* ``CALLS``: the representative call of each function (positional
  arguments and keywords); a registered function missing here fails
  ``test_every_registered_function_has_a_representative_call``;
* ``VALUES``: representative non-default values per parameter name,
  ``VALUES_FOR`` per (function, parameter); a parameter with none fails;
* ``IGNORED``: parameters accepted and ignored because they cannot change
  the result, each with its reason.

The keywords that matter most (initial, where, UPLO, mode, dtype, keepdims)
also get their gradients checked against finite differences in both modes
at the end of the file.
"""
from __future__ import annotations

import ast
import inspect
import re
import warnings

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.eager.tensor import NumpyTensor
from tracegrad.ops._define import NUMPY_FUNCTIONS, FaceMethod

from test_numpy_functions import check

RNG = np.random.default_rng(424242)


def _r(*shape, lo=-2.0, hi=2.0):
    return RNG.uniform(lo, hi, shape)


X = _r(3, 4)
X3 = _r(2, 3, 4)
V = _r(6)
P = RNG.uniform(0.2, 0.9, (3, 4))        # inside every unary ufunc's domain
Q = RNG.uniform(0.5, 1.5, (3, 4))
_B = _r(4, 4)
S = _B @ _B.T + 4 * np.eye(4)            # symmetric positive definite
A = _r(4, 4)                             # a general (non-symmetric) square matrix
XN = np.array([[1.0, np.nan, -np.inf], [np.inf, -2.0, 0.5]])
SORTED = np.sort(V)
IDX = np.array([[0, 2, 1, 0], [1, 1, 0, 2], [2, 0, 0, 1]])   # < 3: fits both axes of X


class B:
    """A value built from the call's (NumPy) positional arguments."""

    def __init__(self, fn):
        self.fn = fn


class Call:
    """A representative call: positional arguments (float ndarrays, and
    lists of them, are traced), base keywords, and how to compare."""

    def __init__(self, *args, kw=None, sign_free=False, values=True, modes=("compiled", "eager"),
                 why_modes=None, traced=None):
        self.args, self.kw = args, dict(kw or {})
        self.traced = traced          # positions to trace (default: float arrays, lists of them)
        self.sign_free = sign_free    # compare absolute values (eigenvector/singular-vector signs)
        self.values = values          # False: only shape and dtype (np.empty_like)
        self.modes = modes
        assert modes == ("compiled", "eager") or why_modes, "say why a mode is left out"


# --- representative calls, by NumPy name ------------------------------------------------------

_UNARY = dict.fromkeys(
    "absolute arccos arcsin arctan arcsinh arctanh ceil conjugate cos cosh deg2rad degrees exp "
    "exp2 expm1 fabs floor isfinite isinf isnan log log10 log1p log2 logical_not negative "
    "rad2deg radians reciprocal rint sign sin sinh sqrt square tan tanh trunc".split())
_BINARY = dict.fromkeys(
    "add arctan2 copysign divide equal float_power floor_divide fmax fmin fmod greater "
    "greater_equal heaviside hypot less less_equal logaddexp logaddexp2 logical_and logical_or "
    "logical_xor maximum minimum multiply not_equal power remainder subtract".split())

_DATA_DEPENDENT = "its result's shape depends on the values, which a compiled graph cannot have"

CALLS = {
    **{n: Call(P) for n in _UNARY},
    "arccosh": Call(1 + P),
    **{n: Call(P, Q) for n in _BINARY},
    "matmul": Call(X, X.T),
    # reductions and statistics
    "sum": Call(X), "prod": Call(X), "mean": Call(X), "var": Call(X), "std": Call(X),
    "max": Call(X), "min": Call(X), "amax": Call(X), "amin": Call(X),
    "argmax": Call(X), "argmin": Call(X), "all": Call(X), "any": Call(X),
    "nansum": Call(XN[:, :2].copy()), "nanmean": Call(XN[:, :2].copy()),
    "count_nonzero": Call(np.array([[0.0, 1.0, 2.0], [0.0, 0.0, 3.0]])),
    "cumsum": Call(X), "cumprod": Call(X), "ptp": Call(X),
    "median": Call(X), "quantile": Call(X, 0.3), "percentile": Call(X, 30.0),
    "average": Call(X), "cov": Call(X), "corrcoef": Call(X),
    # elementwise functions
    "around": Call(X), "round": Call(X), "fix": Call(X), "sinc": Call(X), "clip": Call(X),
    "nan_to_num": Call(XN), "real": Call(X), "imag": Call(X), "real_if_close": Call(X),
    "where": Call(X > 0, X, Q),
    "interp": Call(V, np.linspace(-2, 2, 5), _r(5)),
    # shapes
    "append": Call(X, X), "atleast_1d": Call(X), "atleast_2d": Call(V), "atleast_3d": Call(X),
    "broadcast_to": Call(V, (2, 6)), "column_stack": Call([V, V]), "concatenate": Call([X, X]),
    "copy": Call(X), "diag": Call(X), "diagonal": Call(X3), "trace": Call(X3),
    "dstack": Call([X, X]), "hstack": Call([X, X]), "vstack": Call([X, X]),
    "stack": Call([X, X]), "expand_dims": Call(X, 0), "flip": Call(X), "fliplr": Call(X),
    "flipud": Call(X), "moveaxis": Call(X3, 0, -1), "ravel": Call(X), "repeat": Call(X, 2),
    "reshape": Call(X, (2, 6)), "roll": Call(X, 1), "rollaxis": Call(X3, 2), "rot90": Call(X),
    "squeeze": Call(X[None]), "swapaxes": Call(X, 0, 1), "tile": Call(X, (2, 1)),
    "transpose": Call(X), "tril": Call(X), "triu": Call(X), "pad": Call(X, 1),
    "split": Call(X, [1]), "array_split": Call(X, 2), "hsplit": Call(X, 2), "vsplit": Call(X, 3),
    "dsplit": Call(X3, 2), "ndim": Call(X), "shape": Call(X), "size": Call(X),
    # writes into their first argument (IN_PLACE_FUNCTIONS: compared after the call)
    "put": Call(X, np.array([0, 5, 11, 5, -2]), V[:3]), "copyto": Call(X, Q),
    "place": Call(X, X > 0, V[:4]), "putmask": Call(X, X > 0, V[:5]),
    "fill_diagonal": Call(_r(7, 3), V[:2]),
    "empty_like": Call(X, values=False), "ones_like": Call(X), "zeros_like": Call(X),
    "full_like": Call(X, 2.5),
    # sorting and indexing
    "sort": Call(X), "argsort": Call(X), "partition": Call(X, 1), "argpartition": Call(X, 1),
    "searchsorted": Call(SORTED, X),
    "take": Call(X, np.array([0, 5, 11, 14, -15])),     # out of range: mode= decides
    "take_along_axis": Call(X, IDX),
    "select": Call([X > 1, X < -1], [X, Q]),
    "choose": Call([[0, 1, 2, 0], [2, 2, 1, 0], [1, 0, 0, 4]], [X, Q, -X]),  # 4: mode decides
    "nonzero": Call(X > 0, modes=("eager",), why_modes=_DATA_DEPENDENT),
    "argwhere": Call(X > 0, modes=("eager",), why_modes=_DATA_DEPENDENT),
    # linear algebra
    "dot": Call(X, X.T), "vdot": Call(X, Q), "inner": Call(X, Q), "outer": Call(V, V),
    "kron": Call(X, Q), "cross": Call(_r(3, 3), _r(3, 3)), "tensordot": Call(X, Q),
    "einsum": Call("ij,kj->ik", X, Q),
    "linalg.det": Call(A), "linalg.slogdet": Call(A), "linalg.inv": Call(A),
    "linalg.solve": Call(A, X.T), "linalg.pinv": Call(X), "linalg.lstsq": Call(A, V[:4]),
    "linalg.matrix_power": Call(A, 3), "linalg.cholesky": Call(S),
    "linalg.eigh": Call(A, sign_free=True), "linalg.eigvalsh": Call(A),
    "linalg.svd": Call(S, sign_free=True), "linalg.qr": Call(A), "linalg.norm": Call(X),
    "linalg.eig": Call(A), "linalg.eigvals": Call(A), "angle": Call(X),
    "iscomplex": Call(X), "isreal": Call(X), "iscomplexobj": Call(X), "isrealobj": Call(X),
    "linalg.matrix_norm": Call(X), "linalg.vector_norm": Call(X), "linalg.svdvals": Call(X),
    "linalg.matrix_transpose": Call(X3), "matrix_transpose": Call(X3),
    "linalg.multi_dot": Call([X, X.T, Q]), "linalg.vecdot": Call(X, Q), "vecdot": Call(X, Q),
    "linalg.tensorinv": Call(_r(6, 2, 3), kw={"ind": 1}),
    "linalg.tensorsolve": Call(_r(6, 2, 3), _r(6)),
    # NaN-skipping reductions and scans
    **{n: Call(XN[:, :2].copy()) for n in ("nanmax", "nanmin", "nanprod", "nanstd", "nanvar",
                                            "nancumsum", "nancumprod")},
    # more ufuncs
    "divmod": Call(P, Q), "frexp": Call(P), "modf": Call(3 * X), "positive": Call(P),
    "ldexp": Call(P, np.array([1, 2, 3, -1])),
    # more shapes
    "block": Call([X, Q]), "broadcast_arrays": Call(V, X[:, :1]), "delete": Call(X, 1),
    "insert": Call(X, 1, 0.5), "meshgrid": Call(V[:3], V[:4]), "resize": Call(X, (2, 7)),
    "piecewise": Call(X, [X > 0.5, X < -0.5], [lambda v: 2 * v, lambda v: v ** 2, 0.25]),
    # fft
    **{f"fft.{n}": Call(V) for n in ("fft", "ifft", "rfft", "irfft", "hfft", "ihfft")},
    **{f"fft.{n}": Call(X) for n in ("fft2", "ifft2", "fftn", "ifftn", "rfft2", "irfft2", "rfftn",
                                      "irfftn", "fftshift", "ifftshift")},
    # calculus
    "diff": Call(X), "gradient": Call(X), "trapezoid": Call(X), "convolve": Call(V, V[:3]),
    "correlate": Call(V, V[:3]), "linspace": Call(np.array(0.5), np.array(2.0)),
    "vander": Call(V[:4]), "polyval": Call(V[:3], X),
}

# Functions tracegrad refuses as a whole, with the words the refusal must contain.
REFUSED = {
    "linalg.eig": "complex",
    "linalg.eigvals": "complex",
}

# --- representative non-default values --------------------------------------------------------


def _out(args, kw, want):
    """An output array of NumPy's result's shape and dtype."""
    w = want[0] if isinstance(want, tuple) else want
    return np.empty_like(np.asarray(w))


def _mask(args):
    a = np.asarray(args[0])
    m = np.zeros(a.shape, dtype=bool)
    m.flat[::2] = True
    return m


def _ufunc_signature(args):
    return ("d",) * (len(args) + 1)


VALUES = {
    "axis": [1, 0, -1, None, (0, 1)],
    "keepdims": [True],
    "dtype": [np.float32, np.int64],
    "out": [B(None)],                       # built from NumPy's result (see _out)
    "where": [B(_mask)],
    "initial": [0.5],
    "ddof": [1],
    "correction": [1],
    "mean": [B(lambda a: np.mean(a[0], keepdims=True))],
    "order": ["F"],
    "casting": ["unsafe", "no"],
    "subok": [False],
    "signature": [B(_ufunc_signature)],
    "decimals": [1, -1],
    "kind": ["stable", "heapsort"],
    "stable": [True],
    "n": [2],
    "prepend": [0.5],
    "append": [-0.5],
    "offset": [1],
    "axis1": [1],
    "axis2": [2],
    "k": [1, -1],
    "ord": [1, "fro", np.inf],
    "rowvar": [False],
    "bias": [True],
    "y": [B(lambda a: np.asarray(a[0]) ** 2)],
    "fweights": [np.array([1, 2, 1, 3])],
    "aweights": [np.array([0.5, 1.0, 2.0, 0.3])],
    "left": [-5.0], "right": [5.0], "period": [1.5],
    "num": [7], "endpoint": [False], "retstep": [True],
    "shape": [(2, 6)],
    "device": ["cpu"],
    "copy": [False, True],
    "nan": [1.5], "posinf": [9.0], "neginf": [-9.0],
    "weights": [B(lambda a: np.arange(1.0, 1.0 + np.asarray(a[0]).size).reshape(np.shape(a[0])))],
    "returned": [True],
    "side": ["right"],
    "sorter": [B(lambda a: np.argsort(a[0]))],
    "overwrite_input": [True],
    "method": ["lower", "nearest", "weibull"],
    "interpolation": ["lower"],
    "rcond": [1e-3], "rtol": [1e-3], "hermitian": [True],
    "full_matrices": [False], "compute_uv": [False],
    "UPLO": ["U"],
    "tol": [1e9],
    "edge_order": [2],
    "dx": [0.5],
    "x": [B(lambda a: np.cumsum(np.arange(1.0, 1.0 + np.shape(a[0])[-1])))],
    "N": [3], "increasing": [True],
    "start": [1],
    "axes": [(1, 0)],
    "default": [0.5],
    "mode": ["clip", "wrap"],
    "min": [-0.5], "max": [0.5], "a_min": [-0.5], "a_max": [0.5],
    "upper": [True],
    "optimize": [True, "greedy"],
    "axisa": [0], "axisb": [0], "axisc": [0],
    "norm": ["ortho", "forward"],
    "deg": [True],
    "stream": [1],
    "indexing": ["ij"], "sparse": [True],
}

VALUES_FOR = {
    ("fill_diagonal", "wrap"): [True],
    ("max", "initial"): [0.5, 5.0], ("amax", "initial"): [0.5],
    ("min", "initial"): [-0.5, -5.0], ("amin", "initial"): [-0.5],
    ("prod", "initial"): [2.0],
    ("sum", "initial"): [5.0], ("nansum", "initial"): [5.0],
    ("convolve", "mode"): ["same", "valid"], ("correlate", "mode"): ["same", "full"],
    ("linalg.qr", "mode"): ["complete", "r", "raw"],
    ("pad", "mode"): ["edge", "reflect", "symmetric", "wrap", "linear_ramp", "maximum", "mean",
                      "median", "minimum", "empty"],
    ("cov", "ddof"): [2],
    ("cov", "fweights"): [np.array([1, 2, 1, 3])],
    ("cov", "y"): [B(lambda a: np.asarray(a[0])[:1] ** 2)],
    ("corrcoef", "y"): [B(lambda a: np.asarray(a[0])[:1] ** 2)],
    ("trapezoid", "x"): VALUES["x"],
    ("linspace", "axis"): [0],
    ("linspace", "dtype"): [np.float32],
    ("roll", "axis"): [0, 1, (0, 1)],
    ("rollaxis", "start"): [1, 3],
    ("rot90", "k"): [2, -1],
    ("tensordot", "axes"): [1, [[1], [1]], 0],
    ("transpose", "axes"): [(1, 0)],
    ("take_along_axis", "axis"): [0, None],
    ("size", "axis"): [1],
    ("diff", "axis"): [0],
    ("gradient", "axis"): [0, -1, (0, 1)],
    ("squeeze", "axis"): [0, 1],
    ("repeat", "axis"): [0, 1],
    ("flip", "axis"): [0, (0, 1)],
    ("searchsorted", "sorter"): [np.arange(6)],
    ("average", "weights"): [B(lambda a: np.arange(1.0, 5.0))],
    ("average", "axis"): [1],
    ("matmul", "axes"): [[(-1, -2), (-2, -1), (-1, -2)]],
    ("matmul", "axis"): [0],
    ("vecdot", "axes"): [[(0,), (0,), ()]], ("vecdot", "axis"): [0],
    ("linalg.vecdot", "axis"): [0],
    **{(f"fft.{n}", "axes"): [(0,), (1, 0)] for n in ("fft2", "ifft2", "fftn", "ifftn", "rfft2",
                                                      "irfft2", "rfftn", "irfftn")},
    **{(f"fft.{n}", "axes"): [0, (0, 1)] for n in ("fftshift", "ifftshift")},
    **{(f"fft.{n}", "s"): [(2, 6)] for n in ("fft2", "ifft2", "fftn", "ifftn", "rfft2", "irfft2",
                                             "rfftn", "irfftn")},
    **{(f"fft.{n}", "n"): [4, 9] for n in ("fft", "ifft", "rfft", "irfft", "hfft", "ihfft")},
    **{(f"fft.{n}", "axis"): [0] for n in ("fft", "ifft", "rfft", "irfft", "hfft", "ihfft")},
    ("delete", "axis"): [1, 0], ("insert", "axis"): [1, 0],
    ("nanmax", "initial"): [0.5], ("nanmin", "initial"): [-0.5], ("nanprod", "initial"): [2.0],
    ("linalg.tensorsolve", "axes"): [(0,)],
    ("linalg.vector_norm", "ord"): [1, np.inf, 0.5],
    ("linalg.matrix_norm", "ord"): [1, "nuc", 2, -np.inf],
    ("linalg.norm", "axis"): [1, 0, (1, 0)],
    ("argpartition", "axis"): [0], ("partition", "axis"): [0],
    ("argpartition", "order"): ["x"], ("partition", "order"): ["x"],
    ("sort", "order"): ["x"], ("argsort", "order"): ["x"],
    ("concatenate", "axis"): [1, None], ("stack", "axis"): [1, -1],
    ("take", "axis"): [1],
    ("cumsum", "axis"): [1, 0], ("cumprod", "axis"): [1, 0],
    ("expand_dims", "axis"): [(0, 2)],
    ("full_like", "dtype"): [np.float32, np.int64],
}

# Parameters accepted and ignored: they cannot change the result.
IGNORED = {
    "subok": "subclasses of ndarray: tracegrad values are not ndarray subclasses, the result is "
             "never one",
    "overwrite_input": "lets NumPy use the input as scratch space; the result is the same",
    "optimize": "einsum's contraction order: the same result (up to rounding)",
    "device": "only 'cpu' is a valid value, which is the default",
    ("order", "ufunc"): "the memory layout of the result, not its values",
    ("order", "copy"): "the memory layout of the copy, not its values",
    ("order", "empty_like"): "the memory layout of the result, not its values",
    ("order", "ones_like"): "the memory layout of the result, not its values",
    ("order", "zeros_like"): "the memory layout of the result, not its values",
    ("order", "full_like"): "the memory layout of the result, not its values",
    ("order", "einsum"): "the memory layout of the result, not its values",
    ("kind", "sort"): "the sorting algorithm; a sort is a sort",
    ("kind", "argsort"): "the sorting algorithm; the indices of distinct values are unique",
    ("copy", "nan_to_num"): "whether NumPy may write into its input; the result is the same",
    ("copy", "reshape"): "whether the result may share memory with the input: tracegrad values "
                         "are never views NumPy can see",
}

# Keywords a function takes through **kwargs, by function
EXTRA_KEYWORDS = {
    "einsum": ["dtype", "order", "casting"],
    "clip": ["where", "casting", "order", "dtype", "subok", "signature"],
}

_UFUNC_KEYWORDS = ["out", "where", "casting", "order", "dtype", "subok", "signature"]


# --- NumPy's names and signatures -------------------------------------------------------------

def _numpy_name(f):
    if isinstance(f, np.ufunc):
        return f.__name__
    for prefix, mod in (("", np), ("linalg.", np.linalg), ("fft.", np.fft)):
        name = getattr(f, "__name__", None)
        if name is not None and getattr(mod, name, None) is f:
            return prefix + name
    return getattr(f, "__qualname__", repr(f))


def _numpy_callable(name):
    obj = np
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


REGISTERED = {_numpy_name(f): f for f in NUMPY_FUNCTIONS}


def _parameters(name, f):
    """NumPy's parameters of ``f`` beyond its leading positional ones:
    [(name, default)]."""
    if isinstance(f, np.ufunc):
        params = [(p, None) for p in _UFUNC_KEYWORDS]
        if f.signature:     # a gufunc (matmul)
            params += [("axes", None), ("axis", None), ("keepdims", False)]
        return params
    sig = inspect.signature(f)
    out = []
    for p in sig.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        out.append((p.name, p.default))
    out += [(k, None) for k in EXTRA_KEYWORDS.get(name, ())]
    return out


def _method_parameters(name):
    """ndarray method parameters from the first line of its docstring,
    e.g. ``a.sum(axis=None, dtype=None, out=None, *, keepdims=<no value>, ...)``."""
    line = np.ndarray.__dict__[name].__doc__.strip().splitlines()[0]
    m = re.match(r"a\.\w+\((.*)\)$", line)
    assert m, f"cannot read ndarray.{name}'s parameters from {line!r}"
    text = m.group(1).replace("<no value>", "None").replace("[dtype][, type]", "dtype=None")
    text = re.sub(r"\bshape\b, /, ", "", text) if name == "reshape" else text
    fn = ast.parse(f"def f({text}): pass").body[0]
    a = fn.args
    out = []
    pos = a.posonlyargs + a.args
    for arg, d in zip(pos, [None] * (len(pos) - len(a.defaults)) + a.defaults):
        out.append((arg.arg, ast.literal_eval(d) if d is not None else inspect.Parameter.empty))
    for arg, d in zip(a.kwonlyargs, a.kw_defaults):
        out.append((arg.arg, ast.literal_eval(d) if d is not None else None))
    return out


# --- running one call in every mode -----------------------------------------------------------

def _is_traced(a):
    return isinstance(a, np.ndarray) and a.dtype.kind == "f"


def _split_args(args, forced=None):
    """Positions of the traced leaves: float arrays, and lists of them (or
    the positions ``forced``)."""
    traced, leaves = [], []
    for i, a in enumerate(args):
        if forced is not None:
            if i in forced:
                traced.append(i)
                leaves.append(list(a) if isinstance(a, list) else a)
        elif _is_traced(a):
            traced.append(i)
            leaves.append(a)
        elif isinstance(a, list) and a and all(_is_traced(e) for e in a):
            traced.append(i)
            leaves.append(list(a))
    return traced, leaves


def _run_compiled(fn, args, forced=None):
    traced, leaves = _split_args(args, forced)

    def f(*xs):
        full = list(args)
        for i, x in zip(traced, xs):
            full[i] = x
        return fn(*full)
    return tg.compile(f)(*leaves)


def _to_eager(a, force=False):
    if _is_traced(a) or (force and isinstance(a, np.ndarray)):
        return NumpyTensor(np.array(a))
    if isinstance(a, list) and a and all(_is_traced(e) or force for e in a):
        return [NumpyTensor(np.array(e)) for e in a]
    return a


def _run_eager(fn, args, forced=None):
    if forced is not None:
        return fn(*[_to_eager(a, True) if i in forced else a for i, a in enumerate(args)])
    return fn(*[_to_eager(a) for a in args])


RUNNERS = {"compiled": _run_compiled, "eager": _run_eager}


def _flat(v):
    if isinstance(v, (tuple, list)):
        return [o for x in v for o in _flat(x)]
    return [v]


def _plain(v):
    if hasattr(v, "detach"):
        return v.detach().numpy()
    return v


def _same(got, want, call, what):
    """None when ``got`` is NumPy's ``want``; else what differs."""
    g, w = _flat(got), _flat(want)
    if len(g) != len(w):
        return f"{what}: {len(g)} results, NumPy {len(w)}"
    for gi, wi in zip(g, w):
        gi = _plain(gi)
        if isinstance(wi, (int, float, bool)) and not isinstance(wi, np.generic):
            if not np.isscalar(gi) and np.ndim(gi) != 0:
                return f"{what}: {gi!r}, NumPy {wi!r}"
        ga, wa = np.asarray(gi), np.asarray(wi)
        if ga.shape != wa.shape:
            return f"{what}: shape {ga.shape}, NumPy {wa.shape}"
        if isinstance(wi, (np.ndarray, np.generic)) and ga.dtype != wa.dtype:
            return f"{what}: dtype {ga.dtype}, NumPy {wa.dtype}"
        if not call.values:
            continue
        if wa.dtype.kind not in "biufc":      # bytes, strings: exactly equal
            if not np.array_equal(ga, wa):
                return f"{what}: {gi!r}, NumPy {wi!r}"
            continue
        if call.sign_free:
            ga, wa = np.abs(ga), np.abs(wa)
        tol = 1e-5 if wa.dtype == np.float32 else 1e-9
        try:
            np.testing.assert_allclose(ga, wa, rtol=tol, atol=tol, equal_nan=True)
        except AssertionError as e:
            return f"{what}: values differ from NumPy's\n{e}"
    return None


def _names(err, param):
    """A clear refusal: the message names the parameter and says that
    tracegrad does not support it."""
    msg = str(err)
    return (("tracegrad" in msg or "not supported" in msg)
            and re.search(rf"\b{re.escape(param)}\b", msg) is not None)


def _numpy_result(fn, args):
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        try:
            return fn(*args), None
        except Exception as e:   # noqa: BLE001 -- NumPy's own error is the reference
            return None, e


def _judge(fn, args, call, param, what, ignored=False):
    """Problems (strings) of tracegrad's ``fn(*args)`` against NumPy's in every mode.
    ``out=`` here is a plain ndarray made outside the function, which cannot
    hold a traced or recorded result: it must be refused (out= into an array
    the function creates is honoured: test_out_into_arrays_the_function_made
    below and tests/test_writes.py); an ``ignored`` parameter (IGNORED) must
    be accepted."""
    want, np_err = _numpy_result(fn, args)
    problems = []
    for mode in call.modes:
        try:
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")
                got = RUNNERS[mode](fn, args, call.traced)
        except Exception as e:   # noqa: BLE001 -- judged below
            if param is not None and _names(e, param) and not ignored:
                continue                      # refused clearly
            if np_err is not None and isinstance(e, type(np_err)):
                continue                      # NumPy raises too, the same kind of error
            if np_err is None and param is None and "tracegrad" in str(e) \
                    and isinstance(e, (TypeError, NotImplementedError)):
                continue                      # a whole call refused clearly
            problems.append(f"{what} [{mode}]: {type(e).__name__}: {e}"
                            + (f" (NumPy: {type(np_err).__name__}: {np_err})" if np_err else
                               " (NumPy computes it)"))
            continue
        if param == "out" and np_err is None:
            problems.append(f"{what} [{mode}]: out= a plain ndarray ignored (NumPy writes the "
                            f"result into it); refuse it with an error that names out= and "
                            f"tracegrad")
            continue
        if np_err is not None:
            problems.append(f"{what} [{mode}]: NumPy raises {type(np_err).__name__}: {np_err}, "
                            f"tracegrad returns a value")
            continue
        diff = _same(got, want, call, f"{what} [{mode}]")
        if diff:
            problems.append(diff)
    return problems


def _ignored(name, param, is_ufunc):
    return (param in IGNORED or (param, name) in IGNORED
            or (is_ufunc and (param, "ufunc") in IGNORED))


def _values(name, param, default, args):
    vals = VALUES_FOR.get((name, param), VALUES.get(param))
    if vals is None:
        return None
    out = []
    for v in vals:
        try:
            if not isinstance(v, B) and v is not None and default is not inspect.Parameter.empty \
                    and not isinstance(default, np.ndarray) and type(v) is type(default) \
                    and v == default:
                continue
        except (ValueError, TypeError):
            pass
        out.append(v)
    return out


def _build(v, args, fn, base_kw):
    if not isinstance(v, B):
        return v
    if v.fn is None:     # out=: from NumPy's result without it
        want, err = _numpy_result(lambda *a: fn(*a, **base_kw), args)
        return None if err is not None else _out(args, base_kw, want)
    return v.fn(args)


def _check_callable(name, fn, params, call, n_positional):
    problems = []
    args = list(call.args)
    base = lambda *a: fn(*a, **call.kw)   # noqa: E731
    problems += _judge(base, args, call, None, f"{name}{tuple(call.kw.items()) or ''}")
    missing = []
    for param, default in params[n_positional:]:
        if param in call.kw:
            continue
        vals = _values(name, param, default, args)
        if vals is None:
            missing.append(param)
            continue
        for v in vals:
            value = _build(v, args, fn, call.kw)
            if value is None and isinstance(v, B):
                continue    # NumPy's base call fails: nothing to shape an out= after
            kw = dict(call.kw, **{param: value})
            f = lambda *a, _kw=kw: fn(*a, **_kw)  # noqa: E731
            label = f"{name}(..., {param}={value!r})" if not isinstance(value, np.ndarray) \
                else f"{name}(..., {param}=<array {value.shape} {value.dtype}>)"
            problems += _judge(f, args, call, param, label,
                               ignored=_ignored(name, param, isinstance(fn, np.ufunc)))
    assert not missing, (f"no representative value for parameter(s) {missing} of {name}: "
                         f"add them to VALUES (or VALUES_FOR[({name!r}, param)]) in "
                         f"test_numpy_keywords.py")
    return problems


# --- the functions ----------------------------------------------------------------------------

def test_every_registered_function_has_a_representative_call():
    missing = sorted(n for n in REGISTERED if n not in CALLS)
    assert not missing, (f"NumPy functions registered for the NumPy face with no representative "
                         f"call in test_numpy_keywords.CALLS: {missing}")


def test_the_table_names_only_registered_functions():
    stale = sorted(n for n in CALLS if n not in REGISTERED)
    assert not stale, f"CALLS names functions tracegrad does not register: {stale}"


# functions that write into their first argument and return None: compare the array after
# the call (``a * 1.0``: an array tracegrad tracks, as one the function made)
IN_PLACE_FUNCTIONS = {"put", "copyto", "place", "putmask", "fill_diagonal"}


def _in_place(func):
    def f(a, *rest, **kw):
        a = a * 1.0
        assert func(a, *rest, **kw) is None
        return a
    return f


@pytest.mark.parametrize("name", sorted(REGISTERED))
def test_every_parameter_is_honoured_or_refused(name):
    f = REGISTERED[name]
    call = CALLS.get(name)
    if call is None:
        pytest.fail(f"no representative call for {name} in CALLS")
    if name in REFUSED:
        for mode in call.modes:
            with pytest.raises((TypeError, NotImplementedError), match=REFUSED[name]):
                RUNNERS[mode](f, list(call.args), call.traced)
        return
    params = _parameters(name, f)
    n_pos = 0 if isinstance(f, np.ufunc) else len(call.args)
    if not isinstance(f, np.ufunc):
        sig = inspect.signature(f).parameters.values()
        if any(p.kind is p.VAR_POSITIONAL for p in sig):
            n_pos = sum(1 for p in sig if p.kind is p.VAR_POSITIONAL or
                        (p.kind is p.POSITIONAL_ONLY and p.default is p.empty))
            n_pos = 0 if name == "einsum" else n_pos
            n_pos = len(call.args) if name == "piecewise" else n_pos   # (x, condlist, funclist)
    problems = _check_callable(name, _in_place(f) if name in IN_PLACE_FUNCTIONS else f, params,
                               call, n_pos)
    assert not problems, "\n".join(problems)


# --- ndarray methods of the NumPy face --------------------------------------------------------

def _face_methods():
    """The ndarray methods a NumPy-face value offers (not those it refuses
    as a whole with advice: x.tofile, x.byteswap...)."""
    names = []
    for n in dir(np.ndarray):
        if n.startswith("_") or not callable(getattr(np.ndarray, n)):
            continue
        for k in NumpyTensor.__mro__:
            if n in k.__dict__:
                d = k.__dict__[n]
                if not isinstance(d, FaceMethod) or "numpy" in d.impls:
                    names.append(n)
                break
    return sorted(names)


FACE_METHODS = _face_methods()

# the object the method is called on, and its other positional arguments
METHOD_CALLS = {
    "all": Call(X), "any": Call(X), "argmax": Call(X), "argmin": Call(X), "argsort": Call(X),
    "astype": Call(X, np.float32), "clip": Call(X, -0.5), "conj": Call(X), "conjugate": Call(X),
    "cumprod": Call(X), "cumsum": Call(X), "diagonal": Call(X3), "dot": Call(X, X.T),
    "flatten": Call(X), "max": Call(X), "mean": Call(X), "min": Call(X), "prod": Call(X),
    "ravel": Call(X), "repeat": Call(X, 2), "reshape": Call(X, (2, 6)), "round": Call(X),
    "sort": Call(X), "squeeze": Call(X[None]), "std": Call(X), "sum": Call(X),
    "swapaxes": Call(X, 0, 1), "take": Call(X, np.array([0, 5, 11, 14, -15])),
    "trace": Call(X3), "transpose": Call(X3), "var": Call(X), "view": Call(X),
    "nonzero": Call(X > 0, modes=("eager",), why_modes=_DATA_DEPENDENT),
    "item": Call(X[:1, :1], modes=("eager",), why_modes="a Python number of the value"),
    "tolist": Call(X, modes=("eager",), why_modes="Python lists of the values"),
    "tobytes": Call(X, modes=("eager",), why_modes="the bytes of the values"),
    # mode='raise' of a traced index array is refused (its range cannot be checked)
    "choose": Call(np.array([0, 1, 3, 2, 1, 0]), [V, 2 * V, V ** 2], traced=(0, 1),
                   kw={"mode": "clip"}),
    "argpartition": Call(X, 1), "partition": Call(X, 1), "copy": Call(X),
    "compress": Call(X, [True, False, True]), "searchsorted": Call(SORTED, X),
    "to_device": Call(X, "cpu"),
    "fill": Call(X, 0.5), "put": Call(X, np.array([0, 5, 11, 5]), V[:3]),
}

METHOD_VALUES_FOR = {
    ("clip", "max"): [0.5],
    ("astype", "casting"): ["unsafe", "same_kind"],
    ("astype", "copy"): [False],
    ("view", "dtype"): [np.float64],
    ("reshape", "copy"): [True],
}

# in-place methods: compare the array after the call
IN_PLACE = {"sort", "partition", "fill", "put"}


def _method_fn(name, kw):
    if name in IN_PLACE:
        def f(x, *a):
            x = x * 1.0
            getattr(x, name)(*a, **kw)
            return x
        return f
    return lambda x, *a: getattr(x, name)(*a, **kw)


def test_every_face_method_has_a_representative_call():
    missing = sorted(n for n in FACE_METHODS if n not in METHOD_CALLS)
    assert not missing, f"ndarray methods of the NumPy face with no METHOD_CALLS entry: {missing}"


@pytest.mark.parametrize("name", FACE_METHODS)
def test_every_method_parameter_is_honoured_or_refused(name):
    call = METHOD_CALLS.get(name)
    if call is None:
        pytest.fail(f"no representative call for ndarray.{name} in METHOD_CALLS")
    params = _method_parameters(name)
    n_pos = len(call.args) - 1
    problems = _judge(_method_fn(name, call.kw), list(call.args), call, None, f"x.{name}()")
    missing = []
    for param, default in params[n_pos:]:
        if param in call.kw:
            continue
        vals = METHOD_VALUES_FOR.get((name, param),
                                     VALUES_FOR.get((name, param), VALUES.get(param)))
        if vals is None:
            missing.append(param)
            continue
        vals = _values(name, param, default, call.args) if (name, param) not in \
            METHOD_VALUES_FOR else vals
        for v in vals:
            if isinstance(v, B) and v.fn is None:
                want, err = _numpy_result(_method_fn(name, call.kw), call.args)
                if err is not None:
                    continue
                value = _out(call.args, {}, want)
            else:
                value = v.fn(call.args) if isinstance(v, B) else v
            label = f"x.{name}(..., {param}={value!r})" if not isinstance(value, np.ndarray) \
                else f"x.{name}(..., {param}=<array {value.shape} {value.dtype}>)"
            problems += _judge(_method_fn(name, dict(call.kw, **{param: value})),
                               list(call.args), call, param,
                               label, ignored=_ignored(name, param, False))
    assert not missing, f"no representative value for parameter(s) {missing} of ndarray.{name}"
    assert not problems, "\n".join(problems)


# --- the keywords that matter most: values and gradients in both modes ------------------------
#
# ``check`` (test_numpy_functions) compares values with NumPy's and every
# gradient (tg.grad compiled and compile=False, and eager torch-face
# Tensors) with central finite differences in float64.

MASK = np.array([[True, False, True, True, False],
                 [False, False, True, False, True],
                 [True, True, False, True, False],
                 [True, False, False, False, True]])
X45 = _r(4, 5)

GRADIENT_CASES = {
    # initial= (with and without axis, keepdims)
    "max-initial": (lambda x: np.max(x, initial=0.5), X45),
    "max-initial-above-all": (lambda x: np.max(x, axis=1, initial=5.0) * np.sum(x), X45),
    "max-initial-axis-keepdims": (lambda x: np.max(x, axis=0, keepdims=True, initial=0.3), X45),
    "amax-initial": (lambda x: np.amax(x, axis=1, initial=-0.2), X45),
    "min-initial": (lambda x: np.min(x, axis=1, initial=-0.5), X45),
    "sum-initial": (lambda x: np.sum(x, axis=0, initial=2.5), X45),
    "prod-initial": (lambda x: np.prod(x, axis=1, initial=-2.0), X45),
    # where=
    "sum-where": (lambda x: np.sum(x, where=MASK), X45),
    "sum-where-axis-keepdims-initial": (lambda x: np.sum(x, axis=1, keepdims=True, where=MASK,
                                                         initial=1.0), X45),
    "sum-where-broadcast": (lambda x: np.sum(x, axis=0, where=MASK[0]), X45),
    "prod-where": (lambda x: np.prod(x, axis=0, where=MASK), X45),
    "max-where-initial": (lambda x: np.max(x, axis=1, where=MASK, initial=-1.0), X45),
    "min-where-initial": (lambda x: np.min(x, axis=0, where=MASK, initial=1.0), X45),
    "mean-where": (lambda x: np.mean(x, where=MASK), X45),
    "mean-where-axis": (lambda x: np.mean(x, axis=1, where=MASK, keepdims=True), X45),
    "var-where": (lambda x: np.var(x, axis=1, where=MASK), X45),
    "std-where-ddof": (lambda x: np.std(x, axis=1, where=MASK, ddof=1), X45),
    "var-mean": (lambda x: np.var(x, axis=1, mean=np.mean(x, axis=1, keepdims=True)), X45),
    "nansum-where-initial": (lambda x: np.nansum(np.where(x > 1.5, np.nan, x), axis=1, where=MASK,
                                                 initial=0.5), X45),
    "nanmean-where": (lambda x: np.nanmean(np.where(x > 1.5, np.nan, x), axis=0, where=MASK),
                      X45),
    # dtype= and keepdims= of the statistics
    "mean-dtype-keepdims": (lambda x: np.mean(x, axis=0, dtype=np.float64, keepdims=True), X45),
    "var-keepdims": (lambda x: np.var(x, axis=(0, 1), keepdims=True), X45),
    # UPLO=: a non-symmetric input, of which NumPy reads one triangle
    "eigvalsh-L": (lambda a: np.linalg.eigvalsh(a), A),
    "eigvalsh-U": (lambda a: np.linalg.eigvalsh(a, UPLO="U"), A),
    "eigh-values": (lambda a: np.linalg.eigh(a)[0], A),
    "eigh-vectors-squared": (lambda a: np.linalg.eigh(a)[1] ** 2, A),
    "eigh-U-vectors-squared": (lambda a: np.linalg.eigh(a, UPLO="U")[1] ** 2, A),
    # mode= of take
    "take-clip": (lambda x: np.take(x, [0, 3, 25, -3, 19], mode="clip"), X45),
    "take-wrap-axis": (lambda x: np.take(x, [[0, 7], [-6, 2]], axis=1, mode="wrap"), X45),
    "take-raise": (lambda x: np.take(x, [1, -1], axis=0, mode="raise"), X45),
    "take_along_axis": (lambda x: np.take_along_axis(x, np.argsort(x, axis=0)[:2], axis=0),
                        X45),
    "choose-clip": (lambda x: np.choose([[0, 1, 3, -1, 2]] * 4, [x, np.sin(x), x ** 2],
                                        mode="clip"), X45),
    "choose-wrap": (lambda x: np.choose([4, 1, -2, 0, 2], [x, 3 * x, x[0]], mode="wrap"), X45),
    "choose-raise": (lambda x: np.choose(np.array([[0], [1], [1], [0]]), [x, x ** 3]), X45),
    "take_along_axis-none": (lambda x: np.take_along_axis(x, np.array([3, 0, 19, 3]), axis=None),
                             X45),
}


@pytest.mark.parametrize("name", sorted(GRADIENT_CASES))
def test_keyword_values_and_gradients(name):
    fn, *args = GRADIENT_CASES[name]
    check(fn, *args)


def _numpy_face_grad_check(fn, x, gtol=1e-6):
    """fn's value (compiled and on NumPy-face eager values) and gradient of
    sum(fn(x) * C) (tg.grad, tg.value_and_grad, tg.grad(compile=False))
    against NumPy and central finite differences: for ndarray methods, which
    a torch-face Tensor spells otherwise."""
    want = fn(x)
    np.testing.assert_allclose(tg.compile(fn)(x), want, rtol=1e-10)
    eager = fn(NumpyTensor(np.array(x)))
    np.testing.assert_allclose(eager.detach().numpy(), want, rtol=1e-10)
    c = np.random.default_rng(5).standard_normal(np.shape(want))
    loss = lambda a: np.sum(fn(a) * c)   # noqa: E731
    v, g = tg.value_and_grad(loss)(x)
    np.testing.assert_allclose(v, loss(x), rtol=1e-10)
    grads = [g, tg.grad(loss)(x), tg.grad(loss, compile=False)(x)]
    d = np.random.default_rng(6).standard_normal(x.shape)
    eps = 1e-6
    fd = (loss(x + eps * d) - loss(x - eps * d)) / (2 * eps)
    for gi in grads:
        assert abs(np.sum(gi * d) - fd) <= gtol * max(1.0, abs(fd))


@pytest.mark.parametrize("fn", [
    lambda x: x.max(initial=5.0) + x.sum(),
    lambda x: x.max(axis=1, initial=0.5),
    lambda x: x.min(axis=0, initial=-0.5, keepdims=True),
    lambda x: x.max(axis=0, where=MASK, initial=-3.0),
    lambda x: x.sum(where=MASK),
    lambda x: x.sum(axis=1, where=MASK, initial=0.25),
    lambda x: x.prod(axis=1, where=MASK),
    lambda x: x.mean(where=MASK),
    lambda x: x.mean(axis=0, where=MASK),
    lambda x: x.var(axis=1, where=MASK, ddof=1),
    lambda x: x.std(where=MASK),
    lambda x: x.take([0, 30, -30], mode="clip"),
    lambda x: x.take([6, -7], axis=1, mode="wrap"),
], ids=["max-initial-above", "max-initial-axis", "min-initial-keepdims", "max-where",
        "sum-where", "sum-where-initial", "prod-where", "mean-where", "mean-where-axis",
        "var-where", "std-where", "take-clip", "take-wrap"])
def test_method_keyword_values_and_gradients(fn):
    _numpy_face_grad_check(fn, X45)


def test_eigh_gradient_reads_one_triangle_only():
    """NumPy's eigvalsh(a) depends on a's lower triangle alone ('U': upper):
    the gradient is zero on the other triangle, in both modes."""
    f = lambda a: np.sum(np.linalg.eigvalsh(a) ** 3)   # noqa: E731
    fu = lambda a: np.sum(np.linalg.eigvalsh(a, UPLO="U") ** 3)   # noqa: E731
    for fn, zero in ((f, np.triu_indices(4, 1)), (fu, np.tril_indices(4, -1))):
        for g in (tg.grad(fn)(A), tg.grad(fn, compile=False)(A)):
            np.testing.assert_array_equal(g[zero], 0.0)
            assert np.all(np.abs(np.diag(g)) > 0)


def test_ufunc_dtype_casts_the_loop_and_its_gradient():
    """np.exp(x, dtype=np.float32) computes in float32 (NumPy's loop);
    the gradient reaches x (in x's dtype)."""
    x = _r(3, 4)
    f = lambda a: np.exp(a, dtype=np.float32)   # noqa: E731
    got = tg.compile(f)(x)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, f(x), rtol=1e-6)
    for g in (tg.grad(lambda a: np.sum(f(a)))(x), tg.grad(lambda a: np.sum(f(a)),
                                                          compile=False)(x)):
        assert g.dtype == x.dtype
        np.testing.assert_allclose(g, np.exp(x), rtol=1e-6)


# plain ndarrays made outside the function: out= cannot hold a traced or recorded value
_OUT_0D, _OUT_4, _OUT_64, _OUT_34 = np.empty(()), np.empty(4), np.empty((6, 4)), np.empty((3, 4))


@pytest.mark.parametrize("fn, match", [
    (lambda x: np.sum(x, out=_OUT_0D), "out=(.|\n)*np.copy"),
    (lambda x: x.max(axis=0, out=_OUT_4), "out=(.|\n)*np.copy"),
    (lambda x: np.concatenate([x, x], out=_OUT_64), "out=(.|\n)*np.copy"),
    (lambda x: np.sin(x, out=_OUT_34), "out=(.|\n)*np.copy"),
    (lambda x: np.sin(x, out=(_OUT_34,)), "out=(.|\n)*np.copy"),
    (lambda x: np.sin(x, where=x > 0), "where="),
    (lambda x: np.matmul(x, x.T, axes=[(-2, -1), (-2, -1), (-2, -1)]), "axes="),
    (lambda x: np.var(x, dtype=np.int64), "dtype=int64"),
])
def test_refusals_name_the_keyword_and_tracegrad(fn, match):
    for run in (lambda: tg.compile(fn)(X), lambda: fn(NumpyTensor(np.array(X)))):
        with pytest.raises(TypeError, match=match) as e:
            run()
        assert "tracegrad" in str(e.value)


@pytest.mark.parametrize("fn", [
    lambda x: np.sum(x, out=np.empty(())),
    lambda x: x.max(axis=0, out=np.empty(4)),
    lambda x: np.concatenate([x, x], out=np.empty((6, 4))),
    lambda x: np.sin(x, out=np.empty((3, 4))),
    lambda x: np.add(x, 1, out=(np.zeros((3, 4)),))[0],
    lambda x: np.cumsum(x, axis=1, out=np.zeros((3, 4), np.float32)),
    lambda x: np.exp(x, out=np.zeros((3, 4), np.complex128)),
], ids=["sum", "max-method", "concatenate", "sin", "add-tuple", "cumsum-float32", "exp-complex"])
def test_out_into_arrays_the_function_made(fn):
    """out= an array the function creates is honoured in both modes: the
    result written into it (cast to its dtype), which the call returns."""
    want = fn(X)
    got = tg.compile(fn)(X)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-6)
    for g in (tg.grad(lambda x: np.sum(np.real(fn(x)))), tg.grad(lambda x: np.sum(np.real(fn(x))),
                                                               compile=False)):
        assert g(X).shape == X.shape


def test_errors_numpy_raises_are_raised():
    for fn, exc in [(lambda x: np.max(x, where=x > 0), ValueError),
                    (lambda x: np.take(x, [20]), IndexError),
                    (lambda x: np.take(x, [1], mode="bogus"), ValueError),
                    (lambda x: np.add(x, x, dtype=np.int64), TypeError),
                    (lambda x: np.sort(x, order="f"), ValueError),
                    (lambda x: np.partition(x, 1, kind="stable"), ValueError),
                    (lambda x: np.concatenate([x, x], dtype=np.int64), TypeError)]:
        with pytest.raises(exc):
            fn(X)
        with pytest.raises(exc):
            tg.compile(fn)(X)
        with pytest.raises(exc):
            fn(NumpyTensor(np.array(X)))


XI = np.array([[-1, -2, 5], [3, -4, 0]])


@pytest.mark.parametrize("fn", [
    lambda a: np.sum(a, initial=0.5), lambda a: np.sum(a, axis=1, initial=-7.5, where=a > 0),
    lambda a: np.max(a, axis=1, initial=0.5), lambda a: np.min(a, axis=0, initial=-0.5),
    lambda a: np.max(a, axis=0, where=a > 0, initial=-7.5), lambda a: np.prod(a, initial=1.5),
    lambda a: np.mean(a, axis=1, where=a != 0), lambda a: np.mean(a, dtype=np.int64),
    lambda a: np.mean(a, dtype=np.float32), lambda a: np.var(a, axis=0, dtype=np.float32),
    lambda a: np.all(a, axis=0, where=a > 0), lambda a: np.any(a < -3, where=a > 0),
    lambda a: np.nansum(a, initial=2), lambda a: np.sum(a, dtype=np.float32, keepdims=True),
])
def test_integer_inputs_follow_numpy(fn):
    """An initial= is cast to the reduction's dtype first, a dtype= is the
    result's: values and dtypes as NumPy's, compiled and eager."""
    want = fn(XI)
    for got in (tg.compile(fn)(XI), fn(NumpyTensor(np.array(XI))).detach().numpy()):
        got = np.asarray(got)
        assert got.dtype == np.asarray(want).dtype and got.shape == np.shape(want)
        np.testing.assert_allclose(got, want, rtol=1e-6)


# --- ufunc methods: np.add.reduce(x, axis, dtype, out, keepdims, initial, where), ... -------------

UFUNC_METHOD_UFUNCS = [np.add, np.subtract, np.multiply, np.divide, np.maximum, np.minimum,
                       np.logaddexp, np.hypot, np.less]
UFUNC_METHOD_CALLS = {
    "reduce": Call(P), "accumulate": Call(P), "reduceat": Call(P, [0, 2, 1]),
    "outer": Call(P[0], Q[:, 0]),
}
UFUNC_METHOD_VALUES_FOR = {
    ("reduceat", "axis"): [1],
    ("accumulate", "axis"): [1, -1],
    ("reduce", "axis"): [1, None, (0, 1)],
}


def _ufunc_method_parameters(ufunc, method):
    if method == "outer":
        return [(p, None) for p in _UFUNC_KEYWORDS]
    line = getattr(ufunc, method).__doc__.strip().splitlines()[0]
    m = re.match(r"\w+\((.*)\)$", line)
    text = m.group(1).replace("<no value>", "None")
    fn = ast.parse(f"def f({text}): pass").body[0]
    a = fn.args
    pos = a.posonlyargs + a.args
    defaults = [None] * (len(pos) - len(a.defaults)) + a.defaults
    return [(p.arg, ast.literal_eval(d) if d is not None else inspect.Parameter.empty)
            for p, d in zip(pos, defaults)]


@pytest.mark.parametrize("method", sorted(UFUNC_METHOD_CALLS))
@pytest.mark.parametrize("ufunc", UFUNC_METHOD_UFUNCS, ids=lambda u: u.__name__)
def test_every_ufunc_method_parameter_is_honoured_or_refused(ufunc, method):
    call = UFUNC_METHOD_CALLS[method]
    fn = getattr(ufunc, method)
    name = f"{ufunc.__name__}.{method}"
    problems = _judge(fn, list(call.args), call, None, name)
    missing = []
    for param, default in _ufunc_method_parameters(ufunc, method)[len(call.args):]:
        vals = UFUNC_METHOD_VALUES_FOR.get((method, param), VALUES.get(param))
        if vals is None:
            missing.append(param)
            continue
        for v in vals:
            value = _build(v, list(call.args), fn, {})
            if value is None and isinstance(v, B):
                continue
            if default is not inspect.Parameter.empty and not isinstance(v, B) \
                    and type(value) is type(default) and value == default:
                continue
            label = f"{name}(..., {param}={value!r})" if not isinstance(value, np.ndarray) \
                else f"{name}(..., {param}=<array {value.shape} {value.dtype}>)"
            problems += _judge(lambda *a, _k={param: value}: fn(*a, **_k), list(call.args), call,
                               param, label, ignored=_ignored(name, param, True))
    assert not missing, f"no representative value for parameter(s) {missing} of {name}"
    assert not problems, "\n".join(problems)
