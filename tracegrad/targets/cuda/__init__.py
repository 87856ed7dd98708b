"""The CUDA target: CUDA kernels under a CuPy driver (docs/cuda.md).

May import: tracegrad.ops, tracegrad.ir, tracegrad.targets.templates, tracegrad.targets.pysource, tracegrad.targets.cstyle.
"""
