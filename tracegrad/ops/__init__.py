"""The functional ops: one function per public op, each binding a primitive.

The op modules register their rows in the one registry
(``tracegrad.primitives.REGISTRY``) and attach their functions as Tensor
methods and NumPy overrides.  ``tracegrad`` re-exports the names in
``__all__`` (``tg.exp``, ``tg.sum``, ``tg.linalg.inv``...).
"""
import types as _types

from tracegrad.ops import (_define, base, elementwise, reductions, shape, indexing, linalg, nn,
                           custom, devices, random, numpy_functions, special, control)

__all__ = ["linalg"]
for _mod in (base, elementwise, reductions, shape, indexing, linalg, nn, custom, devices, random,
             numpy_functions, special, control):
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
