"""The native target's whole-graph lowering: a graph whose every node has a
C form becomes ONE C function, called once from Python per graph call.

Applies when every node of the graph, and recursively of its loop bodies,
is one of: an input, a constant, a fusible elementwise node (a registry row
with a ``cuda=`` expression, grouped by ``passes.fusion_groups`` and
rendered by ``cstyle.Kernel`` exactly as the kernel-per-group driver
renders it), a ``sum`` over any axes, ``reshape`` (an alias: every value
is a contiguous C-order buffer), ``broadcast_to``, ``transpose`` and basic
``getitem`` (strided copies; one contiguous run, as ``x[1:-1]``, is read in
place at the top level), ``index_add`` with a basic index (zeros and a
strided scatter), ``zeros_like``, ``scan`` (``tg.fori_loop``, ``tg.scan``
and rolled Python loops: a C ``for`` loop, forward or reverse, with xs
slices read in place and stacked ys written in place) and ``proj`` of a
scan's results.  Anything else (matrix products, gathers, while loops,
branches...) keeps the driver structure of ``codegen.Function``.

Storage: each value is a buffer of its static shape, on the stack while
the function's stack use stays small (``STACK_BYTES``), on the heap
otherwise; a loop body's buffers are declared once, outside the loop.
The graph's outputs are allocated by the entry (the extension's function,
with NumPy's C API, or the driver's ``_whole`` wrapper under ctypes), fresh
each call, and written in place where the value is computed; the entry
returns them (a computed 0-d value as a NumPy scalar).  Large constants are
passed from the driver as arguments after the inputs, small ones are local
arrays.  ``work`` counts the element operations of one call: under
``codegen.GIL_MIN_WORK`` the entry keeps the GIL.
"""
from __future__ import annotations

import re

import numpy as np

from tracegrad.targets import cstyle, pysource
from tracegrad.ir import graph as ir, passes

STACK_BYTES = 1 << 17        # stack budget of one whole function's buffers
SMALL_CONST = 64             # constants up to this many elements are written in C

_VIEWS = ("reshape",)
_COPIES = ("broadcast_to", "transpose", "getitem")


_size = cstyle.numel


def _body_graph(body, memo):
    g = memo.get(body.key)
    if g is None:
        g = ir.from_trace(body)
        passes.optimize(g)
        memo[body.key] = g
    return g


def _basic_index(index):
    return all(it[0] in ("s", "i", "n", "e") for it in index)


def why_not(g, memo=None):
    """None when ``g`` can be one C function, else the first reason why not."""
    memo = {} if memo is None else memo
    for v in g.nodes:
        d = g.nodes[v]
        op = d["op"]
        if op == "scan":
            a = d["attrs"]
            if a["length"] <= 0:
                return "a scan of no steps"
            for av in d["avals"]:
                if str(np.dtype(av.dtype)) not in passes.FUSIBLE_DTYPES or _size(av.shape) == 0:
                    return f"scan %{v}: result {av.dtype}{list(av.shape)}"
            why = why_not(_body_graph(a["body"], memo), memo)
            if why is not None:
                return f"scan %{v} body: {why}"
            continue
        if d.get("avals") is not None:
            return f"%{v} {op}: several results"
        if d.get("dtype") is None or str(d["dtype"]) not in passes.FUSIBLE_DTYPES:
            return f"%{v} {op}: dtype {d.get('dtype')}"
        if _size(d["shape"]) == 0:
            return f"%{v} {op}: an empty array"
        ops = ir.operands(g, v)
        if op in ("input", "const"):
            continue
        if op == "proj":
            if g.nodes[ops[0]]["op"] != "scan":
                return f"%{v} proj of {g.nodes[ops[0]]['op']}"
            continue
        if op in _VIEWS or op in ("broadcast_to", "transpose", "zeros_like", "sum"):
            continue
        if op in ("getitem", "index_add"):
            if len(ops) != 1 or not _basic_index(d["attrs"]["index"]):
                return f"%{v} {op} with index arrays"
            continue
        if passes.fusible(g, v):
            continue
        return f"%{v} {op} has no C form"
    return None


def _strides(view, nshape):
    """(offset, element strides) of ``view`` (a view of an arange)."""
    assert tuple(view.shape) == tuple(nshape), (view.shape, nshape)
    item = view.itemsize
    off = int(view.flat[0]) if view.size else 0
    return off, [s // item for s in view.strides]


def _index_view(d, shape):
    """Node d's basic index applied to an arange of ``shape``: which
    elements of an array of that shape it selects, in order."""
    from tracegrad.ops.indexing import build_index
    return np.arange(_size(shape), dtype=np.int64).reshape(shape)[
        build_index(d["attrs"]["index"], ())]


WHOLE = cstyle.Target(
    "native C",
    acc_store="{param}[0] = {acc};",
    pass_array="{arg}",
    library="NumPy",
    math=None)


class WholeFunction:
    """One graph as one C function plus the driver lines that call it."""

    def __init__(self, g, name, arg_names, doc, module, prefix, kernel_prefix, math,
                 expression=None):
        self.name = pysource.function_name(name)
        self.args = pysource.identifiers(arg_names, reserved={self.name})
        self.doc = doc
        self.graph = g
        self.cname = f"tg_{prefix}whole"
        self.module = module
        self.kernel_prefix = kernel_prefix
        WHOLE.math = math
        if expression is not None:
            WHOLE.expression = expression
        self.kernels = []        # (Kernel, graph)
        self.inline = set()      # names of the kernels in loop bodies (see INLINE_MAX_NODES)
        self._inlined = 0        # their nodes
        self._loops = 0          # depth of the loop bodies being emitted
        self.decls = []          # C declarations at the top of the function
        self.frees = []
        self.allocs = []
        self.storage = {}        # buffer name -> ("stack" | "heap", C type, elements, what)
        #                          or ("const", declaration)
        self.cuts = []           # positions in ``lines`` between top-level statements
        self.lines = []          # C statements
        self.params = []         # (C declaration, C type, elements, writable): inputs, constants
        self.in_info = []        # per input parameter: (dtype name, elements)
        self.out_params = []     # the outputs' parameters, after the inputs' (same form)
        self.outs = []           # per output parameter: shape, dtype, scalar, node
        self.call = []           # driver expressions, one per input parameter
        self.body = []           # driver statements
        self.work = 0            # element operations of one call (loops counted in full)
        self._mult = 1           # steps of the loops being emitted
        self._n = 0
        self._stack = 0
        self._memo = {}
        self._raw = []     # per parameter: the driver's raw argument (inputs)
        names = {}
        for j, (v, a) in enumerate(zip(g.graph["inputs"], self.args)):
            d = g.nodes[v]
            if not any(True for _ in g.successors(v)):
                continue
            ct = cstyle.ctype(d["dtype"])
            pname = f"in{j}"
            self.params.append((f"const {ct}* __restrict__ {pname}", ct, _size(d["shape"]), False))
            self.in_info.append((d["dtype"].name, _size(d["shape"])))
            self.call.append(f"np.ascontiguousarray({a}, dtype={d['dtype'].name!r})")
            self._raw.append(a)
            names[v] = pname
        # outputs: allocated by the entry (fresh each call), written where
        # they are computed
        self.out_param = {}
        self.zeroed = set()     # output parameters the entry allocates zeroed
        outs = g.graph["outputs"]
        rets = []
        post = []
        for p, v in enumerate(outs):
            d = g.nodes[v]
            if d["op"] in ("input", "const"):
                rets.append(pysource.operand_expr(g, v, {u: f"np.asarray({a})" for u, a in
                                                zip(g.graph["inputs"], self.args)}, module))
                continue
            ct = cstyle.ctype(d["dtype"])
            pname = f"out{p}"
            self.out_params.append((f"{ct}* __restrict__ {pname}", ct, _size(d["shape"]), True))
            if v in self.out_param:
                post.append((pname, v))
            elif d["op"] in _VIEWS or d["op"] == "proj":
                post.append((pname, v))
                self.out_param.setdefault(v, None)
            else:
                self.out_param[v] = pname
            # a computed 0-d value is a NumPy scalar, as NumPy's sum gives
            scalar = d["shape"] == () and (d["op"] == "sum" or passes.fusible(g, v))
            rets.append(f"_r[{len(self.outs)}]")
            self.outs.append({"shape": tuple(cstyle.dim(n) for n in d["shape"]),
                              "dtype": d["dtype"].name, "scalar": scalar, "node": v,
                              "param": pname,
                              "what": f"%{v} {d['op']} {d['dtype']}{list(d['shape'])}"})
        self._emit(g, names, "    ")
        for o in self.outs:
            o["zeroed"] = o["param"] in self.zeroed
        for pname, v in post:
            d = g.nodes[v]
            self.cuts.append(len(self.lines))
            self.lines.append(f"    memcpy({pname}, {names[v]}, "
                              f"{_size(d['shape'])} * sizeof(*{pname}));  // %{v} out")
        self.params += self.out_params
        # the arrays as they come (the entry checks their element types,
        # layout and sizes); converted by NumPy when they do not fit
        conv = f"_{self.cname}({', '.join(self.call)})"
        direct = rets == [f"_r[{k}]" for k in range(len(self.outs))]
        got = "return " if direct else "_r = "
        what = ", ".join(o["what"] + (" (a NumPy scalar)" if o["scalar"] else "")
                         for o in self.outs)
        self.body += [
            {"code": None, "comment": None,
             "source": f"the whole graph: one C call; it returns {what or 'nothing'}, "
                       f"fresh each call"},
            {"code": "try:", "comment": None, "source": None},
            {"code": f"    {got}_{self.cname}({', '.join(self._raw)})", "comment": None,
             "source": None},
            {"code": "except (TypeError, ValueError, BufferError):", "comment": None,
             "source": None},
            {"code": f"    {got}{conv}", "comment": "arguments converted by NumPy", "source": None}]
        self.returns = None if direct else \
            "(" + ", ".join(rets) + ("," if len(rets) == 1 else "") + ")"

    # --- storage ------------------------------------------------------------------------

    def _buf(self, ct, n, what):
        name = f"b{self._n}"
        self._n += 1
        nbytes = n * c_sizes(ct)
        if self._stack + nbytes <= STACK_BYTES and not self.module.generic:
            self._stack += nbytes
            self.decls.append(f"{ct} {name}[{n}];  // {what}")
            self.storage[name] = ("stack", ct, n, what)
        else:
            self.decls.append(f"{ct}* {name} = NULL;  // {what}")
            self.allocs.append(f"{name} = ({ct}*)malloc({n} * sizeof({ct}));")
            self.allocs.append(f"if (!{name}) goto tg_oom;")
            self.frees.append(name)
            self.storage[name] = ("heap", ct, n, what)
        return name

    def _node_buf(self, g, v, top):
        d = g.nodes[v]
        if top and self.out_param.get(v):
            return self.out_param[v]
        return self._buf(cstyle.ctype(d["dtype"]), _size(d["shape"]),
                         f"%{v} {d['op']} {d['dtype']}{list(d['shape'])}")

    def _const(self, g, u, names, top):
        """The buffer of constant node u (declared once)."""
        if u in names:
            return names[u]
        d = g.nodes[u]
        val = d["value"]
        dt = d["dtype"]
        ct = cstyle.ctype(dt)
        arr = np.asarray(val, dtype=dt) if not isinstance(val, np.ndarray) else val
        if arr.size <= SMALL_CONST:
            name = f"b{self._n}"
            self._n += 1
            init = ", ".join(cstyle.c_literal(x, arr.dtype) for x in arr.reshape(-1).tolist())
            self.decls.append(f"{ct} {name}[{arr.size}] = {{{init}}};  // %{u} const "
                              f"{arr.dtype}{list(arr.shape)}")
            self.storage[name] = ("const", self.decls[-1])
        else:
            drv = self.module.constant(u, arr)
            name = f"cst{len(self.params)}"
            self.params.append((f"const {ct}* __restrict__ {name}", ct, arr.size, False))
            self.in_info.append((arr.dtype.name, arr.size))
            self.call.append(drv)
            self._raw.append(drv)
        names[u] = name
        return name

    # --- one graph's statements -------------------------------------------------------------

    def _emit(self, g, names, ind, top=True):
        groups = passes.fusion_groups(g)
        member = {v for grp in groups for v in grp.nodes}
        L = self.lines
        for unit in cstyle.schedule(g, groups):
            if top:
                self.cuts.append(len(L))
            if unit[0] == "g":
                self._kernel(g, groups[unit[1]], names, ind, top)
                continue
            v = unit[1]
            d = g.nodes[v]
            op = d["op"]
            if op == "input" or (op == "const" and v not in names and
                                 all(w in member for w in g.successors(v))):
                continue
            if op == "const":
                self._const(g, v, names, top)
                continue
            ops = ir.operands(g, v)
            if op == "proj":
                names[v] = names[ops[0]][d["attrs"]["index"]]
                continue
            if op in _VIEWS:
                names[v] = self._operand(g, ops[0], names, top)
                continue
            if op == "scan":
                names[v] = self._scan(g, v, ops, names, ind, top)
                continue
            if op == "broadcast_to" and v not in g.graph["outputs"] and \
                    all(w in member for w in g.successors(v)):
                continue   # the kernels read its operand through broadcast strides
            src = self._operand(g, ops[0], names, top) if ops else None
            if op == "getitem" and top and v not in g.graph["outputs"]:
                alias = self._contiguous_part(g, v, ops[0], src)
                if alias is not None:
                    names[v] = alias
                    continue
            self.work += self._mult * _size(g.nodes[ops[0]]["shape"] if op == "sum" else d["shape"])
            out = self._node_buf(g, v, top)
            names[v] = out
            shape = tuple(d["shape"])
            ct = cstyle.ctype(d["dtype"])
            L.append(f"{ind}// %{v} {op}")
            if op == "zeros_like":
                self._zero(v, out, shape, ct, ind, top)
            elif op in _COPIES:
                ishape = tuple(g.nodes[ops[0]]["shape"])
                a = np.arange(_size(ishape), dtype=np.int64).reshape(ishape)
                if op == "broadcast_to":
                    view = np.broadcast_to(a, shape)
                elif op == "transpose":
                    view = a.transpose(d["attrs"]["axes"])
                else:
                    view = _index_view(d, ishape)
                off, st = _strides(view, shape)
                self._strided(ind, shape, off, st, f"{out}[_o++]", f"{src}[{{}}]")
            elif op == "index_add":
                gshape = tuple(g.nodes[ops[0]]["shape"])
                off, st = _strides(_index_view(d, shape), gshape)
                self._zero(v, out, shape, ct, ind, top)
                self._strided(ind, gshape, off, st, f"{out}[{{}}]", f"{src}[_o++]", dst_idx=True)
            elif op == "sum":
                self._sum(g, v, ops[0], src, out, ind)
            else:
                raise AssertionError(f"whole C: no form for %{v} {op}")

    def _zero(self, v, out, shape, ct, ind, top):
        """Zeros in ``out``: an output array the entry allocates zeroed
        (calloc: the system's zero pages, no pass over them), else a memset."""
        if top and shape != () and self.out_param.get(v) == out:
            self.zeroed.add(out)
            self.lines.append(f"{ind}// ({out} is allocated zeroed by the entry)")
        else:
            self.lines.append(f"{ind}memset({out}, 0, {_size(shape)} * sizeof({ct}));")

    @staticmethod
    def _contiguous_part(g, v, u, src):
        """``src + offset`` where getitem node v reads one contiguous run of
        its operand u in order (``x[1:-1]``, ``x[2:5, :]``): its readers read
        it in place, with no buffer and no copy (an 8 MB copy and its fresh
        pages made ``x[1:-1]``'s gradient at 1e6 elements 5x the NumPy
        target's).  None otherwise.  At the top level only, where nothing
        writes into u after it is computed."""
        shape = tuple(g.nodes[v]["shape"])
        if _size(shape) == 0:
            return None
        view = _index_view(g.nodes[v], tuple(g.nodes[u]["shape"]))
        if tuple(view.shape) != shape or not view.flags.c_contiguous:
            return None
        off = int(view.flat[0])
        return src if off == 0 else f"({src} + {off})"

    def _operand(self, g, u, names, top):
        if g.nodes[u]["op"] == "const":
            return self._const(g, u, names, top)
        return names[u]

    def _strided(self, ind, shape, off, strides, dst, src, dst_idx=False):
        """Loops over ``shape`` in C order; ``_o`` counts the flat position and
        ``{}`` in dst (dst_idx) or src takes the strided offset."""
        L = self.lines
        dims = [(int(n), int(s)) for n, s in zip(shape, strides) if int(n) != 1]
        L.append(f"{ind}{{ long long _o = 0;")
        terms = [str(off)]
        for j, (n, s) in enumerate(dims):
            L.append(f"{ind}  for (long long _i{j} = 0; _i{j} < {n}LL; _i{j}++)")
            terms.append(f"_i{j} * {s}LL")
        idx = " + ".join(terms)
        stmt = f"{dst.format(idx)} = {src};" if dst_idx else f"{dst} = {src.format(idx)};"
        L.append(f"{ind}    {stmt}")
        L.append(f"{ind}}}")

    def _sum(self, g, v, u, src, out, ind):
        d, du = g.nodes[v], g.nodes[u]
        ishape = tuple(du["shape"])
        axes = sorted(int(a) % max(len(ishape), 1) for a in d["attrs"]["axis"]) if ishape else []
        kept = [j for j in range(len(ishape)) if j not in axes]
        a = np.arange(_size(ishape), dtype=np.int64).reshape(ishape)
        st = [s // 8 for s in a.strides]
        nout = _size([ishape[j] for j in kept])
        nred = _size([ishape[j] for j in axes])
        ct = cstyle.ctype(d["dtype"])
        L = self.lines

        def offset(var, dims):
            terms, inner = [], 1
            for j in reversed(dims):
                n = int(ishape[j])
                if n != 1:
                    e = var if inner == 1 else f"({var} / {inner}LL)"
                    if inner * n != _size([ishape[k] for k in dims]):
                        e = f"({e} % {n}LL)"
                    terms.append(f"{e} * {st[j]}LL")
                inner *= n
            return " + ".join(reversed(terms)) or "0"

        pw = d["dtype"].kind == "f"
        suffix = "f32" if d["dtype"] == np.float32 else "f64"
        # reduced axes that are the trailing ones: each output sums a
        # contiguous run, read directly and summed by the vector loop (as a
        # fused sum's blocks are; a sequential loop kept the adds scalar and
        # made sum(x, axis=-1) slower than NumPy's)
        trailing = bool(axes) and axes == list(range(len(ishape) - len(axes), len(ishape)))
        inner = "_r" if trailing else offset('_r', axes)
        L.append(f"{ind}// %{v} sum over axes {axes} of %{u}")
        L.append(f"{ind}for (long long _o = 0; _o < {nout}LL; _o++) {{")
        L.append(f"{ind}    const long long _base = {offset('_o', kept)};")
        if pw and nred > 8:
            L.append(f"{ind}    tg_pw_{suffix} _pw = {{0}};")
            L.append(f"{ind}    for (long long _b0 = 0; _b0 < {nred}LL; _b0 += TG_BLOCK) {{")
            L.append(f"{ind}        const long long _b1 = _b0 + TG_BLOCK < {nred}LL ? "
                     f"_b0 + TG_BLOCK : {nred}LL;")
            L.append(f"{ind}        {ct} _acc = 0;")
            if trailing:
                L.append("#pragma omp simd reduction(+: _acc)")
            L.append(f"{ind}        for (long long _r = _b0; _r < _b1; _r++)")
            L.append(f"{ind}            _acc += ({ct}){src}[_base + {inner}];")
            L.append(f"{ind}        tg_pw_push_{suffix}(&_pw, _acc);")
            L.append(f"{ind}    }}")
            L.append(f"{ind}    {out}[_o] = tg_pw_done_{suffix}(&_pw);")
        else:
            L.append(f"{ind}    {ct} _acc = 0;")
            L.append(f"{ind}    for (long long _r = 0; _r < {nred}LL; _r++)")
            L.append(f"{ind}        _acc += ({ct}){src}[_base + {offset('_r', axes)}];")
            L.append(f"{ind}    {out}[_o] = _acc;")
        L.append(f"{ind}}}")

    def _kernel(self, g, grp, names, ind, top):
        kname = f"{self.kernel_prefix}k{len(self.kernels)}"
        kn = dict(names)
        for v in grp.nodes:
            kn[v] = f"t{v}"

        def const_name(u):
            return self._const(g, u, names, top)
        kern = cstyle.Kernel(kname, grp, g, kn, const_name, WHOLE)
        self.kernels.append((kern, g))
        if self._loops and self._inlined + len(grp.nodes) <= INLINE_MAX_NODES:
            self.inline.add(kname)
            self._inlined += len(grp.nodes)
        self.work += self._mult * kern.n
        repl = {}
        for v, var in kern.outputs:
            names[v] = self._node_buf(g, v, top)
            repl[var] = names[v]
        for (r, var, dt), acc in zip(kern.partials, kern.accs):
            suffix = "f32" if dt == np.float32 else "f64"
            acc.update(r=r, suffix=suffix, acc=f"acc{r}",
                       store=f"part_t{r}[0] = tg_pw_done_{suffix}(&pw{r});")
            names[r] = self._node_buf(g, r, top)
            repl[var] = names[r]
        args = [repl.get(a, a) for a in kern.args]
        self.lines.append(f"{ind}{kname}({', '.join(args)});  // {kern.describe(g)}")

    def _scan(self, g, v, ops, names, ind, top):
        d = g.nodes[v]
        a = d["attrs"]
        n, nc, nx_, start, rev = a["length"], a["n_carry"], a["n_xs"], a["start"], a["reverse"]
        body = a["body"]
        bg = _body_graph(body, self._memo)
        avals = d["avals"]
        uid = self._n
        self._n += 1
        L = self.lines
        args = [self._operand(g, u, names, top) for u in ops]
        carry = []
        for j in range(nc):
            av = avals[j]
            ct = cstyle.ctype(av.dtype)
            cb = self._buf(ct, _size(av.shape), f"%{v} scan carry {j}")
            carry.append(cb)
            L.append(f"{ind}memcpy({cb}, {args[j]}, {_size(av.shape)} * sizeof({ct}));")
        # stacked ys that nothing reads (no proj of them is left) get no
        # buffer and no store per step (the projectile's positions, stored
        # for a reverse loop that reads only the velocities)
        read = {g.nodes[w]["attrs"]["index"] for w in g.successors(v)
                if g.nodes[w]["op"] == "proj" and self._read(g, w)}
        ys = []
        for j, av in enumerate(avals[nc:]):
            ys.append(self._buf(cstyle.ctype(av.dtype), _size(av.shape),
                                f"%{v} scan ys {j} {av.dtype}{list(av.shape)}")
                      if nc + j in read else None)
        xs = args[nc:nc + nx_]
        consts = args[nc + nx_:]
        k = f"_k{uid}"
        L.append(f"{ind}// %{v} scan: {n} steps{' in reverse' if rev else ''}")
        L.append(f"{ind}for (long long _s{uid} = 0; _s{uid} < {n}LL; _s{uid}++) {{")
        ind2 = ind + "    "
        L.append(f"{ind2}const long long {k} = " + (f"{n - 1}LL - _s{uid};" if rev else f"_s{uid};"))
        bn = {}
        bins = list(bg.graph["inputs"])
        pos = 0
        if start is not None:
            ib = self._buf("long long", 1, f"%{v} scan index")
            L.append(f"{ind2}{ib}[0] = {k} + {int(start)}LL;")
            bn[bins[0]] = ib
            pos = 1
        for j in range(nc):
            bn[bins[pos + j]] = carry[j]
        pos += nc
        for j in range(nx_):
            xshape = g.nodes[ops[nc + j]]["shape"]
            step = _size(xshape[1:])
            bn[bins[pos + j]] = f"({xs[j]} + {k} * {step}LL)"
        pos += nx_
        for j, c in enumerate(consts):
            bn[bins[pos + j]] = c
        self._mult *= n
        self._loops += 1
        self._emit(bg, bn, ind2, top=False)
        self._loops -= 1
        self._mult //= n
        bouts = bg.graph["outputs"]
        for j, u in enumerate(bouts[nc:]):
            if ys[j] is None:
                continue
            av = avals[nc + j]
            m = _size(av.shape[1:])
            ct = cstyle.ctype(av.dtype)
            L.append(f"{ind2}memcpy({ys[j]} + {k} * {m}LL, {self._operand(bg, u, bn, False)}, "
                     f"{m} * sizeof({ct}));  // ys {j}")
        # the new carries: through a second buffer where one could alias a carry
        carry_set = set(carry)
        srcs = [self._operand(bg, u, bn, False) for u in bouts[:nc]]
        direct = all(s not in carry_set or s == carry[j] for j, s in enumerate(srcs)) and \
            len(set(s for j, s in enumerate(srcs) if s != carry[j])) == \
            len([1 for j, s in enumerate(srcs) if s != carry[j]])
        if direct:
            for j, s in enumerate(srcs):
                if s != carry[j]:
                    m = _size(avals[j].shape)
                    L.append(f"{ind2}memcpy({carry[j]}, {s}, {m} * sizeof(*{carry[j]}));")
        else:
            tmp = []
            for j, s in enumerate(srcs):
                m = _size(avals[j].shape)
                t = self._buf(cstyle.ctype(avals[j].dtype), m, f"%{v} next carry {j}")
                tmp.append(t)
                L.append(f"{ind2}memcpy({t}, {s}, {m} * sizeof(*{t}));")
            for j, t in enumerate(tmp):
                m = _size(avals[j].shape)
                L.append(f"{ind2}memcpy({carry[j]}, {t}, {m} * sizeof(*{t}));")
        L.append(f"{ind}}}")
        return carry + ys

    def _read(self, g, w):
        """Is node w's value read?  An output is; a loop that takes it as
        an xs operand its body never uses (the reverse loop of a gradient
        gets every stacked value of the forward loop) does not read it."""
        if w in g.graph["outputs"]:
            return True
        for u in g.successors(w):
            d = g.nodes[u]
            if d["op"] != "scan":
                return True
            a = d["attrs"]
            bg = _body_graph(a["body"], self._memo)
            bins = list(bg.graph["inputs"])
            first = 1 if a["start"] is not None else 0
            for k, x in enumerate(ir.operands(g, u)):
                if x != w:
                    continue
                b = bins[first + k]
                if k < a["n_carry"] or any(True for _ in bg.successors(b)) or \
                        b in bg.graph["outputs"]:
                    return True
        return False

    # --- the C text -----------------------------------------------------------------------

    def c_pieces(self):
        """(declarations, definitions): the function's C text as the
        declarations every translation unit needs (a large graph's frames
        and parts) and the function definitions, each of which may be
        compiled in a unit of its own."""
        if len(self.lines) > PART_LINES:
            return self._parts_text()
        return "", [self.c_text()]

    def c_text(self):
        if len(self.lines) > PART_LINES:
            decls, defs = self._parts_text()
            return "\n\n".join([decls] + defs)
        out = [f"// {self.cname}: the whole graph of {self.name}() as one C function",
               f"int {self.cname}(" + ",\n    ".join(p[0] for p in self.params) + ")"
               if self.params else f"int {self.cname}(void)", "{"]
        out += ["    " + s for s in self.decls]
        out += ["    " + s for s in self.allocs]
        out += self.lines
        out += [f"    free({f});" for f in self.frees]
        out.append("    return 0;")
        if self.frees:
            out.append("tg_oom:")
            out += [f"    free({f});" for f in self.frees]
            out.append("    return 1;")
        out.append("}")
        return "\n".join(out)


    def parts(self):
        """The statements cut at top-level boundaries into runs of about
        PART_LINES lines: (first, end) positions in ``lines``."""
        out, start = [], 0
        for c in sorted(set(self.cuts)) + [len(self.lines)]:
            if c - start >= PART_LINES or (c == len(self.lines) and c > start):
                out.append((start, c))
                start = c
        return out

    def _parts_text(self):
        """A large graph's function as several C functions, one per run of
        statements (``parts``), each compiled on its own: the C compiler's
        time on one function grows faster than linearly with its size (a
        graph of ten thousand nodes took minutes as one function).  The
        buffers live in two frames, a struct on the entry's stack (the
        stack budget's buffers) and one heap block for the rest, handed to
        every part; each part names the buffers it uses as before, so its
        statements are the one-function text itself, and small constants
        are declared in each part that reads them."""
        cn = self.cname
        stack = [(n, st) for n, st in self.storage.items() if st[0] == "stack"]
        heap = [(n, st) for n, st in self.storage.items() if st[0] == "heap"]
        parts = self.parts()
        head = [f"// {cn}: the whole graph of {self.name}() as one C function calling "
                f"{len(parts)} parts (a large graph: each part is compiled on its own)"]
        for tag, bufs in (("stack", stack), ("heap", heap)):
            head.append(f"struct {cn}_{tag} {{")
            head.append("    char _unused;")
            head += [f"    {ct} {n}[{k}];  // {what}" for n, (_, ct, k, what) in bufs]
            head.append("};")
        params = [(p[0], p[0].rsplit(" ", 1)[-1]) for p in self.params]
        calls, defs = [], []
        for j, (a, b) in enumerate(parts):
            lines = self.lines[a:b]
            used = set()
            for ln in lines:
                used.update(_NAME_RE.findall(ln.split("//", 1)[0]))
            ps = [decl for decl, name in params if name in used]
            fn = f"{cn}_p{j}"
            sig = (f"void {fn}(struct {cn}_stack* __restrict__ F, "
                   f"struct {cn}_heap* __restrict__ H" + "".join(f",\n    {p}" for p in ps) + ")")
            # not inlined into the entry: that would make one function again
            head.append(f"__attribute__((noinline)) {sig};")
            out = [f"// {cn}, part {j} of {len(parts)}", sig]
            out.append("{")
            out.append("    (void)F; (void)H;")
            for n in sorted((u for u in used if u in self.storage), key=lambda u: int(u[1:])):
                st = self.storage[n]
                if st[0] == "const":
                    out.append("    " + st[1])
                else:
                    out.append(f"    {st[1]}* const {n} = {'F' if st[0] == 'stack' else 'H'}->{n};")
            out += lines
            out.append("}")
            defs.append("\n".join(out))
            calls.append(f"    {fn}(&F, H" + "".join(f", {name}" for decl, name in params
                                                   if name in used) + ");")
        out = [f"int {cn}(" + ",\n    ".join(p[0] for p in self.params) + ")"
               if self.params else f"int {cn}(void)"]
        out.append("{")
        out.append(f"    struct {cn}_stack F;")
        out.append(f"    struct {cn}_heap* H = (struct {cn}_heap*)malloc(sizeof(struct {cn}_heap));")
        out.append("    if (!H)")
        out.append("        return 1;")
        out += calls
        out.append("    free(H);")
        out.append("    return 0;")
        out.append("}")
        defs.append("\n".join(out))
        return "\n".join(head), defs


# The kernels of a loop body are ``static inline`` (up to this many graph
# nodes in all per whole function): a call per kernel and step, and the
# small buffers between kernels, cost more than the arithmetic of a small
# state (the projectile of benchmarks/loops.py: 167 us a gradient of 3,000
# steps with calls, 103 us inlined, docs/native.md).  Top-level kernels stay
# calls: the compiler's time on one function grows faster than its size.
INLINE_MAX_NODES = 2000

# A whole function of more than PART_LINES lines of statements is cut into
# parts of about that many (``WholeFunction.parts``).
PART_LINES = 400
_NAME_RE = re.compile(r"\b(?:b|in|cst|out)[0-9]+\b")


def c_sizes(ct):
    return {"float": 4, "double": 8, "bool": 1, "signed char": 1, "unsigned char": 1,
            "short": 2, "unsigned short": 2, "int": 4, "unsigned int": 4, "long long": 8,
            "unsigned long long": 8}[ct]
