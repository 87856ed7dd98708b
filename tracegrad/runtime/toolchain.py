"""The native target's compiler: which one, with which flags, and whether it
works (the build recipe), without the generator.

A cache hit of a native function needs the recipe (its identity is part of
the key) but neither the graph modules (networkx) nor the generator
(Jinja2), so this module imports only the cache and the builder's light
module.  The recipe itself is
found by ``codegen_templates/native_loader.py`` (the builder pasted into
every generated module, run here once per process), which probes the
compiler with a few small builds; the result is remembered in the cache
folder (``native-recipe-<hash>.json``, keyed by the compiler's path, size
and modification time, ``CC``, the math choice, the CPU, glibc and Python),
so a warm process starts without running the compiler.  The file is read
under the cache's privacy rules: it names a program to run.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import shutil
import sys

from tracegrad.runtime import cache
from tracegrad.targets.native.builder import build_error, loader, loader_text, whole_enabled

log = logging.getLogger("tracegrad.native")

_broken = {}
_said = set()
_memo = {}
_fixed_parts = []


def _process_parts():
    """The recipe's inputs that cannot change while this process runs (the
    CPU, glibc, Python, the loader's text, the user), read once: reading the
    interpreter's binary for glibc and /proc/cpuinfo cost 1 ms on every
    compile."""
    if not _fixed_parts:
        parts = [platform.machine(), platform.libc_ver(), sys.implementation.cache_tag,
                 sys.version, hashlib.sha256(loader_text().encode()).hexdigest(),
                 os.geteuid() if hasattr(os, "geteuid") else None]   # what this user may read
        try:
            with open("/proc/cpuinfo") as f:
                parts.append(next((ln for ln in f if ln.startswith("flags")), ""))
        except OSError:
            pass
        _fixed_parts.append(parts)
    return _fixed_parts[0]


def _memo_key():
    """What the recipe depends on, or None when the compiler is not found
    (then the loader's probe gives the message)."""
    cmd = loader()["compiler_command"]()
    exe = shutil.which(cmd[0]) if cmd else None
    if exe is None:
        return None
    program = exe
    if cmd[1:3] == ["-m", "ziglang"]:      # the pip-installed Zig: its package is the compiler
        import importlib.util
        spec = importlib.util.find_spec("ziglang")
        program = spec.origin if spec is not None and spec.origin else exe
    try:
        st = os.stat(os.path.realpath(program))
    except OSError:
        return None
    parts = [cmd, os.path.realpath(program), st.st_size, st.st_mtime_ns,
             (os.environ.get("TRACEGRAD_NATIVE_MATH") or "vector").strip().lower(),
             os.environ.get("TRACEGRAD_NUM_THREADS"), loader()["_cores"](), *_process_parts()]
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:24]


def _probe():
    key = _memo_key()
    if key is not None and key in _memo:
        return _memo[key]
    if key is not None:
        text = cache.read_private(f"native-recipe-{key}.json")
        if text is not None:
            try:
                rec = json.loads(text)
                if isinstance(rec, dict) and "identity" in rec and not rec.get("presumed"):
                    _memo[key] = rec
                    return rec
            except ValueError:
                pass
    # No probe builds yet: the first module is built with the presumed recipe
    # (every first choice works), and the probes run only if that fails.
    rec = loader()["recipe"](presume=True)     # raises NativeBuildError
    if key is not None:
        _memo[key] = rec
    return rec


def _remember(key, rec):
    _memo[key] = rec
    cache.write_private(f"native-recipe-{key}.json", json.dumps(rec, sort_keys=True))


def confirm():
    """A module built and loaded with the recipe: a presumed one is proven,
    and remembered in the cache folder for later processes."""
    if not any(r.get("presumed") for r in _memo.values()):
        return          # nothing to prove: no need to compute the key
    key = _memo_key()
    rec = _memo.get(key)
    if rec is not None and rec.get("presumed"):
        _remember(key, {k: v for k, v in rec.items() if k != "presumed"})


def reprobe():
    """A build with the presumed recipe failed: run the probes.  True when
    they found another recipe (a build with it is worth trying), False when
    the recipe was not presumed or the probes found the same one."""
    key = _memo_key()
    rec = _memo.get(key)
    if key is None or rec is None or not rec.get("presumed"):
        return False
    try:
        found = loader()["recipe"]()
    except build_error():
        _memo[key] = dict(rec, presumed=False)     # no further probing in this process
        raise
    _remember(key, found)
    return found["identity"] != rec["identity"]


def recipe():
    """The build recipe (compiler, flags, ISA, vector math, identity);
    raises NativeBuildError when no working C compiler is found.  The
    identity (part of every native cache key) also says whether whole-graph
    functions are off."""
    rec = _probe()
    why = _broken.get(rec["identity"])
    if why is not None:
        raise build_error()(why)
    if not whole_enabled():
        rec = dict(rec, identity=rec["identity"] + " | whole=off")
    return rec


def recipe_or_none():
    rec, _ = available()
    return rec


def available():
    """(recipe, None) when the native target can build, else (None, why)."""
    try:
        return recipe(), None
    except Exception as e:  # noqa: BLE001 -- the loader's NativeBuildError, exec'd above
        if not isinstance(e, build_error()):
            raise
        return None, str(e)


def mark_broken(rec, why):
    """A build with this recipe failed: later builds in this process use
    the NumPy target instead of failing again."""
    _broken[rec["identity"].replace(" | whole=off", "")] = why


def fallback_notice(why):
    """One log line per reason: the native target is not used, and why."""
    if why not in _said:
        _said.add(why)
        log.warning("tracegrad: backend 'native' is not available (%s); using the NumPy "
                    "target instead (TRACEGRAD_BACKEND=numpy chooses it without this line)", why)
