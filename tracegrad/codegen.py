"""Code generation: IR graphs to NumPy source through Jinja2 templates.

The NumPy target prints one plain Python function per graph: straight-line
NumPy calls, one statement per line, each tagged with its graph node and
grouped under the user's source line it came from.  The primitive rows'
``numpy`` emitters give each statement's expression; this module decides
names, constants and buffers.

Buffer planning: a ufunc whose output has the shape and dtype of a dead
intermediate writes into it with ``out=`` (the operand itself when it dies
at this statement), so a long elementwise chain allocates a constant number
of arrays.
"""
from __future__ import annotations

import base64
import builtins
import hashlib
import inspect
import keyword
import math
import os
import re
import unicodedata

import numpy as np

from tracegrad import ir, primitives
from tracegrad._version import __version__
from tracegrad.cache import template_dir, templates_hash  # noqa: F401 (re-exported)

# Arrays at least this large are freed (``del``) as soon as they are dead
# and not kept for reuse, to bound peak memory.
DEL_MIN_ELEMENTS = 1 << 16


_env = None


def _jinja():
    global _env
    if _env is None:
        import jinja2
        _env = jinja2.Environment(loader=jinja2.FileSystemLoader(template_dir()),
                                  trim_blocks=True, lstrip_blocks=True,
                                  keep_trailing_newline=True, undefined=jinja2.StrictUndefined)
        # the templates pass every user-derived string (names, docstrings,
        # quoted source lines) through this filter: see safe_text
        _env.filters["safe_text"] = safe_text
    return _env


# Short escapes safe_text writes; every other unsafe character becomes \xNN,
# \uNNNN or \UNNNNNNNN.
_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def safe_text(text):
    r"""User text (a name, a path, a quoted source line) as text that cannot
    leave the ``#`` comment, the triple-quoted docstring or the CUDA ``//``
    comment it is printed in: the one function for every user-derived string
    that reaches generated source other than as an identifier or a repr().

    The result is the body of a valid Python string literal, escaped as
    ``repr`` escapes: backslashes doubled; line breaks of every kind (all
    that ``str.splitlines`` splits on), NUL, tabs and every other
    non-printable character (bidi controls included) as ``\n``, ``\xNN``,
    ``\uNNNN``; a quote that would extend a run of quotes (so no triple
    quote survives), or that stands at either end, as ``\"``/``\'``, so no
    concatenation of such pieces with quote-free text closes a docstring.
    It never ends with a backslash (a C ``//`` comment would continue onto
    the next line).  Ordinary names and source lines come through unchanged.
    """
    s = str(text)
    out = []
    last = len(s) - 1
    for i, c in enumerate(s):
        if c in _ESCAPES:
            out.append("\\x5c" if c == "\\" and i == last else _ESCAPES[c])
        elif c in "\"'":
            out.append("\\" + c if i in (0, last) or s[i - 1] == c else c)
        elif c.isprintable():
            out.append(c)
        else:
            o = ord(c)
            out.append(f"\\x{o:02x}" if o < 0x100 else
                       f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}")
    return "".join(out)


# Names the generated code binds or reads, besides those beginning with "_"
# (which all belong to it: runtime helpers, constants _c0, kernel handles,
# the CLI's _check): an argument by one of these names would shadow them
# inside the generated function.
_GENERATED_NAMES = frozenset({"np", "math", "base64", "numpy", "cupy", "CUDA_SOURCE"}) \
    | frozenset(dir(builtins))
_TEMPORARY = re.compile(r"t\d+")   # the variables of the generated statements


def identifier(name, taken=()):
    """A valid, readable Python identifier for a user-supplied name: its
    identifier characters kept (non-ASCII letters too), others replaced by
    ``_``; never a keyword, a builtin, a name the generated code uses (np,
    t3, _c0, helpers) nor one in ``taken``.  Idempotent on its results."""
    # the parser NFKC-normalises identifiers (so 𝐧𝐩 would BE np): normalise
    # first, so what we check is what Python will see
    s = unicodedata.normalize("NFKC", str(name))
    s = "".join(c if ("a" + c).isidentifier() else "_" for c in s)
    if s.startswith("_"):
        s = "a" + s
    elif not s[:1].isidentifier():  # empty, or a digit first
        s = "a_" + s
    if keyword.iskeyword(s) or s in _GENERATED_NAMES or _TEMPORARY.fullmatch(s):
        s = s + "_"
    if not s.isidentifier() or unicodedata.normalize("NFKC", s) != s:
        s = "a_" + re.sub(r"[^0-9A-Za-z_]", "_", s)   # never expected; ASCII is always valid
    base, k = s, 1
    while s in taken:
        s = f"{base}_{k}"
        k += 1
    return s


def identifiers(names, reserved=()):
    """``identifier`` of each name: all distinct, none in ``reserved``."""
    taken = set(reserved)
    out = []
    for n in names:
        s = identifier(n, taken)
        taken.add(s)
        out.append(s)
    return out


def literal(value):
    """Python source for a scalar constant."""
    if isinstance(value, (bool, np.bool_)):
        return repr(bool(value))
    if isinstance(value, (int, np.integer)):
        return repr(int(value))
    v = float(value)
    if math.isnan(v):
        return "np.nan"
    if math.isinf(v):
        return "np.inf" if v > 0 else "-np.inf"
    return repr(v)


def scalar_type(dtype):
    """The NumPy scalar type's name in generated code: np.float64, np.bool_
    (np.bool only exists from NumPy 2 on)."""
    dtype = np.dtype(dtype)
    return "np.bool_" if dtype.kind == "b" else f"np.{dtype.name}"


def _const_code(arr):
    t = scalar_type(arr.dtype)
    if arr.ndim == 0 and np.isfinite(arr).all() and arr.dtype.kind in "fiub":
        return f"{t}({literal(arr.item())})", False
    if arr.size <= 16 and arr.dtype.kind in "fiub" and np.isfinite(arr).all():
        return f"np.array({arr.tolist()!r}, dtype={t})", False
    if arr.size and arr.dtype.kind in "fiub" and np.isfinite(arr.flat[0]) \
            and (arr == arr.flat[0]).all():  # one repeated value (zeros, a seed of ones)
        return f"np.full({tuple(arr.shape)!r}, {literal(arr.flat[0])}, dtype={t})", False
    b = base64.b64encode(np.ascontiguousarray(arr).tobytes()).decode()
    return (f"np.frombuffer(base64.b64decode({b!r}), dtype={arr.dtype.str!r})"
            f".reshape({tuple(arr.shape)!r})"), True


def _ufunc_of(prim, n_operands):
    """The callable codegen may give ``out=``: a NumPy ufunc, or one of the
    row's runtime helpers that takes ``out=`` (named in ``ufunc``)."""
    name = prim.ufunc
    if name and name in prim.helpers:
        return name
    if not name or not name.startswith("np."):
        return None
    f = getattr(np, name[3:], None)
    if isinstance(f, np.ufunc) and f.nin == n_operands and f.nout == 1:
        return name
    return None


def _source_comment(loc):
    """``file:line: the user's source line``, raw: templates print it
    through safe_text."""
    if not loc:
        return None
    import linecache
    fname = os.path.basename(loc[0])
    text = linecache.getline(loc[0], loc[1]).strip()
    where = f"{fname}:{loc[1]}"
    if len(loc) > 3:
        where += f" ({loc[3]})"
    return f"{where}: {text}" if text else where


def function_name(name):
    """``name`` if it can be a generated function's name: chosen by tracegrad
    (forward, value_and_grad, run), never by user text, so anything else is a
    bug in the caller."""
    if not str(name).isidentifier() or keyword.iskeyword(name) or name.startswith("_") \
            or name in _GENERATED_NAMES:
        raise ValueError(f"codegen: {name!r} cannot name a generated function")
    return name


def operand_expr(g, u, names, module):
    """Source for operand u: a literal for a Python number, a module-level
    constant for an array, else its variable name."""
    d = g.nodes[u]
    if d["op"] == "const":
        val = d["value"]
        if not isinstance(val, np.ndarray):
            return literal(val)
        return module.constant(u, val)
    return names[u]


class Lowered:
    """A graph lowered to the body of one NumPy function."""

    def __init__(self, g, name, arg_names, doc, module, internal=False):
        # internal: a loop or branch body's function, named by the generator
        self.name = name if internal else function_name(name)
        # argument names are the caller's, possibly raw user text: made
        # identifiers here, where they enter source (a no-op for names that
        # already went through identifier())
        self.args = identifiers(arg_names, reserved={self.name})
        self.doc = doc   # printed through safe_text by the template
        self.body = []
        self._lower(g, module)

    def _lower(self, g, module):
        order = [v for v in ir.topo_order(g) if g.nodes[v]["op"] not in ("input",)]
        outputs = g.graph["outputs"]
        names = {}
        for v, a in zip(g.graph["inputs"], self.args):
            names[v] = a
        plan = BufferPlanner(g, order, [ir.operands(g, v) for v in order])
        prev_src = None

        def expr(u):
            return operand_expr(g, u, names, module)

        for i, v in enumerate(order):
            d = g.nodes[v]
            op = d["op"]
            if op == "const":
                continue
            ops = ir.operands(g, v)
            args = [expr(u) for u in ops]
            var = f"t{v}"
            comment = f"%{v} {op}"
            if op == "proj":
                code = f"{var} = {args[0]}[{d['attrs']['index']}]"
            elif op in CONTROL_FLOW:
                code, prev_src = control_flow_statements(self.body, v, var, args, d, module,
                                                         prev_src)
                comment = None
            else:
                prim = primitives.get(op)
                if prim.numpy is None:
                    raise NotImplementedError(
                        f"codegen: the primitive {op!r} has no NumPy emitter, so it cannot be "
                        f"compiled; use it in eager mode or add an emitter to its registry row")
                if callable(prim.numpy):
                    e = prim.numpy(args, **d["attrs"])
                else:
                    e = prim.numpy.format(*args, **{k: repr(x) for k, x in d["attrs"].items()})
                for h in prim.helpers:
                    if h + "(" in e:  # only the helpers this statement calls
                        module.helper(h)
                code = f"{var} = {e}"
                ufunc = _ufunc_of(prim, len(ops))
                if ufunc and d.get("shape") and d.get("avals") is None:
                    buf = plan.take(v, i, inplace_operands(prim, ufunc, ops))
                    if buf is not None:
                        code = f"{var} = {ufunc}({', '.join(args)}, out={names[buf]})"
                    plan.own(v)
            names[v] = var
            src = _source_comment(d.get("loc"))
            self.body.append({"code": code, "comment": comment,
                              "source": src if src != prev_src else None})
            prev_src = src
            # values that die here: pool their buffers or free them
            for u in plan.release(ops, i):
                self.body.append({"code": f"del {names[u]}", "comment": "dead: free its memory",
                                  "source": None})
        rets = [expr(v) if g.nodes[v]["op"] in ("const", "input") else names[v] for v in outputs]
        self.returns = "(" + ", ".join(rets) + ("," if len(rets) == 1 else "") + ")"


def inplace_operands(prim, ufunc, ops):
    """The operands whose buffer a ufunc statement may write into when they
    die at it: an elementwise ufunc's (a matmul reading its own output
    buffer would need a copy)."""
    return ops if prim.elementwise or ufunc in prim.helpers else ()


class BufferPlanner:
    """Which dead intermediate's buffer a new value is written into.

    The one buffer planner of the targets whose generated code calls NumPy:
    the NumPy target (a statement per node) and the native target's drivers
    (a statement per fused kernel or NumPy call).  Statements run in
    ``order``; ``steps[i]`` holds the operands statement i reads.  ``take``
    gives a value the buffer of a value dead by then with its shape and
    dtype (or of an operand dying at this very statement, where the caller
    allows it); ``release`` pools the buffers of the values dying at a
    statement and names the large dead values worth freeing at once
    (``del``).  A value something else may alias (a view, a ``proj`` of a
    tuple, a loop's carry) is never written into.

    ``keep_between_calls`` (the native driver): a buffer may also be kept
    from one call to the next (``keep``); no value that escapes the call
    (a graph output, or a value an output may be a view of) is ever written
    into such a buffer.  Each buffer carries tags: "kept" (between calls),
    "c_order" (allocated C-contiguous by the caller, as a C kernel needs)."""

    def __init__(self, g, order, steps, keep_between_calls=False):
        self.g = g
        self.last_use = {}   # the last statement reading each value
        for i, reads in enumerate(steps):
            for u in reads:
                self.last_use[u] = i
        self.never_dies = set(g.graph["outputs"]) | set(g.graph["inputs"])
        self.aliased = set()   # values whose memory someone else may alias: never reused
        self.views = set()     # results that are views of another value: nothing to free
        for v in order:
            d = g.nodes[v]
            if d["op"] in ("const", "proj"):
                if d["op"] == "proj":
                    self.aliased.add(ir.operands(g, v)[0])
                continue
            if primitives.get(d["op"]).aliases_operands:
                self.aliased.update(ir.operands(g, v))
                self.views.add(v)
        self.owned = set()      # fresh results: ours to overwrite once dead
        self.handed_on = set()  # values whose buffer a later value took over
        self.pool = {}          # (shape, dtype) -> [value] dead owned buffers
        self.tags = {}          # value -> frozenset of its buffer's tags
        self.kept = []          # (shape, dtype name) of each buffer kept between calls
        self.escapes = set(self.never_dies)
        if keep_between_calls:
            # an output, and whatever an output may alias, escapes the call
            for v in reversed(ir.topo_order(g)):
                d = g.nodes[v]
                if v in self.escapes and d["op"] not in ("input", "const") and (
                        d["op"] == "proj" or d["op"] in CONTROL_FLOW
                        or primitives.get(d["op"]).aliases_operands):
                    self.escapes.update(ir.operands(g, v))

    def _key(self, v):
        d = self.g.nodes[v]
        return (d["shape"], str(d["dtype"]))

    def _fits(self, v, u, need):
        """May value v (escaping or not) be written into u's buffer, which
        must carry the tags ``need``?"""
        tags = self.tags.get(u, frozenset())
        return need <= tags and not ("kept" in tags and v in self.escapes)

    def take(self, v, i, inplace=(), need=frozenset()):
        """The value whose buffer v (computed by statement i) is written
        into, or None: an operand in ``inplace`` dying at statement i, else
        a pooled dead buffer of the same shape and dtype whose tags include
        ``need``."""
        key = self._key(v)
        for u in inplace:
            if (u in self.owned and self.last_use.get(u) == i and u not in self.never_dies
                    and u not in self.aliased and self._key(u) == key
                    and self._fits(v, u, need)):
                self.owned.discard(u)
                self.handed_on.add(u)  # its buffer lives on as this value
                self.tags[v] = self.tags.get(u, frozenset())
                return u
        free = self.pool.get(key)
        for j in range(len(free or ()) - 1, -1, -1):
            u = free[j]
            if self._fits(v, u, need):
                del free[j]
                self.tags[v] = self.tags.get(u, frozenset())
                return u
        return None

    def own(self, v, tags=()):
        """v is a fresh result of ours (or lives in a buffer ``take``
        gave it): its buffer may be reused once it is dead."""
        if tags:
            self.tags[v] = self.tags.get(v, frozenset()) | frozenset(tags)
        if v not in self.aliased:
            self.owned.add(v)

    def may_keep(self, v):
        """May v's buffer be kept between calls (v never escapes)?"""
        return v not in self.escapes

    def keep(self, v):
        """A new buffer for v kept between calls: its index among ``kept``."""
        d = self.g.nodes[v]
        self.kept.append((tuple(d["shape"]), np.dtype(d["dtype"]).name))
        self.own(v, ("kept", "c_order"))
        return len(self.kept) - 1

    def release(self, ops, i):
        """Pool the buffers of the operands dying at statement i; the
        values among them to free at once (large, not pooled, not views)."""
        dels = []
        g = self.g
        for u in set(ops):
            if self.last_use.get(u) != i or u in self.never_dies or \
                    g.nodes[u]["op"] in ("const", "input"):
                continue
            if u in self.owned:
                self.owned.discard(u)
                self.pool.setdefault(self._key(u), []).append(u)
            elif u not in self.aliased and u not in self.handed_on and u not in self.views and \
                    g.nodes[u].get("shape") is not None and \
                    int(np.prod(g.nodes[u]["shape"])) >= DEL_MIN_ELEMENTS:
                dels.append(u)
        return dels


# --- loops and branches: a body is a function of its own ---------------------------------

def _body_function(module, body, kind):
    """The name of the module-level function that computes ``body`` (one
    per distinct body; nested bodies add theirs)."""
    name = module.bodies.get(body.key)
    if name is None:
        from tracegrad import passes
        g = ir.from_trace(body)
        passes.optimize(g)
        name = f"_{kind}{len(module.bodies)}"
        module.bodies[body.key] = name
        args = [f"x{i}" for i in range(len(body.inputs))]
        module.lower_body(g, name, args, f"{kind} body ({body.key[:12]})")
    return name


# --- loops over tiny arrays: a body of Python float arithmetic ----------------------------
# A NumPy call costs about half a microsecond whatever its size, so a loop
# over a float64[3] state (an ODE step, the projectile of benchmarks/loops.py)
# spends its time in call overhead.  When every value of a scan body has at
# most SCALAR_MAX elements, all float64, and every op is one of _SCALAR_OPS,
# the NumPy target also prints the body as straight-line arithmetic on
# Python floats and runs the loop on tuples of floats.  +, -, *, / and sqrt
# are IEEE's, as in NumPy; exp/log/sin/cos/tanh/log1p/expm1 are the C
# library's (NumPy's own SIMD versions may differ in the last bit); a sum
# adds in NumPy's order for fewer than 8 elements (0.0 + a0 + a1 + ...).
# Python raises where NumPy returns inf or nan (math.exp overflow, sqrt or
# log of a negative, division by zero): the loop then runs again from its
# start on the array body.

SCALAR_MAX = 7
_SCALAR_OPS = {
    "add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})", "div": "({0} / {1})",
    "neg": "(-{0})", "square": "({0} * {0})", "sqrt": "math.sqrt({0})", "exp": "math.exp({0})",
    "log": "math.log({0})", "sin": "math.sin({0})", "cos": "math.cos({0})",
    "tanh": "math.tanh({0})", "log1p": "math.log1p({0})", "expm1": "math.expm1({0})",
}
_SCALAR_VIEWS = ("reshape", "broadcast_to")


def _float_literal(x):
    x = float(x)
    return repr(x) if math.isfinite(x) else f"float({str(x)!r})"


def _scalar_body(g, name, doc):
    """The body graph ``g`` as a function of Python floats (one parameter per
    element of each input, in C order; one result per element of each
    output), or None when it does not qualify."""
    f64 = np.dtype(np.float64)
    inputs = g.graph["inputs"]
    for v, d in g.nodes(data=True):
        size = int(np.prod(d["shape"])) if d.get("shape") is not None else None
        if size is None or size > SCALAR_MAX or d.get("avals") is not None:
            return None
        if d["op"] == "input":
            if d["dtype"] != f64 and g.out_degree(v):
                return None          # an integer loop index that the body reads
            continue
        if d["dtype"] != f64:
            return None
        if d["op"] == "const":
            if np.asarray(d["value"]).dtype.kind not in "fiub":
                return None
            continue
        if d["op"] == "sum":
            if tuple(d["attrs"]["axis"]) != tuple(range(len(g.nodes[ir.operands(g, v)[0]]["shape"]))):
                return None
        elif d["op"] not in _SCALAR_OPS and d["op"] not in _SCALAR_VIEWS:
            return None
    elems = {}                      # node -> list of Python expressions, C order
    params = []
    for i, v in enumerate(inputs):
        d = g.nodes[v]
        names = [f"x{i}_{j}" for j in range(int(np.prod(d["shape"])))]
        params += names
        elems[v] = names
    body = []

    def operand(u, shape):
        """u's elements broadcast to ``shape``, in C order."""
        du = g.nodes[u]
        if du["op"] == "const":
            vals = [_float_literal(x) for x in np.asarray(du["value"], dtype=np.float64).ravel()]
            ushape = np.shape(du["value"])
        else:
            vals, ushape = elems[u], du["shape"]
        if tuple(ushape) == tuple(shape):
            return vals
        idx = np.broadcast_to(np.arange(len(vals)).reshape(ushape), shape).ravel()
        return [vals[k] for k in idx]

    def elems_of(u):
        return operand(u, g.nodes[u]["shape"]) if g.nodes[u]["op"] == "const" else elems[u]

    for v in ir.topo_order(g):
        d = g.nodes[v]
        op = d["op"]
        if op in ("input", "const"):
            continue
        ops = ir.operands(g, v)
        shape = tuple(d["shape"])
        if op in _SCALAR_VIEWS:
            elems[v] = operand(ops[0], shape) if op == "broadcast_to" else elems_of(ops[0])
            continue
        if op == "sum":
            src = elems_of(ops[0])
            exprs = [f"(0.0 + {' + '.join(src)})" if src else "0.0"]
        else:
            cols = [operand(u, shape) for u in ops]
            exprs = [_SCALAR_OPS[op].format(*parts) for parts in zip(*cols)]
        names = [f"t{v}_{j}" for j in range(len(exprs))]
        for nm, e in zip(names, exprs):
            body.append({"code": f"{nm} = {e}", "comment": f"%{v} {op}", "source": None})
        elems[v] = names

    outs = [x for v in g.graph["outputs"] for x in elems_of(v)]
    returns = "(" + ", ".join(outs) + ("," if len(outs) == 1 else "") + ")"
    return {"name": name, "args": params, "doc": doc, "body": body, "returns": returns}


class _ScalarFunction:
    """A scalar loop body in the module's function list (as Lowered)."""
    def __init__(self, fn):
        self.name, self.args, self.doc = fn["name"], fn["args"], fn["doc"]
        self.body, self.returns = fn["body"], fn["returns"]


def _scalar_function(module, body, kind):
    """The name of the scalar version of ``body`` for the NumPy target, or
    None (another target, or a body that does not qualify)."""
    if not isinstance(module, Module):
        return None
    key = ("scalar", body.key)
    if key not in module.bodies:
        from tracegrad import passes
        g = ir.from_trace(body)
        passes.optimize(g)
        name = f"_{kind}_floats{len(module.bodies)}"
        fn = _scalar_body(g, name, f"{kind} body ({body.key[:12]}) on Python floats")
        module.bodies[key] = None if fn is None else name
        if fn is not None:
            module.needs_math = True
            module.extra.append(_ScalarFunction(fn))
    return module.bodies[key]


def _scan_scalar_lines(var, args, d, module, fn, array_lines):
    """The loop on tuples of floats, falling back to ``array_lines`` (the
    array loop, indented under ``except``) where Python raises."""
    a = d["attrs"]
    body, n, nc, nx = a["body"], a["length"], a["n_carry"], a["n_xs"]
    start = a["start"]
    in_av = body.in_avals[1:] if start is not None else body.in_avals
    sizes = [int(np.prod(av.shape)) for av in in_av]
    c_sizes, x_sizes = sizes[:nc], sizes[nc:nc + nx]
    n_c = sum(c_sizes)
    out_av = body.out_avals
    k = f"_{var}_k"
    c, r = f"_{var}_fc", f"_{var}_fr"
    lines = ["try:"]
    flat = [f"*np.ravel({x}).tolist()" for x in args[:nc]]
    lines.append(f"    {c} = ({', '.join(flat)}{',' if len(flat) == 1 else ''})")
    # per-step inputs and outputs live in flat array('d') buffers: 8 bytes a
    # float (a list of tuples of floats takes about 30)
    module.needs_array = True
    xrows = [f"_{var}_fx{j}" for j in range(nx)]
    for x, name in zip(args[nc:nc + nx], xrows):
        lines.append(f"    {name} = array.array('d', np.ravel({x}).tobytes())")
    consts = [f"*np.ravel({x}).tolist()" for x in args[nc + nx:]]
    ys = f"_{var}_fys"
    n_y = len(out_av) - nc
    if n_y:
        lines.append(f"    {ys} = array.array('d')")
    rng = f"range({n - 1}, -1, -1)" if a["reverse"] else f"range({n})"
    lines.append(f"    for {k} in {rng}:")
    call = ([f"{k}"] if start is not None else []) + [f"*{c}"] + [
        f"*{x}[{k} * {m}:{k} * {m} + {m}]" for x, m in zip(xrows, x_sizes)]
    if consts:
        lines.insert(1, f"    _{var}_fk = ({', '.join(consts)},)")
        call.append(f"*_{var}_fk")
    lines.append(f"        {r} = {fn}({', '.join(call)})")
    lines.append(f"        {c} = {r}[:{n_c}]")
    if n_y:
        lines.append(f"        {ys}.extend({r}[{n_c}:])")
    m_y = sum(int(np.prod(av.shape)) for av in out_av[nc:])
    if n_y:
        lines.append(f"    _{var}_fy = np.frombuffer({ys}, dtype=np.float64).reshape(({n}, {m_y}))")
        if a["reverse"]:     # appended from the last step to the first
            lines.append(f"    _{var}_fy = _{var}_fy[::-1]")
    res, off = [], 0
    for j, av in enumerate(out_av[:nc]):
        m = int(np.prod(av.shape))
        res.append(f"_{var}_c{j}")
        lines.append(f"    {res[-1]} = np.array({c}[{off}:{off + m}], dtype=np.float64)"
                     f".reshape({tuple(av.shape)!r})")
        off += m
    off = 0
    for j, av in enumerate(out_av[nc:]):
        m = int(np.prod(av.shape))
        res.append(f"_{var}_y{j}")
        lines.append(f"    {res[-1]} = np.ascontiguousarray(_{var}_fy[:, {off}:{off + m}])"
                     f".reshape({(n,) + tuple(av.shape)!r})")
        off += m
    lines.append(f"    {var} = ({', '.join(res)}{',' if len(res) == 1 else ''})")
    lines.append("except (ArithmeticError, ValueError):   # inf or nan: NumPy's arrays say it")
    lines += ["    " + line for line in array_lines]
    return lines


def _scan_lines(var, args, d, module):
    lines = _scan_array_lines(var, args, d, module)
    a = d["attrs"]
    fn = _scalar_function(module, a["body"], "scan_body")
    return lines if fn is None else _scan_scalar_lines(var, args, d, module, fn, lines)


def _scan_array_lines(var, args, d, module):
    a = d["attrs"]
    body, n, nc, nx = a["body"], a["length"], a["n_carry"], a["n_xs"]
    start = a["start"]
    fn = _body_function(module, body, "scan_body")
    carry = [f"_{var}_c{j}" for j in range(nc)]
    xs = args[nc:nc + nx]
    consts = args[nc + nx:]
    n_y = len(body.outputs) - nc
    ys = [f"_{var}_y{j}" for j in range(n_y)]
    k = f"_{var}_k"
    lines = []
    if carry:
        lines.append(f"{', '.join(carry)} = {', '.join(args[:nc])}")
    for y, av in zip(ys, body.out_avals[nc:]):
        lines.append(f"{y} = np.empty({(n,) + tuple(av.shape)!r}, dtype={scalar_type(av.dtype)})")
    rng = f"range({n - 1}, -1, -1)" if a["reverse"] else f"range({n})"
    lines.append(f"for {k} in {rng}:")
    call_args = ([f"np.int64({k} + {start})" if start else f"np.int64({k})"]
                 if start is not None else []) + carry + [f"{x}[{k}]" for x in xs] + consts
    outs = carry + [f"_{var}_o{j}" for j in range(n_y)]
    lhs = ", ".join(outs) + ("," if len(outs) == 1 else "")
    lines.append(f"    {lhs} = {fn}({', '.join(call_args)})")
    for j, y in enumerate(ys):
        lines.append(f"    {y}[{k}] = _{var}_o{j}")
    res = carry + ys
    lines.append(f"{var} = ({', '.join(res)}{',' if len(res) == 1 else ''})")
    return lines


def _while_lines(var, args, d, module):
    a = d["attrs"]
    nc, n_cc = a["n_carry"], a["n_cc"]
    cf = _body_function(module, a["cond"], "while_cond")
    bf = _body_function(module, a["body"], "while_body")
    carry = [f"_{var}_c{j}" for j in range(nc)]
    cc, bc = args[nc:nc + n_cc], args[nc + n_cc:]
    lhs = ", ".join(carry) + ("," if nc == 1 else "")
    return [f"{lhs} = {', '.join(args[:nc])}{',' if nc == 1 else ''}",
            f"while {cf}({', '.join(carry + cc)})[0]:",
            f"    {lhs} = {bf}({', '.join(carry + bc)})",
            f"{var} = ({lhs})"]


def _while_fwd_lines(var, args, d, module):
    lines = _while_lines(var, args, d, module)
    nc = d["attrs"]["n_carry"]
    carry = [f"_{var}_c{j}" for j in range(nc)]
    tape = f"_{var}_tape"
    return [lines[0], f"{tape} = []", lines[1],
            f"    {tape}.append(({', '.join(carry)}{',' if nc == 1 else ''}))", lines[2],
            f"{var} = ({', '.join(carry + [tape])},)"]


def _while_bwd_lines(var, args, d, module):
    a = d["attrs"]
    n_ct, nc = a["n_ct"], a["n_carry"]
    fn = _body_function(module, a["bwd"], "while_bwd_body")
    ct = [f"_{var}_c{j}" for j in range(n_ct)]
    step = [f"_{var}_s{j}" for j in range(nc)]
    lhs = ", ".join(ct) + ("," if n_ct == 1 else "")
    return [f"{lhs} = {', '.join(args[1:1 + n_ct])}{',' if n_ct == 1 else ''}",
            f"for {', '.join(step)}{',' if nc == 1 else ''} in reversed({args[0]}):",
            f"    {lhs} = {fn}({', '.join(ct + step + list(args[1 + n_ct:]))})",
            f"{var} = ({lhs})"]


def _cond_lines(var, args, d, module):
    branches = d["attrs"]["branches"]
    fns = [_body_function(module, b, "branch") for b in branches]
    table = "(" + ", ".join(fns) + ("," if len(fns) == 1 else "") + ")"
    return [f"{var} = {table}[min(max(int({args[0]}), 0), {len(fns) - 1})]"
            f"({', '.join(args[1:])})"]


def control_flow_statements(body, v, var, args, d, module, prev_src):
    """Append a loop or branch node's statements to ``body`` (every target
    prints them alike: the loop runs on the host), all but the last, which
    is returned with the source line now in effect."""
    lines = CONTROL_FLOW[d["op"]](var, args, d, module)
    src = _source_comment(d.get("loc"))
    for k, line in enumerate(lines[:-1]):
        body.append({"code": line, "comment": f"%{v} {d['op']}" if k == 0 else None,
                     "source": src if (k == 0 and src != prev_src) else None})
    return lines[-1], (src if len(lines) > 1 else prev_src)


CONTROL_FLOW = {"scan": _scan_lines, "while": _while_lines, "cond": _cond_lines,
                "while_fwd": _while_fwd_lines, "while_bwd": _while_bwd_lines}


class Module:
    """Collects helpers and constants shared by the functions of one module."""

    def __init__(self):
        self.bodies = {}    # body key -> function name
        self.extra = []     # Lowered bodies of loops and branches
        self.needs_array = False   # the array module (loops on Python floats)
        self.helpers = []
        self._helper_names = set()
        self.constants = []
        self._const_names = {}
        self.needs_base64 = False
        self.needs_math = False

    def lower_body(self, g, name, args, doc):
        """A loop or branch body's graph as one more function of the module."""
        self.extra.append(Lowered(g, name, args, doc, self, internal=True))

    def helper(self, name):
        if name in self._helper_names:
            return
        from tracegrad import runtime_numpy
        fn = getattr(runtime_numpy, name)
        self._helper_names.add(name)
        # helpers may call other helpers
        for dep in getattr(runtime_numpy, "HELPER_DEPS", {}).get(name, ()):
            self.helper(dep)
        src = inspect.getsource(fn)
        if "math." in src:
            self.needs_math = True
        self.helpers.append(src.rstrip())

    def constant(self, node, arr):
        key = (arr.dtype.str, arr.shape, hashlib.sha1(np.ascontiguousarray(arr).tobytes()).hexdigest())
        name = self._const_names.get(key)
        if name is None:
            name = f"_c{len(self._const_names)}"
            self._const_names[key] = name
            code, b64 = _const_code(arr)
            self.needs_base64 |= b64
            self.constants.append({"name": name, "code": code, "node": node,
                                   "desc": f"{arr.dtype}{list(arr.shape)}"})
        return name


def generate_numpy(functions, source="", transform="", key=""):
    """Source of one module holding a NumPy function per (graph, name, arg
    names, docstring) in ``functions``."""
    module = Module()
    lowered = [Lowered(g, name, args, doc, module) for g, name, args, doc in functions]
    lowered = module.extra + lowered
    return _jinja().get_template("numpy_module.py.j2").render(
        version=__version__, source=source, transform=transform, key=key,
        needs_math=module.needs_math, needs_base64=module.needs_base64,
        needs_array=module.needs_array,
        helpers=module.helpers, constants=module.constants,
        functions=[{"name": f.name, "args": f.args, "doc": f.doc, "body": f.body,
                    "returns": f.returns} for f in lowered])
