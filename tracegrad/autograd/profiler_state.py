"""Which profiler (if any) is recording in this thread.

Kept apart from the profiler itself so the eager hot path checks one
attribute and imports nothing else."""
import threading


class _State(threading.local):
    current = None


_state = _State()


def __getattr__(name):
    if name == "current":
        return _state.current
    raise AttributeError(name)
