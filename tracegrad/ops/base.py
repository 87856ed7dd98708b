"""Core primitives and the helpers every op module uses to define rows.

Elementwise ops are defined by their partial derivatives once: the vjp of
input i is ``g * d_i`` and the jvp is ``sum_i t_i * d_i``, so the two modes
cannot disagree.  ``unbroadcast`` undoes broadcasting for every rule.
"""
from __future__ import annotations

import numpy as np

from tracegrad.ops import runtime_numpy as _rt, symbolic
from tracegrad.ops.primitives import Aval, bind, register, broadcast_shapes
from tracegrad.ops.primitives import REGISTRY as _REGISTRY
from tracegrad.ops import _define
from tracegrad.ops._define import method, implements, axis_arg, norm_axes, numpy_copy, _ops


# --- shape rules ------------------------------------------------------------------

def _dummy(a):
    if isinstance(a, Aval):
        return np.ones((), a.dtype)
    if isinstance(a, symbolic.Sym):     # a symbolic Python number: its type decides
        return a.hint
    return a


def _dtype_key(a):
    """What the result dtype of an elementwise op depends on, for one
    operand: an array's dtype, a Python scalar's type (a Python int's value
    too: NumPy refuses one out of range for the other operand's dtype); None
    when unknown (no caching)."""
    if isinstance(a, Aval):
        return a.dtype
    t = type(a)
    if t is int:
        return (t, a)
    if t in (float, bool, complex):
        return t
    if isinstance(a, (np.ndarray, np.generic)):
        return (t is np.ndarray, a.dtype)
    return None


def elementwise_shape(prim_impl):
    """Shape rule of an elementwise op: broadcast shapes; dtype by asking
    NumPy on 0-d stand-ins (Python scalars stay weak), remembered per
    operand dtypes (tracing a long loop asks the same question each step)."""
    dtypes = {}

    def rule(*avals, **attrs):
        shapes = [a.shape for a in avals if isinstance(a, Aval)]
        key = tuple(map(_dtype_key, avals))
        try:
            # (identity test: a dtype compares equal to None, np.dtype(None) being float64)
            key = None if any(k is None for k in key) else (key, tuple(sorted(attrs.items())))
            dtype = dtypes.get(key) if key is not None else None
        except TypeError:      # an unhashable attribute
            key = dtype = None
        if dtype is None:
            with np.errstate(all="ignore"):
                dtype = np.asarray(prim_impl(np, *[_dummy(a) for a in avals], **attrs)).dtype
            if key is not None and len(dtypes) < 4096:
                dtypes[key] = dtype
        return Aval(broadcast_shapes(*shapes), dtype)
    # an elementwise function, even without a C expression (the special
    # functions): tracegrad.runtime.distributed lets such ops work row by row
    rule.elementwise = True
    return rule


def shape_by_eval(impl):
    """Fallback shape rule: run impl on zero-filled stand-ins (calloc'd, so
    cheap) and read the result's shape and dtype.  Trace time only."""
    def rule(*avals, **attrs):
        args = [np.zeros(a.shape, a.dtype) if isinstance(a, Aval) else a for a in avals]
        with np.errstate(all="ignore"):
            out = impl(np, *args, **attrs)
        if isinstance(out, (tuple, list)):
            return tuple(Aval(np.shape(o), np.asarray(o).dtype) for o in out)
        out = np.asarray(out)
        return Aval(out.shape, out.dtype)
    return rule


def is_value(x):
    """A tracegrad value (Tensor or tracer), as opposed to a constant."""
    return hasattr(x, "grad_fn") or hasattr(x, "_trace")


def shape_of(x):
    return tuple(getattr(x, "shape", ()))


# --- broadcasting undone in one place ---------------------------------------------

def unbroadcast(ct, shape, dtype=None):
    """Sum ``ct`` down to ``shape`` (undoing broadcasting) and cast it to
    ``dtype``.  Every vjp rule's result passes through here."""
    cshape = tuple(ct.shape)
    if cshape != shape:
        lead = len(cshape) - len(shape)
        axes = tuple(range(lead)) + tuple(
            lead + i for i, d in enumerate(shape) if d == 1 and cshape[lead + i] != 1)
        if axes:
            ct = bind(sum_p, ct, axis=axes, keepdims=True)
        if tuple(ct.shape) != shape:
            ct = bind(reshape_p, ct, shape=shape)
    if dtype is not None and ct.dtype != dtype and np.issubdtype(dtype, np.inexact):
        ct = _cast_cotangent(ct, dtype)
    return ct


def _cast_cotangent(ct, dtype):
    """ct as ``dtype``; a complex ct of a real value is its real part (the
    cotangent convention of tracegrad.ops.fft), never a cast that warns."""
    if np.dtype(ct.dtype).kind == "c" and np.dtype(dtype).kind != "c":
        ct = bind(_REGISTRY["real"], ct)
        if ct.dtype == dtype:
            return ct
    return astype(ct, dtype)


# --- defining elementwise rows ---------------------------------------------------

def _partials_rules(partials):
    """vjp and jvp tuples from one partial derivative per input.

    partials[i](out, *inputs) -> d out / d input_i (None: no gradient)."""
    vjp, jvp = [], []
    for d in partials:
        if d is None:
            vjp.append(None)
            jvp.append(None)
        else:
            vjp.append(lambda g, out, *xs, _d=d, **kw: mul(g, _d(out, *xs)))
            jvp.append(lambda t, out, *xs, _d=d, **kw: mul(t, _d(out, *xs)))
    return tuple(vjp), tuple(jvp)


def def_elementwise(name, impl, partials, numpy, cuda=None, ufunc=None,
                    save_out=False, save_inputs=True, helpers=(), vjp=None, jvp=None):
    """Register an elementwise primitive from its partial derivatives.

    ``vjp``/``jvp`` override the derived rules where a direct form is
    cheaper (e.g. add: the cotangent passes through unchanged)."""
    dv, dj = _partials_rules(partials)
    if ufunc is None:  # guess from the emitter; pass ufunc=False for "not a ufunc"
        ufunc = numpy.split("(")[0] if numpy.startswith("np.") else None
    return register(name, impl, shape=elementwise_shape(impl), vjp=vjp or dv, jvp=jvp or dj,
                    numpy=numpy, cuda=cuda, ufunc=ufunc or None,
                    save_out=save_out, save_inputs=save_inputs, helpers=helpers,
                    elementwise=True)


def zeros_rule(g, out, *xs, **kw):
    """vjp/jvp of a piecewise-constant op: zero, shaped like the output."""
    return mul(g, 0.0)


# --- forward mode, shared by eager helpers and the compiler's tangent pass -----

def vjp_apply(prim, attrs, g, out, inputs, in_meta, needs):
    """Run ``prim``'s vjp rule for the inputs in ``needs``; reduce each
    cotangent to its input's shape and dtype.  Shared by the eager tape and
    the adjoint pass on graphs."""
    rule = prim.vjp
    if rule is None:
        raise NotImplementedError(
            f"the primitive {prim.name!r} has no vjp rule, so it cannot be differentiated "
            f"in reverse mode; wrap the computation in tg.autograd.Function with a "
            f"hand-written backward, or detach() its input")
    if type(rule) is tuple:
        n = len(rule)
        cts = []
        for i, need in enumerate(needs):
            r = rule[i] if need and i < n else None
            cts.append(r(g, out, *inputs, **attrs) if r is not None else None)
    else:
        cts = list(rule(g, out, *inputs, **attrs))
        for i, need in enumerate(needs):
            if not need:
                cts[i] = None
    for i, ct in enumerate(cts):
        if ct is not None:
            meta = in_meta[i]
            shape = tuple(meta.shape)
            if tuple(ct.shape) != shape or ct.dtype != meta.dtype:
                cts[i] = unbroadcast(ct, shape, meta.dtype)
    return cts


def resolve_dtype(dtype):
    """A dtype from NumPy's or torch's spelling ('float' is float32 there)."""
    if dtype is None:
        return None
    if isinstance(dtype, str) and dtype in ("float", "double", "half", "long", "int", "bool"):
        dtype = {"float": "float32", "double": "float64", "half": "float16",
                 "long": "int64", "int": "int32", "bool": "bool"}[dtype]
    return np.dtype(dtype)


def jvp_apply(prim, attrs, tangents, out, inputs):
    """Tangent of ``prim``'s output(s) given one tangent per input (``None``
    where zero).

    Tuple-form rules give one contribution per input with a tangent; they
    are summed.  A single callable rule receives the whole tuple.  Each
    result is broadcast to its output's shape and cast to its float dtype,
    so rules may return contributions in an input's shape.  Returns
    ``None`` (or a tuple with ``None`` entries for multi-output prims) where
    the tangent is identically zero."""
    n_out = prim.num_outputs(attrs)
    multi = callable(prim.n_out) or prim.n_out != 1
    tangents = tuple(tangents)
    if prim.nondiff or all(t is None for t in tangents):
        return (None,) * n_out if multi else None
    rule = prim.jvp
    if rule is None:
        raise NotImplementedError(
            f"the primitive {prim.name!r} has no jvp rule, so it cannot be differentiated "
            f"in forward mode; use reverse mode (grad/vjp) instead")
    if type(rule) is tuple:
        total = None
        for i, t in enumerate(tangents):
            r = rule[i] if i < len(rule) else None
            if t is None or r is None:
                continue
            c = r(t, out, *inputs, **attrs)
            if total is None:
                total = c
            elif multi:
                total = tuple(b if a is None else a if b is None else add(a, b)
                              for a, b in zip(total, c))
            else:
                total = add(total, c)
    else:
        total = rule(tangents, out, *inputs, **attrs)
    if not multi:
        return _fit_tangent(total, out)
    total = (None,) * n_out if total is None else tuple(total)
    return tuple(_fit_tangent(t, o) for t, o in zip(total, out))


def _fit_tangent(t, out):
    """Broadcast a tangent to its output's shape and cast it to its dtype."""
    if t is None:
        return None
    oshape, odtype = tuple(out.shape), np.dtype(out.dtype)
    if not hasattr(t, "shape"):  # a Python scalar contribution
        t = add(zeros_like_value(out), t)
    if tuple(t.shape) != oshape:
        t = broadcast_to(t, oshape)
    if np.issubdtype(odtype, np.inexact) and t.dtype != odtype:
        t = _cast_cotangent(t, odtype)
    return t


# --- arithmetic ------------------------------------------------------------------

add_p = def_elementwise(
    "add", lambda xp, x, y: xp.add(x, y), (None, None), "np.add({0}, {1})", "({0} + {1})",
    save_inputs=False,
    vjp=(lambda g, out, x, y: g, lambda g, out, x, y: g),
    jvp=(lambda t, out, x, y: t, lambda t, out, x, y: t))
sub_p = def_elementwise(
    "sub", lambda xp, x, y: xp.subtract(x, y), (None, None), "np.subtract({0}, {1})",
    "({0} - {1})", save_inputs=False,
    vjp=(lambda g, out, x, y: g, lambda g, out, x, y: neg(g)),
    jvp=(lambda t, out, x, y: t, lambda t, out, x, y: neg(t)))
mul_p = def_elementwise(
    "mul", lambda xp, x, y: xp.multiply(x, y),
    (lambda out, x, y: y, lambda out, x, y: x), "np.multiply({0}, {1})", "({0} * {1})")
div_p = def_elementwise(
    "div", lambda xp, x, y: xp.true_divide(x, y),
    # 1.0 / y, not reciprocal(y): an integer divisor must give a float slope
    (lambda out, x, y: div(1.0, y), lambda out, x, y: neg(div(div(x, y), y))),
    "np.true_divide({0}, {1})", "({0} / {1})",
    vjp=(lambda g, out, x, y: div(g, y), lambda g, out, x, y: neg(div(mul(g, div(x, y)), y))))
neg_p = def_elementwise(
    "neg", lambda xp, x: xp.negative(x), (None,), "np.negative({0})", "(-{0})",
    save_inputs=False, vjp=(lambda g, out, x: neg(g),), jvp=(lambda t, out, x: neg(t),))
reciprocal_p = def_elementwise(
    "reciprocal", lambda xp, x: xp.reciprocal(x),
    (lambda out, x: neg(mul(out, out)),), "np.reciprocal({0})", "(1 / {0})", save_out=True,
    save_inputs=False)


def _pow_dx(out, x, y):
    ty = type(y)
    if ty is float or ty is int or (not is_value(y) and np.ndim(y) == 0):
        if y == 2:
            return mul(x, 2.0)
        if y == 0:
            return mul(x, 0.0)
        return mul(pow(x, y - 1), y)
    return mul(y, pow(x, sub(y, 1)))


def _pow_dy(out, x, y):
    # d/dy x**y = x**y log x; defined as 0 where x == 0 (the limit for y > 0)
    safe = where(equal(x, 0), 1.0, x)
    return mul(out, log(safe))


pow_p = def_elementwise(
    "pow", lambda xp, x, y: xp.power(x, y), (_pow_dx, _pow_dy), "np.power({0}, {1})",
    "pow({0}, {1})", save_out=True)


def exp_d(out, x):
    return out


exp_p = def_elementwise("exp", lambda xp, x: xp.exp(x), (exp_d,), "np.exp({0})", "exp({0})",
                        save_out=True, save_inputs=False)
log_p = def_elementwise("log", lambda xp, x: xp.log(x), (lambda out, x: reciprocal(x),),
                        "np.log({0})", "log({0})",
                        vjp=(lambda g, out, x: div(g, x),))
tanh_p = def_elementwise("tanh", lambda xp, x: xp.tanh(x),
                         (lambda out, x: sub(1.0, mul(out, out)),), "np.tanh({0})", "tanh({0})",
                         save_out=True, save_inputs=False)


def _cmp(name, fn, numpy_name, cuda_op, cuda=None):
    p = register(name, lambda xp, x, y, _f=fn: getattr(xp, _f)(x, y),
                 shape=lambda x, y, **kw: Aval(broadcast_shapes(getattr(x, "shape", ()),
                                                                 getattr(y, "shape", ())),
                                               np.dtype(bool)),
                 nondiff=True, numpy=f"np.{numpy_name}({{0}}, {{1}})",
                 cuda=cuda or f"({{0}} {cuda_op} {{1}})", ufunc=f"np.{numpy_name}",
                 elementwise=True)
    return p


less_p = _cmp("less", "less", "less", "<")
less_equal_p = _cmp("less_equal", "less_equal", "less_equal", "<=")
greater_p = _cmp("greater", "greater", "greater", ">")
greater_equal_p = _cmp("greater_equal", "greater_equal", "greater_equal", ">=")
equal_p = _cmp("equal", "equal", "equal", "==")
not_equal_p = _cmp("not_equal", "not_equal", "not_equal", "!=")
logical_and_p = _cmp("logical_and", "logical_and", "logical_and", "&&")
logical_or_p = _cmp("logical_or", "logical_or", "logical_or", "||")
# the truth values differ (1.0 and -1.0 are both true): not the values
logical_xor_p = _cmp("logical_xor", "logical_xor", "logical_xor", "!=",
                     cuda="(!({0}) != !({1}))")
logical_not_p = register(
    "logical_not", lambda xp, x: xp.logical_not(x),
    shape=lambda x: Aval(x.shape, np.dtype(bool)), nondiff=True,
    numpy="np.logical_not({0})", cuda="(!{0})", ufunc="np.logical_not", elementwise=True)

where_p = register(
    "where", lambda xp, c, x, y: xp.where(c, x, y),
    shape=elementwise_shape(lambda xp, c, x, y: np.where(c, x, y)),
    vjp=(None, lambda g, out, c, x, y: where(c, g, 0.0),
         lambda g, out, c, x, y: where(c, 0.0, g)),
    jvp=(None, lambda t, out, c, x, y: where(c, t, 0.0),
         lambda t, out, c, x, y: where(c, 0.0, t)),
    numpy="np.where({0}, {1}, {2})", cuda="({0} ? {1} : {2})", elementwise=True)


# --- dtype, copies, gradient stops -------------------------------------------------

astype_p = register(
    "astype", lambda xp, x, dtype: x.astype(dtype),
    shape=lambda x, dtype: Aval(x.shape, np.dtype(dtype)),
    vjp=(lambda g, out, x, dtype: g,), jvp=(lambda t, out, x, dtype: astype(t, dtype),),
    numpy="{0}.astype({dtype})", save_inputs=False, elementwise=True,
    # a kernel casts each operand to its node's dtype (and C converts to
    # bool as "nonzero", as NumPy does), so the cast is the operand itself
    cuda="{0}")
stop_gradient_p = register(
    "stop_gradient", lambda xp, x: x, shape=lambda x: x, vjp=(None,), jvp=(None,),
    numpy="{0}", cuda="{0}", save_inputs=False, elementwise=True)
clone_p = register(
    "clone", lambda xp, x: xp.array(x, copy=True), shape=lambda x: x,
    vjp=(lambda g, out, x: g,), jvp=(lambda t, out, x: t,), numpy="{0}.copy()",
    save_inputs=False)
basis_p = register(
    "basis", lambda xp, shape, dtype: xp.eye(int(np.prod(shape)), dtype=dtype).reshape(
        (int(np.prod(shape)),) + tuple(shape)),
    shape=lambda shape, dtype: Aval((int(np.prod(shape)),) + tuple(shape), np.dtype(dtype)),
    nondiff=True, save_inputs=False,
    numpy=lambda names, shape, dtype: (f"np.eye({int(np.prod(shape))}, dtype=np.{dtype})" + (
        "" if len(shape) == 1 else f".reshape({(int(np.prod(shape)),) + tuple(shape)!r})")),
    doc="The identity as a stack of one-hot arrays of ``shape``: the batched "
        "seed of a Jacobian.")
plus_identity_p = register(
    "plus_identity", lambda xp, m: _rt._plus_identity(m),
    shape=lambda m: m,
    vjp=(lambda g, out, m: g,), jvp=(lambda t, out, m: t,),
    # the helper takes out=, so codegen may write into a dead operand
    numpy="_plus_identity({0})", ufunc="_plus_identity", helpers=("_plus_identity",),
    save_inputs=False,
    doc="M + I for a square matrix (a Hessian's quadratic term), without "
        "materialising the identity.")
zeros_like_p = register(
    "zeros_like", lambda xp, x: xp.zeros_like(x, np.result_type(x)) if hasattr(x, "strides")
    else xp.zeros(np.shape(x), np.result_type(x)),   # (zeros_like keeps NumPy's layout)
    # a Python number operand (a constant whose aval is its value) gives a 0-d array
    shape=lambda x: x if isinstance(x, Aval) else Aval((), np.result_type(x)), nondiff=True,
    numpy="np.zeros_like({0})", save_inputs=False)


# --- reductions ------------------------------------------------------------------

def _reduced_shape(shape, axis, keepdims):
    if keepdims:
        return tuple(1 if i in axis else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axis)


def expand_reduced(g, shape, axis, keepdims):
    """Broadcast a reduction's cotangent back to the input shape.  (Binds the
    primitives directly: the shapes are known to be valid, and this runs in
    every backward of a reduction.)"""
    shape = tuple(shape)
    if not keepdims and len(g.shape):  # a 0-d cotangent broadcasts as it is
        g = bind(reshape_p, g, shape=_reduced_shape(shape, axis, True))
    return bind(broadcast_to_p, g, shape=shape)


def _sum_impl(xp, x, axis, keepdims):
    if xp is np:  # the ufunc reduction skips np.sum's Python-level dispatch
        return np.add.reduce(x, axis=axis, keepdims=keepdims)
    return xp.sum(x, axis=axis, keepdims=keepdims)


sum_p = register(
    "sum", _sum_impl,
    shape=lambda x, axis, keepdims: Aval(
        _reduced_shape(x.shape, axis, keepdims),
        np.sum(np.zeros((), x.dtype)).dtype if x.dtype.kind in "biu" else x.dtype),
    vjp=(lambda g, out, x, axis, keepdims: expand_reduced(g, x.shape, axis, keepdims),),
    jvp=(lambda t, out, x, axis, keepdims: sum(t, axis=axis, keepdims=keepdims),),
    # the ufunc reduction skips np.sum's Python-level dispatch (a microsecond
    # a call, which small arrays notice); CuPy keeps its sum
    numpy="np.add.reduce({0}, axis={axis}, keepdims={keepdims})",
    cupy="np.sum({0}, axis={axis}, keepdims={keepdims})", save_inputs=False)


# --- shapes ------------------------------------------------------------------------

reshape_p = register(
    "reshape", lambda xp, x, shape: xp.reshape(x, shape),
    shape=lambda x, shape: Aval(shape, x.dtype),
    vjp=(lambda g, out, x, shape: reshape(g, x.shape),),
    jvp=(lambda t, out, x, shape: reshape(t, shape),),
    # the method call: np.reshape's dispatch costs more than the reshape
    numpy="{0}.reshape({shape})", save_inputs=False, view=True)
def _broadcast_to_batch(vals, flags, B, shape):
    """Broadcasting aligns trailing axes, so a batched operand of lower rank
    first gets its missing axes after the batch axis."""
    (x,), (fx,) = vals, flags
    if not fx:
        return NotImplemented
    logical = tuple(x.shape[1:])
    if len(logical) < len(shape):
        x = bind(reshape_p, x, shape=(B,) + (1,) * (len(shape) - len(logical)) + logical)
    return bind(broadcast_to_p, x, shape=(B,) + tuple(shape))


broadcast_to_p = register(
    "broadcast_to", lambda xp, x, shape: xp.broadcast_to(x, shape), batch=_broadcast_to_batch,
    shape=lambda x, shape: Aval(shape, x.dtype),
    vjp=(lambda g, out, x, shape: g,),  # unbroadcast sums it back
    jvp=(lambda t, out, x, shape: broadcast_to(t, shape),),
    numpy="np.broadcast_to({0}, {shape})", save_inputs=False, view=True)
transpose_p = register(
    "transpose", lambda xp, x, axes: xp.transpose(x, axes),
    shape=lambda x, axes: Aval(tuple(x.shape[a] for a in axes), x.dtype),
    vjp=(lambda g, out, x, axes: transpose(g, tuple(np.argsort(axes).tolist())),),
    jvp=(lambda t, out, x, axes: transpose(t, axes),),
    numpy="{0}.transpose({axes})", save_inputs=False, view=True)


# --- matrix product -----------------------------------------------------------------

def _matmul_shape(a, b):
    """matmul's result shape and dtype from shapes alone (no product is
    computed); where NumPy would refuse the shapes, its own error is raised
    by a matmul of zero-stride stand-ins, which stops before computing."""
    sa, sb = tuple(a.shape), tuple(b.shape)
    dtype = np.matmul(np.zeros((1,) * min(len(sa), 2), a.dtype),
                      np.zeros((1,) * min(len(sb), 2), b.dtype)).dtype if sa and sb else None
    if not sa or not sb or sa[-1] != (sb[-2] if len(sb) >= 2 else sb[0]):
        np.matmul(np.broadcast_to(np.zeros((), a.dtype), sa),
                  np.broadcast_to(np.zeros((), b.dtype), sb))
        raise AssertionError(f"matmul of shapes {sa} and {sb} was expected to fail")
    core = (sa[-2:-1] if len(sa) >= 2 else ()) + (sb[-1:] if len(sb) >= 2 else ())
    batch = broadcast_shapes(sa[:-2], sb[:-2])
    return Aval(batch + core, dtype)


def _mT(x):
    return swapaxes(x, -1, -2)


def _matmul_vjp_a(g, out, a, b):
    if len(a.shape) == 1 and len(b.shape) == 1:
        return mul(g, b)
    if len(a.shape) == 1 and len(b.shape) == 2:  # (k) @ (k, m): dA = b @ g
        return matmul(b, g)
    if len(a.shape) == 1:      # (k) @ (..., k, m) -> (..., m)
        return reshape(matmul(b, reshape(g, tuple(g.shape) + (1,))), tuple(g.shape[:-1]) + (b.shape[-2],))
    if len(b.shape) == 1:      # (..., n, k) @ (k) -> (..., n)
        return mul(reshape(g, tuple(g.shape) + (1,)), b)
    return matmul(g, _mT(b))


def _matmul_vjp_b(g, out, a, b):
    if len(a.shape) == 1 and len(b.shape) == 1:
        return mul(g, a)
    if len(a.shape) == 1:      # dB[..., k, m] = a[k] g[..., m]
        return mul(reshape(a, (a.shape[0], 1)), reshape(g, tuple(g.shape[:-1]) + (1, g.shape[-1])))
    if len(b.shape) == 1 and len(a.shape) == 2:  # (n, k) @ (k): dB = g @ a
        return matmul(g, a)
    if len(b.shape) == 1:      # dB[k] = sum_n a[..., n, k] g[..., n]
        return reshape(matmul(_mT(a), reshape(g, tuple(g.shape) + (1,))),
                       tuple(g.shape[:-1]) + (a.shape[-1],))
    return matmul(_mT(a), g)


def _matmul_batch(vals, flags, B):
    """matmul with a leading batch axis on the flagged operands: 1-D operands
    become matrices (the extra axis dropped after), batched operands are
    rank-aligned after the batch axis, and matmul's own broadcasting over
    leading dimensions does the rest."""
    (a, b), (fa, fb) = vals, flags
    ra, rb = len(a.shape) - fa, len(b.shape) - fb
    if ra == 1 and rb == 1:
        if fa and fb:
            return sum(mul(a, b), axis=-1)
        return matmul(a, b) if fa else matmul(b, a)
    # one GEMM instead of B matrix-vector products
    if fa and not fb and rb == 2 and ra <= 2:
        return reshape(matmul(reshape(a, (-1, a.shape[-1])), b), tuple(a.shape[:-1]) + (b.shape[-1],))
    if fb and not fa and ra == 2 and rb == 1:
        return matmul(b, transpose(a))
    drop = None
    if ra == 1:
        a, ra, drop = reshape(a, tuple(a.shape[:fa]) + (1, a.shape[-1])), 2, -2
    if rb == 1:
        b, rb, drop = reshape(b, tuple(b.shape[:fb]) + (b.shape[-1], 1)), 2, -1
    r = max(ra, rb)
    if fa and ra < r:
        a = reshape(a, (B,) + (1,) * (r - ra) + tuple(a.shape[1:]))
    if fb and rb < r:
        b = reshape(b, (B,) + (1,) * (r - rb) + tuple(b.shape[1:]))
    out = matmul(a, b)
    if drop == -1:
        out = reshape(out, tuple(out.shape[:-1]))
    elif drop == -2:
        out = reshape(out, tuple(out.shape[:-2]) + (out.shape[-1],))
    return out


matmul_p = register(
    "matmul", lambda xp, a, b: xp.matmul(a, b), shape=_matmul_shape, batch=_matmul_batch,
    vjp=(_matmul_vjp_a, _matmul_vjp_b),
    jvp=(lambda t, out, a, b: matmul(t, b), lambda t, out, a, b: matmul(a, t)),
    numpy="np.matmul({0}, {1})", ufunc="np.matmul")


# --- the functional API ------------------------------------------------------------

@method("add")
@implements(np.add)
def add(x, y, alpha=1, **kw):
    return bind(add_p, x, y if alpha == 1 else mul(y, alpha))


@method("sub", "subtract")
@implements(np.subtract)
def sub(x, y, alpha=1, **kw):
    return bind(sub_p, x, y if alpha == 1 else mul(y, alpha))


subtract = sub


@method("mul", "multiply")
@implements(np.multiply)
def mul(x, y, **kw):
    return bind(mul_p, x, y)


multiply = mul


@method("div", "divide", "true_divide")
@implements(np.true_divide, np.divide)
def div(x, y, rounding_mode=None, **kw):
    if rounding_mode == "floor":
        return _ops.floor(bind(div_p, x, y))
    if rounding_mode == "trunc":
        return _ops.trunc(bind(div_p, x, y))
    return bind(div_p, x, y)


divide = true_divide = div


@method("neg", "negative")
@implements(np.negative)
def neg(x, **kw):
    return bind(neg_p, x)


negative = neg


@method("reciprocal")
@implements(np.reciprocal)
def reciprocal(x, **kw):
    return bind(reciprocal_p, x)


@method("pow")
@implements(np.power)
def pow(x, y, **kw):
    tx, ty = type(x), type(y)
    if (tx is float or tx is int) and (ty is float or ty is int):
        return x ** y
    if not is_value(x) and not is_value(y) and np.ndim(y) == 0 and np.ndim(x) == 0:
        return x ** y
    return bind(pow_p, x, y)


power = pow


@implements(np.float_power)
def float_power(x, y, **kw):
    return pow(astype(x, np.float64), y)


@method("exp")
@implements(np.exp)
def exp(x, **kw):
    return bind(exp_p, x)


@method("log")
@implements(np.log)
def log(x, **kw):
    return bind(log_p, x)


@method("tanh")
@implements(np.tanh)
def tanh(x, **kw):
    return bind(tanh_p, x)


def _binary_cmp(prim):
    def op(x, y, **kw):
        return bind(prim, x, y)
    op.__name__ = prim.name
    return op


less = method("lt", "less")(implements(np.less)(_binary_cmp(less_p)))
less_equal = method("le", "less_equal")(implements(np.less_equal)(_binary_cmp(less_equal_p)))
greater = method("gt", "greater")(implements(np.greater)(_binary_cmp(greater_p)))
greater_equal = method("ge", "greater_equal")(implements(np.greater_equal)(_binary_cmp(greater_equal_p)))
equal = method("eq")(implements(np.equal)(_binary_cmp(equal_p)))
not_equal = method("ne", "not_equal")(implements(np.not_equal)(_binary_cmp(not_equal_p)))
logical_and = method("logical_and")(implements(np.logical_and)(_binary_cmp(logical_and_p)))
logical_or = method("logical_or")(implements(np.logical_or)(_binary_cmp(logical_or_p)))
logical_xor = method("logical_xor")(implements(np.logical_xor)(_binary_cmp(logical_xor_p)))
lt, le, gt, ge, eq, ne = less, less_equal, greater, greater_equal, equal, not_equal


@method("logical_not")
@implements(np.logical_not)
def logical_not(x, **kw):
    return bind(logical_not_p, x)


@implements(np.where)
def where(condition, x=None, y=None):
    if x is None and y is None:
        return _ops.nonzero(condition)
    return bind(where_p, condition, x, y)


@method("where")
def _where_method(self, condition, other):
    """torch's ``x.where(condition, y)``: x where condition holds, else y."""
    return bind(where_p, condition, self, other)


def astype(x, dtype):
    dtype = resolve_dtype(dtype)
    if getattr(x, "dtype", None) == dtype:
        return numpy_copy(x)
    return bind(astype_p, x, dtype=dtype.name)


def stop_gradient(x):
    """The value of x, through which no gradient flows (JAX's stop_gradient)."""
    return bind(stop_gradient_p, x)


def clone(x, memory_format=None):
    return bind(clone_p, x)


@implements(np.copy)
def copy(x, order="K", subok=False):
    return bind(clone_p, x)


def zeros_like_value(x):
    return bind(zeros_like_p, x)


# NumPy's *_like constructors and shape queries on tracegrad values: the
# result depends only on the shape, so no gradient flows through it.

@implements(np.zeros_like)
def _np_zeros_like(a, dtype=None, order="K", subok=True, shape=None, *, device=None):
    """``order`` (the memory layout) and ``subok`` (ndarray subclasses) do
    not change the values; ``shape`` and ``dtype`` are NumPy's."""
    if device not in (None, "cpu"):
        raise ValueError(f'Device not understood. Only "cpu" is allowed, but received: {device}')
    z = bind(zeros_like_p, a)
    if shape is not None:
        z = _ops.broadcast_to(sum(z), (shape,) if isinstance(shape, int) else tuple(shape))
    dt = np.dtype(dtype) if dtype is not None else np.dtype(a.dtype)
    return z if np.dtype(z.dtype) == dt else astype(z, dt)


@implements(np.ones_like)
def _np_ones_like(a, dtype=None, order="K", subok=True, shape=None, *, device=None):
    return _np_full_like(a, 1, dtype, shape=shape, device=device)


@implements(np.full_like)
def _np_full_like(a, fill_value, dtype=None, order="K", subok=True, shape=None, *, device=None):
    z = _np_zeros_like(a, dtype, shape=shape, device=device)
    full = add(z, fill_value)
    return full if np.dtype(full.dtype) == np.dtype(z.dtype) else astype(full, z.dtype)


@implements(np.empty_like)
def _np_empty_like(a, dtype=None, order="K", subok=True, shape=None, *, device=None):
    return _np_zeros_like(a, dtype, shape=shape, device=device)


@implements(np.shape)
def _np_shape(a):
    return tuple(a.shape)


@implements(np.ndim)
def _np_ndim(a):
    return len(a.shape)


@implements(np.size)
def _np_size(a, axis=None):
    return int(np.prod(a.shape)) if axis is None else a.shape[axis]


@implements(np.sum)
def sum(x, axis=None, dtype=None, out=None, keepdims=False, *, dim=None, keepdim=None, **kw):
    """NumPy's sum (its argument order; torch's is tracegrad.frontend.torch_face's)."""
    if out is not None or kw:   # out=, initial=, where=: tracegrad.ops.reductions.sum_keywords
        return _ops.reductions.sum_keywords(x, axis_arg(axis, dim), dtype, out,
                                            bool(keepdim) if keepdim is not None else keepdims,
                                            **kw)
    if axis is None and dim is None and dtype is None and not keepdims and not keepdim \
            and is_value(x):  # the common full reduction
        return bind(sum_p, x, axis=tuple(range(len(x.shape))), keepdims=False)
    axis = axis_arg(axis, dim)
    keepdims = bool(keepdim) if keepdim is not None else bool(keepdims)
    if dtype is not None:
        x = astype(x, dtype)
    axes = norm_axes(axis, len(shape_of(x)))
    if not axes and not is_value(x):
        return x
    return bind(sum_p, x, axis=axes, keepdims=keepdims)


def _resolve_shape(shape, size):
    shape = list(shape)
    if shape.count(-1) > 1:
        raise RuntimeError("only one dimension can be inferred (-1) in a reshape")
    if -1 in shape:
        known = 1
        for d in shape:
            if d != -1:
                known *= d
        if known == 0 or size % known:
            raise RuntimeError(f"shape '{shape}' is invalid for input of size {size}")
        shape[shape.index(-1)] = size // known
    n = 1
    for d in shape:
        n *= d
    if n != size:
        raise RuntimeError(f"shape '{list(shape)}' is invalid for input of size {size}")
    return tuple(int(d) for d in shape)


@method("reshape")
@implements(np.reshape)
def reshape(x, *shape, newshape=None, order="C", **kw):
    """NumPy's reshape (torch's too, which has no ``order``): order="F"
    reads and writes the elements with the first index fastest."""
    if newshape is not None:
        shape = (newshape,)
    if "shape" in kw:
        shape = (kw.pop("shape"),)
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    elif len(shape) == 1 and not isinstance(shape[0], int) and hasattr(shape[0], "__len__"):
        shape = tuple(shape[0])
    size = 1
    for d in shape_of(x):
        size *= d
    shape = _resolve_shape([int(d) for d in shape], size)
    if order == "F":
        return transpose(reshape(transpose(x), tuple(reversed(shape))))
    _check_order(order, "reshape")
    if shape == shape_of(x) and _identity_ok(x):
        return x
    return bind(reshape_p, x, shape=shape)


def _identity_ok(x):
    """A shape op that changes nothing may hand back its operand itself,
    except for an eager tensor that requires grad: torch gives that a view
    with a grad_fn (ViewBackward0, ExpandBackward0...), and so do we."""
    return is_value(x) and not getattr(x, "_requires_grad", False)


def _check_order(order, what):
    if order not in ("C", None):
        raise ValueError(
            f"{what}(order={order!r}): tracegrad takes order 'C' or 'F'; 'A' and 'K' follow "
            f"the memory layout of the array, which traced and compiled code does not track. "
            f"Pass order='C' or order='F' explicitly.")


@method("broadcast_to", "expand")
@implements(np.broadcast_to)
def broadcast_to(x, *shape, **kw):
    if "size" in kw:
        shape = (kw["size"],)
    if "shape" in kw:
        shape = (kw["shape"],)
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    xs = shape_of(x)
    # torch's expand: -1 keeps the existing size
    lead = len(shape) - len(xs)
    shape = tuple(int(xs[i - lead]) if d == -1 else int(d) for i, d in enumerate(shape))
    if shape == xs and _identity_ok(x):
        return x
    try:
        np.broadcast_shapes(xs, shape)
    except ValueError:
        raise RuntimeError(f"the shape {list(xs)} cannot be broadcast to {list(shape)}") from None
    return bind(broadcast_to_p, x, shape=shape)


@implements(np.transpose)
def transpose(x, *axes, **kw):
    """NumPy's transpose: permute the axes (reverse them by default).  torch's
    transpose(dim0, dim1) is ``swapaxes``."""
    if "axes" in kw:
        axes = (kw["axes"],)
    nd = len(shape_of(x))
    if len(axes) == 1 and (axes[0] is None or isinstance(axes[0], (tuple, list))):
        axes = axes[0]
    if axes is None or axes == ():
        axes = tuple(range(nd))[::-1]
    if len(axes) != nd:
        raise ValueError(f"transpose: axes {tuple(axes)} don't match an array of {nd} dimensions")
    axes = tuple(int(a) % nd for a in axes)
    if axes == tuple(range(nd)) and _identity_ok(x):
        return x
    return bind(transpose_p, x, axes=axes)


@method("permute")
def permute(x, *dims):
    if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
        dims = tuple(dims[0])
    nd = len(shape_of(x))
    axes = tuple(int(a) % nd for a in dims)
    return _define.name_grad_fn(bind(transpose_p, x, axes=axes), "PermuteBackward0",
                                (("dims", ("const", axes)),))


@method("swapaxes", "transpose_")
@implements(np.swapaxes)
def swapaxes(x, axis1, axis2):
    nd = len(shape_of(x))
    axes = list(range(nd))
    a, b = axis1 % nd, axis2 % nd
    axes[a], axes[b] = axes[b], axes[a]
    if a == b and (_identity_ok(x) or not is_value(x)):
        return x
    return bind(transpose_p, x, axes=tuple(axes))


swapdims = swapaxes


@method("matmul")
@implements(np.matmul)
def matmul(a, b, **kw):
    sa, sb = shape_of(a), shape_of(b)
    if len(sa) == 0 or len(sb) == 0:
        raise ValueError("matmul: both operands need at least one dimension; use * for scalars")
    k_a, k_b = sa[-1], sb[0] if len(sb) == 1 else sb[-2]
    if k_a != k_b:
        raise ValueError(f"matmul: shapes {list(sa)} and {list(sb)} do not line up: the last "
                         f"dimension of the first ({k_a}) must equal the "
                         f"{'only' if len(sb) == 1 else 'second-to-last'} dimension of the "
                         f"second ({k_b})")
    try:
        broadcast_shapes(sa[:-2], sb[:-2])
    except ValueError:
        raise ValueError(f"matmul: the batch dimensions of shapes {list(sa)} and {list(sb)} "
                         f"cannot be broadcast together") from None
    return bind(matmul_p, a, b)


@method("mm")
def mm(a, b):
    if len(shape_of(a)) != 2 or len(shape_of(b)) != 2:
        raise RuntimeError("mm: both arguments must be 2-D matrices")
    return matmul(a, b)


# The arithmetic operators of Tensors and tracers bind their primitives
# directly: they are the hottest calls of eager mode.
def _install_operators():
    from tracegrad.ops._define import ArrayMethods
    for name, prim, swap in (("__add__", add_p, False), ("__radd__", add_p, True),
                             ("__sub__", sub_p, False), ("__rsub__", sub_p, True),
                             ("__mul__", mul_p, False), ("__rmul__", mul_p, True),
                             ("__truediv__", div_p, False), ("__rtruediv__", div_p, True)):
        if swap:
            setattr(ArrayMethods, name, lambda self, o, _p=prim: bind(_p, o, self))
        else:
            setattr(ArrayMethods, name, lambda self, o, _p=prim: bind(_p, self, o))
    ArrayMethods.__neg__ = lambda self: bind(neg_p, self)


_install_operators()
