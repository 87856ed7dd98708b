"""The disk cache's size cap (TRACEGRAD_CACHE_MAX_BYTES): sizes by kind, the
least recently used entries evicted past the cap, other versions first,
processes sharing the folder while they store and prune, `tracegrad cache
prune` and `cache info`.  See "The cache" in docs/guide.md."""
import json
import os
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.runtime import cache, toolchain


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("TRACEGRAD_CACHE_DIR", str(d))
    monkeypatch.delenv("TRACEGRAD_CACHE", raising=False)
    monkeypatch.delenv("TRACEGRAD_CACHE_MAX_BYTES", raising=False)
    cache._warned_dirs.clear()
    tg.clear_cache()
    yield d
    tg.clear_cache(disk=False)


def f(x):
    return np.sum(np.sin(x) ** 2)


def ref(n):
    x = np.linspace(0.0, 1.0, n)
    return 2 * np.sin(x) * np.cos(x)


def compile_for(n, backend=None):
    """Compile and run tg.grad(f) for float64[n] (one entry per n); check the result."""
    kw = {} if backend is None else {"backend": backend}
    np.testing.assert_allclose(tg.grad(f, **kw)(np.linspace(0.0, 1.0, n)), ref(n), rtol=1e-12)


def new_process():
    """Forget the memory level and the counters, as a new process would."""
    tg.clear_cache(disk=False)


def entries(d):
    return {p.stem for p in d.glob("*.py") if not p.name.startswith(".")}


def entry_for(n, d, backend=None):
    """The key hash of the entry ``compile_for(n)`` writes."""
    before = entries(d) if d.exists() else set()
    new_process()
    compile_for(n, backend)
    (key,) = entries(d) - before
    return key


def set_last_use(d, key, seconds_ago):
    for p in d.glob(key + "*"):
        t = time.time() - seconds_ago
        os.utime(p, (t, t))


def folder_bytes(d):
    return cache.disk_usage(str(d))["bytes"]


# --- the setting ------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("1073741824", 2 ** 30), ("0", 0), ("500MB", 500 * 10 ** 6), ("1.5GiB", 3 * 2 ** 29),
    ("2G", 2 * 2 ** 30), ("800 kB", 800_000), ("64k", 65536), (" 12 ", 12), ("3b", 3)])
def test_sizes_parse(text, expected):
    assert cache.parse_size(text) == expected


@pytest.mark.parametrize("text", ["lots", "-5", "1.5x", "", "1e9", "GiB"])
def test_a_bad_size_says_how_to_write_one(text):
    with pytest.raises(ValueError, match="500MB"):
        cache.parse_size(text)


@pytest.mark.usefixtures("numpy_target")
def test_invalid_environment_value_warns_once_naming_it_and_uses_the_default(cache_dir,
                                                                              monkeypatch):
    monkeypatch.setenv("TRACEGRAD_CACHE_MAX_BYTES", "a lot")
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        compile_for(3)
        compile_for(4)
        info = tg.cache_info()
    said = [str(w.message) for w in rec if "TRACEGRAD_CACHE_MAX_BYTES" in str(w.message)]
    assert len(said) == 1 and "'a lot'" in said[0] and "500MB" in said[0], said
    assert info["disk_max_bytes"] == cache.DEFAULT_MAX_BYTES == 2 ** 30
    assert info["disk_entries"] == 2


@pytest.mark.usefixtures("numpy_target")
def test_zero_means_no_limit(cache_dir, monkeypatch):
    monkeypatch.setenv("TRACEGRAD_CACHE_MAX_BYTES", "0")
    for n in range(3, 9):
        compile_for(n)
    info = tg.cache_info()
    assert info["disk_max_bytes"] == 0 and info["disk_entries"] == 6
    assert info["disk_evictions"] == 0
    r = cache.prune()
    assert r["evicted_entries"] == 0 and tg.cache_info()["disk_entries"] == 6


# --- sizes by kind -----------------------------------------------------------------------------

@pytest.mark.usefixtures("numpy_target")
def test_info_counts_sizes_by_kind_and_keeps_its_old_keys(cache_dir):
    key = entry_for(3, cache_dir)
    (cache_dir / "notes.txt").write_text("mine, not tracegrad's")
    (cache_dir / ".tmp-abc-x.py").write_text("a write in progress")
    info = tg.cache_info()
    for k in ("traces", "compiles", "memory_hits", "disk_hits", "disk_misses", "disk_writes",
              "disk_errors", "memory_entries", "memory_size", "disk_entries", "disk_bytes",
              "cache_dir", "target", "targets"):
        assert k in info
    size = sum((cache_dir / (key + ext)).stat().st_size for ext in (".py", ".json"))
    assert info["disk_numpy_count"] == 1 and info["disk_numpy_bytes"] == size
    assert info["disk_bytes"] == size and info["disk_entries"] == 1     # temp, other: not counted
    assert info["disk_temp_count"] == 1 and info["disk_temp_bytes"] == len("a write in progress")
    assert info["disk_other_count"] == 1
    assert info["disk_native_count"] == info["disk_shared_object_count"] == 0
    assert info["disk_max_bytes"] == 2 ** 30


# --- the cap, least recently used first -------------------------------------------------------

@pytest.mark.usefixtures("numpy_target")
def test_cap_is_honoured_and_a_recently_hit_entry_survives(cache_dir, monkeypatch):
    keys = [entry_for(n, cache_dir) for n in (3, 4, 5, 6)]
    one = folder_bytes(cache_dir) // 4
    for age, key in zip((400, 300, 200, 100), keys):    # used in this order, the first oldest
        set_last_use(cache_dir, key, age)
    new_process()
    compile_for(3)          # a disk hit: the oldest entry becomes the most recently used
    assert tg.cache_info()["disk_hits"] == 1
    cap = int(one * 4.5)    # four entries; past the cap, pruned to 90% of it: four again
    monkeypatch.setenv("TRACEGRAD_CACHE_MAX_BYTES", str(cap))
    for n in (7, 8, 9):
        compile_for(n)
        assert folder_bytes(cache_dir) <= cap
    evicted = tg.cache_info()["disk_evictions"]      # in this process, since new_process()
    left = entries(cache_dir)
    assert keys[0] in left                                  # hit recently: kept
    assert not left & set(keys[1:])                         # the least recently used: gone
    assert evicted == 3 and len(left) == 4
    # every entry left loads, and the evicted ones are compiled again, right
    for n in range(3, 10):
        new_process()
        compile_for(n)


@pytest.mark.usefixtures("numpy_target")
def test_a_write_counts_its_bytes_without_scanning_the_folder(cache_dir, monkeypatch):
    scans = []
    real_scan = cache._scan
    monkeypatch.setattr(cache, "_scan", lambda d: scans.append(d) or real_scan(d))
    compile_for(3)          # no count yet: one scan makes it
    for n in range(4, 9):
        compile_for(n)
    assert len(scans) == 1
    usage = cache_dir / cache.USAGE_FILE
    u = json.loads(usage.read_text())
    assert u["bytes"] + u["added"] - u["at_scan"] == folder_bytes(cache_dir)    # exact here
    assert tg.cache_info()["disk_other_count"] == 0         # the count is not a stray file
    for damage in ("{not json", json.dumps(dict(u, scanned=int(time.time()) - 2 * 86400))):
        usage.write_text(damage)        # damaged, or a scan a day old: the next write scans
        scans.clear()
        compile_for(9 if damage.startswith("{n") else 10)
        assert len(scans) == 1
        u = json.loads(usage.read_text())
        assert u["bytes"] + u["added"] - u["at_scan"] == folder_bytes(cache_dir)


@pytest.mark.usefixtures("numpy_target")
def test_entries_loaded_in_memory_outlive_their_eviction(cache_dir):
    g = tg.grad(f)
    x = np.linspace(0.0, 1.0, 5)
    g(x)
    r = cache.prune(1)
    assert r["evicted_entries"] == 1 and not entries(cache_dir)
    np.testing.assert_allclose(g(x), ref(5))         # from memory
    new_process()
    np.testing.assert_allclose(tg.grad(f)(x), ref(5))    # compiled again
    assert tg.cache_info()["compiles"] == 1


def _entry_of_another_version(d, key, **changes):
    """A copy of the entry ``key`` as another tracegrad would have written it."""
    parts = json.loads((d / (key + ".json")).read_text())
    parts.update(changes)
    other = cache.key_hash(parts)
    source = (d / (key + ".py")).read_text().partition("\n")[2]
    (d / (other + ".py")).write_text(cache.entry_text(other, source))
    (d / (other + ".json")).write_text(json.dumps(parts))
    for p in (d / (other + ".py"), d / (other + ".json")):
        p.chmod(0o600)
    return other


@pytest.mark.usefixtures("numpy_target")
def test_entries_of_other_versions_go_first(cache_dir):
    current = [entry_for(n, cache_dir) for n in (3, 4, 5)]
    current_bytes = folder_bytes(cache_dir)
    for i, key in enumerate(current):
        set_last_use(cache_dir, key, 1000 - i)      # older than the other versions' entries
    old_version = _entry_of_another_version(cache_dir, current[0], version="0.0.1")
    old_templates = _entry_of_another_version(cache_dir, current[1], templates="0" * 16)
    # an entry of an older format, without its .json
    old_format = "f" * 32
    src = (cache_dir / (current[2] + ".py")).read_text().partition("\n")[2]
    (cache_dir / (old_format + ".py")).write_text(
        cache.entry_text(old_format, src).replace(f"format={cache.ENTRY_FORMAT}", "format=1"))
    info = tg.cache_info()
    assert info["disk_other_version_count"] == 3 and info["disk_numpy_count"] == 3
    assert info["disk_entries"] == 6
    r = cache.prune(current_bytes)
    assert r["removed"]["other_version"] == 3 and r["removed"]["lru"] == 0
    assert entries(cache_dir) == set(current)
    assert not {old_version, old_templates, old_format} & entries(cache_dir)
    r = cache.prune(folder_bytes(cache_dir) - 1)     # then the least recently used
    assert r["removed"]["lru"] == 1 and entries(cache_dir) == set(current[1:])


# --- pieces, temporary files, half-removed entries --------------------------------------------

@pytest.mark.usefixtures("numpy_target")
def test_pieces_and_stale_temporary_files_are_removed_writes_in_progress_kept(cache_dir):
    key = entry_for(3, cache_dir)
    piece = cache_dir / ("a" * 32 + ".json")
    piece.write_text("{}")
    obj = cache_dir / ("b" * 32 + "-" + "0" * 16 + ".so")
    obj.write_bytes(b"\0" * 10)
    fresh_obj = cache_dir / ("c" * 32 + "-" + "0" * 16 + ".so")   # may be loading: kept
    fresh_obj.write_bytes(b"\0" * 10)
    stale = cache_dir / ".tmp-crashed-x.py"
    stale.write_text("half")
    in_progress = cache_dir / ".tmp-writing-y.py"
    in_progress.write_text("half")
    other = cache_dir / "README"
    other.write_text("not tracegrad's")
    hour_ago = time.time() - 2 * cache.STALE_TEMP_SECONDS
    for p in (stale, obj, piece):
        os.utime(p, (hour_ago, hour_ago))
    assert tg.cache_info()["disk_orphan_count"] == 3
    r = cache.prune()      # under the cap: no entry goes, the garbage does
    assert r["removed"] == {"other_version": 0, "lru": 0, "recipe": 0, "orphan": 2, "temp": 1}
    assert not piece.exists() and not obj.exists() and not stale.exists()
    assert fresh_obj.exists() and in_progress.exists() and other.exists()
    assert entries(cache_dir) == {key}


@pytest.mark.usefixtures("numpy_target")
def test_an_entry_half_removed_is_a_miss_and_rebuilt(cache_dir):
    key = entry_for(4, cache_dir)
    (cache_dir / (key + ".py")).unlink()          # a pruner removed the source, not yet the rest
    new_process()
    compile_for(4)
    info = tg.cache_info()
    assert info["compiles"] == 1 and info["disk_errors"] == 0 and info["disk_hits"] == 0
    assert (cache_dir / (key + ".py")).exists()
    (cache_dir / (key + ".json")).unlink()        # the .json gone: still a hit
    new_process()
    compile_for(4)
    assert tg.cache_info()["disk_hits"] == 1


# --- the native target's shared objects --------------------------------------------------------

needs_cc = pytest.mark.skipif(toolchain.recipe_or_none() is None,
                              reason="the native target needs a C compiler")


@needs_cc
def test_native_entries_count_their_shared_objects_and_a_loaded_one_survives_eviction(
        cache_dir):
    g = tg.grad(f, backend="native")
    x = np.linspace(0.0, 1.0, 6)
    np.testing.assert_allclose(g(x), ref(6), rtol=1e-12)
    (key,) = entries(cache_dir)
    objs = list(cache_dir.glob(key + "-*.so"))
    assert len(objs) == 1
    info = tg.cache_info()
    assert info["disk_native_count"] == 1 and info["disk_shared_object_count"] == 1
    assert info["disk_shared_object_bytes"] == objs[0].stat().st_size
    assert info["disk_recipe_count"] <= 1
    assert info["disk_bytes"] == (info["disk_native_bytes"] + info["disk_shared_object_bytes"]
                                  + info["disk_recipe_bytes"])
    os.utime(objs[0])               # just built (whatever the machine's load made "just")
    r = cache.prune(1)              # its process may be loading it, so it stays
    assert r["kept_fresh"] == 1 and key in entries(cache_dir)
    set_last_use(cache_dir, key, 3600)
    r = cache.prune(1)
    assert r["evicted_entries"] == 1 and not list(cache_dir.glob(key + "*"))
    # the object is mapped in this process: unlinking it breaks nothing
    np.testing.assert_allclose(g(x), ref(6), rtol=1e-12)
    new_process()
    np.testing.assert_allclose(tg.grad(f, backend="native")(x), ref(6), rtol=1e-12)
    assert tg.cache_info()["compiles"] == 1 and tg.cache_info()["target"] == "native"


# --- processes sharing the folder -------------------------------------------------------------

WORKER = r"""
import random, sys
import numpy as np
import tracegrad as tg
from tracegrad.runtime import cache

seed, backend, rounds = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
cache.FRESH_OBJECT_SECONDS = 0      # no grace for fresh shared objects: the worst case
rng = random.Random(seed)
sizes = list(range(3, 3 + int(sys.argv[4])))
seen = {"disk_hits": 0, "disk_evictions": 0}

def f(x):
    return np.sum(np.sin(x) ** 2)

for r in range(rounds):
    rng.shuffle(sizes)
    for i, n in enumerate(sizes):
        for k in seen:
            seen[k] += cache._stats[k]
        tg.clear_cache(disk=False)      # every call goes to the disk: hits of entries being removed
        x = np.linspace(0.0, 1.0, n)
        got = tg.grad(f, backend=backend)(x)
        want = 2 * np.sin(x) * np.cos(x)
        if not np.allclose(got, want, rtol=1e-12, atol=0):
            print("WRONG", n, got, want)
            sys.exit(3)
        if i % 4 == 3:
            cache.prune()
for k in seen:
    seen[k] += cache._stats[k]
print("ok", seen["disk_hits"], seen["disk_evictions"])
"""


def _workers(tmp_path, cache_dir, backend, n_procs, rounds, n_sizes, cap, need_hits=True):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(tg.__file__)))
    env = dict(os.environ, TRACEGRAD_CACHE_DIR=str(cache_dir), PYTHONDONTWRITEBYTECODE="1",
               TRACEGRAD_CACHE_MAX_BYTES=str(cap),
               PYTHONPATH=os.pathsep.join(p for p in (pkg_parent, os.environ.get("PYTHONPATH"))
                                          if p))
    env.pop("TRACEGRAD_CACHE", None)
    procs = [subprocess.Popen([sys.executable, str(script), str(seed), backend, str(rounds),
                               str(n_sizes)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env) for seed in range(n_procs)]
    hits = evictions = 0
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0 and out.strip().startswith("ok"), (out, err)
        assert "Traceback" not in err, err
        hits += int(out.split()[1])
        evictions += int(out.split()[2])
    assert evictions and (hits or not need_hits)    # they did evict (and hit) entries
    assert not [p for p in cache_dir.iterdir() if p.name.startswith(".tmp-")]
    r = cache.prune(cap)
    assert r["bytes_after"] <= cap


@pytest.mark.usefixtures("numpy_target")
def test_processes_storing_and_pruning_one_folder_never_crash_nor_serve_a_wrong_result(
        tmp_path, cache_dir):
    compile_for(3)
    one = folder_bytes(cache_dir)
    tg.clear_cache()
    _workers(tmp_path, cache_dir, "numpy", n_procs=4, rounds=3, n_sizes=10, cap=4 * one)


@needs_cc
def test_processes_sharing_native_entries_while_they_are_evicted(tmp_path, cache_dir):
    compile_for(3, backend="native")
    one = folder_bytes(cache_dir)
    tg.clear_cache()
    _workers(tmp_path, cache_dir, "native", n_procs=3, rounds=2, n_sizes=4, cap=2 * one,
             need_hits=False)


# --- the command line -------------------------------------------------------------------------

def cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "tracegrad.cli", *args], capture_output=True,
                          text=True, timeout=120, env=env)


@pytest.mark.usefixtures("numpy_target")
def test_cli_info_shows_sizes_by_kind_and_the_cap(cache_dir):
    entry_for(3, cache_dir)
    r = cli("cache", "info")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    for label in ("NumPy modules:", "native modules:", "shared objects:", "compiler recipes:",
                  "other versions:", "temporary files:"):
        assert label in out, out
    assert "cap:     1.0 GiB (1073741824 bytes) (the default" in out
    assert "entries: 1" in out
    nbytes = folder_bytes(cache_dir)
    assert f"({nbytes} bytes)" in out
    r = cli("cache", "info", env=dict(os.environ, TRACEGRAD_CACHE_MAX_BYTES="2G"))
    assert "cap:     2.0 GiB (2147483648 bytes) (TRACEGRAD_CACHE_MAX_BYTES=2G)" in r.stdout
    r = cli("cache", "info", env=dict(os.environ, TRACEGRAD_CACHE_MAX_BYTES="0"))
    assert "cap:     no limit (0)" in r.stdout
    r = cli("cache", "info", env=dict(os.environ, TRACEGRAD_CACHE_MAX_BYTES="huge"))
    assert r.returncode == 0 and "is not a size" in r.stdout
    assert "warning: TRACEGRAD_CACHE_MAX_BYTES='huge' is not a size" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.usefixtures("numpy_target")
def test_cli_prune(cache_dir):
    keys = [entry_for(n, cache_dir) for n in (3, 4, 5)]
    for age, key in zip((300, 200, 100), keys):
        set_last_use(cache_dir, key, age)
    keep = folder_bytes(cache_dir) - 1
    r = cli("cache", "prune", "--max-bytes", str(keep))
    assert r.returncode == 0, r.stderr
    assert "removed 1 entry (0 of other tracegrad versions, 1 least recently used)" in r.stdout
    assert entries(cache_dir) == set(keys[1:])
    r = cli("cache", "prune")       # under the default cap: nothing to do
    assert r.returncode == 0 and "removed 0 entries" in r.stdout
    assert entries(cache_dir) == set(keys[1:])
    r = cli("cache", "prune", "--max-bytes", "1k")
    assert r.returncode == 0 and not entries(cache_dir), r.stdout
    bad = cli("cache", "prune", "--max-bytes", "many")
    assert bad.returncode == 2 and "'many' is not a size" in bad.stderr
    wrong = cli("cache", "info", "--max-bytes", "1k")
    assert wrong.returncode == 2 and "--max-bytes goes with" in wrong.stderr
    off = cli("cache", "prune", env=dict(os.environ, TRACEGRAD_CACHE="0"))
    assert off.returncode == 0 and "off" in off.stdout
