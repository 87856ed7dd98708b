"""``torch.nn.utils``: gradient clipping and flattening parameters into one
vector (and back), with torch's formulas.  All run off the tape."""
from __future__ import annotations

import math
import warnings

import numpy as np

from tracegrad.eager.tensor import Tensor
from tracegrad.ops import primitives

__all__ = ["clip_grad_norm_", "clip_grad_norm", "clip_grad_value_", "get_total_norm",
           "clip_grads_with_norm_", "parameters_to_vector", "vector_to_parameters"]


def _as_list(parameters):
    if isinstance(parameters, Tensor):
        return [parameters]
    return list(parameters)


def _norm(a, norm_type):
    xp = primitives.array_module(a)
    a = xp.abs(a)
    if norm_type == math.inf:
        return a.max() if a.size else xp.asarray(0.0, dtype=a.dtype)
    if norm_type == -math.inf:
        return a.min()
    if norm_type == 0:
        return xp.asarray((a != 0).sum(), dtype=a.dtype)
    return (a ** norm_type).sum() ** (1.0 / norm_type)


def get_total_norm(tensors, norm_type=2.0, error_if_nonfinite=False, foreach=None):
    """The norm of the norms of ``tensors`` (the norm of them all as one vector)."""
    norm_type = float(norm_type)
    ts = [t for t in _as_list(tensors) if t is not None]
    if not ts:
        from tracegrad.eager.factories import tensor
        return tensor(0.0)
    norms = [_norm(t._data, norm_type) for t in ts]
    xp = primitives.array_module(ts[0]._data)
    total = _norm(xp.stack([xp.asarray(n) for n in norms]), norm_type)
    if error_if_nonfinite and not bool(xp.isfinite(total)):
        raise RuntimeError(f"The total norm of order {norm_type} for gradients from "
                           f"`parameters` is non-finite, so it cannot be clipped. To disable "
                           f"this error and scale the gradients by the non-finite norm anyway, "
                           f"set `error_if_nonfinite=False`")
    return Tensor(xp.asarray(total, dtype=ts[0]._data.dtype))


def clip_grads_with_norm_(parameters, max_norm, total_norm, foreach=None):
    """Scale every .grad by min(1, max_norm / (total_norm + 1e-6))."""
    params = [p for p in _as_list(parameters) if p.grad is not None]
    if not params:
        return
    total = total_norm._data if isinstance(total_norm, Tensor) else total_norm
    coef = float(max_norm) / (total + 1e-6)
    coef = min(float(coef), 1.0)
    for p in params:
        g = p._grad
        g._data[...] = g._data * np.asarray(coef, dtype=g._data.dtype)
        g._vbox[0] += 1


def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False,
                    foreach=None):
    """Scale the gradients in place so that their total norm is at most
    max_norm; returns the total norm before clipping (a Tensor)."""
    params = _as_list(parameters)
    grads = [p.grad for p in params if p.grad is not None]
    total = get_total_norm(grads, norm_type, error_if_nonfinite)
    clip_grads_with_norm_(params, max_norm, total)
    return total


def clip_grad_norm(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False, foreach=None):
    warnings.warn("`torch.nn.utils.clip_grad_norm` is now deprecated in favor of "
                  "`torch.nn.utils.clip_grad_norm_`.", FutureWarning, stacklevel=2)
    return clip_grad_norm_(parameters, max_norm, norm_type, error_if_nonfinite, foreach)


def clip_grad_value_(parameters, clip_value, foreach=None):
    """Clamp every gradient into [-clip_value, clip_value] in place."""
    clip_value = float(clip_value)
    for p in _as_list(parameters):
        if p.grad is not None:
            g = p._grad
            xp = primitives.array_module(g._data)
            g._data[...] = xp.clip(g._data, -clip_value, clip_value)
            g._vbox[0] += 1


def parameters_to_vector(parameters):
    """The parameters flattened and concatenated into one 1-d Tensor (a copy
    that records the tape, as torch's)."""
    from tracegrad.ops import concatenate, reshape
    return concatenate([reshape(p, (-1,)) for p in parameters])


def vector_to_parameters(vec, parameters):
    """Copy consecutive slices of ``vec`` into the parameters' data."""
    if not isinstance(vec, Tensor):
        raise TypeError(f"expected torch.Tensor, but got: {type(vec).__name__}")
    data = vec._data
    pointer = 0
    for p in parameters:
        n = p._data.size
        p._data = data[pointer:pointer + n].reshape(p.shape).astype(p.dtype, copy=True)
        p._vbox[0] += 1
        pointer += n
