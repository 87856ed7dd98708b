"""``autograd.misc``: ``flatten`` / ``flatten_func``, ``optimizers``, ``fixed_point``."""
from tracegrad.autograd_compat.misc.flatten import flatten, flatten_func  # noqa: F401
from tracegrad.autograd_compat.misc.fixed_points import fixed_point  # noqa: F401
from tracegrad.autograd_compat.misc import optimizers  # noqa: F401

__all__ = ["flatten", "flatten_func", "fixed_point", "optimizers"]
