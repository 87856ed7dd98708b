"""tg.autograd.functional: jacobian, hessian, vjp, jvp, vhp, hvp.

Same names, arguments and return structures as torch.autograd.functional,
but run on the compiler: the user's function is traced once per input
signature, the transform is applied to its graph (a Jacobian or Hessian is
one batched graph, a jvp uses the forward-mode pass, an hvp is
forward-over-reverse), and the generated code runs as one call.  With
``create_graph=True`` that call is recorded on the tape as one node whose
backward is again generated code, so the results can be differentiated.

A function that cannot be traced (Python control flow on tensor values)
falls back to eager autograd with the same semantics.
"""
from __future__ import annotations

import weakref

import numpy as np

from tracegrad.runtime import cache
from tracegrad.eager.grad_mode import enable_grad, no_grad
from tracegrad.eager.tensor import Tensor

__all__ = ["jacobian", "hessian", "vjp", "jvp", "vhp", "hvp"]

_CACHE = cache.LRU(cache.DEFAULT_MEMORY_CACHE_SIZE)   # key -> GraphFunction


def _as_tuple(x, arg_name, fn_name):
    if isinstance(x, Tensor):
        _check_dtypes((x,), arg_name, fn_name, False)
        return False, (x,)
    if isinstance(x, (tuple, list)):
        for i, e in enumerate(x):
            if not isinstance(e, Tensor):
                raise TypeError(f"The {arg_name} given to {fn_name} must be either a Tensor or a "
                                f"tuple of Tensors but the value at index {i} has type {type(e)}.")
        _check_dtypes(x, arg_name, fn_name, True)
        return True, tuple(x)
    raise TypeError(f"The {arg_name} given to {fn_name} must be either a Tensor or a tuple of "
                    f"Tensors but the given {arg_name} has type {type(x)}.")


def _check_dtypes(xs, arg_name, fn_name, is_tuple):
    """Numeric Tensors only; the inputs are differentiated, so floating or
    complex (torch's requires_grad_ refuses the others with a RuntimeError)."""
    for i, e in enumerate(xs):
        kind = e.dtype.kind
        where = f"{arg_name}[{i}]" if is_tuple else arg_name
        if kind not in "biufc":
            raise TypeError(f"tg.autograd.functional.{fn_name}: {where} is a Tensor of dtype "
                            f"{e.dtype}; tracegrad computes with Tensors of bool, integer, "
                            f"floating-point or complex dtype. Convert it first (e.g. x.double()).")
        if arg_name == "inputs" and kind not in "fc":
            raise RuntimeError(f"tg.autograd.functional.{fn_name}: {where} has dtype {e.dtype}, "
                               f"but only Tensors of floating point and complex dtype can "
                               f"require gradients. "
                               f"Convert it first (e.g. x.double()).")


def _trace(func, inputs):
    from tracegrad.ops.primitives import Aval
    from tracegrad.frontend.trace import trace_function
    avals = [Aval(tuple(x.shape), x.dtype) for x in inputs]
    names = [f"input{i}" for i in range(len(inputs))]
    trace, out_tree = trace_function(func, avals, lambda ts: (list(ts), {}), names,
                                     faces=["torch"] * len(avals),   # torch.autograd's API
                                     capture=True)
    cache.count("traces")
    # the captured state it read: checked on each call (see _prepare)
    from tracegrad.frontend.code_deps import Guard
    guard = Guard(func, checks=trace.checks)
    trace.guard = guard if guard else None
    if out_tree[0] == "tuple" and all(e == ("leaf",) for e in out_tree[1]):
        tuple_out = True
    elif out_tree == ("leaf",):
        tuple_out = False
    else:
        raise TypeError(f"The outputs of the user-provided function must be either a Tensor or "
                        f"a tuple of Tensors, not {out_tree[0]}")
    return trace, tuple_out


def _graph_function(trace, what, func):
    """The GraphFunction of ``what`` applied to the traced graph (cached)."""
    from tracegrad.runtime import pipeline
    from tracegrad.runtime.graph_call import GraphFunction
    backend = pipeline.default_backend()
    key = (trace.structure_hash(), what, backend)
    gf = _CACHE.get(key)
    if gf is not None:
        return gf
    n_all, n_out = len(trace.inputs), len(trace.outputs)
    n_in = n_all - len(trace.implicit)   # the captured state's inputs follow, not differentiated
    wrt = list(range(n_in))

    def make():
        from tracegrad.runtime import pipeline
        return pipeline.transform(pipeline.graph_of(trace), what, wrt)

    name = f"{getattr(func, '__qualname__', 'func')} ({what})"
    # inputs and outputs of the transformed graph
    sizes = {"forward": (n_all, n_out), "jacrev": (n_all, n_out * n_in),
             "jacfwd": (n_all, n_out * n_in), "hessian": (n_all, n_in * n_in),
             "vjp": (n_all + n_out, n_out + n_in), "jvp": (n_all + n_in, 2 * n_out),
             "vhp": (n_all + n_in, n_in), "hvp": (n_all + n_in, n_in)}[what]
    gf = GraphFunction(f"{key[0]}/functional/{what}", make, name, *sizes,
                       fixed=range(n_in, n_all))
    gf.backend = backend
    _CACHE[key] = gf
    return gf


def _cap(trace):
    """The captured arrays and generators the graphs take after the inputs."""
    return tuple(trace.implicit)


def _run(gf, values, create_graph):
    """Run a GraphFunction on Tensors: on the tape when create_graph."""
    if create_graph:
        with enable_grad():
            return gf.call_tensors(list(values))
    with no_grad():
        return gf.call_tensors(list(values))


def _check_strict(trace, fn_name):
    """strict=True: every input must reach some output."""
    reach = set()
    stack = list(trace.outputs)
    while stack:
        n = trace.nodes[stack.pop()]
        if n.id in reach:
            continue
        reach.add(n.id)
        stack.extend(n.inputs)
    for i, nid in enumerate(trace.inputs[:len(trace.inputs) - len(trace.implicit)]):
        if nid not in reach:
            raise RuntimeError(f"The output of the user-provided function is independent of input "
                               f"{i}. This is not allowed in strict mode.")


# func -> {input signature: (trace, tuple_out) or None if untraceable}, so a
# function called again on inputs of the same shapes is not traced again
_TRACES = weakref.WeakKeyDictionary()


def _prepare(func, inputs, fn_name, strict):
    """Trace func (once per input signature); None when it cannot be traced
    (eager fallback)."""
    from tracegrad.frontend.trace import TraceError
    sig = tuple((tuple(x.shape), x.dtype.str) for x in inputs)
    try:
        per_fn = _TRACES.setdefault(func, {})
    except TypeError:  # not weak-referenceable: trace every time
        per_fn = {}
    prep = per_fn.get(sig)
    if prep is not None and prep[0].guard is not None and prep[0].guard.changed() is not None:
        prep = None    # captured state it read changed: trace again
        del per_fn[sig]
    if sig not in per_fn:
        try:
            per_fn[sig] = _trace(func, inputs)
        except TraceError:
            per_fn[sig] = None
    prep = per_fn[sig]
    if prep is not None and strict:
        _check_strict(prep[0], fn_name)
    return prep


def _checked_v(v, like, fn_name, what):
    """``v``: one Tensor per entry of ``like``, of its shape; None only when
    ``like`` is a single one-element Tensor.  ``what`` names ``like`` in the
    message ("the user-provided function returns" / "the input to the
    user-provided function is")."""
    if v is None:
        if len(like) != 1 or int(np.prod(like[0].shape)) != 1:
            raise RuntimeError(f"The vector v can only be None if {what} a single Tensor with "
                               f"a single element.")
        return (Tensor(np.ones(like[0].shape, like[0].dtype)),)
    _, v = _as_tuple(v, "v", fn_name)
    if len(v) != len(like):
        raise RuntimeError(f"v is a tuple of invalid length: should be {len(like)} but got "
                           f"{len(v)}.")
    for i, (a, o) in enumerate(zip(v, like)):
        if tuple(a.shape) != tuple(o.shape):
            raise RuntimeError(f"Entry {i} in v has invalid size: should be {list(o.shape)} but "
                               f"got {list(a.shape)}.")
    return v


_OUTPUTS = "the user-provided function returns"
_INPUTS = "the input to the user-provided function is"


def _out_avals(trace):
    from tracegrad.ops.primitives import Aval
    res = []
    for nid in trace.outputs:
        a = trace.nodes[nid].aval
        res.append(a if isinstance(a, Aval) else Aval((), np.result_type(a)))
    return res


def _grad_free(xs, create_graph):
    return tuple(x if create_graph else x.detach() for x in xs)


# --- the public functions ---------------------------------------------------------------

def jacobian(func, inputs, create_graph=False, strict=False, vectorize=False,
             strategy="reverse-mode"):
    """The Jacobian of ``func`` at ``inputs`` (see torch.autograd.functional.jacobian)."""
    if strategy not in ("reverse-mode", "forward-mode"):
        raise ValueError('Expected strategy to be either "forward-mode" or "reverse-mode".')
    if _traced(inputs):
        return _traced_jacobian(func, inputs)
    tuple_in, inputs = _as_tuple(inputs, "inputs", "jacobian")
    prep = _prepare(func, inputs, "jacobian", strict)
    if prep is None:
        return _eager_jacobian(func, inputs, tuple_in, create_graph, strict)
    trace, tuple_out = prep
    what = "jacrev" if strategy == "reverse-mode" else "jacfwd"
    flat = _run(_graph_function(trace, what, func), inputs + _cap(trace), create_graph)
    n_in = len(inputs)
    rows = [tuple(flat[o * n_in:(o + 1) * n_in]) for o in range(len(trace.outputs))]
    return _structure(rows, tuple_out, tuple_in)


def _structure(rows, tuple_out, tuple_in):
    if tuple_out and tuple_in:
        return tuple(rows)
    if tuple_out:
        return tuple(r[0] for r in rows)
    if tuple_in:
        return rows[0]
    return rows[0][0]


def hessian(func, inputs, create_graph=False, strict=False, vectorize=False,
            outer_jacobian_strategy="reverse-mode"):
    """The Hessian of a scalar ``func`` (see torch.autograd.functional.hessian)."""
    if _traced(inputs):
        return _traced_hessian(func, inputs)
    tuple_in, inputs = _as_tuple(inputs, "inputs", "hessian")
    prep = _prepare(func, inputs, "hessian", strict)
    if prep is None:
        return _eager_hessian(func, inputs, tuple_in, create_graph, strict)
    trace, tuple_out = prep
    outs = _out_avals(trace)
    if tuple_out and len(outs) != 1 or int(np.prod(outs[0].shape)) != 1:
        raise RuntimeError("The function given to hessian should return a single Tensor")
    if outs[0].shape != ():
        inner = func
        func = lambda *xs: inner(*xs).reshape(())  # noqa: E731
        trace, _ = _trace(func, inputs)
    flat = _run(_graph_function(trace, "hessian", func), inputs + _cap(trace), create_graph)
    n = len(inputs)
    blocks = tuple(tuple(flat[i * n:(i + 1) * n]) for i in range(n))
    return blocks if tuple_in else blocks[0][0]


def vjp(func, inputs, v=None, create_graph=False, strict=False):
    """(func(inputs), v^T J) (see torch.autograd.functional.vjp)."""
    if _traced(inputs):
        return _traced_vjp(func, inputs, v)
    tuple_in, inputs = _as_tuple(inputs, "inputs", "vjp")
    prep = _prepare(func, inputs, "vjp", strict)
    if prep is None:
        return _eager_vjp(func, inputs, v, tuple_in, create_graph)
    trace, tuple_out = prep
    v = _checked_v(v, _out_avals(trace), "vjp", _OUTPUTS)
    n_out = len(trace.outputs)
    flat = _run(_graph_function(trace, "vjp", func), inputs + _cap(trace) + v, create_graph)
    out, res = flat[:n_out], flat[n_out:]
    return (out if tuple_out else out[0]), (tuple(res) if tuple_in else res[0])


def jvp(func, inputs, v=None, create_graph=False, strict=False):
    """(func(inputs), J v) by the forward-mode pass (see torch.autograd.functional.jvp)."""
    tuple_in, inputs = _as_tuple(inputs, "inputs", "jvp")
    v = _checked_v(v, inputs, "jvp", _INPUTS)
    prep = _prepare(func, inputs, "jvp", strict)
    if prep is None:
        return _eager_jvp(func, inputs, v, create_graph)
    trace, tuple_out = prep
    n_out = len(trace.outputs)
    flat = _run(_graph_function(trace, "jvp", func), inputs + _cap(trace) + v, create_graph)
    out, res = flat[:n_out], flat[n_out:]
    return (out if tuple_out else out[0]), (tuple(res) if tuple_out else res[0])


def _scalar_check(trace, fn_name):
    outs = _out_avals(trace)
    if len(outs) != 1 or int(np.prod(outs[0].shape)) != 1:
        raise RuntimeError(f"The function given to {fn_name} should return a single Tensor "
                           f"with a single element")


def _hessian_product(func, inputs, v, create_graph, strict, what):
    tuple_in, inputs = _as_tuple(inputs, "inputs", what)
    v = _checked_v(v, inputs, what, _INPUTS)
    prep = _prepare(func, inputs, what, strict)
    if prep is None:
        return _eager_hessian_product(func, inputs, v, tuple_in, create_graph, what)
    trace, _ = prep
    _scalar_check(trace, what)
    if _out_avals(trace)[0].shape != ():
        inner = func
        func = lambda *xs: inner(*xs).reshape(())  # noqa: E731
        trace, _ = _trace(func, inputs)
    out = _run(_graph_function(trace, "forward", func), inputs + _cap(trace), create_graph)[0]
    res = _run(_graph_function(trace, what, func), inputs + _cap(trace) + v, create_graph)
    return out, (tuple(res) if tuple_in else res[0])


def vhp(func, inputs, v=None, create_graph=False, strict=False):
    """(func(inputs), v^T H) (see torch.autograd.functional.vhp)."""
    return _hessian_product(func, inputs, v, create_graph, strict, "vhp")


def hvp(func, inputs, v=None, create_graph=False, strict=False):
    """(func(inputs), H v) by forward-over-reverse: as fast as vhp."""
    return _hessian_product(func, inputs, v, create_graph, strict, "hvp")


# --- inside a traced function (torch.func.grad(f) whose f calls these) ----------------------
# The inputs are traced values: the derivatives are the adjoint of the trace
# (torch.autograd.grad on traced values, tracegrad.autograd.traced), in the
# same trace, so the enclosing transform differentiates through them.

def _traced(inputs):
    xs = inputs if isinstance(inputs, (tuple, list)) else (inputs,)
    return any(not isinstance(x, Tensor) and hasattr(x, "_trace") for x in xs)


def _traced_rows(outs, xs):
    from tracegrad.eager.engine import grad
    from tracegrad.ops import reshape, stack
    rows = []
    for o in outs:
        flat = reshape(o, (-1,))
        per = [grad([flat[k]], xs, allow_unused=True, materialize_grads=True)
               for k in range(flat.shape[0])]
        rows.append(tuple(reshape(stack([p[j] for p in per]), tuple(o.shape) + tuple(x.shape))
                          for j, x in enumerate(xs)))
    return rows


def _traced_jacobian(func, inputs):
    tuple_in = isinstance(inputs, (tuple, list))
    xs = tuple(inputs) if tuple_in else (inputs,)
    out = func(*xs)
    tuple_out = isinstance(out, tuple)
    return _structure(_traced_rows(out if tuple_out else (out,), xs), tuple_out, tuple_in)


def _traced_hessian(func, inputs):
    from tracegrad.eager.engine import grad
    tuple_in = isinstance(inputs, (tuple, list))
    xs = tuple(inputs) if tuple_in else (inputs,)

    def gradient(*vs):
        return grad([func(*vs)], vs, create_graph=True, allow_unused=True,
                    materialize_grads=True)

    rows = _traced_rows(gradient(*xs), xs)
    blocks = tuple(tuple(r) for r in rows)
    return blocks if tuple_in else blocks[0][0]


def _traced_vjp(func, inputs, v):
    from tracegrad.eager.engine import grad
    tuple_in = isinstance(inputs, (tuple, list))
    xs = tuple(inputs) if tuple_in else (inputs,)
    out = func(*xs)
    tuple_out = isinstance(out, tuple)
    outs = out if tuple_out else (out,)
    vs = (v if isinstance(v, (tuple, list)) else (v,)) if v is not None else (None,) * len(outs)
    res = grad(list(outs), xs, list(vs), create_graph=True, allow_unused=True,
               materialize_grads=True)
    return out, (tuple(res) if tuple_in else res[0])


# --- eager fallbacks for functions that cannot be traced -------------------------------------

def _eager_outputs(func, inputs, create_graph):
    xs = tuple(x.detach().requires_grad_(True) if np.issubdtype(x.dtype, np.inexact) else x
               for x in inputs)
    with enable_grad():
        out = func(*xs)
    tuple_out = isinstance(out, tuple)
    outs = out if tuple_out else (out,)
    return xs, outs, tuple_out


def _grads(outs, xs, grad_outputs, create_graph):
    from tracegrad.eager.engine import grad
    from tracegrad.eager.factories import zeros_like
    live = [(o, g) for o, g in zip(outs, grad_outputs) if o.requires_grad]
    if not live:
        return tuple(zeros_like(x) for x in xs)
    res = grad([o for o, _ in live], xs, [g for _, g in live], retain_graph=True,
               create_graph=create_graph, allow_unused=True)
    return tuple(r if r is not None else zeros_like(x) for r, x in zip(res, xs))


def _eager_jacobian(func, inputs, tuple_in, create_graph, strict):
    from tracegrad.ops import stack, reshape
    xs, outs, tuple_out = _eager_outputs(func, inputs, create_graph)
    rows = []
    for o in outs:
        n = int(np.prod(o.shape))
        per_row = []
        for k in range(n):
            e = np.zeros(n, o.dtype)
            e[k] = 1
            per_row.append(_grads((o,), xs, (Tensor(e.reshape(o.shape)),), create_graph))
        blocks = []
        for j, x in enumerate(xs):
            col = [r[j] for r in per_row]
            blocks.append(reshape(stack(col), tuple(o.shape) + tuple(x.shape)) if col else
                          Tensor(np.zeros(tuple(o.shape) + tuple(x.shape), x.dtype)))
        rows.append(tuple(b if create_graph else b.detach() for b in blocks))
    return _structure(rows, tuple_out, tuple_in)


def _eager_hessian(func, inputs, tuple_in, create_graph, strict):
    def grad_fn(*xs):
        xs2, outs, _ = _eager_outputs(func, xs, True)
        return _grads(outs, xs2, (None,) * len(outs), True)
    res = _eager_jacobian(grad_fn, inputs, True, create_graph, strict)
    return res if tuple_in else res[0][0]


def _eager_vjp(func, inputs, v, tuple_in, create_graph):
    xs, outs, tuple_out = _eager_outputs(func, inputs, create_graph)
    v = _checked_v(v, outs, "vjp", _OUTPUTS)
    res = _grads(outs, xs, v, create_graph)
    outs = _grad_free(outs, create_graph)
    res = _grad_free(res, create_graph)
    return (outs if tuple_out else outs[0]), (res if tuple_in else res[0])


def _eager_jvp(func, inputs, v, create_graph):
    # the double-vjp trick: J v = d/du (u^T J) v, exact and eager
    from tracegrad.eager.factories import zeros_like
    xs, outs, tuple_out = _eager_outputs(func, inputs, create_graph)
    us = tuple(zeros_like(o, requires_grad=True) for o in outs)
    g = _grads(outs, xs, us, True)
    from tracegrad.eager.engine import grad
    res = grad(g, us, v, create_graph=create_graph, allow_unused=True)
    res = tuple(r if r is not None else zeros_like(o) for r, o in zip(res, outs))
    outs = _grad_free(outs, create_graph)
    res = _grad_free(res, create_graph)
    return (outs if tuple_out else outs[0]), (res if tuple_out else res[0])


def _eager_hessian_product(func, inputs, v, tuple_in, create_graph, what):  # noqa: ARG001
    xs, outs, _ = _eager_outputs(func, inputs, create_graph)
    g = _grads(outs, xs, (None,), True)
    from tracegrad.eager.engine import grad
    from tracegrad.eager.factories import zeros_like
    # the Hessian is symmetric, so v^T H and H v are the same vectors here
    res = grad(g, xs, v, create_graph=create_graph, allow_unused=True)
    res = tuple(r if r is not None else zeros_like(x) for r, x in zip(res, xs))
    out = _grad_free(outs, create_graph)[0]
    res = _grad_free(res, create_graph)
    return out, (res if tuple_in else res[0])
