"""np.fft, and the complex values it makes.

Rows: ``real``, ``imag``, ``conj`` and ``complex_abs`` (the four ops that
take a complex value apart: np.real, np.imag, np.conj and np.abs route
complex operands here), and the 1-D transforms ``fft``, ``ifft`` (complex
to complex), ``rfft`` (real to half spectrum) and ``irfft`` (half spectrum
to real) along one axis, with NumPy's ``norm``.  Every np.fft function is a
composition of them (n-D transforms are 1-D transforms in NumPy's order,
``n=``/``s=`` crop or zero-pad first, as NumPy does), so their gradients
come from these rows.

Complex cotangents follow JAX's convention: the cotangent ``g`` of a
complex value ``z`` is the one with ``dL = Re(g * dz)`` (no conjugate).
Holomorphic rows (add, mul, exp, matmul, sum...) then keep their real
rules unchanged, a linear map's vjp is its transpose (the DFT matrix is
symmetric: fft's vjp is fft), and a real input's cotangent is the real part
of its complex one (``unbroadcast`` takes it), so the gradient of a real
loss with respect to a real input is real and equals its finite
differences.

The native C and CUDA kernels have no complex type: complex values are
never fused into kernels (``passes.FUSIBLE_DTYPES``), and these rows have
only NumPy emitters, so every target calls NumPy for them.
"""
from __future__ import annotations

import math
import operator
import warnings

import numpy as np

from tracegrad.ops.primitives import Aval, bind, register, REGISTRY
from tracegrad.ops._define import implements, numpy_copy, _ops
from tracegrad.ops.base import (mul, div, where, equal, astype, shape_of, is_value,
                                zeros_like_value)
from tracegrad.ops.indexing import getitem
from tracegrad.ops.shape import concatenate, roll

__all__ = []   # NumPy's names only (np.fft.*): nothing for the tg namespace


def _real_dtype(dt):
    dt = np.dtype(dt)
    return np.finfo(dt).dtype if dt.kind == "c" else dt


def _complex_dtype(dt):
    """The complex dtype NumPy 2's np.fft computes in for an input dtype."""
    dt = np.dtype(dt)
    if dt.kind == "c":
        return dt
    if dt in (np.float32, np.float16):
        return np.dtype(np.complex64)
    if dt == np.longdouble and dt != np.float64:
        return np.dtype(np.clongdouble)
    return np.dtype(np.complex128)


def _float_dtype(dt):
    return _real_dtype(_complex_dtype(dt))


def _is_complex(x):
    return np.dtype(getattr(x, "dtype", np.float64)).kind == "c"


# --- complex values taken apart -------------------------------------------------------------
# JAX's convention (module docstring): dL = Re(g dz).  real: dL = g Re(dz) =
# Re(g dz), so the complex cotangent is g itself; imag: g Im(dz) =
# Re(-i g dz); conj: Re(g conj(dz)) = Re(conj(g) dz); |z|: d|z| =
# Re(conj(z) dz) / |z|.

def _batched(name, shift=False):
    """The batch (vmap) rule of a one-operand row: the row on the batched
    operand, its ``axis`` one further (these rows are not ``elementwise``
    rows, which C/CUDA kernels would fuse, and kernels have no complex type)."""
    def rule(vals, flags, B, **attrs):
        if not flags[0]:
            return NotImplemented
        if shift:
            attrs = dict(attrs, axis=attrs["axis"] + 1)
        return bind(REGISTRY[name], vals[0], **attrs)
    return rule


def _minus_i(g):
    return mul(g, np.array(-1j, dtype=_complex_dtype(g.dtype)))


real_p = register(
    "real", lambda xp, x: xp.real(x).copy(),
    shape=lambda x: Aval(x.shape, _real_dtype(x.dtype)),
    vjp=(lambda g, out, x: g,), jvp=(lambda t, out, x: bind(real_p, t),),
    numpy="np.real({0}).copy()", save_inputs=False, batch=_batched("real"))
imag_p = register(
    "imag", lambda xp, x: xp.imag(x).copy(),
    shape=lambda x: Aval(x.shape, _real_dtype(x.dtype)),
    vjp=(lambda g, out, x: _minus_i(g),), jvp=(lambda t, out, x: bind(imag_p, t),),
    numpy="np.imag({0}).copy()", save_inputs=False, batch=_batched("imag"))
conj_p = register(
    "conj", lambda xp, x: xp.conj(x),
    shape=lambda x: x,
    vjp=(lambda g, out, x: bind(conj_p, g),), jvp=(lambda t, out, x: bind(conj_p, t),),
    numpy="np.conj({0})", save_inputs=False, ufunc="np.conjugate", batch=_batched("conj"))


def _safe(out):
    """|z| where it is not 0, else 1: the derivative of |z| at 0 is taken as 0 (as torch)."""
    return where(equal(out, 0), 1.0, out)


complex_abs_p = register(
    "complex_abs", lambda xp, x: xp.abs(x),
    shape=lambda x: Aval(x.shape, _real_dtype(x.dtype)),
    vjp=(lambda g, out, x: mul(g, div(bind(conj_p, x), _safe(out))),),
    jvp=(lambda t, out, x: div(bind(real_p, mul(bind(conj_p, x), t)), _safe(out)),),
    numpy="np.abs({0})", save_out=True, ufunc="np.absolute", batch=_batched("complex_abs"))


def complex_real(x):
    return bind(real_p, x)


def complex_imag(x):
    return bind(imag_p, x)


def complex_conj(x):
    return bind(conj_p, x)


def complex_abs(x):
    return bind(complex_abs_p, x)


# --- the 1-D transforms -----------------------------------------------------------------------
# With s the norm's scale, fft is s F and ifft s conj(F) for the symmetric
# DFT matrix F: each is its own transpose, so its own vjp.  rfft is the
# first n//2+1 rows of s F on a real input: its vjp zero-pads the cotangent
# to n and takes the real part of the same fft.  irfft (the Hermitian
# extension of the half spectrum, transformed back) is x_k = s Re(sum_j c_j
# e^{2 pi i jk/n} X_j) with c_j 1 at j = 0 (and n/2), else 2: its vjp is
# conj(s c rfft(g)) (JAX's _irfft_transpose).

def _scale(norm, n, inverse):
    """The factor NumPy's norm puts on a forward (or inverse) transform of length n."""
    if norm == "ortho":
        return 1.0 / math.sqrt(n)
    if (norm == "forward") != inverse:
        return 1.0 / n
    return 1.0


def _c2c_shape(x, axis, norm):
    return Aval(x.shape, _complex_dtype(x.dtype))


fft_p = register(
    "fft", lambda xp, x, axis, norm: xp.fft.fft(x, axis=axis, norm=norm),
    shape=_c2c_shape,
    vjp=(lambda g, out, x, axis, norm: bind(fft_p, g, axis=axis, norm=norm),),
    jvp=(lambda t, out, x, axis, norm: bind(fft_p, t, axis=axis, norm=norm),),
    numpy="np.fft.fft({0}, axis={axis}, norm={norm})", save_inputs=False,
    batch=_batched("fft", shift=True))
ifft_p = register(
    "ifft", lambda xp, x, axis, norm: xp.fft.ifft(x, axis=axis, norm=norm),
    shape=_c2c_shape,
    vjp=(lambda g, out, x, axis, norm: bind(ifft_p, g, axis=axis, norm=norm),),
    jvp=(lambda t, out, x, axis, norm: bind(ifft_p, t, axis=axis, norm=norm),),
    numpy="np.fft.ifft({0}, axis={axis}, norm={norm})", save_inputs=False,
    batch=_batched("ifft", shift=True))


def _resize(x, axis, n):
    """x cropped or zero-padded to length n along axis (NumPy's n=/s=)."""
    have = shape_of(x)[axis]
    if n == have:
        return x
    if n < have:
        idx = [slice(None)] * len(shape_of(x))
        idx[axis] = slice(0, n)
        return getitem(x, tuple(idx))
    pad = list(shape_of(x))
    pad[axis] = n - have
    return concatenate([x, np.zeros(pad, dtype=x.dtype)], axis=axis)


def _rfft_vjp(g, out, x, axis, norm):
    n = shape_of(x)[axis]
    return complex_real(bind(fft_p, _resize(g, axis, n), axis=axis, norm=norm))


rfft_p = register(
    "rfft", lambda xp, x, axis, norm: xp.fft.rfft(x, axis=axis, norm=norm),
    shape=lambda x, axis, norm: Aval(
        tuple(d // 2 + 1 if i == axis % len(x.shape) else d for i, d in enumerate(x.shape)),
        _complex_dtype(x.dtype)),
    vjp=(_rfft_vjp,),
    jvp=(lambda t, out, x, axis, norm: bind(rfft_p, t, axis=axis, norm=norm),),
    numpy="np.fft.rfft({0}, axis={axis}, norm={norm})",
    batch=_batched("rfft", shift=True))


def _irfft_vjp(g, out, x, n, axis, norm):
    m = n // 2 + 1
    c = np.full(m, 2.0)
    c[0] = 1.0
    if n % 2 == 0:
        c[-1] = 1.0
    c *= _scale(norm, n, True)
    shape = [1] * len(shape_of(x))
    shape[axis] = m
    spectrum = bind(rfft_p, g, axis=axis, norm="backward")
    return complex_conj(mul(spectrum, c.astype(_float_dtype(g.dtype)).reshape(shape)))


irfft_p = register(
    "irfft", lambda xp, x, n, axis, norm: xp.fft.irfft(x, n=n, axis=axis, norm=norm),
    shape=lambda x, n, axis, norm: Aval(
        tuple(n if i == axis % len(x.shape) else d for i, d in enumerate(x.shape)),
        _float_dtype(x.dtype)),
    vjp=(_irfft_vjp,),
    jvp=(lambda t, out, x, n, axis, norm: bind(irfft_p, t, n=n, axis=axis, norm=norm),),
    numpy="np.fft.irfft({0}, n={n}, axis={axis}, norm={norm})", save_inputs=False,
    batch=_batched("irfft", shift=True))


# --- NumPy's np.fft -----------------------------------------------------------------------------

_NORMS = (None, "backward", "ortho", "forward")


def _check(name, norm, out):
    if out is not None:
        raise TypeError(f"np.fft.{name}(..., out=) cannot write into a tracegrad value; "
                        f"assign the result instead")
    if norm not in _NORMS:
        raise ValueError(f'Invalid norm value {norm}; should be "backward","ortho" or "forward".')
    return "backward" if norm is None else norm


def _swap(norm):
    return {"backward": "forward", "forward": "backward", "ortho": "ortho"}[norm]


def _operand(a):
    return a if is_value(a) else np.asarray(a)


def _axis(a, axis):
    axis = operator.index(axis)
    nd = len(shape_of(a))
    if not -nd <= axis < nd:
        raise np.exceptions.AxisError(axis, nd)
    return axis % nd


def _length(n, have):
    if isinstance(n, (bool, np.bool_)):
        raise TypeError("an integer is required")
    n = have if n is None else operator.index(n)
    if n < 1:
        raise ValueError(f"Invalid number of FFT data points ({n}) specified.")
    return n


def _as_complex(a):
    dt = _complex_dtype(a.dtype)
    return a if a.dtype == dt else astype(a, dt)


def _as_float(a):
    dt = _float_dtype(a.dtype)
    return a if a.dtype == dt else astype(a, dt)


def _c2c(a, n, axis, norm, inverse):
    axis = _axis(a, axis)
    n = _length(n, shape_of(a)[axis])
    a = _resize(_as_complex(a), axis, n)
    return bind(ifft_p if inverse else fft_p, a, axis=axis, norm=norm)


def _r2c(a, n, axis, norm):
    if _is_complex(a):
        raise TypeError("np.fft.rfft: the input must be real, got a complex array")
    axis = _axis(a, axis)
    n = _length(n, shape_of(a)[axis])
    return bind(rfft_p, _resize(_as_float(a), axis, n), axis=axis, norm=norm)


def _c2r(a, n, axis, norm):
    axis = _axis(a, axis)
    n = _length(n, 2 * (shape_of(a)[axis] - 1))
    a = _resize(_as_complex(a), axis, n // 2 + 1)
    return bind(irfft_p, a, n=n, axis=axis, norm=norm)


@implements(np.fft.fft)
def fft(a, n=None, axis=-1, norm=None, out=None):
    norm = _check("fft", norm, out)
    return _c2c(_operand(a), n, axis, norm, False)


@implements(np.fft.ifft)
def ifft(a, n=None, axis=-1, norm=None, out=None):
    norm = _check("ifft", norm, out)
    return _c2c(_operand(a), n, axis, norm, True)


@implements(np.fft.rfft)
def rfft(a, n=None, axis=-1, norm=None, out=None):
    norm = _check("rfft", norm, out)
    return _r2c(_operand(a), n, axis, norm)


@implements(np.fft.irfft)
def irfft(a, n=None, axis=-1, norm=None, out=None):
    norm = _check("irfft", norm, out)
    return _c2r(_operand(a), n, axis, norm)


@implements(np.fft.hfft)
def hfft(a, n=None, axis=-1, norm=None, out=None):
    """The FFT of a signal with Hermitian symmetry: irfft of conj(a), norm swapped."""
    norm = _check("hfft", norm, out)
    a = _as_complex(_operand(a))
    return _c2r(complex_conj(a), n, axis, _swap(norm))


@implements(np.fft.ihfft)
def ihfft(a, n=None, axis=-1, norm=None, out=None):
    norm = _check("ihfft", norm, out)
    return complex_conj(_r2c(_operand(a), n, axis, _swap(norm)))


def _cook(a, s, axes, invreal=False):
    """NumPy's _cook_nd_args: the lengths and axes of an n-D transform."""
    shape = shape_of(a)
    shapeless = s is None
    if s is None:
        s = list(shape) if axes is None else [shape[operator.index(ax)] for ax in axes]
    s = list(s)
    if axes is None:
        if not shapeless:
            warnings.warn("`axes` should not be `None` if `s` is not `None`. This behavior is "
                          "deprecated; pass axes explicitly (for example axes=range(len(s))).",
                          DeprecationWarning, stacklevel=4)
        axes = list(range(-len(s), 0))
    axes = [operator.index(ax) for ax in axes]
    if len(s) != len(axes):
        raise ValueError("Shape and axes have different lengths.")
    if invreal and shapeless:
        s[-1] = (shape[axes[-1]] - 1) * 2
    if None in s:
        warnings.warn("Passing an array containing `None` values to `s` is deprecated; use -1 "
                      "for the whole input along an axis.", DeprecationWarning, stacklevel=4)
    s = [shape[ax] if ln == -1 or ln is None else operator.index(ln) for ln, ax in zip(s, axes)]
    return s, axes


def _c2c_nd(name, a, s, axes, norm, out, inverse):
    norm = _check(name, norm, out)
    a = _operand(a)
    s, axes = _cook(a, s, axes)
    if not axes:   # NumPy returns the input itself for no axes
        return a
    for ii in reversed(range(len(axes))):
        a = _c2c(a, s[ii], axes[ii], norm, inverse)
    return a


@implements(np.fft.fftn)
def fftn(a, s=None, axes=None, norm=None, out=None):
    return _c2c_nd("fftn", a, s, axes, norm, out, False)


@implements(np.fft.ifftn)
def ifftn(a, s=None, axes=None, norm=None, out=None):
    return _c2c_nd("ifftn", a, s, axes, norm, out, True)


@implements(np.fft.fft2)
def fft2(a, s=None, axes=(-2, -1), norm=None, out=None):
    return _c2c_nd("fft2", a, s, axes, norm, out, False)


@implements(np.fft.ifft2)
def ifft2(a, s=None, axes=(-2, -1), norm=None, out=None):
    return _c2c_nd("ifft2", a, s, axes, norm, out, True)


def _rfftn(name, a, s, axes, norm, out):
    norm = _check(name, norm, out)
    a = _operand(a)
    s, axes = _cook(a, s, axes)
    if not axes:
        raise IndexError(f"np.fft.{name}: at least one axis must be given")
    a = _r2c(a, s[-1], axes[-1], norm)
    for ii in range(len(axes) - 2, -1, -1):
        a = _c2c(a, s[ii], axes[ii], norm, False)
    return a


def _irfftn(name, a, s, axes, norm, out):
    norm = _check(name, norm, out)
    a = _operand(a)
    s, axes = _cook(a, s, axes, invreal=True)
    if not axes:
        raise IndexError(f"np.fft.{name}: at least one axis must be given")
    for ii in range(len(axes) - 1):
        a = _c2c(a, s[ii], axes[ii], norm, True)
    return _c2r(a, s[-1], axes[-1], norm)


@implements(np.fft.rfftn)
def rfftn(a, s=None, axes=None, norm=None, out=None):
    return _rfftn("rfftn", a, s, axes, norm, out)


@implements(np.fft.irfftn)
def irfftn(a, s=None, axes=None, norm=None, out=None):
    return _irfftn("irfftn", a, s, axes, norm, out)


@implements(np.fft.rfft2)
def rfft2(a, s=None, axes=(-2, -1), norm=None, out=None):
    return _rfftn("rfft2", a, s, axes, norm, out)


@implements(np.fft.irfft2)
def irfft2(a, s=None, axes=(-2, -1), norm=None, out=None):
    return _irfftn("irfft2", a, s, axes, norm, out)


def _shifts(x, axes, sign):
    shape = shape_of(x)
    if axes is None:
        if not shape:
            raise ValueError("np.fft.fftshift/ifftshift of a 0-d array: it has no axis to "
                             "shift (NumPy raises too)")
        axes = tuple(range(len(shape)))
        shift = [sign * (d // 2) for d in shape]
    elif isinstance(axes, (int, np.integer)):
        shift = sign * (shape[axes] // 2)
    else:
        axes = tuple(axes)
        shift = [sign * (shape[ax] // 2) for ax in axes]
    return shift, axes


@implements(np.fft.fftshift)
def fftshift(x, axes=None):
    """The zero-frequency term moved to the centre: a roll by half of each axis."""
    shift, axes = _shifts(x, axes, 1)
    if axes == ():
        return numpy_copy(x)
    return roll(x, shift, axis=axes)


@implements(np.fft.ifftshift)
def ifftshift(x, axes=None):
    """fftshift undone."""
    shift, axes = _shifts(x, axes, -1)
    if axes == ():
        return numpy_copy(x)
    return roll(x, shift, axis=axes)


@implements(np.angle)
def angle(z, deg=False):
    """The argument of z: arctan2(imag, real), in degrees with deg=True."""
    z = _operand(z)
    if _is_complex(z):
        re, im = complex_real(z), complex_imag(z)
    else:
        re = _as_float(z) if is_value(z) else np.asarray(z, dtype=_float_dtype(z.dtype))
        im = np.zeros(shape_of(z), dtype=re.dtype)
    a = _ops.arctan2(im, re)
    return mul(a, 180.0 / np.pi) if deg else a


@implements(np.iscomplexobj)
def iscomplexobj(x):
    """Is x of a complex dtype (a Python bool: the dtype is static)?"""
    return _is_complex(x)


@implements(np.isrealobj)
def isrealobj(x):
    return not _is_complex(x)


@implements(np.iscomplex)
def iscomplex(x):
    """Elementwise: a nonzero imaginary part (no gradient)."""
    x = _operand(x)
    if not _is_complex(x):
        return _ops.equal(zeros_like_value(x), 1) if is_value(x) else np.zeros(np.shape(x), bool)
    return _ops.not_equal(complex_imag(x), 0)


@implements(np.isreal)
def isreal(x):
    """Elementwise: a zero imaginary part (no gradient)."""
    x = _operand(x)
    if not _is_complex(x):
        return _ops.equal(zeros_like_value(x), 0) if is_value(x) else np.ones(np.shape(x), bool)
    return _ops.equal(complex_imag(x), 0)
