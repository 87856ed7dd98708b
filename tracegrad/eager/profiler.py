"""The autograd profiler: ``tg.autograd.profiler.profile`` and friends.

``profile`` records, in the thread that enters it,

* every eager op (name = primitive name: ``"mul"``, ``"exp"``...), category
  ``"op"``: the eager interpreter calls ``_begin``/``_end`` around ``impl``;
* every backward node the engine runs (``"MulBackward0"``, a custom
  ``"ExpBackward"``), category ``"backward"``;
* compiled calls (category ``"compiled"``) and whatever code marks with
  ``record_function(name)`` (category ``"user_annotation"`` unless told);
  ``record_function`` nests, so the compiler can put one child event per
  generated kernel or statement group under its call.

Events nest: an event's *self* time is its time minus its children's, so
``MulBackward0``'s self time leaves out the ``mul`` ops its vjp runs.

When no profiler is on, the eager hot path pays one thread-local attribute
test (``profiler_state._state.current is None``) and nothing else.

Times are in microseconds, as in torch.
"""
from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
import threading
import time
import tracemalloc

from tracegrad.eager.profiler_state import _state, recording_anywhere

__all__ = ["profile", "record_function", "emit_nvtx", "load_nvprof", "FunctionEvent",
           "FunctionEventAvg", "EventList", "Kernel"]

_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SKIP_DIRS = (_PKG_DIR + os.sep,
              os.path.dirname(contextlib.__file__) + os.sep + "contextlib.py",
              os.path.dirname(functools.__file__) + os.sep + "functools.py")


def _numpy_dir():
    import numpy
    return os.path.dirname(os.path.abspath(numpy.__file__)) + os.sep


# --- formatting ----------------------------------------------------------------------

def _format_time(us):
    if us >= 1e6:
        return f"{us / 1e6:.3f}s"
    if us >= 1e3:
        return f"{us / 1e3:.3f}ms"
    return f"{us:.3f}us"


def _format_memory(nbytes):
    kb, mb, gb = 1024, 1024 ** 2, 1024 ** 3
    if abs(nbytes) >= gb:
        return f"{nbytes / gb:.2f} Gb"
    if abs(nbytes) >= mb:
        return f"{nbytes / mb:.2f} Mb"
    if abs(nbytes) >= kb:
        return f"{nbytes / kb:.2f} Kb"
    return f"{int(nbytes)} b"


def _format_pct(part, total):
    return f"{100.0 * part / total:.2f}%" if total else "0.00%"


# --- events --------------------------------------------------------------------------

class FunctionEvent:
    """One recorded range: an op, a backward node, a compiled call or a
    ``record_function`` block."""
    __slots__ = ("id", "name", "cat", "thread", "start_ns", "end_ns", "input_shapes", "stack",
                 "cpu_memory_usage", "cuda_memory_usage", "flops", "parent", "cpu_children",
                 "_mem0", "_cuda_events", "cuda_time_total", "_open", "_frame", "kernels")

    def __init__(self, id, name, cat, thread, start_ns):
        self.id = id
        self.name = name
        self.cat = cat
        self.thread = thread
        self.start_ns = start_ns
        self.end_ns = start_ns
        self.input_shapes = None
        self.stack = None
        self.cpu_memory_usage = 0
        self.cuda_memory_usage = 0
        self.flops = 0
        self.parent = None
        self.cpu_children = []
        self._mem0 = None
        self._cuda_events = None
        self.cuda_time_total = 0.0
        self._open = True
        # the frame that opened the range, while it is open (see profile._begin)
        self._frame = None
        # GPU kernels launched inside the range (load_nvprof fills it)
        self.kernels = []

    def append_kernel(self, name, device, duration_us):
        """A kernel that ran ``duration_us`` microseconds on ``device`` for this range."""
        self.kernels.append(Kernel(name, device, duration_us))
        self.cuda_time_total += duration_us

    key = property(lambda self: self.name)
    count = property(lambda self: 1)

    @property
    def cpu_time_total(self):
        return (self.end_ns - self.start_ns) / 1000.0

    @property
    def self_cpu_time_total(self):
        return self.cpu_time_total - sum(c.cpu_time_total for c in self.cpu_children)

    @property
    def cpu_time(self):
        return self.cpu_time_total

    @property
    def self_cpu_memory_usage(self):
        return self.cpu_memory_usage - sum(c.cpu_memory_usage for c in self.cpu_children)

    @property
    def self_cuda_memory_usage(self):
        return self.cuda_memory_usage - sum(c.cuda_memory_usage for c in self.cpu_children)

    @property
    def cuda_time(self):
        return self.cuda_time_total

    @property
    def self_cuda_time_total(self):
        return self.cuda_time_total - sum(c.cuda_time_total for c in self.cpu_children)

    @property
    def is_top_level(self):
        return self.parent is None

    def __repr__(self):
        return (f"<FunctionEvent id={self.id} name={self.name} cat={self.cat} "
                f"cpu_time={_format_time(self.cpu_time_total)} "
                f"self_cpu_time={_format_time(self.self_cpu_time_total)} "
                f"input_shapes={self.input_shapes} cpu_memory_usage={self.cpu_memory_usage}>")


class Kernel:
    """A GPU kernel attributed to an event (name, device, duration in us)."""
    __slots__ = ("name", "device", "duration")

    def __init__(self, name, device, duration):
        self.name = name
        self.device = device
        self.duration = duration

    def __repr__(self):
        return f"<Kernel {self.name} device={self.device} duration={self.duration}us>"


class FunctionEventAvg:
    """Events with the same key, summed (``key_averages`` rows)."""

    def __init__(self, key=None):
        self.key = key
        self.count = 0
        self.cpu_time_total = 0.0
        self.self_cpu_time_total = 0.0
        self.cuda_time_total = 0.0
        self.self_cuda_time_total = 0.0
        self.cpu_memory_usage = 0
        self.self_cpu_memory_usage = 0
        self.cuda_memory_usage = 0
        self.self_cuda_memory_usage = 0
        self.flops = 0
        self.input_shapes = None
        self.stack = None
        self.cat = None

    def add(self, other):
        if self.key is None:
            self.key = other.key
            self.input_shapes = other.input_shapes
            self.stack = other.stack
            self.cat = other.cat
        self.count += other.count
        self.cpu_time_total += other.cpu_time_total
        self.self_cpu_time_total += other.self_cpu_time_total
        self.cuda_time_total += other.cuda_time_total
        self.self_cuda_time_total += other.self_cuda_time_total
        self.cpu_memory_usage += other.cpu_memory_usage
        self.self_cpu_memory_usage += other.self_cpu_memory_usage
        self.cuda_memory_usage += other.cuda_memory_usage
        self.self_cuda_memory_usage += other.self_cuda_memory_usage
        self.flops += other.flops
        return self

    __iadd__ = add

    @property
    def cpu_time(self):
        return self.cpu_time_total / self.count if self.count else 0.0

    @property
    def self_cpu_time(self):
        return self.self_cpu_time_total / self.count if self.count else 0.0

    @property
    def cuda_time(self):
        return self.cuda_time_total / self.count if self.count else 0.0

    def __repr__(self):
        return (f"<FunctionEventAvg key={self.key} count={self.count} "
                f"self_cpu_time={_format_time(self.self_cpu_time_total)} "
                f"cpu_time={_format_time(self.cpu_time)} input_shapes={self.input_shapes} "
                f"cpu_memory_usage={self.cpu_memory_usage}>")


_SORT_KEYS = ("cpu_time", "cuda_time", "cpu_time_total", "cuda_time_total",
              "self_cpu_time_total", "self_cuda_time_total", "cpu_memory_usage",
              "cuda_memory_usage", "self_cpu_memory_usage", "self_cuda_memory_usage", "count",
              "flops")


class EventList(list):
    """A list of events (or of averaged events) that can print itself as a
    table and export a Chrome trace."""

    def __init__(self, *args, use_cuda=False, profile_memory=False, with_flops=False,
                 with_stack=False, grouped_by_shape=False):
        super().__init__(*args)
        self._use_cuda = use_cuda
        self._profile_memory = profile_memory
        self._with_flops = with_flops
        self._with_stack = with_stack
        self._grouped_by_shape = grouped_by_shape

    def _like(self, items, grouped_by_shape=None):
        return EventList(items, use_cuda=self._use_cuda, profile_memory=self._profile_memory,
                         with_flops=self._with_flops, with_stack=self._with_stack,
                         grouped_by_shape=self._grouped_by_shape if grouped_by_shape is None
                         else grouped_by_shape)

    @property
    def self_cpu_time_total(self):
        """Total self CPU time of all events, in microseconds."""
        return sum(e.self_cpu_time_total for e in self)

    def key_averages(self, group_by_input_shape=False, group_by_stack_n=0):
        """Average the events over their name (and input shapes, and the top
        ``group_by_stack_n`` stack entries, when asked)."""
        groups = {}
        for e in self:
            key = (e.key,)
            if group_by_input_shape:
                key += (str(e.input_shapes),)
            if group_by_stack_n > 0:
                key += (tuple((e.stack or ())[:group_by_stack_n]),)
            avg = groups.get(key)
            if avg is None:
                avg = groups[key] = FunctionEventAvg()
            avg.add(e)
        return self._like(groups.values(), grouped_by_shape=group_by_input_shape)

    def total_average(self):
        """All events summed into one ``FunctionEventAvg`` keyed "Total"."""
        total = FunctionEventAvg()
        for e in self:
            total.add(e)
        total.key = "Total"
        total.input_shapes = None
        total.stack = None
        total.cat = None
        return total

    def table(self, sort_by=None, row_limit=100, max_src_column_width=75, header=None,
              top_level_events_only=False):
        """The events as a text table (sorted, descending, by ``sort_by``)."""
        return _build_table(self, sort_by, row_limit, max_src_column_width, header,
                            top_level_events_only)

    def __str__(self):
        return self.table()

    def export_chrome_trace(self, path):
        """Write the events as a Chrome trace (JSON ``traceEvents`` with
        complete events, ph "X", times in microseconds) that Perfetto and
        chrome://tracing open."""
        events = [e for e in self if isinstance(e, FunctionEvent)]
        if len(events) != len(self):
            raise TypeError("export_chrome_trace needs the raw events, not key_averages() rows")
        base = min((e.start_ns for e in events), default=0)
        pid = os.getpid()
        trace = []
        for e in events:
            args = {"id": e.id}
            if e.input_shapes is not None:
                args["Input Shapes"] = e.input_shapes
            if self._profile_memory:
                args["CPU Memory Usage"] = e.cpu_memory_usage
                if e.cuda_memory_usage:
                    args["CUDA Memory Usage"] = e.cuda_memory_usage
            if e.stack:
                args["Stack"] = list(e.stack)
            if e.flops:
                args["flops"] = e.flops
            if e.cuda_time_total:
                args["CUDA time (us)"] = e.cuda_time_total
            trace.append({"name": e.name, "cat": e.cat, "ph": "X",
                          "ts": (e.start_ns - base) / 1000.0,
                          "dur": (e.end_ns - e.start_ns) / 1000.0,
                          "pid": pid, "tid": e.thread, "args": args})
        with open(path, "w") as f:
            json.dump({"traceEvents": trace, "displayTimeUnit": "ms"}, f)


def _build_table(events, sort_by, row_limit, max_src_column_width, header,
                 top_level_events_only):
    if sort_by is not None and sort_by not in _SORT_KEYS:
        raise ValueError(f"table(sort_by={sort_by!r}): valid keys are {', '.join(_SORT_KEYS)}")
    rows = list(events)
    if top_level_events_only:
        rows = [e for e in rows if getattr(e, "parent", None) is None]
    if sort_by is not None:
        rows.sort(key=lambda e: getattr(e, sort_by), reverse=True)
    if row_limit is not None and row_limit > 0:
        rows = rows[:row_limit]
    use_cuda = events._use_cuda if isinstance(events, EventList) else False
    mem = events._profile_memory if isinstance(events, EventList) else False
    flops = events._with_flops if isinstance(events, EventList) else False
    shapes = isinstance(events, EventList) and (events._grouped_by_shape or any(
        isinstance(e, FunctionEvent) and e.input_shapes is not None for e in events))
    stacks = isinstance(events, EventList) and events._with_stack
    self_total = sum(e.self_cpu_time_total for e in events)
    cuda_total = sum(e.self_cuda_time_total for e in events) if use_cuda else 0.0

    name_w = max([len("Name")] + [len(str(e.key)) for e in rows])
    name_w = min(name_w, 55)
    cols = [("Name", name_w, lambda e: _clip(str(e.key), name_w))]
    tw = 15
    cols += [
        ("Self CPU %", tw, lambda e: _format_pct(e.self_cpu_time_total, self_total)),
        ("Self CPU", tw, lambda e: _format_time(e.self_cpu_time_total)),
        ("CPU total %", tw, lambda e: _format_pct(e.cpu_time_total, self_total)),
        ("CPU total", tw, lambda e: _format_time(e.cpu_time_total)),
        ("CPU time avg", tw, lambda e: _format_time(e.cpu_time)),
    ]
    if use_cuda:
        cols += [
            ("Self CUDA", tw, lambda e: _format_time(e.self_cuda_time_total)),
            ("Self CUDA %", tw, lambda e: _format_pct(e.self_cuda_time_total, cuda_total)),
            ("CUDA total", tw, lambda e: _format_time(e.cuda_time_total)),
            ("CUDA time avg", tw, lambda e: _format_time(e.cuda_time)),
        ]
    if mem:
        cols += [("CPU Mem", tw, lambda e: _format_memory(e.cpu_memory_usage)),
                 ("Self CPU Mem", tw, lambda e: _format_memory(e.self_cpu_memory_usage))]
        if use_cuda:
            cols += [("CUDA Mem", tw, lambda e: _format_memory(e.cuda_memory_usage)),
                     ("Self CUDA Mem", tw, lambda e: _format_memory(e.self_cuda_memory_usage))]
    cols.append(("# of Calls", tw, lambda e: str(e.count)))
    if flops:
        cols.append(("Total MFLOPs", tw, lambda e: f"{e.flops / 1e6:.3f}" if e.flops else "--"))
    if shapes:
        cols.append(("Input Shapes", 40, lambda e: _clip(str(e.input_shapes), 40)))
    if stacks:
        cols.append(("Source Location", max_src_column_width,
                     lambda e: _clip((e.stack or [""])[0], max_src_column_width)))

    sep = "  ".join("-" * w for _, w, _ in cols)
    lines = []
    if header:
        lines.append("=" * len(sep))
        lines.append(header)
    lines.append(sep)
    left = {0, len(cols) - 1} if stacks else {0}
    lines.append("  ".join(f"{h:<{w}}" if i in left else f"{h:>{w}}"
                           for i, (h, w, _) in enumerate(cols)).rstrip())
    lines.append(sep)
    for e in rows:
        lines.append("  ".join(f"{fn(e):<{w}}" if i in left else f"{fn(e):>{w}}"
                               for i, (_, w, fn) in enumerate(cols)).rstrip())
    lines.append(sep)
    lines.append(f"Self CPU time total: {_format_time(self_total)}")
    if use_cuda:
        lines.append(f"Self CUDA time total: {_format_time(cuda_total)}")
    return "\n".join(lines) + "\n"


def _clip(s, width):
    return s if len(s) <= width else s[:width - 3] + "..."


# --- the profiler ----------------------------------------------------------------------

def _shapes_of(arrays):
    return [list(a.shape) if hasattr(a, "shape") else [] for a in arrays]


def _matmul_flops(shapes):
    if len(shapes) != 2 or not shapes[0] or not shapes[1]:
        return 0
    a, b = shapes
    k = a[-1]
    m = a[-2] if len(a) >= 2 else 1
    n = b[-1] if len(b) >= 2 else 1
    batch = 1
    for d in (a[:-2] if len(a) > len(b) else b[:-2]):
        batch *= d
    return 2 * batch * m * n * k


def _cupy_or_none():
    """CuPy when it is installed and sees a GPU, else None."""
    try:
        import cupy
    except ImportError:
        return None
    try:
        if cupy.cuda.runtime.getDeviceCount() == 0:
            return None
    except cupy.cuda.runtime.CUDARuntimeError:
        return None
    return cupy


def _in_chain(frame, current):
    """Whether ``frame`` is ``current`` or one of its callers (still running)."""
    f = current
    while f is not None:
        if f is frame:
            return True
        f = f.f_back
    return False


class profile:
    """Context manager that records the ops, backward nodes and compiled
    calls run in this thread (see the module doc).

    ``record_shapes`` keeps the input shapes of ops (and lets
    ``key_averages(group_by_input_shape=True)`` split by them);
    ``profile_memory`` records the bytes each event allocates (NumPy memory
    through ``tracemalloc``, GPU memory through CuPy's pool);
    ``with_stack`` records the user's ``file(line): function`` for each event;
    ``use_cuda`` also times events with CUDA events (needs CuPy and a GPU);
    ``with_flops`` estimates matmul FLOPs from the input shapes."""

    def __init__(self, enabled=True, *, use_cuda=False, record_shapes=False, with_flops=False,
                 profile_memory=False, with_stack=False, with_modules=False, use_kineto=False,
                 use_cpu=True, experimental_config=None):
        self.enabled = bool(enabled)
        self.use_cuda = bool(use_cuda)
        self.record_shapes = bool(record_shapes) or bool(with_flops)
        self.with_flops = bool(with_flops)
        self.profile_memory = bool(profile_memory)
        self.with_stack = bool(with_stack)
        if not use_cpu:
            raise ValueError("use_cpu=False is not supported: tracegrad's profiler records "
                             "CPU-side events")
        self.function_events = None
        self.entered = False
        self._cupy = None
        if self.enabled and self.use_cuda:
            self._cupy = _cupy_or_none()
            if self._cupy is None:
                raise RuntimeError("profile(use_cuda=True) needs CuPy and a CUDA GPU; none was "
                                   "found. Profile with use_cuda=False.")

    # --- context -----------------------------------------------------------------
    def __enter__(self):
        if not self.enabled:
            return self
        if self.entered:
            raise RuntimeError("profiler context manager is not reentrant")
        if _state.current is not None:
            raise RuntimeError("Profiler is already enabled on this thread")
        self.entered = True
        self._events = []
        self._stack = []
        self._next_id = 0
        self._tid = threading.get_native_id()
        self._started_tracemalloc = False
        if self.profile_memory and not tracemalloc.is_tracing():
            tracemalloc.start()
            self._started_tracemalloc = True
        self._np_dir = _numpy_dir() if self.with_stack else None
        _state.current = self
        recording_anywhere[0] += 1
        return self

    def __exit__(self, *exc):
        if not self.enabled:
            return False
        _state.current = None
        recording_anywhere[0] -= 1
        if self._started_tracemalloc:
            tracemalloc.stop()
        # ranges opened by ops that raised were never closed: drop them
        self._stack.clear()
        if self._cupy is not None:
            self._cupy.cuda.Device().synchronize()
            for e in self._events:
                if e._cuda_events is not None:
                    start, stop = e._cuda_events
                    e.cuda_time_total = self._cupy.cuda.get_elapsed_time(start, stop) * 1000.0
                    e._cuda_events = None
        self._events.sort(key=lambda e: (e.start_ns, -e.end_ns))
        self.function_events = EventList(self._events, use_cuda=self.use_cuda,
                                         profile_memory=self.profile_memory,
                                         with_flops=self.with_flops, with_stack=self.with_stack)
        return False

    # --- the recording interface (see profiler_state) ----------------------------------
    def _begin(self, name, kind, arrays=None, _frame=None):
        ev = FunctionEvent(self._next_id, name, kind, self._tid, 0)
        self._next_id += 1
        caller = sys._getframe(1)
        ev._frame = caller if _frame is None else _frame
        st = self._stack
        if st:
            # An op whose impl raised never reached _end: its range is still
            # on the stack although the frame that opened it has returned.
            # Drop such ranges so they do not adopt later events.
            while st and not _in_chain(st[-1]._frame, caller):
                st.pop()
            if st:
                ev.parent = st[-1]
        if self.record_shapes and arrays is not None:
            ev.input_shapes = _shapes_of(arrays)
            if self.with_flops and name == "matmul":
                ev.flops = _matmul_flops(ev.input_shapes)
        if self.with_stack:
            ev.stack = self._user_stack()
        self._stack.append(ev)
        if self.profile_memory:
            ev._mem0 = (tracemalloc.get_traced_memory()[0], self._gpu_used())
        if self._cupy is not None:
            start = self._cupy.cuda.Event()
            start.record()
            ev._cuda_events = (start, None)
        ev.start_ns = time.perf_counter_ns()
        return ev

    def _end(self, ev):
        t = time.perf_counter_ns()
        ev.end_ns = t
        if ev._cuda_events is not None:
            stop = self._cupy.cuda.Event()
            stop.record()
            ev._cuda_events = (ev._cuda_events[0], stop)
        if ev._mem0 is not None:
            cpu0, gpu0 = ev._mem0
            ev.cpu_memory_usage = tracemalloc.get_traced_memory()[0] - cpu0
            ev.cuda_memory_usage = self._gpu_used() - gpu0
            ev._mem0 = None
        ev._frame = None
        st = self._stack
        # pop ev and any range left open above it (an op that raised)
        for i in range(len(st) - 1, -1, -1):
            if st[i] is ev:
                del st[i:]
                break
        if not ev._open:
            return
        ev._open = False
        if ev.parent is not None:
            ev.parent.cpu_children.append(ev)
        self._events.append(ev)

    def _gpu_used(self):
        cp = sys.modules.get("cupy")
        if cp is None:
            return 0
        return cp.get_default_memory_pool().used_bytes()

    def _user_stack(self, limit=5):
        out = []
        f = sys._getframe(2)
        np_dir = self._np_dir
        while f is not None and len(out) < limit:
            fn = f.f_code.co_filename
            if not (fn.startswith(_SKIP_DIRS) or fn.startswith(np_dir) or fn.startswith("<frozen")):
                out.append(f"{fn}({f.f_lineno}): {f.f_code.co_name}")
            f = f.f_back
        return out

    # --- results --------------------------------------------------------------------
    def _check_finish(self):
        if self.function_events is None:
            raise RuntimeError("Profiler didn't finish running")

    def key_averages(self, group_by_input_shape=False, group_by_stack_n=0):
        self._check_finish()
        return self.function_events.key_averages(group_by_input_shape, group_by_stack_n)

    def total_average(self):
        self._check_finish()
        return self.function_events.total_average()

    @property
    def self_cpu_time_total(self):
        self._check_finish()
        return self.function_events.self_cpu_time_total

    def table(self, sort_by=None, row_limit=100, max_src_column_width=75, header=None,
              top_level_events_only=False):
        self._check_finish()
        return self.function_events.table(sort_by, row_limit, max_src_column_width, header,
                                          top_level_events_only)

    def export_chrome_trace(self, path):
        self._check_finish()
        return self.function_events.export_chrome_trace(path)

    def events(self):
        self._check_finish()
        return self.function_events

    def __str__(self):
        self._check_finish()
        return str(self.function_events)

    __repr__ = object.__repr__


class record_function(contextlib.ContextDecorator):
    """Mark a block of code as a named event in the active profiler
    (a no-op costing one attribute test when none is active).

    ``cat`` is the event's category in the Chrome trace; the compiler uses it
    for the child events of a compiled call."""

    def __init__(self, name, args=None, cat="user_annotation"):
        self.name = name if args is None else f"{name}({args})"
        self.cat = cat
        self._open = []

    def __enter__(self):
        prof = _state.current
        if prof is None:
            self._open.append((None, None))
        else:
            # the range belongs to the frame running the with-block
            self._open.append((prof, prof._begin(self.name, self.cat, None, sys._getframe(1))))
        return self

    def __exit__(self, *exc):
        prof, ev = self._open.pop()
        if prof is not None:
            prof._end(ev)
        return False


# --- NVTX ----------------------------------------------------------------------------

class _NvtxRecorder:
    """Pushes an NVTX range per event, and forwards to the profiler that was
    active before (if any)."""

    def __init__(self, nvtx, prev, record_shapes):
        self.nvtx = nvtx
        self.prev = prev
        self.record_shapes = record_shapes

    def _begin(self, name, kind, arrays=None, _frame=None):
        msg = name
        if self.record_shapes and arrays is not None:
            msg = f"{name}, sizes = {_shapes_of(arrays)}"
        self.nvtx.RangePush(msg)
        if self.prev is None:
            return None
        return self.prev._begin(name, kind, arrays, sys._getframe(1) if _frame is None else _frame)

    def _end(self, ev):
        self.nvtx.RangePop()
        if self.prev is not None:
            self.prev._end(ev)


def load_nvprof(path):
    """Open an nvprof trace (the SQLite file ``nvprof -o trace.prof`` writes,
    with the ranges ``emit_nvtx`` pushed) and return its ranges as an
    ``EventList``: one event per NVTX range, nested by time, each with the
    GPU kernels launched inside it (``event.kernels``, summed into
    ``cuda_time_total``)."""
    import sqlite3
    if not os.path.isfile(path):
        raise FileNotFoundError(f"load_nvprof: no such file: {path!r}")
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        conn.row_factory = sqlite3.Row
        try:
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master "
                                                  "WHERE type = 'table'")}
        except sqlite3.DatabaseError as e:
            raise RuntimeError(f"load_nvprof: {path!r} is not an nvprof trace (not an SQLite "
                               f"database: {e}); write one with nvprof -o FILE") from None
        need = {"StringTable", "CUPTI_ACTIVITY_KIND_MARKER"}
        if not need <= tables:
            raise RuntimeError(f"load_nvprof: {path!r} is not an nvprof trace: it lacks the "
                               f"table(s) {sorted(need - tables)}")
        strings = {r["_id_"]: r["value"] for r in conn.execute("SELECT _id_, value FROM StringTable")}
        # An NVTX range is two markers with one id: the start names it, the
        # end has name 0.  Timestamps are nanoseconds.
        events = {}
        for r in conn.execute(
                "SELECT s.id AS id, s.name AS name, s.timestamp AS t0, e.timestamp AS t1 "
                "FROM CUPTI_ACTIVITY_KIND_MARKER AS s JOIN CUPTI_ACTIVITY_KIND_MARKER AS e "
                "ON s.id = e.id WHERE s.name != 0 AND e.name = 0"):
            ev = FunctionEvent(r["id"], strings.get(r["name"], str(r["name"])), "nvtx", 0,
                               r["t0"])
            ev.end_ns = r["t1"]
            ev._open = False
            events[r["id"]] = ev
        ordered = sorted(events.values(), key=lambda e: (e.start_ns, -e.end_ns))
        # nesting by time: a range inside another is its child
        stack = []
        for ev in ordered:
            while stack and stack[-1].end_ns < ev.end_ns:
                stack.pop()
            if stack:
                ev.parent = stack[-1]
                stack[-1].cpu_children.append(ev)
            stack.append(ev)
        # kernels: a runtime call (a launch) correlated with the kernel it
        # started belongs to the innermost range around the call
        if {"CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL"} <= tables:
            import bisect
            starts = [ev.start_ns for ev in ordered]
            for r in conn.execute(
                    "SELECT rt.start AS call, k.start AS k0, k.end AS k1, k.name AS name, "
                    "k.deviceId AS device FROM CUPTI_ACTIVITY_KIND_RUNTIME AS rt JOIN "
                    "CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL AS k "
                    "ON k.correlationId = rt.correlationId"):
                i = bisect.bisect_right(starts, r["call"]) - 1
                ev = ordered[i] if i >= 0 else None
                while ev is not None and ev.end_ns < r["call"]:
                    ev = ev.parent
                if ev is not None:
                    ev.append_kernel(strings.get(r["name"], r["name"]), r["device"],
                                     (r["k1"] - r["k0"]) / 1000.0)
    finally:
        conn.close()
    return EventList(ordered, use_cuda=True)


def _nvtx_or_none():
    cupy = _cupy_or_none()
    if cupy is None:
        return None
    from cupy.cuda import nvtx
    if not getattr(nvtx, "available", True):
        return None
    return nvtx


class emit_nvtx:
    """Make every op, backward node and ``record_function`` block emit an
    NVTX range (for Nsight Systems / nvprof), through ``cupy.cuda.nvtx``.

    Without CuPy or a GPU there is nowhere to send the ranges, and the
    context manager does nothing (``.active`` is False)."""

    def __init__(self, enabled=True, record_shapes=False):
        self.enabled = bool(enabled)
        self.record_shapes = bool(record_shapes)
        self.active = False
        self._prev = None

    def __enter__(self):
        if not self.enabled:
            return self
        nvtx = _nvtx_or_none()
        if nvtx is None:
            return self
        self._prev = _state.current
        _state.current = _NvtxRecorder(nvtx, self._prev, self.record_shapes)
        recording_anywhere[0] += 1
        self.active = True
        return self

    def __exit__(self, *exc):
        if self.active:
            _state.current = self._prev
            recording_anywhere[0] -= 1
            self.active = False
        return False
