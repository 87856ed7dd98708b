"""The front end: user code in, a trace (a list of primitive applications) out.

The trace interpreter (``trace``: symbolic values standing for the
arguments, NumPy and Tensor code alike), the source rewrite that rolls
Python loops into loop nodes (``loop_rewrite``), the guard of what a traced
function depends on (``code_deps``: the fingerprint of its code, closures
and globals, and the values it reads from them), the captured arrays and
random generators read at call time (``captured``) and the two faces,
NumPy's (``numpy_face``) and torch's (``torch_face``), which give every
name its own dialect's meaning.

May import: tracegrad.ops, tracegrad.eager.
"""
