"""Every program in examples/ runs to completion in its small (CI) mode, and
the losses it prints fall."""
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def needs(module):
    return pytest.mark.skipif(importlib.util.find_spec(module) is None,
                              reason=f"{module} is not installed (pip install '.[examples]')")


def run_example(path, tmp_path, *args):
    env = dict(os.environ, TRACEGRAD_CACHE_DIR=str(tmp_path / "cache"))
    r = subprocess.run([sys.executable, str(EXAMPLES / path), "--small", *args], env=env,
                       capture_output=True, text=True, timeout=120, cwd=str(tmp_path))
    assert r.returncode == 0, f"{path} failed:\n{r.stdout}\n{r.stderr}"
    return r.stdout


def losses(text, word="loss"):
    return [float(v) for v in re.findall(rf"{word}\s+([0-9.]+)", text)]


def test_quickstart(tmp_path):
    out = run_example("quickstart.py", tmp_path)
    ls = losses(out)
    assert len(ls) >= 5 and ls[-1] < ls[0] / 50
    assert all(b < a for a, b in zip(ls, ls[1:]))


def test_quickstart_shows_generated_source(tmp_path):
    out = run_example("quickstart.py", tmp_path, "--show-source")
    assert "def value_and_grad(w, b, x, y):" in out and "np.tanh" in out


@needs("scipy")
def test_scipy_fit(tmp_path):
    out = run_example("scipy_fit.py", tmp_path)
    assert "Optimization terminated successfully" in out
    fitted = re.search(r"fitted .*: \[([^\]]+)\]", out).group(1).split()
    assert abs(float(fitted[2]) - 2.5) < 0.05   # omega recovered


@needs("sklearn")
def test_digits_eager_and_compiled(tmp_path):
    out = run_example("digits_mlp.py", tmp_path)
    for mode in ("eager", "compiled"):
        ls = [float(v) for v in re.findall(rf"{mode}\s+epoch\s+\d+\s+mean loss ([0-9.]+)", out)]
        assert len(ls) >= 3 and ls[-1] < ls[0] / 2, out
        acc = float(re.search(rf"{mode}: test accuracy ([0-9.]+)", out).group(1))
        assert acc > 0.85, out


def test_projectile(tmp_path):
    out = run_example("projectile.py", tmp_path)
    d = [float(v) for v in re.findall(r"miss distance\s+([0-9.]+)", out)]
    assert d[-1] < d[0] / 20
    g = re.search(r"tracegrad \[([^\]]+)\]\s+finite differences \[([^\]]+)\]", out)
    assert [float(v) for v in g.group(1).split()] == pytest.approx(
        [float(v) for v in g.group(2).split()], abs=2e-6)


def test_standalone_compile_and_use(tmp_path):
    out = run_example("standalone/compile_and_use.py", tmp_path, "--out", str(tmp_path / "gen"))
    assert (tmp_path / "gen" / "loss_grad.py").is_file()
    ls = losses(out)
    assert len(ls) >= 3 and ls[-1] < ls[0] / 2
    assert "a float32 weight vector is refused: loss(): argument 'w' must be float64[5], " \
           "got float32[5]" in out


def test_bayesian_regression_vi(tmp_path):
    out = run_example("bayesian_regression_vi.py", tmp_path)
    elbos = [float(v) for v in re.findall(r"elbo\s+(-?[0-9.]+)", out)]
    assert len(elbos) >= 5 and elbos[-1] > elbos[0] + 50      # the bound rises
    assert len(set(elbos[1:])) > 1                            # fresh Monte Carlo draws per call
    err = float(re.search(r"largest mean error ([0-9.]+)", out).group(1))
    assert err < 0.05                                         # the exact posterior mean
