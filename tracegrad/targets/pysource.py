"""The Python-source renderer every target shares: the NumPy target's
module and the native and CUDA targets' drivers are all plain Python.

Names (user text made identifiers), literals and constants, the user's
source line as a comment, the buffer planner, the statements of loops and
branches (a body is a function of its own; the loop runs on the host) and
``Module``, which collects a generated module's helpers, constants and body
functions.  Each target's module class lowers bodies its own way
(``lower_body``) and may print a scan its own way (``scan_statements``).
"""
from __future__ import annotations

import base64
import builtins
import keyword
import math
import os
import re
import unicodedata

import numpy as np

from tracegrad.ir import graph as ir
from tracegrad.ops import primitives
from tracegrad.ops.symbolic import numel


# Arrays at least this large (32 KiB of float64) are freed (``del``) as soon as they are dead
# and not kept for reuse, to bound peak memory.
DEL_MIN_ELEMENTS = 1 << 12


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
    if isinstance(value, (complex, np.complexfloating)):
        return f"complex({literal(value.real)}, {literal(value.imag)})"
    v = float(value)
    if math.isnan(v):
        return "np.nan"
    if math.isinf(v):
        return "np.inf" if v > 0 else "-np.inf"
    return repr(v)


def attr_source(x):
    """A static attribute in an emitter's format string: its repr, except a
    non-finite float (``pad(constant_values=-inf)`` of max pooling), whose
    repr ``-inf`` names nothing in generated code."""
    if isinstance(x, float) and not math.isfinite(x):
        return literal(x)
    return repr(x)


def scalar_type(dtype):
    """The NumPy scalar type's name in generated code: np.float64, np.bool_
    (np.bool only exists from NumPy 2 on)."""
    dtype = np.dtype(dtype)
    return "np.bool_" if dtype.kind == "b" else f"np.{dtype.name}"


def _const_code(arr):
    t = scalar_type(arr.dtype)
    if arr.ndim == 0 and np.isfinite(arr).all() and arr.dtype.kind in "fiub":
        return f"{t}({literal(arr.item())})", False
    if arr.size == 0:   # tolist() of a (0, 2) array is [], which loses the shape
        return f"np.empty({tuple(arr.shape)!r}, dtype={t})", False
    if arr.size <= 16 and arr.dtype.kind in "fiub" and np.isfinite(arr).all():
        return f"np.array({arr.tolist()!r}, dtype={t})", False
    if arr.size and arr.dtype.kind in "fiub" and np.isfinite(arr.flat[0]) \
            and (arr == arr.flat[0]).all():  # one repeated value (zeros, a seed of ones)
        return f"np.full({tuple(arr.shape)!r}, {literal(arr.flat[0])}, dtype={t})", False
    b = base64.b64encode(np.ascontiguousarray(arr).tobytes()).decode()
    return (f"np.frombuffer(base64.b64decode({b!r}), dtype={arr.dtype.str!r})"
            f".reshape({tuple(arr.shape)!r})"), True


def ufunc_of(prim, n_operands):
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


def source_comment(loc):
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

    def __init__(self, g, order, steps, keep_between_calls=False, statement_per_node=False):
        self.g = g
        # statement_per_node: statement i computes order[i] (the NumPy
        # target), so the planner knows which buffers a later statement can
        # still take, and frees a dead one no later value can reuse
        self.last_made = None
        if statement_per_node:
            self.last_made = {}
            for i, v in enumerate(order):
                if g.nodes[v].get("shape") is not None:
                    self.last_made[self._key(v)] = i
        self.last_use = {}   # the last statement reading each value
        for i, reads in enumerate(steps):
            for u in reads:
                self.last_use[u] = i
        self.never_dies = set(g.graph["outputs"]) | set(g.graph["inputs"])
        self.aliased = set()   # values whose memory someone else may alias
        self.views = set()     # results that are views of another value: nothing to free
        self.views_of = {}     # value -> the views of it
        for v in order:
            d = g.nodes[v]
            if d["op"] == "const":
                continue
            if d["op"] == "proj" or primitives.get(d["op"]).aliases_operands:
                for u in set(ir.operands(g, v)):
                    self.aliased.add(u)
                    self.views_of.setdefault(u, []).append(v)
                self.views.add(v)
        # the statement after which neither a value nor any view of it is
        # read: only then is its buffer free (a view of a value that never
        # dies keeps it alive for good)
        self.dies = {}
        for v in reversed(order):
            last = self.last_use.get(v, -1)
            for w in self.views_of.get(v, ()):
                last = max(last, float("inf") if w in self.never_dies else self.dies.get(w, -1))
            self.dies[v] = last
        self.dying = {}
        for v, i in self.dies.items():
            if i >= 0 and i != float("inf"):
                self.dying.setdefault(i, []).append(v)
        self.owned = set()      # fresh results: ours to overwrite once dead
        self.deleted = set()    # values whose names a ``del`` dropped
        self.holders = {}       # value -> the earlier values whose names hold its buffer
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
            if (u in self.owned and self.last_use.get(u) == i and self.dies.get(u) == i
                    and u not in self.never_dies and self._only_views_dead(u, i)
                    and self._key(u) == key and self._fits(v, u, need)):
                self.owned.discard(u)
                self.handed_on.add(u)  # its buffer lives on as this value
                self.tags[v] = self.tags.get(u, frozenset())
                self.holders[v] = self.holders.get(u, []) + [u]
                return u
        free = self.pool.get(key)
        for j in range(len(free or ()) - 1, -1, -1):
            u = free[j]
            if self._fits(v, u, need):
                del free[j]
                self.tags[v] = self.tags.get(u, frozenset())
                self.holders[v] = self.holders.get(u, []) + [u]
                return u
        return None

    def own(self, v, tags=()):
        """v is a fresh result of ours (or lives in a buffer ``take``
        gave it): its buffer may be reused once it is dead."""
        if tags:
            self.tags[v] = self.tags.get(v, frozenset()) | frozenset(tags)
        if v not in self.views:
            self.owned.add(v)

    def _large(self, u):
        shape = self.g.nodes[u].get("shape")
        return shape is not None and numel(shape) >= DEL_MIN_ELEMENTS

    def _only_views_dead(self, u, i):
        # writing into u at statement i: a view of u read at i would see
        # the new values (a transpose does not read element k at k)
        return all(self.dies.get(w, -1) < i for w in self.views_of.get(u, ()))

    def _view_names(self, u):
        out = []
        for w in self.views_of.get(u, ()):
            out.append(w)
            out += self._view_names(w)
        return out

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
        for u in self.dying.get(i, ()):
            if u in self.never_dies or g.nodes[u]["op"] in ("const", "input", "proj"):
                continue
            if u in self.owned:
                self.owned.discard(u)
                if self.last_made is not None and self.last_made.get(self._key(u), -1) <= i \
                        and self._large(u):
                    # every name that holds the buffer goes, or it stays
                    for w in [u] + self.holders.get(u, []):
                        dels += [w] + self._view_names(w)
                else:
                    self.pool.setdefault(self._key(u), []).append(u)
            elif u not in self.handed_on and u not in self.views and \
                    self._large(u) and not any(g.nodes[w]["op"] == "proj" for w in self._view_names(u)):
                # its views are dead too: drop their names, or they hold it
                dels += [u] + [w for w in self._view_names(u) if w not in self.handed_on]
        if self.last_made is not None:
            # a buffer pooled for a later value of its shape that took
            # another buffer (out= over an operand): none is left to take it
            for key in [k for k in self.pool if self.last_made.get(k, -1) <= i]:
                for u in self.pool.pop(key):
                    if self._large(u):
                        for w in [u] + self.holders.get(u, []):
                            dels += [w] + self._view_names(w)
        # a view of two values is named once
        dels = [u for u in dict.fromkeys(dels) if u not in self.deleted]
        self.deleted.update(dels)
        return dels


def _body_function(module, body, kind):
    """The name of the module-level function that computes ``body`` (one
    per distinct body; nested bodies add theirs)."""
    name = module.bodies.get(body.key)
    if name is None:
        from tracegrad.ir import passes
        g = ir.from_trace(body)
        passes.optimize(g)
        name = f"_{kind}{len(module.bodies)}"
        module.bodies[body.key] = name
        args = [f"x{i}" for i in range(len(body.inputs))]
        module.lower_body(g, name, args, f"{kind} body ({body.key[:12]})")
    return name


def _scan_lines(var, args, d, module):
    # a target may print a scan its own way around the array loop
    return module.scan_statements(var, args, d, _scan_array_lines(var, args, d, module))


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
    step = f"({', '.join(carry)}{',' if nc == 1 else ''})"
    policy = d["attrs"].get("checkpoint")
    if policy:       # some carries kept, the steps between them rerun backwards
        module.helper("_tape_new")
        module.helper("_tape_add")
        start, record = f"{tape} = _tape_new{tuple(policy)!r}", f"    _tape_add({tape}, {step})"
    else:
        start, record = f"{tape} = []", f"    {tape}.append({step})"
    return [lines[0], start, lines[1], record, lines[2],
            f"{var} = ({', '.join(carry + [tape])},)"]


def _while_bwd_lines(var, args, d, module):
    a = d["attrs"]
    n_ct, nc, n_cc = a["n_ct"], a["n_carry"], a["n_cc"]
    fn = _body_function(module, a["bwd"], "while_bwd_body")
    ct = [f"_{var}_c{j}" for j in range(n_ct)]
    step = [f"_{var}_s{j}" for j in range(nc)]
    lhs = ", ".join(ct) + ("," if n_ct == 1 else "")
    steps = f"reversed({args[0]})"
    if a.get("checkpoint"):
        module.helper("_while_steps")
        bf = _body_function(module, a["body"], "while_body")
        n_bc = len(args) - 1 - n_ct - nc - n_cc
        bc = args[1 + n_ct:1 + n_ct + n_bc]
        steps = f"_while_steps({args[0]}, {bf}, ({', '.join(bc)}{',' if len(bc) == 1 else ''}))"
    return [f"{lhs} = {', '.join(args[1:1 + n_ct])}{',' if n_ct == 1 else ''}",
            f"for {', '.join(step)}{',' if nc == 1 else ''} in {steps}:",
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
    src = source_comment(d.get("loc"))
    for k, line in enumerate(lines[:-1]):
        body.append({"code": line, "comment": f"%{v} {d['op']}" if k == 0 else None,
                     "source": src if (k == 0 and src != prev_src) else None})
    return lines[-1], (src if len(lines) > 1 else prev_src)


def _host_lines(var, args, d, module):
    """A host routine over traced callables (SciPy's solvers, integrators and
    optimisers: ``ops/scipy_solvers.py``): each body is a function of the
    module, and the row's emitter prints the call that hands them to SciPy."""
    a = d["attrs"]
    bodies = a["bodies"] if "bodies" in a else (a["body"],)
    fns = tuple(_body_function(module, b, "host_body") for b in bodies)
    prim = primitives.get(d["op"])
    for h in prim.helpers:
        module.helper(h)
    return [f"{var} = {prim.numpy(args, fns=fns, **a)}"]


CONTROL_FLOW = {"scan": _scan_lines, "while": _while_lines, "cond": _cond_lines,
                "while_fwd": _while_fwd_lines, "while_bwd": _while_bwd_lines,
                "scipy_solve": _host_lines, "scipy_quad": _host_lines, "scipy_ode": _host_lines}


class Module:
    """Collects helpers and constants shared by the functions of one module;
    each target's subclass lowers loop and branch bodies (``lower_body``)."""

    def __init__(self):
        self.bodies = {}    # body key -> function name
        self.extra = []     # the lowered bodies of loops and branches
        self.needs_array = False   # the array module (loops on Python floats)
        self.helpers = []
        self._helper_names = set()
        self.constants = []
        self._const_names = {}
        self.needs_base64 = False
        self.needs_math = False

    def lower_body(self, g, name, args, doc):
        """A loop or branch body's graph as one more function of the module."""
        raise NotImplementedError(f"{type(self).__name__} does not lower loop bodies")

    def scan_statements(self, var, args, d, array_lines):
        """The statements of scan node ``d``: the loop over arrays (``array_lines``)."""
        return array_lines

    def helper(self, name):
        if name in self._helper_names:
            return
        from tracegrad.ops import runtime_numpy
        self._helper_names.add(name)
        # helpers may call other helpers
        for dep in getattr(runtime_numpy, "HELPER_DEPS", {}).get(name, ()):
            self.helper(dep)
        src = runtime_numpy.helper_source(name)
        if "math." in src:
            self.needs_math = True
        self.helpers.append(src.rstrip())

    def constant(self, node, arr):
        key = (arr.dtype.str, arr.shape, primitives.content_digest(arr))
        name = self._const_names.get(key)
        if name is None:
            name = f"_c{len(self._const_names)}"
            self._const_names[key] = name
            code, b64 = _const_code(arr)
            self.needs_base64 |= b64
            self.constants.append({"name": name, "code": code, "node": node,
                                   "desc": f"{arr.dtype}{list(arr.shape)}"})
        return name
