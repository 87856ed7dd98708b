"""torch.set_default_dtype / get_default_dtype / set_default_device on the
eager constructors."""
import numpy as np
import pytest

import tracegrad as tg


@pytest.fixture
def float32_default():
    tg.set_default_dtype(tg.float32)
    try:
        yield
    finally:
        tg.set_default_dtype(tg.float32)


def test_tracegrad_default_is_float32_as_torch():
    assert tg.get_default_dtype() == np.float32
    assert tg.tensor([1.5]).dtype == np.float32
    assert tg.zeros(3).dtype == np.float32
    assert tg.get_default_device() == tg.device("cpu")


def test_float64_default_switches_back():
    tg.set_default_dtype(tg.float64)
    try:
        assert tg.tensor([1.5]).dtype == np.float64
        assert tg.zeros(3).dtype == np.float64
        assert tg.linspace(0, 1, 3).dtype == np.float64
        assert (tg.tensor([1, 2]) * 2.5).dtype == np.float64
        assert tg.tensor([1j]).dtype == np.complex128
    finally:
        tg.set_default_dtype(tg.float32)
    assert tg.zeros(1).dtype == np.float32


def test_float32_default_reaches_every_constructor(float32_default):
    assert tg.get_default_dtype() == np.float32
    f32 = np.dtype(np.float32)
    for t in (tg.tensor([1.5, 2.0]), tg.tensor(1.5), tg.as_tensor([0.5]), tg.zeros(3),
              tg.ones(2, 2), tg.empty(2), tg.full((2,), 1.5), tg.eye(2), tg.rand(3),
              tg.randn(3), tg.arange(0, 1, 0.25), tg.linspace(0, 1, 5),
              tg.normal(0.0, 1.0, size=(2,))):
        assert t.dtype == f32, t
    # the values are the float64 ones rounded once
    np.testing.assert_array_equal(tg.tensor([0.1, 1 / 3]).numpy(),
                                  np.array([0.1, 1 / 3], dtype=np.float32))
    np.testing.assert_array_equal(tg.arange(0, 1, 0.25).numpy(), [0, 0.25, 0.5, 0.75])


def test_float32_default_leaves_other_kinds_alone(float32_default):
    assert tg.tensor([1, 2]).dtype == np.int64
    assert tg.arange(3).dtype == np.int64
    assert tg.full((2,), 7).dtype == np.int64
    assert tg.tensor([True]).dtype == np.bool_
    assert tg.tensor([1 + 2j]).dtype == np.complex64
    # NumPy arrays and Tensors keep their dtype, as in torch
    assert tg.tensor(np.zeros(2)).dtype == np.float64
    assert tg.tensor(tg.zeros(2, dtype=tg.float64)).dtype == np.float64
    assert tg.tensor([1.5], dtype=tg.float64).dtype == np.float64
    assert tg.zeros(2, dtype=tg.double).dtype == np.float64


def test_float32_default_repr_and_grad(float32_default):
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    assert repr(x) == "tensor([1., 2.], requires_grad=True)"
    assert "dtype=float64" in repr(tg.tensor(np.ones(1)))
    (x * x).sum().backward()
    assert x.grad.dtype == np.float32
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 4.0])


@pytest.mark.parametrize("bad", [tg.int32, tg.int64, tg.bool, "int64", None, 3])
def test_set_default_dtype_refuses_non_floating(bad):
    with pytest.raises(TypeError, match="only floating-point types"):
        tg.set_default_dtype(bad)
    assert tg.get_default_dtype() == np.float32


def test_set_default_dtype_accepts_names_and_half():
    try:
        tg.set_default_dtype("float32")
        assert tg.zeros(1).dtype == np.float32
        tg.set_default_dtype(tg.half)
        assert tg.tensor([1.5]).dtype == np.float16
    finally:
        tg.set_default_dtype(tg.float32)
    assert tg.zeros(1).dtype == np.float32


def test_set_default_device_cpu():
    tg.set_default_device("cpu")
    tg.set_default_device(tg.device("cpu"))
    tg.set_default_device(None)
    assert tg.zeros(2).device == tg.device("cpu")
    assert tg.get_default_device() == tg.device("cpu")
    with pytest.raises(ValueError, match="unknown device"):
        tg.set_default_device("tpu")


def test_set_default_device_cuda():
    try:
        import cupy  # noqa: F401
        has_cupy = True
    except ImportError:
        has_cupy = False
    if not has_cupy:
        with pytest.raises(RuntimeError, match="needs CuPy"):
            tg.set_default_device("cuda")
        assert tg.get_default_device() == tg.device("cpu")
        return
    try:  # pragma: no cover - needs a GPU
        tg.set_default_device("cuda")
        assert tg.zeros(2).device.type == "cuda"
        assert tg.rand(2).device.type == "cuda"
        assert tg.tensor([1.0]).device.type == "cuda"
    finally:
        tg.set_default_device("cpu")


# --- parity with torch ---------------------------------------------------------------

def test_torch_parity_default_dtype():
    torch = pytest.importorskip("torch")
    before = torch.get_default_dtype()
    try:
        for tdt, ours in ((torch.float32, tg.float32), (torch.float64, tg.float64)):
            torch.set_default_dtype(tdt)
            tg.set_default_dtype(ours)
            pairs = [(torch.tensor([1.5]), tg.tensor([1.5])), (torch.tensor([1]), tg.tensor([1])),
                     (torch.zeros(2), tg.zeros(2)), (torch.arange(0, 1, 0.5), tg.arange(0, 1, 0.5)),
                     (torch.arange(3), tg.arange(3)), (torch.full((2,), 1.5), tg.full((2,), 1.5)),
                     (torch.full((2,), 1), tg.full((2,), 1)), (torch.eye(2), tg.eye(2)),
                     (torch.linspace(0, 1, 3), tg.linspace(0, 1, 3)),
                     (torch.tensor([1j]), tg.tensor([1j])),
                     (torch.tensor(np.zeros(2, np.float32)), tg.tensor(np.zeros(2, np.float32)))]
            for t, o in pairs:
                assert str(t.dtype).replace("torch.", "") == str(o.dtype)
            with pytest.raises(TypeError):
                torch.set_default_dtype(torch.int32)
            with pytest.raises(TypeError):
                tg.set_default_dtype(tg.int32)
    finally:
        torch.set_default_dtype(before)
        tg.set_default_dtype(tg.float32)


def test_device_as_context_manager():
    with tg.device("cpu") as d:
        assert d == tg.device("cpu")
        assert tg.zeros(1).device == tg.device("cpu")
        assert tg.get_default_device() == tg.device("cpu")
    assert tg.get_default_device() == tg.device("cpu")


@pytest.mark.parametrize("data,want", [
    (np.float64(1.0), "float64"), ([np.float64(1.0), 2.0], "float64"),
    ([1.0, np.float64(2.0)], "float64"), ([[1.0], [np.float64(2.0)]], "float64"),
    (np.complex128(1.0), "complex128"), (np.float16(1.0), "float16"),
    ([np.float32(1.0), np.float32(2.0)], "float32"), ([1.0, 2.0], "float32"), (1.0, "float32"),
    (np.int64(3), "int64")])
def test_numpy_scalars_keep_their_dtype_in_tensor(data, want):
    # torch.tensor(np.float64(x)) is float64 (torch 2.13: a NumPy scalar, also
    # inside a list, says its dtype); only Python numbers take the default
    # (float32 here).  The fuzzer found float32 (precision silently lost).
    assert tg.get_default_dtype() == tg.float32
    assert str(tg.tensor(data).dtype) == want
    assert str(tg.as_tensor(data).dtype) == want
