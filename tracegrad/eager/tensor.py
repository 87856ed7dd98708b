"""The eager value: ``Tensor``, an array with torch.autograd semantics.

Its data, its place on the tape (``grad_fn``, ``requires_grad``, the
accumulated ``grad``, hooks, views and their shared version counter) and
its conversions to NumPy and Python.  The files beside it hold the rest:
``torch_methods`` the torch face's Tensor-only methods (casts, device moves,
in-place ops), ``nodes`` the tape's nodes and saved tensors, ``bind`` the
eager interpreter of one primitive, ``factories`` the constructors.
Operators and the methods both dialects share come from the op layer
(``ArrayMethods``); names whose meaning differs from the faces.
"""
from __future__ import annotations

import sys
import weakref

import numpy as np

from tracegrad.eager.device import _CPU, _Defaults, _device_of, _ndarray, _to_host
from tracegrad.eager import graph as _graph
from tracegrad.eager.graph import AccumulateGrad
from tracegrad.ops._define import ArrayMethods
from tracegrad.ops.base import (astype as ops_astype, clone as _ops_clone,
                                resolve_dtype as _resolve_dtype)

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

    def __getattr__(self, name):
        """Only reached for a name the class does not have (or whose
        descriptor refused): say that tracegrad does not provide it, never
        something of another meaning."""
        if not name.startswith("_") and getattr(type(self), name, None) is not None:
            return object.__getattribute__(self, name)   # the descriptor's own error
        if name.startswith("_"):
            raise AttributeError(f"'{type(self).__name__}' object has no attribute {name!r}")
        if self._face == "torch":
            raise AttributeError(f"tracegrad does not provide torch.Tensor.{name} ('Tensor' "
                                 f"object has no attribute {name!r})")
        raise AttributeError(f"tracegrad does not provide numpy.ndarray.{name} on this value, "
                             f"which speaks NumPy ('{type(self).__name__}' object has no "
                             f"attribute {name!r})")

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


def _rebuild(data, requires_grad):
    return Tensor(data, requires_grad)


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


# The backward engine (tracegrad.eager.engine, above this module) installs
# its entry point here when it is imported, as the trace installs its binder.
_engine_backward = None


class NumpyTensor(Tensor):
    """An eager value that speaks NumPy: it records the tape like a Tensor
    (so NumPy code whose control flow depends on values can be
    differentiated: ``tg.grad(f, compile=False)``), while every name whose
    meaning differs between the dialects (``x.std()``, ``x.max(axis)``,
    ``x.size``) means what it means on an ndarray.  Results keep the face.

    Converting a value that depends on a differentiated input (one that
    requires grad) to a Python number or a plain array (``float(x)``,
    ``x.item()``, ``np.asarray(x)`` in code tracegrad cannot see, a store
    into a plain ndarray) would cut it off from the gradient, so it raises
    a ConversionError naming the line -- unless the result only decides
    control flow (``if float(x) > 0.5:``, ``while x.item() > tol:``)."""
    # _nd: an ndarray for NumPy (created by the function, or a copy); any
    # other 0-d value is what NumPy's ufuncs and reductions return, an
    # immutable NumPy scalar, which `s += 1` rebinds
    __slots__ = ("_nd",)
    _face = "numpy"

    @classmethod
    def created(cls, array):
        """The value of an ndarray the user's function created (np.zeros,
        np.array, ...): an array, also when 0-d."""
        t = cls(array)
        t._nd = True
        return t

    def _rebinds(self):
        return self.ndim == 0 and not getattr(self, "_nd", False) and \
            getattr(self, "_base", None) is None and \
            not (self._requires_grad and self.grad_fn is None)

    def __iadd__(self, o):
        return self + o if self._rebinds() else super().__iadd__(o)

    def __isub__(self, o):
        return self - o if self._rebinds() else super().__isub__(o)

    def __imul__(self, o):
        return self * o if self._rebinds() else super().__imul__(o)

    def __itruediv__(self, o):
        return self / o if self._rebinds() else super().__itruediv__(o)

    def __ipow__(self, o):
        return self ** o if self._rebinds() else super().__ipow__(o)

    def __array__(self, dtype=None, copy=None):
        if self._requires_grad:
            _refuse_conversion(self, "conversion to a NumPy array (np.asarray, np.array, or "
                               "a library converting its input)", sys._getframe(1))
        a = _to_host(self._data)
        if dtype is not None and np.dtype(dtype) != a.dtype:
            return a.astype(dtype)
        return a.copy() if copy else a

    def __float__(self):
        if self._requires_grad:
            _refuse_conversion(self, "float()", sys._getframe(1))
        return float(_to_host(self._data))

    def __int__(self):
        if self._requires_grad:
            _refuse_conversion(self, "int()", sys._getframe(1))
        return int(_to_host(self._data))

    def __complex__(self):
        if self._requires_grad:
            _refuse_conversion(self, "complex()", sys._getframe(1))
        return complex(_to_host(self._data))

    def __index__(self):
        return _to_host(self._data).__index__()

    def __bool__(self):
        # a truth value carries no derivative: always allowed (NumPy's meaning)
        return bool(_to_host(self._data))

    def __format__(self, spec):
        return format(_to_host(self._data), spec)   # text carries no derivative

    def __iter__(self):
        if not self.shape:
            raise TypeError("iteration over a 0-d array")
        return (self[i] for i in range(self.shape[0]))

    def __copy__(self):
        """copy.copy(x): a copy of the values, as of an ndarray, still on the
        tape (a fresh leaf would silently cut the gradient)."""
        return _ops_clone(self)

    def __deepcopy__(self, memo):
        out = _ops_clone(self)
        memo[id(self)] = out
        return out

    def __contains__(self, value):
        """``v in x``: (x == v).any(), as on an ndarray."""
        return bool(_to_host((self == value).any()._data))

    def __divmod__(self, other):
        return np.divmod(self, other)

    def __rdivmod__(self, other):
        return np.divmod(other, self)

    def __array_namespace__(self, *, api_version=None):
        return np

    def item(self, *args):
        """ndarray.item: the element as a Python number (NumPy's meaning,
        ``x.item(i)`` included)."""
        if self._requires_grad:
            _refuse_conversion(self, ".item()", sys._getframe(1))
        return _to_host(self._data).item(*args)

    def tolist(self):
        if self._requires_grad:
            _refuse_conversion(self, ".tolist()", sys._getframe(1))
        return _to_host(self._data).tolist()

    def tobytes(self, order="C"):
        if self._requires_grad:
            _refuse_conversion(self, ".tobytes()", sys._getframe(1))
        return _to_host(self._data).tobytes(order)

    def detach(self):
        """The value outside the graph, still speaking NumPy."""
        return NumpyTensor(self._data, False, None, 0, self._vbox)

    @property
    def data(self):
        return NumpyTensor(self._data)

    def __repr__(self):
        return "NumPy-face " + super().__repr__()

    def _copy(self):
        c = self.clone()
        c._nd = True
        return c

    def astype(self, dtype, order="K", casting="unsafe", subok=True, copy=True):
        if order not in ("K", "A", "C", "F"):
            raise ValueError(f"order must be one of 'C', 'F', 'A', or 'K' (got {order!r})")
        dt = _resolve_dtype(dtype)
        if casting != "unsafe" and not np.can_cast(self.dtype, dt, casting):
            raise TypeError(f"Cannot cast array data from {self.dtype!r} to {np.dtype(dt)!r} "
                            f"according to the rule {casting!r}")
        if not copy and dt == self.dtype:
            return self
        return ops_astype(self, dtype)


class ConversionError(TypeError):
    """A value being differentiated was converted to a Python number or a
    plain array, which would silently cut it off from the gradient."""


# Instructions a conversion's result may pass on its way to a comparison or
# a conditional jump and still only decide control flow.
_LOADS = frozenset({"LOAD_CONST", "LOAD_FAST", "LOAD_NAME", "LOAD_GLOBAL", "LOAD_DEREF",
                    "LOAD_CLOSURE", "LOAD_FAST_CHECK", "LOAD_FAST_LOAD_FAST", "NOP",
                    "EXTENDED_ARG", "CACHE", "TO_BOOL"})
_CALLS = frozenset({"CALL", "PRECALL", "CALL_FUNCTION", "CALL_METHOD", "CALL_FUNCTION_EX",
                    "CALL_KW", "CALL_FUNCTION_KW"})
_CONTROL_CODES = {}


def _instruction_at(instrs, lasti):
    """Index of the instruction executing at ``lasti`` (a call into Python
    code leaves f_lasti on the call's last inline cache entry)."""
    at = None
    for i, ins in enumerate(instrs):
        if ins.offset > lasti:
            break
        at = i
    return at


def _instructions(code):
    import dis
    instrs = _CONTROL_CODES.get(code)
    if instrs is None:
        if len(_CONTROL_CODES) > 256:
            _CONTROL_CODES.clear()
        instrs = _CONTROL_CODES[code] = list(dis.get_instructions(code))
    return instrs


def _storing_into_subscript(frame):
    """Is ``frame`` storing into a subscript (``y[i] = value``) right now?"""
    if frame is None or frame.f_lasti < 0:
        return False
    instrs = _instructions(frame.f_code)
    at = _instruction_at(instrs, frame.f_lasti)
    return at is not None and instrs[at].opname == "STORE_SUBSCR"


def _only_decides_control_flow(frame):
    """Does the call ``frame`` is executing feed its result only to a
    comparison or a conditional jump (``if float(x) > 0.5:``)?  Read
    conservatively from the bytecode: after the call only constants and
    names may be loaded before a COMPARE_OP or a POP_JUMP_IF_*."""
    if frame is None or frame.f_lasti < 0:
        return False
    instrs = _instructions(frame.f_code)
    at = _instruction_at(instrs, frame.f_lasti)
    if at is None or instrs[at].opname not in _CALLS:
        return False   # a store (y[i] = x), an operator...: the value flows on
    if instrs[at].opname == "PRECALL" and at + 1 < len(instrs) and instrs[at + 1].opname == "CALL":
        # Python 3.11 specializes a warm PRECALL of a builtin class (float(x))
        # to make the call itself and skip the CALL: f_lasti is then on PRECALL
        at += 1
    for ins in instrs[at + 1:]:
        if ins.opname == "COMPARE_OP" or ins.opname.startswith("POP_JUMP"):
            return True
        if ins.opname not in _LOADS:
            return False
    return False


def _location(frame):
    """(where, source line) of the conversion: the innermost frame outside
    tracegrad, and the caller's line when that frame is in a library."""
    import linecache
    import os
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    f = frame
    while f is not None and f.f_code.co_filename.startswith(pkg):
        f = f.f_back
    if f is None:
        return "an unknown place", ""

    def describe(g):
        src = linecache.getline(g.f_code.co_filename, g.f_lineno).strip()
        return f"{g.f_code.co_filename}, line {g.f_lineno}, in {g.f_code.co_name}", src

    where, src = describe(f)
    lib = f
    while lib is not None and ("site-packages" in lib.f_code.co_filename
                               or "<frozen" in lib.f_code.co_filename
                               or lib.f_code.co_filename.startswith(pkg)):
        lib = lib.f_back
    if lib is not None and lib is not f:
        uwhere, usrc = describe(lib)
        where = f"{where} (inside a library called from {uwhere}" + \
            (f": {usrc})" if usrc else ")")
    return where, src


def _reaches_a_leaf(t):
    """Does a gradient of ``t`` reach an input (other than through
    tg.stop_gradient, whose results record a node of zero derivative)?"""
    fn = t.grad_fn
    if fn is None:
        return t._requires_grad
    seen, todo = set(), [fn]
    while todo:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, AccumulateGrad):
            return True
        if node.name().startswith("StopGradient"):
            continue
        todo.extend(n for n, _ in node.next_functions)
    return False


def _refuse_conversion(t, what, frame):
    """Raise for a conversion of ``t`` (which requires grad) unless its
    result only decides control flow at ``frame``."""
    if _only_decides_control_flow(frame):
        return
    if not _reaches_a_leaf(t):
        return   # every path back goes through tg.stop_gradient: no gradient wanted
    where, src = _location(frame)
    if _storing_into_subscript(frame):
        what = "item assignment into a plain NumPy array (y[...] = value)"
        fix = ("Build the array from the values instead (np.stack([...]), np.array of "
               "values is a conversion too), or store into an array tracegrad tracks: one "
               "created from the function's values (np.zeros_like(x)), ")
    else:
        fix = ("Use the value itself (a tracegrad value already acts as an array and as a "
               "number in arithmetic, np.* functions and comparisons: write "
               "`if x > 0.5:` rather than `if float(x) > 0.5:` in an expression), ")
    raise ConversionError(
        f"{what} of a value being differentiated at {where}"
        + (f":\n    {src}\n" if src else ". ")
        + f"The value ({t.dtype}{list(t.shape)}) depends on a differentiated input; the "
        f"result would be a plain number or array cut off from the gradient, so the "
        f"derivative would silently miss this dependence. {fix}or convert a value that "
        f"needs no gradient: x.detach() or tg.stop_gradient(x). (A conversion whose result "
        f"only decides control flow, `if float(x) > 0.5:` or `while x.item() > tol:`, "
        f"is allowed.)")


def is_tensor(x):
    return isinstance(x, Tensor)


# --- reflected operators, in torch's order --------------------------------------------
# torch's ``2 * b`` is ``b.__rmul__(2)`` = ``mul(b, 2)``: the node records the
# tensor first and the number's slot as (None, 0), so
# ``(2 * b).grad_fn.next_functions`` is ``((SinBackward0, 0), (None, 0))``
# for ``b = a.sin()``; the same holds for ``2 + b``.  ``2 / b`` is
# ``b.reciprocal() * 2`` (torch/_tensor.py ``__rdiv__``): a MulBackward0 over
# a ReciprocalBackward0, whose numbers are torch's, rounded as torch rounds.
# (Addition and multiplication commute exactly in IEEE arithmetic, so the
# swapped order changes no value.)  The NumPy face keeps NumPy's ``2 / x``.
def _install_reflected():
    from tracegrad.ops.primitives import bind
    from tracegrad.ops.base import add_p, mul_p, reciprocal_p

    def __radd__(self, o):
        return bind(add_p, self, o)

    def __rmul__(self, o):
        return bind(mul_p, self, o)

    numpy_rtruediv = Tensor.__rtruediv__

    def __rtruediv__(self, o):
        if self._face == "torch" and self._data.dtype.kind in "fc" \
                and not isinstance(o, Tensor):
            return bind(mul_p, bind(reciprocal_p, self), o)
        return numpy_rtruediv(self, o)

    Tensor.__radd__ = __radd__
    Tensor.__rmul__ = __rmul__
    Tensor.__rtruediv__ = __rtruediv__


_install_reflected()
