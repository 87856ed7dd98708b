"""Grad modes: no_grad, enable_grad, set_grad_enabled, inference_mode.

The state is thread-local, as in torch: a ``no_grad`` block in one thread
does not change what another thread records (a new thread starts with
grad mode on).  Each works as a context manager and as a decorator (with or
without parentheses: ``@no_grad()`` and ``@no_grad``);
``set_grad_enabled(b)`` also works as a plain call.
"""
from __future__ import annotations

import functools
import inspect
import threading


class _State(threading.local):
    grad_enabled = True
    inference = False
    anomaly = False
    anomaly_check_nan = True
    # True while a backward without create_graph runs a vjp rule: the rule
    # then computes on plain arrays and ops on arrays return arrays, with no
    # Tensor wrapping (see tensor.PrimNode._apply)
    raw = False


state = _State()


def is_grad_enabled() -> bool:
    return state.grad_enabled


def is_inference_mode_enabled() -> bool:
    return state.inference


class _Mode:
    """Base: a context manager that is also a decorator."""

    def __call__(self, fn):
        if inspect.isclass(fn):
            raise TypeError(f"{type(self).__name__} cannot decorate a class; decorate its "
                            f"methods instead")
        args = self._args()
        cls = self.__class__
        if inspect.isgeneratorfunction(fn):
            @functools.wraps(fn)
            def gen_wrapper(*a, **kw):
                gen = fn(*a, **kw)
                with cls(*args):
                    response = gen.send(None)
                while True:
                    try:
                        request = yield response
                    except GeneratorExit:
                        with cls(*args):
                            gen.close()
                        raise
                    except BaseException as e:
                        with cls(*args):
                            response = gen.throw(e)
                    else:
                        try:
                            with cls(*args):
                                response = gen.send(request)
                        except StopIteration as stop:
                            return stop.value
            return gen_wrapper

        @functools.wraps(fn)
        def wrapper(*a, **kw):
            with cls(*args):
                return fn(*a, **kw)
        return wrapper

    def _args(self):
        return ()

    def clone(self):
        return self.__class__(*self._args())


class _NoParamMode(_Mode):
    """Also usable as ``@no_grad`` without parentheses."""

    def __new__(cls, orig_func=None):
        if orig_func is None:
            return super().__new__(cls)
        return cls()(orig_func)

    def __init__(self, orig_func=None):
        pass


class no_grad(_NoParamMode):
    """Context manager and decorator that turns off gradient recording.

    Results computed inside have ``requires_grad=False`` even when their
    inputs require grad.  Thread-local."""

    def __enter__(self):
        self.prev = state.grad_enabled
        state.grad_enabled = False
        return None

    def __exit__(self, *exc):
        state.grad_enabled = self.prev
        return False


class enable_grad(_NoParamMode):
    """Context manager and decorator that turns gradient recording on (inside
    ``no_grad`` or ``set_grad_enabled(False)``).  Thread-local."""

    def __enter__(self):
        self.prev = state.grad_enabled
        state.grad_enabled = True
        return None

    def __exit__(self, *exc):
        state.grad_enabled = self.prev
        return False


class set_grad_enabled(_Mode):
    """Set grad mode on or off; takes effect at once (so it works as a plain
    call), and as a context manager restores the previous mode on exit."""

    def __init__(self, mode: bool):
        if not isinstance(mode, bool) and type(mode).__name__ != "bool_":
            raise TypeError(f"enabled must be a bool (got {type(mode).__name__})")
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
        return None

    def __exit__(self, *exc):
        state.grad_enabled = self.prev
        return False

    def clone(self):
        prev = state.grad_enabled
        c = self.__class__(self.mode)
        state.grad_enabled = prev
        c.prev = prev
        return c


class inference_mode(_Mode):
    """Like ``no_grad``, for code that will never be differentiated:
    nothing is recorded inside.  ``inference_mode(False)`` changes nothing.
    Thread-local; usable as ``@inference_mode`` too."""

    def __new__(cls, mode=True):
        if callable(mode) and not isinstance(mode, bool):
            return cls()(mode)
        return super().__new__(cls)

    def __init__(self, mode: bool = True):
        self.mode = bool(mode)

    def _args(self):
        return (self.mode,)

    def __enter__(self):
        self.prev = (state.grad_enabled, state.inference)
        if self.mode:
            state.grad_enabled = False
            state.inference = True
        return None

    def __exit__(self, *exc):
        state.grad_enabled, state.inference = self.prev
        return False
