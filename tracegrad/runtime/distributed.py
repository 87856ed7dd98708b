"""Compiled values and gradients over ``dask.array`` data: one Dask task per
chunk, a tree sum of the chunks' results.

A loss over a dataset that is a sum (or a mean) over rows of per-row terms
is the sum of the same loss over the rows of each chunk, and so is its
gradient.  ``tg.grad(f)(w, X, y)`` with ``X`` and ``y`` dask arrays chunked
along one axis (the rows) therefore runs as:

1. **plan** (``Plan``, once per call signature): the function is traced on
   the full shapes (nothing is computed) and the forward graph is checked
   (``_analyse``): which nodes carry the row axis of which input, that the
   row axis is removed only by a ``sum`` (``np.mean`` is a sum and a division
   by the total count), and that what follows is linear in those sums.  Any
   op that mixes rows (a sort, a cumsum or a max over the rows, ``x @ x.T``,
   a nonlinear function of a sum over rows, a penalty term added once) is a
   ``NotSeparableError`` naming the op and the user's source line.
2. **program per chunk shape** (``Plan.program``): the checked graph is
   replayed on tracers of the chunk's shape (``_replay``: a ``reshape`` or
   ``broadcast_to`` that names the row count gets the chunk's), keeping every
   constant, so a mean still divides by the total count.  That trace goes
   through the one pipeline (graph, value-and-gradient transform, passes,
   NumPy codegen) and the cache (``pipeline.load``): compiled once per chunk
   shape per process, and on disk under its own key.
3. **run** (``Plan.run``): Dask schedules it, nothing of ours does.  One
   ``dask.delayed`` task per chunk calls the generated function on that
   chunk's blocks; the per-chunk outputs are added in a tree
   (``SPLIT_EVERY`` at a time); ``dask.compute`` runs the graph on the
   threaded scheduler by default, or on ``dask.distributed`` when a
   ``Client`` is active.  The parameters (the non-dask arguments) and the
   generated source travel in one ``_Payload`` per call, a single delayed
   object of the task graph: each worker that runs chunks receives it once,
   and Dask can rebuild it if the workers holding it die (scattered data
   could not be).  A worker loads the program by its cache key from
   its own tracegrad cache (memory, then disk) and only on a miss stores the
   source it was sent, so workers need neither the user's code nor the
   compiler's graph libraries to be importable by the user's module path.

Nothing here imports dask until a dask array is passed (dask arrays are
recognised by their type's module name), and this module imports nothing
above the pipeline: ``api`` calls it.
"""
from __future__ import annotations

import linecache
import os
import threading

import numpy as np

from tracegrad.runtime import cache
from tracegrad.ops import primitives
from tracegrad._version import __version__
from tracegrad.ops.primitives import Aval
from tracegrad.frontend.trace import trace_function

# Chunk results added per task of the tree sum.  They are the size of the
# parameters, so adding many is cheap, while every task costs a scheduling
# round (a few ms on dask.distributed): wider than dask.array's 4 (dask.bag's 8).
SPLIT_EVERY = 8


class NotSeparableError(ValueError):
    """A function given dask arrays whose result is not a sum (or mean) over
    the rows of per-row terms, so it cannot be computed chunk by chunk."""


def is_dask_array(x):
    """Is ``x`` a ``dask.array.Array``?  (Asked without importing dask.)"""
    t = type(x)
    return t.__name__ == "Array" and t.__module__.startswith("dask.array")


def has_dask_arrays(leaves):
    """Is any of ``leaves`` a dask array?"""
    return any(is_dask_array(x) for x in leaves)


def batch_axes(arrays, names):
    """{leaf index: row axis} of the dask arrays among ``arrays``: the one
    axis with more than one chunk (axis 0 when there is a single chunk)."""
    axes = {}
    n_rows = None
    for j, x in enumerate(arrays):
        if not is_dask_array(x):
            continue
        name = names[j] if j < len(names) else f"leaf {j}"
        if any(isinstance(s, float) and np.isnan(s) for s in x.shape):
            raise ValueError(f"dask array argument '{name}' has unknown chunk sizes "
                             f"(shape {x.shape}); call {name}.compute_chunk_sizes() first")
        if x.ndim == 0:
            raise ValueError(f"dask array argument '{name}' is 0-dimensional: it has no rows "
                             f"to split; pass it as a NumPy array")
        multi = [i for i, n in enumerate(x.numblocks) if n > 1]
        if len(multi) > 1:
            raise ValueError(
                f"dask array argument '{name}' is chunked along axes {multi} (chunks "
                f"{x.chunks}); tracegrad splits the rows of one axis only. Rechunk the others "
                f"whole, e.g. {name}.rechunk({{{multi[1]}: -1}})")
        ax = multi[0] if multi else 0
        if n_rows is None:
            n_rows, first = x.shape[ax], name
        elif x.shape[ax] != n_rows:
            raise ValueError(f"dask array arguments '{first}' and '{name}' have {n_rows} and "
                             f"{x.shape[ax]} rows along their chunked axes; the rows of all "
                             f"dask arguments must correspond")
        axes[j] = ax
    return axes


# --- the check: which nodes carry the rows -------------------------------------------------

_R = "R"   # state of a node that is a sum over rows (linear in the chunks' sums)

# ops whose result, on a sum over rows (operand 0) and other operands free of
# the data, is still linear in that sum
_LINEAR_ON_R = {"neg", "sum", "reshape", "transpose", "getitem", "broadcast_to", "clone",
                "stop_gradient"}
# ops with an `axis` attribute that work along it (each row's result would
# depend on other rows when it is the row axis)
_ALONG_AXIS = {"cumsum", "cumprod", "sort", "argsort", "flip", "roll", "concatenate",
               "repeat", "argpartition", "partition"}
_REDUCTIONS = {"prod", "amax", "amin", "argmax", "argmin", "all", "any"}
# same shape as operand 0, elementwise in effect
_SAME_SHAPE = {"clone", "zeros_like"}


def _norm_axes(axis, ndim):
    if axis is None:
        return tuple(range(ndim))
    if isinstance(axis, (tuple, list)):
        return tuple(a % ndim for a in axis)
    return (axis % ndim,)


def _where(d):
    loc = d.get("loc")
    if not loc:
        return "", ""
    line = linecache.getline(loc[0], loc[1]).strip()
    return f"{os.path.basename(loc[0])}:{loc[1]}", line


class _Checker:
    def __init__(self, g, axes, names, what):
        self.g = g
        self.names = names
        self.what = what
        self.state = {}
        self.subst = {}     # node -> output axis whose 'shape' attr entry is the row count
        inputs = g.graph["inputs"]
        for j, v in enumerate(inputs):
            self.state[v] = axes.get(j)

    def fail(self, v, why, fix):
        from tracegrad.ir import graph as ir
        d = self.g.nodes[v]
        where, line = _where(d)
        args = ", ".join(f"%{u}" for u in ir.operands(self.g, v))
        at = f" at {where}" if where else ""
        src = f"\n    {line}" if line else ""
        raise NotSeparableError(
            f"{self.what} over dask arrays: `{d['op']}`{at} {why}.{src}\n"
            f"(graph node %{v} = {d['op']}({args}).) tracegrad computes a result chunk by "
            f"chunk only when it is a sum or mean over the rows of terms that each depend on "
            f"one row. {fix}")

    def shape(self, u):
        d = self.g.nodes[u]
        s = d.get("shape")
        return tuple(s) if s is not None else ()

    def run(self):
        from tracegrad.ir import graph as ir
        g = self.g
        for v in ir.topo_order(g):
            if v in self.state:
                continue
            d = g.nodes[v]
            op = d["op"]
            if op == "const":
                self.state[v] = None
                continue
            ops = ir.operands(g, v)
            st = [self.state[u] for u in ops]
            if all(s is None for s in st):
                self.state[v] = None
            elif op == "proj" or d.get("avals") is not None:
                self.fail(v, "has several outputs and is given per-row values",
                          "Compute it on the parameters only, or rewrite it with elementwise "
                          "ops and sums.")
            elif _R in st:
                self.state[v] = self.on_sum(v, op, d, ops, st)
            else:
                self.state[v] = self.on_rows(v, op, d, ops, st)
        for v in g.graph["outputs"]:
            s = self.state[v]
            if s is None:
                raise NotSeparableError(
                    f"{self.what} over dask arrays: a result does not depend on the dask "
                    f"arrays, so there is nothing to split into chunks; pass NumPy arrays")
            if s != _R:
                self.fail(v, f"is returned with the row axis (axis {s}) still in it",
                          "Return a sum or mean over the rows (np.sum(..., axis=0) or np.mean); "
                          "for per-row results use dask's map_blocks instead.")
        return self.state, self.subst

    def on_sum(self, v, op, d, ops, st):
        """An op reading a sum over rows: it must stay linear in it."""
        n_r = sum(s == _R for s in st)
        if any(s not in (None, _R) for s in st):
            self.fail(v, "combines a sum over rows with per-row values",
                      "Finish the per-row computation before summing over the rows.")
        if op in ("add", "sub"):
            if n_r != len(st):
                self.fail(v, "adds a term that is not a sum over rows (a penalty on the "
                             "parameters, say) to one that is: every chunk would add it once",
                          "Compute that term separately on the parameters alone (NumPy "
                          "arrays) and add it, and its gradient, to the result.")
            return _R
        if op in ("mul", "matmul", "einsum") and n_r == 1:
            return _R
        if op == "div" and st[0] == _R and n_r == 1:
            return _R
        if op in _LINEAR_ON_R and st[0] == _R and n_r == 1:
            return _R
        self.fail(v, "applies a function that is not linear to a sum over the rows (or "
                     "multiplies two such sums), so the chunks' results cannot simply be added",
                  "Only a sum or mean over the rows, scaled or added to other such sums, can "
                  "be split; write the loss as np.sum/np.mean over rows of per-row terms.")

    def on_rows(self, v, op, d, ops, st):
        """An op reading per-row values: where its row axis goes, or the error."""
        g = self.g
        out_shape = tuple(d["shape"])
        r = len(out_shape)
        prim = primitives.get(op)
        rows = [(u, s) for u, s in zip(ops, st) if s is not None]
        if prim.elementwise or getattr(prim.shape, "elementwise", False) or op in _SAME_SHAPE:
            pos = {s + r - len(self.shape(u)) for u, s in rows}
            if len(pos) > 1:
                self.fail(v, "lines up the rows of dask arguments along different axes",
                          "Make the rows of every dask argument meet on the same axis.")
            p = pos.pop()
            for u, s in zip(ops, st):
                if s is None:
                    shp = self.shape(u)
                    q = p - (r - len(shp))
                    if q >= 0 and shp[q] != 1:
                        self.fail(v, f"combines per-row values with an array that is not a "
                                     f"dask array but has the row axis too (shape {shp})",
                                  "Pass that array as a dask array chunked like the others, "
                                  "so each chunk gets its rows.")
            return p
        a = st[0]
        if op == "sum" or op in _REDUCTIONS:
            if a is None:
                self.fail(v, "is given per-row values in an unexpected position",
                          "Pass them as the array to reduce.")
            axes = _norm_axes(d["attrs"].get("axis"), len(self.shape(ops[0])))
            if a in axes:
                if op == "sum":
                    return _R
                self.fail(v, f"reduces over the rows with `{op}`: its value depends on all the "
                             f"rows at once, and only a sum or mean over the rows splits into "
                             f"chunks", "Reduce over the other axes, or compute it per row.")
            if d["attrs"].get("keepdims"):
                return a
            return a - sum(1 for x in axes if x < a)
        if op in _ALONG_AXIS:
            axis = d["attrs"].get("axis")
            if op != "concatenate" and (a is None or len(rows) > 1):
                self.fail(v, "is given per-row values in an unexpected position",
                          "Pass them as the array it works on.")
            if op == "concatenate" and len({s for _, s in rows}) != 1:
                self.fail(v, "joins per-row values on different axes", "Line the rows up.")
            nd = len(self.shape(rows[0][0]))
            if axis is None or rows[0][1] in _norm_axes(axis, nd):
                self.fail(v, "works along the row axis, so each row's result depends on other "
                             "rows (or it flattens the rows)",
                          "Apply it along another axis, or to a quantity summed over the rows.")
            if op == "concatenate" and len(rows) != len(ops):
                self.fail(v, "joins per-row values with arrays that are not dask arrays",
                          "Pass them all as dask arrays chunked alike.")
            return rows[0][1]
        if op == "transpose" and a is not None:
            return tuple(d["attrs"]["axes"]).index(a)
        if op == "reshape" and a is not None:
            ins = self.shape(ops[0])
            before = int(np.prod(ins[:a]))
            after = int(np.prod(ins[a + 1:]))
            for q in range(r):
                if (int(np.prod(out_shape[:q])) == before and out_shape[q] == ins[a]
                        and int(np.prod(out_shape[q + 1:])) == after):
                    self.subst[v] = q
                    return q
            self.fail(v, f"reshapes {list(ins)} to {list(out_shape)}, which merges or splits "
                         f"the row axis (axis {a})",
                      "Keep the rows as one axis of their own.")
        if op == "broadcast_to" and a is not None:
            q = a + r - len(self.shape(ops[0]))
            self.subst[v] = q
            return q
        if op == "getitem" and a is not None and len(rows) == 1:
            return self.getitem_axis(v, d, a, len(self.shape(ops[0])))
        if op == "matmul":
            return self.matmul_axis(v, ops, st, r)
        if op == "einsum":
            return self.einsum_axis(v, d, st)
        self.fail(v, f"is given per-row values, and `{op}` is not an op tracegrad knows how to "
                     f"split by rows", "Write the per-row part with elementwise ops, matmul "
                     "by parameters, reductions over other axes, and end with np.sum/np.mean "
                     "over the rows.")

    def getitem_axis(self, v, d, a, nd):
        index = d["attrs"]["index"]
        kinds = [it[0] for it in index]
        if "e" in kinds:
            k = kinds.index("e")
            used = sum(1 for x in kinds if x in "sia")
            index = index[:k] + (("s", None, None, None),) * (nd - used) + index[k + 1:]
        if any(it[0] == "a" for it in index):
            self.fail(v, "indexes per-row values with index arrays",
                      "Select with slices on the other axes, or with a one-hot mask.")
        out_axis = 0
        in_axis = 0
        for it in index:
            if it[0] == "n":
                out_axis += 1
                continue
            if in_axis == a:
                if it[0] == "s" and it[1:] == (None, None, None):
                    return out_axis
                self.fail(v, "selects particular rows", "Take all rows (:) on the row axis.")
            in_axis += 1
            if it[0] == "s":
                out_axis += 1
        return out_axis + (a - in_axis)

    def einsum_axis(self, v, d, st):
        lhs, out = d["attrs"]["subscripts"].split("->")   # explicit, no '...' (normalised)
        ins = lhs.split(",")
        letters = {ins[k][s] for k, s in enumerate(st) if s is not None}
        if len(letters) > 1:
            self.fail(v, "pairs the rows of dask arguments with each other (different "
                         "subscripts on their row axes)", "Give their row axes one subscript.")
        row = letters.pop()
        for k, s in enumerate(st):
            if ins[k].count(row) > (1 if s is not None else 0):
                self.fail(v, f"uses the row subscript '{row}' on an operand that is not a dask "
                             f"array, or twice on one operand",
                          "Pass that operand as a dask array chunked like the others.")
        return out.index(row) if row in out else _R   # summed over rows: a sum over rows

    def matmul_axis(self, v, ops, st, r):
        (ua, sa), (ub, sb) = zip(ops, st)
        na, nb = len(self.shape(ua)), len(self.shape(ub))
        a_contracted = sa is not None and sa == na - 1
        b_contracted = sb is not None and (nb == 1 or sb == nb - 2)
        if sa is not None and sb is not None:
            if a_contracted and b_contracted:
                return _R          # sum over rows of products of per-row terms
            self.fail(v, "multiplies per-row values of two dask arguments without summing over "
                         "their rows (x @ x.T pairs every row with every other)",
                      "Contract over the rows (x.T @ y) or work row by row.")
        if a_contracted or b_contracted:
            self.fail(v, "contracts the row axis with an array that is not a dask array",
                      "Pass the other operand as a dask array chunked like the first.")
        if sa is not None:
            if nb == 1:
                return sa + r - (na - 1)
            q = sa - na + nb          # b's stack axis lined up with the rows (a stacked matmul)
            if sa < na - 2 and q >= 0 and self.shape(ub)[q] != 1:
                self.fail(v, "broadcasts per-row values against a stack of matrices that has "
                             "the row axis too", "Pass that operand as a dask array.")
            return sa + r - na
        if sb == nb - 1:
            return r - 1
        self.fail(v, "multiplies by a stack of per-row matrices", "Put the rows in the "
                  "first operand's row position.")


# --- the per-chunk program ------------------------------------------------------------------

def _replay(g, subst, rows_of):
    """A function of the graph's inputs that records g's nodes again on
    tracers of a chunk's shape: the row count in a reshape or broadcast_to
    becomes the chunk's (``rows_of``), everything else (constants included)
    is kept."""
    from tracegrad.ir import graph as ir
    order = ir.topo_order(g)

    def chunk(*xs):
        env = dict(zip(g.graph["inputs"], xs))
        trace = next((getattr(x, "_trace", None) for x in xs if hasattr(x, "_trace")), None)
        for v in order:
            if v in env:
                continue
            d = g.nodes[v]
            op = d["op"]
            if op == "const":
                env[v] = d["value"]
                continue
            if op == "proj":
                env[v] = env[ir.operands(g, v)[0]][d["attrs"]["index"]]
                continue
            attrs = d["attrs"]
            if v in subst:
                shape = list(attrs["shape"])
                shape[subst[v]] = rows_of
                attrs = dict(attrs, shape=tuple(shape))
            if trace is not None:
                trace.loc_override = d.get("loc")
            env[v] = primitives.bind(primitives.get(op), *[env[u] for u in ir.operands(g, v)],
                                     **attrs)
        if trace is not None:
            trace.loc_override = None
        return tuple(env[v] for v in g.graph["outputs"])
    return chunk


class _Program:
    __slots__ = ("khash", "parts", "source", "name")

    def __init__(self, khash, parts, source, name):
        self.khash, self.parts, self.source, self.name = khash, parts, source, name


# cache key -> generated function, in this process (client or worker)
_LOADED = cache.LRU(256)
cache.on_clear_memory.append(_LOADED.clear)
_LOAD_LOCK = threading.Lock()


def _source_of(ns):
    """The generated source of a loaded cache entry (its header line removed)."""
    lines = linecache.getlines(ns.get("__file__", ""))
    if lines and lines[0].startswith(cache._HEADER_PREFIX):
        lines = lines[1:]
    return "".join(lines) or None


def _load(prog):
    """The generated function of ``prog`` in this process: from memory, the
    tracegrad cache (memory, disk), or, on a miss, the source that came with
    it (then stored in this process's cache like any compile)."""
    fn = _LOADED.get(prog.khash)
    if fn is not None:
        return fn
    from tracegrad.runtime import pipeline
    if cache.key_hash(prog.parts) != prog.khash:
        raise RuntimeError(f"tracegrad: the chunk program {prog.khash} does not match the key "
                           f"parts sent with it; it was not loaded")
    if prog.source is None:
        raise RuntimeError("tracegrad: this worker has no compiled chunk program and was sent "
                           "no source for it")
    with _LOAD_LOCK:
        ns = pipeline.load(prog.khash, prog.parts, lambda: prog.source)
        fn = _LOADED[prog.khash] = ns[prog.name]
    return fn


class _Payload:
    """What every chunk task reads: the parameters (None where a chunk's
    block goes) and the programs by chunk length.  Sent once per call."""
    __slots__ = ("params", "programs")

    def __init__(self, params, programs):
        self.params = params
        self.programs = programs

    def __reduce__(self):
        return (_Payload, (self.params, self.programs))


def _aligned(block):
    """``block``, copied when its data is not aligned for its dtype.

    dask.distributed can hand a worker a block at an odd address (an array
    embedded in the task graph, e.g. by ``da.from_array``, arrives inside a
    message frame); NumPy then leaves BLAS for its own generic loops and a
    matmul runs several times slower, so one copy is far cheaper."""
    if isinstance(block, np.ndarray) and not block.flags.aligned:
        return block.copy()
    return block


def _chunk_task(payload, rows, *blocks):
    """One Dask task: the generated function on one chunk's blocks."""
    fn = _load(payload.programs[rows])
    it = iter(_aligned(b) for b in blocks)
    args = [next(it) if p is None else p for p in payload.params]
    return tuple(fn(*args))


def _add(*parts):
    """The elementwise sum of several chunks' output tuples."""
    total = list(parts[0])
    for p in parts[1:]:
        for k, x in enumerate(p):
            total[k] = total[k] + x
    return tuple(total)


class Plan:
    """A function checked for chunking, for one signature: builds a program
    per chunk length and runs a call on Dask."""

    def __init__(self, trace, avals, axes, wrt, kind, names, fn_name, backend):
        from tracegrad.runtime import pipeline
        self.what = f"tg.{kind} of {fn_name.rsplit('.', 1)[-1]}"
        if backend != "numpy":
            raise NotImplementedError(f"{self.what}: dask arrays are computed with the NumPy "
                                      f"backend only (got backend={backend!r})")
        for j in wrt:
            if j in axes:
                raise TypeError(f"{self.what}: argument '{names[j]}' is a dask array (the "
                                f"data); differentiate with respect to the parameters (NumPy "
                                f"arrays) instead, with argnums")
        self.g = pipeline.graph_of(trace)
        self.state, self.subst = _Checker(self.g, axes, names, self.what).run()
        self.avals = avals
        self.axes = axes
        self.wrt = wrt
        self.kind = kind
        self.names = names
        self.fn_name = fn_name
        self.backend = backend
        self.programs = {}
        self._lock = threading.Lock()

    def program(self, rows):
        """The compiled program for chunks of ``rows`` rows (built once)."""
        prog = self.programs.get(rows)
        if prog is not None:
            return prog
        with self._lock:
            prog = self.programs.get(rows)
            if prog is None:
                prog = self.programs[rows] = self._build(rows)
        return prog

    def _build(self, rows):
        from tracegrad.runtime import pipeline
        avals = []
        for j, a in enumerate(self.avals):
            if j in self.axes:
                shape = list(a.shape)
                shape[self.axes[j]] = rows
                a = Aval(tuple(shape), a.dtype)
            avals.append(a)
        replay = _replay(self.g, self.subst, rows)
        trace, _ = trace_function(replay, avals, lambda xs: (xs, {}), self.names, self.backend)
        cache.count("traces")
        kind = "forward" if self.kind == "forward" else "value_and_grad"
        name = "forward" if kind == "forward" else "value_and_grad"
        total = self.avals[next(iter(self.axes))].shape[self.axes[next(iter(self.axes))]]
        parts = {
            "function": f"{self.fn_name} [dask chunk]",
            "signature": [f"{a.dtype}{list(a.shape)}" for a in avals],
            "backend": self.backend,
            "static": "()",
            "wrt": repr(self.wrt),
            "transform": kind,
            "chunk": f"{rows} of {total} rows",
            "version": __version__,
            "templates": cache.templates_hash(),
            "graph": trace.structure_hash(),
        }
        khash = cache.key_hash(parts)
        made = []

        def make():
            g = pipeline.transform(pipeline.graph_of(trace), kind, self.wrt)
            doc = (f"The {'value' if kind == 'forward' else 'value and gradient'} of "
                   f"{self.fn_name} on one chunk of {rows} of its {total} rows.")
            made.append(pipeline.generate([(g, name, self.names, doc)], self.backend,
                                          source=self.fn_name, transform=kind + " [dask chunk]",
                                          key=khash))
            return made[0]

        ns = pipeline.load(khash, parts, make, explain_as=parts["function"])
        _LOADED[khash] = ns[name]
        source = made[0] if made else _source_of(ns)
        return _Program(khash, parts, source, name)

    def run(self, arrays):
        """The flat outputs (value(s), then gradients) summed over all chunks."""
        import dask
        # the rows are cut where the most finely chunked dask argument cuts them
        row_chunks = max((arrays[j].chunks[ax] for j, ax in self.axes.items()), key=len)
        blocks = {}
        for j, ax in self.axes.items():
            x = arrays[j]
            want = tuple(row_chunks if i == ax else (x.shape[i],) for i in range(x.ndim))
            if x.chunks != want:
                x = x.rechunk(want)
            blocks[j] = x.to_delayed().reshape(-1)
        sizes = [n for n in row_chunks]
        programs = {n: self.program(n) for n in set(sizes) if n > 0}
        params = [None if j in self.axes else a for j, a in enumerate(arrays)]
        # One object in the task graph, whatever the scheduler: Dask sends it
        # to each worker that runs a chunk once, and, unlike scattered data,
        # can make it again if every worker holding it dies.
        ref = dask.delayed(_Payload(params, programs), pure=False)
        task = dask.delayed(_chunk_task, pure=False)
        level = [task(ref, n, *[blocks[j][i] for j in self.axes])
                 for i, n in enumerate(sizes) if n > 0]
        if not level:
            raise ValueError(f"{self.what}: the dask arguments have no rows")
        add = dask.delayed(_add, pure=False)
        while len(level) > 1:
            level = [add(*level[i:i + SPLIT_EVERY]) if len(level[i:i + SPLIT_EVERY]) > 1
                     else level[i] for i in range(0, len(level), SPLIT_EVERY)]
        (total,) = dask.compute(level[0])
        return list(total)
