"""``nn.Parameter``: a leaf Tensor that a Module registers as a parameter
when it is assigned as an attribute (torch's meaning)."""
from __future__ import annotations

import numpy as np

from tracegrad.eager.tensor import Tensor
from tracegrad.eager.factories import empty
from tracegrad.eager.grad_mode import state as _mode

__all__ = ["Parameter", "Buffer", "is_parameter"]


class Parameter(Tensor):
    """A Tensor that is a module parameter: ``requires_grad=True`` by default,
    always a leaf, sharing the memory of the data it wraps (as torch's)."""
    __slots__ = ()

    def __new__(cls, data=None, requires_grad=True, *rest):
        if rest:
            # the eager interpreter makes results (views) of the operand's class
            # with Tensor's signature: a view of a Parameter is a plain Tensor
            return Tensor(data, requires_grad, *rest)
        return super().__new__(cls)

    def __init__(self, data=None, requires_grad=True):
        if data is None:
            data = empty(0)
        if isinstance(data, Tensor):
            arr = data._data
        else:
            arr = np.asarray(data)
        super().__init__(arr)
        if requires_grad:
            self.requires_grad_(True)

    def __repr__(self):
        return "Parameter containing:\n" + super().__repr__()

    # The tape's backward without create_graph runs the rules on plain arrays
    # ("raw mode") and unwraps the saved inputs that are exactly Tensors; a
    # Parameter saved as an operand reaches the rule as itself.  There it is
    # its array, as any other input.
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if _mode.raw:
            return getattr(ufunc, method)(*_unwrap(inputs), **_unwrap(kwargs))
        return super().__array_ufunc__(ufunc, method, *inputs, **kwargs)

    def __array_function__(self, func, types, args, kwargs):
        if _mode.raw:
            return func(*_unwrap(args), **_unwrap(kwargs))
        return super().__array_function__(func, types, args, kwargs)

    def __reduce__(self):
        return (_rebuild_parameter, (np.asarray(self), self.requires_grad))

    def __deepcopy__(self, memo):
        if id(self) in memo:
            return memo[id(self)]
        p = Parameter(self._data.copy(), self.requires_grad)
        if self._grad is not None:
            p._grad = Tensor(self._grad._data.copy())
        memo[id(self)] = p
        return p


def _unwrap(v):
    if isinstance(v, Parameter):
        return v._data
    if isinstance(v, (tuple, list)):
        return type(v)(_unwrap(a) for a in v)
    if isinstance(v, dict):
        return {k: _unwrap(a) for k, a in v.items()}
    return v


def _rebuild_parameter(data, requires_grad):
    return Parameter(data, requires_grad)


class Buffer(Tensor):
    """``nn.Buffer(data, persistent=True)``: assigned to a Module attribute it
    registers a buffer (torch 2.5+).  A plain Tensor elsewhere."""
    __slots__ = ("persistent",)

    def __new__(cls, data=None, *rest, persistent=True):
        if rest:
            return Tensor(data, *rest)   # a result of an op on a Buffer is a Tensor
        return super().__new__(cls)

    def __init__(self, data=None, *, persistent=True):
        if data is None:
            data = empty(0)
        super().__init__(data._data if isinstance(data, Tensor) else np.asarray(data))
        self.persistent = persistent


def is_parameter(x):
    return isinstance(x, Parameter)
