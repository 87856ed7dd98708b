"""``nn.Sequential``, ``nn.ModuleList``, ``nn.ModuleDict``, ``nn.ParameterList``
and ``nn.ParameterDict`` with torch's indexing, slicing and naming."""
from __future__ import annotations

import operator
from collections import OrderedDict
from itertools import islice

from tracegrad.nn.module import Module, _addindent
from tracegrad.nn.parameter import Parameter

__all__ = ["Sequential", "ModuleList", "ModuleDict", "ParameterList", "ParameterDict"]


def _index(idx, n):
    idx = operator.index(idx)
    if not -n <= idx < n:
        raise IndexError(f"index {idx} is out of range")
    return idx % n


class Sequential(Module):
    """Modules applied in order: ``Sequential(m1, m2)`` or
    ``Sequential(OrderedDict([('a', m1), ('b', m2)]))``."""

    def __init__(self, *args):
        super().__init__()
        if len(args) == 1 and isinstance(args[0], OrderedDict):
            for key, module in args[0].items():
                self.add_module(key, module)
        else:
            for idx, module in enumerate(args):
                self.add_module(str(idx), module)

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return type(self)(OrderedDict(list(self._modules.items())[idx]))
        i = _index(idx, len(self))
        return next(islice(iter(self._modules.values()), i, None))

    def __setitem__(self, idx, module):
        key = list(self._modules)[_index(idx, len(self))]
        setattr(self, key, module)

    def __delitem__(self, idx):
        if isinstance(idx, slice):
            for key in list(self._modules)[idx]:
                delattr(self, key)
        else:
            delattr(self, list(self._modules)[_index(idx, len(self))])
        # torch renumbers the remaining modules
        items = list(self._modules.values())
        self._modules.clear()
        for i, m in enumerate(items):
            self._modules[str(i)] = m

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def __add__(self, other):
        if not isinstance(other, Sequential):
            raise ValueError(f"add operator supports only objects of Sequential class, but "
                             f"{type(other)} is given.")
        return Sequential(*self, *other)

    def append(self, module):
        self.add_module(str(len(self)), module)
        return self

    def extend(self, sequential):
        for m in sequential:
            self.append(m)
        return self

    def insert(self, index, module):
        n = len(self._modules)
        if not -n <= index <= n:
            raise IndexError(f"Index out of range: {index}")
        if index < 0:
            index += n
        items = list(self._modules.values())
        items.insert(index, module)
        self._modules.clear()
        for i, m in enumerate(items):
            self.add_module(str(i), m)
        return self

    def pop(self, key):
        v = self[key]
        del self[key]
        return v

    def forward(self, input):
        for module in self:
            input = module(input)
        return input


class ModuleList(Module):
    """A list of modules, registered (their parameters are the list's)."""

    def __init__(self, modules=None):
        super().__init__()
        if modules is not None:
            self.extend(modules)

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return type(self)(list(self._modules.values())[idx])
        return self._modules[str(_index(idx, len(self)))]

    def __setitem__(self, idx, module):
        setattr(self, str(_index(idx, len(self))), module)

    def __delitem__(self, idx):
        if isinstance(idx, slice):
            for k in range(len(self._modules))[idx]:
                delattr(self, str(k))
        else:
            delattr(self, str(_index(idx, len(self))))
        items = list(self._modules.values())
        self._modules.clear()
        for i, m in enumerate(items):
            self._modules[str(i)] = m

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def __iadd__(self, modules):
        return self.extend(modules)

    def __add__(self, other):
        return ModuleList([*self, *other])

    def append(self, module):
        self.add_module(str(len(self)), module)
        return self

    def extend(self, modules):
        for m in modules:
            self.append(m)
        return self

    def insert(self, index, module):
        items = list(self._modules.values())
        items.insert(index, module)
        self._modules.clear()
        for i, m in enumerate(items):
            self.add_module(str(i), m)

    def pop(self, key):
        v = self[key]
        del self[key]
        return v

    def __repr__(self):
        """torch's: runs of equal modules shown once, as (i-j): n x Module(...)."""
        reprs = [repr(m) for m in self]
        if not reprs:
            return self._get_name() + "()"
        spans, blocks = [[0, 0]], [reprs[0]]
        for i, r in enumerate(reprs[1:], 1):
            if r == blocks[-1]:
                spans[-1][1] += 1
                continue
            spans.append([i, i])
            blocks.append(r)
        lines = []
        for (a, b), block in zip(spans, blocks):
            line = f"({a}): {block}" if a == b else f"({a}-{b}): {b - a + 1} x {block}"
            lines.append(_addindent(line, 2))
        return self._get_name() + "(\n  " + "\n  ".join(lines) + "\n)"

    def forward(self, *args, **kwargs):
        raise NotImplementedError("ModuleList has no forward(): iterate over its modules")


class ModuleDict(Module):
    """A dict of modules, registered, in insertion order."""

    def __init__(self, modules=None):
        super().__init__()
        if modules is not None:
            self.update(modules)

    def __getitem__(self, key):
        return self._modules[key]

    def __setitem__(self, key, module):
        self.add_module(key, module)

    def __delitem__(self, key):
        del self._modules[key]

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules)

    def __contains__(self, key):
        return key in self._modules

    def clear(self):
        self._modules.clear()

    def pop(self, key):
        v = self[key]
        del self[key]
        return v

    def keys(self):
        return self._modules.keys()

    def items(self):
        return self._modules.items()

    def values(self):
        return self._modules.values()

    def update(self, modules):
        items = modules.items() if hasattr(modules, "items") else modules
        for j, kv in enumerate(items):
            if not hasattr(modules, "items") and len(kv) != 2:
                raise ValueError(f"ModuleDict update sequence element #{j} has length "
                                 f"{len(kv)}; 2 is required")
            self[kv[0]] = kv[1]

    def forward(self, *args, **kwargs):
        raise NotImplementedError("ModuleDict has no forward(): index it by name")


class ParameterList(Module):
    """A list of Parameters, registered."""

    def __init__(self, values=None):
        super().__init__()
        self.__dict__["_size"] = 0
        if values is not None:
            self.extend(values)

    def __len__(self):
        return self._size

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return ParameterList([self[i] for i in range(len(self))[idx]])
        return getattr(self, str(_index(idx, len(self))))

    def __setitem__(self, idx, param):
        idx = _index(idx, len(self))
        if not isinstance(param, Parameter):
            param = Parameter(param)
        setattr(self, str(idx), param)

    def __iter__(self):
        return iter(self[i] for i in range(len(self)))

    def append(self, value):
        self.__dict__["_size"] += 1
        self[len(self) - 1] = value
        return self

    def extend(self, values):
        for v in values:
            self.append(v)
        return self

    def extra_repr(self):
        return "\n".join(f"({i}): Parameter containing: [{p.dtype} of size "
                         f"{'x'.join(str(s) for s in p.shape)}]" for i, p in enumerate(self))


class ParameterDict(Module):
    """A dict of Parameters, registered."""

    def __init__(self, parameters=None):
        super().__init__()
        if parameters is not None:
            self.update(parameters)

    def __getitem__(self, key):
        return self._parameters[key]

    def __setitem__(self, key, value):
        if not isinstance(value, Parameter):
            value = Parameter(value)
        self.register_parameter(key, value)

    def __delitem__(self, key):
        del self._parameters[key]

    def __len__(self):
        return len(self._parameters)

    def __iter__(self):
        return iter(self._parameters)

    def __contains__(self, key):
        return key in self._parameters

    def keys(self):
        return self._parameters.keys()

    def items(self):
        return self._parameters.items()

    def values(self):
        return self._parameters.values()

    def update(self, parameters):
        items = parameters.items() if hasattr(parameters, "items") else parameters
        for k, v in items:
            self[k] = v
