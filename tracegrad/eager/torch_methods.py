"""The torch face's Tensor methods, in one place: the casts and device
moves (``.to``, ``.float()``, ``.cpu()``...), and the in-place ops
(``add_``, ``mul_``, ``clamp_``, ``zero_``, ``fill_``, ``copy_``,
``t[i] = v``, ``+=``...) with what makes them safe on the tape: the version
counter shared with views, the leaf checks, and the ``CopySlices`` node an
in-place op on a view gives its base.

The methods are attached to ``Tensor`` when this module loads (``import
tracegrad`` loads it), as the op modules attach theirs.
"""
from __future__ import annotations

import numpy as np

from tracegrad.eager.device import _ndarray, device
from tracegrad.eager.nodes import LIVE_VIEWS, keep_saved_before_write
from tracegrad.eager.tensor import _FW, Tensor, _edge_of, _tangent
from tracegrad.ops import _define, primitives
from tracegrad.eager.grad_mode import state as _mode
from tracegrad.eager.graph import Node
from tracegrad.ops.base import resolve_dtype as _resolve_dtype, vjp_apply
from tracegrad.ops.primitives import Aval

class TorchMethods:
    """The torch face's Tensor-only methods (attached to Tensor below)."""

    def clone(self, memory_format=None):
        from tracegrad import ops
        return ops.clone(self)

    def contiguous(self, memory_format=None):
        """The tensor itself where it is C-contiguous, else a C-contiguous
        copy, as torch (an in-place op on the copy does not reach self)."""
        data = self._data
        if type(data) is not _ndarray or data.flags.c_contiguous:
            return self
        from tracegrad import ops
        out = ops.clone(self)       # torch records the copy as CloneBackward0 too
        out._data = np.ascontiguousarray(out._data)   # a fresh array: nothing else holds it
        return out

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
        if grad_on and self._face == "numpy":
            # NumPy code writing into its argument: the NumPy face's error
            # (the compiled mode's TraceError says the same), not torch's
            _define.refuse_argument_write(self, "an in-place update (y[...] = v, y += v)",
                                          "compute a new array (y = y + v)")
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
        if self._face == "numpy":
            if self._base is not None and (self._view_fn is None or any(
                    prim.name == "einsum" for prim, _, _ in self._view_fn)):
                raise TypeError(
                    f"an in-place update of an array that shares memory with another in a "
                    f"way tracegrad does not follow (NumPy's view made by np.einsum or "
                    f"np.split){_define._user_line()}In NumPy the update would write through "
                    f"to the other array. Copy first (e = e.copy()) or compute a new array.")
            keep_saved_before_write(self._vbox)   # NumPy code may write what an op read
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
        if self._face == "numpy":    # the op may have saved an operand sharing this memory
            keep_saved_before_write(self._vbox)
        _write(data, res._data)
        self._vbox[0] += 1
        if self._base is not None:
            self._rebase_view(res)
        else:
            self._set_history(res.grad_fn, res._output_nr, res._requires_grad)
        self._refresh_other_views()
        return self

    def _refresh_other_views(self):
        """The base's other views read the updated memory: their histories
        become their view chains replayed on the base's new history (as
        torch regenerates a view's grad_fn after its base changed)."""
        base = self._base if self._base is not None else self
        entry = LIVE_VIEWS.get(id(base))
        if entry is None or entry[0]() is not base:
            return
        for ref in entry[1]:
            v = ref()
            if v is None or v is self or v._view_fn is None:
                continue
            r = _replay(base, v._view_fn)
            v._set_history(r.grad_fn, r._output_nr, r._requires_grad)

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
        v = _replay(base, self._view_fn)
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

    # the other unary in-place ops (sin_, tanh_, relu_, ...) follow the class,
    # from _UNARY_INPLACE

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


def _replay(base, chain):
    """The view ``chain`` applied to ``base`` again (eager values: eager_bind),
    for the history of a view whose base changed."""
    v = base
    for prim, attrs, rest in chain:
        v = primitives.bind(prim, v, *rest, **attrs)
    return v


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
        return ("this tensor's memory is read-only (it is a broadcast view, e.g. from expand(), "
                "or a diagonal() of planes that are not contiguous, which tracegrad returns as "
                "a copy rather than a view); clone() it before writing in place")
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
            gv = primitives.bind(prim, gv, *rest, **attrs)
        # V^T V gb: the part of gb inside the view, scattered back
        u = gv
        for (prim, attrs, rest), meta in zip(reversed(self.view_fn), reversed(metas)):
            ins = [meta, *rest]
            u = vjp_apply(prim, attrs, u, None, ins, ins, [True] + [False] * len(rest))[0]
        return [ops.sub(gb, u), gv]


# torch's unary in-place methods: name_ updates the tensor with name()'s
# result (recorded as torch records them: the op, then the tensor's new
# version); the NumPy ufunc, where there is one, writes into the data when
# nothing is recorded.
_UNARY_INPLACE = {
    "sin": np.sin, "cos": np.cos, "tan": np.tan, "asin": np.arcsin, "acos": np.arccos,
    "atan": np.arctan, "sinh": np.sinh, "cosh": np.cosh, "tanh": np.tanh,
    "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh, "log": np.log,
    "log2": np.log2, "log10": np.log10, "log1p": np.log1p, "expm1": np.expm1,
    "exp2": np.exp2, "sqrt": np.sqrt, "abs": np.abs, "floor": np.floor, "ceil": np.ceil,
    "trunc": np.trunc, "square": np.square, "sign": np.sign, "reciprocal": None,
    "rsqrt": None, "sigmoid": None, "relu": None, "erf": None, "frac": None,
}


def _unary_inplace(name, ufunc):
    def method(self):
        from tracegrad import ops
        op = getattr(ops, name, None)
        if op is None:
            op = getattr(Tensor, name)
        fast = None
        if ufunc is not None and self._data.dtype.kind in "fc":
            fast = _fast_ufunc(ufunc)
        return self._inplace(op, fast=fast)
    method.__name__ = method.__qualname__ = name + "_"
    method.__doc__ = f"``x.{name}_()``: x becomes ``x.{name}()``, in place (torch's)."
    return method


def _install_unary_inplace():
    for name, ufunc in _UNARY_INPLACE.items():
        if hasattr(Tensor, name) and not hasattr(Tensor, name + "_"):
            setattr(Tensor, name + "_", _unary_inplace(name, ufunc))


def _attach():
    """Make TorchMethods' methods Tensor's own (as if written in its body)."""
    for name, value in vars(TorchMethods).items():
        if name not in ("__module__", "__qualname__", "__doc__", "__dict__", "__weakref__"):
            setattr(Tensor, name, value)


_attach()
_install_unary_inplace()
