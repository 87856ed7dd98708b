"""The NumPy face: ndarray's meaning for the methods and attributes whose
meaning differs between NumPy and torch.

A traced value that stands for an ndarray (or a number) speaks NumPy, and so
do the values computed from it.  Names both dialects mean alike (``x.exp()``,
``x.sum(axis=0)``, ``x.reshape``) are registered once in the op modules;
this module gives the others NumPy's meaning:

==================  ===========================================================
``x.size``          the number of elements (an int, not a method)
``x.flat``          the elements in C order (``x.flat[i]``)
``x.std/var()``     ``ddof=0`` (the population statistic)
``x.max/min()``     the extreme values along ``axis`` (an array, never indices)
``x.repeat(n)``     each element repeated (``axis=None``: of the flattened array)
``x.transpose()``   axes permuted (``*axes``), reversed by default
``x.flatten()``     a copy, flattened in ``order`` ('C' or 'F')
``x.view()``        the same array (``view(dtype)`` of another dtype is an error)
``x.sort()``        sorts in place and returns None
``x.nonzero()``     a tuple of index arrays
``x.squeeze(a)``    an error if axis ``a`` does not have length 1
==================  ===========================================================

Torch's names without a NumPy meaning of the same spelling (``x.dim()``,
``x.numel()``, ``x.split()``...) raise an AttributeError that says what to
write in NumPy.
"""
from __future__ import annotations

import numpy as np

from tracegrad import ops
from tracegrad.ops import indexing, reductions, shape
from tracegrad.ops._define import (ArrayMethods, FaceMethod, face_advice, face_method,
                                   refuse_argument_write)

FACE = "numpy"


@face_method(FACE, "size")
@property
def size(x):
    return x.size_


# NumPy's argument order: x.sum(axis, dtype, out, keepdims), x.argmax(axis, out, keepdims)
for _name, _fn in {"sum": ops.sum, "mean": reductions.mean, "prod": reductions.prod,
                   "amax": reductions.amax, "amin": reductions.amin, "argmax": reductions.argmax,
                   "argmin": reductions.argmin, "all": reductions.all, "any": reductions.any,
                   "nansum": reductions.nansum, "nanmean": reductions.nanmean}.items():
    face_method(FACE, _name)(_fn)


# x.sum(..., out=y) is np.sum(x, ..., out=y) (the functions take the methods' arguments
# in the same order): out= into a tracegrad value is written (tracegrad.ops._define.function_out)
_OUT_POSITION = {"sum": 2, "mean": 2, "prod": 2, "std": 2, "var": 2, "max": 1, "min": 1,
                 "argmax": 1, "argmin": 1, "all": 1, "any": 1, "cumsum": 2, "cumprod": 2,
                 "clip": 2, "round": 1, "trace": 4, "dot": 1, "take": 2}


def _with_out(name, fn):
    npfn = getattr(np, name)
    at = _OUT_POSITION[name]

    def m(x, *args, **kwargs):
        if kwargs.get("out") is not None or (len(args) > at and args[at] is not None):
            return npfn(x, *args, **kwargs)
        return fn(x, *args, **kwargs)
    m.__name__ = name
    m.__doc__ = fn.__doc__
    return m
@face_method(FACE, "flat")
@property
def flat(x):
    """x.flat as a flattened view: x.flat[i] reads element i in C order."""
    return ops.reshape(x, (-1,))


face_method(FACE, "std")(reductions.std)
face_method(FACE, "var")(reductions.var)
face_method(FACE, "max")(reductions.amax)
face_method(FACE, "min")(reductions.amin)
for _name, _fn in {"sum": ops.sum, "mean": reductions.mean, "prod": reductions.prod,
                   "argmax": reductions.argmax, "argmin": reductions.argmin,
                   "all": reductions.all, "any": reductions.any, "std": reductions.std,
                   "var": reductions.var, "max": reductions.amax,
                   "min": reductions.amin}.items():
    face_method(FACE, _name)(_with_out(_name, _fn))
# methods both dialects share: the torch face keeps them as they are
for _name in ("cumsum", "cumprod", "clip", "round", "trace", "dot", "take"):
    _fn = ArrayMethods.__dict__[_name]
    if not isinstance(_fn, FaceMethod):
        face_method("torch", _name)(_fn)
        face_method(FACE, _name)(_with_out(_name, _fn))
face_method(FACE, "repeat")(shape.repeat)
face_method(FACE, "transpose")(ops.transpose)
face_method(FACE, "nonzero")(indexing.nonzero)
face_method(FACE, "squeeze")(shape.squeeze)


@face_method(FACE, "flatten")
def flatten(x, order="C"):
    """ndarray.flatten: always a copy (never the array itself)."""
    return ops.clone(ops.reshape(x, (-1,), order=order))


@face_method(FACE, "view")
def view(x, dtype=None, type=None):
    """ndarray.view(): the same data; reinterpreting its bytes as another
    dtype has no derivative."""
    if type is not None or (dtype is not None and np.dtype(dtype) != np.dtype(x.dtype)):
        raise TypeError(
            f"x.view({dtype!r}) reinterprets the array's bytes as another dtype, which "
            f"tracegrad cannot differentiate or trace; to convert the values write "
            f"x.astype({dtype!r}). (This value speaks NumPy; torch's view(*shape) is "
            f"x.reshape(...) here.)")
    return x


@face_method(FACE, "fill")
def fill(x, value):
    """ndarray.fill: every element becomes ``value`` (cast to x's dtype),
    in place (every name and view bound to x sees it); returns None."""
    refuse_argument_write(x, "x.fill(value)", "x = np.full_like(x, value)")
    np.empty((), np.dtype(x.dtype)).fill(value if not ops.is_value(value) else
                                         np.zeros(tuple(value.shape), value.dtype))
    if ops.is_value(value):
        if value.shape != () and int(np.prod(value.shape)) != 1:
            raise ValueError("setting an array element with a sequence.")
        value = ops.reshape(value, ())
        if np.dtype(value.dtype) != np.dtype(x.dtype):
            value = value.astype(x.dtype)
        new = ops.broadcast_to(value, tuple(x.shape))
    else:
        new = np.full(tuple(x.shape), value, dtype=x.dtype)
    x._assign(new, "x.fill(value) (in place)", "x = np.full_like(x, value)")


@face_method(FACE, "put")
def put(x, indices, values, mode="raise"):
    """ndarray.put: np.put(x, indices, values, mode), in place; None."""
    return np.put(x, indices, values, mode=mode)


face_method(FACE, "argsort")(shape.argsort)   # ndarray.argsort: np.argsort's meaning


@face_method(FACE, "sort")
def sort(x, axis=-1, kind=None, order=None, *, stable=None):
    """ndarray.sort: sorts in place (every name bound to x sees it), None."""
    if axis is None:   # NumPy's method sorts along one axis only
        raise TypeError("'NoneType' object cannot be interpreted as an integer")
    refuse_argument_write(x, "x.sort() (in place)", "x = np.sort(x)")
    # sorted from a copy: the update must not overwrite what sort's backward reads
    x._assign(shape.sort(ops.clone(x), axis, kind, order, stable=stable), "x.sort() (in place)",
              "x = np.sort(x)")


face_advice("torch", "fill", "Tensors have no fill; write t.fill_(value)")
face_advice("torch", "put", "tracegrad has no torch Tensor.put(index, source); write the flat "
            "update with indexing: flat = t.reshape(-1).clone(); flat[index] = source; "
            "t = flat.reshape(t.shape)")

for _name, _advice in {
    "dim": "write x.ndim",
    "ndimension": "write x.ndim",
    "numel": "write x.size",
    "t": "write x.T",
    "split": "ndarrays have no split method; write np.split(x, indices_or_sections, axis=0)",
    "cross": "ndarrays have no cross method; write np.cross(a, b, axis=-1)",
}.items():
    face_advice(FACE, _name, _advice)


# --- the rest of the ndarray surface (issue 24, item 3) ----------------------------------

@face_method(FACE, "copy")
def copy(x, order="C"):
    """ndarray.copy: a new array of the same values, C-ordered by default
    (NumPy's order='C'; np.copy's default is 'K'), which decides whether a
    later reshape of it is a view (x.T.copy().reshape(-1) is)."""
    out = ops.clone(x)
    data = getattr(out, "_data", None)
    if order == "C" and isinstance(data, np.ndarray) and not data.flags.c_contiguous:
        out._data = np.ascontiguousarray(data)   # a fresh array: nothing else holds it
    return out


@face_method(FACE, "searchsorted")
def searchsorted(x, v, side="left", sorter=None):
    return np.searchsorted(x, v, side=side, sorter=sorter)


@face_method(FACE, "argpartition")
def argpartition(x, kth, axis=-1, kind="introselect", order=None):
    return np.argpartition(x, kth, axis=axis, kind=kind, order=order)


@face_method(FACE, "partition")
def partition(x, kth, axis=-1, kind="introselect", order=None):
    """ndarray.partition: partitions in place (every name bound to x sees
    it), returns None."""
    refuse_argument_write(x, "x.partition(kth) (in place)", "x = np.partition(x, kth)")
    x._assign(np.partition(ops.clone(x), kth, axis=axis, kind=kind, order=order),
              "x.partition(kth) (in place)", "x = np.partition(x, kth)")


def _concrete(v, what, instead):
    """The values of ``v`` as a plain array: a NumPy array or a value that
    does not depend on a differentiated or traced input."""
    if isinstance(v, (np.ndarray, np.generic, list, tuple, bool, int)):
        return np.asarray(v)
    if getattr(v, "_face", None) is not None and hasattr(v, "_data") and \
            not getattr(v, "requires_grad", False):
        return np.asarray(v._data)
    raise TypeError(f"{what} needs the values of its argument, and here they are traced "
                    f"or differentiated; {instead}")


@face_method(FACE, "compress")
def compress(x, condition, axis=None, out=None):
    """ndarray.compress: the slices along ``axis`` (of the flattened array
    when None) where ``condition`` is true."""
    if out is not None:
        raise TypeError("x.compress(..., out=...) writes into an array tracegrad does not "
                        "track; use the result: y = x.compress(condition, axis)")
    cond = _concrete(condition, "x.compress(condition) (the result's shape depends on them)",
                     "pass the condition as a NumPy array (an argument not differentiated, "
                     "or static), or write np.where(condition, x, 0) to keep the shape")
    if cond.ndim != 1:
        raise ValueError("condition must be a 1-d array")
    idx = np.flatnonzero(cond)
    if axis is None:
        return ops.take(ops.reshape(x, (-1,)), idx, axis=0)
    return ops.take(x, idx, axis=axis)


@face_method(FACE, "choose")
def choose(x, choices, out=None, mode="raise"):
    """ndarray.choose: ``choices[x[i]][i]`` elementwise (x the index array)."""
    if out is not None:
        raise TypeError("x.choose(..., out=...) writes into an array tracegrad does not "
                        "track; use the result: y = x.choose(choices)")
    if mode not in ("raise", "wrap", "clip"):
        raise ValueError(f"clipmode must be one of 'clip', 'raise', or 'wrap' (got {mode!r})")
    if np.dtype(x.dtype).kind not in "iub":
        raise TypeError(f"Cannot cast array data from dtype('{x.dtype}') to dtype('int64') "
                        f"according to the rule 'safe'")
    n = len(choices)
    if mode == "raise":
        idx = _concrete(x, "x.choose(choices) (mode='raise')",
                        "write x.choose(choices, mode='clip') or mode='wrap', whose results "
                        "do not depend on checking the indices")
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            raise ValueError("invalid entry in choice array")
    elif mode == "wrap":
        x = np.mod(x, n)
    else:
        x = np.clip(x, 0, n - 1)
    arrays = np.broadcast_arrays(x, *choices)
    stacked = np.stack(arrays[1:])
    return np.take_along_axis(stacked, np.expand_dims(arrays[0], 0), axis=0)[0]


@face_method(FACE, "to_device")
def to_device(x, device, /, *, stream=None):
    if stream is not None:
        raise ValueError("The stream argument in to_device() is not supported")
    if device != "cpu":
        raise ValueError(f"Unsupported device {device!r}. Only 'cpu' is accepted.")
    return x


for _name, _advice in {
    "strides": "tracegrad does not reproduce NumPy's memory layout; for a C-contiguous array "
               "the strides follow from x.shape and x.itemsize",
    "base": "tracegrad does not track which array owns the memory; drop the check",
    "flags": "tracegrad does not reproduce NumPy's memory layout or flags; drop the check",
    "ctypes": "a tracegrad value has no C pointer; drop it, or convert a value not "
              "differentiated: np.asarray(x.detach())",
    "setflags": "tracegrad values have no flags to set; drop the call",
    "byteswap": "byte order is not differentiable; convert a value not differentiated: "
                "np.asarray(x.detach()).byteswap()",
    "getfield": "reinterpreting bytes is not differentiable; use x.astype(dtype) or the "
                "value itself",
    "setfield": "reinterpreting bytes is not differentiable; build the new array with "
                "np.where or arithmetic",
    "dump": "pickling is outside the differentiated code: save np.asarray(x.detach()) "
            "after the call",
    "dumps": "pickling is outside the differentiated code: use np.asarray(x.detach()) "
             "after the call",
    "tofile": "writing files is outside the differentiated code: save the function's "
              "result after the call",
    "tobytes": "bytes are not differentiable and a traced value has no bytes; return the "
               "value and call .tobytes() on the result",
    "data": "x.data is an ndarray's raw memory buffer, which a traced value does not have; "
            "use x itself (x.detach() or tg.stop_gradient(x) for a value without gradient)",
}.items():
    face_advice(FACE, _name, _advice)


@face_method(FACE, "__divmod__")
def _divmod(x, other):
    return np.divmod(x, other)


@face_method(FACE, "__rdivmod__")
def _rdivmod(x, other):
    return np.divmod(other, x)


face_advice("torch", "__divmod__", "Tensors have no divmod; write (torch.div(a, b, "
            "rounding_mode='floor'), torch.remainder(a, b))")
face_advice("torch", "__rdivmod__", "Tensors have no divmod; write (torch.div(a, b, "
            "rounding_mode='floor'), torch.remainder(a, b))")
