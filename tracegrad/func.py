"""``torch.func`` on tracegrad's compiler: ``grad``, ``grad_and_value``,
``vjp``, ``jvp``, ``jacrev``, ``jacfwd``, ``hessian``, ``vmap`` and
``functional_call``, with torch.func's signatures, defaults and returned
structures (``import tracegrad as torch; torch.func.grad(f)(x)``).

torch.func on torch re-runs the function eagerly on every call; here each
transform is a compiled function of ``tracegrad.api``: the function is traced
once per input signature, transformed as a graph, turned into generated NumPy
(or CUDA) source and cached in memory and on disk.  Tensors in give Tensors
out (ndarrays in give ndarrays out), and the transforms nest: a transform
called on the values of an enclosing one (grad of grad, jacrev of jacrev,
vmap of grad) inlines its transformed graph into the enclosing trace, so the
whole nest is one compiled program.

``vmap`` batches the traced graph with ``tracegrad.ir.batching`` (every op's
batching rule; an op with no rule is unrolled inside the graph), so it too is
one compiled call, never a Python loop over the batch.

Differences from torch.func (also in docs/coming-from-pytorch.md):

* the function is traced, so Python control flow may not depend on values
  (``if x.sum() > 0``): that raises ``tracegrad.TraceError`` naming the line;
  the tracegrad transforms in ``tracegrad.api`` take ``compile=False`` for
  such code;
* a function must receive the values it is differentiated or batched over
  as arguments, not read a value of an enclosing transform from a closure
  (pass it with ``in_dims=None`` or as another argument instead);
* ``functional_call`` takes a function of a dict of parameters, since
  tracegrad has no ``nn.Module``;
* ``vmap``'s ``chunk_size`` is accepted and checked, but the whole batch is
  computed in one call (results are identical; chunking only bounds memory);
  ``randomness="different"`` is not supported.
"""
from __future__ import annotations

import weakref

import numpy as np

from tracegrad import api
from tracegrad.runtime import cache, pipeline
from tracegrad.runtime.graph_call import ACCEPTED_KINDS, dtype_error, display_paths, leaf_array
from tracegrad.ops.primitives import Aval
from tracegrad.frontend import captured
from tracegrad.nn.normalization import _BatchNorm
from tracegrad.frontend.trace import TraceError, Tracer, trace_function, tree_flatten, tree_unflatten, leaf_paths

__all__ = ["grad", "grad_and_value", "vjp", "jvp", "jacrev", "jacfwd", "hessian", "vmap",
           "functional_call", "replace_all_batch_norm_modules_"]


# --- one wrapper per (function, configuration) -------------------------------------------
# A transform's compiled code is kept per function object (tracegrad.api): the
# wrappers made here are memoised on the user's function, so writing
# ``torch.func.vmap(torch.func.grad(f))`` afresh in a loop reuses what was
# traced.  The table is bounded (least recently used out) and checks the
# function's identity through a weak reference, so functions made in a loop
# neither pile up nor answer for one another.

WRAPPERS_KEPT = 256
_MEMO = cache.LRU(WRAPPERS_KEPT)   # (id of func, configuration) -> (ref to func, wrapper)


def _memo(func, config, make):
    target = func
    if isinstance(func, api.Compiled):
        # a fresh tg.grad(f) each time: the same function and transform
        target = func.fn
        config = config + ("of", func.kind, func.argnums, func._single, func.has_aux,
                           func.backend, func.static_argnums, func.static_argnames,
                           func.compiled)
    key = (id(target), config)
    hit = _MEMO.get(key)
    if hit is not None and hit[0]() is target:
        return hit[1]
    wrapper = make()
    try:
        ref = weakref.ref(target)
    except TypeError:   # not weakly referenceable (a builtin): hold it while memoised
        ref = (lambda t: lambda: t)(target)
    _MEMO[key] = (ref, wrapper)
    return wrapper


def _freeze(tree):
    """A hashable stand-in for an argnums / in_dims / out_dims value."""
    leaves, treedef = tree_flatten(tree)
    return treedef, tuple(leaves)


def _check_callable(func, what):
    if not callable(func):
        raise TypeError(f"torch.func.{what}: expected a function to transform as the first "
                        f"argument, got a {type(func).__name__}")


def _check_argnums(argnums, what):
    if isinstance(argnums, bool) or not isinstance(argnums, (int, tuple)):
        raise TypeError(f"torch.func.{what}: argnums must be an int or a tuple of ints, got "
                        f"{argnums!r}")
    if isinstance(argnums, tuple):
        if not argnums:
            raise ValueError(f"torch.func.{what}: argnums must be non-empty")
        if not all(isinstance(a, int) and not isinstance(a, bool) for a in argnums):
            raise TypeError(f"torch.func.{what}: argnums must be an int or a tuple of ints, "
                            f"got {argnums!r}")


def _named(wrapper, func, what):
    wrapper.__name__ = f"{what}({getattr(func, '__name__', 'f')})"
    wrapper.__qualname__ = f"{what}({getattr(func, '__qualname__', 'f')})"
    wrapper.__doc__ = getattr(func, "__doc__", None)
    wrapper.__wrapped__ = func
    return wrapper


# --- gradients ---------------------------------------------------------------------------

def grad(func, argnums=0, has_aux=False):
    """``torch.func.grad``: a function computing the gradient of ``func``
    (which returns one scalar) w.r.t. the argument(s) ``argnums``; a tuple of
    argnums gives a tuple of gradients.  With ``has_aux=True`` ``func``
    returns ``(output, aux)`` and the new function returns ``(grad, aux)``.
    Compiled: see ``tracegrad.api.grad``."""
    _check_callable(func, "grad")
    _check_argnums(argnums, "grad")
    return _memo(func, ("grad", argnums, bool(has_aux)),
                 lambda: api.grad(_scalar_checked(func, has_aux, "grad"), argnums, has_aux))


def _scalar_checked(func, has_aux, what):
    """``func``, refusing (as torch.func does) an output that is not 0-d,
    which tracegrad's own grad would accept when it has one element."""
    def scalar_output(*args, **kwargs):
        out = func(*args, **kwargs)
        value = _split_aux(out, what)[0] if has_aux else out
        shape = getattr(value, "shape", None)
        if shape is not None and len(shape) > 0:
            raise TypeError(f"torch.func.{what}(f)(*args): expected f(*args) to return a scalar "
                            f"(0-d) Tensor, got one with {len(shape)} dims (shape "
                            f"{tuple(shape)}); reduce it (e.g. .sum()), or use the vjp or jacrev "
                            f"APIs for a non-scalar output")
        return out

    scalar_output.__qualname__ = getattr(func, "__qualname__", "f")
    scalar_output.__name__ = getattr(func, "__name__", "f")   # errors name the user's function
    scalar_output.__module__ = getattr(func, "__module__", None)
    scalar_output.__wrapped__ = func   # its signature names the arguments
    return scalar_output


def grad_and_value(func, argnums=0, has_aux=False):
    """``torch.func.grad_and_value``: ``(grad, value)``, or with
    ``has_aux=True`` ``(grad, (value, aux))``, from one compiled call."""
    _check_callable(func, "grad_and_value")
    _check_argnums(argnums, "grad_and_value")

    def make():
        value_and_grad = api.value_and_grad(_scalar_checked(func, has_aux, "grad_and_value"),
                                            argnums, has_aux)

        def grad_and_value_fn(*args, **kwargs):
            value, g = value_and_grad(*args, **kwargs)
            return g, value   # with has_aux, value is already (value, aux)

        return _named(grad_and_value_fn, func, "grad_and_value")

    return _memo(func, ("grad_and_value", argnums, bool(has_aux)), make)


def jacrev(func, argnums=0, *, has_aux=False, chunk_size=None, _preallocate_and_copy=False):
    """``torch.func.jacrev``: the Jacobian by reverse mode, shape
    ``output.shape + input.shape`` per (output, argument) pair, nested as
    torch nests it (outputs outside, a tuple over ``argnums`` inside).  With
    ``has_aux=True`` returns ``(jacobian, aux)``.  All rows come from one
    compiled call (a batched cotangent); ``chunk_size`` only bounds memory in
    torch and is accepted and checked here."""
    _check_callable(func, "jacrev")
    _check_argnums(argnums, "jacrev")
    _check_chunk_size(chunk_size, "jacrev")
    return _jacobian(api.jacobian, "jacrev", func, argnums, has_aux)


def jacfwd(func, argnums=0, has_aux=False, *, randomness="error"):
    """``torch.func.jacfwd``: the Jacobian by forward mode (one tangent per
    input element, batched in one compiled call); same layout as ``jacrev``."""
    _check_callable(func, "jacfwd")
    _check_argnums(argnums, "jacfwd")
    _check_randomness(randomness, "jacfwd")
    return _jacobian(api.jacfwd, "jacfwd", func, argnums, has_aux)


def _jacobian(transform, what, func, argnums, has_aux):
    if not has_aux:
        return transform(func, argnums)

    def make():
        def value_of(*args, **kwargs):
            return _split_aux(func(*args, **kwargs), what)[0]

        def aux_of(*args, **kwargs):
            return _split_aux(func(*args, **kwargs), what)[1]

        value_of.__qualname__ = aux_of.__qualname__ = getattr(func, "__qualname__", "f")
        value_of.__name__ = aux_of.__name__ = getattr(func, "__name__", "f")
        jac = transform(value_of, argnums)
        aux = api.compile(aux_of)

        # One compiled program: the Jacobian's graph and the aux computation
        # are inlined into the trace of this function (common parts shared).
        def jacobian_and_aux(*args, **kwargs):
            return jac(*args, **kwargs), aux(*args, **kwargs)

        jacobian_and_aux.__qualname__ = f"{what}({getattr(func, '__qualname__', 'f')})"
        return api.compile(jacobian_and_aux)

    return _memo(func, (what, argnums, True), make)


def _split_aux(out, what):
    if not (isinstance(out, (tuple, list)) and len(out) == 2):
        got = (f"a {type(out).__name__} of {len(out)} values" if isinstance(out, (tuple, list))
               else "a single value")
        raise TypeError(f"torch.func.{what}(f, has_aux=True): f must return a pair "
                        f"(output, aux), but it returned {got}")
    return out[0], out[1]


def hessian(func, argnums=0):
    """``torch.func.hessian``: ``jacfwd(jacrev(func, argnums), argnums)``,
    so non-scalar outputs give ``output.shape + in.shape + in.shape`` and a
    tuple of argnums gives a tuple of tuples, as in torch."""
    _check_callable(func, "hessian")
    _check_argnums(argnums, "hessian")
    return _memo(func, ("hessian", argnums),
                 lambda: api.jacfwd(api.jacobian(func, argnums), argnums))


def _trace_inner(fn, avals, rebuild, names, backend, faces, what):
    """Trace ``fn`` on its own (to transform its graph), explaining the one
    way that fails for a nested transform: a closure over the enclosing
    transform's values."""
    try:
        trace, out_tree = trace_function(fn, avals, rebuild, names, backend, faces, capture=True)
    except TraceError as e:
        if "from one trace was used inside another" not in str(e):
            raise
        raise TraceError(
            f"torch.func.{what}: the function reads a value of an enclosing transform from "
            f"a closure (e.g. grad(lambda w: vmap(lambda x: (x * w).sum())(xs).sum())); "
            f"tracegrad transforms a function's own arguments only. Pass that value as an "
            f"argument instead: vmap(lambda x, w: ..., in_dims=(0, None))(xs, w)") from e
    # the captured arrays and generators it reads are the enclosing trace's
    # too: its graph is evaluated there on these objects (after the arguments)
    captured.adopt(trace.implicit, trace.implicit_desc)
    return trace, out_tree


# --- vjp and jvp ----------------------------------------------------------------------

def _dot_with(func, has_aux):
    """``(primals, cotangents) -> sum <func(*primals), cotangents>``, whose
    gradient w.r.t. the primals is the vector-Jacobian product."""
    def dot(primals, cotangents):
        out = func(*primals)
        if has_aux:
            out = _split_aux(out, "vjp")[0]
        outs, out_tree = tree_flatten(out)
        cts, ct_tree = tree_flatten(cotangents, like=out_tree)
        if ct_tree != out_tree:
            raise ValueError(f"torch.func.vjp: vjp_fn expects cotangents with the structure of "
                             f"the function's output ({len(outs)} tensors), got "
                             f"{len(cts)}")
        total = 0.0
        for o, c in zip(outs, cts):
            if tuple(getattr(o, "shape", ())) != tuple(getattr(c, "shape", ())):
                raise ValueError(f"torch.func.vjp: vjp_fn got a cotangent of shape "
                                 f"{tuple(getattr(c, 'shape', ()))} for an output of shape "
                                 f"{tuple(getattr(o, 'shape', ()))}; they must match")
            total = total + (o * c).sum()
        return total

    dot.__qualname__ = f"vjp({getattr(func, '__qualname__', 'f')})"
    dot.__name__ = f"vjp({getattr(func, '__name__', 'f')})"
    return dot


def vjp(func, *primals, has_aux=False):
    """``torch.func.vjp``: ``(output, vjp_fn)``, or ``(output, vjp_fn, aux)``
    with ``has_aux=True``.  ``vjp_fn(cotangents)`` takes cotangents with the
    structure of the output and returns a tuple with one entry per primal.

    The output comes from the compiled forward; ``vjp_fn`` is the compiled
    gradient of ``<func(*primals), cotangents>`` (it re-runs the forward
    inside its generated code rather than keeping residuals), so it nests
    under other transforms (``vmap(vjp_fn)`` gives Jacobian rows)."""
    _check_callable(func, "vjp")
    if not primals:
        raise TypeError("torch.func.vjp(func, *primals): give at least one primal")
    out = api.compile(func)(*primals)
    aux = None
    if has_aux:
        out, aux = _split_aux(out, "vjp")
    back = _memo(func, ("vjp", bool(has_aux)),
                 lambda: api.grad(_dot_with(func, has_aux), argnums=0))
    primals = tuple(primals)

    def vjp_fn(cotangents, *, retain_graph=True, create_graph=None):
        return tuple(back(primals, cotangents))

    if has_aux:
        return out, vjp_fn, aux
    return out, vjp_fn


def _jvp_impl(func, has_aux):
    """The compiled ``(primals, tangents) -> (outputs, tangent outputs[, aux])``:
    traced, it traces ``func`` on its own, takes the forward-mode graph of
    the result (tracegrad.runtime.pipeline) and records it into the caller's trace."""
    def jvp_of(primals, tangents):
        p_leaves, p_tree = tree_flatten(tuple(primals))
        t_leaves, _ = tree_flatten(tuple(tangents), like=p_tree)
        tracer = next(x for x in p_leaves if type(x) is Tracer)
        outer = tracer._trace
        avals = [Aval(tuple(x.shape), x.dtype) for x in p_leaves]
        faces = [getattr(x, "_face", "numpy") for x in p_leaves]

        def rebuild(tracers):
            return list(tree_unflatten(p_tree, tracers)), {}

        def value_of(*args):
            out = func(*args)
            if has_aux:
                out = _split_aux(out, "jvp")[0]
            return out

        trace, out_tree = _trace_inner(value_of, avals, rebuild, leaf_paths(p_tree, "x"),
                                       outer.backend, faces, "jvp")
        g = pipeline.transform(pipeline.graph_of(trace), "jvp", range(len(p_leaves)),
                               fresh=False)   # replayed into the caller's trace
        from tracegrad.ir import graph as ir
        implicit = [outer.captured_value(o) for o in trace.implicit]
        outs = ir.eval_graph(g, list(p_leaves) + implicit + list(t_leaves), trace=outer)[0]
        n = len(trace.outputs)
        result = (tree_unflatten(out_tree, outs[:n]), tree_unflatten(out_tree, outs[n:]))
        if has_aux:
            result += (_split_aux(func(*tree_unflatten(p_tree, p_leaves)), "jvp")[1],)
        return result

    jvp_of.__qualname__ = f"jvp({getattr(func, '__qualname__', 'f')})"
    return api.compile(jvp_of)


def jvp(func, primals, tangents, *, strict=False, has_aux=False):
    """``torch.func.jvp``: ``(output, jvp_out)``, or ``(output, jvp_out,
    aux)`` with ``has_aux=True``; ``primals`` and ``tangents`` are tuples
    with one entry per argument of ``func``.  One compiled forward-mode call."""
    _check_callable(func, "jvp")
    for what, v in (("primals", primals), ("tangents", tangents)):
        if not isinstance(v, tuple):
            raise TypeError(f"torch.func.jvp(func, primals, tangents): expected {what} to be "
                            f"a tuple, got {type(v).__name__}; for one argument write "
                            f"jvp(f, (x,), (t,))")
    if not primals:
        raise ValueError("torch.func.jvp: expected primals to be a non-empty tuple")
    p_leaves, p_tree = tree_flatten(primals)
    t_leaves, t_tree = tree_flatten(tangents, like=p_tree)
    if p_tree != t_tree:
        raise ValueError(f"torch.func.jvp: expected primals and tangents to have the same "
                         f"structure, got {len(p_leaves)} primal and {len(t_leaves)} tangent "
                         f"tensors")
    fname = getattr(func, "__name__", "f")
    if not p_leaves:
        raise TypeError(f"torch.func.jvp({fname}, primals, tangents): expected primals to be a "
                        f"tuple of Tensors, got {primals!r}")
    for tree, leaves, what in ((p_tree, p_leaves, "primals"), (t_tree, t_leaves, "tangents")):
        for x, path in zip(leaves, display_paths(tree, what)):
            if type(x) is Tracer:   # a value of an enclosing transform
                continue
            if type(x) is np.random.Generator:
                raise TypeError(f"torch.func.jvp({fname}, primals, tangents): {path} is a "
                                f"np.random.Generator; expected Tensors. Bind it with "
                                f"functools.partial or a lambda instead")
            leaf_array(x, lambda: f"torch.func.jvp({fname}, primals, tangents): {path}")
    for p, t in zip(p_leaves, t_leaves):
        ps, ts = tuple(getattr(p, "shape", ())), tuple(getattr(t, "shape", ()))
        if ps != ts:
            raise ValueError(f"torch.func.jvp: a tangent of shape {ts} for a primal of shape "
                             f"{ps}; each tangent must have its primal's shape")
    return _memo(func, ("jvp", bool(has_aux)), lambda: _jvp_impl(func, has_aux))(primals,
                                                                                 tangents)


# --- vmap -----------------------------------------------------------------------------

RANDOMNESS = ("error", "different", "same")


def _check_randomness(randomness, what):
    if randomness not in RANDOMNESS:
        raise ValueError(f"torch.func.{what}: randomness must be one of {RANDOMNESS}, got "
                         f"{randomness!r}")


def _check_chunk_size(chunk_size, what):
    if chunk_size is not None and (not isinstance(chunk_size, int) or isinstance(chunk_size, bool)
                                   or chunk_size <= 0):
        raise ValueError(f"torch.func.{what}: chunk_size should be None or a positive int, got "
                         f"{chunk_size!r}")


def _is_array(x):
    return isinstance(x, Tracer) or hasattr(x, "grad_fn") or hasattr(x, "__array_interface__") \
        or type(x).__module__.startswith("cupy")


def _broadcast_dims(dims, tree, what, fname):
    """The dim of each leaf of ``tree`` from ``dims``, a prefix of its
    structure (an int or None applies to a whole subtree), as torch.func."""
    out = []

    def rec(d, t):
        kind = t[0]
        if d is None or (isinstance(d, int) and not isinstance(d, bool)):
            out.extend([d] * _count(t))
            return
        if kind in ("tuple", "list", "namedtuple") and isinstance(d, (tuple, list)):
            children = t[2] if kind == "namedtuple" else t[1]
            if len(children) == len(d):
                for dd, c in zip(d, children):
                    rec(dd, c)
                return
        if kind == "dict" and isinstance(d, dict) and set(d) == set(t[1]) and len(d) == len(t[1]):
            for k, c in zip(t[1], t[2]):
                rec(d[k], c)
            return
        raise ValueError(f"vmap({fname}, {what}={dims!r}, ...): {what} is not compatible with "
                         f"the structure of the {'inputs' if what == 'in_dims' else 'outputs'}; "
                         f"give an int, None, or a (nested) tuple matching them")

    rec(dims, tree)
    return out


def _count(tree):
    kind = tree[0]
    if kind == "leaf":
        return 1
    if kind == "none":
        return 0
    children = tree[2] if kind in ("namedtuple", "dict") else tree[1]
    return sum(_count(c) for c in children)


def vmap(func, in_dims=0, out_dims=0, randomness="error", *, chunk_size=None):
    """``torch.func.vmap``: ``func`` mapped over a batch axis of its inputs.

    in_dims: an int, None (not mapped) or a (nested) tuple matching the
    positional arguments (keyword arguments are never mapped); out_dims:
    where the batch axis goes in each output (None: the output must not
    depend on the batch).  The traced graph of ``func`` is batched as a whole
    (tracegrad.ir.batching) and compiled once per input signature; nested vmaps
    and vmap of grad (per-sample gradients) are one compiled program.
    ``chunk_size`` is accepted and checked, but the whole batch runs at once
    (identical results); ``randomness="same"`` draws once for the batch,
    ``"error"`` (the default) refuses random ops, ``"different"`` is not
    supported."""
    _check_callable(func, "vmap")
    _check_randomness(randomness, "vmap")
    _check_chunk_size(chunk_size, "vmap")
    fname = getattr(func, "__name__", "f")
    if not (in_dims is None or isinstance(in_dims, (int, tuple))) or isinstance(in_dims, bool):
        raise ValueError(f"vmap({fname}, in_dims={in_dims!r}, ...): expected in_dims to be an "
                         f"int or a (nested) tuple matching the structure of the inputs, got "
                         f"{type(in_dims).__name__}")
    if in_dims is None:
        raise ValueError(f"vmap({fname}, in_dims=None, ...): expected in_dims to be an int or "
                         f"a (nested) tuple matching the structure of the inputs; at least one "
                         f"input must be mapped")
    if randomness == "different":
        raise NotImplementedError(
            f"vmap({fname}, randomness='different'): tracegrad does not draw different random "
            f"values per batch element inside vmap; draw them outside with the batch size "
            f"(torch.rand(B, ...)) and pass them in, or use randomness='same'")
    try:
        key = ("vmap", _freeze(in_dims), _freeze(out_dims), randomness)
        hash(key)
    except TypeError:
        raise ValueError(f"vmap({fname}, ...): in_dims and out_dims hold ints, None and "
                         f"tuples/dicts of them; got in_dims={in_dims!r}, "
                         f"out_dims={out_dims!r}") from None
    return _memo(func, key, lambda: _make_vmap(func, in_dims, out_dims, randomness, fname))


def _make_vmap(func, in_dims, out_dims, randomness, fname):
    def batched_call(arrays, static):
        """Traced by tracegrad.api.compile: ``arrays`` are tracers."""
        treedef, others, positions, dims, B = static
        outer = next(x for x in arrays if type(x) is Tracer)._trace
        from tracegrad.ops import moveaxis
        moved, avals, flags = [], [], []
        for x, d in zip(arrays, dims):
            if d is not None:
                if d % x.ndim != 0:
                    x = moveaxis(x, d % x.ndim, 0)
                avals.append(Aval(tuple(x.shape[1:]), x.dtype))
            else:
                avals.append(Aval(tuple(x.shape), x.dtype))
            moved.append(x)
            flags.append(d is not None)
        faces = [getattr(x, "_face", "numpy") for x in arrays]

        def rebuild(tracers):
            leaves = list(others)
            for p, t in zip(positions, tracers):
                leaves[p] = t
            args, kwargs = tree_unflatten(treedef, leaves)
            return list(args), kwargs

        def checked(*args, **kwargs):
            out = func(*args, **kwargs)
            for leaf in tree_flatten(out)[0]:
                if not _is_array(leaf):
                    raise ValueError(f"vmap({fname}, ...): `{fname}` must only return "
                                     f"Tensors, got type {type(leaf).__name__}")
            return out

        checked.__qualname__ = getattr(func, "__qualname__", "f")
        names = [f"x{i}" for i in range(len(arrays))]
        trace, out_tree = _trace_inner(checked, avals, rebuild, names, outer.backend, faces,
                                       f"vmap({fname})")
        g = pipeline.graph_of(trace)
        if randomness == "error" and any(d["op"] == "random_draw" for _, d in g.nodes(data=True)):
            raise RuntimeError("vmap: called random operation while in randomness error mode. "
                               "Please either use the 'same' randomness flag on vmap or "
                               "perform the randomness operation out of vmap")
        import networkx as nx
        batched_nodes = set()
        for v, b in zip(g.graph["inputs"], flags):
            if b:
                batched_nodes.add(v)
                batched_nodes |= nx.descendants(g, v)
        from tracegrad.ir import batching  # a build: networkx is loaded by now
        n_cap = len(trace.implicit)    # captured state: not mapped
        outs = batching.batch_graph(g, flags + [False] * n_cap, B, trace=outer,
                                    inputs=moved + list(trace.implicit))
        o_dims = _broadcast_dims(out_dims, out_tree, "out_dims", fname)
        results = []
        for v, o, d in zip(g.graph["outputs"], outs, o_dims):
            if d is None:
                if v in batched_nodes:
                    raise ValueError(f"vmap({fname}, ...): `{fname}` can not return a batched "
                                     f"value when out_dim is None (that output depends on a "
                                     f"mapped input)")
                o = o[0]
            else:
                nd = len(o.shape)
                if not -nd <= d < nd:
                    raise ValueError(f"vmap({fname}, ..., out_dims={out_dims!r}): out_dim {d} "
                                     f"is out of range for an output with {nd - 1} dims")
                if d % nd != 0:
                    o = moveaxis(o, 0, d % nd)
            results.append(o)
        return tree_unflatten(out_tree, results)

    batched_call.__qualname__ = f"vmap({getattr(func, '__qualname__', 'f')})"
    compiled = api.compile(batched_call, static_argnums=(1,))

    def prepare(args, kwargs):
        """(array leaves, static description) of a call, checked as torch checks."""
        leaves, treedef = tree_flatten((args, kwargs))
        arg_leaves, arg_tree = tree_flatten(args)
        if isinstance(in_dims, int):
            dims = [in_dims] * len(arg_leaves)
        else:
            if len(in_dims) != len(args):
                raise ValueError(f"vmap({fname}, in_dims={in_dims!r}, ...)(<inputs>): in_dims "
                                 f"is not compatible with the structure of `inputs`: "
                                 f"{len(in_dims)} in_dims for {len(args)} positional "
                                 f"arguments")
            dims = _broadcast_dims(in_dims, arg_tree, "in_dims", fname)
        dims = dims + [None] * (len(leaves) - len(arg_leaves))   # keyword arguments
        arrays, positions, leaf_dims, others, sizes = [], [], [], [], []
        for i, (x, d) in enumerate(zip(leaves, dims)):
            if _is_array(x):
                dtype = getattr(x, "dtype", None)
                if dtype is not None and np.dtype(dtype).kind not in ACCEPTED_KINDS:
                    raise dtype_error(f"vmap({fname}, ...)(<inputs>): input {i}",
                                      np.dtype(dtype), "Tensor" if hasattr(x, "grad_fn")
                                      else "array")
                nd = len(getattr(x, "shape", ()))
                if d is not None:
                    if not -nd <= d < nd:
                        raise ValueError(
                            f"vmap({fname}, in_dims={in_dims!r}, ...)(<inputs>): Got in_dim={d} "
                            f"for some input, but that input is a Tensor of dimensionality {nd} "
                            f"so expected in_dim to satisfy -{nd} <= in_dim < {nd}.")
                    sizes.append(x.shape[d])
                arrays.append(x)
                positions.append(i)
                leaf_dims.append(d)
                others.append(None)
            else:
                if d is not None:
                    raise ValueError(
                        f"vmap({fname}, in_dims={in_dims!r}, ...)(<inputs>): Got in_dim={d} for "
                        f"an input but the input is of type {type(x).__name__}. We cannot vmap "
                        f"over non-Tensor arguments, please use None as the respective in_dim")
                others.append(x)
        if not sizes:
            raise ValueError(f"vmap({fname}, in_dims={in_dims!r}, ...)(<inputs>): at least one "
                             f"input must be a Tensor mapped over (in_dim not None)")
        if len(set(sizes)) != 1:
            raise ValueError(f"vmap: Expected all tensors to have the same size in the mapped "
                             f"dimension, got sizes {sizes} for the mapped dimension")
        static = (treedef, _hashable(others, fname), tuple(positions), tuple(leaf_dims),
                  sizes[0])
        return tuple(arrays), static

    def vmapped(*args, **kwargs):
        return compiled(*prepare(args, kwargs))

    def lower(*args, **kwargs):
        """The batched graph and its generated source for these arguments."""
        return compiled.lower(*prepare(args, kwargs))

    vmapped.lower = lower
    return _named(vmapped, func, "vmap")


def _hashable(values, fname):
    try:
        hash(tuple(values))
    except TypeError:
        bad = next(v for v in values if not _try_hash(v))
        raise TypeError(f"vmap({fname}, ...): a non-Tensor argument of type "
                        f"{type(bad).__name__} is unhashable; vmap passes non-Tensor arguments "
                        f"to the function as constants of the compiled code, so they must be "
                        f"hashable (pass a tuple instead of a list of numbers, or a Tensor)"
                        ) from None
    return tuple(values)


def _try_hash(v):
    try:
        hash(v)
        return True
    except TypeError:
        return False


# --- functional_call ------------------------------------------------------------------

def replace_all_batch_norm_modules_(root):
    """``torch.func.replace_all_batch_norm_modules_``: every BatchNorm module
    in ``root`` (itself included) that tracks running statistics stops doing
    so (running_mean, running_var and num_batches_tracked become None), so
    it normalises with the batch's statistics and writes nothing, inside any
    transform.  ``root``, changed in place, is returned."""
    for m in root.modules():
        if isinstance(m, _BatchNorm) and m.track_running_stats:
            m.running_mean = None
            m.running_var = None
            m.num_batches_tracked = None
            m.track_running_stats = False
    return root


def functional_call(module, parameter_and_buffer_dicts, args=None, kwargs=None, *,
                    tie_weights=True, strict=False):
    """``torch.func.functional_call``: ``module`` is an ``nn.Module``, called
    with the given parameters and buffers (by their dotted names) in place
    of its own, or a function whose first argument is the dict of
    parameters (and buffers), called as ``module(params, *args,
    **kwargs)``.  ``parameter_and_buffer_dicts`` is a dict, or a tuple/list
    of dicts merged into one (a key in two of them is an error, as in
    torch); ``args`` a tuple of positional arguments (anything else is the
    single argument).  Transforms compose with it:
    ``grad(lambda p, x: functional_call(model, p, (x,)).sum())(params, x)``."""
    if (hasattr(module, "named_parameters") or hasattr(module, "state_dict")) and \
            not hasattr(module, "_parameters"):
        raise TypeError(
            f"torch.func.functional_call: got a {type(module).__name__}, which looks like a "
            f"module but is no nn.Module of tracegrad's (tracegrad.nn.Module, whose "
            f"parameters functional_call can replace). Build it from tracegrad.nn, or write "
            f"the model as a function of a dict of parameters, def model(params, x): return "
            f"x @ params['w'] + params['b'], and pass it: functional_call(model, params, (x,))")
    if not callable(module):
        raise TypeError(f"torch.func.functional_call: expected a function of a dict of "
                        f"parameters (model(params, *args)), got a {type(module).__name__}")
    dicts = parameter_and_buffer_dicts
    if isinstance(dicts, dict):
        params = dict(dicts)
    elif isinstance(dicts, (tuple, list)) and all(isinstance(d, dict) for d in dicts):
        params = {}
        for d in dicts:
            repeated = sorted(set(params) & set(d))
            if repeated:
                raise ValueError(f"torch.func.functional_call: {repeated} appeared in multiple "
                                 f"dictionaries; a parameter or buffer may be given once")
            params.update(d)
    else:
        raise ValueError(f"torch.func.functional_call: expected parameter_and_buffer_dicts to "
                         f"be a dict, or a tuple/list of dicts, got "
                         f"{type(dicts).__name__}")
    if args is None:
        args = ()
    elif not isinstance(args, tuple):
        args = (args,)
    if hasattr(module, "named_parameters") and hasattr(module, "_parameters"):
        return _call_module_with(module, params, args, kwargs or {}, tie_weights, strict)
    return module(params, *args, **(kwargs or {}))


def _call_module_with(module, params, args, kwargs, tie_weights, strict):
    """An nn.Module called with ``params`` (dotted names) in place of its
    own parameters and buffers, which it gets back afterwards (torch's
    ``functional_call``): a parameter tied under several names is replaced
    under all of them with ``tie_weights``; with ``strict`` every parameter
    and buffer must be given, and nothing else."""
    given = dict(params)
    if tie_weights:
        names = {}
        for store in ("named_parameters", "named_buffers"):
            for n, t in getattr(module, store)(remove_duplicate=False):
                names.setdefault(id(t), []).append(n)
        for tied in names.values():
            hit = [n for n in tied if n in given]
            for n in tied:
                if n not in given and hit:
                    given[n] = given[hit[0]]
    if strict:
        own = {n for n, _ in module.named_parameters(remove_duplicate=False)} | \
              {n for n, _ in module.named_buffers(remove_duplicate=False)}
        missing, unexpected = sorted(own - set(given)), sorted(set(given) - own)
        if missing or unexpected:
            raise RuntimeError(
                f"Error(s) in reparametrizing for {type(module).__name__}:"
                + (f"\n\tUnexpected key(s): {', '.join(repr(k) for k in unexpected)}."
                   if unexpected else "")
                + (f"\n\tMissing key(s): {', '.join(repr(k) for k in missing)}."
                   if missing else ""))
    restore = []       # (dict, name, old value) or (module, name, None): put back after
    try:
        for name, value in given.items():
            path, _, leaf = name.rpartition(".")
            mod = module.get_submodule(path) if path else module
            d = mod.__dict__
            for store in ("_parameters", "_buffers"):
                table = d.get(store)
                if table is not None and leaf in table:
                    restore.append((table, leaf, table[leaf]))
                    table[leaf] = value
                    break
            else:    # a name the module does not have: an attribute for the call
                restore.append((mod, leaf, None))
                object.__setattr__(mod, leaf, value)
        return module(*args, **kwargs)
    finally:
        for where, leaf, old in reversed(restore):
            if isinstance(where, dict):
                where[leaf] = old
            else:
                where.__dict__.pop(leaf, None)
