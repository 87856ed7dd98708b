"""Eager tensors on the GPU: device moves (the ``to_device`` row), the
no-CuPy errors, and the mixed-device error.  The moves are exercised through
tracegrad.testing's CuPy stand-in, so they run without a GPU."""
import sys

import numpy as np
import pytest

import tracegrad as tg
from tracegrad import testing
from tracegrad.ops import primitives


@pytest.fixture
def no_cupy(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)   # `import cupy` fails


@pytest.fixture
def cp():
    with testing.emulated_cupy() as fake:
        yield fake


def test_cuda_tensor_without_cupy_is_a_clear_error(no_cupy):
    with pytest.raises(RuntimeError, match="needs CuPy"):
        tg.tensor([1.0, 2.0], device="cuda")
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="needs CuPy"):
        x.cuda()
    with pytest.raises(RuntimeError, match="needs CuPy"):
        x.to("cuda")
    assert x.cpu() is x   # already there: no move, no CuPy needed


def test_to_device_row_has_both_derivative_rules():
    row = primitives.get("to_device")
    assert row.vjp is not None and row.jvp is not None and not row.elementwise


def test_move_to_cuda_and_back(cp):
    x = tg.tensor(np.arange(3.0))
    y = x.cuda()
    assert y.device == tg.device("cuda") and y.is_cuda and type(y._data) is cp.ndarray
    z = y.to("cpu")
    assert z.device == tg.device("cpu") and type(z._data) is np.ndarray
    np.testing.assert_array_equal(z.numpy(), [0.0, 1.0, 2.0])
    w = tg.tensor([1.0, 2.0], device="cuda", dtype=tg.float32)
    assert w.device.type == "cuda" and w.dtype == np.float32
    assert w.to("cuda") is w


def test_gradient_moves_back_to_the_input_device(cp):
    x = tg.tensor(np.array([0.5, -1.0, 2.0]), requires_grad=True)
    loss = (x.cuda().exp() * 2).sum()
    assert loss.device.type == "cuda"
    loss.backward()
    assert x.grad.device.type == "cpu"
    np.testing.assert_allclose(x.grad.numpy(), 2 * np.exp([0.5, -1.0, 2.0]))

    w = tg.tensor([1.0, 2.0], device="cuda", requires_grad=True)
    (w.cpu() ** 2).sum().backward()
    assert w.grad.device.type == "cuda"
    np.testing.assert_allclose(testing.to_host(w.grad._data), [2.0, 4.0])


def test_mixing_devices_in_one_op_is_an_error(cp):
    a = tg.tensor([1.0, 2.0], device="cuda")
    b = tg.tensor([3.0, 4.0])
    with pytest.raises(RuntimeError, match="same device.*cuda and cpu.*'mul'"):
        a * b
    with pytest.raises(RuntimeError, match="same device"):
        b + a
    assert (a * 2.0).device.type == "cuda"   # Python scalars are fine
