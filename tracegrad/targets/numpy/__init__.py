"""The NumPy target: one plain Python function per graph, straight-line
NumPy calls, readable by a person.

May import: tracegrad.ops, tracegrad.ir, tracegrad.targets.templates, tracegrad.targets.pysource.
"""
