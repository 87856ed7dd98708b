"""Settings for the whole suite.

Compiled functions default to the native C target wherever a C compiler
works, and building a graph's C costs 0.1-0.2 s of the compiler's time: on
the native default the suite's thousands of graphs take it from about 2.5 to
about 9 minutes on 2 cores.  So the suite runs the NumPy target unless
TRACEGRAD_BACKEND is set; the native target is tested by test_native.py (the
compiled corpus through every transform, float32 and float64, against the
NumPy target), the tests that select it, and the default's own tests (which
unset the variable).  ``TRACEGRAD_BACKEND=native python -m pytest`` runs the
suite on native (docs/native.md, Tests, says what that run shows).
"""
import os

import pytest

os.environ.setdefault("TRACEGRAD_BACKEND", "numpy")


@pytest.fixture
def numpy_target(monkeypatch):
    """For a test of the NumPy target's own code or bits (its generated
    source text, results equal to NumPy's or eager mode's to the last bit):
    the NumPy target even in a run with TRACEGRAD_BACKEND=native."""
    monkeypatch.setenv("TRACEGRAD_BACKEND", "numpy")
