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

from tracegrad import cache

# What each transform's graph holds, for the callers that lay out results.
TRANSFORMS = ("forward", "grad", "value_and_grad", "jacrev", "jacfwd", "hessian", "vjp", "jvp",
              "joint", "vhp", "hvp")


def graph_of(trace, exact=False):
    """The optimised graph of a trace (``exact``: only the passes that keep
    every floating-point result bit for bit)."""
    from tracegrad import ir, passes
    g = ir.from_trace(trace)
    passes.optimize(g, exact=exact)
    return g


def transform(g, kind, wrt):
    """The optimised graph of transform ``kind`` of graph ``g`` with respect
    to the inputs at positions ``wrt``:

    forward: g itself; grad / value_and_grad: value and gradient of a scalar
    output; jacrev / jacfwd: the Jacobian by reverse / forward mode; hessian;
    vjp: outputs and input cotangents, the output cotangents as extra inputs;
    joint: the input cotangents only; jvp: outputs and their tangents, one
    tangent input per input; vhp / hvp: v^T H and H v of a scalar output."""
    from tracegrad import adjoint, passes
    wrt = list(wrt)
    if kind == "forward":
        return g
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
    from tracegrad import adjoint, passes
    fwd, bwd, n_residuals = adjoint.split(joint, n_in, n_out)
    passes.optimize(fwd)
    passes.optimize(bwd)
    return fwd, bwd, n_residuals


def generate(functions, backend="numpy", **header):
    """Source of one module with a function per (graph, name, argument
    names, docstring): the NumPy target, or for backend "cupy" the CUDA
    target's CuPy driver with the same function names."""
    if backend == "cupy":
        from tracegrad import codegen_cuda
        return codegen_cuda.generate_driver(functions, **header)
    from tracegrad import codegen
    return codegen.generate_numpy(functions, **header)


def load(khash, parts, make_source, explain_as=None):
    """The loaded generated module for a key: from the memory or disk
    cache, or built by ``make_source()`` and stored (``explain_as``: the
    function name TRACEGRAD_EXPLAIN reports a build under)."""
    ns = cache.lookup(khash)
    if ns is None:
        cache.count("compiles")
        source = make_source()
        if explain_as is not None:
            cache.explain_miss(explain_as, parts)
        ns = cache.store(khash, source, parts)
    return ns
