"""The runtime: a compiled call from signature to result.

``pipeline`` is the one path from a trace to loaded code (graph, transform,
passes, target, cache); ``cache`` keeps generated modules in memory and on
disk, keyed by everything that shapes them; ``toolchain`` finds and probes
the C compiler and remembers the build recipe; ``graph_call`` makes a
compiled graph a callable that records one node on the eager tape; and
``distributed`` runs compiled code over Dask chunks.

May import: tracegrad.ops, tracegrad.eager, tracegrad.frontend, tracegrad.ir, tracegrad.targets.
"""
