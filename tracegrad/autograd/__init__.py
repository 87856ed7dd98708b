"""tracegrad.autograd: the torch.autograd surface on NumPy.

The engine itself lives in ``tracegrad.eager``; this package is its public
face, with torch's module paths: ``tracegrad.autograd.graph``,
``.forward_ad``, ``.profiler``, ``.grad_mode``, ``.anomaly_mode``,
``.function`` and ``.gradcheck`` are the engine's modules under the names
torch gives them (``import tracegrad.autograd.forward_ad as fwAD`` works as
in torch), and ``functional`` and ``replay`` (which build compiled code)
live here, above the compiler.

A public face, on top of the layers: it may import any of them.
"""
import sys as _sys

from tracegrad.eager.tensor import Tensor as _Tensor
from tracegrad.eager import (anomaly_mode, forward_ad, function, grad_mode, gradcheck as
                             _gradcheck_module, graph, profiler)
from tracegrad.eager.engine import backward, grad
from tracegrad.eager.grad_mode import (no_grad, enable_grad, set_grad_enabled, inference_mode,
                                       is_grad_enabled, is_inference_mode_enabled)
from tracegrad.eager.graph import Node, saved_tensors_hooks, save_on_cpu
from tracegrad.eager.function import Function, once_differentiable
from tracegrad.eager.gradcheck import gradcheck, gradgradcheck, GradcheckError
from tracegrad.eager.anomaly_mode import (detect_anomaly, set_detect_anomaly, is_anomaly_enabled,
                                          is_anomaly_check_nan_enabled)
from tracegrad.autograd import functional
from tracegrad.autograd.replay import set_backward_replay, is_backward_replay_enabled
from tracegrad.autograd import traced as _traced  # noqa: F401 (autograd.grad on traced values)

class _VariableMeta(type):
    def __instancecheck__(cls, other):
        return isinstance(other, _Tensor)


class Variable(metaclass=_VariableMeta):
    """torch's legacy ``torch.autograd.Variable``: every Tensor is one
    (``isinstance(t, Variable)``, as torchviz checks its params), and
    ``Variable(t, requires_grad=False)`` is a detached alias of ``t``'s
    values with that flag."""

    def __new__(cls, data=None, requires_grad=False, volatile=False):
        if data is None:
            from tracegrad.eager.factories import empty
            return empty(0, requires_grad=requires_grad)
        if not isinstance(data, _Tensor):
            raise TypeError(f"Variable data has to be a tensor, but got {type(data).__name__}")
        t = data.detach()
        if requires_grad:
            t.requires_grad_(True)
        return t


# torch's submodule paths name the engine's modules (as os.path names posixpath);
# ``gradcheck`` stays the function as an attribute, as in torch.
for _name, _module in (("graph", graph), ("forward_ad", forward_ad), ("profiler", profiler),
                       ("grad_mode", grad_mode), ("anomaly_mode", anomaly_mode),
                       ("function", function), ("gradcheck", _gradcheck_module)):
    _sys.modules.setdefault(f"{__name__}.{_name}", _module)
del _name, _module

__all__ = ["backward", "grad", "no_grad", "enable_grad", "set_grad_enabled",
           "inference_mode", "is_grad_enabled", "is_inference_mode_enabled", "graph", "Node",
           "Function", "once_differentiable", "gradcheck", "gradgradcheck", "GradcheckError",
           "detect_anomaly", "set_detect_anomaly", "is_anomaly_enabled",
           "is_anomaly_check_nan_enabled", "profiler", "saved_tensors_hooks", "save_on_cpu",
           "functional", "forward_ad", "Variable", "set_backward_replay", "is_backward_replay_enabled"]
