"""The IR and its transforms: graphs in, graphs out.

``graph`` turns a trace into a ``networkx.MultiDiGraph`` (a node per
primitive application; an edge per operand position) and prints it;
``adjoint`` derives reverse- and forward-mode graphs from the registry's
rules, ``batching`` vectorises a graph (vmap), and ``passes`` simplifies
it (dead code, common subexpressions, constants, algebra) and decides
fusion and buffers.

May import: tracegrad.ops, tracegrad.eager, tracegrad.frontend.
"""
