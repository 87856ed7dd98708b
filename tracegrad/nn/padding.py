"""Padding modules (ConstantPad, ZeroPad, ReflectionPad, ReplicationPad,
CircularPad; 1-d and 2-d) over ``F.pad``, with torch's reprs."""
from __future__ import annotations

from tracegrad.nn import functional as F
from tracegrad.nn.module import Module

__all__ = ["ConstantPad1d", "ConstantPad2d", "ZeroPad1d", "ZeroPad2d", "ReflectionPad1d",
           "ReflectionPad2d", "ReplicationPad1d", "ReplicationPad2d", "CircularPad1d",
           "CircularPad2d"]


def _widths(padding, nd):
    if isinstance(padding, int):
        return (padding,) * (2 * nd)
    padding = tuple(padding)
    if len(padding) != 2 * nd:
        raise ValueError(f"padding must be an int or a {2 * nd}-tuple, got {padding}")
    return padding


class _PadNd(Module):
    _nd = 1
    _mode = "constant"

    def __init__(self, padding):
        super().__init__()
        self.padding = _widths(padding, self._nd)

    def forward(self, input):
        nd = len(input.shape)
        if nd not in (self._nd + 1, self._nd + 2):
            raise ValueError(f"{type(self).__name__}: expected {self._nd + 1}D or "
                             f"{self._nd + 2}D input (got {nd}D input)")
        return F.pad(input, self.padding, self._mode)

    def extra_repr(self):
        return f"{self.padding}"


class _ConstantPadNd(_PadNd):
    def __init__(self, padding, value):
        super().__init__(padding)
        self.value = value

    def forward(self, input):
        return F.pad(input, self.padding, "constant", self.value)

    def extra_repr(self):
        return f"padding={self.padding}, value={self.value}"


class ConstantPad1d(_ConstantPadNd):
    _nd = 1


class ConstantPad2d(_ConstantPadNd):
    _nd = 2


class ZeroPad1d(ConstantPad1d):
    def __init__(self, padding):
        super().__init__(padding, 0.0)

    def extra_repr(self):
        return f"{self.padding}"


class ZeroPad2d(ConstantPad2d):
    def __init__(self, padding):
        super().__init__(padding, 0.0)

    def extra_repr(self):
        return f"{self.padding}"


class ReflectionPad1d(_PadNd):
    _nd, _mode = 1, "reflect"


class ReflectionPad2d(_PadNd):
    _nd, _mode = 2, "reflect"


class ReplicationPad1d(_PadNd):
    _nd, _mode = 1, "replicate"


class ReplicationPad2d(_PadNd):
    _nd, _mode = 2, "replicate"


class CircularPad1d(_PadNd):
    _nd, _mode = 1, "circular"


class CircularPad2d(_PadNd):
    _nd, _mode = 2, "circular"
