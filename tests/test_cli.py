"""The `tracegrad` command line, run as a user runs it: a subprocess.

For every transform, `tracegrad compile` writes a module; all the modules
are then imported and run in ONE fresh interpreter in which `import
tracegrad` fails, and their results are compared with the decorator's.
Every command-line mistake ends in one paragraph on stderr, exit status 2,
and no traceback.
"""
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import tracegrad as tg

MODEL = '''
import numpy as np


def loss(w, x, y, alpha=0.1):
    """A one-layer network's squared error plus weight decay."""
    pred = np.tanh(x @ w)
    return np.mean((pred - y) ** 2) + alpha * np.sum(w ** 2)


def two(a, b):
    return np.sum(np.sin(a) * b ** 2 + np.exp(a * b))


def rollout(x, n_steps, dt):
    """A damped oscillator stepped n_steps times (n_steps is static)."""
    v = 0.0 * x
    for _ in range(n_steps):
        v = v - dt * (x + 0.1 * v)
        x = x + dt * v
    return x, {"energy": np.sum(x ** 2 + v ** 2)}


def branchy(x):
    if x.sum() > 0:
        print("positive")
        return x
    return -x


def needs_int(x):
    return x[: int(x[0])]
'''

RUN_MODULES = '''
import sys
try:
    import tracegrad
except ImportError:
    pass
else:
    raise SystemExit("tracegrad is importable in the standalone run: the test is void")
import importlib
import pickle
import numpy as np
with open(sys.argv[1], "rb") as f:
    jobs = pickle.load(f)
results = {}
for module, func, args in jobs:
    m = importlib.import_module(module)
    assert "tracegrad" not in sys.modules
    results[module] = getattr(m, func)(*args)
    results[module + ".doc"] = m.__doc__ + "\\n" + getattr(m, func).__doc__
    try:
        getattr(m, func)(*[np.asarray(a, dtype=np.float32) for a in args])
    except ValueError as e:
        results[module + ".err"] = str(e)
with open(sys.argv[2], "wb") as f:
    pickle.dump(results, f)
'''


@pytest.fixture
def work(tmp_path, monkeypatch):
    (tmp_path / "model.py").write_text(MODEL)
    monkeypatch.setenv("TRACEGRAD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    sys.path.insert(0, str(tmp_path))
    sys.modules.pop("model", None)
    yield tmp_path
    sys.path.remove(str(tmp_path))
    sys.modules.pop("model", None)


def cli(*args, cwd=None, env=None):
    return subprocess.run([sys.executable, "-m", "tracegrad.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def run_standalone(tmp_path, jobs):
    """Import and call the generated modules in a fresh interpreter where
    importing tracegrad raises ImportError."""
    import pickle
    block = tmp_path / "block"
    block.mkdir(exist_ok=True)
    (block / "tracegrad.py").write_text("raise ImportError('tracegrad is blocked in this test')\n")
    (tmp_path / "run_modules.py").write_text(RUN_MODULES)
    with open(tmp_path / "jobs.pkl", "wb") as f:
        pickle.dump(jobs, f)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.pathsep.join([str(block), str(tmp_path / "out")])
    r = subprocess.run([sys.executable, str(tmp_path / "run_modules.py"), str(tmp_path / "jobs.pkl"),
                        str(tmp_path / "results.pkl")], cwd=str(tmp_path / "out"), env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    with open(tmp_path / "results.pkl", "rb") as f:
        return pickle.load(f)


def assert_tree_close(a, b):
    if isinstance(a, (tuple, list)):
        assert isinstance(b, (tuple, list)) and len(a) == len(b), (a, b)
        for x, y in zip(a, b):
            assert_tree_close(x, y)
    elif isinstance(a, dict):
        assert isinstance(b, dict) and sorted(a) == sorted(b)
        for k in a:
            assert_tree_close(a[k], b[k])
    else:
        assert np.shape(a) == np.shape(b)
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_every_transform_standalone_matches_decorator(work):
    import model
    rng = np.random.default_rng(0)
    w, x, y = rng.normal(size=(3, 2)), rng.normal(size=(5, 3)), rng.normal(size=(5, 2))
    a, b = rng.normal(size=4), rng.normal(size=4)
    ta, tb = rng.normal(size=4), rng.normal(size=4)
    x0 = rng.normal(size=3)
    loss_args = ["--arg", "w=float64[3,2]", "--arg", "x=float64[5,3]", "--arg", "y=float64[5,2]"]
    two_args = ["--arg", "a=float64[4]", "--arg", "b=float64[4]"]
    out = work / "out"
    out.mkdir()
    cases = [
        # module, CLI arguments, function name, call arguments, the decorator's result
        ("loss_fwd", ["model.py:loss", *loss_args, "--static", "alpha=0.5"], "loss", (w, x, y),
         tg.compile(model.loss, static_argnums=3)(w, x, y, 0.5)),
        ("loss_grad", ["model.py:loss", *loss_args, "--grad"], "loss", (w, x, y),
         tg.grad(model.loss)(w, x, y)),
        ("loss_grad2", ["model.py:loss", *loss_args, "--grad", "--wrt", "w,x"], "loss", (w, x, y),
         tg.grad(model.loss, argnums=(0, 1))(w, x, y)),
        ("loss_vg", ["model.py:loss", *loss_args, "--value-and-grad", "--wrt", "x"], "loss",
         (w, x, y), tg.value_and_grad(model.loss, argnums=1)(w, x, y)),
        ("two_jac", ["model.py:two", *two_args, "--jacobian", "--wrt", "a,b"], "two", (a, b),
         tg.jacobian(model.two, argnums=(0, 1))(a, b)),
        ("two_hess", ["model.py:two", *two_args, "--hessian", "--wrt", "b"], "two", (a, b),
         tg.hessian(model.two, argnums=1)(a, b)),
        ("two_vjp", ["model.py:two", *two_args, "--vjp"], "two", (a, b, np.float64(1.5)),
         (lambda o, f: (o, f(np.float64(1.5))))(*tg.vjp(model.two, a, b))),
        ("two_jvp", ["model.py:two", *two_args, "--jvp"], "two", (a, b, ta, tb),
         tg.jvp(model.two, (a, b), (ta, tb))),
    ]
    ct = (np.ones(3), {"energy": np.float64(2.0)})
    roll = lambda x: model.rollout(x, 5, 0.1)  # noqa: E731
    o, f_vjp = tg.vjp(roll, x0)
    cases += [
        ("roll_fwd", ["model.py:rollout", "--arg", "x=float64[3]", "--static", "n_steps=5",
                      "--static", "dt=0.1"], "rollout", (x0,), roll(x0)),
        ("roll_vjp", ["model.py:rollout", "--arg", "x=float64[3]", "--static", "n_steps=5",
                      "--static", "dt=0.1", "--vjp"], "rollout", (x0, ct[0], ct[1]["energy"]),
         (o, f_vjp(ct))),
        ("roll_jvp", ["model.py:rollout", "--arg", "x=float64[3]", "--static", "n_steps=5",
                      "--static", "dt=0.1", "--jvp"], "rollout", (x0, ta[:3]),
         tg.jvp(roll, (x0,), (ta[:3],))),
    ]
    # a long Python loop is rolled into one loop node: the standalone module
    # holds a Python loop over the body's function, not 300 copies of it
    long_roll = lambda x: model.rollout(x, 300, 0.01)  # noqa: E731
    o_long, f_long = tg.vjp(long_roll, x0)
    cases += [
        ("roll_long_vjp", ["model.py:rollout", "--arg", "x=float64[3]", "--static",
                           "n_steps=300", "--static", "dt=0.01", "--vjp"], "rollout",
         (x0, ct[0], ct[1]["energy"]), (o_long, f_long(ct))),
    ]
    for module, args, _, _, _ in cases:
        r = cli("compile", *args, "-o", str(out / f"{module}.py"))
        assert r.returncode == 0, r.stderr
        text = (out / f"{module}.py").read_text()
        assert "tracegrad" not in "".join(l for l in text.splitlines() if l.startswith(("import", "from")))
    long_text = (out / "roll_long_vjp.py").read_text()
    assert "def _scan_body" in long_text and "for _" in long_text and len(long_text) < 20_000
    results = run_standalone(work, [(m, fn, args) for m, _, fn, args, _ in cases])
    for module, _, fn, _, expected in cases:
        assert_tree_close(results[module], expected)
        doc = results[module + ".doc"]
        assert f"tracegrad {tg.__version__}" in doc and "model.py" in doc
        # the door check names the function, the argument, and both types
        assert results[module + ".err"].startswith(f"{fn}(): argument ")
        assert "must be float64[" in results[module + ".err"] and "got float32[" in results[module + ".err"]


def test_hessian_with_two_arguments_gives_all_blocks(work):
    import model
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=3), rng.normal(size=3)
    (work / "out").mkdir()
    r = cli("compile", "model.py:two", "--arg", "a=float64[3]", "--arg", "b=float64[3]",
            "--hessian", "--wrt", "a,b", "-o", "out/h.py")
    assert r.returncode == 0, r.stderr
    H = run_standalone(work, [("h", "two", (a, b))])["h"]
    assert_tree_close(H[0][0], tg.hessian(model.two, argnums=0)(a, b))
    assert_tree_close(H[1][1], tg.hessian(model.two, argnums=1)(a, b))
    # the mixed block, by finite differences of the gradient w.r.t. a along b
    eps = 1e-6
    ga = tg.grad(model.two, argnums=0)
    fd = np.stack([(ga(a, b + eps * e) - ga(a, b - eps * e)) / (2 * eps) for e in np.eye(3)], 1)
    np.testing.assert_allclose(H[0][1], fd, atol=1e-7)
    np.testing.assert_allclose(H[1][0], H[0][1].T, atol=1e-12)


def test_door_check_message_and_stdout(work):
    r = cli("compile", "model.py:loss", "--arg", "w=float64[128,64]", "--arg", "x=float64[10,128]",
            "--arg", "y=float64[10,64]", "--grad", "-o", "-")
    assert r.returncode == 0, r.stderr
    ns = {}
    exec(compile(r.stdout, "loss_grad.py", "exec"), ns)
    w = np.zeros((128, 64), np.float32)
    with pytest.raises(ValueError) as e:
        ns["loss"](w, np.zeros((10, 128)), np.zeros((10, 64)))
    assert str(e.value) == "loss(): argument 'w' must be float64[128, 64], got float32[128, 64]"
    with pytest.raises(ValueError, match=r"argument 'x' must be float64\[10, 128\], got float64\[10, 127\]"):
        ns["loss"](w.astype(np.float64), np.zeros((10, 127)), np.zeros((10, 64)))
    with pytest.raises(TypeError, match="argument 'w' must be a NumPy array"):
        ns["loss"]("w", np.zeros((10, 128)), np.zeros((10, 64)))


@pytest.mark.skipif(shutil.which("g++") is None, reason="the CUDA emulator needs g++")
@pytest.mark.parametrize("transform, call", [
    ("--value-and-grad", lambda m, w, x, y, cp: m.loss(cp.asarray(w), cp.asarray(x), cp.asarray(y))),
    ("--vjp", lambda m, w, x, y, cp: m.loss(cp.asarray(w), cp.asarray(x), cp.asarray(y),
                                            cp.asarray(np.float64(2.0)))),
])
def test_cupy_backend_module(work, transform, call):
    """--backend cupy writes the CUDA target's CuPy driver (kernels in CUDA C)
    wrapped the same way; run here through tracegrad.testing's CPU emulator of
    the CUDA target, in place of a GPU."""
    import model
    from tracegrad import testing
    r = cli("compile", "model.py:loss", "--arg", "w=float64[3,2]", "--arg", "x=float64[5,3]",
            "--arg", "y=float64[5,2]", "--static", "alpha=0.5", transform,
            "--backend", "cupy", "-o", "-")
    assert r.returncode == 0, r.stderr
    src = r.stdout
    assert "import cupy as np" in src and "__global__" in src and "tracegrad" not in \
        "".join(l for l in src.splitlines() if l.lstrip().startswith(("import", "from")))
    rng = np.random.default_rng(2)
    w, x, y = rng.normal(size=(3, 2)), rng.normal(size=(5, 3)), rng.normal(size=(5, 2))
    with testing.emulated_cupy() as cp:
        ns = {"__name__": "loss_cupy"}
        exec(compile(src, "loss_cupy.py", "exec"), ns)
        got = call(type("M", (), {"loss": staticmethod(ns["loss"])}), w, x, y, cp)
        with pytest.raises(TypeError, match="argument 'w' must be a CuPy array float64\\[3, 2\\]"):
            ns["loss"](w, cp.asarray(x), cp.asarray(y), *([2.0] if transform == "--vjp" else []))
    if transform == "--value-and-grad":
        expected = tg.value_and_grad(model.loss)(w, x, y, 0.5)
    else:
        o, f_vjp = tg.vjp(lambda w, x, y: model.loss(w, x, y, 0.5), w, x, y)
        expected = (o, f_vjp(np.float64(2.0)))
    to_np = lambda t: tuple(to_np(v) for v in t) if isinstance(t, tuple) else testing.to_host(t)  # noqa: E731
    assert_tree_close(to_np(got), expected)


def test_show_formats_and_render(work):
    base = ["show", "model.py:two", "--arg", "a=float64[4]", "--arg", "b=float64[4]", "--grad"]
    src = cli(*base)
    assert src.returncode == 0 and "def value_and_grad(a, b):" in src.stdout
    ir = cli(*base, "--format", "ir")
    assert ir.returncode == 0 and ir.stdout.startswith("graph(%0:a:float64[4], %1:b:float64[4])")
    assert "cos(%0)" in ir.stdout
    dot = cli(*base, "--format", "dot")
    assert dot.returncode == 0 and dot.stdout.startswith('digraph "tracegrad"')
    # without Graphviz on PATH: a clear message, exit status 2
    env = dict(os.environ, PATH=str(work))
    r = subprocess.run([sys.executable, "-m", "tracegrad.cli", *base, "--render", "g.png"],
                       env=env, capture_output=True, text=True)
    assert r.returncode == 2 and "Graphviz" in r.stderr and "not installed" in r.stderr
    assert "Traceback" not in r.stderr
    if shutil.which("dot"):
        r = cli(*base, "--render", "g.svg")
        assert r.returncode == 0, r.stderr
        assert (work / "g.svg").read_text().lstrip().startswith(("<?xml", "<svg"))


def test_cache_info_and_clear(work):
    cache = work / "cache"
    r = subprocess.run([sys.executable, "-c", "import numpy as np, tracegrad as tg, model; "
                        "print(tg.grad(model.two)(np.ones(4), np.ones(4)))"],
                       capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=os.pathsep.join(
                           [str(work)] + [p for p in [os.environ.get("PYTHONPATH")] if p])))
    assert r.returncode == 0, r.stderr
    info = cli("cache", "info")
    assert info.returncode == 0
    n = len([p for p in os.listdir(cache) if p.endswith(".py")])
    assert n >= 1
    assert f"entries: {n}" in info.stdout and str(cache) in info.stdout and "bytes" in info.stdout
    clear = cli("cache", "clear")
    assert clear.returncode == 0 and f"cleared {n} entries" in clear.stdout
    assert not [p for p in os.listdir(cache) if p.endswith(".py")]
    assert "entries: 0" in cli("cache", "info").stdout
    off = cli("cache", "info", env=dict(os.environ, TRACEGRAD_CACHE="0"))
    assert off.returncode == 0 and "off" in off.stdout


def test_version_and_help():
    r = cli("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"tracegrad {tg.__version__}"
    h = cli("compile", "--help")
    assert h.returncode == 0
    for opt in ("--arg", "--static", "--grad", "--value-and-grad", "--vjp", "--jvp", "--jacobian",
                "--hessian", "--wrt", "--backend", "-o"):
        assert opt in h.stdout
    m = subprocess.run([sys.executable, "-m", "tracegrad", "--version"], capture_output=True,
                       text=True)
    assert m.returncode == 0 and tg.__version__ in m.stdout


ARGS = ["--arg", "a=float64[4]", "--arg", "b=float64[4]"]


@pytest.mark.parametrize("args, needles", [
    (["compile", "missing.py:f", "--arg", "x=float64[3]"], ["no such file: missing.py"]),
    (["compile", "model.py:nope", *ARGS], ["has no function 'nope'", "loss", "two"]),
    (["compile", "nosuchpkg.mod:f", *ARGS], ["cannot import the module 'nosuchpkg.mod'"]),
    (["compile", "model.py", *ARGS], ["does not name a function", "FILE.py:FUNC"]),
    (["compile", "model.py:two", "--arg", "a=float64[4", "--arg", "b=float64[4]"],
     ["'a=float64[4' does not parse", "NAME=DTYPE[SHAPE]"]),
    (["compile", "model.py:two", "--arg", "a=flaot64[4]", "--arg", "b=float64[4]"],
     ["'flaot64' is not a NumPy numeric dtype"]),
    (["compile", "model.py:two", "--arg", "a=float64[4,x]", "--arg", "b=float64[4]"],
     ["must be non-negative integers"]),
    (["compile", "model.py:two", "--arg", "a=float64[4]"], ["needs a value for 'b'"]),
    (["compile", "model.py:two", *ARGS, "--arg", "c=float64[1]"], ["two has no argument 'c'"]),
    (["compile", "model.py:rollout", "--arg", "x=float64[3]", "--static", "n_steps=five",
      "--static", "dt=0.1"], ["is not a Python literal"]),
    (["compile", "model.py:two", *ARGS, "--grad", "--wrt", "c"], ["no array argument 'c'"]),
    (["compile", "model.py:two", *ARGS, "--wrt", "a"], ["--wrt needs a transform"]),
    (["compile", "model.py:loss", "--arg", "w=float64[3,2]", "--arg", "x=float64[5,4]",
      "--arg", "y=float64[5,2]"], ["tracing loss(", "matmul", "model.py, line 7", "--arg shapes"]),
    (["compile", "model.py:rollout", "--arg", "x=float64[3]", "--static", "n_steps=2",
      "--static", "dt=0.1", "--grad"], ["--grad needs rollout to return one array"]),
    (["compile", "model.py:branchy", "--arg", "x=float64[3]"],
     ["cannot trace branchy", "model.py, line 25", "if x.sum() > 0:", "calls print", "np.where",
      "--static"]),
    (["compile", "model.py:needs_int", "--arg", "x=float64[3]", "--grad"],
     ["cannot trace needs_int", "int() requested"]),
    (["show", "model.py:two", *ARGS, "--vjp", "--wrt", "q"], ["no array argument 'q'"]),
])
def test_cli_errors_are_one_paragraph(work, args, needles):
    r = cli(*args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    flat = " ".join(r.stderr.split())
    assert flat.startswith(f"tracegrad {args[0]}: error: ")
    for n in needles:
        assert n in flat, flat
    assert "\n\n" not in r.stderr.strip()  # one paragraph


def test_debug_shows_the_traceback(work):
    r = cli("compile", "model.py:branchy", "--arg", "x=float64[3]", "--debug")
    assert r.returncode == 2
    assert "Traceback" in r.stderr and "TraceError" in r.stderr


def test_usage_errors_exit_2():
    r = cli("compile", "model.py:two", "--grad", "--hessian")
    assert r.returncode == 2 and "not allowed with" in r.stderr
    assert cli("frobnicate").returncode == 2


def test_native_backend_module_builds_itself_without_tracegrad(work):
    from tracegrad.runtime import toolchain
    if toolchain.recipe_or_none() is None:
        pytest.skip("the native target needs a C compiler")
    import model
    rng = np.random.default_rng(3)
    w, x, y = rng.normal(size=(3, 2)), rng.normal(size=(5, 3)), rng.normal(size=(5, 2))
    out = work / "out"
    out.mkdir()
    r = cli("compile", "model.py:loss", "--arg", "w=float64[3,2]", "--arg", "x=float64[5,3]",
            "--arg", "y=float64[5,2]", "--grad", "--backend", "native",
            "-o", str(out / "loss_native.py"))
    assert r.returncode == 0, r.stderr
    text = (out / "loss_native.py").read_text()
    assert 'TARGET = "native"' in text and "_RECIPE = None" in text
    assert "void tg_k0(" in (out / "loss_native.c").read_text()
    results = run_standalone(work, [("loss_native", "loss", (w, x, y))])
    assert_tree_close(results["loss_native"], tg.grad(model.loss)(w, x, y))
    assert [p for p in os.listdir(out) if p.endswith(".so")]   # built on first import
    r = cli("show", "model.py:loss", "--arg", "w=float64[3,2]", "--arg", "x=float64[5,3]",
            "--arg", "y=float64[5,2]", "--grad", "--format", "c")
    assert r.returncode == 0, r.stderr
    assert "#pragma omp simd" in r.stdout and "void tg_k0(" in r.stdout


def test_a_long_python_loop_compiles_ahead_of_time_as_one_loop(work):
    (work / "sim.py").write_text(
        "import numpy as np\n\n"
        "def miss(v0, n):\n"
        "    x = np.zeros(3)\n"
        "    v = v0\n"
        "    for _ in range(n):\n"
        "        v = v + 0.01 * (-0.1 * v * np.sqrt(np.sum(v * v)) + np.array([0., 0., -9.8]))\n"
        "        x = x + 0.01 * v\n"
        "    return np.sum((x - np.array([10., 0., 0.])) ** 2)\n")
    env = dict(os.environ, TRACEGRAD_EXPLAIN="1")
    r = cli("compile", "sim.py:miss", "--arg", "v0=float64[3]", "--static", "n=50000",
            "--value-and-grad", "-o", "sim_vg.py", cwd=work, env=env)
    assert r.returncode == 0, r.stderr
    assert "rewrote the Python loop at sim.py:6" in r.stderr
    import importlib
    import sim
    vg = importlib.import_module("sim_vg")
    v0 = np.array([5., 0., 5.])
    v, g = vg.miss(v0)
    v_ref, g_ref = tg.value_and_grad(sim.miss, static_argnums=(1,))(v0, 50000)
    np.testing.assert_allclose(v, v_ref, rtol=1e-12)
    np.testing.assert_allclose(g, g_ref, rtol=1e-12)
