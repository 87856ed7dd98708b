"""tracegrad.autograd: the torch.autograd surface on NumPy."""
from tracegrad.autograd.engine import backward, grad
from tracegrad.autograd.grad_mode import (no_grad, enable_grad, set_grad_enabled,
                                          inference_mode, is_grad_enabled,
                                          is_inference_mode_enabled)
from tracegrad.autograd import graph
from tracegrad.autograd.graph import Node
from tracegrad.autograd.function import Function, once_differentiable
from tracegrad.autograd.gradcheck import gradcheck, gradgradcheck, GradcheckError
from tracegrad.autograd.anomaly_mode import (detect_anomaly, set_detect_anomaly,
                                             is_anomaly_enabled, is_anomaly_check_nan_enabled)
from tracegrad.autograd import profiler
from tracegrad.autograd.graph import saved_tensors_hooks, save_on_cpu
from tracegrad.autograd import functional
from tracegrad.autograd import forward_ad
from tracegrad.autograd.replay import set_backward_replay, is_backward_replay_enabled

__all__ = ["backward", "grad", "no_grad", "enable_grad", "set_grad_enabled",
           "inference_mode", "is_grad_enabled", "is_inference_mode_enabled", "graph", "Node",
           "Function", "once_differentiable", "gradcheck", "gradgradcheck", "GradcheckError",
           "detect_anomaly", "set_detect_anomaly", "is_anomaly_enabled",
           "is_anomaly_check_nan_enabled", "profiler", "saved_tensors_hooks", "save_on_cpu",
           "functional", "forward_ad", "set_backward_replay", "is_backward_replay_enabled"]
