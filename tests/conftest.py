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
import shutil
import tempfile

import pytest

os.environ.setdefault("TRACEGRAD_BACKEND", "numpy")

# The suite's temporary files (native shared objects built without a disk
# cache, emulator libraries, Dask's scratch space, those of the processes the
# tests start) go to a folder of its own, which must be empty when the suite
# ends (the session fixture below checks and removes it): nothing of
# tracegrad's is left behind in the user's temporary folder.  pytest's own
# tmp_path folders stay where pytest keeps them.
# (A process the suite starts may import this module too, to unpickle a
# test's function or to run a pytest of its own: it keeps the folder the
# suite chose, and leaves checking and removing it to the suite.)
OWNS_SUITE_TMP = "TRACEGRAD_SUITE_TMP" not in os.environ
if OWNS_SUITE_TMP:
    os.environ["TRACEGRAD_SYSTEM_TMP"] = tempfile.gettempdir()
    os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", os.environ["TRACEGRAD_SYSTEM_TMP"])
    os.environ["TRACEGRAD_SUITE_TMP"] = tempfile.mkdtemp(prefix="tracegrad-suite-")
    os.environ["TMPDIR"] = os.environ["TRACEGRAD_SUITE_TMP"]
    tempfile.tempdir = None    # gettempdir() reads TMPDIR again
    os.environ.setdefault("TRACEGRAD_EMULATOR_DIR",
                          os.path.join(os.environ["TRACEGRAD_SUITE_TMP"], "emulator"))
SYSTEM_TMP = os.environ["TRACEGRAD_SYSTEM_TMP"]
SUITE_TMP = os.environ["TRACEGRAD_SUITE_TMP"]


def _left_behind():
    """What the suite's processes left in its temporary folder: not this
    process's own native folder (removed when it exits; test_native checks
    that) nor the emulator's libraries (a cache the suite chose to put here)."""
    own = f"tracegrad-native-{os.geteuid() if hasattr(os, 'geteuid') else 0}-{os.getpid()}"
    return sorted(n for n in os.listdir(SUITE_TMP) if n not in (own, "emulator"))


@pytest.fixture(scope="session", autouse=True)
def the_suite_leaves_the_temporary_folder_as_it_found_it():
    yield
    if not OWNS_SUITE_TMP:
        return
    left = _left_behind()
    shutil.rmtree(SUITE_TMP, ignore_errors=True)
    assert not left, f"the suite left these in the temporary folder: {left}"


@pytest.fixture(scope="session", autouse=True)
def torch_compiler_cache_in_pytests_tmp(tmp_path_factory):
    """torch (in a side environment) makes its compiler cache folder under
    the temporary folder on its first transforms or optimizer steps; the
    suite keeps that folder empty, so torch's goes to pytest's own."""
    old = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path_factory.mktemp("torchinductor"))
    yield
    if old is None:
        os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
    else:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = old


@pytest.fixture
def numpy_target(monkeypatch):
    """For a test of the NumPy target's own code or bits (its generated
    source text, results equal to NumPy's or eager mode's to the last bit):
    the NumPy target even in a run with TRACEGRAD_BACKEND=native."""
    monkeypatch.setenv("TRACEGRAD_BACKEND", "numpy")


# --- the same tests on a real GPU ----------------------------------------------------------
# TRACEGRAD_TEST_ON_GPU=1, on a machine with CuPy and a CUDA device: every
# test written against tracegrad.testing's emulator (``emulated_cupy()``) gets
# the real ``cupy`` instead, so the generated kernels and drivers run on the
# device.  The tests of the emulator itself (marked ``emulator_only``) skip.
ON_GPU = os.environ.get("TRACEGRAD_TEST_ON_GPU") == "1"
if ON_GPU:
    import contextlib

    import cupy as _cupy   # asked for the GPU: a missing CuPy is an error, not a skip
    from tracegrad import testing as _testing

    if _cupy.cuda.runtime.getDeviceCount() < 1:
        raise RuntimeError("TRACEGRAD_TEST_ON_GPU=1 but CuPy sees no CUDA device")

    @contextlib.contextmanager
    def _real_cupy():
        _testing._clear_compiled_state()
        try:
            yield _cupy
        finally:
            _testing._clear_compiled_state()

    _testing.emulated_cupy = _real_cupy


def pytest_configure(config):
    config.addinivalue_line("markers", "emulator_only: tests tracegrad.testing's emulator "
                            "itself; skipped when TRACEGRAD_TEST_ON_GPU=1")


def pytest_collection_modifyitems(config, items):
    if ON_GPU:
        skip = pytest.mark.skip(reason="a test of the emulator itself (TRACEGRAD_TEST_ON_GPU=1)")
        for item in items:
            if "emulator_only" in item.keywords:
                item.add_marker(skip)
