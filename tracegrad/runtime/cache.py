"""The compile cache: memory first, then a folder on disk.

An entry is the generated module's source, keyed by a hash of the key's
parts (see ``key_hash``).  On disk it is ``<hash>.py`` (the source, headed
by a line with the entry format, the key hash and a checksum of the body)
beside ``<hash>.json`` (the key's parts, for people reading the folder).
Writes go to a temporary file renamed into place, so processes sharing the
folder never read half an entry.

A cache entry is code that will run, so nothing on disk is trusted before
it is checked: the folder must be ours and writable by nobody else; an
entry must be a regular file of ours, writable by nobody else, whose header
names the key looked up and whose checksum matches.  Anything else is a
miss (logged and counted in ``disk_errors``), recompiled and replaced.  A
forgery made by our own user is not caught: whoever can write files as us
can already run code as us (see "The cache" in docs/guide.md).

Environment: ``TRACEGRAD_CACHE_DIR`` (default: the user cache folder),
``TRACEGRAD_CACHE=0`` (memory only), ``TRACEGRAD_MEMORY_CACHE_SIZE`` (how
many loaded entries stay in memory, least recently used dropped first),
``TRACEGRAD_EXPLAIN=1`` (log why a call recompiled: which key part changed
against the closest earlier key).
"""
from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import stat
import sys
import tempfile
import threading
import warnings
from collections import OrderedDict

from tracegrad.targets.templates import template_dir

log = logging.getLogger("tracegrad.cache")

ENTRY_FORMAT = 2            # 2: the header names the entry's key
_HEADER = "# tracegrad-cache-entry format={fmt} key={key} sha256={digest}\n"
_HEADER_PREFIX = "# tracegrad-cache-entry "

_POSIX = hasattr(os, "geteuid")     # owners and modes mean nothing on Windows
_EFFECTIVE_IDS = os.access in os.supports_effective_ids     # we create files as the euid
# O_NOFOLLOW: a symlink is not an entry; O_NONBLOCK: a FIFO planted in an
# entry's place must not block the open forever.
_OPEN_FLAGS = (os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
               | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0))

DEFAULT_MEMORY_CACHE_SIZE = 256
_KEYS_PER_FUNCTION = 32     # earlier keys kept per function for TRACEGRAD_EXPLAIN


class LRU:
    """A mapping that holds at most ``maxsize`` items and drops the least
    recently used one to make room.

    ``get``, ``[]`` and assignment count as a use; ``in``, ``len`` and
    iteration do not.  Every method is safe to call from several threads:
    ``get`` takes no lock (two atomic OrderedDict steps, so a hit stays a
    dict lookup), the methods that add or remove take the table's lock.
    ``maxsize`` may be changed at any time (a smaller size evicts at once).
    """

    _MISSING = object()

    def __init__(self, maxsize):
        self._data = OrderedDict()
        self._lock = threading.Lock()
        self.evictions = 0
        self.maxsize = maxsize

    @property
    def maxsize(self):
        return self._maxsize

    @maxsize.setter
    def maxsize(self, n):
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"LRU maxsize must be a positive integer, got {n!r}")
        with self._lock:
            self._maxsize = n
            self._trim()

    def _trim(self):        # the caller holds the lock
        while len(self._data) > self._maxsize:
            self._data.popitem(last=False)
            self.evictions += 1

    def get(self, key, default=None):
        value = self._data.get(key, self._MISSING)
        if value is self._MISSING:
            return default
        try:
            self._data.move_to_end(key)
        except KeyError:    # evicted by another thread just now: still a valid answer
            pass
        return value

    def __getitem__(self, key):
        value = self.get(key, self._MISSING)
        if value is self._MISSING:
            raise KeyError(key)
        return value

    def __setitem__(self, key, value):
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            self._trim()

    def setdefault(self, key, default=None):
        """The value for ``key``; if absent, store ``default`` and return it
        (one atomic step, so two threads get the same object)."""
        with self._lock:
            if key in self._data:
                self._data.move_to_end(key)
                return self._data[key]
            self._data[key] = default
            self._trim()
            return default

    def pop(self, key, default=_MISSING):
        with self._lock:
            if default is self._MISSING:
                return self._data.pop(key)
            return self._data.pop(key, default)

    def __delitem__(self, key):
        self.pop(key)

    def clear(self):
        with self._lock:
            self._data.clear()

    def __contains__(self, key):
        return key in self._data

    def __len__(self):
        return len(self._data)

    def keys(self):
        """A snapshot, least recently used first."""
        with self._lock:
            return list(self._data)

    def values(self):
        with self._lock:
            return list(self._data.values())

    def items(self):
        with self._lock:
            return list(self._data.items())

    def __iter__(self):
        return iter(self.keys())

    def __repr__(self):
        return f"LRU(maxsize={self._maxsize}, {len(self._data)} items)"


def _memory_cache_size():
    raw = os.environ.get("TRACEGRAD_MEMORY_CACHE_SIZE", "").strip()
    if not raw:
        return DEFAULT_MEMORY_CACHE_SIZE
    try:
        n = int(raw)
        if n < 1:
            raise ValueError
    except ValueError:
        warnings.warn(f"tracegrad: TRACEGRAD_MEMORY_CACHE_SIZE={raw!r} is not a positive "
                      f"integer; using {DEFAULT_MEMORY_CACHE_SIZE}. Set it to how many compiled "
                      f"functions to keep loaded in memory.", RuntimeWarning, stacklevel=2)
        return DEFAULT_MEMORY_CACHE_SIZE
    return n


_memory = LRU(_memory_cache_size())         # key hash -> namespace dict of the loaded module
_recent_keys = LRU(_memory.maxsize)         # function name -> [key parts], newest last
_stats = {"traces": 0, "compiles": 0, "memory_hits": 0, "disk_hits": 0, "disk_misses": 0,
          "disk_writes": 0, "disk_errors": 0}
_warned_dirs = set()        # (path, problem) already warned about in this process
_targets = {}               # target name -> loads in this process (numpy, native, cupy)
_last_target = [None]


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # tracegrad/


_templates_hash = None


def templates_hash() -> str:
    """Hash of the templates and of every module of the package: part of
    every cache key.  All modules, not a hand-kept list of the generator's:
    any of them (api, batching, a transform) can shape what is generated,
    and a list would go stale."""
    global _templates_hash
    if _templates_hash is None:
        h = hashlib.sha256()
        # (name, path): a template by its file name (the folder differs between
        # a checkout and an installation), a module by its path in the package
        # (several folders hold a codegen.py)
        paths = [(n, os.path.join(template_dir(), n)) for n in sorted(os.listdir(template_dir()))]
        for root, dirs, files in os.walk(_PACKAGE):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__" and d != "codegen_templates")
            paths += [(os.path.relpath(os.path.join(root, n), _PACKAGE).replace(os.sep, "/"),
                       os.path.join(root, n)) for n in sorted(files) if n.endswith(".py")]
        for name, p in paths:
            if os.path.isfile(p):
                h.update(name.encode())
                with open(p, "rb") as f:
                    h.update(f.read())
        _templates_hash = h.hexdigest()[:16]
    return _templates_hash


def count(what, n=1):
    _stats[what] += n


def note_target(name):
    """A compiled function was loaded for the target ``name`` (what
    ``cache_info()['target']`` reports: the native target falls back to
    NumPy without a compiler)."""
    _targets[name] = _targets.get(name, 0) + 1
    _last_target[0] = name


def discard(khash):
    """Forget the entry of a key, in memory and on disk (a native module
    whose build failed: the NumPy target replaces it)."""
    _memory.pop(khash, None)
    d = cache_dir()
    if d is not None and os.path.isdir(d):
        for name in (khash + ".py", khash + ".json"):
            try:
                os.unlink(os.path.join(d, name))
            except OSError:
                pass


def cache_dir():
    """The disk cache folder, or None when the disk cache is off."""
    if os.environ.get("TRACEGRAD_CACHE", "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    d = os.environ.get("TRACEGRAD_CACHE_DIR")
    if not d:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        d = os.path.join(base, "tracegrad")
    return d


def _warn_once(key, message):
    if key not in _warned_dirs:
        _warned_dirs.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=4)


def _dir_problem(d, st, write):
    """Why the folder ``d`` (its ``os.stat``) must not hold code we run, and
    what to do about it; or None when it is fine."""
    if not stat.S_ISDIR(st.st_mode):
        return "it is not a folder", "set TRACEGRAD_CACHE_DIR to a folder of yours"
    if _POSIX:
        me = os.geteuid()
        if st.st_uid != me:
            return (f"it is owned by another user (uid {st.st_uid}; you are uid {me}), who "
                    f"could put code in it", "set TRACEGRAD_CACHE_DIR to a folder of yours")
        if st.st_mode & 0o022:
            who = "group and others" if st.st_mode & 0o022 == 0o022 else (
                "its group" if st.st_mode & 0o020 else "others")
            return (f"it is writable by {who} (mode {stat.S_IMODE(st.st_mode):04o}), who could "
                    f"put code in it", f"run `chmod 700 {d}`, or set TRACEGRAD_CACHE_DIR to a "
                    f"private folder of yours")
    if write and not os.access(d, os.W_OK, effective_ids=_EFFECTIVE_IDS):
        return "the folder is read-only", (f"make it writable (`chmod 700 {d}`), or set "
                                           f"TRACEGRAD_CACHE_DIR to a writable folder of yours")
    return None


def _safe_dir(d, write=False):
    """True if the folder ``d`` may be used: for reading (``write=False``)
    it must exist and be safe; for writing it is created private (0700) if
    missing and must be writable.  Otherwise False, after one RuntimeWarning
    per folder and problem: compiled code is then kept in memory only.

    One ``stat`` per call, so a folder fixed (or broken) while we run is
    seen at the next disk access."""
    try:
        if write:
            try:
                os.makedirs(d, mode=0o700, exist_ok=True)
            except FileExistsError:     # something that is not a folder: said below
                pass
        st = os.stat(d)     # follows a symlink: the folder it names is checked
        problem = _dir_problem(d, st, write)
    except (FileNotFoundError, NotADirectoryError):
        if not write:
            return False    # nothing cached yet; store() will create it or say why not
        problem = ("it cannot be created (a path component is missing or not a folder)",
                   "set TRACEGRAD_CACHE_DIR to a writable folder of yours")
    except OSError as e:
        problem = (f"it cannot be {'created or ' if write else ''}read ({e.strerror or e})",
                   "set TRACEGRAD_CACHE_DIR to a writable folder of yours")
    if problem is None:
        return True
    what, fix = problem
    _warn_once((d, what), f"tracegrad: not using the cache folder {d}: {what}; compiled code "
                          f"is kept in memory only. To fix: {fix} (TRACEGRAD_CACHE=0 turns the "
                          f"disk cache off and silences this).")
    return False


def key_hash(parts: dict) -> str:
    blob = json.dumps(parts, sort_keys=True, default=repr).encode()
    return hashlib.sha256(blob).hexdigest()[:32]


def entry_text(khash, source):
    """The text of the disk entry for ``source`` under the key ``khash``."""
    digest = hashlib.sha256(source.encode()).hexdigest()
    return _HEADER.format(fmt=ENTRY_FORMAT, key=khash, digest=digest) + source


def _exec_source(source, filename, khash):
    ns = {"__name__": f"tracegrad_generated_{khash[:12]}", "__file__": filename}
    code = compile(source, filename, "exec")
    exec(code, ns)
    if not filename.endswith(".py"):
        import linecache
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    return ns


class _BadEntry(Exception):
    """A cache entry that must not run; the message says why."""


class _OldEntry(_BadEntry):
    """An entry written in another ENTRY_FORMAT: expected after an upgrade."""


_FILE_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
               (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"))


def _read_entry(path):
    """The bytes of the entry at ``path`` once its file is known safe to read.
    FileNotFoundError if there is none; _BadEntry if it must not be used."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as e:
        if isinstance(e, FileNotFoundError):
            raise
        if os.path.islink(path):    # O_NOFOLLOW refused it (ELOOP)
            raise _BadEntry("it is a symlink, not a regular file") from None
        raise _BadEntry(f"it cannot be opened ({e.strerror or e})") from None
    try:
        # judged on the open descriptor, so the file cannot be swapped after the check
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = next((k for test, k in _FILE_KINDS if test(st.st_mode)), "not a regular file")
            raise _BadEntry(f"it is {kind}, not a regular file")
        if _POSIX and st.st_uid != os.geteuid():
            raise _BadEntry(f"it is owned by another user (uid {st.st_uid})")
        if _POSIX and st.st_mode & 0o022:
            raise _BadEntry(f"it is writable by group or others (mode "
                            f"{stat.S_IMODE(st.st_mode):04o})")
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read()
    finally:
        os.close(fd)


def _check_entry(data, khash):
    """The entry's text if its header names ``khash`` and its checksum matches."""
    header, _, body = data.partition(b"\n")
    try:
        header = header.decode("ascii")
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise _BadEntry("it is not text (binary garbage)") from None
    if not header.startswith(_HEADER_PREFIX):
        raise _BadEntry("it has no tracegrad entry header (empty, or not written by tracegrad)")
    fields = dict(f.partition("=")[::2] for f in header[len(_HEADER_PREFIX):].split())
    fmt = fields.get("format", "")
    if fmt.isdigit() and fmt != str(ENTRY_FORMAT):
        raise _OldEntry(f"it was written in entry format {fmt}; this tracegrad writes "
                        f"format {ENTRY_FORMAT}")
    if fields.get("key") != khash:
        raise _BadEntry(f"it holds the entry of another key ({fields.get('key')}): copied or "
                        f"renamed onto this name")
    digest = hashlib.sha256(body).hexdigest()
    if header + "\n" != _HEADER.format(fmt=ENTRY_FORMAT, key=khash, digest=digest):
        raise _BadEntry("its checksum does not match its body (truncated or modified)")
    return text


def lookup(khash):
    """The loaded namespace for a key, from memory or disk, or None."""
    ns = _memory.get(khash)
    if ns is not None:
        count("memory_hits")
        return ns
    d = cache_dir()
    if d is None or not _safe_dir(d):
        return None
    path = os.path.join(d, khash + ".py")
    try:
        text = _check_entry(_read_entry(path), khash)
        # the header is a comment, so line numbers in tracebacks match the file
        ns = _exec_source(text, path, khash)
    except FileNotFoundError:
        count("disk_misses")
        return None
    except _OldEntry as e:
        log.info("tracegrad: cache entry %s is from another tracegrad (%s); recompiling", path, e)
        count("disk_misses")
        return None
    except Exception as e:  # a bad entry is a miss, never a crash; store() replaces it
        log.warning("tracegrad: ignoring cache entry %s: %s; it will be recompiled and "
                    "replaced", path, e)
        count("disk_errors")
        return None
    count("disk_hits")
    _memory[khash] = ns
    return ns


def store(khash, source, parts):
    """Load ``source`` into memory and write it to disk atomically, replacing
    whatever bad entry is in its place."""
    d = cache_dir()
    text = entry_text(khash, source)
    path = f"<tracegrad {khash[:12]}>"      # memory only, unless written below
    if d is not None and _safe_dir(d, write=True):
        try:
            _atomic_write(d, khash + ".py", text)
            path = os.path.join(d, khash + ".py")
            count("disk_writes")
        except OSError as e:
            count("disk_errors")
            where = os.path.join(d, khash + ".py")
            fix = (f"it is a folder that is not empty, not a cache entry: remove it "
                   f"(`rm -r {where}`) if nothing in it is needed"
                   if os.path.isdir(where) and not os.path.islink(where) else
                   "check that the disk has room and the folder is writable")
            _warn_once((where, "write"), f"tracegrad: could not write the cache entry {where} "
                                         f"({e.strerror or e}); this compiled function is kept "
                                         f"in memory only. To fix: {fix}.")
        else:
            try:    # the key's parts, for people: nothing reads them back
                _atomic_write(d, khash + ".json", json.dumps(parts, indent=1, sort_keys=True,
                                                             default=repr))
            except OSError as e:
                count("disk_errors")
                log.warning("tracegrad: could not write %s (%s); the entry itself is fine",
                            os.path.join(d, khash + ".json"), e)
    ns = _exec_source(text, path, khash)
    _memory[khash] = ns
    return ns


def _atomic_write(d, name, text):
    """Write ``d/name`` through a temporary file renamed into place.  The
    rename replaces a file, FIFO or symlink in the way; an empty folder in
    the way is removed first, a non-empty one raises OSError."""
    path = os.path.join(d, name)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix="-" + name)   # mode 0600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        try:
            os.replace(tmp, path)
        except OSError as e:
            if e.errno not in (errno.EISDIR, errno.EEXIST, errno.ENOTEMPTY, errno.EACCES) \
                    or os.path.islink(path) or not os.path.isdir(path):
                raise
            os.rmdir(path)
            os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def read_private(name):
    """The text of the file ``name`` in the cache folder when it may be
    trusted (the folder and the file ours, writable by nobody else, a
    regular file), else None.  For small records beside the entries (the
    native target's compiler recipe, which names a program to run)."""
    d = cache_dir()
    if d is None or not _safe_dir(d):
        return None
    try:
        return _read_entry(os.path.join(d, name)).decode("utf-8")
    except FileNotFoundError:
        return None
    except (_BadEntry, UnicodeDecodeError, OSError) as e:
        log.warning("tracegrad: ignoring %s in the cache folder: %s", name, e)
        return None


def write_private(name, text):
    """Write a small record into the cache folder atomically (best effort:
    it is a memo, so a failure only costs recomputing it)."""
    d = cache_dir()
    if d is None or not _safe_dir(d, write=True):
        return
    try:
        _atomic_write(d, name, text)
    except OSError as e:
        log.info("tracegrad: could not write %s to the cache folder (%s)", name, e)


def explain_miss(fn_name, parts):
    """With TRACEGRAD_EXPLAIN=1, log which key part changed against the
    closest key this function was compiled with before."""
    seen = _recent_keys.setdefault(fn_name, [])
    if os.environ.get("TRACEGRAD_EXPLAIN"):
        if seen:
            def diff(a):
                return [k for k in sorted(set(a) | set(parts)) if a.get(k) != parts.get(k)]
            # the closest earlier key; among equals the most recent
            closest = min(reversed(seen), key=lambda a: len(diff(a)))
            lines = [f"  {k}: {closest.get(k)!r} -> {parts.get(k)!r}" for k in diff(closest)]
            msg = (f"tracegrad: recompiling {fn_name} because the cache key changed:\n"
                   + "\n".join(lines))
        else:
            msg = f"tracegrad: compiling {fn_name} for the first time in this process"
        print(msg, file=sys.stderr)
    seen.append(parts)
    del seen[:-_KEYS_PER_FUNCTION]


def _is_entry_name(name):
    return name.endswith(".py") and not name.startswith(".tmp-")


def _disk_entries():
    d = cache_dir()
    if d is None or not os.path.isdir(d):
        return 0, 0
    n = size = 0
    with os.scandir(d) as it:
        for e in it:
            if e.name.startswith(".tmp-") or not e.is_file(follow_symlinks=False):
                continue
            n += _is_entry_name(e.name)
            try:
                size += e.stat(follow_symlinks=False).st_size
            except FileNotFoundError:   # removed by another process meanwhile
                pass
    return n, size


def cache_info() -> dict:
    """Counters of this process and the size of the disk cache."""
    n, size = _disk_entries()
    return dict(_stats, memory_entries=len(_memory), memory_size=_memory.maxsize,
                disk_entries=n, disk_bytes=size, cache_dir=cache_dir(),
                target=_last_target[0], targets=dict(_targets))


# What the layers above keep in memory besides the loaded modules (the API's
# per-function signature tables) registers a function to empty it here, so
# clear_cache reaches it without importing upwards.
on_clear_memory = []


def clear_cache(memory=True, disk=True):
    """Empty the memory cache and the disk cache folder; reset the counters."""
    if memory:
        _memory.clear()
        for forget in on_clear_memory:
            forget()
        _recent_keys.clear()
    if disk:
        d = cache_dir()
        if d and os.path.isdir(d):
            for name in os.listdir(d):
                # .so: the native target's shared objects beside their entries
                if name.endswith((".py", ".json", ".so")) or name.startswith(".tmp-"):
                    p = os.path.join(d, name)
                    try:
                        if os.path.isdir(p) and not os.path.islink(p):
                            os.rmdir(p)     # an empty folder in an entry's place
                        else:
                            os.unlink(p)
                    except FileNotFoundError:   # removed by another process meanwhile
                        pass
                    except OSError as e:
                        log.warning("tracegrad: could not remove %s from the cache (%s)", p, e)
    for k in _stats:
        _stats[k] = 0
    _targets.clear()
    _last_target[0] = None
