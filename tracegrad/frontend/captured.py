"""Captured state: the arrays and random generators a traced function reads
without receiving them as arguments, read at call time.

NumPy reads a module-level or closure array when the function runs, so an
update in place between calls (``X[:] = next_batch``, ``data *= 10``) is
seen.  A trace that turned such an array into a constant would keep the old
values.  Instead, while a function is traced with a ``Scope``:

* the arrays and generators it names itself (its globals, closure
  variables, defaults, a partial's bound arguments) are handed to it as
  tracers of implicit inputs (``Trace.lift``; a generator as a
  ``GeneratorProxy``), so everything computed from them is computed at
  call time;
* an array it reaches another way (``self.W``, ``params["W"]``, a helper's
  global), or a view of one, that meets a traced value becomes an implicit
  input where it meets it (``Trace.operand``).

The compiled call passes the very objects (by reference) after the
arguments.  Rebinding one is seen by the guard (``code_deps.Guard``), which
also gets this module's checks: the lifted arrays' shapes and dtypes, and
the arrays that stay constants, by value.  An array the function uses as a
Python value (``if X[0] > 0``, ``int(n[0])``, a boolean mask) cannot be an
input: the trace is made again with that array frozen into the code, and a
change of its values retraces.  ``TRACEGRAD_EXPLAIN=1`` lists what is read at
call time and what is frozen.
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading

import numpy as np

from tracegrad.frontend import code_deps

# a known array that never met a traced value is checked by value up to this
# many elements (a larger one is listed by TRACEGRAD_EXPLAIN as not checked)
VALUE_CHECK_MAX = 4096
_SCAN_DEPTH = 3     # containers and objects searched for arrays, levels deep
_GENERATORS = (np.random.Generator, np.random.RandomState)


def liftable(v):
    """Can ``v`` be an implicit input: an ndarray of a numeric dtype, an
    eager Tensor holding one (its array is passed), or a Generator /
    RandomState?"""
    t = type(v)
    if t is np.ndarray:
        return v.dtype.kind in "biufc"
    if t is np.random.Generator or t is np.random.RandomState:
        return True
    return is_tensor(v) and v._data.dtype.kind in "biufc"


def is_tensor(v):
    """An eager Tensor over a NumPy array (a captured one passes its array)."""
    return hasattr(v, "grad_fn") and type(getattr(v, "_data", None)) is np.ndarray


def array_of(v):
    """The array behind a captured array or Tensor."""
    return v._data if is_tensor(v) else v


def _owner(a):
    """The object that owns an array's memory (NumPy points a view's base at it)."""
    while isinstance(getattr(a, "base", None), np.ndarray):
        a = a.base
    return a if a.base is None else a.base


class _Local(threading.local):
    def __init__(self):
        self.roots = []     # traces that lift, innermost last; None where none may


_local = _Local()


def active_root():
    """The innermost trace of this thread that lifts captured state (None
    when there is none, or while a transform replays graphs)."""
    roots = _local.roots
    return roots[-1] if roots else None


@contextlib.contextmanager
def rooted(trace):
    """While ``trace`` (a trace that lifts, or None) records a function."""
    _local.roots.append(trace)
    try:
        yield
    finally:
        _local.roots.pop()


def suspended():
    """No lifting: graphs are replayed (transforms), not user code."""
    return rooted(None)


def adopt(objs, descs):
    """The captured state of a transformed function called inside a trace:
    the enclosing trace reads it at call time too (its graph is evaluated on
    these objects there)."""
    root = active_root()
    if root is not None and root.scope is not None:
        for o, d in zip(objs, descs):
            root.scope.add(o, d)


class Scope:
    """What one traced function (and the functions traced inside its trace)
    captured: the arrays and generators it can reach, by identity, and
    which of them stay constants."""

    def __init__(self, fn, parent=None, freeze_all=False):
        self.fn = fn
        self.parent = parent
        # freeze_all: nothing is lifted (code that must stand alone, such as
        # the command line's module); what was read is listed (``read_frozen``)
        self.freeze_all = freeze_all
        self.read_frozen = {}   # id -> (object, description)
        self.known = {}      # id -> (object, Read or None, description)
        self.owners = {}     # id of a known array's memory owner -> description
        self.frozen = set()  # ids kept as constants: a trace used them as Python values
        self.frozen_owners = set()   # ids of their memory's owners (views of them too)
        self.attempts = 0
        self.why = {}        # id -> why it is frozen
        self.culprits = set()
        self.named = set()   # ids of the arrays the code names (a chain ends on them)
        self.holders = {}    # id -> (object, description) of the __tracegrad_state__ objects
        self._scan(fn)

    # --- what is reachable ---------------------------------------------------------------
    def _scan(self, fn):
        seen = set()
        if hasattr(type(fn), "__tracegrad_state__"):   # tg.compile(module): its own state
            self._note(fn, code_deps.Read("obj", fn, None, (), "self"), seen, _SCAN_DEPTH)
        for r in code_deps.reads(fn):
            v = r.value()
            if v is not code_deps._UNSAFE:
                if liftable(v):
                    self.named.add(id(v))
                self._note(v, r, seen, _SCAN_DEPTH if r.escapes or not r.steps else 1)

    def _note(self, v, read, seen, depth):
        """``v`` and what it holds (``depth`` levels): its arrays and
        generators are captured state, found where ``read`` says."""
        if id(v) in seen:
            return
        seen.add(id(v))
        if liftable(v):
            self.add(v, read.desc, read)
            return
        stores = getattr(type(v), "__tracegrad_state__", None)
        if stores is not None:
            # an object that keeps its arrays in named dicts of its own, nested
            # (nn.Module: _parameters, _buffers, _modules), is searched through
            # them at any depth: model.layer1.weight is read at call time
            d = code_deps._instance_dict(v) or {}
            self.holders.setdefault(id(v), (v, read.desc))
            for attr in stores:
                store = d.get(attr)
                if type(store) is dict:
                    sread = read.child(("attr", attr), f"{read.desc}.{attr}")
                    for k, x in store.items():
                        self._note(x, sread.child(("item", k), f"{read.desc}.{k}"), seen,
                                   max(depth, 2))
        if depth <= 1:
            return
        got = code_deps._entries(v)
        if got is None or len(got[1]) > code_deps.MAX_ENTRIES:
            return
        keys, values = got
        is_obj = not isinstance(v, (list, tuple, dict))
        for k, x in zip(keys if keys is not None else range(len(values)), values):
            step = ("attr", k) if is_obj else ("item", k)
            desc = f"{read.desc}.{k}" if is_obj else f"{read.desc}[{k!r}]"
            self._note(x, read.child(step, desc), seen, depth - 1)

    def add(self, obj, desc, read=None):
        if id(obj) not in self.known:
            self.known[id(obj)] = (obj, read, desc)
            if not isinstance(obj, _GENERATORS):
                self.owners.setdefault(id(_owner(array_of(obj))), desc)

    def lookup(self, obj):
        """(object, description) for a captured object, or for a view of a
        captured array (described as one); None for anything else."""
        s = self
        while s is not None:
            hit = s.known.get(id(obj))
            if hit is not None and hit[0] is obj:
                return hit[2]
            s = s.parent
        if type(obj) is np.ndarray:
            owner = id(_owner(obj))
            s = self
            while s is not None:
                desc = s.owners.get(owner)
                if desc is not None:
                    return f"a view of {desc}"
                s = s.parent
        return None

    # --- tracing ------------------------------------------------------------------------------
    def may_lift(self, obj, desc):
        if self.freeze_all or id(obj) in self.frozen or (
                self.frozen_owners and not isinstance(obj, _GENERATORS)
                and id(_owner(array_of(obj))) in self.frozen_owners):
            self.read_frozen.setdefault(id(obj), (obj, desc))
            return False
        return True

    def blame(self, trace, nid, why):
        """A traced value made from lifted inputs was used as a Python value:
        those inputs are the culprits (frozen on the next attempt)."""
        for i in _inputs_behind(trace, nid):
            obj = trace.lifted_object(i)
            if obj is not None and not isinstance(obj, _GENERATORS):
                self.culprits.add(id(obj))
                self.why.setdefault(id(obj), why)

    def freeze_for_retry(self, trace, error):
        """After a failed attempt: freeze its culprits (or, where no
        culprit is known, every array it lifted).  False when nothing new
        would be frozen (the error is not about captured state)."""
        self.attempts += 1
        pairs = [(o, d) for o, d in (zip(trace.implicit_src, trace.implicit_desc)
                                     if trace is not None else ())
                 if not isinstance(o, _GENERATORS)]
        lifted = [o for o, _ in pairs]
        new = {c for c in self.culprits if c not in self.frozen}
        if not new or self.attempts > 3:
            new = {id(o) for o in lifted if id(o) not in self.frozen}
            text = str(error).strip()
            line = text.splitlines()[0] if text else type(error).__name__
            for o in lifted:
                self.why.setdefault(id(o), f"tracing failed with it as a traced input "
                                           f"({type(error).__name__}: {line[:160]})")
        if not new:
            return False
        self.frozen |= new
        for o, d in pairs:   # keep the objects of the ids alive while they are frozen
            if id(o) in new:
                self.known.setdefault(id(o), (o, None, d))
                self.frozen_owners.add(id(_owner(array_of(o))))
        self.culprits = set()
        return True

    # --- after a successful trace -------------------------------------------------------------
    def finish(self, trace):
        """The checks the guard of this trace needs, and the EXPLAIN report;
        what this scope learnt joins the enclosing scope's."""
        checks, notes = [], []
        # the Python attributes of a module the function calls (training,
        # p, eps, ...) are read by library code no guard follows: each
        # such object's own attributes are checked (a change retraces)
        for o, d in self.holders.values():
            checks.append(code_deps.Entries(o, d))
            stores = getattr(type(o), "__tracegrad_state__", ())
            for k, x in (code_deps._instance_dict(o) or {}).items():
                if isinstance(x, dict) and k not in stores:   # its hooks, say
                    checks.append(code_deps.Entries(x, f"{d}.{k}"))
        lifted = set()
        for src, obj, desc in zip(trace.implicit_src, trace.implicit, trace.implicit_desc):
            lifted.add(id(src))
            if type(obj) is np.ndarray:
                checks.append(_ShapeCheck(obj, desc))
            if src is not obj:      # a Tensor: its array is passed; `t.data = x` rebinds it
                checks.append(_TensorCheck(src, obj, desc))
            hit = self.known.get(id(src))
            read = hit[1] if hit is not None and hit[0] is src else None
            if read is not None and read.steps:
                checks.append(_PathCheck(read, src))
        for oid, (obj, read, desc) in self.known.items():
            if oid in lifted or isinstance(obj, _GENERATORS):
                continue
            arr = array_of(obj)
            if oid not in self.frozen and oid not in self.named:
                continue   # only held by a container the code uses: not known to be read
            if oid in self.frozen:
                checks.append(_ValueCheck(obj, desc))
                why = self.why.get(oid, "it was used as a Python value")
                notes.append(f"the captured array {desc} ({arr.dtype}{list(arr.shape)}) is "
                             f"frozen into the compiled code: {why}; it is checked by value "
                             f"on every call, and a change retraces")
            elif arr.size <= VALUE_CHECK_MAX:   # named, maybe read in NumPy while tracing
                checks.append(_ValueCheck(obj, desc))
            else:
                notes.append(f"the captured array {desc} ({arr.dtype}{list(arr.shape)}) never "
                             f"met a traced value while tracing: what the function computed "
                             f"from it in NumPy, if anything, is frozen into the compiled code "
                             f"and not checked (over {VALUE_CHECK_MAX} elements); use it in "
                             f"the function itself (a global or closure variable of the "
                             f"compiled function) or pass it as an argument")
        if trace.implicit:
            what = ", ".join(f"{d} ({_describe(o)})" for o, d in
                             zip(trace.implicit_src, trace.implicit_desc))
            notes.insert(0, f"reads at call time, by reference: {what}")
        trace.frozen = [f"{d} ({_describe(o)})" for o, d in self.read_frozen.values()]
        if self.freeze_all:
            checks = []
            notes = [f"frozen into the code (values as they are now): "
                     f"{', '.join(trace.frozen)}"] if trace.frozen else []
        if self.parent is not None:
            for oid, hit in self.known.items():
                self.parent.known.setdefault(oid, hit)
            for o, d in zip(trace.implicit_src, trace.implicit_desc):
                self.parent.add(o, d)
            self.parent.owners.update({k: v for k, v in self.owners.items()
                                       if k not in self.parent.owners})
        return checks, notes


def _describe(obj):
    if type(obj) is np.ndarray:
        return f"{obj.dtype}{list(obj.shape)}"
    if is_tensor(obj):
        return f"Tensor {obj._data.dtype}{list(obj._data.shape)}"
    return type(obj).__name__


def _inputs_behind(trace, nid):
    seen, stack, out = set(), [nid], []
    nodes = trace.nodes
    while stack:
        v = stack.pop()
        if v in seen or v >= len(nodes):
            continue
        seen.add(v)
        n = nodes[v]
        if n.op == "input":
            out.append(v)
        stack.extend(n.inputs)
    return out


def explain(fn, notes, unchecked=()):
    """Print the captured-state report of a trace (TRACEGRAD_EXPLAIN=1)."""
    if not os.environ.get("TRACEGRAD_EXPLAIN"):
        return
    name = getattr(fn, "__qualname__", getattr(fn, "__name__", type(fn).__name__))
    for n in list(notes) + [f"{u} is not checked: a change there is not seen"
                            for u in unchecked]:
        print(f"tracegrad: {name}: {n}", file=sys.stderr)


# --- the checks each call makes --------------------------------------------------------------

class _ShapeCheck:
    """A lifted array still has the shape and dtype the code was made for
    (``a.shape = ...`` changes an array in place)."""
    __slots__ = ("obj", "shape", "dtype", "desc")

    def __init__(self, obj, desc):
        self.obj, self.shape, self.dtype, self.desc = obj, obj.shape, obj.dtype, desc

    def changed(self):
        o = self.obj
        if o.shape != self.shape or o.dtype != self.dtype:
            return f"the shape or dtype of the captured array {self.desc}"
        return None


class _PathCheck:
    """The container entry or attribute a lifted array was found at still
    holds it (``params[0] = new_W`` rebinds it)."""
    __slots__ = ("read", "obj")

    def __init__(self, read, obj):
        self.read, self.obj = read, obj

    def changed(self):
        return None if self.read.value() is self.obj else self.read.desc


class _TensorCheck:
    """A captured Tensor still holds the array passed for it."""
    __slots__ = ("obj", "data", "desc")

    def __init__(self, obj, data, desc):
        self.obj, self.data, self.desc = obj, data, desc

    def changed(self):
        return None if self.obj._data is self.data else f"the captured tensor {self.desc}"


class _ValueCheck:
    """An array frozen into the code still holds the values it held."""
    __slots__ = ("obj", "copy", "desc")

    def __init__(self, obj, desc):
        self.obj, self.copy, self.desc = obj, array_of(obj).copy(), desc

    def changed(self):
        o, c = array_of(self.obj), self.copy
        if o.shape != c.shape or o.dtype != c.dtype:
            return f"the captured array {self.desc}"
        if o.dtype.kind in "fc":
            same = np.array_equal(o, c, equal_nan=True)
        else:
            same = np.array_equal(o, c)
        if not same:
            return f"the values of the captured array {self.desc}"
        return None


def proxy_for(tracer, obj):
    """What the traced function sees for a lifted generator."""
    from tracegrad.ops.random import GeneratorProxy
    return GeneratorProxy(tracer, "Generator" if type(obj) is np.random.Generator
                          else "RandomState")


