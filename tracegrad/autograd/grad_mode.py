"""Grad modes: no_grad, enable_grad, set_grad_enabled, inference_mode.

The state is thread-local, as in torch: a ``no_grad`` block in one thread
does not change what another thread records.  Each works as a context
manager and as a decorator; ``set_grad_enabled(b)`` also works as a plain
call.
"""
from __future__ import annotations

import functools
import threading


class _State(threading.local):
    grad_enabled = True
    inference = False
    anomaly = False
    anomaly_check_nan = True


state = _State()


def is_grad_enabled() -> bool:
    return state.grad_enabled


def is_inference_mode_enabled() -> bool:
    return state.inference


class _Mode:
    """Base: a context manager that is also a decorator."""

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with self.__class__(*self._args()):
                return fn(*args, **kwargs)
        return wrapper

    def _args(self):
        return ()

    def clone(self):
        return self.__class__(*self._args())


class no_grad(_Mode):
    """Context manager and decorator that turns off gradient recording."""

    def __enter__(self):
        self.prev = state.grad_enabled
        state.grad_enabled = False
        return self

    def __exit__(self, *exc):
        state.grad_enabled = self.prev
        return False


class enable_grad(_Mode):
    """Context manager and decorator that turns gradient recording on."""

    def __enter__(self):
        self.prev = state.grad_enabled
        state.grad_enabled = True
        return self

    def __exit__(self, *exc):
        state.grad_enabled = self.prev
        return False


class set_grad_enabled(_Mode):
    """Set grad mode on or off; takes effect at once, and as a context
    manager restores the previous mode on exit."""

    def __init__(self, mode: bool):
        self.prev = state.grad_enabled
        self.mode = bool(mode)
        state.grad_enabled = self.mode

    def _args(self):
        return (self.mode,)

    def __call__(self, fn):
        # Used as a decorator: undo the immediate effect of __init__.
        state.grad_enabled = self.prev
        return super().__call__(fn)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        state.grad_enabled = self.prev
        return False


class inference_mode(_Mode):
    """Like no_grad; tensors made inside are marked as inference tensors."""

    def __init__(self, mode: bool = True):
        self.mode = bool(mode)

    def _args(self):
        return (self.mode,)

    def __enter__(self):
        self.prev = (state.grad_enabled, state.inference)
        if self.mode:
            state.grad_enabled = False
            state.inference = True
        return self

    def __exit__(self, *exc):
        state.grad_enabled, state.inference = self.prev
        return False
