"""Arrays the user's function creates are values tracegrad follows, so that
writing into them works as in NumPy.

NumPy code builds results by writing into arrays it made itself::

    out = np.zeros(n)
    out[0] = np.max(x)
    for i in range(1, n):
        out[i] = f(out[i - 1], x)

A plain ndarray cannot hold a traced value (NumPy would convert it and lose
it), so while a function is traced, or run eagerly with ``compile=False``,
the creators below return a value tracegrad follows instead: a constant node
of the trace (which stays concrete, usable in ``if`` and as an index, until
a traced value is written into it), or an eager NumPy-face value that does
not require grad.  Only calls made from the user's code are affected (not
NumPy's, SciPy's or tracegrad's own), and only in the thread that traces.

==================================  ===========================================
``np.zeros/ones/empty/full``        a followed array (``empty``: zeros)
``np.zeros_like(a)`` ... of arrays  the same, shaped like ``a``
``np.copy(a)``, ``np.array(a)``     a followed copy (of an ndarray or a value)
``np.array([...traced...])``        the values stacked (plain lists stay plain)
==================================  ===========================================

``np.array`` and ``np.asarray`` of plain data give plain ndarrays, as before:
constants stay cheap.  An array made another way (an argument not traced, a
global, ``ndarray.copy()`` of a plain array) stays plain; writing a traced
value into it is a clear error that names ``np.copy``.
"""
from __future__ import annotations

import contextlib
import threading
import types

import numpy as np

from tracegrad import ops
from tracegrad.frontend import scipy_calls
from tracegrad.ops import indexing

CREATORS = indexing.CREATOR_NAMES
_FOLLOWED_KINDS = "biufc"

_state = threading.local()       # .stack: the makers of the traces/runs in this thread


@contextlib.contextmanager
def following(make):
    """While active in this thread, arrays the user's code creates through
    ``substitute``'s stand-ins are made by ``make(ndarray) -> value`` (the
    innermost ``following`` wins)."""
    stack = getattr(_state, "stack", None)
    if stack is None:
        stack = _state.stack = []
    stack.append(make)
    try:
        yield
    finally:
        stack.pop()


def _creator(name, original):
    def create(*args, **kwargs):
        stack = getattr(_state, "stack", None)
        if not stack:
            return original(*args, **kwargs)
        return _create(name, original, args, kwargs, stack[-1])
    create.__name__ = create.__qualname__ = name
    create.__doc__ = original.__doc__
    create.__wrapped__ = original
    return create


_ORIGINALS = {name: getattr(np, name) for name in CREATORS}
_CREATORS = {name: _creator(name, f) for name, f in _ORIGINALS.items()}
_BY_ORIGINAL = {id(f): _CREATORS[name] for name, f in _ORIGINALS.items()}


class _FollowedNumpy(types.ModuleType):
    """``numpy`` as the traced function sees it: the creators make followed
    arrays, every other name is NumPy's own."""

    def __getattr__(self, name):
        return getattr(np, name)

    def __dir__(self):
        return dir(np)


NUMPY = _FollowedNumpy("numpy", np.__doc__)
NUMPY.__dict__.update(_CREATORS)


def substitute(value):
    """The stand-in the traced function reads for a global or closure value
    (the numpy module, or one of its creators imported by name; a SciPy
    module, function or distribution: tracegrad.frontend.scipy_calls), or None."""
    if value is np:
        return NUMPY
    if callable(value):
        got = _BY_ORIGINAL.get(id(value))
        if got is not None:
            return got
    return scipy_calls.substitute(value)


def _create(name, original, args, kwargs, make):
    obj = args[0] if args else kwargs.get("a", kwargs.get("object"))
    if name in ("array", "asarray", "copy"):
        dtype = kwargs.get("dtype", args[1] if len(args) > 1 and name != "copy" else None)
        if ops.is_value(obj):
            if name == "asarray":
                return obj if dtype is None else obj.astype(dtype, copy=False)
            order = kwargs.get("order", "K")
            c = obj.astype(dtype) if dtype is not None else (
                obj._copy_keeping_layout() if hasattr(obj, "_copy_keeping_layout") and
                order in ("K", "A") else obj._copy())
            return c
        if isinstance(obj, (list, tuple)) and indexing.holds_value(obj):
            v = indexing.stack_values(obj)
            return v if dtype is None else v.astype(dtype)
        if name != "copy":
            return original(*args, **kwargs)       # plain data stays a plain array
    elif name.endswith("_like") and ops.is_value(obj):
        return original(*args, **kwargs)           # NumPy dispatches to tracegrad
    if name in ("empty", "empty_like"):   # zeros: garbage would change the trace's key
        original = _ORIGINALS[name.replace("empty", "zeros")]
    value = original(*args, **kwargs)
    if type(value) is not np.ndarray or value.dtype.kind not in _FOLLOWED_KINDS:
        return value
    return make(value)
