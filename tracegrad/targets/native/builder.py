"""The native target's builder, as this process runs it.

``codegen_templates/native_loader.py`` finds the compiler, probes it, builds
a module's C and loads the result; it is pasted into every generated native
module (a module written by ``tracegrad compile`` needs no tracegrad) and run
here once per process, for the recipe's probes (``runtime.toolchain``) and
for the few facts the generator prints (the vector math declarations).
"""
from __future__ import annotations

import os

from tracegrad.targets.templates import template_dir

_loader_ns = {}


def loader_text():
    with open(os.path.join(template_dir(), "native_loader.py"), encoding="utf-8") as f:
        return f.read()


def loader():
    """The builder's functions (native_loader.py, run once per process)."""
    if not _loader_ns:
        ns = {"__name__": "tracegrad_native_loader"}
        exec(compile(loader_text(), "native_loader.py", "exec"), ns)
        _loader_ns.update(ns)
    return _loader_ns


def build_error():
    """The class of the builder's errors."""
    return loader()["NativeBuildError"]


def whole_enabled():
    """Does a graph whose every node has a C form become one C function?
    On by default; ``TRACEGRAD_NATIVE_WHOLE=0`` keeps every graph in the
    driver structure with a C kernel per fused group."""
    return (os.environ.get("TRACEGRAD_NATIVE_WHOLE") or "1").strip().lower() \
        not in ("0", "off", "no", "false")


def shared_library(source, module_file, rec):
    """(library, entry) of a generic C text (``generic.Template``) for the
    module at ``module_file``: the object another module of the same text
    built is linked beside it, so the text is built once for all the sizes
    it serves.  Generic modules take their sizes through the extension's
    ``tg_enter``, so they need the extension entry."""
    hit = _by_text.get(id(source))
    if hit is not None and hit[0] is source and hit[1] == module_file:
        return hit[2]       # the same text object: a size plan's module at another size
    lib, entry = loader()["load_library"](source, module_file, rec)
    if entry != "python":
        raise build_error()("a generic-size module needs the extension entry (Python's and "
                            "NumPy's C headers), which this build did not get")
    if len(_by_text) >= 64:
        _by_text.clear()
    _by_text[id(source)] = (source, module_file, (lib, entry))
    return lib, entry


_by_text = {}   # id of a C text -> (the text, the module's file, (library, entry))
