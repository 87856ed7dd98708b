"""The IR: a ``networkx.MultiDiGraph`` of primitive applications.

A node is an input, a constant, a primitive application, or ``proj`` (output
``index`` of a multi-output node).  Node attributes: ``op``, ``attrs``
(static parameters), ``shape``, ``dtype`` (``avals`` for multi-output nodes),
``loc`` (file, line, function of the user's code), ``value`` for constants,
``name`` for inputs.  An edge ``u -> v`` carries ``pos``, the operand
position, so ``x * x`` is two edges.  ``graph.graph["inputs"]`` and
``graph.graph["outputs"]`` list node ids in order.
"""
from __future__ import annotations

import heapq
import math

import networkx as nx
import numpy as np

from tracegrad.ops import primitives
from tracegrad.ops.primitives import Aval


def from_trace(trace) -> nx.MultiDiGraph:
    g = nx.MultiDiGraph()
    g.graph.update(inputs=list(trace.inputs), outputs=list(trace.outputs),
                   backend=trace.backend)
    for n in trace.nodes:
        attrs = dict(op=n.op, attrs=dict(n.attrs), loc=n.loc)
        if isinstance(n.aval, Aval):
            attrs.update(shape=tuple(n.aval.shape), dtype=np.dtype(n.aval.dtype))
        elif isinstance(n.aval, tuple):
            attrs.update(avals=tuple(n.aval), shape=None, dtype=None)
        else:  # a Python scalar constant (a symbolic one: ops.symbolic)
            attrs.update(shape=(), dtype=np.result_type(getattr(n.aval, "hint", n.aval)))
        if n.op == "const":
            attrs["value"] = n.value
        if n.op == "input":
            attrs["name"] = n.name
        g.add_node(n.id, **attrs)
        for pos, src in enumerate(n.inputs):
            g.add_edge(src, n.id, key=pos, pos=pos)
    return g


def operands(g, v):
    """Operand node ids of v, in position order."""
    # the adjacency dict itself (u -> {key: edge data}): the passes ask this
    # about every node many times, and networkx's edge views cost ~10x more
    edges = sorted([(d["pos"], u) for u, keyed in g._pred[v].items() for d in keyed.values()])
    return [u for _, u in edges]


def topo_order(g):
    """Nodes in a deterministic topological order (creation order breaks
    ties): networkx's lexicographical_topological_sort, on the adjacency
    dicts directly (every pass asks for it; the generic one was a third of
    the compile time of a large graph)."""
    pred, succ = g._pred, g._succ
    waiting = {v: len(p) for v, p in pred.items()}
    ready = [v for v, n in waiting.items() if n == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        v = heapq.heappop(ready)
        order.append(v)
        for w in succ[v]:
            waiting[w] -= 1
            if waiting[w] == 0:
                heapq.heappush(ready, w)
    if len(order) != len(waiting):
        raise nx.NetworkXUnfeasible("Graph contains a cycle or graph changed during iteration")
    return order


def _nbytes(d):
    if d["op"] in ("input", "const", "proj"):
        return 0
    avals = d.get("avals")
    if avals is None:
        shape = d.get("shape")
        return 0 if shape is None or d.get("dtype") is None else \
            math.prod(shape) * np.dtype(d["dtype"]).itemsize
    total = 0
    for a in avals:
        if getattr(a, "shape", None) is not None and getattr(a, "dtype", None) is not None:
            total += math.prod(a.shape) * np.dtype(a.dtype).itemsize
    return total


def _pinned(d):
    """Must this node keep its place among the other pinned nodes?  Draws
    from a shared random state, and nodes that run user code (loop and
    branch bodies, custom rules), whose draws or effects happen in the
    order the user wrote them."""
    if d["op"] == "random_draw":
        return True
    for x in d["attrs"].values():
        for y in (x if isinstance(x, (tuple, list)) else (x,)):
            if callable(y) or (hasattr(y, "inputs") and hasattr(y, "outputs")):
                return True
    return False


def memory_order(g):
    """Nodes in a topological order that keeps few buffers alive at once.

    A greedy list scheduler: of the nodes whose operands exist, run the one
    that frees the most bytes minus the bytes it allocates (a node frees a
    buffer when it is its last reader; a view allocates nothing and keeps
    its base alive), creation order breaking ties.  So a backward statement
    runs as soon as it can end an operand's life, rather than after the
    whole forward pass, and an allocation waits until it is needed.  Pinned
    nodes (random draws, bodies of user code) keep their relative order.
    O(E log V): scores change only when a buffer is left with one reader."""
    pred, succ, nodes = g._pred, g._succ, g._node
    creation = {v: i for i, v in enumerate(topo_order(g))}
    escapes = set(g.graph["outputs"])
    root, size, readers = {}, {}, {}
    aliasing = {name for name, p in primitives.REGISTRY.items() if p.aliases_operands}
    aliasing.add("proj")
    for v in creation:
        d = nodes[v]
        if d["op"] in aliasing and pred[v]:
            root[v] = root[operands(g, v)[0]]
            size[v] = 0
        else:
            root[v] = v
            size[v] = _nbytes(d)
        for u in pred[v]:
            readers.setdefault(root[u], set()).add(v)
    escapes |= {root[v] for v in escapes}
    for v, d in nodes.items():
        if d["op"] in ("input", "const"):
            escapes.add(v)
    # pinned nodes wait for the pinned node before them
    after = {}
    prev = None
    for v in creation:
        if _pinned(nodes[v]):
            if prev is not None:
                after[prev] = v
            prev = v
    waiting = {v: len(pred[v]) for v in creation}
    for a, b in after.items():
        waiting[b] += 1
    version = dict.fromkeys(creation, 0)

    def score(v):
        s = -size[v]
        for b in {root[u] for u in pred[v]}:
            if b not in escapes and readers[b] == {v}:
                s += size[b]
        return s

    ready = [(-score(v), creation[v], v, 0) for v, n in waiting.items() if n == 0]
    heapq.heapify(ready)
    order = []
    done = set()
    while ready:
        _, _, v, ver = heapq.heappop(ready)
        if v in done or ver != version[v]:
            continue
        done.add(v)
        order.append(v)
        for b in {root[u] for u in pred[v]}:
            rs = readers[b]
            rs.discard(v)
            if len(rs) == 1 and b not in escapes:
                (w,) = rs
                if waiting[w] == 0 and w not in done:   # its score just rose
                    version[w] += 1
                    heapq.heappush(ready, (-score(w), creation[w], w, version[w]))
        nxt = list(succ[v])
        if v in after:
            nxt.append(after[v])
        for w in nxt:
            waiting[w] -= 1
            if waiting[w] == 0:
                heapq.heappush(ready, (-score(w), creation[w], w, version[w]))
    if len(order) != len(creation):
        raise nx.NetworkXUnfeasible("Graph contains a cycle or graph changed during iteration")
    return order


def aval(g, v):
    d = g.nodes[v]
    if d["op"] == "const" and not isinstance(d["value"], np.ndarray):
        return d["value"]  # Python scalars stay weakly typed
    if d.get("avals") is not None:
        return tuple(d["avals"])
    return Aval(d["shape"], d["dtype"])


def eval_graph(g, inputs, const=lambda v: v, trace=None):
    """Evaluate ``g`` by binding each node's primitive: on Tensors this runs
    eagerly, on tracers it re-records the graph into ``trace`` (keeping each
    node's source location).  Returns (outputs, env): env maps node id -> value."""
    env = {}
    for v, x in zip(g.graph["inputs"], inputs):
        env[v] = x
    for v in topo_order(g):
        if v in env:
            continue
        d = g.nodes[v]
        op = d["op"]
        if op == "const":
            env[v] = const(d["value"])
        elif op == "proj":
            env[v] = env[operands(g, v)[0]][d["attrs"]["index"]]
        elif op == "input":
            raise ValueError(f"input node {v} was given no value")
        else:
            prim = primitives.get(op)
            if trace is not None:
                trace.loc_override = d.get("loc")
            env[v] = primitives.bind(prim, *[env[u] for u in operands(g, v)], **d["attrs"])
    if trace is not None:
        trace.loc_override = None
    return [env[v] for v in g.graph["outputs"]], env


def _fmt_attrs(attrs):
    return ", ".join(f"{k}={v!r}" for k, v in attrs.items())


def _type_str(d):
    if d.get("avals") is not None:
        return "(" + ", ".join(f"{a.dtype}{list(a.shape)}" for a in d["avals"]) + ")"
    return f"{d['dtype']}{list(d['shape'])}"


def to_text(g) -> str:
    """The graph as readable text, one node per line."""
    lines = []
    ins = ", ".join(f"%{v}:{g.nodes[v]['name']}:{_type_str(g.nodes[v])}" for v in g.graph["inputs"])
    lines.append(f"graph({ins}) {{")
    for v in topo_order(g):
        d = g.nodes[v]
        if d["op"] == "input":
            continue
        if d["op"] == "const":
            val = d["value"]
            shown = repr(val) if not isinstance(val, np.ndarray) or val.size <= 4 else \
                f"array<{val.dtype}{list(val.shape)}>"
            lines.append(f"  %{v} = const {shown}")
            continue
        args = ", ".join(f"%{u}" for u in operands(g, v))
        at = _fmt_attrs(d["attrs"])
        loc = d.get("loc")
        where = f"    # {loc[0].rsplit('/', 1)[-1]}:{loc[1]}" if loc else ""
        lines.append(f"  %{v}: {_type_str(d)} = {d['op']}({args}{', ' if at and args else ''}{at}){where}")
        # a loop's or branch's body, indented under it
        for k, b in d["attrs"].items():
            bodies = b if isinstance(b, tuple) else (b,)
            for i, body in enumerate(bodies):
                if hasattr(body, "nodes") and hasattr(body, "key"):
                    name = f"{k}[{i}]" if isinstance(b, tuple) else k
                    lines.append(f"    {name} = " + to_text(from_trace(body)).replace(
                        "\n", "\n    "))
    lines.append("  return " + ", ".join(f"%{v}" for v in g.graph["outputs"]))
    lines.append("}")
    return "\n".join(lines)


def to_dot(g, name="tracegrad") -> str:
    """Graphviz text: inputs as boxes, constants as plain text, ops as ellipses."""
    out = [f'digraph "{name}" {{', "  rankdir=TB;", '  node [fontname="Helvetica", fontsize=10];']
    outputs = set(g.graph["outputs"])
    for v in topo_order(g):
        d = g.nodes[v]
        label = d["op"]
        if d["op"] == "input":
            shape = "box"
            label = f"{d['name']}\\n{_type_str(d)}"
        elif d["op"] == "const":
            shape = "plaintext"
            val = d["value"]
            label = repr(val) if not isinstance(val, np.ndarray) or val.size <= 4 else \
                f"const {val.dtype}{list(val.shape)}"
        else:
            shape = "ellipse"
            at = _fmt_attrs(d["attrs"])
            label = f"{d['op']}" + (f"\\n{at}" if at else "") + f"\\n{_type_str(d)}"
        style = ', style=bold, color="#1f77b4"' if v in outputs else ""
        label = label.replace('"', '\\"')
        out.append(f'  n{v} [label="{label}", shape={shape}{style}];')
    for u, v, d in g.edges(data=True):
        out.append(f'  n{u} -> n{v} [label="{d["pos"]}", fontsize=8];')
    out.append("}")
    return "\n".join(out)


class IRValidationError(AssertionError):
    pass


def validate(g):
    """Check every node's recorded shape and dtype against its primitive's
    shape rule, operand positions, and that the graph is acyclic."""
    if not nx.is_directed_acyclic_graph(g):
        raise IRValidationError("the graph has a cycle")
    for v in g.graph["outputs"] + g.graph["inputs"]:
        if v not in g:
            raise IRValidationError(f"graph input/output %{v} is not a node")
    for v in g.nodes:
        d = g.nodes[v]
        op = d["op"]
        ops = operands(g, v)
        if [dd["pos"] for _, _, dd in sorted(g.in_edges(v, data=True), key=lambda e: e[2]["pos"])] \
                != list(range(len(ops))):
            raise IRValidationError(f"%{v} ({op}) has operand positions out of order")
        if op in ("input", "const"):
            continue
        if op == "proj":
            src = g.nodes[ops[0]]
            want = src["avals"][d["attrs"]["index"]]
            if (d["shape"], d["dtype"]) != (tuple(want.shape), np.dtype(want.dtype)):
                raise IRValidationError(f"%{v} proj has {_type_str(d)}, source says {want}")
            continue
        prim = primitives.get(op)
        in_avals = [aval(g, u) for u in ops]
        from tracegrad.frontend.trace import _shape_by_eval
        got = (prim.shape or _shape_by_eval(prim))(*in_avals, **d["attrs"])
        if d.get("avals") is not None:
            ok = tuple(tuple(a.shape) for a in got) == tuple(tuple(a.shape) for a in d["avals"])
        else:
            if isinstance(got, tuple) and not isinstance(got, Aval):
                got = got[0]
            ok = tuple(got.shape) == d["shape"] and np.dtype(got.dtype) == d["dtype"]
        if not ok:
            raise IRValidationError(
                f"%{v} = {op}: recorded {_type_str(d)} but the shape rule gives {got}")
    return True
