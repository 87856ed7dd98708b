"""torch's dtypes on the torch face (issue 27, item 1): the default dtype is
float32 as in torch, and torch's type promotion (bool < integer < floating <
complex; 0-d tensors and Python numbers decide only by category; a Python
float is the default dtype) holds for eager Tensors and for traced
torch-face values alike; NumPy-face values keep NumPy's rule (NEP 50).
The expected dtypes come from torch 2.13 (tests/_torch_dtype_table.py)."""
import numpy as np
import pytest

import tracegrad as torch
import tracegrad.func as tf
from _torch_dtype_table import CASES, PROMOTE, UNARY

_OPS = {"add": lambda a, b: a + b, "mul": lambda a, b: a * b, "div": lambda a, b: a / b,
        "maximum": lambda a, b: torch.maximum(a, b)}


def _make(o):
    kind, v = o
    if kind == "dim":
        return torch.ones(3, dtype=getattr(torch, v))
    if kind == "zero":
        return torch.tensor(1, dtype=getattr(torch, v))
    return eval(v)


_ROWS = [r for r in CASES if r[3] not in ("error", "complex32")]


@pytest.mark.parametrize("op, a, b, expected", _ROWS)
def test_binary_promotion_eager(op, a, b, expected):
    assert str(_OPS[op](_make(a), _make(b)).dtype) == expected


@pytest.mark.parametrize("op, a, b, expected", [r for r in _ROWS if r[2][0] == "py" or
                                                 r[1][0] == "zero" or r[2][0] == "zero"])
def test_binary_promotion_compiled(op, a, b, expected):
    if b[0] == "py":
        f = torch.compile(lambda x, _b=_make(b): _OPS[op](x, _b))
        assert str(f(_make(a)).dtype) == expected
    else:
        f = torch.compile(lambda x, y: _OPS[op](x, y))
        assert str(f(_make(a), _make(b)).dtype) == expected


@pytest.mark.parametrize("op, dt, expected", [r for r in UNARY if r[2] != "error"])
def test_unary_dtypes(op, dt, expected):
    x = torch.ones(3, dtype=getattr(torch, dt))
    assert str(getattr(torch, op)(x).dtype) == expected
    assert str(torch.compile(getattr(torch, op))(x).dtype) == expected


@pytest.mark.parametrize("a, b, promoted, castable", PROMOTE)
def test_promote_types_and_can_cast(a, b, promoted, castable):
    da, db = getattr(torch, a), getattr(torch, b)
    assert str(torch.promote_types(da, db)) == promoted
    assert torch.can_cast(da, db) is castable


def test_default_dtype_is_float32_and_follows_set_default_dtype():
    x32 = torch.tensor([1.0, 2.0, 3.0])
    assert x32.dtype == torch.float32
    assert (x32 * torch.tensor([1.0, 2.0, 3.0])).dtype == torch.float32
    for t in (torch.linspace(0, 1, 3), torch.arange(0.0, 1.0, 0.5), torch.rand(2),
              torch.randn(2), torch.zeros(2), torch.ones(2), torch.full((2,), 1.5),
              torch.eye(2), torch.tensor(0.1)):
        assert t.dtype == torch.float32
    assert torch.tensor(0.1).item() == float(np.float32(0.1))     # the literal rounded
    assert (torch.ones(3, dtype=torch.float32) * torch.tensor([1, 2, 3])).dtype == torch.float32
    assert (torch.tensor([1, 2]) * 2.5).dtype == torch.float32
    assert (torch.tensor([1, 2]) / torch.tensor([2, 2])).dtype == torch.float32
    try:
        torch.set_default_dtype(torch.float64)
        assert torch.tensor([1.5]).dtype == torch.float64
        assert (torch.tensor([1, 2]) * 2.5).dtype == torch.float64
        assert torch.sqrt(torch.tensor([4])).dtype == torch.float64
        assert torch.result_type(torch.tensor([1]), 1.0) == torch.float64
    finally:
        torch.set_default_dtype(torch.float32)


def test_where_and_clamp_promote_as_torch():
    c = torch.tensor([True, False])
    assert torch.where(c, 1.0, 2).dtype == torch.float32
    assert torch.where(c, torch.tensor([1, 2]), 2.5).dtype == torch.float32
    assert torch.compile(lambda c: torch.where(c, 1.0, 2))(c).dtype == torch.float32
    assert torch.clamp(torch.tensor([1, 2]), 0.5).dtype == torch.float32
    assert torch.clamp(torch.tensor([1, 2]), 0, 1).dtype == torch.int64
    assert np.where(np.array([True]), 1.0, 2).dtype == np.float64      # NumPy's own


def test_result_type_finfo_iinfo():
    assert torch.result_type(torch.tensor([1, 2]), 1.0) == torch.float32
    assert torch.result_type(torch.ones(2, dtype=torch.float32),
                             torch.tensor(1.0, dtype=torch.float64)) == torch.float32
    assert torch.result_type(torch.tensor([1], dtype=torch.int32), torch.tensor(5)) == torch.int32
    assert torch.result_type(torch.tensor([True]), 2) == torch.int64
    assert torch.result_type(2, 3.0) == torch.float32
    assert torch.finfo().eps == np.finfo(np.float32).eps
    assert torch.finfo(torch.float64).max == np.finfo(np.float64).max
    assert torch.finfo(torch.float16).tiny == np.finfo(np.float16).tiny
    assert torch.iinfo(torch.int32).max == 2 ** 31 - 1 and torch.iinfo(torch.uint8).min == 0
    with pytest.raises(TypeError):
        torch.finfo(torch.int32)
    with pytest.raises(TypeError):
        torch.iinfo(torch.float32)


def test_traced_values_get_the_same_dtypes_as_eager():
    def f(x, n):
        a = x * 2.5                     # float32
        b = n * 2.5                     # int64 * float -> float32 (the default)
        c = n / 2                       # true division of ints: float32
        d = x * torch.tensor(3.0, dtype=torch.float64)   # 0-d float64: float32
        e = torch.sqrt(n)               # float32
        return a, b, c, d, e

    x = torch.ones(3)
    n = torch.tensor([1, 2, 3])
    eager = f(x, n)
    compiled = torch.compile(f)(x, n)
    for e, c in zip(eager, compiled):
        assert e.dtype == c.dtype == torch.float32
        np.testing.assert_allclose(c.numpy(), e.numpy())
    g = tf.grad(lambda x: (x * 0.1 + torch.tensor(1.0, dtype=torch.float64)).sum())(x)
    assert g.dtype == torch.float32
    v = tf.vmap(lambda r: r * torch.tensor([1, 2, 3]))(torch.ones(2, 3))
    assert v.dtype == torch.float32


def test_numpy_face_keeps_numpys_rule():
    x = np.ones(3, np.float32)
    assert torch.compile(lambda a, b: a * b)(x, np.array(2.0)).dtype == np.float64
    assert torch.compile(lambda a: a * 2.5)(np.array([1, 2])).dtype == np.float64
    assert torch.compile(lambda a: np.sqrt(a))(np.array([1, 4])).dtype == np.float64
    assert torch.compile(lambda a: a / 2)(np.array([1, 4])).dtype == np.float64
    g = torch.grad(lambda a: np.sum(a * 0.1))(np.ones(3))
    assert g.dtype == np.float64


def test_gradients_keep_the_dtypes():
    x = torch.ones(3, requires_grad=True)
    s = torch.tensor(2.0, dtype=torch.float64, requires_grad=True)
    (x * s).sum().backward()
    assert x.grad.dtype == torch.float32 and s.grad.dtype == torch.float64


# --- parity with torch (where it is installed) ------------------------------------------------

def test_torch_parity_table_is_current():
    real = pytest.importorskip("torch")
    for op, a, b, expected in CASES[:200]:
        def mk(o):
            k, v = o
            if k == "dim":
                return real.ones(3, dtype=getattr(real, v))
            if k == "zero":
                return real.tensor(1, dtype=getattr(real, v))
            return eval(v)
        f = {"add": lambda p, q: p + q, "mul": lambda p, q: p * q, "div": lambda p, q: p / q,
             "maximum": lambda p, q: real.maximum(p, q)}[op]
        try:
            got = str(f(mk(a), mk(b)).dtype).replace("torch.", "")
        except Exception:  # noqa: BLE001 -- torch refuses: the table says "error"
            got = "error"
        assert got == expected, (op, a, b)
