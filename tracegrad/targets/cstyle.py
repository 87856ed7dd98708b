"""The C-style kernel renderer the native and CUDA targets share.

``passes.fusion_groups`` (the one cost function that decides fusion)
partitions a graph's elementwise nodes into groups; each group becomes one
kernel (``Kernel``): a loop over the group's iteration space whose shapes,
strides and size are compile-time constants, one ``const`` line per graph
node, each tagged ``// %id op`` and grouped under the user's source line;
a full ``sum`` of a value the group computes becomes the kernel's epilogue.
``Function`` lowers a graph to a Python driver: kernel launches in a valid
order, and the registry's library emitters for everything else.

The renderer owns no target: what differs between targets is a ``Target``
table (the few strings the shared lowering prints) and a ``Function``
subclass (the launch, the library emitter); the loop header, math prelude
and entry live in each target's template.  A new C-like target is one more
table and subclass beside this module.
"""
from __future__ import annotations

import math
import re

import numpy as np

from tracegrad.ir import graph as ir
from tracegrad.ops import primitives
from tracegrad.ops import symbolic
from tracegrad.ops.symbolic import dim, numel   # noqa: F401 -- the generators' helpers
from tracegrad.targets import pysource
from tracegrad.targets.pysource import (CONTROL_FLOW, control_flow_statements, function_name,
                                        identifiers)


# NumPy dtype name -> C type of a kernel value.
CTYPES = {
    "float32": "float", "float64": "double", "bool": "bool",
    "int8": "signed char", "uint8": "unsigned char", "int16": "short",
    "uint16": "unsigned short", "int32": "int", "uint32": "unsigned int",
    "int64": "long long", "uint64": "unsigned long long",
}


def ctype(dtype) -> str:
    return CTYPES[np.dtype(dtype).name]


# int64 against uint64, as NumPy compares them (exactly), not as C does
# (the signed one converted to unsigned) nor through their common float64
# (53 bits: 2**53 + 1 == 2**53): s OP u for a signed s and an unsigned u
_MIXED = {"less": "({s} < 0 || (unsigned long long)({s}) < {u})",
          "less_equal": "({s} < 0 || (unsigned long long)({s}) <= {u})",
          "greater": "({s} >= 0 && (unsigned long long)({s}) > {u})",
          "greater_equal": "({s} >= 0 && (unsigned long long)({s}) >= {u})",
          "equal": "({s} >= 0 && (unsigned long long)({s}) == {u})",
          "not_equal": "({s} < 0 || (unsigned long long)({s}) != {u})"}
_MIRRORED = {"less": "greater", "less_equal": "greater_equal", "greater": "less",
             "greater_equal": "less_equal", "equal": "equal", "not_equal": "not_equal"}


def _mixed_comparison(op, operands):
    """The exact C comparison of an int64 and a uint64 operand ((text,
    dtype) each), or None for other ops and dtypes."""
    if op not in _MIXED or len(operands) != 2 or any(dt is None for _, dt in operands):
        return None
    (a, da), (b, db) = operands
    kinds = (np.dtype(da).name, np.dtype(db).name)
    if kinds == ("int64", "uint64"):
        return _MIXED[op].format(s=a, u=b)
    if kinds == ("uint64", "int64"):
        return _MIXED[_MIRRORED[op]].format(s=b, u=a)
    return None


_FLOAT_ONLY_RE = re.compile(r"\b(fabs|fmax|fmin|fmod|floor|ceil|trunc|rint)\(")
_INTEGER_FORMS = {"fabs": "tg_iabs(", "fmax": "tg_imax(", "fmin": "tg_imin(", "fmod": "tg_ifmod(",
                  "floor": "(", "ceil": "(", "trunc": "(", "rint": "("}
_UNSIGNED_FORMS = dict(_INTEGER_FORMS, fabs="(", fmod="tg_ufmod(")


def integer_math(expr, dtype):
    """A registry expression computed in integer dtype ``dtype``: fabs, fmax,
    fmin, fmod, floor, ceil, trunc and rint are double functions (53 bits: np.abs
    or np.floor of an int64 above 2**53 came out rounded): tg_integer.h's
    helpers, or the operand itself (an unsigned integer's abs, an integer's
    floor)."""
    kind = np.dtype(dtype).kind
    if kind in "iub":
        forms = _INTEGER_FORMS if kind == "i" else _UNSIGNED_FORMS
        return _FLOAT_ONLY_RE.sub(lambda m: forms[m.group(1)], expr)
    return expr


def c_literal(value, dtype) -> str:
    """C++ source for the scalar ``value`` as a constant of ``dtype``.

    Infinities and NaN are spelled with the bit-pattern intrinsics both
    NVRTC and nvcc provide (NVRTC has no <math.h>, so no INFINITY)."""
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return "true" if bool(value) else "false"
    if dt.kind in "iu":
        v = value if isinstance(value, symbolic.SymInt) else int(value)
        return f"{v}LL" if dt.kind == "i" else f"{v}ULL"
    if isinstance(value, symbolic.Sym) and dt == np.float64:
        # a number from sizes (a mean's 1/n): finite and 0 or more at every
        # size its plan serves (runtime.shape_plan), so repr spells it
        return repr(value * 1.0)
    v = float(value)
    single = dt == np.float32
    if math.isnan(v):
        return "__int_as_float(0x7fc00000)" if single else "__longlong_as_double(0x7ff8000000000000LL)"
    if math.isinf(v):
        if single:
            return "__int_as_float(0x7f800000)" if v > 0 else "__int_as_float(0xff800000)"
        return ("__longlong_as_double(0x7ff0000000000000LL)" if v > 0
                else "__longlong_as_double(0xfff0000000000000LL)")
    if single:
        with np.errstate(over="ignore"):
            v = float(np.float32(v))
        if math.isinf(v):  # a double beyond float's range, as NumPy would round it
            return "__int_as_float(0x7f800000)" if v > 0 else "__int_as_float(0xff800000)"
    text = repr(v)
    if "e" not in text and "." not in text:
        text += ".0"
    return f"({text}f)" if single and text.startswith("-") else \
        (f"{text}f" if single else (f"({text})" if text.startswith("-") else text))


def _attr_literal(value):
    """An attribute of a ``cuda=`` expression (``{decimals}``, ``{nan}``)."""
    if isinstance(value, (bool, np.bool_)):
        return "true" if value else "false"
    if isinstance(value, (int, np.integer)):
        return f"{int(value)}"
    if isinstance(value, (float, np.floating)):
        return c_literal(value, np.float64)
    raise NotImplementedError(f"codegen (CUDA): cannot print the attribute value {value!r} "
                              f"in a kernel")


def c_identifier(name) -> str:
    """An ASCII C identifier for a user-supplied name (never a keyword,
    since it always carries a prefix where it is used)."""
    s = re.sub(r"[^0-9A-Za-z_]", "_", str(name))
    return s or "arg"


# --- the per-target table of the C-style renderer -------------------------------------------

class Target:
    """What differs between the targets of the C-style renderer (STYLE.md, 5):
    everything else (parameters, loads, index arithmetic, one line per node,
    stores, accumulators) is shared.  The loop header, epilogue, math
    prelude and entry live in each target's template; this table holds the
    few strings the shared lowering prints.

    name: the target's name in messages; acc_store: the epilogue line that
    stores accumulator ``{acc}`` to parameter ``{param}``; math: a function
    mapping (expression, compute dtype) to the target's spelling (C's float
    functions carry an ``f``; CUDA's are overloaded); pass_contiguous: the
    driver expression of an array argument (``{arg}``, ``{dtype}``);
    library: the array library of the driver's other calls, named in its
    comments; expression: a function mapping (op name, the registry's
    expression template, per operand its value where it is a compile-time
    literal, else None, the compute dtype) to the template this target
    prints (default: the registry's), for the ops whose registry expression is slow or not
    NumPy's on this target."""

    def __init__(self, name, acc_store, pass_array, library, math=None, expression=None):
        self.name = name
        self.library = library
        self.acc_store = acc_store
        self.pass_array = pass_array
        self.math = math or (lambda expr, dtype: expr)
        self.expression = expression or (lambda op, template, literal, compute: template)


class Kernel:
    """One fused group rendered as a kernel, and how the driver calls it."""

    def __init__(self, name, group, g, names, const_name, target):
        self.name = name
        self.target = target
        self.group = group
        self.shape = tuple(g.nodes[group.nodes[0]]["shape"])     # (a row block's, in blocks)
        self.n = numel(self.shape)
        self.params = []      # C parameter declarations
        self.param_info = []  # per parameter: (C type, elements, written by the kernel)
        self.args = []        # driver expressions, one per parameter
        self.arg_nodes = []   # the node each parameter passes
        self.hoisted = []     # loads of one-element inputs, before the loop
        self.coords = []      # index arithmetic at the top of the loop
        self.body = []        # {"code", "comment", "source"} inside the loop
        self.stores = []
        self.accs = []        # fused reductions: {"decl", "update", "store"}
        self.outputs = []     # (node, driver variable) stored by this kernel
        self.partials = []    # (reduction node, partial buffer variable, dtype)
        self._same_index = {}  # operand read at element i only -> its parameter's index
        self._out_param = {}   # output -> its parameter's index
        self._lower(g, names, const_name)

    def same_index_operands(self, g):
        """The operands this kernel reads at the very element it stores
        (same shape, no broadcast): an output may be written over one of
        them, since the loop reads element i before it stores element i."""
        return list(self._same_index)

    def never_written_over(self, nodes):
        """No output may take the buffer of these operands (the native
        driver's row blocks: a later block's product reads them)."""
        for u in nodes:
            self._same_index.pop(u, None)

    def shares_buffer(self, u, v):
        """Output v is written over operand u: the two parameters point
        into one buffer, so neither may be declared ``__restrict__``."""
        for j in (self._same_index[u], self._out_param[v]):
            self.params[j] = self.params[j].replace(" __restrict__", "")

    def describe(self, g):
        ops = [f"%{v} {g.nodes[v]['op']}" for v in self.group.nodes]
        if len(ops) > 6:
            ops = ops[:3] + [f"... {len(ops) - 6} more ..."] + ops[-3:]
        red = "".join(f", %{r} sum (fused epilogue)" for r in self.group.reductions)
        return f"{len(self.group.nodes)} elementwise nodes ({', '.join(ops)}){red}"

    def _lower(self, g, names, const_name):
        members = set(self.group.nodes)
        S = self.shape
        k = len(S)
        inputs = {}     # source node -> kernel variable
        taken = set()   # parameter names
        coord_used = set()

        def coord(j):
            coord_used.add(j)
            return f"c{j}"

        def offset(src_shape):
            if tuple(src_shape) == S:
                return "i"
            if numel(src_shape) == 1:
                return "0"
            lead = k - len(src_shape)
            terms, stride = [], 1
            for j in reversed(range(len(src_shape))):
                if src_shape[j] != 1:
                    c = coord(lead + j)
                    terms.append(c if stride == 1 else f"{c} * {stride}LL")
                stride *= dim(src_shape[j])
            return " + ".join(reversed(terms))

        def load(u):
            """The kernel variable holding external array operand u."""
            du = g.nodes[u]
            src = u
            if du["op"] == "broadcast_to":      # read the source through broadcast strides
                src = ir.operands(g, u)[0]
            if src in inputs:
                return inputs[src]
            ds = g.nodes[src]
            var = f"v{src}"
            inputs[src] = var
            if ds["op"] == "const":
                pname = f"c_{const_name(src)}"
            elif ds["op"] == "input":
                pname = f"in_{c_identifier(names[src])}"
            else:
                pname = f"in_t{src}"
            if pname in taken:
                pname = f"{pname}_{src}"
            taken.add(pname)
            ct = ctype(ds["dtype"])
            off = offset(ds["shape"])
            if off == "i" and ds["op"] not in ("const", "input"):
                self._same_index[src] = len(self.params)
            self.params.append(f"const {ct}* __restrict__ {pname}")
            self.param_info.append((ct, numel(ds["shape"]), False))
            arg = names[src] if ds["op"] != "const" else const_name(src)
            self.args.append(self.target.pass_array.format(arg=arg, dtype=ds["dtype"].name))
            self.arg_nodes.append(src)
            line = {"code": f"const {ct} {var} = {pname}[{off}];",
                    "comment": f"%{src} {ds['op'] if ds['op'] != 'input' else 'input ' + names[src]}"
                               f" {ds['dtype']}{list(ds['shape'])}"
                               + (" (broadcast)" if tuple(ds["shape"]) != S else ""),
                    "source": None}
            (self.hoisted if off == "0" else self.body).append(line)
            return var

        def operand(u, compute):
            """(C expression, dtype or None for a weak literal) of operand u."""
            du = g.nodes[u]
            if u in members:
                return f"v{u}", du["dtype"]
            if du["op"] == "const":
                val = du["value"]
                if not isinstance(val, np.ndarray):
                    return c_literal(val, compute), None
                if val.size == 1:
                    return c_literal(val.reshape(()).item(), val.dtype), val.dtype
            return load(u), g.nodes[u]["dtype"] if du["op"] != "broadcast_to" else \
                g.nodes[ir.operands(g, u)[0]]["dtype"]

        prev_src = None
        for v in self.group.nodes:
            d = g.nodes[v]
            prim = primitives.get(d["op"])
            ops = ir.operands(g, v)
            out_dt = np.dtype(d["dtype"])
            if out_dt.kind == "b":
                arr = [g.nodes[u]["dtype"] for u in ops
                       if not (g.nodes[u]["op"] == "const"
                               and not isinstance(g.nodes[u]["value"], np.ndarray))]
                compute = np.result_type(*arr) if arr else out_dt
            else:
                compute = out_dt
            texts, literal, raw = [], [], []
            for u in ops:
                du = g.nodes[u]
                val = du["value"] if u not in members and du["op"] == "const" else None
                if isinstance(val, np.ndarray):
                    val = val.reshape(()).item() if val.size == 1 else None
                literal.append(val)
                text, dt = operand(u, compute)
                raw.append((text, dt))
                if dt is not None and np.dtype(dt).kind == "b" and compute.kind == "f":
                    # a select, not C's conversion of a bool: gcc vectorizes
                    # the select (a count of x == 0 as a sum: 108 -> 11 us
                    # for 1e5 elements), not the conversion
                    text = f"({text} ? {c_literal(1, compute)} : {c_literal(0, compute)})"
                elif dt is not None and np.dtype(dt) != compute:
                    # (a bool too, where the compute type is an integer: the
                    # helpers dispatch on the C type, and _Generic has no bool)
                    text = f"(({ctype(compute)}){text})"
                texts.append(text)
            expr = _mixed_comparison(d["op"], raw)
            if expr is None:
                # only the attributes the expression prints (astype's dtype is not)
                template = self.target.expression(d["op"], prim.cuda, tuple(literal), compute)
                attrs = {key: _attr_literal(val) for key, val in d["attrs"].items()
                         if "{" + key in template}
                expr = self.target.math(integer_math(template.format(*texts, **attrs), compute),
                                        compute)
            src = pysource.source_comment(d.get("loc"))
            self.body.append({"code": f"const {ctype(out_dt)} v{v} = {expr};",
                              "comment": f"%{v} {d['op']}",
                              "source": src if src != prev_src else None})
            prev_src = src

        # values leaving the kernel: graph outputs and operands of nodes
        # outside the group (a fused reduction reads its operand in-kernel)
        fused = set(self.group.reductions)
        outs = set(g.graph["outputs"])
        for v in self.group.nodes:
            users = {w for w in g.successors(v) if w not in members and w not in fused}
            if v in outs or users:
                d = g.nodes[v]
                pname = f"out_t{v}"
                self._out_param[v] = len(self.params)
                self.params.append(f"{ctype(d['dtype'])}* __restrict__ {pname}")
                self.param_info.append((ctype(d["dtype"]), self.n, True))
                self.args.append(f"t{v}")
                self.arg_nodes.append(v)
                self.stores.append({"code": f"{pname}[i] = v{v};", "comment": f"%{v} {d['op']}"})
                self.outputs.append((v, f"t{v}"))
        for r in self.group.reductions:
            d = g.nodes[r]
            (u,) = ir.operands(g, r)
            ct = ctype(d["dtype"])
            pname = f"part_t{r}"
            self.params.append(f"{ct}* __restrict__ {pname}")
            self.param_info.append((ct, numel(d["shape"]), True))
            self.args.append(f"_p{r}")
            self.arg_nodes.append(r)
            self.accs.append({"decl": f"{ct} acc{r} = 0;",
                              "add": f"acc{r} += v{u};",
                              "store": self.target.acc_store.format(param=pname, acc=f"acc{r}"),
                              "comment": f"%{r} sum of %{u}"})
            self.partials.append((r, f"_p{r}", np.dtype(d["dtype"])))

        # index arithmetic: coordinate j of the flat index i in S
        self.coord_axes = sorted(coord_used)
        for j in sorted(coord_used):
            inner = numel(S[j + 1:])
            e = "i" if inner == 1 else f"i / {inner}LL"
            if j > 0:
                e = f"({e}) % {dim(S[j])}LL"
            self.coords.append({"code": f"const long long c{j} = {e};",
                                "comment": f"index along axis {j} of [{', '.join(map(str, S))}]"})

    def render_dict(self, g):
        return {"name": self.name, "describe": self.describe(g), "params": self.params,
                "n": self.n, "shape": list(self.shape), "hoisted": self.hoisted,
                "coords": self.coords, "body": self.body, "stores": self.stores,
                "accs": self.accs}


def schedule(g, groups):
    """Units (a group, or one node) in a valid launch order: a topological
    order of the graph with each group contracted to one unit."""
    import networkx as nx
    order = ir.memory_order(g)   # few buffers alive at once
    index = {v: i for i, v in enumerate(order)}
    unit_of = {}
    for gi, grp in enumerate(groups):
        for v in list(grp.nodes) + list(grp.reductions):
            unit_of[v] = ("g", gi)
    c = nx.DiGraph()
    first = {}
    for v in order:
        u = unit_of.get(v, ("n", v))
        c.add_node(u)
        first[u] = min(first.get(u, index[v]), index[v])
    for a, b in g.edges():
        ua, ub = unit_of.get(a, ("n", a)), unit_of.get(b, ("n", b))
        if ua != ub:
            c.add_edge(ua, ub)
    return list(nx.lexicographical_topological_sort(c, key=lambda u: first[u]))


class Function:
    """One graph lowered to a driver function and its kernels."""

    target = None     # the target's table (a Target)

    def __init__(self, g, name, arg_names, doc, module, prefix, internal=False):
        from tracegrad.ir import passes
        # internal: a loop or branch body's function, named by the generator
        self.name = name if internal else function_name(name)
        self.graph = g
        # possibly raw user text (translation_unit passes the graph's input
        # names): made identifiers where they enter source
        self.args = identifiers(arg_names, reserved={self.name})
        self.doc = doc   # printed through templates.safe_text by the template
        self.body = []
        self.kernels = []
        self.module = module
        names = {v: a for v, a in zip(g.graph["inputs"], self.args)}
        groups = passes.fusion_groups(g)
        fresh = set()   # variables written by our kernels: contiguous, no copy needed

        def expr(u):
            return pysource.operand_expr(g, u, names, module)

        def const_name(u):
            return module.constant(u, g.nodes[u]["value"])

        prev_src = None
        units = schedule(g, groups)
        self._plan_buffers(g, units, groups)
        for unit in units:
            if unit[0] == "g":
                grp = groups[unit[1]]
                kname = f"tg_{prefix}k{len(self.kernels)}"
                for v in grp.nodes:
                    names[v] = f"t{v}"
                kern = Kernel(kname, grp, self._kernel_graph(g, grp), names, const_name,
                              self.target)
                self.kernels.append(kern)
                self._launch(g, kern, kname, module, names, fresh)
                prev_src = None
                continue
            v = unit[1]
            d = g.nodes[v]
            op = d["op"]
            if op in ("input", "const") or self._computed_in_kernel(v, names):
                continue
            ops = ir.operands(g, v)
            args = [expr(u) for u in ops]
            var = f"t{v}"
            comment = f"%{v} {op} ({self.target.library})"
            if op == "proj":
                code = f"{var} = {args[0]}[{d['attrs']['index']}]"
            elif op in CONTROL_FLOW:
                # The loop stays on the host: a Python loop calling the body's
                # own function of this target (its kernels fused as here).
                code, prev_src = control_flow_statements(self.body, v, var, args, d, module,
                                                         prev_src)
                comment = None
            else:
                prim = primitives.get(op)
                emit = self._library_emitter(prim)
                if emit is None:
                    raise NotImplementedError(
                        f"codegen ({self.target.name}): the primitive {op!r} has neither a C "
                        f"expression for a kernel nor a NumPy emitter for a library call, so "
                        f"it cannot be compiled; use it in eager mode or add an emitter to its "
                        f"registry row")
                for h in prim.helpers:
                    module.helper(h)
                if callable(emit):
                    e = emit(args, **d["attrs"])
                else:
                    e = emit.format(*args, **{k: pysource.attr_source(x)
                                              for k, x in d["attrs"].items()})
                code = self._library_statement(g, v, var, e, prim, args, names)
            names[v] = var
            src = pysource.source_comment(d.get("loc"))
            self.body.append({"code": code, "comment": comment,
                              "source": src if src != prev_src else None})
            prev_src = src
        rets = [expr(v) if g.nodes[v]["op"] in ("const", "input") else self._returned(v, names[v])
                for v in g.graph["outputs"]]
        self.returns = "(" + ", ".join(rets) + ("," if len(rets) == 1 else "") + ")"

    def _returned(self, v, name):
        """The expression returning output v, held in variable ``name``."""
        return name

    def _plan_buffers(self, g, units, groups):
        """Called once the launch order (``units``) is known, before any
        statement is printed (the native driver plans its buffers here)."""

    def _kernel_graph(self, g, grp):
        """The graph whose shapes a group's kernel is written for (``g``;
        the native driver's row blocks give it theirs)."""
        return g

    def _computed_in_kernel(self, v, names):
        """Is library node v computed where a later kernel is launched (the
        native driver's row-blocked matrix products)?  Then it has no
        statement of its own; ``names[v]`` is set."""
        return False

    def _library_statement(self, g, v, var, e, prim, args, names):
        """The statement computing node v with the library call ``e``."""
        return f"{var} = {e}"

    @staticmethod
    def _library_emitter(prim):
        """The registry emitter of a node no kernel computes (the target's library call)."""
        raise NotImplementedError

    def _allocate_outputs(self, g, kern, kname, fresh):
        """The comment naming a kernel and the driver statements that
        allocate its outputs (every target's entry starts so)."""
        self.body.append({"code": None, "comment": None,
                          "source": f"kernel {kname}: {kern.describe(g)}"})
        for v, var in kern.outputs:
            d = g.nodes[v]
            self.body.append({"code": f"{var} = np.empty({tuple(d['shape'])!r}, "
                                      f"dtype={d['dtype'].name!r})",
                              "comment": f"%{v} {d['op']}", "source": None})
            fresh.add(var)

    def _launch(self, g, kern, kname, module, names, fresh):
        """The driver statements that allocate a kernel's outputs, launch it
        and finish its reductions (the target's entry)."""
        raise NotImplementedError



class DriverModule(pysource.Module):
    """Helpers, constants and kernel handles shared by a driver's functions."""

    def __init__(self):
        super().__init__()
        self.kernel_handles = []
        self.function_cls = None   # the target's Function
        # the native target's generic structure: no choice made from a size
        # (docs/native.md, "Generic sizes")
        self.generic = False

    def lower_body(self, g, name, args, doc):
        """A loop or branch body's graph as one more function of the driver,
        lowered by the same target (its kernels join the translation unit)."""
        self.extra.append(self.function_cls(g, name, args, doc, self, f"{name.lstrip('_')}_",
                                            internal=True))

    def constant(self, node, arr):
        import base64
        import hashlib
        arr = np.asarray(arr)
        key = (arr.dtype.str, arr.shape, hashlib.sha1(np.ascontiguousarray(arr).tobytes()).hexdigest())
        name = self._const_names.get(key)
        if name is None:
            name = f"_c{len(self._const_names)}"
            self._const_names[key] = name
            if arr.size == 0:   # tolist() of a (0, 2) array is [], which loses the shape
                code = f"np.empty({tuple(arr.shape)!r}, dtype={pysource.scalar_type(arr.dtype)})"
            elif arr.size <= 16 and arr.dtype.kind in "fiub" and np.isfinite(arr).all():
                code = f"np.array({arr.tolist()!r}, dtype={pysource.scalar_type(arr.dtype)})"
            else:
                b = base64.b64encode(np.ascontiguousarray(arr).tobytes()).decode()
                code = (f"np.asarray(_numpy.frombuffer(base64.b64decode({b!r}), "
                        f"dtype={arr.dtype.str!r}).reshape({tuple(arr.shape)!r}))")
                self.needs_base64 = True
            self.constants.append({"name": name, "code": code, "node": node,
                                   "desc": f"{arr.dtype}{list(arr.shape)}"})
        return name

    def kernel(self, kname, n, blocks_per_sm=None):
        handle = f"_{kname}"
        self.kernel_handles.append({"handle": handle, "name": kname, "n": n,
                                    "blocks_per_sm": blocks_per_sm})
        return handle


def lower_all(functions, function_cls):
    """(module, lowered functions, graph of each) for (graph, name, arg names,
    doc) tuples; ``function_cls``: the target's Function."""
    module = DriverModule()
    module.function_cls = function_cls
    prefix_each = len(functions) > 1
    lowered, g_of = [], {}
    for g, name, args, doc in functions:
        f = function_cls(g, name, args, doc, module,
                         f"{c_identifier(name)}_" if prefix_each else "")
        g_of[id(f)] = g
        lowered.append(f)
    for f in module.extra:
        g_of[id(f)] = f.graph
    return module, module.extra + lowered, g_of


def py_string(text):
    """``text`` as a Python string literal: a readable raw triple-quoted
    block when that is exact, ``repr`` otherwise.  In a raw string a
    backslash stays as it is, but one before a quote keeps the quote from
    ending the string, and one at the very end escapes the closing quote;
    Python reads a carriage return in source as a newline."""
    exact = text.replace("\n", "").isprintable()   # each character a newline or printable
    if exact and "'''" not in text and "\\'" not in text and not text.endswith(("'", "\\")):
        return "r'''" + text + "'''"
    return repr(text)
