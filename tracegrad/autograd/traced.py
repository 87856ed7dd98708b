"""``torch.autograd.grad`` called on traced values: inside a function that
tracegrad traces (``torch.func.grad(f)``, ``tg.compile``...), the outputs
and inputs are symbolic, so their gradient is the adjoint of the part of
the trace recorded so far, applied in the same trace with the registry's
vjp rules (the adjoint pass's own sweep).  The result is an ordinary traced
value: the enclosing transform differentiates through it, as torch.func
does through an inner autograd.grad.

Installed into the eager engine (``engine._traced_grad``) on import.
"""
from __future__ import annotations

import numpy as np

from tracegrad.eager import engine
from tracegrad.frontend.trace import Tracer
from tracegrad.ops import primitives
from tracegrad.ops.primitives import Aval


def _tracer_env(T):
    """node id -> the value the sweep reads for it: a tracer, or for a
    multi-output node the tuple of its outputs (an Aval where unread)."""
    env = {}
    projs = {}
    for n in T.nodes:
        if _multi(n):
            continue
        if n.op == "const" and not isinstance(n.aval, Aval):
            env[n.id] = n.value        # a Python number stays weakly typed
            continue
        aval = n.aval if isinstance(n.aval, Aval) else Aval((), np.result_type(n.aval))
        env[n.id] = Tracer(T, n.id, aval, "torch")
        if n.op == "proj":
            projs.setdefault(n.inputs[0], {})[n.attrs["index"]] = env[n.id]
    for n in T.nodes:
        if _multi(n):
            got = projs.get(n.id, {})
            env[n.id] = tuple(got.get(i, a) for i, a in enumerate(n.aval))
    return env


def _multi(n):
    return isinstance(n.aval, tuple) and not isinstance(n.aval, Aval)


def traced_grad(outputs, inputs, grad_outputs, allow_unused, materialize_grads):
    """The gradients of ``outputs`` (traced) w.r.t. ``inputs`` (traced), as
    traced values of the same trace."""
    # the graph layer (networkx) loads only when a trace asks for a gradient
    from tracegrad.ir import graph as ir
    from tracegrad.ir.adjoint import backward_sweep
    from tracegrad.ops import add, zeros_like_value
    tracers = [v for v in tuple(outputs) + tuple(inputs) if type(v) is Tracer]
    T = max((v._trace for v in tracers), key=lambda t: t.level)
    for v in tuple(outputs) + tuple(inputs):
        if type(v) is not Tracer or v._trace is not T:
            raise TypeError("torch.autograd.grad inside a traced function needs outputs and "
                            "inputs that are values of the function (traced), all of the same "
                            "trace")
    g = ir.from_trace(T)
    wrt_nodes = [x.id for x in inputs]
    g.graph["inputs"] = wrt_nodes
    env = _tracer_env(T)
    ct_env = {}
    for y, go in zip(outputs, grad_outputs):
        if go is None:
            if int(np.prod(y.shape)) != 1:
                raise RuntimeError("grad can be implicitly created only for scalar outputs")
            go = primitives.bind(primitives.REGISTRY["astype"],
                                 zeros_like_value(y) + 1, dtype=y.dtype.name)
        ct_env[y.id] = go if y.id not in ct_env else add(ct_env[y.id], go)
    active = _active_between(g, set(wrt_nodes))
    used = [any(y.id in active for y in outputs) and x.id in active for x in inputs]
    res = backward_sweep(g, T, env, list(inputs), ct_env, list(range(len(inputs))), active)
    out = []
    for x, r, u in zip(inputs, res, used):
        if not u and not materialize_grads:
            if not allow_unused:
                raise RuntimeError("One of the differentiated Tensors appears to not have been "
                                   "used in the graph. Set allow_unused=True if this is the "
                                   "desired behavior.")
            out.append(None)
            continue
        if type(r) is Tracer:
            r._face = x._face
        out.append(r)
    return tuple(out)


def _active_between(g, wrt_nodes):
    from tracegrad.ir.adjoint import _active
    return _active(g, wrt_nodes)


engine._traced_grad = traced_grad
