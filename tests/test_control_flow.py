"""Python control flow on traced values compiles (issue 25): ``if``/``elif``,
``while`` (with ``break``/``continue``), ``for`` with ``break``/``continue``,
early ``return``, conditional expressions, ``and``/``or``/``not``, chained
comparisons and the builtin ``min``/``max`` become ``cond`` and ``while``
nodes (tracegrad/frontend/branch_rewrite.py).  Each function is checked
against plain NumPy (value), finite differences and compile=False
(gradient), compiled for the NumPy, native and (emulated) CUDA targets, on
inputs that take different paths through the SAME compiled code.  What
cannot be converted runs eagerly for that signature, with one log line."""
import logging
import shutil

import numpy as np
import pytest

import tracegrad as tg
from tracegrad import testing
from tracegrad.runtime import toolchain

HAVE_CC = toolchain.recipe_or_none() is not None
BACKENDS = ["numpy", pytest.param("native", marks=pytest.mark.skipif(
    not HAVE_CC, reason="the native target needs a C compiler"))]


@pytest.fixture(autouse=True)
def _no_disk_cache(monkeypatch):
    monkeypatch.setenv("TRACEGRAD_CACHE", "0")


# --- the functions, as a user writes them -----------------------------------------------------

def elif_chain(x):
    s = x.sum()
    if s > 1:
        y = x * 2
    elif s > 0:
        y = x ** 2
    elif s > -1:
        y = np.sin(x)
    else:
        y = -x
    return np.sum(y * x)


def early_return(x):
    s = np.sum(x ** 2)
    if s > 2.0:
        return np.sqrt(s)
    if x[0] < 0:
        t = s * 3
        return t + x[1]
    return s


def normalise(x):
    if x.sum() > 0:
        x = x / x.max()
    return np.sum(np.sin(x) * np.arange(x.size))


def newton_sqrt(a):
    x = a
    step = np.ones_like(a)
    it = 0
    while np.max(np.abs(step)) > 1e-13 and it < 60:
        step = (x * x - a) / (2 * x)
        x = x - step
        it += 1
    return np.sum(x * np.arange(1, a.size + 1))


def halvings(x):
    y = x
    while np.sum(y ** 2) > 0.05:     # a value-dependent trip count
        y = y * 0.5
    return np.sum(np.sin(y))


def while_break_continue(x):
    acc = 0.0
    i = 0
    while True:
        i += 1
        if i > x.size:
            break
        if x[i - 1] < 0:
            continue
        acc = acc + x[i - 1] ** 2
        if acc > 2.0:
            break
    return acc + x.sum()


def for_break(x):
    y = x
    for k in range(30):
        y = y * 0.7 + 0.01 * np.sin(y)
        if np.sum(y ** 2) < 0.1:
            break
    return np.sum(y) * (k + 1)


def for_continue_writes(x):
    out = np.zeros(x.size)
    for i in range(x.size):
        if x[i] < -0.5:
            continue
        if x[i] > 0:
            out[i] = x[i] ** 2
        else:
            out[i] = -x[i]
    return np.sum(out * np.arange(1, x.size + 1))


def nested(x):
    # a while inside an if inside a rolled for loop (rolled: 40 iterations)
    out = np.zeros(x.size)
    acc = x * 0.1
    for j in range(40):
        v = acc[j % x.size] + 0.3
        if v > 0:
            while v > 0.2:
                v = v * 0.5
        acc = acc * 0.99 + 0.001 * v
    out = out + acc
    return np.sum(out ** 2)


def expressions(x):
    a = x[0] if x[1] > 0 else x[1] * 3
    b = max(x.sum(), 0.5) + min(x[0], x[1], x[2])
    c = x[2] if 0 < x[2] < 1 else 0.25 * x[2]
    ok = (x[0] > 0 and x[1] > 0) or not (x[2] > 1)
    d = x.sum() if ok else -x.sum()
    return a + b + c + d


def loop_with_branch(x):
    for i in range(500):       # rolled into one scan; the branch is a cond inside it
        if np.sum(x) > 1.0:
            x = x * 0.9
        else:
            x = x + 0.01 * np.sin(x)
    return np.sum(x ** 2)


def helper(v):
    if v > 0:
        return v
    return 0.1 * v


def calls_helper(x):          # the helper's own `if` is converted too
    return helper(x.sum()) + helper(x[0]) * 2


def search(x):                # a return inside a for loop, of a tuple
    y = x
    for i in range(50):
        y = y * 0.8 + 0.05
        if np.sum(y ** 2) < 0.5:
            return np.sum(y) * i, y[0]
    return np.sum(y), -y[0]


def search_total(x):
    a, b = search(x)
    return a + b


def fixed_cos(x):             # while True left by return only
    it = 0
    while True:
        x = np.cos(x)
        it += 1
        if np.max(np.abs(x - np.cos(x))) < 1e-8:
            return np.sum(x)
        if it > 200:
            return np.sum(x) * 0


FUNCTIONS = {
    "elif_chain": (elif_chain, [np.full(3, 0.5), np.full(3, 0.1), np.full(3, -0.1),
                                np.full(3, -0.5)]),
    "early_return": (early_return, [np.array([1.5, 1.0]), np.array([-0.5, 0.3]),
                                    np.array([0.5, 0.3])]),
    "normalise": (normalise, [np.array([0.3, 0.9, -0.2]), np.array([-0.3, 0.2, -0.4])]),
    "newton_sqrt": (newton_sqrt, [np.linspace(1, 4, 4), np.linspace(0.3, 9, 4)]),
    "halvings": (halvings, [np.array([0.1, 0.15]), np.array([3.0, -2.0]), np.array([40.0, 1.0])]),
    "while_break_continue": (while_break_continue, [np.array([0.5, -1.0, 0.7, 0.2]),
                                                    np.array([1.2, 1.1, -0.3, 0.9])]),
    "for_break": (for_break, [np.array([1.0, 2.0]), np.array([0.1, 0.2]),
                              np.array([-3.0, 4.0])]),
    "for_continue_writes": (for_continue_writes, [np.array([0.3, -0.2, -0.9, 1.1]),
                                                  np.array([-0.8, 0.4, 0.1, -0.1])]),
    "nested": (nested, [np.array([0.5, -0.4, 2.0]), np.array([-3.0, -4.0, -5.0])]),
    "expressions": (expressions, [np.array([0.5, 0.3, 0.7]), np.array([-0.5, -0.3, 1.7]),
                                  np.array([0.2, -0.6, -0.3])]),
    "loop_with_branch": (loop_with_branch, [np.array([0.5, 0.4, 0.3]), np.array([0.1, 0.1, 0.1])]),
    "calls_helper": (calls_helper, [np.array([1.0, 2.0]), np.array([-1.0, 0.5])]),
    "search_total": (search_total, [np.array([1.0, 2.0]), np.array([0.1, 0.2]),
                                    np.array([30.0, 40.0])]),
    "fixed_cos": (fixed_cos, [np.array([0.3, 0.5]), np.array([2.0, -1.0])]),
}


def _fd(f, x, eps=1e-6):
    g = np.zeros_like(x)
    for i in range(x.size):
        e = np.zeros_like(x)
        e.flat[i] = eps
        g.flat[i] = (f(x + e) - f(x - e)) / (2 * eps)
    return g


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_converted_control_flow_matches_numpy(name, backend, caplog):
    f, inputs = FUNCTIONS[name]
    compiled = tg.value_and_grad(f, backend=backend, fallback=False)
    eager = tg.grad(f, compile=False)
    with caplog.at_level(logging.WARNING, logger="tracegrad"):
        for x in inputs:                 # one compiled function, every path
            v, g = compiled(x)
            np.testing.assert_allclose(v, f(x), rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(g, eager(x), rtol=1e-10, atol=1e-12)
            np.testing.assert_allclose(g, _fd(f, x), rtol=1e-5, atol=1e-6)
    assert not [r for r in caplog.records if "runs eagerly" in r.message]
    assert len(compiled._fast) == 1      # traced once, for every input


@pytest.mark.parametrize("name", ["elif_chain", "newton_sqrt", "halvings", "for_break",
                                  "expressions", "early_return", "nested"])
def test_higher_derivatives_through_converted_control_flow(name):
    f, inputs = FUNCTIONS[name]
    for x in inputs:
        h = tg.hessian(f, fallback=False)(x)
        h_eager = tg.hessian(f, compile=False)(x)
        np.testing.assert_allclose(h, h_eager, rtol=1e-8, atol=1e-9)
        h_fd = np.stack([_fd(lambda z, i=i: tg.grad(f, compile=False)(z)[i], x, 1e-5)
                         for i in range(x.size)])
        np.testing.assert_allclose(h, h_fd, rtol=1e-4, atol=1e-5)
        jf = tg.jacfwd(f, fallback=False)(x)
        np.testing.assert_allclose(jf, tg.grad(f, compile=False)(x), rtol=1e-10, atol=1e-12)
        gg = tg.grad(lambda z: np.sum(tg.grad(f)(z) ** 2), fallback=False)(x)
        gg_eager = tg.grad(lambda z: np.sum(tg.grad(f, compile=False)(z) ** 2),
                           compile=False)(x)
        np.testing.assert_allclose(gg, gg_eager, rtol=1e-8, atol=1e-9)


@pytest.fixture(scope="module")
def emulator():
    if shutil.which(testing.CXX) is None:
        pytest.skip(f"the emulator needs a host C++ compiler ({testing.CXX})")
    with testing.emulated_cupy() as fake:
        yield fake


def test_branches_run_only_when_taken():
    # an op of a branch on values from outside it stays in the branch: no
    # 0 * NaN from the untaken sqrt, no index out of range from x[i]
    def f(x):
        if x > 0:
            return np.sqrt(x)
        return x * 2
    np.testing.assert_allclose(tg.grad(f, fallback=False)(np.array(-1.0)), 2.0)
    np.testing.assert_allclose(tg.grad(f, fallback=False)(np.array(4.0)), 0.25)
    g = tg.grad(lambda x: tg.cond(x > 0, lambda: np.sqrt(x), lambda: x * 2))
    np.testing.assert_allclose(g(np.array(-1.0)), 2.0)


@pytest.mark.parametrize("name", ["elif_chain", "newton_sqrt", "for_break", "expressions"])
def test_converted_control_flow_on_the_emulated_cuda_target(emulator, name):
    f, inputs = FUNCTIONS[name]
    compiled = tg.value_and_grad(f, fallback=False)
    for x in inputs:
        v, g = compiled(emulator.asarray(x))
        assert type(g).__module__ == "cupy"
        ref_v, ref_g = tg.value_and_grad(f, backend="numpy")(x)
        np.testing.assert_allclose(testing.to_host(v), ref_v, rtol=1e-12)
        np.testing.assert_allclose(testing.to_host(g), ref_g, rtol=1e-12)


def test_the_graph_holds_cond_and_while_nodes():
    low = tg.grad(newton_sqrt, backend="numpy").lower(np.linspace(1, 4, 4))
    ops = {low.graph.nodes[v]["op"] for v in low.graph}
    assert "while" in ops or "while_fwd" in ops
    low = tg.grad(elif_chain, backend="numpy").lower(np.ones(3))
    assert "cond" in {low.graph.nodes[v]["op"] for v in low.graph}


def test_torch_face_control_flow_compiles():
    def f(x):
        y = x.sin()
        while y.abs().sum() > 0.1:
            y = y * 0.5
        if y.sum() > 0:
            return (y * 2).sum()
        return y.sum()
    for data in ([0.5, 0.3, -0.1], [-0.5, 0.3, -0.1]):
        x = tg.tensor(data, dtype=tg.float64)
        xr = x.clone().requires_grad_()
        f(xr).backward()
        np.testing.assert_allclose(tg.func.grad(f)(x).numpy(), xr.grad.numpy(), rtol=1e-12)
        xc = x.clone().requires_grad_()
        out = tg.compile(f, fallback=False)(xc)
        out.backward()
        np.testing.assert_allclose(xc.grad.numpy(), xr.grad.numpy(), rtol=1e-12)


# --- Python's meaning of names, kept ----------------------------------------------------------

def test_static_conditions_stay_python():
    calls = []

    def f(x, mode):
        if mode == "double":         # a static value: plain Python, one branch traced
            calls.append(mode)
            return np.sum(x * 2)
        return np.sum(x)
    g = tg.grad(f, static_argnums=1, fallback=False)
    np.testing.assert_allclose(g(np.ones(2), "double"), [2.0, 2.0])
    np.testing.assert_allclose(g(np.ones(2), "plain"), [1.0, 1.0])


def test_in_place_update_in_a_branch_reaches_every_name():
    def f(x):
        y = np.copy(x)
        z = y                  # another name for the same array
        if x.sum() > 0:
            y *= 2
        return np.sum(z * x)
    for x in (np.array([1.0, 2.0]), np.array([-1.0, 0.5])):
        np.testing.assert_allclose(tg.grad(f, fallback=False)(x),
                                   tg.grad(f, compile=False)(x), rtol=1e-12)
        np.testing.assert_allclose(tg.compile(f, fallback=False)(x), f(x), rtol=1e-12)


def test_name_bound_on_one_path_only():
    def unused(x):
        if x.sum() > 0:
            t = x * 2          # bound on one path, never read after: fine
            x = t + 1
        return np.sum(x)
    np.testing.assert_allclose(tg.grad(unused, fallback=False)(np.ones(2)), [2.0, 2.0])
    np.testing.assert_allclose(tg.grad(unused, fallback=False)(-np.ones(2)), [1.0, 1.0])

    def read_after(x):
        if x.sum() > 0:
            y = x * 2
        return np.sum(y)
    with pytest.raises(tg.TraceError, match=r"'y' is bound on one path only.*line \d+|'y'"):
        tg.grad(read_after, fallback=False)(np.ones(2))
    # with the fallback it runs as written: right where Python is right
    np.testing.assert_allclose(tg.grad(read_after)(np.ones(2)), [2.0, 2.0])


def test_python_counter_and_result_after_the_loop():
    def f(x):
        it = 0
        while np.sum(x ** 2) > 1e-3:
            x = x * 0.5
            it += 1
        return np.sum(x) * it        # the trip count, a value of the run
    for x in (np.array([1.0, 1.0]), np.array([10.0, -3.0])):
        v, g = tg.value_and_grad(f, fallback=False)(x)
        np.testing.assert_allclose(v, f(x), rtol=1e-12)
        np.testing.assert_allclose(g, tg.grad(f, compile=False)(x), rtol=1e-12)


# --- what cannot be converted: eager for that signature, said once ---------------------------

def printing(x):
    s = x.sum()
    if s > 0:
        print("positive")
        s = s * 2
    return s ** 2


def appending(x):
    history = []
    while np.sum(x) > 0.1:
        x = x * 0.5
        history.append(x)
    return np.sum(x) + len(history)


def shape_changes(x):
    if x.sum() > 0:
        y = x[:1]
    else:
        y = x
    return np.sum(y ** 2)


@pytest.mark.parametrize("f,why", [(printing, "calls print"), (appending, "history.append"),
                                   (shape_changes, "different shapes")])
def test_unconvertible_control_flow_falls_back_to_eager(f, why, caplog, capsys):
    x = np.array([1.0, 2.0])
    with caplog.at_level(logging.WARNING, logger="tracegrad"):
        g = tg.grad(f)
        got = [g(x), g(x), g(-x)]
    lines = [r.message for r in caplog.records if "runs eagerly" in r.message]
    assert len(lines) == 1, lines              # once per signature
    assert "test_control_flow.py:" in lines[0] and why in lines[0]
    for x_, gx in zip([x, x, -x], got):
        np.testing.assert_allclose(gx, tg.grad(f, compile=False)(x_), rtol=1e-12)
    with pytest.raises(tg.TraceError, match=why):
        tg.grad(f, fallback=False)(x)


def test_explain_shows_the_fallback(monkeypatch, capsys):
    def chatty(x):
        if x.sum() > 0:
            print("positive")
        return np.sum(x ** 2)
    monkeypatch.setenv("TRACEGRAD_EXPLAIN", "1")
    logger = logging.getLogger("tracegrad")
    handler = logging.StreamHandler()
    logger.addHandler(handler)
    try:
        tg.grad(chatty)(np.array([1.0, 2.0]))
    finally:
        logger.removeHandler(handler)
    assert "runs eagerly" in capsys.readouterr().err


def test_fallback_never_gives_a_wrong_number():
    def counts(x):
        n = int(np.sum(x))            # a value as a Python number that reaches the result
        return np.sum(x) * n
    with pytest.raises(tg.TraceError, match="int"):
        tg.grad(counts, fallback=False)(np.ones(3))
    with pytest.raises(Exception, match="int"):   # eagerly: refused, not a lost path
        tg.grad(counts)(np.ones(3))
    # the forward value has no gradient to lose: it runs eagerly
    assert tg.compile(counts)(np.ones(3)) == 9.0


def test_lambdas_convert_too():
    f = lambda x, k=2.0: np.sum(x) * k if max(x[0], x[1]) > 0 and x[2] < 1 else -np.sum(x)  # noqa: E731
    for x in (np.array([1.0, -2.0, 0.5]), np.array([-1.0, -2.0, 0.5]),
              np.array([1.0, -2.0, 1.5])):
        v, g = tg.value_and_grad(f, fallback=False)(x)
        np.testing.assert_allclose(v, f(x), rtol=1e-12)
        np.testing.assert_allclose(g, tg.grad(f, compile=False)(x), rtol=1e-12)


def test_methods_convert_too():
    class Model:
        scale = 2.0

        def loss(self, x):
            s = x.sum()
            return s * self.scale if s > 0 else -s
    m = Model()
    np.testing.assert_allclose(tg.grad(m.loss, fallback=False)(np.array([1.0, 2.0])), [2.0, 2.0])
    np.testing.assert_allclose(tg.grad(m.loss, fallback=False)(np.array([-1.0, 0.5])),
                               [-1.0, -1.0])


# --- checkpointing a while loop's reverse mode -------------------------------------------------

def _contraction(x, checkpoint=None):
    def cond(s):
        return s[1] < 300

    def body(s):
        return (np.sin(s[0]) * 0.999 + 0.01 * s[0] ** 2, s[1] + 1)
    y, _ = tg.while_loop(cond, body, (x, np.int64(0)), checkpoint=checkpoint)
    return np.sum(y ** 2)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("checkpoint", [True, 7, "1kB"])
def test_while_loop_checkpointing_gives_the_same_derivatives(checkpoint, backend):
    x = np.linspace(0.1, 0.5, 4)
    plain = tg.grad(_contraction, backend=backend)(x)
    f = tg.grad(lambda x: _contraction(x, checkpoint), backend=backend)
    np.testing.assert_array_equal(f(x), plain)
    np.testing.assert_allclose(tg.hessian(lambda x: _contraction(x, checkpoint))(x),
                               tg.hessian(_contraction)(x), rtol=1e-12, atol=1e-14)


def test_while_checkpoint_tape_keeps_about_sqrt_n_carries():
    from tracegrad.ops.runtime_numpy import _tape_add, _tape_new, _while_steps
    tape = _tape_new(0, 0)
    for i in range(10000):
        _tape_add(tape, (i,))
    assert len(tape["marks"]) <= 2 * int(np.sqrt(10000)) and tape["every"] <= 2 * 100
    # the steps replayed from the kept carries are every step, last first
    assert [c[0] for c in _while_steps(tape, lambda i: (i + 1,), ())] == list(range(9999, -1, -1))
    with pytest.raises(ValueError, match="checkpoint="):
        _contraction(np.ones(2), "lots")


def test_converted_while_loops_follow_the_loop_checkpoint_setting(monkeypatch):
    monkeypatch.setenv("TRACEGRAD_LOOP_CHECKPOINT", "true")
    x = np.array([3.0, -2.0])
    low = tg.grad(halvings, backend="numpy").lower(x)
    assert "_tape_new(" in low.source and "_while_steps(" in low.source
    np.testing.assert_allclose(tg.grad(halvings)(x), tg.grad(halvings, compile=False)(x),
                               rtol=1e-12)


# --- methods of the user's classes ---------------------------------------------------------------

class _Block:
    def __init__(self, w):
        self.w = w

    def __call__(self, x):
        y = x * self.w
        while np.sum(y ** 2) > 1.0:
            y = y * 0.5
        return y


class _Model:
    def __init__(self):
        self.blocks = [_Block(2.0), _Block(3.0)]

    def __call__(self, x):
        for b in self.blocks:
            x = b(x)
        if x.sum() > 0:
            return np.sum(x ** 2)
        return -np.sum(x)


def test_callable_objects_and_their_parts_convert():
    m = _Model()
    for x in (np.array([0.3, 0.4]), np.array([-0.3, 0.1])):
        v, g = tg.value_and_grad(m, fallback=False)(x)
        np.testing.assert_allclose(v, m(x), rtol=1e-12)
        np.testing.assert_allclose(g, tg.grad(m, compile=False)(x), rtol=1e-12)


def test_an_nn_module_with_a_branch_compiles_and_trains():
    class Net(tg.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = tg.nn.Linear(3, 3, dtype=tg.float64)

        def forward(self, x):
            y = self.lin(x)
            if y.sum() > 0:         # on the parameters and the input
                y = y.relu()
            else:
                y = -y
            return y.sum()
    tg.manual_seed(0)
    net = Net()
    compiled = tg.compile(net, fallback=False)
    for data in ([0.5, -0.2, 0.1], [-3.0, 2.0, -1.0]):
        x = tg.tensor(data, dtype=tg.float64)
        out = compiled(x)
        out.backward()
        g = net.lin.weight.grad.clone()
        net.zero_grad()
        ref = net(x)
        ref.backward()
        np.testing.assert_allclose(out.item(), ref.item(), rtol=1e-12)
        np.testing.assert_allclose(g.numpy(), net.lin.weight.grad.numpy(), rtol=1e-12)
        net.zero_grad()


def test_hessian_through_a_branch_that_reads_no_array():
    # a conditional expression whose branches are constants: a cond node
    # with no operands, batched by the Hessian's forward mode
    def f(x):
        return np.sum(x ** 2) * (2.0 if x[0] > 0 else 3.0)
    for x in (np.array([0.5, -0.2]), np.array([-0.5, 0.3])):
        np.testing.assert_allclose(tg.hessian(f, fallback=False)(x),
                                   tg.hessian(f, compile=False)(x), rtol=1e-12)
