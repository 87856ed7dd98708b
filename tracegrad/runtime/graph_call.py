"""Compiled graphs as callables, and compiled calls on the eager tape.

A ``GraphFunction`` wraps one traced graph.  It generates (or takes from the
cache) the NumPy code of the graph and of the graphs derived from it: the
forward part that also returns the residuals the backward needs, the
backward part, and the joint vjp graph used for double backward.

``call_tensors`` runs the graph on eager Tensors and records ONE node on the
tape (``CompiledBackward``) whose backward runs the generated backward code,
so hooks, accumulation and ``create_graph=True`` behave as in eager mode: with
``create_graph`` the backward is itself a compiled call on Tensors, recorded
on the tape, so its derivative is the adjoint of the backward graph.
"""
from __future__ import annotations

import inspect
import re

import numpy as np

from tracegrad.runtime import cache
from tracegrad._version import __version__
from tracegrad.eager.graph import FREED_MSG, Node
from tracegrad.eager.profiler_state import _state as _prof_state
from tracegrad.frontend.trace import trace_function, tree_flatten, tree_unflatten, leaf_paths
from tracegrad.ops import primitives
from tracegrad.ops.primitives import Aval


def leaf_array(x, where):
    """The array behind one argument leaf, and whether it was a Tensor."""
    t = type(x)
    if t is np.ndarray:
        return x, False
    if hasattr(x, "grad_fn") and hasattr(x, "_data"):
        return x._data, True
    if isinstance(x, (bool, int, float)) or isinstance(x, np.generic):
        return np.asarray(x), False
    if t.__module__.startswith("cupy") or t is np.random.Generator:
        # a Generator is handed to the generated code, which draws from it
        return x, False
    if hasattr(x, "__array__") and not isinstance(x, (str, bytes)):
        return np.asarray(x), False
    raise TypeError(f"{where}: tracegrad compiles functions of arrays and numbers (and tuples, "
                    f"lists and dicts of them); got a {t.__name__}. Pass non-array arguments "
                    f"as static (static_argnums=/static_argnames=).")


class GraphFunction:
    """A graph compiled to NumPy, keyed by its structure in the cache."""
    # "cupy": generate the CUDA target's driver (tracegrad/targets/cuda/);
    # set from the trace and inherited by the derived graphs.
    backend = "numpy"

    def __init__(self, key, make_graph, name, n_in, n_out):
        self.key = key                # structural key (str), part of the cache key
        self._make_graph = make_graph
        self._graph = None
        self.name = name
        self.n_in = n_in              # inputs and outputs of the original graph
        self.n_out = n_out
        self._fn = None
        self._derived = {}

    @classmethod
    def from_trace(cls, trace, names, name):
        def make():
            from tracegrad.runtime import pipeline
            return pipeline.graph_of(trace)
        gf = cls(trace.structure_hash(), make, name, len(trace.inputs), len(trace.outputs))
        gf.backend = trace.backend
        return gf

    @property
    def graph(self):
        if self._graph is None:
            self._graph = self._make_graph()
        return self._graph

    def _parts(self):
        from tracegrad.runtime.cache import templates_hash
        return {"function": self.name, "graph": self.key, "version": __version__,
                "templates": templates_hash(), "transform": "graph", "backend": self.backend}

    def source(self):
        from tracegrad.runtime import pipeline
        return pipeline.generate(
            [(self.graph, "run", self.graph_arg_names(), f"{self.name}.")],
            self.backend, source=self.name, transform=self.key[:16],
            key=cache.key_hash(self._parts()))

    def graph_arg_names(self):
        g = self.graph
        return [g.nodes[v]["name"] for v in g.graph["inputs"]]

    def fn(self):
        if self._fn is None:
            from tracegrad.runtime import pipeline
            parts = self._parts()
            self._fn = pipeline.load(cache.key_hash(parts), parts, self.source)["run"]
        return self._fn

    def run(self, *arrays):
        prof = _prof_state.current
        if prof is not None:
            return profiled_call(prof, self.name, self.fn(), arrays)
        return self.fn()(*arrays)

    # --- derived graphs -------------------------------------------------------------
    def derived(self, what):
        """'vjp_fwd', 'vjp_bwd' (split of the joint vjp graph), 'joint' (the
        joint vjp graph: inputs, cotangents -> input cotangents), 'jvp'."""
        gf = self._derived.get(what)
        if gf is not None:
            return gf
        from tracegrad.runtime import pipeline
        wrt = range(self.n_in)

        if what in ("vjp_fwd", "vjp_bwd"):
            holder = {}

            def part(i):
                def make():
                    if "split" not in holder:
                        holder["split"] = pipeline.split(pipeline.transform(self.graph, "vjp", wrt),
                                                         self.n_in, self.n_out)
                    return holder["split"][i]
                return make
            fwd = GraphFunction(self.key + "/vjp_fwd", part(0), self.name + " (forward)",
                                self.n_in, None)
            bwd = GraphFunction(self.key + "/vjp_bwd", part(1), self.name + " (backward)",
                                None, self.n_in)
            fwd.backend = bwd.backend = self.backend
            self._derived["vjp_fwd"] = fwd
            self._derived["vjp_bwd"] = bwd
            return self._derived[what]
        if what == "joint":
            gf = GraphFunction(self.key + "/joint",
                               lambda: pipeline.transform(self.graph, "joint", wrt),
                               self.name + " (vjp)", self.n_in + self.n_out, self.n_in)
        elif what == "jvp":
            gf = GraphFunction(self.key + "/jvp", lambda: pipeline.transform(self.graph, "jvp", wrt),
                               self.name + " (jvp)", 2 * self.n_in, 2 * self.n_out)
        else:
            raise ValueError(what)
        gf.backend = self.backend
        self._derived[what] = gf
        return gf

    # --- on the eager tape -----------------------------------------------------------
    def call_tensors(self, values):
        """Run on a list of Tensors/arrays; record one tape node when any
        Tensor requires grad and grad mode is on."""
        from tracegrad.eager.tensor import _FW
        outputs = self._call_tensors(values)
        if _FW.level is not None:
            # dual tensors among the arguments: the outputs get their tangents
            # from the compiled forward-mode graph (never silently none)
            from tracegrad.eager import forward_ad
            forward_ad.attach_compiled_tangents(self, values, outputs)
        return outputs

    def _call_tensors(self, values):
        from tracegrad.eager.grad_mode import state
        from tracegrad.eager.tensor import Tensor
        arrays = [v._data if isinstance(v, Tensor) else np.asarray(v) for v in values]
        track = state.grad_enabled and any(isinstance(v, Tensor) and v._requires_grad
                                           for v in values)
        if not track:
            return tuple(Tensor(np.asarray(o)) for o in self.run(*arrays))
        fwd = self.derived("vjp_fwd")
        outs = fwd.run(*arrays)
        n_out = self.n_out
        residuals = outs[n_out:]
        node = CompiledBackward(self, values, residuals, [np.asarray(o) for o in outs[:n_out]])
        res = []
        for i, o in enumerate(outs[:n_out]):
            o = np.asarray(o)
            if np.issubdtype(o.dtype, np.inexact):
                res.append(Tensor(o, True, node, i))
            else:
                res.append(Tensor(o))
        return tuple(res)


_STATEMENT = re.compile(r"^(\s+)(t\d+ = .*?)  # (%\d+ \w+)$")
_instrumented_cache = cache.LRU(cache.DEFAULT_MEMORY_CACHE_SIZE)   # generated fn -> instrumented


def instrumented(fn):
    """The generated function with each statement wrapped in a profiler
    ``record_function`` named after its graph node (``%12 matmul``), so a
    compiled call shows its generated kernels as child events.  Built from
    the generated source only while a profiler is recording."""
    got = _instrumented_cache.get(fn)
    if got is not None:
        return got
    from tracegrad.eager.profiler import record_function
    src = inspect.getsource(fn)
    lines = []
    for line in src.splitlines():
        m = _STATEMENT.match(line)
        if m:
            line = f"{m.group(1)}with _record_function({m.group(3)!r}, cat='kernel'): {m.group(2)}"
        lines.append(line)
    ns = dict(fn.__globals__, _record_function=record_function)
    exec(compile("\n".join(lines) + "\n", fn.__code__.co_filename, "exec"), ns)
    got = _instrumented_cache[fn] = ns[fn.__name__]
    return got


def profiled_call(prof, name, fn, arrays):
    fn = instrumented(fn)
    ev = prof._begin(name, "compiled", arrays)
    try:
        return fn(*arrays)
    finally:
        prof._end(ev)


class CompiledBackward(Node):
    """The one tape node of a compiled call."""
    __slots__ = ("gf", "saved", "versions", "residuals", "freed", "out_meta")

    def __init__(self, gf, values, residuals, outs):
        from tracegrad.eager.tensor import Tensor
        super().__init__(tuple(v._edge() if isinstance(v, Tensor) else None for v in values))
        self.gf = gf
        self.saved = list(values)
        self.versions = [v._vbox[0] if isinstance(v, Tensor) else None for v in values]
        self.residuals = residuals
        self.freed = False
        self.output_meta = [(o.shape, o.dtype) for o in outs]

    def name(self):
        return f"CompiledFunctionBackward[{self.gf.name}]"

    def num_outputs(self):
        return len(self.output_meta)

    def release(self):
        self.saved = None
        self.residuals = None
        self.freed = True

    def apply(self, grad_outputs, create_graph):
        from tracegrad.eager.tensor import Tensor
        if self.freed:
            raise RuntimeError(FREED_MSG)
        for v, ver in zip(self.saved, self.versions):
            if ver is not None and v._vbox[0] != ver:
                raise RuntimeError(
                    f"one of the variables needed for gradient computation has been modified by "
                    f"an inplace operation: an input of {self.name()} is at version "
                    f"{v._vbox[0]}; expected version {ver} instead.")
        cts = []
        for g, (shape, dtype) in zip(grad_outputs, self.output_meta):
            if g is None:
                g = Tensor(np.zeros(shape, dtype))
            cts.append(g)
        if create_graph:
            joint = self.gf.derived("joint")
            return list(joint.call_tensors(list(self.saved) + cts))
        bwd = self.gf.derived("vjp_bwd")
        outs = bwd.run(*self.residuals, *[c._data for c in cts])
        return [Tensor(np.asarray(o)) for o in outs]


# --- tg.vjp and tg.jvp ---------------------------------------------------------------

def _trace_flat(fn, primals, backend):
    leaves, tree = tree_flatten(tuple(primals))
    arrays = [leaf_array(x, "primal")[0] for x in leaves]
    names = leaf_paths(tree, "x")
    avals = [Aval(tuple(a.shape), a.dtype) for a in arrays]

    def rebuild(tracers):
        return list(tree_unflatten(tree, tracers)), {}

    if backend is None:  # CuPy arrays select the CUDA target, as in tracegrad.api
        from tracegrad.runtime import pipeline
        backend = "cupy" if any(type(a).__module__.startswith("cupy") for a in arrays) \
            else pipeline.default_backend()
    faces = ["torch" if hasattr(x, "grad_fn") else "numpy" for x in leaves]
    trace, out_tree = trace_function(fn, avals, rebuild, names, backend, faces)
    cache.count("traces")
    name = getattr(fn, "__qualname__", "f")
    return trace, out_tree, tree, arrays, names, name


_VJP_CACHE = cache.LRU(cache.DEFAULT_MEMORY_CACHE_SIZE)   # structure hash -> GraphFunction


def vjp(fn, primals, has_aux, backend):
    trace, out_tree, in_tree, arrays, names, name = _trace_flat(fn, primals, backend)
    key = trace.structure_hash()
    gf = _VJP_CACHE.get(key)
    if gf is None:
        gf = _VJP_CACHE[key] = GraphFunction.from_trace(trace, names, name)
    fwd = gf.derived("vjp_fwd")
    bwd = gf.derived("vjp_bwd")
    outs = fwd.run(*arrays)
    n_out = len(trace.outputs)
    primal_outs = list(outs[:n_out])
    residuals = outs[n_out:]
    out = tree_unflatten(out_tree, primal_outs)
    if has_aux:
        out, aux = out
        aux_n = len(tree_flatten(aux)[0])

    def vjp_fn(ct):
        if has_aux:
            ct_leaves = tree_flatten(ct)[0] + [np.zeros_like(o) for o in primal_outs[-aux_n:]] \
                if aux_n else tree_flatten(ct)[0]
        else:
            ct_leaves = tree_flatten(ct)[0]
        if len(ct_leaves) != n_out:
            raise ValueError(f"vjp_fn expects cotangents shaped like the function's output "
                             f"({n_out} arrays), got {len(ct_leaves)}")
        cts = []
        for c, o in zip(ct_leaves, primal_outs):
            c = primitives.array_module(o).asarray(  # CuPy outputs too
                c, dtype=o.dtype if hasattr(o, "dtype") else np.asarray(o).dtype)
            if c.shape != np.shape(o):
                raise ValueError(f"vjp_fn: cotangent of shape {c.shape} for an output of shape "
                                 f"{np.shape(o)}")
            cts.append(c)
        res = bwd.run(*residuals, *cts)
        return tuple(tree_unflatten(in_tree, list(res)))

    if has_aux:
        return out, vjp_fn, aux
    return out, vjp_fn


def jvp(fn, primals, tangents, backend):
    primals, tangents = tuple(primals), tuple(tangents)
    trace, out_tree, in_tree, arrays, names, name = _trace_flat(fn, primals, backend)
    t_leaves, t_tree = tree_flatten(tangents)
    if t_tree != in_tree:
        raise ValueError("jvp: tangents must have the same structure as primals")
    t_arrays = []
    for t, a in zip(t_leaves, arrays):
        t = primitives.array_module(a).asarray(leaf_array(t, "tangent")[0], dtype=a.dtype)  # CuPy too
        if t.shape != a.shape:
            raise ValueError(f"jvp: tangent of shape {t.shape} for a primal of shape {a.shape}")
        t_arrays.append(t)
    key = trace.structure_hash()
    gf = _VJP_CACHE.get(key)
    if gf is None:
        gf = _VJP_CACHE[key] = GraphFunction.from_trace(trace, names, name)
    outs = gf.derived("jvp").run(*arrays, *t_arrays)
    n = len(trace.outputs)
    return tree_unflatten(out_tree, list(outs[:n])), tree_unflatten(out_tree, list(outs[n:]))
