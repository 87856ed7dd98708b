"""What a traced function depends on besides its arguments: the code it
runs and the closure cells and module globals that code reads.

A trace bakes these in (a global learning rate becomes a constant, a helper's
body becomes graph nodes), so two things key on them:

* ``fingerprint(*fns)``: a hash of the code reached from ``fns`` (bytecode,
  constants, and numbers read from globals), for cache keys that must change
  when a helper in another module changes (a custom Function's backward);
* ``Guard``: the closure cells and globals reached, by identity (numbers by
  value), checked on every call of a compiled function so that rebinding
  one retraces instead of running stale code.

The walk follows plain Python functions reached through globals, closure
cells and module attributes, not into NumPy or tracegrad themselves, and
stops after ``MAX_FUNCTIONS`` functions.  Mutating an object in place (an
array's elements, a dict's entries) is not seen; the guide says so.
"""
from __future__ import annotations

import builtins
import functools
import hashlib
import types

MAX_FUNCTIONS = 64
_LIBRARY_ROOTS = ("numpy", "tracegrad", "scipy", "jax", "torch", "builtins")
_NUMBERS = (bool, int, float, complex, str, bytes, type(None))


def _user_code(fn):
    """A Python function of the user's (not of a library we trace through)."""
    if not isinstance(fn, types.FunctionType):
        return False
    mod = getattr(fn, "__module__", None) or ""
    return mod.split(".")[0] not in _LIBRARY_ROOTS


def _names(code):
    """Global names read by ``code`` and the code objects nested in it."""
    names = list(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names.extend(_names(c))
    return names


def _callables_of(value):
    """Functions a value makes reachable: itself, what it wraps, or a
    class's methods."""
    if isinstance(value, functools.partial):
        value = value.func
    elif callable(value) and not isinstance(value, type):
        value = getattr(value, "__wrapped__", None) or value   # a decorated function
    if isinstance(value, types.MethodType):
        value = value.__func__
    if isinstance(value, type):
        mod = getattr(value, "__module__", "") or ""
        if mod.split(".")[0] in _LIBRARY_ROOTS:
            return []
        return [v.__func__ if isinstance(v, (staticmethod, classmethod)) else v
                for v in vars(value).values()]
    return [value]


def walk(*roots):
    """(functions, reads): the user functions reached from ``roots``, and
    each read as (kind, container, name, value) with kind "cell" or
    "global"."""
    funcs, reads, seen = [], [], set()
    stack = [f for r in roots for f in _callables_of(r)]
    while stack and len(funcs) < MAX_FUNCTIONS:
        fn = stack.pop()
        if not _user_code(fn) or id(fn) in seen:
            continue
        seen.add(id(fn))
        funcs.append(fn)
        code = fn.__code__
        for cell in fn.__closure__ or ():
            try:
                value = cell.cell_contents
            except ValueError:  # an empty cell: a name assigned later
                continue
            reads.append(("cell", cell, None, value))
            stack.extend(_callables_of(value))
        g = fn.__globals__
        names = _names(code)
        for name in dict.fromkeys(names):
            if name in g:
                value = g[name]
                reads.append(("global", g, name, value))
                if isinstance(value, types.ModuleType):
                    # module.attr: follow the attributes this code names
                    for attr in names:
                        sub = getattr(value, attr, None)
                        if isinstance(sub, types.FunctionType):
                            stack.append(sub)
                else:
                    stack.extend(_callables_of(value))
    return funcs, reads


def _code_digest(h, code):
    h.update(code.co_code)
    h.update(repr(code.co_names).encode())
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            _code_digest(h, c)
        else:
            h.update(repr(c).encode())


def fingerprint(*roots) -> str:
    """A hash of the code reachable from ``roots`` and of the numbers and
    strings it reads from globals and closures."""
    funcs, reads = walk(*roots)
    h = hashlib.sha256()
    for fn in funcs:
        h.update(f"{fn.__module__}.{fn.__qualname__}".encode())
        _code_digest(h, fn.__code__)
    for kind, _, name, value in reads:
        if type(value) in _NUMBERS:
            h.update(f"{kind}:{name}={value!r}".encode())
    return h.hexdigest()[:16]


def _same(now, then, by_value):
    """Still what the trace saw: the same object, or for numbers and
    strings an equal value of the same type (repr tells -0.0 from 0.0)."""
    return now is then or (by_value and type(now) is type(then) and repr(now) == repr(then))


class Guard:
    """The cells and globals a trace read, checked cheaply on each call."""
    __slots__ = ("_cells", "_globals")

    def __init__(self, *roots):
        _, reads = walk(*roots)
        cells, globs = [], []
        for kind, container, name, value in reads:
            if isinstance(value, types.ModuleType) or value is getattr(builtins, name or "", None):
                continue  # `np` and friends: rebinding a module is not worth a check per call
            by_value = type(value) in _NUMBERS
            entry = (container, name, value, by_value)
            (cells if kind == "cell" else globs).append(entry)
        self._cells = tuple(cells)
        self._globals = tuple(globs)

    def __bool__(self):
        """Is there anything to check (a function reading no cells or
        globals needs no check per call)?"""
        return bool(self._cells or self._globals)

    def changed(self):
        """The name of the first cell or global that no longer holds what
        the trace saw, or None."""
        for cell, _, value, by_value in self._cells:
            try:
                now = cell.cell_contents
            except ValueError:
                return "a closure variable"
            if not _same(now, value, by_value):
                return "a closure variable"
        missing = object()
        for g, name, value, by_value in self._globals:
            now = g.get(name, missing)
            if not _same(now, value, by_value):
                return f"the global {name!r}"
        return None
