"""Batching on graphs (vmap): evaluate a graph for a whole batch of inputs at
once, with the batch as a new leading axis.

This is what makes a Jacobian or Hessian ONE compiled call through a batched
cotangent (or tangent) instead of one backward pass per row.  Each node is
rewritten by the first rule that applies:

1. the primitive's own ``batch`` rule from the registry, if it has one;
2. elementwise primitives: operands are rank-aligned after the batch axis
   and broadcasting does the rest;
3. primitives whose attributes only name axes or shapes and that are known
   to act along them (reductions, reshapes, transposes, concatenation...):
   the axes shift by one, shapes gain the batch size, unbatched operands are
   broadcast to the batch;
4. anything else: the node is unrolled over the batch (one application per
   batch element, then stacked) -- always correct, just slower.
"""
from __future__ import annotations

from tracegrad.ir import graph as ir
from tracegrad.ops import primitives
from tracegrad.ops.primitives import Aval
from tracegrad.frontend.trace import Trace

# Primitives whose ``axis`` attribute names logical axes (None: all of them),
# so rule 3 can shift it past the batch axis.
AXIS_PRIMS = {"sum", "prod", "max", "min", "amax", "amin", "mean", "cumsum", "cumprod",
              "concatenate", "stack", "flip", "split", "softmax", "log_softmax", "logsumexp",
              "argmax", "argmin", "all", "any", "var", "std", "sort", "argsort", "squeeze",
              "expand_dims", "diff", "repeat", "roll", "take_along_axis", "permute_along",
              "unpermute_along"}
# Attribute names that rule 3 knows how to rewrite; a primitive whose
# attributes are all in here (and, for ``axis``, in AXIS_PRIMS) is batched by it.
SHIFTABLE = {"axis", "axes", "shape", "keepdims", "dtype", "ddof", "decimals", "n",
             "indices_or_sections", "sections", "repeats", "kind"}


def _logical_ndim(val, batched):
    return len(val.shape) - (1 if batched else 0)


def _materialize(val, batched, B):
    """An operand with the batch axis, broadcasting an unbatched one."""
    from tracegrad.ops import broadcast_to
    if batched:
        return val
    shape = tuple(getattr(val, "shape", ()))
    return broadcast_to(val, (B,) + shape)


def _shift_axis(axis, ndim):
    if axis is None:
        return tuple(range(1, ndim + 1))
    if isinstance(axis, tuple):
        return tuple(a + 1 if a >= 0 else a for a in axis)
    return axis + 1 if axis >= 0 else axis


def _elementwise(prim, vals, flags, attrs, B):
    from tracegrad.ops import reshape
    nd = max(_logical_ndim(v, f) if hasattr(v, "shape") else 0 for v, f in zip(vals, flags))
    args = []
    for v, f in zip(vals, flags):
        if f:
            logical = tuple(v.shape[1:])
            if len(logical) < nd:
                v = reshape(v, (B,) + (1,) * (nd - len(logical)) + logical)
        args.append(v)
    return primitives.bind(prim, *args, **attrs)


def _shifted(prim, vals, flags, attrs, B):
    nd = max(_logical_ndim(v, f) for v, f in zip(vals, flags) if hasattr(v, "shape"))
    new = dict(attrs)
    for k, v in attrs.items():
        if k == "axis":
            new[k] = _shift_axis(v, nd)
        elif k == "axes":
            new[k] = (0,) + tuple(a + 1 for a in v) if v is not None else None
        elif k == "shape":
            new[k] = (B,) + tuple(v)
    args = [_materialize(v, f, B) if hasattr(v, "shape") else v for v, f in zip(vals, flags)]
    return primitives.bind(prim, *args, **new)


def _unrolled(prim, vals, flags, attrs, B):
    from tracegrad.ops import getitem, stack
    outs = []
    for b in range(B):
        args = [getitem(v, b) if f else v for v, f in zip(vals, flags)]
        outs.append(primitives.bind(prim, *args, **attrs))
    if isinstance(outs[0], tuple):
        return tuple(stack([o[i] for o in outs]) for i in range(len(outs[0])))
    return stack(outs)


def batch_rule(prim, vals, flags, attrs, B):
    """Apply ``prim`` to operands of which those flagged carry a leading
    batch axis of size B; the result carries it too."""
    rule = getattr(prim, "batch", None)
    if rule is not None:
        out = rule(vals, flags, B, **attrs)
        if out is not NotImplemented:
            return out
    if prim.elementwise:
        return _elementwise(prim, vals, flags, attrs, B)
    keys = set(attrs)
    if keys <= SHIFTABLE and (prim.name in AXIS_PRIMS or keys & {"shape", "axes"}):
        return _shifted(prim, vals, flags, attrs, B)
    return _unrolled(prim, vals, flags, attrs, B)


def batch_graph(g, batched, B, trace=None, inputs=None):
    """Replay ``g`` with the inputs flagged in ``batched`` carrying a leading
    axis of size B.  With ``trace``/``inputs`` it records into an existing
    trace (composition); otherwise it returns a new graph whose batched
    inputs have shape (B,) + shape.  Every output is batched."""
    from tracegrad.ops import broadcast_to
    own = inputs is None
    # (a body with no inputs records into the trace its constants' ops meet)
    T = trace if trace is not None else Trace(g.graph.get("backend", "numpy")) if own else None
    if inputs is None:
        inputs = []
        for v, b in zip(g.graph["inputs"], batched):
            d = g.nodes[v]
            shape = ((B,) if b else ()) + tuple(d["shape"])
            inputs.append(T.new_input(Aval(shape, d["dtype"]), d["name"]))
    env = {}
    for v, x, b in zip(g.graph["inputs"], inputs, batched):
        env[v] = (x, b)
    for v in ir.topo_order(g):
        if v in env:
            continue
        d = g.nodes[v]
        op = d["op"]
        if op == "const":
            env[v] = (d["value"], False)
            continue
        ops = ir.operands(g, v)
        if op == "proj":
            val, b = env[ops[0]]
            env[v] = (val[d["attrs"]["index"]], b)
            continue
        prim = primitives.get(op)
        vals = [env[u][0] for u in ops]
        flags = [env[u][1] for u in ops]
        if T is not None:
            T.loc_override = d.get("loc")
        if not any(flags):
            env[v] = (primitives.bind(prim, *vals, **d["attrs"]), False)
        else:
            env[v] = (batch_rule(prim, vals, flags, d["attrs"], B), True)
        if T is not None:
            T.loc_override = None
    outs = []
    for v in g.graph["outputs"]:
        val, b = env[v]
        if not b:
            val = broadcast_to(val, (B,) + tuple(getattr(val, "shape", ())))
        outs.append(val)
    if not own:
        return outs
    T.outputs = [T.operand(o) for o in outs]
    return ir.from_trace(T)


def _batch_body(body, flags, B):
    """A loop or branch body batched over the inputs flagged (tracegrad.ops.control)."""
    from tracegrad.frontend.trace import trace_body
    g = ir.from_trace(body)
    avals = [Aval(((B,) if f else ()) + tuple(a.shape), a.dtype)
             for a, f in zip(body.in_avals, flags)]

    def f(*xs):
        return tuple(batch_graph(g, list(flags), B, trace=xs[0]._trace if xs else None,
                                 inputs=list(xs)))
    bb, captured, _ = trace_body(f, avals)
    return bb


def _install_control_flow():
    from tracegrad.ops import control
    control.hooks.batch_body = _batch_body


_install_control_flow()
