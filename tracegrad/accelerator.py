"""``torch.accelerator``: the device-agnostic queries.  tracegrad's one
accelerator is CUDA through CuPy (``tracegrad.cuda``)."""
from __future__ import annotations

from tracegrad import cuda
from tracegrad.eager.device import device

__all__ = ["is_available", "current_accelerator", "device_count", "current_device_index",
           "synchronize"]


def is_available() -> bool:
    """True if a CUDA device is usable through CuPy."""
    return cuda.is_available()


def current_accelerator(check_available: bool = False):
    """``tracegrad.device("cuda")`` when a CUDA device is usable, else None
    (torch answers for the accelerator it was built with; tracegrad's
    build is CuPy, so both ``check_available`` values ask whether it works)."""
    return device("cuda") if cuda.is_available() else None


def device_count() -> int:
    """The number of accelerator devices (0 without one)."""
    return cuda.device_count()


def current_device_index() -> int:
    """The index of the current accelerator device."""
    if not cuda.is_available():
        raise RuntimeError(f"tracegrad.accelerator.current_device_index: cannot access an "
                           f"accelerator device when none is available. {cuda.INSTALL}; check "
                           f"with tracegrad.accelerator.is_available().")
    return cuda.current_device()


def synchronize(device=None) -> None:
    """Wait for the accelerator's queued work (see tracegrad.cuda.synchronize)."""
    cuda.synchronize(device)
