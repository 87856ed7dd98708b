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

# helper -> the helpers it calls (the code generator copies those too)
HELPER_DEPS = {"_bessel_jy": ("_jn_small", "_jn_miller"), "_index_add": ("_flat_positions",),
               "_partition_positions": ("_unpermute_along",),
               "_invert_permutation": ("_unpermute_along",)}


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
    arrays): ``_flat_positions`` finds where each selected element lives.
    Real floating cotangents on NumPy are added by ``np.bincount`` (in
    float64, in the order of the positions, as ``np.add.at`` would; 2-4x
    faster than it)."""
    dtype = np.result_type(g)  # g may be a folded Python number
    if not any(isinstance(i, (list,)) or hasattr(i, "dtype") for i in idx):
        out = xp.zeros(shape, dtype)
        out[idx] = g  # basic indexing selects every position at most once
        return out
    size = 1
    for d in shape:
        size *= d
    pos = _flat_positions(shape, size, idx, xp)
    # (a broadcast view is read-only, and bincount copies read-only weights)
    weights = (xp.asarray(g) if getattr(g, "shape", ()) == pos.shape
               else xp.broadcast_to(g, pos.shape)).reshape(-1)
    # (in a CUDA driver the name np is CuPy: there add.at stays)
    if xp.__name__ == "numpy" and dtype.kind == "f" and dtype.itemsize <= 8:
        summed = np.bincount(pos.reshape(-1), weights=weights, minlength=size)
        return summed.astype(dtype, copy=False).reshape(shape)
    flat = xp.zeros(size, dtype)
    xp.add.at(flat, pos.reshape(-1), weights)
    return flat.reshape(shape)


def _flat_positions(shape, size, idx, xp=np):
    """The flat position in an array of ``shape`` of every element ``[idx]``
    selects, shaped as the selection.  Two common indexes are computed
    directly; any other gathers from an arange of the whole array."""
    def is_ints(i):
        return getattr(i, "dtype", None) is not None and i.dtype.kind in "iu"

    k = 0
    while k < len(idx) and isinstance(idx[k], slice) and idx[k] == slice(None):
        k += 1
    rest = idx[k:]
    if len(idx) == len(shape) and rest and all(is_ints(i) for i in rest):
        # x[i] of a vector, or x[:, :, i, j] (windows, im2col): the index
        # arrays give positions in the trailing dimensions (negatives
        # wrapped), added to each leading position's offset
        tail = tuple(shape[k:])
        # negative indices wrapped as indexing wraps them (the gather itself
        # refused any out of range, so a + d will do: an integer % costs
        # more than the rest), skipped where none is negative
        arrays = [a if not a.size or a.min() >= 0 else xp.where(a < 0, a + d, a)
                  for a, d in zip(rest, tail)]
        inner = xp.ravel_multi_index(tuple(arrays), tail) if len(tail) > 1 else arrays[0]
        lead = tuple(shape[:k])
        if not lead:
            return inner
        offsets = (xp.arange(math.prod(lead), dtype=inner.dtype) * math.prod(tail)).reshape(
            lead + (1,) * inner.ndim)
        return offsets + inner
    return xp.arange(size).reshape(shape)[idx]


def _invert_permutation(p, axis, xp=np):
    """The inverse of the permutations along ``axis``: ``inv[..., p[..., i]]
    = i``.  One scatter, where the argsort of ``p`` would sort."""
    steps = [1] * p.ndim
    steps[axis] = p.shape[axis]
    positions = xp.broadcast_to(xp.arange(p.shape[axis], dtype=p.dtype).reshape(steps), p.shape)
    return _unpermute_along(positions, p, axis, xp)


def _sorted_by(x, perm, axis, kind, xp=np):
    """x gathered along ``axis`` by ``perm`` (kind None).  With a sort kind,
    ``perm`` is an argsort of x of that kind and the result is
    ``np.sort(x, axis, kind=kind)``: x gathered by it.  NumPy's unstable sort and argsort may
    order equal elements differently, which only shows where equal values
    differ in their bits (-0.0 and 0.0, NaNs, complex parts); there the sort
    itself runs."""
    # (in a CUDA driver the name np is CuPy, which sorts stably: a gather)
    if kind is None or kind == "stable" or xp.__name__ != "numpy":
        return xp.take_along_axis(x, perm, axis=axis)
    if x.dtype.kind == "c":
        return xp.sort(x, axis=axis, kind=kind)
    out = xp.take_along_axis(x, perm, axis=axis)
    if out.dtype.kind != "f" or not out.size:
        return out
    # out is sorted along axis, NaN last: a NaN shows in the last place; in
    # one dimension a binary search finds the zeros
    if xp.isnan(xp.take(out, -1, axis=axis)).any():
        return xp.sort(x, axis=axis, kind=kind)
    if out.ndim == 1:
        i = xp.searchsorted(out, 0.0)
        zero = i < out.size and out[i] == 0
    else:
        zero = (out == 0).any()
    return xp.sort(x, axis=axis, kind=kind) if zero else out


def _unpermute_along(g, perm, axis, xp=np):
    """g put back where the permutations ``perm`` took it from along
    ``axis``: ``out[..., perm[..., i]] = g[..., i]`` (one scatter; the
    gradient of a gather by a permutation)."""
    if g.ndim == 1:
        out = xp.empty_like(g)
        out[perm] = g
        return out
    if g.size == 0:
        return xp.empty_like(g)
    q = xp.moveaxis(perm, axis, -1)
    rows = q.reshape(-1, q.shape[-1])
    out = xp.empty(rows.shape, g.dtype)
    out[xp.arange(rows.shape[0])[:, None], rows] = xp.moveaxis(g, axis, -1).reshape(rows.shape)
    return xp.moveaxis(out.reshape(q.shape), -1, axis)


def _partition_positions(x, out, kth, axis, xp=np):
    """Where each element of ``out = np.partition(x, kth, axis)`` came from:
    ``perm`` with ``take_along_axis(x, perm)`` equal to ``out`` (equal
    elements matched in order; any match is a valid gradient).  NumPy's
    argpartition arranges the elements otherwise than its partition from
    about 1,000 on; where it does, both are matched through stable sorts."""
    if xp.__name__ == "numpy":
        perm = xp.argpartition(x, kth, axis=axis)
        if xp.array_equal(xp.take_along_axis(x, perm, axis=axis), out, equal_nan=True):
            return perm
        sx = xp.argsort(x, axis=axis, kind="stable")
        so = xp.argsort(out, axis=axis, kind="stable")
    else:   # CuPy (the name np in a CUDA driver) sorts stably
        sx = xp.argsort(x, axis=axis)
        so = xp.argsort(out, axis=axis)
    return _unpermute_along(sx, so, axis, xp)


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


SHORTER_SLICE = "dynamic slice ["   # how the error below begins (copied into generated code)


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
        # (tracegrad.api knows this message: it runs the call again
        # specialised on the values of its integer arguments)
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
        out[low & (z == 1.0)] = -np.inf  # x == 0 (SciPy: -inf there, nan at -1, -2, ...)
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


# --- Bessel functions, incomplete gamma and beta (tracegrad.ops.special) ---

def _bessel_jy(x, n, kind):
    """Bessel functions of the first (kind "j") and second ("y") kind of
    integer order n, elementwise (float64 inside).  J: the power series for
    |x| < 2, Miller's backward recurrence where |x| <= n + 4 (relative
    accuracy where J_n is small), else the trapezoidal rule on Bessel's
    integral (exact to rounding: the integrand is periodic and analytic,
    with more points than the order the aliasing would reach).  Y (x > 0):
    Neumann's series in the J_k (those from one FFT of exp(i x sin t),
    the Jacobi-Anger expansion) for Y0 and Y1, then the forward recurrence."""
    x = np.asarray(x)
    dtype = x.dtype if x.dtype.kind == "f" else np.dtype(np.float64)
    n = int(n)
    sign = 1.0
    if n < 0:
        n = -n
        sign = -1.0 if n % 2 else 1.0

    def j(v):
        s = -1.0 if (v < 0 and n % 2) else 1.0
        v = abs(v)
        if v != v:
            return math.nan
        if math.isinf(v):
            return 0.0
        if v == 0.0:
            return 1.0 if n == 0 else 0.0
        if v < 2.0:
            return s * _jn_small(v, n)
        if v <= n + 4.0:
            return s * _jn_miller(v, n)
        m = n + int(v + 12.0 * v ** (1 / 3)) + 64
        tau = np.arange(m) * (2.0 * math.pi / m)
        return s * math.fsum(np.cos(n * tau - v * np.sin(tau))) / m

    gamma_e = 0.5772156649015329  # Euler's constant

    def y(v):
        if v != v or v < 0:
            return math.nan
        if v == 0.0:
            return -math.inf
        if math.isinf(v):
            return 0.0
        kmax = int(v + 12.0 * v ** (1 / 3)) + 48
        m = 2 * (kmax + int(v + 12.0 * v ** (1 / 3)) + 48)
        tau = np.arange(m) * (2.0 * math.pi / m)
        jk = (np.fft.fft(np.exp(1j * v * np.sin(tau))) / m).real[:2 * kmax + 2]
        lg = math.log(0.5 * v) + gamma_e
        ks = np.arange(1, kmax)
        alt = np.where(ks % 2, -1.0, 1.0)
        # Neumann's series: Y0 = 2/pi ((ln(x/2) + gamma) J0 - 2 sum (-1)^k J_2k / k);
        # Y1 = -Y0' (with J0' = -J1, J_m' = (J_{m-1} - J_{m+1}) / 2)
        y0 = 2 / math.pi * (lg * jk[0] - 2 * math.fsum(alt * jk[2 * ks] / ks))
        y1 = -2 / math.pi * (jk[0] / v - lg * jk[1]
                             - math.fsum(alt * (jk[2 * ks - 1] - jk[2 * ks + 1]) / ks))
        if n == 0:
            return y0
        for k in range(1, n):   # forward recurrence (stable for Y)
            y0, y1 = y1, 2.0 * k / v * y1 - y0
        return y1
    return np.vectorize(j if kind == "j" else y, otypes=[np.float64])(x).astype(dtype) * sign


def _jn_small(v, n):
    """J_n(v) for small v > 0 by its power series (summed exactly)."""
    h = 0.25 * v * v
    t = math.exp(n * math.log(0.5 * v) - math.lgamma(n + 1))
    terms = [t]
    k = 0
    while abs(t) > 1e-18 * abs(terms[0]) or k < 2:
        k += 1
        t = -t * h / (k * (n + k))
        terms.append(t)
    return math.fsum(terms)


def _jn_miller(v, n):
    """J_n(v) by Miller's backward recurrence, normalised by
    J_0 + 2 (J_2 + J_4 + ...) = 1 (relative accuracy where J_n is small)."""
    big = int(n + v + 12.0 * v ** (1 / 3)) + 40
    big += big % 2
    nxt, cur = 0.0, 1e-300
    norm = 0.0
    want = 0.0
    for k in range(big, 0, -1):
        prev = 2.0 * k / v * cur - nxt
        nxt, cur = cur, prev
        if k - 1 == n:
            want = cur
        if (k - 1) % 2 == 0 and k - 1 > 0:
            norm += 2.0 * cur
        if abs(cur) > 1e250:
            nxt *= 1e-250
            cur *= 1e-250
            want *= 1e-250
            norm *= 1e-250
    norm += cur  # J_0
    return want / norm


def _bessel_ive(x, v):
    """exp(-|x|) I_v(x), the exponentially scaled modified Bessel function of
    real order v >= 0 (negative x: integer v only), elementwise: the power
    series summed in log space (x <= 50 or v large), else Hankel's
    asymptotic series."""
    x = np.asarray(x)
    dtype = x.dtype if x.dtype.kind == "f" else np.dtype(np.float64)
    v = float(v)
    integer = v == int(v)
    if v < 0 and integer:
        v = -v                      # I_{-n} = I_n

    def one(z):
        if z != z or v < 0:
            return math.nan         # negative non-integer order: not supported
        s = 1.0
        if z < 0:
            if not integer:
                return math.nan
            z = -z
            s = -1.0 if int(v) % 2 else 1.0
        if math.isinf(z):
            return 0.0
        if z == 0.0:
            return 1.0 if v == 0 else 0.0
        if z > 50.0 and z > v * v:
            mu = 4.0 * v * v
            t, terms, k = 1.0, [1.0], 0
            while True:
                k += 1
                t_new = -t * (mu - (2 * k - 1) ** 2) / (k * 8.0 * z)
                if abs(t_new) >= abs(t) or abs(t_new) < 1e-17:
                    if abs(t_new) < abs(t):
                        terms.append(t_new)
                    break
                t = t_new
                terms.append(t)
            return s * math.fsum(terms) / math.sqrt(2.0 * math.pi * z)
        big = int(z / 2 + 12.0 * math.sqrt(z) + 40)
        k = np.arange(big, dtype=np.float64)
        lz = math.log(0.5 * z)
        lt = ((2 * k + v) * lz - np.array([math.lgamma(i + 1) for i in range(big)])
              - np.array([math.lgamma(i + v + 1) for i in range(big)]) - z)
        m = float(lt.max())
        return s * math.exp(m) * math.fsum(np.exp(lt - m))
    return np.vectorize(one, otypes=[np.float64])(x).astype(dtype)


def _gammainc(a, x, upper=False):
    """The regularized incomplete gamma function P(a, x) (upper: Q = 1 - P),
    elementwise: its series where x < a + 1, else Legendre's continued
    fraction (modified Lentz), each giving the smaller of P and Q directly."""
    a, x = np.broadcast_arrays(np.asarray(a), np.asarray(x))
    dtype = np.result_type(a.dtype, x.dtype, np.float32) if a.dtype.kind == "f" or \
        x.dtype.kind == "f" else np.dtype(np.float64)
    tiny = 1e-300

    def one(a, x):
        if a != a or x != x or a < 0 or x < 0:
            return math.nan
        if a == 0:
            return (0.0 if x > 0 else math.nan) if upper else (1.0 if x > 0 else math.nan)
        if x == 0:
            return 1.0 if upper else 0.0
        if math.isinf(x):
            return 0.0 if upper else 1.0
        lead = -x + a * math.log(x) - math.lgamma(a)
        if x < a + 1.0:
            ap, d = a, 1.0 / a
            terms = [d]
            for _ in range(100000):
                ap += 1.0
                d *= x / ap
                terms.append(d)
                if d < 1e-17 * terms[0]:
                    break
            p = math.fsum(terms) * math.exp(lead)
            return 1.0 - p if upper else p
        b = x + 1.0 - a
        c = 1.0 / tiny
        d = 1.0 / b
        h = d
        for i in range(1, 100000):
            an = -i * (i - a)
            b += 2.0
            d = an * d + b
            d = tiny if abs(d) < tiny else d
            c = b + an / c
            c = tiny if abs(c) < tiny else c
            d = 1.0 / d
            step = d * c
            h *= step
            if abs(step - 1.0) < 1e-16:
                break
        q = math.exp(lead) * h
        return q if upper else 1.0 - q
    return np.vectorize(one, otypes=[np.float64])(a, x).astype(dtype)


def _betainc(a, b, x):
    """The regularized incomplete beta function I_x(a, b), elementwise: the
    continued fraction (modified Lentz) on the side where it converges
    fast, I_x(a, b) = 1 - I_{1-x}(b, a) on the other."""
    a, b, x = np.broadcast_arrays(np.asarray(a), np.asarray(b), np.asarray(x))
    dtype = np.result_type(a.dtype, b.dtype, x.dtype, np.float32) \
        if "f" in (a.dtype.kind, b.dtype.kind, x.dtype.kind) else np.dtype(np.float64)
    tiny = 1e-300

    def cf(a, b, x):
        qab, qap, qam = a + b, a + 1.0, a - 1.0
        c = 1.0
        d = 1.0 - qab * x / qap
        d = 1.0 / (tiny if abs(d) < tiny else d)
        h = d
        for m in range(1, 100000):
            m2 = 2 * m
            aa = m * (b - m) * x / ((qam + m2) * (a + m2))
            d = 1.0 + aa * d
            d = 1.0 / (tiny if abs(d) < tiny else d)
            c = 1.0 + aa / c
            c = tiny if abs(c) < tiny else c
            h *= d * c
            aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
            d = 1.0 + aa * d
            d = 1.0 / (tiny if abs(d) < tiny else d)
            c = 1.0 + aa / c
            c = tiny if abs(c) < tiny else c
            step = d * c
            h *= step
            if abs(step - 1.0) < 1e-16:
                break
        return h

    def one(a, b, x):
        if a != a or b != b or x != x or a <= 0 or b <= 0 or x < 0 or x > 1:
            return math.nan
        if x == 0 or x == 1:
            return float(x)
        lead = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x)
                + b * math.log1p(-x))
        if x < (a + 1.0) / (a + b + 2.0):
            return math.exp(lead) * cf(a, b, x) / a
        return 1.0 - math.exp(lead) * cf(b, a, 1.0 - x) / b
    return np.vectorize(one, otypes=[np.float64])(a, b, x).astype(dtype)


# --- tg.fixed_point (tracegrad.ops.control) ---

def _fixed_point_result(err, k, tol, max_iter, *xs):
    """The fixed point ``xs`` an iteration reached, or the error saying it
    did not converge: ``err`` is the last iteration's largest change
    |x_new - x| / (1 + |x_new|), ``k`` the iterations run."""
    e = float(err)
    if not math.isfinite(e):
        n = int(k)
        raise RuntimeError(
            f"tg.fixed_point: the iteration diverged: x is not finite (NaN or inf) after {n} "
            f"iteration{'s' if n != 1 else ''}; start closer to the fixed point, or check "
            f"that f is a contraction there")
    if not e <= tol:
        raise RuntimeError(
            f"tg.fixed_point: no convergence within max_iter={max_iter} iterations: the last "
            f"iteration still changed x by {e:.3g} (relative), more than tol={tol:g}; raise "
            f"max_iter, loosen tol, start closer to the fixed point, or check that f is a "
            f"contraction there")
    return xs


def _tape_new(every, cap):
    """The tape of a while loop's reverse mode that keeps some carries only:
    every ``every``-th (every > 0), or with a spacing that doubles whenever
    more than ``cap`` carries (cap 0: twice the spacing, about 2 sqrt(steps))
    are kept.  ``_while_steps`` replays the steps between them."""
    return {"every": max(every, 1), "fixed": every > 0, "cap": cap, "n": 0, "marks": []}


def _tape_add(tape, carry):
    """Record the carry a step starts from (kept when the step is a multiple
    of the spacing)."""
    every = tape["every"]
    if tape["n"] % every == 0:
        marks = tape["marks"]
        marks.append(carry)
        if not tape["fixed"] and len(marks) > (tape["cap"] or 2 * every):
            tape["every"] = 2 * every        # keep the multiples of the new spacing
            tape["marks"] = marks[::2]
    tape["n"] += 1


def _while_steps(tape, body, consts):
    """The carries a while loop's steps started from, last first: the
    tape's list, or the steps between its kept carries run again with
    ``body(*carry, *consts)``, one segment at a time."""
    if isinstance(tape, np.ndarray):
        tape = tape[()]
    if isinstance(tape, list):
        yield from reversed(tape)
        return
    every, n, marks = tape["every"], tape["n"], tape["marks"]
    for j in range(len(marks) - 1, -1, -1):
        seg = [marks[j]]
        for _ in range(min(every, n - j * every) - 1):
            seg.append(tuple(body(*seg[-1], *consts)))
        yield from reversed(seg)


# This file's text as it was imported: code generation pastes a helper's
# source from it (helper_source), so an edit or an upgrade of the file on
# disk while a process runs cannot paste other lines than the code this
# process runs (and store a broken module in the disk cache).
try:
    with open(__file__, encoding="utf-8") as _f:
        _SOURCE_LINES = _f.read().splitlines(keepends=True)
except OSError:     # no source file beside the code: inspect's search is all there is
    _SOURCE_LINES = None


def helper_source(name):
    """The source of helper ``name`` as this process imported it."""
    import inspect
    fn = globals()[name]
    if _SOURCE_LINES is None or fn.__code__.co_filename != __file__:   # defined elsewhere
        return inspect.getsource(fn)
    return "".join(inspect.getblock(_SOURCE_LINES[fn.__code__.co_firstlineno - 1:]))
