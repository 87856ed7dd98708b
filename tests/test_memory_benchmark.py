"""benchmarks/memory.py on tiny inputs: NumPy by hand and tracegrad only."""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "memory.py")

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/status"),
                                reason="the memory benchmark reads Linux's /proc")


def test_memory_benchmark_prints_a_table(tmp_path):
    env = dict(os.environ, TRACEGRAD_CACHE_DIR=str(tmp_path))
    p = subprocess.run([sys.executable, SCRIPT, "--tiny", "--workloads", "W2",
                        "--systems", "numpy,tg-numpy,tg-native,tg-eager", "--jobs", "2"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert "Peak RSS growth during one call" in out
    assert "tracemalloc peak of one call" in out
    head = "| workload | inputs | NumPy by hand | tg numpy | tg native | tg compile=False |"
    assert out.count(head) == 2, out
    rows = [ln for ln in out.splitlines() if ln.startswith("| W2 chain")]
    assert len(rows) == 2, out
    number = r"\d+\.\d+(\+\d+\.\d+)?\*?"     # MiB; a+k: the native driver's kept buffers
    for row, dash in zip(rows, (False, True)):
        cells = [c.strip() for c in row.strip("|").split("|")][1:]
        assert len(cells) == 5, row
        # the tracemalloc table has "-" where the allocations are not traced
        # (the native target's whole-graph C function)
        assert all(re.fullmatch(number, c) or (dash and c == "-") for c in cells), row
        assert re.fullmatch(number, cells[1]) and re.fullmatch(number, cells[2]), row
    # the NumPy target's generated code: every statement parsed
    plan = [ln for ln in out.splitlines() if ln.startswith("| W2 | numpy |")]
    assert len(plan) == 1 and re.match(r"\| W2 \| numpy \| \d+ \| \d+ \|", plan[0]), out
