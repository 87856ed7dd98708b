"""What a traced function depends on besides its arguments: the code it
runs and the closure cells and module globals that code reads.

A trace bakes these in (a global learning rate becomes a constant, a helper's
body becomes graph nodes), so two things key on them:

* ``fingerprint(*fns)``: a hash of the code reached from ``fns`` (bytecode,
  constants, and numbers read from globals), for cache keys that must change
  when a helper in another module changes (a custom Function's backward);
* ``Guard``: the closure cells and globals reached, by identity (numbers by
  value), and the Python values the code reads from containers and objects
  it captured (``k[0]``, ``cfg["lr"]``, ``self.scale``: ``reads``),
  checked on every call of a compiled function so that a changed value
  retraces instead of running stale code.  The arrays and random generators
  a trace reads are inputs of the compiled call, read at call time
  (``tracegrad.frontend.captured``); their checks join the guard.

The walk follows plain Python functions reached through globals, closure
cells and module attributes, not into NumPy or tracegrad themselves, and
stops after ``MAX_FUNCTIONS`` functions.
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
    # tracegrad's own wrappers around the user's function (tg.func.vmap's,
    # a partial of static arguments...): their closures lead to it
    wrappers = {id(f) for f in stack}
    while stack and len(funcs) < MAX_FUNCTIONS:
        fn = stack.pop()
        if id(fn) in seen:
            continue
        if not _user_code(fn):
            if id(fn) in wrappers and isinstance(fn, types.FunctionType) \
                    and (fn.__module__ or "").startswith("tracegrad"):
                seen.add(id(fn))
                for cell in fn.__closure__ or ():
                    try:
                        inner = _callables_of(cell.cell_contents)
                    except ValueError:
                        continue
                    wrappers.update(id(f) for f in inner)
                    stack.extend(inner)
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



# --- what the code reads from the objects it captured ------------------------------------------
# A global or closure variable can hold a container or an object whose
# contents change between calls (``k[0] = 30``, ``cfg["lr"] = 0.1``,
# ``self.scale = 2``): the cell still holds the same list, so the checks
# above see nothing.  ``reads`` finds, in the bytecode of the functions
# ``walk`` reaches, each chain of attribute loads and constant subscripts on
# a global, a closure variable or a bound argument (``self``, a partial's
# arguments, a default), and ``Guard`` checks the value at the end of each
# chain on every call, as torch.compile's guards do.  A chain that ends on
# a list, a dict or an object of the user's (iterated, indexed by a
# variable, handed to another function) has its entries checked instead,
# shallowly.  The lookups never run user code: dicts, lists and tuples by
# their own methods, attributes through the instance's ``__dict__`` only
# (a property is not evaluated, and its chain is not checked).

MAX_ENTRIES = 256     # entries of one container checked shallowly (larger: not checked)
_UNSAFE = object()    # a lookup that could run user code, or that failed


class Read:
    """One value the traced code reaches from a captured variable: the
    variable (``kind`` "cell": a closure cell; "global": a module's dict
    and a name; "obj": an object bound to a parameter, such as ``self``),
    then ``steps`` of ("attr", name) / ("item", key)."""
    __slots__ = ("kind", "container", "name", "steps", "desc", "escapes")

    def __init__(self, kind, container, name, steps, desc, escapes=False):
        self.kind = kind
        self.container = container
        self.name = name
        self.steps = steps
        self.desc = desc          # as the user wrote it: cfg['lr'], self.scale, k[0]
        self.escapes = escapes    # the value is used whole (iterated, passed on, ...)

    def value(self):
        """The value now, or _UNSAFE."""
        kind = self.kind
        if kind == "cell":
            try:
                v = self.container.cell_contents
            except ValueError:
                return _UNSAFE
        elif kind == "global":
            v = self.container.get(self.name, _UNSAFE)
        else:
            v = self.container
        for step in self.steps:
            if v is _UNSAFE:
                return v
            v = _step(v, step)
        return v

    def child(self, step, desc):
        return Read(self.kind, self.container, self.name, self.steps + (step,), desc)


def _step(v, step):
    kind, key = step
    if kind == "item":
        t = type(v)
        if t is list or t is tuple:
            if type(key) is int and -len(v) <= key < len(v):
                return v[key]
            return _UNSAFE
        if isinstance(v, dict) and t.__getitem__ is dict.__getitem__:
            try:
                return dict.get(v, key, _UNSAFE)
            except TypeError:
                return _UNSAFE
        return _UNSAFE
    d = _instance_dict(v)
    if d is None or key not in d:
        return _UNSAFE
    if not isinstance(v, types.ModuleType) and hasattr(getattr(type(v), key, None), "__set__"):
        return _UNSAFE    # a property or another data descriptor: reading it runs code
    return d[key]


def _instance_dict(v):
    """A module's or a user object's own attribute dict (None for others)."""
    if isinstance(v, types.ModuleType):
        return vars(v)
    if isinstance(v, (type, types.FunctionType)) or not (
            _users_object(v) or hasattr(type(v), "__tracegrad_state__")):
        return None   # (__tracegrad_state__: a library's object that holds user state, nn.Module)
    try:
        d = object.__getattribute__(v, "__dict__")
    except AttributeError:
        return None
    return d if type(d) is dict else None


def _users_object(v):
    """An instance of a class of the user's (not of Python's library or an
    installed package, nor a builtin container, number or array); a
    ``types.SimpleNamespace`` counts as the user's.  Decided once per class
    (a compiled call's guard asks it for every step of every captured path)."""
    cls = type(v)
    users = _USERS_CLASSES.get(cls)
    if users is None:
        if len(_USERS_CLASSES) > 4096:     # classes made on the fly: keep the table small
            _USERS_CLASSES.clear()
        users = _USERS_CLASSES[cls] = _users_class(cls)
    return users


_USERS_CLASSES = {}   # class -> are its instances the user's objects?


def _users_class(cls):
    if cls is types.SimpleNamespace:
        return True
    mod = getattr(cls, "__module__", "") or ""
    if mod.split(".")[0] in _LIBRARY_ROOTS or issubclass(cls, (list, tuple, dict, set, frozenset)
                                                          + _NUMBERS):
        return False
    return not _is_library(mod)


def _is_library(mod):
    lib = _LIBRARY_MODULES.get(mod)
    if lib is None:
        lib = _LIBRARY_MODULES[mod] = _library_module(mod)
    return lib


_LIBRARY_MODULES = {}   # module name -> is it Python's library or an installed package's?
_LIBRARY_DIRS = []


def _library_module(name):
    import os
    import sys
    if not _LIBRARY_DIRS:
        import sysconfig
        paths = sysconfig.get_paths()
        _LIBRARY_DIRS.extend({os.path.realpath(paths[k]) + os.sep
                              for k in ("stdlib", "platstdlib", "purelib", "platlib")
                              if paths.get(k)})
    mod = sys.modules.get(name)
    f = getattr(mod, "__file__", None)
    if mod is None or f is None:
        return name in sys.builtin_module_names or mod is None and name != "__main__"
    return os.path.realpath(f).startswith(tuple(_LIBRARY_DIRS))


def _is_subscr(ins):
    return ins.opname == "BINARY_SUBSCR" or (ins.opname == "BINARY_OP" and ins.argrepr == "[]")


def _method_load(ins):
    return ins.opname == "LOAD_METHOD" or (ins.opname == "LOAD_ATTR"
                                           and "NULL|self" in (ins.argrepr or ""))


_FAST = ("LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_BORROW")


_CHAINS = {}     # code object -> its chains (each trace asks twice: the scope, the guard)


def _chains(code):
    """(base kind "global"/"deref"/"fast", name, steps, method name or None)
    for each chain of attribute loads and constant subscripts in ``code``
    and the code nested in it (comprehensions, lambdas, inner functions)."""
    got = _CHAINS.get(code)
    if got is None:
        if len(_CHAINS) > 2048:
            _CHAINS.clear()
        got = _CHAINS[code] = tuple(_find_chains(code))
    return got


def _find_chains(code):
    import dis
    out = []
    try:
        ins = list(dis.get_instructions(code))
    except Exception:  # noqa: BLE001 -- an unusual code object: nothing is read
        ins = []
    i, n = 0, len(ins)
    while i < n:
        op = ins[i].opname
        base = ("global" if op in ("LOAD_GLOBAL", "LOAD_NAME") else
                "deref" if op in ("LOAD_DEREF", "LOAD_CLASSDEREF") else
                "fast" if op in _FAST else None)
        if base is None:
            i += 1
            continue
        name = ins[i].argval
        steps, j, method = [], i + 1, None
        while j < n:
            e = ins[j]
            if e.opname == "LOAD_ATTR" and not _method_load(e):
                steps.append(("attr", e.argval))
                j += 1
            elif e.opname in ("LOAD_CONST", "LOAD_SMALL_INT") and j + 1 < n \
                    and type(e.argval) in (int, str) and _is_subscr(ins[j + 1]):
                steps.append(("item", e.argval))
                j += 2
            else:
                if _method_load(e):
                    method = e.argval
                break
        out.append((base, name, tuple(steps), method))
        i = max(j, i + 1)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            out.extend(_find_chains(c))
    return out


def _step_text(desc, step):
    kind, key = step
    return f"{desc}.{key}" if kind == "attr" else f"{desc}[{key!r}]"


def reads(*roots):
    """The ``Read``s of the code reachable from ``roots``: one per chain of
    attribute loads and constant subscripts on a captured variable, at its
    longest prefix that can be looked up without running user code."""
    found, seen = {}, set()
    todo = []   # (function, {parameter name: bound object, description})

    def add_root(r):
        bound = {}
        if isinstance(r, functools.partial):
            f = r.func
            params = _params(f)
            for p, a in zip(params, r.args):
                bound[p] = (a, f"bound argument {p!r}")
            for k, a in (r.keywords or {}).items():
                bound[k] = (a, f"bound argument {k!r}")
            r = f
        if isinstance(r, types.MethodType):
            params = _params(r.__func__)
            if params:
                bound[params[0]] = (r.__self__, params[0])
            r = r.__func__
        elif callable(r) and not isinstance(r, (types.FunctionType, type)) \
                and _users_object(r):   # a callable object: its __call__ with self bound
            call = getattr(type(r), "__call__", None)
            if isinstance(call, types.FunctionType):
                params = _params(call)
                if params:
                    todo.append((call, {params[0]: (r, "self")}))
        if isinstance(r, types.FunctionType):
            todo.append((r, bound))

    for r in roots:
        add_root(r)
    for f in walk(*roots)[0]:
        todo.append((f, {}))
    while todo and len(seen) < MAX_FUNCTIONS:
        fn, bound = todo.pop(0)
        key = (id(fn), tuple(sorted((k, id(v[0])) for k, v in bound.items())))
        if key in seen or not _user_code(fn):
            continue
        seen.add(key)
        code = fn.__code__
        params = _params(fn)
        defaults = dict(zip(params[len(params) - len(fn.__defaults__ or ()):],
                            fn.__defaults__ or ()))
        defaults.update(fn.__kwdefaults__ or {})
        bound = {**{k: (v, k) for k, v in defaults.items()}, **bound}
        cells = dict(zip(code.co_freevars, fn.__closure__ or ()))
        g = fn.__globals__
        for base, name, steps, method in _chains(code):
            if base == "global":
                if name not in g:
                    continue
                r = Read("global", g, name, (), name)
            elif base == "deref":
                if name not in cells:
                    continue   # a variable of this function that an inner one reads
                r = Read("cell", cells[name], None, (), name)
            else:
                if name not in bound:
                    continue
                obj, desc = bound[name]
                r = Read("obj", obj, None, (), desc)
            v = r.value()
            if isinstance(v, types.ModuleType) and (v.__name__.split(".")[0] in _LIBRARY_ROOTS
                                                    or _is_library(v.__name__)):
                continue   # np.pi, math.tau, np.random.normal: not the user's state
            for s in steps:
                nv = _step(v, s)
                if nv is _UNSAFE:
                    break
                r = r.child(s, _step_text(r.desc, s))
                v = nv
            else:
                if method is not None and _users_object(v):
                    # obj.method(...): the method's reads of self are this object's
                    m = getattr(type(v), method, None)
                    if isinstance(m, types.FunctionType) and _params(m):
                        todo.append((m, {_params(m)[0]: (v, r.desc)}))
                        method = "followed"
            r.escapes = method != "followed"
            k = (r.kind, id(r.container), r.name, r.steps)
            old = found.get(k)
            if old is None:
                found[k] = r
            else:
                old.escapes |= r.escapes
    return list(found.values())


def _params(fn):
    code = fn.__code__
    return list(code.co_varnames[:code.co_argcount + code.co_kwonlyargcount])


def _by_value(v):
    return type(v) in _NUMBERS or _is_numpy_scalar(v)


def _is_numpy_scalar(v):
    np = _numpy()
    return np is not None and isinstance(v, np.generic)


def _numpy():
    import sys
    return sys.modules.get("numpy")


def _same_value(now, then):
    """Still what the trace saw (numbers and strings by value, -0.0 and 0.0
    told apart; anything else by identity)."""
    if now is then:
        return True
    return type(now) is type(then) and _by_value(then) and repr(now) == repr(then)


def _entries(v):
    """(keys or None, values) of a container or object checked shallowly, or None."""
    t = type(v)
    if t is list or t is tuple:
        return None, tuple(v)
    if isinstance(v, dict):
        return tuple(v), tuple(dict.values(v))
    d = _instance_dict(v)
    if d is not None and not isinstance(v, types.ModuleType):
        return tuple(d), tuple(d.values())
    return None


class Entries:
    """The entries of a container or object a traced function used whole,
    as they were: checked by identity first (fast), then by value."""
    __slots__ = ("obj", "desc", "keys", "values", "ids")

    def __init__(self, obj, desc):
        self.obj = obj
        self.desc = desc
        self.keys, self.values = _entries(obj)
        self.ids = list(map(id, self.values))

    def changed(self):
        got = _entries(self.obj)
        if got is None:
            return self.desc
        keys, values = got
        if keys != self.keys or len(values) != len(self.values):
            return self.desc
        if list(map(id, values)) == self.ids:
            return None
        for now, then in zip(values, self.values):
            if not _same_value(now, then):
                return self.desc
        self.values = values        # equal values in new objects: remember them
        self.ids = list(map(id, values))
        return None


def _same(now, then, by_value):
    """Still what the trace saw: the same object, or for numbers and
    strings an equal value of the same type (repr tells -0.0 from 0.0)."""
    return now is then or (by_value and type(now) is type(then) and repr(now) == repr(then))


class Guard:
    """What a trace read, checked cheaply on each call: the cells and globals
    (by identity, numbers by value), the values at the end of the chains
    ``reads`` finds (``cfg['lr']``, ``k[0]``, ``self.scale``), the entries
    of containers and objects used whole, and the ``checks`` the trace adds
    (each has ``changed()`` -> a description or None: the captured arrays'
    shapes, the arrays frozen into the code, by value)."""
    __slots__ = ("_cells", "_globals", "_paths", "_entries", "_checks", "unchecked")

    def __init__(self, *roots, checks=()):
        _, reads_ = walk(*roots)
        cells, globs = [], []
        for kind, container, name, value in reads_:
            if isinstance(value, types.ModuleType) or value is getattr(builtins, name or "", None):
                continue  # `np` and friends: rebinding a module is not worth a check per call
            by_value = type(value) in _NUMBERS
            entry = (container, name, value, by_value)
            (cells if kind == "cell" else globs).append(entry)
        self._cells = tuple(cells)
        self._globals = tuple(globs)
        paths, entries, seen = [], [], set()
        self.unchecked = []     # what could not be checked, for TRACEGRAD_EXPLAIN
        for r in reads(*roots):
            v = r.value()
            if v is _UNSAFE:
                continue
            if r.steps:
                paths.append((r, v))
            if r.escapes:
                self._add_entries(v, r.desc, entries, seen, depth=2)
        self._paths = tuple(paths)
        self._entries = tuple(entries)
        self._checks = tuple(checks)

    def _add_entries(self, v, desc, out, seen, depth):
        if id(v) in seen or _entries(v) is None:
            return
        seen.add(id(v))
        e = Entries(v, desc)
        if len(e.values) > MAX_ENTRIES:
            self.unchecked.append(f"the entries of {desc} ({len(e.values)}, over "
                                  f"{MAX_ENTRIES})")
            return
        out.append(e)
        if depth > 1:
            keys = e.keys if e.keys is not None else range(len(e.values))
            for k, x in zip(keys, e.values):
                if not _by_value(x):
                    sub = f"{desc}[{k!r}]" if isinstance(v, (list, tuple, dict)) else f"{desc}.{k}"
                    self._add_entries(x, sub, out, seen, depth - 1)

    def __bool__(self):
        """Is there anything to check (a function reading no cells or
        globals needs no check per call)?"""
        return bool(self._cells or self._globals or self._paths or self._entries
                    or self._checks)

    def checks(self):
        return self._checks

    def changed(self):
        """What no longer holds what the trace saw (a description), or None."""
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
        for r, value in self._paths:
            if not _same_value(r.value(), value):
                return r.desc
        for e in self._entries:
            what = e.changed()
            if what is not None:
                return f"an entry of {what}"
        for c in self._checks:
            what = c.changed()
            if what is not None:
                return what
        return None
