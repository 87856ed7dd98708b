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

import contextlib
import hashlib
import math
import operator
import os
import re
import sys
import threading
import types
import weakref

import numpy as np

from tracegrad.frontend import branch_rewrite, captured as _captured, created, loop_rewrite
from tracegrad.ops import primitives, symbolic
from tracegrad.ops._define import ArrayMethods
from tracegrad.ops.primitives import Aval
from tracegrad.eager.grad_mode import enable_grad as _enable_grad, state as _grad_state

_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # tracegrad/


class TraceError(TypeError):
    """A traced value was used where a concrete value is needed (Python
    control flow, conversion to a Python number or NumPy array)."""


class ValueDependentTraceError(TraceError):
    """The function needs a traced value's value while it is traced (Python
    control flow that cannot become graph control flow, a conversion to a
    Python number): ``where`` is file:line, ``reason`` what was asked.  A
    compiled transform then runs the function eagerly for that signature
    (``tracegrad.api``), unless its fallback is off.  ``on_arguments``: the
    value depends on the function's arguments (freezing captured state
    would not make it known)."""

    def __init__(self, message, where=None, reason=None, on_arguments=True):
        super().__init__(message)
        self.where = where
        self.reason = reason
        self.on_arguments = on_arguments


_INTERNAL_CODE = {}    # code object -> is it tracegrad's (or the interpreter's)?


def _internal(code):
    """Is this code tracegrad's (or the interpreter's)?  Asked by every op:
    memoised per code object."""
    internal = _INTERNAL_CODE.get(code)
    if internal is None:
        if len(_INTERNAL_CODE) > 4096:
            _INTERNAL_CODE.clear()
        fn = code.co_filename
        internal = _INTERNAL_CODE[code] = fn.startswith(_PKG_DIR) or "<frozen" in fn \
            or fn.startswith("<__array_function__")
    return internal


def _user_frame_object(depth=2):
    """The innermost frame outside tracegrad (from ``depth`` callers up)."""
    f = sys._getframe(depth)
    while f is not None and _internal(f.f_code):
        f = f.f_back
    return f


def _user_frame():
    """(file, line, function) of the innermost frame outside tracegrad."""
    f = _user_frame_object(3)
    return None if f is None else (f.f_code.co_filename, f.f_lineno, f.f_code.co_name)


def _writing_into_array():
    """Is the user's code storing into a subscript (``y[i] = value``) right
    now?  NumPy converts the value when ``y`` is a plain ndarray."""
    import dis
    f = _user_frame_object(3)
    if f is None or f.f_lasti < 0:
        return False
    return f.f_code.co_code[f.f_lasti] == dis.opmap["STORE_SUBSCR"]


_FOREIGN_WRITE_WHY = (
    "(y[...] = value, where y is an array tracegrad does not track: one the caller passed "
    "without it being traced, a global, or a copy made with ndarray.copy() of one)")
_FOREIGN_WRITE_FIX = (
    "NumPy would convert the traced value and lose it. Create the array inside the function "
    "with np.zeros/np.ones/np.empty/np.full (or np.zeros_like...), or make a tracked copy "
    "first with y = np.copy(y)")
_FOREIGN_WRITE = (f"item assignment into a plain NumPy array {_FOREIGN_WRITE_WHY} requested; "
                  f"{_FOREIGN_WRITE_FIX}")


def foreign_write_error(e, what="a traced value"):
    """NumPy's "setting an array element with a sequence" ValueError, raised
    where the user's code stores a tracegrad value into a plain ndarray
    (NumPy swallows the value's own error there): the TraceError that says
    what happened and what to write, or None for any other error."""
    import dis
    if not isinstance(e, ValueError) or "setting an array element with a sequence" not in str(e):
        return None
    tb, last = e.__traceback__, None
    while tb is not None:
        fn = tb.tb_frame.f_code.co_filename
        if not (fn.startswith(_PKG_DIR) or "<frozen" in fn):
            last = tb
        tb = tb.tb_next
    if last is None or last.tb_lasti < 0 or \
            last.tb_frame.f_code.co_code[last.tb_lasti] != dis.opmap["STORE_SUBSCR"]:
        return None
    code = last.tb_frame.f_code
    loc = (code.co_filename, last.tb_lineno, code.co_name)
    src = _source_line(loc)
    return TraceError(f"item assignment of {what} into a plain NumPy array at "
                      f"{loc[0]}, line {loc[1]}, in {loc[2]}" + (f":\n    {src}\n" if src else ". ")
                      + f"{_FOREIGN_WRITE_WHY}; {_FOREIGN_WRITE_FIX}, or compute the new array "
                      f"functionally with tg.setitem.")


@contextlib.contextmanager
def foreign_writes_explained(what="a traced value"):
    """Turn NumPy's bare error for a store of ``what`` into a plain ndarray
    into the TraceError of ``foreign_write_error``."""
    try:
        yield
    except ValueError as e:
        err = foreign_write_error(e, what)
        if err is None:
            raise
        raise err from e


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
    __slots__ = ("_trace", "_id", "shape", "dtype", "_face", "_view", "_vbox", "_order",
                 "_array", "__weakref__")

    def __init__(self, trace, id, aval, face="numpy"):
        self._trace = trace
        self._id = id
        self.shape = aval.shape
        self.dtype = aval.dtype
        self._face = face
        # NumPy's aliasing, functionalized: a view (x[1:], x.T, x.reshape)
        # keeps (base, the ops from base to it, the base's version it last
        # read); a write through it rewrites the base, and a view whose base
        # was written since is recomputed from the base when next read.
        self._view = None
        self._vbox = None    # [version]: a base that views were taken of
        # NumPy's memory layout of this array where it is not C order: the
        # axes in memory order (np.copy(y.T) is Fortran-ordered: (1, 0)), or
        # UNKNOWN_LAYOUT; it decides whether a reshape is a view or a copy
        self._order = None
        # an ndarray for NumPy (an array the function created, a copy): a 0-d
        # value made any other way is what NumPy's ufuncs and reductions
        # return, an immutable NumPy scalar, which `s += 1` rebinds
        self._array = False

    @property
    def id(self):
        """The node this value is now (a stale view is first replayed)."""
        v = self._view
        if v is not None and v[2] != v[0]._vbox[0]:
            self._replay()
        return self._id

    @id.setter
    def id(self, nid):
        self._id = nid
        if self._vbox is not None:   # the views taken of it read the new value
            self._vbox[0] += 1

    def _replay(self):
        base, chain, _ = self._view
        cur = base
        for prim, extra, attrs in chain:
            cur = self._trace.bind(prim, (cur, *extra), attrs)
        self._id = cur._id
        self._view = (base, chain, base._vbox[0])

    def known_value(self):
        """The value of a traced array that is a constant (an array the
        function created and wrote only constants into), else None."""
        n = self._trace.nodes[self.id]
        return n.value if n.op == "const" else None

    @property
    def aval(self):
        return Aval(self.shape, self.dtype)

    @property
    def requires_grad(self):
        return False

    @property
    def device(self):
        from tracegrad.eager.device import device
        return device("cuda" if self._trace.backend == "cupy" else "cpu")

    def __repr__(self):
        return f"Tracer<{self.dtype}{list(self.shape)}, node {self.id}>"

    def _blame(self, what, loc):
        """Tell the trace's captured-state scope that this value was used
        concretely: the captured arrays it was made from cannot be inputs
        (tracegrad.frontend.captured freezes them and traces again)."""
        T = self._trace
        if T.scope is not None:
            where = f" at {os.path.basename(loc[0])}:{loc[1]}" if loc else ""
            T.scope.blame(T, self.id, f"it was used as a Python value ({what}{where})")

    def _concrete_error(self, what):
        loc = _user_frame()
        self._blame(what.split(" (")[0].split(";")[0], loc)
        where = f"{loc[0]}, line {loc[1]}, in {loc[2]}" if loc else "your function"
        src = _source_line(loc)
        deps = self._trace.input_names_behind(self.id)
        origin = ""
        if deps:
            origin = (" It depends on the argument" + ("s " if len(deps) > 1 else " ")
                      + ", ".join(f"'{d}'" for d in deps) + ".")
        kind = TraceError if what == _FOREIGN_WRITE else ValueDependentTraceError
        raise kind(
            f"{what} of a traced value at {where}"
            + (f":\n    {src}\n" if src else ". ")
            + f"While tracegrad traces a function, arrays are symbolic "
            f"({self.dtype}{list(self.shape)}): their values are not known, only shapes and "
            f"dtypes.{origin} An if/while/and/or/min/max on a value compiles into graph "
            f"control flow where tracegrad can read and rewrite the function's source (not "
            f"here); a conversion to a Python number or NumPy array never compiles. "
            f"Remedies: mark the argument static with "
            f"static_argnums=/static_argnames= (it is then part of the cache key), "
            f"express the choice as data with np.where(cond, a, b) / np.maximum / np.clip, "
            f"or differentiate without compiling: tg.grad(f, compile=False) runs f eagerly "
            f"on values that record the tape, so its control flow may depend on values.",
            **({} if kind is TraceError else dict(
                where=f"{os.path.basename(loc[0])}:{loc[1]}" if loc else None,
                reason=what.split(" (")[0] + " of a traced value",
                on_arguments=self._trace.depends_on_arguments(self.id))))

    def _known(self, what):
        """The value of a constant array for a conversion ``what``; an error
        for a value known only at run time."""
        v = self.known_value()
        if v is None:
            self._concrete_error(_FOREIGN_WRITE if _writing_into_array() else what)
        return np.asarray(v, dtype=self.dtype)

    def __bool__(self):
        return bool(self._known("Python truth value (if/while/and/or/not) requested"))

    def __float__(self):
        return float(self._known("float() requested"))

    def __int__(self):
        return int(self._known("int() requested"))

    def __complex__(self):
        return complex(self._known("complex() requested"))

    def __index__(self):
        v = self.known_value()
        if v is not None and np.asarray(v).dtype.kind in "iub" and np.ndim(v) == 0:
            return operator.index(np.asarray(v, dtype=self.dtype)[()])
        self._concrete_error("use as an index or int requested (indexing or slicing by a "
                             "traced integer works on traced arrays and on NumPy arrays the "
                             "function names as globals, closure variables or defaults; pass "
                             "any other array as an argument)")

    def _misuse(self, what, advice):
        """Raise TraceError for a traced value an op cannot take (op modules,
        which cannot import this one, call it): what, where, what to do."""
        loc = _user_frame()
        self._blame(what, loc)
        where = f"{loc[0]}, line {loc[1]}, in {loc[2]}" if loc else "your function"
        src = _source_line(loc)
        raise TraceError(f"{what} at {where}" + (f":\n    {src}\n" if src else ". ") + advice)

    def item(self, *args):
        return self._known(".item() requested").item(*args)

    def tolist(self):
        return self._known(".tolist() requested").tolist()

    def numpy(self):
        self._concrete_error(".numpy() requested")

    def __array__(self, dtype=None, copy=None):
        v = self.known_value()
        if v is not None:
            return np.array(v, dtype=dtype or self.dtype)
        if _writing_into_array():
            self._concrete_error(_FOREIGN_WRITE)
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
        """``y[idx] = value`` as NumPy does it (the value cast to y's dtype,
        broadcast to y[idx]), for every name bound to y and every view of
        the same memory."""
        from tracegrad.ops.indexing import assign_index
        self._assign(assign_index(self, idx, value), "item assignment",
                     "y = tg.setitem(y, index, value)")

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
        c = Tracer(self._trace, self.id, self.aval, self._face)
        c._array = True
        return c

    # In-place arithmetic updates the value every name bound to it sees, as
    # NumPy does (b = a; b += 1 changes a).  A view shares memory with its
    # base, which compiled code cannot write through: that is an error.
    def _inplace(self, op, other, symbol):
        r = getattr(operator, op)(self, other)   # what `self <op> other` computes
        if self._face == "numpy" and self.shape == () and not self._array and \
                self._view is None and not any(a is self for a in self._trace.arguments):
            # a NumPy scalar (np.float64) is immutable: the name is rebound,
            # other names bound to the old value keep it
            return r
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
        if T.is_lifted(self) or (self._view is not None and T.is_lifted(self._view[0])):
            # the function writes into an array it captured (or a view of one):
            # compiled code cannot (tracegrad.frontend.captured freezes it and traces again)
            loc = _user_frame()
            self._blame(what, loc)
            where = f"{loc[0]}, line {loc[1]}" if loc else "your function"
            raise TraceError(f"{what} of an array the function captured (a global, closure "
                             f"variable or default) at {where}; compiled code reads captured "
                             f"arrays, it does not write into them. Return the new value "
                             f"instead, or pass the array as an argument.")
        if not isinstance(value, Tracer):
            nid = T.operand(value)
            value = Tracer(T, nid, T.nodes[nid].aval, self._face)
        if value._trace is not T:
            self._misuse(f"{what} of an array made outside a loop or branch body, from "
                         f"inside the body", "A body cannot write into the enclosing "
                         "function's arrays: carry the array through the loop (pass it "
                         "in and return it) or return the values and write them after.")
        root = self._view[0] if self._view is not None else self
        if not T.is_body and self._face == "numpy" and any(a is root for a in T.arguments):
            self._misuse(
                f"{what} into an argument of the function (or a view of one)",
                f"NumPy would write into the caller's array; compiled code does not change "
                f"its caller's arrays. Write into a copy: x = x.copy() (or np.copy(x)) "
                f"before the update, or {instead}.")
        if self._view is not None and any(p.name not in _UNVIEW for p, _, _ in self._view[1]):
            self._refuse_shared(what, instead)     # a view with no way back (np.einsum's)
        if self._view is not None:
            base, chain, _ = self._view
            if base._trace is not T:
                self._misuse(f"{what} of a view, taken inside a loop or branch body, of an "
                             f"array made outside it", "A body cannot write into the "
                             "enclosing function's arrays: carry the array through the loop "
                             "(pass it in and return it) or return the values and write "
                             "them after.")
            new_base = _write_through(base, chain, value)
            base._id = new_base.id
            base._vbox[0] += 1
            self._id = value.id
            self._view = (base, chain, base._vbox[0])
            return self
        if T.shares_memory(self):
            self._refuse_shared(what, instead)
        self.id = value.id
        return self

    def _refuse_shared(self, what, instead):
        loc = _user_frame()
        where = f"{loc[0]}, line {loc[1]}" if loc else "your function"
        src = _source_line(loc)
        raise TraceError(
            f"{what} on a traced value that shares memory with another (a view such "
            f"as a[1:], a.T, a.reshape(...) or np.einsum('ij->ji', a), or an array a view "
            f"was taken of) at {where}" + (f":\n    {src}\n" if src else ". ")
            + f"In NumPy the update would write through to the other array; compiled "
            f"code has no shared memory. Write {instead} to make a new array, copy "
            f"first (b = a[1:].copy()), or update with tg.setitem(a, index, value).")

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

    @property
    def _c_contiguous(self):
        """Would NumPy's array here be C-contiguous?  A view's strides are
        replayed on its base (ravel copies unless it is)."""
        if self._view is None:
            # unknown: taken as a view, whose writes the trace then refuses
            return self._order is None or self._order is UNKNOWN_LAYOUT
        probe = _view_probe(self._view[0], self._view[1])
        return True if probe is None else bool(probe.flags.c_contiguous)

    def _memory_order(self):
        """The axes in NumPy's memory order (by decreasing stride, as
        order='K' keeps them), None for C order, or UNKNOWN_LAYOUT."""
        if self._view is None:
            return self._order
        base = self._view[0]
        if base._order is UNKNOWN_LAYOUT:
            return UNKNOWN_LAYOUT
        probe = _view_probe(base, self._view[1])
        if probe is None:
            return UNKNOWN_LAYOUT
        return _order_of(probe)

    def _copy_keeping_layout(self):
        """np.copy / np.array of this value: order='K' keeps its layout."""
        c = self._copy()
        c._order = self._memory_order()
        return c

    def copy(self, order="K"):   # ndarray.copy: order= is the memory layout, not the values
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


# ops never computed at trace time: draws, bodies, custom rules, transfers
_NO_FOLD = frozenset({"random_draw", "cond", "scan", "while", "while_bwd", "while_fwd",
                      "custom_vjp", "to_device"})


def _write_through(cur, chain, value):
    """``cur`` with ``value`` written where the view ``chain`` of it reads."""
    if not chain:
        return value
    prim, extra, attrs = chain[0]
    sub = cur._trace.bind(prim, (cur, *extra), attrs)
    return _UNVIEW[prim.name](cur, _write_through(sub, chain[1:], value), extra, attrs)


def _unview_getitem(cur, new, extra, attrs):
    from tracegrad.ops.indexing import setitem_p
    return primitives.bind(setitem_p, cur, new, *extra, index=attrs["index"])


def _unview_dynamic_slice(cur, new, extra, attrs):
    from tracegrad.ops.indexing import dynamic_update_slice_p
    return primitives.bind(dynamic_update_slice_p, cur, new, *extra, **attrs)


def _unview_reshape(cur, new, extra, attrs):
    from tracegrad.ops.base import reshape_p
    return primitives.bind(reshape_p, new, shape=tuple(cur.shape))


def _unview_transpose(cur, new, extra, attrs):
    from tracegrad.ops.base import transpose_p
    return primitives.bind(transpose_p, new, axes=tuple(np.argsort(attrs["axes"]).tolist()))


def _unview_flip(cur, new, extra, attrs):
    from tracegrad.ops.shape import flip_p
    return primitives.bind(flip_p, new, axes=attrs["axes"])


def _view_probe(base, chain):
    """An array with the strides NumPy's view ``chain`` of ``base`` (a
    C-ordered array) would have, and no data of its size (basic indexing,
    transposes and flips only move strides); None where the chain cannot be
    replayed (a traced index)."""
    order = base._order
    if order is UNKNOWN_LAYOUT:
        return None
    shp = tuple(int(d) for d in base.shape)
    perm = tuple(range(len(shp))) if order is None else order
    mem = tuple(shp[a] for a in perm)          # the shape in memory order, C-strided
    strides, acc = [], 1
    for d in reversed(mem):
        strides.append(acc)
        acc *= max(d, 1)
    probe = np.lib.stride_tricks.as_strided(np.zeros(1, np.int8), mem, tuple(reversed(strides)))
    probe = probe.transpose(tuple(np.argsort(perm).tolist()))
    try:
        from tracegrad.ops.indexing import build_index
        for prim, extra, attrs in chain:
            if prim.name == "getitem" and not extra:
                probe = probe[build_index(attrs["index"], ())]
            elif prim.name == "transpose":
                probe = probe.transpose(attrs["axes"])
            elif prim.name == "flip":
                probe = np.flip(probe, axis=attrs["axes"])
            elif prim.name == "reshape":
                probe = np.reshape(probe, attrs["shape"], copy=False)
            else:
                return None
    except Exception:   # noqa: BLE001 -- not replayable
        return None
    return probe


UNKNOWN_LAYOUT = "unknown"   # a layout NumPy's order='K' rules would need more care for


def _order_of(probe):
    """The axes of a strided array by decreasing stride (order='K'), None
    when that is C order."""
    st = [abs(x) for x in probe.strides]
    perm = tuple(sorted(range(probe.ndim), key=lambda a: -st[a]))
    if all(d <= 1 for d in probe.shape) or perm == tuple(range(probe.ndim)):
        return None
    return perm


def _result_order(prim, args, result):
    """The layout NumPy gives an elementwise result (order='K': that of its
    full-shape operands when they agree, else C for plain C operands and
    UNKNOWN_LAYOUT otherwise); C for every other op."""
    if not prim.elementwise and prim.name not in ("zeros_like", "astype"):
        return None
    orders = {a._memory_order() for a in args
              if type(a) is Tracer and tuple(a.shape) == tuple(result.shape)}
    if not orders or orders == {None}:
        return None
    if len(orders) == 1:
        return orders.pop()
    return UNKNOWN_LAYOUT


def _reshape_is_view(base, chain, shape):
    """Would NumPy's reshape of the view ``chain`` of ``base`` (a C-ordered
    array) be a view?  (``y.T.reshape(-1)`` and ``y[:, ::2].ravel()`` copy.)
    The chain is replayed on a probe that has strides but no data of its size
    (basic indexing, transposes and flips only move strides); a chain that
    cannot be replayed (a traced index) is taken to be a view, as before."""
    if not chain and base._order is None:
        return True     # a C-ordered array itself: every reshape of it is a view
    probe = _view_probe(base, chain)
    if probe is None:
        return None if base._order is UNKNOWN_LAYOUT else True
    try:
        np.reshape(probe, shape, copy=False)
    except ValueError:
        return False
    return True


# the views a write can go through: how to write a view's new value into its base
_UNVIEW = {"getitem": _unview_getitem, "dynamic_slice": _unview_dynamic_slice,
           "reshape": _unview_reshape, "transpose": _unview_transpose, "flip": _unview_flip}


def _einsum_is_view(x, subscripts):
    """Is NumPy's one-operand ``np.einsum(subscripts, x)`` a view of x (a
    transpose, a diagonal: nothing summed)?  Asked of an unwritten array of
    x's shape and dtype."""
    probe = np.empty(x.shape, x.dtype)
    return np.may_share_memory(np.einsum(subscripts, probe), probe)


def _attr_key(attrs):
    return tuple(sorted(attrs.items()))


_GENERATOR_TYPES = (np.random.Generator, np.random.RandomState)
_LIFTABLE_TYPES = (np.ndarray,) + _GENERATOR_TYPES


def captured_name(desc):
    """An input name for captured state: ``X``, ``self_W``, ``params_0``."""
    view = desc.startswith("a view of ")
    base = "_".join(re.findall(r"\w+", desc[len("a view of "):] if view else desc)) or "captured"
    return base + ("_view" if view else "")


_LEVELS = [0]


class Trace:
    """The graph being recorded, as plain lists (converted to networkx by ir).

    ``level`` orders traces by creation: a loop body is traced inside the
    trace that encloses it, so the newest trace among an op's operands is the
    innermost one, and the op is recorded there.  A body trace (``is_body``)
    turns a value of an enclosing trace that its code reads (a closure
    variable) into an extra input, and remembers the outer value in
    ``captured``: the loop node takes it as an operand."""

    def __init__(self, backend="numpy", is_body=False):
        _LEVELS[0] += 1
        self.level = _LEVELS[0]
        self.is_body = is_body
        self.captured = []
        self._captures = {}
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
        # Captured state (tracegrad.frontend.captured): the scope of a trace
        # that lifts, and the arrays and generators its implicit inputs
        # stand for (after the arguments' inputs, in order), by reference.
        self.scope = None
        self.implicit = []
        self.implicit_src = []     # what was captured: the array, Tensor or generator
        self.implicit_desc = []
        self.frozen = []       # captured arrays left constants (capture="freeze"), described
        self._lifted = {}      # id(object) -> its tracer
        self.checks = ()       # the guard's checks of captured state (after tracing)
        self.arguments = ()    # the tracers handed to the function (NumPy writes into them
        #                        would reach the caller's arrays: refused)

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
        elif isinstance(value, symbolic.Sym):     # a symbolic size (runtime.shape_plan)
            key = ("sym", value.name, id(value.rec))
            aval = value
        else:
            arr = np.asarray(value)
            if arr.dtype == object:
                raise TypeError(f"cannot use a value of type {type(value).__name__} in a traced "
                                f"computation; pass arrays or numbers")
            key = (arr.dtype.str, arr.shape, primitives.content_digest(arr))
            value = arr
            aval = Aval(arr.shape, arr.dtype)
        nid = self._consts.get(key)
        if nid is None:
            nid = self._add("const", (), {}, aval, value=value).id
            self._consts[key] = nid
        return nid

    def operand(self, a):
        if isinstance(a, Tracer):
            if a._trace is not self and self.is_body and a._trace.level < self.level:
                alias = branch_rewrite.alias_in(a)   # another name of a branch's operand
                if alias is not None and alias._trace is self:
                    return alias.id
                if alias is not None and alias._trace.level < self.level:
                    return self._capture(alias)
                return self._capture(a)
            if a._trace is not self:
                raise TraceError("a value from one trace was used inside another (a tracer "
                                 "leaked out of a traced function, e.g. stored in a global); "
                                 "return it instead")
            return a.id
        if hasattr(a, "grad_fn"):  # an eager Tensor captured by the traced code
            if self.is_body and a.requires_grad:
                from tracegrad.ops.control import _Eager
                raise _Eager()
            # captured state is read at call time (a view of captured memory too)
            t = self._lift_operand(a)
            if t is None and type(getattr(a, "_data", None)) is np.ndarray:
                t = self._lift_operand(a._data)
            if t is not None:
                return self.operand(t)
            return self.const(a._data)
        if isinstance(a, np.generic):
            return self.const(np.asarray(a))
        if type(a).__module__.startswith("cupy"):
            return self.const(a.get())
        if type(a) in _LIFTABLE_TYPES:   # captured state is read at call time
            t = self._lift_operand(a)
            if t is not None:
                return self.operand(t)
        return self.const(a)

    def lift(self, obj, desc):
        """The tracer of the implicit input standing for ``obj``, an array or
        a random generator the function captured; the compiled call passes
        ``obj`` itself (by reference) after the arguments."""
        t = self._lifted.get(id(obj))
        if t is None:
            value, face = obj, "numpy"
            if _captured.is_tensor(obj):      # a Tensor: its array, in the torch dialect
                value, face = obj._data, "torch"
            if type(value) is np.ndarray:
                aval = Aval(tuple(value.shape), value.dtype)
            else:
                aval = Aval((), np.dtype(object))
            t = self.new_input(aval, captured_name(desc), face)
            self.implicit.append(value)
            self.implicit_src.append(obj)
            self.implicit_desc.append(desc)
            self._lifted[id(obj)] = t
        return t

    def follow(self, array, face="numpy"):
        """A constant's tracer: an array the user's function created
        (tracegrad.frontend.created), which writes then change, or a folded
        result (``_fold``)."""
        nid = self.const(np.asarray(array))
        return Tracer(self, nid, self.nodes[nid].aval, face)

    def follow_created(self, array):
        """The tracer of an ndarray the user's function created (np.zeros,
        np.array, ...): an array, also when 0-d (``+=`` writes into it)."""
        t = self.follow(array)
        t._array = True
        return t

    def lift_generator(self, gen, desc):
        """A proxy whose draws record ``random_draw`` nodes reading ``gen``
        (torch's default generator, or one passed as ``generator=``), an
        implicit input of the trace that lifts captured state, passed by
        reference on every call; None where no trace lifts it."""
        root = self if self.scope is not None else (_captured.active_root() if self.is_body
                                                    else None)
        if root is None or root.scope is None:
            return None
        root.scope.add(gen, desc)
        return _captured.proxy_for(root.lift(gen, desc), gen)

    def is_lifted(self, tracer):
        """Is this tracer object an implicit input handed to the function?"""
        return any(t is tracer for t in self._lifted.values())

    def lifted_object(self, nid):
        """The captured object behind implicit input node ``nid``, or None."""
        for obj in self.implicit_src:
            if self._lifted[id(obj)].id == nid:
                return obj
        return None

    def captured_value(self, obj):
        """``obj``, captured state of a function replayed into this trace
        (a nested transform's captured array), as this trace's implicit
        input where it may be lifted, so the replayed graph reads it at call
        time; else ``obj`` itself (an operation on it alone would be folded
        into a constant: a snapshot of its value at trace time)."""
        t = self._lift_operand(obj)
        return obj if t is None else t

    def _lift_operand(self, a):
        """A concrete array (or generator) met as an operand: the tracer of
        an implicit input where it is captured state, else None."""
        root = self if self.scope is not None else (_captured.active_root() if self.is_body
                                                    else None)
        if root is None or root.scope is None or not _captured.liftable(a):
            return None
        desc = root.scope.lookup(a)
        if desc is None or not root.scope.may_lift(a, desc):
            return None
        return root.lift(a, desc)

    def _capture(self, a):
        """An enclosing trace's value read by a body: an input of the body."""
        nid = self._captures.get((id(a._trace), a.id))
        if nid is None:
            t = self.new_input(a.aval, f"captured_{len(self.captured)}", a._face)
            nid = t.id
            self._captures[(id(a._trace), a.id)] = nid
            self.captured.append(a._copy())
        return nid

    def bind(self, prim, args, attrs):
        ids = tuple(self.operand(a) for a in args)
        face = next((a._face for a in args if type(a) is Tracer), "numpy")
        if prim.name not in _NO_FOLD and ids and all(self.nodes[i].op == "const" for i in ids):
            folded = self._fold(prim, ids, attrs, face)
            if folded is not None:
                return self._note_views(prim, args, folded, attrs)
        key = (prim.name, ids, _attr_key(attrs))
        hit = self._cse.get(key)
        if hit is not None:
            # a fresh Tracer: an in-place update of one result must not
            # change another name's (a = sin(x); b = sin(x); b += 1)
            if type(hit) is int:
                result = Tracer(self, hit, self.nodes[hit].aval, face)
            else:
                result = tuple(Tracer(self, i, self.nodes[i].aval, face) for i in hit)
            return self._note_views(prim, args, result, attrs)
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
            raise primitives.with_message(
                e, f"{prim.name}({shapes}) fails while tracing{where}: {e}") from e
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
        return self._note_views(prim, args, result, attrs)

    def _fold(self, prim, ids, attrs, face):
        """An op on constants only is computed now, as NumPy would, and is a
        constant: arrays the function creates and fills with constants stay
        concrete (usable in ``if``, ``range``, as indices)."""
        if self.loc_override is not None and prim.name == "broadcast_to" and \
                (symbolic.has_sym(attrs["shape"]) or math.prod(attrs["shape"]) > 1):
            # a transform's rule broadcasting a constant (a mean's 1/n):
            # a node, not an array of the full size made now (and its size
            # may be symbolic: ops.symbolic)
            return None
        values = [self.nodes[i].value for i in ids]
        if any(isinstance(v, symbolic.Sym) for v in values) or symbolic.has_sym(list(attrs.values())):
            return self._fold_symbolic(prim, values, attrs, face)
        try:
            out = prim.impl(np, *values, **attrs)
        except Exception:   # noqa: BLE001 -- recorded as a node, the shape rule says why
            return None

        if prim.n_out == 1 and not isinstance(out, tuple):
            return self.follow(out, face)
        return tuple(self.follow(v, face) for v in out)

    def _fold_symbolic(self, prim, values, attrs, face):
        """``_fold`` where a constant is a symbolic size (runtime.shape_plan):
        scalar arithmetic gives a symbolic constant of the dtype NumPy's
        result has; anything else is a node."""
        fold = symbolic.SCALAR_FOLDS.get(prim.name)
        # (float64 and int64 only: Python's arithmetic is theirs, bit for bit)
        if fold is None or attrs or not all(
                isinstance(v, symbolic.Sym) or type(v) in (int, float) or
                (isinstance(v, np.ndarray) and v.shape == () and
                 v.dtype in (np.float64, np.int64))
                for v in values):
            return None
        plain = [v.hint if isinstance(v, symbolic.Sym) else v for v in values]
        try:
            concrete = prim.impl(np, *plain)
        except Exception:   # noqa: BLE001 -- recorded as a node, as _fold does
            return None
        value = fold(*[v.item() if isinstance(v, np.ndarray) else v for v in values])
        if isinstance(concrete, (np.ndarray, np.generic)):
            if np.asarray(concrete).dtype not in (np.float64, np.int64):
                return None
            aval = Aval((), np.asarray(concrete).dtype)     # NumPy's dtype, as _fold's
        else:
            aval = value                                     # a Python number stays weak
        nid = self._add("const", (), {}, aval, value=value).id
        return Tracer(self, nid, aval, face)

    def _note_views(self, prim, args, result, attrs=None):
        """A view's result and its operands share memory from now on: a view
        the trace can write through (``_UNVIEW``) remembers its base; for
        others, in-place updates of both are refused.  A new array gets
        NumPy's layout (``Tracer._order``)."""
        if type(result) is Tracer and not prim.view and args:
            result._order = _result_order(prim, args, result)
        if prim.name == "einsum" and type(result) is Tracer and attrs is not None and \
                all(type(a) is Tracer and a._face == "numpy" for a in args):
            src = args[0]
            if len(args) != 1 or not _einsum_is_view(src, attrs["subscripts"]) or (
                    src.shape == () and not src._array and src._view is None):
                return result           # NumPy makes a new array
            # a view (a transpose, a diagonal): read again from its base once
            # that is written; a write into it is refused (no way back)
            base, chain = (src._view[0], src._view[1]) if src._view is not None else (src, ())
            if base._vbox is None:
                base._vbox = [0]
            if not self.shares_memory(base):
                result._view = (base, chain + ((prim, (), attrs),), base._vbox[0])
                return result
        if type(result) is Tracer and args and type(args[0]) is Tracer and \
                prim.name in _UNVIEW and attrs is not None:
            if prim.name == "getitem" and any(it[0] == "a" for it in attrs["index"]) \
                    and not self._python_int_index(args[1:]):
                return result            # advanced indexing: NumPy makes a copy
            if prim.name == "getitem" and not result.shape and args[0]._face == "numpy" and \
                    not any(it[0] == "e" for it in attrs["index"]):
                return result            # an element (every axis an integer): a NumPy scalar
            src = args[0]
            if src._face == "numpy" and src.shape == () and not src._array and \
                    src._view is None and not any(a is src for a in self.arguments):
                # a NumPy scalar (np.var(x, axis=0) of a vector, say): a reshape
                # or an index of it is a new array (a new scalar where 0-d),
                # which writes do not link back
                return result
            base, chain = (src._view[0], src._view[1]) if src._view is not None else (src, ())
            is_view = _reshape_is_view(base, chain, attrs["shape"]) \
                if prim.name == "reshape" else True
            if is_view is False:
                result._order = None     # NumPy copies (C order): the strides do not allow a view
                return result
            if is_view is None:          # a layout tracegrad does not follow: refuse writes
                self._aliased[id(result)] = weakref.ref(result)
                self._aliased[id(base)] = weakref.ref(base)
                return result
            if base._vbox is None:
                base._vbox = [0]
            if not self.shares_memory(base):
                result._view = (base, chain + ((prim, tuple(args[1:]), attrs),), base._vbox[0])
                return result
        if prim.aliases_operands:
            for v in (*args, *(result if type(result) is tuple else (result,))):
                if type(v) is Tracer:
                    self._aliased[id(v)] = weakref.ref(v)
        return result

    # ops that turn Python ints into Python ints (or NumPy integer scalars)
    _INT_OPS = frozenset({"add", "sub", "mul", "floor_divide", "remainder", "neg", "abs", "maximum",
                          "minimum"})

    # reductions whose 0-d result NumPy returns as a scalar
    _SCALAR_OPS = frozenset({"sum", "prod", "amax", "amin", "argmax", "argmin", "searchsorted"})

    def _python_int_index(self, arrays):
        """Are these index arrays Python ints or NumPy integer scalars in the
        code as written (``python_int_nodes``)?  Then ``y[i]`` is basic
        indexing, a view, not a copy as with a 0-d index array.  A rewritten
        loop's index (tracegrad.frontend.loop_rewrite) is marked in
        ``python_ints``."""
        if not arrays:
            return False
        if any(type(a) is not Tracer or a.shape or a.dtype.kind not in "iu" for a in arrays):
            return False
        return all(a._trace.python_int_nodes([a._id]) for a in arrays)

    def python_int_nodes(self, ids):
        """Are these nodes 0-d integers that are Python ints or NumPy integer
        scalars in the code as written (not 0-d arrays): computed by integer
        arithmetic from ``python_ints``, constants and elements read out of
        arrays (``perm[k]``: a NumPy scalar)?"""
        marks = getattr(self, "python_ints", None) or ()
        stack = list(ids)
        seen = set()
        while stack:
            n = self.nodes[stack.pop()]
            if n.id in seen or n.id in marks:
                continue
            seen.add(n.id)
            if n.op == "const":     # a Python int in the code (its aval is the number)
                v = n.value
                if isinstance(v, bool) or not isinstance(v, (int, np.integer)) and not (
                        isinstance(v, np.ndarray) and v.ndim == 0 and v.dtype.kind in "iu"):
                    return False
                continue
            if getattr(n.aval, "shape", None) != () or np.dtype(n.aval.dtype).kind not in "iu":
                return False
            if n.op == "getitem" and not any(it[0] == "e" for it in n.attrs.get("index", ())):
                continue    # an element read out of an array: a NumPy scalar
            if n.op in self._SCALAR_OPS:
                continue    # a reduction to 0-d: a NumPy scalar
            if n.op not in self._INT_OPS:
                return False
            stack.extend(n.inputs)
        return True

    def shares_memory(self, value):
        """Is this traced value a view, or one a view was taken of?"""
        ref = self._aliased.get(id(value))
        return ref is not None and ref() is value

    # --- reading --------------------------------------------------------------------
    def depends_on_arguments(self, nid):
        """Does node ``nid`` depend on an argument of the traced function (or,
        in a loop or branch body, on the body's inputs)?  A value computed
        from captured state only becomes known when that state is frozen."""
        args = set(self.inputs[:len(self.arguments)])
        seen, stack = set(), [nid]
        while stack:
            n = self.nodes[stack.pop()]
            if n.id in seen:
                continue
            seen.add(n.id)
            if n.op == "input" and (self.is_body or n.id in args):
                return True
            stack.extend(n.inputs)
        return False

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
            h.update(_node_key(n, repr(n.aval)).encode())
            h.update(b"\n")
        h.update(repr(self.outputs).encode())
        self._hash = ((len(self.nodes), tuple(self.outputs)), h.hexdigest())
        return self._hash[1]

    def structure_sizes(self):
        """(structure, sizes): a hash of what ``structure_hash`` covers with
        every dimension of 2 or more cut out of the shapes, and those
        dimensions in order.  Two traces of one structure differ only in
        those sizes (``runtime.shape_plan``); sizes 0 and 1 stay in the
        structure (broadcasting, as torch's dynamic shapes specialise them).
        An integer constant of 2 or more (a mean's count) is cut out too."""
        h = hashlib.sha256()
        sizes = []
        counts = self._counts()
        for n in self.nodes:
            if _int_size(n, counts):
                sizes.append(n.value)
                h.update(_node_key(n, "int?", value=False).encode())
                h.update(b"\n")
                continue
            avals = n.aval if isinstance(n.aval, tuple) and not isinstance(n.aval, Aval) \
                else (n.aval,)
            shapes = []
            for a in avals:
                if isinstance(a, Aval):
                    cut = []
                    for d in a.shape:
                        if type(d) is int and d >= 2:
                            sizes.append(d)
                            cut.append("?")
                        else:
                            cut.append(repr(d))
                    shapes.append(f"{np.dtype(a.dtype).str}[{','.join(cut)}]")
                else:
                    shapes.append(repr(a))
            h.update(_node_key(n, " ".join(shapes)).encode())
            h.update(b"\n")
        h.update(repr(self.outputs).encode())
        return h.hexdigest(), sizes

    def _counts(self):
        """The element counts of the trace's shapes and their dimensions: an
        integer constant among them is taken for a size (a mean's count)."""
        counts = set()
        for n in self.nodes:
            if isinstance(n.aval, Aval) and n.aval.shape:
                counts.update(n.aval.shape)
                counts.add(math.prod(n.aval.shape))
        return counts

    def with_sizes(self, make):
        """A copy of this trace whose every dimension of 2 or more (those
        ``structure_sizes`` lists, in its order) is ``make(size)``."""
        def shape(s):
            return tuple(make(d) if type(d) is int and d >= 2 else d for d in s)

        copy = object.__new__(Trace)
        copy.__dict__.update(self.__dict__)
        copy.nodes = []
        counts = self._counts()
        for n in self.nodes:
            if _int_size(n, counts):
                v = make(n.value)
                copy.nodes.append(Node(n.id, n.op, n.inputs, n.attrs, v, n.loc, v, n.name))
                continue
            aval = n.aval
            if isinstance(aval, Aval):
                aval = Aval(shape(aval.shape), aval.dtype)
            elif isinstance(aval, tuple):
                aval = tuple(Aval(shape(a.shape), a.dtype) if isinstance(a, Aval) else a
                             for a in aval)
            copy.nodes.append(Node(n.id, n.op, n.inputs, n.attrs, aval, n.loc, n.value, n.name))
        copy._hash = None
        return copy


def _node_key(n, aval_text, value=True):
    """What a node contributes to a trace's structure: op, wiring, attributes,
    its avals as ``aval_text``, a constant's value (``value``), source line."""
    parts = [n.op, repr(n.inputs), repr(_attr_key(n.attrs)), aval_text]
    if n.op == "const" and value:
        v = n.value
        parts.append(primitives.content_digest(v) if isinstance(v, np.ndarray) else repr(v))
    if n.loc:
        parts.append(f"{os.path.basename(n.loc[0])}:{n.loc[1]}")
    return "|".join(parts)


def _int_size(n, counts):
    """Is node n an integer constant that is a size (a mean's count: the
    elements of a shape of the trace, or one of its dimensions)?"""
    return n.op == "const" and type(n.value) is int and 2 <= n.value < 1 << 62 and \
        n.value in counts


def _shape_by_eval(prim):
    from tracegrad.ops.base import shape_by_eval
    return shape_by_eval(prim.impl)


class _Containing(threading.local):
    """The branch bodies being traced now, innermost last."""
    def __init__(self):
        self.stack = []


_CONTAINING = _Containing()


def _trace_bind(prim, args, attrs):
    # the innermost (newest) trace among the operands records the op, or the
    # branch body being traced if that is newer (a branch's ops stay in it)
    best = None
    for a in args:
        t = getattr(a, "_trace", None)
        if t is not None and (best is None or t.level > best.level):
            best = t
    stack = _CONTAINING.stack
    if stack and stack[-1].level > best.level:
        best = stack[-1]
    out = best.bind(prim, args, attrs)
    if not _grad_state.grad_enabled and getattr(best, "user_code", False) and \
            not prim.nondiff and prim.name != "stop_gradient":
        out = _no_grad_outputs(out)     # the function's own `with torch.no_grad():`
    return out


def _no_grad_outputs(out):
    """What an op computes inside the traced function's ``no_grad`` block:
    its value, through which no gradient flows (eager mode records nothing)."""
    if isinstance(out, tuple):
        return tuple(_no_grad_outputs(o) for o in out)
    if type(out) is Tracer and out.dtype.kind in "fc":
        return primitives.bind(primitives.REGISTRY["stop_gradient"], out)
    return out


primitives._trace_bind = _trace_bind
primitives._tracer_type = Tracer


def _install_function_tracing():
    """Custom autograd.Functions met while tracing become custom_vjp nodes."""
    from tracegrad.eager import function
    from tracegrad.frontend.code_deps import fingerprint
    from tracegrad.ops.custom import trace_apply

    def apply_traced(fn, args, setup_ctx):
        return trace_apply(fn, args, setup_ctx, source=fingerprint(fn))

    function._trace_apply = apply_traced


_install_function_tracing()


# --- pytrees: tuples, lists, dicts and None around array leaves ------------------------

def _speaks_torch(v):
    """Does a container hold a Tensor (or a torch-face traced value)?"""
    if isinstance(v, dict):
        return any(_speaks_torch(e) for e in v.values())
    if isinstance(v, (tuple, list)):
        return any(_speaks_torch(e) for e in v)
    return getattr(v, "_face", None) == "torch"


def tree_flatten(x, keep_order=False, like=None):
    """(leaves, treedef); treedef is hashable and rebuilds the structure.
    A dict's entries go in the order of its sorted keys (JAX's rule, the
    NumPy face's), except a dict that holds Tensors, which keeps its
    insertion order (torch.func's results keep it, as torch's do), and any
    dict with ``keep_order`` (a result rebuilt as it is).  ``like``: the
    treedef of the values ``x`` goes with (the primals of tangents, the
    outputs of cotangents), whose dicts' orders ``x``'s dicts of the same
    keys follow, so the leaves pair up."""
    leaves = []

    def rec(v, d):
        if isinstance(v, tuple) and not hasattr(v, "_fields"):
            return ("tuple", tuple(rec(e, _child(d, "tuple", i)) for i, e in enumerate(v)))
        if isinstance(v, tuple):  # namedtuple
            return ("namedtuple", type(v),
                    tuple(rec(e, _child(d, "namedtuple", i)) for i, e in enumerate(v)))
        if isinstance(v, list):
            return ("list", tuple(rec(e, _child(d, "list", i)) for i, e in enumerate(v)))
        if isinstance(v, dict):
            if d is not None and d[0] == "dict" and len(d[1]) == len(v) and set(d[1]) == set(v):
                keys = list(d[1])
                return ("dict", tuple(keys), tuple(rec(v[k], e) for k, e in zip(keys, d[2])))
            keys = list(v)
            if not keep_order and not _speaks_torch(v):
                keys.sort()
            return ("dict", tuple(keys), tuple(rec(v[k], None) for k in keys))
        if v is None:
            return ("none",)
        leaves.append(v)
        return ("leaf",)

    return leaves, rec(x, like)


def _child(d, kind, i):
    """The i-th child of treedef ``d`` when it is a ``kind`` node, else None."""
    if d is None or d[0] != kind:
        return None
    children = d[2] if kind == "namedtuple" else d[1]
    return children[i] if i < len(children) else None


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


def leaf_paths(treedef, prefix, index="{}_{}", field="{}_{}", key=None):
    """Readable identifier names for each leaf: w, params_0, params_bias.
    ``index``, ``field``: formats of (path, position or field name);
    ``key(path, k)``: a dict entry's path (default ``path_k``)."""
    names = []
    key = key or (lambda path, k: f"{path}_{k}")

    def rec(d, path):
        kind = d[0]
        if kind == "leaf":
            names.append(path)
        elif kind in ("tuple", "list"):
            for i, e in enumerate(d[1]):
                rec(e, index.format(path, i))
        elif kind == "namedtuple":
            for f, e in zip(d[1]._fields, d[2]):
                rec(e, field.format(path, f))
        elif kind == "dict":
            for k, e in zip(d[1], d[2]):
                rec(e, key(path, k))

    rec(treedef, prefix)
    return names


def trace_function(fn, leaves_avals, rebuild_args, names, backend="numpy", faces=None,
                   capture=False):
    """Trace ``fn`` on symbolic inputs.

    leaves_avals: Aval per dynamic leaf; faces: the dialect of each ("numpy"
    for ndarrays and numbers, "torch" for Tensors; all "numpy" by default);
    rebuild_args(tracers) -> (args, kwargs).  Returns (trace, out_treedef).

    The ``for ... in range(...)`` loops of the function, and of the
    functions it calls by a global or closure name, are first rewritten
    into loop nodes (``tracegrad.frontend.loop_rewrite``); when one cannot stand for
    the loop as written, the function is traced again as written.

    capture=True: the arrays and random generators ``fn`` captured (globals,
    closure variables, defaults, attributes...) are read at call time
    (``tracegrad.frontend.captured``): they become implicit inputs after the
    arguments' (``trace.implicit``: the objects to pass, by reference), and
    ``trace.checks`` are the checks the caller's guard adds.  A caller that
    cannot pass them leaves ``capture`` off: the arrays are then constants;
    capture="freeze" makes them constants too and lists them (``trace.frozen``)."""
    if not capture:
        try:
            return _trace_rewritten(fn, leaves_avals, rebuild_args, names, backend, faces, None)
        except ValueDependentTraceError:
            if not loop_rewrite.enabled():
                raise
        return _trace_rewritten(fn, leaves_avals, rebuild_args, names, backend, faces, None,
                                control=True)
    root = _captured.active_root()
    scope = _captured.Scope(fn, parent=root.scope if root is not None else None,
                            freeze_all=capture == "freeze")
    control = False
    while True:
        scope.last_trace = None
        try:
            trace, out_tree = _trace_rewritten(fn, leaves_avals, rebuild_args, names, backend,
                                               faces, scope, control)
        except Exception as e:
            # an array the function uses as a Python value cannot be an
            # input: trace again with it frozen (never twice the same way);
            # control flow on any other value: trace again with the control
            # flow converted into cond and while nodes (branch_rewrite)
            blamed_capture = any(c not in scope.frozen for c in scope.culprits) and not (
                isinstance(e, ValueDependentTraceError) and e.on_arguments)
            if isinstance(e, ValueDependentTraceError) and not control and not blamed_capture \
                    and loop_rewrite.enabled():
                control = True
                continue
            if not scope.freeze_for_retry(scope.last_trace, e):
                raise
            continue
        trace.checks, notes = scope.finish(trace)
        trace.scope = scope.last_trace = None   # what it reached need not stay alive
        _captured.explain(fn, notes)
        return trace, out_tree


def _trace_rewritten(fn, leaves_avals, rebuild_args, names, backend, faces, scope,
                     control=False):
    """Trace ``fn`` with its loops rolled, else as written; ``control``: with
    its control flow on values converted too (loops rolled, else not)."""
    try:
        if loop_rewrite.enabled():
            try:
                return _trace_once(fn, loop_rewrite.rewrite(fn, control) or fn, leaves_avals,
                                   rebuild_args, names, backend, faces,
                                   loop_rewrite.CalledFunctions(control), scope)
            except loop_rewrite.RetraceAsWritten:
                pass
        if control:
            return _trace_once(fn, loop_rewrite.rewrite(fn, control, loops=False) or fn,
                               leaves_avals, rebuild_args, names, backend, faces,
                               loop_rewrite.CalledFunctions(control, loops=False), scope)
        return _trace_once(fn, fn, leaves_avals, rebuild_args, names, backend, faces, None, scope)
    except branch_rewrite.NotConverted as e:
        src = _source_line((e.file, e.line))
        raise ValueDependentTraceError(
            f"control flow on a traced value at {e.file}, line {e.line}"
            + (f":\n    {src}\n" if src else " ")
            + f"cannot be compiled: {e.reason}. Remedies: write the choice as data (np.where, "
            f"np.maximum, np.clip) or with tg.cond / tg.while_loop, mark the argument static "
            f"(static_argnums=/static_argnames=), or run the function eagerly (compile=False)",
            where=e.where, reason=e.reason) from None


def _trace_once(fn, run, leaves_avals, rebuild_args, names, backend, faces, functions=None,
                scope=None):
    trace = Trace(backend)
    lift = None
    if scope is not None:
        trace.scope = scope
        scope.last_trace = trace

        def lift(value, desc):
            """A captured array or generator fn names: its implicit input."""
            if not _captured.liftable(value) or not scope.may_lift(value, desc):
                return None
            scope.add(value, desc)
            t = trace.lift(value, desc)
            return _captured.proxy_for(t, value) if isinstance(value, _GENERATOR_TYPES) else t
    faces = faces or ["numpy"] * len(leaves_avals)
    tracers = [trace.new_input(a, n, f) for a, n, f in zip(leaves_avals, names, faces)]
    trace.arguments = tracers
    args, kwargs = rebuild_args(tracers)
    from tracegrad.ops.random import tracing_random_draws  # np.random.* draws become nodes
    with _captured.rooted(trace if scope is not None else None), \
            created.following(trace.follow_created), \
            tracing_random_draws(trace, fn, args, kwargs) as (args, kwargs):
        # NumPy arrays fn names (globals, closures) accept traced indices
        from tracegrad.ops.indexing import indexable_constants
        # the trace does not depend on the caller's grad mode (torch.func's
        # transforms ignore an outer no_grad); the function's own no_grad
        # blocks stop the gradient of what they compute (_trace_bind)
        trace.user_code = True
        with foreign_writes_explained(), _enable_grad():
            if functions is not None and not isinstance(fn, types.FunctionType):
                functions.enter_methods(fn)   # a callable object's (a method's) own class
            try:
                call = indexable_constants(run, functions, lift, created.substitute)
            except BaseException:
                if functions is not None:
                    functions.restore()
                raise
            out = call(*args, **kwargs)        # (which restores the functions when it ends)
        out_leaves, out_tree = tree_flatten(out)
        arguments = {t.id: t for t in tracers}
        for o in out_leaves:
            if isinstance(o, Tracer):
                if o.id in arguments and o is not arguments[o.id]:
                    # NumPy's copy of an argument (np.array(x), x.astype of
                    # its dtype): the same node, but a fresh array, which the
                    # compiled function returns too (passes.fresh_outputs)
                    from tracegrad.ops import clone
                    o = clone(o)
                trace.outputs.append(o.id)
            elif hasattr(o, "grad_fn"):
                trace.outputs.append(trace.const(o._data))
            else:
                try:
                    trace.outputs.append(trace.operand(o))   # a captured array: its input
                except TypeError:
                    raise TypeError(f"the traced function returned a {type(o).__name__}; a "
                                    f"compiled function returns arrays, numbers, or "
                                    f"tuples/lists/dicts of them") from None
    roll_loops(trace)
    return trace, out_tree


# --- bodies of loops and branches -------------------------------------------------------

def trace_body(fn, avals, faces=None, contain=False):
    """Trace ``fn(*tracers) -> tuple of values`` into a ``Body``.

    Values of enclosing traces that ``fn`` reads become extra inputs after
    the declared ones.  ``contain`` (a branch): every op ``fn`` runs is
    recorded in the body, also one whose operands are all values of an
    enclosing trace (else it would be recorded there, out of the branch).
    Returns (body, captured outer values, None)."""
    from tracegrad.ops.control import Body
    T = Trace(is_body=True)
    faces = faces or ["numpy"] * len(avals)
    xs = [T.new_input(Aval(tuple(a.shape), np.dtype(a.dtype)), f"in_{i}", f)
          for i, (a, f) in enumerate(zip(avals, faces))]
    stack = _CONTAINING.stack
    if contain:
        stack.append(T)
    try:
        with created.following(T.follow_created):
            outs = fn(*xs)
    finally:
        if contain:
            stack.pop()
    if not isinstance(outs, tuple):
        outs = (outs,)
    for o in outs:
        if isinstance(o, Tracer) or hasattr(o, "grad_fn"):
            T.outputs.append(T.operand(o))
        else:
            try:
                T.outputs.append(T.const(np.asarray(o)))
            except TypeError:
                raise TypeError(f"a loop or branch body returned a {type(o).__name__}; bodies "
                                f"return arrays, numbers, or tuples/lists/dicts of them") from None
    roll_loops(T)       # Python loops inside the body (not rewritten: too short, ...)
    # the backend is the enclosing trace's; a body's code is the same for both
    backend = next((c._trace.backend for c in T.captured), "numpy")
    T.backend = backend
    body = Body(T.nodes, T.inputs, T.outputs, backend, T.structure_hash())
    return body, list(T.captured), None


def _install_control_flow():
    from tracegrad.ops import control
    control.hooks.trace_body = trace_body
    control.hooks.tree_flatten = tree_flatten
    control.hooks.tree_unflatten = tree_unflatten


_install_control_flow()


# --- rolling of Python loops --------------------------------------------------------------
# A Python ``for`` loop unrolls while tracing: every iteration appends the same
# ops, from the same source lines, wired the same way.  ``roll_loops`` finds
# such runs in the recorded node list and replaces them by ONE scan node whose
# body is one iteration, so the graph, the passes and the generated code no
# longer grow with the trip count.  A run is rolled only when every iteration
# has the same ops, attributes, shapes, dtypes and source lines, reads the
# previous iteration only through values it carries, reads the same values
# from before the loop, and nothing after the loop reads a value of an
# iteration other than the last one's carried values.  Anything else stays
# unrolled: rolling never changes what is computed, only how it is written.

# fewer iterations, or fewer recorded ops in all, stay unrolled (they compile
# fast; unrolled, the buffer planner reuses their arrays): as for rewritten loops
ROLL_MIN_STEPS = loop_rewrite.ROLL_MIN_STEPS
ROLL_MIN_NODES = loop_rewrite.ROLL_MIN_NODES
_ROLL_CANDIDATES = 4    # periods tried at one position


_roll_enabled = loop_rewrite.enabled


def roll_loops(trace):
    """Roll repeated iterations of ``trace`` into scan nodes, in place (inner
    loops first, so nested Python loops roll as nested scans)."""
    if not _roll_enabled():
        return trace
    while _roll_once(trace):
        pass
    return trace


def _roll_once(T):
    """One pass: the loops with the shortest iterations first (periods up to
    4, 16, 64, ... ops), so an inner loop rolls before the loop around it
    and the outer loop's body holds the inner scan.  True if it rolled."""
    from bisect import bisect_right
    nodes = T.nodes
    seq = [n.id for n in nodes if n.op not in ("input", "const")]
    if len(seq) < ROLL_MIN_NODES:
        return False
    table, sig, occ = {}, [], {}
    for k, nid in enumerate(seq):
        n = nodes[nid]
        try:
            s = (n.op, _attr_key(n.attrs), n.aval, n.loc[:2] if n.loc else None, len(n.inputs))
            hash(s)
        except TypeError:
            s = ("unique", nid)
        code = table.setdefault(s, len(table))
        sig.append(code)
        occ.setdefault(code, []).append(k)
    pos = {nid: k for k, nid in enumerate(seq)}
    # the last position that reads each node (trace outputs read from "after everything")
    last_read = {}
    for k, nid in enumerate(seq):
        for u in nodes[nid].inputs:
            last_read[u] = k
    for o in T.outputs:
        last_read[o] = len(seq)
    N = len(seq)
    limit = 4
    while True:
        rolls = _find_runs(T, seq, pos, last_read, sig, occ, limit)
        if rolls:
            _apply_rolls(T, rolls)
            return True
        if limit >= N:
            return False
        limit *= 4


def _find_runs(T, seq, pos, last_read, sig, occ, limit):
    from bisect import bisect_right
    rolls = []
    i = 0
    N = len(seq)
    while i < N:
        found = skip = None
        lst = occ[sig[i]]
        at = bisect_right(lst, i)
        for j in lst[at:at + _ROLL_CANDIDATES]:
            p = j - i
            if p > limit:
                break
            block = sig[i:j]
            m = 1
            while i + (m + 1) * p <= N and sig[i + m * p:i + (m + 1) * p] == block:
                m += 1
            if m >= ROLL_MIN_STEPS and m * p >= ROLL_MIN_NODES:
                found = _plan_roll(T, seq, pos, last_read, i, p, m)
                if found is None:
                    skip = i + m * p   # the same run at another phase fails alike
                break
        if found is not None:
            rolls.append(found)
            i = found["end"]
        elif skip is not None:
            i = skip
        else:
            i += 1
    return rolls


def _plan_roll(T, seq, pos, last_read, i, p, m):
    """Check the dataflow of the run of m blocks of p nodes at seq[i]; the
    plan of the scan that replaces it, or None."""
    nodes = T.nodes
    B = [seq[i + r * p:i + (r + 1) * p] for r in range(m)]
    rep_of = {}
    for r in range(m):
        for j, nid in enumerate(B[r]):
            rep_of[nid] = (r, j)

    def kinds(r):
        out = []
        for nid in B[r]:
            ks = []
            for u in nodes[nid].inputs:
                ru = rep_of.get(u)
                if ru is None:
                    ks.append(("out", u))
                elif ru[0] == r:
                    ks.append(("in", ru[1]))
                elif ru[0] == r - 1:
                    ks.append(("carry", ru[1]))
                else:
                    return None    # reads an iteration further back
            out.append(ks)
        return out

    tmpl = kinds(1)
    if tmpl is None:
        return None
    for r in range(2, m):
        if kinds(r) != tmpl:
            return None
    carries = sorted({k for ks in tmpl for kind, k in ks if kind == "carry"})
    # iteration 0 reads the carries' initial values from before the loop
    first, init = 0, {}
    k0 = kinds(0)
    ok = k0 is not None
    if ok:
        for ks0, ks in zip(k0, tmpl):
            for a, b in zip(ks0, ks):
                if b[0] == "carry":
                    if a[0] != "out" or init.setdefault(b[1], a[1]) != a[1]:
                        ok = False
                elif a != b:
                    ok = False
        for k, x in init.items():
            xa, ka = nodes[x].aval, nodes[B[0][k]].aval
            if not isinstance(xa, Aval) or (tuple(xa.shape), np.dtype(xa.dtype)) != \
                    (tuple(ka.shape), np.dtype(ka.dtype)):
                ok = False   # e.g. a Python number that becomes an array
    if not ok:
        first = 1
        init = {k: B[0][k] for k in carries}
    # what is read after the run: only the last iteration's values
    end_pos = i + m * p
    late = {rep_of[nid] for r in range(m) for nid in B[r] if last_read.get(nid, -1) >= end_pos}
    if any(r != m - 1 for r, _ in late):
        return None
    last = m
    if any(j not in carries for _, j in late):
        last = m - 1     # the last iteration stays unrolled
    if last - first < 2 or not carries:
        return None
    return dict(B=B, tmpl=tmpl, carries=carries, init=init, first=first, last=last,
                end=end_pos, p=p)


def _apply_rolls(T, rolls):
    from tracegrad.ops.control import Body, scan_p
    nodes = T.nodes
    removed = {}
    replace = {}     # old id -> ("proj", roll index, carry number)
    starts = {}
    for ri, R in enumerate(rolls):
        B, first, last = R["B"], R["first"], R["last"]
        for r in range(first, last):
            for nid in B[r]:
                removed[nid] = ri
        # the scan takes the place of the run's last node: everything it
        # reads (constants first used inside the loop too) is recorded by then
        starts[B[last - 1][-1]] = ri
        for c, k in enumerate(R["carries"]):
            replace[B[last - 1][k]] = (ri, c)
        R["body"] = _roll_body(T, R)
    new_nodes, new_id = [], {}

    def add(op, inputs, attrs, aval, loc, value=None, name=None):
        n = Node(len(new_nodes), op, tuple(inputs), attrs, aval, loc, value, name)
        new_nodes.append(n)
        return n.id

    def ref(u):
        if u in replace:
            ri, c = replace[u]
            return rolls[ri]["projs"][c]
        return new_id[u]

    explain = bool(os.environ.get("TRACEGRAD_EXPLAIN"))
    for n in nodes:
        if n.id in starts:
            R = rolls[starts[n.id]]
            body, captured = R["body"]
            ops = [ref(R["init"][k]) for k in R["carries"]] + [ref(u) for u in captured]
            avals = tuple(nodes[R["B"][R["first"]][k]].aval for k in R["carries"])
            loc = nodes[R["B"][R["first"]][0]].loc
            sid = add("scan", ops, dict(body=body, length=R["last"] - R["first"],
                                        n_carry=len(avals), n_xs=0, start=None,
                                        reverse=False), avals, loc)
            R["projs"] = [add("proj", (sid,), {"index": c}, a, loc) for c, a in enumerate(avals)]
            if explain:
                where = f"{os.path.basename(loc[0])}:{loc[1]}" if loc else "?"
                print(f"tracegrad: rolled a Python loop at {where}: {R['last'] - R['first']} "
                      f"iterations of {R['p']} ops into one scan node", file=sys.stderr)
        if n.id in removed:
            continue
        new_id[n.id] = add(n.op, [ref(u) for u in n.inputs], n.attrs, n.aval, n.loc, n.value,
                           n.name)
    T.nodes = new_nodes
    T.inputs = [new_id[v] for v in T.inputs]
    T.outputs = [ref(v) for v in T.outputs]
    T._cse = {}
    T._consts = {k: new_id[v] for k, v in T._consts.items() if v in new_id}
    T._aliased = {}
    T._hash = None


def _roll_body(T, R):
    """One iteration as a Body: (carries..., values from before the loop...)
    -> carries.  Returns (body, the outer node ids it reads)."""
    from tracegrad.ops.control import Body
    nodes = T.nodes
    tmpl, carries, p = R["tmpl"], R["carries"], R["p"]
    rep = R["B"][max(R["first"], 1)]
    BT = Trace(T.backend, is_body=True)
    carry_in = {}
    for k in carries:
        a = nodes[rep[k]].aval
        carry_in[k] = BT.new_input(a, f"carry_{k}").id
    outer, captured = {}, []
    for ks in tmpl:
        for kind, u in ks:
            if kind == "out" and nodes[u].op != "const" and u not in outer:
                outer[u] = BT.new_input(_aval_of_node(nodes[u]), f"outer_{len(captured)}").id
                captured.append(u)
    env = {}
    for j in range(p):
        n = nodes[rep[j]]
        ids = []
        for kind, u in tmpl[j]:
            if kind == "in":
                ids.append(env[u])
            elif kind == "carry":
                ids.append(carry_in[u])
            elif nodes[u].op == "const":
                ids.append(BT.const(nodes[u].value))
            else:
                ids.append(outer[u])
        env[j] = BT._add(n.op, tuple(ids), dict(n.attrs), n.aval, n.loc).id
    BT.outputs = [env[k] for k in carries]
    return Body(BT.nodes, BT.inputs, BT.outputs, T.backend, BT.structure_hash()), captured


def _aval_of_node(n):
    a = n.aval
    return a if isinstance(a, Aval) else Aval((), np.result_type(a))
