"""Random NumPy programs for differential testing of tracegrad.

A program is data: a list of statements ``vN = <NumPy expression>`` over a
small pool of values (the inputs and every earlier result), ending in a
scalar loss that weights the results with constants.  The generator
evaluates each statement as it writes it, on the program's own inputs, so it
only applies an op where the op is defined and smooth there (``log`` and
``sqrt`` of values >= 0.1, ``exp`` of values < 4, ``maximum`` of values
apart, ``max`` of a row whose top two entries are apart, ...), and falls back
to a safe op otherwise.  The same source text then runs

* in NumPy (the reference),
* compiled: ``tg.compile``, ``tg.grad``, ``tg.value_and_grad``,
* eagerly on ``tg.tensor(..., requires_grad=True)`` leaves, three fresh
  forward passes each followed by ``backward()`` (the third backward of a tape
  structure runs as generated code: the backward replay),

and ``check_program`` compares all of them, and the gradient with central
finite differences.  A failure carries a reproducer: the program as NumPy
source plus its inputs, runnable as a script.

Choices come from a ``Chooser``: ``RngChooser`` (a NumPy Generator, for the
10,000-program script ``benchmarks/random_programs.py``) or a hypothesis
``draw`` (``programs()`` strategy, for ``tests/test_random_programs.py``, so
hypothesis can shrink a failing program).
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import textwrap
import warnings

import numpy as np

MAX_SIZE = 64      # elements of any value
MAX_NDIM = 4
MAX_ABS = 100.0    # values stay moderate, so finite differences mean something
MARGIN = 1e-2      # distance from kinks (abs at 0, ties of max/maximum, ...)

# Every op tag the generator can emit, for reporting (failures by op).
VIEW_TAGS = ("einsum1", "reshape", "transpose", "T", "swapaxes", "moveaxis", "squeeze",
             "expand_dims", "broadcast_to", "diagonal", "slice", "ravel", "astype64",
             "astype64_nocopy", "astype32", "reshape_method")


# --- choosers ---------------------------------------------------------------------------

class RngChooser:
    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)

    def int(self, lo, hi):
        """An integer in [lo, hi] (both included)."""
        return int(self.rng.integers(lo, hi + 1))

    def choice(self, seq):
        return seq[self.int(0, len(seq) - 1)]

    def weighted(self, items):
        """items: [(weight, value)]"""
        w = np.array([p for p, _ in items], float)
        return items[int(self.rng.choice(len(items), p=w / w.sum()))][1]

    def flag(self, p=0.5):
        return bool(self.rng.random() < p)


class DrawChooser(RngChooser):
    """Choices through a hypothesis ``draw``, so failing programs shrink."""

    def __init__(self, draw):
        from hypothesis import strategies as st
        self.draw, self.st = draw, st

    def int(self, lo, hi):
        return self.draw(self.st.integers(lo, hi))

    def weighted(self, items):
        # integers shrink towards lo: the first item is the "simplest"
        total = sum(p for p, _ in items)
        k = self.int(0, total - 1)
        for p, v in items:
            if k < p:
                return v
            k -= p
        raise AssertionError

    def flag(self, p=0.5):
        return self.int(0, 99) < int(round(100 * p)) if p < 1 else True


# --- literals ---------------------------------------------------------------------------

def _num(v):
    """A short exact literal for a float."""
    r = repr(float(v))
    return r


def _const_array(ch, shape):
    """(source, value) of a constant array of the given shape, readable in source."""
    n = int(np.prod(shape, dtype=int))
    if n <= 6:
        vals = np.array([ch.int(-12, 12) / 4 for _ in range(n)], float).reshape(shape)
        src = "np.array(" + repr(vals.tolist()) + ")"
    else:
        lo, hi = ch.int(-8, 8) / 4, ch.int(-8, 8) / 4
        vals = np.linspace(lo, hi, n).reshape(shape)
        src = f"np.linspace({_num(lo)}, {_num(hi)}, {n})"
        if len(shape) != 1:
            src += f".reshape({tuple(shape)!r})"
    return src, vals


# --- the program ------------------------------------------------------------------------

@dataclasses.dataclass
class Program:
    inputs: list          # [(name, ndarray)]
    lines: list           # ["vN = expr"]
    loss_terms: list      # ["np.sum(vN * W)"]
    tags: list            # op tag of each line
    float32: bool = False  # some value went through float32: looser tolerances
    seed: object = None

    @property
    def names(self):
        return [n for n, _ in self.inputs]

    @property
    def args(self):
        return [a.copy() for _, a in self.inputs]

    def source(self, name="f"):
        body = self.lines + ["return " + " + ".join(self.loss_terms)]
        return f"def {name}({', '.join(self.names)}):\n" + textwrap.indent("\n".join(body), "    ") + "\n"

    def function(self, name="f"):
        ns = {"np": np}
        exec(compile(self.source(name), f"<random program {self.seed}>", "exec"), ns)
        return ns[name]

    def reproducer(self):
        with np.printoptions(precision=17, threshold=10 ** 6, floatmode="unique"):
            ins = "\n".join(f"{n} = np.{a!r}" for n, a in self.inputs)
        # copies: NumPy's f may update an argument in place (astype(copy=False))
        args = ", ".join(f"{n}.copy()" for n in self.names)
        argnums = tuple(range(len(self.inputs)))
        return (f"import numpy as np\nimport tracegrad as tg\n\n{self.source()}\n{ins}\n"
                f"print('numpy   ', f({args}))\n"
                f"print('compiled', tg.compile(f)({args}))\n"
                f"print('grad    ', tg.grad(f, argnums={argnums!r})({args}))\n")

    def __repr__(self):
        return f"Program(seed={self.seed!r}):\n{self.reproducer()}"


class _Gen:
    def __init__(self, ch, exclude=()):
        self.ch = ch
        self.exclude = frozenset(exclude)
        self.env = {"np": np}
        self.pool = []          # names of values
        self.used = set()
        self.inputs = set()
        self.lines, self.tags = [], []
        self.float32 = False

    # the pool
    def val(self, name):
        return self.env[name]

    def shape(self, name):
        return np.shape(self.env[name])

    def pick(self, pred=lambda v: True):
        """A pool value; recent ones more likely, any may be used again (fan-out)."""
        cands = [n for n in self.pool if pred(self.env[n])]
        if not cands:
            return None
        ch = self.ch
        if ch.flag(0.5):
            return cands[-1 - ch.int(0, min(2, len(cands) - 1))]
        return ch.choice(cands)

    # evaluation
    def try_emit(self, expr, tag, operands, f32=False, update=None):
        """Evaluate ``expr``; keep it if the result is finite, moderate and
        small.  ``update``: an augmented assignment (``"+= 0.5"``) applied to
        the new name after, in place."""
        name = f"v{len(self.lines)}"
        if update is not None:
            value = eval(expr, self.env)
            if not isinstance(value, np.ndarray) or not value.flags.writeable:
                return False   # NumPy refuses the update (a broadcast view is read-only)
            exec(f"{name} = {expr}\n{name} {update}", self.env)
            self.lines.append(f"{name} = {expr}; {name} {update}")
            self.tags.append(tag)
            self.pool.append(name)
            self.used.update(operands)
            return True
        try:
            with np.errstate(all="raise"), warnings.catch_warnings():
                warnings.simplefilter("error")
                value = eval(expr, self.env)
        except (FloatingPointError, ValueError, TypeError, IndexError, RuntimeWarning,
                ZeroDivisionError, np.exceptions.AxisError):
            return False
        a = np.asarray(value)
        if a.dtype.kind != "f" or a.size == 0 or a.size > MAX_SIZE or a.ndim > MAX_NDIM:
            return False
        if not np.all(np.isfinite(a)) or np.max(np.abs(a)) > MAX_ABS:
            return False
        self.env[name] = value
        self.lines.append(f"{name} = {expr}")
        self.tags.append(tag)
        self.pool.append(name)
        self.used.update(operands)
        self.float32 |= f32
        return True


# --- ops --------------------------------------------------------------------------------
# Each op: (gen, a) -> (expr, tag, operands, f32) or None where it does not apply.

def _min_abs(x):
    return float(np.min(np.abs(x)))


def _unary(g, a):
    ch, x = g.ch, np.asarray(g.val(a))
    lo, hi = float(np.min(x)), float(np.max(x))
    opts = ["sin", "cos", "tanh", "arctan", "negative", "square", "sigmoid", "pow2", "pow3",
            "exp", "expm1", "log", "log1p", "sqrt", "reciprocal", "abs", "sinh", "cosh",
            "powf", "log_safe", "sqrt_safe", "clip", "maximum_c", "div_c", "exp2", "log2"]
    op = ch.choice(opts)
    if op in ("exp", "expm1", "sinh", "cosh", "exp2") and hi > 3.5 or op in ("sinh", "cosh") and lo < -3.5:
        op = "tanh"
    if op in ("log", "sqrt", "powf", "log2") and lo < 0.1:
        op = {"log": "log_safe", "sqrt": "sqrt_safe", "powf": "square", "log2": "log_safe"}[op]
    if op == "log1p" and lo < -0.8:
        op = "log_safe"
    if op == "reciprocal" and _min_abs(x) < 0.2:
        op = "sigmoid"
    if op == "abs" and _min_abs(x) < MARGIN:
        op = "sin"
    if op == "exp" and lo < -30:
        op = "arctan"
    src = {
        "sigmoid": f"1.0 / (1.0 + np.exp(-{a}))", "pow2": f"{a} ** 2", "pow3": f"{a} ** 3",
        "powf": f"np.power({a}, 1.5)", "log_safe": f"np.log({a} * {a} + 0.5)",
        "sqrt_safe": f"np.sqrt({a} * {a} + 0.25)",
    }.get(op)
    if op == "clip":
        c1, c2 = sorted([ch.int(-6, 6) / 4, ch.int(-6, 6) / 4])
        if c1 == c2 or np.min(np.abs(x - c1)) < MARGIN or np.min(np.abs(x - c2)) < MARGIN:
            op, src = "cos", None
        else:
            src = f"np.clip({a}, {_num(c1)}, {_num(c2)})"
    if op == "maximum_c":
        c = ch.int(-6, 6) / 4
        fn = ch.choice(["maximum", "minimum"])
        if np.min(np.abs(x - c)) < MARGIN:
            op, src = "sin", None
        else:
            src = f"np.{fn}({a}, {_num(c)})" if ch.flag() else f"np.{fn}({_num(c)}, {a})"
    if op == "div_c":
        c = ch.choice([0.5, 2.0, -3.0, 0.25])
        src = f"{_num(c)} / ({a} * {a} + 1.0)" if ch.flag() else f"{a} / {_num(c)}"
    if src is None:
        src = f"np.{op}({a})"
    return src, op, [a], False


def _broadcastable_shape(ch, shape):
    """A shape that broadcasts with ``shape``: a suffix of it, some dims set to 1,
    perhaps with new leading dims, or a dim expanded from 1."""
    s = list(shape)
    k = ch.int(0, len(s))
    s = s[k:]
    s = [1 if ch.flag(0.3) else d for d in s]
    s = [ch.int(2, 3) if d == 1 and ch.flag(0.3) else d for d in s]
    if ch.flag(0.2) and len(s) < 3:
        s = [ch.int(1, 3)] + s
    return tuple(s)


def _binary(g, a):
    ch, x = g.ch, g.val(a)
    sa = np.shape(x)
    op = ch.choice(["add", "sub", "mul", "div", "maximum", "minimum", "where", "hypot",
                    "logaddexp", "power", "add", "mul", "sub"])
    if ch.flag(0.6):
        b = g.pick(lambda v: _bshape(sa, np.shape(v)) is not None)
        bsrc, y = b, g.val(b)
        operands = [a, b]
    else:
        operands = [a]
        if ch.flag(0.35):
            c = ch.int(-8, 8) / 4
            bsrc, y = _num(c), c
        else:
            shp = _broadcastable_shape(ch, sa)
            if _bshape(sa, shp) is None:
                return None
            bsrc, y = _const_array(ch, shp)
    if ch.flag(0.25):     # constant or value on the left
        (a_src, xv), (b_src, yv) = (bsrc, y), (a, x)
    else:
        (a_src, xv), (b_src, yv) = (a, x), (bsrc, y)
    with np.errstate(all="ignore"):
        xb, yb = np.broadcast_arrays(np.asarray(xv, float), np.asarray(yv, float))
    if op == "div" and _min_abs(yb) < 0.2:
        b_src = f"({b_src} * {b_src} + 1.0)"
    if op in ("maximum", "minimum", "where") and np.min(np.abs(xb - yb)) < MARGIN:
        op = "add"
    if op == "hypot" and np.min(xb * xb + yb * yb) < 0.01:
        op = "mul"
    if op == "power" and (np.min(xb) < 0.1 or np.max(np.abs(yb)) > 3):
        op = "sub"
    sym = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
    if op in sym:
        expr = f"{a_src} {sym[op]} {b_src}"
    elif op == "where":
        expr = f"np.where({a_src} > {b_src}, {a_src}, {b_src} * 2.0)"
    elif op == "power":
        expr = f"{a_src} ** {b_src}" if ch.flag() else f"np.power({a_src}, {b_src})"
    else:
        expr = f"np.{op}({a_src}, {b_src})"
    return expr, op, operands, False


def _bshape(s1, s2):
    try:
        s = np.broadcast_shapes(s1, s2)
    except ValueError:
        return None
    if math.prod(s) > MAX_SIZE or len(s) > MAX_NDIM:
        return None
    return s


def _axis_src(ch, ndim):
    """(source text of an axis argument, tuple of axes)"""
    if ndim == 0 or ch.flag(0.25):
        return "None", tuple(range(ndim))
    if ch.flag(0.6):
        ax = ch.int(-ndim, ndim - 1)
        return str(ax), (ax % ndim,)
    k = ch.int(1, ndim)
    axes = sorted(set(ch.int(0, ndim - 1) for _ in range(k)))
    return repr(tuple(axes)), tuple(axes)


def _reduce(g, a):
    ch, x = g.ch, np.asarray(g.val(a))
    op = ch.choice(["sum", "sum", "mean", "max", "min", "prod", "var", "std", "norm", "amax"])
    axsrc, axes = _axis_src(ch, x.ndim)
    keep = ch.flag(0.4)
    kd = ", keepdims=True" if keep else ""
    if x.ndim:
        moved = np.moveaxis(x, axes, tuple(range(-len(axes), 0))) if axes else x[..., None]
        rows = moved.reshape(moved.shape[:moved.ndim - len(axes)] + (-1,)) if axes else moved
    else:
        rows = x.reshape(1)
    k = rows.shape[-1]
    if op in ("max", "min", "amax") and k > 1:
        srt = np.sort(rows, axis=-1)
        gap = srt[..., -1] - srt[..., -2] if op != "min" else srt[..., 1] - srt[..., 0]
        if np.min(gap) < MARGIN:
            op = "mean"
    if op == "prod" and k > 4:
        op = "sum"
    if op == "std" and (k < 2 or np.min(np.var(rows, axis=-1)) < 1e-2):
        op = "var"
    if op == "norm":
        if np.min(np.sum(rows * rows, axis=-1)) < 1e-2 or len(axes) > 2 or x.ndim == 0 \
                or (len(axes) == 2 and x.ndim > 2):
            op = "sum"
        else:
            ax = "None" if axsrc == "None" and x.ndim > 2 else axsrc
            if ax == "None" and x.ndim > 2:
                op = "sum"
            else:
                return f"np.linalg.norm({a}, axis={ax}{kd})", "norm", [a], False
    if op in ("sum", "mean") and ch.flag(0.3):   # the method (same meaning on Tensors)
        return f"{a}.{op}(axis={axsrc}{kd})", op + "_method", [a], False
    return f"np.{op}({a}, axis={axsrc}{kd})", op, [a], False


def _concat(g, a):
    """np.concatenate / np.stack of a value with another of its shape (or itself)."""
    ch, s = g.ch, g.shape(a)
    b = g.pick(lambda v: np.shape(v) == s) or a
    n = len(s)
    if n >= 1 and ch.flag():
        ax = ch.int(-n, n - 1)
        return f"np.concatenate([{a}, {b}], axis={ax})", "concatenate", [a, b], False
    ax = ch.int(-n - 1, n)
    return f"np.stack([{a}, {b}], axis={ax})", "stack", [a, b], False


def _view(g, a):
    ch, x = g.ch, g.val(a)
    s = np.shape(x)
    n = len(s)
    op = ch.choice(["einsum1", "einsum1", "reshape", "transpose", "T", "swapaxes", "moveaxis",
                    "squeeze", "expand_dims", "broadcast_to", "diagonal", "slice", "slice",
                    "ravel", "astype64", "astype64_nocopy", "astype32", "reshape_method"])
    if op in g.exclude:
        op = "slice"
    letters = "abcd"[:n]
    if op == "einsum1" and n >= 1:
        kind = ch.int(0, 3)
        if kind == 0:                      # permutation (a view)
            perm = list(letters)
            for i in range(len(perm) - 1, 0, -1):
                j = ch.int(0, i)
                perm[i], perm[j] = perm[j], perm[i]
            return f"np.einsum('{letters}->{''.join(perm)}', {a})", op, [a], False
        if kind == 1:                      # identity (a view of the operand itself)
            return f"np.einsum('{letters}->{letters}', {a})", op, [a], False
        if kind == 2:
            pairs = [(i, j) for i in range(n) for j in range(i + 1, n) if s[i] == s[j]]
            if pairs:                      # a diagonal (a view)
                i, j = ch.choice(pairs)
                ins = list(letters)
                ins[j] = ins[i]
                out = [c for k, c in enumerate(ins) if k != j]
                if ch.flag():
                    out = out[::-1]
                return f"np.einsum('{''.join(ins)}->{''.join(out)}', {a})", op, [a], False
        # a sum over some letters
        keep = [c for c in letters if ch.flag(0.5)]
        return f"np.einsum('{letters}->{''.join(keep)}', {a})", op, [a], False
    if op in ("reshape", "reshape_method") and n >= 0:
        size = int(np.prod(s, dtype=int))
        dims = []
        rest = size
        for _ in range(ch.int(1, 3)):
            divs = [d for d in range(1, rest + 1) if rest % d == 0]
            d = ch.choice(divs)
            dims.append(d)
            rest //= d
        dims[-1] *= rest
        if ch.flag(0.3):
            dims[ch.int(0, len(dims) - 1)] = -1
        if op == "reshape":
            return f"np.reshape({a}, {tuple(dims)!r})", op, [a], False
        return f"{a}.reshape({', '.join(map(str, dims))})", op, [a], False
    if op == "transpose" and n >= 2:
        if ch.flag(0.4):
            return f"np.transpose({a})", op, [a], False
        perm = list(range(n))
        for i in range(n - 1, 0, -1):
            j = ch.int(0, i)
            perm[i], perm[j] = perm[j], perm[i]
        return f"np.transpose({a}, {tuple(perm)!r})", op, [a], False
    if op == "T" and n >= 2:
        return f"{a}.T", op, [a], False
    if op == "swapaxes" and n >= 2:
        return f"np.swapaxes({a}, {ch.int(0, n - 1)}, {ch.int(-n, n - 1)})", op, [a], False
    if op == "moveaxis" and n >= 2:
        return f"np.moveaxis({a}, {ch.int(0, n - 1)}, {ch.int(-n, n - 1)})", op, [a], False
    if op == "squeeze" and 1 in s:
        ones = [i for i, d in enumerate(s) if d == 1]
        if ch.flag(0.4):
            return f"np.squeeze({a})", op, [a], False
        return f"np.squeeze({a}, axis={ch.choice(ones)})", op, [a], False
    if op == "expand_dims" and n < MAX_NDIM:
        return f"np.expand_dims({a}, {ch.int(-n - 1, n)})", op, [a], False
    if op == "broadcast_to":
        t = [ch.int(2, 3) if d == 1 and ch.flag(0.6) else d for d in s]
        if ch.flag(0.5) or t == list(s):
            t = [ch.int(1, 3)] + t
        return f"np.broadcast_to({a}, {tuple(t)!r})", op, [a], False
    if op == "diagonal" and n >= 2:
        ax1 = ch.int(0, n - 1)
        ax2 = ch.choice([i for i in range(n) if i != ax1])
        off = ch.int(-1, 1)
        if (n == 2 and ax1 == 0 and ax2 == 1 and off == 0) and ch.flag():
            return f"np.diagonal({a})", op, [a], False
        return f"np.diagonal({a}, {off}, {ax1}, {ax2})", op, [a], False
    if op == "slice" and n >= 1:
        idx = []
        for d in s:
            kind = ch.int(0, 7)
            idx.append([":", "1:", ":-1", "::-1", "::2", f"{ch.int(-d, d - 1)}", "None", "1::2"][kind])
        while idx and idx[-1] == ":":
            idx.pop()
        if ch.flag(0.15):
            idx = ["..."] + idx[1:]
        if not idx:
            idx = ["::-1"]
        return f"{a}[{', '.join(idx)}]", op, [a], False
    if op == "ravel":
        return f"np.ravel({a})", op, [a], False
    if op == "astype64":
        return f"{a}.astype(np.float64)", op, [a], False
    if op == "astype64_nocopy":
        return f"{a}.astype(np.float64, copy=False)", op, [a], False
    if op == "astype32" and not g.float32 and ch.flag(0.5):
        return f"{a}.astype(np.float32)", op, [a], True
    # the view did not apply: an elementwise op instead, on a view
    if n >= 1:
        return f"{a}[::-1]", "slice", [a], False
    return None


def _matmul(g, a):
    ch, x = g.ch, g.val(a)
    s = np.shape(x)
    if len(s) == 0:
        return None
    k = s[-1]
    if len(s) >= 2:
        want = lambda v: (np.ndim(v) == 1 and np.shape(v)[0] == k) or \
            (np.ndim(v) >= 2 and np.shape(v)[-2] == k and _bshape(s[:-2], np.shape(v)[:-2]) is not None)
    else:
        want = lambda v: np.ndim(v) >= 1 and np.shape(v)[-1 if np.ndim(v) == 1 else -2] == k
    b = g.pick(want) if ch.flag(0.5) else None
    if b is not None:
        bsrc, y, operands = b, g.val(b), [a, b]
    else:
        shp = (k,) if ch.flag(0.25) else (k, ch.int(1, 3))
        bsrc, y = _const_array(ch, shp)
        operands = [a]
    form = ch.choice(["@", "@", "matmul", "dot", "einsum", "tensordot"])
    ya = np.asarray(y)
    if form == "dot" and (len(s) > 2 or ya.ndim > 2):
        form = "@"
    if form == "einsum":
        if len(s) == 2 and ya.ndim == 2:
            return f"np.einsum('ij,jk->ik', {a}, {bsrc})", "matmul_einsum", operands, False
        if len(s) == 2 and ya.ndim == 1:
            return f"np.einsum('ij,j->i', {a}, {bsrc})", "matmul_einsum", operands, False
        form = "@"
    if form == "tensordot":
        if ya.ndim <= 2:
            return f"np.tensordot({a}, {bsrc}, axes=1)", "tensordot", operands, False
        form = "@"
    if form == "@":
        return f"{a} @ {bsrc}", "matmul", operands, False
    return f"np.{form}({a}, {bsrc})", form, operands, False


def _matmul_left(g, a):
    """constant @ a"""
    ch, x = g.ch, g.val(a)
    s = np.shape(x)
    if len(s) == 0:
        return None
    k = s[0] if len(s) == 1 else s[-2]
    csrc, _ = _const_array(ch, (ch.int(1, 3), k))
    return f"{csrc} @ {a}", "matmul", [a], False


def _misc(g, a):
    """Copies that move or repeat elements: flip, roll, tile, repeat, cumsum,
    gathers with repeated indices (their gradients add up)."""
    ch, s = g.ch, g.shape(a)
    n = len(s)
    if n == 0:
        return None
    ax = ch.int(-n, n - 1)
    op = ch.choice(["flip", "roll", "tile", "repeat", "cumsum", "gather", "take"])
    if op == "flip":
        return f"np.flip({a}, axis={ax})", op, [a], False
    if op == "roll":
        return f"np.roll({a}, {ch.int(-2, 2)}, axis={ax})", op, [a], False
    if op == "tile":
        return f"np.tile({a}, {tuple(ch.int(1, 2) for _ in range(ch.int(1, n)))!r})", op, [a], False
    if op == "repeat":
        return f"np.repeat({a}, {ch.int(1, 2)}, axis={ax})", op, [a], False
    if op == "cumsum":
        return f"np.cumsum({a}, axis={ax})", op, [a], False
    idx = [ch.int(0, s[ax] - 1) for _ in range(ch.int(1, 4))]
    if op == "take":
        return f"np.take({a}, {idx!r}, axis={ax})", op, [a], False
    pre = ", ".join([":"] * (ax % n))
    return f"{a}[{pre + ', ' if pre else ''}{idx!r}]", op, [a], False


def _inplace(g, a):
    """``vN = <an alias of a>; vN += c``: NumPy updates ``a`` too; compiled
    code does the same through ``a`` itself and refuses (a TraceError) through
    a view."""
    ch, s = g.ch, g.shape(a)
    if not isinstance(g.val(a), np.ndarray) or a in g.inputs or len(s) == 0:
        return None
    alias = ch.choice(["", "[:]", "[::-1]", ".T", "[0]"])
    op = ch.choice(["+=", "-=", "*="])
    c = ch.int(1, 8) / 4
    return f"{a}{alias}", "inplace", [a], False, f"{op} {_num(c)}"


KINDS = [(30, _unary), (25, _binary), (12, _reduce), (28, _view), (7, _matmul), (2, _matmul_left),
         (3, _concat), (6, _misc), (4, _inplace)]

# Ops that crash today on programs NumPy runs (reported; left out by default so
# the other checks still see the programs that would have used them).
KNOWN_CRASHES = frozenset()
# Ops whose compiled results are wrong today (a failing reproducer stays in
# tests/test_random_programs.py until fixed).
KNOWN_WRONG = frozenset()
EXCLUDE = KNOWN_CRASHES | KNOWN_WRONG


def generate(ch, seed=None, min_ops=2, max_ops=12, exclude=EXCLUDE):
    """A random Program, choices from ``ch``; op tags in ``exclude`` are not used."""
    g = _Gen(ch, exclude)
    kinds = [(w, k) for w, k in KINDS if not (k is _inplace and "inplace" in g.exclude)]
    n_in = ch.weighted([(3, 1), (1, 2)])
    inputs = []
    data_seed = ch.int(0, 2 ** 31 - 1)
    rng = np.random.default_rng(data_seed)
    for i in range(n_in):
        nd = ch.weighted([(4, 2), (3, 1), (2, 3), (1, 0)])
        shape = tuple(ch.int(1, 4) for _ in range(nd))
        if math.prod(shape) > 24:
            shape = shape[1:]
        arr = np.round(rng.uniform(-1.5, 1.5, shape), 3)
        name = f"x{i}" if n_in > 1 else "x"
        inputs.append((name, np.array(arr, float)))   # a copy: in-place ops change arr
        g.env[name] = arr
        g.pool.append(name)
        g.inputs.add(name)
    n_ops = ch.int(min_ops, max_ops)
    for _ in range(n_ops):
        for _attempt in range(6):
            kind = ch.weighted(kinds)
            a = g.pick()
            spec = kind(g, a)
            if spec is not None and g.try_emit(*spec):
                break
        else:
            g.try_emit(f"np.tanh({g.pool[-1]})", "tanh", [g.pool[-1]])
    # the loss: every value nothing else used, and some others, each weighted
    terms = []
    for n in g.pool:
        if n not in g.used or ch.flag(0.15) or n == g.pool[-1]:
            v = g.val(n)
            if np.ndim(v) == 0:
                terms.append(f"{_num(ch.int(-8, 8) / 4 or 0.5)} * {n}")
            else:
                w, _ = _const_array(ch, np.shape(v))
                terms.append(f"np.sum({n} * {w})")
    return Program(inputs, g.lines, terms, g.tags, g.float32, seed)


def programs(**kw):
    """A hypothesis strategy of Programs (keywords as for ``generate``)."""
    from hypothesis import strategies as st

    @st.composite
    def _programs(draw):
        return generate(DrawChooser(draw), **kw)
    return _programs()


# --- checking ---------------------------------------------------------------------------

class Failure(AssertionError):
    def __init__(self, kind, program, detail):
        self.kind, self.program, self.detail = kind, program, detail
        super().__init__(f"[{kind}] {detail}\n--- reproducer ---\n{program.reproducer()}")


def fd_grad(f, args, argnum, eps):
    x = np.array(args[argnum], dtype=np.float64)
    g = np.zeros_like(x)
    a = list(args)
    for i in np.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[i] += eps
        xm[i] -= eps
        a[argnum] = xp
        fp = f(*a)
        a[argnum] = xm
        g[i] = (fp - f(*a)) / (2 * eps)
    return g


def _close(got, want, rtol, atol):
    got, want = np.asarray(got, float), np.asarray(want, float)
    return got.shape == want.shape and np.allclose(got, want, rtol=rtol, atol=atol, equal_nan=False)


def _saved_value_changed(e, prog):
    """torch's error for an in-place change of a saved value (or of a leaf:
    the update reached an input through astype(copy=False)): the right
    outcome of such a program in eager mode, and nothing to compare."""
    return isinstance(e, RuntimeError) and "inplace" in prog.tags and (
        "modified by an inplace operation" in str(e)
        or "leaf Variable that requires grad is being used in an in-place" in str(e))


def check_program(prog, *, eager=True, fd=True, value_and_grad=True, uncompiled=True,
                  replay_stats=None):
    """Run every check on ``prog``; raise Failure at the first disagreement.
    ``uncompiled``: also ``tg.value_and_grad(f, compile=False)`` and
    ``tg.vjp(f, ..., compile=False)`` (NumPy code run eagerly on values that
    record the tape).  Returns a dict of facts (e.g. whether the eager replay
    ran)."""
    import tracegrad as tg
    from tracegrad.autograd import replay
    from tracegrad.eager.tensor import NumpyTensor

    facts = {}
    f = prog.function()
    args = prog.args
    argnums = tuple(range(len(args)))
    with np.errstate(all="raise"):
        want = f(*prog.args)
    scale = 1.0 + float(np.max(np.abs([want])))
    if prog.float32:
        vtol, gtol = dict(rtol=2e-5, atol=2e-5 * scale), dict(rtol=1e-4, atol=1e-4)
    else:
        vtol, gtol = dict(rtol=1e-10, atol=1e-11 * scale), dict(rtol=1e-8, atol=1e-10)

    def run(kind, thunk):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return thunk()
        except Failure:
            raise
        except Exception as e:  # a crash on a program NumPy runs
            raise Failure(kind + "-crash", prog, f"{type(e).__name__}: {e}") from e

    # compiled forward, twice (a second call reuses buffers), inputs untouched
    cf = tg.compile(f)
    call_args = prog.args
    if "inplace" in prog.tags:
        try:
            cf(*call_args)
        except tg.TraceError as e:
            if "shares memory with another" not in str(e) and \
                    "into an argument of the function" not in str(e):
                raise Failure("compile-crash", prog, f"TraceError: {e}") from e
            # an update through a view compiled code cannot write through, or
            # into the caller's array: a clear error, by design
            facts["refused"] = True
            return facts
    for k in range(2):
        got = run("compile", lambda: cf(*call_args))
        if not _close(got, want, **vtol):
            raise Failure("compile-value", prog, f"call {k + 1}: numpy {want!r}, compiled {got!r}")
        if np.result_type(got) != np.result_type(want):
            raise Failure("compile-dtype", prog, f"numpy {np.result_type(want)}, compiled {np.result_type(got)}")
    for a, b in zip(call_args, args):
        if not np.array_equal(a, b):
            raise Failure("compile-mutates-input", prog, f"input changed to {a!r}")

    # compiled gradient
    gf = tg.grad(f, argnums=argnums)
    grads = run("grad", lambda: gf(*call_args))
    grads = [np.asarray(g_, float) for g_ in grads]
    grads2 = run("grad", lambda: gf(*call_args))
    for g1, g2 in zip(grads, grads2):
        if not np.array_equal(g1, np.asarray(g2, float)):
            raise Failure("grad-unstable", prog, f"first call {g1!r}, second {g2!r}")
    for a, b in zip(call_args, args):
        if not np.array_equal(a, b):
            raise Failure("grad-mutates-input", prog, f"input changed to {a!r}")
    for i, (g_, a) in enumerate(zip(grads, args)):
        if g_.shape != np.shape(a):
            raise Failure("grad-shape", prog, f"d/d{prog.names[i]}: shape {g_.shape}, input {np.shape(a)}")

    if fd:
        eps = 1e-3 if prog.float32 else 1e-6
        for i in argnums:
            with np.errstate(all="ignore"):
                num = fd_grad(f, args, i, eps)
            gs = 1.0 + float(np.max(np.abs(num), initial=0.0))
            tol = dict(rtol=2e-2, atol=2e-2 * gs) if prog.float32 else \
                dict(rtol=1e-5, atol=1e-6 * gs + 1e-9 * scale)
            if not _close(grads[i], num, **tol):
                raise Failure("grad-vs-fd", prog,
                              f"d/d{prog.names[i]}: compiled\n{grads[i]!r}\nfinite differences\n{num!r}")

    if value_and_grad:
        vg = tg.value_and_grad(f, argnums=argnums)
        v, gs_ = run("value_and_grad", lambda: vg(*call_args))
        if not _close(v, want, **vtol):
            raise Failure("value_and_grad-value", prog, f"numpy {want!r}, value_and_grad {v!r}")
        for i, (g1, g2) in enumerate(zip(grads, gs_)):
            if not _close(g2, g1, **gtol):
                raise Failure("value_and_grad-grad", prog,
                              f"d/d{prog.names[i]}: grad\n{g1!r}\nvalue_and_grad\n{g2!r}")

    if uncompiled:
        # compile=False: f runs on NumPy-face values that record the tape
        def eager_vg():
            try:
                return tg.value_and_grad(f, argnums=argnums, compile=False)(*call_args)
            except RuntimeError as e:
                if _saved_value_changed(e, prog):
                    return None
                raise
        res = run("compile=False", eager_vg)
        if res is None:
            facts["uncompiled_skipped"] = True
        else:
            v, gs_ = res
            if isinstance(v, tg.Tensor) or not _close(v, want, **vtol):
                raise Failure("compile=False-value", prog, f"numpy {want!r}, compile=False {v!r}")
            for i, (g1, g2) in enumerate(zip(grads, gs_)):
                if isinstance(g2, tg.Tensor) or not _close(g2, g1, **gtol):
                    raise Failure("compile=False-grad", prog,
                                  f"d/d{prog.names[i]}: compiled\n{g1!r}\ncompile=False\n{g2!r}")
            ct = 0.75
            out, vjp_fn = run("compile=False-vjp", lambda: tg.vjp(f, *call_args, compile=False))
            if not _close(out, want, **vtol):
                raise Failure("compile=False-vjp-value", prog, f"numpy {want!r}, vjp {out!r}")
            cts = run("compile=False-vjp", lambda: vjp_fn(np.asarray(ct, np.result_type(out))))
            for i, (g1, g2) in enumerate(zip(grads, cts)):
                if not _close(np.asarray(g2, float) / ct, g1, **gtol):
                    raise Failure("compile=False-vjp-grad", prog,
                                  f"d/d{prog.names[i]}: compiled\n{g1!r}\nvjp / {ct}\n{g2!r}")
        for a, b in zip(call_args, args):
            if not np.array_equal(a, b):
                raise Failure("compile=False-mutates-input", prog, f"input changed to {a!r}")

    if eager:
        runs = []
        before = dict(replay.stats)
        for step in range(3):
            # NumPy code runs eagerly on values that speak NumPy (the compile=False path)
            leaves = [NumpyTensor(np.array(a), requires_grad=True) for a in args]

            def fwd_bwd():
                try:
                    out = f(*leaves)
                    val = out.detach().numpy().copy() if isinstance(out, tg.Tensor) else out
                    out.backward()
                except RuntimeError as e:
                    if _saved_value_changed(e, prog):
                        return None
                    raise
                return val
            val = run("eager", fwd_bwd)
            if val is None:
                facts["eager_skipped"] = True
                return facts
            if not _close(val, want, **vtol):
                raise Failure("eager-value", prog, f"pass {step + 1}: numpy {want!r}, eager {val!r}")
            gl = [np.zeros(np.shape(a)) if t.grad is None else t.grad.numpy().copy() for t, a in zip(leaves, args)]
            runs.append(gl)
            for i, (g1, g2) in enumerate(zip(grads, gl)):
                if not _close(g2, g1, **gtol):
                    raise Failure("eager-grad" if step < 2 else "eager-replay-grad", prog,
                                  f"backward {step + 1}, d/d{prog.names[i]}: compiled\n{g1!r}\neager\n{g2!r}")
        delta = {k: replay.stats[k] - before[k] for k in before}
        facts["replayed"] = delta["replays"] >= 1
        facts["replay_delta"] = delta
        for i in argnums:
            if runs[2][i].tobytes() != runs[0][i].tobytes():
                kind = "eager-replay-signed-zero" if np.array_equal(runs[2][i], runs[0][i]) \
                    else "eager-replay-not-bit-equal"
                raise Failure(kind, prog,
                              f"d/d{prog.names[i]}: interpreter\n{runs[0][i]!r}\nreplay\n{runs[2][i]!r}")
    return facts
