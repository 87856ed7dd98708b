"""How the functional ops become methods, operators and NumPy overrides.

``ArrayMethods`` is the base class of both eager ``Tensor`` and tracing
``Tracer``: every method on it calls a functional op, which binds a
primitive, so the same user code runs eagerly and under tracing.

A value speaks one dialect, its face (``value._face``: "numpy" or "torch").
A name that means the same in NumPy and torch (``x.exp()``, ``x.sum(axis)``)
is one method; a name whose meaning differs (``x.std()``, ``x.max(1)``,
``x.size``, ``x.transpose(0, 1)``) is a ``FaceMethod`` that picks the
implementation of the value's face, and a face that has no meaning for it
raises an error naming the dialect and what to write instead.

An op module attaches a function with

* ``@method("exp")``: as ``x.exp()`` on Tensors and tracers, in both faces;
* ``@face_method("numpy", "std")``: as one face's meaning of the name (the
  faces register theirs in ``tracegrad.frontend.numpy_face`` / ``tracegrad.frontend.torch_face``);
* ``@implements(np.exp)``: as the override NumPy dispatches to through
  ``__array_ufunc__`` / ``__array_function__``, so ``np.exp(t)`` works.
"""
from __future__ import annotations

import numpy as np

from tracegrad.ops import dtypes as _dtypes


def _name_grad_fn(value, name, spec=()):
    return name_grad_fn(value, name, spec)   # late-bound: tracegrad.eager.tensor replaces it


# NumPy callable (ufunc or array function) -> tracegrad function
NUMPY_FUNCTIONS: dict = {}
# resolvers of other libraries' ufuncs (SciPy's: tracegrad.ops.scipy_special), ufunc -> fn or None
FOREIGN_UFUNCS: list = []


def _foreign_ufunc(ufunc):
    for resolve in FOREIGN_UFUNCS:
        fn = resolve(ufunc)
        if fn is not None:
            return fn
    return None


def _booleans(sym, *xs):
    """``& | ^ ~`` are logical on booleans (what tracegrad computes); on
    integers they are bitwise, which has no op here: refuse, never a
    silently logical result."""
    for v in xs:
        dt = getattr(v, "dtype", None)
        if dt is not None:
            ok = np.dtype(dt).kind == "b"
        else:
            ok = isinstance(v, (bool, np.bool_))
        if not ok:
            what = f"dtype {np.dtype(dt)}" if dt is not None else type(v).__name__
            raise TypeError(
                f"'{sym}' on a value of {what}: tracegrad computes '{sym}' on booleans only "
                f"(logical and/or/xor/not); the bitwise operation on integers has no "
                f"tracegrad op. Compare to get booleans ((a > 0) {sym if sym != '~' else '&'} "
                f"(b > 0)), or compute the bits outside the function")
    return xs


class ArrayMethods:
    """Operators and torch/NumPy-style methods shared by Tensor and Tracer."""
    __slots__ = ()
    __array_priority__ = 1000  # so ndarray <op> Tensor defers to us

    # Filled by op modules through ``method``; operators below call them.
    def __add__(self, o): return _ops.add(self, o)
    def __radd__(self, o): return _ops.add(o, self)
    def __sub__(self, o): return _ops.sub(self, o)
    def __rsub__(self, o): return _ops.sub(o, self)
    def __mul__(self, o): return _ops.mul(self, o)
    def __rmul__(self, o): return _ops.mul(o, self)
    def __truediv__(self, o): return _ops.div(self, o)
    def __rtruediv__(self, o): return _ops.div(o, self)
    def __pow__(self, o): return _ops.pow(self, o)
    def __rpow__(self, o): return _ops.pow(o, self)
    def __matmul__(self, o): return _ops.matmul(self, o)
    def __rmatmul__(self, o): return _ops.matmul(o, self)
    def __floordiv__(self, o): return _ops.floor_divide(self, o)
    def __rfloordiv__(self, o): return _ops.floor_divide(o, self)
    def __mod__(self, o): return _ops.remainder(self, o)
    def __rmod__(self, o): return _ops.remainder(o, self)
    def __neg__(self): return _ops.neg(self)
    def __pos__(self): return numpy_copy(self)
    def __abs__(self): return _ops.abs(self)
    def __lt__(self, o): return _ops.less(self, o)
    def __le__(self, o): return _ops.less_equal(self, o)
    def __gt__(self, o): return _ops.greater(self, o)
    def __ge__(self, o): return _ops.greater_equal(self, o)
    def __eq__(self, o): return _ops.equal(self, o)
    def __ne__(self, o): return _ops.not_equal(self, o)
    def __and__(self, o): return _ops.logical_and(*_booleans("&", self, o))
    def __rand__(self, o): return _ops.logical_and(*_booleans("&", o, self))
    def __or__(self, o): return _ops.logical_or(*_booleans("|", self, o))
    def __ror__(self, o): return _ops.logical_or(*_booleans("|", o, self))
    def __xor__(self, o): return _ops.logical_xor(*_booleans("^", self, o))
    def __invert__(self): return _ops.logical_not(*_booleans("~", self))
    def __getitem__(self, idx):
        if type(idx) is not slice and type(idx) is not int and hasattr(idx, "_trace"):
            sel = _ops.indexing.masked_selection(self, idx)   # x[traced mask]: lazy
            if sel is not None:
                return sel
        return _ops.getitem(self, idx)
    __hash__ = object.__hash__

    # Attributes both dialects spell and mean alike
    @property
    def ndim(self):
        return len(self.shape)

    @property
    def size_(self):
        n = 1
        for d in self.shape:
            n *= d
        return n

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    @property
    def T(self):
        out = _ops.transpose(self)
        if len(self.shape) == 2:
            out = _name_grad_fn(out, "PermuteBackward0", (("dims", ("const", (1, 0))),))
        return out

    @property
    def mT(self):
        return _ops.swapaxes(self, -1, -2)

    @property
    def itemsize(self):
        return np.dtype(self.dtype).itemsize

    @property
    def nbytes(self):
        return self.size_ * np.dtype(self.dtype).itemsize

    @property
    def real(self):
        return _ops.real(self)

    @property
    def imag(self):
        return _ops.imag(self)

    # NumPy protocols: np.sin(t), np.sum(t, axis=0), ndarray @ t.
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if method != "__call__":
            return _reduce_ufunc(ufunc, method, inputs, kwargs)
        fn = NUMPY_FUNCTIONS.get(ufunc) or _foreign_ufunc(ufunc)
        if fn is None:
            raise NotImplementedError(
                f"tracegrad has no rule for the NumPy ufunc np.{ufunc.__name__}; "
                f"use an op tracegrad supports or wrap it in tg.autograd.Function "
                f"with a hand-written backward")
        with _dtypes.numpy_rules():     # NumPy code: NumPy's promotion, on any value
            return _ufunc_call(ufunc, fn, inputs, kwargs)

    def __array_function__(self, func, types, args, kwargs):
        fn = NUMPY_FUNCTIONS.get(func)
        if fn is None:
            raise NotImplementedError(
                f"tracegrad has no rule for np.{getattr(func, '__name__', func)}; "
                f"use an op tracegrad supports or wrap it in tg.autograd.Function "
                f"with a hand-written backward")
        with _dtypes.numpy_rules():     # NumPy code: NumPy's promotion, on any value
            if kwargs.get("out") is not None:
                return function_out(func, fn, args, kwargs)
            return fn(*args, **kwargs)


def _dtype_of(v):
    if isinstance(v, (bool, int, float, complex)):
        return type(v)          # a Python number: NumPy's weak scalar
    dt = getattr(v, "dtype", None)
    return np.dtype(dt) if dt is not None else np.asarray(v).dtype


def _ufunc_call(ufunc, fn, inputs, kwargs):
    """Call a ufunc's override with NumPy's ufunc keywords honoured or
    refused, never ignored: ``dtype=``, ``signature=`` and ``casting=``
    pick NumPy's loop (``ufunc.resolve_dtypes``, so NumPy's own errors), the
    inputs are cast to it and the outputs to its output dtypes; ``order=``
    and ``subok=`` only choose the memory layout and the array class, which
    tracegrad values do not have; ``out=`` into a tracegrad value is written
    (``_ufunc_out``, with ``where=``), ``where=`` without it is refused."""
    name = ufunc.__name__
    out = kwargs.pop("out", None)
    if out is not None and not (isinstance(out, tuple) and all(o is None for o in out)):
        return _ufunc_out(ufunc, fn, inputs, out, kwargs)
    mask = kwargs.pop("where", True)
    if mask is not True:
        raise TypeError(f"tracegrad does not support np.{name}(..., where=) (an unsupported "
                        f"keyword for a tracegrad value): without out= NumPy leaves the "
                        f"elements where the mask is False uninitialised; write "
                        f"np.where(mask, np.{name}(...), fill) instead")
    kwargs.pop("order", None)
    kwargs.pop("subok", None)
    if ufunc.signature:     # a gufunc (matmul, vecdot)
        for k, default in (("axes", None), ("axis", None), ("keepdims", False)):
            if kwargs.pop(k, default) != default:
                raise TypeError(f"tracegrad does not support np.{name}(..., {k}=) yet; move "
                                f"the core axes last with np.moveaxis (np.matrix_transpose) "
                                f"and call np.{name} without it")
    dtype = kwargs.pop("dtype", None)
    signature = kwargs.pop("signature", None)
    casting = kwargs.pop("casting", None)
    if kwargs:
        raise TypeError(f"np.{name}() got an unexpected keyword argument {next(iter(kwargs))!r}")
    if dtype is None and signature is None and casting is None:
        return fn(*inputs)
    if dtype is not None and signature is not None:
        raise TypeError("cannot specify both 'signature' and 'dtype'")
    if dtype is not None:
        signature = (None,) * ufunc.nin + (np.dtype(dtype),) * ufunc.nout
    elif isinstance(signature, (tuple, list)):
        signature = tuple(None if d is None else np.dtype(d) for d in signature)
    extra = {} if signature is None else {"signature": signature}
    loop = ufunc.resolve_dtypes(tuple(_dtype_of(v) for v in inputs) + (None,) * ufunc.nout,
                                casting=casting or "same_kind", **extra)
    inputs = [v if isinstance(v, (bool, int, float, complex)) or _dtype_of(v) == d
              else _ops.astype(v, d) for v, d in zip(inputs, loop[:ufunc.nin])]
    res = fn(*inputs)
    outs = res if ufunc.nout > 1 else (res,)
    outs = tuple(o if _dtype_of(o) == d else _ops.astype(o, d)
                 for o, d in zip(outs, loop[ufunc.nin:]))
    return outs if ufunc.nout > 1 else outs[0]


# --- out=: NumPy writes the result into an array (issue 24, item 1) ---------------------------
#
# ``np.add(a, b, out=y)``, ``np.exp(x, out=y[1:])``, ``np.sum(x, axis=0, out=y)``:
# where ``y`` is a tracegrad value (an array the function created, or a view
# of one), the result is computed as without out=, cast to y's dtype (NumPy's
# casting rule: 'same_kind' for ufuncs, checked by NumPy itself on stand-ins
# of the operands' shapes and dtypes, so its errors are NumPy's) and written
# with ``y._assign`` (functionalized: every name and view of y sees it);
# ``where=`` keeps y's old values where the mask is False.  The call returns
# y itself.  A plain ndarray cannot hold a traced or recorded value: that is
# an error naming np.copy.

def _is_value(v):
    return hasattr(v, "grad_fn") or hasattr(v, "_trace")


def _stand_in(v):
    """A zero-cost NumPy stand-in of an operand (same shape and dtype)."""
    if _is_value(v):
        return np.broadcast_to(np.zeros((), np.dtype(v.dtype)), tuple(v.shape))
    if isinstance(v, list):
        return [_stand_in(e) for e in v]
    if isinstance(v, tuple):
        return tuple(_stand_in(e) for e in v)
    if isinstance(v, np.ndarray) and type(v) is not np.ndarray:
        return v.view(np.ndarray)      # (a captured array's view that indexes by tracers)
    return v


def _out_stand_in(o):
    if o is None:
        return None
    return np.empty(tuple(o.shape), np.dtype(o.dtype)) if _is_value(o) else o


def _plain_out_error(name, where="out="):
    return TypeError(
        f"np.{name}(..., {where}) names a plain NumPy array, and the result is a traced or "
        f"differentiated tracegrad value, which NumPy would convert and lose (tracegrad "
        f"cannot write into an array it does not track). Make the output an array "
        f"tracegrad tracks: create it in the function (np.zeros/np.empty/np.zeros_like...) "
        f"or copy it first with y = np.copy(y); or assign the result: y = np.{name}(...)")


def _user_line():
    """' at FILE, line N, in F:\n    SOURCE\n' for the innermost frame outside
    tracegrad (an error's location in the user's code), or ': '."""
    import linecache
    import os
    import sys
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    f = sys._getframe(1)
    while f is not None and (f.f_code.co_filename.startswith(pkg)
                             or "<frozen" in f.f_code.co_filename):
        f = f.f_back
    if f is None:
        return ": "
    code = f.f_code
    src = linecache.getline(code.co_filename, f.f_lineno).strip()
    return (f" at {code.co_filename}, line {f.f_lineno}, in {code.co_name}"
            + (f":\n    {src}\n" if src else ". "))


def refuse_argument_write(o, what, instead):
    """Eager (compile=False): ``o`` is a value being differentiated that no
    op made (an argument of the function) or a view of one.  NumPy would
    write into the caller's array; refused as the trace refuses it (the
    compiled mode's TraceError says the same)."""
    if not hasattr(o, "_data"):
        return
    for v in (o, getattr(o, "_base", None)):
        if v is not None and getattr(v, "_requires_grad", False) and v.grad_fn is None:
            raise TypeError(
                f"{what} into an argument of the function (or a view of one), a value being "
                f"differentiated{_user_line()}NumPy would write into the caller's array, and tracegrad "
                f"differentiates at the value it was called with. Write into a copy: "
                f"x = x.copy() (or np.copy(x)) before the update, or {instead}.")


def _write_out(name, o, value, mask=True):
    """Write ``value`` (the result, in the call's dtype) into the tracegrad
    value ``o`` as NumPy's out= does; returns ``o``."""
    refuse_argument_write(o, f"np.{name}(..., out=)", f"y = np.{name}(...)")
    dt = np.dtype(o.dtype)
    if _dtype_of(value) != dt:
        value = _ops.astype(value, dt)
    if mask is not True:   # (an eager o is read from a copy: the write must not change it)
        value = _ops.where(mask, value, _ops.clone(o) if hasattr(o, "_data") else o)
    shape = tuple(o.shape)
    if tuple(getattr(value, "shape", np.shape(value))) != shape:
        value = _ops.broadcast_to(value, shape)
    o._assign(value, f"np.{name}(..., out=)", f"y = np.{name}(...)")
    return o


def _unalias(inputs, outs):
    """Eager operands that share memory with an output are read from a
    copy: the update must not change what the op saved for its backward
    (NumPy reads them before it writes)."""
    datas = [o._data for o in outs if o is not None and hasattr(o, "_data")]
    if not datas:
        return inputs
    res = []
    for v in inputs:
        d = getattr(v, "_data", None)
        if d is not None and hasattr(v, "grad_fn") and \
                any(np.may_share_memory(d, od) for od in datas):
            v = _ops.clone(v)
        res.append(v)
    return res


def _ufunc_out(ufunc, fn, inputs, out, kwargs):
    """``ufunc(*inputs, out=out, **kwargs)`` into tracegrad values."""
    name = ufunc.__name__
    outs = out if isinstance(out, tuple) else (out,)
    mask = kwargs.pop("where", True)
    kw = {k: kwargs[k] for k in ("dtype", "signature", "casting", "order", "subok")
          if k in kwargs}
    if any(o is not None and not _is_value(o) for o in outs):
        raise _plain_out_error(name)
    # NumPy's own checks (entries, shapes, casting, dtype=...) on stand-ins
    with np.errstate(all="ignore"):
        ufunc(*[_stand_in(v) for v in inputs],
              out=tuple(_out_stand_in(o) for o in outs) if isinstance(out, tuple)
              else _out_stand_in(out),
              **({} if mask is True else {"where": _stand_in(mask)}), **kw)
    kwargs = {k: v for k, v in kwargs.items() if k not in ("order", "subok")}
    inputs = _unalias(list(inputs), outs)
    if not any(_is_value(v) for v in inputs):
        # constants written into a tracegrad value: NumPy computes them (into
        # arrays of out's dtype, its loop)
        tmp = tuple(None if o is None else np.zeros(tuple(o.shape), np.dtype(o.dtype))
                    for o in outs)
        with np.errstate(all="ignore"):
            res = ufunc(*[_stand_in(v) for v in inputs], out=tmp, **kwargs)
    else:
        dtype = kwargs.pop("dtype", None)
        signature = kwargs.pop("signature", None)
        casting = kwargs.pop("casting", None)
        if kwargs:
            raise TypeError(f"np.{name}() got an unexpected keyword argument "
                            f"{next(iter(kwargs))!r}")
        if dtype is not None:
            signature = (None,) * ufunc.nin + (np.dtype(dtype),) * ufunc.nout
        elif isinstance(signature, (tuple, list)):
            signature = tuple(None if d is None else np.dtype(d) for d in signature)
        extra = {} if signature is None else {"signature": signature}
        if ufunc.signature:
            loop = None     # a gufunc (matmul): its loop follows the inputs
        else:
            loop = ufunc.resolve_dtypes(
                tuple(_dtype_of(v) for v in inputs)
                + tuple(None if o is None else np.dtype(o.dtype) for o in outs),
                casting=casting or "same_kind", **extra)
        if loop is not None:
            inputs = [v if isinstance(v, (bool, int, float, complex)) or _dtype_of(v) == d
                      else _ops.astype(v, d) for v, d in zip(inputs, loop[:ufunc.nin])]
        res = fn(*inputs)
        if loop is not None:
            rs = res if ufunc.nout > 1 else (res,)
            rs = tuple(r if _dtype_of(r) == d else _ops.astype(r, d)
                       for r, d in zip(rs, loop[ufunc.nin:]))
            res = rs if ufunc.nout > 1 else rs[0]
    rs = res if ufunc.nout > 1 else (res,)
    if mask is not True and any(o is None for o in outs):
        raise TypeError(f"tracegrad does not support np.{name}(..., where=) with an output "
                        f"left to NumPy (out=None): NumPy leaves its elements where the mask "
                        f"is False uninitialised; pass out= for every output")
    got = tuple(r if o is None else _write_out(name, o, r, mask) for r, o in zip(rs, outs))
    return got if ufunc.nout > 1 else got[0]


# Reductions whose result NumPy computes into out= in out's dtype, step by
# step (np.mean: the sum cast to out's dtype, then divided there): honoured
# when out= has the result's dtype.
_STEPWISE = frozenset({"mean", "std", "var", "nanmean", "nanstd", "nanvar", "average",
                       "median", "nanmedian", "quantile", "percentile", "nanquantile",
                       "nanpercentile"})


# ... and those that accumulate with a ufunc in the dtype NumPy's loop picks for out's dtype,
# with the position of their dtype argument
_ACCUMULATES_IN = {"sum": np.add, "nansum": np.add, "cumsum": np.add, "nancumsum": np.add,
                   "prod": np.multiply, "nanprod": np.multiply, "cumprod": np.multiply,
                   "nancumprod": np.multiply, "trace": np.add}
_DTYPE_AT = {"sum": 2, "nansum": 2, "cumsum": 2, "nancumsum": 2, "prod": 2, "nanprod": 2,
             "cumprod": 2, "nancumprod": 2, "trace": 4}


def function_out(func, fn, args, kwargs):
    """``func(*args, out=..., **kwargs)`` (an array function: np.sum,
    np.cumsum, np.clip, np.concatenate...) into a tracegrad value."""
    name = getattr(func, "__name__", "function")
    kwargs = dict(kwargs)
    out = kwargs.pop("out")
    o = out[0] if isinstance(out, tuple) and len(out) == 1 else out
    if not _is_value(o):
        raise _plain_out_error(name)
    # NumPy's own checks (shape, casting) on stand-ins
    stand_ins = _stand_in(tuple(args)), {k: _stand_in(v) for k, v in kwargs.items()}
    with np.errstate(all="ignore"):
        func(*stand_ins[0], out=_out_stand_in(o) if o is out else (_out_stand_in(o),),
             **stand_ins[1])
    ufunc = _ACCUMULATES_IN.get(name)
    if ufunc is not None and kwargs.get("dtype") is None and len(args) <= _DTYPE_AT[name]:
        # NumPy's sum/prod/cumsum... into out= accumulate in the dtype its loop
        # picks for out's dtype (float32 data into a float64 out: in float64)
        with np.errstate(all="ignore"):
            natural = np.asarray(func(*stand_ins[0], **stand_ins[1])).dtype
        loop = ufunc.resolve_dtypes((np.dtype(o.dtype), _dtype_of(args[0]), None),
                                    reduction=True, casting="unsafe")[0]
        if loop != natural:
            kwargs["dtype"] = loop
    res = fn(*_unalias(list(args), (o,)), **kwargs)
    if name in _STEPWISE and np.dtype(o.dtype) != _dtype_of(res):
        raise TypeError(f"tracegrad does not support np.{name}(..., out=) of another dtype "
                        f"({o.dtype}) than the result's ({_dtype_of(res)}): NumPy computes "
                        f"it step by step in out's dtype; write y[...] = np.{name}(...)"
                        f".astype(y.dtype) (or np.{name}(..., dtype=y.dtype, out=y))")
    _write_out(name, o, res)
    return out


def refuse_out(name, out):
    """NumPy writes its result into ``out=``; a traced or recorded value
    cannot be written into an array, so tracegrad refuses it (never ignores it)."""
    if out is not None:
        raise TypeError(f"tracegrad does not support np.{name}(..., out=): a tracegrad value "
                        f"cannot be written into an array; assign the result instead "
                        f"(y = np.{name}(...))")


def _reduce_ufunc(ufunc, method, inputs, kwargs):
    # np.add.reduce(t, axis), np.multiply.accumulate, np.maximum.outer,
    # np.add.reduceat, np.add.at: they live with the NumPy functions
    fn = NUMPY_FUNCTIONS.get(ufunc)
    out = kwargs.get("out")
    if method in ("reduce", "accumulate", "reduceat") and out is not None and \
            not (isinstance(out, tuple) and all(o is None for o in out)):
        return _ufunc_method_out(ufunc, method, inputs, dict(kwargs))
    if method == "outer" and fn is not None and ufunc.nin == 2 and len(inputs) == 2:
        # A[..., None, ...] op B, with the ufunc keywords of a call (_ufunc_call)
        a, b = inputs
        shape = tuple(np.shape(a) if not hasattr(a, "shape") else a.shape) \
            + (1,) * (np.ndim(b) if not hasattr(b, "shape") else len(b.shape))
        a = _ops.reshape(a, shape) if hasattr(a, "_face") else np.reshape(np.asarray(a), shape)
        return _ufunc_call(ufunc, fn, (a, b), dict(kwargs))
    if method in ("accumulate", "reduceat") and inputs and ufunc.nin == 2:
        # NumPy's loop for the dtype (and its error where it has none), on a stand-in
        x = inputs[0]
        nd = len(x.shape) if hasattr(x, "shape") else np.ndim(x)
        stand_in = np.ones((1,) * _builtins_max(nd, 1), _dtype_of(x))
        getattr(ufunc, method)(stand_in, *(([0],) if method == "reduceat" else ()),
                               dtype=kwargs.get("dtype"))
    return _ops.numpy_functions.ufunc_method(ufunc, method, inputs, kwargs)


def _ufunc_method_out(ufunc, method, inputs, kwargs):
    """np.add.reduce(x, axis, out=y), np.multiply.accumulate(x, out=y),
    np.add.reduceat(x, idx, out=y) into a tracegrad value y (as function_out)."""
    name = f"{ufunc.__name__}.{method}"
    out = kwargs.pop("out")
    o = out[0] if isinstance(out, tuple) and len(out) == 1 else out
    if not _is_value(o):
        raise _plain_out_error(name)
    stand_ins = [_stand_in(v) for v in inputs], {k: _stand_in(v) for k, v in kwargs.items()}
    with np.errstate(all="ignore"):
        getattr(ufunc, method)(*stand_ins[0], out=(_out_stand_in(o),), **stand_ins[1])
        if kwargs.get("dtype") is None and inputs:
            # accumulated in the dtype NumPy's loop picks for out's dtype
            natural = np.asarray(getattr(ufunc, method)(*stand_ins[0], **stand_ins[1])).dtype
            loop = ufunc.resolve_dtypes((np.dtype(o.dtype), _dtype_of(inputs[0]), None),
                                        reduction=True, casting="unsafe")[0]
            if loop != natural:
                kwargs["dtype"] = loop
    res = _ops.numpy_functions.ufunc_method(ufunc, method, _unalias(list(inputs), (o,)), kwargs)
    _write_out(name, o, res)
    return o


def _builtins_max(a, b):
    return a if a > b else b


def numpy_copy(x):
    """NumPy's fresh result for an op that leaves the values as they are
    (astype to the same dtype, conj of reals, +x): a value that in-place
    updates of x do not reach.  Values that speak NumPy provide ``_copy``;
    a torch Tensor stays itself, as torch returns it."""
    copy = getattr(x, "_copy", None)
    return x if copy is None else copy()


def method(*names):
    """Attach the decorated op as methods named ``names`` of Tensor and
    Tracer, with the same meaning in both faces."""
    def deco(fn):
        for n in names:
            setattr(ArrayMethods, n, fn)
        return fn
    return deco


_DIALECT = {"numpy": "NumPy (it stands for an ndarray)", "torch": "torch (a Tensor)"}


class FaceMethod:
    """A method or attribute whose meaning differs between NumPy and torch:
    the value's face picks the implementation (a function, or a property)."""
    __slots__ = ("name", "impls", "advice")

    def __init__(self, name):
        self.name = name
        self.impls = {}      # face -> function or property
        self.advice = {}     # face -> what to write there instead

    def __get__(self, obj, cls=None):
        if obj is None:
            return self
        impl = self.impls.get(obj._face)
        if impl is None:
            raise AttributeError(
                f"'{self.name}' means different things in NumPy and torch, and this value "
                f"speaks {_DIALECT[obj._face]}, which has no '{self.name}' of that meaning: "
                f"{self.advice.get(obj._face, 'see the guide, Two dialects')}")
        return impl.__get__(obj, cls)


def _face_entry(name):
    d = ArrayMethods.__dict__.get(name)
    if not isinstance(d, FaceMethod):
        d = FaceMethod(name)
        setattr(ArrayMethods, name, d)
    return d


def face_method(face, *names):
    """Attach the decorated function (or property) as face ``face``'s
    meaning of ``names``; the other face must register its own (or advice)."""
    def deco(fn):
        for n in names:
            _face_entry(n).impls[face] = fn
        return fn
    return deco


def face_advice(face, name, advice):
    """``name`` has no meaning in ``face``: what to write instead."""
    _face_entry(name).advice[face] = advice


def implements(*numpy_funcs):
    """Route the given NumPy ufuncs/functions to the decorated op."""
    def deco(fn):
        for f in numpy_funcs:
            if f is not None:
                NUMPY_FUNCTIONS[f] = fn
        return fn
    return deco


def axis_arg(axis, dim):
    """NumPy says axis, torch says dim: accept both, not both at once."""
    if dim is not None:
        if axis is not None:
            raise TypeError("pass either axis= or dim=, not both")
        axis = dim
    if isinstance(axis, list):
        axis = tuple(axis)
    return axis


def norm_axes(axis, ndim):
    """Normalise an axis spec to a sorted tuple of non-negative ints (None: all)."""
    if axis is None:
        return tuple(range(ndim))
    if isinstance(axis, int) or hasattr(axis, "__index__"):
        axis = (int(axis),)
    out = []
    for a in axis:
        a = int(a)
        if not -ndim <= a < max(ndim, 1):
            raise IndexError(f"axis {a} is out of range for an array of {ndim} dimensions")
        out.append(a % ndim if ndim else 0)
    return tuple(sorted(set(out)))


class _Ops:
    """The functional ops by name, for the operators above and for op modules
    that call one defined in a module loaded after theirs.  tracegrad.ops
    fills it once every op module is loaded (this module imports nothing of
    the package, so there is no cycle)."""

    def __getattr__(self, name):
        raise AttributeError(f"tracegrad.ops has no op {name!r} (or it was used while the op "
                             f"modules were still loading)")


_ops = _Ops()


def name_grad_fn(value, name, spec=()):
    """Give an eager result's backward node torch's name where torch's
    depends on which method made it (``x.t()``: TBackward0, ``x.T``:
    PermuteBackward0, for the same transpose primitive).  ``spec``: the
    node's ``_saved_*`` attributes, as tracegrad.eager.tensor describes them.
    The eager layer (tracegrad.eager.tensor) installs the implementation; on a
    traced value, or before that, nothing happens."""
    return value
