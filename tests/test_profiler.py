"""tg.autograd.profiler: profile, record_function, key_averages, Chrome traces, emit_nvtx."""
import json
import re
import threading

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.eager import profiler
from tracegrad.eager.profiler import profile, record_function, emit_nvtx
from tracegrad.eager.profiler_state import _state


def by_name(prof, name):
    return [e for e in prof.function_events if e.name == name]


def test_reference_example():
    x = tg.randn(1, 1, requires_grad=True)
    with profile() as prof:
        for _ in range(100):
            y = x ** 2
            y.backward()
    assert _state.current is None
    avg = {e.key: e for e in prof.key_averages()}
    assert avg["pow"].count == 100
    assert avg["PowBackward0"].count == 100
    # every op run inside PowBackward0 is its child, and its self time leaves them out
    for ev in by_name(prof, "PowBackward0"):
        assert ev.cat == "backward"
        children = ev.cpu_children
        assert children and all(c.parent is ev for c in children)
        assert ev.self_cpu_time_total == pytest.approx(
            ev.cpu_time_total - sum(c.cpu_time_total for c in children))
    n_child_ops = sum(len(ev.cpu_children) for ev in by_name(prof, "PowBackward0"))
    assert sum(a.count for k, a in avg.items() if k not in ("pow", "PowBackward0")) == n_child_ops
    np.testing.assert_allclose(x.grad.numpy(), 100 * 2 * x.detach().numpy(), rtol=1e-5)  # float32

    table = prof.key_averages().table(sort_by="self_cpu_time_total")
    lines = table.splitlines()
    assert lines[1].split()[:4] == ["Name", "Self", "CPU", "%"]
    assert "# of Calls" in lines[1]
    body = [ln.split()[0] for ln in lines[3:-2]]
    assert set(body) == set(avg)
    selfs = [avg[k].self_cpu_time_total for k in body]
    assert selfs == sorted(selfs, reverse=True)
    assert lines[-1].startswith("Self CPU time total: ")


def test_averages_and_totals_are_consistent():
    a = tg.tensor(np.ones(10), requires_grad=True)
    with profile() as prof:
        for _ in range(3):
            (a * 2.0).exp().sum().backward()
    events = prof.function_events
    total = prof.total_average()
    assert total.key == "Total" and total.count == len(events)
    assert total.self_cpu_time_total == pytest.approx(prof.self_cpu_time_total)
    assert prof.self_cpu_time_total == pytest.approx(sum(e.self_cpu_time_total for e in events))
    top = sum(e.cpu_time_total for e in events if e.parent is None)
    assert prof.self_cpu_time_total == pytest.approx(top)
    for avg in prof.key_averages():
        evs = [e for e in events if e.name == avg.key]
        assert avg.count == len(evs)
        assert avg.cpu_time_total == pytest.approx(sum(e.cpu_time_total for e in evs))
        assert avg.cpu_time == pytest.approx(avg.cpu_time_total / avg.count)
    assert {"mul", "exp", "sum", "MulBackward0", "ExpBackward0", "SumBackward0"} <= {
        e.key for e in prof.key_averages()}


def test_record_function_nests_and_self_time():
    x = tg.tensor([1.0, 2.0])
    with profile() as prof:
        with record_function("outer"):
            y = x * 3
            with record_function("inner"):
                y = y + 1
    outer, = by_name(prof, "outer")
    inner, = by_name(prof, "inner")
    mul, = by_name(prof, "mul")
    add, = by_name(prof, "add")
    assert outer.cat == "user_annotation" and outer.parent is None
    assert mul.parent is outer and inner.parent is outer and add.parent is inner
    assert outer.self_cpu_time_total == pytest.approx(
        outer.cpu_time_total - mul.cpu_time_total - inner.cpu_time_total)
    assert outer.start_ns <= mul.start_ns <= mul.end_ns <= inner.start_ns <= add.start_ns
    assert add.end_ns <= inner.end_ns <= outer.end_ns
    table = prof.function_events.table(top_level_events_only=True)
    assert "outer" in table and "inner" not in table


def test_record_function_without_profiler_and_as_decorator():
    with record_function("nothing"):
        pass
    assert _state.current is None

    @record_function("decorated")
    def f(t):
        return t * 2

    with profile() as prof:
        f(tg.tensor([1.0]))
        f(tg.tensor([1.0]))
    evs = by_name(prof, "decorated")
    assert len(evs) == 2 and all(e.cpu_children[0].name == "mul" for e in evs)


def test_compiled_call_interface():
    # what the compiler does: one "compiled" event, one child per kernel
    with profile() as prof:
        ev = _state.current._begin("compiled:loss", "compiled", [np.ones((2, 3))])
        with record_function("kernel_0", cat="kernel"):
            np.ones(10).sum()
        with record_function("kernel_1", cat="kernel"):
            pass
        _state.current._end(ev)
    top, = by_name(prof, "compiled:loss")
    assert top.cat == "compiled"
    assert [c.name for c in top.cpu_children] == ["kernel_0", "kernel_1"]
    assert [c.cat for c in top.cpu_children] == ["kernel", "kernel"]


def test_record_shapes_and_group_by_input_shape():
    with profile(record_shapes=True) as prof:
        tg.ones(2, 3) * tg.ones(2, 3)
        tg.ones(4) * 2.0
        tg.ones(4) * 3.0
    muls = by_name(prof, "mul")
    assert [m.input_shapes for m in muls] == [[[2, 3], [2, 3]], [[4], []], [[4], []]]
    grouped = {str(a.input_shapes): a.count for a in prof.key_averages(group_by_input_shape=True)
               if a.key == "mul"}
    assert grouped == {"[[2, 3], [2, 3]]": 1, "[[4], []]": 2}
    assert [a.count for a in prof.key_averages() if a.key == "mul"] == [3]
    assert "Input Shapes" in prof.key_averages(group_by_input_shape=True).table()


def test_profile_memory_records_output_bytes():
    a = tg.tensor(np.ones(5000))
    with profile(profile_memory=True) as prof:
        b = a * 2.0
    mul, = by_name(prof, "mul")
    assert b.nbytes == 40000
    assert 40000 <= mul.cpu_memory_usage < 40000 + 4096
    table = prof.key_averages().table(sort_by="cpu_memory_usage")
    assert "CPU Mem" in table
    assert re.search(r"  39\.\d\d Kb  ", table)


def test_with_stack_records_user_line():
    import inspect
    with profile(with_stack=True) as prof:
        line = inspect.currentframe().f_lineno + 1
        tg.tensor([1.0]) * 2.0
    mul, = by_name(prof, "mul")
    assert mul.stack[0] == f"{__file__}({line}): test_with_stack_records_user_line"
    assert "Source Location" in prof.key_averages().table()


def test_with_flops_for_matmul():
    with profile(with_flops=True) as prof:
        tg.ones(2, 3) @ tg.ones(3, 4)
    mm, = by_name(prof, "matmul")
    assert mm.flops == 2 * 2 * 3 * 4
    assert "Total MFLOPs" in prof.key_averages().table()


def test_chrome_trace(tmp_path):
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    with profile(record_shapes=True) as prof:
        with record_function("step"):
            (x * x).sum().backward()
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    data = json.loads(path.read_text())
    evs = data["traceEvents"]
    assert len(evs) == len(prof.function_events)
    for e in evs:
        assert e["ph"] == "X"
        assert isinstance(e["ts"], (int, float)) and isinstance(e["dur"], (int, float))
        assert e["dur"] >= 0 and e["ts"] >= 0
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
        assert {"name", "cat", "args"} <= set(e)
    names = {e["name"]: e for e in evs}
    assert {"step", "mul", "sum", "SumBackward0", "MulBackward0"} <= set(names)
    assert names["mul"]["cat"] == "op" and names["MulBackward0"]["cat"] == "backward"
    assert names["mul"]["args"]["Input Shapes"] == [[2], [2]]
    step = names["step"]
    for e in evs:   # everything nests inside "step" on the timeline
        assert step["ts"] <= e["ts"] and e["ts"] + e["dur"] <= step["ts"] + step["dur"] + 1e-3
    with pytest.raises(TypeError, match="raw events"):
        prof.key_averages().export_chrome_trace(str(path))


def test_errors_and_disabled():
    with profile(enabled=False) as prof:
        tg.ones(2) * 2
        assert _state.current is None
    with pytest.raises(RuntimeError, match="Profiler didn't finish running"):
        prof.key_averages()
    with profile():
        with pytest.raises(RuntimeError, match="Profiler is already enabled on this thread"):
            with profile():
                pass
        with pytest.raises(ValueError, match="valid keys are"):
            profiler.EventList([]).table(sort_by="bogus")
    assert _state.current is None


def test_op_that_raises_leaves_no_open_range():
    with profile() as prof:
        with pytest.raises(ValueError):
            tg.ones(2, 3) @ tg.ones(4, 5)
        with record_function("after"):
            tg.ones(1) * 1.0
    after, = by_name(prof, "after")
    assert after.parent is None and [c.name for c in after.cpu_children] == ["mul"]
    assert by_name(prof, "matmul") == []


def test_only_this_thread_is_recorded():
    done = []
    with profile() as prof:
        t = threading.Thread(target=lambda: done.append(tg.ones(3) * 2))
        t.start()
        t.join()
        tg.ones(3) + 1.0
    assert done and [e.name for e in prof.function_events] == ["add"]


def test_custom_function_backward_event():
    class Exp(tg.autograd.Function):
        @staticmethod
        def forward(ctx, i):
            r = i.exp()
            ctx.save_for_backward(r)
            return r

        @staticmethod
        def backward(ctx, g):
            r, = ctx.saved_tensors
            return g * r

    x = tg.tensor([0.0], requires_grad=True)
    with profile() as prof:
        Exp.apply(x).sum().backward()
    ev, = by_name(prof, "ExpBackward")
    assert [c.name for c in ev.cpu_children] == ["mul"]


def test_emit_nvtx_is_a_noop_without_gpu(monkeypatch):
    monkeypatch.setattr(profiler, "_cupy_or_none", lambda: None)
    with emit_nvtx() as nv:
        assert nv.active is False and _state.current is None
        y = tg.ones(2) * 2
    np.testing.assert_allclose(y.numpy(), [2.0, 2.0])
    with profile() as prof:
        with emit_nvtx(record_shapes=True):
            tg.ones(2) * 2
    assert [e.name for e in prof.function_events] == ["mul"]
    with emit_nvtx(enabled=False) as nv:
        assert not nv.active


def test_emit_nvtx_pushes_ranges(monkeypatch):
    calls = []

    class FakeNvtx:
        @staticmethod
        def RangePush(msg):
            calls.append(("push", msg))

        @staticmethod
        def RangePop():
            calls.append(("pop",))

    monkeypatch.setattr(profiler, "_nvtx_or_none", lambda: FakeNvtx)
    with profile() as prof:
        with emit_nvtx(record_shapes=True) as nv:
            assert nv.active
            tg.ones(2) * 2
        assert _state.current is prof
    assert calls == [("push", "mul, sizes = [[2], []]"), ("pop",)]
    assert [e.name for e in prof.function_events] == ["mul"]


def test_use_cuda_without_gpu(monkeypatch):
    monkeypatch.setattr(profiler, "_cupy_or_none", lambda: None)
    with pytest.raises(RuntimeError, match=r"use_cuda=True\) needs CuPy and a CUDA GPU"):
        profile(use_cuda=True)


def _nvprof_file(path, markers, kernels):
    """An SQLite file with the tables nvprof writes (the columns load_nvprof
    reads): markers are (id, name or None for an end, timestamp ns);
    kernels are (launch time, kernel start, kernel end, name)."""
    import sqlite3
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE StringTable (_id_ INTEGER PRIMARY KEY, value TEXT)")
    conn.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_MARKER (_id_ INTEGER PRIMARY KEY, flags INT, "
                 "timestamp INT, id INT, objectKind INT, objectId BLOB, name INT, domain INT)")
    conn.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (_id_ INTEGER PRIMARY KEY, cbid INT, "
                 "start INT, end INT, processId INT, threadId INT, correlationId INT, "
                 "returnValue INT)")
    conn.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL (_id_ INTEGER PRIMARY KEY, "
                 "start INT, end INT, deviceId INT, correlationId INT, name INT)")
    names = {}

    def sid(text):
        if text not in names:
            names[text] = len(names) + 1
            conn.execute("INSERT INTO StringTable VALUES (?, ?)", (names[text], text))
        return names[text]

    for mid, name, t in markers:
        conn.execute("INSERT INTO CUPTI_ACTIVITY_KIND_MARKER (flags, timestamp, id, name) "
                     "VALUES (?, ?, ?, ?)", (2 if name else 4, t, mid, sid(name) if name else 0))
    for corr, (call, k0, k1, name) in enumerate(kernels, 1):
        conn.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME (cbid, start, end, correlationId) "
                     "VALUES (211, ?, ?, ?)", (call, call + 500, corr))
        conn.execute("INSERT INTO CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL (start, end, deviceId, "
                     "correlationId, name) VALUES (?, ?, 0, ?, ?)", (k0, k1, corr, sid(name)))
    conn.commit()
    conn.close()


def test_load_nvprof_reads_ranges_nesting_and_kernels(tmp_path):
    path = str(tmp_path / "trace.prof")
    # "step" [0, 100 us] holds "mul" [10, 30 us] and "MulBackward0" [40, 90 us],
    # which holds "mul" [50, 60 us]; three kernels launched inside them
    _nvprof_file(path,
                 [(1, "step", 0), (2, "mul", 10_000), (2, None, 30_000),
                  (3, "MulBackward0", 40_000), (4, "mul", 50_000), (4, None, 60_000),
                  (3, None, 90_000), (1, None, 100_000)],
                 [(12_000, 15_000, 19_000, "_tg_k0"), (52_000, 61_000, 63_000, "_tg_k1"),
                  (70_000, 71_000, 72_500, "_tg_k2")])
    events = profiler.load_nvprof(path)
    assert [e.name for e in events] == ["step", "mul", "MulBackward0", "mul"]
    step, mul1, back, mul2 = events
    assert step.cpu_time_total == 100.0 and back.cpu_time_total == 50.0
    assert mul1.parent is step and back.parent is step and mul2.parent is back
    assert step.self_cpu_time_total == 100.0 - 20.0 - 50.0
    assert [k.name for k in mul1.kernels] == ["_tg_k0"] and mul1.cuda_time_total == 4.0
    assert [k.name for k in mul2.kernels] == ["_tg_k1"] and mul2.cuda_time_total == 2.0
    assert [k.name for k in back.kernels] == ["_tg_k2"] and back.cuda_time_total == 1.5
    rows = {r.key: r for r in events.key_averages()}
    assert rows["mul"].count == 2 and rows["mul"].cuda_time_total == 6.0
    assert "Self CUDA" in events.table(sort_by="cuda_time_total")
    events.export_chrome_trace(str(tmp_path / "t.json"))


def test_load_nvprof_says_what_is_wrong(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file"):
        profiler.load_nvprof(str(tmp_path / "missing.prof"))
    bad = tmp_path / "bad.prof"
    bad.write_text("not a database at all, just text " * 100)
    with pytest.raises(RuntimeError, match="not an nvprof trace"):
        profiler.load_nvprof(str(bad))
    import sqlite3
    other = str(tmp_path / "other.db")
    sqlite3.connect(other).execute("CREATE TABLE t (x INT)").connection.commit()
    with pytest.raises(RuntimeError, match="lacks the table"):
        profiler.load_nvprof(other)
