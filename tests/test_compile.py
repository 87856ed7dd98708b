"""Compile mode: traced, differentiated, generated NumPy code agrees with
eager mode and with finite differences; the graph and source can be read."""
import linecache

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.ir import graph as ir


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACEGRAD_CACHE_DIR", str(tmp_path / "cache"))
    tg.clear_cache()
    yield
    tg.clear_cache(disk=False)


rng = np.random.default_rng(42)


def fd_grad(f, args, argnum, eps=1e-6):
    x = np.array(args[argnum], dtype=np.float64)
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[i] += eps
        xm[i] -= eps
        a = list(args)
        a[argnum] = xp
        fp = f(*a)
        a[argnum] = xm
        g[i] = (fp - f(*a)) / (2 * eps)
    return g


# --- composite programs, written as plain NumPy --------------------------------------

def logistic_regression(w, X, y):
    z = X @ w
    p = 1.0 / (1.0 + np.exp(-z))
    return -np.mean(y * np.log(p) + (1 - y) * np.log(1 - p))


def softmax_xent(W, X, onehot):
    logits = X @ W
    m = np.max(logits, axis=1, keepdims=True)
    lse = np.log(np.sum(np.exp(logits - m), axis=1, keepdims=True)) + m
    return -np.sum(onehot * (logits - lse)) / X.shape[0]


def mlp(W1, b1, W2, b2, X, Y):
    h = np.tanh(X @ W1 + b1)
    out = h @ W2 + b2
    return np.mean((out - Y) ** 2)


def rosenbrock(x):
    return np.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2)


def rnn(Wh, Wx, h0, xs):
    h = h0
    for t in range(5):          # a Python loop, unrolled by tracing
        h = np.tanh(h @ Wh + xs[t] @ Wx)
    return np.sum(h ** 2)


PROGRAMS = {
    "logistic": (logistic_regression, lambda: (rng.standard_normal(4) * 0.3,
                                               rng.standard_normal((10, 4)),
                                               (rng.random(10) > 0.5).astype(float)), (0,)),
    "softmax_xent": (softmax_xent, lambda: (rng.standard_normal((4, 3)),
                                            rng.standard_normal((6, 4)),
                                            np.eye(3)[rng.integers(0, 3, 6)]), (0,)),
    "mlp": (mlp, lambda: (rng.standard_normal((4, 8)) * 0.5, rng.standard_normal(8) * 0.1,
                          rng.standard_normal((8, 2)) * 0.5, rng.standard_normal(2) * 0.1,
                          rng.standard_normal((7, 4)), rng.standard_normal((7, 2))), (0, 1, 2, 3)),
    "rosenbrock": (rosenbrock, lambda: (rng.standard_normal(6),), (0,)),
    "rnn": (rnn, lambda: (rng.standard_normal((3, 3)) * 0.5, rng.standard_normal((2, 3)) * 0.5,
                          rng.standard_normal(3), rng.standard_normal((5, 2))), (0, 1, 2)),
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_value_and_grad_matches_eager_and_fd(name):
    f, make, argnums = PROGRAMS[name]
    args = make()
    value, grads = tg.value_and_grad(f, argnums=argnums)(*args)
    np.testing.assert_allclose(value, f(*args), rtol=1e-12)
    # eager mode on Tensors, the same user code
    ts = [tg.tensor(a, requires_grad=(i in argnums)) for i, a in enumerate(args)]
    f(*ts).backward()
    for k, i in enumerate(argnums):
        np.testing.assert_allclose(grads[k], ts[i].grad.numpy(), rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(grads[k], fd_grad(f, args, i), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_jvp_and_jacobian_and_hessian(name):
    f, make, argnums = PROGRAMS[name]
    args = make()
    i = argnums[0]
    gfun = tg.grad(f, argnums=i)
    g = gfun(*args)
    # jvp of the scalar function in a random direction = <grad, t>
    t = rng.standard_normal(np.shape(args[i]))
    tangents = tuple(t if j == i else np.zeros_like(a) for j, a in enumerate(args))
    out, tout = tg.jvp(f, args, tangents)
    np.testing.assert_allclose(out, f(*args), rtol=1e-12)
    np.testing.assert_allclose(tout, np.sum(g * t), rtol=1e-9, atol=1e-12)
    # the Hessian against finite differences of the compiled gradient
    H = tg.hessian(f, argnums=i)(*args)
    x = np.asarray(args[i], float)
    n = x.size
    assert H.shape == x.shape + x.shape
    eps = 1e-6
    Hfd = np.zeros((n, n))
    for k in range(n):
        e = np.zeros(n)
        e[k] = eps
        ap, am = list(args), list(args)
        ap[i] = x + e.reshape(x.shape)
        am[i] = x - e.reshape(x.shape)
        Hfd[:, k] = ((gfun(*ap) - gfun(*am)) / (2 * eps)).ravel()
    np.testing.assert_allclose(H.reshape(n, n), Hfd, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(H.reshape(n, n), H.reshape(n, n).T, rtol=1e-9, atol=1e-12)


def test_jacobian_rev_and_fwd_agree_with_fd():
    def f(x, A):
        return np.tanh(A @ x) * x[:3]

    x, A = rng.standard_normal(4), rng.standard_normal((3, 4))
    J = tg.jacobian(f)(x, A)
    Jf = tg.jacfwd(f)(x, A)
    assert J.shape == (3, 4)
    eps = 1e-6
    Jfd = np.stack([(f(x + eps * e, A) - f(x - eps * e, A)) / (2 * eps) for e in np.eye(4)], axis=1)
    np.testing.assert_allclose(J, Jfd, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(Jf, J, rtol=1e-12, atol=1e-14)


def test_vjp_matches_eager():
    def f(x, y):
        return np.sin(x) * y, np.sum(x ** 2)

    x, y = rng.standard_normal(5), rng.standard_normal(5)
    (a, b), vjp_fn = tg.vjp(f, x, y)
    np.testing.assert_allclose(a, np.sin(x) * y)
    ca, cb = rng.standard_normal(5), 0.7
    gx, gy = vjp_fn((ca, np.float64(cb)))
    np.testing.assert_allclose(gx, ca * np.cos(x) * y + cb * 2 * x, rtol=1e-12)
    np.testing.assert_allclose(gy, ca * np.sin(x), rtol=1e-12)


def test_float32_stays_float32():
    x = rng.standard_normal(8).astype(np.float32)
    v, g = tg.value_and_grad(lambda x: np.sum(np.exp(x) * 2.0))(x)
    assert g.dtype == np.float32
    np.testing.assert_allclose(g, 2 * np.exp(x), rtol=1e-6)


def test_torch_style_tensor_code_compiles():
    def f(w, x):
        return (x.matmul(w).tanh() ** 2).sum(dim=1).mean()

    w, x = rng.standard_normal((3, 2)), rng.standard_normal((4, 3))
    v, g = tg.value_and_grad(f)(w, x)
    W = tg.tensor(w, requires_grad=True)
    f(W, tg.tensor(x)).backward()
    np.testing.assert_allclose(g, W.grad.numpy(), rtol=1e-10)


def test_pytrees_python_numbers_and_has_aux():
    def f(params, x, scale):
        y = np.tanh(x @ params["w"] + params["b"]) * scale
        return np.sum(y ** 2), {"mean": np.mean(y)}

    params = {"w": rng.standard_normal((3, 2)), "b": rng.standard_normal(2)}
    x = rng.standard_normal((4, 3))
    (value, aux), g = tg.value_and_grad(f, has_aux=True)(params, x, 0.5)
    assert set(g) == {"w", "b"}
    assert g["w"].shape == (3, 2)
    np.testing.assert_allclose(g["b"], fd_grad(lambda b: f({"w": params["w"], "b": b}, x, 0.5)[0],
                                               [params["b"]], 0), rtol=1e-6)
    np.testing.assert_allclose(aux["mean"], np.mean(np.tanh(x @ params["w"] + params["b"]) * 0.5))
    # a different Python number does not retrace (it is a dynamic 0-d input),
    # nor does wrapping the same function again
    before = tg.cache_info()["traces"]
    gfun = tg.value_and_grad(f, has_aux=True)
    gfun(params, x, 0.5)
    gfun(params, x, 2.0)
    assert tg.cache_info()["traces"] == before


def test_static_argnums_and_shape_only_control_flow():
    def f(x, n, mode):
        for _ in range(n):
            x = np.sin(x)
        if mode == "square":
            x = x ** 2
        if x.shape[0] > 2:          # shapes are known while tracing
            x = x * 2.0
        return np.sum(x)

    x = rng.standard_normal(3)
    g = tg.grad(f, static_argnums=(1, 2))
    ref = fd_grad(lambda x: f(x, 2, "square"), [x], 0)
    np.testing.assert_allclose(g(x, 2, "square"), ref, rtol=1e-6)
    traces = tg.cache_info()["traces"]
    g(x, 2, "square")
    assert tg.cache_info()["traces"] == traces
    g(x, 3, "square")
    assert tg.cache_info()["traces"] == traces + 1
    g2 = tg.grad(f, static_argnames=("mode",), static_argnums=(1,))
    np.testing.assert_allclose(g2(x, 2, mode="square"), ref, rtol=1e-6)


def test_retrace_exactly_when_signature_changes():
    @tg.compile
    def f(x):
        return np.sum(np.exp(x))

    f(np.ones(3))
    info = tg.cache_info()
    assert (info["traces"], info["compiles"]) == (1, 1)
    for _ in range(5):
        f(np.zeros(3))
    assert tg.cache_info()["traces"] == 1
    f(np.ones(4))                        # new shape
    assert tg.cache_info()["traces"] == 2
    f(np.ones(4, dtype=np.float32))      # new dtype
    assert tg.cache_info()["traces"] == 3
    assert tg.cache_info()["compiles"] == 3


def test_value_dependent_control_flow_compiles_or_says_why():
    def f(x):
        if x.sum() > 0:
            return np.sum(x)
        return -np.sum(x)

    g = tg.grad(f)
    np.testing.assert_allclose(g(np.ones(3)), np.ones(3))
    np.testing.assert_allclose(g(-np.ones(3)), -np.ones(3))    # the same code, other branch

    def noisy(x):
        if x.sum() > 0:
            print("positive")
            return np.sum(x)
        return -np.sum(x)

    with pytest.raises(tg.TraceError) as e:
        tg.grad(noisy, fallback=False)(np.ones(3))
    msg = str(e.value)
    assert "test_compile.py" in msg and "print" in msg
    assert "static_argnums" in msg and "np.where" in msg
    assert isinstance(e.value, TypeError)


def test_conversion_of_traced_value_raises_trace_error():
    with pytest.raises(tg.TraceError, match="float"):
        tg.compile(lambda x: float(np.sum(x)), fallback=False)(np.ones(2))
    with pytest.raises(tg.TraceError, match="argument 'x'"):
        tg.compile(lambda x: np.sum(x).item(), fallback=False)(np.ones(2))
    # with the fallback, the function runs as written for that signature
    assert tg.compile(lambda x: float(np.sum(x)))(np.ones(2)) == 2.0


def test_grad_of_non_scalar_and_int_inputs_errors():
    with pytest.raises(TypeError, match="scalar output"):
        tg.grad(lambda x: x * 2)(np.ones(3))
    with pytest.raises(TypeError, match="floating-point"):
        tg.grad(lambda x: np.sum(x * 2))(np.ones(3, dtype=np.int64))
    with pytest.raises(TypeError, match="static_argnums"):
        tg.compile(lambda x, s: x)(np.ones(2), object())


@pytest.mark.usefixtures("numpy_target")
def test_lower_exposes_graph_source_and_dot():
    def f(w, x):
        return np.sum(np.tanh(x @ w) ** 2)

    w, x = rng.standard_normal((3, 2)), rng.standard_normal((4, 3))
    low = tg.grad(f).lower(w, x)
    g = low.graph
    assert ir.validate(g)
    ops = {g.nodes[v]["op"] for v in g.nodes}
    assert {"matmul", "tanh", "sum", "input"} <= ops
    src = low.source
    assert "import numpy as np" in src and "tracegrad" not in src.split("import numpy")[1].split("def ")[0]
    assert "np.matmul(x, w)" in src
    assert "return np.sum(np.tanh(x @ w) ** 2)" in src      # the user's line, as a comment
    assert "backward of" in src
    # one statement per line
    body = src.split("def value_and_grad")[1]
    assert all(line.count(" = ") <= 1 for line in body.splitlines())
    dot = low.dot()
    assert dot.startswith("digraph") and "matmul" in dot and "->" in dot
    assert "matmul" in low.text()


def test_generated_source_is_registered_for_tracebacks():
    f = tg.grad(lambda x: np.sum(np.log(x)))
    f(np.ones(3))
    fn = next(iter(f._fast.values())).fns
    filename = fn.__code__.co_filename
    assert linecache.getline(filename, fn.__code__.co_firstlineno).startswith("def value_and_grad")


def test_graph_validator_runs_after_every_pass():
    from tracegrad.ir import adjoint, passes
    low = tg.compile(mlp).lower(*PROGRAMS["mlp"][1]())
    g = low.graph
    passes.optimize(g, validate=True)
    j = adjoint.reverse(g, [0, 1, 2, 3], seed="ones")
    passes.optimize(j, validate=True)
    h = adjoint.tangent(j, [0])
    passes.optimize(h, validate=True)


def test_simplification_passes():
    from tracegrad.ir import passes
    from tracegrad.frontend.trace import Trace
    from tracegrad.ops.primitives import Aval
    from tracegrad import ops

    T = Trace()
    x = T.new_input(Aval((3, 4), np.dtype("float64")), "x")
    y = ops.mul(ops.add(ops.neg(ops.neg(x)), 0.0), 1.0)
    z = ops.transpose(ops.transpose(y))
    s = ops.sum(ops.broadcast_to(ops.reshape(ops.sum(z, axis=0), (1, 4)), (5, 4)), axis=0)
    T.outputs = [z.id, s.id]
    g = ir.from_trace(T)
    passes.optimize(g, validate=True)
    ops_left = sorted(g.nodes[v]["op"] for v in g.nodes)
    # z is x itself; s is 5 * sum(x, axis=0)
    assert g.graph["outputs"][0] == g.graph["inputs"][0]
    assert "neg" not in ops_left and "transpose" not in ops_left and "broadcast_to" not in ops_left
    from tracegrad.ir.graph import eval_graph
    X = rng.standard_normal((3, 4))
    out, _ = eval_graph(g, [tg.tensor(X)])
    np.testing.assert_allclose(out[1].numpy(), 5 * X.sum(0))


@pytest.mark.usefixtures("numpy_target")
def test_long_elementwise_chain_reuses_buffers():
    def chain(x):
        y = x
        for _ in range(20):
            y = np.sin(y) * 1.5 + 0.1
        return np.sum(y)

    src = tg.compile(chain).lower(np.ones(1000)).source
    body = src.split("def forward")[1]
    statements = [l.strip() for l in body.splitlines() if l.strip() and not l.strip().startswith("#")]
    allocating = [l for l in statements if " = np." in l and "out=" not in l and "np.sum" not in l]
    # 60 elementwise statements, but only the first allocates: the rest
    # write into the buffer of a value that just died
    assert len([l for l in statements if "out=" in l]) >= 55
    assert len(allocating) <= 2, "\n".join(allocating)
    x = rng.standard_normal(1000)
    np.testing.assert_allclose(tg.compile(chain)(x), chain(x), rtol=1e-12)
    np.testing.assert_allclose(tg.grad(chain)(x), _chain_grad_eager(chain, x), rtol=1e-10)


def _chain_grad_eager(f, x):
    t = tg.tensor(x, requires_grad=True)
    f(t).backward()
    return t.grad.numpy()


# --- compiled calls on the eager tape ----------------------------------------------------

def test_compiled_function_on_tensors_records_one_node():
    cf = tg.compile(mlp)
    args = PROGRAMS["mlp"][1]()
    ts = [tg.tensor(a, requires_grad=i < 4) for i, a in enumerate(args)]
    loss = cf(*ts)
    assert isinstance(loss, tg.Tensor)
    assert "Compiled" in loss.grad_fn.name()
    assert all(nf is None or type(nf[0]).__name__ == "AccumulateGrad"
               for nf in loss.grad_fn.next_functions)
    seen = []
    ts[0].register_hook(lambda g: seen.append(g) or g * 2)
    (loss * 3).backward()
    es = [tg.tensor(a, requires_grad=i < 4) for i, a in enumerate(args)]
    (mlp(*es) * 3).backward()
    assert len(seen) == 1
    np.testing.assert_allclose(ts[0].grad.numpy(), 2 * es[0].grad.numpy(), rtol=1e-10)
    for t, e in zip(ts[1:4], es[1:4]):
        np.testing.assert_allclose(t.grad.numpy(), e.grad.numpy(), rtol=1e-10)


def test_compiled_function_double_backward_matches_eager():
    cf = tg.compile(lambda x: np.sum(np.exp(x) * np.sin(x)))
    x = rng.standard_normal(4)
    t = tg.tensor(x, requires_grad=True)
    g, = tg.autograd.grad(cf(t), t, create_graph=True)
    h, = tg.autograd.grad(g.sum(), t)
    # d2/dx2 of e^x sin x = 2 e^x cos x
    np.testing.assert_allclose(h.numpy(), 2 * np.exp(x) * np.cos(x), rtol=1e-10)


def test_compiled_backward_twice_needs_retain_graph():
    cf = tg.compile(lambda x: np.sum(x ** 3))
    t = tg.tensor(np.ones(2), requires_grad=True)
    y = cf(t)
    y.backward()
    with pytest.raises(RuntimeError, match="second time"):
        y.backward()


# --- custom Functions inside compiled code ------------------------------------------------

class ScaledExp(tg.autograd.Function):
    """exp with a hand-written backward that is deliberately 2x the true
    derivative, so a test can tell the user's backward was used."""

    @staticmethod
    def forward(ctx, x, k):
        y = x.exp()
        ctx.save_for_backward(y)
        ctx.k = k
        return y * k

    @staticmethod
    def backward(ctx, g):
        y, = ctx.saved_tensors
        return 2 * g * y * ctx.k, None


class SplitSquare(tg.autograd.Function):
    """Two outputs; backward written with differentiable ops."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x ** 2, x ** 3

    @staticmethod
    def backward(ctx, ga, gb):
        x, = ctx.saved_tensors
        return ga * 2 * x + gb * 3 * x ** 2


def test_custom_function_is_one_node_with_the_users_backward():
    def f(x):
        return np.sum(ScaledExp.apply(x, 3.0))

    x = rng.standard_normal(4)
    v, g = tg.value_and_grad(f)(x)
    np.testing.assert_allclose(v, 3 * np.exp(x).sum())
    np.testing.assert_allclose(g, 2 * 3 * np.exp(x))           # the user's (2x) rule
    low = tg.grad(f).lower(x)
    assert [low.graph.nodes[n]["op"] for n in low.graph].count("exp") == 1  # not recomputed
    # eager mode with the same Function agrees
    t = tg.tensor(x, requires_grad=True)
    ScaledExp.apply(t, 3.0).sum().backward()
    np.testing.assert_allclose(g, t.grad.numpy())


def test_custom_function_several_outputs_and_second_order():
    def f(x):
        a, b = SplitSquare.apply(x)
        return np.sum(a + b)

    x = rng.standard_normal(3)
    np.testing.assert_allclose(tg.grad(f)(x), 2 * x + 3 * x ** 2, rtol=1e-12)
    np.testing.assert_allclose(np.diag(tg.hessian(f)(x)), 2 + 6 * x, rtol=1e-12)


class StraightThroughRound(tg.autograd.Function):
    """round in the forward; the identity's derivative in both modes."""
    @staticmethod
    def forward(ctx, x):
        return np.round(x)

    @staticmethod
    def backward(ctx, g):
        return g

    @staticmethod
    def jvp(ctx, t):
        return t


class RoundBackwardOnly(tg.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return np.round(x)

    @staticmethod
    def backward(ctx, g):
        return g


def test_forward_mode_through_a_custom_function_uses_its_jvp_or_says_it_has_none():
    # The user's rules define the derivative in both modes: differentiating
    # round's own ops would give 0 here, with no error.
    x, t = np.array([0.3, 1.7, -2.2]), np.array([1.0, -2.0, 0.5])
    f = lambda x: StraightThroughRound.apply(x) * x  # noqa: E731
    _, tan = tg.jvp(f, (x,), (t,))
    np.testing.assert_allclose(tan, t * x + np.round(x) * t, rtol=1e-12)
    np.testing.assert_allclose(tg.jacfwd(f)(x), tg.jacobian(f)(x), rtol=1e-12)
    g = lambda x: np.sum(StraightThroughRound.apply(x) ** 2)  # noqa: E731
    np.testing.assert_allclose(tg.hessian(g)(x), 2 * np.eye(3), rtol=1e-12)
    with pytest.raises(NotImplementedError, match="You must implement the jvp function.*"
                                                  "RoundBackwardOnly"):
        tg.jvp(lambda x: RoundBackwardOnly.apply(x) * x, (x,), (t,))
    # reverse mode needs no jvp
    np.testing.assert_allclose(tg.grad(lambda x: np.sum(RoundBackwardOnly.apply(x) * x))(x),
                               x + np.round(x), rtol=1e-12)


def test_custom_function_edit_changes_cache_key():
    from tracegrad.frontend.code_deps import fingerprint as _source_hash
    assert _source_hash(ScaledExp) != _source_hash(SplitSquare)
    low = tg.grad(lambda x: np.sum(ScaledExp.apply(x, 1.0))).lower(np.ones(2))
    assert low.key_parts["graph"]  # the source hash is a node attribute in the hashed graph


@pytest.mark.usefixtures("numpy_target")
def test_profiler_shows_compiled_call_with_kernels_as_children(tmp_path):
    import json
    f = tg.value_and_grad(lambda w, x: np.sum(np.tanh(x @ w) ** 2))
    w, x = rng.standard_normal((3, 2)), rng.standard_normal((4, 3))
    expected = f(w, x)
    with tg.autograd.profiler.profile() as prof:
        got = f(w, x)
    np.testing.assert_allclose(got[0], expected[0])
    keys = [e.key for e in prof.key_averages()]
    assert "<lambda>" in keys
    assert any(k.endswith(" matmul") and k.startswith("%") for k in keys)
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    parent = next(e for e in events if e["name"] == "<lambda>")
    kids = [e for e in events if e.get("cat") == "kernel"]
    assert kids and all(parent["ts"] <= k["ts"] and k["ts"] + k["dur"] <= parent["ts"] + parent["dur"] + 1
                        for k in kids)


def test_hessian_of_several_arguments_gives_all_blocks():
    def f(a, b):
        return np.sum(a ** 2 * b[:2]) + np.sum(b ** 3)

    a, b = rng.standard_normal(2), rng.standard_normal(3)
    (haa, hab), (hba, hbb) = tg.hessian(f, argnums=(0, 1))(a, b)
    assert haa.shape == (2, 2) and hab.shape == (2, 3) and hba.shape == (3, 2) and hbb.shape == (3, 3)
    np.testing.assert_allclose(haa, np.diag(2 * b[:2]))
    np.testing.assert_allclose(hab, np.hstack([np.diag(2 * a), np.zeros((2, 1))]))
    np.testing.assert_allclose(hba, hab.T)
    np.testing.assert_allclose(hbb, np.diag(6 * b))


def test_jacobian_of_several_outputs_keeps_their_structure():
    def f(x, y):
        return {"p": x * y, "s": np.sum(x)}

    x, y = rng.standard_normal(3), rng.standard_normal(3)
    J = tg.jacobian(f, argnums=(0, 1))(x, y)
    np.testing.assert_allclose(J["p"][0], np.diag(y))
    np.testing.assert_allclose(J["p"][1], np.diag(x))
    np.testing.assert_allclose(J["s"][0], np.ones(3))
    np.testing.assert_allclose(J["s"][1], np.zeros(3))


def test_vjp_and_jvp_static_argnums():
    def f(x, power):
        return x ** power

    x = rng.standard_normal(3)
    out, vjp_fn = tg.vjp(f, x, 3, static_argnums=(1,))
    np.testing.assert_allclose(out, x ** 3)
    (gx,) = vjp_fn(np.ones(3))
    np.testing.assert_allclose(gx, 3 * x ** 2)
    out, t = tg.jvp(f, (x, 2), (np.ones(3),), static_argnums=(1,))
    np.testing.assert_allclose(t, 2 * x)
    with pytest.raises(TypeError, match="functools.partial"):
        tg.vjp(f, x, 3, static_argnames=("power",))


def test_numpy_like_constructors_trace():
    f = tg.grad(lambda x: np.sum(np.full_like(x, 3.0) * x + np.ones_like(x) * np.zeros_like(x)))
    np.testing.assert_allclose(f(np.ones(2)), [3.0, 3.0])
    # np.asarray of a traced value is the value itself (no conversion)
    np.testing.assert_allclose(tg.compile(lambda x: np.asarray(x) * 2)(np.ones(2)), [2.0, 2.0])
    with pytest.raises(tg.TraceError, match="drop the conversion"):
        tg.compile(lambda x: np.asarray(x.tolist() if False else x).__array__() * 2,
                   fallback=False)(np.ones(2))


def test_jacobian_of_diagonal_seed_avoids_the_cubic_product():
    """diag(w) @ W is rewritten to w[:, None] * W: no matmul on the seed."""
    f = lambda x, W: np.tanh(W @ x) * x  # noqa: E731
    x, W = rng.standard_normal(6), rng.standard_normal((6, 6))
    low = tg.jacobian(f).lower(x, W)
    assert [low.graph.nodes[v]["op"] for v in low.graph].count("matmul") == 1  # W @ x only
    eps = 1e-6
    Jfd = np.stack([(f(x + eps * e, W) - f(x - eps * e, W)) / (2 * eps) for e in np.eye(6)], axis=1)
    np.testing.assert_allclose(tg.jacobian(f)(x, W), Jfd, rtol=1e-6, atol=1e-8)


def test_topo_order_is_networkx_lexicographical_order():
    # ir.topo_order walks the adjacency dicts itself (speed); the order must
    # stay networkx's: creation order (node id) breaks ties
    import random
    import networkx as nx
    from tracegrad.ir import graph as ir
    rnd = random.Random(3)
    for _ in range(200):
        g = nx.MultiDiGraph()
        ids = rnd.sample(range(1000), rnd.randint(1, 60))
        g.add_nodes_from(ids)
        order = ids[:]
        rnd.shuffle(order)
        for i, v in enumerate(order):
            for u in rnd.sample(order[:i], min(i, rnd.randint(0, 3))):
                for k in range(rnd.randint(1, 2)):
                    g.add_edge(u, v, key=k, pos=k)
        assert ir.topo_order(g) == list(nx.lexicographical_topological_sort(g))
    g.add_edge(order[-1], order[0], key=9, pos=9)
    if len(order) > 1 and nx.has_path(g, order[0], order[-1]):
        with pytest.raises(nx.NetworkXUnfeasible):
            ir.topo_order(g)
