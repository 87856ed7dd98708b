"""``autograd.scipy.special``: ``tracegrad.scipy.special``."""
from tracegrad.scipy.special import *  # noqa: F401,F403
from tracegrad.scipy.special import __all__  # noqa: F401
