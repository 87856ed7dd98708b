"""Custom differentiable operations: ``tg.autograd.Function``.

A subclass defines two static methods::

    class Exp(tg.autograd.Function):
        @staticmethod
        def forward(ctx, i):
            result = i.exp()
            ctx.save_for_backward(result)
            return result

        @staticmethod
        def backward(ctx, grad_output):
            result, = ctx.saved_tensors
            return grad_output * result

    y = Exp.apply(x)

``apply`` runs ``forward`` under ``no_grad`` and, when grad mode is on and a
Tensor argument requires grad, makes the outputs point at one backward node
(``y.grad_fn`` is an ``ExpBackward``).  That node is also the ``ctx`` the
static methods receive, as in torch.  The torch 2 style, where ``forward``
takes no ``ctx`` and a separate ``setup_context(ctx, inputs, output)`` fills
it, works too.

``backward`` runs with grad mode set to ``create_graph``: written with
tracegrad ops, it is recorded like any other code, so higher derivatives
work.

Hook for the compiler
---------------------
``Function.forward``/``backward``/``setup_context`` stay plain static
methods, so the tracer may run them itself.  ``function_rules(cls)`` returns
them (and whether the torch 2 style is used); when any argument of
``apply`` is a tracer (has ``_trace``), ``apply`` hands the call to the
binder installed in ``tracegrad.eager.function._trace_apply`` (signature
``_trace_apply(cls, args, setup_ctx)``), as ``primitives._trace_bind`` does for
primitives.  The tracer can record the call as one opaque node whose vjp
calls the user's ``backward``.
"""
from __future__ import annotations

import functools
import inspect

import numpy as np

from tracegrad.eager.grad_mode import state as _mode
from tracegrad.eager import graph as _graph
from tracegrad.eager.graph import FREED_MSG, Node
from tracegrad.eager import forward_ad as _fwad
from tracegrad.eager.tensor import Tensor, _FW

__all__ = ["Function", "FunctionCtx", "BackwardCFunction", "once_differentiable",
           "function_rules", "InplaceFunction"]

# Installed by the tracer: _trace_apply(cls, args, setup_ctx) -> outputs
# (keyword arguments already bound to positions).
_trace_apply = None

# next_functions entry of an input that takes no gradient (as torch's (None, 0))
_NO_EDGE = (None, 0)


def function_rules(cls):
    """What the compiler needs to know about a custom Function subclass.

    Returns ``(forward, backward, setup_context)`` as plain functions;
    ``setup_context`` is None for the classic style where ``forward`` takes
    ``ctx`` first."""
    if not (isinstance(cls, type) and issubclass(cls, Function)):
        raise TypeError(f"function_rules expects a tg.autograd.Function subclass, got {cls!r}")
    return cls.forward, cls.backward, (cls.setup_context if _uses_setup_context(cls) else None)


def _uses_setup_context(cls):
    return cls.setup_context is not _SingleLevelFunction.setup_context


class FunctionCtx:
    """The methods ``ctx`` offers inside ``forward`` (torch's context mixin)."""

    def save_for_backward(self, *tensors):
        """Save Tensors (or None) for ``backward``; read them back through
        ``ctx.saved_tensors``.  Call at most once, inside ``forward``."""
        for i, t in enumerate(tensors):
            if t is not None and not isinstance(t, Tensor):
                raise TypeError(f"save_for_backward can only save variables, but argument {i} "
                                f"is of type {type(t).__name__}")
        self.to_save = tensors

    def save_for_forward(self, *tensors):
        self.saved_for_forward = tensors

    def mark_dirty(self, *args):
        """Mark input Tensors that ``forward`` modified in place."""
        self.dirty_tensors = args

    def mark_non_differentiable(self, *args):
        """Mark outputs that never carry a gradient (e.g. indices)."""
        self.non_differentiable = args

    def set_materialize_grads(self, value):
        """Whether ``backward`` receives zeros (True, the default) or None
        for outputs that got no gradient."""
        self.materialize_grads = bool(value)


class _Saved:
    """One tensor saved by ``save_for_backward``."""
    __slots__ = ("kind", "value", "vbox", "version", "output_nr", "unpack_hook")

    def __init__(self, kind, value, vbox, version, output_nr=0, unpack_hook=None):
        # kind: "input"/"other" (value is the Tensor), "output" (value is the
        # array: the Tensor is rebuilt on unpack so that no cycle
        # node -> output -> node is kept), "packed" (value is what a
        # saved_tensors_hooks pack hook returned).
        self.kind = kind
        self.value = value
        self.vbox = vbox
        self.version = version
        self.output_nr = output_nr
        self.unpack_hook = unpack_hook


class BackwardCFunction(Node, FunctionCtx):
    """The backward node of one ``Function.apply`` call; also its ``ctx``.

    A subclass per Function (``ExpBackward`` for ``Exp``) is made when the
    Function class is defined, so ``name()`` reads as in torch."""
    _forward_cls = None

    def __init__(self, next_functions):
        super().__init__(next_functions)
        self.to_save = None
        self.dirty_tensors = None
        self.non_differentiable = None
        self.materialize_grads = True
        self.needs_input_grad = ()
        self._saved = None
        self._n_inputs = 0
        self._input_is_tensor = ()
        self._input_meta = ()
        self._out_meta = ()
        self._released = False

    # --- node protocol ------------------------------------------------------------
    def name(self):
        return type(self).__name__

    def num_outputs(self):
        return len(self._out_meta)

    def release(self):
        self._saved = None
        self._released = True

    @property
    def saved_tensors(self):
        """The tensors given to ``save_for_backward``, checked against
        in-place modification since they were saved."""
        if self.__dict__.get("_in_jvp"):   # inside jvp: what save_for_forward kept
            return tuple(getattr(self, "saved_for_forward", None) or ())
        if self._released:
            raise RuntimeError(FREED_MSG)
        saved = self._saved
        if saved is None:
            return ()
        out = []
        for s in saved:
            if s is None:
                out.append(None)
                continue
            if s.vbox[0] != s.version:
                what = (f"which is output {s.output_nr} of {self.name()}" if s.kind == "output"
                        else f"which was saved by {self.name()}")
                raise RuntimeError(
                    "one of the variables needed for gradient computation has been modified by "
                    f"an inplace operation: [tensor of shape {list(_shape(s))} and dtype "
                    f"{_dtype(s)}], {what}, is at version {s.vbox[0]}; expected version "
                    f"{s.version} instead. Hint: compute it out of place, or clone() it "
                    "before modifying it.")
            if s.kind == "packed":
                t = s.unpack_hook(s.value)
                if not isinstance(t, Tensor):
                    raise TypeError(f"the saved_tensors_hooks unpack hook must return a Tensor, "
                                    f"got {type(t).__name__}")
            elif s.kind == "output":
                meta = self._out_meta[s.output_nr]
                rg = meta is not None and meta[2]
                t = Tensor(s.value, rg, self if rg else None, s.output_nr, s.vbox)
            else:
                t = s.value
            out.append(t)
        return tuple(out)

    saved_variables = saved_tensors

    def apply(self, grad_outputs, create_graph):
        cls = self._forward_cls
        grads = list(grad_outputs)
        if self.materialize_grads:
            for i, g in enumerate(grads):
                if g is None and self._out_meta[i] is not None:
                    shape, dtype, _, xp = self._out_meta[i]
                    grads[i] = Tensor(xp.zeros(shape, dtype))
        result = cls.backward(self, *grads)
        if not isinstance(result, tuple):
            result = (result,)
        return self._check_grads(result)

    def _check_grads(self, result):
        n = self._n_inputs
        name = self.name()
        if len(result) > n and all(r is None for r in result[n:]):
            result = result[:n]
        if len(result) != n:
            raise RuntimeError(f"function {name} returned an incorrect number of gradients "
                               f"(expected {n}, got {len(result)})")
        out = []
        for i, g in enumerate(result):
            if g is None:
                out.append(None)
                continue
            if not self._input_is_tensor[i]:
                raise RuntimeError(
                    f"function {name} returned a gradient different than None at position "
                    f"{i + 1}, but the corresponding forward input was not a Variable")
            if not isinstance(g, Tensor):
                if hasattr(g, "__cuda_array_interface__"):
                    g = Tensor(g)
                elif isinstance(g, (int, float, np.ndarray, np.generic)):
                    g = Tensor(np.asarray(g))
                else:
                    raise TypeError(f"function {name} returned a {type(g).__name__} as gradient "
                                    f"{i}; expected a Tensor or None")
            if self.next_functions[i][0] is None:
                # the input does not require grad: drop the gradient, as torch does
                out.append(None)
                continue
            shape, dtype = self._input_meta[i]
            if tuple(g.shape) != shape or g.dtype != dtype:
                gshape = tuple(g.shape)
                if gshape != shape:
                    try:
                        ok = tuple(np.broadcast_shapes(gshape, shape)) == gshape
                    except ValueError:
                        ok = False
                    if not ok:
                        raise RuntimeError(
                            f"Function {name} returned an invalid gradient at index {i} - got "
                            f"{list(gshape)} but expected shape compatible with {list(shape)}")
                from tracegrad.ops.base import unbroadcast
                g = unbroadcast(g, shape, dtype)
            out.append(g)
        return out


def _shape(s):
    v = s.value
    return getattr(v, "shape", "?")


def _dtype(s):
    v = s.value
    return getattr(v, "dtype", "?")


class FunctionMeta(type):
    """Makes ``<Name>Backward``, the node class of each Function subclass."""

    def __init__(cls, name, bases, attrs):
        backward_fn = type(name + "Backward", (BackwardCFunction,), {"_forward_cls": cls})
        cls._backward_cls = backward_fn
        super().__init__(name, bases, attrs)


class _SingleLevelFunction(metaclass=FunctionMeta):
    @staticmethod
    def forward(ctx, *args, **kwargs):
        """Performs the operation; override in a subclass."""
        raise NotImplementedError("You must implement the forward function for custom "
                                  "autograd.Function.")

    @staticmethod
    def setup_context(ctx, inputs, output):
        """torch 2 style: fill ``ctx`` from the inputs and the output of a
        ``forward`` that takes no ``ctx``.  Override to use this style."""
        raise NotImplementedError("setup_context is not overridden.")

    @staticmethod
    def backward(ctx, *grad_outputs):
        """Gradients of the outputs -> one gradient (or None) per input of
        ``forward``.  Override in a subclass."""
        raise NotImplementedError("You must implement either the backward or vjp method for "
                                  "your custom autograd.Function to use it with backward mode AD.")

    vjp = backward

    @staticmethod
    def jvp(ctx, *grad_inputs):
        raise NotImplementedError("You must implement the jvp function for custom "
                                  "autograd.Function to use it with forward mode AD.")


class Function(_SingleLevelFunction):
    """Base class of custom differentiable operations (see the module doc)."""

    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        raise RuntimeError(
            "Legacy autograd function with non-static forward method is deprecated. Please use "
            "new-style autograd function with static forward method. (Example: "
            "https://pytorch.org/docs/stable/autograd.html#torch.autograd.Function)")

    @classmethod
    def apply(cls, *args, **kwargs):
        if cls.forward is _SingleLevelFunction.forward:
            raise NotImplementedError(f"{cls.__name__} does not implement forward")
        setup_ctx = _uses_setup_context(cls)
        if kwargs:
            args = _bind_args(cls, args, kwargs, setup_ctx)
        if _trace_apply is not None:
            for a in args:
                if hasattr(a, "_trace"):
                    return _trace_apply(cls, args, setup_ctx)
        grad_on = _mode.grad_enabled
        needs = tuple(isinstance(a, Tensor) and a._requires_grad and grad_on for a in args)
        is_executable = any(needs)
        node = cls._backward_cls(tuple(a._edge() if n else _NO_EDGE for a, n in zip(args, needs)))
        node.needs_input_grad = needs
        node._n_inputs = len(args)
        node._input_is_tensor = tuple(isinstance(a, Tensor) for a in args)
        node._input_meta = tuple((tuple(a.shape), a.dtype) if isinstance(a, Tensor) else None
                                 for a in args)
        tangents = _fwad.function_tangents(args) if _FW.level is not None else None
        prev = _mode.grad_enabled
        _mode.grad_enabled = False
        try:
            if _FW.level is not None:   # forward runs on the primals; jvp gives the tangents
                with _fwad.plain_ops():
                    outputs = _run_forward(cls, node, args, setup_ctx)
            else:
                outputs = _run_forward(cls, node, args, setup_ctx)
        finally:
            _mode.grad_enabled = prev
        outputs = _wrap_outputs(node, args, outputs, is_executable)
        if tangents is not None:
            _fwad.attach_function_tangents(cls, node, args, tangents, outputs)
        return outputs


def _run_forward(cls, node, args, setup_ctx):
    if setup_ctx:
        outputs = cls.forward(*args)
        cls.setup_context(node, args, outputs)
        return outputs
    return cls.forward(node, *args)


def _bind_args(cls, args, kwargs, setup_ctx):
    """Keyword arguments become positional ones in ``forward``'s order, so
    backward returns one gradient per parameter (torch 2 does the same)."""
    try:
        sig = inspect.signature(cls.forward)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{cls.__name__}.apply got keyword arguments but the signature of "
                        f"its forward cannot be read: {e}") from e
    params = list(sig.parameters.values())
    if not setup_ctx:
        params = params[1:]
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
        raise TypeError(f"{cls.__name__}.apply: keyword arguments need a forward with named "
                        f"parameters only (no *args/**kwargs); pass them positionally")
    sig = sig.replace(parameters=params)
    bound = sig.bind(*args, **kwargs)
    bound.apply_defaults()
    return tuple(bound.arguments[p.name] for p in params)


def _wrap_outputs(node, args, outputs, is_executable):
    single = not isinstance(outputs, tuple)
    outs = (outputs,) if single else outputs
    dirty = node.dirty_tensors or ()
    nondiff = node.non_differentiable or ()
    dirty_ids = {id(t) for t in dirty}
    input_ids = {id(a): i for i, a in enumerate(args) if isinstance(a, Tensor)}
    for k, t in enumerate(dirty):
        if id(t) not in input_ids:
            raise RuntimeError(f"mark_dirty only accepts input Tensors, but argument {k} "
                               f"is not an input of the Function")
    nondiff_ids = {id(t) for t in nondiff}
    out_ids = {id(o) for o in outs if isinstance(o, Tensor)}
    for k, t in enumerate(nondiff):
        if id(t) not in out_ids:
            raise RuntimeError(f"mark_non_differentiable only accepts output Tensors, but "
                               f"argument {k} is not an output of the Function")
    for t in dirty:
        if id(t) not in out_ids:
            raise RuntimeError("Some elements marked as dirty during the forward method were "
                               "not returned as output. The inputs that are modified inplace "
                               "must all be outputs of the Function.")

    new_outs = []
    metas = []
    raw_to_out = {}
    for i, o in enumerate(outs):
        if not isinstance(o, Tensor):
            new_outs.append(o)
            metas.append(None)
            continue
        differentiable = (is_executable and id(o) not in nondiff_ids
                          and np.issubdtype(o.dtype, np.inexact))
        if id(o) in dirty_ids:
            if is_executable and o._requires_grad and o.grad_fn is None:
                raise RuntimeError("a leaf Variable that requires grad has been used in an "
                                   "in-place operation.")
            t = o  # rebase the modified input's history onto this node
        elif id(o) in input_ids:
            # an input returned unchanged: the output is a new Tensor on the
            # same memory, so the input keeps its own history
            t = Tensor(o._data, False, None, 0, o._vbox)
        elif o.grad_fn is not None or (o._requires_grad and is_executable):
            # made outside this forward (e.g. a captured tensor): alias it
            t = Tensor(o._data, False, None, 0, o._vbox)
        else:
            t = o
        if differentiable:
            t.grad_fn = node
            t._output_nr = i
            t._requires_grad = True
        elif t is o and id(o) in dirty_ids and is_executable:
            t.grad_fn = None
            t._requires_grad = False
        raw_to_out[id(o)] = t
        from tracegrad.ops.primitives import array_module
        metas.append((tuple(o.shape), o.dtype, differentiable, array_module(o._data)))
        new_outs.append(t)
    node._out_meta = tuple(metas)

    if is_executable and node.to_save:
        _save(node, args, outs, raw_to_out)
    node.to_save = None
    return new_outs[0] if single else tuple(new_outs)


def _save(node, args, outs, raw_to_out):
    hooks = _graph._saved_hooks.stack
    pack, unpack = hooks[-1] if hooks else (None, None)
    out_pos = {id(o): i for i, o in enumerate(outs) if isinstance(o, Tensor)}
    saved = []
    for t in node.to_save:
        if t is None:
            saved.append(None)
            continue
        i = out_pos.get(id(t))
        if i is not None:
            t = raw_to_out[id(t)]
        if pack is not None:
            saved.append(_Saved("packed", pack(t), t._vbox, t._vbox[0], 0, unpack))
        elif i is not None and t.grad_fn is node:
            saved.append(_Saved("output", t._data, t._vbox, t._vbox[0], i))
        else:
            saved.append(_Saved("input", t, t._vbox, t._vbox[0]))
    node._saved = saved


class _OnceDifferentiableError(Node):
    """Stands where a double backward would go through a backward marked
    ``@once_differentiable``."""

    def __init__(self, fn_name, next_functions):
        super().__init__(next_functions)
        self._fn_name = fn_name

    def name(self):
        return "DelayedError"

    def apply(self, grad_outputs, create_graph):
        raise RuntimeError(f"trying to differentiate twice a function that was marked with "
                           f"@once_differentiable ({self._fn_name})")


def once_differentiable(fn):
    """Decorator for a ``backward`` that is not itself differentiable: it
    runs without recording, and differentiating its result raises."""

    @functools.wraps(fn)
    def wrapper(ctx, *args):
        prev = _mode.grad_enabled
        _mode.grad_enabled = False
        try:
            outputs = fn(ctx, *args)
        finally:
            _mode.grad_enabled = prev
        if not prev:
            return outputs
        tensor_args = [a for a in args if isinstance(a, Tensor) and a._requires_grad]
        if not tensor_args:
            return outputs
        single = not isinstance(outputs, tuple)
        outs = (outputs,) if single else outputs
        err = _OnceDifferentiableError(
            ctx.name() if hasattr(ctx, "name") else "backward",
            tuple(a._edge() for a in tensor_args))
        wrapped = tuple(Tensor(o._data, True, err, 0, o._vbox) if isinstance(o, Tensor) else o
                        for o in outs)
        return wrapped[0] if single else wrapped

    return wrapper


class InplaceFunction(Function):
    def __init__(self, inplace=False):
        super().__init__()
        self.inplace = inplace
