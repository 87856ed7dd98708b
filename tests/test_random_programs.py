"""Random-program differential test: compiled, eager (its third backward
replayed as generated code), NumPy values and finite differences agree.

The programs (tests/_random_programs.py) are data, a list of NumPy statements
over a pool of values: views (one-operand einsum, reshape, transpose, .T,
squeeze, expand_dims, broadcast_to, diagonal, basic slicing, astype), fan-out,
broadcasting between operands of different shapes, reductions with
axis/keepdims, matmul, elementwise ops on domain-safe values, constants, and
a weighted sum down to a scalar loss.  A failure prints the program as a
runnable NumPy script with its input.

Here: a few hundred programs, deterministic.  At scale:
``python benchmarks/random_programs.py --count 10000``.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import tracegrad as tg
from tracegrad.autograd import replay

import _random_programs as rp

# programs per run of this file: SEEDED from NumPy seeds, HYPOTHESIS drawn
# (and shrunk on failure) by hypothesis
SEEDED = 200
HYPOTHESIS = 200


@pytest.fixture(scope="module", autouse=True)
def private_cache(tmp_path_factory):
    old = os.environ.get("TRACEGRAD_CACHE_DIR")
    os.environ["TRACEGRAD_CACHE_DIR"] = str(tmp_path_factory.mktemp("random-programs") / "cache")
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
def test_seeded_random_program(seed):
    rp.check_program(rp.generate(rp.RngChooser([12345, seed]), seed=seed))


@settings(derandomize=True, max_examples=HYPOTHESIS, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.filter_too_much])
@given(rp.programs())
def test_hypothesis_random_program(prog):
    rp.check_program(prog)


def test_the_generator_covers_the_ops_it_promises():
    """The seeded programs above use every kind of op at least a few times."""
    seen = set()
    for seed in range(SEEDED):
        seen.update(rp.generate(rp.RngChooser([12345, seed])).tags)
    wanted = {"einsum1", "reshape", "transpose", "T", "squeeze", "expand_dims", "broadcast_to",
              "diagonal", "slice", "astype64", "astype32", "sum", "max", "matmul", "log", "sqrt",
              "exp", "maximum", "where", "concatenate", "add", "mul", "div", "flip", "cumsum",
              "gather", "take", "repeat", "tile", "roll"}
    assert wanted <= seen, wanted - seen


def test_a_failure_prints_a_runnable_reproducer():
    prog = rp.generate(rp.RngChooser(7), seed=7)
    ns = {}
    exec(prog.reproducer().replace("print(", "_ = ("), ns)
    np.testing.assert_allclose(ns["f"](*prog.args), prog.function()(*prog.args))


def test_the_third_backward_replays():
    prog = rp.Program([("x", np.array([[0.3, -1.2, 0.5], [1.1, 0.7, -0.4]]))],
                      ["a = np.cos(x)", "b = np.einsum('ab->ba', a)", "c = np.exp(a)"],
                      ["np.sum(b * np.arange(6.).reshape(3, 2))", "np.sum(c)"], [])
    facts = rp.check_program(prog)
    assert facts["replayed"], facts


# --- reproducers of bugs the random programs found --------------------------------------

def test_one_operand_einsum_view_buffer_is_not_reused():
    """The planner reused the buffer of a one-operand einsum's operand with
    out= while the einsum's result (a view of it) was still alive."""
    def f(x):
        a = np.cos(x)
        b = np.einsum('ab->ba', a)
        c = np.exp(a)
        return np.sum(b * np.arange(6.).reshape(3, 2)) + np.sum(c)
    x = np.array([[.3, -1.2, .5], [1.1, .7, -.4]])
    np.testing.assert_allclose(tg.compile(f)(x), f(x), rtol=1e-12)
    np.testing.assert_allclose(tg.value_and_grad(f)(x)[0], f(x), rtol=1e-12)


def test_astype_copy_false_traces():
    def f(x):
        return np.sum(np.sin(x).astype(np.float64, copy=False) * 2.0)
    x = np.array([0.1, 0.2])
    np.testing.assert_allclose(tg.compile(f)(x), f(x), rtol=1e-12)


def _aliased_update(alias):
    src = f"def f(x):\n    a = np.sin(x)\n    {alias}\n    b *= 2.0\n    b += 1.0\n    return np.sum(a * a)\n"
    ns = {"np": np}
    exec(src, ns)
    return ns["f"]


@pytest.mark.parametrize("alias", ["b = a", "b = a.astype(np.float64, copy=False)",
                                   "b = a.T"])   # .T of a 1-d array is the array itself
def test_augmented_assignment_through_an_alias_updates_the_aliased_value(alias):
    """``b += 1.0`` where ``b`` is ``a`` itself changes ``a``, in NumPy, in
    eager mode and in compiled code."""
    f = _aliased_update(alias)
    x = np.array([0.5, -1.0])
    t = tg.tensor(x, requires_grad=True)
    y = f(t)
    y.backward()
    np.testing.assert_allclose(y.detach().numpy(), f(x), rtol=1e-12)      # eager is right
    np.testing.assert_allclose(tg.compile(f)(x), f(x), rtol=1e-12)
    np.testing.assert_allclose(tg.grad(f)(x), t.grad.numpy(), rtol=1e-12)


@pytest.mark.parametrize("alias", ["b = a[:]", "b = a[None].T", "b = a.reshape(2, 1)",
                                   "b = a[::-1][1:]", "b = a[:1]; a += 1.0; b = a"])
def test_augmented_assignment_through_a_view_writes_into_its_base(alias):
    """Through a view NumPy writes into the base: compiled code rewrites the
    base (and every other view of it reads the new value), as eager mode does."""
    f = _aliased_update(alias)
    x = np.array([0.5, -1.0])
    np.testing.assert_allclose(tg.compile(f)(x), f(x.copy()), rtol=1e-12)
    np.testing.assert_allclose(tg.value_and_grad(f)(x)[1],
                               tg.value_and_grad(f, compile=False)(x)[1], rtol=1e-12)


def test_augmented_assignment_through_a_view_it_cannot_follow_is_a_clear_error():
    """einsum('i->i', a) may be a itself or a copy: compiled code refuses
    rather than compute something else."""
    f = _aliased_update("b = np.einsum('i->i', a)")
    with pytest.raises(tg.TraceError, match="shares memory with another"):
        tg.compile(f)(np.array([0.5, -1.0]))


def test_writing_into_an_argument_is_a_clear_error_naming_the_copy():
    def f(x):
        v = x[1:]
        v *= 2.0
        return np.sum(x)
    with pytest.raises(tg.TraceError, match=r"caller's array.*x.copy\(\)"):
        tg.compile(f)(np.array([0.5, -1.0]))


@pytest.mark.parametrize("copy", ["np.tile(a, 1)", "np.tile(a, (1,))"])
def test_an_update_of_a_tile_by_ones_leaves_its_operand_alone(copy):
    """np.tile(a, 1) returned a itself, so b += 1 on it changed a, in compiled
    code and with compile=False; NumPy's tile makes a copy."""
    ns = {"np": np}
    exec(f"def f(x):\n    a = np.sin(x)\n    b = {copy}\n    b += 1.0\n    return np.sum(a)\n", ns)
    f, x = ns["f"], np.array([0.1, 0.2])
    np.testing.assert_allclose(tg.compile(f)(x), f(x), rtol=1e-12)
    np.testing.assert_allclose(tg.value_and_grad(f, compile=False)(x)[0], f(x), rtol=1e-12)


def test_in_place_update_of_one_result_leaves_an_equal_one_alone():
    def f(x):
        a = np.sin(x)
        b = np.sin(x)      # the same node in the trace, another array in NumPy
        b += 1.0
        return np.sum(a * b)
    x = np.array([0.5, -1.0])
    np.testing.assert_allclose(tg.compile(f)(x), f(x), rtol=1e-12)


def test_in_place_casting_and_shape_follow_numpy():
    def widen(x):
        a = np.sin(x)
        a += np.ones((2, 2))
        return np.sum(a)
    with pytest.raises(ValueError, match="non-broadcastable output operand"):
        tg.compile(widen)(np.array([0.5, -1.0]))

    def f32(x):
        a = np.sin(x)
        a *= 2.0          # a Python float keeps float32
        return a
    assert tg.compile(f32)(np.ones(2, np.float32)).dtype == np.float32


def _interpreter_and_replay(f, xs):
    """The gradients of the first (interpreted) and the third (replayed) backward."""
    replay.clear()
    runs = []
    for _ in range(3):
        leaves = [tg.tensor(x, requires_grad=True) for x in xs]
        f(*leaves).backward()
        runs.append([t.grad.numpy().copy() for t in leaves])
    return runs[0], runs[2]


@pytest.mark.xfail(strict=True, reason="replay: the vjp of a - s (s broadcast) negates after "
                   "the sum where the interpreter sums the negation: -0.0 for +0.0")
def test_replay_keeps_signed_zeros_of_a_broadcast_subtraction():
    first, third = _interpreter_and_replay(
        lambda x, s: np.sum((x - s) * np.array([0.0, -0.0])),
        [np.array([1.0, 2.0]), np.array(0.5)])
    for a, b in zip(first, third):
        assert a.tobytes() == b.tobytes(), (a, b)


# Not strict: whether the two memory orders round differently depends on the
# CPU's SIMD width in NumPy's pairwise sum (it differs on some of our machines
# and not on others, with the same NumPy).
@pytest.mark.xfail(strict=False, reason="replay: out= into a Fortran-ordered buffer changes "
                   "the memory order a later sum reduces in: last-bit differences on some CPUs")
def test_replay_sums_in_the_interpreters_order_after_a_transpose():
    x0 = np.array([[0.094, -1.492, 0.947], [-0.336, -1.079, 1.039], [1.079, 0.361, 1.286]])
    w = np.linspace(-1.75, -0.25, 9).reshape(3, 3)
    first, third = _interpreter_and_replay(
        lambda a, b: np.sum(np.logaddexp(a.T, b) * w), [x0, np.array([1.44])])
    for a, b in zip(first, third):
        assert a.tobytes() == b.tobytes(), (a, b)
