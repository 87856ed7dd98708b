"""``autograd.builtins``: ``tuple``, ``list``, ``dict``, ``isinstance``, ``type``.

autograd needs its own containers because a plain ``tuple`` cannot hold its
boxes on the tape; tracegrad differentiates through Python's containers as
they are (a gradient has the structure of its argument), so ``tuple``,
``list`` and ``dict`` here are Python's own: ``tuple((x, y))``,
``list(xs)``, ``dict(a=x)``, and ``isinstance(v, tuple)`` behave as in
autograd.

autograd's ``isinstance`` and ``type`` look through a box at the value it
holds.  Here they look through a tracegrad value (traced or recorded for a
gradient) at the array it stands for: ``type(v)`` is ``numpy.ndarray`` and
``isinstance(v, np.ndarray)`` is True; anything else is Python's answer.
"""
import builtins as _builtins

import numpy as _np

from tracegrad.ops.base import is_value as _is_value

tuple = _builtins.tuple
list = _builtins.list
dict = _builtins.dict
isinstance_ = _builtins.isinstance
type_ = _builtins.type
tuple_, list_, dict_ = _builtins.tuple, _builtins.list, _builtins.dict


def isinstance(obj, classinfo):  # noqa: A001 (autograd's name)
    """Python's isinstance, with a tracegrad value taken for the ndarray it stands for."""
    if _builtins.isinstance(obj, classinfo):
        return True
    if _is_value(obj):
        classes = classinfo if _builtins.isinstance(classinfo, _builtins.tuple) else (classinfo,)
        return any(_builtins.isinstance(c, _builtins.type) and issubclass(_np.ndarray, c)
                   for c in classes)
    return False


def type(obj):  # noqa: A001 (autograd's name)
    """Python's type, with a tracegrad value's type taken as numpy.ndarray."""
    return _np.ndarray if _is_value(obj) else _builtins.type(obj)


__all__ = ["tuple", "list", "dict", "isinstance", "type"]
