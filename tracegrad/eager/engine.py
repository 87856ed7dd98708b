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

from tracegrad.eager.grad_mode import state as _mode
from tracegrad.eager.graph import AccumulateGrad
from tracegrad.eager.profiler_state import _state as _prof_state
from tracegrad.eager import tensor as _tensor
from tracegrad.eager.nodes import PRIM_NODE_CLASSES, PrimNode
from tracegrad.eager.tensor import Tensor


class _NoReplay:
    """Until tracegrad.autograd.replay is imported (it installs itself here),
    every backward runs in the interpreter."""
    @staticmethod
    def try_backward(*args, **kwargs):
        return None


_replay = _NoReplay


# torch.autograd.grad on traced values (installed by tracegrad.autograd.traced)
_traced_grad = None


def _as_tuple(x):
    """A Tensor (or array, or scalar) alone, or a sequence of them, as a tuple."""
    if x is None:
        return ()
    if isinstance(x, (list, tuple)):
        return tuple(x)
    if type(x) is dict:
        return tuple(x.values())
    return (x,)


def _make_root_grads(outputs, grads, is_grads_batched):
    out = []
    for i, (o, g) in enumerate(zip(outputs, grads)):
        if g is None:
            if o._requires_grad:
                if o._data.size != 1:
                    raise RuntimeError("grad can be implicitly created only for scalar outputs")
                if o.dtype.kind != "f":
                    raise RuntimeError(f"grad can be implicitly created only for real scalar "
                                       f"outputs but got {o.dtype}")
                out.append(Tensor(_xp(o._data).ones(o.shape, o.dtype)))
            else:
                out.append(None)
            continue
        if not isinstance(g, Tensor):
            if not hasattr(g, "shape") and not isinstance(g, (int, float, list)):
                raise TypeError(f"gradients can be either Tensors or None, but got "
                                f"{type(g).__name__}")
            g = Tensor(_xp(o._data).asarray(g, dtype=o.dtype))
        gshape = tuple(g.shape[1:]) if is_grads_batched else tuple(g.shape)
        if gshape != tuple(o.shape):
            if is_grads_batched:
                raise RuntimeError(
                    f"If `is_grads_batched=True`, we interpret the first dimension of each "
                    f"grad_output as the batch dimension. The sizes of the remaining dimensions "
                    f"are expected to match the shape of corresponding output, but a mismatch "
                    f"was detected: grad_output[{i}] has a shape of {list(gshape)} and "
                    f"output[{i}] has a shape of {list(o.shape)}.")
            raise RuntimeError(
                f"Mismatch in shape: grad_output[{i}] has a shape of {list(gshape)} and "
                f"output[{i}] has a shape of {list(o.shape)}.")
        if (o.dtype.kind == "c") != (g.dtype.kind == "c"):
            raise RuntimeError(
                f"For complex Tensors, both grad_output and output are required to have the "
                f"same dtype. Mismatch in dtype: grad_output[{i}] has a dtype of {g.dtype} and "
                f"output[{i}] has a dtype of {o.dtype}.")
        out.append(g)
    return out


def _xp(a):
    if type(a) is np.ndarray:
        return np
    from tracegrad.ops.primitives import array_module
    return array_module(a)


def _check_outputs(tensors, grads):
    if len(grads) != len(tensors):
        raise RuntimeError(f"got {len(tensors)} tensors and {len(grads)} gradients")
    for i, t in enumerate(tensors):
        if not isinstance(t, Tensor):
            raise TypeError(f"element {i} of tensors is a {type(t).__name__}, not a Tensor")
        if not t._requires_grad:
            raise RuntimeError(f"element {i} of tensors does not require grad and does not "
                               f"have a grad_fn")


def _check_inputs(inputs):
    for t in inputs:
        if not isinstance(t, Tensor):
            raise TypeError(f"inputs must be Tensors, got a {type(t).__name__}")
        if not t._requires_grad:
            raise RuntimeError("One of the differentiated Tensors does not require grad")


def backward(tensors, grad_tensors=None, retain_graph=None, create_graph=False,
             grad_variables=None, inputs=None):
    """Accumulate the gradient of ``tensors`` into the ``.grad`` of the leaves
    (or of ``inputs`` when given; those may be non-leaf tensors too)."""
    if grad_variables is not None:
        import warnings
        warnings.warn("`grad_variables` is deprecated. Use `grad_tensors` instead.",
                      FutureWarning, stacklevel=2)
        if grad_tensors is not None:
            raise RuntimeError("`grad_tensors` and `grad_variables` (deprecated) arguments both "
                               "passed to `backward()`. Please only use `grad_tensors`.")
        grad_tensors = grad_variables
    if inputs is not None:
        inputs = _as_tuple(inputs)
        if len(inputs) == 0:
            raise RuntimeError("`inputs` argument to `backward()` cannot be empty.")
    if retain_graph is None:
        retain_graph = create_graph
    if (grad_tensors is None and isinstance(tensors, Tensor) and tensors._requires_grad
            and tensors._data.size == 1 and tensors._data.dtype.kind == "f"
            and type(tensors._data) is np.ndarray):
        # the common case, loss.backward(): skip the general argument handling,
        # and replay compiled code when this tape's structure repeats
        d = tensors._data
        if (inputs is None and not create_graph and tensors.grad_fn is not None
                and _replay.try_backward(tensors, retain_graph)):
            return
        tensors = (tensors,)
        roots = [Tensor(np.ones(d.shape, d.dtype))]
    else:
        tensors = _as_tuple(tensors)
        grad_tensors = ([None] * len(tensors) if grad_tensors is None
                        else list(_as_tuple(grad_tensors)))
        _check_outputs(tensors, grad_tensors)
        roots = _make_root_grads(tensors, grad_tensors, False)
        # y.backward(gradient): a given cotangent is an argument of the replay
        if (len(tensors) == 1 and inputs is None and not create_graph
                and tensors[0].grad_fn is not None and type(roots[0]._data) is np.ndarray
                and _replay.try_backward(tensors[0], retain_graph, roots[0]._data)):
            return
    if inputs is not None:
        _check_inputs(inputs)
    run(tensors, roots, retain_graph, create_graph, inputs, accumulate=True)


def grad(outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=False,
         only_inputs=True, allow_unused=None, is_grads_batched=False, materialize_grads=False):
    """Return the sum of gradients of ``outputs`` w.r.t. ``inputs`` without
    touching ``.grad``."""
    if materialize_grads and allow_unused is False:
        raise ValueError("Expected allow_unused to be True or not passed when "
                         "materialize_grads=True, but got: allow_unused=False.")
    if allow_unused is None:
        allow_unused = materialize_grads
    outputs = _as_tuple(outputs)
    inputs = _as_tuple(inputs)
    if len(inputs) == 0:
        raise RuntimeError("`inputs` argument to `grad()` cannot be empty.")
    grad_outputs = ([None] * len(outputs) if grad_outputs is None
                    else list(_as_tuple(grad_outputs)))
    if retain_graph is None:
        retain_graph = create_graph
    if _traced_grad is not None and any(
            not isinstance(v, Tensor) and hasattr(v, "_trace") for v in outputs + inputs):
        # inside a traced function (torch.func.grad(f)...): the adjoint of the
        # trace so far (tracegrad.autograd.traced installs it)
        return _traced_grad(outputs, inputs, grad_outputs, allow_unused, materialize_grads)
    _check_outputs(outputs, grad_outputs)
    _check_inputs(inputs)
    roots = _make_root_grads(outputs, grad_outputs, is_grads_batched)
    if is_grads_batched:
        sizes = {g.shape[0] for g in roots if g is not None}
        if len(sizes) > 1:
            raise RuntimeError(f"is_grads_batched=True needs the same batch size (first "
                               f"dimension) in every grad_output, got {sorted(sizes)}")
        nb = sizes.pop() if sizes else 0
        per = []
        for b in range(nb):
            rb = [None if g is None else g[b] if create_graph else Tensor(g._data[b])
                  for g in roots]
            per.append(run(outputs, rb, True if b < nb - 1 else retain_graph, create_graph,
                           inputs, accumulate=False))
        res = []
        for j, inp in enumerate(inputs):
            col = [p[j] for p in per]
            if nb == 0 or all(c is None for c in col):
                res.append(None)
            else:
                col = [c if c is not None else Tensor(_xp(inp._data).zeros(inp.shape, inp.dtype))
                       for c in col]
                res.append(_stack(col))
    else:
        res = None
        if (len(outputs) == 1 and not create_graph and outputs[0].grad_fn is not None
                and type(roots[0]._data) is np.ndarray):
            # a repeated tape replays (leaf inputs only; see replay.py)
            res = _replay.try_backward(outputs[0], retain_graph,
                                       None if grad_outputs[0] is None else roots[0]._data,
                                       inputs)
        if res is None:
            res = run(outputs, roots, retain_graph, create_graph, inputs, accumulate=False)
    out = []
    for t, g in zip(inputs, res):
        if g is None:
            if not allow_unused:
                raise RuntimeError(
                    "One of the differentiated Tensors appears to not have been used in the "
                    "graph. Set allow_unused=True if this is the desired behavior.")
            if materialize_grads:
                g = Tensor(_xp(t._data).zeros(t.shape, t.dtype))
                if create_graph:
                    g._requires_grad = True
        out.append(g)
    return tuple(out)


def _stack(col):
    if any(c._requires_grad for c in col):
        from tracegrad import ops
        stack = getattr(ops, "stack", None)
        if stack is not None:
            return stack(col)
        return ops.reshape(ops.concatenate([ops.reshape(c, (1,) + tuple(c.shape)) for c in col]),
                           (len(col),) + tuple(col[0].shape)) if hasattr(ops, "concatenate") \
            else _no_stack()
    return Tensor(_xp(col[0]._data).stack([c._data for c in col]))


def _no_stack():
    raise NotImplementedError("is_grads_batched=True with create_graph=True needs the 'stack' op")


def _add(a, b):
    if a is None:
        return b
    if b is None:
        return a
    return a + b


def _reachable(roots):
    """Dependency counts (number of edges into each node) over the graph
    reachable from ``roots``."""
    deps = {}
    stack = list(roots)
    seen = set(stack)
    while stack:
        for nf in stack.pop().next_functions:
            if nf is None:
                continue
            nxt = nf[0]
            if nxt is None:
                continue
            d = deps.get(nxt)
            if d is None:
                deps[nxt] = 1
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
            else:
                deps[nxt] = d + 1
    return deps


def _leads_to_target(roots, targets):
    """node -> whether a target node is reachable from it (itself included),
    computed children first with an explicit stack."""
    reach = {}
    for root in roots:
        if root in reach:
            continue
        stack = [(root, iter(root.next_functions))]
        while stack:
            node, it = stack[-1]
            pushed = False
            for nf in it:
                if nf is None or nf[0] is None or nf[0] in reach:
                    continue
                stack.append((nf[0], iter(nf[0].next_functions)))
                pushed = True
                break
            if pushed:
                continue
            stack.pop()
            r = node in targets
            if not r:
                for nf in node.next_functions:
                    if nf is not None and nf[0] is not None and reach[nf[0]]:
                        r = True
                        break
            reach[node] = r
    return reach


def run(outputs, root_grads, retain_graph, create_graph, inputs, accumulate):
    """Execute the backward graph from ``outputs``.

    accumulate=True: add into ``.grad`` of the leaves (or of ``inputs``).
    accumulate=False: return the gradients of ``inputs`` (autograd.grad).
    """
    buffers = {}
    summed = {}   # (id of node, output index) -> id of the gradient sum made here for that slot
    roots = []
    for t, g in zip(outputs, root_grads):
        if g is None:
            continue
        e = t._edge()
        if e is None:
            continue
        node, idx = e
        buf = buffers.get(node)
        if buf is None:
            buf = buffers[node] = [None] * node.num_outputs()
            roots.append(node)
        buf[idx] = _add(buf[idx], g)

    # capture targets: (node, output index) -> positions in ``inputs``
    capture = None
    reach = None
    results = None
    if inputs is not None:
        capture = {}
        for i, t in enumerate(inputs):
            capture.setdefault(t._edge(), []).append(i)
        reach = _leads_to_target(roots, {e[0] for e in capture})
        results = [None] * len(inputs)

    deps = _reachable(roots)
    ready = []
    for node in roots:
        if node not in deps:
            heapq.heappush(ready, (-node.seq, id(node), node))

    prev_mode = _mode.grad_enabled
    _mode.grad_enabled = create_graph
    profiler = _active_profiler()
    anomaly = _mode.anomaly and _mode.anomaly_check_nan
    try:
        while ready:
            node = heapq.heappop(ready)[2]
            grads = buffers.pop(node)
            # tensor hooks (in registration order), then retain_grad, per output
            th = node._tensor_pre_hooks
            md = node._metadata
            retained = md.get("_retain_grad") if md else None
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
                            _retain(t, grads[i], create_graph)
            if node._pre_hooks:
                for hook in list(node._pre_hooks.values()):
                    r = hook(tuple(grads))
                    if r is not None:
                        grads = list(r)
            is_acc = type(node) is AccumulateGrad
            if capture is not None:
                for i, g in enumerate(grads):
                    pos = capture.get((node, i))
                    if pos is None:
                        continue
                    for p in pos:
                        if accumulate:
                            _accumulate(inputs[p], g, create_graph)
                            if is_acc:
                                _post_accumulate(node, inputs[p])
                        else:
                            results[p] = _add(results[p], g)
            if is_acc:
                if accumulate and capture is None:
                    leaf = node.variable
                    if leaf is not None:
                        _accumulate(leaf, grads[0], create_graph)
                        _post_accumulate(node, leaf)
                continue
            nfs = node.next_functions
            if reach is not None:
                needs = [nf is not None and nf[0] is not None and reach[nf[0]] for nf in nfs]
                if not any(needs):
                    continue  # a target whose inputs lead to no other target
            else:
                needs = None
            tn = type(node)
            is_prim = tn is PrimNode or tn in PRIM_NODE_CLASSES
            n_none = 0
            if is_prim:
                for g in grads:
                    if g is None:
                        n_none += 1
            if n_none and n_none == len(grads):
                in_grads = [None] * len(nfs)  # nothing flows through
            else:
                if n_none:
                    grads = _materialize(node, grads)
                if profiler is not None:
                    ev = profiler._begin(node.name(), "backward")
                try:
                    if is_prim:
                        in_grads = node._apply(grads, create_graph, needs)
                    else:
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
                if anomaly:
                    _check_nan(node, in_grads)
                if not retain_graph:
                    node.release()
            for k, nf in enumerate(nfs):
                if nf is None:
                    continue
                nxt = nf[0]
                if nxt is None or (needs is not None and not needs[k]):
                    continue
                g = in_grads[k]
                buf = buffers.get(nxt)
                if buf is None:
                    buf = buffers[nxt] = [None] * nxt.num_outputs()
                if g is not None:
                    idx = nf[1]
                    cur = buf[idx]
                    if cur is None:
                        buf[idx] = g
                    elif create_graph:
                        buf[idx] = cur + g
                    elif summed.get((id(nxt), idx)) == id(cur) and type(cur._data) is np.ndarray \
                            and cur._data.shape == np.broadcast_shapes(cur._data.shape, g._data.shape) \
                            and np.result_type(cur._data, g._data) == cur._data.dtype:
                        # this slot holds a sum made here, which nothing else has seen yet
                        np.add(cur._data, g._data, out=cur._data)
                    else:  # nothing to record: add the arrays
                        buf[idx] = Tensor(cur._data + g._data)
                        summed[(id(nxt), idx)] = id(buf[idx])
                d = deps[nxt] - 1
                deps[nxt] = d
                if d == 0:
                    heapq.heappush(ready, (-nxt.seq, id(nxt), nxt))
    finally:
        _mode.grad_enabled = prev_mode
    return results


def _post_accumulate(node, leaf):
    md = node._metadata
    post = md.get("_post_accumulate") if md else None
    if post:
        for hook in list(post.values()):
            hook(leaf)


def _materialize(node, grads):
    """Multi-output nodes get zeros for outputs that received no gradient."""
    metas = node.output_meta
    if metas is None:
        return grads
    out = list(grads)
    for i, g in enumerate(out):
        if g is None and i < len(metas) and metas[i] is not None:
            shape, dtype = metas[i]
            out[i] = Tensor(np.zeros(shape, dtype))
    return out


def _retain(t, g, create_graph):
    """retain_grad: a non-leaf's ``.grad`` gets its own copy of the gradient."""
    cur = t._grad
    if create_graph:
        t._grad = g.clone() if cur is None else cur + g
    elif cur is None:
        t._grad = Tensor(_copy(g._data))
    else:
        t._grad = Tensor(cur._data + g._data)


def _copy(a):
    return a.copy()


def _accumulate(leaf, g, create_graph):
    """Add ``g`` into ``leaf.grad`` as torch's AccumulateGrad does: a fresh
    tensor the first time (never the incoming one, which may be the user's
    or reach other leaves too), in place afterwards, and out of place (with
    graph) under create_graph."""
    if g is None:
        return
    cur = leaf._grad
    if create_graph:
        leaf._grad = g.clone() if cur is None else cur + g
        return
    _accumulate_array(leaf, g._data)


def _accumulate_array(leaf, gd):
    """_accumulate without create_graph, for a gradient array ``gd``."""
    cur = leaf._grad
    if cur is None:
        leaf._grad = Tensor(gd.copy())
    elif cur._requires_grad or cur.grad_fn is not None or cur._data.shape != gd.shape \
            or not cur._data.flags.writeable:
        leaf._grad = Tensor(cur._data + gd)
    else:
        cur._data += gd
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
    return _prof_state.current


_tensor._engine_backward = backward   # Tensor.backward() runs here
