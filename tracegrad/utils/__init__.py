"""``torch.utils`` for code written the torch way: ``tracegrad.utils.data``
(Dataset, TensorDataset, DataLoader, random_split) and ``Generator``, the
seeded random generator torch code passes as ``generator=``.

A public face, on top of the layers: it may import any of them.
"""
from tracegrad.utils.generator import Generator
from tracegrad.utils import data

__all__ = ["data", "Generator"]
