"""``scipy.signal`` (convolutions and linear filters), ``scipy.fft`` and
``scipy.integrate``'s sample-based rules on tracegrad values, with SciPy's
signatures: the one implementation behind ``tracegrad.scipy.signal`` /
``.fft`` / ``.integrate`` and behind SciPy's own functions called on traced
or recorded values.  All are compositions of existing rows:

* convolve / correlate / fftconvolve / oaconvolve: a direct sum of shifted
  products (exact, and its gradient is the correlation with the other operand);
* lfilter / sosfilt: the filter as a banded lower-triangular system, ``y =
  T_a^-1 (T_b x)`` with Toeplitz matrices of the coefficients (differentiable in
  b, a and x; memory N^2 for N samples);
* scipy.fft: NumPy's FFT rows (``tracegrad/ops/fft.py``);
* trapezoid / cumulative_trapezoid / simpson: SciPy's formulas.
"""
from __future__ import annotations

import itertools

import numpy as np

from tracegrad.ops import fft as _fft
from tracegrad.ops._define import _ops as _o
from tracegrad.ops.base import is_value

__all__ = []   # reached through tracegrad.scipy.signal / fft / integrate


def _f(x):
    if is_value(x):
        return x if np.dtype(x.dtype).kind in "fc" else _o.astype(x, np.float64)
    x = np.asarray(x)
    return x if x.dtype.kind in "fc" else x.astype(np.float64)


def _shape(x):
    return tuple(_o.shape_of(x)) if is_value(x) else np.shape(x)


def _refuse(name, what):
    raise NotImplementedError(f"{name}({what}) is not supported on tracegrad values; call it "
                              f"without it (or on plain arrays, outside the differentiated code)")


# --- convolution ----------------------------------------------------------------------------

def _full_convolve(a, b):
    """The full N-d convolution, as a sum over b's elements of a shifted copy of a."""
    sa, sb = _shape(a), _shape(b)
    if len(sa) != len(sb):
        raise ValueError("scipy.signal.convolve: in1 and in2 should have the same "
                         "dimensionality")
    if min(np.prod(sa, dtype=int), np.prod(sb, dtype=int)) == 0:
        raise ValueError("scipy.signal.convolve: in1 and in2 must be non-empty")
    if np.prod(sb) > np.prod(sa):      # loop over the smaller operand
        a, b, sa, sb = b, a, sb, sa
    full = tuple(m + n - 1 for m, n in zip(sa, sb))
    out = None
    for k in itertools.product(*[range(n) for n in sb]):
        pad = [(k[d], full[d] - sa[d] - k[d]) for d in range(len(sa))]
        term = _o.multiply(_o.pad(a, pad), b[k])
        out = term if out is None else _o.add(out, term)
    return out


def _centered(x, shape):
    start = [(n - m) // 2 for n, m in zip(_shape(x), shape)]
    return x[tuple(slice(s, s + m) for s, m in zip(start, shape))]


def _swap_for_valid(sa, sb):
    ok1 = all(m >= n for m, n in zip(sa, sb))
    ok2 = all(n >= m for m, n in zip(sa, sb))
    if not (ok1 or ok2):
        raise ValueError("For 'valid' mode, one must be at least as large as the other in "
                         "every dimension")
    return not ok1


def convolve(in1, in2, mode="full", method="auto"):
    """scipy.signal.convolve (every ``method`` gives the same numbers here: a direct sum)."""
    a, b = _f(in1), _f(in2)
    sa, sb = _shape(a), _shape(b)
    if not sa and not sb:
        return _o.multiply(a, b)
    full = _full_convolve(a, b)
    if mode == "full":
        return full
    if mode == "same":
        return _centered(full, sa)
    if mode == "valid":
        big = sb if _swap_for_valid(sa, sb) else sa
        small = sa if big is sb else sb
        return _centered(full, tuple(m - n + 1 for m, n in zip(big, small)))
    raise ValueError("acceptable mode flags are 'valid', 'same', or 'full'")


def correlate(in1, in2, mode="full", method="auto"):
    """scipy.signal.correlate: the convolution with in2 reversed (and conjugated)."""
    a, b = _f(in1), _f(in2)
    sa, sb = _shape(a), _shape(b)
    if mode == "valid" and _swap_for_valid(sa, sb):
        r = correlate(b, a, "valid")
        r = r[(slice(None, None, -1),) * len(sb)]
        return _o.conj(r) if np.dtype(r.dtype).kind == "c" else r
    rev = b[(slice(None, None, -1),) * len(sb)] if sb else b
    if np.dtype(rev.dtype).kind == "c":
        rev = _o.conj(rev)
    return convolve(a, rev, mode)


def fftconvolve(in1, in2, mode="full", axes=None):
    if axes is not None:
        _refuse("scipy.signal.fftconvolve", "axes=")
    return convolve(in1, in2, mode)


def oaconvolve(in1, in2, mode="full", axes=None):
    if axes is not None:
        _refuse("scipy.signal.oaconvolve", "axes=")
    return convolve(in1, in2, mode)


def _lower_toeplitz(c, n):
    """The n x n lower-triangular Toeplitz matrix with first column c (zero-padded)."""
    k = _shape(c)[0]
    if k < n:
        c = _o.concatenate([c, np.zeros(n - k, np.dtype(c.dtype))], axis=0)
    idx = np.arange(n)[:, None] - np.arange(n)[None, :]
    vals = _o.concatenate([np.zeros(1, np.dtype(c.dtype)), c[:n]], axis=0) \
        if is_value(c) else np.concatenate([np.zeros(1, c.dtype), c[:n]])
    return vals[np.where(idx >= 0, idx + 1, 0)]


def lfilter(b, a, x, axis=-1, zi=None):
    """scipy.signal.lfilter: y[n] = (sum_k b[k] x[n-k] - sum_{k>=1} a[k] y[n-k]) / a[0]."""
    if zi is not None:
        _refuse("scipy.signal.lfilter", "zi=")
    b, a, x = _f(b), _f(a), _f(x)
    if len(_shape(b)) != 1 or len(_shape(a)) != 1:
        raise ValueError("scipy.signal.lfilter: b and a must be 1-d")
    nd = len(_shape(x))
    if nd == 0:
        raise ValueError("scipy.signal.lfilter: x must be at least 1-d")
    xs = _o.moveaxis(x, axis, -1)
    n = _shape(xs)[-1]
    a0 = a[0]
    tb = _lower_toeplitz(_o.divide(b, a0), n)
    ta = _lower_toeplitz(_o.divide(a, a0), n)
    rhs = _o.matmul(xs, _o.swapaxes(tb, -1, -2))          # (..., n): T_b x per row
    y = _o.swapaxes(_o.linalg.solve(ta, _o.swapaxes(_o.reshape(rhs, (-1, n)), 0, 1)), 0, 1)
    y = _o.reshape(y, _shape(xs))
    return _o.moveaxis(y, -1, axis)


def sosfilt(sos, x, axis=-1, zi=None):
    """scipy.signal.sosfilt: the second-order sections in turn (rows [b0 b1 b2 a0 a1 a2])."""
    if zi is not None:
        _refuse("scipy.signal.sosfilt", "zi=")
    sos = _f(sos)
    s = _shape(sos)
    if len(s) != 2 or s[1] != 6:
        raise ValueError("scipy.signal.sosfilt: sos array must be shape (n_sections, 6)")
    y = _f(x)
    for i in range(s[0]):
        y = lfilter(sos[i, :3], sos[i, 3:], y, axis=axis)
    return y


SIGNAL = {n: globals()[n] for n in ("convolve", "correlate", "fftconvolve", "oaconvolve",
                                    "lfilter", "sosfilt")}


# --- scipy.fft ------------------------------------------------------------------------------

def _fft_wrap(name):
    base = getattr(_fft, name)

    def f(x, *args, workers=None, overwrite_x=False, plan=None, **kwargs):
        if plan is not None:
            _refuse(f"scipy.fft.{name}", "plan=")
        return base(x, *args, **kwargs)
    f.__name__ = f.__qualname__ = name
    f.__doc__ = f"scipy.fft.{name}: np.fft.{name}'s rows (workers/overwrite_x do not change it)"
    return f


FFT = {n: _fft_wrap(n) for n in ("fft", "ifft", "rfft", "irfft", "hfft", "ihfft", "fftn",
                                  "ifftn", "fft2", "ifft2", "rfftn", "irfftn", "rfft2",
                                  "irfft2") if hasattr(_fft, n)}
for _n in ("fftshift", "ifftshift"):
    FFT[_n] = getattr(_o, _n, None) or getattr(_fft, _n)


# --- scipy.integrate (samples) ---------------------------------------------------------------

def _along(y, x, axis):
    """y with the integration axis last, and x (None, 1-d or y's shape) alike."""
    y = _o.moveaxis(_f(y), axis, -1)
    if x is not None:
        x = _f(x)
        x = _o.moveaxis(x, axis, -1) if len(_shape(x)) > 1 else x
    return y, x


def trapezoid(y, x=None, dx=1.0, axis=-1):
    y, x = _along(y, x, axis)
    d = dx if x is None else _o.diff(x, axis=-1)
    return _o.multiply(_o.sum(_o.multiply(d, _o.add(y[..., 1:], y[..., :-1])), axis=-1), 0.5)


def cumulative_trapezoid(y, x=None, dx=1.0, axis=-1, initial=None):
    y, x = _along(y, x, axis)
    d = dx if x is None else _o.diff(x, axis=-1)
    res = _o.cumsum(_o.multiply(_o.multiply(d, _o.add(y[..., 1:], y[..., :-1])), 0.5), axis=-1)
    if initial is not None:
        if initial != 0:
            raise ValueError("`initial` must be `None` or `0`.")
        res = _o.concatenate([_o.multiply(res[..., :1], 0.0), res], axis=-1)
    return _o.moveaxis(res, -1, axis)


def _basic_simpson(y, stop, x, dx):
    y0, y1, y2 = y[..., 0:stop:2], y[..., 1:stop + 1:2], y[..., 2:stop + 2:2]
    if x is None:
        return _o.multiply(_o.sum(_o.add(_o.add(y0, _o.multiply(y1, 4.0)), y2), axis=-1),
                           dx / 3.0)
    h = _o.diff(x, axis=-1)
    h0, h1 = h[..., 0:stop:2], h[..., 1:stop + 1:2]
    hsum, hprod = _o.add(h0, h1), _o.multiply(h0, h1)
    r = _o.divide(h0, h1)
    t = _o.add(_o.add(_o.multiply(y0, _o.sub(2.0, _o.divide(1.0, r))),
                      _o.multiply(y1, _o.divide(_o.multiply(hsum, hsum), hprod))),
               _o.multiply(y2, _o.sub(2.0, r)))
    return _o.sum(_o.multiply(_o.divide(hsum, 6.0), t), axis=-1)


def simpson(y, x=None, *, dx=1.0, axis=-1):
    """scipy.integrate.simpson (Cartwright's correction for the last interval
    when the number of samples is even, as SciPy)."""
    y, x = _along(y, x, axis)
    n = _shape(y)[-1]
    if n % 2:
        return _basic_simpson(y, n - 2, x, dx)
    if n == 2:
        d = dx if x is None else _o.sub(x[..., -1], x[..., -2])
        return _o.multiply(_o.multiply(d, 0.5), _o.add(y[..., -1], y[..., -2]))
    res = _basic_simpson(y, n - 3, x, dx)
    if x is None:
        h0 = h1 = float(dx)
    else:
        h = _o.diff(x, axis=-1)
        h0, h1 = h[..., -2], h[..., -1]
    alpha = _o.divide(_o.add(_o.multiply(_o.multiply(h1, h1), 2.0),
                             _o.multiply(_o.multiply(h0, h1), 3.0)),
                      _o.multiply(_o.add(h1, h0), 6.0))
    beta = _o.divide(_o.add(_o.multiply(h1, h1), _o.multiply(_o.multiply(h0, h1), 3.0)),
                     _o.multiply(h0, 6.0))
    eta = _o.divide(_o.multiply(_o.multiply(h1, h1), h1),
                    _o.multiply(_o.multiply(h0, _o.add(h0, h1)), 6.0))
    return _o.add(res, _o.sub(_o.add(_o.multiply(alpha, y[..., -1]),
                                     _o.multiply(beta, y[..., -2])),
                              _o.multiply(eta, y[..., -3])))


INTEGRATE = {n: globals()[n] for n in ("trapezoid", "cumulative_trapezoid", "simpson")}
