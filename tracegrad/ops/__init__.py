"""The functional ops: one function per public op, each binding a primitive.

The op modules register their rows in the one registry
(``tracegrad.primitives.REGISTRY``) and attach their functions as Tensor
methods and NumPy overrides.
"""
import sys as _sys

from tracegrad.ops.base import *  # noqa: F401,F403
from tracegrad.ops.base import (unbroadcast, stop_gradient, astype, clone, zeros_like_value,
                                swapaxes, permute, mm, where, sum, reshape, broadcast_to,
                                transpose, matmul, pow, div, sub, mul, add, neg)

for _name in ("elementwise", "reductions", "shape", "indexing", "linalg", "nn", "custom",
              "devices"):
    try:
        _mod = __import__(f"tracegrad.ops.{_name}", fromlist=["*"])
    except ModuleNotFoundError as _e:  # module not written yet
        if _e.name != f"tracegrad.ops.{_name}":
            raise
        continue
    for _k in getattr(_mod, "__all__", [k for k in dir(_mod) if not k.startswith("_")]):
        globals()[_k] = getattr(_mod, _k)

from tracegrad.ops import _define as _define_mod  # noqa: E402

_define_mod._ops = _sys.modules[__name__]
