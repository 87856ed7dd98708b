"""Helper functions that generated NumPy code calls.

Each helper is a top-level function whose name starts with an underscore.
It depends only on ``numpy`` (as ``np``) and ``math``, because the code
generator copies its source verbatim into standalone modules that import
nothing else.  The primitives' ``impl`` functions call the same helpers, so
there is one definition of each computation.  Helpers that an ``impl`` also
runs on CuPy take the array module as ``xp`` (NumPy when omitted, which is
how generated code calls them).
"""
import math

import numpy as np


def _erf(x):
    """The error function, elementwise (NumPy has none; math.erf is exact
    to double precision).  Keeps float32 inputs float32."""
    x = np.asarray(x)
    dtype = x.dtype if x.dtype.kind == "f" else np.dtype(np.float64)
    return np.vectorize(math.erf, otypes=[dtype])(x) if x.size else x.astype(dtype)


def _index_add(g, shape, idx, xp=np):
    """A zero array of ``shape`` into which ``g`` is added at ``[idx]``.

    The transpose of ``x[idx]``: positions an integer index repeats receive
    the sum of their cotangents (plain ``z[idx] = g`` would keep only one).
    Any NumPy index works (slices, None, Ellipsis, integer and boolean
    arrays), because the flat positions are found by indexing an arange."""
    out = xp.zeros(shape, np.result_type(g))  # g may be a folded Python number
    if not any(isinstance(i, (list,)) or hasattr(i, "dtype") for i in idx):
        out[idx] = g  # basic indexing selects every position at most once
        return out
    size = 1
    for d in shape:
        size *= d
    pos = xp.arange(size).reshape(shape)[idx]
    flat = out.reshape(-1)
    xp.add.at(flat, pos.reshape(-1), xp.broadcast_to(g, pos.shape).reshape(-1))
    return flat.reshape(shape)


def _index_set(g, shape, idx, xp=np):
    """A zero array of ``shape`` holding ``g`` at the basic index ``[idx]``
    (slices, integers, None, Ellipsis: each position at most once)."""
    out = xp.zeros(shape, np.result_type(g))  # g may be a folded Python number
    out[idx] = g
    return out


def _plus_identity(m, out=None):
    """m + I for a square matrix, without building the identity; ``out``
    (which may be ``m`` itself) receives the result."""
    if out is None:
        out = m.copy()
    elif out is not m:
        out[...] = m
    n = m.shape[0]
    if out.flags.c_contiguous:
        out.reshape(-1)[::n + 1] += 1  # the diagonal, as a strided view
    else:
        i = np.arange(n)
        out[i, i] += 1
    return out


def _setitem(x, idx, v):
    """A copy of ``x`` with ``[idx]`` set to ``v`` (out-of-place assignment)."""
    y = x.copy()
    y[idx] = v
    return y


def _dynamic_slice_index(x, start, axis, delta, step):
    """The index ``[..., start:start + delta:step]`` (on ``axis``) for a start
    known only at run time.  Compiled code was traced for
    ``len(range(0, delta, step))`` elements; where NumPy's slice holds fewer
    (the start runs past an end, or a negative start wraps), raise rather
    than return a shorter or different array."""
    s = int(start)
    sl = slice(s, s + delta, step)
    n = x.shape[axis]
    got = len(range(*sl.indices(n)))
    want = len(range(0, delta, step))
    if got != want:
        lo, hi = (0, n - delta) if step > 0 else (-delta, n - 1)
        raise IndexError(
            f"dynamic slice [{s}:{s + delta}" + (f":{step}" if step != 1 else "") + "] of "
            f"axis {axis} (length {n}) holds {got} elements in NumPy, but the compiled code "
            f"was traced for {want} (a slice x[start:start + {delta}] whose start is only "
            f"known at run time keeps its length); use a start in {lo}..{hi} or pad the array")
    return (slice(None),) * axis + (sl,)

