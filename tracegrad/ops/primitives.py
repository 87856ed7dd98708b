"""The one registry of primitives.

Every primitive is a single ``Primitive`` row holding all of its rules:

* ``impl(xp, *arrays, **attrs)``: the computation on concrete arrays, written
  against the array module ``xp`` it is handed (``numpy`` or ``cupy``).
* ``shape(*avals, **attrs)``: output ``Aval`` (shape, dtype) from the input
  avals, without computing.  Python scalars appear as themselves.
* ``vjp``: the reverse-mode rule.  Either a tuple with one entry per input,
  ``rule(g, out, *inputs, **attrs) -> cotangent`` (``None`` for an input that
  has no gradient), or one callable returning a tuple of cotangents.  Rules
  are written with tracegrad's own ops, so the same rule runs eagerly on
  Tensors, under ``create_graph=True``, and symbolically on tracers.  A rule
  may return its cotangent in the broadcast output shape: ``unbroadcast``
  reduces it back to the input's shape in one place, not in every rule.
* ``jvp``: the forward-mode rule, a tuple with one entry per input,
  ``rule(t, out, *inputs, **attrs) -> tangent contribution``, summed over the
  inputs that have a tangent, or one callable ``rule(tangents, out, *inputs,
  **attrs)`` taking the tuple of tangents (``None`` where zero).
* ``numpy``: the NumPy emitter, a format string over the operand names
  (``{0}``, ``{1}``...) and attributes (``{axis}``, formatted with ``repr``),
  or a callable ``(names, **attrs) -> expression``.
* ``cupy``: the CuPy driver's expression where NumPy's does not carry over.
* ``cuda``: the CUDA elementwise expression (same format), for fusible ops.
* ``batch``: optional batching rule (vmap) where the generic ones in
  ``tracegrad.ir.batching`` do not fit.

Values flowing through ``bind`` are eager ``Tensor``s, tracing ``Tracer``s,
NumPy/CuPy arrays and Python scalars.  ``bind`` hands the call to the
interpreter that owns the values: the trace when any operand is a tracer,
otherwise the eager engine.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np

from tracegrad.ops import dtypes as _dtypes, symbolic


class Aval(NamedTuple):
    """Abstract value: what the shape rules see and produce."""
    shape: tuple
    dtype: np.dtype

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def size(self):
        n = 1
        for d in self.shape:
            n *= d
        return n


class Primitive:
    __slots__ = ("name", "impl", "shape", "vjp", "jvp", "numpy", "cupy", "cuda",
                 "nondiff", "n_out", "save_inputs", "save_out", "view", "may_view",
                 "ufunc", "helpers", "elementwise", "batch", "backward_name", "doc",
                 "torch_promotes", "torch_float")

    def __init__(self, name, impl, shape=None, vjp=None, jvp=None, numpy=None,
                 cupy=None, cuda=None, nondiff=False, n_out=1, save_inputs=True,
                 save_out=False, view=False, may_view=False, ufunc=None, helpers=(),
                 elementwise=False, batch=None, doc=None):
        self.name = name
        self.impl = impl
        # torch's promotion for torch-face operands (tracegrad.ops.dtypes)
        self.torch_float = name in _dtypes.TORCH_TO_FLOAT
        self.torch_promotes = _dtypes.TORCH_PROMOTED.get(name, self.torch_float)
        self.shape = shape
        self.vjp = vjp
        self.jvp = jvp
        self.numpy = numpy
        # cupy: the CUDA driver's call where the NumPy emitter's does not
        # exist in CuPy (ufunc reductions); None: the NumPy emitter serves both
        self.cupy = cupy
        self.cuda = cuda
        # nondiff: outputs never carry a gradient (comparisons, argmax).
        self.nondiff = nondiff
        # n_out: 1 for a single array, k for a tuple of k, or a callable
        # (**attrs) -> k for ops like split.
        self.n_out = n_out
        # What the vjp rule reads, so the tape keeps only that alive and the
        # in-place check only fires for values the backward really needs.
        self.save_inputs = save_inputs
        self.save_out = save_out
        # view: the eager output shares memory (and version counter) with
        # operand 0.
        self.view = view
        # may_view: the emitted NumPy call may return a view of an operand
        # for some attributes (a one-operand einsum), so the code generator's
        # buffer planner must never write into that operand while the
        # result lives.  ``view`` rows and "{0}" emitters alias by nature.
        self.may_view = may_view
        # ufunc: NumPy ufunc name when the op is one, so codegen may write
        # into a reused buffer with out=.
        self.ufunc = ufunc
        # helpers: names of functions in tracegrad.ops.runtime_numpy that the
        # numpy emitter calls; codegen copies their source into the module.
        self.helpers = tuple(helpers)
        self.elementwise = elementwise
        # batch(vals, flags, B, **attrs): the op on operands of which those
        # flagged carry a leading batch axis (see tracegrad.ir.batching); only
        # for ops the generic batching rules get wrong or make slow.
        self.batch = batch
        self.backward_name = "".join(p.capitalize() for p in name.split("_")) + "Backward0"
        self.doc = doc

    @property
    def aliases_operands(self):
        """Can the generated NumPy result share memory with an operand?"""
        return self.view or self.may_view or self.numpy == "{0}"

    def num_outputs(self, attrs):
        n = self.n_out
        return n(**attrs) if callable(n) else n

    def __repr__(self):
        return f"<primitive {self.name}>"

    def bind(self, *args, **attrs):
        return bind(self, *args, **attrs)


REGISTRY: dict[str, Primitive] = {}


def register(name, impl, **rules) -> Primitive:
    """Add a row to the registry and return it."""
    if name in REGISTRY:
        raise ValueError(f"primitive {name!r} is registered twice")
    p = Primitive(name, impl, **rules)
    REGISTRY[name] = p
    return p


def get(name) -> Primitive:
    try:
        return REGISTRY[name]
    except KeyError:
        raise NotImplementedError(
            f"tracegrad has no primitive named {name!r}; known primitives: "
            f"{', '.join(sorted(REGISTRY))}") from None


# --- dispatch ---------------------------------------------------------------
# The trace module installs its binder and its value type here on import;
# until then no tracer can exist, and the eager path tests nothing.
_eager_bind: Callable = None  # set by tracegrad.eager.tensor
_trace_bind: Callable = None  # set by tracegrad.frontend.trace
_tracer_type = None           # set by tracegrad.frontend.trace


# The torch dialect's type promotion (tracegrad.ops.dtypes holds the rule).
# NumPy (NEP 50) lets a 0-d array decide the dtype like any other operand,
# and picks float16/32/64 for integers by their width; torch lets the
# dimensioned tensors decide within a category (bool < integer < floating <
# complex), makes a Python float the default dtype, and computes integer
# operands of floating functions in the default dtype.  For the rows that
# promote (each row's ``torch_promotes``: True, or the positions that
# promote), when an operand speaks torch, every array operand is cast to
# torch's result dtype first, so the shape rule, the impl and every
# derivative see torch's dtypes, in eager mode and in traces alike.
# NumPy-face values keep NumPy's rule.
_SCALAR_CATEGORY = {bool: 0, int: 1, float: 2, complex: 3}
_WEAK_STAND_IN = {"b": False, "u": 0, "i": 0, "f": 0.0, "c": 0j}


def mark_weak(t):
    """``t`` (a traced value) stands for a Python number (a rolled loop's
    index, and what arithmetic of such numbers makes): in torch's promotion
    it is a wrapped number, as the Python int of the loop as written is."""
    T = t._trace
    weak = getattr(T, "weak_ids", None)
    if weak is None:
        weak = T.weak_ids = set()
    weak.add(t._id)


def _is_weak(a):
    T = getattr(a, "_trace", None)
    return T is not None and a._id in getattr(T, "weak_ids", ())


def torch_promotion(prim, args):
    """``args`` with torch's promotion applied (see above), or ``args``
    itself when nothing changes."""
    if _dtypes.numpy_call.depth:
        return args               # an np.* function: NumPy's rule on any value
    positions = prim.torch_promotes
    if positions is True:
        positions = range(len(args))
    torch_face = False
    first = None
    mixed = False
    scalar_cat = -1
    if positions is not True and len(positions) < len(args):
        # an operand that does not promote (where's condition) still says the dialect
        torch_face = any(getattr(a, "_face", None) == "torch" for a in args)
    for i in positions:
        a = args[i]
        cat = _SCALAR_CATEGORY.get(type(a))
        if cat is not None:
            if cat > scalar_cat:
                scalar_cat = cat
            continue
        if isinstance(a, np.generic):
            mixed = True          # a NumPy scalar: a wrapped number in torch
            continue
        if _is_weak(a):           # a Python number's stand-in (a loop index)
            torch_face |= a._face == "torch"
            mixed = True
            continue
        face = getattr(a, "_face", None)
        if face == "torch":
            torch_face = True
        dt = getattr(a, "dtype", None)
        if dt is None:
            return args           # lists and the like: the row says what they mean
        if first is None:
            first = dt
        elif dt != first:
            mixed = True
    if not torch_face:
        return args
    if not mixed and first is not None and scalar_cat <= _dtypes.category(first) and \
            not (prim.torch_float and first.kind in "biu"):
        return args
    if any(_is_weak(args[i]) for i in positions):
        if not any(hasattr(args[i], "dtype") and not isinstance(args[i], np.generic)
                   and not _is_weak(args[i]) for i in positions):
            return args           # Python numbers only: Python's (NumPy's) arithmetic
        rt = _dtypes.result_type(*[(_WEAK_STAND_IN[args[i].dtype.kind] if _is_weak(args[i])
                                    else args[i]) for i in positions])
    else:
        rt = _dtypes.result_type(*[args[i] for i in positions])
    if prim.torch_float and rt.kind in "biu":
        rt = _dtypes.Defaults.dtype
    out = list(args)
    arrays = False
    for i in positions:
        a = args[i]
        if isinstance(a, np.generic):
            out[i] = a.item()     # a weak number, as a Python scalar is
        elif type(a) not in _SCALAR_CATEGORY:
            arrays = True
            if a.dtype != rt:
                out[i] = bind(REGISTRY["astype"], a, dtype=rt.name)
    if not arrays:                # numbers only (torch.where(c, 1.0, 2)): one in torch's dtype
        i = positions[0]
        out[i] = np.asarray(out[i], dtype=rt)
    return tuple(out)


def bind(prim: Primitive, *args, **attrs):
    tracer = _tracer_type
    if tracer is not None:
        for a in args:
            if type(a) is tracer:
                if prim.torch_promotes:
                    args = torch_promotion(prim, args)
                    out = _trace_bind(prim, args, attrs)
                    if type(out) is tracer and all(
                            type(b) in _SCALAR_CATEGORY or _is_weak(b) for b in args):
                        mark_weak(out)      # Python numbers make Python numbers
                    return out
                return _trace_bind(prim, args, attrs)
    return _eager_bind(prim, args, attrs)


# --- helpers every rule table shares ---------------------------------------

def array_module(*arrays):
    """numpy, or cupy when any operand lives on the GPU."""
    for a in arrays:
        mod = type(a).__module__
        if mod.startswith("cupy"):
            import cupy
            return cupy
    return np


def with_message(e, message):
    """The exception ``e`` again with ``message`` (the op and its operands
    added): of e's own class where that class takes a message, else of the
    builtin class it derives from (NumPy's ``_UFuncNoLoopError`` takes its
    ufunc and dtypes, not a message: re-made from a message it would be a
    TypeError about its own constructor)."""
    try:
        new = type(e)(message)
        str(new)
        return new
    except Exception:  # noqa: BLE001 -- any class that is not made from a message
        return next(c for c in type(e).__mro__ if c.__module__ == "builtins")(message)


def content_digest(arr) -> str:
    """A digest of an array's bytes, the identity of a constant (with its
    dtype and shape).  An array whose elements all have the same bytes
    (np.zeros, np.ones, np.full of any size) is recognised without hashing
    it: a simulation's np.zeros((n, 3)), and the ones of its gradient, are
    constants that every trace, pass and target would otherwise hash again."""
    import hashlib
    flat = np.ascontiguousarray(arr).reshape(-1)
    if flat.nbytes >= 4096:
        width = flat.dtype.itemsize
        words = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}.get(width)
        u = flat.view(words) if words is not None else \
            flat.view(np.uint8).reshape(flat.size, width)
        if (u == u[0]).all():
            return "all " + flat[:1].tobytes().hex()
    return hashlib.sha1(flat.tobytes()).hexdigest()


def aval_of(x) -> Aval:
    if isinstance(x, Aval):
        return x
    shape = getattr(x, "shape", None)
    if shape is not None and hasattr(x, "dtype"):
        return Aval(tuple(shape), np.dtype(x.dtype))
    return Aval((), np.result_type(x))


def broadcast_shapes(*shapes):
    """np.broadcast_shapes, in plain Python for the common cases (tracing
    calls it for every elementwise op); NumPy's own raises the errors."""
    ndim = max(map(len, shapes), default=0)
    out = [1] * ndim
    for s in shapes:
        for i, d in enumerate(s, ndim - len(s)):
            if d != 1:
                if out[i] != 1 and out[i] != d:
                    return tuple(np.broadcast_shapes(*shapes))   # NumPy's error
                out[i] = d
    return tuple(out)


def result_dtype(*operands):
    """NumPy's promotion, with Python scalars weak (NEP 50)."""
    conv = []
    for o in operands:
        if isinstance(o, Aval):
            conv.append(o.dtype)
        elif isinstance(o, (bool, int, float, complex)):
            conv.append(o)
        elif isinstance(o, symbolic.Sym):    # a symbolic Python number: as weak
            conv.append(o.hint)
        else:
            conv.append(np.dtype(o.dtype))
    return np.result_type(*conv)


def is_float(dtype) -> bool:
    return np.issubdtype(dtype, np.inexact)
