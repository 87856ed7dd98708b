"""Random torch-dialect programs: eager ``tracegrad.tensor`` with
``.backward()`` (its third backward replayed as generated code),
``tracegrad.func.grad`` / ``grad_and_value`` / ``vjp`` (compiled), a NumPy
reference written with torch's meaning, and finite differences agree.

The programs (tests/_random_torch_programs.py) are random compositions of
Tensor methods, top-level functions and ``torch.nn.functional`` with torch's
meanings: elementwise ops, reductions with dim/keepdim (std unbiased,
max(dim).values, logsumexp, norm, median), softmax and log_softmax, sort /
topk / kthvalue, cumsum, matmul and its spellings, reshape / view / flatten /
transpose / permute / squeeze / expand / repeat, slicing, advanced indexing,
gather, index_select, masked_fill, where, cat and stack, losses, indices
computed from values (argmax, sort), in-place updates of clones (add_, mul_,
copy_, clamp_, exp_, ..., of the whole or through a view: ``v.t()[0]``,
``v.diagonal()``, ``v.view(-1)[::2]``) and item assignment.  A failure prints the
torch-dialect program, its NumPy reference and its inputs as a runnable script.

Here: a few hundred programs, deterministic.  At scale, and against torch
itself where ``import torch`` works: ``python benchmarks/random_programs.py``.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import tracegrad as tg
import tracegrad.func as tfunc
from tracegrad.autograd import replay

import _random_torch_programs as rtp

SEEDED = 150
HYPOTHESIS = 80


@pytest.fixture(scope="module", autouse=True)
def private_cache(tmp_path_factory):
    old = os.environ.get("TRACEGRAD_CACHE_DIR")
    os.environ["TRACEGRAD_CACHE_DIR"] = str(tmp_path_factory.mktemp("random-torch-programs") / "cache")
    tg.clear_cache()
    prev = replay.set_backward_replay(True)
    yield
    replay.set_backward_replay(prev)
    tg.clear_cache(disk=False)
    if old is None:
        del os.environ["TRACEGRAD_CACHE_DIR"]
    else:
        os.environ["TRACEGRAD_CACHE_DIR"] = old


@pytest.mark.parametrize("seed", range(SEEDED))
def test_seeded_random_torch_program(seed):
    rtp.check_program(rtp.generate(rtp.RngChooser([2028, seed]), seed=seed))


@settings(derandomize=True, max_examples=HYPOTHESIS, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.filter_too_much])
@given(rtp.programs())
def test_hypothesis_random_torch_program(prog):
    rtp.check_program(prog)


def test_the_generator_covers_the_ops_it_promises():
    seen = set()
    for seed in range(SEEDED):
        seen.update(rtp.generate(rtp.RngChooser([2028, seed])).tags)
    wanted = {"sum", "mean", "std", "var", "max", "logsumexp", "softmax", "log_softmax",
              "cumsum", "matmul", "reshape", "transpose", "permute", "squeeze", "unsqueeze",
              "expand", "repeat", "flip", "basic", "advanced", "gather", "index_select",
              "masked_fill", "where", "cat", "stack", "clamp", "inplace", "inplace_view",
              "sort", "topk", "relu", "softplus", "div", "alpha", "chunk", "split", "narrow",
              "setitem", "argmax_gather"}
    assert wanted <= seen, wanted - seen


def test_a_failure_prints_a_runnable_reproducer():
    prog = rtp.generate(rtp.RngChooser(11), seed=11)
    ns = {}
    exec(prog.reproducer().replace("print(", "_ = ("), ns)
    np.testing.assert_allclose(ns["f"](*[tg.tensor(a) for a in prog.args]).numpy(),
                               ns["f_numpy"](*prog.args), rtol=1e-12)


def test_the_reference_translates_torch_meanings():
    """A hand-written program whose torch meanings differ from NumPy's."""
    prog = rtp.TorchProgram(
        [("x", np.array([[0.3, -1.2, 0.5], [1.1, 0.7, -0.4]]))],
        ["a = x.std(1)", "b = x.max(0).values", "c = x.repeat(2, 1)", "d = x.squeeze(0)",
         "e = x.transpose(0, 1)"],
        ["a = np.std(x, axis=1, ddof=1)", "b = np.max(x, axis=0)", "c = np.tile(x, (2, 1))",
         "d = x", "e = np.swapaxes(x, 0, 1)"],
        ["a.sum()", "(b * 2.0).sum()", "(c * c).sum()", "d.sum()", "(e ** 3).sum()"],
        ["np.sum(a)", "np.sum(b * 2.0)", "np.sum(c * c)", "np.sum(d)", "np.sum(e ** 3)"],
        ["std", "max", "repeat", "squeeze", "transpose"])
    rtp.check_program(prog)


# --- reproducers of bugs the random programs found --------------------------------------

def test_an_element_of_a_vector_is_a_view():
    """t[0] of a 1-d tensor was a copy (NumPy gives a scalar), so
    ``t[0].add_(1)`` left ``t`` unchanged; torch's t[0] is a 0-d view."""
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    v = (x * 1.0).clone()
    v[0].add_(1.5)
    np.testing.assert_array_equal(v.detach().numpy(), [2.5, 2.0])
    (v * v).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [5.0, 4.0])
    a = tg.tensor([1.0, 2.0])
    b = a[1]
    a.mul_(3.0)
    assert float(b) == 6.0
    y = x * 1.0
    y[0] = 2 * y[0]        # torch's MulBackward of y[0] * 2 does not need y[0]: no error
    (y * y).sum().backward()


def test_an_element_of_a_numpy_face_vector_stays_a_copy():
    """NumPy's a[0] is a scalar, a copy: compile=False keeps that meaning."""
    def f(x):
        a = x * 1.0
        b = a[0]
        a[0] = 5.0
        return b * a[1]
    x = np.array([0.5, 2.0])
    v, g = tg.value_and_grad(f, compile=False)(x)
    assert v == f(x)
    np.testing.assert_array_equal(g, [2.0, 0.5])


def test_in_place_methods_trace_in_torch_func():
    """``v.add_(...)`` in a function given to tracegrad.func was an
    AttributeError of the tracer; an update through a view writes into its base."""
    def f(x):
        v = x.clone()
        v.mul_(2.0)
        v.add_(x, alpha=3.0)
        v.clamp_(min=-0.5)
        v.sub_(1.0)
        v.div_(2.0)
        return (v * v).sum()
    x = np.array([0.3, -0.2, 0.1])
    xl = tg.tensor(x, requires_grad=True)
    f(xl).backward()
    np.testing.assert_allclose(tfunc.grad(f)(tg.tensor(x)).numpy(), xl.grad.numpy(), rtol=1e-12)

    def through_a_view(x):    # torch writes through the view into v
        v = x.clone()
        v[0].add_(x[1])
        v[1:].mul_(x[0])
        return (v * v).sum()
    xl = tg.tensor(x, requires_grad=True)
    through_a_view(xl).backward()
    np.testing.assert_allclose(tfunc.grad(through_a_view)(tg.tensor(x)).numpy(),
                               xl.grad.numpy(), rtol=1e-12)


def test_roll_takes_torchs_keywords():
    x = tg.tensor(np.arange(6.0).reshape(2, 3))
    np.testing.assert_array_equal(tg.roll(x, shifts=1, dims=1).numpy(),
                                  np.roll(np.arange(6.0).reshape(2, 3), 1, axis=1))


def test_compile_false_never_runs_the_compiled_code():
    """tg.grad(f, compile=False) after tg.grad(f) of the same one-array
    signature ran the compiled code (the two shared their tables)."""
    calls = []

    def f(x):
        calls.append(1)
        return np.sum(np.sin(x))
    x = np.array([0.5, 1.0])
    tg.grad(f)(x)
    n = len(calls)
    g = tg.grad(f, compile=False)(x)
    assert len(calls) == n + 1
    np.testing.assert_allclose(g, np.cos(x), rtol=1e-12)


def _written_through(make):
    """How many elements of ``v`` an in-place op on ``make(v)`` changed."""
    v = tg.tensor(np.arange(24.0).reshape(2, 3, 4))
    make(v).add_(100.0)
    return int((v.numpy() >= 100).sum())


@pytest.mark.parametrize("make", [lambda v: v.flip(0), lambda v: tg.flip(v, [2]),
                                  lambda v: tg.fliplr(v), lambda v: tg.rot90(v, 1, (1, 2)),
                                  lambda v: v.repeat(1, 1, 1), lambda v: v.tile((1,)),
                                  lambda v: v.transpose(0, 2).contiguous(),
                                  lambda v: tg.diag(v[0])])
def test_results_torch_copies_are_copies(make):
    """flip (a view in NumPy), repeat/tile by ones (which returned the tensor
    itself), contiguous() of a non-contiguous tensor (which returned it) and
    diag of a matrix are new tensors in torch: an in-place op on them left
    the source changed."""
    assert _written_through(make) == 0


@pytest.mark.parametrize("make, n", [(lambda v: v.diagonal(), 8), (lambda v: v.diagonal(1), 8),
                                     (lambda v: tg.diagonal(v, 0, 1, 2), 6)])
def test_diagonal_is_a_view(make, n):
    """torch's diagonal is a view; tracegrad's was a copy that in-place ops
    changed without reaching the tensor."""
    assert _written_through(make) == n
    x = tg.tensor(np.arange(9.0).reshape(3, 3), requires_grad=True)
    v = x * 1.0
    v.diagonal().mul_(2.0)
    (v * v).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), 2 * np.arange(9.0).reshape(3, 3)
                                  * np.where(np.eye(3), 4.0, 1.0))


def test_an_in_place_op_on_a_diagonal_that_is_a_copy_is_an_error():
    """Where the planes are not contiguous the diagonal is a copy: writing
    into it is an error, not an update the tensor never sees."""
    v = tg.tensor(np.arange(24.0).reshape(2, 3, 4))
    with pytest.raises(RuntimeError, match="diagonal"):
        tg.diagonal(v, 0, 0, 2).add_(1.0)
    assert v.numpy().max() == 23.0
