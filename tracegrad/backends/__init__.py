"""``torch.backends``: the backends tutorials ask about.  tracegrad's GPU
path is CUDA through CuPy (``tracegrad.cuda``); Apple's MPS is not one.

A public face, on top of the layers: it may import any of them.
"""
from tracegrad.backends import mps  # noqa: F401

__all__ = ["mps"]
