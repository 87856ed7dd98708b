"""Python ``for i in range(...)`` loops of a traced function, rewritten into
one scan node *before* they run, so tracing does not grow with the trip count.

``tracegrad.frontend.trace.roll_loops`` rolls a loop after tracing has run every
iteration: the graph stops growing, but the trace itself still costs about
0.1 ms an iteration.  This module goes one step earlier, as TensorFlow's
autograph does: it reads the function's source, and turns each loop

    for i in range(a, b):        # the body assigns x, v (plain names only)
        <body>

into a nested function ``def body(i, x, v): <body>; return (x, v)`` and a
call ``x, v, i = for_range(range, (a, b), body, ("x", "v"), "i")``.  At run
time ``for_range`` runs the first ``PEELED`` iterations as written (they give
the carried values their steady shapes and dtypes), then traces ``body``
once on symbolic carries and binds a scan node for the rest.

The rewrite must never change what is computed, so it is conservative:

* Only loops over the builtin ``range`` with no ``else``, ``break``,
  ``continue``, ``return``, ``yield``, ``del``, ``try``, ``with``, nested
  ``for``/``while`` (other than loops rewritten themselves), nested
  functions or lambdas, and whose statements are assignments to plain names
  (``x = ...``, ``x += ...``, ``a, b = ...``) or to items of plain local
  names (``out[i] = f(out[i - 1])``, ``acc[i, j] += v``: ``out`` is carried
  and updated in place, as ``x += ...`` is), ``if`` on such statements and
  ``pass``.  A statement that is only a call (``hist.append(x)``), an
  assignment to an attribute or to an item of anything else (``a.b[i]``,
  ``a[i][j]``, a global), ``global``/``nonlocal`` anywhere in the function:
  the loop stays a Python loop (and may still be rolled after tracing).
* At run time the body is traced twice and both traces must be the same
  graph reading the same values; carried values that are not arrays (Python
  numbers, objects) must come out of an iteration unchanged; arrays keep
  their shapes and dtypes.  An array updated in place (by item or ``+=``)
  must be a traced array sharing memory with nothing the loop or the body
  reads (not a view, no carried view of it, no view of it taken before the
  loop read inside: ``_aliasing``).  Inside the body the loop index stands
  for a Python int, so ``out[i]`` is a view of ``out`` as in the loop as
  written (``Trace.python_ints``).  Anything else, and any error while tracing the
  body symbolically, raises ``RetraceAsWritten``, and the caller traces the
  function again as the user wrote it (see ``tracegrad.frontend.trace.trace_function``).
* Short loops (fewer than ``ROLL_MIN_STEPS`` iterations or ``ROLL_MIN_NODES``
  recorded ops in all) run as written: unrolled, they compile fast and the
  buffer planner reuses their arrays.

``TRACEGRAD_ROLL=0`` turns the rewrite off with rolling; ``TRACEGRAD_EXPLAIN=1``
names each rewritten loop (and each one traced as written, with the reason).
"""
from __future__ import annotations

import ast
import builtins
import inspect
import linecache
import os
import sys
import textwrap
import threading
import types

import numpy as np

from tracegrad.frontend import branch_rewrite
from tracegrad.frontend.branch_rewrite import (_PREFIX, _SCOPE_READERS, UNBOUND, _explain,
                                               loop_checkpoint)
from tracegrad.ops import control

ROLL_MIN_STEPS = 4      # fewer iterations stay unrolled
ROLL_MIN_NODES = 256    # nor loops of fewer recorded ops in all
PEELED = 2              # iterations run as written before the loop node

_RT = "__tg_rt"         # the local name under which rewritten code reaches this module


class RetraceAsWritten(BaseException):
    """A rewritten loop cannot stand for the user's loop: trace the function
    again without the rewrite.  A BaseException, so that a user's ``except
    Exception`` around the loop does not take it for an error of theirs."""


def enabled():
    return os.environ.get("TRACEGRAD_ROLL", "1").strip().lower() not in ("0", "false", "no", "off")


# --- the source rewrite ----------------------------------------------------------------------

_REFUSED_EXPRESSIONS = (ast.Lambda, ast.NamedExpr, ast.Yield, ast.YieldFrom, ast.Await)
_names_stored = branch_rewrite.names_stored
_names_items_written = branch_rewrite.names_items_written
_names_loaded = branch_rewrite.names_loaded
_locate = branch_rewrite.locate


def _written_first(stmts, name, generated):
    """Does every iteration assign ``name`` before reading it?  (Then the
    value it enters an iteration with is never read.)"""
    for s in stmts:
        if id(s) in generated:      # a rewritten inner loop reads what it names
            if name in {n.id for n in ast.walk(s) if isinstance(n, ast.Name)}:
                return False
            continue
        if isinstance(s, ast.AugAssign):
            reads = _names_loaded(s.value) | _names_loaded(s.target) | (
                {s.target.id} if isinstance(s.target, ast.Name) else set())
        elif isinstance(s, ast.Assign):   # y[index] = v reads y (and the index)
            reads = _names_loaded(s.value).union(*(_names_loaded(t) for t in s.targets))
        elif isinstance(s, ast.AnnAssign):
            reads = _names_loaded(s.value)
        else:
            reads = _names_loaded(s)
        if name in reads:
            return False
        if isinstance(s, (ast.Assign, ast.AnnAssign)) and name in _names_stored([s]):
            return True
    return False


def _plain_target(t):
    if isinstance(t, ast.Name):
        return True
    if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name):
        return True     # y[index] = v (y a plain name): y is carried
    if isinstance(t, (ast.Tuple, ast.List)):
        return all(_plain_target(e) for e in t.elts)
    return False


_STATEMENT_WORDS = {
    ast.Expr: "is a call made for its effect (such as list.append)",
    ast.Break: "is a break", ast.Continue: "is a continue", ast.Return: "is a return",
    ast.For: "is a loop kept as written", ast.While: "is a while loop",
    ast.Try: "is a try statement", ast.With: "is a with statement", ast.Delete: "is a del",
    ast.Raise: "raises", ast.Assert: "is an assert", ast.FunctionDef: "defines a function",
    ast.ClassDef: "defines a class", ast.Import: "imports", ast.ImportFrom: "imports",
}


def _why_not(stmts, generated):
    """None when every statement may be rewritten, else the reason."""
    for s in stmts:
        if id(s) in generated:
            continue
        if isinstance(s, ast.Assign):
            if not all(_plain_target(t) for t in s.targets):
                return f"line {s.lineno} assigns to an attribute or an item of an expression"
            value = ast.Tuple(elts=[s.value] + s.targets, ctx=ast.Load())
        elif isinstance(s, ast.AugAssign):
            if not (isinstance(s.target, ast.Name) or (isinstance(s.target, ast.Subscript)
                                                      and isinstance(s.target.value, ast.Name))):
                return f"line {s.lineno} assigns to an attribute or an item of an expression"
            value = ast.Tuple(elts=[s.value, s.target], ctx=ast.Load())
        elif isinstance(s, ast.AnnAssign):
            if not isinstance(s.target, ast.Name) or s.value is None:
                return f"line {s.lineno} assigns to an attribute or an item"
            value = s.value
        elif isinstance(s, ast.If):
            why = _why_not(s.body, generated) or _why_not(s.orelse, generated)
            if why:
                return why
            value = s.test
        elif isinstance(s, ast.Pass):
            continue
        elif isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant):
            continue
        else:
            return f"line {s.lineno} {_STATEMENT_WORDS.get(type(s), 'is a ' + type(s).__name__ + ' statement')}"
        for node in ast.walk(value):
            if isinstance(node, _REFUSED_EXPRESSIONS) and not getattr(node, "_tg_generated", False):
                return f"line {s.lineno} has a {type(node).__name__}"
            if isinstance(node, ast.Name) and node.id in _SCOPE_READERS:
                return f"line {s.lineno} calls {node.id}()"
    return None


class _Rewriter(branch_rewrite.ControlFlowRewriter):
    """Rolls ``for`` loops over ``range`` (``loops``) and, with ``control``,
    converts the control flow on values (``branch_rewrite``)."""

    def __init__(self, local_names=(), control=False, loops=True):
        super().__init__(control)
        self.local_names = set(local_names)   # the function's own local variables
        self.loops = loops
        self.rolled = 0

    def visit_For(self, node):
        if self.control:
            jumps = self.convert_for_with_jumps(node)
            if jumps is not None:
                return jumps
        self.generic_visit(node)     # inner loops first
        if not self.loops:
            return node
        why = self._why_not(node)
        if why:
            self.skipped.append((node.lineno, why))
            return node
        self.count += 1
        self.rolled += 1
        var = node.target.id
        carried = _names_stored(node.body)
        index = var
        if var in carried:    # the body assigns the loop variable (an inner loop over it)
            index = f"{_PREFIX}index"
        fname = f"{_PREFIX}body_{node.lineno}_{self.count}"
        loc = dict(lineno=node.lineno, col_offset=node.col_offset,
                   end_lineno=node.lineno, end_col_offset=node.col_offset)

        def parse(src):
            stmts = ast.parse(textwrap.dedent(src)).body
            for s in stmts:
                for n in ast.walk(s):
                    if "lineno" in n._attributes:
                        n.lineno, n.col_offset = loc["lineno"], loc["col_offset"]
                        n.end_lineno, n.end_col_offset = loc["end_lineno"], loc["end_col_offset"]
            return stmts

        # An unbound name enters as UNBOUND and is unbound again inside, so
        # reading it raises UnboundLocalError as in the loop as written.
        prologue = parse("\n".join(f"if {n} is {_RT}.UNBOUND:\n    del {n}" for n in carried))
        definite = set()
        for s in node.body:
            if isinstance(s, (ast.Assign, ast.AnnAssign, ast.AugAssign)) \
                    and id(s) not in self.generated:
                definite.update(_names_stored([s]))
        if index != var:
            definite.add(var)
        epilogue = parse("\n".join(
            f"try:\n    {_PREFIX}out_{n} = {n}\nexcept NameError:\n    {_PREFIX}out_{n} = {_RT}.UNBOUND"
            for n in carried if n not in definite))
        ret = "return (" + "".join(
            (f"{n}, " if n in definite else f"{_PREFIX}out_{n}, ") for n in carried) + ")"
        body_def = ast.FunctionDef(
            name=fname,
            args=ast.arguments(posonlyargs=[], args=[ast.arg(arg=a) for a in [index] + carried],
                               kwonlyargs=[], kw_defaults=[], defaults=[]),
            body=prologue + (parse(f"{var} = {index}") if index != var else []) + node.body
            + epilogue + parse(ret),
            decorator_list=[], returns=None, type_comment=None, **loc)
        _locate(body_def, loc)
        targets = ", ".join(carried + [var if index == var else f"{_PREFIX}last"])
        written_first = tuple(n == var or _written_first(node.body, n, self.generated)
                              for n in carried)
        written_items = _names_items_written(node.body)
        items = tuple(n in written_items for n in carried)
        # an in-place update anywhere in the body (y[i] = v, y += v, inner loops too)
        writes = any(isinstance(n, ast.AugAssign) or (isinstance(n, ast.Subscript) and
                                                      isinstance(n.ctx, ast.Store))
                     for s in node.body for n in ast.walk(s))
        call = parse(f"({targets},) = {_RT}.for_range(range, (), {fname}, {tuple(carried)!r}, "
                     f"{written_first!r}, {var!r}, {node.lineno}, {items!r}, {writes!r})")[0]
        call.value.args[1] = ast.Tuple(elts=node.iter.args, ctx=ast.Load(), **loc)
        unbind = parse("\n".join(f"if {n} is {_RT}.UNBOUND:\n    del {n}"
                                 for n in carried + ([var] if index == var else [])))
        out = [body_def, call] + unbind
        for s in out:
            self.generated.add(id(s))
        return out

    def _why_not(self, node):
        if node.orelse:
            return "it has an else clause"
        if not isinstance(node.target, ast.Name):
            return "its target is not a plain name"
        it = node.iter
        if not (isinstance(it, ast.Call) and isinstance(it.func, ast.Name)
                and it.func.id == "range" and not it.keywords and 1 <= len(it.args) <= 3
                and not any(isinstance(a, ast.Starred) for a in it.args)):
            return "it is not a loop over range(...)"
        why = _why_not(node.body, self.generated)
        if why:
            return why
        # the carried names become the function's locals: an item assignment
        # into a global or a closure variable (not bound by the function) stays
        for name in sorted(_names_items_written(node.body)):
            if name not in self.local_names:
                return f"it writes into the items of '{name}', which is not a local variable"
        return None


def _function_refused(tree):
    for n in ast.walk(tree):
        if isinstance(n, (ast.Global, ast.Nonlocal)):
            return "it declares global or nonlocal names"
        if isinstance(n, (ast.Yield, ast.YieldFrom, ast.Await)):
            return "it is a generator or a coroutine"
    return None


_MEMO = {}     # (code object, control, loops) -> its rewritten code, or None


def _rewritten_code(code, control=False, loops=True):
    key = (code, control, loops)
    if key in _MEMO:
        return _MEMO[key]
    if len(_MEMO) > 1024:
        _MEMO.clear()
    _MEMO[key] = result = _rewrite_code(code, control, loops)
    return result


def _rewrite_code(code, control=False, loops=True):
    """The code of the function ``code`` with its loops rewritten (``loops``)
    and its control flow on values converted (``control``), or None.

    The whole source file is parsed and compiled again with the function
    replaced, so the function is compiled exactly where it was (inside its
    class or enclosing function, under the module's imports and
    ``__future__`` flags), and the file compiled unchanged must give back
    ``code`` itself: a file edited since it was imported is not rewritten."""
    source = "".join(linecache.getlines(code.co_filename))
    if not source:
        return None
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    fdef = _find_def(tree, code)
    if fdef is None or _function_refused(fdef) or not (
            control or any(isinstance(n, ast.For) for n in ast.walk(fdef))):
        return None
    if not _same_code(_find_code(_compile_file(tree, source, code.co_filename), code), code):
        _explain(f"kept the loops of {code.co_qualname} as written: its source file changed "
                 f"since it was imported")
        return None
    rw = _Rewriter(code.co_varnames + code.co_cellvars, control, loops)
    if isinstance(fdef, ast.Lambda):
        # an expression only: its conditional expressions, and/or/not,
        # comparisons and min/max; the module reached through a keyword-only
        # parameter that ``rewrite`` gives its default
        fdef.body = rw.visit(fdef.body)
        if not rw.converted:
            return None
        fdef.args.kwonlyargs.append(ast.arg(arg=branch_rewrite._CF))
        fdef.args.kw_defaults.append(None)
        return _compiled_again(tree, code)
    returns = control and (branch_rewrite.loop_returns_to_flags(fdef)
                           | branch_rewrite.returns_to_result(fdef))
    body = []
    for s in fdef.body:
        r = rw.visit(s)
        body.extend(r if isinstance(r, list) else [r])
    for line, why in rw.skipped:
        _explain(f"kept the Python statement at {os.path.basename(code.co_filename)}:{line} "
                 f"as written: {why}")
    if not rw.rolled and not rw.converted and not returns:
        return None
    # the rewritten code reaches these modules through local names
    reach = ast.parse(f"import {__name__} as {_RT}\n"
                      f"import {branch_rewrite.__name__} as {branch_rewrite._CF}").body
    for r in reach:
        _locate(r, dict(lineno=fdef.lineno, col_offset=fdef.col_offset,
                        end_lineno=fdef.lineno, end_col_offset=fdef.col_offset))
    fdef.body = reach + body
    return _compiled_again(tree, code)


def _compiled_again(tree, code):
    """The code of ``code``'s function in the rewritten file ``tree``."""
    ast.fix_missing_locations(tree)
    try:
        compiled = compile(tree, code.co_filename, "exec", dont_inherit=True)
    except (SyntaxError, ValueError, TypeError):
        return None
    new = _find_code(compiled, code)
    if new is None or not set(new.co_freevars) <= set(code.co_freevars):
        return None
    return _renamed_bodies(new, code.co_name, code.co_qualname)


def _find_def(tree, code):
    """The ``def`` statement (or the lambda, alone on its line) of ``code``
    in the parsed file."""
    if code.co_name == "<lambda>":
        found = [n for n in ast.walk(tree) if isinstance(n, ast.Lambda)
                 and n.lineno == code.co_firstlineno]
        return found[0] if len(found) == 1 else None
    for n in ast.walk(tree):
        if isinstance(n, ast.FunctionDef) and n.name == code.co_name:
            first = min([n.lineno] + [d.lineno for d in n.decorator_list])
            if first == code.co_firstlineno:
                return n
    return None


def _find_code(module_code, code):
    """The code object compiled for ``code``'s function in ``module_code``."""
    stack = [module_code] if module_code is not None else []
    while stack:
        c = stack.pop()
        if c.co_qualname == code.co_qualname and c.co_firstlineno == code.co_firstlineno:
            return c
        stack.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    return None


_FILES = {}    # (file name, source) -> the file's code, compiled unchanged


def _compile_file(tree, source, filename):
    key = (filename, hash(source))
    if key not in _FILES:
        if len(_FILES) > 64:
            _FILES.clear()
        try:
            _FILES[key] = compile(tree, filename, "exec", dont_inherit=True)
        except (SyntaxError, ValueError, TypeError):
            _FILES[key] = None
    return _FILES[key]


def _same_code(a, b):
    """Do two code objects run the same instructions on the same constants?"""
    if not isinstance(a, types.CodeType) or not isinstance(b, types.CodeType):
        return False
    if (a.co_code, a.co_names, a.co_varnames, a.co_freevars, a.co_cellvars) != \
            (b.co_code, b.co_names, b.co_varnames, b.co_freevars, b.co_cellvars):
        return False
    if len(a.co_consts) != len(b.co_consts):
        return False
    for x, y in zip(a.co_consts, b.co_consts):
        if isinstance(x, types.CodeType) or isinstance(y, types.CodeType):
            if not _same_code(x, y):
                return False
        elif type(x) is not type(y) or repr(x) != repr(y):
            return False
    return True


def _renamed_bodies(code, name, qualname):
    """Loop bodies carry the user's function name (tracebacks, source
    locations of the graph)."""
    consts = tuple(_renamed_bodies(c, name, qualname) if isinstance(c, types.CodeType)
                   and c.co_name.startswith(_PREFIX) else c for c in code.co_consts)
    if code.co_name.startswith(_PREFIX):
        return code.replace(co_consts=consts, co_name=name, co_qualname=qualname)
    return code.replace(co_consts=consts, co_qualname=qualname)


def _may_rewrite(code, control=False):
    """The cheap tests first: most functions have no loop over ``range``."""
    return (control or "range" in code.co_names) and not code.co_flags & (
        inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR)


def rewrite(fn, control=False, loops=True):
    """``fn`` with its ``for ... in range(...)`` loops rewritten into scan
    nodes (``loops``) and its control flow on values converted into cond and
    while nodes (``control``), or None when there is nothing to rewrite (or
    no source to read)."""
    if not enabled():
        return None
    if isinstance(fn, types.MethodType):
        f = rewrite(fn.__func__, control, loops)
        return None if f is None else types.MethodType(f, fn.__self__)
    if not isinstance(fn, types.FunctionType):
        return None
    code = fn.__code__
    if not _may_rewrite(code, control):
        return None
    new = _rewritten_code(code, control, loops)
    if new is None:
        return None
    cells = dict(zip(code.co_freevars, fn.__closure__ or ()))
    g = types.FunctionType(new, fn.__globals__, fn.__name__, fn.__defaults__,
                           tuple(cells[v] for v in new.co_freevars))
    g.__kwdefaults__ = fn.__kwdefaults__
    if new.co_kwonlyargcount > code.co_kwonlyargcount:    # a lambda: the module it reaches
        g.__kwdefaults__ = {**(fn.__kwdefaults__ or {}), branch_rewrite._CF: branch_rewrite}
    g.__qualname__, g.__module__, g.__doc__ = fn.__qualname__, fn.__module__, fn.__doc__
    g.__dict__.update(fn.__dict__)
    return g


_LIBRARY_DIRS = None


def _library_code(code):
    """Is ``code`` from Python's own library, an installed package or
    tracegrad?  (Their loops are not the user's to rewrite.)"""
    global _LIBRARY_DIRS
    if _LIBRARY_DIRS is None:
        import sysconfig
        paths = sysconfig.get_paths()
        _LIBRARY_DIRS = tuple({os.path.realpath(paths[k]) + os.sep
                               for k in ("stdlib", "platstdlib", "purelib", "platlib")
                               if paths.get(k)}
                              | {os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep})
    name = code.co_filename
    return name.startswith("<") or os.path.realpath(name).startswith(_LIBRARY_DIRS)


class CalledFunctions:
    """The loops of the user's functions that the compiled function calls
    (by a global or closure name) are rewritten in place while it is traced:
    the function object keeps its identity (``method is rk4`` still holds,
    dictionaries keyed by it still find it) and runs the rewritten code until
    ``restore()``.  Only the user's own code (not the standard library,
    installed packages or tracegrad), and only with a loop over ``range``.
    The rewritten code means the same wherever it runs, so another thread
    calling the function meanwhile gets the same results."""
    _lock = threading.Lock()
    _swapped = {}       # function -> [its own code, how many traces use the rewrite]

    def __init__(self, control=False, loops=True):
        self.mine = []
        self.control, self.loops = control, loops

    def enter(self, fn):
        """Make ``fn`` run its rewritten code (if it has any) until restore()."""
        if type(fn) is not types.FunctionType or not _may_rewrite(fn.__code__, self.control) \
                or not enabled():
            return
        code = fn.__code__
        with self._lock:
            entry = self._swapped.get(fn)
            if entry is None:
                if _library_code(code):
                    return
                new = _rewritten_code(code, self.control, self.loops)
                if new is None or new.co_freevars != code.co_freevars \
                        or new.co_kwonlyargcount != code.co_kwonlyargcount:
                    return
                entry = self._swapped[fn] = [code, 0]
                fn.__code__ = new
            entry[1] += 1
        self.mine.append(fn)

    def enter_methods(self, obj, depth=0, seen=None):
        """The methods of the user's classes that a traced callable object
        (an ``nn.Module``, a bound method's object) reaches through itself
        and its attributes (sub-modules, lists and dicts of them): their
        code is rewritten as a called function's is (``self.forward(x)`` is
        an attribute lookup, which no global or closure name shows)."""
        seen = set() if seen is None else seen
        if isinstance(obj, types.MethodType):
            obj = obj.__self__
        if depth > 3 or id(obj) in seen or isinstance(obj, (types.FunctionType, type,
                                                             types.ModuleType)):
            return
        seen.add(id(obj))
        if isinstance(obj, (list, tuple)):
            for v in obj[:64]:
                self.enter_methods(v, depth + 1, seen)
            return
        if isinstance(obj, dict):
            for v in list(obj.values())[:64]:
                self.enter_methods(v, depth + 1, seen)
            return
        cls = type(obj)
        if cls.__module__ in ("builtins", "numpy") or not hasattr(obj, "__dict__"):
            return
        for klass in cls.__mro__:
            for v in vars(klass).values():
                if type(v) is types.FunctionType:
                    self.enter(v)
        for v in list(vars(obj).values())[:256]:
            if isinstance(v, (list, tuple, dict)) or (hasattr(v, "__dict__") and not isinstance(
                    v, np.ndarray)):
                self.enter_methods(v, depth + 1, seen)

    def restore(self):
        with self._lock:
            for fn in reversed(self.mine):
                entry = self._swapped[fn]
                entry[1] -= 1
                if entry[1] == 0:
                    fn.__code__ = entry[0]
                    del self._swapped[fn]
        self.mine = []


# --- the loop at run time ----------------------------------------------------------------------

def _run_as_written(r, body, carry, last=UNBOUND):
    """The loop as written; (carried values..., the loop variable's last value)."""
    for last in r:
        carry = body(last, *carry)
    return carry + (last,)


def _is_tracer(x):
    return hasattr(x, "_trace")


def _same_python_value(a, b):
    if a is b or (branch_rewrite._absent(a) and branch_rewrite._absent(b)):
        return True
    if type(a) is not type(b) or not isinstance(a, (bool, int, float, complex, str, bytes)):
        return False
    return a == b


def _derived(tracer):
    """Node ids of ``tracer``'s trace computed from its value (itself too)."""
    t, root = tracer._trace, tracer.id
    seen = {root}
    for n in t.nodes[root + 1:]:
        if any(u in seen for u in n.inputs):
            seen.add(n.id)
    return seen


def _ambiguous_view(body_trace):
    """A row read at a traced 0-d integer not known to be a Python int or a
    NumPy integer in the loop as written (``Trace.python_int_nodes``: the
    loop index's arithmetic, elements read out of arrays, reductions): NumPy
    gives a view for a NumPy integer and a copy for a 0-d array, and the
    trace recorded a copy, which differs from a view once an array is
    updated in place."""
    for n in body_trace.nodes:
        if n.op != "getitem" or not getattr(n.aval, "shape", ()):
            continue
        spec = n.attrs.get("index", ())
        arrays = [n.inputs[1 + it[1]] for it in spec if it[0] == "a"]
        if arrays and all(body_trace.nodes[a].aval.shape == () and
                          np.dtype(body_trace.nodes[a].aval.dtype).kind in "iu" for a in arrays) \
                and not body_trace.python_int_nodes(arrays):
            return ("the body reads part of an array at a traced 0-d integer that may be a "
                    "NumPy integer (then NumPy's result is a view) or a 0-d array (a copy), "
                    "and an array is updated in place")
    return None


def _aliasing(names, carry, traced_at, in_place, body_trace):
    """Why the loop node cannot stand for a loop that updates a carried
    array in place (``y[i] = v``, ``y += v``), or None.  Inside the body a
    carry is a fresh array, so NumPy's sharing of its memory with other
    arrays would be lost: the carry must not be a view of another array,
    no carry may be a view (of it), and the body must not read, by
    another name, a value computed from it (a view taken before the loop)."""
    if not any(in_place):
        return None
    for k in traced_at:
        c = carry[k]
        if _is_tracer(c) and (getattr(c, "_view", None) is not None
                              or c._trace.shares_memory(c)):
            return (f"'{names[k]}' is a view of another array (or shares its memory) and "
                    f"an array is updated in place in the loop")
    captures = getattr(body_trace, "_captures", None) or {}
    for k, f in zip(traced_at, in_place):
        if f:
            c = carry[k]
            derived = _derived(c)
            if any(tid == id(c._trace) and nid in derived for tid, nid in captures):
                return (f"the body reads a carried array by another name ('{names[k]}' "
                        f"bound to another name, or a view of it, before the loop), which "
                        f"its in-place update changes too")
    return None


def for_range(range_fn, args, body, names, written_first, var, line, items=(), writes=True):
    """Run ``for var in range_fn(*args): names = body(var, *names)``; returns
    the carried values and the loop variable, as a loop node when it pays.
    ``written_first[k]``: the body assigns ``names[k]`` before reading it, so
    the loop node need not carry it (the last iteration, run as written,
    gives its final value).  ``items[k]``: the body assigns items of
    ``names[k]`` (``y[i] = v``): it must be a traced array, updated in place
    as ``y += v`` is.  ``writes``: the body updates some array in place."""
    caller = sys._getframe(1)
    f_locals = caller.f_locals
    init = tuple(f_locals.get(n, UNBOUND) for n in names)
    var_before = f_locals.get(var, UNBOUND)
    r = range_fn(*args)
    if range_fn is not builtins.range or len(r) < max(ROLL_MIN_STEPS, PEELED + 2):
        return _run_as_written(r, body, init, var_before)   # (a user's `range`: any iterable)
    where = f"{os.path.basename(caller.f_code.co_filename)}:{line}"
    carry = _run_as_written(r[:PEELED - 1], body, init)[:-1]
    # the last peeled iteration measures how many ops one iteration records
    traces = {id(t): t for t in (getattr(c, "_trace", None) for c in carry) if t is not None}
    before = {k: len(t.nodes) for k, t in traces.items()}
    carry = body(r[PEELED - 1], *carry)
    traces.update({id(t): t for t in (getattr(c, "_trace", None) for c in carry)
                   if t is not None})
    per_step = sum(len(t.nodes) - before.get(k, 0) for k, t in traces.items())
    rest = r[PEELED:-1]     # the last iteration runs as written too
    if not traces or per_step * len(r) < ROLL_MIN_NODES:
        # nothing traced flows through the loop (it computes constants), or it is small
        return _run_as_written(r[PEELED:], body, carry)
    traced_at = [k for k, c in enumerate(carry) if not written_first[k] and (
        _is_tracer(c) or type(c) is np.ndarray or isinstance(c, np.generic))]
    fixed = {k: c for k, c in enumerate(carry) if k not in set(traced_at) and not written_first[k]}
    for k, c in enumerate(carry):
        if k < len(items) and items[k] and not written_first[k] and not _is_tracer(c):
            _explain(f"traced the Python loop at {where} as written: the body writes into "
                     f"items of '{names[k]}', a {type(c).__name__} (not an array the "
                     f"function traces)")
            raise RetraceAsWritten(f"'{names[k]}' is written by item and is not traced")
    step = rest.step

    def scan_step(i, c, _x):
        body_trace = getattr(i, "_trace", None)
        if body_trace is not None:
            # the loop index stands for a Python int: y[i] is a view of y, as
            # with an int (not a copy, as with a 0-d index array)
            body_trace.python_ints = {i.id}
        if step != 1:
            i = rest.start + i * step
        full = list(carry)      # the written-first values are not read
        for k, v in zip(traced_at, c):
            full[k] = v
        for k, v in fixed.items():
            full[k] = v
        out = body(i, *full)
        for k, v in fixed.items():
            if not _same_python_value(v, out[k]):
                raise RetraceAsWritten(f"'{names[k]}' ({type(v).__name__}) changes from one "
                                       f"iteration to the next and is not an array")
        outs = [out[k] for k in traced_at]
        for k, v, o in zip(traced_at, c, outs):
            a = getattr(o, "aval", None) if _is_tracer(o) else (
                np.asarray(o) if isinstance(o, (np.ndarray, np.generic)) else None)
            if a is None or tuple(a.shape) != tuple(v.aval.shape) or a.dtype != v.aval.dtype:
                raise RetraceAsWritten(f"'{names[k]}' changes its type, shape or dtype")
        # NumPy's meaning of `x += ...` is an update of the array every name
        # bound to it sees: a carry that comes out as the object it went in
        # as is updated in place after the loop too (a NumPy array that is
        # not traced cannot be)
        in_place[:] = [o is v for v, o in zip(c, outs)]
        if any(f and not _is_tracer(carry[k]) for k, f in zip(traced_at, in_place)):
            raise RetraceAsWritten("a NumPy array is updated in place")
        if len({id(o) for o in outs}) != len(outs):
            raise RetraceAsWritten("two carried names are bound to one array")
        why = (_ambiguous_view(body_trace) if writes and body_trace is not None else None) \
            or _aliasing(names, carry, traced_at, in_place, body_trace)
        if why:
            raise RetraceAsWritten(why)
        return tuple(outs), None

    in_place = []

    init_traced = tuple(carry[k] for k in traced_at)
    checkpoint = loop_checkpoint()
    if checkpoint is not None:     # a bad value, or a budget too small, is said here
        control._checkpoint_every(checkpoint, len(rest), sum(
            int(np.prod(np.shape(c))) * np.dtype(c.dtype).itemsize for c in init_traced))
    # the index is a Python int in the loop as written: in torch code, a
    # torch value (a 0-d integer tensor promotes as a Python int does there)
    faces = {getattr(c, "_face", "numpy") for c in init_traced if _is_tracer(c)}
    face = "torch" if faces == {"torch"} else "numpy"
    # A scan node may pass an operand through, so tracing marks its operands
    # and results as sharing memory; the loop as written shares none (an
    # in-place update is replayed below), so those marks are dropped.
    view_marks = {k: dict(t._aliased) for k, t in traces.items()}
    try:
        out, _ = control._scan_core(scan_step, init_traced, None, len(rest),
                                    rest.start if step == 1 else 0, False, "for loop",
                                    checkpoint=checkpoint, verify=True, index_face=face)
    except RetraceAsWritten as e:
        _explain(f"traced the Python loop at {where} as written: {e}")
        raise
    except control.BodyNotRepeatable as e:
        _explain(f"traced the Python loop at {where} as written: {str(e).split(': ', 1)[1]}")
        raise RetraceAsWritten("the body is not repeatable") from None
    except Exception as e:   # noqa: BLE001 -- the loop as written says what went wrong
        _explain(f"traced the Python loop at {where} as written: its body cannot be traced "
                 f"once for all iterations ({type(e).__name__}: {e})")
        raise RetraceAsWritten(str(e)) from e
    _explain(f"rewrote the Python loop at {where} into one scan node: {len(rest)} iterations "
             f"(the first {PEELED} and the last traced as written)")
    for k, t in traces.items():
        t._aliased = view_marks[k]
    result = list(carry)
    for k, v, f in zip(traced_at, out, in_place):
        if f:   # as Tracer._assign does (the peeled iterations checked it for views)
            carry[k].id = v.id
            v = carry[k]
        result[k] = v
    return body(r[-1], *result) + (r[-1],)
