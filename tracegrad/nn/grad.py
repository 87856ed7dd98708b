"""``torch.nn.grad``: the gradients of a convolution with respect to its
input (``conv*d_input``) and its weight (``conv*d_weight``), given the
gradient of its output.

A convolution is linear in its input and in its weight, so each of these is
the vector-Jacobian product of ``F.conv*d`` at a zero point: the backward of
the registry rows the convolution is made of (im2col slices, a matmul),
taken by the eager tape (``autograd.grad``, with ``create_graph`` when the
weight, input or output gradient requires grad, so the result is
differentiable again) or, inside a traced function, by the trace's own
backward sweep.  No derivative is written here.
"""
from __future__ import annotations

import numpy as np

from tracegrad import autograd
from tracegrad.eager.factories import zeros
from tracegrad.eager.grad_mode import enable_grad, state as _grad_state
from tracegrad.eager.tensor import Tensor
from tracegrad.frontend.trace import Tracer
from tracegrad.nn import functional as F
from tracegrad.ops.base import astype, broadcast_to, sum as _sum, zeros_like_value
from tracegrad.ops.random import is_tracing

__all__ = ["conv1d_input", "conv1d_weight", "conv2d_input", "conv2d_weight", "conv3d_input",
           "conv3d_weight"]


def _size(size, what):
    try:
        return tuple(int(s) for s in size)
    except TypeError:
        raise TypeError(f"torch.nn.grad.{what}: expected a size (a tuple, list or torch.Size "
                        f"of ints), got {type(size).__name__}") from None


def _linear_vjp(conv, shape, dtype, grad_output, others, what):
    """J^T grad_output for ``conv``, linear in its argument of ``shape``."""
    if not is_tracing():
        x = zeros(shape, dtype=dtype, requires_grad=True)
        with enable_grad():
            out = conv(x)
        _check_out(out, grad_output, what)
        again = _grad_state.grad_enabled and any(
            isinstance(v, Tensor) and v.requires_grad for v in (grad_output,) + others)
        g, = autograd.grad(out, x, grad_output, create_graph=again)
        return g if again else g.detach()
    # traced: the point is a value of the trace (zeros made from a traced
    # operand: the folding of constants would cut a constant off the sweep)
    traced = [v for v in (grad_output,) + tuple(F._lifted(o) for o in others)
              if type(v) is Tracer]
    if not traced:
        raise TypeError(f"torch.nn.grad.{what} inside a traced function needs a traced "
                        f"grad_output, weight or input (a value of the function); got "
                        f"constants only: compute it outside the function")
    base = traced[-1]
    x = astype(broadcast_to(_sum(zeros_like_value(base)), shape), dtype)
    out = conv(x)
    _check_out(out, grad_output, what)
    g, = autograd.grad(out, x, grad_output)
    return g


def _check_out(out, grad_output, what):
    if tuple(out.shape) != tuple(grad_output.shape):
        raise RuntimeError(f"torch.nn.grad.{what}: grad_output has shape "
                           f"{list(grad_output.shape)}, but the convolution's output has shape "
                           f"{list(out.shape)} for these sizes, stride, padding and dilation")


def _dtype(*vals):
    for v in vals:
        d = getattr(v, "dtype", None)
        if d is not None and np.dtype(d).kind in "fc":
            return np.dtype(d)
    return np.dtype(np.float32)


def _input_grad(nd, input_size, weight, grad_output, stride, padding, dilation, groups):
    what = f"conv{nd}d_input"
    conv = getattr(F, f"conv{nd}d")
    return _linear_vjp(lambda x: conv(x, weight, None, stride, padding, dilation, groups),
                       _size(input_size, what), _dtype(weight, grad_output), grad_output,
                       (weight,), what)


def _weight_grad(nd, input, weight_size, grad_output, stride, padding, dilation, groups):
    what = f"conv{nd}d_weight"
    conv = getattr(F, f"conv{nd}d")
    return _linear_vjp(lambda w: conv(input, w, None, stride, padding, dilation, groups),
                       _size(weight_size, what), _dtype(input, grad_output), grad_output,
                       (input,), what)


def conv1d_input(input_size, weight, grad_output, stride=1, padding=0, dilation=1, groups=1):
    """The gradient of conv1d with respect to its input (of size ``input_size``)."""
    return _input_grad(1, input_size, weight, grad_output, stride, padding, dilation, groups)


def conv1d_weight(input, weight_size, grad_output, stride=1, padding=0, dilation=1, groups=1):
    """The gradient of conv1d with respect to its weight (of size ``weight_size``)."""
    return _weight_grad(1, input, weight_size, grad_output, stride, padding, dilation, groups)


def conv2d_input(input_size, weight, grad_output, stride=1, padding=0, dilation=1, groups=1):
    """The gradient of conv2d with respect to its input (of size ``input_size``)."""
    return _input_grad(2, input_size, weight, grad_output, stride, padding, dilation, groups)


def conv2d_weight(input, weight_size, grad_output, stride=1, padding=0, dilation=1, groups=1):
    """The gradient of conv2d with respect to its weight (of size ``weight_size``)."""
    return _weight_grad(2, input, weight_size, grad_output, stride, padding, dilation, groups)


def conv3d_input(input_size, weight, grad_output, stride=1, padding=0, dilation=1, groups=1):
    """The gradient of conv3d with respect to its input (of size ``input_size``)."""
    return _input_grad(3, input_size, weight, grad_output, stride, padding, dilation, groups)


def conv3d_weight(input, weight_size, grad_output, stride=1, padding=0, dilation=1, groups=1):
    """The gradient of conv3d with respect to its weight (of size ``weight_size``)."""
    return _weight_grad(3, input, weight_size, grad_output, stride, padding, dilation, groups)
