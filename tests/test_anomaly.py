"""Anomaly detection: forward tracebacks for failing backward nodes, NaN checks."""
import threading
import warnings

import numpy as np
import pytest

import tracegrad as tg
from tracegrad import autograd
from tracegrad.eager.grad_mode import state

pytestmark = pytest.mark.filterwarnings("ignore:Anomaly Detection has been enabled")


class MyFunc(autograd.Function):
    # the reference's example
    @staticmethod
    def forward(ctx, inp):
        return inp.clone()

    @staticmethod
    def backward(ctx, gO):
        raise RuntimeError("Some error in backward")


def run_fn(a):
    out = MyFunc.apply(a)  # FORWARD-CALL
    return out.sum()


def test_off_by_default_and_no_trace_recorded():
    assert not autograd.is_anomaly_enabled()
    x = tg.tensor([1.0], requires_grad=True)
    assert (x * 2).grad_fn.anomaly_trace is None
    out = run_fn(tg.rand(3, 3, requires_grad=True))
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # no "Error detected" warning without anomaly mode
        with pytest.raises(RuntimeError, match="Some error in backward"):
            out.backward()


def test_reference_example_shows_forward_traceback():
    with autograd.detect_anomaly():
        inp = tg.rand(10, 10, requires_grad=True)
        out = run_fn(inp)  # OUTER-CALL
        with pytest.warns(Warning) as record:
            with pytest.raises(RuntimeError, match="Some error in backward"):
                out.backward()
    msgs = [str(w.message) for w in record if "Error detected" in str(w.message)]
    assert len(msgs) == 1
    msg = msgs[0]
    assert msg.startswith("Error detected in MyFuncBackward. Traceback of forward call that "
                          "caused the error:")
    assert __file__ in msg
    assert "FORWARD-CALL" in msg and "OUTER-CALL" in msg
    assert msg.index("OUTER-CALL") < msg.index("FORWARD-CALL")   # outermost first
    assert not autograd.is_anomaly_enabled()


def test_nan_in_custom_backward_names_the_function():
    class NanGrad(autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * float("nan")

    x = tg.tensor([1.0, 2.0], requires_grad=True)
    with autograd.detect_anomaly():
        y = NanGrad.apply(x).sum()  # NAN-FORWARD
        with pytest.raises(RuntimeError) as info:
            y.backward()
    msg = str(info.value)
    assert msg.startswith("Function 'NanGradBackward' returned nan values in its 0th output.")
    assert "NAN-FORWARD" in msg
    assert x.grad is None


def test_nan_in_primitive_backward():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    c = tg.tensor([float("nan"), 1.0])
    with autograd.detect_anomaly():
        y = (x * c).sum()
        with pytest.raises(RuntimeError, match=r"^Function 'MulBackward0' returned nan values in "
                                               r"its 0th output\."):
            y.backward()


def test_check_nan_false_lets_nan_through():
    x = tg.tensor([1.0], requires_grad=True)
    c = tg.tensor([float("nan")])
    with autograd.detect_anomaly(check_nan=False):
        assert autograd.is_anomaly_enabled() and not autograd.is_anomaly_check_nan_enabled()
        (x * c).sum().backward()
    assert np.isnan(x.grad.numpy()).all()
    assert autograd.is_anomaly_check_nan_enabled()
    # and without anomaly mode no check happens at all
    x.grad = None
    (x * c).sum().backward()
    assert np.isnan(x.grad.numpy()).all()


def test_detect_anomaly_warns_on_creation():
    with pytest.warns(UserWarning, match="Anomaly Detection has been enabled. This mode will "
                                         "increase the runtime"):
        autograd.detect_anomaly()


def test_set_detect_anomaly_as_call_and_context():
    assert not autograd.is_anomaly_enabled()
    autograd.set_detect_anomaly(True)
    try:
        assert autograd.is_anomaly_enabled()
        with autograd.set_detect_anomaly(False):
            assert not autograd.is_anomaly_enabled()
        assert autograd.is_anomaly_enabled()
    finally:
        autograd.set_detect_anomaly(False)
    assert not autograd.is_anomaly_enabled()
    with autograd.set_detect_anomaly(True, check_nan=False):
        assert autograd.is_anomaly_enabled() and not autograd.is_anomaly_check_nan_enabled()
    assert not autograd.is_anomaly_enabled() and autograd.is_anomaly_check_nan_enabled()


def test_detect_anomaly_as_decorator():
    @autograd.detect_anomaly()
    def f():
        return autograd.is_anomaly_enabled()

    assert f() is True
    assert not autograd.is_anomaly_enabled()


def test_state_is_thread_local():
    seen = []
    with autograd.detect_anomaly():
        t = threading.Thread(target=lambda: seen.append(autograd.is_anomaly_enabled()))
        t.start()
        t.join()
        assert autograd.is_anomaly_enabled()
    assert seen == [False]


def test_restored_after_exception():
    with pytest.raises(ValueError):
        with autograd.detect_anomaly():
            raise ValueError("boom")
    assert not state.anomaly
