"""The backward engine: walks the tape from the outputs to the leaves.

Nodes run in dependency order (a node runs once all gradients for its
outputs have arrived, newest node first among the ready ones, as torch
does), gradients for one output are summed, tensor hooks may replace them,
and gradients arriving at leaves accumulate into ``.grad`` or are captured
for ``autograd.grad``.  Without ``retain_graph`` each node frees what it
saved once it has run.
"""
from __future__ import annotations

import heapq

import numpy as np

from tracegrad.autograd.grad_mode import state as _mode
from tracegrad.autograd.graph import AccumulateGrad, FREED_MSG
from tracegrad.tensor import Tensor


def _as_tuple(x):
    if x is None:
        return ()
    if isinstance(x, Tensor):
        return (x,)
    return tuple(x)


def _make_root_grads(outputs, grads, is_grads_batched):
    out = []
    for i, (o, g) in enumerate(zip(outputs, grads)):
        if g is None:
            if o._requires_grad:
                if o._data.size != 1:
                    raise RuntimeError("grad can be implicitly created only for scalar outputs")
                if not np.issubdtype(o.dtype, np.inexact):
                    raise RuntimeError(f"grad can be implicitly created only for real scalar outputs "
                                       f"but got {o.dtype}")
                xp = _xp(o._data)
                out.append(Tensor(xp.ones(o.shape, o.dtype)))
            else:
                out.append(None)
            continue
        if not isinstance(g, Tensor):
            g = Tensor(_xp(o._data).asarray(g, dtype=o.dtype))
        gshape = tuple(g.shape[1:]) if is_grads_batched else tuple(g.shape)
        if gshape != tuple(o.shape):
            which = "grad_output" if True else ""
            raise RuntimeError(
                f"Mismatch in shape: {which}[{i}] has a shape of {list(gshape)} and "
                f"output[{i}] has a shape of {list(o.shape)}.")
        out.append(g)
    return out


def _xp(a):
    if type(a) is np.ndarray:
        return np
    from tracegrad.primitives import array_module
    return array_module(a)


def backward(tensors, grad_tensors=None, retain_graph=None, create_graph=False,
             grad_variables=None, inputs=None):
    """Accumulate the gradient of ``tensors`` into the ``.grad`` of the leaves
    (or of ``inputs`` when given)."""
    if grad_variables is not None:
        grad_tensors = grad_variables
    tensors = _as_tuple(tensors)
    if grad_tensors is None:
        grad_tensors = [None] * len(tensors)
    else:
        grad_tensors = list(_as_tuple(grad_tensors)) if not isinstance(grad_tensors, (list, tuple)) else list(grad_tensors)
    if len(grad_tensors) != len(tensors):
        raise RuntimeError(f"got {len(grad_tensors)} gradients for {len(tensors)} tensors")
    if retain_graph is None:
        retain_graph = create_graph
    inputs = _as_tuple(inputs)
    if inputs is not None and len(inputs) == 0 and isinstance(inputs, tuple) and inputs == ():
        inputs = None
    for i, t in enumerate(tensors):
        if not t._requires_grad:
            raise RuntimeError(f"element {i} of tensors does not require grad and does not have a grad_fn")
    roots = _make_root_grads(tensors, grad_tensors, False)
    if inputs is not None:
        for t in inputs:
            if not t._requires_grad:
                raise RuntimeError("One of the differentiated Tensors does not require grad")
    run(tensors, roots, retain_graph, create_graph, inputs, accumulate=True)


def grad(outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=False,
         only_inputs=True, allow_unused=None, is_grads_batched=False, materialize_grads=False):
    """Return the sum of gradients of ``outputs`` w.r.t. ``inputs`` without
    touching ``.grad``."""
    single_input = isinstance(inputs, Tensor)
    outputs = _as_tuple(outputs)
    inputs = _as_tuple(inputs)
    if allow_unused is None:
        allow_unused = materialize_grads
    if materialize_grads and not allow_unused:
        raise ValueError("Expected allow_unused to be True or not passed when materialize_grads=True, "
                         "but got: allow_unused=False.")
    if grad_outputs is None:
        grad_outputs = [None] * len(outputs)
    else:
        grad_outputs = list(_as_tuple(grad_outputs)) if isinstance(grad_outputs, Tensor) else list(grad_outputs)
    if len(grad_outputs) != len(outputs):
        raise RuntimeError(f"grad requires one grad_output per output: got {len(grad_outputs)} "
                           f"for {len(outputs)} outputs")
    if retain_graph is None:
        retain_graph = create_graph
    for i, t in enumerate(outputs):
        if not t._requires_grad:
            raise RuntimeError(f"element {i} of tensors does not require grad and does not have a grad_fn")
    for t in inputs:
        if not t._requires_grad:
            raise RuntimeError("One of the differentiated Tensors does not require grad")
    if is_grads_batched:
        roots = _make_root_grads(outputs, grad_outputs, True)
        nb = next(g.shape[0] for g in roots if g is not None)
        per = []
        for b in range(nb):
            rb = [None if g is None else Tensor(g._data[b]) for g in roots]
            per.append(run(outputs, rb, True if b < nb - 1 else retain_graph, create_graph,
                           inputs, accumulate=False))
        result = []
        for j, inp in enumerate(inputs):
            col = [p[j] for p in per]
            if all(c is None for c in col):
                result.append(None)
            else:
                from tracegrad import ops
                col = [c if c is not None else ops.zeros_like(inp) for c in col]
                result.append(ops.stack(col))
        res = result
    else:
        roots = _make_root_grads(outputs, grad_outputs, False)
        res = run(outputs, roots, retain_graph, create_graph, inputs, accumulate=False)
    out = []
    for t, g in zip(inputs, res):
        if g is None:
            if not allow_unused:
                raise RuntimeError(
                    "One of the differentiated Tensors appears to not have been used in the graph. "
                    "Set allow_unused=True if this is the desired behavior.")
            if materialize_grads:
                from tracegrad.tensor import zeros_like
                g = zeros_like(t)
        out.append(g)
    return tuple(out)


def _add(a, b):
    if a is None:
        return b
    if b is None:
        return a
    return a + b


def run(outputs, root_grads, retain_graph, create_graph, inputs, accumulate):
    """Execute the backward graph from ``outputs``.

    accumulate=True: add into ``.grad`` of the leaves (or of ``inputs``).
    accumulate=False: return the gradients of ``inputs`` (autograd.grad).
    """
    # root edges
    root_edges = []
    for t, g in zip(outputs, root_grads):
        if g is None:
            continue
        e = t._edge()
        if e is not None:
            root_edges.append((e[0], e[1], g))
    # capture targets: edge -> position in inputs
    capture = None
    if inputs is not None:
        capture = {}
        for i, t in enumerate(inputs):
            e = t._edge()
            capture.setdefault((e[0], e[1]), []).append(i)

    # dependencies over the reachable graph
    deps = {}
    stack = [e[0] for e in root_edges]
    seen = set(map(id, stack))
    order = []
    while stack:
        node = stack.pop()
        order.append(node)
        for nf in node.next_functions:
            if nf is None:
                continue
            nxt = nf[0]
            deps[nxt] = deps.get(nxt, 0) + 1
            if id(nxt) not in seen:
                seen.add(id(nxt))
                stack.append(nxt)

    # with inputs given, run only nodes from which a target is reachable
    needed = None
    if capture is not None:
        target_nodes = {e[0] for e in capture}
        needed = set()
        # reverse topological pass: a node is needed if it is a target or
        # one of its next nodes is needed.  ``order`` is DFS order; iterate
        # until stable (graphs are DAGs, so a few sweeps suffice).
        changed = True
        while changed:
            changed = False
            for node in order:
                if node in needed:
                    continue
                if node in target_nodes or any(nf is not None and nf[0] in needed
                                               for nf in node.next_functions):
                    needed.add(node)
                    changed = True

    buffers = {}
    for node, idx, g in root_edges:
        buf = buffers.get(node)
        if buf is None:
            buf = buffers[node] = [None] * node.num_outputs()
        buf[idx] = _add(buf[idx], g)
    ready = []
    for node in buffers:
        if deps.get(node, 0) == 0:
            heapq.heappush(ready, (-node.seq, id(node), node))

    results = [None] * len(inputs) if capture is not None else None
    prev_mode = _mode.grad_enabled
    _mode.grad_enabled = create_graph
    profiler = _active_profiler()
    try:
        while ready:
            _, _, node = heapq.heappop(ready)
            grads = buffers.pop(node)
            # tensor hooks and retain_grad, per output
            th = node._tensor_pre_hooks
            retained = node.metadata.get("_retain_grad") if node.metadata else None
            if th or retained:
                for i in range(len(grads)):
                    if grads[i] is None:
                        continue
                    if th and i in th:
                        for hook in list(th[i].values()):
                            r = hook(grads[i])
                            if r is not None:
                                grads[i] = r if isinstance(r, Tensor) else Tensor(np.asarray(r))
                    if retained and i in retained:
                        t = retained[i]()
                        if t is not None:
                            g = grads[i]
                            if t._grad is None:
                                t._grad = g if create_graph else Tensor(g._data.copy())
                            else:
                                t._grad = t._grad + g if create_graph else Tensor(t._grad._data + g._data)
            if node._pre_hooks:
                for hook in list(node._pre_hooks.values()):
                    r = hook(tuple(grads))
                    if r is not None:
                        grads = list(r)
            if capture is not None:
                for i, g in enumerate(grads):
                    pos = capture.get((node, i))
                    if pos is not None:
                        for p in pos:
                            results[p] = _add(results[p], g)
            if type(node) is AccumulateGrad:
                if accumulate:
                    leaf = node.variable
                    if leaf is not None and (capture is None or (node, 0) in capture):
                        _accumulate(leaf, grads[0], create_graph)
                        post = node.metadata.get("_post_accumulate") if node.metadata else None
                        if post:
                            for hook in list(post.values()):
                                hook(leaf)
                continue
            if needed is not None and node not in needed:
                continue
            if needed is not None and all(nf is None or nf[0] not in needed for nf in node.next_functions):
                if not retain_graph:
                    node.release()
                continue
            # non-leaf targets of backward(inputs=...) accumulate into .grad
            if accumulate and capture is not None:
                for i, g in enumerate(grads):
                    for p in capture.get((node, i), ()):
                        _accumulate(inputs[p], g, create_graph)
            if any(g is None for g in grads):
                grads = _materialize(node, grads)
            if profiler is not None:
                ev = profiler._begin(node.name(), "backward")
            try:
                in_grads = node.apply(grads, create_graph)
            except Exception as e:
                if node.anomaly_trace is not None:
                    _report_anomaly(node, e)
                raise
            if profiler is not None:
                profiler._end(ev)
            if node._post_hooks:
                for hook in list(node._post_hooks.values()):
                    r = hook(tuple(in_grads), tuple(grads))
                    if r is not None:
                        in_grads = list(r)
            if _mode.anomaly and _mode.anomaly_check_nan:
                _check_nan(node, in_grads)
            if not retain_graph:
                node.release()
            for nf, g in zip(node.next_functions, in_grads):
                if nf is None:
                    continue
                nxt, idx = nf
                buf = buffers.get(nxt)
                if buf is None:
                    buf = buffers[nxt] = [None] * nxt.num_outputs()
                if g is not None:
                    buf[idx] = _add(buf[idx], g)
                d = deps[nxt] - 1
                deps[nxt] = d
                if d == 0:
                    heapq.heappush(ready, (-nxt.seq, id(nxt), nxt))
    finally:
        _mode.grad_enabled = prev_mode
    return results


def _materialize(node, grads):
    """Multi-output nodes get zeros for outputs that received no gradient."""
    from tracegrad.tensor import PrimNode
    if isinstance(node, PrimNode) and node.out_saved is None and node.freed:
        raise RuntimeError(FREED_MSG)
    metas = node.output_meta
    if metas is None:
        return grads
    out = list(grads)
    for i, g in enumerate(out):
        if g is None and i < len(metas) and metas[i] is not None:
            shape, dtype = metas[i]
            out[i] = Tensor(np.zeros(shape, dtype))
    return out


def _accumulate(leaf, g, create_graph):
    if g is None:
        return
    cur = leaf._grad
    if create_graph:
        leaf._grad = g if cur is None else cur + g
        return
    if g._requires_grad or g.grad_fn is not None:
        g = g.detach()
    if cur is None:
        # a private copy: the same gradient array may reach several leaves
        leaf._grad = Tensor(g._data.copy())
    elif cur._requires_grad or cur.grad_fn is not None or cur._data.shape != g._data.shape \
            or not cur._data.flags.writeable:
        leaf._grad = Tensor(cur._data + g._data)
    else:
        cur._data += g._data
        cur._vbox[0] += 1


def _check_nan(node, in_grads):
    for i, g in enumerate(in_grads):
        if g is not None and np.issubdtype(g.dtype, np.inexact):
            xp = _xp(g._data)
            if bool(xp.isnan(g._data).any()):
                msg = f"Function '{node.name()}' returned nan values in its {i}th output."
                if node.anomaly_trace:
                    msg += ("\nTraceback of the forward call that caused the error:\n"
                            + node.anomaly_trace)
                raise RuntimeError(msg)


def _report_anomaly(node, exc):
    import warnings
    warnings.warn(
        f"Error detected in {node.name()}. Traceback of forward call that caused the error:\n"
        f"{node.anomaly_trace}", RuntimeWarning, stacklevel=3)


def _active_profiler():
    from tracegrad.autograd.profiler_state import _state
    return _state.current
