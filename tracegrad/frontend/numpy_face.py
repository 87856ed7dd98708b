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
from tracegrad.ops._define import face_advice, face_method

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
@face_method(FACE, "flat")
@property
def flat(x):
    """x.flat as a flattened view: x.flat[i] reads element i in C order."""
    return ops.reshape(x, (-1,))


face_method(FACE, "std")(reductions.std)
face_method(FACE, "var")(reductions.var)
face_method(FACE, "max")(reductions.amax)
face_method(FACE, "min")(reductions.amin)
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


@face_method(FACE, "sort")
def sort(x, axis=-1, kind=None, order=None, *, stable=None):
    """ndarray.sort: sorts in place (every name bound to x sees it), None."""
    # sorted from a copy: the update must not overwrite what sort's backward reads
    x._assign(shape.sort(ops.clone(x), axis, kind, order, stable=stable), "x.sort() (in place)",
              "x = np.sort(x)")


for _name, _advice in {
    "dim": "write x.ndim",
    "ndimension": "write x.ndim",
    "numel": "write x.size",
    "t": "write x.T",
    "split": "ndarrays have no split method; write np.split(x, indices_or_sections, axis=0)",
    "cross": "ndarrays have no cross method; write np.cross(a, b, axis=-1)",
}.items():
    face_advice(FACE, _name, _advice)
