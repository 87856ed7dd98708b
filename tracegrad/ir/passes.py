"""Optimisation passes on the IR graph.

Each pass takes a graph and rewrites it in place: constant folding,
algebraic simplification, common-subexpression elimination and dead-code
elimination.  ``optimize`` runs them to a fixed point.  Buffer planning,
which needs the final statement order, lives in codegen (``plan_buffers``).
"""
from __future__ import annotations

import weakref

import numpy as np

from tracegrad.ir import graph as ir
from tracegrad.ops import primitives, symbolic

# Constants larger than this stay as operations in the generated code
# instead of being folded into embedded arrays.
FOLD_MAX_ELEMENTS = 4096


_next_ids = weakref.WeakKeyDictionary()    # graph -> the next fresh node id


def _new_id(g):
    """A node id larger than every id in ``g`` (creation order breaks ties in
    the topological order), remembered per graph: scanning for the maximum
    at every new node made the passes quadratic in the graph's size."""
    v = _next_ids.get(g)
    if v is None or v in g:
        v = max(g.nodes) + 1 if len(g) else 0
    _next_ids[g] = v + 1
    return v


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
    broadcast_to(x) when the operands still broadcast to the output shape."""
    changed = False
    for pos, u in enumerate(ops):
        if g.nodes[u]["op"] != "broadcast_to":
            continue
        src = ir.operands(g, u)[0]
        shapes = [g.nodes[w].get("shape") or () for j, w in enumerate(ops) if j != pos]
        try:
            ok = primitives.broadcast_shapes(g.nodes[src].get("shape") or (), *shapes) == d["shape"]
        except ValueError:
            ok = False
        if ok:
            for _, _, k, dd in list(g.in_edges(v, keys=True, data=True)):
                if dd["pos"] == pos:
                    g.remove_edge(u, v, key=k)
            g.add_edge(src, v, key=pos, pos=pos)
            ops[pos] = src
            changed = True
    return changed


def _scalar(g, v):
    """The value of a scalar constant that cannot change a result's shape or
    dtype when it multiplies (a Python number), else None."""
    d = g.nodes[v]
    if d["op"] != "const":
        return None
    val = d["value"]
    if isinstance(val, (int, float, symbolic.Sym)) and not isinstance(val, bool):
        return val
    # a one-element float64 array (a folded seed such as [100.]): callers
    # only use it where the other operand already has the result's dtype
    if isinstance(val, np.ndarray) and val.size == 1 and val.dtype == np.float64:
        return float(val.reshape(()))
    return None


def _single_use(g, v):
    return g.out_degree(v) == 1 and v not in g.graph["outputs"]


def _scale(g, x, c, d):
    """x * c as a new node (c a Python number), typed like d."""
    k = add_node(g, "const", [], {}, (), np.float64, value=c)
    return add_node(g, "mul", [x, k], {}, d["shape"], d["dtype"], d.get("loc"))


def _collect_constants(g, v, d, op, ops):
    """Products with Python-number factors: constants move outwards and
    fold (2*(100*x) -> 200*x, x + x -> 2*x, -(c*x) -> -c*x), so the chains
    the adjoint builds cost one multiply instead of several."""
    if not np.issubdtype(d["dtype"], np.inexact):
        return None
    if op == "add" and ops[0] == ops[1]:
        return _scale(g, ops[0], 2.0, d)
    if op == "neg":
        (a,) = ops
        da = g.nodes[a]
        if da["op"] == "mul" and _single_use(g, a):
            x, y = ir.operands(g, a)
            for p, q in ((x, y), (y, x)):
                c = _scalar(g, q)
                if c is not None and g.nodes[p]["dtype"] == d["dtype"] and \
                        g.nodes[p]["shape"] == d["shape"]:
                    return _scale(g, p, -c, d)
    if op != "mul":
        return None
    for pos in (0, 1):
        inner, other = ops[pos], ops[1 - pos]
        if g.nodes[inner]["op"] == "neg" and _single_use(g, inner):
            # (-x) * y -> -(x * y): the sign joins the other constants
            x = ir.operands(g, inner)[0]
            c = _scalar(g, other)
            if c is not None and g.nodes[x]["dtype"] == d["dtype"] and \
                    g.nodes[x]["shape"] == d["shape"]:
                return _scale(g, x, -c, d)
            if c is None:
                prod = add_node(g, "mul", [x, other] if pos == 0 else [other, x], {},
                                d["shape"], d["dtype"], d.get("loc"))
                return add_node(g, "neg", [prod], {}, d["shape"], d["dtype"], d.get("loc"))
    for pos in (0, 1):
        c = _scalar(g, ops[1 - pos])
        inner = ops[pos]
        di = g.nodes[inner]
        if c is None or di["op"] != "mul" or not _single_use(g, inner):
            continue
        a, b = ir.operands(g, inner)
        for p, q in ((a, b), (b, a)):
            c2 = _scalar(g, q)
            if c2 is not None and g.nodes[p]["dtype"] == d["dtype"] and \
                    g.nodes[p]["shape"] == d["shape"]:
                return _scale(g, p, c * c2, d)
    # (x * c) * y -> (x * y) * c, so constants meet and fold further up
    for pos in (0, 1):
        inner, other = ops[pos], ops[1 - pos]
        di = g.nodes[inner]
        if _scalar(g, other) is not None or di["op"] != "mul" or not _single_use(g, inner):
            continue
        a, b = ir.operands(g, inner)
        for p, q in ((a, b), (b, a)):
            c = _scalar(g, q)
            if c is None:
                continue
            dp, do = g.nodes[p], g.nodes[other]
            try:
                shape = primitives.broadcast_shapes(dp["shape"], do["shape"])
            except ValueError:
                continue
            dtype = np.result_type(dp["dtype"], do["dtype"])
            if shape != d["shape"] or dtype != d["dtype"]:
                continue
            prod = add_node(g, "mul", [p, other], {}, shape, dtype, d.get("loc"))
            return _scale(g, prod, c, d)
    return None


def _push_scalar_through_broadcast(g, v, d, op, ops):
    """f(broadcast_to(x), scalars...) -> broadcast_to(f(x, scalars...)): the
    elementwise work happens on the small array and the broadcast stays lazy."""
    prim = primitives.REGISTRY.get(op)
    if prim is None or not prim.elementwise or prim.nondiff:
        return None
    bpos = [i for i, u in enumerate(ops) if g.nodes[u]["op"] == "broadcast_to"]
    if len(bpos) != 1:
        return None
    others = [u for i, u in enumerate(ops) if i != bpos[0]]
    if not all(_scalar(g, u) is not None for u in others):
        return None
    src = ir.operands(g, ops[bpos[0]])[0]
    avals = [ir.aval(g, src) if i == bpos[0] else ir.aval(g, u) for i, u in enumerate(ops)]
    small = (prim.shape)(*avals, **d["attrs"])
    if np.dtype(small.dtype) != d["dtype"]:
        return None
    new_ops = [src if i == bpos[0] else u for i, u in enumerate(ops)]
    inner = add_node(g, op, new_ops, d["attrs"], small.shape, small.dtype, d.get("loc"))
    return add_node(g, "broadcast_to", [inner], {"shape": d["shape"]}, d["shape"], d["dtype"],
                    d.get("loc"))


def _uniform_constants_to_scalars(g, v, d, ops):
    """An elementwise operand that is a constant array of one repeated value
    (a folded seed such as a vector of 0.5) becomes that Python number when
    the other operands already give the result's shape and dtype, so
    constant collection can fold it and no array is embedded."""
    changed = False
    for pos, u in enumerate(ops):
        du = g.nodes[u]
        val = du.get("value")
        if du["op"] != "const" or not isinstance(val, np.ndarray) or val.size < 2 \
                or val.dtype != d["dtype"] or val.dtype.kind != "f":
            continue
        first = val.reshape(-1)[0]
        if not np.all(val == first):
            continue
        others = [w for j, w in enumerate(ops) if j != pos]
        try:
            shape = primitives.broadcast_shapes(*[g.nodes[w].get("shape") or () for w in others])
        except ValueError:
            continue
        if shape != d["shape"] or any(g.nodes[w]["dtype"] != d["dtype"] for w in others
                                      if g.nodes[w]["op"] != "const"):
            continue
        k = add_node(g, "const", [], {}, (), np.float64, value=float(first))
        for _, _, key, dd in list(g.in_edges(v, keys=True, data=True)):
            if dd["pos"] == pos:
                g.remove_edge(u, v, key=key)
        g.add_edge(k, v, key=pos, pos=pos)
        ops[pos] = k
        changed = True
    return changed


def _diagonal_factors(g, u, n, depth=0):
    """If u is diag(f1 * f2 * ...) -- the identity (basis) times vectors of
    length n along its last axis or scalars -- the factor nodes, else None."""
    du = g.nodes[u]
    if du["op"] == "basis" and du["shape"] == (n, n):
        return []
    if du["op"] != "mul" or du.get("shape") != (n, n) or depth > 8:
        return None
    a, b = ir.operands(g, u)
    for p, q in ((a, b), (b, a)):
        if g.nodes[q].get("shape") in ((n,), (), (1,)):
            inner = _diagonal_factors(g, p, n, depth + 1)
            if inner is not None:
                return inner + [q]
    return None


def _sum_of_product_as_matmul(g, v, d, ops):
    """sum(M * w, axis=-1) with M a matrix and w a vector along its rows is
    M @ w: one BLAS call instead of an elementwise pass and a reduction
    (the adjoint writes this for every reduction's broadcast cotangent)."""
    (p,) = ops
    dp = g.nodes[p]
    if dp["op"] != "mul" or not _single_use(g, p) or dp.get("shape") is None \
            or len(dp["shape"]) != 2 or tuple(d["attrs"]["axis"]) != (1,):
        return None
    r, c = dp["shape"]
    a, b = ir.operands(g, p)
    for m, w in ((a, b), (b, a)):
        dm, dw = g.nodes[m], g.nodes[w]
        if dm.get("shape") == (r, c) and dw.get("shape") == (c,) and \
                dm["dtype"] == dw["dtype"] == d["dtype"] and np.issubdtype(d["dtype"], np.inexact):
            out = add_node(g, "matmul", [m, w], {}, (r,), d["dtype"], d.get("loc"))
            if d["attrs"]["keepdims"]:
                out = add_node(g, "reshape", [out], {"shape": (r, 1)}, (r, 1), d["dtype"],
                               d.get("loc"))
            return out
    return None


def _diagonal_matmul(g, v, d, ops):
    """diag(w) @ M -> w[:, None] * M: the Jacobian seeds the adjoint builds
    are diagonal matrices, and this turns an O(n^3) product into O(n^2)."""
    a, m = ops
    da, dm = g.nodes[a], g.nodes[m]
    if da.get("shape") is None or len(da["shape"]) != 2 or da["shape"][0] != da["shape"][1]:
        return None
    n = da["shape"][0]
    factors = _diagonal_factors(g, a, n)
    if not factors or dm.get("shape") is None or len(dm["shape"]) != 2 or dm["shape"][0] != n:
        return None
    if np.result_type(da["dtype"], dm["dtype"]) != d["dtype"]:
        return None
    w = factors[0]
    for f in factors[1:]:
        w = add_node(g, "mul", [w, f], {},
                     primitives.broadcast_shapes(g.nodes[w]["shape"], g.nodes[f]["shape"]),
                     np.result_type(g.nodes[w]["dtype"], g.nodes[f]["dtype"]), d.get("loc"))
    dw = g.nodes[w]
    if dw["shape"] == (n,):
        w = add_node(g, "reshape", [w], {"shape": (n, 1)}, (n, 1), dw["dtype"], d.get("loc"))
    return add_node(g, "mul", [w, m], {}, d["shape"], d["dtype"], d.get("loc"))


def _push_negations(g, v, d, op, ops):
    """Signs move outwards through linear ops until an add or sub absorbs
    them: sum(-x) -> -sum(x), reshape(-x) -> -reshape(x), a + (-b) -> a - b,
    a - (-b) -> a + b.  The adjoint of a subtraction leaves such negations
    on whole arrays; this turns each into nothing or a negation of a
    smaller one."""
    if op in ("sum", "reshape", "broadcast_to", "transpose"):
        (a,) = ops
        if g.nodes[a]["op"] == "neg" and _single_use(g, a):
            x = ir.operands(g, a)[0]
            inner = add_node(g, op, [x], d["attrs"], d["shape"], d["dtype"], d.get("loc"))
            return add_node(g, "neg", [inner], {}, d["shape"], d["dtype"], d.get("loc"))
        return None
    if op not in ("add", "sub"):
        return None
    a, b = ops
    na = g.nodes[a]["op"] == "neg" and _single_use(g, a)
    nb = g.nodes[b]["op"] == "neg" and _single_use(g, b)
    if nb:
        y = ir.operands(g, b)[0]
        new_op = "sub" if op == "add" else "add"
        if primitives.broadcast_shapes(g.nodes[a].get("shape") or (),
                                       g.nodes[y].get("shape") or ()) == d["shape"]:
            return add_node(g, new_op, [a, y], {}, d["shape"], d["dtype"], d.get("loc"))
    if na and op == "add":
        x = ir.operands(g, a)[0]
        return add_node(g, "sub", [b, x], {}, d["shape"], d["dtype"], d.get("loc"))
    return None


def _simplify_node(g, v, exact=False):
    """One algebraic rewrite at v; returns the node that replaces v, or None.
    exact: only rewrites that compute the same floating-point numbers."""
    d = g.nodes[v]
    op = d["op"]
    ops = ir.operands(g, v)
    prim = primitives.REGISTRY.get(op)
    if prim is not None and prim.elementwise and len(ops) > 1:
        _drop_explicit_broadcasts(g, v, d, ops)
        ops = ir.operands(g, v)
        if not exact and any(g.nodes[w]["op"] != "const" for w in ops):
            _uniform_constants_to_scalars(g, v, d, ops)
    rules = ((_push_scalar_through_broadcast, _push_negations) if exact else
             (_push_scalar_through_broadcast, _collect_constants, _push_negations))
    for rule in rules:
        new = rule(g, v, d, op, ops)
        if new is not None:
            return new
    if exact:
        return _exact_identity(g, v, d, op, ops, exact=True)
    if op == "matmul" and g.nodes[ops[0]]["op"] == "basis" and \
            len(g.nodes[ops[0]]["shape"]) == 2 and _same_type(g, ops[1], v):
        return ops[1]  # identity @ M
    if op == "add":
        # I + M -> plus_identity(M): no identity matrix is built
        for p, q in ((ops[0], ops[1]), (ops[1], ops[0])):
            dp, dq = g.nodes[p], g.nodes[q]
            if dp["op"] == "basis" and len(dp["shape"]) == 2 and dq.get("shape") == dp["shape"] \
                    and dq["dtype"] == d["dtype"] and d["shape"] == dp["shape"]:
                return add_node(g, "plus_identity", [q], {}, d["shape"], d["dtype"], d.get("loc"))
    if op == "sort":
        new = _sort_by_its_argsort(g, v, d, ops)
        if new is not None:
            return new
    if op == "sum":
        new = _sum_of_product_as_matmul(g, v, d, ops)
        if new is not None:
            return new
    if op == "matmul":
        new = _diagonal_matmul(g, v, d, ops)
        if new is not None:
            return new
    if op == "pow" and _is_scalar_const(g, ops[1], 2) and _same_type(g, ops[0], v):
        # x ** 2 -> x * x: one multiply instead of a pow
        return add_node(g, "mul", [ops[0], ops[0]], {}, d["shape"], d["dtype"], d.get("loc"))
    if op == "sum":
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
    return _exact_identity(g, v, d, op, ops)


def _sort_by_its_argsort(g, v, d, ops):
    """sort(x) -> x gathered by argsort(x) where the graph computes that
    argsort anyway (a sort's gradient does), for one sort instead of two.
    The gather gives the sort's own bits (permute_along's kind)."""
    (x,) = ops
    for w in g.successors(x):
        dw = g.nodes[w]
        if dw["op"] == "argsort" and dw["attrs"] == d["attrs"]:
            return add_node(g, "permute_along", [x, w], d["attrs"], d["shape"], d["dtype"],
                            d.get("loc"))
    return None


def _exact_identity(g, v, d, op, ops, exact=False):
    """x * 1, x + 0, -(-x), a reshape or cast to what x already is...: x.
    exact: not x + 0 (for x = -0.0 the sum is +0.0); x - 0 stays, it is x."""
    if op == "mul":
        a, b = ops
        if _is_scalar_const(g, b, 1) and _same_type(g, a, v):
            return a
        if _is_scalar_const(g, a, 1) and _same_type(g, b, v):
            return b
    elif op == "sub" or (op == "add" and not exact):
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
    return None


def simplify(g, exact=False):
    changed = False
    for v in ir.topo_order(g):
        if v not in g or g.nodes[v]["op"] in ("input", "const", "proj"):
            continue
        new = _simplify_node(g, v, exact)
        if new is not None and new != v:
            replace_uses(g, v, new)
            changed = True
    return changed


def _cse_key(g, v):
    d = g.nodes[v]
    if d["op"] == "const":
        val = d["value"]
        if isinstance(val, np.ndarray):
            return ("const", val.dtype.str, val.shape, primitives.content_digest(val))
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


# Ops whose NumPy result may be a view of their first operand, or that
# operand itself (np.real of a real array).
_VIEW_OPS = frozenset({"reshape", "transpose", "broadcast_to", "getitem", "flip", "real",
                       "imag", "dynamic_slice", "astype"})


def alias_root(g, v):
    """The input or constant array whose memory the value of node v may
    share (through ops that can return views): ("input", node) or ("const",
    id of the array), else None."""
    while True:
        d = g.nodes[v]
        if d["op"] == "input":
            return ("input", v)
        if d["op"] == "const":
            return ("const", id(d["value"])) if isinstance(d["value"], np.ndarray) else None
        if d["op"] not in _VIEW_OPS:
            return None
        v = ir.operands(g, v)[0]


def fresh_outputs(g, returned=None):
    """``g`` with a ``clone`` before every output that may share memory with
    an input or a constant array, except where the user's function itself
    returned that input or a view of it (``returned``: per output position,
    ``alias_root`` of the traced output, before the passes; None for a
    transform's graph, whose outputs are all fresh).  A constant is the
    module's one array: each call gets its own copy (NumPy's ``np.zeros(3)``
    in the function is a new array each call).  A gradient that is
    ``y`` itself (d/dx of sum(x * y)) or a value that a pass made an input
    (``x * 1.0``) is otherwise the caller's array: writing into the result
    (``g *= lr``) would change the caller's data, where NumPy and eager
    mode give a new array.  An output that is the node of an earlier one
    (``(x * 2, x * 2)``, one node after hash-consing) is a second array too,
    and a broadcast (the gradient of a sum) a writable array: NumPy's
    read-only view only where the function returned one as written.  ``g``
    itself is left as it was (a copy gets the clones)."""
    outs = list(g.graph["outputs"])
    todo, seen = [], set()
    for p, v in enumerate(outs):
        root = alias_root(g, v)
        as_written = root is not None and root[0] == "input" and returned is not None \
            and p < len(returned) and returned[p] == root
        if (root is not None or v in seen or g.nodes[v]["op"] == "broadcast_to") \
                and not as_written:
            todo.append(p)
        seen.add(v)
    if not todo:
        return g
    g = g.copy()
    for p in todo:
        d = g.nodes[outs[p]]
        outs[p] = add_node(g, "clone", [outs[p]], {}, d["shape"], d["dtype"], d.get("loc"))
    g.graph["outputs"] = outs
    return g


def optimize(g, validate=False, exact=False):
    """Run the passes until nothing changes.  exact: only rewrites that keep
    every floating-point result as it was (folding evaluates the same
    operations early; constants are not collected, nothing is reassociated)."""
    for _ in range(10):
        changed = constant_folding(g)
        changed |= simplify(g, exact)
        changed |= common_subexpression_elimination(g)
        changed |= dead_code_elimination(g)
        if validate:
            ir.validate(g)
        if not changed:
            break
    return g


# --- fusion (the CUDA target's grouping of elementwise nodes) ------------------------
# Added for the CUDA target (tracegrad/targets/cuda/).  Every decision about
# which nodes share a kernel is made here, in ``fusion_groups`` and the two
# predicates it calls; the generator only renders the groups it is given.

# Dtypes a kernel can load, compute and store (NumPy dtype name -> C type is
# the CUDA generator's table; these are the names it knows).
FUSIBLE_DTYPES = frozenset({"float32", "float64", "bool", "int8", "uint8", "int16", "uint16",
                            "int32", "uint32", "int64", "uint64"})


class FusionGroup:
    """One kernel: elementwise ``nodes`` (topological order) over ``shape``,
    plus ``reductions``: full ``sum`` nodes whose operand is computed in the
    group, emitted as the kernel's epilogue (per-thread partial sums)."""
    __slots__ = ("nodes", "shape", "reductions")

    def __init__(self, nodes, shape, reductions):
        self.nodes = nodes
        self.shape = shape
        self.reductions = reductions

    def __repr__(self):
        return f"<FusionGroup {list(self.shape)} nodes={self.nodes} reductions={self.reductions}>"


def fusible(g, v):
    """Can node v be computed inside a kernel?  It must be a single-output
    elementwise primitive with a CUDA expression in its registry row, of a
    dtype the kernel can hold, producing at least one element (an empty
    result needs no kernel, and a zero-sized grid cannot be launched)."""
    d = g.nodes[v]
    if d["op"] in ("input", "const", "proj") or d.get("avals") is not None:
        return False
    prim = primitives.REGISTRY.get(d["op"])
    if prim is None or not prim.elementwise or prim.cuda is None:
        return False
    if not _fusible_dtype(d["dtype"]) or 0 in d["shape"]:
        return False
    if d["op"] == "pow" and np.dtype(d["dtype"]).kind in "iu":
        # C's and CUDA's pow are double (53 bits), and a negative exponent is
        # NumPy's error: an integer power stays NumPy's
        return False
    for u in ir.operands(g, v):
        du = g.nodes[u]
        if du["op"] == "const" and not isinstance(du["value"], np.ndarray):
            continue  # a Python scalar becomes a literal
        if not _fusible_dtype(du.get("dtype")):
            return False
    return True


_FUSIBLE_SEEN = {}


def _fusible_dtype(dt):
    """``str(dt) in FUSIBLE_DTYPES``, remembered per dtype (str of a dtype
    costs microseconds, and fusion asks once per node and operand)."""
    try:
        return _FUSIBLE_SEEN[dt]
    except KeyError:
        ok = _FUSIBLE_SEEN[dt] = dt is not None and str(dt) in FUSIBLE_DTYPES
        return ok
    except TypeError:      # not hashable
        return dt is not None and str(dt) in FUSIBLE_DTYPES


def _fused_reduction(g, r, member_of):
    """Is node r a reduction the kernel computing its operand can finish?

    Only a ``sum`` over every axis, of a float operand computed in a group,
    in the operand's dtype: the kernel accumulates one partial sum per
    thread in a register and stores it, and the driver sums the few
    thousand partials with CuPy, so the operand itself never reaches
    memory.  Partial-axis sums stay with CuPy (its reduction kernels beat a
    strided grid-stride loop), as do max/min/prod."""
    d = g.nodes[r]
    if d["op"] != "sum":
        return False
    (u,) = ir.operands(g, r)
    du = g.nodes[u]
    if u not in member_of or du["dtype"] != d["dtype"] or du["dtype"].kind != "f":
        return False
    return tuple(d["attrs"]["axis"]) == tuple(range(len(du["shape"])))


def fusion_groups(g):
    """Partition the fusible nodes of ``g`` into kernels: the one cost
    function of the CUDA and native CPU targets.

    Cost model: an elementwise kernel (a GPU grid-stride loop or a CPU
    vector loop) is bound by memory traffic and call count, not arithmetic,
    so every edge kept inside a kernel saves a store, a load and (for the
    last user) an allocation, and every merge saves a launch.  Fusing is
    therefore always profitable, subject to four rules that keep a kernel
    one loop without redundant work:

    1. **Same iteration space.**  All nodes of a group produce the same
       shape; operands from outside the group may have any shape that
       broadcasts to it (the kernel reads them through constant strides).
       A smaller node feeding a larger one (``x[:, None] * y``) is not
       pulled in: it would be recomputed once per broadcast element.
    2. **Connected.**  Nodes join the group of an operand they read; two
       unrelated chains of the same shape stay separate kernels (merging
       them saves a launch but no traffic, and keeps kernels readable).
    3. **Convex.**  No path may leave a group and come back into it (through
       a reduction, a matmul, another kernel...): the contracted graph must
       stay acyclic, or no launch order exists.  Checked on each merge.
    4. **Bounded.**  A group holds at most ``FUSION_MAX_NODES`` nodes: a
       kernel's loop body is one basic block, and the C compiler's time on
       it grows faster than linearly with its length.

    Reductions, matrix products, indexing and shape ops break groups: they
    run as library calls between kernels.  Exception: a full ``sum`` of a
    value computed in a group becomes that kernel's epilogue
    (``_fused_reduction``); W2's forward and both gradients are then a
    single kernel.

    The convexity check is near-linear in the graph's size: each node keeps
    a bit set (a Python int) of the groups it is reachable from, and each
    group the edges that enter it from a node reachable from some group
    (the only edges that can close a cycle).  A merge then checks only those
    edges, never walks the graph.

    Returns ``FusionGroup``s ordered by their first node; the generator
    schedules them among the other nodes on the contracted graph, which
    convexity keeps acyclic."""
    order = ir.topo_order(g)
    index = {v: i for i, v in enumerate(order)}
    member_of = {}   # node -> group id (one of its nodes)
    groups = {}      # group id -> list of nodes
    ids = {}         # group id -> bit set (a Python int) of every group id merged into it
    sources = {}     # group id -> nodes outside it, reachable from some group, that it reads
    srcmask = {}     # group id -> OR of mask(w) over its sources (an over-approximation)
    reach = {}       # node -> bit set of the groups (ids at the time) with a path to it

    def mask(w):
        m = reach[w]
        gid = member_of.get(w)
        return m | (1 << index[gid]) if gid is not None else m

    def escapes(h, cand, cand_ids):
        """Does a source of group h (outside ``cand``) have a path from ``cand``?"""
        if not srcmask[h] & cand_ids:
            return False
        exact = 0
        found = False
        for w in sources[h]:
            m = mask(w)
            exact |= m
            if member_of.get(w) not in cand and m & cand_ids:
                found = True
        srcmask[h] = exact
        return found

    for v in order:
        r = 0
        for u in g.predecessors(v):
            r |= mask(u)
        reach[v] = r        # the groups with a path to v
        if not fusible(g, v):
            continue
        shape = g.nodes[v]["shape"]
        ops = ir.operands(g, v)
        own = {u for u in ops if mask(u)}
        own_mask = 0
        for u in own:
            own_mask |= mask(u)
        merged_ids, merged_gids, size = 0, [], 1
        for u in ops:
            gid = member_of.get(u)
            if gid is None or gid in merged_gids or g.nodes[u]["shape"] != shape:
                continue
            if size + len(groups[gid]) > FUSION_MAX_NODES:
                continue    # a full group: v starts another (see FUSION_MAX_NODES)
            cand = set(merged_gids) | {gid}
            cand_ids = merged_ids | ids[gid]
            # a path out of the candidate and back in enters it through a
            # source of one of its parts (or of v) that the candidate reaches
            cycle = any(member_of.get(w) not in cand and mask(w) & cand_ids for w in own) \
                if own_mask & cand_ids else False
            cycle = cycle or any(escapes(h, cand, cand_ids) for h in cand)
            if not cycle:
                merged_gids.append(gid)
                merged_ids = cand_ids
                size += len(groups[gid])
        if not merged_gids:
            groups[v], ids[v], sources[v], srcmask[v] = [v], 1 << index[v], own, own_mask
            member_of[v] = v
            continue
        # the largest lists and sets absorb the smaller ones (near-linear
        # merging); the largest group's id names the merged one
        gid = max(merged_gids, key=lambda h: len(groups[h]))
        nodes = groups[gid]
        src = max([sources[h] for h in merged_gids] + [own], key=len)
        smask = own_mask
        for h in merged_gids:
            smask |= srcmask[h]
            if h != gid:
                for u in groups.pop(h):
                    member_of[u] = gid
                    nodes.append(u)
                    src.discard(u)
        nodes.append(v)
        member_of[v] = gid
        for part in [sources[h] for h in merged_gids] + [own]:
            if part is not src:
                src.update(w for w in part if member_of.get(w) != gid)
        for h in merged_gids:
            if h != gid:
                del ids[h], sources[h], srcmask[h]
        ids[gid], sources[gid], srcmask[gid] = merged_ids, src, smask

    # A sum joins the kernel of its operand only when no node of that kernel
    # reads it (x / sum(x * x) in one group would be a cycle): one forward
    # pass carries, per node, the bit set of candidate sums it depends on.
    candidates = [v for v in order if g.nodes[v]["op"] == "sum"
                  and _fused_reduction(g, v, member_of)]
    bit = {r: 1 << k for k, r in enumerate(candidates)}
    after = {}       # node -> bit set of the candidate sums it depends on
    for v in order:
        m = 0
        for u in g.predecessors(v):
            m |= after.get(u, 0) | bit.get(u, 0)
        if m:
            after[v] = m
    read_in_group = {gid: 0 for gid in groups}
    for v, m in after.items():
        if v in member_of:
            read_in_group[member_of[v]] |= m
    reductions = {gid: [] for gid in groups}
    for r in candidates:
        gid = member_of[ir.operands(g, r)[0]]
        if not read_in_group[gid] & bit[r]:
            reductions[gid].append(r)
    out = []
    for gid, nodes in groups.items():
        ordered = sorted(nodes, key=index.__getitem__)
        out += _bounded(g, ordered, reductions[gid])
    out.sort(key=lambda grp: index[grp.nodes[0]])
    return _without_cycles(g, _sink_into_readers(g, out, index), index)


def _sink_into_readers(g, groups, index):
    """Move the nodes a kernel computes only for one later kernel into that
    kernel, where their operands are at hand anyway.

    The greedy merge puts a node in the kernel of its operand: in an MLP's
    gradient ``1 - h*h`` joins the forward kernel of ``h = tanh(a)``, which
    then stores both h and 1 - h*h, although only the backward kernel
    ``dh * (1 - h*h)`` reads the second.  Computed there instead, from h
    (stored anyway, for the matrix products), one array is neither stored
    nor kept alive.  A set S of nodes of a group moves into group T when
    every reader of a node of S is in S or T (never a graph output, a fused
    sum or another kernel), and S reads no value of its group that the
    group did not store anyway and no more full-size arrays than it stops
    storing.  The contracted graph stays acyclic: T already came after the
    group and after everything S reads."""
    outs = set(g.graph["outputs"])
    group_of = {}
    for gi, grp in enumerate(groups):
        for v in grp.nodes:
            group_of[v] = gi
        for r in grp.reductions:
            group_of[r] = ("sum", gi)
    moved = False
    for gi, grp in enumerate(groups):
        members = set(grp.nodes)
        dest = {}
        for v in reversed(grp.nodes):
            if v in outs:
                continue
            targets = {dest.get(w, group_of.get(w)) if w in members else group_of.get(w)
                       for w in g.successors(v)}
            if len(targets) != 1:
                continue
            (t,) = targets
            if isinstance(t, int) and t != gi and groups[t].shape == grp.shape:
                dest[v] = t
        for t in sorted(set(dest.values())):
            S = [v for v in grp.nodes if dest.get(v) == t]
            if len(groups[t].nodes) + len(S) > FUSION_MAX_NODES:
                continue
            inside = set(S)
            stops_storing = sum(1 for v in S if any(w not in inside for w in g.successors(v)))
            new_loads, ok = set(), True
            for v in S:
                for u in ir.operands(g, v):
                    if u in inside or group_of.get(u) == t:
                        continue
                    if u in members and not any(group_of.get(w) != gi and w not in inside
                                                for w in g.successors(u)) and u not in outs:
                        ok = False      # its group would have to store it now
                    du = g.nodes[u]
                    if du["op"] != "const" and tuple(du.get("shape") or ()) == tuple(grp.shape):
                        new_loads.add(u)
            if not ok or len(new_loads) > stops_storing:
                continue
            grp.nodes = [v for v in grp.nodes if v not in inside]
            groups[t].nodes = sorted(groups[t].nodes + S, key=index.__getitem__)
            for v in S:
                group_of[v] = t
            members -= inside
            moved = True
    if not moved:
        return groups
    return sorted((grp for grp in groups if grp.nodes),
                  key=lambda grp: index[grp.nodes[0]])     # by first node, as before


# A kernel's loop body is one basic block of its group's nodes: the C
# compiler's time grows faster than linearly with it (docs/benchmarks.md,
# "Compile time": 0.55 ms of gcc per node in groups of 64 nodes, 0.75 in
# groups of 512, seconds for one group of 1,749), and the merge checks above
# walk a group's sources, so a group stops growing at this many nodes (a
# node whose operands' groups are full starts a new one; ``_bounded`` cuts
# any group still larger).
FUSION_MAX_NODES = 128


def _bounded(g, ordered, reductions):
    """A group's nodes (topological order) as groups of at most
    ``FUSION_MAX_NODES`` nodes: consecutive runs of that order, so no path
    leads from a later run back into an earlier one, and a path out of one
    run and back in would have left the whole group and come back (which
    the merges above refuse); each fused sum stays with its operand's run."""
    shape = tuple(g.nodes[ordered[0]]["shape"])
    if len(ordered) <= FUSION_MAX_NODES:
        return [FusionGroup(ordered, shape, reductions)]
    runs = [ordered[k:k + FUSION_MAX_NODES] for k in range(0, len(ordered), FUSION_MAX_NODES)]
    run_of = {v: j for j, run in enumerate(runs) for v in run}
    red = [[] for _ in runs]
    for r in reductions:
        red[run_of[ir.operands(g, r)[0]]].append(r)
    return [FusionGroup(run, shape, rs) for run, rs in zip(runs, red)]


def _cut_on_cycle(g, groups, cycle, unit_of, index):
    """``groups`` with one group of the contracted cycle ``cycle`` cut in
    two, so that this cycle is gone, or None where no cut is found.

    Each unit on the cycle is entered through a node b (an edge from the
    previous unit) and left from a node c (an edge to the next).  Along the
    cycle every edge goes forward in the topological order, so some group
    is left from an earlier node than it is entered at (a single node is
    entered and left at itself): cutting that group at b, into its nodes
    before b and those from b on, puts c and b in different kernels, and
    no path leads from the later part back into the earlier one.  A fused
    sum stays with its operand.  (The projectile's reverse step of
    benchmarks/loops.py: a cycle through the 0-d group of sqrt's adjoint
    split its 7-node and 3-node kernels into single nodes; cut, it keeps
    them.)"""
    def members(u):
        return list(groups[u[1]].nodes) + list(groups[u[1]].reductions) if u[0] == "g" else [u[1]]

    edges = []      # one node edge (c, b) per edge of the cycle
    for ua, ub, *_ in cycle:
        pair = next(((a, b) for a in members(ua) for b in g.successors(a)
                     if unit_of.get(b, ("n", b)) == ub), None)
        if pair is None:
            return None
        edges.append(pair)
    for k, (ua, ub, *_) in enumerate(cycle):
        if ub[0] != "g":
            continue
        grp = groups[ub[1]]
        b = edges[k][1]
        c = edges[(k + 1) % len(edges)][0]
        if c in grp.reductions:
            c = ir.operands(g, c)[0]
        if b not in grp.nodes or index[c] >= index[b]:
            continue
        first = [v for v in grp.nodes if index[v] < index[b]]
        later = [v for v in grp.nodes if index[v] >= index[b]]
        head = set(first)
        parts = [FusionGroup(first, grp.shape,
                             [r for r in grp.reductions if ir.operands(g, r)[0] in head]),
                 FusionGroup(later, grp.shape,
                             [r for r in grp.reductions if ir.operands(g, r)[0] not in head])]
        out = [h for gi, h in enumerate(groups) if gi != ub[1]] + parts
        out.sort(key=lambda h: index[h.nodes[0]])
        return out
    return None


def _without_cycles(g, groups, index):
    """``groups`` with no cycle left in the contracted graph.

    The merge checks above follow paths between nodes; a path through a
    third group's kernel (in through one of its nodes, out through another
    or through its fused sum) can still close a cycle once groups are
    contracted.  One linear check of the contracted graph finds it; while
    there is one, a group on it is cut in two (``_cut_on_cycle``); failing
    that, the groups on it give up their fused sums, then their fusion
    (their nodes become kernels of one node each)."""
    import networkx as nx
    while True:
        unit_of = {}
        for gi, grp in enumerate(groups):
            for v in list(grp.nodes) + list(grp.reductions):
                unit_of[v] = ("g", gi)
        c = nx.DiGraph()
        for a, b in g.edges():
            ua, ub = unit_of.get(a, ("n", a)), unit_of.get(b, ("n", b))
            if ua != ub:
                c.add_edge(ua, ub)
        # the usual answer, no cycle, by one linear topological sort
        # (networkx's find_cycle walks a DAG's edges once per start node:
        # quadratic, minutes on a graph of 1e4 groups)
        if nx.is_directed_acyclic_graph(c):
            return groups
        cycle = nx.find_cycle(c)
        cut = _cut_on_cycle(g, groups, cycle, unit_of, index)
        if cut is not None:
            groups = cut
            continue
        on_cycle = sorted({u[1] for edge in cycle for u in edge[:2] if u[0] == "g"})
        if any(groups[gi].reductions for gi in on_cycle):
            for gi in on_cycle:
                groups[gi] = FusionGroup(groups[gi].nodes, groups[gi].shape, [])
            continue
        keep = [grp for gi, grp in enumerate(groups) if gi not in on_cycle]
        for gi in on_cycle:
            keep.extend(FusionGroup([v], groups[gi].shape, []) for v in groups[gi].nodes)
        groups = sorted(keep, key=lambda grp: index[grp.nodes[0]])
