"""Symbolic sizes: integers that remember how they were computed.

A ``SymInt`` stands for a size of a traced graph (a dimension of a node's
shape) while the pipeline (transforms, passes, code generation) runs on
that graph once.  It behaves as its *hint* (the size it had in the graph it
was made from) and records, in the active ``Recording``:

* how every number derived from it was computed (``+``, ``*``, ``//``, ...):
  an SSA program over the graph's sizes;
* every observation of its value that could steer the pipeline (a
  comparison, ``bool``, a conversion to a plain ``int`` or ``float``, a
  hash): a **guard**, the expression and the outcome it had;
* where it was written into generated text (``str``, ``format``): a
  **marker** ``@TG<n>@`` that stands for the number.

So the text the run produced, with each marker replaced by its expression
evaluated at other sizes, is the text the pipeline would produce for a
graph of the same structure at those sizes, wherever every guard holds
there: the run's every decision that depended on a size is a guard, and
what did not depend on a size is the same at any size.  A conversion to a
plain number guards the exact value (the size is then specialised: sound,
only less general).  Outside an active recording a SymInt is its hint in
every way (one that escaped into a cache formats as a plain number).

``tracegrad.runtime.shape_plan`` uses this to serve new sizes of a
compiled function without running the pipeline (docs/native.md, "Generic
sizes").
"""
from __future__ import annotations

import math
import operator
import threading

import numpy as np

_HASH = hash("tracegrad.symbolic.Sym")
MARK = "@TG"
MARK_END = "@"


class Recording:
    """One symbolic run: the SSA lines, guards and markers it produced."""

    def __init__(self):
        self.lines = []         # (name, python expression over earlier names)
        self.memo = {}          # expression -> its SSA name
        self.guards = {}        # (python boolean expression) -> expected outcome
        self.marks = []         # (name, format spec, "int" | "float")
        self.special = []       # where a size was specialised (for explaining)
        self.inputs = []        # the input symbols, v[0], v[1], ...
        self.count = 0

    def line(self, src):
        """The SSA name of expression ``src`` (one line per distinct expression)."""
        key = src
        name = self.memo.get(key)
        if name is None:
            name = f"s{self.count}"
            self.count += 1
            self.lines.append((name, src))
            self.memo[key] = name
        return name

    def guard(self, src, outcome):
        self.guards[src] = bool(outcome)

    def mark(self, name, spec, kind):
        self.marks.append((name, spec, kind))
        return f"{MARK}{len(self.marks) - 1}{MARK_END}"

    def symbol(self, hint):
        """A new input symbol (``v[k]``, k in order of creation)."""
        s = SymInt(f"v[{len(self.inputs)}]", hint, self)
        self.inputs.append(s)
        return s


class _Active(threading.local):
    rec = None


ACTIVE = _Active()


def _operand(x, rec):
    """(expression, hint) of an operand: a symbol of the active recording,
    or a plain number (a constant, written into the expression as a
    literal; a symbol of another recording, kept in some cache, is its
    hint here)."""
    if isinstance(x, Sym):
        if x.rec is rec:
            return x.name, x.hint
        x = x.hint
    if type(x) is bool:
        x = int(x)
    if type(x) is int:
        return repr(x), x
    if isinstance(x, np.integer):
        return repr(int(x)), int(x)
    if type(x) is float and math.isfinite(x):
        return repr(x), x
    return None, None


def _plain(x):
    return x.hint if isinstance(x, Sym) else x


class Sym:
    """A symbolic number (see the module's docstring); SymInt or SymFloat."""
    __slots__ = ("name", "hint", "rec")

    def __init__(self, name, hint, rec):
        self.name = name
        self.hint = hint
        self.rec = rec

    def _live(self):
        """The active recording if this symbol is one of its own, else None
        (the symbol is then its hint in every way)."""
        rec = ACTIVE.rec
        return rec if rec is not None and rec is self.rec else None

    # -- arithmetic: a new symbol -------------------------------------------------------
    def _binary(self, other, op, sym, reflected=False):
        rec = self._live()
        if rec is None:
            return op(_plain(other), self.hint) if reflected else op(self.hint, _plain(other))
        b, bh = _operand(other, rec)
        if b is None:
            return NotImplemented
        a, ah = self.name, self.hint
        if reflected:
            a, b, ah, bh = b, a, bh, ah
        value = op(ah, bh)
        if type(value) not in (int, float):
            return value
        name = rec.line(f"({a} {sym} {b})")
        return (SymInt if type(value) is int else SymFloat)(name, value, rec)

    def __add__(self, o): return self._binary(o, operator.add, "+")
    def __radd__(self, o): return self._binary(o, operator.add, "+", True)
    def __sub__(self, o): return self._binary(o, operator.sub, "-")
    def __rsub__(self, o): return self._binary(o, operator.sub, "-", True)
    def __mul__(self, o): return self._binary(o, operator.mul, "*")
    def __rmul__(self, o): return self._binary(o, operator.mul, "*", True)
    def __floordiv__(self, o): return self._binary(o, operator.floordiv, "//")
    def __rfloordiv__(self, o): return self._binary(o, operator.floordiv, "//", True)
    def __mod__(self, o): return self._binary(o, operator.mod, "%")
    def __rmod__(self, o): return self._binary(o, operator.mod, "%", True)
    def __truediv__(self, o): return self._binary(o, operator.truediv, "/")
    def __rtruediv__(self, o): return self._binary(o, operator.truediv, "/", True)
    def __and__(self, o): return self._binary(o, operator.and_, "&")
    def __rand__(self, o): return self._binary(o, operator.and_, "&", True)
    def __or__(self, o): return self._binary(o, operator.or_, "|")
    def __ror__(self, o): return self._binary(o, operator.or_, "|", True)
    def __lshift__(self, o): return self._binary(o, operator.lshift, "<<")
    def __rshift__(self, o): return self._binary(o, operator.rshift, ">>")

    def __pow__(self, o):
        if type(o) is int and 0 <= o <= 4:   # squares and cubes of sizes
            return self._binary(o, operator.pow, "**")
        return operator.pow(self._concrete("pow"), _plain(o))

    def __rpow__(self, o):
        return operator.pow(_plain(o), self._concrete("pow"))

    def __neg__(self):
        return self._binary(-1, operator.mul, "*")

    def __pos__(self):
        return self

    def __abs__(self):
        rec = self._live()
        if rec is None:
            return abs(self.hint)
        return type(self)(rec.line(f"abs({self.name})"), abs(self.hint),
                          rec)

    def __divmod__(self, o):
        return self // o, self % o

    # -- observations: guards ---------------------------------------------------------------
    def _compare(self, other, op, sym):
        rec = self._live()
        if rec is None:
            return op(self.hint, _plain(other))
        b, bh = _operand(other, rec)
        if b is None:
            return NotImplemented
        outcome = op(self.hint, bh)
        rec.guard(f"({self.name} {sym} {b})", outcome)
        return outcome

    def __eq__(self, o): return self._compare(o, operator.eq, "==")
    def __ne__(self, o): return self._compare(o, operator.ne, "!=")
    def __lt__(self, o): return self._compare(o, operator.lt, "<")
    def __le__(self, o): return self._compare(o, operator.le, "<=")
    def __gt__(self, o): return self._compare(o, operator.gt, ">")
    def __ge__(self, o): return self._compare(o, operator.ge, ">=")

    def __bool__(self):
        return self._compare(0, operator.ne, "!=")

    def _concrete(self, why):
        """The hint as a plain number: the size is specialised (a guard of
        its exact value)."""
        rec = self._live()
        if rec is not None:
            rec.guard(f"({self.name} == {self.hint!r})", True)
            if len(rec.special) < 64:
                import traceback
                rec.special.append((why, self.hint, traceback.extract_stack(limit=9)[:-2]))
        return self.hint

    def __hash__(self):
        # every symbol hashes alike: a dictionary keyed by sizes then compares
        # two symbolic keys (a guard) instead of telling them apart by hash
        return _HASH

    def __float__(self):
        return float(self._concrete("float"))

    def __round__(self, nd=None):
        return round(self._concrete("round"), nd)

    # -- text: markers ----------------------------------------------------------------------
    def __format__(self, spec):
        rec = self._live()
        if rec is None:
            return format(self.hint, spec)
        return rec.mark(self.name, spec, type(self.hint))

    def __str__(self):
        return self.__format__("")

    def __repr__(self):
        rec = self._live()
        if rec is None:
            return repr(self.hint)
        return rec.mark(self.name, "r", type(self.hint))

    def __reduce__(self):
        return (type(self.hint), (self.hint,))

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self


class SymInt(Sym):
    __slots__ = ()

    def __index__(self):
        return self._concrete("index")

    def __int__(self):
        return self._concrete("int")

    def __trunc__(self):
        return self

    def __floor__(self):
        return self

    def __ceil__(self):
        return self


class SymFloat(Sym):
    __slots__ = ()

    def __int__(self):
        return int(self._concrete("int"))

    def __trunc__(self):
        return self._unary("math.trunc", math.trunc)

    def __floor__(self):
        return self._unary("math.floor", math.floor)

    def __ceil__(self):
        return self._unary("math.ceil", math.ceil)

    def _unary(self, fname, fn):
        value = fn(self.hint)
        rec = self._live()
        if rec is None:
            return value
        return SymInt(rec.line(f"{fname}({self.name})"), value, rec)


def if_less(a, b, then, other):
    """``then if a < b else other``: where a number is a symbol of the
    active recording, a formula (no guard: the result is itself a number
    read at run time), else plain Python."""
    rec = ACTIVE.rec
    xs = (a, b, then, other)
    if rec is None or not any(isinstance(x, Sym) and x.rec is rec for x in xs):
        return then if _plain(a) < _plain(b) else other
    ops = [_operand(x, rec) for x in xs]
    if any(e is None for e, _ in ops):
        return then if a < b else other
    hint = ops[2][1] if ops[0][1] < ops[1][1] else ops[3][1]
    name = rec.line(f"({ops[2][0]} if {ops[0][0]} < {ops[1][0]} else {ops[3][0]})")
    return (SymInt if type(hint) is int else SymFloat)(name, hint, rec)


def larger(a, b):
    """``max(a, b)``, a formula where a number is symbolic (see if_less)."""
    return if_less(a, b, b, a)


# scalar arithmetic a trace folds on symbolic constants (frontend.trace._fold)
SCALAR_FOLDS = {"add": operator.add, "sub": operator.sub, "mul": operator.mul,
                "div": operator.truediv, "neg": operator.neg}


def dim(d):
    """A size as a Python int; a symbolic size stays one."""
    return int(d) if isinstance(d, np.integer) else d


def numel(shape):
    """The number of elements of ``shape`` (symbolic where a size is)."""
    n = 1
    for d in shape:
        n *= dim(d)
    return n


def has_sym(x):
    """Does an attribute value (a number, or tuples and lists of them) hold
    a symbolic size?"""
    if isinstance(x, Sym):
        return True
    if isinstance(x, (tuple, list)):
        return any(has_sym(y) for y in x)
    return False
