"""Anomaly detection for the eager engine, as ``torch.autograd.detect_anomaly``.

While enabled (per thread, off by default):

* every backward node records the Python traceback of the forward call that
  created it (``Node.anomaly_trace``); when its backward raises, the engine
  warns with that traceback before the error propagates;
* with ``check_nan`` (the default), a backward node whose gradients contain
  NaN raises ``RuntimeError: Function 'XBackward0' returned nan values in
  its 0th output.``

The flag lives in ``grad_mode.state`` next to grad mode; when it is off the
only cost is the attribute test the engine and ``Node`` already make.
"""
from __future__ import annotations

import functools
import warnings

from tracegrad.eager.grad_mode import state as _state

__all__ = ["detect_anomaly", "set_detect_anomaly", "is_anomaly_enabled",
           "is_anomaly_check_nan_enabled"]


def is_anomaly_enabled() -> bool:
    """Whether anomaly detection is on in this thread."""
    return _state.anomaly


def is_anomaly_check_nan_enabled() -> bool:
    """Whether anomaly detection checks backward results for NaN."""
    return _state.anomaly_check_nan


class detect_anomaly:
    """Context manager (and decorator) that turns anomaly detection on.

    This mode slows every op down (a traceback is taken per recorded node);
    use it for debugging only."""

    def __init__(self, check_nan=True):
        self.check_nan = bool(check_nan)
        self.prev = None
        warnings.warn("Anomaly Detection has been enabled. This mode will increase the runtime "
                      "and should only be enabled for debugging.", UserWarning, stacklevel=2)

    def __enter__(self):
        self.prev = (_state.anomaly, _state.anomaly_check_nan)
        _state.anomaly = True
        _state.anomaly_check_nan = self.check_nan
        return self

    def __exit__(self, *exc):
        _state.anomaly, _state.anomaly_check_nan = self.prev
        return False

    def __call__(self, fn):
        check_nan = self.check_nan

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            prev = (_state.anomaly, _state.anomaly_check_nan)
            _state.anomaly = True
            _state.anomaly_check_nan = check_nan
            try:
                return fn(*args, **kwargs)
            finally:
                _state.anomaly, _state.anomaly_check_nan = prev
        return wrapper


class set_detect_anomaly:
    """Turn anomaly detection on or off: at once as a plain call, and for the
    block (restoring the previous setting) as a context manager."""

    def __init__(self, mode, check_nan=True):
        self.prev = (_state.anomaly, _state.anomaly_check_nan)
        self.mode = bool(mode)
        self.check_nan = bool(check_nan)
        _state.anomaly = self.mode
        _state.anomaly_check_nan = self.check_nan

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        _state.anomaly, _state.anomaly_check_nan = self.prev
        return False
