"""``torch.backends``: the backends tutorials ask about.  tracegrad's GPU
path is CUDA through CuPy (``tracegrad.cuda``); Apple's MPS is not one."""
from tracegrad.backends import mps  # noqa: F401

__all__ = ["mps"]
