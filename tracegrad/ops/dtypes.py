"""torch's dtype rules, in the one place every torch-face value reads them:
the default dtype (``torch.set_default_dtype``), ``promote_types`` and
``result_type`` (torch's type promotion), and which rows turn integer
operands into floating ones.  NumPy-face values never reach these rules
(NumPy's own, NEP 50, applies to them unchanged).

torch's promotion (c10's ``ResultTypeState``): operands fall in three
groups, the dimensioned tensors, the 0-d tensors and the wrapped numbers
(Python and NumPy scalars); each group promotes within itself, and a group
lower in that list decides the dtype only where its category (bool <
integer < floating < complex) is above the groups before it.  A Python
float is the default dtype, a Python complex its complex partner, a Python
int int64.  ``int64[3] * 2.5`` is float32, ``float32[3] * float64[]`` is
float32, ``int32[3] + int64[]`` is int32, ``float16[3] + int64[3]`` float16.

The op layer holds these rules (the registry's ``bind`` applies them to the
rows listed in ``TORCH_PROMOTED`` and ``TORCH_TO_FLOAT`` when an operand
speaks torch); it knows no dialect beyond that flag.

May import: numpy.
"""
from __future__ import annotations

import threading

import numpy as np

__all__ = []


class Defaults:
    """What torch-face constructors make when told nothing: ``dtype`` for
    Python floats (and zeros/ones/rand/linspace/...), torch's float32."""
    dtype = np.dtype(np.float32)


class _NumpyCall(threading.local):
    depth = 0      # > 0 while an np.* function or ufunc runs: NumPy's rule, on any value


numpy_call = _NumpyCall()


class numpy_rules:
    """Inside: NumPy's promotion for every operand (``np.sin(tensor)`` is
    NumPy code and keeps NumPy's meaning, dtypes included)."""
    __slots__ = ()

    def __enter__(self):
        numpy_call.depth += 1

    def __exit__(self, *exc):
        numpy_call.depth -= 1
        return False


def default_complex():
    return np.dtype(np.complex128 if Defaults.dtype.itemsize == 8 else np.complex64)


_CATEGORY = {"b": 0, "u": 1, "i": 1, "f": 2, "c": 3}


def category(dt):
    return _CATEGORY.get(dt.kind, 9)


def _to_complex(dt):
    return np.dtype(np.complex128 if dt.itemsize >= 8 else np.complex64)


def promote_types(a, b):
    """torch.promote_types on NumPy dtypes: within a category NumPy's (and
    torch's) table; across categories the higher category's dtype, a
    complex one widened to hold the float's precision (int64 + float16 is
    float16, int32 + float32 float32, complex64 + float64 complex128)."""
    a, b = np.dtype(a), np.dtype(b)
    if a == b:
        return a
    ca, cb = category(a), category(b)
    if ca == cb or (ca == 3 and cb == 2) or (ca == 2 and cb == 3):
        return np.promote_types(a, b)
    return a if ca > cb else b


def _combine(higher, lower):
    """c10's combine_categories: ``lower`` decides only by category."""
    if higher is None:
        return lower
    if lower is None:
        return higher
    if higher.kind == "c":
        return higher
    if lower.kind == "c":
        return _to_complex(higher) if higher.kind == "f" else lower
    if higher.kind == "f":
        return higher
    if higher.kind == "b" or lower.kind == "f":
        return promote_types(higher, lower)
    return higher


def wrapped_dtype(x):
    """The dtype a Python or NumPy scalar takes in torch's promotion."""
    if isinstance(x, (bool, np.bool_)):
        return np.dtype(np.bool_)
    if isinstance(x, (int, np.integer)):
        return np.dtype(np.int64)
    if isinstance(x, (float, np.floating)):
        return Defaults.dtype
    if isinstance(x, (complex, np.complexfloating)):
        return default_complex()
    raise TypeError(f"{type(x).__name__} is not a number torch can promote")


def is_wrapped(x):
    return isinstance(x, (bool, int, float, complex, np.generic))


def result_type(*operands):
    """torch.result_type over arrays (anything with shape and dtype: their
    rank decides their group) and scalars (wrapped numbers)."""
    dim = zero = wrapped = None
    for x in operands:
        if is_wrapped(x):
            dt = wrapped_dtype(x)
            wrapped = dt if wrapped is None else promote_types(wrapped, dt)
        elif len(x.shape):
            dt = np.dtype(x.dtype)
            dim = dt if dim is None else promote_types(dim, dt)
        else:
            dt = np.dtype(x.dtype)
            zero = dt if zero is None else promote_types(zero, dt)
    if dim is None and zero is None and wrapped is None:
        raise TypeError("result_type needs at least one operand")
    return _combine(dim, _combine(zero, wrapped))


# Rows that promote their operands as torch's binary ops do (True: every
# operand; a tuple: the positions that promote, where's condition does not).
TORCH_PROMOTED = {name: True for name in (
    "add", "sub", "mul", "div", "pow", "maximum", "minimum", "fmax", "fmin", "fmod",
    "remainder", "floor_divide", "arctan2", "hypot", "copysign", "logaddexp", "logaddexp2",
    "clip")}
TORCH_PROMOTED["where"] = (1, 2)

# Rows whose torch result is floating for integer or bool operands: torch
# computes them in the default dtype (NumPy picks float16/32/64 by width).
TORCH_TO_FLOAT = frozenset((
    "div", "exp", "log", "tanh", "sqrt", "rsqrt", "exp2", "expm1", "log1p", "log2", "log10",
    "sin", "cos", "tan", "arcsin", "arccos", "arctan", "sinh", "cosh", "arcsinh", "arccosh",
    "arctanh", "sigmoid", "softplus", "erf", "erfc", "erfinv", "sinc", "deg2rad", "rad2deg",
    "gammaln", "polygamma", "arctan2", "hypot", "logaddexp", "logaddexp2", "reciprocal",
    "copysign", "bessel_ive"))

