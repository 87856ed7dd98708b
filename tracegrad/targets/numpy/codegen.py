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

import math

import numpy as np

from tracegrad._version import __version__
from tracegrad.ir import graph as ir
from tracegrad.ops import primitives
from tracegrad.targets import pysource, templates
from tracegrad.targets.pysource import (CONTROL_FLOW, BufferPlanner, control_flow_statements,
                                        function_name, identifiers, inplace_operands,
                                        operand_expr, source_comment, ufunc_of)

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
        order = [v for v in ir.memory_order(g) if g.nodes[v]["op"] not in ("input",)]
        outputs = g.graph["outputs"]
        names = {}
        for v, a in zip(g.graph["inputs"], self.args):
            names[v] = a
        plan = BufferPlanner(g, order, [ir.operands(g, v) for v in order], statement_per_node=True)
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
                    e = prim.numpy.format(*args, **{k: pysource.attr_source(x)
                                                    for k, x in d["attrs"].items()})
                for h in prim.helpers:
                    if h + "(" in e:  # only the helpers this statement calls
                        module.helper(h)
                code = f"{var} = {e}"
                ufunc = ufunc_of(prim, len(ops))
                if ufunc and d.get("shape") and d.get("avals") is None:
                    buf = plan.take(v, i, inplace_operands(prim, ufunc, ops))
                    if buf is not None:
                        code = f"{var} = {ufunc}({', '.join(args)}, out={names[buf]})"
                    plan.own(v)
            names[v] = var
            src = source_comment(d.get("loc"))
            self.body.append({"code": code, "comment": comment,
                              "source": src if src != prev_src else None})
            prev_src = src
            # values that die here: pool their buffers or free them
            for u in plan.release(ops, i):
                self.body.append({"code": f"del {names[u]}", "comment": "dead: free its memory",
                                  "source": None})
        rets = [expr(v) if g.nodes[v]["op"] in ("const", "input") else names[v] for v in outputs]
        self.returns = "(" + ", ".join(rets) + ("," if len(rets) == 1 else "") + ")"


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
    """The name of the scalar version of ``body``, or None (a body that
    does not qualify)."""
    key = ("scalar", body.key)
    if key not in module.bodies:
        from tracegrad.ir import passes
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


class NumpyModule(pysource.Module):
    """The NumPy target's module: a body is one more NumPy function, and a
    scan over tiny float64 arrays also runs on Python floats."""

    def lower_body(self, g, name, args, doc):
        self.extra.append(Lowered(g, name, args, doc, self, internal=True))

    def scan_statements(self, var, args, d, array_lines):
        fn = _scalar_function(self, d["attrs"]["body"], "scan_body")
        return array_lines if fn is None else _scan_scalar_lines(var, args, d, self, fn,
                                                                  array_lines)


def generate_numpy(functions, source="", transform="", key=""):
    """Source of one module holding a NumPy function per (graph, name, arg
    names, docstring) in ``functions``."""
    module = NumpyModule()
    lowered = [Lowered(g, name, args, doc, module) for g, name, args, doc in functions]
    lowered = module.extra + lowered
    return templates.environment().get_template("numpy_module.py.j2").render(
        version=__version__, source=source, transform=transform, key=key,
        needs_math=module.needs_math, needs_base64=module.needs_base64,
        needs_array=module.needs_array,
        helpers=module.helpers, constants=module.constants,
        functions=[{"name": f.name, "args": f.args, "doc": f.doc, "body": f.body,
                    "returns": f.returns} for f in lowered])

