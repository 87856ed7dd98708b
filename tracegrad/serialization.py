"""``torch.save`` / ``torch.load`` for tracegrad's objects: Tensors,
Parameters, state_dicts (a model's or an optimizer's) and any nesting of
dicts, lists, tuples, numbers and strings around them.

The file is a pickle (Tensors pickle as their array and ``requires_grad``),
so ``torch.save(model.state_dict(), path)`` then
``model.load_state_dict(torch.load(path))`` round-trips.  As in torch 2.6
and later, ``load`` reads with ``weights_only=True`` by default: only
Tensors, arrays, dtypes, numbers, strings and the built-in containers are
rebuilt, never an arbitrary object a file names (pass
``weights_only=False`` for a file you trust that holds other objects).
Files written by torch itself (a zip archive) are not read: load them with
torch and hand over ``{k: v.numpy() for k, v in sd.items()}``.
"""
from __future__ import annotations

import codecs
import collections
import io
import os
import pickle

import numpy as np

from tracegrad.eager.tensor import Tensor, _rebuild
from tracegrad.nn.parameter import Parameter, _rebuild_parameter

__all__ = ["save", "load", "DEFAULT_PROTOCOL"]

DEFAULT_PROTOCOL = 2   # torch's

# (module, name) of what a weights-only load may rebuild
_SAFE = {
    ("tracegrad.eager.tensor", "_rebuild"): _rebuild,
    ("tracegrad.nn.parameter", "_rebuild_parameter"): _rebuild_parameter,
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
}
for _mod in ("numpy.core.multiarray", "numpy._core.multiarray"):
    _SAFE[(_mod, "_reconstruct")] = np.ndarray.__reduce__(np.zeros(0))[0]
    _SAFE[(_mod, "scalar")] = np.float64(0).__reduce__()[0]
for _name in ("dtypes.Float64DType", "dtypes.Float32DType", "dtypes.Float16DType",
              "dtypes.Int64DType", "dtypes.Int32DType", "dtypes.Int16DType", "dtypes.Int8DType",
              "dtypes.UInt8DType", "dtypes.BoolDType", "dtypes.Complex64DType",
              "dtypes.Complex128DType"):
    _cls = getattr(np.dtypes, _name.split(".")[1], None)
    if _cls is not None:
        _SAFE[("numpy", _name)] = _cls
        _SAFE[("numpy.dtypes", _name.split(".")[1])] = _cls
_SAFE[("_codecs", "encode")] = codecs.encode   # bytes under protocol 2 (torch allows it too)
_SAFE[("builtins", "set")] = set
_SAFE[("builtins", "frozenset")] = frozenset
_SAFE[("builtins", "complex")] = complex
_SAFE[("builtins", "slice")] = slice


class _WeightsOnly(pickle.Unpickler):
    def find_class(self, module, name):
        got = _SAFE.get((module, name))
        if got is None:
            raise pickle.UnpicklingError(
                f"Weights only load failed: the file names {module}.{name}, which "
                f"weights_only=True does not rebuild (it rebuilds Tensors, arrays, dtypes, "
                f"numbers, strings and the built-in containers). If you trust the file, "
                f"load it with weights_only=False.")
        return got


def _is_path(f):
    return isinstance(f, (str, os.PathLike))


def save(obj, f, pickle_module=pickle, pickle_protocol=DEFAULT_PROTOCOL,
         _use_new_zipfile_serialization=True, _disable_byteorder_record=False):
    """Write ``obj`` to ``f`` (a path or a binary file object)."""
    if _is_path(f):
        with open(f, "wb") as fh:
            pickle_module.dump(obj, fh, protocol=pickle_protocol)
        return
    if not hasattr(f, "write"):
        raise AttributeError(f"torch.save: expected a file name or a binary file object to "
                             f"write to, got {type(f).__name__}")
    pickle_module.dump(obj, f, protocol=pickle_protocol)


def load(f, map_location=None, pickle_module=None, *, weights_only=None, mmap=None,
         **pickle_load_args):
    """Read what ``save`` wrote to ``f`` (a path or a binary file object)."""
    if weights_only is None:
        weights_only = True
    if pickle_module is not None and weights_only:
        raise RuntimeError("Can not safely load weights when explicit pickle_module is "
                           "specified")
    if mmap:
        raise NotImplementedError("torch.load(mmap=True) is not supported by tracegrad: its "
                                  "files are pickles, read whole")
    if _is_path(f):
        with open(f, "rb") as fh:
            data = fh.read()
    elif hasattr(f, "read"):
        data = f.read()
    else:
        raise AttributeError(f"torch.load: expected a file name or a binary file object to "
                             f"read from, got {type(f).__name__}")
    if data[:4] == b"PK\x03\x04":
        raise RuntimeError("torch.load: this file is a zip archive, as torch.save writes; "
                           "tracegrad reads the files tracegrad.save writes (a pickle). Load "
                           "it with torch and pass the arrays: {k: v.numpy() for k, v in "
                           "torch.load(path).items()}")
    stream = io.BytesIO(data)
    if weights_only:
        obj = _WeightsOnly(stream, **pickle_load_args).load()
    else:
        obj = (pickle_module or pickle).load(stream, **pickle_load_args)
    return _mapped(obj, map_location)


def _mapped(obj, where):
    """Every Tensor in ``obj`` moved to ``where`` (None or the CPU: as it is)."""
    if where is None or str(where) == "cpu":
        return obj
    if callable(where) or isinstance(where, dict):
        raise NotImplementedError("torch.load: a map_location function or dict is not "
                                  "supported by tracegrad; give a device (\"cpu\", \"cuda\")")

    def move(v):
        if isinstance(v, Parameter):
            return Parameter(v.to(where), v.requires_grad)
        if isinstance(v, Tensor):
            return v.to(where)
        if isinstance(v, dict):
            out = type(v)() if type(v) in (dict, collections.OrderedDict) else {}
            for k, x in v.items():
                out[k] = move(x)
            return out
        if isinstance(v, list):
            return [move(x) for x in v]
        if isinstance(v, tuple) and not hasattr(v, "_fields"):
            return tuple(move(x) for x in v)
        return v

    return move(obj)
