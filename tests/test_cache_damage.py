"""The disk cache under damage: every way an entry or the folder can be
broken, planted or left behind.  Each test checks that the result is right
AND what the cache did about it (recompiled, logged, warned, counted, the
entry repaired on disk).  See "The cache" in docs/guide.md for the threat
model these tests pin down."""
import contextlib
import logging
import os
import shutil
import stat
import tempfile
import threading
import warnings

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.runtime import cache

from conftest import SYSTEM_TMP

IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
OTHER_UID = 12345           # a user that is not us (only root can chown to it)
NOBODY = 65534
needs_root = pytest.mark.skipif(not IS_ROOT, reason="os.chown to another user needs root")
posix_only = pytest.mark.skipif(not hasattr(os, "geteuid"), reason="owners and modes are POSIX")


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("TRACEGRAD_CACHE_DIR", str(d))
    monkeypatch.delenv("TRACEGRAD_CACHE", raising=False)
    cache._warned_dirs.clear()
    tg.clear_cache()
    yield d
    tg.clear_cache(disk=False)


def f_sin(x):
    return np.sum(np.sin(x) ** 2)


def f_cos(x):
    return np.sum(np.cos(x) ** 2)


X = np.linspace(0.0, 1.0, 5)
REF_SIN = 2 * np.sin(X) * np.cos(X)
REF_COS = -2 * np.cos(X) * np.sin(X)


def new_process():
    """Forget the memory level and the counters, as a new process would."""
    tg.clear_cache(disk=False)


def entry_of(f, d):
    """Compile ``tg.grad(f)`` in a fresh state and return its disk entry."""
    before = {p.name for p in d.glob("*.py")} if d.exists() else set()
    new_process()
    tg.grad(f)(X)
    (name,) = {p.name for p in d.glob("*.py")} - before
    return d / name


def assert_recompiled(result, ref, path, reason, caplog):
    """The call gave the right answer, counted one bad entry, and said why."""
    np.testing.assert_allclose(result, ref)
    info = tg.cache_info()
    assert info["disk_errors"] == 1 and info["compiles"] == 1 and info["disk_hits"] == 0
    msgs = [r.getMessage() for r in caplog.records if r.name == "tracegrad.cache"]
    assert any(str(path) in m and reason in m for m in msgs), msgs


def assert_repaired(path, f, ref):
    """A good entry of ours is back in place, and a new process loads it."""
    st = os.lstat(path)
    assert stat.S_ISREG(st.st_mode)
    if hasattr(os, "geteuid"):
        assert st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o600
    khash = path.stem
    assert path.read_text().startswith(f"# tracegrad-cache-entry format={cache.ENTRY_FORMAT} "
                                       f"key={khash} ")
    new_process()
    np.testing.assert_allclose(tg.grad(f)(X), ref)
    info = tg.cache_info()
    assert info["disk_hits"] == 1 and info["compiles"] == 0 and info["disk_errors"] == 0


# --- damaged entries ------------------------------------------------------------------------

def _wrong_checksum(text):
    header, _, body = text.partition("\n")
    return header.rsplit("=", 1)[0] + "=" + "0" * 64 + "\n" + body


DAMAGES = {
    "truncated": (lambda p, t: p.write_text(t[: len(t) // 2]), "checksum does not match"),
    "modified_body": (lambda p, t: p.write_text(t.replace("np.sin", "np.cos")),
                      "checksum does not match"),
    "wrong_checksum": (lambda p, t: p.write_text(_wrong_checksum(t)), "checksum does not match"),
    "empty": (lambda p, t: p.write_text(""), "no tracegrad entry header"),
    "binary_garbage": (lambda p, t: p.write_bytes(b"\x00\xff\xfe not python"), "not text"),
    "no_header": (lambda p, t: p.write_text(t.partition("\n")[2]), "no tracegrad entry header"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_damaged_entry_is_recompiled_logged_and_replaced(cache_dir, caplog, damage):
    entry = entry_of(f_sin, cache_dir)
    spoil, reason = DAMAGES[damage]
    spoil(entry, entry.read_text())
    new_process()
    assert_recompiled(tg.grad(f_sin)(X), REF_SIN, entry, reason, caplog)
    assert_repaired(entry, f_sin, REF_SIN)


def test_entry_of_another_key_copied_onto_a_name_is_not_run(cache_dir, caplog):
    sin_entry = entry_of(f_sin, cache_dir)
    cos_entry = entry_of(f_cos, cache_dir)
    shutil.copy2(cos_entry, sin_entry)      # a valid entry, checksum and all, of another key
    new_process()
    assert_recompiled(tg.grad(f_sin)(X), REF_SIN, sin_entry,
                      f"entry of another key ({cos_entry.stem})", caplog)
    assert_repaired(sin_entry, f_sin, REF_SIN)


def test_entry_from_an_older_format_is_a_quiet_miss(cache_dir, caplog):
    entry = entry_of(f_sin, cache_dir)
    header, _, body = entry.read_text().partition("\n")
    entry.write_text(header.replace(f"format={cache.ENTRY_FORMAT}", "format=1") + "\n" + body)
    new_process()
    with caplog.at_level(logging.INFO, logger="tracegrad.cache"):
        np.testing.assert_allclose(tg.grad(f_sin)(X), REF_SIN)
    info = tg.cache_info()
    assert info["compiles"] == 1 and info["disk_misses"] == 1 and info["disk_errors"] == 0
    (rec,) = [r for r in caplog.records if r.name == "tracegrad.cache"]
    assert rec.levelno == logging.INFO and "entry format 1" in rec.getMessage()
    assert_repaired(entry, f_sin, REF_SIN)


@posix_only
def test_entry_writable_by_others_is_not_run(cache_dir, caplog):
    entry = entry_of(f_sin, cache_dir)
    entry.write_text(entry.read_text().replace("np.sin", "np.cos"))
    os.chmod(entry, 0o666)
    new_process()
    assert_recompiled(tg.grad(f_sin)(X), REF_SIN, entry,
                      "writable by group or others (mode 0666)", caplog)
    assert_repaired(entry, f_sin, REF_SIN)


@needs_root
def test_entry_owned_by_another_user_is_not_run(cache_dir, caplog):
    entry = entry_of(f_sin, cache_dir)
    os.chown(entry, OTHER_UID, OTHER_UID)
    new_process()
    assert_recompiled(tg.grad(f_sin)(X), REF_SIN, entry,
                      f"owned by another user (uid {OTHER_UID})", caplog)
    assert_repaired(entry, f_sin, REF_SIN)


def test_symlink_to_an_entry_elsewhere_is_not_followed(cache_dir, tmp_path, caplog):
    entry = entry_of(f_sin, cache_dir)
    elsewhere = tmp_path / "elsewhere.py"
    shutil.copy2(entry, elsewhere)          # a perfectly valid entry, but not in the folder
    entry.unlink()
    entry.symlink_to(elsewhere)
    new_process()
    assert_recompiled(tg.grad(f_sin)(X), REF_SIN, entry, "symlink", caplog)
    assert not entry.is_symlink()
    assert elsewhere.read_bytes() == entry.read_bytes()   # replaced the link, not written through
    assert_repaired(entry, f_sin, REF_SIN)


def test_fifo_in_an_entry_place_is_a_miss_not_a_hang(cache_dir, caplog):
    entry = entry_of(f_sin, cache_dir)
    entry.unlink()
    os.mkfifo(entry, 0o600)
    new_process()
    out = {}

    def call():
        out["grad"] = tg.grad(f_sin)(X)

    t = threading.Thread(target=call, daemon=True)
    t.start()
    t.join(timeout=30)
    if t.is_alive():    # blocked in open(): release it so the run can go on, and fail
        os.close(os.open(entry, os.O_WRONLY | os.O_NONBLOCK))
        t.join(timeout=30)
        pytest.fail(f"lookup blocked on the FIFO {entry}")
    assert_recompiled(out["grad"], REF_SIN, entry, "it is a FIFO", caplog)
    assert_repaired(entry, f_sin, REF_SIN)


@pytest.mark.parametrize("thing", ["empty_folder", "dangling_symlink", "symlink_to_folder"])
def test_non_file_in_an_entry_place_is_replaced(cache_dir, tmp_path, caplog, thing):
    entry = entry_of(f_sin, cache_dir)
    entry.unlink()
    if thing == "empty_folder":
        entry.mkdir()
        reason = "it is a folder"
    elif thing == "dangling_symlink":
        entry.symlink_to(tmp_path / "nowhere")
        reason = "symlink"
    else:
        (tmp_path / "target").mkdir()
        entry.symlink_to(tmp_path / "target")
        reason = "symlink"
    new_process()
    assert_recompiled(tg.grad(f_sin)(X), REF_SIN, entry, reason, caplog)
    assert_repaired(entry, f_sin, REF_SIN)
    if thing == "symlink_to_folder":
        assert (tmp_path / "target").is_dir()   # the link was replaced, its target left alone


def test_non_empty_folder_in_an_entry_place_warns_once_and_runs_from_memory(cache_dir, caplog):
    entry = entry_of(f_sin, cache_dir)
    entry.unlink()
    entry.mkdir()
    (entry / "someones-file").write_text("not ours to delete")
    for _ in range(2):      # two fresh starts in one process: one warning
        new_process()
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            np.testing.assert_allclose(tg.grad(f_sin)(X), REF_SIN)
        info = tg.cache_info()
        assert info["compiles"] == 1 and info["disk_writes"] == 0
        assert info["disk_errors"] == 2     # the lookup and the write
        if _ == 0:
            (w,) = [w for w in rec if issubclass(w.category, RuntimeWarning)]
            msg = str(w.message)
            assert str(entry) in msg and "memory only" in msg and f"rm -r {entry}" in msg
        else:
            assert not [w for w in rec if issubclass(w.category, RuntimeWarning)]
    assert (entry / "someones-file").read_text() == "not ours to delete"
    # once it is gone, the next store writes the entry again
    shutil.rmtree(entry)
    new_process()
    tg.grad(f_sin)(X)
    assert_repaired(entry, f_sin, REF_SIN)


@pytest.mark.usefixtures("numpy_target")
def test_same_user_forgery_is_outside_the_threat_model(cache_dir):
    """A forged entry with a recomputed checksum, ours and 0600, runs: who
    can write files as us can already run code as us (docs/guide.md)."""
    entry = entry_of(f_sin, cache_dir)
    body = entry.read_text().partition("\n")[2].replace("np.sin", "np.cos")
    entry.write_text(cache.entry_text(entry.stem, body))
    new_process()
    forged = tg.grad(f_sin)(X)
    assert not np.allclose(forged, REF_SIN)
    assert tg.cache_info()["disk_hits"] == 1


# --- what lies beside the entries -----------------------------------------------------------

@pytest.mark.parametrize("damage", ["missing", "corrupt"])
def test_json_sidecar_missing_or_corrupt_does_not_matter(cache_dir, damage):
    entry = entry_of(f_sin, cache_dir)
    sidecar = entry.with_suffix(".json")
    assert sidecar.exists()
    if damage == "missing":
        sidecar.unlink()
    else:
        sidecar.write_bytes(b"{not json\x00")
    new_process()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_allclose(tg.grad(f_sin)(X), REF_SIN)
    info = tg.cache_info()
    assert info["disk_hits"] == 1 and info["compiles"] == 0 and info["disk_errors"] == 0


@pytest.mark.usefixtures("numpy_target")
def test_leftover_temporary_files_are_ignored_and_cleared(cache_dir):
    entry = entry_of(f_sin, cache_dir)
    tmp_py = cache_dir / f".tmp-crashed-{entry.name}"
    tmp_json = cache_dir / f".tmp-crashed-{entry.stem}.json"
    tmp_py.write_text("half an entry")
    tmp_json.write_text("{")
    new_process()
    np.testing.assert_allclose(tg.grad(f_sin)(X), REF_SIN)
    info = tg.cache_info()
    assert info["disk_hits"] == 1 and info["disk_errors"] == 0
    assert info["disk_entries"] == 1
    assert info["disk_bytes"] == entry.stat().st_size + entry.with_suffix(".json").stat().st_size
    tg.clear_cache()
    assert not list(cache_dir.iterdir())


def test_failed_write_leaves_no_temporary_file(cache_dir):
    entry = entry_of(f_sin, cache_dir)
    entry.unlink()
    entry.mkdir()
    (entry / "x").write_text("x")
    new_process()
    with pytest.warns(RuntimeWarning, match="could not write the cache entry"):
        tg.grad(f_sin)(X)
    assert not [p for p in cache_dir.iterdir() if p.name.startswith(".tmp-")]


# --- the folder -----------------------------------------------------------------------------

def _one_runtime_warning(rec):
    ws = [w for w in rec if issubclass(w.category, RuntimeWarning)]
    assert len(ws) == 1, [str(w.message) for w in ws]
    return str(ws[0].message)


@posix_only
@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757], ids=oct)
def test_folder_writable_by_others_is_refused_for_reads_and_writes(cache_dir, mode):
    entry = entry_of(f_sin, cache_dir)     # a valid entry: must not be read either
    os.chmod(cache_dir, mode)
    new_process()
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        np.testing.assert_allclose(tg.grad(f_sin)(X), REF_SIN)
        np.testing.assert_allclose(tg.grad(f_cos)(X), REF_COS)
    msg = _one_runtime_warning(rec)
    assert str(cache_dir) in msg and f"mode {mode:04o}" in msg
    assert f"chmod 700 {cache_dir}" in msg and "TRACEGRAD_CACHE_DIR" in msg
    assert "memory only" in msg
    info = tg.cache_info()
    assert info["disk_hits"] == 0 and info["disk_writes"] == 0 and info["compiles"] == 2
    assert [p.name for p in cache_dir.glob("*.py")] == [entry.name]
    # fixed while we run: used again at the next disk access, silently
    os.chmod(cache_dir, 0o700)
    new_process()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tg.grad(f_sin)(X)
    assert tg.cache_info()["disk_hits"] == 1


@needs_root
def test_folder_owned_by_another_user_is_refused(cache_dir):
    entry_of(f_sin, cache_dir)
    os.chown(cache_dir, OTHER_UID, OTHER_UID)
    new_process()
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        np.testing.assert_allclose(tg.grad(f_sin)(X), REF_SIN)
        np.testing.assert_allclose(tg.grad(f_cos)(X), REF_COS)
    msg = _one_runtime_warning(rec)
    assert str(cache_dir) in msg and f"owned by another user (uid {OTHER_UID}" in msg
    assert "TRACEGRAD_CACHE_DIR" in msg and "memory only" in msg
    info = tg.cache_info()
    assert info["disk_hits"] == 0 and info["disk_writes"] == 0


def test_folder_that_is_a_file_is_refused_with_one_warning(tmp_path, monkeypatch):
    f = tmp_path / "not-a-folder"
    f.write_text("x")
    monkeypatch.setenv("TRACEGRAD_CACHE_DIR", str(f))
    cache._warned_dirs.clear()
    new_process()
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        np.testing.assert_allclose(tg.grad(f_sin)(X), REF_SIN)
    msg = _one_runtime_warning(rec)
    assert str(f) in msg and "not a folder" in msg
    assert f.read_text() == "x"


def test_symlink_to_a_private_folder_of_ours_is_used(tmp_path, monkeypatch):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    monkeypatch.setenv("TRACEGRAD_CACHE_DIR", str(link))
    cache._warned_dirs.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        new_process()
        tg.grad(f_sin)(X)
        new_process()
        np.testing.assert_allclose(tg.grad(f_sin)(X), REF_SIN)
    assert tg.cache_info()["disk_hits"] == 1
    assert len(list(real.glob("*.py"))) == 1
    tg.clear_cache(disk=False)


@pytest.mark.usefixtures("numpy_target")
@posix_only
def test_folder_we_create_is_private_whatever_the_umask(tmp_path, monkeypatch):
    d = tmp_path / "new" / "cache"
    monkeypatch.setenv("TRACEGRAD_CACHE_DIR", str(d))
    old = os.umask(0)
    try:
        new_process()
        tg.grad(f_sin)(X)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    for p in d.iterdir():
        assert stat.S_IMODE(os.stat(p).st_mode) == 0o600
    tg.clear_cache(disk=False)


@contextlib.contextmanager
def _unprivileged(folder):
    """Run the body as a user that file modes apply to: ourselves when not
    root; as root, the effective uid ``nobody`` (restored afterwards)."""
    if not IS_ROOT:
        yield
        return
    os.chown(folder, NOBODY, NOBODY)
    os.seteuid(NOBODY)
    try:
        yield
    finally:
        os.seteuid(0)


@posix_only
def test_read_only_folder_serves_hits_and_keeps_new_code_in_memory(monkeypatch):
    tg.grad(f_cos)(X)       # load the compiler's modules while we may read everything
    # a folder the other user can reach (the suite's own temporary folder is
    # private to us), removed below
    base = tempfile.mkdtemp(prefix="tracegrad-ro-", dir=SYSTEM_TMP)
    d = os.path.join(base, "cache")
    monkeypatch.setenv("TRACEGRAD_CACHE_DIR", d)
    cache._warned_dirs.clear()
    try:
        with _unprivileged(base):
            new_process()
            tg.grad(f_sin)(X)                   # written by the user who reads it below
            os.chmod(d, 0o500)
            new_process()
            with warnings.catch_warnings(record=True) as rec:
                warnings.simplefilter("always")
                np.testing.assert_allclose(tg.grad(f_sin)(X), REF_SIN)   # a hit: no write
                np.testing.assert_allclose(tg.grad(f_cos)(X), REF_COS)   # new: memory only
                np.testing.assert_allclose(tg.grad(lambda x: np.sum(x ** 3))(X), 3 * X ** 2)
            info = tg.cache_info()
            entries = os.listdir(d)
            os.chmod(d, 0o700)
        msg = _one_runtime_warning(rec)
        assert d in msg and "read-only" in msg and "memory only" in msg
        assert info["disk_hits"] == 1 and info["disk_writes"] == 0 and info["compiles"] == 2
        assert len([n for n in entries if n.endswith(".py")]) == 1
    finally:
        shutil.rmtree(base)
        tg.clear_cache(disk=False)


def test_a_hit_in_a_good_folder_is_silent(cache_dir, caplog):
    entry_of(f_sin, cache_dir)
    new_process()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_allclose(tg.grad(f_sin)(X), REF_SIN)
    assert not [r for r in caplog.records if r.name == "tracegrad.cache"]
    assert tg.cache_info()["disk_hits"] == 1


# --- the memory level -----------------------------------------------------------------------

def test_lru_evicts_the_least_recently_used():
    t = cache.LRU(3)
    for k in "abc":
        t[k] = k.upper()
    assert t.get("a") == "A"            # a use: "b" is now the oldest
    t["d"] = "D"
    assert "b" not in t and t.keys() == ["c", "a", "d"]
    assert t.evictions == 1 and len(t) == 3
    assert t.get("b", 0) == 0
    with pytest.raises(KeyError):
        t["b"]
    assert t.setdefault("a", "other") == "A" and t.setdefault("e", "E") == "E"
    assert t.keys() == ["d", "a", "e"]
    t.maxsize = 1
    assert t.items() == [("e", "E")] and t.evictions == 4
    assert t.pop("e") == "E" and t.pop("e", None) is None and len(t) == 0
    with pytest.raises(ValueError, match="positive integer"):
        cache.LRU(0)


def test_lru_is_safe_under_threads():
    t = cache.LRU(50)
    errors = []

    def work(offset):
        try:
            for i in range(5000):
                k = (offset + i) % 200
                if t.get(k) is None:
                    t[k] = k
                t.setdefault(k + 1, k + 1)
        except Exception as e:     # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=work, args=(n * 37,)) for n in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    assert not errors and not any(th.is_alive() for th in threads)
    assert len(t) == 50 and all(t.get(k) == k for k in t.keys())


def test_memory_level_is_bounded(cache_dir):
    old = cache._memory.maxsize, cache._recent_keys.maxsize
    cache._memory.maxsize = cache._recent_keys.maxsize = 3
    try:
        g = tg.grad(f_sin)
        for n in range(2, 8):           # six shapes, six entries
            g(np.ones(n))
        info = tg.cache_info()
        assert info["memory_entries"] == 3 and info["memory_size"] == 3
        assert info["compiles"] == 6 and info["disk_entries"] == 6
        for n in range(20):              # functions named apart: explain's table is bounded too
            cache.explain_miss(f"fn{n}", {"signature": [n]})
        assert len(cache._recent_keys) == 3
        for n in range(40):
            cache.explain_miss("one", {"signature": [n]})
        assert len(cache._recent_keys.get("one")) == cache._KEYS_PER_FUNCTION
        # an evicted entry comes back from disk, not from the compiler
        tg.clear_cache(disk=False)
        for n in range(2, 8):
            np.testing.assert_allclose(tg.grad(f_sin)(np.ones(n)), np.sin(2.0) * np.ones(n))
        info = tg.cache_info()
        assert info["disk_hits"] == 6 and info["compiles"] == 0 and info["memory_entries"] == 3
    finally:
        cache._memory.maxsize, cache._recent_keys.maxsize = old


@pytest.mark.parametrize("value,expected", [("", cache.DEFAULT_MEMORY_CACHE_SIZE), ("17", 17),
                                            ("0", None), ("-3", None), ("lots", None)])
def test_memory_cache_size_from_the_environment(monkeypatch, value, expected):
    monkeypatch.setenv("TRACEGRAD_MEMORY_CACHE_SIZE", value)
    if expected is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert cache._memory_cache_size() == expected
    else:
        with pytest.warns(RuntimeWarning, match="TRACEGRAD_MEMORY_CACHE_SIZE=.*positive integer"):
            assert cache._memory_cache_size() == cache.DEFAULT_MEMORY_CACHE_SIZE


def test_a_helper_is_pasted_as_imported_whatever_its_file_now_says(tmp_path, monkeypatch):
    # an upgrade (or an edit) of tracegrad's files while a process runs:
    # the helpers pasted into generated modules are the code this process
    # imported, not the lines now on disk at the old offsets
    import linecache

    from tracegrad.ops import runtime_numpy
    monkeypatch.setenv("TRACEGRAD_CACHE_DIR", str(tmp_path))
    tg.clear_cache()
    path = runtime_numpy.__file__
    real = linecache.getlines

    def changed(filename, module_globals=None):
        lines = real(filename, module_globals)
        return ["# moved\n"] * 40 + lines if filename == path else lines
    monkeypatch.setattr(linecache, "getlines", changed)
    monkeypatch.setattr(linecache, "checkcache", lambda *a, **k: None)
    idx = np.array([0, 2, 2, -1])
    g = tg.grad(lambda x: np.sum(x[idx] ** 2), backend="numpy")(np.arange(1.0, 6.0))
    np.testing.assert_array_equal(g, [2.0, 0.0, 12.0, 0.0, 10.0])
    tg.clear_cache()
