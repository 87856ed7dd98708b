"""Random imperative NumPy programs: writes into arrays, for differential
testing of tracegrad (issue 24).

A program is ``def f(x): ...`` over one float64 input ``x`` (1-d or 2-d, a
few elements) whose statements create arrays (``np.zeros/ones/empty/full``,
``*_like``, ``np.copy``, ``x.copy()``, ``np.array([...traced...])``, results
of ops) and write into them: integer, negative, slice, ellipsis indices,
``y[i, j] += v``, ``y[:, t] = v``, boolean masks from comparisons of traced
values with scalars (``y[x > 0.3] = 0.5``), ``y[range(k)] -= v``, fancy
indices with repeats (``y[[0, 0]] += v``: NumPy applies it once),
``np.add.at`` with repeated indices (applied every time), writes through
views (``v = y[1:]; v *= c``, ``y.T[0] = ...``, ``y.reshape(-1)[k] = ...``,
``y[::-1][0] = ...``, ``row = y[1]; row[:] = ...``) with reads of other views
of the same base afterwards (and copies that look like views:
``y.T.reshape(-1)``, ``y.flatten()``), loops ``for i in range(1, n):
out[i] = g(out[i - 1], x)`` and ``acc[i % m] += ...``, ``z.sort()`` of a
created array, chained indices (``y[1][::-1] = ...``), traced indices
(``y[np.argsort(x)] = ...``, ``y[np.argmax(x)] += ...``), selections by a
traced mask written back (``y[m] = x[m] * 2``), writes by NumPy functions
(``y.fill``, ``np.copyto``, ``np.put``, ``out=``), and branches and while
loops on conversions that only feed a comparison (``if float(np.sum(y)) >
c:``).  A few programs do what tracegrad refuses by
design (a conversion used as a number, a write into the argument through a
view, a write through an ``np.einsum`` view): those must be refused with a
TraceError/TypeError naming the line.

The generator runs every statement in NumPy as it writes it (the whole body
so far, from a fresh copy of the input), so masks, sorts and branches are
kept only where the compared values are at least ``MARGIN`` away from their
thresholds (or one another): finite differences do not cross a kink.

``check_program`` runs each program as plain NumPy, compiled
(``tg.compile`` twice, ``tg.value_and_grad``) and with ``compile=False``
(``tg.value_and_grad(f, compile=False)``): the values equal NumPy's, the
gradients central finite differences of the NumPy function.  A refusal is
classified (``Outcome.refusals``): expected by design, pending (features
being added), or a Failure.  A Failure carries a runnable reproducer.
"""
from __future__ import annotations

import dataclasses
import linecache
import re
import textwrap
import warnings

import numpy as np

from _random_programs import Failure, RngChooser, _close, fd_grad  # noqa: F401

MARGIN = 2e-2
MAX_ABS = 50.0

# Tags of statements whose refusal is tolerated today: features another
# engineer is adding (the refusal is counted as "pending:<tag>", not failed,
# provided it is a clear TraceError/TypeError naming the line).
PENDING = frozenset()

# Statement kinds known to give wrong values today (left out by default; the
# reproducers are strict xfails in tests/test_random_imperative_programs.py).
KNOWN_WRONG = frozenset()   # none known today

# Crashes on programs NumPy runs, known today (strict xfails in
# tests/test_random_imperative_programs.py): name -> (mode, exception type,
# text of the message).  ``check_program(known=True)`` counts them in
# ``Outcome.known`` instead of failing.
KNOWN_CRASHES: dict = {}    # none known today


def _num(v):
    return repr(float(v))


@dataclasses.dataclass
class Program:
    x: np.ndarray
    body: list            # statements (each possibly several lines), at indent 0
    loss: str
    tags: list
    # what tracegrad refuses by design: {"compiled": reason, "eager": reason}
    expect: dict = dataclasses.field(default_factory=dict)
    # refusals allowed but not required: {"compiled": reason}
    allow: dict = dataclasses.field(default_factory=dict)
    seed: object = None

    def source(self, name="f"):
        body = "\n".join(self.body + ["return " + self.loss])
        return f"def {name}(x):\n" + textwrap.indent(body, "    ") + "\n"

    def filename(self):
        return f"<random imperative program {self.seed}>"

    def function(self, name="f"):
        src = self.source(name)
        fn = self.filename()
        # so tracebacks and tracegrad's messages can quote the line
        linecache.cache[fn] = (len(src), None, src.splitlines(True), fn)
        ns = {"np": np}
        exec(compile(src, fn, "exec"), ns)
        return ns[name]

    def reproducer(self):
        with np.printoptions(precision=17, floatmode="unique"):
            xs = f"x = np.{self.x!r}"
        return (f"import numpy as np\nimport tracegrad as tg\n\n{self.source()}\n{xs}\n"
                f"print('numpy        ', f(x.copy()))\n"
                f"print('compiled     ', tg.value_and_grad(f)(x.copy()))\n"
                f"print('compile=False', tg.value_and_grad(f, compile=False)(x.copy()))\n")

    def __repr__(self):
        return f"Program(seed={self.seed!r}):\n{self.reproducer()}"


class _Gen:
    def __init__(self, ch, x, exclude):
        self.ch, self.x, self.exclude = ch, x, frozenset(exclude)
        self.body, self.tags = [], []
        self.arrays = []          # names of created arrays and views (writable in NumPy)
        self.n = 0
        self.expect = {}
        self.allow = {}
        self.x_may_change = False

    def fresh(self, p="y"):
        self.n += 1
        return f"{p}{self.n}"

    def run(self, extra=()):
        """The body so far plus ``extra`` statements, run in NumPy on a fresh
        copy of x; the namespace, or None where NumPy fails or values blow up."""
        env = {"np": np, "x": self.x.copy()}
        src = "\n".join(list(self.body) + list(extra))
        try:
            with np.errstate(all="raise"), warnings.catch_warnings():
                warnings.simplefilter("error")
                exec(src, env)
        except Exception:
            return None
        for k, v in env.items():
            if isinstance(v, np.ndarray) and v.dtype.kind == "f":
                if not np.all(np.isfinite(v)) or (v.size and np.max(np.abs(v)) > MAX_ABS):
                    return None
        if not np.array_equal(env["x"], self.x) and not self.x_may_change:
            return None
        return env

    def emit(self, stmt, tag, new=()):
        stmts = stmt if isinstance(stmt, list) else [stmt]
        env = self.run(stmts)
        if env is None or any(np.size(env[a]) == 0 for a in new):
            return False
        self.body.extend(stmts)
        self.tags.append(tag)
        self.arrays.extend(new)
        return True

    # --- values ------------------------------------------------------------------
    def env(self):
        return self.run()

    def shapes(self, env):
        return {a: env[a].shape for a in self.arrays}

    def sval(self, env, depth=0):
        """Source of a smooth scalar expression of traced values."""
        ch = self.ch
        x = self.x
        idx = ", ".join(str(ch.int(-d, d - 1)) for d in x.shape)
        forms = ["xi", "xi", "sum", "arr", "arr", "mix"]
        form = ch.choice(forms)
        if form == "arr" and self.arrays:
            a = ch.choice(self.arrays)
            s = env[a].shape
            if len(s) == 0:
                src = a
            else:
                src = f"{a}[{', '.join(str(ch.int(-d, d - 1)) for d in s)}]"
            fn = ch.choice(["np.tanh", "np.sin", "", "0.5 * "])
            return f"{fn}({src})" if fn.startswith("np") else f"{fn}{src}"
        if form == "sum":
            return ch.choice(["np.sum(np.sin(x))", "np.mean(x) * 2.0", "np.tanh(np.sum(x))",
                              "np.sum(x ** 2) * 0.25"])
        if form == "mix" and depth < 1:
            return f"{self.sval(env, depth + 1)} * {self.sval(env, depth + 1)}"
        fn = ch.choice(["np.sin", "np.cos", "np.tanh", "", "np.exp"])
        c = ch.choice(["", " * 1.5", " + 0.25", " ** 2"])
        return f"{fn}(x[{idx}]){c}" if fn else f"x[{idx}]{c}"

    def vval(self, env, shape):
        """Source of an array expression of the given shape (or broadcastable to it)."""
        ch = self.ch
        cands = []
        for nm in ["x"] + self.arrays:
            v = env[nm]
            for sl in ["", "[::-1]", "[1:]", "[:-1]", ".T", "[0]", "[:, 0]", "[..., -1]", "[::2]"]:
                try:
                    r = eval(f"v{sl}", {"v": v})
                except Exception:
                    continue
                if r.shape == shape:
                    cands.append(f"{nm}{sl}")
        if cands and ch.flag(0.75):
            src = ch.choice(cands)
            fn = ch.choice(["np.sin", "np.tanh", "", "0.5 * ", "np.cos"])
            if fn.startswith("np"):
                return f"{fn}({src})"
            return f"{fn}{src}"
        n = int(np.prod(shape))
        vals = [ch.int(-8, 8) / 4 for _ in range(n)]
        const = f"np.array({np.array(vals).reshape(shape).tolist()!r})"
        return f"{self.sval(env)} * {const}"

    # --- statements ----------------------------------------------------------------
    def create(self, env):
        ch = self.ch
        y = self.fresh("y")
        nd = ch.weighted([(3, 1), (2, 2)])
        shape = (ch.int(2, 6),) if nd == 1 else (ch.int(2, 3), ch.int(2, 4))
        kind = ch.choice(["zeros", "ones", "full", "empty", "zeros_like", "ones_like", "copy",
                          "copy_method", "array", "op"])
        if kind == "zeros":
            return self.emit(f"{y} = np.zeros({shape!r})", "zeros", [y])
        if kind == "ones":
            return self.emit(f"{y} = np.ones({shape[0] if nd == 1 else shape})", "ones", [y])
        if kind == "full":
            return self.emit(f"{y} = np.full({shape!r}, {_num(ch.int(-6, 6) / 4)})", "full", [y])
        if kind == "empty":
            fill = self.vval(env, shape) if ch.flag() else self.sval(env)
            sl = ch.choice(["...", ":"])
            return self.emit([f"{y} = np.empty({shape!r})", f"{y}[{sl}] = {fill}"], "empty", [y])
        src = ch.choice(["x"] + self.arrays)
        if kind in ("zeros_like", "ones_like"):
            return self.emit(f"{y} = np.{kind}({src})", kind, [y])
        if kind == "copy":
            return self.emit(f"{y} = np.copy({src})", "copy", [y])
        if kind == "copy_method":
            return self.emit(f"{y} = {src}.copy()", "copy", [y])
        if kind == "op":
            return self.emit(f"{y} = {ch.choice(['np.sin', 'np.tanh', '0.5 * '])}({src})"
                             if ch.flag() else f"{y} = {src} * 1.0", "op_result", [y])
        k = ch.int(2, 4)
        items = [self.sval(env) if ch.flag(0.7) else _num(ch.int(-4, 4) / 4) for _ in range(k)]
        # np.array of numbers only is a plain ndarray tracegrad does not follow
        # (a write of a traced value into it is refused by design)
        items[ch.int(0, k - 1)] = self.sval(env)
        return self.emit(f"{y} = np.array([{', '.join(items)}])", "array", [y])

    def index(self, shape, scalar_only=False):
        """(index source, tag) for an array of this shape."""
        ch = self.ch
        if scalar_only or ch.flag(0.45):
            parts = [str(ch.int(-d, d - 1)) for d in shape]
            return ", ".join(parts), "int"
        if len(shape) == 1:
            d = shape[0]
            a = ch.int(0, d - 1)
            return ch.choice([f"{a}:", f":{max(a, 1)}", "::2", "::-1", "...", ":", f"-{ch.int(1, d)}:",
                              "1::2"]), "slice"
        r, c = shape
        return ch.choice([f":, {ch.int(0, c - 1)}", f"{ch.int(0, r - 1)}", f"{ch.int(0, r - 1)}, 1:",
                          f"..., {ch.int(-c, -1)}", f"::-1, {ch.int(0, c - 1)}", "1:, :2", "...",
                          ":, ::2"]), "slice"

    def write(self, env):
        ch = self.ch
        if not self.arrays:
            return False
        y = ch.choice(self.arrays)
        shape = env[y].shape
        if len(shape) == 0:
            return False
        idx, tag = self.index(shape)
        try:
            tshape = eval(f"_y[{idx}]", {"_y": env[y]}).shape
        except Exception:
            return False
        op = ch.weighted([(5, "="), (2, "+="), (1, "-="), (2, "*=")])
        if op == "*=":
            val = f"{_num(ch.choice([0.5, 1.5, -1.0, 2.0]))}" if ch.flag() else \
                f"np.cos({self.sval(env)})"
        else:
            val = self.vval(env, tshape) if tshape and ch.flag(0.7) else self.sval(env)
        return self.emit(f"{y}[{idx}] {op} {val}", f"write_{tag}{'' if op == '=' else '_aug'}")

    def mask(self, env):
        ch = self.ch
        if not self.arrays:
            return False
        y = ch.choice(self.arrays)
        shape = env[y].shape
        srcs = [n for n in ["x"] + self.arrays if env[n].shape == shape]
        s = ch.choice(srcs)
        vals = env[s]
        c = ch.int(-4, 4) / 4
        if np.min(np.abs(vals - c)) < MARGIN:
            return False
        cmp = ch.choice([">", "<", ">=", "<="])
        m = f"{s} {cmp} {_num(c)}"
        if ch.flag(0.3):
            m2 = f"np.sin({s}) {ch.choice(['>', '<'])} 0.0" if np.min(np.abs(np.sin(vals))) > MARGIN \
                else None
            if m2:
                m = f"({m}) & ({m2})" if ch.flag() else f"({m}) | ({m2})"
        if ch.flag(0.25):
            mname = self.fresh("m")
            pre, mref = [f"{mname} = {m}"], mname
        else:
            pre, mref = [], m
        if ch.flag(0.2) and "mask_aug" not in self.exclude:
            return self.emit(pre + [f"{y}[{mref}] {ch.choice(['*=', '+='])} {_num(ch.choice([0.5, 2.0, -1.5]))}"],
                             "mask_aug")
        val = _num(ch.int(-6, 6) / 4)
        return self.emit(pre + [f"{y}[{mref}] = {val}"], "mask_set")

    def fancy(self, env):
        ch = self.ch
        if not self.arrays:
            return False
        y = ch.choice(self.arrays)
        shape = env[y].shape
        if len(shape) == 0:
            return False
        d = shape[0]
        kind = ch.choice(["range", "list_repeat", "add_at", "add_at", "rows_cols"])
        if kind == "range":
            k = ch.int(1, d)
            return self.emit(f"{y}[range({k})] {ch.choice(['-=', '+=', '='])} {self.sval(env)}",
                             "write_range")
        if kind == "list_repeat":
            idx = [ch.int(-d, d - 1) for _ in range(ch.int(2, 4))]
            return self.emit(f"{y}[{idx!r}] {ch.choice(['+=', '-=', '*='])} {self.sval(env)}",
                             "write_list_repeat")
        if kind == "add_at":
            idx = [ch.int(0, d - 1) for _ in range(ch.int(2, 5))]
            if len(shape) == 1 or ch.flag():
                val = self.sval(env)
            else:
                val = self.vval(env, (len(idx),) + shape[1:])
            return self.emit(f"np.add.at({y}, {idx!r}, {val})", "add_at")
        if len(shape) != 2:
            return False
        k = ch.int(1, 3)
        rows = [ch.int(0, shape[0] - 1) for _ in range(k)]
        cols = [ch.int(0, shape[1] - 1) for _ in range(k)]
        rsrc = f"range({k})" if ch.flag() and all(r < shape[0] for r in range(k)) else repr(rows)
        return self.emit(f"{y}[{rsrc}, {cols!r}] {ch.choice(['-=', '+=', '='])} {self.sval(env)}",
                         "write_rows_cols")

    def view(self, env):
        ch = self.ch
        if not self.arrays:
            return False
        y = ch.choice(self.arrays)
        a = env[y]
        v = self.fresh("v")
        forms = ["[1:]", "[::-1]", "[:-1]", ".reshape(-1)", ".ravel()", "[..., ::2]"]
        if a.ndim == 2:
            forms += [".T", "[0]", "[-1]", "[:, 1]", ".T.reshape(-1)", ".flatten()", "[1:][::-1]",
                      ".reshape(-1)[::-1]", "[:, ::-1].T"]
        form = ch.choice(forms)
        stmts = [f"{v} = {y}{form}"]
        # then (often) write through it, and keep it for reads
        if ch.flag(0.7):
            r = eval(f"_a{form}", {"_a": a})
            if r.ndim == 0:
                return False
            if ch.flag(0.4):
                stmts.append(f"{v} {ch.choice(['*=', '+=', '-='])} {_num(ch.choice([0.5, 1.5, -2.0, 0.25]))}")
            else:
                idx, _ = self.index(r.shape)
                try:
                    tshape = eval(f"_r[{idx}]", {"_r": r}).shape
                except Exception:
                    return False
                val = self.vval(env, tshape) if tshape and ch.flag(0.6) else self.sval(env)
                stmts.append(f"{v}[{idx}] {ch.choice(['=', '=', '+='])} {val}")
        return self.emit(stmts, "view" + form.replace("[", "(").replace("]", ")"), [v])

    def view_write_inline(self, env):
        """A write through a view taken in the statement: ``y.T[0] = ...``."""
        ch = self.ch
        if not self.arrays:
            return False
        y = ch.choice(self.arrays)
        a = env[y]
        forms = ["[::-1]", ".reshape(-1)", "[1:]"] + ([".T", "[0]"] if a.ndim == 2 else [])
        form = ch.choice(forms)
        r = eval(f"_a{form}", {"_a": a})
        idx, _ = self.index(r.shape, scalar_only=ch.flag())
        try:
            tshape = eval(f"_r[{idx}]", {"_r": r}).shape
        except Exception:
            return False
        val = self.vval(env, tshape) if tshape and ch.flag(0.5) else self.sval(env)
        return self.emit(f"{y}{form}[{idx}] {ch.choice(['=', '+=', '*='])} {val}",
                         "inline_view_write")

    def loop(self, env):
        ch = self.ch
        kind = ch.choice(["recur", "recur", "acc", "recur2d"])
        if kind == "recur":
            n = ch.int(2, 8)
            out = self.fresh("o")
            first = self.sval(env)
            g = ch.choice([f"np.sin({out}[i - 1]) * {self.sval(env)}",
                           f"np.tanh({out}[i - 1] + {self.sval(env)})",
                           f"0.5 * {out}[i - 1] + np.cos(x.flat[i % {self.x.size}])",
                           f"{out}[i - 1] * 0.9 + x.flat[i % {self.x.size}] ** 2"])
            init = ch.choice([f"np.zeros({n})", f"np.empty({n})", f"np.ones({n})"])
            stmts = [f"{out} = {init}", f"{out}[0] = {first}",
                     f"for i in range(1, {n}):\n    {out}[i] = {g}"]
            return self.emit(stmts, "loop_recur", [out])
        if kind == "recur2d":
            x = self.x
            r = x.shape[0]
            n = ch.int(2, 6)
            s = self.fresh("s")
            col = "x" if x.ndim == 1 else f"x[:, {ch.int(0, x.shape[1] - 1)}]"
            stmts = [f"{s} = np.zeros(({r}, {n}))", f"{s}[:, 0] = {col}",
                     f"for t in range(1, {n}):\n    {s}[:, t] = np.tanh({s}[:, t - 1]) "
                     f"{ch.choice(['+', '-'])} {_num(ch.choice([0.5, 0.25, 1.5]))} * {col}"]
            if ch.flag(0.4):
                stmts.append(f"{s}[{ch.int(0, r - 1)}, {ch.int(0, n - 1)}] += {self.sval(env)}")
            return self.emit(stmts, "loop_recur2d", [s])
        if not self.arrays:
            return False
        acc = ch.choice(self.arrays)
        a = env[acc]
        if a.ndim == 0:
            return False
        m = a.shape[0]
        n = ch.int(2, 8)
        body = ch.choice([f"{acc}[i % {m}] += np.sin(x.flat[i % {self.x.size}]) * {_num(ch.int(1, 4) / 4)}",
                          f"{acc}[i % {m}] -= 0.5 * {acc}[(i + 1) % {m}]",
                          f"{acc}[i % {m}] *= {_num(ch.choice([0.5, 1.25, -0.75]))}",
                          f"{acc}[{ch.int(0, m - 1)}] += {self.sval(env)} * i"])
        return self.emit(f"for i in range({n}):\n    {body}", "loop_acc")

    def sort(self, env):
        ch = self.ch
        src = ch.choice(["x"] + self.arrays)
        v = env[src]
        if v.ndim == 0 or v.shape[-1] < 2:
            return False
        srt = np.sort(v, axis=-1)
        if np.min(np.diff(srt, axis=-1)) < MARGIN:
            return False
        z = self.fresh("z")
        how = ch.choice(["np.copy", "", "np.tanh"])
        init = f"{z} = np.copy({src})" if how == "np.copy" else \
            f"{z} = {src}.copy()" if how == "" else f"{z} = np.tanh({src})"
        if how == "np.tanh":
            t = np.sort(np.tanh(v), axis=-1)
            if np.min(np.diff(t, axis=-1)) < MARGIN:
                return False
        return self.emit([init, f"{z}.sort()"], "sort", [z])

    def branch(self, env):
        """``if float(...) > c:`` / ``if y[0].item() < c:``: a conversion that only
        feeds a comparison (compile=False runs it; compiled tracing refuses)."""
        ch = self.ch
        if not self.arrays:
            return False
        y = ch.choice(self.arrays)
        a = env[y]
        if a.ndim == 0:
            return False
        conv = ch.choice([f"float(np.sum({y}))", f"{y}.flat[0].item()", f"float({y}.max())",
                          f"bool(np.mean({y}) > CONST)", f"int(np.sum({y} > CONST))"])
        if "CONST" in conv:
            c = ch.int(-4, 4) / 4
            vals = a if "int(" in conv else np.mean(a)
            if np.min(np.abs(np.asarray(vals) - c)) < MARGIN:
                return False
            conv = conv.replace("CONST", _num(c))
            cond = conv if conv.startswith("bool") else f"{conv} >= {ch.int(0, a.size)}"
        else:
            val = eval(conv, {y: a, "np": np})
            c = ch.int(-8, 8) / 4
            if abs(val - c) < MARGIN:
                return False
            cond = f"{conv} {ch.choice(['>', '<'])} {_num(c)}"
        idx, _ = self.index(a.shape, scalar_only=True)
        st1 = f"{y}[{idx}] {ch.choice(['=', '+=', '*='])} {self.sval(env)}"
        st2 = f"{y}[{idx}] = {self.sval(env)}"
        stmt = f"if {cond}:\n    {st1}" + (f"\nelse:\n    {st2}" if ch.flag() else "")
        if self.emit(stmt, "branch_conversion"):
            # compiled tracing refuses it where the converted value is traced
            self.allow.setdefault("compiled", "conversion")
            return True
        return False

    def refused(self, env):
        """Something tracegrad refuses by design: both modes must raise a clear
        TraceError/TypeError naming the line."""
        ch = self.ch
        kind = ch.choice(["conversion_value", "argument_view_write", "einsum_view_write"])
        if "refused_" + kind in self.exclude:
            return False
        if kind == "conversion_value":
            c = self.fresh("c")
            conv = ch.choice(["float(np.sum(x))", "x.flat[0].item()"])
            ok = self.emit([f"{c} = {conv} * 2.0", f"{c}_arr = np.zeros(2)", f"{c}_arr[0] = {c}"],
                           "refused_conversion", [f"{c}_arr"])
            if ok:
                self.expect.update(compiled="conversion", eager="conversion")
            return ok
        if kind == "argument_view_write":
            v = self.fresh("xv")
            form = ch.choice(["[1:]", "[::-1]", ".T", ".reshape(-1)"])
            if form == "[1:]" and self.x.shape[0] < 2:
                return False
            # NumPy changes x: the rest of the program sees it; the check compares
            # only the refusal.
            self.x_may_change = True
            ok = self.emit([f"{v} = x{form}", f"{v} {ch.choice(['*=', '+='])} 0.5"], "refused_argument")
            self.x_may_change = ok
            return ok
        if not self.arrays:
            return False
        y = ch.choice(self.arrays)
        a = env[y]
        if a.ndim != 2:
            return False
        e = self.fresh("e")
        ok = self.emit([f"{e} = np.einsum('ij->ji', {y})", f"{e}[0, 1] = {self.sval(env)}"],
                       "refused_einsum_view")
        if ok:
            self.expect.update(compiled="einsum_view", eager="einsum_view")
        return ok


def _gaps_ok(v, axis=-1):
    v = np.asarray(v)
    return v.ndim and v.shape[axis] >= 2 and np.min(np.diff(np.sort(v, axis=axis), axis=axis)) >= MARGIN


class _More:
    """Statement kinds added second: chained and traced indices, selections
    by a mask, writes by NumPy functions, while loops on conversions."""

    def chained(self, env):
        """``y[i][j] op= v``: y[i] is a view for an integer i."""
        ch = self.ch
        cands = [a for a in self.arrays if env[a].ndim == 2]
        if not cands:
            return False
        y = ch.choice(cands)
        r, c = env[y].shape
        j = ch.choice([str(ch.int(-c, c - 1)), "1:", "::-1"])
        tgt = eval(f"_y[0][{j}]", {"_y": env[y]})
        val = self.vval(env, tgt.shape) if tgt.shape and ch.flag() else self.sval(env)
        return self.emit(f"{y}[{ch.int(-r, r - 1)}][{j}] {ch.choice(['=', '+=', '*='])} {val}",
                         "write_chained")

    def traced_index(self, env):
        """An index computed from traced values: argsort (a permutation),
        argmax (a 0-d integer)."""
        ch = self.ch
        if not self.arrays:
            return False
        y = ch.choice(self.arrays)
        a = env[y]
        if a.ndim == 0:
            return False
        n = a.shape[0]
        srcs = [s for s in ["x"] + self.arrays if env[s].ndim == 1 and env[s].shape[0] == n
                and _gaps_ok(env[s])]
        if not srcs:
            return False
        s = ch.choice(srcs)
        if ch.flag():
            val = self.vval(env, a.shape) if ch.flag() else self.sval(env)
            return self.emit(f"{y}[np.argsort({s})] {ch.choice(['=', '+=', '-='])} {val}",
                             "write_argsort")
        return self.emit(f"{y}[np.argmax({s})] {ch.choice(['=', '+=', '*='])} {self.sval(env)}",
                         "write_argmax")

    def mask_select(self, env):
        """``y[m] = src[m] * c`` (a selection by a traced mask, written back)."""
        ch = self.ch
        if not self.arrays:
            return False
        y = ch.choice(self.arrays)
        shape = env[y].shape
        srcs = [n for n in ["x"] + self.arrays if env[n].shape == shape]
        s = ch.choice(srcs)
        c = ch.int(-4, 4) / 4
        if np.min(np.abs(env[s] - c)) < MARGIN:
            return False
        m = self.fresh("m")
        src2 = ch.choice(srcs)
        expr = ch.choice([f"{src2}[{m}] * 2.0", f"np.sin({src2}[{m}])", f"{src2}[{m}] + {y}[{m}]"])
        return self.emit([f"{m} = {s} > {_num(c)}", f"{y}[{m}] = {expr}"], "mask_select")

    def numpy_write(self, env):
        """Writes by NumPy functions: ``y.fill(v)``, ``np.copyto(y, v)``,
        ``np.sin(src, out=y)``, ``np.put(y, idx, v)``."""
        ch = self.ch
        if not self.arrays:
            return False
        y = ch.choice(self.arrays)
        a = env[y]
        if a.ndim == 0:
            return False
        kind = ch.choice(["fill", "copyto", "out", "put"])
        if kind == "fill":
            return self.emit(f"{y}.fill({self.sval(env)})", "numpy_fill")
        if kind == "copyto":
            return self.emit(f"np.copyto({y}, {self.vval(env, a.shape)})", "numpy_copyto")
        if kind == "put":
            idx = [ch.int(0, a.size - 1) for _ in range(ch.int(1, 3))]
            return self.emit(f"np.put({y}, {idx!r}, {self.sval(env)})", "numpy_put")
        srcs = [n for n in ["x"] + self.arrays if env[n].shape == a.shape and n != y]
        if not srcs:
            return False
        fn = ch.choice(["np.sin", "np.tanh", "np.cos"])
        return self.emit(f"{fn}({ch.choice(srcs)}, out={y})", "numpy_out")

    def while_conversion(self, env):
        """``while float(np.max(np.abs(y))) > c and k < 4: y *= 0.5``."""
        ch = self.ch
        if not self.arrays:
            return False
        y = ch.choice(self.arrays)
        a = env[y]
        if a.ndim == 0:
            return False
        m = float(np.max(np.abs(a)))
        c = ch.choice([0.25, 0.5, 1.0])
        if min(abs(m * 0.5 ** k - c) for k in range(5)) < MARGIN:
            return False
        k = self.fresh("k")
        stmt = (f"{k} = 0\nwhile float(np.max(np.abs({y}))) > {_num(c)} and {k} < 4:\n"
                f"    {y} *= 0.5\n    {k} += 1")
        if self.emit(stmt, "while_conversion"):
            self.allow.setdefault("compiled", "conversion")
            return True
        return False

    def sort_axis(self, env):
        ch = self.ch
        cands = [a for a in ["x"] + self.arrays if env[a].ndim == 2 and _gaps_ok(env[a], 0)]
        if not cands:
            return False
        src = ch.choice(cands)
        z = self.fresh("z")
        return self.emit([f"{z} = np.copy({src})", f"{z}.sort(axis=0)"], "sort_axis0", [z])


for _name in ("chained", "traced_index", "mask_select", "numpy_write", "while_conversion",
              "sort_axis"):
    setattr(_Gen, _name, getattr(_More, _name))


KINDS = [(14, "create"), (20, "write"), (6, "mask"), (8, "fancy"), (10, "view"),
         (6, "view_write_inline"), (8, "loop"), (3, "sort"), (2, "branch"), (1, "refused"),
         (3, "chained"), (3, "traced_index"), (2, "mask_select"), (3, "numpy_write"),
         (1, "while_conversion"), (1, "sort_axis")]


def generate(ch, seed=None, min_stmts=3, max_stmts=10, exclude=KNOWN_WRONG, refusals=True):
    data_seed = ch.int(0, 2 ** 31 - 1)
    rng = np.random.default_rng(data_seed)
    if ch.flag(0.6):
        shape = (ch.int(2, 5),)
    else:
        shape = (ch.int(2, 3), ch.int(2, 3))
    x = np.round(rng.uniform(-1.5, 1.5, shape), 3)
    g = _Gen(ch, x, exclude)
    kinds = [(w, k) for w, k in KINDS if k not in exclude and (refusals or k not in ("refused",))]
    n = ch.int(min_stmts, max_stmts)
    g.create(g.env())
    while len(g.tags) < n:
        for _attempt in range(8):
            k = ch.weighted(kinds)
            if k == "refused" and g.expect:
                continue
            if k == "refused" and "refused_argument" in g.tags:
                continue
            try:
                ok = getattr(g, k)(g.env())
            except (ValueError, IndexError):   # a choice that does not fit (an empty view)
                ok = False
            if ok:
                break
        else:
            break
    if "refused_argument" in g.tags:
        g.expect.update(compiled="argument", eager="argument")
    env = g.env()
    terms = []
    for a in g.arrays:
        v = env[a]
        w = np.round(np.linspace(-1, 1, v.size) + 0.25, 3).reshape(v.shape) if v.ndim else 0.75
        if ch.flag(0.3):
            terms.append(f"np.sum(np.sin({a}))")
        else:
            wsrc = f"np.array({np.asarray(w).tolist()!r})" if v.ndim else "0.75"
            terms.append(f"np.sum({a} * {wsrc})")
    if not terms:
        terms = ["np.sum(x ** 2)"]
    if ch.flag(0.3):
        terms.append("np.sum(np.cos(x))")
    return Program(x, g.body, " + ".join(terms), g.tags, dict(g.expect), dict(g.allow), seed)


# --- checking ---------------------------------------------------------------------------

# What a refusal by design says, by reason.
REFUSAL_MESSAGES = {
    "conversion": re.compile(r"float\(\)|item\(\)|int\(\)|bool\(\)|conver|truth value", re.I),
    "argument": re.compile(r"into an argument|caller.s array", re.I),
    "einsum_view": re.compile(r"einsum|shares memory|view", re.I),
}


@dataclasses.dataclass
class Outcome:
    refusals: dict = dataclasses.field(default_factory=dict)   # mode -> kind
    checked: list = dataclasses.field(default_factory=list)    # modes whose numbers were compared
    known: dict = dataclasses.field(default_factory=dict)      # mode -> KNOWN_CRASHES name
    grads: dict = dataclasses.field(default_factory=dict)      # mode -> gradient
    fd_unreliable: bool = False    # finite differences did not converge: compared modes only


def _names_line(msg, prog):
    """A refusal must point at the user's line: 'line N' of the program and its text."""
    m = re.search(r"line (\d+)", msg)
    if not m or prog.filename() not in msg:
        return False
    n = int(m.group(1))
    lines = prog.source().splitlines()
    return 1 <= n <= len(lines) and lines[n - 1].strip() in msg


def check_program(prog, *, fd=True, known=True):
    """Run ``prog`` as NumPy, compiled and with compile=False; raise Failure at
    the first disagreement.  Returns an Outcome."""
    import tracegrad as tg

    out = Outcome()
    f = prog.function()
    x = prog.x
    with np.errstate(all="raise"):
        want = f(x.copy())
    scale = 1.0 + abs(float(want))
    vtol = dict(rtol=1e-10, atol=1e-11 * scale)
    gs = 1.0
    if fd:
        with np.errstate(all="ignore"):
            num = fd_grad(lambda v: f(v.copy()), [x], 0, 1e-6)
        gs = 1.0 + float(np.max(np.abs(num)))
        gtol = dict(rtol=1e-5, atol=1e-6 * gs + 1e-9 * scale)

    def attempt(mode, thunk):
        """The result, or None where tracegrad refused (a refusal classified)."""
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return thunk()
        except Exception as e:
            msg = f"{type(e).__name__}: {e}"
            for kname, (kmode, ktype, pat) in KNOWN_CRASHES.items():
                if known and mode == kmode and isinstance(e, ktype) and pat in str(e):
                    out.known[mode] = kname
                    return None
            reasons = [r for r in (prog.expect.get(mode), prog.allow.get(mode)) if r]
            reason = next((r for r in reasons if REFUSAL_MESSAGES[r].search(str(e))),
                          reasons[0] if reasons else None)
            if not isinstance(e, TypeError):   # TraceError and ConversionError are TypeErrors
                raise Failure(f"{mode}-crash", prog, msg) from e
            if not _names_line(str(e), prog):
                raise Failure(f"{mode}-refusal-unclear", prog, "the message names no line: " + msg) from e
            if reason is not None and REFUSAL_MESSAGES[reason].search(str(e)):
                out.refusals[mode] = reason
                return None
            pend = PENDING & set(prog.tags)
            if pend:
                out.refusals[mode] = "pending:" + ",".join(sorted(pend))
                return None
            if reason is not None:
                raise Failure(f"{mode}-refusal-wrong-reason", prog,
                              f"expected a refusal for {reason}: {msg}") from e
            raise Failure(f"{mode}-unexpected-refusal", prog, msg) from e

    richardson = []

    def fd_again():
        """Richardson-extrapolated central differences at two step sizes:
        (estimate, whether the two agree, i.e. finite differences converged)."""
        if not richardson:
            def est(h):
                with np.errstate(all="ignore"):
                    a = fd_grad(lambda v: f(v.copy()), [x], 0, h)
                    b = fd_grad(lambda v: f(v.copy()), [x], 0, 2 * h)
                return (4 * a - b) / 3
            r1, r2 = est(1e-4), est(1e-5)
            richardson.append((r2, _close(r1, r2, rtol=1e-6, atol=1e-7 * gs)))
        return richardson[0]

    def compare(mode, v, g):
        if not _close(v, want, **vtol):
            raise Failure(f"{mode}-value", prog, f"numpy {want!r}, {mode} {v!r}")
        if fd and not _close(g, num, **gtol):
            # a stiff program (exp inside a recurrence): the plain central
            # difference is off; fail only where a converged estimate disagrees
            ref, converged = fd_again()
            if converged and not _close(g, ref, **gtol):
                raise Failure(f"{mode}-grad", prog,
                              f"{mode}\n{np.asarray(g)!r}\nfinite differences\n{num!r}"
                              f"\nextrapolated\n{ref!r}")
            out.fd_unreliable = out.fd_unreliable or not converged
        if fd and mode == "eager" and out.grads.get("compiled") is not None and \
                not _close(g, out.grads["compiled"], rtol=1e-8, atol=1e-10 * gs):
            raise Failure("eager-grad-vs-compiled", prog,
                          f"compile=False\n{np.asarray(g)!r}\ncompiled\n{out.grads['compiled']!r}")
        out.grads[mode] = np.asarray(g)
        out.checked.append(mode)

    # compiled: tg.compile (twice) and tg.value_and_grad, without the eager
    # fallback (the compiled path itself is what is checked here)
    xs = x.copy()
    cf = tg.compile(f, fallback=False)
    r = attempt("compiled", lambda: cf(xs))
    if r is not None:
        for k in range(2):
            if k:
                r = attempt("compiled", lambda: cf(xs))
            if not _close(r, want, **vtol):
                raise Failure("compiled-value", prog, f"call {k + 1}: numpy {want!r}, compiled {r!r}")
        res = attempt("compiled", lambda: tg.value_and_grad(f, fallback=False)(xs))
        if res is None:
            raise Failure("compiled-crash", prog, "tg.compile ran, tg.value_and_grad refused")
        compare("compiled", *res)
    if not np.array_equal(xs, x):
        raise Failure("compiled-mutates-input", prog, f"x changed to {xs!r}")

    xs = x.copy()
    res = attempt("eager", lambda: tg.value_and_grad(f, compile=False)(xs))
    if res is not None:
        v, g = res
        if isinstance(v, tg.Tensor) or isinstance(g, tg.Tensor):
            raise Failure("eager-type", prog, f"a Tensor came back: {v!r}, {g!r}")
        compare("eager", v, g)
    if not np.array_equal(xs, x):
        raise Failure("eager-mutates-input", prog, f"x changed to {xs!r}")

    for mode, reason in prog.expect.items():
        if mode not in out.refusals and mode not in out.known:
            raise Failure(f"{mode}-not-refused", prog,
                          f"expected a clear refusal ({reason}); it ran and matched NumPy")
    return out
