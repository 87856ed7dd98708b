"""Activation modules: one per activation of ``tracegrad.nn.functional``,
with torch's constructor arguments and reprs."""
from __future__ import annotations

from tracegrad.eager.factories import empty
from tracegrad.nn import functional as F
from tracegrad.nn import init
from tracegrad.nn.module import Module
from tracegrad.nn.parameter import Parameter

__all__ = ["ReLU", "ReLU6", "LeakyReLU", "ELU", "CELU", "SELU", "GELU", "SiLU", "Mish", "Tanh",
           "Sigmoid", "LogSigmoid", "Softplus", "Softsign", "Tanhshrink", "Hardtanh",
           "Hardswish", "Hardsigmoid", "Hardshrink", "Softshrink", "Threshold", "GLU", "PReLU",
           "Softmax", "LogSoftmax", "Softmin"]


def _inplace(inplace):
    return "inplace=True" if inplace else ""


class _Inplace(Module):
    _fn = None

    def __init__(self, inplace=False):
        super().__init__()
        self.inplace = inplace

    def forward(self, input):
        return type(self)._fn(input, inplace=self.inplace)

    def extra_repr(self):
        return _inplace(self.inplace)


class ReLU(_Inplace):
    _fn = staticmethod(F.relu)


class ReLU6(_Inplace):
    _fn = staticmethod(F.relu6)


class SELU(_Inplace):
    _fn = staticmethod(F.selu)


class SiLU(_Inplace):
    _fn = staticmethod(F.silu)


class Mish(_Inplace):
    _fn = staticmethod(F.mish)


class Hardswish(_Inplace):
    _fn = staticmethod(F.hardswish)


class Hardsigmoid(_Inplace):
    _fn = staticmethod(F.hardsigmoid)


class _NoArgs(Module):
    _fn = None

    def forward(self, input):
        return type(self)._fn(input)


class Tanh(_NoArgs):
    _fn = staticmethod(F.tanh)


class Sigmoid(_NoArgs):
    _fn = staticmethod(F.sigmoid)


class LogSigmoid(_NoArgs):
    _fn = staticmethod(F.logsigmoid)


class Softsign(_NoArgs):
    _fn = staticmethod(F.softsign)


class Tanhshrink(_NoArgs):
    _fn = staticmethod(F.tanhshrink)


class LeakyReLU(Module):
    def __init__(self, negative_slope=0.01, inplace=False):
        super().__init__()
        self.negative_slope = negative_slope
        self.inplace = inplace

    def forward(self, input):
        return F.leaky_relu(input, self.negative_slope, self.inplace)

    def extra_repr(self):
        return f"negative_slope={self.negative_slope}" + (", inplace=True" if self.inplace
                                                          else "")


class ELU(Module):
    def __init__(self, alpha=1.0, inplace=False):
        super().__init__()
        self.alpha = alpha
        self.inplace = inplace

    def forward(self, input):
        return F.elu(input, self.alpha, self.inplace)

    def extra_repr(self):
        return f"alpha={self.alpha}" + (", inplace=True" if self.inplace else "")


class CELU(ELU):
    def forward(self, input):
        return F.celu(input, self.alpha, self.inplace)


class GELU(Module):
    def __init__(self, approximate="none"):
        super().__init__()
        self.approximate = approximate

    def forward(self, input):
        return F.gelu(input, approximate=self.approximate)

    def extra_repr(self):
        return f"approximate={self.approximate!r}"


class Softplus(Module):
    def __init__(self, beta=1.0, threshold=20.0):
        super().__init__()
        self.beta = beta
        self.threshold = threshold

    def forward(self, input):
        return F.softplus(input, self.beta, self.threshold)

    def extra_repr(self):
        return f"beta={self.beta}, threshold={self.threshold}"


class Hardtanh(Module):
    def __init__(self, min_val=-1.0, max_val=1.0, inplace=False):
        super().__init__()
        if max_val <= min_val:
            raise ValueError("max_val must be greater than min_val")
        self.min_val = min_val
        self.max_val = max_val
        self.inplace = inplace

    def forward(self, input):
        return F.hardtanh(input, self.min_val, self.max_val, self.inplace)

    def extra_repr(self):
        return f"min_val={self.min_val}, max_val={self.max_val}" + (
            ", inplace=True" if self.inplace else "")


class Hardshrink(Module):
    def __init__(self, lambd=0.5):
        super().__init__()
        self.lambd = lambd

    def forward(self, input):
        return F.hardshrink(input, self.lambd)

    def extra_repr(self):
        return f"{self.lambd}"


class Softshrink(Hardshrink):
    def forward(self, input):
        return F.softshrink(input, self.lambd)


class Threshold(Module):
    def __init__(self, threshold, value, inplace=False):
        super().__init__()
        self.threshold = threshold
        self.value = value
        self.inplace = inplace

    def forward(self, input):
        return F.threshold(input, self.threshold, self.value, self.inplace)

    def extra_repr(self):
        return f"threshold={self.threshold}, value={self.value}" + (
            ", inplace=True" if self.inplace else "")


class GLU(Module):
    def __init__(self, dim=-1):
        super().__init__()
        self.dim = dim

    def forward(self, input):
        return F.glu(input, self.dim)

    def extra_repr(self):
        return f"dim={self.dim}"


class PReLU(Module):
    """max(0, x) + a min(0, x) with a learnt a (one, or one per channel)."""

    def __init__(self, num_parameters=1, init=0.25, device=None, dtype=None):
        super().__init__()
        self.num_parameters = num_parameters
        self.init = init
        self.weight = Parameter(empty(num_parameters, device=device, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self):
        init.constant_(self.weight, self.init)

    def forward(self, input):
        return F.prelu(input, self.weight)

    def extra_repr(self):
        return f"num_parameters={self.num_parameters}"


class _Dim(Module):
    _fn = None

    def __init__(self, dim=None):
        super().__init__()
        self.dim = dim

    def forward(self, input):
        return type(self)._fn(input, self.dim, _stacklevel=5)

    def extra_repr(self):
        return f"dim={self.dim}"


class Softmax(_Dim):
    _fn = staticmethod(F.softmax)


class LogSoftmax(_Dim):
    _fn = staticmethod(F.log_softmax)


class Softmin(_Dim):
    _fn = staticmethod(F.softmin)
