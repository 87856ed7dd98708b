"""Backward replay (tracegrad/autograd/replay.py): a tape structure seen
before runs its backward as generated code.  It must give the interpreter's
gradients to the last bit, for every row of the registry, and step aside
(so the interpreter's behaviour and errors hold) wherever it cannot."""
from __future__ import annotations

import gc
import warnings

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.autograd import replay

from test_ops_registry import DIFF_CASES, _bind, _draw, _float_outs, _impl, _rng, Rand


@pytest.fixture(autouse=True)
def fresh_replay(monkeypatch):
    replay.clear()
    prev = replay.set_backward_replay(True)
    # compile at a structure's second sighting (the default waits for the
    # third), so the tests below need one step less
    monkeypatch.setattr(replay, "COMPILE_AFTER", 2)
    yield
    replay.set_backward_replay(prev)
    replay.clear()


def _stats():
    return dict(replay.stats)


def _delta(before):
    return {k: replay.stats[k] - before[k] for k in before}


def _grads_of_case(case):
    """Leaf gradients of sum(out * ct) over the case's float outputs."""
    vals = _draw(case)
    ops, out = _bind(case, vals)
    outs = out if isinstance(out, tuple) else (out,)
    ref = _impl(case, vals)
    rng = _rng(case, "ct")
    loss = None
    for i in _float_outs(ref):
        term = (outs[i] * tg.tensor(rng.standard_normal(ref[i].shape))).sum()
        loss = term if loss is None else loss + term
    if loss is None or not loss.requires_grad:
        return None
    loss.backward()
    return [None if o.grad is None else o.grad.numpy().copy()
            for o, spec in zip(ops, case.operands) if isinstance(spec, Rand)]


def _grad_of_case(case):
    """autograd.grad of the case's first float output with a given cotangent."""
    vals = _draw(case)
    ops, out = _bind(case, vals)
    outs = out if isinstance(out, tuple) else (out,)
    ref = _impl(case, vals)
    fl = _float_outs(ref)
    if not fl or not outs[fl[0]].requires_grad:
        return None
    inputs = [o for o, spec in zip(ops, case.operands) if isinstance(spec, Rand)]
    ct = tg.tensor(_rng(case, "ct").standard_normal(ref[fl[0]].shape))
    return [None if g is None else g.numpy().copy()
            for g in tg.autograd.grad(outs[fl[0]], inputs, grad_outputs=ct, allow_unused=True)]


def _interpreter_then_replays(grads_of, case):
    """grads_of(case) with the replay off, then three times with it on (the
    first interpreted, the second compiled and replayed, the third replayed):
    the same arrays to the last bit, dtypes and shapes included."""
    replay.set_backward_replay(False)
    with np.errstate(all="ignore"):
        want = grads_of(case)
    if want is None:
        return
    replay.set_backward_replay(True)
    before = _stats()
    with np.errstate(all="ignore"):
        runs = [grads_of(case) for _ in range(3)]
    d = _delta(before)
    assert d["compiles"] == 1 and d["replays"] == 2, d
    for got in runs:
        for w, g in zip(want, got):
            assert (w is None) == (g is None)
            if w is not None:
                assert g.dtype == w.dtype and g.shape == w.shape
                # to the bit: signed zeros and NaNs included
                assert np.ascontiguousarray(g).tobytes() == np.ascontiguousarray(w).tobytes()


@pytest.mark.parametrize("case", DIFF_CASES, ids=repr)
def test_autograd_grad_replay_equals_interpreter_for_every_row(case):
    _interpreter_then_replays(_grad_of_case, case)


@pytest.mark.parametrize("case", DIFF_CASES, ids=repr)
def test_replay_equals_interpreter_for_every_row(case):
    _interpreter_then_replays(_grads_of_case, case)


def _rosenbrock_grad(x):
    f = (100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2).sum()
    x.grad = None
    f.backward()
    return f, x.grad.numpy().copy()


def test_training_loop_replays_and_matches_interpreter():
    x0 = np.random.default_rng(0).uniform(-1.5, 1.5, 16)

    def run(enabled, steps=6):
        replay.set_backward_replay(enabled)
        x = tg.tensor(x0.copy(), requires_grad=True)
        out = []
        for _ in range(steps):
            f, g = _rosenbrock_grad(x)
            out.append(g)
            with tg.no_grad():
                x -= 1e-4 * x.grad
        return out, x.detach().numpy()

    want, xw = run(False)
    before = _stats()
    got, xg = run(True)
    assert _delta(before) == {"replays": 5, "compiles": 1, "declined": 0, "uncompilable": 0}
    for w, g in zip(want, got):
        np.testing.assert_array_equal(g, w)
    np.testing.assert_array_equal(xg, xw)


def test_mlp_step_with_broadcast_bias_matches():
    rng = np.random.default_rng(1)
    X, Y = rng.standard_normal((8, 5)), rng.standard_normal((8, 3))
    init = [rng.standard_normal((5, 6)) * 0.3, np.zeros(6), rng.standard_normal((6, 3)) * 0.3,
            np.zeros(3)]

    def run(enabled):
        replay.set_backward_replay(enabled)
        ps = [tg.tensor(p.copy(), requires_grad=True) for p in init]
        for _ in range(4):
            h = tg.tanh(tg.tensor(X) @ ps[0] + ps[1])
            loss = ((h @ ps[2] + ps[3] - tg.tensor(Y)) ** 2).mean()
            loss.backward()   # gradients accumulate over the steps: in place after the first
        return [p.grad.numpy().copy() for p in ps]

    want = run(False)
    before = _stats()
    got = run(True)
    # the leaves' nodes are made during the first step, so its tape is ordered
    # differently: steps 2 and 3 share a structure, 3 and 4 replay it
    assert _delta(before)["replays"] == 2
    for w, g in zip(want, got):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("setting", [None, "native"])
def test_the_replay_stays_on_the_numpy_target_whatever_the_default(monkeypatch, setting):
    # compiled functions default to native code, but the replay starts by
    # itself at a tape's third backward: native code there would change the
    # gradients by a few ulp from one backward of the same tape to the next
    # (gradcheck's reentrancy check, tolerance 0, would fail)
    from tracegrad.autograd import gradcheck
    if setting is None:
        monkeypatch.delenv("TRACEGRAD_BACKEND", raising=False)
    else:
        monkeypatch.setenv("TRACEGRAD_BACKEND", setting)
    rng = np.random.default_rng(1)
    X, Y = rng.standard_normal((8, 5)), rng.standard_normal((8, 3))
    init = [rng.standard_normal((5, 6)) * 0.3, np.zeros(6)]

    def run(enabled):
        replay.set_backward_replay(enabled)
        ps = [tg.tensor(p.copy(), requires_grad=True) for p in init]
        grads = []
        for _ in range(4):
            for p in ps:
                p.grad = None
            h = tg.tanh(tg.tensor(X) @ ps[0] + ps[1])
            (h[:, :3] - tg.tensor(Y)).pow(2).mean().backward()
            grads.append([p.grad.numpy().copy() for p in ps])
        return grads

    want = run(False)
    replay.clear()
    got = run(True)
    assert ["TARGET = \"native\"" in p.source
            for p in replay._plans.values() if p is not replay._NO_PLAN] == [False]
    for w, g in zip(want, got):
        for a, b in zip(w, g):
            np.testing.assert_array_equal(b, a)
    w = tg.tensor(rng.standard_normal((5, 3)), requires_grad=True)
    x = tg.tensor(rng.standard_normal(5), requires_grad=True)
    assert gradcheck(lambda a, b: tg.tanh(a @ b) / (1.0 + b.sum()), (x, w))


def test_second_backward_through_a_replayed_tape_raises_freed():
    x = tg.tensor(np.arange(4.0), requires_grad=True)
    for _ in range(2):
        y = (x * x).sum()
        y.backward()
    assert replay.stats["replays"] == 1
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        y.backward()


def test_retain_graph_keeps_a_replayed_tape():
    x = tg.tensor(np.arange(4.0), requires_grad=True)
    y = (x * x).sum()
    for _ in range(3):
        y.backward(retain_graph=True)
    assert replay.stats["replays"] == 2
    np.testing.assert_array_equal(x.grad.numpy(), 3 * 2 * np.arange(4.0))


def test_in_place_change_of_a_saved_tensor_still_raises_the_interpreter_error():
    x = tg.tensor(np.arange(1.0, 5.0), requires_grad=True)
    for _ in range(2):
        (x.exp() * 2).sum().backward()
    y = x * 1.0
    z = y.exp()
    loss = (z * 2).sum()
    with tg.no_grad():
        z.mul_(2)
    before = _stats()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()
    assert _delta(before)["replays"] == 0


@pytest.mark.filterwarnings("ignore:Anomaly Detection has been enabled")
@pytest.mark.parametrize("setup", ["tensor_hook", "leaf_hook", "retain_grad", "node_hook",
                                   "post_accumulate", "anomaly", "saved_hooks", "profiler"])
def test_features_that_need_the_interpreter_decline(setup):
    x = tg.tensor(np.arange(1.0, 4.0), requires_grad=True)
    calls = []

    def step():
        y = x * 3.0
        if setup == "tensor_hook":
            y.register_hook(lambda g: calls.append(1) or g * 2)
        elif setup == "leaf_hook" and not calls:
            x.register_hook(lambda g: calls.append(1))
        elif setup == "retain_grad":
            y.retain_grad()
        elif setup == "node_hook":
            y.grad_fn.register_hook(lambda gi, go: calls.append(1))
        elif setup == "post_accumulate" and not calls:
            x.register_post_accumulate_grad_hook(lambda t: calls.append(1))
        loss = y.sum()
        x.grad = None
        loss.backward()
        return y

    for _ in range(3):
        if setup == "anomaly":
            with tg.autograd.detect_anomaly():
                step()
        elif setup == "saved_hooks":
            with tg.autograd.graph.saved_tensors_hooks(lambda t: calls.append(1) or t,
                                                       lambda t: t):
                step()
        elif setup == "profiler":
            with tg.autograd.profiler.profile() as prof:
                step()
            assert any("MulBackward0" in e.name for e in prof.function_events)
        else:
            y = step()
    assert replay.stats["replays"] == 0
    if setup == "tensor_hook":
        np.testing.assert_array_equal(x.grad.numpy(), [6.0, 6.0, 6.0])
    elif setup == "retain_grad":
        np.testing.assert_array_equal(y.grad.numpy(), [1.0, 1.0, 1.0])
    if setup not in ("retain_grad", "anomaly", "profiler"):
        assert calls


def test_a_leaf_that_is_gone_gets_nothing_and_others_still_do():
    keep = tg.tensor(np.ones(3), requires_grad=True)
    for _ in range(4):
        gone = tg.tensor(np.ones(3), requires_grad=True)
        loss = (gone * keep).sum()
        keep.grad = None
        del gone
        gc.collect()
        loss.backward()
    assert replay.stats["replays"] == 2
    np.testing.assert_array_equal(keep.grad.numpy(), np.ones(3))


def test_structure_key_tells_shapes_constants_and_wiring_apart():
    x = tg.tensor(np.arange(1.0, 5.0), requires_grad=True)
    w = tg.tensor(np.arange(1.0, 4.0), requires_grad=True)
    funcs = [lambda: (x * 2).sum(), lambda: (x * 3).sum(), lambda: (x * 2.0).sum(),
             lambda: (x ** 2).sum(), lambda: (x * x).sum(), lambda: (x[:3] * w).sum(),
             lambda: (x[1:] * w).sum(), lambda: (w * 2).sum()]
    for _ in range(3):
        for f in funcs:
            replay.set_backward_replay(False)
            x.grad = w.grad = None
            f().backward()
            want = [None if t.grad is None else t.grad.numpy().copy() for t in (x, w)]
            replay.set_backward_replay(True)
            x.grad = w.grad = None
            f().backward()
            got = [None if t.grad is None else t.grad.numpy().copy() for t in (x, w)]
            for a, b in zip(want, got):
                assert (a is None) == (b is None)
                if a is not None:
                    np.testing.assert_array_equal(b, a)
    assert replay.stats["compiles"] == len(funcs)


def test_float32_stays_float32():
    x = tg.tensor(np.arange(1.0, 5.0, dtype=np.float32), requires_grad=True)
    for _ in range(3):
        x.grad = None
        (x.sin() * 2.5).sum().backward()
    assert replay.stats["replays"] == 2
    assert x.grad.dtype == np.float32
    np.testing.assert_allclose(x.grad.numpy(), 2.5 * np.cos(np.arange(1.0, 5.0)), rtol=1e-6)


def test_the_generated_code_is_readable_and_names_tape_nodes():
    x = tg.tensor(np.arange(1.0, 5.0), requires_grad=True)
    for _ in range(2):
        (x.exp() * 2).sum().backward()
    (plan,) = replay._plans.values()
    assert "def backward(n1_in0, n2_out)" in plan.source
    assert "# <tape node>:2 (ExpBackward0)" in plan.source
    assert "np.exp" not in plan.source.split("def backward")[1]  # exp's vjp reads its saved output


def test_switching_off_by_call_and_environment(monkeypatch):
    x = tg.tensor(np.arange(3.0), requires_grad=True)
    assert replay.set_backward_replay(False) is True
    for _ in range(3):
        (x * x).sum().backward()
    assert replay.stats["replays"] == 0
    assert not replay.is_backward_replay_enabled()
    import importlib
    import subprocess
    import sys
    code = ("import tracegrad.autograd.replay as r; print(r.is_backward_replay_enabled())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**__import__("os").environ, "TRACEGRAD_BACKWARD_REPLAY": "0"})
    assert out.stdout.strip() == "False", out.stderr
    del importlib


def test_a_failing_replay_warns_and_the_interpreter_answers(monkeypatch):
    x = tg.tensor(np.arange(3.0), requires_grad=True)
    for _ in range(2):
        x.grad = None
        (x * x).sum().backward()
    (plan,) = replay._plans.values()

    def broken(*arrays):
        raise ValueError("simulated")
    monkeypatch.setattr(plan, "fn", broken)
    x.grad = None
    with pytest.warns(RuntimeWarning, match="replay failed"):
        (x * x).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), 2 * np.arange(3.0))
    x.grad = None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (x * x).sum().backward()  # interpreted from now on, quietly
    np.testing.assert_array_equal(x.grad.numpy(), 2 * np.arange(3.0))


def test_remembered_structures_are_bounded(monkeypatch):
    monkeypatch.setattr(replay, "MAX_PLANS", 4)
    monkeypatch.setattr(replay, "MAX_SEEN", 8)
    x = tg.tensor(np.arange(3.0), requires_grad=True)
    for k in range(20):
        for _ in range(2):
            (x * float(k)).sum().backward()
    assert len(replay._plans) <= 4 and len(replay._seen) <= 8
    import linecache
    held = [k for k in linecache.cache if str(k).startswith("<tracegrad backward replay")]
    assert len(held) <= 4  # an evicted plan's source leaves linecache too


def test_by_default_a_structure_compiles_at_its_third_sighting(monkeypatch):
    monkeypatch.undo()  # the default COMPILE_AFTER
    assert replay.COMPILE_AFTER == 3
    x = tg.tensor(np.arange(3.0), requires_grad=True)
    seen = []
    for _ in range(4):
        (x * x).sum().backward()
        seen.append(dict(replay.stats))
    assert [s["compiles"] for s in seen] == [0, 0, 1, 1]
    assert [s["replays"] for s in seen] == [0, 0, 1, 2]
    np.testing.assert_array_equal(x.grad.numpy(), 4 * 2 * np.arange(3.0))


def test_an_error_in_the_computation_is_the_interpreters_and_keeps_the_plan():
    # solve's vjp solves with A^T: a matrix that turns singular in place makes
    # both the replay and the interpreter fail; the user sees NumPy's error
    A = tg.tensor(np.eye(3) * 2.0)
    x = tg.tensor(np.ones(3), requires_grad=True)
    for _ in range(2):
        tg.linalg.solve(A, x).sum().backward()
    y = tg.linalg.solve(A, x).sum()
    A._data[:] = 0.0  # behind autograd's back: A is no saved leaf that requires grad
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(np.linalg.LinAlgError):
            y.backward()
    assert any(type(p) is replay._Plan for p in replay._plans.values())


def _grad_run(enabled, f, inputs, **kw):
    replay.set_backward_replay(enabled)
    return [None if g is None else g.numpy().copy()
            for g in tg.autograd.grad(f(), inputs, **kw)]


def test_autograd_grad_replays_with_implicit_and_given_cotangents():
    x = tg.tensor(np.linspace(-1, 1, 5), requires_grad=True)
    w = tg.tensor(np.linspace(0.5, 2, 5), requires_grad=True)
    ct = tg.tensor(np.arange(5.0))
    cases = [(lambda: (x.sin() * w).sum(), {}),
             (lambda: x.sin() * w, {"grad_outputs": ct}),
             (lambda: (x * x * w).sum(), {})]
    for f, kw in cases:
        for inputs in ([x, w], [w], [x, x]):
            want = _grad_run(False, f, inputs, **kw)
            before = _stats()
            got = [_grad_run(True, f, inputs, **kw) for _ in range(3)]
            assert _delta(before)["replays"] == 2
            for g in got:
                for a, b in zip(want, g):
                    np.testing.assert_array_equal(b, a)
    # a given cotangent is an argument of the code, not a constant of it
    v = _grad_run(True, lambda: x.sin() * w, [x], grad_outputs=tg.tensor(np.ones(5) * 3.0))
    np.testing.assert_array_equal(v[0], 3.0 * np.cos(x.detach().numpy()) * w.detach().numpy())


def test_autograd_grad_replay_keeps_interpreter_semantics():
    x = tg.tensor(np.linspace(-1, 1, 4), requires_grad=True)
    u = tg.tensor(np.ones(4), requires_grad=True)  # not used by the loss
    for _ in range(3):
        gx, gu = tg.autograd.grad((x.exp() * 2).sum(), [x, u], allow_unused=True)
        assert gu is None
        np.testing.assert_array_equal(gx.detach().numpy(), 2 * np.exp(x.detach().numpy()))
        gx.mul_(0)  # the caller owns the gradient: changing it touches nothing of ours
    for _ in range(3):
        with pytest.raises(RuntimeError, match="appears to not have been used"):
            tg.autograd.grad((x.exp() * 2).sum(), [x, u])
    assert x.grad is None and u.grad is None  # grad() never accumulates
    # only the nodes on a path to an input run and are freed, as in the interpreter
    for _ in range(3):
        a = x * 2.0
        b = u * 3.0
        loss = (a + b).sum()
        tg.autograd.grad(loss, [x])
        b.sum().backward()  # b's node did not run: its branch still works
    assert replay.stats["replays"] >= 1
    np.testing.assert_array_equal(u.grad.numpy(), 3 * 3.0 * np.ones(4))


def test_autograd_grad_of_a_non_leaf_input_uses_the_interpreter():
    x = tg.tensor(np.linspace(-1, 1, 4), requires_grad=True)
    for _ in range(3):
        y = x * 2.0
        (gy,) = tg.autograd.grad((y.sin()).sum(), [y])
        np.testing.assert_allclose(gy.numpy(), np.cos(2.0 * x.detach().numpy()))
    assert replay.stats["replays"] == 0


def test_backward_with_a_gradient_argument_replays():
    x = tg.tensor(np.linspace(-1, 1, 6).reshape(2, 3), requires_grad=True)
    ct = np.arange(6.0).reshape(2, 3)

    def run(enabled):
        replay.set_backward_replay(enabled)
        out = []
        for _ in range(3):
            x.grad = None
            (x.tanh() * 2).backward(tg.tensor(ct))
            out.append(x.grad.numpy().copy())
        return out

    want = run(False)
    before = _stats()
    got = run(True)
    assert _delta(before) == {"replays": 2, "compiles": 1, "declined": 0, "uncompilable": 0}
    for a, b in zip(want, got):
        np.testing.assert_array_equal(b, a)


# --- random programs: fan-out, broadcasting, reductions, views, linear algebra ------------

_UNARY = [lambda a: a.tanh(), lambda a: a.sin(), lambda a: a.exp() * 0.1, lambda a: a * a,
          lambda a: -a, lambda a: a.abs() + 1.0, lambda a: (a * a + 1.0).log(),
          lambda a: a.sigmoid(), lambda a: a ** 3, lambda a: 2.0 - a]
_BINARY = [lambda a, b: a + b, lambda a, b: a * b, lambda a, b: a - b,
           lambda a, b: a / (b * b + 1.0), lambda a, b: tg.maximum(a, b),
           lambda a, b: tg.where(a > b, a, b * 2.0)]


def _random_program(seed):
    """A function of three leaves (4x3, 3, 4x3) built from random ops; each
    value may be used several times (fan-out)."""
    rng = np.random.default_rng(seed)
    plan = []
    n_vals = 3
    for _ in range(int(rng.integers(8, 20))):
        kind = rng.choice(["unary", "binary", "reduce", "view", "matmul"],
                          p=[0.35, 0.35, 0.1, 0.1, 0.1])
        plan.append((kind, int(rng.integers(0, 10 ** 6)), rng.integers(0, n_vals, 2).tolist()))
        n_vals += 1

    def f(x, v, w):
        vals = [x, v, w]
        for kind, r, (i, j) in plan:
            a, b = vals[i], vals[j]
            if kind == "unary":
                out = _UNARY[r % len(_UNARY)](a)
            elif kind == "binary":
                out = _BINARY[r % len(_BINARY)](a, b) if a.shape[-1:] == b.shape[-1:] \
                    else _UNARY[r % len(_UNARY)](a)
            elif kind == "reduce":
                out = a.sum(axis=0, keepdims=True) * 0.5 if a.ndim == 2 else a.mean() + a
            elif kind == "view":
                out = a[::-1] if a.ndim == 1 else a.T.reshape(a.shape)[1:].sum(0) + a[0]
            else:
                out = a @ b.T if a.ndim == 2 and b.ndim == 2 and a.shape[1] == b.shape[1] \
                    else a * b.sum()
            vals.append(out)
        return sum((o * o).sum() * 0.01 for o in vals[3:])
    return f


@pytest.mark.parametrize("seed", range(40))
def test_random_programs_replay_bit_equal(seed):
    f = _random_program(seed)
    rng = np.random.default_rng(1000 + seed)
    data = [rng.uniform(-1, 1, s) for s in ((4, 3), (3,), (4, 3))]

    def run(enabled, steps):
        replay.set_backward_replay(enabled)
        leaves = [tg.tensor(d, requires_grad=True) for d in data]
        out = []
        for _ in range(steps):
            for t in leaves:
                t.grad = None
            f(*leaves).backward()
            out.append([None if t.grad is None else t.grad.numpy().copy() for t in leaves])
        return out

    with np.errstate(all="ignore"):
        want = run(False, 1)[0]
        before = _stats()
        got = run(True, 4)
    # step 1 makes the leaves' nodes, which may order its tape differently
    assert _delta(before)["replays"] >= 2
    for g in got:
        for a, b in zip(want, g):
            assert (a is None) == (b is None)
            if a is not None:
                assert b.tobytes() == a.tobytes()  # to the bit, signed zeros included


def test_threads_replay_their_own_tapes():
    import threading
    x0 = np.random.default_rng(3).uniform(-1.5, 1.5, 16)
    replay.set_backward_replay(False)
    xr = tg.tensor(x0.copy(), requires_grad=True)
    want = _rosenbrock_grad(xr)[1]
    replay.set_backward_replay(True)
    errors, results = [], []

    def worker():
        try:
            x = tg.tensor(x0.copy(), requires_grad=True)
            for _ in range(50):
                results.append(_rosenbrock_grad(x)[1])
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(results) == 200 and replay.stats["replays"] > 0
    for r in results:
        np.testing.assert_array_equal(r, want)


def test_explain_says_what_was_compiled_and_what_could_not_be(monkeypatch, capsys):
    monkeypatch.setenv("TRACEGRAD_EXPLAIN", "1")
    x = tg.tensor(np.arange(3.0), requires_grad=True)
    for _ in range(2):
        (x * x).sum().backward()
    assert "backward replay: compiled the backward of a tape of 3 nodes" in capsys.readouterr().err

    def no_symbolic_rule(*a, **k):
        raise NotImplementedError("simulated rule without a symbolic form")
    import sys
    monkeypatch.setattr(sys.modules["tracegrad.ops.base"], "vjp_apply", no_symbolic_rule)
    y = tg.tensor(np.arange(3.0), requires_grad=True)
    for _ in range(2):
        y.grad = None
        (y.exp() * 2).sum().backward()
    np.testing.assert_allclose(y.grad.numpy(), 2 * np.exp(np.arange(3.0)))
    assert replay.stats["uncompilable"] == 1
    assert "simulated rule" in replay.last_error
    assert "stays interpreted: NotImplementedError: simulated rule" in capsys.readouterr().err


def test_numpy_scalar_operands_replay_and_signed_zero_constants_do_not_share_a_plan():
    from tracegrad.eager.tensor import NumpyTensor
    replay.clear()
    for _ in range(3):
        x = NumpyTensor(np.array([0.5, -1.0]), requires_grad=True)
        np.sum(x * np.float64(2.0)).backward()
    assert replay.stats["replays"] >= 1 and replay.stats["declined"] == 0
    grads = []
    for c in (0.0, 0.0, 0.0, -0.0):
        x = tg.tensor(np.array([0.5, -1.0]), requires_grad=True)
        (x * c).sum().backward()
        grads.append(x.grad.numpy().copy())
    assert np.signbit(grads[-1]).all() and not np.signbit(grads[0]).any()
