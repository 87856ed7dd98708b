"""``autograd.scipy``: ``tracegrad.scipy``'s differentiable ``special``,
``stats``, ``linalg``, ``signal`` (autograd's ``convolve``) and
``integrate`` (``odeint``), and ``misc.logsumexp``, importable as modules."""
from tracegrad.autograd_compat.scipy import special, stats, misc  # noqa: F401
from tracegrad.autograd_compat.scipy import linalg, signal, integrate  # noqa: F401
