"""``torch.backends.mps``: tracegrad has no Metal (MPS) backend, so both
answers are False; on a Mac tracegrad runs on the CPU (NumPy)."""

__all__ = ["is_available", "is_built"]


def is_available() -> bool:
    """False: tracegrad has no MPS backend (its GPU path is CUDA via CuPy)."""
    return False


def is_built() -> bool:
    """False: tracegrad was not built with MPS."""
    return False
