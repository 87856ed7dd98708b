"""torch.nn's functional half: ``tracegrad.nn.functional`` (``F``).

``import tracegrad as torch; F = torch.nn.functional`` gives the losses,
activations and helpers of ``torch.nn.functional`` with torch's names,
arguments, defaults and reductions; each is a composition of registry ops,
so it runs eagerly on Tensors and inside ``tg.grad`` / ``tg.compile``.

A public face, on top of the layers: it may import any of them.
"""
from tracegrad.nn import functional

__all__ = ["functional"]
