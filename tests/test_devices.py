"""Device queries as in torch: tracegrad.cuda, tracegrad.accelerator and
tracegrad.backends.mps, answered by tracegrad's GPU path (CuPy).  Nothing
is mocked: on a machine without CuPy and a GPU the "none" answers are
checked, and the GPU answers only where CuPy sees a device."""
import importlib.util

import pytest

import tracegrad as tg


def _gpu():
    if importlib.util.find_spec("cupy") is None:
        return False
    import cupy
    try:
        return cupy.cuda.runtime.getDeviceCount() > 0
    except cupy.cuda.runtime.CUDARuntimeError:
        return False


GPU = _gpu()
needs_gpu = pytest.mark.skipif(not GPU, reason="needs CuPy and a CUDA device")
without_gpu = pytest.mark.skipif(GPU, reason="this machine has a CUDA device")


def test_reachable_as_attributes_of_tracegrad():
    assert callable(tg.cuda.is_available) and callable(tg.cuda.device_count)
    assert callable(tg.accelerator.is_available) and callable(tg.accelerator.current_accelerator)
    assert tg.backends.mps.is_available() is False and tg.backends.mps.is_built() is False
    # Tensor.cuda (the method) is untouched by the module of the same name
    assert callable(tg.ones(2).cuda)


def test_answers_agree_with_each_other():
    available = tg.cuda.is_available()
    assert isinstance(available, bool) and available is GPU
    assert tg.accelerator.is_available() is available
    assert (tg.cuda.device_count() > 0) is available
    assert tg.accelerator.device_count() == tg.cuda.device_count()


@without_gpu
def test_no_gpu_answers():
    assert tg.cuda.is_available() is False
    assert tg.cuda.device_count() == 0
    assert tg.accelerator.is_available() is False
    assert tg.accelerator.current_accelerator() is None
    assert tg.accelerator.current_accelerator(check_available=True) is None
    # the tutorials' first line picks the CPU
    dev = tg.accelerator.current_accelerator().type if tg.accelerator.is_available() else "cpu"
    assert tg.ones(2, device=dev).device == tg.device("cpu")


@without_gpu
def test_no_gpu_errors_name_the_fix():
    for call in (tg.cuda.current_device, tg.cuda.get_device_name, tg.cuda.synchronize):
        with pytest.raises(RuntimeError, match=r"no CUDA device.*tracegrad\[cuda\]"):
            call()
    with pytest.raises(RuntimeError, match="none is available.*CuPy"):
        tg.accelerator.current_device_index()


@needs_gpu
def test_gpu_answers():
    import cupy
    assert tg.cuda.is_available() is True
    assert tg.cuda.device_count() == cupy.cuda.runtime.getDeviceCount()
    assert tg.cuda.current_device() == cupy.cuda.runtime.getDevice()
    assert tg.accelerator.current_accelerator() == tg.device("cuda")
    assert tg.accelerator.current_device_index() == tg.cuda.current_device()
    assert isinstance(tg.cuda.get_device_name(), str) and tg.cuda.get_device_name(0)
    tg.cuda.synchronize()
    x = tg.ones(3, device=tg.accelerator.current_accelerator())
    assert x.device.type == "cuda"
    with pytest.raises(ValueError, match="out of range"):
        tg.cuda.get_device_name(tg.cuda.device_count())
    with pytest.raises(ValueError, match="expected a CUDA device"):
        tg.cuda.get_device_name("cpu")


def test_parity_with_torch_on_a_machine_without_gpu():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available() or GPU:
        pytest.skip("compares the no-GPU answers")
    assert tg.cuda.is_available() == torch.cuda.is_available()
    assert tg.cuda.device_count() == torch.cuda.device_count()
    assert tg.accelerator.is_available() == torch.accelerator.is_available()
    assert tg.accelerator.current_accelerator() is torch.accelerator.current_accelerator()
    assert tg.backends.mps.is_available() == torch.backends.mps.is_available()
