"""Nodes of the eager tape (``grad_fn``) and saved-tensor hooks.

A node knows the edges to the nodes of its inputs (``next_functions``) and
how to turn the gradients of its outputs into gradients of its inputs
(``apply``).  ``PrimNode`` applies a primitive's vjp rule from the
registry; ``AccumulateGrad`` ends a path at a leaf.  Custom ``Function``s and
compiled calls add node kinds of their own.
"""
from __future__ import annotations

import itertools
import threading
import weakref

from tracegrad.eager.grad_mode import state

_seq = itertools.count()

FREED_MSG = (
    "Trying to backward through the graph a second time (or directly access "
    "saved tensors after they have already been freed). Saved intermediate "
    "values of the graph are freed when you call .backward() or "
    "autograd.grad(). Specify retain_graph=True if you need to backward "
    "through the graph a second time or if you need to access saved tensors "
    "after calling backward.")


class RemovableHandle:
    """What ``register_hook`` returns: ``remove()`` takes the hook away."""
    _ids = itertools.count()

    def __init__(self, hooks_dict):
        self.id = next(RemovableHandle._ids)
        self._ref = weakref.ref(hooks_dict) if hasattr(hooks_dict, "__weakref__") else (lambda d=hooks_dict: d)

    def remove(self):
        d = self._ref()
        if d is not None:
            d.pop(self.id, None)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()


class HookDict(dict):
    """A dict that weakrefs can point to."""
    __slots__ = ("__weakref__",)


class Node:
    """Base of every backward node."""
    __slots__ = ("next_functions", "seq", "_pre_hooks", "_post_hooks",
                 "_tensor_pre_hooks", "_metadata", "anomaly_trace", "output_meta",
                 "__weakref__")

    def __init__(self, next_functions):
        self.next_functions = next_functions
        self.seq = next(_seq)
        self._pre_hooks = None
        self._post_hooks = None
        # output index -> HookDict of tensor hooks (registered on outputs)
        self._tensor_pre_hooks = None
        self._metadata = None
        self.anomaly_trace = None
        # [(shape, dtype)] per output, for nodes with several outputs, so
        # outputs that got no gradient can be given zeros.
        self.output_meta = None
        if state.anomaly:
            import traceback
            self.anomaly_trace = "".join(traceback.format_stack()[:-3])

    @property
    def metadata(self):
        """A dict for the user's own data about this node (made on first use)."""
        md = self._metadata
        if md is None:
            md = self._metadata = {}
        return md

    def name(self) -> str:
        return type(self).__name__

    def __repr__(self):
        return f"<{self.name()} object at {id(self):#x}>"

    # torch.autograd.graph.Node hooks
    def register_hook(self, fn):
        """fn(grad_inputs, grad_outputs) -> new grad_inputs or None, after apply."""
        if self._post_hooks is None:
            self._post_hooks = HookDict()
        h = RemovableHandle(self._post_hooks)
        self._post_hooks[h.id] = fn
        return h

    def register_prehook(self, fn):
        """fn(grad_outputs) -> new grad_outputs or None, before apply."""
        if self._pre_hooks is None:
            self._pre_hooks = HookDict()
        h = RemovableHandle(self._pre_hooks)
        self._pre_hooks[h.id] = fn
        return h

    def _add_tensor_hook(self, output_nr, fn):
        if self._tensor_pre_hooks is None:
            self._tensor_pre_hooks = {}
        d = self._tensor_pre_hooks.get(output_nr)
        if d is None:
            d = self._tensor_pre_hooks[output_nr] = HookDict()
        h = RemovableHandle(d)
        d[h.id] = fn
        return h

    def num_outputs(self) -> int:
        return 1

    def apply(self, grad_outputs, create_graph):
        """Gradients of the outputs -> gradients for each next_function."""
        raise NotImplementedError(f"{self.name()} has no backward")

    def release(self):
        """Free what was saved for backward (after a backward without retain_graph)."""

    def __call__(self, *grad_outputs):
        return self.apply(list(grad_outputs), False)


class AccumulateGrad(Node):
    """Ends a path at a leaf tensor: adds the gradient into ``leaf.grad``.

    As in torch, the node holds its leaf and the leaf holds the node only
    weakly (``Tensor._accumulate_node``): a graph keeps alive every leaf it
    reaches (torchviz draws ``torch.tensor(1., requires_grad=True).clone()``'s
    leaf), and no reference cycle keeps a dropped leaf waiting for the
    garbage collector."""
    __slots__ = ("_variable",)

    def __init__(self, leaf):
        super().__init__(())
        self._variable = leaf

    @property
    def variable(self):
        return self._variable

    def name(self):
        return "torch::autograd::AccumulateGrad"

    def __repr__(self):   # torch prints the class name here, not name()
        return f"<AccumulateGrad object at {id(self):#x}>"


# --- saved-tensor hooks -------------------------------------------------------

class _SavedHooksState(threading.local):
    stack = None


_saved_hooks = _SavedHooksState()


def current_saved_hooks():
    st = _saved_hooks.stack
    return (st[-1][0].__wrapped__, st[-1][1]) if st else None


def call_pack_hook(pack, t):
    """``pack(t)`` with the saved-tensor hooks off, as torch runs a pack
    hook: the ops it runs (``lambda x: x * 4``) save tensors of their own,
    which must not call the hook again (that would recurse without end)."""
    st = _saved_hooks.stack
    if not st:
        return pack(t)
    _saved_hooks.stack = None
    try:
        return pack(t)
    finally:
        _saved_hooks.stack = st


class saved_tensors_hooks:
    """Context manager: ``pack(tensor)`` runs when an op saves a tensor for
    backward and ``unpack(packed)`` when backward reads it back."""

    def __init__(self, pack_hook, unpack_hook):
        self.pack_hook = pack_hook
        self.unpack_hook = unpack_hook

    def __enter__(self):
        if _saved_hooks.stack is None:
            _saved_hooks.stack = []
        pack = self.pack_hook

        def pack_with_hooks_off(t):   # (what the recording nodes call)
            return call_pack_hook(pack, t)
        pack_with_hooks_off.__wrapped__ = pack
        _saved_hooks.stack.append((pack_with_hooks_off, self.unpack_hook))
        return self

    def __exit__(self, *exc):
        _saved_hooks.stack.pop()
        return False


class save_on_cpu(saved_tensors_hooks):
    """Saved-tensor hooks that keep what backward needs in host memory.

    A tensor on the GPU (CuPy array) is copied to a NumPy array when it is
    saved (into page-locked memory with ``pin_memory=True``) and copied back
    to its device when backward reads it; NumPy tensors are already on the
    host and are kept as they are.  The unpacked tensor keeps the original's
    ``grad_fn``, so double backward still flows through it."""

    def __init__(self, pin_memory=False, device_type="cuda"):
        self.pin_memory = bool(pin_memory)

        def pack(t):
            data = t._data
            if not type(data).__module__.startswith("cupy"):
                return t
            if self.pin_memory:
                import cupyx
                host = cupyx.empty_pinned(data.shape, data.dtype)
                data.get(out=host)
            else:
                host = data.get()
            return (type(t), data.device.id, host, t._requires_grad, t.grad_fn, t._output_nr,
                    t._vbox)

        def unpack(packed):
            if type(packed) is not tuple:
                return packed
            import cupy
            cls, dev, host, requires_grad, grad_fn, output_nr, vbox = packed
            with cupy.cuda.Device(dev):
                data = cupy.asarray(host)
            return cls(data, requires_grad, grad_fn, output_nr, vbox)

        super().__init__(pack, unpack)
