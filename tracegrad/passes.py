"""Optimisation passes on the IR graph.

Each pass takes a graph and rewrites it in place: constant folding,
algebraic simplification, common-subexpression elimination and dead-code
elimination.  ``optimize`` runs them to a fixed point.  Buffer planning,
which needs the final statement order, lives in codegen (``plan_buffers``).
"""
from __future__ import annotations

import numpy as np

from tracegrad import ir, primitives

# Constants larger than this stay as operations in the generated code
# instead of being folded into embedded arrays.
FOLD_MAX_ELEMENTS = 4096


def _new_id(g):
    return max(g.nodes) + 1 if len(g) else 0


def replace_uses(g, old, new):
    """Make every user of ``old`` (and the graph outputs) read ``new``."""
    for _, w, k, d in list(g.out_edges(old, keys=True, data=True)):
        g.remove_edge(old, w, key=k)
        g.add_edge(new, w, key=d["pos"], pos=d["pos"])
    g.graph["outputs"] = [new if v == old else v for v in g.graph["outputs"]]


def add_node(g, op, operands, attrs, shape, dtype, loc=None, value=None):
    v = _new_id(g)
    g.add_node(v, op=op, attrs=dict(attrs), shape=tuple(shape), dtype=np.dtype(dtype), loc=loc)
    if value is not None or op == "const":
        g.nodes[v]["value"] = value
    for pos, u in enumerate(operands):
        g.add_edge(u, v, key=pos, pos=pos)
    return v


def dead_code_elimination(g):
    """Remove nodes that no output depends on (inputs stay: they are the signature)."""
    import networkx as nx
    keep = set(g.graph["outputs"]) | set(g.graph["inputs"])
    for v in list(g.graph["outputs"]):
        keep |= nx.ancestors(g, v)
    dead = [v for v in g.nodes if v not in keep]
    g.remove_nodes_from(dead)
    return bool(dead)


def _const_value(g, v):
    d = g.nodes[v]
    return d["value"] if d["op"] == "const" else None


def _is_scalar_const(g, v, value):
    """v is a constant whose every element equals ``value`` (broadcasting
    it changes nothing: callers check the result's shape and dtype)."""
    d = g.nodes[v]
    if d["op"] != "const":
        return False
    val = d["value"]
    if isinstance(val, np.ndarray):
        return val.size >= 1 and bool(np.all(val == value))
    return isinstance(val, (int, float)) and not isinstance(val, bool) and val == value


def _same_type(g, a, b):
    da, db = g.nodes[a], g.nodes[b]
    return da.get("shape") == db.get("shape") and da.get("dtype") == db.get("dtype")


def constant_folding(g):
    """Evaluate nodes whose operands are all constants."""
    changed = False
    for v in ir.topo_order(g):
        d = g.nodes[v]
        if d["op"] in ("input", "const", "proj") or d.get("avals") is not None:
            continue
        ops = ir.operands(g, v)
        if not ops or any(g.nodes[u]["op"] != "const" for u in ops):
            continue
        if d["op"] == "broadcast_to":
            continue  # a view at run time; folding would materialise it
        shape = d["shape"]
        if int(np.prod(shape)) > FOLD_MAX_ELEMENTS:
            continue
        prim = primitives.get(d["op"])
        args = [g.nodes[u]["value"] for u in ops]
        with np.errstate(all="ignore"):
            val = np.asarray(prim.impl(np, *args, **d["attrs"]))
        val = val.astype(d["dtype"], copy=False)
        for u in ops:
            g.remove_edge(u, v)
        d["op"] = "const"
        d["attrs"] = {}
        d["value"] = val
        changed = True
    return changed


def _drop_explicit_broadcasts(g, v, d, ops):
    """An elementwise op broadcasts by itself: read x instead of
    broadcast_to(x) when another operand already has the output's shape."""
    changed = False
    for pos, u in enumerate(ops):
        du = g.nodes[u]
        if du["op"] != "broadcast_to":
            continue
        others = [w for j, w in enumerate(ops) if j != pos]
        if any(g.nodes[w].get("shape") == d["shape"] for w in others):
            src = ir.operands(g, u)[0]
            for _, _, k, dd in list(g.in_edges(v, keys=True, data=True)):
                if dd["pos"] == pos:
                    g.remove_edge(u, v, key=k)
            g.add_edge(src, v, key=pos, pos=pos)
            changed = True
    return changed


def _simplify_node(g, v):
    """One algebraic rewrite at v; returns the node that replaces v, or None."""
    d = g.nodes[v]
    op = d["op"]
    ops = ir.operands(g, v)
    prim = primitives.REGISTRY.get(op)
    if prim is not None and prim.elementwise and len(ops) > 1 and \
            _drop_explicit_broadcasts(g, v, d, ops):
        ops = ir.operands(g, v)
    if op == "pow" and _is_scalar_const(g, ops[1], 2) and _same_type(g, ops[0], v):
        # x ** 2 -> x * x: one multiply instead of a pow
        return add_node(g, "mul", [ops[0], ops[0]], {}, d["shape"], d["dtype"], d.get("loc"))
    if op == "mul":
        a, b = ops
        if _is_scalar_const(g, b, 1) and _same_type(g, a, v):
            return a
        if _is_scalar_const(g, a, 1) and _same_type(g, b, v):
            return b
    elif op in ("add", "sub"):
        a, b = ops
        if _is_scalar_const(g, b, 0) and _same_type(g, a, v):
            return a
        if op == "add" and _is_scalar_const(g, a, 0) and _same_type(g, b, v):
            return b
    elif op == "div":
        a, b = ops
        if _is_scalar_const(g, b, 1) and _same_type(g, a, v):
            return a
    elif op == "neg":
        (a,) = ops
        if g.nodes[a]["op"] == "neg":
            return ir.operands(g, a)[0]
    elif op in ("reshape", "broadcast_to"):
        (a,) = ops
        if _same_type(g, a, v):
            return a
        if op == "reshape" and g.nodes[a]["op"] == "reshape":
            inner = ir.operands(g, a)[0]
            return add_node(g, "reshape", [inner], d["attrs"], d["shape"], d["dtype"], d.get("loc"))
    elif op == "astype":
        (a,) = ops
        if _same_type(g, a, v):
            return a
    elif op == "transpose":
        (a,) = ops
        axes = d["attrs"]["axes"]
        if tuple(axes) == tuple(range(len(axes))):
            return a
        if g.nodes[a]["op"] == "transpose":
            inner = ir.operands(g, a)[0]
            inner_axes = g.nodes[a]["attrs"]["axes"]
            comp = tuple(inner_axes[i] for i in axes)
            if comp == tuple(range(len(comp))):
                return inner
            return add_node(g, "transpose", [inner], {"axes": comp}, d["shape"], d["dtype"], d.get("loc"))
    elif op == "sum":
        (a,) = ops
        da = g.nodes[a]
        if da["op"] == "broadcast_to":
            # sum over exactly the broadcast axes of broadcast_to(x) is x * n
            x = ir.operands(g, a)[0]
            xs = g.nodes[x]["shape"]
            full = da["shape"]
            lead = len(full) - len(xs)
            bcast = {i for i in range(len(full))
                     if i < lead or (xs[i - lead] == 1 and full[i] != 1)}
            axes = set(d["attrs"]["axis"])
            if bcast and axes == bcast and np.issubdtype(d["dtype"], np.inexact):
                n = int(np.prod([full[i] for i in axes]))
                xr = x
                if tuple(xs) != tuple(d["shape"]):
                    xr = add_node(g, "reshape", [x], {"shape": tuple(d["shape"])}, d["shape"],
                                  g.nodes[x]["dtype"], d.get("loc"))
                c = add_node(g, "const", [], {}, (), np.float64, value=float(n))
                return add_node(g, "mul", [xr, c], {}, d["shape"], d["dtype"], d.get("loc"))
    return None


def simplify(g):
    changed = False
    for v in ir.topo_order(g):
        if v not in g or g.nodes[v]["op"] in ("input", "const", "proj"):
            continue
        new = _simplify_node(g, v)
        if new is not None and new != v:
            replace_uses(g, v, new)
            changed = True
    return changed


def _cse_key(g, v):
    d = g.nodes[v]
    if d["op"] == "const":
        val = d["value"]
        if isinstance(val, np.ndarray):
            return ("const", val.dtype.str, val.shape, val.tobytes())
        return ("const", type(val).__name__, repr(val))
    if d["op"] == "input":
        return None
    return (d["op"], tuple(ir.operands(g, v)), tuple(sorted(d["attrs"].items())))


def common_subexpression_elimination(g):
    seen = {}
    changed = False
    for v in ir.topo_order(g):
        key = _cse_key(g, v)
        if key is None:
            continue
        try:
            hash(key)
        except TypeError:
            continue
        w = seen.get(key)
        if w is None:
            seen[key] = v
        else:
            replace_uses(g, v, w)
            changed = True
    return changed


def optimize(g, validate=False):
    """Run the passes until nothing changes."""
    for _ in range(10):
        changed = constant_folding(g)
        changed |= simplify(g)
        changed |= common_subexpression_elimination(g)
        changed |= dead_code_elimination(g)
        if validate:
            ir.validate(g)
        if not changed:
            break
    return g
