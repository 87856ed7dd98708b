"""Random NumPy programs with control flow on traced values, for
differential testing of issue 25 (``tracegrad/frontend/branch_rewrite.py``).

A program is ``def f(x): ...`` over one float64 vector ``x`` (3 to 5
elements) built from:

* ``if``/``elif``/``else`` on traced reductions and elements (nested), with
  names assigned on every path and read afterwards, and early ``return`` in
  ``if`` branches;
* ``while`` loops with value-dependent trip counts that always terminate:
  bounded by a Python counter (``while s > c and k < 6:``) or contracting
  toward a tolerance (``while abs(g - t) > 1e-3: g = g + 0.5 * (t - g)``,
  Newton's ``g = 0.5 * (g + r / g)``);
* ``for i in range(m)`` with ``break``/``continue`` on traced conditions
  (and ``for ... else``), and ``for`` loops whose body branches on traced
  values;
* conditional expressions, ``and``/``or``/``not``, chained comparisons
  (``lo < s < hi``), builtin ``min``/``max`` of 0-d values;
* arrays made with ``np.zeros`` (before, inside branches and loops) written
  by item (``y[i] = ...``, ``y[j] += ...``), in-place ``y += ...``, aliases of
  such arrays (``z = y``) read after a branch wrote through the other name;
* ordinary elementwise math between them.

A few programs also hold what issue 25 does not convert by design (a branch
that appends to a list or raises, a name bound on one path only and read
later, branches of different shapes, a return inside a loop, ``float()``
feeding a comparison): the compiled function then runs eagerly for the
signature, with one log line; ``fallback=False`` must raise a TraceError
naming the line.  Every program's fallbacks are counted with their reasons
(``Outcome.fallbacks``), expected or not.

Each program is written to a temporary ``.py`` file and exec'd from it (the
source rewrite reads the file).  Inputs: random candidates run through an
instrumented copy of the program in NumPy (every comparison, truth test
and ``min``/``max`` records how far its operands are from deciding the other
way and which way it went); a candidate is kept where every decision is at
least ``MARGIN`` (or ``REL_MARGIN`` relative) from flipping, so central
finite differences do not cross a kink, and the kept inputs prefer distinct
paths (``Program.paths``): one compiled function must choose the branches
and trip counts at run time.

``check_program`` compares, on every input, ``tg.value_and_grad(f)``
(backend ``numpy`` and ``native``; one compiled function for all inputs, not
traced again) with NumPy's value and with ``tg.value_and_grad(f,
compile=False)`` and central finite differences for the gradient;
``higher=True`` adds ``tg.jacfwd`` (the gradient) and ``tg.hessian`` (finite
differences of the gradient).  A Failure carries a runnable reproducer.
"""
from __future__ import annotations

import ast
import dataclasses
import logging
import operator
import os
import re
import tempfile
import textwrap
import warnings

import numpy as np

from _random_programs import Failure, RngChooser, _close, fd_grad  # noqa: F401

MARGIN = 2e-2       # a decision's operands at least this far apart ...
REL_MARGIN = 0.1    # ... or this far relative to their size (tolerances)
MAX_ABS = 50.0
N_CANDIDATES = 24
MAX_INPUTS = 4

# Statement kinds known to give wrong values today (left out unless asked for):
# ``s1 = s0; s1 += v`` where s0 is a NumPy scalar (np.float64 from a reduction
# or an integer index): NumPy's scalars are immutable, so s0 keeps its value;
# tracegrad's 0-d values are updated in place, compiled and with
# compile=False (see tests/test_random_branchy_programs.py).
KNOWN_WRONG = frozenset({"scalar_inplace_aug"})

# Statement kinds whose conversion is refused by design (the function runs
# eagerly for the signature): tag -> the words the fallback's reason has.
FALLBACK_KINDS = {
    "fb_append": r"calls .*append.* for its effect",
    "fb_raise": r"raises",
    "fb_one_path": r"bound on one path only",
    "fb_shapes": r"different shapes|Python number on one path and an array",
    "fb_return_in_loop": r"return|float\(\)|truth|traced value",
    "fb_float_cmp": r"float\(\)",
}


def _num(v):
    return repr(float(v))


@dataclasses.dataclass
class Program:
    body: list            # lines at indent 0 (nested statements indented by 4)
    loss: str
    tags: list
    n: int
    inputs: list = dataclasses.field(default_factory=list)
    paths: int = 0        # distinct decision sequences among the inputs
    expect_fallback: list = dataclasses.field(default_factory=list)   # tags
    seed: object = None

    def source(self, name="f"):
        body = "\n".join(self.body + ["return " + self.loss])
        return f"def {name}(x):\n" + textwrap.indent(body, "    ") + "\n"

    def file_text(self):
        return "import numpy as np\n\n\n" + self.source()

    def function(self, directory=None):
        """``f`` exec'd from a .py file (the source rewrite reads the file)."""
        directory = directory or _tmpdir()
        tag = re.sub(r"[^0-9A-Za-z_]+", "_", str(self.seed)).strip("_") or "x"
        path = os.path.join(directory, f"branchy_{tag}_{abs(hash(self.file_text())) % 10**8}.py")
        text = self.file_text()
        if not os.path.exists(path):
            with open(path, "w") as fh:
                fh.write(text)
        ns = {"__name__": os.path.basename(path)[:-3]}
        exec(compile(text, path, "exec"), ns)
        return ns["f"]

    def reproducer(self):
        with np.printoptions(precision=17, floatmode="unique"):
            xs = ",\n      ".join(f"np.{x!r}" for x in self.inputs)
        return (f"import numpy as np\nimport tracegrad as tg\n\n{self.source()}\n"
                f"# save as a .py file and run it: the source rewrite reads the file\n"
                f"vg = tg.value_and_grad(f)\n"
                f"for x in [{xs}]:\n"
                f"    print('numpy        ', f(x.copy()))\n"
                f"    print('compiled     ', vg(x.copy()))\n"
                f"    print('compile=False', tg.value_and_grad(f, compile=False)(x.copy()))\n")

    def __repr__(self):
        return f"Program(seed={self.seed!r}):\n{self.reproducer()}"


_TMP = []


def cleanup():
    """Remove the temporary folder of the programs' files."""
    while _TMP:
        _TMP.pop().cleanup()


def _tmpdir():
    if not _TMP:
        _TMP.append(tempfile.TemporaryDirectory(prefix="tracegrad-branchy-"))
    return _TMP[0].name


# --- the generator ---------------------------------------------------------------------

def _indent(lines):
    return ["    " + ln for ln in lines]


class _Gen:
    def __init__(self, ch, n, exclude=KNOWN_WRONG):
        self.ch, self.n = ch, n
        self.exclude = frozenset(exclude)
        self.count = 0
        self.tags = []
        self.expect = []
        self.pre = []          # statements at the top (hist = [])
        self.extra_loss = []   # terms the loss must hold (len(hist))

    def fresh(self, p):
        self.count += 1
        return f"{p}{self.count}"

    def const(self, lo=-1.0, hi=1.0):
        return _num(round(self.ch.int(int(lo * 20), int(hi * 20)) / 20, 2))

    # -- expressions --
    def sexpr(self, sc, loop=None, depth=0):
        """A smooth 0-d expression."""
        ch, n = self.ch, self.n
        scal = [k for k, v in sc.items() if v[0] == "s"]
        vecs = ["x"] + [k for k, v in sc.items() if v[0] == "v"]
        arrs = [k for k, v in sc.items() if v[0] == "a"]
        forms = [(4, "xi"), (3, "red"), (5 if scal else 0, "name"), (2 if arrs else 0, "arr"),
                 (3 if loop and loop["m"] else 0, "loop"), (3 if depth < 1 else 0, "mix"),
                 (1, "const")]
        form = ch.weighted(forms)
        if form == "xi":
            e = f"x[{ch.int(-n, n - 1)}]"
            fn = ch.choice(["", "np.sin", "np.cos", "np.tanh", "0.5 * "])
            return f"{fn}({e})" if fn.startswith("np") else f"{fn}{e}"
        if form == "red":
            v = ch.choice(vecs)
            return ch.choice([f"np.sum(np.sin({v}))", f"np.mean({v})", f"np.sum({v} ** 2) * 0.25",
                              f"np.tanh(np.sum({v}))", f"np.dot({v}, x) * 0.5"])
        if form == "name":
            s = ch.choice(scal)
            fn = ch.choice(["", "", "np.tanh", "np.sin", "0.5 * "])
            return f"{fn}({s})" if fn.startswith("np") else f"{fn}{s}"
        if form == "arr":
            a = ch.choice(arrs)
            return f"{a}[{ch.int(0, sc[a][1] - 1)}]"
        if form == "loop":
            i, m = loop["var"], loop["m"]
            srcs = ["x"] + [a for a in arrs if sc[a][1] >= m]
            src = ch.choice(srcs)
            return ch.choice([f"{src}[{i}]", f"np.sin({src}[{i}])", f"{src}[{i}] * 0.5",
                              f"0.1 * {i}"])
        if form == "mix":
            a, b = self.sexpr(sc, loop, depth + 1), self.sexpr(sc, loop, depth + 1)
            return ch.choice([f"{a} * {b}", f"{a} + {b}", f"np.tanh({a} - {b})",
                              f"{a} * 0.5 - {b}"])
        return self.const()

    def vexpr(self, sc, loop=None):
        """A smooth expression of shape (n,)."""
        ch = self.ch
        vecs = ["x"] + [k for k, v in sc.items() if v[0] == "v"] + \
            [k for k, v in sc.items() if v[0] == "a" and v[1] == self.n]
        a, b = ch.choice(vecs), ch.choice(vecs)
        s = self.sexpr(sc, loop, 1)
        return ch.choice([f"np.sin({a})", f"{a} * {s}", f"np.tanh({a}) + 0.5 * {b}",
                          f"{a} * 0.9 + 0.1", f"np.cos({a}) * {s}", f"{a} * {b}"])

    def cond(self, sc, loop=None, depth=0):
        """A condition on traced values (sometimes mixed with static ones)."""
        ch, n = self.ch, self.n
        vecs = ["x"] + [k for k, v in sc.items() if v[0] == "v"]
        scal = [k for k, v in sc.items() if v[0] == "s"]
        kind = ch.weighted([(8, "cmp"), (2, "cmp2"), (2, "red_bool"),
                            (2 if depth < 1 else 0, "and"),
                            (2 if depth < 1 else 0, "or"), (1 if depth < 1 else 0, "not"),
                            (2, "chain"), (1 if scal else 0, "truth"),
                            (1 if depth < 1 else 0, "static")])
        op = ch.choice([">", "<", ">=", "<="])
        if kind == "cmp":
            v = ch.choice(vecs)
            lhs = ch.choice([f"np.sum({v})", f"np.max({v})", f"np.min({v})",
                             f"x[{ch.int(0, n - 1)}]", f"np.mean({v})"]
                            + ([f"x[{loop['var']}]"] * 3 if loop and loop["m"] else [])
                            + [self.sexpr(sc, loop, 1)] * 3)
            self.tag("if_cmp")
            return f"{lhs} {op} {self.const()}"
        if kind == "cmp2":
            a, b = self.sexpr(sc, loop, 1), self.sexpr(sc, loop, 1)
            if a != b:
                self.tag("if_cmp2")
                return f"{a} {op} {b}"
            kind = "chain"
        if kind == "red_bool":
            v = ch.choice(vecs)
            self.tag("if_any_all")
            return f"np.{ch.choice(['any', 'all'])}({v} {op} {self.const()})"
        if kind == "and":
            self.tag("and")
            return f"{self.cond(sc, loop, 1)} and {self.cond(sc, loop, 1)}"
        if kind == "or":
            self.tag("or")
            return f"{self.cond(sc, loop, 1)} or {self.cond(sc, loop, 1)}"
        if kind == "not":
            self.tag("not")
            c = self.cond(sc, loop, 1)
            return f"not ({c})" if " " in c else f"not {c}"
        if kind == "chain":
            lo = float(self.const(-1.0, 0.2))
            hi = lo + ch.int(2, 20) / 10
            self.tag("chained_cmp")
            return f"{_num(lo)} < {self.sexpr(sc, loop, 1)} < {_num(hi)}"
        if kind == "truth":
            self.tag("truth_of_float")
            return ch.choice(scal)
        self.tag("static_and_traced")
        return f"len(x) > {ch.int(1, 6)} {ch.choice(['and', 'or'])} {self.cond(sc, loop, 1)}"

    def tag(self, t):
        self.tags.append(t)

    # -- statements --
    def block(self, sc, depth, loop, k):
        lines = []
        for _ in range(k):
            lines += self.stmt(sc, depth, loop)
        return lines or ["pass"]

    def stmt(self, sc, depth, loop):
        ch = self.ch
        arrs = [a for a, v in sc.items() if v[0] == "a"]
        top = loop is None
        kinds = [(4, "assign_s"), (2, "assign_v"), (2, "aug"), (3 if depth < 3 else 0, "create"),
                 (8 if arrs else 0, "write"), (6 if depth < 3 else 0, "if"), (2, "ifexp"),
                 (2, "minmax"), (0.5, "boolval"),
                 (2.5 if top and depth < 2 else 0, "while_counter"),
                 (1.5 if top and depth < 2 else 0, "while_tol"),
                 (2.5 if top and depth < 2 else 0, "for_jump"),
                 (1.5 if top and depth < 2 else 0, "for_if"),
                 (1.5 if arrs else 0, "alias")]
        kind = ch.weighted(kinds)
        return getattr(self, "s_" + kind)(sc, depth, loop)

    def s_assign_s(self, sc, depth, loop):
        scal = [k for k, v in sc.items() if v[0] == "s"]
        if scal and self.ch.flag(0.5):
            s = self.ch.choice(scal)
            self.tag("reassign")
            fn = self.ch.choice(['0.5 * ', 'np.tanh', ''])
            return [f"{s} = {fn}({s} + {self.sexpr(sc, loop)})"]
        s = self.fresh("s")
        e = self.sexpr(sc, loop)
        sc[s] = ("s",)
        return [f"{s} = {e}"]

    def s_assign_v(self, sc, depth, loop):
        vecs = [k for k, v in sc.items() if v[0] == "v"]
        e = self.vexpr(sc, loop)
        if vecs and self.ch.flag(0.4):
            v = self.ch.choice(vecs)
            return [f"{v} = np.tanh({e})"]
        v = self.fresh("v")
        sc[v] = ("v",)
        return [f"{v} = {e}"]

    def s_aug(self, sc, depth, loop):
        ch = self.ch
        scal = [k for k, v in sc.items() if v[0] == "s"]
        vecs = [k for k, v in sc.items() if v[0] in ("v", "a")]
        if vecs and ch.flag(0.4):
            v = ch.choice(vecs)
            self.tag("inplace_array_aug")
            op = ch.choice(["+=", "*=", "-="])
            val = _num(ch.choice([0.5, 0.9, -0.25])) if op == "*=" else \
                f"0.5 * np.sin({self.sexpr(sc, loop, 1)})"
            return [f"{v} {op} {val}"]
        if not scal:
            return self.s_assign_s(sc, depth, loop)
        s = ch.choice(scal)
        if "scalar_inplace_aug" in self.exclude:   # s = s + v: the same, where s is immutable
            self.tag("scalar_update")
            if ch.flag(0.3):
                return [f"{s} = {s} * {_num(ch.choice([0.5, 0.9, -0.5]))}"]
            return [f"{s} = {s} {ch.choice(['+', '-'])} 0.5 * np.tanh({self.sexpr(sc, loop)})"]
        self.tag("scalar_inplace_aug")
        if ch.flag(0.3):
            return [f"{s} *= {_num(ch.choice([0.5, 0.9, -0.5]))}"]
        return [f"{s} {ch.choice(['+=', '-='])} 0.5 * np.tanh({self.sexpr(sc, loop)})"]

    def s_create(self, sc, depth, loop):
        ch = self.ch
        y = self.fresh("y")
        m = ch.choice([self.n, self.n, 2, 3, 4])
        lines = [f"{y} = np.zeros({m})"]
        for _ in range(ch.int(0, 2)):
            lines.append(f"{y}[{ch.int(-m, m - 1)}] = {self.sexpr(sc, loop)}")
        if loop is not None and loop["m"] and m >= loop["m"] and ch.flag():
            lines.append(f"{y}[{loop['var']}] = {self.sexpr(sc, loop)}")
        sc[y] = ("a", m)
        self.tag("zeros_in_" + ("loop" if loop else "branch" if depth else "body"))
        return lines

    def s_write(self, sc, depth, loop):
        ch = self.ch
        arrs = [a for a, v in sc.items() if v[0] == "a"]
        y = ch.choice(arrs)
        m = sc[y][1]
        if loop is not None and loop["m"] and m >= loop["m"] and ch.flag(0.6):
            idx = loop["var"]
            self.tag("write_loop_index")
        else:
            idx = str(ch.int(-m, m - 1))
            self.tag("write_item" + ("_in_branch" if depth else ""))
        return [f"{y}[{idx}] {ch.choice(['=', '=', '+=', '-='])} {self.sexpr(sc, loop)}"]

    def s_alias(self, sc, depth, loop):
        arrs = [a for a, v in sc.items() if v[0] == "a"]
        y = self.ch.choice(arrs)
        z = self.fresh("z")
        sc[z] = sc[y]
        self.tag("alias")
        return [f"{z} = {y}"]

    def s_ifexp(self, sc, depth, loop):
        ch = self.ch
        c = self.cond(sc, loop, 1)
        self.tag("ifexp")
        if ch.flag(0.3):
            v = self.fresh("v")
            line = f"{v} = {self.vexpr(sc, loop)} if {c} else {self.vexpr(sc, loop)}"
            sc[v] = ("v",)
            return [line]
        s = self.fresh("s")
        line = f"{s} = {self.sexpr(sc, loop)} if {c} else {self.sexpr(sc, loop)}"
        sc[s] = ("s",)
        return [line]

    def s_minmax(self, sc, depth, loop):
        ch = self.ch
        fn = ch.choice(["min", "max"])
        k = ch.int(1, 3)
        args = [self.sexpr(sc, loop, 1) for _ in range(k)]
        if k == 1:
            args.append(self.const())
        s = self.fresh("s")
        sc[s] = ("s",)
        self.tag("builtin_" + fn)
        return [f"{s} = {fn}({', '.join(args)})"]

    def s_boolval(self, sc, depth, loop):
        scal = [k for k, v in sc.items() if v[0] == "s"]
        if not scal:
            return self.s_assign_s(sc, depth, loop)
        s = self.fresh("s")
        a = self.ch.choice(scal)
        op = self.ch.choice(["and", "or"])
        line = f"{s} = {a} {op} {self.sexpr(sc, loop, 1)}"
        sc[s] = ("s",)
        self.tag("value_" + op)
        return [line]

    def s_if(self, sc, depth, loop):
        ch = self.ch
        nb = ch.weighted([(3, 1), (5, 2), (2, 3)])
        has_else = nb >= 2 and not (nb == 3 and ch.flag(0.3))
        heads = [f"if {self.cond(sc, loop)}:"]
        if nb == 3:
            heads.append(f"elif {self.cond(sc, loop)}:")
        if has_else:
            heads.append("else:")
        elif nb == 2:
            heads.append(f"elif {self.cond(sc, loop)}:")
        self.tag(f"if_{len(heads)}_branches" + ("_else" if has_else else ""))
        # a new name every path binds (only with an else: every path)
        new = None
        if has_else and ch.flag(0.5):
            new = (self.fresh(ch.choice(["s", "s", "v", "y"])))
        jumps = loop is not None and loop.get("jumps")
        out = []
        scopes = []
        for head in heads:
            bsc = dict(sc)
            body = self.block(bsc, depth + 1, loop, ch.int(1, 2))
            if new is not None:
                if new[0] == "s":
                    body.append(f"{new} = {self.sexpr(bsc, loop)}")
                elif new[0] == "v":
                    body.append(f"{new} = {self.vexpr(bsc, loop)}")
                else:
                    m = self.n
                    body += [f"{new} = np.zeros({m})",
                             f"{new}[{ch.int(0, m - 1)}] = {self.sexpr(bsc, loop)}"]
                    self.tag("zeros_in_both_branches")
            if jumps and ch.flag(0.35):
                j = ch.choice(loop["jumps"])
                body.append(j)
                self.tag(j + "_in_" + loop["kind"])
                loop["used"].add(j)
            if depth == 0 and loop is None and ch.flag(0.12) and not self.expect:
                body.append(f"return {self.loss_expr(bsc)}")
                self.tag("early_return")
            out.append(head)
            out += _indent(body)
            scopes.append(bsc)
        if new is not None:
            sc[new] = ("s",) if new[0] == "s" else ("v",) if new[0] == "v" else ("a", self.n)
            self.tag("bound_on_every_path")
        return out

    def s_while_counter(self, sc, depth, loop):
        ch = self.ch
        k = self.fresh("k")
        K = ch.int(2, 7)
        scal = [a for a, v in sc.items() if v[0] == "s"]
        if not scal or ch.flag(0.3):
            s = self.fresh("s")
            pre = [f"{s} = {self.sexpr(sc, None)}"]
            sc[s] = ("s",)
        else:
            s, pre = ch.choice(scal), []
        lp = {"var": k, "m": 0, "kind": "while", "jumps": ["break"], "used": set()}
        test = ch.choice([f"{s} > {self.const(-0.5, 0.5)}",
                          f"np.abs({s}) > {self.const(0.05, 0.5)}",
                          self.cond(sc, None, 1), f"{s} < {self.const(-0.5, 0.8)}"])
        order = ch.flag(0.7)
        test = f"{test} and {k} < {K}" if order else f"{k} < {K} and {test}"
        step = ch.choice([f"{s} = 0.8 * {s} + 0.3 * np.sin({self.sexpr(sc, None, 1)})",
                          f"{s} = np.tanh({s} * 1.5 - 0.2)",
                          f"{s} = {s} - 0.25",
                          f"{s} = {s} * 0.5 + 0.3"])
        bsc = dict(sc)
        body = [f"{k} += 1", step] + (self.block(bsc, depth + 1, lp, ch.int(0, 2)))
        self.tag("while_counter")
        lines = pre + [f"{k} = 0", f"while {test}:"] + _indent(body)
        if ch.flag(0.5):
            t = self.fresh("s")
            lines.append(f"{t} = {s} + 0.1 * {k}")
            sc[t] = ("s",)
            self.tag("counter_read_after")
        return lines

    def s_while_tol(self, sc, depth, loop):
        ch = self.ch
        g = self.fresh("g")
        kind = ch.choice(["halve", "newton", "newton_counter"])
        if kind == "halve":
            t = self.fresh("t")
            tol = ch.choice(["1e-3", "1e-2", "0.05"])
            lines = [f"{t} = {self.sexpr(sc, None)}", f"{g} = {self.const()}",
                     f"while abs({g} - {t}) > {tol}:",
                     f"    {g} = {g} + 0.5 * ({t} - {g})"]
            sc[t] = ("s",)
        else:
            r = self.fresh("r")
            s = self.sexpr(sc, None)
            lines = [f"{r} = 1.0 + ({s}) ** 2", f"{g} = {ch.choice(['1.0', r, '2.0'])}"]
            if kind == "newton":
                lines += [f"while abs({g} * {g} - {r}) > 1e-9:",
                          f"    {g} = 0.5 * ({g} + {r} / {g})"]
            else:
                it = self.fresh("it")
                lines += [f"{it} = 0", f"while np.abs({g} * {g} - {r}) > 1e-6 * {r} and {it} < 50:",
                          f"    {g} = 0.5 * ({g} + {r} / {g})", f"    {it} += 1"]
            sc[r] = ("s",)
        sc[g] = ("s",)
        self.tag("while_tol_" + kind)
        return lines

    def s_for_jump(self, sc, depth, loop):
        ch = self.ch
        i = self.fresh("i")
        m = ch.int(2, self.n)
        lp = {"var": i, "m": m, "kind": "for", "jumps": ["break", "continue"], "used": set()}
        scal = [a for a, v in sc.items() if v[0] == "s"]
        pre = []
        if not scal or ch.flag(0.5):
            acc = self.fresh("acc")
            pre.append(f"{acc} = {ch.choice(['0.0', '0.0', self.sexpr(sc, None)])}")
            sc[acc] = ("s",)
        else:
            acc = ch.choice(scal)
        bsc = dict(sc)
        stmts = [self.stmt(bsc, depth + 1, lp) for _ in range(ch.int(0, 2))]
        j = ch.choice(["break", "continue"])
        jump_if = [f"if {self.cond(dict(sc), lp)}:", f"    {j}"]   # names bound before the loop
        lp["used"].add(j)
        self.tag(j + "_in_for")
        update = [f"{acc} = {acc} {ch.choice(['+', '-'])} {ch.choice(['', 'np.sin', 'np.tanh'])}"
                  f"(x[{i}])" + ch.choice(["", f" * {acc}", " * 0.5"])]
        pre += self._loop_array(sc, bsc, lp, stmts)
        stmts.insert(ch.int(0, len(stmts)), jump_if)
        stmts.insert(len(stmts) if ch.flag(0.6) else 0, update)
        body = [ln for st in stmts for ln in st]
        lines = pre + [f"for {i} in range({m}):"] + _indent(body)
        if "break" in lp["used"] and ch.flag(0.2):
            lines += ["else:", f"    {acc} = {acc} + 0.5"]
            self.tag("for_else")
        return lines

    def _loop_array(self, sc, bsc, lp, stmts):
        """Often: ``y[i] = ...`` in the loop's body, into an array made
        before the loop (returned: the statement making it) or an earlier one."""
        ch = self.ch
        if not ch.flag(0.5):
            return []
        arrs = [a for a, v in sc.items() if v[0] == "a" and v[1] >= lp["m"]]
        pre = []
        if arrs and ch.flag(0.5):
            y = ch.choice(arrs)
        else:
            y = self.fresh("y")
            pre = [f"{y} = np.zeros({self.n})"]
            sc[y] = bsc[y] = ("a", self.n)
        i = lp["var"]
        stmts.insert(ch.int(0, len(stmts)),
                     [f"{y}[{i}] {ch.choice(['=', '+='])} {self.sexpr(dict(sc), lp)}"])
        self.tag("write_loop_index")
        return pre

    def s_for_if(self, sc, depth, loop):
        ch = self.ch
        i = self.fresh("i")
        m = ch.int(2, self.n)
        lp = {"var": i, "m": m, "kind": "for", "jumps": None, "used": set()}
        scal = [a for a, v in sc.items() if v[0] == "s"]
        if not scal or ch.flag(0.5):
            acc = self.fresh("acc")
            pre = [f"{acc} = 0.0"]
            sc[acc] = ("s",)
        else:
            acc, pre = ch.choice(scal), []
        bsc = dict(sc)
        stmts = [[f"if {self.cond(dict(sc), lp)}:",
                  f"    {acc} = {acc} + {self.sexpr(dict(sc), lp)}",
                  "else:",
                  f"    {acc} = {acc} * 0.9"]] + [self.stmt(bsc, depth + 1, lp)
                                               for _ in range(ch.int(0, 1))]
        pre += self._loop_array(sc, bsc, lp, stmts)
        body = [ln for st in stmts for ln in st]
        self.tag("for_with_if")
        return pre + [f"for {i} in range({m}):"] + _indent(body)

    # -- what is not converted by design --
    def fallback_stmt(self, sc):
        ch = self.ch
        kind = ch.choice(list(FALLBACK_KINDS))
        self.expect.append(kind)
        self.tag(kind)
        s = self.sexpr(sc)
        if kind == "fb_append":
            self.pre.append("hist = []")
            self.extra_loss.append("0.125 * len(hist)")
            return [f"if {self.cond(sc)}:", f"    hist.append({s})"]
        if kind == "fb_one_path":
            w = self.fresh("w")
            sc[w] = ("s",)
            return ["if np.max(x) > -2.0:", f"    {w} = {s}"]
        if kind == "fb_raise":
            return ["if np.max(np.abs(x)) > 10.0:", "    raise ValueError('x out of range')"]
        if kind == "fb_shapes":
            q = self.fresh("q")
            line = f"{q} = np.sum(x * 0.5 if {self.cond(sc)} else {s})"
            sc[q] = ("s",)
            return [line]
        if kind == "fb_float_cmp":
            return [f"if float(np.sum(x)) > {self.const()}:", f"    x = x * {s}"]
        i = self.fresh("i")
        return [f"for {i} in range({self.n}):", f"    if x[{i}] > {self.const(0.5, 1.2)}:",
                f"        return {self.loss_expr(sc)}"]

    def loss_expr(self, sc):
        terms = []
        for k, v in sc.items():
            if v[0] == "s":
                terms.append(f"{k} * {_num(self.ch.choice([0.5, 1.0, -0.75, 1.25]))}")
            elif v[0] == "v":
                terms.append(f"np.sum(np.sin({k}))")
            else:
                w = np.round(np.linspace(-1, 1, v[1]) + 0.25, 3).tolist()
                terms.append(f"np.sum({k} * np.array({w!r}))")
        terms += self.extra_loss
        return " + ".join(terms) or "np.sum(x ** 2)"


def generate(ch, seed=None, min_stmts=2, max_stmts=5, fallbacks=0.08, attempts=20,
             exclude=KNOWN_WRONG):
    """A program with at least two inputs that keep every decision MARGIN
    away from flipping (preferring inputs that take different paths)."""
    for _ in range(attempts):
        n = ch.int(3, 5)
        g = _Gen(ch, n, exclude)
        sc = {}
        body = [f"s0 = {g.sexpr({}, None)}"]
        sc["s0"] = ("s",)
        k = ch.int(min_stmts, max_stmts)
        for j in range(k):
            if ch.flag(fallbacks) and not g.expect:
                body += g.fallback_stmt(sc)
            body += g.stmt(sc, 0, None)
        prog = Program(g.pre + body, g.loss_expr(sc), g.tags, n, expect_fallback=list(g.expect),
                       seed=seed)
        if _choose_inputs(prog, ch):
            return prog
    raise RuntimeError(f"no program with valid inputs in {attempts} attempts (seed {seed})")


# --- inputs: an instrumented copy records every decision ------------------------------

_OPS = {"Lt": operator.lt, "LtE": operator.le, "Gt": operator.gt, "GtE": operator.ge,
        "Eq": operator.eq, "NotEq": operator.ne}


class _Recorder:
    def __init__(self):
        self.ok = True
        self.path = []

    def _far(self, a, b):
        a = np.asarray(a, dtype=float)
        b = np.asarray(b, dtype=float)
        d = np.abs(a - b)
        return bool(np.all((d >= MARGIN) | (d > REL_MARGIN * np.maximum(np.abs(a), np.abs(b)))))

    def C(self, ops, *vals):
        res = True
        for op, a, b in zip(ops, vals, vals[1:]):
            r = _OPS[op](a, b)
            self.ok = self.ok and self._far(a, b)
            self.path.append(tuple(np.ravel(r).tolist()))
            if len(ops) == 1:
                return r
            res = res and bool(r)
        return res

    def T(self, v):
        if isinstance(v, (bool, np.bool_)) or (isinstance(v, np.ndarray) and v.dtype == bool):
            self.path.append(bool(v))
        elif isinstance(v, (int, float, np.number, np.ndarray)):
            self.ok = self.ok and self._far(v, 0.0)
            self.path.append(bool(v))
        return v

    def M(self, fn, *args):
        items = list(args[0]) if len(args) == 1 else list(args)
        for a in range(len(items)):
            for b in range(a + 1, len(items)):
                self.ok = self.ok and self._far(items[a], items[b])
        r = fn(*args)
        self.path.append(id(r) == id(items[0]))
        return r


class _Instrument(ast.NodeTransformer):
    def _call(self, name, args):
        return ast.Call(func=ast.Attribute(value=ast.Name(id="_rec", ctx=ast.Load()), attr=name,
                                           ctx=ast.Load()), args=args, keywords=[])

    def visit_Compare(self, node):
        self.generic_visit(node)
        ops = ast.Constant(value=tuple(type(o).__name__ for o in node.ops))
        return self._call("C", [ops, node.left] + node.comparators)

    def _test(self, node):
        self.generic_visit(node)
        node.test = self._call("T", [node.test])
        return node

    visit_If = visit_While = visit_IfExp = _test

    def visit_BoolOp(self, node):
        self.generic_visit(node)
        node.values = [self._call("T", [v]) for v in node.values]
        return node

    def visit_UnaryOp(self, node):
        self.generic_visit(node)
        if isinstance(node.op, ast.Not):
            node.operand = self._call("T", [node.operand])
        return node

    def visit_Call(self, node):
        self.generic_visit(node)
        if isinstance(node.func, ast.Name) and node.func.id in ("min", "max"):
            return self._call("M", [node.func] + node.args)
        return node


def instrumented(prog):
    tree = ast.parse(prog.source())
    tree = ast.fix_missing_locations(_Instrument().visit(tree))
    ns = {"np": np}
    exec(compile(tree, "<instrumented>", "exec"), ns)
    return ns["f"]


def run_recorded(prog, x, fi=None):
    """(value, recorder) of the program in NumPy on x, or None where it fails
    or its values blow up."""
    fi = fi or instrumented(prog)
    rec = _Recorder()
    fi.__globals__["_rec"] = rec
    try:
        with np.errstate(all="raise"), warnings.catch_warnings():
            warnings.simplefilter("error")
            v = fi(x.copy())
    except Exception:
        return None
    if not np.isfinite(v) or abs(v) > MAX_ABS or np.ndim(v) != 0:
        return None
    return v, rec


def _choose_inputs(prog, ch):
    fi = instrumented(prog)
    seed = ch.int(0, 2 ** 31 - 1)
    rng = np.random.default_rng(seed)
    by_path = {}
    for _ in range(N_CANDIDATES):
        x = np.round(rng.uniform(-1.5, 1.5, prog.n), 3)
        r = run_recorded(prog, x, fi)
        if r is None or not r[1].ok:
            continue
        by_path.setdefault(repr(r[1].path), []).append(x)
    if not by_path:
        return False
    chosen = [xs[0] for xs in by_path.values()][:MAX_INPUTS]
    rest = [x for xs in by_path.values() for x in xs[1:]]
    while len(chosen) < min(3, MAX_INPUTS) and rest:
        chosen.append(rest.pop(0))
    if len(chosen) < 2:
        return False
    prog.inputs = chosen
    prog.paths = min(len(by_path), MAX_INPUTS)
    return True


# --- checking ---------------------------------------------------------------------------

@dataclasses.dataclass
class Outcome:
    fallbacks: dict = dataclasses.field(default_factory=dict)   # backend -> reason
    checked: list = dataclasses.field(default_factory=list)
    paths: int = 0
    inputs: int = 0
    fd_unreliable: bool = False
    higher: list = dataclasses.field(default_factory=list)


class _LogCapture(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())

    def __enter__(self):
        self.logger = logging.getLogger("tracegrad")
        self.logger.addHandler(self)
        return self

    def __exit__(self, *exc):
        self.logger.removeHandler(self)
        return False


def _reason(msg):
    m = re.search(r"for these argument types(?:, because)?:? at (.*?)\. Pass fallback", msg, re.S)
    return m.group(1) if m else msg


def _short_reason(reason):
    """A fallback reason with the file, line and names taken out (to count)."""
    r = reason.split("\n")[0]
    r = re.sub(r"\S*\.py(:\d+)?,?", "FILE", r)
    r = re.sub(r"line \d+", "line N", r)
    r = re.sub(r"'[A-Za-z_][A-Za-z_0-9]*'", "'NAME'", r)
    r = re.sub(r"^FILE\s*", "", r)
    m = re.match(r"its body cannot be traced \((\w+): (.{0,60})", r)
    if m:
        return f"its body cannot be traced ({m.group(1)}: {m.group(2)}...)"
    return re.sub(r"\(([^()]{40})[^()]*\)", r"(\1...)", r)[:170]


def fallback_expected(prog, reason):
    """Is the fallback one of the program's statements not converted by design?"""
    return any(re.search(FALLBACK_KINDS[t], reason) for t in prog.expect_fallback)


def check_program(prog, *, backends=("numpy",), fd=True, higher=False):
    """Run ``prog`` on its inputs as NumPy, compiled on each backend and with
    compile=False; raise Failure at the first disagreement."""
    with _LogCapture():     # the fallbacks' log lines are counted, not printed
        return _check(prog, backends, fd, higher)


def _check(prog, backends, fd, higher):
    import tracegrad as tg
    from tracegrad.runtime import cache

    out = Outcome(paths=prog.paths, inputs=len(prog.inputs))
    f = prog.function()
    xs = prog.inputs
    with np.errstate(all="raise"):
        wants = [f(x.copy()) for x in xs]

    nums, scales = [], []
    for x, want in zip(xs, wants):
        scale = 1.0 + abs(float(want))
        with np.errstate(all="ignore"):
            num = fd_grad(lambda v: f(v.copy()), [x], 0, 1e-6) if fd else None
        nums.append(num)
        scales.append((scale, 1.0 + (float(np.max(np.abs(num))) if fd else 0.0)))

    def fd_ok(g, j, mode):
        if not fd:
            return
        scale, gs = scales[j]
        gtol = dict(rtol=1e-5, atol=1e-6 * gs + 1e-9 * scale)
        if _close(g, nums[j], **gtol):
            return
        x = xs[j]

        def est(h):
            with np.errstate(all="ignore"):
                a = fd_grad(lambda v: f(v.copy()), [x], 0, h)
                b = fd_grad(lambda v: f(v.copy()), [x], 0, 2 * h)
            return (4 * a - b) / 3
        r1, r2 = est(1e-4), est(1e-5)
        if _close(r1, r2, rtol=1e-6, atol=1e-7 * gs):
            if not _close(g, r2, **gtol):
                raise Failure(f"{mode}-grad-vs-fd", prog,
                              f"input {j}: {mode}\n{np.asarray(g)!r}\nfinite differences\n"
                              f"{nums[j]!r}\nextrapolated\n{r2!r}")
        else:
            out.fd_unreliable = True

    def value_ok(v, j, mode):
        scale = scales[j][0]
        if not _close(v, wants[j], rtol=1e-10, atol=1e-11 * scale):
            raise Failure(f"{mode}-value", prog, f"input {j}: numpy {wants[j]!r}, {mode} {v!r}")

    # compile=False: the reference gradient
    eager = []
    veg = tg.value_and_grad(f, compile=False)
    for j, x in enumerate(xs):
        xc = x.copy()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                v, g = veg(xc)
        except Exception as e:
            raise Failure("eager-crash", prog, f"input {j}: {type(e).__name__}: {e}") from e
        value_ok(v, j, "eager")
        fd_ok(g, j, "eager")
        eager.append(np.asarray(g))
    out.checked.append("eager")

    for backend in backends:
        vg = tg.value_and_grad(f, backend=backend)
        traces = []
        with _LogCapture() as cap:
            for j, x in enumerate(xs):
                xc = x.copy()
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        v, g = vg(xc)
                except Exception as e:
                    raise Failure(f"{backend}-crash", prog,
                                  f"input {j}: {type(e).__name__}: {e}") from e
                traces.append(cache._stats["traces"])
                if not np.array_equal(xc, x):
                    raise Failure(f"{backend}-mutates-input", prog, f"x changed to {xc!r}")
                value_ok(v, j, backend)
                if not _close(g, eager[j], rtol=1e-8, atol=1e-10 * scales[j][1]):
                    raise Failure(f"{backend}-grad-vs-eager", prog,
                                  f"input {j}: {backend}\n{np.asarray(g)!r}\ncompile=False\n"
                                  f"{eager[j]!r}")
                fd_ok(g, j, backend)
        fell = [m for m in cap.messages if "runs eagerly" in m]
        if len(fell) > 1:
            raise Failure(f"{backend}-fallback-logged-twice", prog, "\n".join(fell))
        if traces[-1] != traces[0]:
            raise Failure(f"{backend}-traced-again", prog,
                          f"the compiled function was traced again for inputs of the same "
                          f"signature (trace counts {traces})")
        if fell:
            reason = _reason(fell[0])
            out.fallbacks[backend] = reason
            try:
                tg.value_and_grad(f, backend=backend, fallback=False)(xs[0].copy())
            except tg.TraceError as e:
                if not re.search(r"\.py:\d+|line \d+", str(e)):
                    raise Failure(f"{backend}-fallback-error-unclear", prog,
                                  f"the TraceError names no line: {e}") from e
            except Exception as e:
                raise Failure(f"{backend}-fallback-false-crash", prog,
                              f"{type(e).__name__}: {e}") from e
            else:
                raise Failure(f"{backend}-fallback-false-ran", prog,
                              f"fallback=False ran although the default fell back: {reason}")
        out.checked.append(backend)

    if higher:
        j = 0
        x = xs[j]
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                jf = tg.jacfwd(f)(x.copy())
                h = tg.hessian(f)(x.copy())
        except Exception as e:
            raise Failure("higher-crash", prog, f"{type(e).__name__}: {e}") from e
        gs = scales[j][1]
        if not _close(jf, eager[j], rtol=1e-8, atol=1e-10 * gs):
            raise Failure("jacfwd", prog, f"jacfwd\n{np.asarray(jf)!r}\ncompile=False grad\n"
                                          f"{eager[j]!r}")
        ge = tg.grad(f, compile=False)
        eps = 1e-5
        num = np.zeros((x.size, x.size))
        for k in range(x.size):
            e = np.zeros_like(x)
            e[k] = eps
            num[:, k] = (np.asarray(ge(x + e)) - np.asarray(ge(x - e))) / (2 * eps)
        hs = 1.0 + float(np.max(np.abs(num)))
        if not _close(h, num, rtol=1e-4, atol=1e-5 * hs):
            raise Failure("hessian", prog, f"hessian\n{np.asarray(h)!r}\nfinite differences of "
                                           f"the compile=False gradient\n{num!r}")
        out.higher += ["jacfwd", "hessian"]
    return out
