"""The native CPU target: IR graphs to C kernels plus a NumPy driver module.

It shares the CUDA target's C-style renderer (``cstyle.Kernel``:
parameters, loads, index arithmetic, one line per node, stores,
accumulators) and its driver structure; this module is the CPU's row of the
per-target table (STYLE.md, 5): the loop header and the blocked pairwise
epilogue of a fused sum (``native_kernels.c.j2``), the math prelude (C's
``f``-suffixed float functions, ``_Generic`` helpers, glibc's vector math
declarations), and the entry: a CPython extension function per kernel
(``native_kernels.c.j2``; a ctypes call where Python's or NumPy's headers
are missing) from a NumPy driver (``native_driver.py.j2``).  Matrix products, reductions over some axes,
indexing and shape ops stay NumPy calls between the kernels, so BLAS does
the matrix products.

A graph whose every node (loop bodies included) has a C form is instead ONE
C function (``whole.WholeFunction``): its kernels, sums, copies
and loops in C, one call from Python per graph call.

Kernels above a size threshold (``threaded``) split their blocks among the
recipe's threads (``TRACEGRAD_NUM_THREADS``, OpenMP); a fused sum's block
sums are then added pairwise in block order, as on one thread.

The build recipe (compiler, flags, ISA level, vector math) and the builder
live in ``codegen_templates/native_loader.py``, pasted into every generated
module: a module written by ``tracegrad compile --backend native`` builds
itself with NumPy and a C compiler alone, and tracegrad probes the compiler
through the same text.
"""
from __future__ import annotations

import re

import numpy as np

from tracegrad.targets.native import builder, whole
from tracegrad.targets import cstyle, pysource, templates
from tracegrad.ops import symbolic
from tracegrad.ir import graph as ir
from tracegrad._version import __version__

# C's float functions carry an f; the registry's expressions use the
# (CUDA-overloaded) double names.
_MATH = ("exp", "log", "sin", "cos", "tan", "asin", "acos", "atan", "atan2", "sinh", "cosh",
         "tanh", "asinh", "acosh", "atanh", "exp2", "expm1", "log1p", "log2", "log10", "sqrt",
         "pow", "fabs", "floor", "ceil", "rint", "trunc", "lgamma", "erf", "fmod", "fmin",
         "fmax", "hypot", "copysign", "rsqrt", "sinpi")
_MATH_RE = re.compile(r"\b(" + "|".join(_MATH) + r")\(")
_CLASSIFY_RE = re.compile(r"\b(isnan|isinf|isfinite)\(")


# fmax/fmin of floating operands: the vectorisable helpers of native_helpers.h;
# atan2: native_kernels.c.j2's tg_atan2 (through the vector atan where libmvec
# has it, else C's atan2)
_HELPER_RE = re.compile(r"\b(fmax|fmin|atan2)(f?)\(")


def _c_math(expr, dtype):
    """A registry expression in C for compute dtype ``dtype``."""
    dt = np.dtype(dtype)
    if dt == np.float32:
        expr = _MATH_RE.sub(lambda m: m.group(1) + "f(", expr)
    if dt.kind == "f":
        return _HELPER_RE.sub(lambda m: "tg_" + m.group(1) + m.group(2) + "(", expr)
    if dt.kind in "iub":
        # C's classification macros take floating operands only: an integer
        # is never NaN or infinite
        return _CLASSIFY_RE.sub(lambda m: {"isnan": "0 * (", "isinf": "0 * (",
                                           "isfinite": "1 + 0 * ("}[m.group(1)], expr)
    return expr


# np.clip, as NumPy computes it, with compare-and-select only (the
# registry's fmin(fmax(..)) is a libm call per element that gcc does not
# vectorise without -ffinite-math-only: 8x slower than np.maximum's
# expression, and it ignores a NaN bound and orders signed zeros otherwise).
# NumPy's own clip has two loops that differ in signed zeros only: scalar
# bounds (its vector loop: x < lo ? lo : x, then > hi; a NaN bound gives NaN)
# and array bounds (its scalar loop, _NPY_MAX then _NPY_MIN, NaN-propagating).
# The kernel follows the first where both bounds are C literals, else the second.
_CLIP_SCALAR_BOUNDS = ("((isnan({1}) || isnan({2})) ? ({1}) + ({2}) : "
                       "((({0}) < ({1}) ? ({1}) : ({0})) > ({2}) ? ({2}) : "
                       "(({0}) < ({1}) ? ({1}) : ({0}))))")
_CLIP_ARRAY_BOUNDS_MAX = "((isnan({0}) || ({0}) > ({1})) ? ({0}) : ({1}))"
_CLIP_ARRAY_BOUNDS = ("((isnan({t}) || {t} < ({2})) ? {t} : ({2}))"
                      .replace("{t}", _CLIP_ARRAY_BOUNDS_MAX))


def _literal_power(e, compute):
    """x ** e for a literal e of 3, 4, 0.5, 1.5, 2.5, 3.5 or -0.5 with
    products and sqrt, or None (a float's power only).  libmvec's vector pow
    is 1.2-1.35x slower than NumPy's (ops.py, pow(x,2.5), forward and
    gradient).  The products are in double (float32 rounds once, at the
    end); sqrt is correctly rounded and each product adds half an ulp, so a
    double x ** 3.5 is within about 2 ulp of NumPy's pow.  The non-positive
    x take pow's values (NumPy's): +-0 -> +0 (e > 0) or +inf (e < 0), -inf
    -> +inf or +0, other negatives and NaN -> sqrt's NaN (pow's too); e =
    0.5 is sqrt, as NumPy computes it (sqrt(-0) = -0, sqrt(-inf) = NaN).
    ``__builtin_sqrt`` stays double where the float32 spelling pass renames
    ``sqrt``."""
    if isinstance(e, bool) or not isinstance(e, (int, float, np.integer, np.floating)):
        return None
    if np.dtype(compute).kind != "f":
        return None     # an integer power is NumPy's (passes.fusible)
    x = "((double)({0}))"
    if e in (3, 4):
        # JAX's integer_pow: products (pow(x, 3.0) of a negative x takes
        # glibc's slow path, 50 ns an element)
        return " * ".join([x] * int(e))
    e = float(e)
    if e == 0.5:
        return "sqrt({0})"
    if e == -0.5:
        positive, zero, minus_inf = f"1 / __builtin_sqrt({x})", "INFINITY", "0"
    elif e in (1.5, 2.5, 3.5):
        positive = " * ".join([x] * int(e - 0.5) + [f"__builtin_sqrt({x})"])
        zero, minus_inf = "0", "INFINITY"
    else:
        return None
    return (f"({x} > 0 ? {positive} : ({x} == 0 ? {zero} : "
            f"({x} == -INFINITY ? {minus_inf} : __builtin_sqrt({x}))))")


def _c_expression(op, template, literal, compute):
    """The C template of op (the registry's, except where C needs another);
    ``literal``: per operand its value where it is a C literal, else None;
    ``compute``: the dtype the expression computes in."""
    if op == "clip":
        scalar = all(v is not None for v in literal[1:])
        return _CLIP_SCALAR_BOUNDS if scalar else _CLIP_ARRAY_BOUNDS
    if op == "pow":
        product = _literal_power(literal[1], compute)
        if product is not None:
            return product
    if op == "ldexp":
        # ldexp(x, e) with e a literal is x times the exact power 2**e: one
        # correctly rounded product, which is ldexp's result, where 2**e is a
        # normal float32 (so also a double); C's ldexp is a libm call per
        # element that keeps the loop scalar
        e = literal[1]
        if isinstance(e, (int, np.integer)) and not isinstance(e, bool) and -126 <= e <= 127:
            return f"(({{0}}) * 0x1p{int(e)})"
    return template


_C_SIZES = {"float": 4, "double": 8, "bool": 1, "signed char": 1, "unsigned char": 1,
           "short": 2, "unsigned short": 2, "int": 4, "unsigned int": 4, "long long": 8,
           "unsigned long long": 8}

# the buffer protocol's format characters of each C type (native order)
_FORMATS = {"float": "f", "double": "d", "bool": "?", "signed char": "b", "unsigned char": "B",
            "short": "h", "unsigned short": "H", "int": "i", "unsigned int": "I",
            "long long": "lq", "unsigned long long": "LQ"}

C = cstyle.Target(
    "native C",
    acc_store="{param}[0] = {acc};",   # replaced by the pairwise epilogue (_launch)
    pass_array="np.ascontiguousarray({arg}, dtype={dtype!r})",
    library="NumPy",
    math=_c_math,
    expression=_c_expression)


# A driver function keeps the buffers of intermediates that never leave the
# call from one call to the next, up to this many bytes per set of buffers
# (docs/native.md, "Buffers"); beyond that they are allocated per call.
KEPT_MAX_BYTES = 64 << 20

# A matrix product read only by one elementwise kernel (an MLP's backward:
# dh = d @ W2.T, then dh * (1 - h*h)) is computed a block of rows at a time
# into one buffer of about ROW_BLOCK_BYTES, each block handed at once to the
# kernel, written for a block's shape: the product's full array never
# exists (docs/native.md, "Row blocks").  Only products of at least
# ROW_BLOCK_MIN_BLOCKS blocks are split: each block costs a BLAS call and a
# launch (W3x4's 4 MiB products in 1 MiB blocks: 3% slower, 3 MiB less
# memory; in 256 KiB blocks, 7% slower with two threads).
ROW_BLOCK_BYTES = 1 << 20
ROW_BLOCK_MIN_BLOCKS = 2
# A product below two such blocks (W3's 512 KiB) is split in blocks a
# quarter that size, as long as it makes two: two BLAS calls and launches
# instead of one, for a quarter of its memory.
ROW_BLOCK_SMALL_DIVISOR = 4


def row_block_rows(rows, row_bytes, generic=False):
    """The rows of one block of a ``rows`` x ``row_bytes`` product, or
    None where it is not split (fewer than ROW_BLOCK_MIN_BLOCKS blocks).
    ``generic`` (the generic structure): whole blocks at every size, so that
    the kernels are the same whatever the rows (fewer than a block: the
    last block only)."""
    if generic:
        return max(1, ROW_BLOCK_BYTES // max(1, row_bytes))
    for block in (ROW_BLOCK_BYTES, ROW_BLOCK_BYTES // ROW_BLOCK_SMALL_DIVISOR):
        per = max(1, block // max(1, row_bytes))
        if rows >= ROW_BLOCK_MIN_BLOCKS * per:
            return per
    return None


class _BlockShapes:
    """A graph read through other shapes for a few nodes: what a kernel
    written for one block of rows sees (cstyle.Kernel reads only shapes,
    dtypes, attributes and edges)."""

    def __init__(self, g, shapes):
        self._g = g
        self._shapes = shapes
        self.graph = g.graph
        self._pred = g._pred

    @property
    def nodes(self):
        return self

    def __getitem__(self, v):
        d = self._g.nodes[v]
        return dict(d, shape=self._shapes[v]) if v in self._shapes else d

    def successors(self, v):
        return self._g.successors(v)


class Function(cstyle.Function):
    """One graph lowered to a NumPy driver function calling C kernels.

    Buffers: the NumPy target's planner (``pysource.BufferPlanner``) runs
    over the driver's statements (one per kernel or NumPy call).  A kernel
    output, or a NumPy ufunc's result (``out=``), goes into the buffer of a
    value dead by then with its shape and dtype; failing that, a value that
    never leaves the call (no graph output is, or may be a view of, it)
    gets a buffer kept between calls, taken from the function's
    ``_Scratch`` (native_driver.py.j2) when the call starts and given back
    when it returns.  Graph outputs are always fresh arrays of this call."""

    target = C

    def __init__(self, g, name, arg_names, doc, module, prefix, internal=False):
        super().__init__(g, name, arg_names, doc, module, prefix, internal=internal)
        self.scratch = list(self._plan.kept)
        if self.scratch:
            handle = f"_scratch_{self.name}"
            self.body.insert(0, {"code": f"_s = {handle}.take()",
                                 "comment": f"{len(self.scratch)} buffers kept between calls",
                                 "source": None})
            self.body.append({"code": f"{handle}.give(_s)", "comment": None, "source": None})

    @staticmethod
    def _library_emitter(prim):
        return prim.numpy

    # --- buffers ---------------------------------------------------------------------------

    def _row_blocks(self, g, units, groups):
        """{group index: (matmul node, rows per block)}: the matrix products
        computed in row blocks inside the launch of their one reader, an
        elementwise kernel over the product's shape whose every other
        operand is split by the same rows (a full-shape array, a column) or
        the same for every row (a row, a scalar)."""
        unit_of = {}
        for gi, grp in enumerate(groups):
            for v in list(grp.nodes) + list(grp.reductions):
                unit_of[v] = gi
        outs = set(g.graph["outputs"])
        found = {}
        for unit in units:
            if unit[0] != "n" or g.nodes[unit[1]]["op"] != "matmul" or unit[1] in outs:
                continue
            m = unit[1]
            d = g.nodes[m]
            ops = ir.operands(g, m)
            if len(ops) != 2 or d.get("avals") is not None or \
                    any(len(g.nodes[u]["shape"]) != 2 for u in ops) or \
                    np.dtype(d["dtype"]) not in (np.float32, np.float64):
                continue
            readers = {unit_of.get(w) for w in g.successors(m)}
            if len(readers) != 1 or None in readers:
                continue
            (gi,) = readers
            grp = groups[gi]
            rows, cols = d["shape"]
            per = row_block_rows(rows, cols * np.dtype(d["dtype"]).itemsize,
                                 self.module.generic)
            if grp.reductions or tuple(grp.shape) != (rows, cols) or per is None or \
                    gi in found:
                continue
            members = set(grp.nodes)
            ok = True
            for w in grp.nodes:
                for u in ir.operands(g, w):
                    du = g.nodes[u]
                    if u in members or (du["op"] == "const" and
                                        not isinstance(du["value"], np.ndarray)):
                        continue
                    sh = tuple(du["shape"])
                    split = len(sh) == 2 and sh[0] == rows and sh[1] in (cols, 1)
                    same = len(sh) < 2 or sh[0] == 1
                    if du["op"] == "broadcast_to" or not (split or same):
                        ok = False
            if ok:
                found[gi] = (m, per)
        return found

    def _plan_buffers(self, g, units, groups):
        self._blocks = {}       # id(group) -> (matmul node, rows per block)
        self._in_blocks = {}    # matmul node -> its group
        self._block_buffers = {}    # (shape, dtype name) -> index of its kept buffer
        for gi, (m, per) in self._row_blocks(g, units, groups).items():
            # the product runs inside its reader's launch: move it there
            # (its operands then live until the launch)
            units.remove(("n", m))
            units.insert(units.index(("g", gi)), ("n", m))
            self._blocks[id(groups[gi])] = (m, per)
            self._in_blocks[m] = groups[gi]
        steps, self._step_of = [], {}
        for i, unit in enumerate(units):
            if unit[0] == "g":
                grp = groups[unit[1]]
                members = set(grp.nodes) | set(grp.reductions)
                reads = []
                if id(grp) in self._blocks:
                    reads += ir.operands(g, self._blocks[id(grp)][0])
                for w in list(grp.nodes) + list(grp.reductions):
                    for u in ir.operands(g, w):
                        if u not in members:
                            reads.append(u)
                            if g.nodes[u]["op"] == "broadcast_to":   # the kernel reads its source
                                reads += ir.operands(g, u)
                self._step_of[id(grp)] = i
            else:
                reads = [] if unit[1] in self._in_blocks else ir.operands(g, unit[1])
                self._step_of[unit[1]] = i
            steps.append(reads)
        self._steps = steps
        order = [v for v in ir.topo_order(g) if g.nodes[v]["op"] != "input"]
        self._plan = pysource.BufferPlanner(g, order, steps, keep_between_calls=True)
        self._released = 0
        self._kept_bytes = 0
        self._c_vars = set()   # variables holding C-contiguous arrays of their node's dtype
        self._c_new = []       # ... added since the last kernel launch
        self._kernel_0d = set()    # 0-d values a kernel computes (0-d arrays in the driver)

    def _kernel_graph(self, g, grp):
        if id(grp) not in self._blocks:
            return g
        m, per = self._blocks[id(grp)]
        return _BlockShapes(g, self._block_shapes(g, grp, per))

    @staticmethod
    def _block_shapes(g, grp, per):
        """The shapes a kernel over ``per`` rows of ``grp`` sees: its nodes'
        and every operand split by rows."""
        rows = grp.shape[0]
        out = {}
        for w in grp.nodes:
            for u in [w] + ir.operands(g, w):
                sh = g.nodes[u].get("shape")
                if sh is not None and len(sh) == 2 and sh[0] == rows:
                    out[u] = (per,) + tuple(sh[1:])
        return out

    def _computed_in_kernel(self, v, names):
        if v not in self._in_blocks:
            return False
        names[v] = f"_b{v}"
        return True

    def _c_var(self, var):
        self._c_vars.add(var)
        self._c_new.append(var)

    def _returned(self, v, name):
        # a 0-d value a kernel computes is returned as a NumPy scalar, as
        # NumPy's ufuncs return it and the NumPy target does
        return f"{name}[()]" if v in self._kernel_0d else name

    def _advance(self, i):
        """Statement i is next: pool the buffers of the values dead before it."""
        while self._released < i:
            self._plan.release(self._steps[self._released], self._released)
            self._released += 1

    def _keep(self, shape, dtype):
        """Room for one more kept buffer?"""
        n = cstyle.numel(shape) * np.dtype(dtype).itemsize
        if self._kept_bytes + n > KEPT_MAX_BYTES:
            return False
        self._kept_bytes += n
        return True

    def _kernel_output(self, g, v, var, i, names, kern=None):
        """The statement giving kernel output v (variable ``var``) its
        C-contiguous buffer: an operand of ``kern`` that dies there (the
        kernel reads element i of it before it stores element i), a dead
        value's, a buffer kept between calls, or a new one."""
        plan, d = self._plan, g.nodes[v]
        what = f"%{v} {d['op']}"
        inplace = [] if kern is None else kern.same_index_operands(g)
        u = plan.take(v, i, inplace, need=frozenset({"c_order"}))
        if u is not None and u in inplace:
            plan.own(v)
            kern.shares_buffer(u, v)
            code, comment = f"{var} = {names[u]}", f"{what}: over %{u}, read here for the last time"
        elif u is not None:
            plan.own(v)
            code, comment = f"{var} = {names[u]}", f"{what}: into the buffer of %{u}, dead"
        elif plan.may_keep(v) and self._keep(d["shape"], d["dtype"]):
            code, comment = f"{var} = _s[{plan.keep(v)}]", f"{what} (a buffer kept between calls)"
        else:
            plan.own(v, ("c_order",))
            code, comment = (f"{var} = np.empty({tuple(d['shape'])!r}, dtype={d['dtype'].name!r})",
                             what)
        self._c_var(var)
        self.body.append({"code": code, "comment": comment, "source": None})

    def _library_statement(self, g, v, var, e, prim, args, names):
        i = self._step_of[v]
        self._advance(i)
        d = g.nodes[v]
        ops = ir.operands(g, v)
        ufunc = pysource.ufunc_of(prim, len(ops))
        if not (ufunc and d.get("shape") and d.get("avals") is None):
            return f"{var} = {e}"
        plan = self._plan
        u = plan.take(v, i, pysource.inplace_operands(prim, ufunc, ops))
        if u is not None:
            plan.own(v)
            if "c_order" in plan.tags.get(v, ()):
                self._c_var(var)
            return f"{var} = {ufunc}({', '.join(args)}, out={names[u]})"
        if plan.may_keep(v) and self._keep(d["shape"], d["dtype"]):
            self._c_var(var)
            return f"{var} = {ufunc}({', '.join(args)}, out=_s[{plan.keep(v)}])"
        plan.own(v)
        return f"{var} = {e}"

    def _launch(self, g, kern, kname, module, names, fresh):
        if id(kern.group) in self._blocks:
            return self._launch_in_blocks(g, kern, kname, module, names, fresh)
        handle = f"_{kname}"
        module.kernel(kname, kern.n)
        module.kernel_handles[-1].update(nargs=len(kern.params))
        i = self._step_of[id(kern.group)]
        self._advance(i)
        self.body.append({"code": None, "comment": None,
                          "source": f"kernel {kname}: {kern.describe(g)}"})
        for v, var in kern.outputs:
            self._kernel_output(g, v, var, i, names, kern)
            if g.nodes[v]["shape"] == ():
                self._kernel_0d.add(v)
        for (r, var, dt), acc in zip(kern.partials, kern.accs):
            d = g.nodes[r]
            suffix = "f32" if dt == np.float32 else "f64"
            acc.update(r=r, suffix=suffix, acc=f"acc{r}",
                       store=f"part_t{r}[0] = tg_pw_done_{suffix}(&pw{r});")
            if d["shape"] == () and self._keep((), dt):
                # read back as a NumPy scalar below: the array never leaves the call
                self._plan.kept.append(((), dt.name))
                self.body.append({"code": f"{var} = _s[{len(self._plan.kept) - 1}]",
                                  "comment": f"%{r} sum, finished in {kname} (a buffer kept "
                                             f"between calls)", "source": None})
                self._c_var(var)
            elif d["shape"] == ():
                self.body.append({"code": f"{var} = np.empty((), dtype={dt.name!r})",
                                  "comment": f"%{r} sum, finished in {kname}", "source": None})
            else:
                self._kernel_output(g, r, var, i, names)
            names[r] = var
        fresh.update(self._c_new)     # fresh holds every earlier one (a union per launch was quadratic)
        self._c_new = []
        args = []
        for a in kern.args:
            m = re.fullmatch(r"np\.ascontiguousarray\((\w+), dtype='(\w+)'\)", a)
            args.append(m.group(1) if m and m.group(1) in fresh else a)
        self.body.append({"code": f"{handle}({', '.join(args)})",
                          "comment": f"call {kname}", "source": None})
        for r, var, dt in kern.partials:
            if g.nodes[r]["shape"] == ():
                # a NumPy scalar, as np.sum returns, not a 0-d array
                names[r] = f"t{r}"
                self.body.append({"code": f"t{r} = {var}[()]", "comment": f"%{r} sum",
                                  "source": None})


    def _launch_in_blocks(self, g, kern, kname, module, names, fresh):
        """A kernel over row blocks of the matrix product it reads (see
        ROW_BLOCK_BYTES): each block of the product goes into one buffer,
        then the kernel runs on the same rows of every operand and output.
        The last block (1 to ``per`` rows) has a kernel of its own, so
        that every batch size has the same kernels (Generic sizes)."""
        grp = kern.group
        m, per = self._blocks[id(grp)]
        rows, cols = g.nodes[m]["shape"]
        dt = np.dtype(g.nodes[m]["dtype"])
        full = (rows - 1) // per * per      # rows in whole blocks; the rest: 1 to per
        last = rows - full
        tail_name = f"{kname.rsplit('k', 1)[0]}k{len(self.kernels)}"
        tail = cstyle.Kernel(tail_name, grp, _BlockShapes(g, self._block_shapes(g, grp, last)),
                             names, lambda u: module.constant(u, g.nodes[u]["value"]),
                             self.target)
        self.kernels.append(tail)
        # never written over by an output: the block buffer (reused), and the
        # product's operands (a later block's product reads them)
        kern.never_written_over([m] + ir.operands(g, m))
        i = self._step_of[id(grp)]
        self._advance(i)
        self.body.append({"code": None, "comment": None,
                          "source": f"kernel {kname}: {kern.describe(g)}, over blocks of "
                                    f"{per} rows of %{m} matmul (computed here, a block at "
                                    f"a time; the last block in {tail_name})"})
        for v, var in kern.outputs:
            self._kernel_output(g, v, var, i, names, kern)
        for j, p in enumerate(kern.params):     # the same parameters share buffers
            if "__restrict__" not in p:
                tail.params[j] = tail.params[j].replace(" __restrict__", "")
        buf = f"_b{m}"
        key = ((per, cols), dt.name)
        if key in self._block_buffers or self._keep((per, cols), dt):
            # one kept buffer serves every launch with blocks of its shape
            if key not in self._block_buffers:
                self._plan.kept.append(key)
                self._block_buffers[key] = len(self._plan.kept) - 1
            code = f"{buf} = _s[{self._block_buffers[key]}]"
            comment = f"%{m} matmul, {per} rows at a time (a buffer kept between calls)"
        else:
            code = f"{buf} = np.empty({(per, cols)!r}, dtype={dt.name!r})"
            comment = f"%{m} matmul, {per} rows at a time"
        self.body.append({"code": code, "comment": comment, "source": None})
        fresh.update(self._c_new)
        self._c_new = []
        a, b = (pysource.operand_expr(g, u, names, module) for u in ir.operands(g, m))

        def args(k, lo, hi, block):
            out = []
            for text, u in zip(k.args, k.arg_nodes):
                found = re.fullmatch(r"np\.ascontiguousarray\((\w+), dtype='(\w+)'\)", text)
                name = found.group(1) if found else text
                sh = g.nodes[u].get("shape") or ()
                if u == m:
                    out.append(block)
                elif len(sh) == 2 and sh[0] == rows:
                    part = f"{name}[{lo}:{hi}]"
                    out.append(part if found is None or name in fresh else
                               f"np.ascontiguousarray({part}, dtype={found.group(2)!r})")
                else:
                    out.append(name if found is None or name in fresh else text)
            return ", ".join(out)

        for k, name in ((kern, kname), (tail, tail_name)):
            module.kernel(name, k.n)
            module.kernel_handles[-1].update(nargs=len(k.params))
        self.body.append({"code": f"for _r in range(0, {full}, {per}):", "comment": None,
                          "source": None})
        self.body.append({"code": f"    np.matmul({a}[_r:_r + {per}], {b}, out={buf})",
                          "comment": f"%{m} matmul", "source": None})
        self.body.append({"code": f"    _{kname}({args(kern, '_r', f'_r + {per}', buf)})",
                          "comment": f"call {kname}", "source": None})
        self.body.append({"code": f"np.matmul({a}[{full}:], {b}, out={buf}[:{last}])",
                          "comment": f"%{m} matmul, the last {last} rows", "source": None})
        self.body.append({"code": f"_{tail_name}({args(tail, full, '', f'{buf}[:{last}]')})",
                          "comment": f"call {tail_name}", "source": None})


# Kernels of at least PARALLEL_MIN elements (PARALLEL_MIN_MATH where the loop
# calls a math function: sin, exp, ...) split their loop among the recipe's
# threads (TRACEGRAD_NUM_THREADS, default the cores); below that a second
# thread did not pay on this project's 2-core machine (docs/native.md,
# "Threads": sum(x * 2 + y) 1.31x slower on two threads at 32,768 elements,
# 0.97x at 65,536; W2's math 0.55x at 16,384), and a threaded kernel still
# measures whether its threads pay as the program runs (tg_par_threads).
PARALLEL_MIN = 1 << 16
PARALLEL_MIN_MATH = 1 << 14
_CALL_RE = re.compile(r"\b(" + "|".join(_MATH + ("tg_polygamma",)) + r")f?\(")


def threaded(kern):
    """Is this kernel's loop split among threads (when the recipe has them)?"""
    return thread_count(kern) > 1


def thread_count(kern):
    """How many threads this kernel's loop may use (at most the recipe's):
    1 below its threshold, else one per half a threshold of elements, so
    each thread gets at least the work that paid for a second one."""
    least = PARALLEL_MIN_MATH if any(_CALL_RE.search(s["code"] or "") for s in kern.body) \
        else PARALLEL_MIN
    # (a formula where the size is symbolic: runtime.shape_plan reads it at run time)
    return symbolic.if_less(kern.n, least, 1, symbolic.larger(2, kern.n // max(1, least // 2)))


# The block of a fused sum (TG_BLOCK in codegen_templates/native_helpers.h).
TG_BLOCK = 256

# Kernels of at most UNROLL_MAX elements are loops the compiler unrolls
# (#pragma GCC unroll) instead of vector loops: a float64[3] state's step in
# benchmarks/loops.py took 32 ns with 3-element vector loops, 26 ns unrolled
# (docs/native.md, "Loops").
UNROLL_MAX = 8


# Below this many element operations a call runs its C code without
# releasing the GIL: releasing and taking it back costs 40-50 ns, more than
# tiny work takes, and other threads wait a few microseconds at most.
GIL_MIN_WORK = 1 << 13


def _npy_type(dtype):
    """NumPy's C type number of a dtype name (NPY_FLOAT64, NPY_BOOL, ...)."""
    return "NPY_BOOL" if dtype == "bool" else f"NPY_{dtype.upper()}"


def whole_entry(f):
    """The template's view of a whole function's entry: it takes the input
    arrays (and large constants), checks them, allocates the outputs and
    returns them (0-d computed values as NumPy scalars)."""
    n_in = len(f.params) - len(f.out_params)
    ins = [{"ctype": ct, "bytes": n * _C_SIZES[ct], "npy": _npy_type(dt), "dtype": dt}
           for (_, ct, n, _w), (dt, _n) in zip(f.params[:n_in], f.in_info)]
    outs = [dict(o, p=p, ctype=ct, npy=_npy_type(o["dtype"]))
            for p, (o, (_, ct, _n, _w)) in enumerate(zip(f.outs, f.out_params))]
    call = [f"in{j}" for j in range(n_in)] + [
        f"&s{p}" if o["scalar"] else f"({o['ctype']}*)PyArray_DATA((PyArrayObject*)out[{p}])"
        for p, o in enumerate(outs)]
    return {"name": f.cname, "ins": ins, "outs": outs, "work": f.work, "call_args": call}


# A kernel that reads an operand through broadcast strides loops over the
# rows of its last axis when a row has at least ROW_MIN elements: the flat
# loop computes each coordinate with a division and a remainder per element
# and gathers the broadcast operand; the row loop computes the outer
# coordinates once per row and reads the operand contiguously (W3's bias
# add and tanh over [256, 256]: 175 us flat, 135 us by rows).
ROW_MIN = 16


def row_loop(kern):
    """The row loop of a kernel (rows, row length, the coordinates computed
    per row and per element), or None where the flat loop serves: no
    broadcast operand, a fused sum (its blocks follow the flat index), or
    rows shorter than ROW_MIN."""
    S, axes = kern.shape, kern.coord_axes
    last = len(S) - 1
    if kern.accs or not axes or last < 1 or S[last] < ROW_MIN:
        return None
    shape = ", ".join(map(str, S))
    outer = []
    for j in axes:
        if j == last:
            continue
        inner = cstyle.numel(S[j + 1:last])
        e = "o" if inner == 1 else f"o / {inner}LL"
        if j > 0:
            e = f"({e}) % {cstyle.dim(S[j])}LL"
        outer.append({"code": f"const long long c{j} = {e};",
                      "comment": f"index along axis {j} of [{shape}], once per row"})
    inner = [{"code": f"const long long c{last} = i - base;",
              "comment": f"index along axis {last} of [{shape}]"}] if last in axes else []
    return {"rows": kern.n // cstyle.dim(S[last]), "length": cstyle.dim(S[last]), "outer": outer,
            "chunk": max(1, 4096 // cstyle.dim(S[last])),     # rows a thread takes at a time
            "inner": inner}


def c_source(functions, lowered, g_of, rec, header=(), generic=False):
    """The C file of lowered functions; ``generic``: the generic structure
    (every kernel but a loop body's in its threaded form, whatever its size:
    see Function.module.generic)."""
    kernels, entries, wholes, whole_entries, decls, protos = [], [], [], [], [], []

    def kernel_dict(kern, g, inline=False):
        k = kern.render_dict(g)
        k["threads"] = thread_count(kern)
        k["parallel"] = (generic and not inline) or k["threads"] > 1
        # the generic structure's threaded kernels have a copy of their loops
        # without OpenMP, for the sizes where one thread runs them
        k["twin"] = generic
        # a fused sum over one block needs no pairwise counter (whose struct
        # a small kernel in a loop body would clear at every step)
        k["one_block"] = bool(kern.accs) and not k["parallel"] and kern.n <= TG_BLOCK
        k["inline"] = inline
        # a few elements: unrolled (then the values stay in registers)
        # rather than a vector loop with a remainder
        k["unroll"] = not k["parallel"] and kern.n <= UNROLL_MAX
        k["rows"] = row_loop(kern)
        if k["rows"]:
            k["coords"] = k["rows"]["inner"]
        k["args"] = [{"ctype": ct, "bytes": n * _C_SIZES[ct], "writable": int(w),
                      "cast": p.rsplit(" ", 1)[0].replace(" __restrict__", "")}
                     for (ct, n, w), p in zip(kern.param_info, kern.params)]
        return k

    for f in lowered:
        if isinstance(f, whole.WholeFunction):
            for kern, g in f.kernels:
                kernels.append(kernel_dict(kern, g, kern.name in f.inline))
            head, defs = f.c_pieces()
            if head:
                decls.append(head)
            protos.append(f"int {f.cname}(" + (", ".join(p[0] for p in f.params) or "void") + ");")
            wholes += defs
            whole_entries.append(whole_entry(f))
            continue
        for kern in f.kernels:
            k = kernel_dict(kern, g_of[id(f)])
            kernels.append(k)
            entries.append({"name": k["name"], "args": k["args"], "n": kern.n})
    loader = builder.loader()
    funcs = rec["vector_math"] if rec else []
    # about how many lines the file has: a large one is marked for the
    # builder to compile as several translation units in parallel
    size = sum(len(k["body"]) + len(k["stores"]) + 30 for k in kernels) + \
        sum(w.count("\n") + 1 for w in wholes) + 45 * (len(entries) + len(whole_entries))
    units = size > UNIT_LINES and len(kernels) + len(wholes) > 1
    if units:       # a kernel and its caller may land in different units
        for k in kernels:
            k["inline"] = False
    return templates.environment().get_template("native_kernels.c.j2").render(
        version=__version__, header=list(header), kernels=kernels, vector_math=funcs,
        parallel_min=PARALLEL_MIN, parallel_min_math=PARALLEL_MIN_MATH, unroll_max=UNROLL_MAX,
        vector_decls=loader["vector_math_decls"](funcs), entries=entries, wholes=wholes,
        whole_entries=whole_entries, gil_min=GIL_MIN_WORK, decls=decls, protos=protos,
        units=units)


# A C file of more than about this many lines is marked for the builder
# (native_loader.py's ``build``) to compile as several translation units in
# parallel, as many as the machine has cores (docs/benchmarks.md, "Compile time").
UNIT_LINES = 4000


def _lower(functions, generic=False):
    """(module, lowered functions, graph of each): a graph whose every node
    has a C form becomes one C function (whole.WholeFunction),
    any other keeps the driver structure (Function).  ``generic``: the
    generic structure (docs/native.md, "Generic sizes")."""
    module = cstyle.DriverModule()
    module.function_cls = Function
    module.generic = generic
    prefix_each = len(functions) > 1
    lowered, g_of = [], {}
    whole_on = builder.whole_enabled()
    for g, name, args, doc in functions:
        prefix = f"{cstyle.c_identifier(name)}_" if prefix_each else ""
        if whole_on and any(g.nodes[v]["op"] not in ("input", "const") for v in g.nodes) \
                and whole.why_not(g) is None:
            f = whole.WholeFunction(g, name, args, doc, module, prefix,
                                              f"tg_{prefix}w", _c_math, _c_expression)
        else:
            f = Function(g, name, args, doc, module, prefix)
        g_of[id(f)] = g
        lowered.append(f)
    for f in module.extra:
        g_of[id(f)] = f.graph
    return module, module.extra + lowered, g_of


def translation_unit(graph, header=(), rec=None) -> str:
    """All kernels of one graph as one C file (``tracegrad show --format c``);
    ``rec``: the build recipe (``runtime.toolchain``), None for none (no
    vector math)."""
    names = [graph.nodes[v].get("name", f"a{i}") for i, v in enumerate(graph.graph["inputs"])]
    _, lowered, g_of = _lower([(graph, "run", names, "")])
    return c_source(None, lowered, g_of, rec, header)


def _array_args(f, g):
    """The arguments a driver function converts with np.asarray: all but
    object inputs (a np.random.Generator stays itself: its draws are calls)."""
    return [a for a, v in zip(f.args, g.graph["inputs"]) if g.nodes[v]["dtype"] != object]


def generate_driver(functions, source="", transform="", key="", rec=None, standalone=False,
                    sizes=None, dynamic=None, probe=None, generic=False):
    """Source of one Python module holding a function per (graph, name, arg
    names, docstring) in ``functions``, with the kernels of all of them in
    one C file.  ``standalone``: the module finds the compiler itself when
    imported (CC or cc) instead of using the recipe tracegrad chose, which
    ``rec`` is otherwise (``runtime.toolchain.recipe()``).

    ``sizes``: the process's ``generic.Registry`` of C texts by skeleton
    (None: the C is specialised to these sizes); ``dynamic``: None (generic
    once a skeleton was seen with other numbers), True (generic at once,
    against ``probe``: the same functions traced at other sizes), False
    (never generic).  ``probe``: a function giving lists of functions like
    ``functions`` at other sizes (called only where no text made before
    serves), whose C texts tell at once which numbers vary.
    ``generic``: the generic structure, no choice made from a size (the
    caller's, from the second size of a function on).  A generic module's C
    reads its sizes at run time and is built once for every size it serves
    (docs/native.md, "Generic sizes")."""
    if rec is None and not standalone:
        raise ValueError("codegen (native): a driver needs the build recipe, or standalone=True")
    generic = generic and not standalone
    module, lowered, g_of = _lower(functions, generic)
    csrc = c_source(functions, lowered, g_of, rec if not standalone else None, generic=generic)
    values = None
    if sizes is not None and not standalone and dynamic is not False and \
            generic_sizes_usable(rec):
        def probes():       # the probes' C texts, only where no earlier text serves
            texts = []
            for fns in probe():
                _, p_lowered, p_g_of = _lower(fns, generic)
                texts.append(c_source(fns, p_lowered, p_g_of, rec, generic=generic))
            return texts
        csrc, values = sizes.resolve(csrc, None if probe is None else probes)
    return render_driver(module, lowered, g_of, csrc, values, None if standalone else rec,
                         source=source, transform=transform, key=key)


def generic_sizes_usable(rec):
    """Can a module built with recipe ``rec`` read its sizes at run time
    (the extension entry, NumPy's headers)?"""
    return rec.get("entry") == "python" and builder.loader()["_numpy_include"]() is not None


def render_driver(module, lowered, g_of, csrc, values, rec, source="", transform="", key=""):
    """The Python module of lowered functions around the C text ``csrc``;
    ``values``: the (ints, floats) a generic text reads (None: the C is
    specialised); ``rec`` None for a standalone module."""
    return templates.environment().get_template("native_driver.py.j2").render(
        version=__version__, source=source, transform=transform, key=key,
        c_source=cstyle.py_string(csrc),
        generic=None if values is None else {
            "ints": values[0], "floats": values[1],
            "public": [f.name for f in lowered if f not in module.extra]},
        recipe=repr(None if rec is None else {k: v for k, v in rec.items() if k != "presumed"}),
        loader=builder.loader_text(), needs_math=module.needs_math,
        needs_base64=module.needs_base64, helpers=module.helpers,
        constants=module.constants,
        kernels=module.kernel_handles,
        wholes=[{"handle": f"_{f.cname}", "name": f.cname,
                 "inputs": [(dt, n) for dt, n in f.in_info],
                 "outputs": [(o["shape"], o["dtype"], o["scalar"], o["zeroed"]) for o in f.outs]}
                for f in lowered if isinstance(f, whole.WholeFunction)],
        functions=[{"name": f.name, "args": f.args, "doc": f.doc, "body": f.body,
                    "returns": f.returns,
                    "asarray": [] if isinstance(f, whole.WholeFunction) else
                    _array_args(f, g_of[id(f)]),
                    "scratch": getattr(f, "scratch", [])}
                   for f in lowered])
