"""The native CPU target: C kernels (or one C function per graph) under a
NumPy driver, built by the user's C compiler (docs/native.md); ``generic``
makes one C text serve every size of a dimension that varies.

May import: tracegrad.ops, tracegrad.ir, tracegrad.targets.templates, tracegrad.targets.pysource, tracegrad.targets.cstyle.
"""
