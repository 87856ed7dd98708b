"""Python control flow on traced values, rewritten into ``cond`` and
``while`` nodes (TensorFlow's AutoGraph is the precedent).

A function is first traced as written.  When a Python ``if``, ``while``,
``and``/``or``/``not``, conditional expression, chained comparison or
builtin ``min``/``max`` asks for the truth of a traced value (a
``ValueDependentTraceError`` TraceError), the function is traced again with its
source rewritten (``tracegrad.frontend.loop_rewrite`` does the rewriting,
with the transforms of this module): each statement becomes nested
functions and one call into this module, which decides at trace time:

* on a value known at trace time (a Python number, a shape, a constant
  array) the statement runs as Python runs it, branch by branch and
  iteration by iteration;
* on a traced value, ``if`` becomes a ``cond`` node over both branches
  traced as functions of the names they assign, ``while`` a ``while`` node
  whose carry is the names its body assigns, and ``and``/``or``/``min``/
  ``max`` select with ``where``.

Before that, ``break`` and ``continue`` become flags (``_tgv_brk_…``) that
guard the rest of the body, a ``for`` loop over ``range`` that breaks
becomes a ``while`` over an index, and ``return`` inside ``if`` branches
becomes an assignment to one result name returned at the end.

What cannot be a graph node (a branch that prints, appends to a list,
assigns an attribute, raises; branches giving different shapes or dtypes;
a name bound on one path only and read later) raises ``NotConverted`` when
its condition is traced; the compiled function then runs eagerly for that
signature (``tracegrad.api``), with one log line saying where and why.
"""
from __future__ import annotations

import ast
import builtins
import contextlib
import functools
import operator
import os
import sys
import textwrap
import threading

import numpy as np

from tracegrad.ops import control
from tracegrad.ops._define import _ops

_PREFIX = "__tg_"      # names of the rewrite's own functions and temporaries
_VAR = "_tgv_"         # names of the rewrite's own carried variables (flags, results)
_CF = "__tg_cf"        # the local name under which rewritten code reaches this module


class _Unbound:
    """The value of a carried name that is not bound (yet)."""
    __slots__ = ()

    def __repr__(self):
        return "<unbound>"


UNBOUND = _Unbound()


class NotConverted(BaseException):
    """A statement on a traced value cannot become a graph node.  A
    BaseException, so that a user's ``except Exception`` does not take it
    for an error of theirs; ``tracegrad.frontend.trace`` turns it into a
    TraceError naming ``where`` (file:line) and ``reason``."""

    def __init__(self, where, reason):
        super().__init__(f"{where[0]}:{where[1]}: {reason}")
        self.file, self.line = where      # where: (file name, line)
        self.where = f"{os.path.basename(where[0])}:{where[1]}"
        self.reason = reason


def _explain(msg):
    if os.environ.get("TRACEGRAD_EXPLAIN"):
        print(f"tracegrad: {msg}", file=sys.stderr)


def loop_checkpoint():
    """``checkpoint=`` for the loops rewritten from Python source (for and
    while loops), from
    ``TRACEGRAD_LOOP_CHECKPOINT``: unset (every carry stored), ``true``
    (every ceil(sqrt(n))-th), an integer k, or a memory budget such as
    ``50MB`` (the values ``tg.fori_loop`` takes)."""
    v = (os.environ.get("TRACEGRAD_LOOP_CHECKPOINT") or "").strip()
    if not v:
        return None
    if v.lower() in ("true", "yes", "on"):
        return True
    if v.isdigit():
        return int(v)
    return v


# --- reading statements ----------------------------------------------------------------------

def _item_target(node):
    """``y`` for an item assignment target ``y[index]`` (y a plain name)."""
    if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store) \
            and isinstance(node.value, ast.Name) and not node.value.id.startswith(_PREFIX):
        return node.value.id
    return None


def names_stored(stmts):
    """Plain names the statements assign, in order (not inside
    comprehensions or nested functions), and the arrays they update by item
    (``y[i] = v``) or by an in-place call (``y.fill(0)``, ``np.add.at(y, ...)``)."""
    out = []

    def visit(node):
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp,
                             ast.FunctionDef, ast.Lambda)):
            return
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            if not node.id.startswith(_PREFIX) and node.id not in out:
                out.append(node.id)
        name = _item_target(node) or _in_place_call_target(node)
        if name is not None and name not in out:
            out.append(name)
        for child in ast.iter_child_nodes(node):
            visit(child)
    for s in stmts:
        visit(s)
    return out


def names_items_written(stmts):
    """Names whose items the statements assign (``y[i] = v``, ``y[i] += v``)."""
    out = set()
    for s in stmts:
        for n in ast.walk(s):
            name = _item_target(n)
            if name is not None:
                out.add(name)
    return out


def names_loaded(node):
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)
            and isinstance(n.ctx, ast.Load)}


def locate(tree, loc):
    """Give the nodes a rewrite built (they have no source position) ``loc``."""
    for n in ast.walk(tree):
        if "lineno" in n._attributes and getattr(n, "lineno", None) is None:
            for k, v in loc.items():
                setattr(n, k, v)


def parse_at(src, loc):
    """Statements parsed from ``src``, every node placed at ``loc``."""
    stmts = ast.parse(textwrap.dedent(src)).body
    for s in stmts:
        for n in ast.walk(s):
            if "lineno" in n._attributes:
                for k, v in loc.items():
                    setattr(n, k, v)
    return stmts


def loc_of(node):
    return dict(lineno=node.lineno, col_offset=node.col_offset,
                end_lineno=node.lineno, end_col_offset=node.col_offset)


# Array methods and NumPy functions that update their first array in place:
# a statement made of such a call updates the array as ``y[...] = v`` does.
_IN_PLACE_METHODS = {"fill", "sort", "partition", "put", "itemset", "setfield", "clip"}
_IN_PLACE_FUNCTIONS = {"at", "copyto", "put", "place", "putmask", "fill_diagonal",
                       "put_along_axis"}


def _in_place_call_target(node):
    if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)):
        return None
    call = node.value
    f = call.func
    if isinstance(f, ast.Attribute):
        if f.attr in _IN_PLACE_METHODS and isinstance(f.value, ast.Name) \
                and not (f.attr == "clip" and not any(k.arg == "out" for k in call.keywords)):
            return f.value.id
        if f.attr in _IN_PLACE_FUNCTIONS and call.args and isinstance(call.args[0], ast.Name):
            return call.args[0].id
    return None


_SCOPE_READERS = {"locals", "vars", "eval", "exec", "globals", "dir", "super"}

_EFFECT_WORDS = {
    ast.Raise: "raises an exception", ast.Assert: "has an assert", ast.Delete: "has a del",
    ast.Try: "has a try statement", ast.With: "has a with statement",
    ast.Import: "imports", ast.ImportFrom: "imports", ast.Global: "declares a global",
    ast.Nonlocal: "declares a nonlocal",
}


def _unconvertible(stmts):
    """Why these statements cannot be moved into a nested function at all
    (they would mean something else there), or None."""
    for s in stmts:
        for n in ast.walk(s):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
                              ast.Lambda)) and not getattr(n, "_tg_generated", False):
                return f"line {n.lineno} defines a function or class"
            if isinstance(n, (ast.Yield, ast.YieldFrom, ast.Await, ast.Global, ast.Nonlocal)):
                return f"line {n.lineno} has a {type(n).__name__.lower()}"
            if isinstance(n, ast.Name) and n.id in _SCOPE_READERS:
                return f"line {n.lineno} calls {n.id}()"
            if isinstance(n, ast.Return):
                return f"line {n.lineno} returns from inside it"
    if _contains(stmts, (ast.Break, ast.Continue), into_loops=False):
        return "it breaks out of (or continues) a loop kept as written"
    return None


def _effects(stmts):
    """Why these statements cannot run as a traced branch or loop body (what
    they do besides computing values), or None."""
    for s in stmts:
        if isinstance(s, ast.Assign):
            for t in s.targets:
                if not _plain_target(t):
                    return f"assigns to an attribute or to an item of an expression at " \
                           f"line {s.lineno}"
        elif isinstance(s, ast.AugAssign):
            if not _plain_target(s.target):
                return f"assigns to an attribute or to an item of an expression at " \
                       f"line {s.lineno}"
        elif isinstance(s, ast.AnnAssign):
            if not isinstance(s.target, ast.Name):
                return f"assigns to an attribute at line {s.lineno}"
        elif isinstance(s, ast.Expr):
            if isinstance(s.value, ast.Constant) or _in_place_call_target(s) is not None:
                continue
            what = ast.unparse(s.value.func) if isinstance(s.value, ast.Call) else "an expression"
            return f"calls {what} for its effect at line {s.lineno} (such as print or " \
                   f"list.append)"
        elif isinstance(s, (ast.If, ast.While)):
            why = _effects(s.body) or _effects(s.orelse)
            if why:
                return why
        elif isinstance(s, ast.For):
            if not isinstance(s.target, (ast.Name, ast.Tuple)):
                return f"assigns a loop variable to an attribute or item at line {s.lineno}"
            why = _effects(s.body) or _effects(s.orelse)
            if why:
                return why
        elif isinstance(s, (ast.Pass, ast.Break, ast.Continue)):
            continue
        else:
            return f"{_EFFECT_WORDS.get(type(s), 'has a ' + type(s).__name__ + ' statement')} " \
                   f"at line {s.lineno}"
    return None


def _plain_target(t):
    if isinstance(t, ast.Name):
        return True
    if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name):
        return True
    if isinstance(t, ast.Starred):
        return _plain_target(t.value)
    if isinstance(t, (ast.Tuple, ast.List)):
        return all(_plain_target(e) for e in t.elts)
    return False


def _contains(stmts, kinds, into_loops=True):
    """Do the statements hold a node of ``kinds`` (not in nested functions,
    and not in nested loops unless ``into_loops``)?"""
    def visit(n):
        if isinstance(n, kinds):
            return True
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            return False
        if not into_loops and isinstance(n, (ast.For, ast.While, ast.AsyncFor)):
            return False
        return any(visit(c) for c in ast.iter_child_nodes(n))
    return any(visit(s) for s in stmts)


# --- the statements each transform writes ------------------------------------------------------

def carry_function(name, params, body, loc, result=None):
    """``def name(*params): <body>; return (*params,)`` (or ``return result``):
    a name that entered unbound (UNBOUND) is unbound inside, and one the body
    leaves unbound comes out as UNBOUND."""
    prologue = parse_at("\n".join(f"if {p} is {_CF}.UNBOUND:\n    del {p}" for p in params),
                        loc)
    if result is not None:
        tail = [ast.Return(value=result, **loc)]
    else:
        epilogue = parse_at("\n".join(
            f"try:\n    {_PREFIX}out_{p} = {p}\nexcept NameError:\n"
            f"    {_PREFIX}out_{p} = {_CF}.UNBOUND" for p in params), loc)
        tail = epilogue + parse_at("return (" + "".join(f"{_PREFIX}out_{p}, " for p in params)
                                   + ")", loc)
    fdef = ast.FunctionDef(
        name=name,
        args=ast.arguments(posonlyargs=[], args=[ast.arg(arg=p) for p in params],
                           kwonlyargs=[], kw_defaults=[], defaults=[]),
        body=prologue + (body or [ast.Pass(**loc)]) + tail,
        decorator_list=[], returns=None, type_comment=None, **loc)
    locate(fdef, loc)
    return fdef


def unbind(names, loc):
    """``del`` each name that came out of a statement unbound."""
    return parse_at("\n".join(f"if {n} is {_CF}.UNBOUND:\n    del {n}" for n in names), loc)


def _thunk(expr):
    lam = ast.Lambda(args=ast.arguments(posonlyargs=[], args=[], kwonlyargs=[],
                                        kw_defaults=[], defaults=[]), body=expr)
    lam._tg_generated = True
    ast.copy_location(lam, expr)
    return lam


def _rt_call(fname, args, node):
    call = ast.Call(func=ast.Attribute(value=ast.Name(id=_CF, ctx=ast.Load()), attr=fname,
                                       ctx=ast.Load()), args=args, keywords=[])
    ast.copy_location(call, node)
    locate(call, loc_of(node))
    return call


# --- return, break and continue, before the conversion -------------------------------------------

def _always_returns(stmts):
    if not stmts:
        return False
    last = stmts[-1]
    if isinstance(last, (ast.Return, ast.Raise)):
        return True
    if isinstance(last, ast.If):
        return _always_returns(last.body) and _always_returns(last.orelse)
    return False


def _returns_only_through_ifs(stmts):
    """Is every ``return`` reached from here through ``if`` statements only?"""
    for s in stmts:
        if isinstance(s, ast.If):
            if not _returns_only_through_ifs(s.body) or not _returns_only_through_ifs(s.orelse):
                return False
        elif not isinstance(s, ast.Return) and _contains([s], (ast.Return,)):
            return False
    return True


def _absorb(stmts):
    """The statements with what follows an ``if`` that returns moved into
    its branches, so that every ``return`` ends its block."""
    out = []
    for k, s in enumerate(stmts):
        if isinstance(s, ast.Return):
            out.append(s)
            return out            # what follows is never run
        if isinstance(s, ast.If) and _contains([s], (ast.Return,)):
            rest = stmts[k + 1:]
            body = _absorb(s.body)
            orelse = _absorb(s.orelse)
            if rest:
                if not _always_returns(body):
                    body = _absorb(body + [_copy(r) for r in rest])
                if not _always_returns(orelse):
                    orelse = _absorb(orelse + [_copy(r) for r in rest])
            s.body, s.orelse = body, orelse
            out.append(s)
            return out
        out.append(s)
    return out


def _copy(node):
    import copy
    return copy.deepcopy(node)


class _ReturnsToResult(ast.NodeTransformer):
    """``return x`` (at the end of a block) -> ``_tgv_result = x``."""

    def visit_FunctionDef(self, node):
        return node

    visit_AsyncFunctionDef = visit_ClassDef = visit_Lambda = visit_FunctionDef

    def visit_Return(self, node):
        value = node.value if node.value is not None else ast.Constant(value=None)
        a = ast.Assign(targets=[ast.Name(id=f"{_VAR}result", ctx=ast.Store())], value=value)
        ast.copy_location(a, node)
        locate(a, loc_of(node))
        return a


def returns_to_result(fdef):
    """Rewrite the function so that a ``return`` inside ``if`` branches
    assigns one result name returned at the end (so the ``if`` can become a
    ``cond`` node).  False when its returns cannot all be reached that way
    (a return inside a loop or a ``try``): then nothing changes."""
    body = fdef.body
    if not any(isinstance(s, ast.If) and _contains([s], (ast.Return,)) for s in body):
        return False
    if not _returns_only_through_ifs(body):
        return False
    loc = loc_of(body[-1])
    if not _always_returns(body):
        body = body + [ast.Return(value=None, **loc)]   # falling off the end returns None
    body = _absorb(body)
    body = [_ReturnsToResult().visit(s) for s in body]
    fdef.body = body + [ast.Return(value=ast.Name(id=f"{_VAR}result", ctx=ast.Load()), **loc)]
    locate(fdef, loc)
    return True


def _range_for_or_while(node):
    if isinstance(node, ast.While):
        return True
    it = node.iter
    return isinstance(node, ast.For) and _plain_target(node.target) and not (
        isinstance(it, ast.Call) and any(isinstance(a, ast.Starred) for a in it.args))


def _returns_to_break(stmts, flag, value):
    """``return x`` (reached through ifs) -> ``value = x; flag = True; break``."""
    out = []
    for s in stmts:
        if isinstance(s, ast.Return):
            loc = loc_of(s)
            v = s.value if s.value is not None else ast.Constant(value=None)
            assign = ast.Assign(targets=[ast.Name(id=value, ctx=ast.Store())], value=v)
            ast.copy_location(assign, s)
            out += [assign] + parse_at(f"{flag} = True\nbreak", loc)
            return out
        if isinstance(s, ast.If):
            s.body = _returns_to_break(s.body, flag, value)
            s.orelse = _returns_to_break(s.orelse, flag, value)
        out.append(s)
    return out


def loop_returns_to_flags(fdef):
    """A ``return`` inside a ``while`` loop or a ``for`` loop over ``range``
    (reached through ifs) becomes a result and a flag set before a
    ``break``, and the loop is followed by ``if flag: return result``."""
    count = [0]

    def process(stmts):
        out = []
        for s in stmts:
            if isinstance(s, ast.If):
                s.body, s.orelse = process(s.body), process(s.orelse)
            elif isinstance(s, (ast.While, ast.For)):
                s.body, s.orelse = process(s.body), process(s.orelse)   # inner loops first
                if _range_for_or_while(s) and _contains(s.body, (ast.Return,)) \
                        and _returns_only_through_ifs(s.body):
                    count[0] += 1
                    loc = loc_of(s)
                    # `while True:` left only by return: the loop always returns
                    always = isinstance(s, ast.While) and isinstance(s.test, ast.Constant) \
                        and s.test.value is True and not s.orelse \
                        and not _contains(s.body, (ast.Break,), into_loops=False)
                    flag, value = f"{_VAR}ret_{s.lineno}_{count[0]}", \
                        f"{_VAR}retval_{s.lineno}_{count[0]}"
                    s.body = _returns_to_break(s.body, flag, value)
                    after = parse_at(f"return {value}" if always else
                                     f"if {flag}:\n    return {value}", loc)
                    out += parse_at(f"{flag} = False", loc) + [s] + after
                    continue
            out.append(s)
        return out
    fdef.body = process(fdef.body)
    return count[0] > 0


def _guard_jumps(stmts, flags, loc):
    """Statements of a loop body with ``break``/``continue`` replaced by
    setting a flag, and what follows a statement that may have set one run
    only while neither is set."""
    out = []
    for k, s in enumerate(stmts):
        if isinstance(s, ast.Break):
            out += parse_at(f"{flags['break']} = True", loc_of(s))
            return out
        if isinstance(s, ast.Continue):
            out += parse_at(f"{flags['continue']} = True", loc_of(s))
            return out
        if isinstance(s, ast.If) and _contains([s], (ast.Break, ast.Continue), into_loops=False):
            s.body = _guard_jumps(s.body, flags, loc)
            s.orelse = _guard_jumps(s.orelse, flags, loc)
            out.append(s)
            rest = stmts[k + 1:]
            if rest:
                live = ", ".join(f for f in flags.values() if f)
                guard = parse_at(f"if {_CF}.neither({live}):\n    pass", loc_of(s))[0]
                guard.body = _guard_jumps(rest, flags, loc)
                out.append(guard)
            return out
        out.append(s)
    return out


def jumps_to_flags(node, count):
    """A ``while`` (or a ``for`` over ``range``) whose body breaks or
    continues, as statements: flags set before the loop, a ``while`` whose
    test reads the break flag and whose body is guarded, and its ``else``
    run when no break happened.  None when the jumps are not all reached
    through ``if`` statements of the body (inside a ``try``, say)."""
    body = node.body
    if not _contains(body, (ast.Break, ast.Continue), into_loops=False):
        return None
    for s in body:    # jumps only at the top or inside ifs
        if not isinstance(s, (ast.If, ast.Break, ast.Continue)) and \
                _contains([s], (ast.Break, ast.Continue), into_loops=False):
            return None
        if isinstance(s, ast.If) and not _jumps_through_ifs(s):
            return None
    loc = loc_of(node)
    tag = f"{node.lineno}_{count}"
    has_break = _contains(body, (ast.Break,), into_loops=False)
    has_cont = _contains(body, (ast.Continue,), into_loops=False)
    flags = {"break": f"{_VAR}brk_{tag}" if has_break else None,
             "continue": f"{_VAR}cont_{tag}" if has_cont else None}
    before = []
    if has_break:
        before += parse_at(f"{flags['break']} = False", loc)
    if has_cont:
        before += parse_at(f"{flags['continue']} = False", loc)
    start = parse_at(f"{flags['continue']} = False", loc) if has_cont else []
    if isinstance(node, ast.For):
        r, k = f"{_VAR}range_{tag}", f"{_VAR}k_{tag}"
        before += parse_at(f"{r} = {_CF}.as_sequence(None)\n{k} = 0", loc)
        before[-2].value.args = [node.iter]
        test = parse_at(f"{k} < len({r})", loc)[0].value
        start = parse_at(f"{k} = {k} + 1", loc) + start
        assign_var = ast.Assign(targets=[node.target],
                                value=parse_at(f"{_CF}.range_item({r}, {k} - 1)", loc)[0].value)
        ast.copy_location(assign_var, node)
        start = start[:1] + [assign_var] + start[1:]
    else:
        test = node.test
    if has_break:
        test = ast.BoolOp(op=ast.And(), values=[
            ast.UnaryOp(op=ast.Not(), operand=ast.Name(id=flags["break"], ctx=ast.Load())),
            test])
    loop = ast.While(test=test, body=start + _guard_jumps(body, flags, loc), orelse=[])
    ast.copy_location(loop, node)
    after = []
    if node.orelse:
        if has_break:
            guard = parse_at(f"if not {flags['break']}:\n    pass", loc)[0]
            guard.body = node.orelse
            after.append(guard)
        else:
            after += node.orelse
    out = before + [loop] + after
    for s in out:
        locate(s, loc)
    return out


def _jumps_through_ifs(s):
    for b in (s.body, s.orelse):
        for t in b:
            if isinstance(t, ast.If):
                if not _jumps_through_ifs(t):
                    return False
            elif not isinstance(t, (ast.Break, ast.Continue)) and \
                    _contains([t], (ast.Break, ast.Continue), into_loops=False):
                return False
    return True


# --- the conversion of statements and expressions ------------------------------------------------

def _names_from(fname, args, names, reason, node):
    """``(*names,) = __tg_cf.fname(*args, names, line, reason)`` at ``node``."""
    call = _rt_call(fname, args + [ast.Constant(value=tuple(names)),
                                   ast.Constant(value=node.lineno), ast.Constant(value=reason)],
                    node)
    if names:
        stmt = ast.Assign(targets=[ast.Tuple(elts=[ast.Name(id=n, ctx=ast.Store())
                                                   for n in names], ctx=ast.Store())],
                          value=call)
    else:
        stmt = ast.Expr(value=call)
    ast.copy_location(stmt, node)
    locate(stmt, loc_of(node))
    return stmt


class ControlFlowRewriter(ast.NodeTransformer):
    """The transforms for ``if``, ``while`` and the value-dependent
    expressions; ``tracegrad.frontend.loop_rewrite._Rewriter`` adds ``for``.
    ``control`` off: nothing here changes anything."""

    def __init__(self, control=False):
        self.control = control
        self.generated = set()   # ids of statements the rewrite wrote
        self.count = 0
        self.converted = 0
        self.skipped = []        # (line, reason)

    def _mark(self, stmts):
        for s in stmts:
            self.generated.add(id(s))
        return stmts

    def visit_If(self, node):
        if not self.control:
            return self.generic_visit(node)
        why_not = _unconvertible(node.body + node.orelse)
        reason = None if why_not else _effects(node.body + node.orelse)
        self.generic_visit(node)
        if why_not:
            self.skipped.append((node.lineno, f"the if statement: {why_not}"))
            return node
        self.count += 1
        self.converted += 1
        loc = loc_of(node)
        names = names_stored(node.body + node.orelse)
        tag = f"{node.lineno}_{self.count}"
        then_def = carry_function(f"{_PREFIX}then_{tag}", names, node.body, loc)
        else_def = carry_function(f"{_PREFIX}else_{tag}", names, node.orelse, loc)
        stmt = _names_from("if_stmt", [node.test, ast.Name(id=then_def.name, ctx=ast.Load()),
                                       ast.Name(id=else_def.name, ctx=ast.Load())],
                           names, reason, node)
        return self._mark([then_def, else_def, stmt] + unbind(names, loc))

    def visit_While(self, node):
        if not self.control:
            return self.generic_visit(node)
        self.count += 1
        flagged = jumps_to_flags(node, self.count)
        if flagged is not None:
            out = []
            for s in flagged:
                r = self.visit(s)
                out.extend(r if isinstance(r, list) else [r])
            return out
        why_not = _unconvertible(node.body) or (
            "it breaks or continues inside a nested statement"
            if _contains(node.body, (ast.Break, ast.Continue), into_loops=False) else None)
        reason = None if why_not else _effects(node.body)
        self.generic_visit(node)
        if why_not:
            self.skipped.append((node.lineno, f"the while loop: {why_not}"))
            return node
        self.converted += 1
        loc = loc_of(node)
        names = names_stored(node.body)
        tag = f"{node.lineno}_{self.count}"
        test_def = carry_function(f"{_PREFIX}test_{tag}", names, [], loc, result=node.test)
        body_def = carry_function(f"{_PREFIX}loop_{tag}", names, node.body, loc)
        stmt = _names_from("while_stmt", [ast.Name(id=test_def.name, ctx=ast.Load()),
                                          ast.Name(id=body_def.name, ctx=ast.Load())],
                           names, reason, node)
        out = [test_def, body_def, stmt] + unbind(names, loc)
        out += node.orelse      # no break: the else always runs after the loop
        return self._mark(out)

    def convert_for_with_jumps(self, node):
        """A ``for`` over ``range`` that breaks or continues, as a while
        loop (then converted); None for any other loop."""
        if not (self.control and _range_for_or_while(node)):
            return None
        self.count += 1
        flagged = jumps_to_flags(node, self.count)
        if flagged is None:
            return None
        out = []
        for s in flagged:
            r = self.visit(s)
            out.extend(r if isinstance(r, list) else [r])
        return out

    # -- expressions --
    def visit_BoolOp(self, node):
        self.generic_visit(node)
        if not self.control:
            return node
        fname = "and_" if isinstance(node.op, ast.And) else "or_"
        self.converted += 1
        return _rt_call(fname, [node.values[0]] + [_thunk(v) for v in node.values[1:]], node)

    def visit_UnaryOp(self, node):
        self.generic_visit(node)
        if not self.control or not isinstance(node.op, ast.Not):
            return node
        self.converted += 1
        return _rt_call("not_", [node.operand], node)

    def visit_IfExp(self, node):
        self.generic_visit(node)
        if not self.control:
            return node
        self.converted += 1
        return _rt_call("if_exp", [node.test, _thunk(node.body), _thunk(node.orelse),
                                   ast.Constant(value=node.lineno)], node)

    def visit_Compare(self, node):
        self.generic_visit(node)
        if not self.control or len(node.ops) < 2:
            return node
        ops = ast.Constant(value=tuple(type(o).__name__ for o in node.ops))
        self.converted += 1
        return _rt_call("compare_chain", [ops, node.left] + [_thunk(c) for c in node.comparators],
                        node)

    def visit_Call(self, node):
        self.generic_visit(node)
        if self.control and isinstance(node.func, ast.Name) and node.func.id in ("min", "max"):
            call = _rt_call("min_max", [node.func] + node.args, node)
            call.keywords = node.keywords
            self.converted += 1
            return call
        return node

    def visit_Lambda(self, node):
        if getattr(node, "_tg_generated", False):
            return self.generic_visit(node)
        return node

    def visit_FunctionDef(self, node):
        return node              # nested functions are other scopes: left alone

    visit_AsyncFunctionDef = visit_FunctionDef
    visit_ClassDef = visit_FunctionDef
    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = visit_FunctionDef


# --- at run time ---------------------------------------------------------------------------------

class Undefined:
    """A name an ``if`` on a traced value binds on one path only, or that a
    ``while`` loop on a traced value binds only inside its body: reading it
    is an error, as it would be in Python on the path that leaves it unbound."""
    __slots__ = ("_name", "_where", "_why")

    def __init__(self, name, where, why):
        self._name, self._where, self._why = name, where, why

    def _fail(self, *a, **k):
        raise NotConverted(self._where, f"'{self._name}' is {self._why}, and it is read after "
                                        f"the statement; bind it before the statement")

    def __getattr__(self, name):
        if name.startswith("_"):     # a probe (hasattr(v, "_trace")): not a read
            raise AttributeError(name)
        self._fail()

    __bool__ = __array__ = __index__ = __float__ = __int__ = __len__ = \
        __iter__ = __getitem__ = __call__ = _fail
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = \
        __rtruediv__ = __pow__ = __rpow__ = __neg__ = __matmul__ = __rmatmul__ = \
        __lt__ = __le__ = __gt__ = __ge__ = __array_ufunc__ = __array_function__ = _fail

    def __repr__(self):
        return f"<'{self._name}' undefined: {self._why}>"


def _is_tracer(x):
    return type(x) is not Undefined and hasattr(x, "_trace") and hasattr(x, "known_value")


def _absent(v):
    """Unbound, or bound on one path only of an earlier statement."""
    return v is UNBOUND or type(v) is Undefined


def _unknown(x):
    """A traced value whose value is not known while tracing."""
    return _is_tracer(x) and x.known_value() is None


def _where(frame, line):
    return frame.f_code.co_filename, line


def _at(where):
    return f"{os.path.basename(where[0])}:{where[1]}"


def _truth(x, where):
    """The truth of a traced value as a 0-d boolean (Python's ``bool(x)``)."""
    if x.shape != ():
        if int(np.prod(x.shape)) != 1:
            raise ValueError(f"The truth value of an array with more than one element is "
                             f"ambiguous. Use a.any() or a.all() (at {_at(where)})")
        x = _ops.reshape(x, ())
    if np.dtype(x.dtype) == np.bool_:
        return x
    return _ops.not_equal(x, 0)


def _number(v):
    return isinstance(v, (bool, int, float, complex, np.generic)) and not isinstance(v, str)


def _arraylike(v):
    return _is_tracer(v) or isinstance(v, (np.ndarray, np.generic))


def _aval(v):
    if _is_tracer(v):
        return tuple(v.shape), np.dtype(v.dtype)
    a = np.asarray(v)
    return a.shape, a.dtype


def _as_array(v, dtype, where, name):
    """A Python number as a 0-d array of ``dtype``, where that keeps its value."""
    a = np.asarray(v, dtype=dtype)
    if not (a == v or (isinstance(v, float) and np.isnan(v) and np.isnan(a))):
        raise NotConverted(where, f"'{name}' is the Python number {v!r} on one path and a "
                                  f"{np.dtype(dtype)} array on another, which cannot hold it "
                                  f"exactly")
    return a


def _unique(values):
    """The distinct objects of ``values``, in order (by identity)."""
    out, seen = [], set()
    for v in values:
        if id(v) not in seen:
            seen.add(id(v))
            out.append(v)
    return out


def _index_of(objs, v):
    return next(i for i, o in enumerate(objs) if o is v)


class _Aliases(threading.local):
    """Outer arrays -> the body inputs standing for them, innermost last."""
    def __init__(self):
        self.stack = []


_ALIASES = _Aliases()


@contextlib.contextmanager
def _reading_through(outer, inner):
    """While a body runs: a name bound (by closure) to an array the body
    takes as an operand reads the operand, so a write through one name is
    seen through the other, as in NumPy (``z = y; if c: y[0] += v; s = z[0]``)."""
    _ALIASES.stack.append({id(o): i for o, i in zip(outer, inner) if _is_tracer(o)})
    try:
        yield
    finally:
        _ALIASES.stack.pop()


def alias_in(value):
    """The innermost body input standing for the outer array ``value``, or None."""
    for m in reversed(_ALIASES.stack):
        t = m.get(id(value))
        if t is not None:
            return t
    return None


class _no_view_marks:
    """A loop or branch node may pass an operand through, so tracing marks
    its operands and results as sharing memory; the statement as written
    shares none (an in-place update is replayed on the names after it), so
    those marks are dropped (as ``loop_rewrite.for_range`` does)."""

    def __init__(self, trace):
        self.trace = trace

    def __enter__(self):
        self.marks = dict(self.trace._aliased)

    def __exit__(self, *exc):
        self.trace._aliased = self.marks
        return False


def _trace_fn(fn, args, where, contain=False, aliases=True):
    """``fn(*args)`` traced as a body (to see what it gives), outputs as is;
    (outputs, the positions updated in place, the outer values it read).
    ``aliases``: one body input per array object, read through every name."""
    objs = _unique([v for v in args if _is_tracer(v)])
    arrays = [k for k, v in enumerate(args) if _is_tracer(v)]
    outs = []

    if not aliases:
        objs = [args[k] for k in arrays]

    def flat(*ins):
        xs = [ins[_index_of(objs, args[k])] for k in arrays] if aliases else list(ins)
        full = list(args)
        for k, x in zip(arrays, xs):
            full[k] = x
        first = [x._id for x in xs]
        with _reading_through(objs if aliases else (), ins):
            res = fn(*full)
        outs.append((res, xs, first))
        return tuple(r for r in res if _is_tracer(r))
    try:
        _, captured, _ = control._trace(flat, [control._leaf_aval(v) for v in objs],
                                        [control._face(v) for v in objs], contain)
    except NotConverted:
        raise
    except Exception as e:   # noqa: BLE001 -- said as the reason of the eager fallback
        raise NotConverted(where, f"its body cannot be traced ({type(e).__name__}: {e})") from e
    res, xs, first = outs[-1]
    # which inputs the function updated in place (y[i] = v rebinds the
    # tracer y to a new node, keeping the object)
    written = {k for k, x, i in zip(arrays, xs, first) if res[k] is x and x._id != i}
    return res, written, captured


def _container(v):
    return isinstance(v, (tuple, list, dict)) and not _arraylike(v)


def _flatten(v):
    """(leaves, structure) of a name's value: a tuple, list or dict of values
    as its leaves (structure None: the value is one leaf)."""
    if _container(v):
        return control.hooks.tree_flatten(v)
    return [v], None


def _unflatten(tree, leaves):
    return leaves[0] if tree is None else control.hooks.tree_unflatten(tree, list(leaves))


def _plan_leaf(vals, v0, where, name, what, cast=False):
    """("same", value) for a leaf every path leaves alone (not an array), or
    ("array", shape, dtype) for one the statement's node gives."""
    if all(v is v0 for v in vals) and not _arraylike(v0):
        return ("same", v0)
    arrays = [v for v in vals if _arraylike(v)]
    numbers = [v for v in vals if _number(v) and not _arraylike(v)]
    if len(arrays) + len(numbers) != len(vals):
        kinds = sorted({type(v).__name__ for v in vals})
        raise NotConverted(where, f"'{name}' is bound to a Python object ({', '.join(kinds)}) "
                                  f"that differs between the paths of the {what}; only "
                                  f"arrays and numbers can depend on a traced condition")
    avals = {_aval(v) for v in arrays}
    if cast and len({s for s, _ in avals}) == 1 and (len(avals) > 1 or numbers):
        shape = next(iter(avals))[0]
        avals = {(shape, np.result_type(*[d for _, d in avals],
                                        *[np.asarray(v).dtype for v in numbers]))}
    if len(avals) > 1:
        desc = " vs ".join(f"{d}{list(s)}" for s, d in sorted(avals, key=str))
        raise NotConverted(where, f"'{name}' has different shapes or dtypes on the paths "
                                  f"of the {what} ({desc})")
    if avals:
        shape, dtype = avals.pop()
    else:
        shape, dtype = (), np.result_type(*[np.asarray(v).dtype for v in numbers])
    for v in numbers:
        _as_array(v, dtype, where, name)
    if shape != () and numbers:
        raise NotConverted(where, f"'{name}' is a Python number on one path and an array of "
                                  f"shape {list(shape)} on another")
    return ("array", shape, dtype)


def _plan(results, init, names, where, what, cast=False):
    """How each name comes out of a statement with several paths (the
    branches of an if): ("same",) unchanged, ("undefined", why), or
    ("tree", structure, leaf plans, fill) -- ``fill``: a rewrite's own
    result name (``_tgv_...``) bound on some paths only, read only where
    it was bound: zeros on the others."""
    plan = []
    for k, name in enumerate(names):
        vals = [r[k] for r in results]
        v0 = init[k]
        if all(v is v0 for v in vals) and not _arraylike(v0):
            plan.append(("same",))
            continue
        fill = False
        if any(_absent(v) for v in vals):
            if all(_absent(v) for v in vals):
                plan.append(("same",))
                continue
            if not name.startswith(_VAR):
                plan.append(("undefined", f"bound on one path only of the {what} at {_at(where)}, "
                                          f"whose condition depends on a traced value"))
                continue
            fill = True
            vals = [v for v in vals if not _absent(v)]
        flat = [_flatten(v) for v in vals]
        trees = {repr(t) for _, t in flat}
        if len(trees) > 1:
            raise NotConverted(where, f"'{name}' has different structures on the paths of the "
                                      f"{what} ({' vs '.join(sorted(trees))})")
        tree = flat[0][1]
        init_leaves, init_tree = _flatten(v0)
        if init_tree != tree or (tree is None and _absent(v0)):
            init_leaves = [UNBOUND] * len(flat[0][0])
        try:
            leaves = [_plan_leaf([f[0][j] for f in flat], init_leaves[j], where, name, what,
                                 cast) for j in range(len(flat[0][0]))]
        except NotConverted:
            if not fill:
                raise
            leaves = None
        if fill and (leaves is None or any(p[0] == "same" for p in leaves)):
            # a rewrite's own loop temporary (a range, a Python counter): not read after
            plan.append(("undefined", f"a loop temporary bound on one path only of the {what}"))
            continue
        plan.append(("tree", tree, leaves, fill))
    return plan


def _path_leaves(v, p, where, name):
    """The arrays the node gives for a name on one path, by its plan."""
    if _absent(v):     # a rewrite's own result name not bound on this path
        return [np.zeros(lp[1], lp[2]) for lp in p[2]]
    leaves, _ = _flatten(v)
    return [_shaped(x, lp, where, name) for x, lp in zip(leaves, p[2]) if lp[0] == "array"]


def _rebuilt(p, outs):
    """A name's value after the node from its plan and the node's outputs."""
    it = iter(outs)
    leaves = [lp[1] if lp[0] == "same" else next(it) for lp in p[2]]
    return _unflatten(p[1], leaves)


def _shaped(v, plan_k, where, name):
    """A value of a path, as the array the plan wants."""
    if _is_tracer(v):
        return v if np.dtype(v.dtype) == np.dtype(plan_k[2]) else _ops.astype(v, plan_k[2])
    return _as_array(v, plan_k[2], where, name) if _number(v) and not isinstance(
        v, np.ndarray) else np.asarray(v, dtype=plan_k[2])


def if_stmt(test, then_fn, else_fn, names, line, reason):
    """``if test: <then> else: <else>`` on the values of ``names`` in the
    caller; returns their new values."""
    caller = sys._getframe(1)
    init = tuple(caller.f_locals.get(n, UNBOUND) for n in names)
    if not _unknown(test):
        return (then_fn if test else else_fn)(*init)
    where = _where(caller, line)
    if reason:
        raise NotConverted(where, f"the if statement's condition depends on a traced value and "
                                  f"its body {reason}")
    pred = _truth(test, where)
    return _branches(pred, (else_fn, then_fn), init, names, where, "if statement")


def _branches(pred, fns, init, names, where, what, cast=False):
    traced = [_trace_fn(f, init, where, contain=True)[:2] for f in fns]
    plan = _plan([r for r, _ in traced], init, names, where, what, cast)
    # an array a branch updates in place (y[i] = v) is updated for every
    # name bound to it, as NumPy would
    in_place = [any(k in written for _, written in traced) for k in range(len(names))]
    out_at = [k for k, p in enumerate(plan) if p[0] == "tree"]
    counts = [sum(lp[0] == "array" for lp in plan[k][2]) for k in out_at]
    # one operand per array object: two names bound to one array are one
    # value in the branch, as in NumPy
    op_objs = _unique([init[k] for k in range(len(names)) if _arraylike(init[k])])
    operands = tuple(op_objs)

    def branch(fn):
        def run(*ops):
            full = [ops[_index_of(op_objs, v)] if _arraylike(v) else v for v in init]
            with _reading_through(op_objs, ops):
                res = fn(*full)
            return tuple(x for k in out_at for x in _path_leaves(res[k], plan[k], where,
                                                                 names[k]))
        return run
    out = _cond_node(pred, fns, branch, operands, where) if sum(counts) else ()
    result = list(init)
    for k, p in enumerate(plan):
        if p[0] == "undefined":
            result[k] = Undefined(names[k], where, p[1])
    pos = 0
    for k, n in zip(out_at, counts):
        v = _rebuilt(plan[k], out[pos:pos + n])
        pos += n
        if in_place[k] and _is_tracer(init[k]) and _is_tracer(v):
            v = init[k]._assign(v, f"the update of '{names[k]}' in the {what} at {_at(where)}",
                                f"'{names[k]} = ...'")
        result[k] = v
    return tuple(result)


def _cond_node(pred, fns, branch, operands, where):
    idx = _ops.astype(pred, np.int64)
    try:
        with _no_view_marks(pred._trace):
            out = control._branch_node(idx, [branch(f) for f in fns], operands)
    except NotConverted:
        raise
    except TypeError as e:
        raise NotConverted(where, f"its paths cannot be one cond node ({e})") from e
    return out


def if_exp(test, then_thunk, else_thunk, line):
    """``then if test else other``."""
    if not _unknown(test):
        return then_thunk() if test else else_thunk()
    where = _where(sys._getframe(1), line)
    pred = _truth(test, where)
    r = _branches(pred, (lambda v: (else_thunk(),), lambda v: (then_thunk(),)), (UNBOUND,),
                  ("<the conditional expression>",), where, "conditional expression")
    return r[0]


def _select(cond, a, b, where):
    """``a`` where the traced truth ``cond`` holds, else ``b`` (both already computed)."""
    for v in (a, b):
        if not (_arraylike(v) or _number(v)):
            raise NotConverted(where, f"and/or/min/max on a traced value gives a "
                                      f"{type(v).__name__} on one path; only arrays and numbers "
                                      f"can depend on a traced condition")
    shapes = {_aval(v)[0] for v in (a, b)}
    if len(shapes) > 1:
        raise NotConverted(where, f"and/or/min/max on a traced value chooses between values of "
                                  f"different shapes ({' and '.join(map(str, shapes))})")
    return _ops.where(cond, a, b)


def and_(a, *thunks):
    """``a and b and ...`` (the later operands as thunks, evaluated only when
    Python would: on a traced ``a``, in a branch of a cond node)."""
    for k, th in enumerate(thunks):
        if _unknown(a):
            rest = thunks[k + 1:]
            return _short_circuit(a, lambda: and_(th(), *rest), True, sys._getframe(1))
        if not a:
            return a
        a = th()
    return a


def or_(a, *thunks):
    """``a or b or ...``."""
    for k, th in enumerate(thunks):
        if _unknown(a):
            rest = thunks[k + 1:]
            return _short_circuit(a, lambda: or_(th(), *rest), False, sys._getframe(1))
        if a:
            return a
        a = th()
    return a


def _short_circuit(a, later, is_and, frame):
    """``a and later()`` (``a or later()``) on a traced ``a``: a cond node
    whose branch runs ``later`` only where Python would; the two results
    share their dtype (False and 0.0 are the same number)."""
    where = _where(frame, frame.f_lineno)
    pred = _truth(a, where)
    first = (lambda v: (a,))
    second = (lambda v: (later(),))
    fns = (first, second) if is_and else (second, first)    # index 0: a is false
    return _branches(pred, fns, (UNBOUND,), ("<the and/or expression>",), where,
                     "and/or expression", cast=True)[0]


def not_(a):
    """``not a``."""
    if _unknown(a):
        return _ops.logical_not(_truth(a, _where(sys._getframe(1), sys._getframe(1).f_lineno)))
    return not a


def neither(*flags):
    """``not (f1 or f2)``: the guard of what follows a break or continue."""
    if len(flags) == 1:
        return not_(flags[0])
    return not_(or_(flags[0], lambda: flags[1]))


_COMPARE = {"Lt": operator.lt, "LtE": operator.le, "Gt": operator.gt, "GtE": operator.ge,
            "Eq": operator.eq, "NotEq": operator.ne, "Is": operator.is_,
            "IsNot": operator.is_not, "In": lambda a, b: a in b,
            "NotIn": lambda a, b: a not in b}


def compare_chain(ops, left, *thunks):
    """``a < b < c``: ``a < b and b < c``, each operand evaluated where
    Python would (a thunk may run again when a branch is traced again, so
    nothing here keeps state between runs)."""
    def rest(prev, k):
        right = thunks[k]()
        r = _COMPARE[ops[k]](prev, right)
        if k + 1 == len(ops):
            return r
        return and_(r, lambda: rest(right, k + 1))
    return rest(left, 0)


def min_max(fn, *args, **kwargs):
    """The builtin ``min``/``max`` (Python's rule: the first of equal values,
    NaN as Python compares it) on traced 0-d values; any other function
    named min/max is called as is."""
    if fn is not builtins.max and fn is not builtins.min:
        return fn(*args, **kwargs)
    items = list(args[0]) if len(args) == 1 and not _is_tracer(args[0]) else list(args)
    if len(args) == 1 and _is_tracer(args[0]):
        items = [args[0][i] for i in range(args[0].shape[0])] if args[0].shape else [args[0]]
    if not any(_unknown(v) for v in items):
        return fn(*args, **kwargs)
    where = _where(sys._getframe(1), sys._getframe(1).f_lineno)
    if kwargs:
        raise NotConverted(where, f"{fn.__name__}() with {', '.join(kwargs)}= on traced values")
    if not items:
        return fn(*args)
    better = operator.gt if fn is builtins.max else operator.lt
    best = items[0]
    for v in items[1:]:
        if _unknown(v) or _unknown(best):
            best = _select(better(v, best), v, best, where)
        elif better(v, best):
            best = v
    return best


def as_sequence(it):
    """What a ``for`` loop rewritten into a while loop iterates over, as a
    sequence it can index: a range, list, tuple or array (traced too) as
    it is, any other iterable (a generator, a dict) as the list of its items."""
    if isinstance(it, (range, list, tuple, np.ndarray)) or _is_tracer(it):
        return it
    return list(it)


def range_item(r, k):
    """``r[k]`` for the index of a ``for`` loop rewritten into a while loop."""
    if isinstance(k, (int, np.integer)):
        return r[int(k)]
    if isinstance(r, range):
        return r.start + k * r.step
    if _is_tracer(r) or isinstance(r, np.ndarray):
        return r[k]             # the row at a traced index
    raise NotConverted(("<for loop>", 0), f"the loop runs over a {type(r).__name__}, whose "
                                          f"items a traced counter cannot index")


def while_stmt(test_fn, body_fn, names, line, reason):
    """``while test: <body>`` on the values of ``names`` in the caller;
    returns their values after the loop.  Iterations run as Python runs
    them while the test is known; from the first traced test on, the rest
    of the loop is one ``while`` node."""
    caller = sys._getframe(1)
    vals = tuple(caller.f_locals.get(n, UNBOUND) for n in names)
    while True:
        c = test_fn(*vals)
        if _unknown(c):
            break
        if not c:
            return vals
        vals = body_fn(*vals)
    where = _where(caller, line)
    if reason:
        raise NotConverted(where, f"the while loop's condition depends on a traced value and "
                                  f"its body {reason}")
    return _while_node(c, test_fn, body_fn, vals, names, where)


class _Slots:
    """The values of a statement's names as leaves: a name bound to a tuple,
    list or dict of values has one slot per leaf."""

    def __init__(self, vals, names):
        self.names = names
        self.trees, self.flat, self.owner = [], [], []
        for k, v in enumerate(vals):
            leaves, tree = _flatten(v)
            self.trees.append(tree)
            self.flat.extend(leaves)
            self.owner.extend([k] * len(leaves))

    def values(self, flat):
        out, pos = [], 0
        for k, tree in enumerate(self.trees):
            n = self.owner.count(k)
            out.append(_unflatten(tree, flat[pos:pos + n]))
            pos += n
        return out

    def leaves(self, vals, where):
        """The leaves of the names' values after an iteration (same structures)."""
        out = []
        for k, (tree, v) in enumerate(zip(self.trees, vals)):
            leaves, t = _flatten(v)
            if t != tree:
                raise NotConverted(where, f"'{self.names[k]}' changes its structure in the "
                                          f"while loop (a tuple, list or dict of other length "
                                          f"or keys)")
            out.extend(leaves)
        return out

    def adopt(self, k, tree, n):
        """Name k, unbound at entry, is a container after an iteration."""
        at = self.owner.index(k)
        self.trees[k] = tree
        self.flat[at:at + 1] = [UNBOUND] * n
        self.owner[at:at + 1] = [k] * n


def _while_node(c, test_fn, body_fn, vals, names, where):
    trace, face = c._trace, getattr(c, "_face", "numpy")
    slots = _Slots(vals, names)
    born = set()       # bound only inside the body: carried, undefined after the loop
    promoted = set()   # slots of Python numbers (or unbound names) carried as arrays

    def body_flat(*flat):
        return tuple(slots.leaves(body_fn(*slots.values(list(flat))), where))

    written, captured, maybe_bound = set(), [], set()
    for _ in range(6):   # the carry grows until one iteration keeps it
        res_vals = _trace_fn(body_fn, slots.values(slots.flat), where, True, False)[0]
        grown = False
        for k, r in enumerate(res_vals):
            if slots.trees[k] is None and _absent(slots.flat[slots.owner.index(k)]) \
                    and _container(r):
                leaves, tree = _flatten(r)
                slots.adopt(k, tree, len(leaves))
                grown = True
        if grown:
            continue
        res, written, captured = _trace_fn(body_flat, slots.flat, where, True, False)
        changed = False
        for j, (v, r) in enumerate(zip(slots.flat, res)):
            name = names[slots.owner[j]]
            if _arraylike(v) or r is v or (_absent(r) and _absent(v)):
                if _absent(v) and type(r) is Undefined:
                    maybe_bound.add(slots.owner[j])
                continue
            if _absent(v) and _arraylike(r):
                shape, dtype = _aval(r)
                slots.flat[j] = trace.follow(np.zeros(shape, dtype), face)
                born.add(slots.owner[j])
            elif _number(r) and (_absent(v) or _number(v)):
                a = np.asarray(r) if _absent(v) else np.asarray(v)
                dtype = np.result_type(a.dtype, np.asarray(r).dtype)
                slots.flat[j] = trace.follow(np.asarray(r if _absent(v) else v, dtype), face)
                if _absent(v):
                    born.add(slots.owner[j])
            elif _number(v) and _arraylike(r):
                slots.flat[j] = trace.follow(_as_array(v, _aval(r)[1], where, name), face)
            else:
                raise NotConverted(where, f"'{name}' is a {type(v).__name__} that the body of "
                                          f"the while loop changes (to a {type(r).__name__}); "
                                          f"only arrays and numbers can be carried by a loop "
                                          f"whose condition depends on a traced value")
            promoted.add(j)
            changed = True
        if not changed:
            break
    flat = slots.flat
    carried = [j for j, v in enumerate(flat) if _arraylike(v)]
    fixed = {j: v for j, v in enumerate(flat) if j not in set(carried)}
    # an array updated in place in the loop and bound to another name too (or
    # read through one) would be two values here: run it as written
    for j in written:
        others = [i for i in carried if i != j and flat[i] is flat[j]]
        if others or any(getattr(c, "_trace", None) is flat[j]._trace and c._id == flat[j]._id
                         for c in captured):
            raise NotConverted(where, f"'{names[slots.owner[j]]}' is updated in place in the "
                                      f"while loop and the same array is bound to another name")
    python_ints = [j for j in promoted if j in set(carried)
                   and np.dtype(flat[j].dtype).kind in "iu"]

    def full(carry):
        f = list(flat)
        for j, v in zip(carried, carry):
            f[j] = v
        return f

    def cond_fun(carry):
        r = test_fn(*slots.values(full(carry)))
        return _truth(r, where) if _is_tracer(r) else np.bool_(bool(r))

    def body_fun(carry):
        for j in python_ints:   # a Python int in the loop as written: y[i] is a view
            t = carry[carried.index(j)]
            t._trace.python_ints = set(getattr(t._trace, "python_ints", None) or ()) | {t._id}
        res = body_flat(*full(carry))
        for j, v in fixed.items():
            if res[j] is not v and not (_absent(res[j]) and _absent(v)):
                raise NotConverted(where, f"'{names[slots.owner[j]]}' changes in the while "
                                          f"loop and is not an array or a number")
        out = []
        for j, v in zip(carried, carry):
            r = res[j]
            if _absent(r):
                raise NotConverted(where, f"'{names[slots.owner[j]]}' is unbound after an "
                                          f"iteration")
            if not _is_tracer(r):
                r = _as_array(r, np.dtype(v.dtype), where, names[slots.owner[j]]) \
                    if _number(r) and not isinstance(r, np.ndarray) else np.asarray(r)
            out.append(r)
        return tuple(out)
    try:
        with _no_view_marks(trace):
            out = control.while_loop(cond_fun, body_fun, tuple(flat[j] for j in carried),
                                     checkpoint=loop_checkpoint(), contain=True)
    except NotConverted:
        raise
    except TypeError as e:
        raise NotConverted(where, f"the while loop cannot be one node ({e})") from e
    result = list(flat)
    for j, v in zip(carried, out):
        if j in written and _is_tracer(flat[j]) and j not in promoted:
            v = flat[j]._assign(v, f"the update of '{names[slots.owner[j]]}' in the while "
                                   f"loop at {_at(where)}", f"'{names[slots.owner[j]]} = ...'")
        result[j] = v
    values = slots.values(result)
    for k in maybe_bound:       # bound on some path of an iteration: unknown after
        values[k] = Undefined(names[k], where, f"bound on some paths only of the while loop "
                                               f"at {_at(where)}")
    for k in born:
        if not names[k].startswith(_VAR):   # the rewrite's own names are read only where set
            values[k] = Undefined(names[k], where, f"bound only inside the while loop at "
                                                   f"{_at(where)}, whose trip count depends on a "
                                                   f"traced value")
    return tuple(values)
