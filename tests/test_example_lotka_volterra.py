"""examples/lotka_volterra.py runs in its small mode: tracegrad's gradient
through scipy.integrate.solve_ivp agrees with central differences, and the
BFGS fit with it reaches the loss of the same fit with finite differences."""
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "lotka_volterra.py"


@pytest.mark.skipif(importlib.util.find_spec("scipy") is None, reason="needs SciPy")
def test_lotka_volterra_small(tmp_path):
    env = dict(os.environ, TRACEGRAD_CACHE_DIR=str(tmp_path / "cache"))
    r = subprocess.run([sys.executable, str(EXAMPLE), "--small"], env=env, capture_output=True,
                       text=True, timeout=120, cwd=str(tmp_path))
    assert r.returncode == 0, f"lotka_volterra.py failed:\n{r.stdout}\n{r.stderr}"
    out = r.stdout
    assert float(re.search(r"max relative difference ([0-9.e+-]+)", out).group(1)) < 1e-4, out
    start = float(re.search(r"start: loss ([0-9.]+)", out).group(1))
    fit_tg = float(re.search(r"fit with tg.grad\(loss\)\s*: loss ([0-9.]+)", out).group(1))
    fit_fd = float(re.search(r"fit with finite differences\s*: loss ([0-9.]+)", out).group(1))
    assert fit_tg < 0.75 * start, out
    assert fit_tg == pytest.approx(fit_fd, rel=1e-3), out
    assert re.search(r"one gradient: tracegrad [0-9.]+ ms, central differences", out), out
