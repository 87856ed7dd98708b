"""The code generators: an optimised graph in, source text out.

Each target is a folder of its own and never imports another: ``numpy``
(plain NumPy source, one Python function per graph), ``native`` (C kernels,
or one C function per graph, under a NumPy driver) and ``cuda`` (CUDA
kernels under a CuPy driver).  What they share sits beside them:
``templates`` (the Jinja2 templates and the filter user text goes through),
``pysource`` (the Python-source renderer: names, literals, comments, loops
and branches, buffers) and ``cstyle`` (the C-style kernel renderer of the
native and CUDA targets; each of them is a table beside it).  A new C-like
target is one more folder with a table and a ``Function`` subclass.

Generating text needs no compiler, no CuPy and no GPU; building and loading
it is the runtime's.

May import: tracegrad.ops, tracegrad.ir.
"""
