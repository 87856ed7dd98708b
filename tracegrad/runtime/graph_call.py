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


# the dtype kinds compiled code takes: bool, signed and unsigned integer,
# floating point, complex (a np.random.Generator is taken whole, not as an array)
ACCEPTED_KINDS = frozenset("biufc")
ACCEPTED_DTYPES = "bool, integer, floating-point or complex"
_GENERATORS = (np.random.Generator, np.random.RandomState)   # captured state passed whole


def leaf_array(x, where):
    """The array behind one argument leaf, and whether it was a Tensor.

    ``where`` names the leaf in an error (``"tg.grad of f: argument 'x'"``):
    a string, or a function of no arguments giving one, called only when the
    leaf is refused (so a call that succeeds formats nothing)."""
    t = type(x)
    if t is np.ndarray:
        if x.dtype.kind not in ACCEPTED_KINDS:
            raise dtype_error(where, x.dtype)
        return x, False
    if hasattr(x, "grad_fn") and hasattr(x, "_data"):
        if x._data.dtype.kind not in ACCEPTED_KINDS:
            raise dtype_error(where, x._data.dtype, "tensor")
        return x._data, True
    if t.__module__.startswith("cupy") or t is np.random.Generator:
        # a Generator is handed to the generated code, which draws from it
        return x, False
    if isinstance(x, (bool, int, float, complex, np.generic)) or (
            hasattr(x, "__array__") and not isinstance(x, (str, bytes))):
        a = np.asarray(x)
        if a.dtype.kind not in ACCEPTED_KINDS:
            raise dtype_error(where, a.dtype,
                              "array" if isinstance(x, np.ndarray) else t.__name__)
        return a, False
    where = where() if callable(where) else where
    if isinstance(x, (np.random.RandomState, np.random.BitGenerator)):
        raise TypeError(f"{where} is a np.random.{t.__name__}; compiled functions take a "
                        f"np.random.Generator argument (np.random.default_rng(seed)), drawn "
                        f"from on every call, but not a {t.__name__}. Pass a Generator, or "
                        f"draw the numbers outside and pass them as an array.")
    raise TypeError(f"{where} is {_a(t.__name__)}: tracegrad compiles functions of arrays and "
                    f"numbers (and tuples, lists and dicts of them), not {_a(t.__name__)}. Pass "
                    f"non-array arguments as static (static_argnums=/static_argnames=).")


def _a(noun):
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"


def dtype_error(where, dtype, what="array"):
    """The TypeError for an argument leaf whose dtype compiled code cannot take."""
    where = where() if callable(where) else where
    return TypeError(f"{where} is {_a(what)} of dtype "
                     f"{dtype}; tracegrad compiles functions of arrays of {ACCEPTED_DTYPES} "
                     f"dtype (and np.random.Generator arguments), not {dtype}. Convert it to "
                     f"one of those first, e.g. np.asarray(x, dtype=np.float64).")


def display_paths(treedef, prefix):
    """Each leaf's path as Python writes it, for messages: x, p['w'], xs[1],
    pair.bias (``leaf_paths`` gives the identifiers of the generated code).
    prefix None: a dict of keyword arguments, whose keys are the names."""
    return leaf_paths(treedef, prefix, index="{}[{}]", field="{}.{}",
                      key=lambda path, k: str(k) if path is None else f"{path}[{k!r}]")


def describe_path(path, what="argument"):
    """``argument 'x'`` for a name, ``argument p['w']`` for a path in it."""
    return f"{what} '{path}'" if path.isidentifier() else f"{what} {path}"


class GraphFunction:
    """A graph compiled to NumPy, keyed by its structure in the cache."""
    # "cupy": generate the CUDA target's driver (tracegrad/targets/cuda/);
    # set from the trace and inherited by the derived graphs.
    backend = "numpy"

    def __init__(self, key, make_graph, name, n_in, n_out, fixed=()):
        self.key = key                # structural key (str), part of the cache key
        self._make_graph = make_graph
        self._graph = None
        self.name = name
        self.n_in = n_in              # inputs and outputs of the original graph
        self.n_out = n_out
        # positions of inputs that are not differentiated: the captured
        # arrays and generators a trace reads at call time (passed by the
        # caller like the others; they get no cotangent and no tangent)
        self.fixed = tuple(fixed)
        self._fn = None
        self._derived = {}

    @classmethod
    def from_trace(cls, trace, names, name, captured_tensors_wrt=False):
        """captured_tensors_wrt: the captured Tensors of a floating dtype (an
        nn.Module's parameters) are differentiated too, as the arguments (a
        compiled call on the tape gives them their gradients)."""
        def make():
            from tracegrad.runtime import pipeline
            return pipeline.graph_of(trace)
        n_in = len(trace.inputs)
        n_cap = len(trace.implicit)
        diff = [j for j, src in enumerate(trace.implicit_src)
                if captured_tensors_wrt and hasattr(src, "grad_fn")
                and np.dtype(src.dtype).kind in "fc"]
        key = trace.structure_hash()
        if diff:
            key += "/captured-wrt-" + "-".join(map(str, diff))
        gf = cls(key, make, name, n_in, len(trace.outputs),
                 fixed=[n_in - n_cap + j for j in range(n_cap) if j not in diff])
        gf.backend = trace.backend
        return gf

    @property
    def wrt(self):
        """The differentiated input positions."""
        fixed = self.fixed
        return [i for i in range(self.n_in) if i not in fixed] if fixed else list(range(self.n_in))

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
        wrt = self.wrt
        n_wrt = len(wrt)

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
                                self.n_in, None, self.fixed)
            bwd = GraphFunction(self.key + "/vjp_bwd", part(1), self.name + " (backward)",
                                None, n_wrt)
            fwd.backend = bwd.backend = self.backend
            self._derived["vjp_fwd"] = fwd
            self._derived["vjp_bwd"] = bwd
            return self._derived[what]
        if what == "joint":
            gf = GraphFunction(self.key + "/joint",
                               lambda: pipeline.transform(self.graph, "joint", wrt),
                               self.name + " (vjp)", self.n_in + self.n_out, n_wrt, self.fixed)
        elif what == "jvp":
            gf = GraphFunction(self.key + "/jvp", lambda: pipeline.transform(self.graph, "jvp", wrt),
                               self.name + " (jvp)", self.n_in + n_wrt, 2 * self.n_out,
                               self.fixed)
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
        arrays = [v._data if isinstance(v, Tensor) else
                  v if isinstance(v, _GENERATORS) else np.asarray(v) for v in values]
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
            return self._per_input(list(joint.call_tensors(list(self.saved) + cts)))
        bwd = self.gf.derived("vjp_bwd")
        outs = bwd.run(*self.residuals, *[c._data for c in cts])
        return self._per_input([Tensor(np.asarray(o)) for o in outs])

    def written_by_the_call(self, tensors):
        """The call itself wrote these inputs after computing its outputs (the
        buffers a compiled module updates in place, tracegrad.nn's
        OptimizedModule): their new versions are expected, as in torch.compile,
        whose backward does not read them either."""
        if self.saved is None:
            return
        ids = {id(t) for t in tensors}
        for i, v in enumerate(self.saved):
            if id(v) in ids:
                self.versions[i] = v._vbox[0]

    def _per_input(self, grads):
        """One gradient per input: none for the captured state."""
        fixed = self.gf.fixed
        if not fixed:
            return grads
        it = iter(grads)
        return [None if i in fixed else next(it) for i in range(self.gf.n_in)]


# --- tg.vjp and tg.jvp ---------------------------------------------------------------

def _trace_flat(fn, primals, backend, what="vjp"):
    leaves, tree = tree_flatten(tuple(primals))
    name = getattr(fn, "__qualname__", "f")
    paths = display_paths(tree, "primals")
    arrays = []
    for x, path in zip(leaves, paths):
        if type(x) is np.random.Generator:
            raise TypeError(f"tg.{what} of {name}: {path} is a np.random.Generator; "
                            f"tg.{what} takes arrays as primals. Bind the Generator with "
                            f"functools.partial or a lambda, or call tg.grad/tg.value_and_grad, "
                            f"which take a Generator argument")
        arrays.append(leaf_array(x, lambda: f"tg.{what} of {name}: {path}")[0])
    names = leaf_paths(tree, "x")
    avals = [Aval(tuple(a.shape), a.dtype) for a in arrays]

    def rebuild(tracers):
        return list(tree_unflatten(tree, tracers)), {}

    if backend is None:  # CuPy arrays select the CUDA target, as in tracegrad.api
        from tracegrad.runtime import pipeline
        backend = "cupy" if any(type(a).__module__.startswith("cupy") for a in arrays) \
            else pipeline.default_backend()
    faces = ["torch" if hasattr(x, "grad_fn") else "numpy" for x in leaves]
    trace, out_tree = trace_function(fn, avals, rebuild, names, backend, faces, capture=True)
    cache.count("traces")
    name = getattr(fn, "__qualname__", "f")
    return trace, out_tree, tree, arrays, names, name


_VJP_CACHE = cache.LRU(cache.DEFAULT_MEMORY_CACHE_SIZE)   # (structure, target) -> GraphFunction


def _cached_graph_function(trace, names, name):
    """The GraphFunction of a traced call, one per graph and target: the same
    graph called with NumPy and with CuPy arrays needs two generated modules."""
    key = (trace.structure_hash(), trace.backend)
    gf = _VJP_CACHE.get(key)
    if gf is None:
        gf = _VJP_CACHE[key] = GraphFunction.from_trace(trace, names, name)
    return gf


def vjp(fn, primals, has_aux, backend):
    trace, out_tree, in_tree, arrays, names, name = _trace_flat(fn, primals, backend, "vjp")
    gf = _cached_graph_function(trace, names, name)
    fwd = gf.derived("vjp_fwd")
    bwd = gf.derived("vjp_bwd")
    outs = fwd.run(*arrays, *trace.implicit)   # the captured state, read now
    n_out = len(trace.outputs)
    primal_outs = list(outs[:n_out])
    residuals = outs[n_out:]
    out = tree_unflatten(out_tree, primal_outs)
    if has_aux:
        out, aux = out
        aux_n = len(tree_flatten(aux)[0])

    ct_like = out_tree[1][0] if has_aux and out_tree[0] == "tuple" else out_tree

    def vjp_fn(ct):
        ct_leaves = tree_flatten(ct, like=ct_like)[0]
        if has_aux and aux_n:
            ct_leaves = ct_leaves + [np.zeros_like(o) for o in primal_outs[-aux_n:]]
        if len(ct_leaves) != n_out:
            raise ValueError(f"vjp_fn expects cotangents shaped like the function's output "
                             f"({n_out} arrays), got {len(ct_leaves)}")
        cts = []
        for k, (c, o) in enumerate(zip(ct_leaves, primal_outs)):
            if not (type(c).__module__.startswith("cupy") or hasattr(c, "_data")):
                c = leaf_array(c, lambda: f"tg.vjp of {name}: vjp_fn's cotangent {k}")[0]
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
    trace, out_tree, in_tree, arrays, names, name = _trace_flat(fn, primals, backend, "jvp")
    t_leaves, t_tree = tree_flatten(tangents, like=in_tree)
    if t_tree != in_tree:
        raise ValueError("jvp: tangents must have the same structure as primals")
    t_arrays = []
    for t, a, path in zip(t_leaves, arrays, display_paths(t_tree, "tangents")):
        t = leaf_array(t, lambda: f"tg.jvp of {name}: {path}")[0]
        t = primitives.array_module(a).asarray(t, dtype=a.dtype)  # CuPy too
        if t.shape != a.shape:
            raise ValueError(f"jvp: tangent of shape {t.shape} for a primal of shape {a.shape}")
        t_arrays.append(t)
    gf = _cached_graph_function(trace, names, name)
    outs = gf.derived("jvp").run(*arrays, *trace.implicit, *t_arrays)
    n = len(trace.outputs)
    return tree_unflatten(out_tree, list(outs[:n])), tree_unflatten(out_tree, list(outs[n:]))
