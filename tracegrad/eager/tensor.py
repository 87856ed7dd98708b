"""The eager interpreter: ``Tensor`` and the tape it records.

Every op on Tensors goes through ``eager_bind``: it computes the primitive's
``impl`` on the arrays at once and, when grad mode is on and an operand
requires grad, records a ``PrimNode`` whose backward applies the
primitive's vjp rule from the registry.
"""
from __future__ import annotations

import weakref

import numpy as np

from tracegrad.ops import primitives
from tracegrad.eager import graph as _graph
from tracegrad.eager.grad_mode import state as _mode
from tracegrad.eager.profiler_state import _state as _prof_state
from tracegrad.eager.graph import AccumulateGrad, FREED_MSG, Node, _seq
from tracegrad.ops import _define
from tracegrad.ops._define import ArrayMethods
from tracegrad.ops.base import (astype as ops_astype, resolve_dtype as _resolve_dtype,
                                unbroadcast, vjp_apply)
from tracegrad.ops.random import is_tracing
from tracegrad.ops.primitives import Aval

_ndarray = np.ndarray


class device:
    """``tg.device("cpu")`` / ``tg.device("cuda")``, compared by type and index."""
    __slots__ = ("type", "index")

    def __init__(self, type="cpu", index=None):
        if isinstance(type, device):
            type, index = type.type, type.index
        if ":" in type:
            type, idx = type.split(":", 1)
            index = int(idx)
        if type not in ("cpu", "cuda"):
            raise ValueError(f"unknown device {type!r}: tracegrad knows 'cpu' and 'cuda'")
        self.type = type
        self.index = index

    def __eq__(self, other):
        if isinstance(other, str):
            other = device(other)
        return isinstance(other, device) and self.type == other.type and (
            self.index == other.index or self.index is None or other.index is None)

    def __hash__(self):
        return hash(self.type)

    def __repr__(self):
        return f"device(type='{self.type}'" + (f", index={self.index})" if self.index is not None else ")")

    def __str__(self):
        return self.type if self.index is None else f"{self.type}:{self.index}"

    def __enter__(self):
        """``with tg.device("cpu"):`` makes it the default device inside the block."""
        _Defaults.device_stack.append(_Defaults.device)
        set_default_device(self)
        return self

    def __exit__(self, *exc):
        _Defaults.device = _Defaults.device_stack.pop()
        return False


_CPU = device("cpu")


class _FW:
    """The open forward-AD level (tracegrad.eager.forward_ad), global as
    in torch; None when no level is open.  A tensor's tangent lives in its
    ``_fw`` slot as ``(level, tangent)`` (the slot is unset until then)."""
    level = None


def _tangent(t):
    """The tangent ``t`` carries in the open forward-AD level, or None."""
    fw = getattr(t, "_fw", None)
    if fw is not None and fw[0] == _FW.level and fw[0] is not None:
        return fw[1]
    return None


class Tensor(ArrayMethods):
    """An array with torch.autograd semantics, on NumPy (or CuPy) data."""
    _face = "torch"   # names whose meaning differs between NumPy and torch mean torch's
    __slots__ = ("_data", "_requires_grad", "_grad", "grad_fn", "_output_nr",
                 "_vbox", "_retains_grad", "_accum", "_base", "_view_fn", "name", "_fw",
                 "__weakref__")

    def __init__(self, data, requires_grad=False, grad_fn=None, _output_nr=0, _vbox=None):
        self._data = data
        self._requires_grad = requires_grad
        self._grad = None
        self.grad_fn = grad_fn
        self._output_nr = _output_nr
        self._vbox = _vbox if _vbox is not None else [0]
        self._retains_grad = False
        self._accum = None
        self._base = None

    # --- attributes -----------------------------------------------------------
    @property
    def data(self):
        """A detached Tensor sharing this tensor's memory (as in torch)."""
        return Tensor(self._data)

    @data.setter
    def data(self, value):
        self._data = value._data if isinstance(value, Tensor) else value

    @property
    def requires_grad(self):
        return self._requires_grad

    @requires_grad.setter
    def requires_grad(self, flag):
        self.requires_grad_(flag)

    def requires_grad_(self, requires_grad=True):
        if self.grad_fn is not None and not requires_grad:
            raise RuntimeError(
                "you can only change requires_grad flags of leaf variables. If you want to "
                "use a computed variable in a subgraph that doesn't require differentiation "
                "use var_no_grad = var.detach().")
        if requires_grad and self._data.dtype.kind not in "fc":
            raise RuntimeError("only Tensors of floating point and complex dtype can require "
                               "gradients")
        self._requires_grad = bool(requires_grad)
        return self

    @property
    def grad(self):
        if self.grad_fn is not None and not self._retains_grad and self._grad is None:
            import warnings
            warnings.warn(
                "The .grad attribute of a Tensor that is not a leaf Tensor is being accessed. "
                "Its .grad attribute won't be populated during autograd.backward(). If you "
                "indeed want the .grad field to be populated for a non-leaf Tensor, use "
                ".retain_grad() on the non-leaf Tensor.", UserWarning, stacklevel=2)
        return self._grad

    @grad.setter
    def grad(self, value):
        if value is not None:
            if not isinstance(value, Tensor):
                value = Tensor(np.asarray(value))
            if tuple(value.shape) != tuple(self.shape):
                raise RuntimeError(
                    f"assigned grad has data of a different size: expected {tuple(self.shape)}, "
                    f"got {tuple(value.shape)}")
            if value.dtype != self.dtype:
                raise RuntimeError(
                    f"assigned grad has data of a different type: expected {self.dtype}, "
                    f"got {value.dtype}")
        self._grad = value

    @property
    def is_leaf(self):
        return self.grad_fn is None

    @property
    def shape(self):
        return self._data.shape

    @property
    def dtype(self):
        return self._data.dtype

    @property
    def device(self):
        return _CPU if type(self._data) is _ndarray else _device_of(self._data)

    @property
    def is_cuda(self):
        return self.device.type == "cuda"

    @property
    def _version(self):
        return self._vbox[0]

    @property
    def output_nr(self):
        return self._output_nr

    @property
    def retains_grad(self):
        return self._retains_grad

    @property
    def itemsize(self):
        return self._data.itemsize

    @property
    def nbytes(self):
        return self._data.nbytes

    def element_size(self):
        return self._data.itemsize

    def __repr__(self):
        body = np.array2string(np.asarray(_to_host(self._data)), separator=", ", prefix="tensor(")
        extra = ""
        if self.dtype != _Defaults.dtype and self.dtype != np.int64 and self.dtype != np.bool_:
            extra += f", dtype={self.dtype}"
        if self.device.type != "cpu":
            extra += f", device='{self.device}'"
        if self.grad_fn is not None:
            extra += f", grad_fn=<{self.grad_fn.name()}>"
        elif self._requires_grad:
            extra += ", requires_grad=True"
        t = _tangent(self)
        if t is not None:   # a dual tensor of forward-mode AD
            extra += f", tangent={t!r}"
        return f"tensor({body}{extra})"

    # --- conversion -----------------------------------------------------------
    def numpy(self, force=False):
        if self._requires_grad and not force:
            raise RuntimeError("Can't call numpy() on Tensor that requires grad. "
                               "Use tensor.detach().numpy() instead.")
        return _to_host(self._data)

    def __array__(self, dtype=None, copy=None):
        a = _to_host(self._data)
        return a if dtype is None else a.astype(dtype)

    def item(self):
        if self._data.size != 1:
            raise RuntimeError(f"a Tensor with {self._data.size} elements cannot be converted to Scalar")
        return self._data.item()

    def tolist(self):
        return self._data.tolist()

    def __float__(self):
        return float(self.item())

    def __int__(self):
        return int(self.item())

    def __index__(self):
        if np.issubdtype(self.dtype, np.integer):
            return int(self.item())
        raise TypeError("only integer tensors of a single element can be converted to an index")

    def __bool__(self):
        if self._data.size != 1:
            raise RuntimeError("Boolean value of Tensor with more than one value is ambiguous")
        return bool(self._data.item())

    def __iter__(self):
        if not self.shape:
            raise TypeError("iteration over a 0-d tensor")
        return (self[i] for i in range(self.shape[0]))

    def __reduce__(self):
        return (_rebuild, (_to_host(self._data), self._requires_grad))

    def __deepcopy__(self, memo):
        if not self.is_leaf:
            raise RuntimeError("Only Tensors created explicitly by the user (graph leaves) "
                               "support the deepcopy protocol at the moment")
        t = Tensor(self._data.copy(), self._requires_grad)
        if self._grad is not None:
            t._grad = Tensor(self._grad._data.copy())
        memo[id(self)] = t
        return t

    # --- autograd -------------------------------------------------------------
    def backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
        """Compute the gradient of this tensor w.r.t. graph leaves (see torch.Tensor.backward)."""
        _engine_backward(self, gradient, retain_graph, create_graph, None, inputs)

    def detach(self):
        """A new Tensor on the same memory and version counter, outside the graph."""
        return Tensor(self._data, False, None, 0, self._vbox)

    def detach_(self):
        if self._base is not None and (self._requires_grad or self._base._requires_grad):
            raise RuntimeError("Can't detach views in-place. Use detach() instead.")
        self._unretain()
        self.grad_fn = None
        self._output_nr = 0
        self._requires_grad = False
        return self

    def retain_grad(self):
        """Let ``.grad`` of this non-leaf tensor be filled by backward."""
        if self.grad_fn is None:
            if not self._requires_grad:
                raise RuntimeError("can't retain_grad on Tensor that has requires_grad=False")
            return  # leaves retain their grad anyway
        if self._retains_grad:
            return
        self._retains_grad = True
        retained = self.grad_fn.metadata.setdefault("_retain_grad", {})
        retained[self._output_nr] = weakref.ref(self)

    def _unretain(self):
        if self._retains_grad and self.grad_fn is not None:
            md = self.grad_fn._metadata
            if md and "_retain_grad" in md:
                md["_retain_grad"].pop(self._output_nr, None)

    def _set_history(self, grad_fn, output_nr, requires_grad):
        """Point this tensor at a new grad_fn (after an in-place op)."""
        retains = self._retains_grad
        if retains:
            self._unretain()
            self._retains_grad = False
        self.grad_fn = grad_fn
        self._output_nr = output_nr
        self._requires_grad = requires_grad
        if retains and grad_fn is not None:
            self.retain_grad()

    def register_hook(self, hook):
        """hook(grad) -> Tensor or None, called with the gradient of this tensor."""
        if not self._requires_grad:
            raise RuntimeError("cannot register a hook on a tensor that doesn't require gradient")
        if self.grad_fn is not None:
            return self.grad_fn._add_tensor_hook(self._output_nr, hook)
        return self._pinned_accumulate_node()._add_tensor_hook(0, hook)

    def register_post_accumulate_grad_hook(self, hook):
        if self.grad_fn is not None:
            raise RuntimeError("post accumulate grad hooks cannot be registered on non-leaf tensors")
        node = self._pinned_accumulate_node()
        hooks = node.metadata.setdefault("_post_accumulate", _graph.HookDict())
        h = _graph.RemovableHandle(hooks)
        hooks[h.id] = hook
        return h

    def _accumulate_node(self):
        # A weak reference, as torch's: the graph holds the node and the node
        # the leaf.  A leaf with hooks holds it strongly (_pinned_accumulate_node).
        acc = self._accum
        if acc is not None:
            acc = acc if type(acc) is AccumulateGrad else acc()
            if acc is not None:
                return acc
        acc = AccumulateGrad(self)
        self._accum = weakref.ref(acc)
        return acc

    def _pinned_accumulate_node(self):
        """The AccumulateGrad node, kept as long as the leaf (its hooks live there)."""
        acc = self._accum = self._accumulate_node()
        return acc

    def _edge(self):
        """(node, output index) that gradients for this tensor flow into, or
        None when it does not require grad."""
        e = _edge_of(self)
        return None if e is _NO_EDGE else e

    def is_inference(self):
        return False

    def _is_view(self):
        return self._base is not None

    # --- copies and devices ---------------------------------------------------
    def clone(self, memory_format=None):
        from tracegrad import ops
        return ops.clone(self)

    def contiguous(self, memory_format=None):
        return self

    def is_contiguous(self, memory_format=None):
        return bool(self._data.flags.c_contiguous)

    def to(self, *args, **kwargs):
        """.to(dtype), .to(device), .to(device, dtype), .to(other)."""
        dev = kwargs.pop("device", None)
        dtype = kwargs.pop("dtype", None)
        kwargs.pop("non_blocking", None)
        kwargs.pop("copy", None)
        for a in args:
            if isinstance(a, Tensor):
                dev, dtype = a.device, a.dtype
            elif isinstance(a, (str, device)) and str(a).split(":")[0] in ("cpu", "cuda"):
                dev = a
            elif a is not None:
                dtype = a
        out = self
        if dtype is not None and np.dtype(dtype) != self.dtype:
            from tracegrad import ops
            out = ops.astype(out, np.dtype(dtype))
        if dev is not None and device(dev) != out.device:
            from tracegrad import ops
            out = ops.to_device(out, device(dev).type)
        return out

    def cpu(self):
        return self.to("cpu")

    def cuda(self, device=None):
        return self.to("cuda")

    def type(self, dtype=None):
        if dtype is None:
            return f"tracegrad.{self.dtype}"
        return self.to(dtype)

    def float(self):
        return self.to(np.float32)

    def double(self):
        return self.to(np.float64)

    def half(self):
        return self.to(np.float16)

    def long(self):
        return self.to(np.int64)

    def int(self):
        return self.to(np.int32)

    def bool(self):
        return self.to(np.bool_)

    def astype(self, dtype, copy=True):
        if not copy and _resolve_dtype(dtype) == self.dtype:
            return self   # NumPy's astype(copy=False): the array itself
        return self.to(dtype)

    def _assign(self, value, what, instead):
        """NumPy's in-place update of every name bound to this value (the
        NumPy face's x.sort()), recorded like any in-place op."""
        self.copy_(value)

    # --- in-place ops ---------------------------------------------------------
    def _inplace(self, fn, *args, fast=None):
        """Apply ``fn(self, *args)`` and write the result into this tensor.

        Bumps the version counter shared with views and ``detach()``ed
        aliases, so backward through a saved copy of the old value is caught.
        On a leaf that requires grad (or a view of one) it is an error while
        grad mode is on, as in torch; under ``no_grad`` it writes in place.
        When nothing is recorded, ``fast(data, *arrays)`` (if given) does the
        work on the arrays directly."""
        if _FW.level is not None and (_tangent(self) is not None or any(
                isinstance(a, Tensor) and _tangent(a) is not None for a in args)):
            return self._inplace_dual(fn, args)
        grad_on = _mode.grad_enabled
        if grad_on:
            if self._requires_grad and self.grad_fn is None:
                raise RuntimeError(
                    "a leaf Variable that requires grad is being used in an in-place operation.")
            base = self._base
            if base is not None and base._requires_grad and base.grad_fn is None:
                raise RuntimeError(
                    "a view of a leaf Variable that requires grad is being used in an in-place "
                    "operation.")
            track = self._requires_grad or any(
                isinstance(a, Tensor) and a._requires_grad for a in args)
        else:
            track = False
        data = self._data
        if not track:
            if fast is not None and (type(data) is _ndarray or fn is None):
                try:
                    fast(data, *[a._data if isinstance(a, Tensor) else a for a in args])
                except (ValueError, TypeError) as e:
                    raise RuntimeError(_inplace_error(e, data, args)) from None
            else:
                res = fn(Tensor(data), *args)
                _write(data, res._data)
            self._vbox[0] += 1
            return self
        if self._base is not None and self._view_fn is None:
            name = self.grad_fn.name() if self.grad_fn is not None else "a multi-view op"
            raise RuntimeError(
                f"Output {self._output_nr} of {name} is a view and is being modified "
                f"inplace. This view is the output of a function that returns multiple "
                f"views. Such functions do not allow the output views to be modified "
                f"inplace. You should replace the inplace operation by an out-of-place one.")
        # recorded: compute out of place from a private copy of the old value
        # (the op may save it for backward), then write the result back
        old = Tensor(data.copy(), self._requires_grad, self.grad_fn, self._output_nr)
        res = fn(old, *[old if a is self else a for a in args])
        _write(data, res._data)
        self._vbox[0] += 1
        if self._base is not None:
            self._rebase_view(res)
        else:
            self._set_history(res.grad_fn, res._output_nr, res._requires_grad)
        return self

    def _inplace_dual(self, fn, args):
        """An in-place op inside a forward-AD level with a tangent among its
        operands: computed out of place with tangents, written back; this
        tensor takes the result's tangent."""
        if fn is None:
            raise NotImplementedError("this in-place assignment cannot carry a forward-AD "
                                      "tangent; compute the result out of place")
        if self._base is not None and _mode.grad_enabled and self._requires_grad:
            raise NotImplementedError(
                "an in-place op on a view of a tensor that requires grad, inside a forward-AD "
                "level, is not supported; compute the result out of place")
        if _mode.grad_enabled and self._requires_grad and self.grad_fn is None:
            raise RuntimeError(
                "a leaf Variable that requires grad is being used in an in-place operation.")
        old = Tensor(self._data.copy(), self._requires_grad, self.grad_fn, self._output_nr)
        if _tangent(self) is not None:
            old._fw = self._fw
        res = fn(old, *[old if a is self else a for a in args])
        _write(self._data, res._data)
        self._vbox[0] += 1
        if _mode.grad_enabled and res._requires_grad:
            self._set_history(res.grad_fn, res._output_nr, True)
        t = _tangent(res)
        if t is not None:
            if t.dtype != self.dtype:
                t = t.to(self.dtype)
            self._fw = (_FW.level, t)
        return self

    def _rebase_view(self, res):
        """An in-place op on a view changed its base: the base's history
        becomes a CopySlices node (old base outside the view, ``res`` inside)
        and the view's history the view chain replayed on the new base."""
        base = self._base
        node = CopySlices(base, self._view_fn, res)
        base._set_history(node, 0, True)
        v = base
        for prim, attrs, rest in self._view_fn:
            v = eager_bind(prim, (v,) + rest, attrs)
        self._set_history(v.grad_fn, v._output_nr, v._requires_grad)

    def add_(self, other, alpha=1):
        from tracegrad import ops
        if alpha != 1:
            other = other * alpha
        return self._inplace(ops.add, other, fast=_fast_ufunc(np.add))

    def sub_(self, other, alpha=1):
        from tracegrad import ops
        if alpha != 1:
            other = other * alpha
        return self._inplace(ops.sub, other, fast=_fast_ufunc(np.subtract))

    def mul_(self, other):
        from tracegrad import ops
        return self._inplace(ops.mul, other, fast=_fast_ufunc(np.multiply))

    def div_(self, other, rounding_mode=None):
        from tracegrad import ops
        if rounding_mode is not None:
            return self._inplace(lambda a, b: ops.div(a, b, rounding_mode=rounding_mode), other)
        return self._inplace(ops.div, other, fast=_fast_ufunc(np.true_divide))

    def pow_(self, other):
        from tracegrad import ops
        return self._inplace(ops.pow, other, fast=_fast_ufunc(np.power))

    def neg_(self):
        from tracegrad import ops
        return self._inplace(ops.neg, fast=_fast_ufunc(np.negative))

    def exp_(self):
        from tracegrad import ops
        return self._inplace(ops.exp, fast=_fast_ufunc(np.exp))

    def clamp_(self, min=None, max=None):
        from tracegrad import ops
        if min is None and max is None:
            raise RuntimeError("torch.clamp: At least one of 'min' or 'max' must not be None")
        clip = getattr(ops, "clip", None) or getattr(ops, "clamp")
        return self._inplace(lambda a: clip(a, min, max),
                             fast=lambda d: np.clip(d, min, max, out=d))

    clip_ = clamp_

    def zero_(self):
        from tracegrad import ops
        return self._inplace(lambda a: ops.where(True, 0.0, a), fast=lambda d: d.fill(0))

    def fill_(self, value):
        from tracegrad import ops
        if isinstance(value, Tensor):
            if value.ndim != 0:
                raise RuntimeError(f"fill_ only supports 0-dimension value tensor but got tensor "
                                   f"with {value.ndim} dimensions.")
            return self._inplace(lambda a, v: ops.where(True, v, a), value,
                                 fast=lambda d, v: d.__setitem__(Ellipsis, v))
        return self._inplace(lambda a: ops.where(True, value, a), fast=lambda d: d.fill(value))

    def copy_(self, src, non_blocking=False):
        from tracegrad import ops
        return self._inplace(lambda a, s: ops.where(True, ops.astype(s, a.dtype), a), src,
                             fast=lambda d, s: np.copyto(d, s, casting="unsafe"))

    def __setitem__(self, idx, value):
        from tracegrad import ops
        idx = _unwrap_index(idx)
        setitem = getattr(ops, "setitem", None)
        if setitem is None:
            if _mode.grad_enabled and (self._requires_grad or (isinstance(value, Tensor)
                                                               and value._requires_grad)):
                raise NotImplementedError(
                    "assigning into a Tensor that takes part in autograd needs the 'setitem' "
                    "primitive, which this build of tracegrad does not have yet")
            fn = None
        else:
            def fn(a, v):
                return setitem(a, idx, v)
        self._inplace(fn, value, fast=lambda d, v: d.__setitem__(idx, v))

    def __iadd__(self, o):
        return self.add_(o)

    def __isub__(self, o):
        return self.sub_(o)

    def __imul__(self, o):
        return self.mul_(o)

    def __itruediv__(self, o):
        return self.div_(o)

    def __ipow__(self, o):
        return self.pow_(o)


def _fast_ufunc(ufunc):
    def run(d, *arrays):
        ufunc(d, *arrays, out=d)
    return run


def _unwrap_index(idx):
    if isinstance(idx, Tensor):
        return idx._data
    if type(idx) is tuple:
        return tuple(i._data if isinstance(i, Tensor) else i for i in idx)
    return idx


def _write(dst, src):
    """dst[...] = src with torch's in-place rules (same shape, castable dtype)."""
    if src.shape != dst.shape:
        try:
            bshape = np.broadcast_shapes(src.shape, dst.shape)
        except ValueError:
            bshape = src.shape
        if bshape != dst.shape:
            raise RuntimeError(f"output with shape {list(dst.shape)} doesn't match the "
                               f"broadcast shape {list(bshape)}")
    if src.dtype != dst.dtype and not np.can_cast(src.dtype, dst.dtype, "same_kind"):
        raise RuntimeError(f"result type {_tname(src.dtype)} can't be cast to the desired output "
                           f"type {_tname(dst.dtype)}")
    try:
        dst[...] = src
    except ValueError as e:
        raise RuntimeError(_inplace_error(e, dst)) from None


def _tname(dt):
    return {"f": "Float", "i": "Long", "u": "Byte", "b": "Bool", "c": "ComplexFloat"}.get(
        np.dtype(dt).kind, str(dt))


def _inplace_error(e, dst, args=()):
    """torch's wording for an in-place op that NumPy refused."""
    msg = str(e)
    if "read-only" in msg:
        return ("this tensor's memory is read-only (it is a broadcast view, e.g. from expand()); "
                "clone() it before writing in place")
    if "Cannot cast" in msg or "casting" in msg:
        res = np.result_type(dst, *[a._data if isinstance(a, Tensor) else a for a in args])
        return (f"result type {_tname(res)} can't be cast to the desired output type "
                f"{_tname(dst.dtype)}")
    if "broadcast" in msg:
        shapes = [np.shape(a._data if isinstance(a, Tensor) else a) for a in args]
        try:
            b = np.broadcast_shapes(dst.shape, *shapes)
        except ValueError:
            return (f"the size of the operands {[list(s) for s in shapes]} does not match the "
                    f"size of the tensor {list(dst.shape)}")
        return f"output with shape {list(dst.shape)} doesn't match the broadcast shape {list(b)}"
    return msg


class CopySlices(Node):
    """Backward of an in-place op on a view: the base's new value is the old
    base outside the view and the op's result inside it."""
    __slots__ = ("view_fn",)

    def __init__(self, base, view_fn, res):
        Node.__init__(self, (_edge_of(base), _edge_of(res)))
        self.view_fn = view_fn

    def name(self):
        return "CopySlices"

    def apply(self, grad_outputs, create_graph):
        from tracegrad import ops
        gb = grad_outputs[0]
        gv = gb
        metas = []
        for prim, attrs, rest in self.view_fn:
            metas.append(Aval(tuple(gv.shape), gv.dtype))
            gv = eager_bind(prim, (gv,) + rest, attrs)
        # V^T V gb: the part of gb inside the view, scattered back
        u = gv
        for (prim, attrs, rest), meta in zip(reversed(self.view_fn), reversed(metas)):
            ins = [meta, *rest]
            u = vjp_apply(prim, attrs, u, None, ins, ins, [True] + [False] * len(rest))[0]
        return [ops.sub(gb, u), gv]


def _rebuild(data, requires_grad):
    return Tensor(data, requires_grad)


def _to_host(a):
    if type(a) is _ndarray:
        return a
    get = getattr(a, "get", None)
    return get() if get is not None else np.asarray(a)


def _device_of(a):
    return device("cuda") if type(a).__module__.startswith("cupy") else _CPU


# --- the eager interpreter -----------------------------------------------------

# The edge of an operand that does not require grad, as torch shows it in
# ``grad_fn.next_functions``.
_NO_EDGE = (None, 0)


def _edge_of(a):
    fn = a.grad_fn
    if fn is not None:
        return (fn, a._output_nr)
    if a._requires_grad:
        return (a._accumulate_node(), 0)
    return _NO_EDGE


def _edges(args):
    """next_functions of a node recorded on ``args``."""
    return tuple(_edge_of(a) if isinstance(a, Tensor) else _NO_EDGE for a in args)


_avals = {}


def _meta(a):
    """Shape and dtype of an operand (an Aval, shared between equal ones);
    Python scalars stay themselves."""
    if isinstance(a, (Tensor, _ndarray)):
        key = (a.shape, a.dtype)
        m = _avals.get(key)
        if m is None:
            if len(_avals) > 4096:
                _avals.clear()
            m = _avals[key] = Aval(a.shape, a.dtype)
        return m
    return a


class PrimNode(Node):
    """Backward node of one primitive application.

    It keeps only what the primitive's vjp rule reads (``save_inputs`` /
    ``save_out``), with the version of each saved tensor, so a later
    in-place change is caught when backward reads it."""
    __slots__ = ("prim", "attrs", "saved", "out_saved", "out_vbox", "out_ver", "in_meta",
                 "freed", "_nout")

    def __init__(self, prim, attrs, args, out_data, next_functions, out_vbox=None):
        # Node.__init__, inlined: this runs once per recorded op
        self.next_functions = next_functions
        self.seq = next(_seq)
        self._pre_hooks = self._post_hooks = self._tensor_pre_hooks = None
        self._metadata = None
        self.output_meta = None
        self.anomaly_trace = None
        if _mode.anomaly:
            import traceback
            self.anomaly_trace = "".join(traceback.format_stack()[:-2])
        self.prim = prim
        self.attrs = attrs
        self.freed = False
        n = prim.n_out
        self._nout = n if type(n) is int else n(**attrs)
        if prim.save_inputs:
            hooks = _graph._saved_hooks.stack
            if hooks:
                pack, unpack = hooks[-1]
                self.saved = [(_Packed(pack(a), unpack), None) if isinstance(a, Tensor)
                              else (a, None) for a in args]
                self.in_meta = [_meta(a) for a in args]
            else:
                self.saved = saved = [(a, a._vbox[0]) if type(a) is Tensor or isinstance(a, Tensor)
                                      else (a, None) for a in args]
                if prim.view:
                    # a view's backward is linear in its operand and reads only
                    # its shape: an in-place change of the base is no error
                    saved[0] = (saved[0][0], None)
                self.in_meta = None  # the saved inputs carry their shapes and dtypes
        else:
            self.saved = None
            meta = []
            for a in args:
                if isinstance(a, Tensor):
                    d = a._data
                    m = _avals.get((d.shape, d.dtype))
                    meta.append(m if m is not None else _meta(d))
                else:
                    meta.append(_meta(a))
            self.in_meta = meta
        if prim.save_out:
            self.out_saved = out_data
            self.out_vbox = out_vbox
            self.out_ver = out_vbox[0] if type(out_vbox) is list else (
                None if out_vbox is None else tuple(v[0] for v in out_vbox))
        else:
            self.out_saved = None
            self.out_vbox = None

    # torch's view of the node (name(), _saved_*, _raw_saved_*): the node
    # takes the subclass named after torch's node the first time someone
    # looks, so type(node).__name__ reads as in torch (torchviz prints it)
    # and recording stays as cheap as before.
    _torch_name = None
    _torch_attrs = None

    def name(self):
        n = type(self)._torch_name
        return n if n is not None else _specialize(self)._torch_name

    # (``_saved_<name>`` and ``_raw_saved_<name>`` are properties, installed
    # below from _SAVED_NAMES: a __getattr__ would slow every attribute read
    # of every node.)
    @property
    def variable(self):
        # only AccumulateGrad has one; asking is how torchviz tells them
        # apart, so this is where a node takes torch's class name before
        # torchviz prints type(node).__name__
        cls = type(self)
        if cls._torch_name is None:
            cls = _specialize(self)
        raise AttributeError(f"'{cls._torch_name}' object has no attribute 'variable'")

    def __dir__(self):
        cls = type(self)
        if cls._torch_name is None:
            cls = _specialize(self)
        names = {n for n in object.__dir__(self)
                 if not n.startswith("_saved_") and not n.startswith("_raw_saved_")}
        for k, spec in cls._torch_attrs.items():
            names.add("_saved_" + k)
            if spec[0] in _TENSOR_SPECS:
                names.add("_raw_saved_" + k)
        return sorted(names)

    def _metas(self):
        """Shape/dtype (or the number itself) of each operand, or None once freed."""
        if self.in_meta is not None:
            return self.in_meta
        if self.saved is None:
            return None
        return [_meta(a) for a, _ in self.saved]

    def num_outputs(self):
        return self._nout

    def release(self):
        # A node that saved nothing can run again (as in torch); one that
        # saved tensors cannot once they are freed.
        if self.saved is not None or self.out_saved is not None:
            if self.in_meta is None and self.prim.name in _NAME_NEEDS_META \
                    and self.saved is not None and type(self)._torch_name is None:
                self.in_meta = self._metas()   # torch's name of the node depends on them
            self.freed = True
            self.saved = None
            self.out_saved = None

    # (no ``saved_tensors``: torch's built-in nodes have none, only custom
    # Functions' do, and torchviz draws a node that has them as a Function's)
    def _inputs(self):
        if self.freed:
            raise RuntimeError(FREED_MSG)
        saved = self.saved
        if saved is None:
            return self.in_meta
        out = []
        for a, v in saved:
            if v is not None and a._vbox[0] != v:
                self._in_modified(a, v)
            out.append(a.unpack() if type(a) is _Packed else a)
        return out

    def _out(self, create_graph):
        if self.freed:
            raise RuntimeError(FREED_MSG)
        o = self.out_saved
        if o is None:
            return None
        if type(o) is _Packed:   # grad_fn._raw_saved_result.register_hooks(...)
            return o.unpack()
        vb = self.out_vbox
        if type(vb) is list:
            if vb[0] != self.out_ver:
                self._out_modified(0, o, vb[0], self.out_ver)
        elif vb is not None:
            for i, (b, v) in enumerate(zip(vb, self.out_ver)):
                if b[0] != v:
                    self._out_modified(i, o[i], b[0], v)
        if isinstance(o, tuple):
            return tuple(Tensor(x, create_graph, self if create_graph else None, i)
                         for i, x in enumerate(o))
        return Tensor(o, create_graph, self if create_graph else None, 0)

    def _out_modified(self, i, arr, now, expected):
        raise RuntimeError(
            f"one of the variables needed for gradient computation has been modified by an "
            f"inplace operation: [tensor of shape {list(arr.shape)} and dtype {arr.dtype}], "
            f"which is output {i} of {self.name()}, is at version {now}; expected version "
            f"{expected} instead. Hint: the backward of {self.prim.name} reads its result; "
            f"compute it out of place or clone() the result before modifying it.")

    def apply(self, grad_outputs, create_graph):
        return self._apply(grad_outputs, create_graph, None)

    def _apply(self, grad_outputs, create_graph, needs):
        """Gradients for the inputs (None where ``needs`` says not needed or
        the input does not require grad), each in its input's shape and dtype."""
        if self.freed:
            raise RuntimeError(FREED_MSG)
        prim = self.prim
        saved = self.saved
        if saved is None:
            inputs = metas = self.in_meta
        else:
            inputs = []
            for a, v in saved:
                if v is not None and a._vbox[0] != v:
                    self._in_modified(a, v)
                inputs.append(a.unpack() if type(a) is _Packed else a)
            metas = self.in_meta or inputs
        if create_graph:
            out = self._out(True) if self.out_saved is not None else None
            g = grad_outputs[0] if self._nout == 1 and prim.n_out == 1 else tuple(grad_outputs)
        else:
            # Nothing is recorded: the rule runs on the plain arrays ("raw
            # mode", where ops on arrays return arrays), skipping all Tensor
            # bookkeeping; only the results are wrapped.
            out = self.out_saved
            if out is not None:  # the in-place check of a saved output
                if type(out) is _Packed:
                    out = _asarray_like(out.unpack())
                vb = self.out_vbox
                if type(vb) is list:
                    if vb[0] != self.out_ver:
                        self._out_modified(0, out, vb[0], self.out_ver)
                elif vb is not None:
                    self._out(False)
            if self._nout == 1 and prim.n_out == 1:
                g = grad_outputs[0]._data
            else:
                g = tuple(None if x is None else x._data for x in grad_outputs)
            if saved is not None:
                inputs = [a._data if type(a) is Tensor else a for a in inputs]
                if metas is not self.in_meta:
                    metas = inputs
        rule = prim.vjp
        attrs = self.attrs
        nfs = self.next_functions
        raw_before = _mode.raw
        _mode.raw = not create_graph
        try:
            if type(rule) is not tuple:
                if rule is None:
                    return vjp_apply(prim, attrs, g, out, inputs, metas, [])  # raises
                cts = list(rule(g, out, *inputs, **attrs))
            else:
                cts = [None] * len(nfs)
                nr = len(rule)
                for i, nf in enumerate(nfs):
                    if nf[0] is None or i >= nr or (needs is not None and not needs[i]):
                        continue
                    r = rule[i]
                    if r is not None:
                        cts[i] = r(g, out, *inputs, **attrs)
            for i, ct in enumerate(cts):
                if ct is None:
                    continue
                if nfs[i][0] is None or (needs is not None and not needs[i]):
                    cts[i] = None
                    continue
                m = metas[i]
                if ct.shape != m.shape or ct.dtype != m.dtype:
                    ct = cts[i] = unbroadcast(ct, tuple(m.shape), m.dtype)
                if not create_graph and type(ct) is not Tensor:
                    cts[i] = Tensor(ct if type(ct) is _ndarray else _asarray_like(ct))
        finally:
            _mode.raw = raw_before
        return cts

    def _in_modified(self, a, v):
        raise RuntimeError(
            f"one of the variables needed for gradient computation has been modified by "
            f"an inplace operation: [tensor of shape {list(a.shape)} and dtype {a.dtype}], "
            f"which is an input of {self.name()}, is at version {a._vbox[0]}; expected "
            f"version {v} instead. Hint: the backward of {self.prim.name} reads this "
            f"value; compute it out of place (e.g. x = x + y instead of x += y) or "
            f"clone() it before modifying it.")


# --- torch's names and saved values of primitive nodes ----------------------------
#
# torch names each backward node after its ATen op (MulBackward0,
# MmBackward0...) and exposes what the node saved as ``_saved_<name>``.
# ``_torch_node`` maps a recorded primitive application to torch's name and
# to where each of those saved values lives in our node:
#   ("in", i)        operand i (a Python number shows as a 0-d tensor)
#   ("in_if", i, j)  operand i, saved only when operand j needs a gradient
#   ("num", i)       operand i as the Python number it is
#   ("out",)         the result
#   ("sizes", i)     operand i's shape;  ("strides", i) its (contiguous) strides
#   ("const", v)     a constant (an attribute torch keeps, e.g. alpha=1)
# A primitive torch has no node for gets ``<Prim>Backward0`` and its saved
# operands as self/other, its saved result as result.

_TENSOR_SPECS = ("in", "in_if", "out")
# Nodes whose torch name depends on their operands' shapes keep those (as
# Avals) when backward frees them.  Only matmul (Mm/Mv/Dot/Bmm): its own
# cost dwarfs this, while pow, as common and cheap, tells PowBackward0 from
# PowBackward1 after freeing by whether the exponent takes a gradient.
_NAME_NEEDS_META = frozenset(("matmul",))


def _is_tensor_meta(m):
    return isinstance(m, Aval)


def _generic_node(node, metas):
    spec = {}
    if node.prim.save_inputs:
        tensors = [i for i, m in enumerate(metas or ()) if _is_tensor_meta(m)]
        for k, i in zip(("self", "other"), tensors[:2]):
            spec[k] = ("in", i)
    if node.prim.save_out and node._nout == 1 and node.prim.n_out == 1:
        spec["result"] = ("out",)
    return node.prim.backward_name, spec


def _matmul_node(node, m):
    ra, rb = len(m[0].shape), len(m[1].shape)
    if ra == 2 and rb == 2:
        return "MmBackward0", {"self": ("in", 0), "mat2": ("in", 1), "self_sym_sizes": ("sizes", 0),
                               "self_sym_strides": ("strides", 0),
                               "mat2_sym_sizes": ("sizes", 1), "mat2_sym_strides": ("strides", 1)}
    if ra == 2 and rb == 1:
        return "MvBackward0", {"self": ("in", 0), "vec": ("in", 1)}
    if ra == 1 and rb == 1:
        return "DotBackward0", {"self": ("in", 0), "tensor": ("in", 1)}
    if ra == 3 and rb == 3:
        return "BmmBackward0", {"self": ("in", 0), "mat2": ("in", 1)}
    return "MatmulBackward0", {"self": ("in", 0), "other": ("in", 1)}


def _pow_node(node, m):
    if m is None:   # freed before anyone looked
        return ("PowBackward1", {"self": ("in", 0), "exponent": ("in", 1), "result": ("out",)}) \
            if node.next_functions[1][0] is not None else \
            ("PowBackward0", {"self": ("in", 0), "exponent": ("num", 1)})
    if _is_tensor_meta(m[1]):
        return "PowBackward1", {"self": ("in", 0), "exponent": ("in", 1), "result": ("out",)}
    if not _is_tensor_meta(m[0]):
        return "PowBackward2", {"self": ("num", 0), "exponent": ("in", 1), "result": ("out",)}
    return "PowBackward0", {"self": ("in", 0), "exponent": ("num", 1)}


def _sum_node(node, m):
    axis, keep = node.attrs["axis"], node.attrs["keepdims"]
    if not keep and tuple(axis) == tuple(range(len(m[0].shape))):
        return "SumBackward0", {"self_sym_sizes": ("sizes", 0)}
    return "SumBackward1", {"dim": ("const", tuple(axis)), "keepdim": ("const", bool(keep)),
                            "self_sym_sizes": ("sizes", 0)}


def _transpose_node(node, m):
    axes = tuple(node.attrs["axes"])
    moved = [i for i, a in enumerate(axes) if a != i]
    if len(moved) == 2:
        return "TransposeBackward0", {"dim0": ("const", moved[0]), "dim1": ("const", moved[1])}
    return "PermuteBackward0", {"dims": ("const", axes)}


def _getitem_node(node, m):
    index = node.attrs["index"]
    kinds = {k[0] for k in index}
    ints = [d for d, k in enumerate(index) if k[0] == "i"]
    if kinds <= {"i", "s"} and ints:
        # x[0], x[:, 0], x[1:, 0], x[0, 1]: torch's last view op is a select
        # (the views before it are part of this one node); its dim counts the
        # dimensions the earlier selects removed
        d = ints[-1]
        return "SelectBackward0", {"dim": ("const", d - (len(ints) - 1)),
                                   "index": ("const", index[d][1]),
                                   "self_sym_sizes": ("sizes", 0)}
    cut = [d for d, k in enumerate(index) if k[0] == "s" and k[1:] != (None, None, None)]
    if kinds <= {"s"} and len(cut) == 1:
        # x[:, 1:]: one slice along one dimension, with torch's saved values
        # (an open end is INT64_MAX, as torch stores it)
        d = cut[0]
        start, stop, step = index[d][1:]
        return "SliceBackward0", {"dim": ("const", d), "start": ("const", start or 0),
                                  "end": ("const", (1 << 63) - 1 if stop is None else stop),
                                  "step": ("const", step or 1), "self_sym_sizes": ("sizes", 0)}
    if kinds <= {"s", "e", "n"}:
        return "SliceBackward0", {"self_sym_sizes": ("sizes", 0)}
    return "IndexBackward0", {"self_sym_sizes": ("sizes", 0)}


_TORCH_NODES = {
    "add": lambda n, m: ("AddBackward0", {"alpha": ("const", 1)}),
    "sub": lambda n, m: ("SubBackward0", {"alpha": ("const", 1)}),
    "mul": lambda n, m: ("MulBackward0", {"other": ("in_if", 1, 0), "self": ("in_if", 0, 1)}),
    "div": lambda n, m: ("DivBackward0", {"other": ("in", 1), "self": ("in_if", 0, 1)}),
    "neg": lambda n, m: ("NegBackward0", {}),
    "exp": lambda n, m: ("ExpBackward0", {"result": ("out",)}),
    "tanh": lambda n, m: ("TanhBackward0", {"result": ("out",)}),
    "sigmoid": lambda n, m: ("SigmoidBackward0", {"result": ("out",)}),
    "sqrt": lambda n, m: ("SqrtBackward0", {"result": ("out",)}),
    "relu": lambda n, m: ("ReluBackward0", {"result": ("out",)}),
    "log": lambda n, m: ("LogBackward0", {"self": ("in", 0)}),
    "sin": lambda n, m: ("SinBackward0", {"self": ("in", 0)}),
    "cos": lambda n, m: ("CosBackward0", {"self": ("in", 0)}),
    "abs": lambda n, m: ("AbsBackward0", {"self": ("in", 0)}),
    "where": lambda n, m: ("WhereBackward0", {"condition": ("in", 0)}),
    "clone": lambda n, m: ("CloneBackward0", {}),
    "astype": lambda n, m: ("ToCopyBackward0", {}),
    "reshape": lambda n, m: ("ViewBackward0", {"self_sym_sizes": ("sizes", 0)}),
    "broadcast_to": lambda n, m: ("ExpandBackward0", {"self_sym_sizes": ("sizes", 0)}),
    "matmul": _matmul_node,
    "pow": _pow_node,
    "sum": _sum_node,
    "transpose": _transpose_node,
    "getitem": _getitem_node,
}

_PRIM_NODE_TYPES = {}   # torch's name -> PrimNode subclass of that name


def _specialize(node):
    """Give ``node`` the PrimNode subclass named as torch names it."""
    metas = node._metas()
    rule = _TORCH_NODES.get(node.prim.name)
    name, spec = None, None
    if rule is not None:   # most rules need no metas (they are gone once freed)
        try:
            name, spec = rule(node, metas)
        except (KeyError, IndexError, AttributeError, TypeError):
            name = None
    if name is None:
        name, spec = _generic_node(node, metas)
    cls = node.__class__ = _node_class(name, spec)
    return cls


def _node_class(name, spec):
    """The PrimNode subclass torch calls ``name``, with ``spec``'s ``_saved_*``."""
    key = (name, tuple(sorted(dict(spec).items())))
    cls = _PRIM_NODE_TYPES.get(key)
    if cls is None:
        cls = _PRIM_NODE_TYPES[key] = type(name, (PrimNode,), {
            "__slots__": (), "_torch_name": name, "_torch_attrs": dict(spec),
            "__module__": PrimNode.__module__,
            "__doc__": f"torch's {name}: a recorded primitive node (see PrimNode)."})
        PRIM_NODE_CLASSES.add(cls)
    return cls


def _name_grad_fn(value, name, spec=()):
    """ops._define.name_grad_fn for eager values: the method that made
    ``value`` names its node as torch would (``x.t()``: TBackward0)."""
    node = value.grad_fn if isinstance(value, Tensor) else None
    if isinstance(node, PrimNode):
        node.__class__ = _node_class(name, spec)
    return value


_define.name_grad_fn = _name_grad_fn


# every name a _saved_ attribute of _TORCH_NODES or _generic_node may have
_SAVED_NAMES = ("self", "other", "result", "exponent", "alpha", "mat2", "vec", "tensor",
                "self_sym_sizes", "self_sym_strides", "mat2_sym_sizes", "mat2_sym_strides",
                "dim", "keepdim", "dim0", "dim1", "dims", "index", "condition",
                "start", "end", "step")


def _saved_property(key, raw):
    attr = ("_raw_saved_" if raw else "_saved_") + key

    def get(self):
        cls = type(self)
        if cls._torch_name is None:
            cls = _specialize(self)
        spec = cls._torch_attrs.get(key)
        if spec is None or (raw and spec[0] not in _TENSOR_SPECS):
            raise AttributeError(f"'{cls._torch_name}' object has no attribute '{attr}'")
        return SavedTensor(self, spec) if raw else _saved_value(self, spec)
    get.__name__ = attr
    return property(get, doc=f"torch's {attr} (when this node has one)")


for _k in _SAVED_NAMES:
    setattr(PrimNode, "_saved_" + _k, _saved_property(_k, False))
    setattr(PrimNode, "_raw_saved_" + _k, _saved_property(_k, True))
del _k

# The engine and replay test ``type(node) in PRIM_NODE_CLASSES``.
PRIM_NODE_CLASSES = {PrimNode}


def _as_tensor_value(a):
    if isinstance(a, Tensor):
        return a
    if type(a) is _Packed:
        return a.unpack()
    return Tensor(np.asarray(a))


def _saved_value(node, spec):
    kind = spec[0]
    if kind == "const":
        return spec[1]
    if kind in ("sizes", "strides"):
        metas = node._metas()
        if metas is None:
            raise RuntimeError(FREED_MSG)
        shape = tuple(metas[spec[1]].shape)
        if kind == "sizes":
            return shape
        strides, acc = [], 1
        for d in reversed(shape):
            strides.append(acc)
            acc *= max(d, 1)
        return tuple(reversed(strides))
    if kind == "in_if" and node.next_functions[spec[2]][0] is None:
        return None
    if node.freed:
        raise RuntimeError(FREED_MSG)
    if kind == "out":
        out = node.out_saved
        if out is None:   # the rule reads only the inputs: the result from them
            inputs = [a._data if isinstance(a, Tensor) else a for a in node._inputs()]
            with np.errstate(all="ignore"):
                out = node.prim.impl(primitives.array_module(*inputs), *inputs, **node.attrs)
        if type(out) is _Packed:
            return out.unpack()
        return Tensor(out)
    if node.saved is None:
        return None
    inputs = node._inputs()   # checks the versions, unpacks hooked ones
    v = inputs[spec[1]]
    if kind == "num":
        return v.item() if isinstance(v, Tensor) else v
    return _as_tensor_value(v)


class SavedTensor:
    """``grad_fn._raw_saved_<name>``: one value a node saved for backward.
    ``register_hooks(pack, unpack)`` packs it now and unpacks it when
    backward reads it (torch.autograd.graph's saved-tensor hooks for one
    tensor)."""
    __slots__ = ("_node", "_spec")

    def __init__(self, node, spec):
        self._node = node
        self._spec = spec

    def register_hooks(self, pack_hook, unpack_hook):
        if not callable(pack_hook) or not callable(unpack_hook):
            raise TypeError(f"register_hooks(): pack_hook and unpack_hook must be callables, "
                            f"got {type(pack_hook).__name__} and {type(unpack_hook).__name__}")
        node, spec = self._node, self._spec
        if node.freed:
            raise RuntimeError(FREED_MSG)
        if spec[0] == "out":
            out = node.out_saved
            if type(out) is _Packed:
                raise RuntimeError(_HOOKS_TWICE)
            if out is None or type(out) is tuple:
                raise RuntimeError("Calling register_hooks on a saved tensor with value None is "
                                   "forbidden")
            node.out_saved = _Packed(pack_hook(Tensor(out)), unpack_hook)
            node.out_vbox = None
            return
        i = spec[1]
        if spec[0] == "in_if" and node.next_functions[spec[2]][0] is None or node.saved is None:
            raise RuntimeError("Calling register_hooks on a saved tensor with value None is "
                               "forbidden")
        a, v = node.saved[i]
        if type(a) is _Packed:
            raise RuntimeError(_HOOKS_TWICE)
        if not isinstance(a, Tensor):
            raise RuntimeError("Calling register_hooks on a saved tensor with value None is "
                               "forbidden")
        if v is not None and a._vbox[0] != v:
            node._in_modified(a, v)
        if node.in_meta is None:
            node.in_meta = node._metas()
        node.saved[i] = (_Packed(pack_hook(a), unpack_hook), None)

    def __repr__(self):
        return f"<SavedTensor of {self._node.name()}>"


_HOOKS_TWICE = ("Calling register_hooks on a saved tensor whose hooks have already been set. "
                "Hint: only one pair of hooks is allowed at a time.")


class _Packed:
    """A saved tensor packed by a saved_tensors_hooks pack hook."""
    __slots__ = ("packed", "unpack_hook")

    def __init__(self, packed, unpack_hook):
        self.packed = packed
        self.unpack_hook = unpack_hook

    def unpack(self):
        return self.unpack_hook(self.packed)


def _view_chain(src, prim, attrs, rest):
    """(base, chain) of a view op's output: the chain of (prim, attrs, other
    operands) that makes the view from its base."""
    if src._base is not None:
        chain = src._view_fn
        # a view of a multi-output view stays one (chain unknown: no in-place)
        return src._base, None if chain is None else chain + ((prim, attrs, rest),)
    return src, ((prim, attrs, rest),)


def _shares_base(out, src):
    """out is a view into src's memory.  NumPy points every view's ``base``
    at the array that owns the memory, so comparing owners is enough (and
    much cheaper than np.may_share_memory)."""
    b = out.base
    if b is None:
        return False
    return b is src or (src.base is not None and b is src.base)


def _asarray_like(x):
    if isinstance(x, Tensor):
        return x._data
    return primitives.array_module(x).asarray(x)


# The backward engine (tracegrad.eager.engine, above this module) installs
# its entry point here when it is imported, as the trace installs its binder.
_engine_backward = None


class NumpyTensor(Tensor):
    """An eager value that speaks NumPy: it records the tape like a Tensor
    (so NumPy code whose control flow depends on values can be
    differentiated: ``tg.grad(f, compile=False)``), while every name whose
    meaning differs between the dialects (``x.std()``, ``x.max(axis)``,
    ``x.size``) means what it means on an ndarray.  Results keep the face."""
    __slots__ = ()
    _face = "numpy"

    def __array__(self, dtype=None, copy=None):
        if self._requires_grad:
            raise TypeError(
                "conversion of a value being differentiated to a NumPy array (np.asarray, "
                "np.array, float indexing): the result would be cut off from the gradient. "
                "Drop the conversion, a tracegrad value already acts as an array.")
        return super().__array__(dtype, copy)

    def __repr__(self):
        return "NumPy-face " + super().__repr__()

    def _copy(self):
        return self.clone()

    def astype(self, dtype, copy=True):
        if not copy and _resolve_dtype(dtype) == self.dtype:
            return self
        return ops_astype(self, dtype)


def eager_bind(prim, args, attrs):
    if _mode.raw:
        # a vjp rule inside a backward without create_graph: plain arrays in,
        # plain arrays out (a Tensor operand takes the full path below)
        xp = np
        for a in args:
            t = type(a)
            if t is Tensor or t is NumpyTensor:
                break
            if t is not _ndarray and t is not float and t is not int and \
                    t.__module__.startswith("cupy"):
                xp = primitives.array_module(a)
        else:
            prof = _prof_state.current
            if prof is None:
                return prim.impl(xp, *args, **attrs)
            ev = prof._begin(prim.name, "op", args)
            out = prim.impl(xp, *args, **attrs)
            prof._end(ev)
            return out
    if prim.n_out == 1 and _prof_state.current is None:
        # The common case in one pass: a single-output primitive on CPU
        # Tensors and numbers, no profiler.  Anything else (CuPy data, lists)
        # takes the general path below.
        arrays = []
        edges = []
        needs_grad = False
        tensors = False
        zero_d = False
        for a in args:
            ta = type(a)
            if ta is Tensor:
                tensors = True
                d = a._data
                if type(d) is not _ndarray:
                    break
                if not d.ndim:
                    zero_d = True
                arrays.append(d)
                if a._requires_grad:
                    needs_grad = True
                    fn = a.grad_fn  # _edge_of, inlined
                    edges.append((fn, a._output_nr) if fn is not None
                                 else (a._accumulate_node(), 0))
                else:
                    edges.append(_NO_EDGE)
            elif ta is float or ta is int or ta is _ndarray or ta is bool:
                arrays.append(a)
                edges.append(_NO_EDGE)
            else:
                break
        else:
            if zero_d and prim.torch_promotes:     # torch's promotion (primitives.py)
                promoted = primitives.torch_promotion(prim, args)
                if promoted is not args:
                    return eager_bind(prim, promoted, attrs)
            try:
                out = prim.impl(np, *arrays, **attrs)
            except (ValueError, TypeError) as e:
                raise type(e)(f"{e} (in tracegrad op '{prim.name}')") from e
            if type(out) is not _ndarray:
                # a NumPy scalar becomes a 0-d array; a CuPy result (to_device)
                # stays on its device
                out = primitives.array_module(out).asarray(out)
            if not tensors:
                return out   # plain arrays in, plain arrays out (tg.exp(ndarray))
            track = needs_grad and _mode.grad_enabled and not prim.nondiff \
                and out.dtype.kind in "fc"
            if prim.view:
                src = args[0]
                if type(src) is Tensor and _shares_base(out, arrays[0]):
                    # a real view (advanced indexing and some reshapes copy
                    # instead): it shares its base's version counter
                    vbox = src._vbox
                    t = Tensor(out, track, PrimNode(prim, attrs, args, out, tuple(edges), vbox)
                               if track else None, 0, vbox)
                    t._base, t._view_fn = _view_chain(src, prim, attrs, args[1:])
                    return t
            if track:
                vbox = [0]
                return Tensor(out, True, PrimNode(prim, attrs, args, out, tuple(edges), vbox),
                              0, vbox)
            return Tensor(out)
    if prim.torch_promotes:     # torch's promotion for torch-face operands (primitives.py)
        promoted = primitives.torch_promotion(prim, args)
        if promoted is not args:
            return eager_bind(prim, promoted, attrs)
    arrays = []
    needs_grad = False
    cls = None     # the first Tensor operand's class: its face carries over
    xp = np
    on_cpu = False  # a Tensor operand in host memory (device check below)
    for a in args:
        if isinstance(a, Tensor):
            if cls is None:
                cls = type(a)
            d = a._data
            if a._requires_grad:
                needs_grad = True
            if type(d) is not _ndarray:
                xp = primitives.array_module(d)
            else:
                on_cpu = True
            arrays.append(d)
        elif type(a) is list or type(a) is tuple:
            raise TypeError(f"{prim.name}: operands must be arrays or scalars, got a {type(a).__name__}")
        else:
            arrays.append(a)
    if on_cpu and xp is not np:  # CUDA device work: no implicit copies between devices
        raise RuntimeError(
            f"Expected all tensors to be on the same device, but found at least two devices, "
            f"cuda and cpu! (in tracegrad op '{prim.name}'); move one with .to(device), "
            f".cuda() or .cpu()")
    prof = _prof_state.current
    if prof is not None:
        ev = prof._begin(prim.name, "op", arrays)
    try:
        out = prim.impl(xp, *arrays, **attrs)
    except (ValueError, TypeError) as e:
        raise type(e)(f"{e} (in tracegrad op '{prim.name}')") from e
    if prof is not None:
        prof._end(ev)
    track = needs_grad and not prim.nondiff and _mode.grad_enabled
    if prim.n_out == 1:
        if type(out) is not _ndarray:  # a CuPy result stays CuPy (to_device to "cuda")
            mod = primitives.array_module(out)
            out = (mod if mod is not np else xp).asarray(out)
        if cls is None:
            return out
        if prim.view:
            src = args[0]
            # a real view (shares memory with its operand; advanced indexing
            # and some reshapes copy instead)
            if isinstance(src, Tensor) and (type(out) is not _ndarray
                                            or _shares_base(out, src._data)):
                vbox = src._vbox
                t = cls(out, False, None, 0, vbox)
                t._base, t._view_fn = _view_chain(src, prim, attrs, tuple(args[1:]))
                if track and out.dtype.kind in "fc":
                    t.grad_fn = PrimNode(prim, attrs, args, out, _edges(args), vbox)
                    t._requires_grad = True
                return t
        if not track or out.dtype.kind not in "fc":
            return cls(out)
        vbox = [0]
        node = PrimNode(prim, attrs, args, out, _edges(args), vbox)
        return cls(out, True, node, 0, vbox)
    outs = tuple(o if type(o) is _ndarray else xp.asarray(o) for o in out)
    if cls is None:
        return outs
    src = args[0] if prim.view else None
    if isinstance(src, Tensor):
        # views of one base (split): they share its version counter, and
        # in-place ops on them are refused (see Tensor._inplace)
        vboxes = tuple(src._vbox for _ in outs)
        base = src._base if src._base is not None else src
        res = tuple(cls(o, False, None, 0, src._vbox) for o in outs)
        for t in res:
            t._base, t._view_fn = base, None
        if track:
            node = PrimNode(prim, attrs, args, outs, _edges(args), vboxes)
            node.output_meta = [(o.shape, o.dtype) for o in outs]
            for i, t in enumerate(res):
                if outs[i].dtype.kind in "fc":
                    t.grad_fn, t._output_nr, t._requires_grad = node, i, True
        return res
    if not track:
        return tuple(cls(o) for o in outs)
    vboxes = tuple([0] for _ in outs)
    node = PrimNode(prim, attrs, args, outs, tuple(
        _edge_of(a) if isinstance(a, Tensor) else _NO_EDGE for a in args), vboxes)
    node.output_meta = [(o.shape, o.dtype) for o in outs]
    return tuple(cls(o, True, node, i, vb) if o.dtype.kind in "fc" else cls(o, False, None, 0, vb)
                 for i, (o, vb) in enumerate(zip(outs, vboxes)))


primitives._eager_bind = eager_bind


# --- constructors ---------------------------------------------------------------

# --- default dtype and device (torch.set_default_dtype / set_default_device) ------

class _Defaults:
    """What the constructors make when told nothing: ``dtype`` for Python
    floats (and for zeros/ones/rand/...), ``device`` for data."""
    dtype = np.dtype(np.float64)   # tracegrad's default (NumPy's); torch's is float32
    device = None                  # None: cpu
    device_stack = []              # outer defaults of open ``with tg.device(...)`` blocks


def set_default_dtype(d):
    """torch.set_default_dtype: the dtype the constructors give Python floats
    (``tg.tensor([1.5])``, ``tg.zeros(3)``, ``tg.rand(2)``, ``tg.arange(0., 1.)``)
    and, paired with it, Python complex numbers (complex64 for float32,
    complex128 for float64).  tracegrad's default is float64 (NumPy's);
    ``tg.set_default_dtype(tg.float32)`` gives torch's.  Only floating
    dtypes are accepted, as in torch."""
    try:
        dt = _resolve_dtype(d)
    except TypeError:
        dt = None
    if dt is None or dt.kind != "f":
        raise TypeError(f"only floating-point types are supported as the default type "
                        f"(float16, float32 or float64), got {d!r}")
    _Defaults.dtype = dt


def get_default_dtype():
    """The dtype Python floats become in the constructors (see set_default_dtype)."""
    return _Defaults.dtype


def set_default_device(dev):
    """torch.set_default_device: where the constructors put new tensors when
    given no ``device=``.  'cpu' (or None) is NumPy; 'cuda' needs CuPy."""
    if dev is None:
        _Defaults.device = None
        return
    d = device(dev)
    if d.type == "cuda":
        _xp_for(d)   # says what to install when CuPy is missing
        _Defaults.device = d
    else:
        _Defaults.device = None


def get_default_device():
    """The device of a tensor made without ``device=`` (torch.get_default_device)."""
    return _Defaults.device if _Defaults.device is not None else _CPU


def _default_float(arr, data):
    """A float64 (complex128) array made from Python numbers takes the
    default dtype (its complex partner), as torch.tensor does; NumPy arrays
    and Tensors keep their own dtype."""
    dt = _Defaults.dtype
    if dt.itemsize == 8 or isinstance(data, (Tensor, _ndarray)) or hasattr(data, "__cuda_array_interface__"):
        return arr
    if arr.dtype == np.float64:
        return arr.astype(dt)
    if arr.dtype == np.complex128:
        return arr.astype(np.complex64 if dt.itemsize == 4 else np.complex128)
    return arr


def _xp_for(dev):
    if dev is None:
        dev = _Defaults.device
        if dev is None:
            return np
    if device(dev).type == "cuda":
        try:
            import cupy
        except ImportError:
            raise RuntimeError("device='cuda' needs CuPy: pip install 'tracegrad[cuda]' on a machine "
                               "with an NVIDIA GPU") from None
        return cupy
    return np


def _make(data, requires_grad):
    t = Tensor(data)
    if requires_grad:
        t.requires_grad_(True)
    return t


def tensor(data, dtype=None, device=None, requires_grad=False, pin_memory=False):
    """A new leaf tensor holding a copy of ``data`` (dtype follows NumPy)."""
    xp = _xp_for(device)
    if isinstance(data, Tensor):
        data = data._data
    dt = _resolve_dtype(dtype)
    if isinstance(data, (list, tuple)) and any(isinstance(d, Tensor) for d in data):
        data = [d._data if isinstance(d, Tensor) else d for d in data]
    arr = xp.array(data, dtype=dt, copy=True)
    if dt is None:
        arr = _default_float(arr, data)
    return _make(arr, requires_grad)


def as_tensor(data, dtype=None, device=None):
    if isinstance(data, Tensor) and dtype is None:
        return data
    xp = _xp_for(device)
    dt = _resolve_dtype(dtype)
    arr = xp.asarray(data._data if isinstance(data, Tensor) else data, dtype=dt)
    return Tensor(arr if dt is not None else _default_float(arr, data))


def from_numpy(a):
    return Tensor(a)


def _shape_args(size):
    if len(size) == 1 and isinstance(size[0], (tuple, list)):
        return tuple(size[0])
    return tuple(size)


def _filled(fill, size, dtype, device, requires_grad):
    xp = _xp_for(device)
    dt = _resolve_dtype(dtype) or _Defaults.dtype
    return _make(fill(xp, _shape_args(size), dt), requires_grad)


def zeros(*size, dtype=None, device=None, requires_grad=False, out=None):
    return _filled(lambda xp, s, d: xp.zeros(s, d), size, dtype, device, requires_grad)


def ones(*size, dtype=None, device=None, requires_grad=False, out=None):
    return _filled(lambda xp, s, d: xp.ones(s, d), size, dtype, device, requires_grad)


def empty(*size, dtype=None, device=None, requires_grad=False, out=None):
    return _filled(lambda xp, s, d: xp.empty(s, d), size, dtype, device, requires_grad)


def full(size, fill_value, dtype=None, device=None, requires_grad=False):
    xp = _xp_for(device)
    dt = _resolve_dtype(dtype)
    if dt is None:
        dt = np.result_type(fill_value)
        if isinstance(fill_value, (float, complex)):   # Python numbers: torch's defaults
            dt = _default_float(np.empty(0, dt), fill_value).dtype
    return _make(xp.full(tuple(size) if not isinstance(size, int) else (size,), fill_value, dt),
                 requires_grad)


def eye(n, m=None, dtype=None, device=None, requires_grad=False):
    xp = _xp_for(device)
    return _make(xp.eye(n, m, dtype=_resolve_dtype(dtype) or _Defaults.dtype), requires_grad)


def _like(fill, t, dtype, device, requires_grad):
    a = t._data if isinstance(t, Tensor) else np.asarray(t)
    dt = _resolve_dtype(dtype) or a.dtype
    xp = primitives.array_module(a) if device is None else _xp_for(device)
    return _make(fill(xp, a.shape, dt), requires_grad)


def zeros_like(t, dtype=None, device=None, requires_grad=False, memory_format=None):
    return _like(lambda xp, s, d: xp.zeros(s, d), t, dtype, device, requires_grad)


def ones_like(t, dtype=None, device=None, requires_grad=False, memory_format=None):
    return _like(lambda xp, s, d: xp.ones(s, d), t, dtype, device, requires_grad)


def empty_like(t, dtype=None, device=None, requires_grad=False, memory_format=None):
    return _like(lambda xp, s, d: xp.empty(s, d), t, dtype, device, requires_grad)


def full_like(t, fill_value, dtype=None, device=None, requires_grad=False, memory_format=None):
    return _like(lambda xp, s, d: xp.full(s, fill_value, d), t, dtype, device, requires_grad)


def arange(start, end=None, step=1, dtype=None, device=None, requires_grad=False):
    xp = _xp_for(device)
    if end is None:
        start, end = 0, start
    dt = _resolve_dtype(dtype)
    if dt is None:
        dt = np.dtype(np.int64) if all(isinstance(v, int) for v in (start, end, step)) else _Defaults.dtype
    return _make(xp.arange(start, end, step, dtype=dt), requires_grad)


def linspace(start, end, steps, dtype=None, device=None, requires_grad=False):
    xp = _xp_for(device)
    return _make(xp.linspace(start, end, steps, dtype=_resolve_dtype(dtype) or _Defaults.dtype),
                 requires_grad)


class _RNG:
    gen = np.random.default_rng()


def manual_seed(seed):
    """Seed the generator behind rand/randn/randint/randperm/normal."""
    _RNG.gen = np.random.default_rng(seed)
    return _RNG.gen


def seed():
    s = int(np.random.SeedSequence().entropy % (2 ** 63))
    manual_seed(s)
    return s


def _not_while_tracing(name):
    """tracegrad's own generator cannot be drawn from by generated code: a
    draw while tracing would be frozen into it, so refuse."""
    if is_tracing():
        raise TypeError(
            f"tg.{name} was called while tracegrad traces a function: the sample would be "
            f"drawn once and frozen into the compiled code. Draw with np.random (for example "
            f"np.random.standard_normal(shape), which compiled code draws afresh on every "
            f"call), pass a np.random.Generator argument, or draw outside and pass the "
            f"sample as an argument.")


def _random(draw, size, dtype, device, requires_grad, name):
    _not_while_tracing(name)
    dt = _resolve_dtype(dtype) or _Defaults.dtype
    arr = draw(_shape_args(size)).astype(dt, copy=False)
    if device is None:
        device = _Defaults.device
    if device is not None and device_type(device) == "cuda":
        arr = _xp_for(device).asarray(arr)
    return _make(arr, requires_grad)


def device_type(dev):
    return device(dev).type


def rand(*size, dtype=None, device=None, requires_grad=False, generator=None):
    return _random(lambda s: _RNG.gen.random(s), size, dtype, device, requires_grad, "rand")


def randn(*size, dtype=None, device=None, requires_grad=False, generator=None):
    return _random(lambda s: _RNG.gen.standard_normal(s), size, dtype, device, requires_grad,
                   "randn")


def rand_like(t, dtype=None, device=None, requires_grad=False):
    return rand(*t.shape, dtype=dtype or t.dtype, device=device, requires_grad=requires_grad)


def randn_like(t, dtype=None, device=None, requires_grad=False):
    return randn(*t.shape, dtype=dtype or t.dtype, device=device, requires_grad=requires_grad)


def randint(low, high=None, size=(), dtype=None, device=None, requires_grad=False):
    _not_while_tracing("randint")
    if high is None:
        low, high = 0, low
    arr = _RNG.gen.integers(low, high, size=tuple(size)).astype(_resolve_dtype(dtype) or np.int64)
    return _make(arr, requires_grad)


def randperm(n, dtype=None, device=None, requires_grad=False):
    _not_while_tracing("randperm")
    return _make(_RNG.gen.permutation(n).astype(_resolve_dtype(dtype) or np.int64), requires_grad)


def normal(mean=0.0, std=1.0, size=(), dtype=None, device=None, requires_grad=False):
    _not_while_tracing("normal")
    arr = _RNG.gen.normal(mean, std, size=tuple(size)).astype(_resolve_dtype(dtype) or _Defaults.dtype)
    return _make(arr, requires_grad)


def is_tensor(x):
    return isinstance(x, Tensor)
