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


# --- special functions (tracegrad.ops.special; tracegrad.scipy.special) ---

def _gammaln(x):
    """log|Gamma(x)| elementwise (inf at the poles, like SciPy).  Keeps float32."""
    x = np.asarray(x)
    dtype = x.dtype if x.dtype.kind == "f" else np.dtype(np.float64)

    def lg(v):
        try:
            return math.lgamma(v)
        except ValueError:  # a pole: 0, -1, -2, ...
            return math.inf
    return np.vectorize(lg, otypes=[dtype])(x) if x.size else x.astype(dtype)


def _polygamma(x, n):
    """The n-th derivative of digamma (n == 0: digamma itself), elementwise."""
    x = np.asarray(x)
    dtype = x.dtype if x.dtype.kind == "f" else np.dtype(np.float64)
    z = np.array(x, dtype=np.float64, copy=True, ndmin=1)
    shape = x.shape
    out = np.zeros(z.shape)
    if n == 0:  # reflection: psi(x) = psi(1 - x) - pi / tan(pi x)
        low = z < 0.5
        with np.errstate(all="ignore"):
            out[low] = -math.pi / np.tan(math.pi * z[low])
        z[low] = 1.0 - z[low]
        pole = low & (z == np.floor(z))
        out[pole] = np.nan
        out[z == 1.0] = -np.inf  # x == 0 (SciPy: -inf there, nan at -1, -2, ...)
    sgn = 1.0 if n % 2 else -1.0  # (-1)^(n+1)
    fact = float(math.factorial(n))
    lim = 10.0 + 2 * n
    with np.errstate(all="ignore"):
        bad = ~(z > -1e4)  # nan, -inf, too far left for the recurrence
        z[bad] = lim
        out[bad] = np.nan
        while True:
            small = z < lim
            if not small.any():
                break
            zs = z[small]
            out[small] += sgn * fact / zs ** (n + 1) if n else -1.0 / zs
            z[small] = zs + 1.0
        b2k = (1 / 6, -1 / 30, 1 / 42, -1 / 30, 5 / 66, -691 / 2730, 7 / 6, -3617 / 510,
               43867 / 798, -174611 / 330)
        r = 1.0 / z
        r2 = r * r
        if n == 0:
            s = np.log(z) - 0.5 * r
            p = np.ones_like(z)
            for k, b in enumerate(b2k, 1):
                p = p * r2
                s = s - b / (2 * k) * p
        else:
            s = math.factorial(n - 1) * r ** n + 0.5 * fact * r ** (n + 1)
            p = r ** n
            for k, b in enumerate(b2k, 1):
                p = p * r2
                s = s + b * (math.factorial(2 * k + n - 1) / math.factorial(2 * k)) * p
            s = sgn * s
        out = out + s
    if n > 0:
        out[np.isinf(np.asarray(x, dtype=np.float64).reshape(-1))[:out.size].reshape(out.shape)
            & ~bad] = 0.0
    return out.reshape(shape).astype(dtype)


def _erfinv(y):
    """The inverse error function, elementwise (+-inf at +-1, nan outside)."""
    y = np.asarray(y)
    dtype = y.dtype if y.dtype.kind == "f" else np.dtype(np.float64)
    v = y.astype(np.float64)
    with np.errstate(all="ignore"):
        w = -np.log((1.0 - v) * (1.0 + v))
        a = w - 2.5
        p = 2.81022636e-08
        for c in (3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087,
                  -0.00125372503, -0.00417768164, 0.246640727, 1.50140941):
            p = c + p * a
        b = np.sqrt(w) - 3.0
        q = -0.000200214257
        for c in (0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773,
                  -0.0076224613, 0.00943887047, 1.00167406, 2.83297682):
            q = c + q * b
        x = np.where(w < 5.0, p, q) * v
        # Newton on |x|: erf(t) = |y| near 0, erfc(t) = 1 - |y| (exact) towards +-1
        erf = np.vectorize(math.erf, otypes=[np.float64])
        erfc = np.vectorize(math.erfc, otypes=[np.float64])
        av = np.abs(v)
        c = 1.0 - av
        near = av > 0.5
        t = np.abs(x)
        ok = np.isfinite(t)
        for _ in range(12):  # quadratic; the start is poorer towards +-1
            if not t.size:
                break
            ts = np.where(ok, t, 0.0)
            f = np.where(near, c - erfc(ts), erf(ts) - av)
            step = np.where(ok, f / (1.1283791670955126 * np.exp(-ts * ts)), 0.0)
            step = np.where(np.isfinite(step), step, 0.0)
            t = t - step
            if not np.any(np.abs(step) > 1e-16 * np.abs(t)):
                break
        x = np.copysign(t, v)
        x = np.where(np.abs(v) == 1.0, np.copysign(np.inf, v), x)
        x = np.where(np.abs(v) > 1.0, np.nan, x)
    return np.asarray(x).astype(dtype)
