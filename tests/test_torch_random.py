"""torch's random functions and dropout inside compiled code draw from
torch's generator (tg.manual_seed, or generator=), as torch.compile does:
seeded runs repeat, and compiled code draws what eager code draws."""
import numpy as np
import pytest

import tracegrad as torch
import tracegrad as tg

nn = torch.nn


def _draws(x):
    return x * torch.randn(3) + torch.rand(3) + torch.normal(0.0, 2.0, size=(3,)) \
        + torch.randint(0, 5, (3,)) + torch.randperm(3)


def test_compiled_draws_equal_eager_draws_after_the_same_seed():
    f = tg.compile(_draws)
    x = torch.ones(3)
    torch.manual_seed(3)
    eager = [_draws(x) for _ in range(3)]
    torch.manual_seed(3)
    compiled = [f(x) for _ in range(3)]
    for e, c in zip(eager, compiled):
        np.testing.assert_array_equal(c.numpy(), e.numpy())
        assert c.dtype == e.dtype == torch.float32
    assert not np.array_equal(compiled[0].numpy(), compiled[1].numpy())   # fresh every call


def test_a_generator_argument_is_drawn_from():
    g = torch.Generator().manual_seed(1)
    f = tg.compile(lambda x: x + torch.rand(4, generator=g))
    x = torch.zeros(4)
    first = f(x).numpy()
    g.manual_seed(1)
    np.testing.assert_array_equal(f(x).numpy(), first)
    g.manual_seed(1)
    np.testing.assert_array_equal(torch.rand(4, generator=g).numpy(), first)


def test_dropout_in_a_compiled_model_follows_manual_seed():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.Dropout(0.5), nn.Linear(16, 2))
    compiled = torch.compile(model)
    x = torch.ones(5, 4)
    torch.manual_seed(7)
    eager = [model(x).detach().numpy() for _ in range(2)]
    torch.manual_seed(7)
    comp = [compiled(x).detach().numpy() for _ in range(2)]
    for e, c in zip(eager, comp):
        np.testing.assert_allclose(c, e, rtol=1e-6, atol=1e-6)
    assert not np.allclose(comp[0], comp[1])


def test_requires_grad_draws_inside_compiled_code_are_refused():
    f = tg.compile(lambda x: x * torch.randn(3, requires_grad=True))
    with pytest.raises(TypeError, match="requires_grad=True"):
        f(torch.ones(3))


def test_torch_compile_keywords():
    import logging
    m = nn.Linear(3, 2)
    x = torch.ones(4, 3)
    want = m(x).detach().numpy()
    assert torch.compile(m, disable=True) is m
    for kw in ({"mode": "max-autotune"}, {"backend": "inductor"}, {"backend": "eager"},
               {"fullgraph": True, "mode": "reduce-overhead"}, {"options": {}}):
        np.testing.assert_allclose(torch.compile(m, **kw)(x).detach().numpy(), want, rtol=1e-6)
    with pytest.raises(RuntimeError, match="Unrecognized mode"):
        torch.compile(m, mode="fastest")
    with pytest.raises(ValueError, match="options"):
        torch.compile(m, options={"trace.enabled": True})

    def prints(x):          # a graph break: fullgraph=True raises as torch does
        if x.sum() > 0:
            print("positive")
        return x * 2
    logging.getLogger("tracegrad").disabled = True
    try:
        np.testing.assert_allclose(torch.compile(prints)(x).numpy(), 2 * x.numpy())
    finally:
        logging.getLogger("tracegrad").disabled = False
    with pytest.raises(Exception, match="print"):
        torch.compile(prints, fullgraph=True)(x)
