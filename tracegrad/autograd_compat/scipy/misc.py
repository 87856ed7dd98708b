"""``autograd.scipy.misc``: ``logsumexp`` (SciPy moved it to ``special``)."""
from tracegrad.scipy.special import logsumexp  # noqa: F401

__all__ = ["logsumexp"]
