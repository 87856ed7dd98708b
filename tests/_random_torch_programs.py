"""Random torch-dialect programs for differential testing of tracegrad.

A program is data, as in ``_random_programs.py``: a list of statements
``vN = <expression>`` over a pool of values (the inputs and every earlier
result), ending in a weighted scalar loss.  Each statement is written twice
from the same random recipe:

* in the torch dialect: Tensor methods (``x.sum(1, keepdim=True)``,
  ``x.std(0)``, ``x.max(1).values``, ``x.transpose(0, 1)``, ``x.repeat(2, 1)``,
  ``x.squeeze(0)``, ``x.clamp(min=0.5)``, ``x.softmax(-1)``, ...), top-level
  functions (``torch.cat``, ``torch.where``, ``torch.gather``, ``torch.topk``,
  ``torch.norm``, ...) and ``torch.nn.functional`` (as ``F``), run on
  ``tracegrad`` (``import tracegrad as torch``) and, where it is installed,
  on torch itself;
* in NumPy, with torch's meaning translated by hand (torch's ``std`` is
  unbiased: ``np.std(x, ddof=1)``; ``x.repeat`` tiles: ``np.tile``;
  ``x.squeeze(d)`` leaves a dimension whose length is not 1 alone;
  ``x.chunk(n, d)[i]`` is a slice whose bounds the generator computes; ...).
  The NumPy program is the reference: its value is the expected value and its
  central finite differences the expected gradient.

The generator evaluates each NumPy statement as it writes it, so an op is
only applied where it is defined and smooth (``log`` of values >= 0.1,
``max`` of rows whose top two entries are apart, ``sort`` of rows without
near ties, ...); otherwise it falls back to a safe op.

``check_program`` runs a program

* eagerly on ``tracegrad.tensor(x, requires_grad=True)`` leaves, with
  ``.backward()``, three fresh forward passes (the third backward of a tape
  structure runs as generated code: the backward replay);
* through ``tracegrad.func``: ``grad``, ``grad_and_value``, ``vjp`` and
  ``jvp`` (forward mode: the output's tangent is the gradient's inner product
  with the input tangent) on Tensors (compiled, with torch's meaning: the
  traced values speak torch);
* on torch itself when a torch module is passed (``benchmarks/random_programs.py``
  does, when ``import torch`` works: a side environment, never a dependency);

and compares every value with the NumPy reference and every gradient with
finite differences and with the other modes.  A failure carries a reproducer:
the torch-dialect program, its NumPy reference and its inputs, runnable as a
script.
"""
from __future__ import annotations

import dataclasses
import math
import textwrap
import warnings

import numpy as np

from _random_programs import RngChooser, DrawChooser, Failure, fd_grad, _close, _bshape  # noqa: F401

MAX_SIZE = 64
MAX_NDIM = 4
MAX_ABS = 100.0
MARGIN = 1e-2

# NumPy helpers the references call: torch's meaning, written in NumPy.
REF_HELPERS = '''\
import math
import numpy as np

_erf_scalar = np.vectorize(math.erf, otypes=[float])

def erf(x):
    return _erf_scalar(np.asarray(x, dtype=float))

def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))

def softmax(x, axis):
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)

def log_softmax(x, axis):
    m = np.max(x, axis=axis, keepdims=True)
    return x - m - np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True))

def logsumexp(x, axis, keepdims=False):
    return np.log(np.sum(np.exp(x), axis=axis, keepdims=keepdims))

def vnorm(x, axis=None, keepdims=False, p=2):
    if p == 1:
        return np.sum(np.abs(x), axis=axis, keepdims=keepdims)
    return np.sqrt(np.sum(x * x, axis=axis, keepdims=keepdims))
'''


def ref_namespace():
    ns = {}
    exec(compile(REF_HELPERS, "<reference helpers>", "exec"), ns)
    return ns


_REF = ref_namespace()


def _num(v):
    return repr(float(v))


def _ints(xs):
    return ", ".join(str(int(x)) for x in xs)


def _const(ch, shape):
    """(torch source, NumPy source, value) of a constant float64 array; every
    element a small dyadic rational, so both sources give the same bits."""
    shape = tuple(shape)
    n = int(np.prod(shape, dtype=int))
    if n <= 6:
        vals = np.array([ch.int(-12, 12) / 4 for _ in range(n)], float).reshape(shape)
        lit = repr(vals.tolist())
        return f"torch.tensor({lit}, dtype=torch.float64)", f"np.array({lit})", vals
    lo = ch.int(-8, 8) / 4
    step = ch.choice([0.0625, -0.0625, 0.125, -0.125, 0.03125])
    vals = (np.arange(n) * step + lo).reshape(shape)
    t = f"(torch.arange({n}, dtype=torch.float64) * {step!r} + {lo!r})"
    a = f"(np.arange({n}) * {step!r} + {lo!r})"
    if len(shape) != 1:
        t += f".reshape({_ints(shape)}{',' if len(shape) == 1 else ''})"
        a += f".reshape({shape!r})"
    return t, a, vals


def _min_abs(x):
    return float(np.min(np.abs(x)))


# --- the program ------------------------------------------------------------------------

@dataclasses.dataclass
class TorchProgram:
    inputs: list            # [(name, ndarray)]
    lines: list             # torch-dialect statements
    np_lines: list          # the NumPy reference, statement by statement
    loss_terms: list        # torch-dialect terms of the loss
    np_loss_terms: list
    tags: list
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

    def numpy_source(self, name="f_numpy"):
        body = self.np_lines + ["return " + " + ".join(self.np_loss_terms)]
        return f"def {name}({', '.join(self.names)}):\n" + textwrap.indent("\n".join(body), "    ") + "\n"

    def function(self, torch_module, name="f"):
        """The torch-dialect program on ``torch_module`` (tracegrad or torch)."""
        import importlib
        ns = {"torch": torch_module,
              "F": importlib.import_module(torch_module.__name__ + ".nn.functional")}
        exec(compile(self.source(name), f"<random torch program {self.seed}>", "exec"), ns)
        return ns[name]

    def numpy_function(self, name="f_numpy"):
        ns = dict(_REF)
        exec(compile(self.numpy_source(name), f"<reference {self.seed}>", "exec"), ns)
        return ns[name]

    def reproducer(self):
        with np.printoptions(precision=17, threshold=10 ** 6, floatmode="unique"):
            ins = "\n".join(f"{n} = np.{a!r}" for n, a in self.inputs)
        names = ", ".join(self.names)
        argnums = tuple(range(len(self.inputs)))
        return (f"import numpy as np\nimport tracegrad as torch\nimport tracegrad.func\n"
                f"import tracegrad.nn.functional as F\n\n{self.source()}\n"
                f"# the reference: the same program in NumPy, with torch's meaning\n"
                f"{REF_HELPERS}\n{self.numpy_source()}\n{ins}\n"
                f"print('numpy  ', f_numpy({names}))\n"
                f"leaves = [torch.tensor(a, requires_grad=True) for a in ({names},)]\n"
                f"out = f(*leaves)\nout.backward()\n"
                f"print('eager  ', out, [t.grad for t in leaves])\n"
                f"print('func   ', torch.func.grad(f, argnums={argnums!r})"
                f"(*[torch.tensor(a) for a in ({names},)]))\n")

    def __repr__(self):
        return f"TorchProgram(seed={self.seed!r}):\n{self.reproducer()}"


@dataclasses.dataclass
class Spec:
    t: str                  # torch-dialect expression
    n: str                  # NumPy expression
    tag: str
    operands: list
    t_post: str = None      # a statement on the new name ("{o}"), torch
    n_post: str = None      # and NumPy (in-place updates)


class _Gen:
    def __init__(self, ch, exclude=()):
        self.ch = ch
        self.exclude = frozenset(exclude)
        self.env = dict(_REF)
        self.pool, self.used, self.inputs = [], set(), set()
        self.lines, self.np_lines, self.tags = [], [], []

    def val(self, name):
        return self.env[name]

    def shape(self, name):
        return np.shape(self.env[name])

    def pick(self, pred=lambda v: True):
        cands = [n for n in self.pool if pred(self.env[n])]
        if not cands:
            return None
        ch = self.ch
        if ch.flag(0.5):
            return cands[-1 - ch.int(0, min(2, len(cands) - 1))]
        return ch.choice(cands)

    def try_emit(self, spec):
        if spec is None or spec.tag in self.exclude:
            return False
        name = f"v{len(self.lines)}"
        n_stmt = f"{name} = {spec.n}"
        t_stmt = f"{name} = {spec.t}"
        if spec.n_post:
            n_stmt += "; " + spec.n_post.format(o=name)
            t_stmt += "; " + spec.t_post.format(o=name)
        env = dict(self.env)
        try:
            with np.errstate(all="raise"), warnings.catch_warnings():
                warnings.simplefilter("error")
                exec(n_stmt, env)
        except (FloatingPointError, ValueError, TypeError, IndexError, RuntimeWarning,
                ZeroDivisionError, np.exceptions.AxisError):
            return False
        value = env[name]
        a = np.asarray(value)
        if a.dtype != np.float64 or a.size == 0 or a.size > MAX_SIZE or a.ndim > MAX_NDIM:
            return False
        if not np.all(np.isfinite(a)) or np.max(np.abs(a)) > MAX_ABS:
            return False
        self.env[name] = a   # a 0-d result stays an array: torch's 0-d tensor
        self.lines.append(t_stmt)
        self.np_lines.append(n_stmt)
        self.tags.append(spec.tag)
        self.pool.append(name)
        self.used.update(spec.operands)
        return True


# --- elementwise ------------------------------------------------------------------------

def _unary(g, a):
    ch, x = g.ch, np.asarray(g.val(a))
    lo, hi = float(np.min(x)), float(np.max(x))
    op = ch.choice(["sin", "cos", "tanh", "atan", "exp", "expm1", "log", "log1p", "log2",
                    "sqrt", "rsqrt", "sigmoid", "erf", "abs", "neg", "square", "reciprocal",
                    "relu", "sinh", "cosh", "asinh", "exp2", "pow2", "pow3", "powf", "clamp",
                    "softplus", "silu", "gelu", "elu", "leaky_relu", "logsigmoid", "log_safe",
                    "sqrt_safe", "scale"])
    if op in ("exp", "expm1", "exp2", "sinh", "cosh") and hi > 3.5 or \
            op in ("sinh", "cosh") and lo < -3.5:
        op = "tanh"
    if op in ("log", "log2", "sqrt", "rsqrt", "powf") and lo < 0.1:
        op = "log_safe" if op.startswith("log") else "sqrt_safe"
    if op == "log1p" and lo < -0.8:
        op = "log_safe"
    if op == "reciprocal" and _min_abs(x) < 0.2:
        op = "sigmoid"
    if op in ("abs", "relu", "elu", "leaky_relu") and _min_abs(x) < MARGIN:
        op = "sin"
    plain = {"sin": "np.sin", "cos": "np.cos", "tanh": "np.tanh", "atan": "np.arctan",
             "exp": "np.exp", "expm1": "np.expm1", "log": "np.log", "log1p": "np.log1p",
             "log2": "np.log2", "sqrt": "np.sqrt", "abs": "np.abs", "square": "np.square",
             "sinh": "np.sinh", "cosh": "np.cosh", "asinh": "np.arcsinh", "exp2": "np.exp2",
             "sigmoid": "sigmoid", "erf": "erf"}
    if op in plain:
        t = ch.choice([f"{a}.{op}()", f"torch.{op}({a})"])
        if op in ("sigmoid", "tanh") and ch.flag(0.3):
            t = f"F.{op}({a})"
        return Spec(t, f"{plain[op]}({a})", op, [a])
    if op == "neg":
        return Spec(ch.choice([f"-{a}", f"{a}.neg()", f"torch.neg({a})"]), f"-{a}", op, [a])
    if op == "rsqrt":
        return Spec(ch.choice([f"{a}.rsqrt()", f"torch.rsqrt({a})"]), f"1.0 / np.sqrt({a})", op, [a])
    if op == "reciprocal":
        return Spec(ch.choice([f"{a}.reciprocal()", f"torch.reciprocal({a})", f"1.0 / {a}"]),
                    f"1.0 / {a}", op, [a])
    if op == "relu":
        return Spec(ch.choice([f"{a}.relu()", f"torch.relu({a})", f"F.relu({a})"]),
                    f"np.maximum({a}, 0.0)", op, [a])
    if op in ("pow2", "pow3"):
        k = int(op[-1])
        return Spec(ch.choice([f"{a} ** {k}", f"{a}.pow({k})", f"torch.pow({a}, {k})"]),
                    f"{a} ** {k}", op, [a])
    if op == "powf":
        return Spec(ch.choice([f"{a} ** 1.5", f"{a}.pow(1.5)", f"torch.pow({a}, 1.5)"]),
                    f"np.power({a}, 1.5)", op, [a])
    if op == "log_safe":
        return Spec(f"({a} * {a} + 0.5).log()", f"np.log({a} * {a} + 0.5)", op, [a])
    if op == "sqrt_safe":
        return Spec(f"torch.sqrt({a} * {a} + 0.25)", f"np.sqrt({a} * {a} + 0.25)", op, [a])
    if op == "clamp":
        c1, c2 = sorted([ch.int(-6, 6) / 4, ch.int(-6, 6) / 4])
        if c1 == c2 or min(np.min(np.abs(x - c1)), np.min(np.abs(x - c2))) < MARGIN:
            return Spec(f"{a}.cos()", f"np.cos({a})", "cos", [a])
        form = ch.int(0, 4)
        if form == 0:
            return Spec(f"{a}.clamp({_num(c1)}, {_num(c2)})", f"np.clip({a}, {c1!r}, {c2!r})", op, [a])
        if form == 1:
            return Spec(f"torch.clamp({a}, min={_num(c1)})", f"np.maximum({a}, {c1!r})", op, [a])
        if form == 2:
            return Spec(f"{a}.clamp(max={_num(c2)})", f"np.minimum({a}, {c2!r})", op, [a])
        if form == 3:
            return Spec(f"{a}.clip({_num(c1)}, {_num(c2)})", f"np.clip({a}, {c1!r}, {c2!r})", op, [a])
        return Spec(f"torch.clamp({a}, {_num(c1)}, {_num(c2)})", f"np.clip({a}, {c1!r}, {c2!r})",
                    op, [a])
    if op == "softplus":
        return Spec(f"F.softplus({a})", f"np.logaddexp(0.0, {a})", op, [a])
    if op == "silu":
        return Spec(f"F.silu({a})", f"{a} * sigmoid({a})", op, [a])
    if op == "gelu":
        return Spec(f"F.gelu({a})", f"0.5 * {a} * (1.0 + erf({a} / np.sqrt(2.0)))", op, [a])
    if op == "elu":
        return Spec(f"F.elu({a})", f"np.where({a} > 0, {a}, np.expm1(np.minimum({a}, 0.0)))", op, [a])
    if op == "leaky_relu":
        return Spec(f"F.leaky_relu({a}, 0.125)", f"np.where({a} > 0, {a}, 0.125 * {a})", op, [a])
    if op == "logsigmoid":
        return Spec(f"F.logsigmoid({a})", f"-np.logaddexp(0.0, -{a})", op, [a])
    # scale: a Python number with a Tensor, either side
    c = ch.choice([0.5, 2.0, -3.0, 0.25, 1.5])
    form = ch.int(0, 5)
    t, n = [(f"{a} * {c!r}", f"{a} * {c!r}"), (f"{c!r} - {a}", f"{c!r} - {a}"),
            (f"{a}.mul({c!r})", f"{a} * {c!r}"), (f"{a}.div({c!r})", f"{a} / {c!r}"),
            (f"torch.add({a}, {c!r})", f"{a} + {c!r}"),
            (f"{c!r} / ({a} * {a} + 1.0)", f"{c!r} / ({a} * {a} + 1.0)")][form]
    return Spec(t, n, "scale", [a])


def _broadcastable_shape(ch, shape):
    s = list(shape)
    s = s[ch.int(0, len(s)):]
    s = [1 if ch.flag(0.3) else d for d in s]
    s = [ch.int(2, 3) if d == 1 and ch.flag(0.3) else d for d in s]
    if ch.flag(0.2) and len(s) < 3:
        s = [ch.int(1, 3)] + s
    return tuple(s)


def _binary(g, a):
    ch, x = g.ch, g.val(a)
    sa = np.shape(x)
    op = ch.choice(["add", "sub", "mul", "div", "maximum", "minimum", "where", "hypot",
                    "atan2", "logaddexp", "pow", "add", "mul", "sub", "alpha"])
    scalar = False
    if ch.flag(0.6):
        b = g.pick(lambda v: _bshape(sa, np.shape(v)) is not None)
        bt = bn = b
        y = g.val(b)
        operands = [a, b]
    else:
        operands = [a]
        if ch.flag(0.3) and op in ("add", "sub", "mul", "div", "pow", "where", "alpha"):
            y = ch.int(-8, 8) / 4
            bt = bn = _num(y)
            scalar = True
        else:
            shp = _broadcastable_shape(ch, sa)
            if _bshape(sa, shp) is None:
                return None
            bt, bn, y = _const(ch, shp)
    swap = ch.flag(0.25) and op in ("add", "sub", "mul", "div", "maximum", "minimum", "hypot",
                                     "atan2", "logaddexp")
    (xt, xn, xv), (yt, yn, yv) = ((bt, bn, y), (a, a, x)) if swap else ((a, a, x), (bt, bn, y))
    left_scalar = swap and scalar
    with np.errstate(all="ignore"):
        xb, yb = np.broadcast_arrays(np.asarray(xv, float), np.asarray(yv, float))
    if op == "div" and _min_abs(yb) < 0.2:
        yt, yn = f"({yt} * {yt} + 1.0)", f"({yn} * {yn} + 1.0)"
    if op in ("maximum", "minimum", "where") and np.min(np.abs(xb - yb)) < MARGIN:
        op = "add"
    if op in ("hypot", "atan2") and np.min(xb * xb + yb * yb) < 0.01:
        op = "mul"
    if op == "atan2" and np.any((yb < 0) & (np.abs(xb) < MARGIN)):
        op = "mul"       # atan2(x, y) jumps where y < 0 and x crosses 0
    if op == "pow" and (np.min(xb) < 0.1 or np.max(np.abs(yb)) > 3 or left_scalar):
        op = "sub"
    if scalar and op in ("maximum", "minimum", "hypot", "atan2", "logaddexp"):
        op = "mul"
    sym = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
    if op in sym:
        n = f"{xn} {sym[op]} {yn}"
        forms = [f"{xt} {sym[op]} {yt}"]
        if not left_scalar:
            name = {"add": "add", "sub": "sub", "mul": "mul", "div": "div"}[op]
            forms += [f"{xt}.{name}({yt})", f"torch.{name}({xt}, {yt})"]
            if op == "div":
                forms.append(f"torch.true_divide({xt}, {yt})")
        return Spec(ch.choice(forms), n, op, operands)
    if op == "alpha":
        k = ch.choice([2.0, -0.5, 3.0])
        which = ch.choice(["add", "sub"])
        s = "+" if which == "add" else "-"
        return Spec(f"torch.{which}({xt}, {yt}, alpha={k!r})" if ch.flag()
                    else f"{xt}.{which}({yt}, alpha={k!r})",
                    f"{xn} {s} {k!r} * {yn}", "alpha", operands)
    if op in ("maximum", "minimum"):
        forms = [f"torch.{op}({xt}, {yt})", f"{xt}.{op}({yt})",
                 f"{xt}.{'max' if op == 'maximum' else 'min'}({yt})",
                 f"torch.{'fmax' if op == 'maximum' else 'fmin'}({xt}, {yt})"]
        return Spec(ch.choice(forms), f"np.{op}({xn}, {yn})", op, operands)
    if op == "where":
        return Spec(f"torch.where({xt} > {yt}, {xt}, {yt} * 2.0)",
                    f"np.where({xn} > {yn}, {xn}, {yn} * 2.0)", op, operands)
    if op == "hypot":
        return Spec(f"torch.hypot({xt}, {yt})", f"np.hypot({xn}, {yn})", op, operands)
    if op == "atan2":
        return Spec(ch.choice([f"torch.atan2({xt}, {yt})", f"{xt}.atan2({yt})"]),
                    f"np.arctan2({xn}, {yn})", op, operands)
    if op == "logaddexp":
        return Spec(f"torch.logaddexp({xt}, {yt})", f"np.logaddexp({xn}, {yn})", op, operands)
    # pow
    return Spec(ch.choice([f"{xt} ** {yt}", f"torch.pow({xt}, {yt})", f"{xt}.pow({yt})"]),
                f"np.power({xn}, {yn})", "pow", operands)


# --- reductions (torch's signatures: dim, keepdim) --------------------------------------

def _rows(x, axes):
    """x with the reduced axes moved last and merged: one row per result."""
    x = np.asarray(x)
    if x.ndim == 0:
        return x.reshape(1, 1)
    moved = np.moveaxis(x, axes, tuple(range(-len(axes), 0)))
    return moved.reshape(-1, int(np.prod([x.shape[a] for a in axes], dtype=int)))


def _dims(ch, ndim, allow_tuple=True):
    """(torch dim source or None, NumPy axis source, axes tuple)"""
    if ndim == 0 or ch.flag(0.2):
        return None, "None", tuple(range(ndim))
    if not allow_tuple or ch.flag(0.6):
        d = ch.int(-ndim, ndim - 1)
        return str(d), str(d), (d % ndim,)
    axes = sorted(set(ch.int(0, ndim - 1) for _ in range(ch.int(1, ndim))))
    if ch.flag(0.3):
        axes = [ax - ndim for ax in axes]
    src = "(" + ", ".join(map(str, axes)) + ("," if len(axes) == 1 else "") + ")"
    return src, src, tuple(ax % ndim for ax in axes)


def _reduce(g, a):
    ch, x = g.ch, np.asarray(g.val(a))
    n = x.ndim
    op = ch.choice(["sum", "sum", "mean", "prod", "std", "var", "max", "min", "amax", "amin",
                    "logsumexp", "norm", "median", "nansum"])
    keep = ch.flag(0.35)
    tuple_ok = op not in ("prod", "max", "min", "median")
    dt, dn, axes = _dims(ch, n, tuple_ok)
    if op == "logsumexp" and dt is None:
        dt, dn, axes = ("-1", "-1", (n - 1,)) if n else (None, "None", ())
    rows = _rows(x, axes)
    k = rows.shape[-1]
    kd_t = ", keepdim=True" if keep else ""
    kd_n = ", keepdims=True" if keep else ""
    if op in ("max", "min", "amax", "amin", "median") and k > 1:
        srt = np.sort(rows, axis=-1)
        gaps = np.diff(srt, axis=-1)
        if op == "median" and np.min(gaps) < MARGIN or \
                op in ("max", "amax") and np.min(gaps[..., -1]) < MARGIN or \
                op in ("min", "amin") and np.min(gaps[..., 0]) < MARGIN:
            op = "mean"
    if op == "prod" and (k > 4 or _min_abs(x) < 0.05):
        op = "sum"
    if op in ("std", "var") and (k < 2 or np.min(np.var(rows, axis=-1)) < 1e-2):
        op = "sum" if k < 2 else "var"
    if op == "norm" and (np.min(np.sum(rows * rows, axis=-1)) < 1e-2 or len(axes) > 2):
        op = "sum"
    if op == "logsumexp" and dt is None:
        op = "sum"
    if op in ("sum", "mean", "nansum"):
        if dt is None:
            t = ch.choice([f"{a}.{op}()", f"torch.{op}({a})"])
            return Spec(t, f"np.{op}({a})", op, [a])
        t = ch.choice([f"{a}.{op}({dt}{kd_t})", f"torch.{op}({a}, dim={dt}{kd_t})",
                       f"{a}.{op}(dim={dt}{kd_t})"])
        if keep and ch.flag(0.3):
            t = f"{a}.{op}({dt}, True)"
        return Spec(t, f"np.{op}({a}, axis={dn}{kd_n})", op, [a])
    if op == "prod":
        if dt is None:
            return Spec(ch.choice([f"{a}.prod()", f"torch.prod({a})"]), f"np.prod({a})", op, [a])
        return Spec(ch.choice([f"{a}.prod({dt}{kd_t})", f"torch.prod({a}, {dt}{kd_t})"]),
                    f"np.prod({a}, axis={dn}{kd_n})", op, [a])
    if op in ("std", "var"):
        form = ch.int(0, 3)
        ddof = 1
        if dt is None and not keep:
            t = [f"{a}.{op}()", f"torch.{op}({a})", f"{a}.{op}(unbiased=False)",
                 f"{a}.{op}(correction=0)"][form]
            ddof = 0 if form >= 2 else 1
        else:
            dsrc = dt if dt is not None else "None"
            t = [f"{a}.{op}({dsrc}{kd_t})", f"torch.{op}({a}, {dsrc}{kd_t})",
                 f"{a}.{op}({dsrc}, unbiased=False{kd_t})",
                 f"torch.{op}({a}, dim={dsrc}, correction=0{kd_t})"][form]
            ddof = 0 if form >= 2 else 1
        return Spec(t, f"np.{op}({a}, axis={dn}, ddof={ddof}{kd_n})", op, [a])
    if op in ("max", "min"):
        if dt is None:
            return Spec(ch.choice([f"{a}.{op}()", f"torch.{op}({a})"]), f"np.{op}({a})", op, [a])
        t = ch.choice([f"{a}.{op}({dt}{kd_t}).values", f"torch.{op}({a}, {dt}{kd_t})[0]",
                       f"{a}.{op}(dim={dt}{kd_t})[0]", f"torch.{op}({a}, dim={dt}{kd_t}).values"])
        return Spec(t, f"np.{op}({a}, axis={dn}{kd_n})", op, [a])
    if op in ("amax", "amin"):
        np_name = "max" if op == "amax" else "min"
        if dt is None:
            return Spec(ch.choice([f"{a}.{op}()", f"torch.{op}({a})"]), f"np.{np_name}({a})",
                        op, [a])
        return Spec(ch.choice([f"{a}.{op}({dt}{kd_t})", f"torch.{op}({a}, dim={dt}{kd_t})"]),
                    f"np.{np_name}({a}, axis={dn}{kd_n})", op, [a])
    if op == "logsumexp":
        return Spec(ch.choice([f"{a}.logsumexp({dt}{kd_t})", f"torch.logsumexp({a}, {dt}{kd_t})"]),
                    f"logsumexp({a}, {dn}{', True' if keep else ''})", op, [a])
    if op == "norm":
        if dt is None:
            return Spec(ch.choice([f"{a}.norm()", f"torch.norm({a})"]), f"vnorm({a})", op, [a])
        if len(axes) == 1 and ch.flag(0.3) and _min_abs(x) > MARGIN:
            return Spec(ch.choice([f"{a}.norm(1, {dt}{kd_t})", f"torch.norm({a}, p=1, dim={dt}{kd_t})"]),
                        f"vnorm({a}, {dn}, {keep}, p=1)", "norm1", [a])
        return Spec(ch.choice([f"{a}.norm(dim={dt}{kd_t})", f"torch.norm({a}, dim={dt}{kd_t})"]),
                    f"vnorm({a}, {dn}, {keep})", op, [a])
    if op == "median":
        if dt is None:
            return Spec(ch.choice([f"{a}.median()", f"torch.median({a})"]),
                        f"np.sort({a}, axis=None)[({x.size} - 1) // 2]", op, [a])
        d = int(dt)
        take = f"np.take(np.sort({a}, axis={d}), {(x.shape[d] - 1) // 2}, axis={d})"
        if keep:
            take = f"np.expand_dims({take}, {d})"
        return Spec(ch.choice([f"{a}.median({dt}{kd_t}).values", f"torch.median({a}, {dt}{kd_t})[0]"]),
                    take, op, [a])
    raise AssertionError(op)


def _normalize_op(g, a):
    """softmax, log_softmax, cumsum, cumprod, sort, topk, kthvalue, F.normalize:
    along one dim."""
    ch, x = g.ch, np.asarray(g.val(a))
    n = x.ndim
    if n == 0:
        return None
    d = ch.int(-n, n - 1)
    k = x.shape[d]
    op = ch.choice(["softmax", "log_softmax", "cumsum", "cumprod", "sort", "topk", "kthvalue",
                    "normalize", "softmax", "cumsum"])
    rows = _rows(x, (d % n,))
    if op in ("sort", "topk", "kthvalue") and k > 1 and np.min(np.diff(np.sort(rows, -1), axis=-1)) < MARGIN:
        op = "softmax"
    if op == "cumprod" and (_min_abs(x) < 0.05 or k > 5):
        op = "cumsum"
    if op == "normalize" and np.min(np.sum(rows * rows, axis=-1)) < 1e-2:
        op = "log_softmax"
    if op == "softmax":
        return Spec(ch.choice([f"{a}.softmax({d})", f"torch.softmax({a}, {d})",
                               f"F.softmax({a}, dim={d})", f"{a}.softmax(dim={d})"]),
                    f"softmax({a}, {d})", op, [a])
    if op == "log_softmax":
        return Spec(ch.choice([f"{a}.log_softmax({d})", f"torch.log_softmax({a}, {d})",
                               f"F.log_softmax({a}, dim={d})"]),
                    f"log_softmax({a}, {d})", op, [a])
    if op in ("cumsum", "cumprod"):
        return Spec(ch.choice([f"{a}.{op}({d})", f"torch.{op}({a}, dim={d})"]),
                    f"np.{op}({a}, axis={d})", op, [a])
    if op == "normalize":
        return Spec(f"F.normalize({a}, dim={d})", f"{a} / vnorm({a}, {d}, True)", op, [a])
    srt = f"np.sort({a}, axis={d})"
    if op == "sort":
        desc = ch.flag()
        n_src = f"np.flip({srt}, axis={d})" if desc else srt
        t = ch.choice([f"torch.sort({a}, dim={d}{', descending=True' if desc else ''}).values",
                       f"{a}.sort({d}{', descending=True' if desc else ''})[0]"])
        return Spec(t, n_src, op, [a])
    if op == "topk":
        kk = ch.int(1, k)
        largest = ch.flag(0.7)
        base = f"np.flip({srt}, axis={d})" if largest else srt
        t = ch.choice([f"torch.topk({a}, {kk}, dim={d}{'' if largest else ', largest=False'}).values",
                       f"{a}.topk({kk}, {d}{'' if largest else ', False'})[0]"])
        return Spec(t, f"np.take({base}, np.arange({kk}), axis={d})", op, [a])
    kk = ch.int(1, k)
    keep = ch.flag(0.3)
    n_src = f"np.take({srt}, {kk - 1}, axis={d})"
    if keep:
        n_src = f"np.expand_dims({n_src}, {d})"
    t = ch.choice([f"torch.kthvalue({a}, {kk}, {d}{', keepdim=True' if keep else ''}).values",
                   f"{a}.kthvalue({kk}, dim={d}{', keepdim=True' if keep else ''})[0]"])
    return Spec(t, n_src, op, [a])


# --- shapes, views, indexing ------------------------------------------------------------

def _tup(xs):
    xs = list(xs)
    return "(" + ", ".join(map(str, xs)) + ("," if len(xs) == 1 else "") + ")"


def _shape_op(g, a):
    ch, x = g.ch, np.asarray(g.val(a))
    s, n = x.shape, x.ndim
    op = ch.choice(["reshape", "view", "flatten", "transpose", "t", "T", "mT", "permute",
                    "movedim", "unsqueeze", "squeeze", "expand", "repeat", "tile", "flip",
                    "roll", "narrow", "split", "chunk", "diagonal", "tril", "diag",
                    "repeat_interleave", "ravel", "trace", "clone", "reshape"])
    if op == "view" and not x.flags.c_contiguous:
        op = "reshape"
    if op in ("reshape", "view"):
        size = x.size
        dims, rest = [], size
        for _ in range(ch.int(1, 3)):
            d = ch.choice([d for d in range(1, rest + 1) if rest % d == 0])
            dims.append(d)
            rest //= d
        dims[-1] *= rest
        if ch.flag(0.3):
            dims[ch.int(0, len(dims) - 1)] = -1
        forms = [f"{a}.{op}({_ints(dims)})", f"{a}.{op}({_tup(dims)})"]
        if op == "reshape":
            forms.append(f"torch.reshape({a}, {_tup(dims)})")
        return Spec(ch.choice(forms), f"np.reshape({a}, {_tup(dims)})", op, [a])
    if op == "flatten":
        if n == 0:
            return Spec(f"{a}.flatten()", f"np.reshape({a}, (1,))", op, [a])
        st = ch.int(-n, n - 1)
        en = ch.int(st % n, n - 1)
        if ch.flag(0.3):
            en -= n
        shp = s[:st % n] + (int(np.prod(s[st % n:en % n + 1], dtype=int)),) + s[en % n + 1:]
        t = ch.choice([f"{a}.flatten({st}, {en})", f"torch.flatten({a}, {st}, {en})",
                       f"{a}.flatten(start_dim={st}, end_dim={en})"])
        return Spec(t, f"np.reshape({a}, {_tup(shp)})", op, [a])
    if op == "ravel":
        return Spec(ch.choice([f"{a}.ravel()", f"torch.ravel({a})"]), f"np.ravel({a})", op, [a])
    if op == "clone":
        return Spec(ch.choice([f"{a}.clone()", f"torch.clone({a})", f"{a}.contiguous()",
                               f"{a}.double()", f"{a}.to(torch.float64)"]), f"{a}", op, [a])
    if op == "transpose" and n >= 1:
        d0, d1 = ch.int(-n, n - 1), ch.int(-n, n - 1)
        t = ch.choice([f"{a}.transpose({d0}, {d1})", f"torch.transpose({a}, {d0}, {d1})",
                       f"{a}.swapaxes({d0}, {d1})", f"torch.swapaxes({a}, {d0}, {d1})"])
        return Spec(t, f"np.swapaxes({a}, {d0}, {d1})", op, [a])
    if op == "t" and n <= 2:
        return Spec(f"{a}.t()", f"np.transpose({a})", op, [a])
    if op == "T" and n == 2:
        return Spec(f"{a}.T", f"{a}.T", op, [a])
    if op == "mT" and n >= 2:
        return Spec(f"{a}.mT", f"np.swapaxes({a}, -1, -2)", op, [a])
    if op == "permute" and n >= 1:
        perm = list(range(n))
        for i in range(n - 1, 0, -1):
            j = ch.int(0, i)
            perm[i], perm[j] = perm[j], perm[i]
        t = ch.choice([f"{a}.permute({_ints(perm)})", f"{a}.permute({_tup(perm)})",
                       f"torch.permute({a}, {_tup(perm)})"])
        return Spec(t, f"np.transpose({a}, {_tup(perm)})", op, [a])
    if op == "movedim" and n >= 1:
        src, dst = ch.int(-n, n - 1), ch.int(-n, n - 1)
        return Spec(ch.choice([f"torch.movedim({a}, {src}, {dst})", f"{a}.movedim({src}, {dst})"]),
                    f"np.moveaxis({a}, {src}, {dst})", op, [a])
    if op == "unsqueeze" and n < MAX_NDIM:
        d = ch.int(-n - 1, n)
        form = ch.int(0, 2)
        if form == 2 and n >= 1:
            return Spec(f"{a}[:, None]", f"{a}[:, None]", op, [a])
        return Spec(ch.choice([f"{a}.unsqueeze({d})", f"torch.unsqueeze({a}, {d})"]),
                    f"np.expand_dims({a}, {d})", op, [a])
    if op == "squeeze" and n >= 1:
        if ch.flag(0.3):
            return Spec(ch.choice([f"{a}.squeeze()", f"torch.squeeze({a})"]), f"np.squeeze({a})",
                        op, [a])
        d = ch.int(-n, n - 1)      # torch: a dimension whose length is not 1 stays
        n_src = f"np.squeeze({a}, {d})" if s[d] == 1 else f"{a}"
        return Spec(ch.choice([f"{a}.squeeze({d})", f"torch.squeeze({a}, {d})"]), n_src, op, [a])
    if op == "expand":
        tgt = [ch.int(2, 3) if d == 1 and ch.flag(0.6) else d for d in s]
        if ch.flag(0.5) or tgt == list(s):
            tgt = [ch.int(1, 3)] + tgt
        lead = len(tgt) - n
        args = [str(d) if i < lead or d != s[i - lead] or ch.flag(0.5) else "-1"
                for i, d in enumerate(tgt)]
        return Spec(f"{a}.expand({', '.join(args)})", f"np.broadcast_to({a}, {_tup(tgt)})", op, [a])
    if op in ("repeat", "tile"):
        k = ch.int(n if op == "repeat" else 1, n + 1) if n or op == "tile" else ch.int(1, 2)
        k = max(k, 1)
        reps = [ch.int(1, 2) for _ in range(k)]
        if op == "repeat":
            return Spec(ch.choice([f"{a}.repeat({_ints(reps)})", f"{a}.repeat({_tup(reps)})"]),
                        f"np.tile({a}, {_tup(reps)})", op, [a])
        return Spec(ch.choice([f"torch.tile({a}, {_tup(reps)})", f"{a}.tile({_tup(reps)})"]),
                    f"np.tile({a}, {_tup(reps)})", op, [a])
    if op == "flip" and n >= 1:
        ds = sorted(set(ch.int(0, n - 1) for _ in range(ch.int(1, 2))))
        t = ch.choice([f"{a}.flip({_ints(ds)})", f"torch.flip({a}, {list(ds)!r})",
                       f"{a}.flip({_tup(ds)})"])
        if n >= 2 and ch.flag(0.2):
            return Spec(ch.choice([f"torch.fliplr({a})", f"{a}.fliplr()"]), f"np.fliplr({a})", op, [a])
        return Spec(t, f"np.flip({a}, axis={_tup(ds)})", op, [a])
    if op == "roll":
        if n == 0 or ch.flag(0.25):
            k = ch.int(-3, 3)
            return Spec(f"torch.roll({a}, {k})", f"np.roll({a}, {k})", op, [a])
        d = ch.int(-n, n - 1)
        k = ch.int(-2, 2)
        if n >= 2 and ch.flag(0.3):
            d2 = (d + 1) % n
            return Spec(f"torch.roll({a}, (1, {k}), ({d}, {d2}))",
                        f"np.roll({a}, (1, {k}), axis=({d}, {d2}))", op, [a])
        return Spec(ch.choice([f"torch.roll({a}, {k}, {d})", f"{a}.roll({k}, {d})",
                               f"torch.roll({a}, shifts={k}, dims={d})"]),
                    f"np.roll({a}, {k}, axis={d})", op, [a])
    if op in ("narrow", "split", "chunk") and n >= 1:
        d = ch.int(-n, n - 1)
        L = s[d]
        pre = ":, " * (d % n)
        if op == "narrow":
            start = ch.int(0, L - 1)
            length = ch.int(1, L - start)
            return Spec(ch.choice([f"{a}.narrow({d}, {start}, {length})",
                                   f"torch.narrow({a}, {d}, {start}, {length})"]),
                        f"{a}[{pre}{start}:{start + length}]", op, [a])
        if op == "split":
            if ch.flag(0.4) and L >= 2:
                cut = ch.int(1, L - 1)
                sizes = [cut, L - cut]
                i = ch.int(0, 1)
                lo = 0 if i == 0 else cut
                return Spec(ch.choice([f"{a}.split({sizes!r}, {d})[{i}]",
                                       f"torch.split({a}, {sizes!r}, dim={d})[{i}]"]),
                            f"{a}[{pre}{lo}:{lo + sizes[i]}]", op, [a])
            size = ch.int(1, L)
            pieces = -(-L // size)
            i = ch.int(0, pieces - 1)
            return Spec(ch.choice([f"{a}.split({size}, {d})[{i}]",
                                   f"torch.split({a}, {size}, dim={d})[{i}]"]),
                        f"{a}[{pre}{i * size}:{min(L, (i + 1) * size)}]", op, [a])
        chunks = ch.int(1, L + 1)
        size = -(-L // chunks)
        pieces = -(-L // size)
        i = ch.int(0, pieces - 1)
        return Spec(ch.choice([f"{a}.chunk({chunks}, {d})[{i}]", f"torch.chunk({a}, {chunks}, {d})[{i}]"]),
                    f"{a}[{pre}{i * size}:{min(L, (i + 1) * size)}]", op, [a])
    if op == "diagonal" and n >= 2:
        d1 = ch.int(0, n - 1)
        d2 = ch.choice([i for i in range(n) if i != d1])
        off = ch.int(-1, 1)
        t = ch.choice([f"{a}.diagonal({off}, {d1}, {d2})",
                       f"torch.diagonal({a}, offset={off}, dim1={d1}, dim2={d2})"])
        return Spec(t, f"np.diagonal({a}, {off}, {d1}, {d2})", op, [a])
    if op == "tril" and n >= 2:
        k = ch.int(-1, 1)
        which = ch.choice(["tril", "triu"])
        return Spec(ch.choice([f"{a}.{which}({k})", f"torch.{which}({a}, diagonal={k})"]),
                    f"np.{which}({a}, {k})", which, [a])
    if op == "diag" and n in (1, 2):
        k = ch.int(-1, 1)
        return Spec(ch.choice([f"torch.diag({a}, {k})", f"{a}.diag({k})"]), f"np.diag({a}, {k})",
                    op, [a])
    if op == "trace" and n == 2:
        return Spec(ch.choice([f"{a}.trace()", f"torch.trace({a})"]), f"np.trace({a})", op, [a])
    if op == "repeat_interleave":
        r = ch.int(1, 3)
        if n == 0 or ch.flag(0.3):
            return Spec(f"{a}.repeat_interleave({r})", f"np.repeat({a}, {r})", op, [a])
        d = ch.int(-n, n - 1)
        return Spec(ch.choice([f"{a}.repeat_interleave({r}, {d})",
                               f"torch.repeat_interleave({a}, {r}, dim={d})"]),
                    f"np.repeat({a}, {r}, axis={d})", op, [a])
    # the op did not apply
    if n >= 1:
        return Spec(f"{a}.flip(0)", f"np.flip({a}, 0)", "flip", [a])
    return None


def _index(g, a):
    """Basic and advanced indexing, index_select, gather, masked_fill, where
    with a constant condition."""
    ch, x = g.ch, np.asarray(g.val(a))
    s, n = x.shape, x.ndim
    op = ch.choice(["basic", "basic", "basic", "advanced", "advanced2", "index_tensor", "mask",
                    "index_select", "gather", "masked_fill", "where_mask"])
    if n == 0:
        src = ch.choice(["None", "...", "None, None"])
        return Spec(f"{a}[{src}]", f"{a}[{src}]", "basic", [a])
    if op == "basic":
        idx = []
        for d in s:
            idx.append(ch.choice([":", "1:", ":-1", "::2", str(ch.int(-d, d - 1)), "None", "1::2",
                                  f"{ch.int(0, d - 1)}:{ch.int(0, d - 1) + 1}"]))
        while idx and idx[-1] == ":":
            idx.pop()
        if ch.flag(0.15) and idx:
            idx = ["..."] + idx[1:]
        if not idx:
            idx = ["None"]
        src = ", ".join(idx)
        return Spec(f"{a}[{src}]", f"{a}[{src}]", "basic", [a])
    d = ch.int(0, n - 1)
    L = s[d]
    idx = [ch.int(-L, L - 1) if ch.flag(0.2) else ch.int(0, L - 1) for _ in range(ch.int(1, 4))]
    pre = ":, " * d
    if op == "advanced":
        return Spec(f"{a}[{pre}{idx!r}]", f"{a}[{pre}{idx!r}]", "advanced", [a])
    if op == "advanced2" and n >= 2:
        j = [ch.int(0, s[1] - 1) for _ in idx]
        i0 = [ch.int(0, s[0] - 1) for _ in idx]
        return Spec(f"{a}[{i0!r}, {j!r}]", f"{a}[{i0!r}, {j!r}]", "advanced2", [a])
    if op == "index_tensor":
        return Spec(f"{a}[{pre}torch.tensor({idx!r})]", f"{a}[{pre}np.array({idx!r})]",
                    "index_tensor", [a])
    if op in ("mask", "masked_fill", "where_mask"):
        shp = s if op == "mask" else _broadcastable_shape(ch, s)
        if _bshape(s, shp) != s:
            shp = s
        m = np.array([ch.flag(0.6) for _ in range(int(np.prod(shp, dtype=int)))]).reshape(shp)
        if not m.any():
            m.flat[0] = True
        lit = repr(m.tolist())
        if op == "mask":
            return Spec(f"{a}[torch.tensor({lit})]", f"{a}[np.array({lit})]", "mask", [a])
        if op == "masked_fill":
            c = ch.int(-8, 8) / 4
            return Spec(f"{a}.masked_fill(torch.tensor({lit}), {_num(c)})",
                        f"np.where(np.array({lit}), {_num(c)}, {a})", op, [a])
        b = g.pick(lambda v: _bshape(s, np.shape(v)) is not None)
        other_t, other_n = (b, b) if b is not None and ch.flag(0.6) else _const(ch, s)[:2]
        ops_ = [a] + ([b] if other_t == b and b is not None else [])
        return Spec(f"torch.where(torch.tensor({lit}), {a}, {other_t})",
                    f"np.where(np.array({lit}), {a}, {other_n})", op, ops_)
    if op == "index_select":
        ds = ch.int(-n, n - 1)
        idx = [ch.int(0, s[ds] - 1) for _ in range(ch.int(1, 4))]
        return Spec(ch.choice([f"torch.index_select({a}, {ds}, torch.tensor({idx!r}))",
                               f"{a}.index_select({ds}, torch.tensor({idx!r}))"]),
                    f"np.take({a}, {idx!r}, axis={ds})", op, [a])
    # gather: an index of the input's shape but for dim d
    m = ch.int(1, 4)
    ishape = s[:d] + (m,) + s[d + 1:]
    if int(np.prod(ishape, dtype=int)) > MAX_SIZE:
        return None
    index = np.array([ch.int(0, L - 1) for _ in range(int(np.prod(ishape, dtype=int)))]).reshape(ishape)
    lit = repr(index.tolist())
    return Spec(ch.choice([f"torch.gather({a}, {d}, torch.tensor({lit}))",
                           f"{a}.gather({d}, torch.tensor({lit}))"]),
                f"np.take_along_axis({a}, np.array({lit}), axis={d})", "gather", [a])


def _concat(g, a):
    ch, s = g.ch, g.shape(a)
    n = len(s)
    if n >= 1 and ch.flag(0.6):
        d = ch.int(-n, n - 1)
        b = g.pick(lambda v: np.ndim(v) == n and all(
            i == d % n or np.shape(v)[i] == s[i] for i in range(n))) or a
        t = ch.choice([f"torch.cat([{a}, {b}], dim={d})", f"torch.cat(({a}, {b}), {d})",
                       f"torch.concat([{a}, {b}], {d})"])
        return Spec(t, f"np.concatenate([{a}, {b}], axis={d})", "cat", [a, b])
    b = g.pick(lambda v: np.shape(v) == s) or a
    d = ch.int(-n - 1, n)
    return Spec(ch.choice([f"torch.stack([{a}, {b}], dim={d})", f"torch.stack(({a}, {b}), {d})"]),
                f"np.stack([{a}, {b}], axis={d})", "stack", [a, b])


# --- products ---------------------------------------------------------------------------

def _matmul(g, a):
    ch, x = g.ch, np.asarray(g.val(a))
    s, n = x.shape, x.ndim
    if n == 0:
        return None
    k = s[-1]
    if n >= 2:
        want = lambda v: (np.ndim(v) == 1 and np.shape(v)[0] == k) or (
            np.ndim(v) >= 2 and np.shape(v)[-2] == k and _bshape(s[:-2], np.shape(v)[:-2]) is not None)
    else:
        want = lambda v: np.ndim(v) >= 1 and np.shape(v)[-1 if np.ndim(v) == 1 else -2] == k
    b = g.pick(want) if ch.flag(0.5) else None
    if b is not None:
        bt = bn = b
        y = np.asarray(g.val(b))
        operands = [a, b]
    else:
        shp = (k,) if ch.flag(0.25) else (k, ch.int(1, 3))
        bt, bn, y = _const(ch, shp)
        operands = [a]
    forms = [f"{a} @ {bt}", f"torch.matmul({a}, {bt})", f"{a}.matmul({bt})"]
    tag = "matmul"
    if n == 2 and y.ndim == 2:
        forms += [f"{a}.mm({bt})", f"torch.mm({a}, {bt})", f"torch.einsum('ij,jk->ik', {a}, {bt})",
                  f"torch.tensordot({a}, {bt}, dims=1)"]
    if n == 2 and y.ndim == 1:
        forms += [f"{a}.mv({bt})", f"torch.mv({a}, {bt})", f"torch.einsum('ij,j->i', {a}, {bt})"]
    if n == 1 and y.ndim == 1:
        forms += [f"torch.dot({a}, {bt})", f"{a}.dot({bt})", f"torch.inner({a}, {bt})"]
    if n == 3 and y.ndim == 3 and y.shape[0] == s[0]:
        forms += [f"torch.bmm({a}, {bt})", f"torch.einsum('bij,bjk->bik', {a}, {bt})"]
    t = ch.choice(forms)
    if "einsum" in t:
        tag = "einsum"
    return Spec(t, f"np.matmul({a}, {bn})", tag, operands)


def _products(g, a):
    """outer, cross, F.linear, a constant on the left of @."""
    ch, x = g.ch, np.asarray(g.val(a))
    s, n = x.shape, x.ndim
    op = ch.choice(["outer", "cross", "linear", "left"])
    if op == "outer" and n == 1:
        b = g.pick(lambda v: np.ndim(v) == 1) or a
        return Spec(ch.choice([f"torch.outer({a}, {b})", f"{a}.outer({b})"]),
                    f"np.outer({a}, {b})", op, [a, b])
    if op == "cross" and 3 in s:
        d = ch.choice([i for i, k in enumerate(s) if k == 3])
        b = g.pick(lambda v: np.shape(v) == s)
        if b is None:
            bt, bn, _ = _const(ch, s)
            operands = [a]
        else:
            bt = bn = b
            operands = [a, b]
        return Spec(f"torch.cross({a}, {bt}, dim={d})", f"np.cross({a}, {bn}, axis={d})", op, operands)
    if op == "linear" and n >= 1:
        m = ch.int(1, 3)
        wt, wn, _ = _const(ch, (m, s[-1]))
        if ch.flag():
            bt, bn, _ = _const(ch, (m,))
            return Spec(f"F.linear({a}, {wt}, {bt})", f"np.matmul({a}, {wn}.T) + {bn}", op, [a])
        return Spec(f"F.linear({a}, {wt})", f"np.matmul({a}, {wn}.T)", op, [a])
    if n >= 1:
        kk = s[0] if n == 1 else s[-2]
        ct, cn, _ = _const(ch, (ch.int(1, 3), kk))
        return Spec(f"{ct} @ {a}", f"np.matmul({cn}, {a})", "matmul_left", [a])
    return None


# --- losses -----------------------------------------------------------------------------

def _loss(g, a):
    ch, x = g.ch, np.asarray(g.val(a))
    s, n = x.shape, x.ndim
    op = ch.choice(["mse", "huber", "smooth_l1", "bce_logits", "cross_entropy", "cosine", "l1"])
    b = g.pick(lambda v: np.shape(v) == s)
    if b is None or b == a or ch.flag(0.4):
        bt, bn, y = _const(ch, s)
        operands = [a]
    else:
        bt = bn = b
        y = np.asarray(g.val(b))
        operands = [a, b]
    diff = np.abs(x - y)
    red = ch.choice(["mean", "sum", None])
    r_t = f", reduction='{red}'" if red else ""
    r_n = {"mean": "np.mean", "sum": "np.sum", None: "np.mean"}[red]
    if op == "l1" and np.min(diff) < MARGIN:
        op = "mse"
    if op in ("huber", "smooth_l1"):
        delta = ch.choice([0.5, 1.0, 0.25])
        if np.min(np.abs(diff - delta)) < MARGIN:
            op = "mse"
    if op == "mse":
        return Spec(f"F.mse_loss({a}, {bt}{r_t})", f"{r_n}(({a} - {bn}) ** 2)", op, operands)
    if op == "l1":
        return Spec(f"F.l1_loss({a}, {bt}{r_t})", f"{r_n}(np.abs({a} - {bn}))", op, operands)
    if op == "huber":
        dn = f"np.abs({a} - {bn})"
        return Spec(f"F.huber_loss({a}, {bt}{r_t}, delta={delta!r})",
                    f"{r_n}(np.where({dn} < {delta!r}, 0.5 * {dn} ** 2, {delta!r} * ({dn} - 0.5 * {delta!r})))",
                    op, operands)
    if op == "smooth_l1":
        dn = f"np.abs({a} - {bn})"
        return Spec(f"F.smooth_l1_loss({a}, {bt}{r_t}, beta={delta!r})",
                    f"{r_n}(np.where({dn} < {delta!r}, 0.5 * {dn} ** 2 / {delta!r}, {dn} - 0.5 * {delta!r}))",
                    op, operands)
    if op == "bce_logits":
        tgt = np.array([ch.int(0, 4) / 4 for _ in range(x.size)]).reshape(s)
        lit = repr(tgt.tolist())
        return Spec(f"F.binary_cross_entropy_with_logits({a}, torch.tensor({lit}, dtype=torch.float64){r_t})",
                    f"{r_n}(np.logaddexp(0.0, {a}) - np.array({lit}) * {a})", op, [a])
    if op == "cross_entropy" and n in (1, 2):
        c = s[-1]
        if n == 1:
            t_i = ch.int(0, c - 1)
            return Spec(f"F.cross_entropy({a}, torch.tensor({t_i}))",
                        f"-log_softmax({a}, -1)[{t_i}]", op, [a])
        tgt = [ch.int(0, c - 1) for _ in range(s[0])]
        return Spec(f"F.cross_entropy({a}, torch.tensor({tgt!r}){r_t})",
                    f"{r_n}(-log_softmax({a}, 1)[np.arange({s[0]}), {tgt!r}])", op, [a])
    if op == "cosine" and n >= 1:
        d = ch.int(-n, n - 1)
        if np.min(np.sum(x * x, axis=d)) < 1e-2 or np.min(np.sum(y * y, axis=d)) < 1e-2:
            return None
        return Spec(f"F.cosine_similarity({a}, {bt}, dim={d})",
                    f"np.sum({a} * {bn}, axis={d}) / (vnorm({a}, {d}) * vnorm({bn}, {d}))",
                    op, operands)
    return Spec(f"F.mse_loss({a}, {bt}{r_t})", f"{r_n}(({a} - {bn}) ** 2)", "mse", operands)


# --- in place ---------------------------------------------------------------------------

def _inplace_view(ch, s):
    """(torch source, NumPy source) of a view of ``{o}`` (a fresh clone of
    shape ``s``) that an in-place op can write through; the NumPy one is an
    ndarray view (never a scalar), so ``_w *= c`` writes into ``{o}``."""
    n = len(s)
    forms = ["index", "index"]
    if n == 2:
        forms += ["t", "diagonal"] if s[0] == s[1] else ["t"]
    if n >= 2:
        forms.append("transpose")
    forms += ["view", "unsqueeze", "narrow"]
    form = ch.choice(forms)
    if form == "t":
        return "{o}.t()", "{o}.T"
    if form == "diagonal":
        return "{o}.diagonal()", "np.einsum('ii->i', {o})"
    if form == "transpose":
        return "{o}.transpose(0, 1)", "np.swapaxes({o}, 0, 1)"
    if form == "view":
        step = ch.int(1, 2)
        return f"{{o}}.view(-1)[::{step}]", f"{{o}}.reshape(-1)[::{step}]"
    if form == "unsqueeze":
        return "{o}.unsqueeze(0)", "{o}[None]"
    if form == "narrow":
        d = ch.int(0, n - 1)
        start = ch.int(0, s[d] - 1)
        length = ch.int(1, s[d] - start)
        pre = ":, " * d
        return (f"{{o}}.narrow({d}, {start}, {length})", f"{{o}}[{pre}{start}:{start + length}]")
    idx = ch.choice(["0", "-1", "1:", "::2", ":, 0" if n >= 2 else "0:1", "..., -1", ":, 1:" if n >= 2 else ":"])
    if idx in ("1:",) and s[0] < 2:
        idx = "0"
    return f"{{o}}[{idx}]", f"{{o}}[{idx}{'' if '...' in idx else ', ...'}]"


def _inplace(g, a):
    """``vN = a.clone()`` then one or two in-place updates of vN, of the whole
    (``vN.mul_(c)``, ``vN.add_(b, alpha=2)``, ``vN.clamp_(...)``,
    ``vN.copy_(b)``, ...) or through a view of it (``vN.t()[0].add_(c)``,
    ``vN.diagonal().mul_(b)``, ``vN.view(-1)[::2].exp_()``: torch writes into
    vN, as the NumPy reference's ``_w = vN.T[0, ...]; _w += c`` does)."""
    ch, x = g.ch, np.asarray(g.val(a))
    s = x.shape
    t_stmts, n_stmts = [], []
    tag = "inplace"
    operands = [a]
    cur = x.copy()
    for _ in range(ch.int(1, 2)):
        if s and ch.flag(0.5):
            vt, vn = _inplace_view(ch, s)
            tag = "inplace_view"
        else:
            vt, vn = "{o}", "{o}[...]"
        # the view's current value, to pick a safe update
        w = eval(vn.format(o="cur"), {"np": np, "cur": cur})
        ws = np.shape(w)
        if w.size == 0:
            return None
        op = ch.choice(["add_", "sub_", "mul_", "div_", "add_t", "mul_t", "copy_", "fill_",
                        "zero_", "clamp_", "neg_", "exp_", "pow_"])
        b = None
        if op in ("add_t", "mul_t", "copy_"):
            b = g.pick(lambda v: np.ndim(v) <= len(ws) and _bshape(ws, np.shape(v)) == ws)
            if b is None:
                op = "add_"
        c = ch.choice([0.5, 2.0, 1.5, -0.75])
        if op == "exp_" and np.max(w) > 3.5:
            op = "neg_"
        if op == "clamp_":
            c1, c2 = sorted([ch.int(-6, 6) / 4, ch.int(-6, 6) / 4])
            if c1 == c2 or min(np.min(np.abs(w - c1)), np.min(np.abs(w - c2))) < MARGIN:
                op = "neg_"
        if op in ("add_", "sub_", "mul_", "div_"):
            sym = {"add_": "+=", "sub_": "-=", "mul_": "*=", "div_": "/="}[op]
            t, n = f"{vt}.{op}({c!r})", f"_w = {vn}; _w {sym} {c!r}"
        elif op == "add_t":
            k = ch.choice([1.0, 2.0, -0.5])
            t = f"{vt}.add_({b})" if k == 1.0 else f"{vt}.add_({b}, alpha={k!r})"
            n = f"_w = {vn}; _w += {k!r} * {b}"
            operands.append(b)
        elif op == "mul_t":
            t, n = f"{vt}.mul_({b})", f"_w = {vn}; _w *= {b}"
            operands.append(b)
        elif op == "copy_":
            t, n = f"{vt}.copy_({b})", f"_w = {vn}; _w[...] = {b}"
            operands.append(b)
        elif op == "fill_":
            t, n = f"{vt}.fill_({c!r})", f"_w = {vn}; _w[...] = {c!r}"
        elif op == "zero_":
            t, n = f"{vt}.zero_()", f"_w = {vn}; _w[...] = 0.0"
        elif op == "clamp_":
            t = f"{vt}.clamp_({_num(c1)}, {_num(c2)})"
            n = f"_w = {vn}; np.clip(_w, {c1!r}, {c2!r}, out=_w)"
        elif op == "neg_":
            t, n = f"{vt}.neg_()", f"_w = {vn}; np.negative(_w, out=_w)"
        elif op == "exp_":
            t, n = f"{vt}.exp_()", f"_w = {vn}; np.exp(_w, out=_w)"
        else:
            t, n = f"{vt}.pow_(2)", f"_w = {vn}; _w **= 2"
        t_stmts.append(t)
        n_stmts.append(n)
        env = {"np": np, "cur": cur, **{k: g.env[k] for k in g.pool}}
        exec(n.replace("{o}", "cur"), env)
    # torch's clone keeps a transposed layout, through which view(-1) cannot
    # see and diagonal() is a copy: a C-contiguous clone for those
    flat = any(".view(-1)" in t or ".diagonal()" in t for t in t_stmts)
    return Spec(f"{a}.contiguous().clone()" if flat else f"{a}.clone()", f"np.array({a}, order='C')", tag,
                operands, "; ".join(t_stmts), "; ".join(n_stmts))


def _setitem(g, a):
    """``vN = a.clone(); vN[idx] = value``: torch's setitem, differentiable
    in vN and in the value."""
    ch, x = g.ch, np.asarray(g.val(a))
    s, n = x.shape, x.ndim
    if n == 0:
        return None
    kind = ch.choice(["basic", "basic", "list", "mask"])
    if kind == "basic":
        idx = ch.choice(["0", "-1", "1:", "::2", ":, 0" if n >= 2 else ":1", "..., 0", ":"])
        if idx == "1:" and s[0] < 2:
            idx = "0"
    elif kind == "list":
        k = ch.int(1, s[0])
        rows = sorted(set(ch.int(0, s[0] - 1) for _ in range(k)))   # no repeats: no write order
        idx = repr(rows)
    else:
        m = np.array([ch.flag(0.5) for _ in range(x.size)]).reshape(s)
        if not m.any():
            m.flat[0] = True
        c = ch.int(-8, 8) / 4
        lit = repr(m.tolist())
        return Spec(f"{a}.clone()", f"np.array({a}, order='C')", "setitem", [a],
                    f"{{o}}[torch.tensor({lit})] = {_num(c)}", f"{{o}}[np.array({lit})] = {_num(c)}")
    ws = np.shape(x[eval(f"np.s_[{idx}]")])
    b = g.pick(lambda v: np.ndim(v) <= len(ws) and _bshape(ws, np.shape(v)) == ws)
    if b is None or ch.flag(0.2):
        c = ch.int(-8, 8) / 4
        return Spec(f"{a}.clone()", f"np.array({a}, order='C')", "setitem", [a],
                    f"{{o}}[{idx}] = {_num(c)}", f"{{o}}[{idx}] = {_num(c)}")
    return Spec(f"{a}.clone()", f"np.array({a}, order='C')", "setitem", [a, b],
                f"{{o}}[{idx}] = {b} * 2.0", f"{{o}}[{idx}] = {b} * 2.0")


def _argindex(g, a):
    """Indices computed from values: ``y.gather(d, x.argmax(d, keepdim=True))``,
    ``torch.sort(x, d).indices`` used to gather, ``x.max(d).indices``; and
    integer tensors in arithmetic (``x * torch.arange(n)``)."""
    ch, x = g.ch, np.asarray(g.val(a))
    s, n = x.shape, x.ndim
    if n == 0:
        return None
    d = ch.int(-n, n - 1)
    rows = _rows(x, (d % n,))
    op = ch.choice(["argmax_gather", "sort_gather", "max_indices", "arange_mul"])
    if op == "arange_mul":
        return _arange_spec(ch, a, s[-1])
    if rows.shape[-1] > 1 and np.min(np.diff(np.sort(rows, -1), axis=-1)) < MARGIN:
        return None     # ties: the indices are not determined
    y = g.pick(lambda v: np.shape(v) == s) or a
    if op == "argmax_gather":
        which = ch.choice(["argmax", "argmin"])
        return Spec(ch.choice([f"{y}.gather({d}, {a}.{which}({d}, keepdim=True))",
                               f"torch.gather({y}, {d}, torch.{which}({a}, dim={d}, keepdim=True))"]),
                    f"np.take_along_axis({y}, np.expand_dims(np.{which}({a}, axis={d}), {d}), axis={d})",
                    "argmax_gather", [a, y])
    if op == "sort_gather":
        desc = ch.flag()
        order = f"np.argsort({a}, axis={d})"
        if desc:
            order = f"np.flip({order}, axis={d})"
        return Spec(f"{y}.gather({d}, torch.sort({a}, dim={d}{', descending=True' if desc else ''}).indices)",
                    f"np.take_along_axis({y}, {order}, axis={d})", "sort_gather", [a, y])
    which = ch.choice(["max", "min"])
    return Spec(f"torch.index_select({y}.flatten(), 0, {a}.flatten().{which}(0).indices.reshape(1))",
                f"np.ravel({y})[[np.arg{which}(np.ravel({a}))]]", "max_indices", [a, y])


def _arange_spec(ch, a, k):
    if ch.flag():
        return Spec(f"{a} * torch.arange({k})", f"{a} * np.arange({k})", "arange_mul", [a])
    return Spec(f"torch.arange({k}) - {a}", f"np.arange({k}) - {a}", "arange_mul", [a])


KINDS = [(28, _unary), (22, _binary), (12, _reduce), (8, _normalize_op), (22, _shape_op),
         (8, _index), (3, _concat), (7, _matmul), (3, _products), (3, _loss), (5, _inplace),
         (2, _setitem), (2, _argindex)]

# Tags left out by default: none today (a construct that gives wrong numbers
# is listed here, with its reproducer in tests/test_random_torch_programs.py).
KNOWN_WRONG = frozenset()
EXCLUDE = KNOWN_WRONG


def generate(ch, seed=None, min_ops=2, max_ops=10, exclude=EXCLUDE):
    """A random TorchProgram, choices from ``ch``; tags in ``exclude`` are not used."""
    g = _Gen(ch, exclude)
    n_in = ch.weighted([(3, 1), (1, 2)])
    inputs = []
    rng = np.random.default_rng(ch.int(0, 2 ** 31 - 1))
    for i in range(n_in):
        nd = ch.weighted([(4, 2), (3, 1), (2, 3), (1, 0)])
        shape = tuple(ch.int(1, 4) for _ in range(nd))
        if math.prod(shape) > 24:
            shape = shape[1:]
        arr = np.array(np.round(rng.uniform(-1.5, 1.5, shape), 3), float)
        name = f"x{i}" if n_in > 1 else "x"
        inputs.append((name, arr.copy()))
        g.env[name] = arr
        g.pool.append(name)
        g.inputs.add(name)
    for _ in range(ch.int(min_ops, max_ops)):
        for _attempt in range(6):
            kind = ch.weighted(KINDS)
            a = g.pick()
            if g.try_emit(kind(g, a)):
                break
        else:
            last = g.pool[-1]
            g.try_emit(Spec(f"{last}.tanh()", f"np.tanh({last})", "tanh", [last]))
    terms, np_terms = [], []
    for n in g.pool:
        if n not in g.used or ch.flag(0.15) or n == g.pool[-1]:
            v = g.val(n)
            if np.ndim(v) == 0:
                c = _num(ch.int(-8, 8) / 4 or 0.5)
                terms.append(f"{c} * {n}")
                np_terms.append(f"{c} * {n}")
            else:
                wt, wn, _ = _const(ch, np.shape(v))
                terms.append(ch.choice([f"({n} * {wt}).sum()", f"torch.sum({n} * {wt})"]))
                np_terms.append(f"np.sum({n} * {wn})")
    return TorchProgram(inputs, g.lines, g.np_lines, terms, np_terms, g.tags, seed)


def programs(**kw):
    """A hypothesis strategy of TorchPrograms."""
    from hypothesis import strategies as st

    @st.composite
    def _programs(draw):
        return generate(DrawChooser(draw), **kw)
    return _programs()


# --- checking ---------------------------------------------------------------------------

def check_program(prog, *, eager=True, func=True, fd=True, replay=True, torch_module=None):
    """Run ``prog`` in every mode; raise Failure at the first disagreement.
    ``torch_module``: torch itself, to run the program on it too.  Returns a
    dict of facts."""
    import tracegrad as tg
    import tracegrad.func as tfunc

    facts = {}
    f_np = prog.numpy_function()
    args = prog.args
    argnums = tuple(range(len(args)))
    with np.errstate(all="raise"):
        want = np.asarray(f_np(*prog.args), float)
    scale = 1.0 + float(np.max(np.abs(want)))
    vtol = dict(rtol=1e-10, atol=1e-11 * scale)
    gtol = dict(rtol=1e-8, atol=1e-10)
    f_t = prog.function(tg)

    def run(kind, thunk):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return thunk()
        except Failure:
            raise
        except Exception as e:
            raise Failure(kind + "-crash", prog, f"{type(e).__name__}: {e}") from e

    def value_of(out, kind):
        if not isinstance(out, tg.Tensor):
            raise Failure(kind + "-type", prog, f"returned a {type(out).__name__}, not a Tensor")
        if out.shape != () or out.dtype != np.float64:
            raise Failure(kind + "-type", prog, f"returned shape {out.shape} dtype {out.dtype}")
        return out.detach().numpy().copy()

    def grads_of(gs, kind):
        out = []
        for i, (g_, a) in enumerate(zip(gs, args)):
            if not isinstance(g_, tg.Tensor):
                raise Failure(kind + "-type", prog, f"d/d{prog.names[i]} is a {type(g_).__name__}")
            g_ = g_.detach().numpy().copy()
            if g_.shape != a.shape or g_.dtype != np.float64:
                raise Failure(kind + "-type", prog, f"d/d{prog.names[i]}: {g_.dtype}{list(g_.shape)}, "
                              f"input float64{list(a.shape)}")
            out.append(g_)
        return out

    num = None
    if fd:
        num = []
        for i in argnums:
            with np.errstate(all="ignore"):
                num.append(fd_grad(f_np, args, i, 1e-6))

    def against_fd(kind, grads):
        if num is None:
            return
        for i, (g_, n_) in enumerate(zip(grads, num)):
            gs_ = 1.0 + float(np.max(np.abs(n_), initial=0.0))
            if not _close(g_, n_, rtol=1e-5, atol=1e-6 * gs_ + 1e-9 * scale):
                raise Failure(kind + "-vs-fd", prog,
                              f"d/d{prog.names[i]}: {kind}\n{g_!r}\nfinite differences\n{n_!r}")

    reference = None    # the gradients the other modes are compared with, tightly

    def against_reference(kind, grads):
        for i, (g1, g2) in enumerate(zip(reference, grads)):
            if not _close(g2, g1, **gtol):
                raise Failure(kind + "-grad", prog,
                              f"d/d{prog.names[i]}: {reference_kind}\n{g1!r}\n{kind}\n{g2!r}")

    if eager:
        from tracegrad.autograd import replay as replay_mod
        before = dict(replay_mod.stats)
        for step in range(3 if replay else 1):
            leaves = [tg.tensor(a.copy(), requires_grad=True) for a in args]

            def fwd_bwd():
                out = f_t(*leaves)
                val = value_of(out, "eager")
                out.backward()
                return val
            val = run("eager", fwd_bwd)
            if not _close(val, want, **vtol):
                raise Failure("eager-value", prog, f"pass {step + 1}: numpy {want!r}, eager {val!r}")
            gl = [np.zeros(a.shape) if t.grad is None else t.grad.numpy().copy()
                  for t, a in zip(leaves, args)]
            if reference is None:
                against_fd("eager", gl)
                reference, reference_kind = gl, "eager"
            else:
                against_reference("eager-replay" if step == 2 else "eager-again", gl)
        delta = {k: replay_mod.stats[k] - before[k] for k in before}
        facts["replayed"] = delta.get("replays", 0) >= 1

    if func:
        ts = [tg.tensor(a.copy()) for a in args]
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                gs = tfunc.grad(f_t, argnums=argnums)(*ts)
        except tg.TraceError as e:
            # compiled code has no shared memory: an update through a view, or
            # an item assignment, is refused with a TraceError (by design;
            # eager mode writes through)
            if not ("inplace_view" in prog.tags and "shares memory with another" in str(e)
                    or "setitem" in prog.tags and "item assignment" in str(e)):
                raise Failure("func.grad-crash", prog, f"TraceError: {e}") from e
            facts["func_refused"] = True
            func = False
        except Exception as e:
            raise Failure("func.grad-crash", prog, f"{type(e).__name__}: {e}") from e
    if func:
        gs = grads_of(gs, "func.grad")
        if reference is None:
            against_fd("func.grad", gs)
            reference, reference_kind = gs, "func.grad"
        else:
            against_reference("func.grad", gs)
        gv = run("func.grad_and_value", lambda: tfunc.grad_and_value(f_t, argnums=argnums)(*ts))
        val = value_of(gv[1], "func.grad_and_value")
        if not _close(val, want, **vtol):
            raise Failure("func.grad_and_value-value", prog, f"numpy {want!r}, func {val!r}")
        against_reference("func.grad_and_value", grads_of(gv[0], "func.grad_and_value"))

        ct = 0.75

        def vjp():
            out, vjp_fn = tfunc.vjp(f_t, *ts)
            return out, vjp_fn(tg.tensor(ct))
        out, cts = run("func.vjp", vjp)
        val = value_of(out, "func.vjp")
        if not _close(val, want, **vtol):
            raise Failure("func.vjp-value", prog, f"numpy {want!r}, func.vjp {val!r}")
        cts = grads_of(cts, "func.vjp")
        against_reference("func.vjp", [c / ct for c in cts])

        # forward mode: the tangent of the scalar output is <gradient, tangent>
        tans = [np.linspace(-1.0, 1.0, a.size).reshape(a.shape) + 0.25 for a in args]
        out, tan = run("func.jvp", lambda: tfunc.jvp(f_t, tuple(ts),
                                                     tuple(tg.tensor(t) for t in tans)))
        val = value_of(out, "func.jvp")
        if not _close(val, want, **vtol):
            raise Failure("func.jvp-value", prog, f"numpy {want!r}, func.jvp {val!r}")
        tan = value_of(tan, "func.jvp")
        expect = sum(float(np.sum(g_ * t)) for g_, t in zip(reference, tans))
        gscale = 1.0 + sum(float(np.sum(np.abs(g_ * t))) for g_, t in zip(reference, tans))
        if not _close(tan, expect, rtol=1e-8, atol=1e-10 * gscale):
            raise Failure("func.jvp-tangent", prog,
                          f"<{reference_kind} gradient, tangent> {expect!r}, func.jvp {tan!r}")
        for a, t in zip(args, ts):
            if not np.array_equal(t.numpy(), a):
                raise Failure("func-mutates-input", prog, f"input changed to {t.numpy()!r}")

    if torch_module is not None:
        torch = torch_module
        f_torch = prog.function(torch)

        def on_torch():
            leaves = [torch.tensor(a.copy(), dtype=torch.float64, requires_grad=True) for a in args]
            out = f_torch(*leaves)
            out.backward()
            return (out.detach().numpy().copy(),
                    [np.zeros(a.shape) if t.grad is None else t.grad.numpy().copy()
                     for t, a in zip(leaves, args)])
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                val, gt = on_torch()
        except RuntimeError as e:
            # torch refuses a backward through a saved value changed in place
            # since; tracegrad keeps what it saved, and its numbers were
            # checked above
            if "modified by an inplace operation" not in str(e) or \
                    not any(t in prog.tags for t in ("inplace", "inplace_view", "setitem")):
                raise Failure("torch-crash", prog, f"{type(e).__name__}: {e}") from e
            facts["torch_refused"] = True
            return facts
        except Exception as e:
            raise Failure("torch-crash", prog, f"{type(e).__name__}: {e}") from e
        if not _close(val, want, **vtol):
            raise Failure("torch-vs-numpy-value", prog, f"numpy {want!r}, torch {val!r}")
        against_fd("torch", gt)
        if reference is not None:
            for i, (g1, g2) in enumerate(zip(reference, gt)):
                if not _close(g1, g2, **gtol):
                    raise Failure("tracegrad-vs-torch-grad", prog,
                                  f"d/d{prog.names[i]}: torch\n{g2!r}\n{reference_kind}\n{g1!r}")
        facts["torch"] = True
    return facts
