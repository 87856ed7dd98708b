"""Random programs with control flow on traced values (issue 25): if/elif/
else on traced reductions and elements, early returns, while loops with
value-dependent trip counts, for loops with break/continue, conditional
expressions, and/or/not, chained comparisons, builtin min/max, item writes
into arrays made inside branches and loops (tests/_random_branchy_programs.py).

Each program runs on several inputs that take different paths through ONE
compiled function (it must choose at run time, not be traced again): the
compiled value equals NumPy's, the compiled gradient the compile=False one
and central finite differences; a third of them also tg.jacfwd and
tg.hessian.  A fallback (the function runs eagerly for the signature) is
not wrong, but must give the same numbers, and fallback=False must raise a
TraceError naming the line.

Here: a fixed sample of seeds.  At scale:
``python benchmarks/random_programs.py --branchy 2000 [--backend native]``.
Below: reproducers of what these programs found.
"""
from __future__ import annotations

import logging
import os

import numpy as np
import pytest

import tracegrad as tg

import _random_branchy_programs as rbp

SEEDS = range(30)
NATIVE_SEEDS = (0, 5)    # programs that compile (no fallback): the C target runs


@pytest.fixture(scope="module", autouse=True)
def private_cache(tmp_path_factory):
    old = os.environ.get("TRACEGRAD_CACHE_DIR")
    os.environ["TRACEGRAD_CACHE_DIR"] = str(tmp_path_factory.mktemp("branchy-programs") / "cache")
    tg.clear_cache()
    yield
    rbp.cleanup()
    tg.clear_cache(disk=False)
    if old is None:
        del os.environ["TRACEGRAD_CACHE_DIR"]
    else:
        os.environ["TRACEGRAD_CACHE_DIR"] = old


def _program(seed):
    return rbp.generate(rbp.RngChooser([2025, seed]), seed=seed)


@pytest.mark.parametrize("seed", SEEDS)
def test_seeded_branchy_program(seed):
    prog = _program(seed)
    out = rbp.check_program(prog, backends=("numpy",), higher=seed % 3 == 0)
    assert out.checked[:2] == ["eager", "numpy"]
    assert out.inputs >= 2


@pytest.mark.parametrize("seed", NATIVE_SEEDS)
def test_seeded_branchy_program_native(seed):
    out = rbp.check_program(_program(seed), backends=("native",))
    assert not out.fallbacks


def test_the_sample_takes_different_paths_and_covers_the_statements():
    progs = [_program(s) for s in SEEDS]
    tags = set()
    for p in progs:
        tags.update(p.tags)
    wanted = {"if_2_branches_else", "if_3_branches_else", "while_counter", "break_in_for",
              "continue_in_for", "ifexp", "builtin_max", "builtin_min", "chained_cmp", "and",
              "or", "not", "write_item_in_branch", "write_loop_index", "zeros_in_branch",
              "for_with_if", "bound_on_every_path"}
    assert wanted <= tags, wanted - tags
    assert any(t.startswith("while_tol_") for t in tags)
    # most programs are checked on inputs that take different paths
    assert sum(p.paths >= 2 for p in progs) >= len(progs) // 2


def test_the_instrumented_copy_records_each_decision():
    prog = rbp.Program(["s = np.sum(x)", "if s > 0.5:\n    s = s * 2.0",
                        "t = max(x[0], x[1])"], "s + t", [], 2, seed="recorder")
    v, rec = rbp.run_recorded(prog, np.array([0.4, 0.3]))
    assert v == pytest.approx(0.7 * 2 + 0.4)
    assert rec.ok and rec.path == [(True,), True, True]   # s > 0.5; the if; max took x[0]
    # 0.51 is within MARGIN of the threshold: finite differences would cross it
    assert not rbp.run_recorded(prog, np.array([0.26, 0.25]))[1].ok


def test_a_failure_prints_a_runnable_reproducer(tmp_path):
    prog = _program(3)
    path = tmp_path / "repro.py"
    path.write_text(prog.reproducer().replace("print(", "_ = ("))
    ns = {"__name__": "repro"}
    exec(compile(path.read_text(), str(path), "exec"), ns)
    x = prog.inputs[0]
    np.testing.assert_allclose(ns["f"](x.copy()), prog.function()(x.copy()))


def test_a_fallback_by_design_is_counted_and_checked():
    """A branch that appends to a list is not converted: the function runs
    eagerly (same numbers), once logged; fallback=False raises."""
    prog = rbp.Program(["hist = []", "s = np.sum(np.sin(x))", "if s > 0.2:\n    hist.append(s)"],
                       "s * 2.0 + 0.125 * len(hist)", ["fb_append"], 3,
                       inputs=[np.array([0.3, 0.4, 0.1]), np.array([-0.3, 0.1, -0.2])],
                       expect_fallback=["fb_append"], seed="fallback")
    out = rbp.check_program(prog)
    assert "append" in out.fallbacks["numpy"]


# --- reproducers of what the random programs found --------------------------------------

def _fd(f, x, eps=1e-6):
    g = np.zeros_like(x)
    for i in range(x.size):
        e = np.zeros_like(x)
        e[i] = eps
        g[i] = (f(x + e) - f(x - e)) / (2 * eps)
    return g


def scalar_alias_aug(x):
    s0 = np.sum(x)
    s1 = s0                    # np.float64: immutable in NumPy
    s1 -= 1.0                  # rebinds s1; s0 keeps its value
    return s0 + 10.0 * s1


def scalar_alias_aug_ifexp(x):
    s0 = np.sum(np.sin(x))
    s1 = s0 if s0 > 0 else x[0]
    s1 += 1.0
    return s0


@pytest.mark.parametrize("f, compile", [
    pytest.param(scalar_alias_aug, True, id="alias-compiled"),
    pytest.param(scalar_alias_aug, False, id="alias-eager"),
    # the conditional expression's cond node gives a new value: right compiled
    pytest.param(scalar_alias_aug_ifexp, True, id="ifexp-compiled"),
    pytest.param(scalar_alias_aug_ifexp, False, id="ifexp-eager")])
def test_augmented_assignment_of_a_numpy_scalar_alias(f, compile):
    x = np.array([0.5, 0.25])
    v, g = tg.value_and_grad(f, compile=compile)(x.copy())
    np.testing.assert_allclose(v, f(x.copy()), rtol=1e-12)
    np.testing.assert_allclose(g, _fd(f, x), rtol=1e-6)


def loop_temporary_after_break(x):
    acc = 0.0
    for i in range(3):
        if x[i] > 0.5:
            break
        t = np.sin(x[i])       # a temporary of the body, never read after the loop
        acc = acc + t
    return acc


def break_on_loop_invariant_condition(x):
    acc = 0.0
    for i in range(3):
        if x[2] < 0.35:
            break
        acc = acc - x[i]
    return acc


def for_with_break_inside_a_traced_if(x):
    acc = 0.0
    if x[0] > 0:
        for i in range(3):
            acc = acc - x[i]
            if x[2] < 0.35:
                break
    return acc


def temporary_in_a_branch_in_a_for_loop(x):
    acc = 0.0
    for i in range(4):
        if x[i] > 0:
            t = x[i] * 2.0     # bound on one path, read only inside the branch
            acc = acc + t
    return acc


def temporary_in_a_branch_in_a_while_loop(x):
    acc = 0.0
    k = 0
    while acc < 1.0 and k < 3:
        if x[k] > 0:
            t = x[k] * 2.0
            acc = acc + t
        k += 1
    return acc


def item_update_in_a_branch_in_a_while_loop(x):
    y = np.zeros(3)
    s = x[0]
    k = 0
    while k < 5 and np.abs(s) > 0.1:
        k += 1
        s = 0.5 * s
        if x[1] > 0:
            y[1] += s          # refused: 'shares memory with another' (it shares none)
    return s + np.sum(y * np.array([1.0, 2.0, 3.0]))


def break_over_the_rows_of_an_array(x):
    acc = 0.0
    for v in x:                # not over range(): the break's truth value is refused
        if v > 0.5:
            break
        acc = acc + v ** 2
    return acc


COMMON = [loop_temporary_after_break, break_on_loop_invariant_condition,
          for_with_break_inside_a_traced_if, temporary_in_a_branch_in_a_for_loop,
          temporary_in_a_branch_in_a_while_loop, item_update_in_a_branch_in_a_while_loop,
          break_over_the_rows_of_an_array]


@pytest.mark.parametrize("f", COMMON, ids=lambda f: f.__name__)
def test_common_loops_with_branches_compile(f):
    """Loop patterns the fuzz found falling back, each now compiled whole: a
    temporary bound in the body after a break; x[i] with the converted
    loop's index; a for-with-break inside a traced if; a temporary bound in
    a branch inside a loop; an item update of a carried array in a branch
    inside a while loop; a for loop over an array's rows with break."""
    x = np.array([0.13, 0.2, 0.7, 0.4])     # (0.1 is on a kink of one of them)
    v, g = tg.value_and_grad(f, fallback=False)(x.copy())
    np.testing.assert_allclose(v, f(x.copy()), rtol=1e-12)
    np.testing.assert_allclose(g, _fd(f, x), rtol=1e-6)


@pytest.mark.parametrize("f", COMMON, ids=lambda f: f.__name__)
def test_common_loops_with_branches_give_the_right_numbers(f, caplog):
    for x in (np.array([0.13, 0.2, 0.7, 0.4]), np.array([0.6, -0.2, 0.1, 0.3]),
              np.array([-0.3, 0.4, 0.2, -0.1])):
        with caplog.at_level(logging.WARNING, logger="tracegrad"):
            v, g = tg.value_and_grad(f)(x.copy())
        np.testing.assert_allclose(v, f(x.copy()), rtol=1e-12)
        np.testing.assert_allclose(g, _fd(f, x), rtol=1e-6, atol=1e-9)


def and_value_sqrt(x):
    s = x[0] > 0 and np.sqrt(x[0])      # NumPy never takes sqrt of a negative here
    return s * 2.0 + x[1]


def test_and_of_a_traced_value_keeps_the_unreached_operand_out_of_the_gradient():
    x = np.array([-0.3, 0.5])
    with np.errstate(invalid="ignore"):
        v, g = tg.value_and_grad(and_value_sqrt)(x.copy())
    assert v == and_value_sqrt(x.copy())
    np.testing.assert_array_equal(g, [0.0, 1.0])       # compile=False's gradient (NaN today)


def test_and_of_a_traced_value_compile_false_gradient():
    x = np.array([-0.3, 0.5])
    v, g = tg.value_and_grad(and_value_sqrt, compile=False)(x.copy())
    np.testing.assert_array_equal(g, [0.0, 1.0])


def and_guards_an_index(x):
    i = np.argmax(x)
    if i < 3 and x[i + 1] > 0:          # NumPy never reads x[4]
        return x[0]
    return x[1]


def and_guards_an_unbound_name(x):
    acc = 0.0
    for i in range(3):
        if x[i] < 0.5 and t > 0:  # noqa: F821 -- t is unbound in the first iteration
            break
        t = x[i]
        acc = acc + t
    return acc


@pytest.mark.parametrize("f, x", [(and_guards_an_index, [0.1, 0.2, 0.3, 0.9]),
                                  (and_guards_an_unbound_name, [0.7, 0.6, 0.2])],
                         ids=["index", "unbound-name"])
def test_a_short_circuit_guard_is_respected(f, x):
    x = np.array(x)
    v, g = tg.value_and_grad(f)(x.copy())
    assert v == f(x.copy())


W3 = np.array([1.0, 2.0, 3.0])


def two_names_written_in_one_branch(x):
    y = np.zeros(3)
    z = y                      # one array, two names
    if x[0] > 0:
        y[0] = x[2]
        z[1] = x[1]
    return np.sum(y * W3) + 10 * np.sum(z * W3)


def two_names_written_in_one_loop_body(x):
    y = np.zeros(3)
    z = y
    k = 0
    while x[0] > 0.1 * k and k < 2:
        z[1] += x[1]
        y[0] += x[2]
        k += 1
    return np.sum(y * W3) + 10 * np.sum(z * W3)


@pytest.mark.parametrize("f", [two_names_written_in_one_branch, two_names_written_in_one_loop_body],
                         ids=lambda f: f.__name__)
def test_writes_through_two_names_of_one_array_in_a_converted_statement(f):
    x = np.array([0.5, 0.3, 0.7])
    v, g = tg.value_and_grad(f)(x.copy())
    np.testing.assert_allclose(v, f(x.copy()), rtol=1e-12)      # 6.6 / 15.4 today
    np.testing.assert_allclose(g, _fd(f, x), rtol=1e-6)


@pytest.mark.parametrize("f", [two_names_written_in_one_branch, two_names_written_in_one_loop_body],
                         ids=lambda f: f.__name__)
def test_writes_through_two_names_compile_false(f):
    x = np.array([0.5, 0.3, 0.7])
    v, g = tg.value_and_grad(f, compile=False)(x.copy())
    np.testing.assert_allclose(v, f(x.copy()), rtol=1e-12)
    np.testing.assert_allclose(g, _fd(f, x), rtol=1e-6)


def read_through_an_alias_in_a_branch(x):
    y = np.zeros(2)
    z = y
    if x[0] > 0:
        y[0] += x[1]
        s = z[0]               # NumPy: the write through y is seen through z
    else:
        s = x[1]
    return s


def read_through_an_alias_in_a_loop_body(x):
    y = np.zeros(2)
    z = y
    s = 0.0
    k = 0
    while x[0] > 0.1 * k and k < 2:
        y[0] += x[1]
        s = s + z[0]
        k += 1
    return s


@pytest.mark.parametrize("f", [read_through_an_alias_in_a_branch,
                               read_through_an_alias_in_a_loop_body], ids=lambda f: f.__name__)
def test_a_read_through_an_alias_inside_a_converted_statement(f):
    x = np.array([0.5, 0.3, 0.7])
    v, g = tg.value_and_grad(f)(x.copy())
    np.testing.assert_allclose(v, f(x.copy()), rtol=1e-12)
    np.testing.assert_allclose(g, _fd(f, x), rtol=1e-6, atol=1e-9)


def zero_d_array_alias_aug(x):
    a = np.zeros(())          # a 0-d ndarray: mutable in NumPy
    b = a
    b += np.sum(x * x)        # writes into a too
    c = np.copy(np.sum(x))    # np.copy of a scalar is a 0-d array
    d = c
    d *= 3.0
    e = np.sum(np.sin(x))     # np.float64
    f = e
    f /= 2.0                  # rebinds f only
    return a + b + c + 10.0 * e + f


@pytest.mark.parametrize("compile", [True, False])
def test_augmented_assignment_of_a_zero_d_array_writes_through(compile):
    x = np.array([0.5, 0.25, -1.0])
    want = zero_d_array_alias_aug(x)
    got = tg.value_and_grad(zero_d_array_alias_aug, compile=compile)(x)
    np.testing.assert_allclose(got[0], want, rtol=1e-13)
    np.testing.assert_allclose(got[1], _fd(zero_d_array_alias_aug, x), rtol=1e-6, atol=1e-9)
