"""The one pipeline of a compiled call: trace -> graph -> transform ->
passes -> code generator (NumPy or CUDA) -> cache.

The decorators (``api``), compiled calls on the tape (``graph_call``), the
command line, ``autograd.functional`` and the eager backward replay all
build their code through these functions, so a transform, a pass or the
choice of generator is decided in one place.  A cache hit (``load``) needs
only the cache: the graph, transform and generator modules (networkx,
Jinja2) load on the first build.
"""
from __future__ import annotations

import os

from tracegrad.frontend import captured
from tracegrad.runtime import cache
from tracegrad.targets.native import generic

BACKENDS = ("numpy", "native")     # the ones TRACEGRAD_BACKEND may name

# The native C texts this process generated, by skeleton: a text that differs
# from an earlier one only in numbers (another batch size) is served by one
# generic C build (docs/native.md, "Generic sizes").
SIZES = generic.Registry()
cache.on_clear_memory.append(SIZES.clear)


def default_backend():
    """The target of a compiled function given no ``backend=`` (every
    decorator, ``tg.vjp``/``tg.jvp`` and ``tg.autograd.functional``):
    ``native`` (the NumPy target where no C compiler works, with one log
    line), or what ``TRACEGRAD_BACKEND`` names.  CuPy arrays select the CUDA
    target and Dask arrays the NumPy target whatever it says."""
    name = (os.environ.get("TRACEGRAD_BACKEND") or "native").strip().lower()
    if name not in BACKENDS:
        raise ValueError(f"TRACEGRAD_BACKEND must be one of {', '.join(BACKENDS)}, got "
                         f"{os.environ.get('TRACEGRAD_BACKEND')!r} (CuPy arrays select the "
                         f"CUDA target by themselves)")
    return name


# What each transform's graph holds, for the callers that lay out results.
TRANSFORMS = ("forward", "grad", "value_and_grad", "jacrev", "jacfwd", "hessian", "vjp", "jvp",
              "joint", "vhp", "hvp")


def graph_of(trace, exact=False):
    """The optimised graph of a trace (``exact``: only the passes that keep
    every floating-point result bit for bit)."""
    from tracegrad.ir import graph as ir, passes
    g = ir.from_trace(trace)
    # what the function returned as is (an input, a captured array, a view
    # of one): its outputs may alias those, and only those (passes.fresh_outputs)
    returned = [passes.alias_root(g, v) for v in g.graph["outputs"]]
    with captured.suspended():   # graphs are replayed here, not user code
        passes.optimize(g, exact=exact)
    g.graph["returned_aliases"] = returned
    return g


def transform(g, kind, wrt, fresh=True):
    """The optimised graph of transform ``kind`` of graph ``g`` with respect
    to the inputs at positions ``wrt``:

    forward: g itself; grad / value_and_grad: value and gradient of a scalar
    output; jacrev / jacfwd: the Jacobian by reverse / forward mode; hessian;
    vjp: outputs and input cotangents, the output cotangents as extra inputs;
    joint: the input cotangents only; jvp: outputs and their tangents, one
    tangent input per input; vhp / hvp: v^T H and H v of a scalar output.

    ``fresh``: outputs that would share memory with an argument or a
    constant get a copy (passes.fresh_outputs), for a graph whose results
    reach the caller; False for one replayed inside another trace, where a
    copy of a captured array would be folded into a constant (a snapshot
    instead of the array's value at call time)."""
    wrt = list(wrt)
    from tracegrad.ir import passes
    if kind == "forward":
        out = g
    else:
        with captured.suspended():   # graphs are replayed here, not user code
            out = _transform(g, kind, wrt)
    if not fresh:
        return out
    return passes.fresh_outputs(out, g.graph.get("returned_aliases") if kind == "forward"
                                else None)


def _transform(g, kind, wrt):
    from tracegrad.ir import adjoint, passes
    if kind in ("grad", "value_and_grad"):
        out = adjoint.reverse(g, wrt, seed="ones")
    elif kind in ("jacrev", "jacfwd"):
        out = adjoint.jacobian(g, wrt, mode=kind[3:])
    elif kind == "hessian":
        out = adjoint.hessian(g, wrt)
    elif kind in ("vjp", "joint"):
        out = adjoint.reverse(g, wrt, seed="input", keep_outputs=kind == "vjp")
    elif kind == "jvp":
        out = adjoint.tangent(g, wrt, keep_outputs=True)
    elif kind == "vhp":      # v^T H: the vjp of the gradient graph
        out = adjoint.reverse(adjoint.reverse(g, wrt, seed="ones", keep_outputs=False),
                              wrt, seed="input", keep_outputs=False)
    elif kind == "hvp":      # H v: forward mode over the gradient graph
        out = adjoint.tangent(adjoint.reverse(g, wrt, seed="ones", keep_outputs=False),
                              wrt, keep_outputs=False)
    else:
        raise ValueError(f"unknown transform {kind!r}; known: {', '.join(TRANSFORMS)}")
    passes.optimize(out)
    return out


def split(joint, n_in, n_out):
    """(forward, backward, number of residuals) of a vjp graph, both graphs
    optimised: the forward part returns the outputs and what the backward
    reads."""
    from tracegrad.ir import adjoint, passes
    with captured.suspended():
        fwd, bwd, n_residuals = adjoint.split(joint, n_in, n_out)
        passes.optimize(fwd)
        passes.optimize(bwd)
    return fwd, bwd, n_residuals


def generate(functions, backend="numpy", dynamic=None, probe=None, generic=False, **header):
    """Source of one module with a function per (graph, name, argument
    names, docstring): the NumPy target, or for backend "cupy" the CUDA
    target's CuPy driver with the same function names.  ``dynamic`` and
    ``probe`` (the same functions at other sizes) and ``generic`` (the C's
    structure the same at every size) are the native target's generic sizes
    (docs/native.md); sizes are no constants of the others."""
    if backend == "cupy":
        from tracegrad.targets.cuda import codegen as cuda
        return cuda.generate_driver(functions, **header)
    if backend == "native":
        from tracegrad.runtime import toolchain
        rec, why = toolchain.available()
        if rec is not None:
            from tracegrad.targets.native import codegen as native
            return native.generate_driver(functions, rec=rec, sizes=SIZES, dynamic=dynamic,
                                          probe=probe, generic=generic, **header)
        toolchain.fallback_notice(why)
    from tracegrad.targets.numpy import codegen
    return codegen.generate_numpy(functions, **header)


def native_parts(parts):
    """The key parts of a native build: the compiler's recipe (identity,
    flags, ISA level, vector math, glibc, Python ABI) joins the key, so a
    changed toolchain recompiles; "unavailable" when there is none (the
    entry then holds the NumPy target)."""
    if parts.get("backend") != "native":
        return parts
    from tracegrad.runtime import toolchain
    import numpy
    rec, _ = toolchain.available()
    return dict(parts, native=rec["identity"] if rec else "unavailable",
                numpy_abi=f"{numpy.__version__}")


def load(khash, parts, make_source, explain_as=None):
    """The loaded generated module for a key: from the memory or disk
    cache, or built by ``make_source()`` and stored (``explain_as``: the
    function name TRACEGRAD_EXPLAIN reports a build under)."""
    if parts.get("backend") == "native":
        parts = native_parts(parts)
        khash = cache.key_hash(parts)
    ns = cache.lookup(khash)
    if ns is None:
        cache.count("compiles")
        source = make_source()
        if explain_as is not None:
            cache.explain_miss(explain_as, parts)
        try:
            ns = cache.store(khash, source, parts)
        except Exception as e:  # noqa: BLE001 -- only a failed native build is handled
            if type(e).__name__ == "NativeBuildError" and _generic_refused(source):
                # a generic-size text that did not build: this size is built
                # specialised (make_source now gives its own C)
                cache.discard(khash)
                return load(khash, parts, make_source, explain_as)
            ns = _native_failed(e, khash, parts, make_source)
        else:
            if ns.get("_lib") is not None:      # a native module built and loaded
                from tracegrad.runtime import toolchain
                toolchain.confirm()
    cache.note_target(ns.get("TARGET") or ("cupy" if parts.get("backend") == "cupy"
                                           else "numpy"))
    return ns


def _generic_refused(source):
    """Was ``source`` a generic-size module (its C now refused for this process)?"""
    i = source.find("\nC_SOURCE = ")
    if i < 0 or "\n_lib, _ENTRY = _builder.shared_library(" not in source:
        return False
    import ast
    j = source.index("\n# The build recipe", i)
    # the C text: the one string literal the generator wrote there
    c_source = ast.literal_eval(ast.parse(source[i:j].strip()).body[0].value)
    if not SIZES.refuse(c_source):
        return False
    import logging
    logging.getLogger("tracegrad.native").info(
        "tracegrad: a generic-size C text did not build; its sizes are built one by one")
    return True


def _native_failed(e, khash, parts, make_source):
    """A native module whose C build failed: log it once, mark the recipe
    broken for this process and store the NumPy target under the key."""
    if parts.get("backend") != "native":
        raise e
    from tracegrad.runtime import toolchain
    # each generated module defines the builder's error class anew (the
    # builder is pasted into it), so the class is recognised by name
    if type(e).__name__ != "NativeBuildError":
        raise e
    cache.discard(khash)
    rec, _ = toolchain.available()
    why = f"the C build failed: {e}"
    try:
        # built with the presumed recipe: the probes may find one that builds
        retry = toolchain.reprobe()
    except toolchain.build_error() as probe_error:
        retry, why = False, str(probe_error)
    if retry:
        parts = native_parts({k: v for k, v in parts.items() if k != "native"})
        khash = cache.key_hash(parts)
        try:
            return cache.store(khash, make_source(), parts)
        except Exception as e2:  # noqa: BLE001 -- as above
            if type(e2).__name__ != "NativeBuildError":
                raise
            cache.discard(khash)
            rec, _ = toolchain.available()
            why = f"the C build failed: {e2}"
    if rec is not None:
        toolchain.mark_broken(rec, why)
    toolchain.fallback_notice(why.splitlines()[0])
    parts = native_parts({k: v for k, v in parts.items() if k != "native"})
    return cache.store(cache.key_hash(parts), make_source(), parts)
