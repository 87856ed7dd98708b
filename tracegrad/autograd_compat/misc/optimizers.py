"""``autograd.misc.optimizers``: ``sgd``, ``rmsprop``, ``adam`` with
autograd's signatures and numbers.

``optimizer(grad, x0, callback=None, num_iters=..., step_size=..., ...)``:
``grad(x, i)`` is called with the parameters and the iteration number,
``callback(x, i, g)`` before each step.  ``x0`` may be any nesting of
tuples, lists and dicts of arrays (``unflatten_optimizer`` flattens it, and
hands ``grad`` and ``callback`` the structure).  The steps themselves are
plain NumPy on concrete arrays.
"""
from __future__ import annotations

from functools import wraps

import numpy as np

from tracegrad.autograd_compat.misc.flatten import flatten

__all__ = ["unflatten_optimizer", "sgd", "rmsprop", "adam"]


def unflatten_optimizer(optimize):
    """An optimizer of flat 1-D arrays made one of nested containers."""
    @wraps(optimize)
    def _optimize(grad, x0, callback=None, *args, **kwargs):
        _x0, unflatten = flatten(x0)

        def _grad(x, i):
            return np.asarray(flatten(grad(unflatten(x), i))[0])
        if callback:
            def _callback(x, i, g):
                return callback(unflatten(x), i, unflatten(g))
        else:
            _callback = None
        return unflatten(optimize(_grad, np.asarray(_x0), _callback, *args, **kwargs))
    return _optimize


@unflatten_optimizer
def sgd(grad, x, callback=None, num_iters=200, step_size=0.1, mass=0.9):
    """Stochastic gradient descent with momentum; grad(x, i)."""
    velocity = np.zeros(len(x))
    for i in range(num_iters):
        g = grad(x, i)
        if callback:
            callback(x, i, g)
        velocity = mass * velocity - (1.0 - mass) * g
        x = x + step_size * velocity
    return x


@unflatten_optimizer
def rmsprop(grad, x, callback=None, num_iters=100, step_size=0.1, gamma=0.9, eps=10**-8):
    """Root mean squared prop."""
    avg_sq_grad = np.ones(len(x))
    for i in range(num_iters):
        g = grad(x, i)
        if callback:
            callback(x, i, g)
        avg_sq_grad = avg_sq_grad * gamma + g**2 * (1 - gamma)
        x = x - step_size * g / (np.sqrt(avg_sq_grad) + eps)
    return x


@unflatten_optimizer
def adam(grad, x, callback=None, num_iters=100, step_size=0.001, b1=0.9, b2=0.999,
         eps=10**-8):
    """Adam (Kingma and Ba, arXiv:1412.6980): RMSprop with momentum and
    bias correction."""
    m = np.zeros(len(x))
    v = np.zeros(len(x))
    for i in range(num_iters):
        g = grad(x, i)
        if callback:
            callback(x, i, g)
        m = (1 - b1) * g + b1 * m
        v = (1 - b2) * (g**2) + b2 * v
        mhat = m / (1 - b1**(i + 1))
        vhat = v / (1 - b2**(i + 1))
        x = x - step_size * mhat / (np.sqrt(vhat) + eps)
    return x
