"""Grad modes: no_grad, enable_grad, set_grad_enabled, inference_mode, as
context managers, decorators and plain calls, thread-local."""
import threading

import numpy as np
import pytest

import tracegrad as tg


@pytest.fixture(autouse=True)
def _restore_grad_mode():
    prev = tg.is_grad_enabled()
    yield
    tg.set_grad_enabled(prev)


def test_reference_example_no_grad():
    x = tg.tensor([1.0], requires_grad=True)
    with tg.no_grad():
        y = x * 2
    assert y.requires_grad is False and y.grad_fn is None

    @tg.no_grad()
    def doubler(x):
        return x * 2
    z = doubler(x)
    assert z.requires_grad is False
    assert (x * 2).requires_grad  # back on after the block

    @tg.no_grad
    def doubler2(x):  # torch 2 also takes the decorator without parentheses
        return x * 2
    assert doubler2(x).requires_grad is False and doubler2.__name__ == "doubler2"


def test_reference_example_enable_grad():
    x = tg.tensor([1.0], requires_grad=True)
    with tg.no_grad():
        with tg.enable_grad():
            y = x * 2
    assert y.requires_grad is True
    y.backward()
    assert x.grad.tolist() == [2.0]

    @tg.enable_grad()
    def doubler(x):
        return x * 2
    with tg.no_grad():
        z = doubler(x)
        assert not tg.is_grad_enabled()
    assert z.requires_grad is True


def test_reference_example_set_grad_enabled():
    x = tg.tensor([1.0], requires_grad=True)
    is_train = False
    with tg.set_grad_enabled(is_train):
        y = x * 2
    assert y.requires_grad is False
    tg.set_grad_enabled(True)
    y = x * 2
    assert y.requires_grad is True
    tg.set_grad_enabled(False)
    y = x * 2
    assert y.requires_grad is False
    assert not tg.is_grad_enabled()
    tg.set_grad_enabled(True)

    @tg.set_grad_enabled(False)
    def f(x):
        return x * 2
    assert tg.is_grad_enabled()  # decorating does not switch the mode
    assert f(x).requires_grad is False and tg.is_grad_enabled()
    with pytest.raises(TypeError, match="enabled must be a bool"):
        tg.set_grad_enabled("yes")


def test_modes_restore_on_exception_and_nest():
    with pytest.raises(ValueError):
        with tg.no_grad():
            raise ValueError("boom")
    assert tg.is_grad_enabled()
    with tg.no_grad():
        with tg.set_grad_enabled(True):
            assert tg.is_grad_enabled()
        assert not tg.is_grad_enabled()
        with tg.enable_grad():
            assert tg.is_grad_enabled()
        assert not tg.is_grad_enabled()
    assert tg.is_grad_enabled()


def test_inference_mode():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    with tg.inference_mode():
        assert tg.is_inference_mode_enabled() and not tg.is_grad_enabled()
        y = (x * x).sum()
    assert not y.requires_grad and y.item() == 5.0
    assert not tg.is_inference_mode_enabled() and tg.is_grad_enabled()
    with tg.inference_mode(False):
        assert (x * 2).requires_grad

    @tg.inference_mode()
    def f(x):
        return x * 3

    @tg.inference_mode
    def g(x):
        return x * 3
    assert not f(x).requires_grad and not g(x).requires_grad
    assert arr_list(g(x)) == [3.0, 6.0]


def arr_list(t):
    return t.detach().numpy().tolist()


def test_generator_function_decorated():
    x = tg.tensor([1.0], requires_grad=True)

    @tg.no_grad()
    def gen():
        for k in range(3):
            yield x * k
    outs = list(gen())
    assert [o.requires_grad for o in outs] == [False, False, False]
    assert tg.is_grad_enabled()


def test_grad_mode_is_thread_local():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    inside = threading.Event()
    release = threading.Event()
    results = {}

    def worker_no_grad():
        with tg.no_grad():
            inside.set()
            release.wait(5)
            results["worker"] = ((x * 2).requires_grad, tg.is_grad_enabled())

    def worker_default():
        results["fresh"] = ((x * 2).requires_grad, tg.is_grad_enabled())

    t = threading.Thread(target=worker_no_grad)
    t.start()
    assert inside.wait(5)
    # the other thread is inside no_grad: this one still records
    y = x * 3
    assert y.requires_grad and tg.is_grad_enabled()
    with tg.no_grad():
        t2 = threading.Thread(target=worker_default)  # a new thread starts with grad on
        t2.start()
        t2.join(5)
    release.set()
    t.join(5)
    assert results["worker"] == (False, False)
    assert results["fresh"] == (True, True)
    y.sum().backward()
    assert arr_list(x.grad) == [3.0, 3.0]


def test_backward_in_threads_concurrently():
    def work(seed, out):
        rng = np.random.default_rng(seed)
        v = rng.standard_normal(5)
        w = tg.tensor(v, requires_grad=True)
        for _ in range(50):
            with tg.set_grad_enabled(seed % 2 == 0):
                y = (w * w).sum()
            if y.requires_grad:
                w.grad = None
                y.backward()
        out[seed] = (v, w.grad)

    out = {}
    threads = [threading.Thread(target=work, args=(s, out)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    for s, (v, g) in out.items():
        if s % 2 == 0:
            np.testing.assert_allclose(g.numpy(), 2 * v)
        else:
            assert g is None
