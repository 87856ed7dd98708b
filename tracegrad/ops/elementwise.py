"""Elementwise primitives: one row each, defined by their partial derivatives.

``def_elementwise`` derives both the vjp (``g * d``) and the jvp (``t * d``)
from one partial derivative per input, so the two modes cannot disagree.
Piecewise-constant ops (floor, sign, ...) pass a zero gradient through
instead of failing.  Comparisons and predicates are ``nondiff``.
"""
from __future__ import annotations

import math

import numpy as np

from tracegrad.ops import runtime_numpy as _rt
from tracegrad.ops.primitives import Aval, bind, register, REGISTRY
from tracegrad.ops._define import method, implements, numpy_copy
from tracegrad.ops.base import (def_elementwise, zeros_rule, add, sub, mul, div, neg,
                                reciprocal, exp, where, equal, greater, less,
                                greater_equal, less_equal, logical_and, logical_or,
                                zeros_like_value)

__all__ = [
    "abs", "absolute", "sign", "sqrt", "square", "rsqrt", "exp2", "expm1", "log1p", "log2",
    "log10", "sin", "cos", "tan", "arcsin", "arccos", "arctan", "sinh", "cosh", "arcsinh",
    "arccosh", "arctanh", "asin", "acos", "atan", "asinh", "acosh", "atanh", "sigmoid", "relu",
    "softplus", "erf", "sinc", "deg2rad", "rad2deg", "radians", "degrees", "floor", "ceil",
    "rint", "trunc", "fix", "round", "around", "isnan", "isinf", "isfinite", "nan_to_num",
    "maximum", "minimum", "fmax", "fmin", "arctan2", "atan2", "hypot", "logaddexp",
    "logaddexp2", "floor_divide", "remainder", "mod", "fmod", "clip", "clamp", "conj",
    "conjugate", "real", "imag",
]

_LN2 = math.log(2.0)
_LN10 = math.log(10.0)


def _no_kw(name, kw):
    """NumPy ufuncs accept out=, where=, casting=...; we support none of them."""
    bad = {k: v for k, v in kw.items() if v is not None}
    if bad:
        raise TypeError(f"{name}: unsupported keyword argument(s) {sorted(bad)} for a "
                        f"tracegrad value; compute the result and assign it instead")


def _op1(prim, methods=(), np_funcs=(), name=None):
    """The public function of a unary primitive, attached as methods and
    NumPy overrides."""
    def op(x, **kw):
        _no_kw(op.__name__, kw)
        return bind(prim, x)
    op.__name__ = name or prim.name
    op.__doc__ = f"Elementwise {prim.name} (primitive ``{prim.name}``)."
    if methods:
        method(*methods)(op)
    implements(*np_funcs)(op)
    return op


def _op2(prim, methods=(), np_funcs=(), name=None):
    def op(x, y, **kw):
        _no_kw(op.__name__, kw)
        return bind(prim, x, y)
    op.__name__ = name or prim.name
    op.__doc__ = f"Elementwise {prim.name} of two broadcast operands (primitive ``{prim.name}``)."
    if methods:
        method(*methods)(op)
    implements(*np_funcs)(op)
    return op


def _unary(name, impl, partial, numpy, cuda, **kw):
    return def_elementwise(name, impl, (partial,), numpy, cuda, **kw)


def _piecewise_constant(name, impl, numpy, cuda, **kw):
    """Flat almost everywhere: the gradient is zero (not an error)."""
    return def_elementwise(name, impl, (None,), numpy, cuda, save_inputs=False,
                           vjp=(zeros_rule,), jvp=(zeros_rule,), **kw)


# --- unary rows ---------------------------------------------------------------------
# partial(out, x) -> d out / d x

abs_p = _unary("abs", lambda xp, x: xp.abs(x), lambda out, x: sign(x),
               "np.abs({0})", "fabs({0})", ufunc="np.absolute")
sign_p = _piecewise_constant("sign", lambda xp, x: xp.sign(x), "np.sign({0})",
                             "(isnan({0}) ? {0} : (({0} > 0) - ({0} < 0)))")
sqrt_p = _unary("sqrt", lambda xp, x: xp.sqrt(x), lambda out, x: div(0.5, out),
                "np.sqrt({0})", "sqrt({0})", save_out=True, save_inputs=False)
square_p = _unary("square", lambda xp, x: xp.square(x), lambda out, x: mul(x, 2.0),
                  "np.square({0})", "({0} * {0})")
rsqrt_p = _unary("rsqrt", lambda xp, x: 1 / xp.sqrt(x),
                 lambda out, x: mul(mul(out, mul(out, out)), -0.5),
                 "(1 / np.sqrt({0}))", "rsqrt({0})", save_out=True, save_inputs=False)
exp2_p = _unary("exp2", lambda xp, x: xp.exp2(x), lambda out, x: mul(out, _LN2),
                "np.exp2({0})", "exp2({0})", save_out=True, save_inputs=False)
expm1_p = _unary("expm1", lambda xp, x: xp.expm1(x), lambda out, x: add(out, 1.0),
                 "np.expm1({0})", "expm1({0})", save_out=True, save_inputs=False)
log1p_p = _unary("log1p", lambda xp, x: xp.log1p(x), lambda out, x: reciprocal(add(x, 1.0)),
                 "np.log1p({0})", "log1p({0})")
log2_p = _unary("log2", lambda xp, x: xp.log2(x), lambda out, x: reciprocal(mul(x, _LN2)),
                "np.log2({0})", "log2({0})")
log10_p = _unary("log10", lambda xp, x: xp.log10(x), lambda out, x: reciprocal(mul(x, _LN10)),
                 "np.log10({0})", "log10({0})")
sin_p = _unary("sin", lambda xp, x: xp.sin(x), lambda out, x: cos(x), "np.sin({0})", "sin({0})")
cos_p = _unary("cos", lambda xp, x: xp.cos(x), lambda out, x: neg(sin(x)),
               "np.cos({0})", "cos({0})")
tan_p = _unary("tan", lambda xp, x: xp.tan(x), lambda out, x: add(square(out), 1.0),
               "np.tan({0})", "tan({0})", save_out=True, save_inputs=False)
arcsin_p = _unary("arcsin", lambda xp, x: xp.arcsin(x),
                  lambda out, x: rsqrt(sub(1.0, square(x))), "np.arcsin({0})", "asin({0})")
arccos_p = _unary("arccos", lambda xp, x: xp.arccos(x),
                  lambda out, x: neg(rsqrt(sub(1.0, square(x)))), "np.arccos({0})", "acos({0})")
arctan_p = _unary("arctan", lambda xp, x: xp.arctan(x),
                  lambda out, x: reciprocal(add(square(x), 1.0)), "np.arctan({0})", "atan({0})")
sinh_p = _unary("sinh", lambda xp, x: xp.sinh(x), lambda out, x: cosh(x),
                "np.sinh({0})", "sinh({0})")
cosh_p = _unary("cosh", lambda xp, x: xp.cosh(x), lambda out, x: sinh(x),
                "np.cosh({0})", "cosh({0})")
arcsinh_p = _unary("arcsinh", lambda xp, x: xp.arcsinh(x),
                   lambda out, x: rsqrt(add(square(x), 1.0)), "np.arcsinh({0})", "asinh({0})")
arccosh_p = _unary("arccosh", lambda xp, x: xp.arccosh(x),
                   lambda out, x: rsqrt(sub(square(x), 1.0)), "np.arccosh({0})", "acosh({0})")
arctanh_p = _unary("arctanh", lambda xp, x: xp.arctanh(x),
                   lambda out, x: reciprocal(sub(1.0, square(x))), "np.arctanh({0})",
                   "atanh({0})")
# sigmoid = exp(-log(1 + exp(-x))): no overflow for either sign of x.
sigmoid_p = _unary("sigmoid", lambda xp, x: xp.exp(-xp.logaddexp(0, -x)),
                   lambda out, x: mul(out, sub(1.0, out)),
                   "np.exp(-np.logaddexp(0, -{0}))", "(1 / (1 + exp(-{0})))",
                   save_out=True, save_inputs=False, ufunc=False)
# relu's partial is a boolean mask: g * mask keeps g's dtype.
relu_p = _unary("relu", lambda xp, x: xp.maximum(x, 0), lambda out, x: greater(x, 0),
                "np.maximum({0}, 0)", "(({0} > 0 || isnan({0})) ? {0} : 0)")
softplus_p = _unary("softplus", lambda xp, x: xp.logaddexp(0, x), lambda out, x: sigmoid(x),
                    "np.logaddexp(0, {0})",
                    "({0} > 0 ? {0} + log1p(exp(-{0})) : log1p(exp({0})))")


def _erf_impl(xp, x):
    if xp is np:
        return _rt._erf(x)
    from cupyx.scipy.special import erf as _cupy_erf  # the GPU has its own
    return _cupy_erf(x)


erf_p = _unary("erf", _erf_impl, lambda out, x: mul(exp(neg(square(x))), 2.0 / math.sqrt(math.pi)),
               "_erf({0})", "erf({0})", helpers=("_erf",), ufunc=False)


def _sinc_d(out, x):
    # (cos(pi x) - sinc(x)) / x, with the removable singularity at 0 set to 0
    zero = equal(x, 0)
    xs = where(zero, 1.0, x)
    return where(zero, 0.0, div(sub(cos(mul(xs, math.pi)), sinc(xs)), xs))


sinc_p = _unary("sinc", lambda xp, x: xp.sinc(x), _sinc_d, "np.sinc({0})",
                "({0} == 0 ? 1 : sinpi({0}) / ({0} * M_PI))", ufunc=False)
deg2rad_p = _unary("deg2rad", lambda xp, x: xp.deg2rad(x), lambda out, x: math.pi / 180,
                   "np.deg2rad({0})", "({0} * 0.017453292519943295)", save_inputs=False)
rad2deg_p = _unary("rad2deg", lambda xp, x: xp.rad2deg(x), lambda out, x: 180 / math.pi,
                   "np.rad2deg({0})", "({0} * 57.29577951308232)", save_inputs=False)

floor_p = _piecewise_constant("floor", lambda xp, x: xp.floor(x), "np.floor({0})", "floor({0})")
ceil_p = _piecewise_constant("ceil", lambda xp, x: xp.ceil(x), "np.ceil({0})", "ceil({0})")
rint_p = _piecewise_constant("rint", lambda xp, x: xp.rint(x), "np.rint({0})", "rint({0})")
trunc_p = _piecewise_constant("trunc", lambda xp, x: xp.trunc(x), "np.trunc({0})", "trunc({0})")
# NumPy rounds half to even, like CUDA's rint; decimals scales first.
round_p = _piecewise_constant(
    "round", lambda xp, x, decimals: xp.round(x, decimals), "np.round({0}, {decimals})",
    "(rint({0} * pow(10.0, {decimals})) / pow(10.0, {decimals}))", ufunc=False)


def _predicate(name, cuda):
    return register(name, lambda xp, x, _n=name: getattr(xp, _n)(x),
                    shape=lambda x: Aval(getattr(x, "shape", ()), np.dtype(bool)),
                    nondiff=True, numpy=f"np.{name}({{0}})", cuda=cuda, ufunc=f"np.{name}",
                    elementwise=True, save_inputs=False)


isnan_p = _predicate("isnan", "isnan({0})")
isinf_p = _predicate("isinf", "isinf({0})")
isfinite_p = _predicate("isfinite", "isfinite({0})")

nan_to_num_p = _unary(
    "nan_to_num",
    lambda xp, x, nan, posinf, neginf: xp.nan_to_num(x, nan=nan, posinf=posinf, neginf=neginf),
    lambda out, x, **kw: isfinite(x),
    "np.nan_to_num({0}, nan={nan}, posinf={posinf}, neginf={neginf})",
    "(isnan({0}) ? {nan} : (isinf({0}) ? ({0} > 0 ? {posinf} : {neginf}) : {0}))", ufunc=False)


# --- binary rows ----------------------------------------------------------------------

def _half_step(d):
    """1 where d > 0, 1/2 where d == 0, 0 where d < 0, in d's dtype: ties
    share the gradient evenly, as torch does for maximum/minimum."""
    return mul(add(sign(d), 1.0), 0.5)


maximum_p = def_elementwise(
    "maximum", lambda xp, x, y: xp.maximum(x, y),
    (lambda out, x, y: _half_step(sub(x, y)), lambda out, x, y: _half_step(sub(y, x))),
    "np.maximum({0}, {1})", "((isnan({0}) || {0} > {1}) ? {0} : {1})")
minimum_p = def_elementwise(
    "minimum", lambda xp, x, y: xp.minimum(x, y),
    (lambda out, x, y: _half_step(sub(y, x)), lambda out, x, y: _half_step(sub(x, y))),
    "np.minimum({0}, {1})", "((isnan({0}) || {0} < {1}) ? {0} : {1})")


def _nan_aware(step):
    """fmax/fmin pick the non-NaN operand: its partial is 1, the NaN one's 0."""
    def d(out, x, y):
        return where(isnan(y), 1.0, where(isnan(x), 0.0, step(x, y)))
    return d


fmax_p = def_elementwise(
    "fmax", lambda xp, x, y: xp.fmax(x, y),
    (_nan_aware(lambda x, y: _half_step(sub(x, y))),
     lambda out, x, y: _nan_aware(lambda a, b: _half_step(sub(a, b)))(out, y, x)),
    "np.fmax({0}, {1})", "fmax({0}, {1})")
fmin_p = def_elementwise(
    "fmin", lambda xp, x, y: xp.fmin(x, y),
    (_nan_aware(lambda x, y: _half_step(sub(y, x))),
     lambda out, x, y: _nan_aware(lambda a, b: _half_step(sub(b, a)))(out, y, x)),
    "np.fmin({0}, {1})", "fmin({0}, {1})")
arctan2_p = def_elementwise(
    "arctan2", lambda xp, y, x: xp.arctan2(y, x),
    (lambda out, y, x: div(x, add(square(x), square(y))),
     lambda out, y, x: neg(div(y, add(square(x), square(y))))),
    "np.arctan2({0}, {1})", "atan2({0}, {1})")
hypot_p = def_elementwise(
    "hypot", lambda xp, x, y: xp.hypot(x, y),
    (lambda out, x, y: div(x, out), lambda out, x, y: div(y, out)),
    "np.hypot({0}, {1})", "hypot({0}, {1})", save_out=True)
logaddexp_p = def_elementwise(
    "logaddexp", lambda xp, x, y: xp.logaddexp(x, y),
    (lambda out, x, y: exp(sub(x, out)), lambda out, x, y: exp(sub(y, out))),
    "np.logaddexp({0}, {1})",
    "(({0}) == ({1}) ? ({0}) + M_LN2 : fmax({0}, {1}) + log1p(exp(-fabs(({0}) - ({1})))))",
    save_out=True)
logaddexp2_p = def_elementwise(
    "logaddexp2", lambda xp, x, y: xp.logaddexp2(x, y),
    (lambda out, x, y: exp2(sub(x, out)), lambda out, x, y: exp2(sub(y, out))),
    "np.logaddexp2({0}, {1})",
    "(({0}) == ({1}) ? ({0}) + 1 : fmax({0}, {1}) + log1p(exp2(-fabs(({0}) - ({1})))) * M_LOG2E)",
    save_out=True)
floor_divide_p = def_elementwise(
    "floor_divide", lambda xp, x, y: xp.floor_divide(x, y), (None, None),
    "np.floor_divide({0}, {1})", "tg_floordiv({0}, {1})", save_inputs=False,
    vjp=(zeros_rule, zeros_rule), jvp=(zeros_rule, zeros_rule))
# x mod y = x - floor(x / y) * y, the sign following the divisor (Python's %)
remainder_p = def_elementwise(
    "remainder", lambda xp, x, y: xp.remainder(x, y),
    (lambda out, x, y: 1.0, lambda out, x, y: neg(floor_divide(x, y))),
    "np.remainder({0}, {1})", "tg_remainder({0}, {1})")
# C's fmod: x - trunc(x / y) * y, the sign following the dividend
fmod_p = def_elementwise(
    "fmod", lambda xp, x, y: xp.fmod(x, y),
    (lambda out, x, y: 1.0, lambda out, x, y: neg(trunc(div(x, y)))),
    "np.fmod({0}, {1})", "fmod({0}, {1})")
# The gradient passes to x inside [lo, hi] and to the bound that is active.
clip_p = def_elementwise(
    "clip", lambda xp, x, lo, hi: xp.clip(x, lo, hi),
    (lambda out, x, lo, hi: logical_and(greater_equal(x, lo), less_equal(x, hi)),
     lambda out, x, lo, hi: logical_and(less(x, lo), less_equal(lo, hi)),
     lambda out, x, lo, hi: logical_or(greater(x, hi), greater(lo, hi))),
    "np.clip({0}, {1}, {2})", "(isnan({0}) ? {0} : fmin(fmax({0}, {1}), {2}))", ufunc=False)


# --- the functional API -------------------------------------------------------------



@method("abs", "absolute")
@implements(np.absolute)
def abs(x, **kw):
    """Elementwise |x| (primitive ``abs``; of a complex x, ``complex_abs`` of
    tracegrad.ops.fft, which is real)."""
    _no_kw("abs", kw)
    if np.dtype(getattr(x, "dtype", np.float64)).kind == "c":
        return bind(REGISTRY["complex_abs"], x)
    return bind(abs_p, x)


absolute = abs
sign = _op1(sign_p, ("sign", "sgn"), (np.sign,))
sqrt = _op1(sqrt_p, ("sqrt",), (np.sqrt,))
square = _op1(square_p, ("square",), (np.square,))
rsqrt = _op1(rsqrt_p, ("rsqrt",))
exp2 = _op1(exp2_p, ("exp2",), (np.exp2,))
expm1 = _op1(expm1_p, ("expm1",), (np.expm1,))
log1p = _op1(log1p_p, ("log1p",), (np.log1p,))
log2 = _op1(log2_p, ("log2",), (np.log2,))
log10 = _op1(log10_p, ("log10",), (np.log10,))
sin = _op1(sin_p, ("sin",), (np.sin,))
cos = _op1(cos_p, ("cos",), (np.cos,))
tan = _op1(tan_p, ("tan",), (np.tan,))
arcsin = asin = _op1(arcsin_p, ("arcsin", "asin"), (np.arcsin,))
arccos = acos = _op1(arccos_p, ("arccos", "acos"), (np.arccos,))
arctan = atan = _op1(arctan_p, ("arctan", "atan"), (np.arctan,))
sinh = _op1(sinh_p, ("sinh",), (np.sinh,))
cosh = _op1(cosh_p, ("cosh",), (np.cosh,))
arcsinh = asinh = _op1(arcsinh_p, ("arcsinh", "asinh"), (np.arcsinh,))
arccosh = acosh = _op1(arccosh_p, ("arccosh", "acosh"), (np.arccosh,))
arctanh = atanh = _op1(arctanh_p, ("arctanh", "atanh"), (np.arctanh,))
sigmoid = _op1(sigmoid_p, ("sigmoid",))
relu = _op1(relu_p, ("relu",))
softplus = _op1(softplus_p, ("softplus",))
erf = _op1(erf_p, ("erf",))
sinc = _op1(sinc_p, ("sinc",), (np.sinc,))
deg2rad = radians = _op1(deg2rad_p, ("deg2rad",), (np.deg2rad, np.radians))
rad2deg = degrees = _op1(rad2deg_p, ("rad2deg",), (np.rad2deg, np.degrees))
floor = _op1(floor_p, ("floor",), (np.floor,))
ceil = _op1(ceil_p, ("ceil",), (np.ceil,))
rint = _op1(rint_p, ("rint",), (np.rint,))
trunc = _op1(trunc_p, ("trunc", "fix"), (np.trunc,))
isnan = _op1(isnan_p, ("isnan",), (np.isnan,))
isinf = _op1(isinf_p, ("isinf",), (np.isinf,))
isfinite = _op1(isfinite_p, ("isfinite",), (np.isfinite,))

maximum = _op2(maximum_p, ("maximum",), (np.maximum,))
minimum = _op2(minimum_p, ("minimum",), (np.minimum,))
fmax = _op2(fmax_p, ("fmax",), (np.fmax,))
fmin = _op2(fmin_p, ("fmin",), (np.fmin,))
arctan2 = atan2 = _op2(arctan2_p, ("arctan2", "atan2"), (np.arctan2,))
hypot = _op2(hypot_p, ("hypot",), (np.hypot,))
logaddexp = _op2(logaddexp_p, ("logaddexp",), (np.logaddexp,))
logaddexp2 = _op2(logaddexp2_p, ("logaddexp2",), (np.logaddexp2,))
floor_divide = _op2(floor_divide_p, ("floor_divide",), (np.floor_divide,))
remainder = mod = _op2(remainder_p, ("remainder",), (np.remainder,))
fmod = _op2(fmod_p, ("fmod",), (np.fmod,))


@implements(np.fix)
def fix(x, out=None):
    """Round toward zero (NumPy's name for trunc)."""
    _no_kw("fix", {"out": out})
    return bind(trunc_p, x)


@method("round")
@implements(np.round, getattr(np, "around", None))
def round(x, decimals=0, out=None):
    """Round half to even, at ``decimals`` digits; its gradient is zero."""
    _no_kw("round", {"out": out})
    return bind(round_p, x, decimals=int(decimals))


around = round


@method("nan_to_num")
@implements(np.nan_to_num)
def nan_to_num(x, nan=0.0, posinf=None, neginf=None, copy=True):
    """NaN -> nan, +-inf -> posinf/neginf (default: the dtype's largest finite)."""
    dt = np.dtype(getattr(x, "dtype", np.float64))
    if dt.kind != "f":  # integers have no NaN or inf
        return x
    big = float(np.finfo(dt).max)
    return bind(nan_to_num_p, x, nan=float(nan),
                posinf=big if posinf is None else float(posinf),
                neginf=-big if neginf is None else float(neginf))


@method("clamp", "clip")
def clip(x, a_min=None, a_max=None, out=None, *, min=None, max=None, **kw):
    """Limit x to [min, max]; either bound may be None, a scalar or a tensor.

    The gradient flows to x where it lies inside the bounds (ends
    included, as torch.clamp) and to the bound that is active elsewhere."""
    kw.pop("subok", None)   # ndarray subclasses: tracegrad values are none
    kw.pop("order", None)   # the memory layout of the result, not its values
    _no_kw("clip", dict(kw, out=out))
    lo = min if a_min is None else a_min
    hi = max if a_max is None else a_max
    if lo is None and hi is None:
        if getattr(x, "_face", "numpy") == "numpy":   # NumPy: x.clip() is a copy of x
            return numpy_copy(x)
        raise ValueError("clip/clamp: at least one of min and max must be given")
    if lo is None or hi is None:
        dt = np.dtype(getattr(x, "dtype", np.float64))
        if dt.kind != "f":  # no infinity to stand for the missing bound
            return minimum(x, hi) if lo is None else maximum(x, lo)
        lo = -math.inf if lo is None else lo
        hi = math.inf if hi is None else hi
    return bind(clip_p, x, lo, hi)


clamp = clip


@implements(np.clip)
def _np_clip(a, a_min=np._NoValue, a_max=np._NoValue, out=None, *, min=np._NoValue,
             max=np._NoValue, **kw):
    """np.clip's rules for its two spellings of the bounds, then clip."""
    given = lambda v: v is not np._NoValue   # noqa: E731
    if not given(a_min) and not given(a_max):
        a_min, a_max = (min if given(min) else None), (max if given(max) else None)
    elif not given(a_min):
        raise TypeError("clip() missing 1 required positional argument: 'a_min'")
    elif not given(a_max):
        raise TypeError("clip() missing 1 required positional argument: 'a_max'")
    elif given(min) or given(max):
        raise ValueError("Passing `min` or `max` keyword argument when `a_min` and `a_max` "
                         "are provided is forbidden.")
    if a_min is None and a_max is None:   # NumPy: np.positive(a, out=out, **kw)
        return np.positive(a, out=out, **kw)
    return clip(a, a_min, a_max, out, **kw)


@method("conj", "conjugate", "conj_physical")
@implements(np.conjugate)
def conj(x, **kw):
    """Complex conjugate (the ``conj`` row of tracegrad.ops.fft); a copy of a real value."""
    _no_kw("conj", kw)
    if np.dtype(getattr(x, "dtype", np.float64)).kind == "c":
        return bind(REGISTRY["conj"], x)
    return numpy_copy(x)


conjugate = conj


@implements(np.real)
def real(x):
    """Real part (the ``real`` row of tracegrad.ops.fft); a copy of a real value."""
    if np.dtype(getattr(x, "dtype", np.float64)).kind == "c":
        return bind(REGISTRY["real"], x)
    return conj(x)


@implements(np.imag)
def imag(x):
    """Imaginary part (the ``imag`` row of tracegrad.ops.fft); zeros for a real value."""
    if np.dtype(getattr(x, "dtype", np.float64)).kind == "c":
        return bind(REGISTRY["imag"], x)
    return zeros_like_value(x)
