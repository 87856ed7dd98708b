"""Neural-network activations over an axis: softmax and log_softmax.

Both are compositions: the maximum they subtract for stability sits behind
``stop_gradient`` (it cancels exactly), so the gradients are exact and no
extra rule is needed.  The elementwise activations (relu, sigmoid,
softplus) are rows in ``elementwise``.
"""
from __future__ import annotations

import numpy as np

from tracegrad.ops._define import method, axis_arg
from tracegrad.ops.base import sub, div, exp, sum, stop_gradient, astype
from tracegrad.ops.reductions import amax, logsumexp

__all__ = ["softmax", "log_softmax"]


def _prepare(x, axis, dim, dtype):
    axis = axis_arg(axis, dim)
    if axis is None:
        axis = -1
    if dtype is not None:
        x = astype(x, dtype)
    elif np.dtype(getattr(x, "dtype", np.float64)).kind != "f":
        x = astype(x, np.float64)
    return x, axis


@method("softmax")
def softmax(x, dim=None, dtype=None, *, axis=None):
    """exp(x) / sum(exp(x)) along ``dim`` (default: the last axis)."""
    x, axis = _prepare(x, axis, dim, dtype)
    e = exp(sub(x, stop_gradient(amax(x, axis=axis, keepdims=True))))
    return div(e, sum(e, axis=axis, keepdims=True))


@method("log_softmax")
def log_softmax(x, dim=None, dtype=None, *, axis=None):
    """x - logsumexp(x) along ``dim`` (default: the last axis)."""
    x, axis = _prepare(x, axis, dim, dtype)
    return sub(x, logsumexp(x, axis=axis, keepdims=True))
