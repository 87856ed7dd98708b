"""Custom Functions inside compiled code: one opaque node whose vjp is the
user's ``backward``.

While tracing, ``MyFn.apply(x, ...)`` records the user's ``forward`` as
ordinary ops and then one ``custom_vjp`` node over (forward outputs,
inputs).  The node passes the forward outputs through unchanged (the
generated code is just the forward's ops), but its vjp rule ignores them and
calls the user's ``backward`` instead: the forward's own ops are never
differentiated.  The rule re-runs ``forward`` on the inputs to rebuild
``ctx`` (its saved tensors); in a trace those ops hash-cons onto the ones
already recorded, so nothing is computed twice.
"""
from __future__ import annotations

from tracegrad.ops.primitives import bind, register

__all__ = []


class _TraceCtx:
    """``ctx`` for a Function's forward/backward running on tracers."""

    def __init__(self, needs_input_grad):
        self.needs_input_grad = needs_input_grad
        self.to_save = ()
        self.materialize_grads = True
        self.non_differentiable = ()

    def save_for_backward(self, *values):
        self.to_save = values

    @property
    def saved_tensors(self):
        return tuple(self.to_save)

    def save_for_forward(self, *values):
        self.saved_for_forward = values

    def mark_dirty(self, *args):
        raise TypeError("mark_dirty (an in-place custom Function) cannot be compiled: "
                        "compiled code has no in-place semantics; use it in eager mode")

    def mark_non_differentiable(self, *args):
        self.non_differentiable = args

    def set_materialize_grads(self, value):
        self.materialize_grads = bool(value)


def _run_forward(fn, ctx, args, setup_ctx):
    """fn.forward on args; setup_ctx: the Function defines setup_context
    (torch 2 style, a forward without ctx)."""
    if setup_ctx:
        out = fn.forward(*args)
        fn.setup_context(ctx, tuple(args), out)
        return out
    return fn.forward(ctx, *args)


def _args(operands_x, statics, tensor_pos):
    n = len(statics) + len(tensor_pos)
    args = [None] * n
    for p, v in statics:
        args[p] = v
    for p, x in zip(tensor_pos, operands_x):
        args[p] = x
    return args


def _custom_vjp(g, out, *operands, fn, n_out, statics, tensor_pos, source, setup_ctx):
    from tracegrad.ops.base import zeros_like_value
    raw, xs = operands[:n_out], operands[n_out:]
    ctx = _TraceCtx(tuple(i in tensor_pos for i in range(len(statics) + len(tensor_pos))))
    _run_forward(fn, ctx, _args(xs, statics, tensor_pos), setup_ctx)
    gs = tuple(g)
    if ctx.materialize_grads:
        gs = tuple(zeros_like_value(r) if gi is None else gi for gi, r in zip(gs, raw))
    grads = fn.backward(ctx, *gs)
    if not isinstance(grads, tuple):
        grads = (grads,)
    n_args = len(statics) + len(tensor_pos)
    if len(grads) != n_args:
        raise RuntimeError(f"function {fn.__name__}Backward returned an incorrect number of "
                           f"gradients (expected {n_args}, got {len(grads)})")
    return (None,) * n_out + tuple(grads[p] for p in tensor_pos)


def _has_own_jvp(fn):
    # the base class's jvp raises torch's error; it lives in the autograd
    # layer above this one, so it is recognised by name
    jvp = getattr(fn, "jvp", None)
    return jvp is not None and getattr(jvp, "__qualname__", "") != "_SingleLevelFunction.jvp"


def _custom_jvp(tangents, out, *operands, fn, n_out, statics, tensor_pos, source, setup_ctx):
    """Forward mode runs the user's ``jvp`` (torch's ``Function.jvp``): the
    user's rules, never the forward's ops, define the derivative (a
    straight-through backward would otherwise meet a different forward-mode
    derivative).  Without one it is torch's error."""
    from tracegrad.ops.base import zeros_like_value
    if not _has_own_jvp(fn):
        raise NotImplementedError(
            f"You must implement the jvp function for custom autograd.Function to use it with "
            f"forward mode AD: {fn.__name__} defines only backward, and forward mode (tg.jvp, "
            f"tg.jacfwd, tg.hessian, which is forward-over-reverse) needs "
            f"'@staticmethod def jvp(ctx, *tangents)'; or differentiate in reverse mode "
            f"(tg.grad, tg.jacobian)")
    raw, xs = operands[:n_out], operands[n_out:]
    n_args = len(statics) + len(tensor_pos)
    ctx = _TraceCtx(tuple(i in tensor_pos for i in range(n_args)))
    _run_forward(fn, ctx, _args(xs, statics, tensor_pos), setup_ctx)
    grad_inputs = [None] * n_args
    for p, x, t in zip(tensor_pos, xs, tangents[n_out:]):
        if t is None and getattr(x, "dtype", None) is not None and x.dtype.kind == "f":
            t = zeros_like_value(x)
        grad_inputs[p] = t
    res = fn.jvp(ctx, *grad_inputs)
    res = res if isinstance(res, tuple) else (res,)
    if len(res) != n_out:
        raise RuntimeError(f"function {fn.__name__}.jvp returned an incorrect number of "
                           f"tangents (expected {n_out}, got {len(res)})")
    return tuple(zeros_like_value(r) if t is None else t for t, r in zip(res, raw))


def _custom_numpy(names, fn, n_out, statics, tensor_pos, source, setup_ctx):
    return "(" + ", ".join(names[:n_out]) + ",)"


# The node always has a tuple of outputs (n_out is callable), one per
# forward output.
custom_vjp_p = register(
    "custom_vjp",
    lambda xp, *operands, fn, n_out, statics, tensor_pos, source, setup_ctx: tuple(operands[:n_out]),
    shape=lambda *avals, fn, n_out, statics, tensor_pos, source, setup_ctx: tuple(avals[:n_out]),
    vjp=_custom_vjp, jvp=_custom_jvp, numpy=_custom_numpy,
    may_view=True,  # the emitted tuple holds the forward outputs themselves
    n_out=lambda fn, n_out, statics, tensor_pos, source, setup_ctx: n_out,
    doc="A custom autograd.Function in compiled code: forward outputs pass through; "
        "the vjp is the user's backward, the jvp the user's jvp.")


def trace_apply(fn, args, setup_ctx, source):
    """``Function.apply`` on tracers (keyword arguments already bound to
    positions): the forward's ops plus one custom_vjp node.  ``source``: a
    hash of the code ``fn`` runs (the front end's ``code_deps.fingerprint``),
    part of the node's attributes, so an edited backward (or a helper it
    calls, in any module) is never served stale generated code from the
    disk cache."""
    tensor_pos, statics = [], []
    for i, a in enumerate(args):
        if hasattr(a, "_trace") or hasattr(a, "grad_fn") or hasattr(a, "__array_interface__"):
            tensor_pos.append(i)
        else:
            try:
                hash(a)
            except TypeError:
                raise TypeError(f"{fn.__name__}.apply: non-tensor argument {i} of type "
                                f"{type(a).__name__} is unhashable; compiled code keys on it, "
                                f"so pass a tuple or a number") from None
            statics.append((i, a))
    ctx = _TraceCtx(tuple(i in tensor_pos for i in range(len(args))))
    out = _run_forward(fn, ctx, list(args), setup_ctx)
    multi = isinstance(out, tuple)
    outs = out if multi else (out,)
    res = bind(custom_vjp_p, *outs, *[args[p] for p in tensor_pos], fn=fn, n_out=len(outs),
               statics=tuple(statics), tensor_pos=tuple(tensor_pos), source=source,
               setup_ctx=setup_ctx)
    return res if multi else res[0]
