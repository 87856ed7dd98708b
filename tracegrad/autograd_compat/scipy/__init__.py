"""``autograd.scipy``: ``tracegrad.scipy``'s differentiable ``special`` and
``stats`` (and ``misc.logsumexp``), importable as modules."""
from tracegrad.autograd_compat.scipy import special, stats, misc  # noqa: F401
