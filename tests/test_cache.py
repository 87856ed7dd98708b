"""The compile cache: memory and disk levels, shared by processes, robust to
corrupt, stale, foreign and read-only entries."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.runtime import cache


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("TRACEGRAD_CACHE_DIR", str(d))
    monkeypatch.delenv("TRACEGRAD_CACHE", raising=False)
    tg.clear_cache()
    yield d
    tg.clear_cache(disk=False)


USER_MODULE = """
import numpy as np

SCALE = {scale}

def helper(z):
    return {helper_body}

def loss(w, x, y):
    return np.mean((helper(x @ w) - y) ** 2) * SCALE
"""

RUNNER = """
import json, sys
import numpy as np
sys.path.insert(0, {folder!r})
import tracegrad as tg
import userfn
rng = np.random.default_rng(0)
w, x, y = rng.standard_normal((4, 3)), rng.standard_normal((6, 4)), rng.standard_normal((6, 3))
v, g = tg.value_and_grad(userfn.loss)(w, x, y)
info = tg.cache_info()
info["value"] = float(v)
info["grad"] = g.tolist()
info["modules"] = sorted(m for m in ("networkx", "jinja2") if m in sys.modules)
print(json.dumps(info))
"""


def _write_user_module(folder, scale=1.0, helper_body="np.tanh(z)"):
    (folder / "userfn.py").write_text(USER_MODULE.format(scale=scale, helper_body=helper_body))
    for p in folder.glob("__pycache__/*"):
        p.unlink()


def _env(cache_dir):
    """The child imports the same tracegrad as this test process."""
    pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(tg.__file__)))
    path = os.pathsep.join(p for p in (pkg_parent, os.environ.get("PYTHONPATH")) if p)
    return dict(os.environ, TRACEGRAD_CACHE_DIR=str(cache_dir), PYTHONDONTWRITEBYTECODE="1",
                PYTHONPATH=path)


def _run(folder, cache_dir, extra_env=None):
    script = folder / "runner.py"
    script.write_text(RUNNER.format(folder=str(folder)))
    env = _env(cache_dir)
    env.update(extra_env or {})
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1]), r.stderr


def _expected(scale, act):
    rng = np.random.default_rng(0)
    w, x, y = rng.standard_normal((4, 3)), rng.standard_normal((6, 4)), rng.standard_normal((6, 3))
    W = tg.tensor(w, requires_grad=True)
    v = tg.mean((act(tg.tensor(x) @ W) - tg.tensor(y)) ** 2) * scale
    v.backward()
    return v.item(), W.grad.numpy()


def test_second_process_hits_disk_cache_without_compiling(tmp_path, cache_dir):
    _write_user_module(tmp_path)
    first, _ = _run(tmp_path, cache_dir)
    assert first["compiles"] == 1 and first["disk_hits"] == 0
    second, _ = _run(tmp_path, cache_dir)
    assert second["compiles"] == 0
    assert second["disk_hits"] >= 1
    # a cache hit needs neither networkx nor Jinja2
    assert second["modules"] == []
    v, g = _expected(1.0, tg.tanh)
    assert second["value"] == pytest.approx(v, rel=1e-12)
    np.testing.assert_allclose(second["grad"], g, rtol=1e-10)


def test_edited_helper_or_global_is_never_served_stale(tmp_path, cache_dir):
    _write_user_module(tmp_path)
    _run(tmp_path, cache_dir)
    # edit the helper the function calls
    _write_user_module(tmp_path, helper_body="np.sin(z)")
    after_edit, _ = _run(tmp_path, cache_dir)
    assert after_edit["compiles"] == 1
    v, g = _expected(1.0, tg.sin)
    assert after_edit["value"] == pytest.approx(v, rel=1e-12)
    np.testing.assert_allclose(after_edit["grad"], g, rtol=1e-10)
    # change a global constant
    _write_user_module(tmp_path, scale=3.0, helper_body="np.sin(z)")
    after_global, _ = _run(tmp_path, cache_dir)
    assert after_global["compiles"] == 1
    assert after_global["value"] == pytest.approx(3.0 * v, rel=1e-12)


def test_new_tracegrad_version_changes_the_key(cache_dir, monkeypatch):
    f = tg.grad(lambda x: np.sum(np.exp(x)))
    f(np.ones(3))
    assert tg.cache_info()["compiles"] == 1
    import tracegrad.api as api
    monkeypatch.setattr(api, "__version__", "999.0")
    g = tg.grad(lambda x: np.sum(np.exp(x)))
    g(np.ones(3))
    assert tg.cache_info()["compiles"] == 2


def _entries(d):
    return sorted(p for p in d.iterdir() if p.suffix == ".py")


@pytest.mark.parametrize("damage", ["truncate", "garbage", "edit_body", "empty"])
def test_corrupt_entry_is_recompiled_and_replaced(cache_dir, damage):
    f = lambda x: np.sum(np.sin(x) ** 2)  # noqa: E731
    x = np.linspace(0, 1, 5)
    ref = tg.grad(f)(x)
    (entry,) = _entries(cache_dir)
    text = entry.read_text()
    if damage == "truncate":
        entry.write_text(text[: len(text) // 2])
    elif damage == "garbage":
        entry.write_bytes(b"\x00\xff not python at all")
    elif damage == "edit_body":
        entry.write_text(text.replace("np.sin", "np.cos"))
    else:
        entry.write_text("")
    tg.clear_cache(disk=False)      # forget the memory level, as a new process would
    got = tg.grad(f)(x)
    np.testing.assert_allclose(got, ref)
    info = tg.cache_info()
    assert info["disk_errors"] == 1 and info["compiles"] == 1
    # the entry was replaced by a good one
    tg.clear_cache(disk=False)
    tg.grad(f)(x)
    assert tg.cache_info()["disk_hits"] == 1 and tg.cache_info()["compiles"] == 0


def test_entry_writable_by_others_is_not_executed(cache_dir):
    f = lambda x: np.sum(x * 3.0)  # noqa: E731
    tg.grad(f)(np.ones(2))
    (entry,) = _entries(cache_dir)
    entry.write_text(entry.read_text().replace("3.0", "4.0"))
    os.chmod(entry, 0o666)
    tg.clear_cache(disk=False)
    np.testing.assert_allclose(tg.grad(f)(np.ones(2)), [3.0, 3.0])
    assert tg.cache_info()["disk_errors"] == 1


def test_cache_folder_is_private(cache_dir):
    tg.grad(lambda x: np.sum(x))(np.ones(2))
    assert (os.stat(cache_dir).st_mode & 0o077) == 0
    for p in cache_dir.iterdir():
        assert (os.stat(p).st_mode & 0o077) == 0


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0,
                    reason="root can write into read-only folders")
def test_read_only_folder_falls_back_to_memory(tmp_path, monkeypatch):
    d = tmp_path / "ro"
    d.mkdir()
    os.chmod(d, 0o500)
    monkeypatch.setenv("TRACEGRAD_CACHE_DIR", str(d))
    tg.clear_cache(disk=False)
    cache._warned_dirs.clear()
    with pytest.warns(RuntimeWarning, match="memory only"):
        v = tg.grad(lambda x: np.sum(x ** 2))(np.ones(3))
    np.testing.assert_allclose(v, [2, 2, 2])


def test_unwritable_folder_falls_back_to_memory_with_one_warning(tmp_path, monkeypatch):
    # a path under a regular file can never be created, even by root
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("TRACEGRAD_CACHE_DIR", str(blocker / "cache"))
    tg.clear_cache(disk=False)
    cache._warned_dirs.clear()
    with pytest.warns(RuntimeWarning, match="memory only") as rec:
        v = tg.grad(lambda x: np.sum(x ** 2))(np.ones(3))
        tg.grad(lambda x: np.sum(x ** 3))(np.ones(3))
    assert len([w for w in rec if "memory only" in str(w.message)]) == 1
    np.testing.assert_allclose(v, [2, 2, 2])


def test_cache_disabled_by_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACEGRAD_CACHE", "0")
    monkeypatch.setenv("TRACEGRAD_CACHE_DIR", str(tmp_path / "never"))
    tg.clear_cache(disk=False)
    tg.grad(lambda x: np.sum(x ** 2))(np.ones(3))
    assert not (tmp_path / "never").exists()
    assert tg.cache_info()["disk_entries"] == 0


def test_cache_info_and_clear(cache_dir):
    tg.grad(lambda x: np.sum(np.exp(x)))(np.ones(3))
    info = tg.cache_info()
    for k in ("traces", "compiles", "memory_hits", "disk_hits", "disk_entries", "disk_bytes"):
        assert k in info
    assert info["disk_entries"] == 1 and info["disk_bytes"] > 0
    tg.clear_cache()
    info = tg.cache_info()
    assert info["disk_entries"] == 0 and info["traces"] == 0


def test_explain_names_the_changed_part(cache_dir, monkeypatch, capsys):
    monkeypatch.setenv("TRACEGRAD_EXPLAIN", "1")
    g = tg.grad(lambda x: np.sum(np.exp(x)))
    g(np.ones(3))
    g(np.ones(4))
    err = capsys.readouterr().err
    assert "recompiling" in err and "signature" in err and "float64[3]" in err and "float64[4]" in err


def test_eight_processes_compile_into_one_folder(tmp_path, cache_dir):
    _write_user_module(tmp_path)
    script = tmp_path / "runner.py"
    script.write_text(RUNNER.format(folder=str(tmp_path)))
    env = _env(cache_dir)
    procs = [subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for _ in range(8)]
    v, g = _expected(1.0, tg.tanh)
    for p in procs:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err
        info = json.loads(out.strip().splitlines()[-1])
        assert info["value"] == pytest.approx(v, rel=1e-12)
        np.testing.assert_allclose(info["grad"], g, rtol=1e-10)
    entries = _entries(cache_dir)
    assert len(entries) == 1
    assert not [p for p in cache_dir.iterdir() if p.name.startswith(".tmp-")]
