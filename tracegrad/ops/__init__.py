"""The functional ops: one function per public op, each binding a primitive.

The op modules register their rows in the one registry
(``tracegrad.ops.primitives.REGISTRY``) and attach their functions as Tensor
methods and NumPy overrides.  ``tracegrad`` re-exports the names in
``__all__`` (``tg.exp``, ``tg.sum``, ``tg.linalg.inv``...).

The bottom layer: the registry (``primitives``: one row per primitive with
its impl, shape rule, vjp and jvp rules and emitters), the functional ops
and their rules, and the NumPy helpers the rows' impls and the generated
code share (``runtime_numpy``).  Eager mode, tracing and every code
generator read these rows; where an op must reach a higher layer (control
flow traces its bodies), that layer installs a hook (``control.hooks``).

May import: no other folder.
"""
import types as _types

from tracegrad.ops import (_define, base, elementwise, reductions, shape, indexing, linalg, nn,
                           custom, devices, random, numpy_functions, special, control, fft)

__all__ = ["linalg"]
for _mod in (base, elementwise, reductions, shape, indexing, linalg, nn, custom, devices, random,
             numpy_functions, special, control, fft):
    _names = getattr(_mod, "__all__", None)
    if _names is None:  # base: the functions it defines, not what it imports
        _names = [k for k, v in vars(_mod).items() if not k.startswith("_")
                  and callable(v) and not isinstance(v, (type, _types.ModuleType))
                  and getattr(v, "__module__", "").startswith("tracegrad.ops")]
    for _k in _names:
        globals()[_k] = getattr(_mod, _k)
        if _k not in __all__:
            __all__.append(_k)

# every op by name, for the operators and the op modules' late lookups
vars(_define._ops).update((k, v) for k, v in globals().items() if not k.startswith("_"))

# SciPy's functions on tracegrad values (nothing for the tg namespace; SciPy is not imported)
from tracegrad.ops import (scipy_rows, scipy_special, scipy_linalg,  # noqa: E402,F401
                          scipy_more, scipy_stats)
