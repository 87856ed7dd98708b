"""The compile cache: memory first, then a folder on disk.

An entry is the generated module's source, keyed by a hash of the key's
parts (see ``make_key``).  On disk it is ``<hash>.py`` (the source, headed
by a checksum line) beside ``<hash>.json`` (the key's parts, so a recompile
can be explained).  Writes go to a temporary file renamed into place, so
processes sharing the folder never read half an entry; an entry that is
truncated, corrupt, foreign (owned by another user or writable by others)
or fails to load is recompiled and replaced, never trusted.

Environment: ``TRACEGRAD_CACHE_DIR`` (default: the user cache folder),
``TRACEGRAD_CACHE=0`` (memory only), ``TRACEGRAD_EXPLAIN=1`` (log why a
call recompiled: which key part changed against the closest earlier key).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import tempfile
import threading
import warnings

log = logging.getLogger("tracegrad.cache")

ENTRY_FORMAT = 1
_HEADER = "# tracegrad-cache-entry format={fmt} sha256={digest}\n"

_lock = threading.Lock()
_memory: dict = {}          # key hash -> namespace dict of the loaded module
_stats = {"traces": 0, "compiles": 0, "memory_hits": 0, "disk_hits": 0, "disk_misses": 0,
          "disk_writes": 0, "disk_errors": 0}
_warned_readonly = set()
_recent_keys: dict = {}     # function name -> [key parts] seen in this process


TEMPLATE_DIRS = [
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "codegen_templates"),
    # running from a source checkout: the top-level folder
    os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "codegen_templates"),
]


def template_dir():
    for d in TEMPLATE_DIRS:
        if os.path.isdir(d):
            return d
    raise FileNotFoundError("tracegrad's codegen_templates folder is missing from the installation")


_GENERATOR_FILES = ("primitives.py", "trace.py", "ir.py", "adjoint.py", "passes.py",
                    "codegen.py", "codegen_cuda.py", "runtime_numpy.py", "ops")
_templates_hash = None


def templates_hash() -> str:
    """Hash of the templates and of the generator itself (the modules whose
    code decides what is generated): part of every cache key."""
    global _templates_hash
    if _templates_hash is None:
        h = hashlib.sha256()
        pkg = os.path.dirname(os.path.abspath(__file__))
        paths = [os.path.join(template_dir(), n) for n in sorted(os.listdir(template_dir()))]
        for name in _GENERATOR_FILES:
            p = os.path.join(pkg, name)
            if os.path.isdir(p):
                paths += [os.path.join(p, n) for n in sorted(os.listdir(p)) if n.endswith(".py")]
            else:
                paths.append(p)
        for p in paths:
            if os.path.isfile(p):
                h.update(os.path.basename(p).encode())
                with open(p, "rb") as f:
                    h.update(f.read())
        _templates_hash = h.hexdigest()[:16]
    return _templates_hash


def count(what, n=1):
    _stats[what] += n


def cache_dir():
    """The disk cache folder, or None when the disk cache is off."""
    if os.environ.get("TRACEGRAD_CACHE", "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    d = os.environ.get("TRACEGRAD_CACHE_DIR")
    if not d:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        d = os.path.join(base, "tracegrad")
    return d


def _usable_dir(d):
    """Create the folder private to its owner; False (with one warning) if
    it cannot be written or is not safely ours."""
    try:
        os.makedirs(d, mode=0o700, exist_ok=True)
        st = os.stat(d)
        if hasattr(os, "getuid") and st.st_uid != os.getuid():
            raise PermissionError(f"the folder is owned by another user (uid {st.st_uid})")
        if not os.access(d, os.W_OK):
            raise PermissionError("the folder is read-only")
        return True
    except OSError as e:
        if d not in _warned_readonly:
            _warned_readonly.add(d)
            warnings.warn(f"tracegrad: cannot use the cache folder {d} ({e}); compiled code is "
                          f"kept in memory only. Set TRACEGRAD_CACHE_DIR to a writable folder "
                          f"of yours, or TRACEGRAD_CACHE=0 to silence this.", RuntimeWarning,
                          stacklevel=4)
        return False


def key_hash(parts: dict) -> str:
    blob = json.dumps(parts, sort_keys=True, default=repr).encode()
    return hashlib.sha256(blob).hexdigest()[:32]


def _exec_source(source, filename, khash):
    ns = {"__name__": f"tracegrad_generated_{khash[:12]}", "__file__": filename}
    code = compile(source, filename, "exec")
    exec(code, ns)
    if not filename.endswith(".py"):
        import linecache
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    return ns


def lookup(khash):
    """The loaded namespace for a key, from memory or disk, or None."""
    ns = _memory.get(khash)
    if ns is not None:
        count("memory_hits")
        return ns
    d = cache_dir()
    if d is None:
        return None
    path = os.path.join(d, khash + ".py")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        count("disk_misses")
        return None
    try:
        with os.fdopen(fd, "r", encoding="utf-8") as f:
            st = os.fstat(f.fileno())
            if hasattr(os, "getuid") and (st.st_uid != os.getuid() or st.st_mode & 0o022):
                log.warning("tracegrad: ignoring cache entry %s: it is owned by another user or "
                            "writable by others; it will be recompiled", path)
                count("disk_errors")
                return None
            text = f.read()
        header, _, body = text.partition("\n")
        digest = hashlib.sha256(body.encode()).hexdigest()
        if header + "\n" != _HEADER.format(fmt=ENTRY_FORMAT, digest=digest):
            raise ValueError("checksum mismatch (truncated or modified)")
        ns = _exec_source(text, path, khash)  # the header is a comment: lines match the file
    except Exception as e:  # a bad entry is a miss, never a crash
        log.warning("tracegrad: cache entry %s is unreadable (%s); recompiling", path, e)
        count("disk_errors")
        return None
    count("disk_hits")
    with _lock:
        _memory[khash] = ns
    return ns


def store(khash, source, parts):
    """Load ``source`` into memory and write it to disk atomically."""
    d = cache_dir()
    path = os.path.join(d, khash + ".py") if d else f"<tracegrad {khash[:12]}>"
    text = _HEADER.format(fmt=ENTRY_FORMAT,
                          digest=hashlib.sha256(source.encode()).hexdigest()) + source
    if d is not None and _usable_dir(d):
        try:
            _atomic_write(d, khash + ".json", json.dumps(parts, indent=1, sort_keys=True,
                                                         default=repr))
            _atomic_write(d, khash + ".py", text)
            count("disk_writes")
        except OSError as e:
            log.warning("tracegrad: could not write cache entry %s (%s)", path, e)
            path = f"<tracegrad {khash[:12]}>"
    else:
        path = f"<tracegrad {khash[:12]}>"
    ns = _exec_source(text, path, khash)
    with _lock:
        _memory[khash] = ns
    return ns


def _atomic_write(d, name, text):
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix="-" + name)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o600)
        os.replace(tmp, os.path.join(d, name))
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


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


def _disk_entries():
    d = cache_dir()
    if d is None or not os.path.isdir(d):
        return 0, 0
    n = size = 0
    for name in os.listdir(d):
        if name.endswith(".py") and not name.startswith(".tmp-"):
            n += 1
        if not name.startswith(".tmp-"):
            try:
                size += os.path.getsize(os.path.join(d, name))
            except OSError:
                pass
    return n, size


def cache_info() -> dict:
    """Counters of this process and the size of the disk cache."""
    n, size = _disk_entries()
    return dict(_stats, memory_entries=len(_memory), disk_entries=n, disk_bytes=size,
                cache_dir=cache_dir())


def clear_cache(memory=True, disk=True):
    """Empty the memory cache and the disk cache folder; reset the counters."""
    from tracegrad import api
    if memory:
        with _lock:
            _memory.clear()
        api._clear_fast_paths()
        _recent_keys.clear()
    if disk:
        d = cache_dir()
        if d and os.path.isdir(d):
            for name in os.listdir(d):
                if name.endswith((".py", ".json")) or name.startswith(".tmp-"):
                    try:
                        os.unlink(os.path.join(d, name))
                    except OSError:
                        pass
    for k in _stats:
        _stats[k] = 0
