"""The compile cache: memory first, then a folder on disk.

An entry is the generated module's source, keyed by a hash of the key's
parts (see ``key_hash``).  On disk it is ``<hash>.py`` (the source, headed
by a line with the entry format, the key hash and a checksum of the body)
beside ``<hash>.json`` (the key's parts, for people reading the folder and for
the size cap, which reads the version from it; never run).
Writes go to a temporary file renamed into place, so processes sharing the
folder never read half an entry.

A cache entry is code that will run, so nothing on disk is trusted before
it is checked: the folder must be ours and writable by nobody else; an
entry must be a regular file of ours, writable by nobody else, whose header
names the key looked up and whose checksum matches.  Anything else is a
miss (logged and counted in ``disk_errors``), recompiled and replaced.  A
forgery made by our own user is not caught: whoever can write files as us
can already run code as us (see "The cache" in docs/guide.md).

The folder is bounded (``TRACEGRAD_CACHE_MAX_BYTES``, 1 GiB by default):
an entry's files (the source, its ``.json``, the native target's shared
objects ``<hash>-<digest>.so``) and the compiler recipes count; the
modification time of an entry's source is its last use (a disk hit
touches it); past the cap, entries of other tracegrad versions go first,
then the least recently used (see ``prune``).  Eviction is safe with
other processes sharing the folder: a file being written is a temporary
one and is never removed (unless it is an hour old: a crashed write), a
removal tolerates files already gone, and a reader that finds an entry
half removed has a miss and rebuilds.  A running count of the folder's
size (``.usage.json``, under flock) spares a write the scan of the folder.

Environment: ``TRACEGRAD_CACHE_DIR`` (default: the user cache folder),
``TRACEGRAD_CACHE=0`` (memory only), ``TRACEGRAD_CACHE_MAX_BYTES`` (the
size cap of the folder; 0: none), ``TRACEGRAD_MEMORY_CACHE_SIZE`` (how
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
import re
import stat
import sys
import tempfile
import threading
import time
import warnings
from collections import OrderedDict

try:
    import fcntl
except ImportError:     # Windows: no flock; see _after_write
    fcntl = None

from tracegrad._version import __version__
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
          "disk_writes": 0, "disk_errors": 0, "disk_evictions": 0, "size_plans": 0}
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
    _touch(path)
    _memory[khash] = ns
    return ns


def store(khash, source, parts):
    """Load ``source`` into memory and write it to disk atomically, replacing
    whatever bad entry is in its place."""
    d = cache_dir()
    text = entry_text(khash, source)
    path = f"<tracegrad {khash[:12]}>"      # memory only, unless written below
    written = 0
    if d is not None and _safe_dir(d, write=True):
        try:
            written += _atomic_write(d, khash + ".py", text)
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
            try:    # the key's parts, for people (and for prune: which tracegrad wrote it)
                written += _atomic_write(d, khash + ".json", json.dumps(
                    parts, indent=1, sort_keys=True, default=repr))
            except OSError as e:
                count("disk_errors")
                log.warning("tracegrad: could not write %s (%s); the entry itself is fine",
                            os.path.join(d, khash + ".json"), e)
    ns = _exec_source(text, path, khash)
    _memory[khash] = ns
    if written:     # after loading: the native shared object is built by now
        _after_write(d, written + _object_bytes(ns, d))
    return ns


def _atomic_write(d, name, text):
    """Write ``d/name`` through a temporary file renamed into place.  The
    rename replaces a file, FIFO or symlink in the way; an empty folder in
    the way is removed first, a non-empty one raises OSError."""
    path = os.path.join(d, name)
    data = text.encode("utf-8")
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix="-" + name)   # mode 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
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
    return len(data)


def read_private(name):
    """The text of the file ``name`` in the cache folder when it may be
    trusted (the folder and the file ours, writable by nobody else, a
    regular file), else None.  For small records beside the entries (the
    native target's compiler recipe, which names a program to run)."""
    d = cache_dir()
    if d is None or not _safe_dir(d):
        return None
    try:
        text = _read_entry(os.path.join(d, name)).decode("utf-8")
    except FileNotFoundError:
        return None
    except (_BadEntry, UnicodeDecodeError, OSError) as e:
        log.warning("tracegrad: ignoring %s in the cache folder: %s", name, e)
        return None
    _touch(os.path.join(d, name))      # a use: the size cap evicts the least recently used
    return text


def write_private(name, text):
    """Write a small record into the cache folder atomically (best effort:
    it is a memo, so a failure only costs recomputing it)."""
    d = cache_dir()
    if d is None or not _safe_dir(d, write=True):
        return
    try:
        n = _atomic_write(d, name, text)
    except OSError as e:
        log.info("tracegrad: could not write %s to the cache folder (%s)", name, e)
    else:
        _after_write(d, n)


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


# --- the size cap ---------------------------------------------------------------------------
#
# The folder holds, per entry, <hash>.py, <hash>.json and the native target's
# shared objects <hash>-<digest>.so (named by native_loader.load_library
# after the module beside them), plus the compiler recipes
# native-recipe-<hash>.json and the temporary files of writes in progress
# (.tmp-*).  The cap counts the entries' files (of every tracegrad version)
# and the recipes; temporary files are shown but not counted, and files that
# are not tracegrad's (other names, folders, links, another user's files)
# are neither counted nor ever removed.
#
# A use of an entry (a disk hit, a store) sets the modification time of its
# source; an entry's last use is the newest time of its files.  Nothing is
# rewritten to record a use, so a hit costs one utime call.

DEFAULT_MAX_BYTES = 1 << 30     # 1 GiB: thousands of entries, shared objects included
PRUNE_TO = 0.9                  # an automatic prune leaves the folder at 90% of the cap
RESCAN_SECONDS = 24 * 3600      # the running count is checked by a scan at least this often
RESCAN_EVERY = 32               # without flock (Windows): a process's writes between two scans
STALE_TEMP_SECONDS = 3600       # a temporary file this old: a crashed write (builds take < 300 s)
FRESH_OBJECT_SECONDS = 10       # a shared object this young may be being loaded by its builder

_ENTRY_FILE = re.compile(r"([0-9a-f]{32})(\.py|\.json|-[0-9a-f]{16}\.so)\Z")
_RECIPE_FILE = re.compile(r"native-recipe-[0-9A-Za-z]+\.json\Z")
_SIZE_UNITS = {"": 1, "b": 1, "k": 2 ** 10, "kb": 10 ** 3, "kib": 2 ** 10, "m": 2 ** 20,
               "mb": 10 ** 6, "mib": 2 ** 20, "g": 2 ** 30, "gb": 10 ** 9, "gib": 2 ** 30,
               "t": 2 ** 40, "tb": 10 ** 12, "tib": 2 ** 40}
_SIZE_HELP = ("write a number of bytes (1073741824) or a size with a unit (500MB, 1.5GiB, 2G: "
              "kB/MB/GB are powers of 1000, KiB/MiB/GiB and K/M/G powers of 1024); 0 for no limit")

# The kinds of files the folder holds, in the order `tracegrad cache info` lists them:
# (kind, what it is called, what one of them is called, counted against the cap)
KINDS = (("numpy", "NumPy modules", "entry", True),
         ("native", "native modules", "entry", True),
         ("shared_object", "shared objects", "file", True),
         ("recipe", "compiler recipes", "file", True),
         ("other_version", "other versions", "entry", True),
         ("orphan", "pieces of removed entries", "file", True),
         ("temp", "temporary files", "file", False),
         ("other", "not tracegrad's", "file", False))


def parse_size(text) -> int:
    """Bytes from ``1073741824``, ``500MB``, ``1.5GiB`` or ``2G``; ValueError
    (saying how to write one) otherwise."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([A-Za-z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _SIZE_UNITS:
        raise ValueError(f"{text!r} is not a size: {_SIZE_HELP}")
    num, unit = m.group(1), _SIZE_UNITS[m.group(2).lower()]
    return int(num) * unit if num.isdigit() else int(float(num) * unit)


def size_cap() -> int:
    """The cap of the disk cache in bytes, from TRACEGRAD_CACHE_MAX_BYTES
    (default 1 GiB; 0: no limit).  A value that is not a size is a
    RuntimeWarning naming the variable, once, and the default applies."""
    raw = os.environ.get("TRACEGRAD_CACHE_MAX_BYTES", "").strip()
    if not raw:
        return DEFAULT_MAX_BYTES
    try:
        return parse_size(raw)
    except ValueError:
        _warn_once(("TRACEGRAD_CACHE_MAX_BYTES", raw),
                   f"tracegrad: TRACEGRAD_CACHE_MAX_BYTES={raw!r} is not a size; the disk cache "
                   f"is capped at the default, {DEFAULT_MAX_BYTES} bytes (1 GiB). To set it: "
                   f"{_SIZE_HELP}.")
        return DEFAULT_MAX_BYTES


def _touch(path):
    """Record a use of the file at ``path`` (its modification time: now)."""
    try:
        os.utime(path)
    except OSError:     # a read-only folder or file system: its entries are not evicted by us
        pass


def _object_bytes(ns, d):
    """The size of the shared object a native module loaded from the folder ``d``."""
    lib = ns.get("_lib")
    p = getattr(lib, "__file__", None) or getattr(lib, "_name", None)
    if not isinstance(p, str) or os.path.dirname(os.path.abspath(p)) != os.path.abspath(d):
        return 0
    try:
        return os.stat(p).st_size
    except OSError:
        return 0


class _Group:
    """The files of one entry (its hash) or one recipe: [name, size, mtime_ns]."""
    __slots__ = ("key", "py", "json", "objects", "recipe", "kind")

    def __init__(self, key):
        self.key, self.py, self.json, self.objects, self.recipe = key, None, None, [], None
        self.kind = None

    def files(self):
        return [f for f in (self.py, self.json, self.recipe) if f is not None] + self.objects

    def size(self):
        return sum(f[1] for f in self.files())

    def last_use(self):
        return max(f[2] for f in self.files())


def _scan(d):
    """(groups by key, temporary files, other files) of the folder; each file
    is [name, size, mtime_ns], read by lstat (no link is followed)."""
    groups, temp, other = {}, [], []
    me = os.geteuid() if _POSIX else None
    try:
        it = os.scandir(d)
    except (FileNotFoundError, NotADirectoryError):
        return groups, temp, other
    with it:
        for e in it:
            try:
                st = e.stat(follow_symlinks=False)
            except FileNotFoundError:   # removed by another process meanwhile
                continue
            f = [e.name, st.st_size, st.st_mtime_ns]
            if e.name == USAGE_FILE:
                continue    # the running count of the folder's size: tracegrad's, not counted
            if not stat.S_ISREG(st.st_mode) or (me is not None and st.st_uid != me):
                other.append(f)
            elif e.name.startswith(".tmp-"):
                temp.append(f)
            elif _RECIPE_FILE.match(e.name):
                g = groups[e.name] = _Group(e.name)
                g.recipe, g.kind = f, "recipe"
            else:
                m = _ENTRY_FILE.match(e.name)
                if m is None:
                    other.append(f)
                    continue
                g = groups.get(m.group(1)) or groups.setdefault(m.group(1), _Group(m.group(1)))
                if m.group(2) == ".py":
                    g.py = f
                elif m.group(2) == ".json":
                    g.json = f
                else:
                    g.objects.append(f)
    return groups, temp, other


_parts_memo = {}    # (json name, size, mtime_ns) -> the entry's key parts (or None)


def _entry_parts(d, g):
    """The key parts of an entry from its .json (None when missing or unreadable)."""
    if g.json is None:
        return None
    memo_key = tuple(g.json)
    if memo_key not in _parts_memo:
        try:
            parts = json.loads(_read_entry(os.path.join(d, g.json[0])).decode("utf-8"))
        except (OSError, _BadEntry, ValueError):
            parts = None
        if len(_parts_memo) > 100_000:
            _parts_memo.clear()
        _parts_memo[memo_key] = parts if isinstance(parts, dict) else None
    return _parts_memo[memo_key]


def _entry_format(d, g):
    """The entry format named by the header of the entry's source ('' if unreadable)."""
    try:
        fd = os.open(os.path.join(d, g.py[0]), _OPEN_FLAGS)
    except OSError:
        return ""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return ""
        line = os.read(fd, 256).partition(b"\n")[0].decode("ascii", "replace")
    finally:
        os.close(fd)
    if not line.startswith(_HEADER_PREFIX):
        return ""
    return dict(f.partition("=")[::2] for f in line[len(_HEADER_PREFIX):].split()).get("format", "")


def _classify(d, g):
    """Set the kind of an entry: orphan (its source is gone: pieces of an
    entry removed, a shared object built as it was), other_version (written
    by another tracegrad version, or from other templates or entry format),
    native (it has a shared object, or its key is a native build), numpy."""
    if g.kind is not None:
        return g.kind
    if g.py is None:
        g.kind = "orphan"
        return g.kind
    parts = _entry_parts(d, g)
    if parts is None:
        fmt = _entry_format(d, g)
        other = fmt.isdigit() and fmt != str(ENTRY_FORMAT)
    else:
        other = (parts.get("version", __version__) != __version__
                 or parts.get("templates", templates_hash()) != templates_hash())
    if other:
        g.kind = "other_version"
    elif g.objects or (parts or {}).get("backend") == "native" and \
            (parts or {}).get("native", "unavailable") != "unavailable":
        g.kind = "native"
    else:
        g.kind = "numpy"
    return g.kind


def disk_usage(d=None) -> dict:
    """What the cache folder holds, by kind: for each kind of ``KINDS``
    ``{kind: {"count": n, "bytes": b}}`` (count: entries or files, as
    ``KINDS`` says; a native entry's shared objects are the shared_object
    kind, an entry of another version counts its objects with it), with
    ``"entries"`` (every entry's source), ``"bytes"`` (what counts
    against the cap) and ``"max_bytes"``."""
    d = cache_dir() if d is None else d
    out = {k: {"count": 0, "bytes": 0} for k, *_ in KINDS}
    entries = 0
    if d is not None and os.path.isdir(d):
        groups, temp, other = _scan(d)
        for g in groups.values():
            kind = _classify(d, g)
            entries += g.py is not None
            if kind == "native":
                files = [f for f in (g.py, g.json) if f is not None]
                out["native"]["count"] += 1
                out["native"]["bytes"] += sum(f[1] for f in files)
                out["shared_object"]["count"] += len(g.objects)
                out["shared_object"]["bytes"] += sum(f[1] for f in g.objects)
            else:
                out[kind]["count"] += len(g.files()) if kind == "orphan" else 1
                out[kind]["bytes"] += g.size()
        for kind, files in (("temp", temp), ("other", other)):
            out[kind]["count"] += len(files)
            out[kind]["bytes"] += sum(f[1] for f in files)
    out["entries"] = entries
    out["bytes"] = sum(out[k]["bytes"] for k, _, _, counted in KINDS if counted)
    out["max_bytes"] = size_cap()
    return out


def _unlink(d, name):
    """Remove one file; the bytes removed (0 when it was gone already)."""
    p = os.path.join(d, name)
    try:
        size = os.lstat(p).st_size
        os.unlink(p)
        return size
    except FileNotFoundError:      # removed by another process meanwhile
        return 0
    except OSError as e:
        log.warning("tracegrad: could not remove %s from the cache (%s)", p, e)
        return 0


def _remove_group(d, g):
    """Remove an entry (its source first, so a reader from now on misses;
    then its .json and shared objects) or a recipe, unless it was used or
    rewritten since the scan (its source's time changed), or, for pieces of
    a removed entry, unless its source came back.  The bytes removed, or
    None when it was left."""
    try:
        st = os.lstat(os.path.join(d, (g.py or g.recipe or [g.key + ".py"])[0]))
    except FileNotFoundError:
        st = None
    if g.py is not None or g.recipe is not None:
        mine = g.py or g.recipe
        if st is None or st.st_mtime_ns != mine[2]:
            return None     # used (touched), rewritten or removed by another process meanwhile
    elif st is not None:
        return None         # pieces of an entry whose source is back: an entry again
    return sum(_unlink(d, f[0]) for f in g.files())


def _dir_lock(d, wait):
    """An exclusive lock on the folder (flock on its descriptor), so that one
    process prunes at a time: the descriptor to close, True when locking is
    not available here, or None when another process holds it (wait=False)."""
    if fcntl is None:       # Windows: prunes may overlap; each removal tolerates the others
        return True
    try:
        fd = os.open(d, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return None
        return True         # a file system without flock
    return fd


def _prune(d, cap, target, wait):
    """Prune the folder ``d``: remove stale temporary files and pieces of
    removed entries; if it holds more than ``cap`` bytes (0: no limit),
    remove entries until it holds at most ``target``: entries of other
    versions first, then the least recently used entries and recipes.
    The report, or None when another process is pruning (wait=False)."""
    lock = _dir_lock(d, wait)
    if lock is None:
        return None
    try:
        added_at_scan = _usage_update(d, None)
        groups, temp, _ = _scan(d)
        removed = {"other_version": 0, "lru": 0, "recipe": 0, "orphan": 0, "temp": 0}
        freed = 0
        now = time.time_ns()
        stale = now - STALE_TEMP_SECONDS * 10 ** 9
        # A shared object just renamed into place may not be loaded yet by the
        # process that built it (a load that fails right after a build turns the
        # native target off in that process): it and its entry stay a while.
        fresh = now - FRESH_OBJECT_SECONDS * 10 ** 9
        loading = {g.key for g in groups.values() if any(o[2] > fresh for o in g.objects)}
        for f in temp:
            if f[2] < stale:
                n = _unlink(d, f[0])
                freed += n
                removed["temp"] += 1
        total = sum(g.size() for g in groups.values())
        before = total
        for g in [g for g in groups.values()
                  if g.py is None and g.recipe is None and g.key not in loading]:
            n = _remove_group(d, g)     # pieces: always garbage, whatever the cap
            if n is not None:
                removed["orphan"] += len(g.files())
                total -= g.size()
                freed += n
                del groups[g.key]
        kept_fresh = 0
        if cap and total > cap:
            # entries of other versions first, each tier least recently used first
            order = sorted(groups.values(), key=lambda g: (
                _classify(d, g) != "other_version", g.last_use(), g.key))
            for g in order:
                if total <= target:
                    break
                if g.key in loading:
                    kept_fresh += 1
                    continue
                n = _remove_group(d, g)
                if n is None:
                    continue
                total -= g.size()
                freed += n
                kind = "recipe" if g.recipe is not None else (
                    "other_version" if g.kind == "other_version" else "lru")
                removed[kind] += 1
        evicted = removed["other_version"] + removed["lru"]
        count("disk_evictions", evicted)
        if added_at_scan is not None:
            _usage_update(d, (total, added_at_scan))
        if evicted or removed["recipe"]:
            log.info("tracegrad: pruned the cache folder %s to %d bytes (cap %d): removed %s",
                     d, total, cap, removed)
        return {"folder": d, "max_bytes": cap, "target": target, "bytes_before": before,
                "bytes_after": total, "freed_bytes": freed, "removed": removed,
                "evicted_entries": evicted, "kept_fresh": kept_fresh}
    finally:
        if lock is not True:
            os.close(lock)  # closing the descriptor releases the lock


def prune(max_bytes=None, *, wait=True):
    """Bring the disk cache under a size cap now: ``max_bytes`` bytes, else
    TRACEGRAD_CACHE_MAX_BYTES, else 1 GiB (0: no limit, so only stale
    temporary files and pieces of removed entries go).  Past the cap,
    entries of other tracegrad versions go first, then the least recently
    used entries and recipes, until the folder holds at most the cap.

    Returns a report: ``bytes_before``, ``bytes_after``, ``freed_bytes``,
    ``removed`` (counts by reason: other_version, lru, recipe, orphan,
    temp), ``evicted_entries``, ``kept_fresh`` (entries left because their
    shared object was built in the last ``FRESH_OBJECT_SECONDS``: its
    process may be loading it), ``max_bytes``, ``folder``; None when the
    disk cache is off or its folder is missing or unsafe, or (wait=False)
    another process is pruning it."""
    cap = size_cap() if max_bytes is None else int(max_bytes)
    if cap < 0:
        raise ValueError(f"max_bytes must be 0 (no limit) or a positive number of bytes, got {cap}")
    d = cache_dir()
    if d is None or not _safe_dir(d):
        return None
    return _prune(d, cap, cap, wait)


# The folder's size, kept without scanning it at every write: the file
# USAGE_FILE holds {"bytes": what the last scan found, "at_scan": the count
# of bytes written when it began, "added": the count of bytes written by
# every process, "scanned": when}, updated under flock.  A write adds to
# "added"; the estimate is bytes + added - at_scan.  A write that takes it
# past the cap (or finds the file missing, damaged, or a scan a day old)
# scans and prunes.  A write counted during a scan is counted twice at worst:
# the estimate errs high, which costs an early scan, never an overfull folder.
USAGE_FILE = ".usage.json"
_local = {"dir": None, "bytes": None, "writes": 0}     # without flock: this process's count
_local_lock = threading.Lock()


def _usage_update(d, change):
    """Under an flock of the folder's USAGE_FILE: ``change`` an int adds
    that many bytes written and returns (estimate, scan due); None returns
    "added" (the count a scan starts from); (bytes, at_scan) records a
    scan.  Returns None when the file cannot be used (no flock, not ours)."""
    if fcntl is None:
        return None
    try:
        fd = os.open(os.path.join(d, USAGE_FILE), os.O_RDWR | os.O_CREAT | getattr(
            os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0),
            0o600)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (_POSIX and (st.st_uid != os.geteuid()
                                                        or st.st_mode & 0o022)):
            return None
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            u = json.loads(os.pread(fd, 4096, 0).decode("ascii"))
            if set(u) != {"bytes", "at_scan", "added", "scanned"} or \
                    not all(type(v) is int and v >= 0 for v in u.values()):
                raise ValueError(u)
            ok = True
        except ValueError:      # new, damaged or cut short: a scan puts it right
            u, ok = {"bytes": 0, "at_scan": 0, "added": 0, "scanned": 0}, False
        if change is None:
            return u["added"]
        if isinstance(change, tuple):
            u.update(bytes=change[0], at_scan=change[1], scanned=int(time.time()))
            if not ok:      # damaged during the scan: what was written since is lost
                u["added"] = change[1]
        else:
            u["added"] += change
        data = json.dumps(u, sort_keys=True).encode("ascii")
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
        estimate = u["bytes"] + max(0, u["added"] - u["at_scan"])
        return estimate, not ok or time.time() - u["scanned"] > RESCAN_SECONDS
    except OSError:
        return None
    finally:
        os.close(fd)    # releases the lock


def _after_write(d, nbytes):
    """``nbytes`` were written to the folder ``d``: count them, and prune the
    folder when it may be past the cap.  Never raises: the cap is
    housekeeping."""
    try:
        cap = size_cap()
        counted = _usage_update(d, nbytes)
        if counted is not None:
            estimate, due = counted
        else:   # no shared count here: this process's, with a scan every RESCAN_EVERY writes
            with _local_lock:
                if _local["dir"] != d:
                    _local.update(dir=d, bytes=None, writes=0)
                _local["writes"] += 1
                if _local["bytes"] is not None:
                    _local["bytes"] += nbytes
                estimate = _local["bytes"]
                due = estimate is None or _local["writes"] >= RESCAN_EVERY
        if cap <= 0 or not (due or estimate > cap):
            return
        report = _prune(d, cap, int(cap * PRUNE_TO), wait=False)
        if report is not None and counted is None:
            with _local_lock:
                _local.update(dir=d, bytes=report["bytes_after"], writes=0)
    except Exception as e:  # noqa: BLE001 -- a failed prune must not fail a compile
        log.warning("tracegrad: could not prune the cache folder %s (%s)", d, e)


def cache_info() -> dict:
    """Counters of this process and the size of the disk cache: ``disk_entries``
    and ``disk_bytes`` (what counts against the cap), ``disk_max_bytes`` (the
    cap, 0 for none), and for each kind of file ``disk_<kind>_count`` and
    ``disk_<kind>_bytes`` (kinds: numpy, native, shared_object, recipe,
    other_version, orphan, temp, other; see ``KINDS``)."""
    u = disk_usage()
    by_kind = {}
    for kind, *_ in KINDS:
        by_kind[f"disk_{kind}_count"] = u[kind]["count"]
        by_kind[f"disk_{kind}_bytes"] = u[kind]["bytes"]
    return dict(_stats, memory_entries=len(_memory), memory_size=_memory.maxsize,
                disk_entries=u["entries"], disk_bytes=u["bytes"], disk_max_bytes=u["max_bytes"],
                **by_kind, cache_dir=cache_dir(), target=_last_target[0], targets=dict(_targets))


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
                # .so: the native target's shared objects beside their entries;
                # .json: also the recipes and the running count of the folder's size
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
        with _local_lock:
            _local.update(dir=None, bytes=None, writes=0)
    for k in _stats:
        _stats[k] = 0
    _targets.clear()
    _last_target[0] = None
