"""torch.save / torch.load: Tensors, Parameters, state_dicts and nested
containers round-trip through a file or a file object; weights_only (the
default) rebuilds no other object; torch's own (zip) files are refused with
what to do."""
from __future__ import annotations

import io
import pickle

import numpy as np
import pytest

import tracegrad as torch
from tracegrad import nn


def _model():
    return nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.ReLU(), nn.Flatten(),
                         nn.Linear(2 * 3 * 3, 3))


def test_a_models_state_dict_round_trips_through_a_file(tmp_path):
    torch.manual_seed(0)
    model = _model()
    x = torch.randn(4, 1, 5, 5)
    model(x)                     # running statistics and num_batches_tracked move
    path = tmp_path / "model.pt"
    torch.save(model.state_dict(), path)          # a pathlib path
    other = _model()
    assert str(other.load_state_dict(torch.load(path))) == "<All keys matched successfully>"
    sd, back = model.state_dict(), torch.load(str(path))   # a str path
    assert list(back) == list(sd) and type(back) is type(sd)
    for k in sd:
        assert back[k].dtype == sd[k].dtype and back[k].shape == sd[k].shape, k
        np.testing.assert_array_equal(back[k].numpy(), sd[k].numpy())
    model.eval()
    other.eval()
    np.testing.assert_array_equal(other(x).detach().numpy(), model(x).detach().numpy())


def test_tensors_parameters_and_nested_containers_round_trip():
    p = nn.Parameter(torch.tensor([1.0, 2.0]))
    frozen = nn.Parameter(torch.tensor([3.0]), requires_grad=False)
    obj = {"b": [torch.tensor([1, 2], dtype=torch.int64), torch.tensor(2.5, dtype=torch.float64),
                 torch.tensor([True, False]), torch.tensor([1 + 2j], dtype=torch.complex64)],
           "a": (p, frozen, None, 3, 4.5, "text", b"raw"),
           "t": torch.tensor([[1.0]], requires_grad=True)}
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    back = torch.load(buf)
    assert list(back) == ["b", "a", "t"]
    for got, want in zip(back["b"], obj["b"]):
        assert isinstance(got, torch.Tensor) and got.dtype == want.dtype
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    bp, bf = back["a"][0], back["a"][1]
    assert isinstance(bp, nn.Parameter) and bp.requires_grad and bp.tolist() == [1.0, 2.0]
    assert isinstance(bf, nn.Parameter) and not bf.requires_grad
    assert back["a"][2:] == (None, 3, 4.5, "text", b"raw")
    assert back["t"].requires_grad and back["t"].is_leaf


def test_an_optimizers_state_round_trips_and_training_continues_the_same(tmp_path):
    torch.manual_seed(1)
    model = nn.Linear(3, 2)
    x, y = torch.randn(8, 3), torch.randn(8, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)

    def step(m, o):
        o.zero_grad()
        ((m(x) - y) ** 2).mean().backward()
        o.step()

    for _ in range(3):
        step(model, opt)
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, tmp_path / "ck.pt")
    ck = torch.load(tmp_path / "ck.pt")
    model2 = nn.Linear(3, 2)
    model2.load_state_dict(ck["model"])
    opt2 = torch.optim.Adam(model2.parameters(), lr=0.5)
    opt2.load_state_dict(ck["opt"])
    assert opt2.param_groups[0]["lr"] == 0.01
    for _ in range(3):
        step(model, opt)
        step(model2, opt2)
    for a, b in zip(model.parameters(), model2.parameters()):
        np.testing.assert_array_equal(a.detach().numpy(), b.detach().numpy())


class _Payload:
    def __reduce__(self):
        return (print, ("not run",))


def test_weights_only_rebuilds_no_other_object(tmp_path):
    path = tmp_path / "obj.pt"
    torch.save({"w": torch.ones(2), "x": _Payload()}, path)
    with pytest.raises(pickle.UnpicklingError, match="weights_only=False"):
        torch.load(path)
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        torch.load(path, weights_only=True)
    torch.save({"k": 1}, path)
    with pytest.raises(RuntimeError, match="explicit pickle_module"):
        torch.load(path, pickle_module=pickle)
    assert torch.load(path, pickle_module=pickle, weights_only=False) == {"k": 1}


def test_torchs_zip_files_and_bad_arguments_are_refused(tmp_path):
    path = tmp_path / "torch.pt"
    path.write_bytes(b"PK\x03\x04" + bytes(40))    # the start of torch.save's zip archive
    with pytest.raises(RuntimeError, match="zip archive"):
        torch.load(path)
    with pytest.raises(AttributeError, match="file name or a binary file object"):
        torch.save(torch.ones(1), 3)
    with pytest.raises(NotImplementedError, match="map_location"):
        torch.load(io.BytesIO(pickle.dumps(1)), map_location=lambda s, loc: s)


def test_map_location_cpu_keeps_the_tensors():
    buf = io.BytesIO()
    torch.save([torch.ones(2)], buf)
    for where in ("cpu", torch.device("cpu"), None):
        buf.seek(0)
        got = torch.load(buf, map_location=where)
        assert got[0].tolist() == [1.0, 1.0] and got[0].device.type == "cpu"


def test_a_file_torch_wrote_is_refused_and_ours_is_not_torchs():
    real = pytest.importorskip("torch")
    buf = io.BytesIO()
    real.save({"w": real.ones(2)}, buf)
    buf.seek(0)
    with pytest.raises(RuntimeError, match="Load it with torch"):
        torch.load(buf)
