"""Transforms on graphs: reverse mode (adjoint), forward mode (tangent), and
the split of a joint graph into forward and backward parts.

Each transform takes a graph and returns a graph.  It replays the graph into
a fresh trace (so the copy is hash-consed again) and applies each node's
rule from the registry to the replayed, symbolic values: the vjp rules in
reverse topological order for the adjoint, the jvp rules in order for the
tangent.  Because the result is an ordinary graph of primitives, applying a
transform again gives higher derivatives.
"""
from __future__ import annotations

import numpy as np

from tracegrad.ir import graph as ir
from tracegrad.ops import primitives
from tracegrad.frontend.trace import Trace, Tracer
from tracegrad.ops.primitives import Aval, is_float


def _active(g, wrt_nodes):
    """Nodes whose value depends on one of ``wrt_nodes`` through floats."""
    active = set()
    for v in ir.topo_order(g):
        d = g.nodes[v]
        if v in wrt_nodes:
            active.add(v)
            continue
        if d["op"] in ("input", "const"):
            continue
        if d["op"] != "proj":
            prim = primitives.get(d["op"])
            if prim.nondiff:
                continue
        if any(u in active for u in ir.operands(g, v)):
            if d.get("avals") is not None or is_float(d["dtype"]):
                active.add(v)
    return active


def _const_tracer(T, value):
    arr = np.asarray(value)
    nid = T.const(arr)
    return Tracer(T, nid, Aval(arr.shape, arr.dtype))


def _as_tracer(T, x):
    if isinstance(x, Tracer):
        return x
    nid = T.operand(x)
    n = T.nodes[nid]
    av = n.aval if isinstance(n.aval, Aval) else Aval((), np.result_type(n.aval))
    return Tracer(T, nid, av)


def _zeros(T, like_tracer_or_aval):
    from tracegrad.ops import zeros_like_value
    return zeros_like_value(like_tracer_or_aval)


def _derived_loc(d, v, what):
    """Source location for nodes a rule records: the forward node's line."""
    loc = d.get("loc")
    return (loc or ("?", 0, "?"))[:3] + (f"{what} of %{v} {d['op']}",)


def _replay(g, T, names=None):
    """Fresh inputs for g's inputs in trace T; replay g.  -> (inputs, outs, env)."""
    xs = []
    for i, v in enumerate(g.graph["inputs"]):
        d = g.nodes[v]
        xs.append(T.new_input(Aval(d["shape"], d["dtype"]), d["name"] if names is None else names[i]))
    outs, env = ir.eval_graph(g, xs, trace=T)
    return xs, outs, env


def reverse(g, wrt, seed="input", keep_outputs=True):
    """The adjoint of graph ``g`` w.r.t. the inputs at positions ``wrt``.

    seed="ones": the (single, scalar) output's cotangent is 1 (gradients);
    seed="input": one cotangent input per output is added after the inputs
    (vector-Jacobian products).
    Returns a graph: inputs (+ cotangents) -> outputs (if keep_outputs) +
    one cotangent per ``wrt`` input."""
    from tracegrad.ops import add

    T = Trace(g.graph.get("backend", "numpy"))
    xs, outs, env = _replay(g, T)
    out_nodes = g.graph["outputs"]
    ct_env = {}
    if seed == "ones":
        v = out_nodes[0]
        d = g.nodes[v]
        # a one-element output (shape (1,) or (1, 1)) counts as a scalar, as
        # in HIPS autograd
        if int(np.prod(d["shape"])) != 1:
            raise TypeError(f"grad requires a scalar output, but the function returns "
                            f"{d['dtype']}{list(d['shape'])}; use tg.vjp or tg.jacobian for "
                            f"non-scalar outputs, or reduce it (e.g. .sum())")
        if not is_float(d["dtype"]) or np.issubdtype(d["dtype"], np.complexfloating):
            raise TypeError(f"grad requires a real floating-point output, got {d['dtype']}"
                            + ("; for a complex function differentiate its real part or "
                               "abs(z) ** 2" if np.issubdtype(d["dtype"], np.complexfloating)
                               else ""))
        ct_env[v] = _const_tracer(T, np.ones(d["shape"], d["dtype"]))
    else:
        for i, v in enumerate(out_nodes):
            d = g.nodes[v]
            ct = T.new_input(Aval(d["shape"], d["dtype"]), f"ct_{i}" if len(out_nodes) > 1 else "ct")
            ct_env[v] = add(ct_env[v], ct) if v in ct_env else ct
    cts = backward_sweep(g, T, env, xs, ct_env, wrt)
    T.outputs = [T.operand(r) for r in (list(outs) if keep_outputs else []) + cts]
    return share_loop_forward(ir.from_trace(T))


def share_loop_forward(g):
    """A loop's vjp reruns it recording its carries (a ``scan`` whose body
    has the carries as extra outputs, or ``while_fwd``); the rerun's leading
    outputs ARE the loop's outputs, so the loop's readers read them there
    and the forward runs once (the original node is removed)."""
    def sig(v, d, op, body_key):
        a = dict(d["attrs"])
        a.pop("body", None)
        return (op, tuple(ir.operands(g, v)), body_key, tuple(sorted(a.items())))

    originals = {}
    for v, d in g.nodes(data=True):
        if d["op"] in ("scan", "while"):
            originals[sig(v, d, d["op"], d["attrs"]["body"].key)] = v
    for v, d in list(g.nodes(data=True)):
        if d["op"] == "scan" and "+stack" in d["attrs"]["body"].key:
            key = sig(v, d, "scan", d["attrs"]["body"].key.rsplit("+stack", 1)[0])
        elif d["op"] == "while_fwd":
            key = sig(v, d, "while", d["attrs"]["body"].key)
        else:
            continue
        orig = originals.get(key)
        if orig is None or orig in g.graph["outputs"]:
            continue
        for _, p, k in list(g.out_edges(orig, keys=True)):
            g.remove_edge(orig, p, key=k)
            g.add_edge(v, p, key=0, pos=0)
        if g.out_degree(orig) == 0:
            g.remove_node(orig)
    return g


def backward_sweep(g, T, env, xs, ct_env, wrt, active=None):
    """Apply the vjp rules of ``g``'s nodes in reverse order inside trace T.

    env: node -> replayed value; ct_env: node -> cotangent seeds (consumed).
    Returns one cotangent per ``wrt`` input (zeros where none flows)."""
    from tracegrad.ops import add
    from tracegrad.ops.base import vjp_apply

    in_nodes = g.graph["inputs"]
    if active is None:
        active = _active(g, {in_nodes[i] for i in wrt})
    for v in reversed(ir.topo_order(g)):
        if v not in ct_env or v not in active:
            continue
        d = g.nodes[v]
        op = d["op"]
        if op in ("input", "const"):
            continue
        ops = ir.operands(g, v)
        ct = ct_env[v]
        if op == "proj":
            src = ops[0]
            slots = ct_env.get(src)
            if slots is None:
                slots = ct_env[src] = [None] * len(g.nodes[src]["avals"])
            i = d["attrs"]["index"]
            slots[i] = ct if slots[i] is None else add(slots[i], ct)
            continue
        prim = primitives.get(op)
        T.loc_override = _derived_loc(d, v, "backward")
        if d.get("avals") is not None:
            ct = tuple(c if c is not None else _zeros(T, o) for c, o in zip(ct, env[v]))
        needs = [u in active for u in ops]
        cts = vjp_apply(prim, d["attrs"], ct, env[v] if prim.save_out else None,
                        [env[u] for u in ops], [ir.aval(g, u) for u in ops], needs)
        for u, c in zip(ops, cts):
            if c is None:
                continue
            c = _as_tracer(T, c)
            ct_env[u] = c if u not in ct_env else add(ct_env[u], c)
        T.loc_override = None
    results = []
    for i in wrt:
        c = ct_env.get(in_nodes[i])
        results.append(c if c is not None else _zeros(T, xs[i]))
    return results


def tangent(g, wrt, keep_outputs=True):
    """Forward mode: the graph of (inputs, tangents of ``wrt`` inputs) ->
    (outputs if keep_outputs, tangents of the outputs)."""
    T = Trace(g.graph.get("backend", "numpy"))
    in_nodes = g.graph["inputs"]
    xs = []
    for v in in_nodes:
        d = g.nodes[v]
        xs.append(T.new_input(Aval(d["shape"], d["dtype"]), d["name"]))
    seeds = {}
    for i in wrt:
        d = g.nodes[in_nodes[i]]
        seeds[in_nodes[i]] = T.new_input(Aval(d["shape"], d["dtype"]), f"t_{d['name']}")
    outs, env = ir.eval_graph(g, xs, trace=T)
    tan = tangent_sweep(g, T, env, seeds, needed=_reaches_outputs(g))
    results = list(outs) if keep_outputs else []
    for v, o in zip(g.graph["outputs"], outs):
        t = tan.get(v)
        results.append(_as_tracer(T, t) if t is not None else _zeros(T, _as_tracer(T, o)))
    T.outputs = [T.operand(r) for r in results]
    return ir.from_trace(T)


def _reaches_outputs(g):
    """The nodes some output of ``g`` depends on (the outputs included)."""
    seen = set(g.graph["outputs"])
    stack = list(seen)
    while stack:
        for u in g.predecessors(stack.pop()):
            if u not in seen:
                seen.add(u)
                stack.append(u)
    return seen


def tangent_sweep(g, T, env, seeds, needed=None):
    """Apply the jvp rules of ``g``'s nodes in order inside trace T, given
    replayed values ``env`` and tangent ``seeds`` (node -> tangent).
    Returns node -> tangent for every node a tangent reaches (of those in
    ``needed``, when given: a tangent no output reads is never derived, so
    a rule that cannot give one, such as a custom Function without jvp,
    only stops forward mode where its tangent matters)."""
    from tracegrad.ops.base import jvp_apply

    tan = dict(seeds)
    for v in ir.topo_order(g):
        d = g.nodes[v]
        op = d["op"]
        if op in ("input", "const") or v in seeds or (needed is not None and v not in needed):
            continue
        ops = ir.operands(g, v)
        if op == "proj":
            t = tan.get(ops[0])
            if t is not None and t[d["attrs"]["index"]] is not None:
                tan[v] = t[d["attrs"]["index"]]
            continue
        ts = [tan.get(u) for u in ops]
        prim = primitives.get(op)
        if prim.nondiff or all(t is None for t in ts):
            continue
        T.loc_override = _derived_loc(d, v, "tangent")
        t = jvp_apply(prim, d["attrs"], ts, env[v], [env[u] for u in ops])
        T.loc_override = None
        if t is not None:
            tan[v] = t
    return tan


def split(joint, n_primal_inputs, n_outputs):
    """Split a joint vjp graph (``reverse(g, wrt, seed="input")``: primal
    inputs, then cotangent inputs -> outputs, then input cotangents) into

    * forward: primal inputs -> outputs + residuals (the forward values the
      backward reads), and
    * backward: residuals + cotangents -> input cotangents.

    Returns (forward_graph, backward_graph, n_residuals)."""
    import networkx as nx

    ins = joint.graph["inputs"]
    ct_inputs = set(ins[n_primal_inputs:])
    outs = joint.graph["outputs"]
    # backward nodes: everything that depends on a cotangent input
    bwd = set(ct_inputs)
    for v in ir.topo_order(joint):
        if v in bwd:
            continue
        if any(u in bwd for u in ir.operands(joint, v)):
            bwd.add(v)
    # residuals: forward values (not constants) read by backward nodes or
    # returned as input cotangents directly
    residuals = []
    seen = set()
    for v in ir.topo_order(joint):
        if v not in bwd:
            continue
        for u in ir.operands(joint, v):
            if u not in bwd and u not in seen and joint.nodes[u]["op"] != "const":
                seen.add(u)
                residuals.append(u)
    for v in outs[n_outputs:]:
        if v not in bwd and v not in seen and joint.nodes[v]["op"] != "const":
            seen.add(v)
            residuals.append(v)

    fwd = joint.subgraph([v for v in joint.nodes if v not in bwd]).copy()
    fwd.graph = dict(joint.graph)
    fwd.graph["inputs"] = list(ins[:n_primal_inputs])
    fwd.graph["outputs"] = list(outs[:n_outputs]) + residuals
    fwd.graph["n_primal_outputs"] = n_outputs

    bw_nodes = set(bwd) | set(residuals)
    bw_nodes.update(outs[n_outputs:])
    # constants read by backward nodes come along
    for v in list(bwd):
        for u in ir.operands(joint, v):
            if joint.nodes[u]["op"] == "const":
                bw_nodes.add(u)
    bw = nx.MultiDiGraph(joint.subgraph(bw_nodes))
    # residuals become inputs: drop their in-edges
    for r in residuals:
        bw.remove_edges_from(list(bw.in_edges(r, keys=True)))
        d = dict(joint.nodes[r])
        name = f"res_{r}"
        bw.nodes[r].clear()
        bw.nodes[r].update(op="input", attrs={}, shape=d["shape"], dtype=d["dtype"],
                           loc=d.get("loc"), name=name)
    bw.graph = dict(joint.graph)
    bw.graph["inputs"] = residuals + list(ins[n_primal_inputs:])
    bw.graph["outputs"] = list(outs[n_outputs:])
    for i, v in enumerate(bw.graph["inputs"]):
        bw.nodes[v]["attrs"] = {"index": i}
    return fwd, bw, len(residuals)


def _basis(T, shape, dtype):
    """The identity as a batch of one-hot arrays: shape (n,) + shape."""
    from tracegrad.ops.base import basis_p
    return T.bind(basis_p, (), {"shape": tuple(shape), "dtype": np.dtype(dtype).name})


def jacobian(g, wrt, mode="rev"):
    """The graph of the full Jacobian of every output w.r.t. each ``wrt``
    input: outputs ordered output-major, each of shape out.shape + in.shape.

    mode="rev": the backward part of the vjp graph, batched over the rows of
    the identity (one batched cotangent per output); mode="fwd": the tangent
    graph batched over the identity's columns.  Either way the Jacobian is
    one compiled call with no per-row loop."""
    from tracegrad.ir.batching import batch_graph
    from tracegrad.ops import reshape, transpose

    T = Trace(g.graph.get("backend", "numpy"))
    in_nodes = g.graph["inputs"]
    out_nodes = g.graph["outputs"]
    n_in, n_out = len(in_nodes), len(out_nodes)
    xs = [T.new_input(Aval(g.nodes[v]["shape"], g.nodes[v]["dtype"]), g.nodes[v]["name"])
          for v in in_nodes]
    for k, v in enumerate(out_nodes):
        dtype = np.dtype(g.nodes[v]["dtype"])
        if dtype.kind not in "biufc":
            raise TypeError(f"a Jacobian needs numeric outputs, but output {k} of the function "
                            f"is {dtype}{list(g.nodes[v]['shape'])}; return arrays of numbers "
                            f"(or compute the other values outside the differentiated function)")
    blocks = {}
    if mode == "rev":
        fwd, bwd, n_res = split(reverse(g, wrt, seed="input"), n_in, n_out)
        fouts, _ = ir.eval_graph(fwd, xs, trace=T)
        outs, residuals = fouts[:n_out], fouts[n_out:]
        for oi, o in enumerate(outs):
            o = _as_tracer(T, o)
            cts = [_basis(T, o.shape, o.dtype) if j == oi else _zeros(T, _as_tracer(T, outs[j]))
                   for j in range(n_out)]
            flags = [False] * n_res + [j == oi for j in range(n_out)]
            rows = batch_graph(bwd, flags, int(np.prod(o.shape)), trace=T,
                               inputs=list(residuals) + cts)
            for k, i in enumerate(wrt):
                blocks[oi, i] = reshape(rows[k], tuple(o.shape) + tuple(xs[i].shape))
    else:
        tg = tangent(g, wrt, keep_outputs=True)
        for i in wrt:
            ishape = tuple(xs[i].shape)
            n = int(np.prod(ishape))
            seeds = [_basis(T, ishape, xs[i].dtype) if j == i else _zeros(T, xs[j]) for j in wrt]
            flags = [False] * n_in + [j == i for j in wrt]
            cols = batch_graph(tg, flags, n, trace=T, inputs=xs + seeds)[n_out:]
            for oi, c in enumerate(cols):
                oshape = tuple(c.shape[1:])
                # (n, *oshape) -> (*oshape, n) -> oshape + ishape
                c = transpose(c, tuple(range(1, len(oshape) + 1)) + (0,))
                blocks[oi, i] = reshape(c, oshape + ishape)
    results = [blocks[oi, i] for oi in range(n_out) for i in wrt]
    T.outputs = [T.operand(r) for r in results]
    return ir.from_trace(T)


def hessian(g, wrt):
    """Forward-over-reverse: the Jacobian (forward mode, batched) of the
    gradient graph.  Outputs: block (i, j) = d grad_i / d x_j, row-major
    over ``wrt``."""
    grad_g = reverse(g, wrt, seed="ones", keep_outputs=False)
    return jacobian(grad_g, wrt, mode="fwd")


# --- loop and branch bodies (tracegrad.ops.control) ------------------------------------
# The op layer's control-flow rows differentiate their bodies with the
# transforms above: a body is a small graph, its vjp and jvp are graphs too,
# traced back into Bodies.

def graph_body(g):
    """A graph as a ``Body`` (the form loop and branch nodes hold)."""
    from tracegrad.frontend.trace import trace_body
    avals = [Aval(g.nodes[v]["shape"], g.nodes[v]["dtype"]) for v in g.graph["inputs"]]
    def run(*xs):
        T = xs[0]._trace if xs else None
        return tuple(ir.eval_graph(g, xs, trace=T)[0])
    body, captured, _ = trace_body(run, avals)
    return body


def _vjp_body(body, wrt):
    """(body inputs, one cotangent per output) -> cotangents of ``wrt``."""
    return graph_body(reverse(ir.from_trace(body), list(wrt), seed="input", keep_outputs=False))


def _jvp_body(body, wrt):
    """(body inputs, tangents of ``wrt``) -> (outputs, tangents of the outputs)."""
    return graph_body(tangent(ir.from_trace(body), list(wrt), keep_outputs=True))


def _install_control_flow():
    from tracegrad.ops import control
    control.hooks.vjp_body = _vjp_body
    control.hooks.jvp_body = _jvp_body


_install_control_flow()
