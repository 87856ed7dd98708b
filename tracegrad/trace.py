"""The trace interpreter: run user code on symbolic values and record a graph.

A ``Tracer`` stands for an array of known shape and dtype.  Every op on it
(NumPy ufuncs and functions, operators, Tensor methods) binds a primitive,
and ``Trace.bind`` appends a node instead of computing.  Nodes are
hash-consed: the same op on the same operands with the same attributes is
one node, which is common-subexpression elimination for free and gives a
stable structural hash for the compile cache.

This module stays light (no networkx, no Jinja2): a warm-cache call traces
to compute its key and then runs code from disk.
"""
from __future__ import annotations

import hashlib
import operator
import os
import sys
import weakref

import numpy as np

from tracegrad import primitives
from tracegrad.ops._define import ArrayMethods
from tracegrad.primitives import Aval

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))


class TraceError(TypeError):
    """A traced value was used where a concrete value is needed (Python
    control flow, conversion to a Python number or NumPy array)."""


def _user_frame():
    """(file, line, function) of the innermost frame outside tracegrad."""
    f = sys._getframe(2)
    while f is not None:
        fn = f.f_code.co_filename
        if not fn.startswith(_PKG_DIR) and "<frozen" not in fn and not fn.startswith("<__array_function__"):
            return (fn, f.f_lineno, f.f_code.co_name)
        f = f.f_back
    return None


def _source_line(loc):
    if not loc:
        return ""
    import linecache
    return linecache.getline(loc[0], loc[1]).strip()


class Node:
    """One recorded value: an input, a constant, or a primitive application."""
    __slots__ = ("id", "op", "inputs", "attrs", "aval", "loc", "value", "name")

    def __init__(self, id, op, inputs, attrs, aval, loc, value=None, name=None):
        self.id = id
        self.op = op            # primitive name, "input", "const" or "proj"
        self.inputs = inputs    # tuple of node ids
        self.attrs = attrs      # dict of static parameters
        self.aval = aval        # Aval, or tuple of Avals for multi-output ops
        self.loc = loc          # (file, line, function) in user code
        self.value = value      # the constant, for op == "const"
        self.name = name        # the argument name, for op == "input"


class Tracer(ArrayMethods):
    """A symbolic array inside a trace.  Its face ("numpy" or "torch") is the
    dialect of the argument it stands for, or of the first traced operand
    of the op that made it; names whose meaning differs follow it."""
    __slots__ = ("_trace", "id", "shape", "dtype", "_face", "__weakref__")

    def __init__(self, trace, id, aval, face="numpy"):
        self._trace = trace
        self.id = id
        self.shape = aval.shape
        self.dtype = aval.dtype
        self._face = face

    @property
    def aval(self):
        return Aval(self.shape, self.dtype)

    @property
    def requires_grad(self):
        return False

    @property
    def device(self):
        from tracegrad.tensor import device
        return device("cuda" if self._trace.backend == "cupy" else "cpu")

    def __repr__(self):
        return f"Tracer<{self.dtype}{list(self.shape)}, node {self.id}>"

    def _concrete_error(self, what):
        loc = _user_frame()
        where = f"{loc[0]}, line {loc[1]}, in {loc[2]}" if loc else "your function"
        src = _source_line(loc)
        deps = self._trace.input_names_behind(self.id)
        origin = ""
        if deps:
            origin = (" It depends on the argument" + ("s " if len(deps) > 1 else " ")
                      + ", ".join(f"'{d}'" for d in deps) + ".")
        raise TraceError(
            f"{what} of a traced value at {where}"
            + (f":\n    {src}\n" if src else ". ")
            + f"While tracegrad traces a function, arrays are symbolic "
            f"({self.dtype}{list(self.shape)}): their values are not known, only shapes and "
            f"dtypes.{origin} Python control flow may depend on shapes and static values, "
            f"not on array values. Remedies: mark the argument static with "
            f"static_argnums=/static_argnames= (it is then part of the cache key), "
            f"express the choice as data with np.where(cond, a, b) / np.maximum / np.clip, "
            f"or differentiate without compiling: tg.grad(f, compile=False) runs f eagerly "
            f"on values that record the tape, so its control flow may depend on values.")

    def __bool__(self):
        self._concrete_error("Python truth value (if/while/and/or/not) requested")

    def __float__(self):
        self._concrete_error("float() requested")

    def __int__(self):
        self._concrete_error("int() requested")

    def __index__(self):
        self._concrete_error("use as an index or int requested (indexing or slicing by a "
                             "traced integer works on traced arrays and on NumPy arrays the "
                             "function names as globals, closure variables or defaults; pass "
                             "any other array as an argument)")

    def _misuse(self, what, advice):
        """Raise TraceError for a traced value an op cannot take (op modules,
        which cannot import this one, call it): what, where, what to do."""
        loc = _user_frame()
        where = f"{loc[0]}, line {loc[1]}, in {loc[2]}" if loc else "your function"
        src = _source_line(loc)
        raise TraceError(f"{what} at {where}" + (f":\n    {src}\n" if src else ". ") + advice)

    def item(self):
        self._concrete_error(".item() requested")

    def tolist(self):
        self._concrete_error(".tolist() requested")

    def numpy(self):
        self._concrete_error(".numpy() requested")

    def __array__(self, dtype=None, copy=None):
        self._concrete_error("conversion to a NumPy array (np.asarray/np.array/float "
                             "indexing) requested; drop the conversion, a traced value "
                             "already acts as an array (a NumPy array indexed by a traced "
                             "index array must be one the function names as a global, closure "
                             "variable or default, or an argument),")

    def __iter__(self):
        if not self.shape:
            raise TypeError("iteration over a 0-d array")
        return (self[i] for i in range(self.shape[0]))

    def __setitem__(self, idx, value):
        loc = _user_frame()
        where = f"{loc[0]}, line {loc[1]}" if loc else "your function"
        src = _source_line(loc)
        raise TraceError(
            f"item assignment on a traced value at {where}"
            + (f":\n    {src}\n" if src else ". ")
            + "Compiled code has no in-place updates of arrays it computes. Write "
            "y = tg.setitem(y, index, value) (a copy of y with y[index] = value, "
            "differentiable in y and value), or np.where(mask, value, y).")

    def detach(self):
        from tracegrad.ops import stop_gradient
        return stop_gradient(self)

    def astype(self, dtype, order="K", casting="unsafe", subok=True, copy=True):
        from tracegrad.ops import astype
        if not copy and np.dtype(dtype) == self.dtype:
            return self   # NumPy returns the array itself: the same value, aliased
        return astype(self, dtype)

    def _copy(self):
        """NumPy's copy: the same (immutable) node as another array object,
        which in-place updates and views of the original do not reach."""
        return Tracer(self._trace, self.id, self.aval, self._face)

    # In-place arithmetic updates the value every name bound to it sees, as
    # NumPy does (b = a; b += 1 changes a).  A view shares memory with its
    # base, which compiled code cannot write through: that is an error.
    def _inplace(self, op, other, symbol):
        r = getattr(operator, op)(self, other)   # what `self <op> other` computes
        if r.shape != self.shape:
            raise ValueError(f"non-broadcastable output operand with shape {self.shape} "
                             f"doesn't match the broadcast shape {r.shape} (in-place '{symbol}')")
        if r.dtype != self.dtype:
            if not np.can_cast(r.dtype, self.dtype, "same_kind"):
                raise TypeError(f"Cannot cast the '{symbol[:-1]}' output from {r.dtype!r} to "
                                f"{self.dtype!r} with casting rule 'same_kind' (in-place "
                                f"'{symbol}')")
            r = r.astype(self.dtype)
        return self._assign(r, f"in-place '{symbol}'", f"b = b {symbol[:-1]} value")

    def _assign(self, value, what, instead):
        """Make this value ``value`` for every name bound to it (NumPy's
        in-place update); refused where NumPy would write through a view."""
        T = self._trace
        if T.shares_memory(self):
            loc = _user_frame()
            where = f"{loc[0]}, line {loc[1]}" if loc else "your function"
            src = _source_line(loc)
            raise TraceError(
                f"{what} on a traced value that shares memory with another (a view such "
                f"as a[1:], a.T or a.reshape(...), or an array a view was taken of) at "
                f"{where}" + (f":\n    {src}\n" if src else ". ")
                + f"In NumPy the update would write through to the other array; compiled "
                f"code has no shared memory. Write {instead} to make a new array, copy "
                f"first (b = a[1:].copy()), or update with tg.setitem(a, index, value).")
        self.id = value.id
        return self

    def __iadd__(self, other):
        return self._inplace("add", other, "+=")

    def __isub__(self, other):
        return self._inplace("sub", other, "-=")

    def __imul__(self, other):
        return self._inplace("mul", other, "*=")

    def __itruediv__(self, other):
        return self._inplace("truediv", other, "/=")

    def __ifloordiv__(self, other):
        return self._inplace("floordiv", other, "//=")

    def __imod__(self, other):
        return self._inplace("mod", other, "%=")

    def __ipow__(self, other):
        return self._inplace("pow", other, "**=")

    def to(self, *args, **kwargs):
        dtype = kwargs.get("dtype")
        for a in args:
            if not isinstance(a, str):
                dtype = a
        return self if dtype is None else self.astype(dtype)

    def float(self):
        return self.astype(np.float32)

    def double(self):
        return self.astype(np.float64)

    def clone(self):
        from tracegrad.ops import clone
        return clone(self)

    def contiguous(self):
        return self

    def copy(self):
        return self.clone()

    @property
    def size_(self):
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def itemsize(self):
        return self.dtype.itemsize


def _attr_key(attrs):
    return tuple(sorted(attrs.items()))


class Trace:
    """The graph being recorded, as plain lists (converted to networkx by ir)."""

    def __init__(self, backend="numpy"):
        self.nodes: list[Node] = []
        self.inputs: list[int] = []
        self.outputs: list[int] = []
        self.backend = backend
        self._cse = {}
        # values that share memory with another in NumPy's meaning (views and
        # the arrays they were taken of), by object as NumPy's arrays are:
        # in-place updates of them are refused.  id -> weak reference.
        self._aliased = {}
        self._consts = {}
        # While a transform applies a node's rule, the nodes it records are
        # attributed to that node's source line: (loc, "backward of %3 mul").
        self.loc_override = None

    # --- building -----------------------------------------------------------------
    def _add(self, op, inputs, attrs, aval, loc=None, value=None, name=None):
        n = Node(len(self.nodes), op, inputs, attrs, aval, loc, value, name)
        self.nodes.append(n)
        return n

    def new_input(self, aval, name, face="numpy"):
        n = self._add("input", (), {"index": len(self.inputs)}, aval, name=name)
        self.inputs.append(n.id)
        return Tracer(self, n.id, aval, face)

    def const(self, value):
        """Node id of a constant (deduplicated by content)."""
        if isinstance(value, (bool, int, float, complex)) and not isinstance(value, np.generic):
            key = (type(value).__name__, repr(value))
            aval = value
        else:
            arr = np.asarray(value)
            if arr.dtype == object:
                raise TypeError(f"cannot use a value of type {type(value).__name__} in a traced "
                                f"computation; pass arrays or numbers")
            key = (arr.dtype.str, arr.shape, hashlib.sha1(np.ascontiguousarray(arr).tobytes()).hexdigest())
            value = arr
            aval = Aval(arr.shape, arr.dtype)
        nid = self._consts.get(key)
        if nid is None:
            nid = self._add("const", (), {}, aval, value=value).id
            self._consts[key] = nid
        return nid

    def operand(self, a):
        if isinstance(a, Tracer):
            if a._trace is not self:
                raise TraceError("a value from one trace was used inside another (a tracer "
                                 "leaked out of a traced function, e.g. stored in a global); "
                                 "return it instead")
            return a.id
        if hasattr(a, "grad_fn"):  # an eager Tensor captured by the traced code
            return self.const(a._data)
        if isinstance(a, np.generic):
            return self.const(np.asarray(a))
        if type(a).__module__.startswith("cupy"):
            return self.const(a.get())
        return self.const(a)

    def bind(self, prim, args, attrs):
        ids = tuple(self.operand(a) for a in args)
        face = next((a._face for a in args if type(a) is Tracer), "numpy")
        key = (prim.name, ids, _attr_key(attrs))
        hit = self._cse.get(key)
        if hit is not None:
            # a fresh Tracer: an in-place update of one result must not
            # change another name's (a = sin(x); b = sin(x); b += 1)
            if type(hit) is int:
                result = Tracer(self, hit, self.nodes[hit].aval, face)
            else:
                result = tuple(Tracer(self, i, self.nodes[i].aval, face) for i in hit)
            return self._note_views(prim, args, result)
        in_avals = [self.nodes[i].aval for i in ids]
        try:
            aval = (prim.shape or _shape_by_eval(prim))(*in_avals, **attrs)
        except TraceError:
            raise
        except Exception as e:
            loc = _user_frame()
            where = f" at {loc[0]}, line {loc[1]}" if loc else ""
            shapes = ", ".join(f"{a.dtype}{list(a.shape)}" if isinstance(a, Aval) else repr(a)
                               for a in in_avals)
            raise type(e)(f"{prim.name}({shapes}) fails while tracing{where}: {e}") from e
        loc = self.loc_override or _user_frame()
        node = self._add(prim.name, ids, dict(attrs), aval, loc)
        n_out = prim.num_outputs(attrs)
        if prim.n_out == 1:  # a callable n_out always gives a tuple, as in eager mode
            if isinstance(aval, tuple) and not isinstance(aval, Aval):
                aval = aval[0]
                node.aval = aval
            result = Tracer(self, node.id, aval, face)
            self._cse[key] = node.id
        else:
            outs = []
            for i in range(n_out):
                p = self._add("proj", (node.id,), {"index": i}, aval[i], loc)
                outs.append(Tracer(self, p.id, aval[i], face))
            result = tuple(outs)
            self._cse[key] = tuple(o.id for o in outs)
        return self._note_views(prim, args, result)

    def _note_views(self, prim, args, result):
        """A view's result and its operands share memory from now on."""
        if prim.aliases_operands:
            for v in (*args, *(result if type(result) is tuple else (result,))):
                if type(v) is Tracer:
                    self._aliased[id(v)] = weakref.ref(v)
        return result

    def shares_memory(self, value):
        """Is this traced value a view, or one a view was taken of?"""
        ref = self._aliased.get(id(value))
        return ref is not None and ref() is value

    # --- reading --------------------------------------------------------------------
    def input_names_behind(self, nid):
        """Names of the inputs a node depends on (for error messages)."""
        seen, stack, names = set(), [nid], []
        while stack:
            n = self.nodes[stack.pop()]
            if n.id in seen:
                continue
            seen.add(n.id)
            if n.op == "input":
                names.append(n.name)
            stack.extend(n.inputs)
        return sorted(names)

    def structure_hash(self) -> str:
        """A hash of everything that determines the generated code: ops,
        wiring, attributes, shapes, dtypes, constants and source locations."""
        memo = getattr(self, "_hash", None)
        if memo is not None and memo[0] == (len(self.nodes), tuple(self.outputs)):
            return memo[1]
        h = hashlib.sha256()
        for n in self.nodes:
            parts = [n.op, repr(n.inputs), repr(_attr_key(n.attrs)), repr(n.aval)]
            if n.op == "const":
                v = n.value
                parts.append(hashlib.sha1(np.ascontiguousarray(v).tobytes()).hexdigest()
                             if isinstance(v, np.ndarray) else repr(v))
            if n.loc:
                parts.append(f"{os.path.basename(n.loc[0])}:{n.loc[1]}")
            h.update("|".join(parts).encode())
            h.update(b"\n")
        h.update(repr(self.outputs).encode())
        self._hash = ((len(self.nodes), tuple(self.outputs)), h.hexdigest())
        return self._hash[1]


def _shape_by_eval(prim):
    from tracegrad.ops.base import shape_by_eval
    return shape_by_eval(prim.impl)


def _trace_bind(prim, args, attrs):
    for a in args:
        t = getattr(a, "_trace", None)
        if t is not None:
            return t.bind(prim, args, attrs)


primitives._trace_bind = _trace_bind
primitives._tracer_type = Tracer


def _install_function_tracing():
    """Custom autograd.Functions met while tracing become custom_vjp nodes."""
    from tracegrad.autograd import function
    from tracegrad.ops.custom import trace_apply
    function._trace_apply = trace_apply


_install_function_tracing()


# --- pytrees: tuples, lists, dicts and None around array leaves ------------------------

def tree_flatten(x):
    """(leaves, treedef); treedef is hashable and rebuilds the structure."""
    leaves = []

    def rec(v):
        if isinstance(v, tuple) and not hasattr(v, "_fields"):
            return ("tuple", tuple(rec(e) for e in v))
        if isinstance(v, tuple):  # namedtuple
            return ("namedtuple", type(v), tuple(rec(e) for e in v))
        if isinstance(v, list):
            return ("list", tuple(rec(e) for e in v))
        if isinstance(v, dict):
            keys = sorted(v)
            return ("dict", tuple(keys), tuple(rec(v[k]) for k in keys))
        if v is None:
            return ("none",)
        leaves.append(v)
        return ("leaf",)

    return leaves, rec(x)


def tree_unflatten(treedef, leaves):
    it = iter(leaves)

    def rec(d):
        kind = d[0]
        if kind == "leaf":
            return next(it)
        if kind == "none":
            return None
        if kind == "tuple":
            return tuple(rec(e) for e in d[1])
        if kind == "namedtuple":
            return d[1](*[rec(e) for e in d[2]])
        if kind == "list":
            return [rec(e) for e in d[1]]
        if kind == "dict":
            return {k: rec(e) for k, e in zip(d[1], d[2])}
        raise ValueError(kind)

    return rec(treedef)


def leaf_paths(treedef, prefix):
    """Readable identifier names for each leaf: w, params_0, params_bias."""
    names = []

    def rec(d, path):
        kind = d[0]
        if kind == "leaf":
            names.append(path)
        elif kind in ("tuple", "list"):
            for i, e in enumerate(d[1]):
                rec(e, f"{path}_{i}")
        elif kind == "namedtuple":
            for f, e in zip(d[1]._fields, d[2]):
                rec(e, f"{path}_{f}")
        elif kind == "dict":
            for k, e in zip(d[1], d[2]):
                rec(e, f"{path}_{k}")

    rec(treedef, prefix)
    return names


def trace_function(fn, leaves_avals, rebuild_args, names, backend="numpy", faces=None):
    """Trace ``fn`` on symbolic inputs.

    leaves_avals: Aval per dynamic leaf; faces: the dialect of each ("numpy"
    for ndarrays and numbers, "torch" for Tensors; all "numpy" by default);
    rebuild_args(tracers) -> (args, kwargs).  Returns (trace, out_treedef)."""
    trace = Trace(backend)
    faces = faces or ["numpy"] * len(leaves_avals)
    tracers = [trace.new_input(a, n, f) for a, n, f in zip(leaves_avals, names, faces)]
    args, kwargs = rebuild_args(tracers)
    from tracegrad.ops.random import tracing_random_draws  # np.random.* draws become nodes
    with tracing_random_draws(trace, fn, args, kwargs) as (args, kwargs):
        # NumPy arrays fn names (globals, closures) accept traced indices
        from tracegrad.ops.indexing import indexable_constants
        out = indexable_constants(fn)(*args, **kwargs)
    out_leaves, out_tree = tree_flatten(out)
    for o in out_leaves:
        if isinstance(o, Tracer):
            trace.outputs.append(o.id)
        elif hasattr(o, "grad_fn"):
            trace.outputs.append(trace.const(o._data))
        else:
            try:
                trace.outputs.append(trace.const(o))
            except TypeError:
                raise TypeError(f"the traced function returned a {type(o).__name__}; a compiled "
                                f"function returns arrays, numbers, or tuples/lists/dicts of "
                                f"them") from None
    return trace, out_tree
