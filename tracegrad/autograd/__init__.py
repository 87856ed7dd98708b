"""tracegrad.autograd: the torch.autograd surface on NumPy."""
from tracegrad.autograd.engine import backward, grad
from tracegrad.autograd.grad_mode import (no_grad, enable_grad, set_grad_enabled,
                                          inference_mode, is_grad_enabled,
                                          is_inference_mode_enabled)
from tracegrad.autograd import graph
from tracegrad.autograd.graph import Node

__all__ = ["backward", "grad", "no_grad", "enable_grad", "set_grad_enabled",
           "inference_mode", "is_grad_enabled", "is_inference_mode_enabled", "graph", "Node"]
