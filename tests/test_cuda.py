"""The CUDA target (tracegrad/targets/cuda/), verified without a GPU.

Every function of the corpus below is compiled for the CUDA target and

* its kernels are compiled by ``nvcc -ptx`` for sm_80 and sm_90 when nvcc is
  on the PATH;
* the generated driver and kernels run on the CPU through the emulator
  (``tracegrad.testing``: the unchanged CUDA source built by g++, the driver
  against a NumPy-backed CuPy stand-in) and must match the NumPy target;
* with CuPy and a GPU present, the same corpus runs for real.
"""
import ast
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import tracegrad as tg
from tracegrad import testing
from tracegrad.targets import cstyle
from tracegrad.targets.cuda import codegen as codegen_cuda

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# --- the corpus -----------------------------------------------------------------------

def w2(x, y):
    return np.sum(np.tanh(x) * np.exp(-y ** 2) + np.log1p(x ** 2) * np.sin(y))


def bcast_chain(x, y, z):
    # (4,1) * (1,5) / (5,): broadcasting inside one kernel
    return np.sum(np.exp(x * y * 0.3) / (1.0 + z ** 2))


def bias_tanh(X, b):
    return np.tanh(X + b) * 2.0 - b


def colsum(X):
    return np.sum(np.sum(np.sin(X) ** 2, axis=0) ** 2) + np.mean(np.exp(-X), axis=1).sum()


def matmul_sq(A, B):
    return np.sum((A @ B) ** 2)


def mlp_loss(W1, b1, W2, b2, X, Y):
    h = np.tanh(X @ W1 + b1)
    return np.mean((h @ W2 + b2 - Y) ** 2)


def softmax_xent(W, X, Y):
    # Y is one-hot; a stable log-softmax
    z = X @ W
    m = np.max(z, axis=1, keepdims=True)
    lse = np.log(np.sum(np.exp(z - m), axis=1, keepdims=True)) + m
    return -np.mean(np.sum(Y * (z - lse), axis=1))


def xent_labels(W, X, labels):
    z = X @ W
    lse = tg.logsumexp(z, axis=1)
    return np.mean(lse - z[np.arange(z.shape[0]), labels])


def rosenbrock(x):
    return np.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2)


def logreg(w, X, y):
    return np.mean(np.log1p(np.exp(-y * (X @ w)))) + 0.01 * np.sum(w * w)


def special(x):
    return np.sum(tg.erf(x) * np.expm1(-x) + 1.0 / (1.0 + np.exp(-x)) + np.sqrt(np.abs(x) + 1.0))


def gamma_like(x):
    # gammaln's gradient is digamma, its Hessian trigamma: polygamma in a kernel
    from tracegrad.scipy import special as tsp
    return np.sum(tsp.gammaln(np.abs(x) + 0.5) * x)


def sorted_weights(x):
    # sort, argsort and partition as CuPy calls (CuPy sorts stably, whatever
    # the kind); the gradient's scatter back is a helper run on CuPy arrays
    return np.sum(np.sort(x, axis=1) * np.linspace(-1.0, 1.0, x.shape[1])) + \
        np.sum(np.sort(x, axis=None)[-3:]) + np.sum(np.partition(x, 2, axis=1)[:, :2] ** 2)


def piecewise(x, y):
    return np.sum(np.where(x > 0, x, 0.1 * x) + np.maximum(x, y) * np.clip(y, -0.5, 0.5))


def rational(x, y):
    return np.sum(x ** 3 / (1.0 + y ** 2) - np.arctan(x * y))


def rowmax(X):
    return np.max(X, axis=1) * np.cos(X[:, 0])


def normalize(X):
    mu = np.mean(X, axis=0)
    sd = np.std(X, axis=0)
    return np.sum(((X - mu) / (sd + 1e-3)) ** 3)


def transposed(A, B):
    return np.sum(np.tanh(A.T) * B)


def scalar_scale(x, s):
    return np.sum(np.sinh(x * s) + np.cosh(s))


def two_outputs(x, y):
    return np.exp(x) * y, np.sum(np.log(np.abs(y) + 1.0))


def logaddexp_fn(x, y):
    return np.sum(np.logaddexp(x, y) + np.hypot(x, y))


def vec_field(x):
    return np.tanh(x) * np.roll(x, 1) + x ** 2


def sumsq_int(x, k):
    return np.sum((x * k) ** 2)


def floor_mod(x, k):
    # floor division and remainder of floats and of (negative) integers
    return np.sum((x // 0.3) * x + x % 0.7 + (k // 2) * x + k % 3)


def casts(x, k):
    # astype inside kernels: narrowing, widening, from integers and to bool
    y = x.astype(np.float32).astype(np.float64) * k.astype(np.float64)
    return np.sum(y + (x > 0.2).astype(np.float64) + (x * 3).astype(np.int64) * x)


def _r(rng, *shape):
    return rng.normal(size=shape)


def _onehot(rng, n, k):
    Y = np.zeros((n, k))
    Y[np.arange(n), rng.integers(0, k, n)] = 1.0
    return Y


# name -> (function, argument maker, argnums to differentiate, extra transforms)
CORPUS = {
    "w2": (w2, lambda r: (_r(r, 1000), _r(r, 1000)), (0, 1), ("vjp", "jvp")),
    "bcast_chain": (bcast_chain, lambda r: (_r(r, 4, 1), _r(r, 1, 5), _r(r, 5)), (0, 1, 2), ()),
    "bias_tanh": (bias_tanh, lambda r: (_r(r, 6, 3), _r(r, 3)), None, ("vjp", "jacobian")),
    "colsum": (colsum, lambda r: (_r(r, 7, 5),), 0, ()),
    "matmul_sq": (matmul_sq, lambda r: (_r(r, 4, 6), _r(r, 6, 3)), (0, 1), ()),
    "mlp_loss": (mlp_loss, lambda r: (_r(r, 8, 16) * 0.3, _r(r, 16), _r(r, 16, 3) * 0.3, _r(r, 3),
                                      _r(r, 32, 8), _r(r, 32, 3)), (0, 1, 2, 3), ()),
    "softmax_xent": (softmax_xent, lambda r: (_r(r, 5, 4), _r(r, 12, 5), _onehot(r, 12, 4)), 0, ()),
    "xent_labels": (xent_labels, lambda r: (_r(r, 5, 4), _r(r, 12, 5), r.integers(0, 4, 12)), 0, ()),
    "rosenbrock": (rosenbrock, lambda r: (_r(r, 6),), 0, ("hessian",)),
    "logreg": (logreg, lambda r: (_r(r, 5), _r(r, 20, 5), np.sign(_r(r, 20))), 0, ("hessian",)),
    "special": (special, lambda r: (_r(r, 50),), 0, ("jvp",)),
    "gamma_like": (gamma_like, lambda r: (_r(r, 40),), 0, ("hessian",)),
    "sorted_weights": (sorted_weights, lambda r: (_r(r, 4, 9),), 0, ("vjp", "jvp")),
    "piecewise": (piecewise, lambda r: (_r(r, 30), _r(r, 30)), (0, 1), ()),
    "rational": (rational, lambda r: (_r(r, 3, 4), _r(r, 4)), (0, 1), ()),
    "rowmax": (rowmax, lambda r: (_r(r, 5, 6),), None, ("vjp",)),
    "normalize": (normalize, lambda r: (_r(r, 9, 4),), 0, ()),
    "transposed": (transposed, lambda r: (_r(r, 3, 5), _r(r, 5, 3)), (0, 1), ()),
    "scalar_scale": (scalar_scale, lambda r: (_r(r, 2, 3), np.float64(0.7)), (0, 1), ()),
    "two_outputs": (two_outputs, lambda r: (_r(r, 10), _r(r, 10)), None, ("vjp", "jvp")),
    "logaddexp": (logaddexp_fn, lambda r: (_r(r, 17), _r(r, 17)), (0, 1), ()),
    "vec_field": (vec_field, lambda r: (_r(r, 6),), None, ("jacobian",)),
    "sumsq_int": (sumsq_int, lambda r: (_r(r, 4, 3), r.integers(1, 4, 3)), 0, ()),
    "floor_mod": (floor_mod, lambda r: (_r(r, 9), r.integers(-7, 8, 9)), 0, ()),
    "casts": (casts, lambda r: (_r(r, 11), r.integers(-5, 6, 11)), 0, ()),
}
FLOAT32 = ("w2", "bcast_chain", "mlp_loss", "softmax_xent", "rosenbrock", "logreg", "special",
           "normalize")


def _args(name, dtype):
    rng = np.random.default_rng(abs(hash(name)) % 2 ** 32)
    args = CORPUS[name][1](rng)
    return tuple(a.astype(dtype) if np.asarray(a).dtype.kind == "f" else a for a in args)


def _transforms(name):
    fn, _, argnums, extra = CORPUS[name]
    out = ["forward"] + (["value_and_grad"] if argnums is not None else []) + list(extra)
    return out


def _run(name, transform, dtype, backend):
    """One corpus entry under one transform, on one backend."""
    fn, _, argnums, _ = CORPUS[name]
    args = _args(name, dtype)
    if backend == "cupy":
        xp = sys.modules["cupy"]
        args = tuple(xp.asarray(a) for a in args)
    else:
        xp = np
    if transform == "forward":
        return tg.compile(fn, backend=backend)(*args)
    if transform == "value_and_grad":
        return tg.value_and_grad(fn, argnums=argnums, backend=backend)(*args)
    if transform == "vjp":
        out, f_vjp = tg.vjp(fn, *args, backend=backend)
        cts = tuple(xp.ones_like(o) * 0.5 for o in (out if isinstance(out, tuple) else (out,)))
        return out, f_vjp(cts if isinstance(out, tuple) else cts[0])
    if transform == "jvp":
        tangents = tuple(xp.ones_like(a) * 0.25 for a in args)
        return tg.jvp(fn, args, tangents, backend=backend)
    if transform == "jacobian":
        return tg.jacobian(fn, argnums=0, backend=backend)(*args)
    if transform == "hessian":
        return tg.hessian(fn, argnums=0, backend=backend)(*args)
    raise ValueError(transform)


def _leaves(x):
    if isinstance(x, (tuple, list)):
        return [z for y in x for z in _leaves(y)]
    return [x]


def _assert_close(got, want, dtype):
    g, w = _leaves(got), _leaves(want)
    assert len(g) == len(w)
    tol = dict(rtol=1e-10, atol=1e-12) if dtype == np.float64 else dict(rtol=3e-4, atol=3e-5)
    for a, b in zip(g, w):
        a, b = testing.to_host(a), np.asarray(b)
        assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, a.dtype, b.shape, b.dtype)
        np.testing.assert_allclose(a, b, **tol)


CASES = [(n, t, np.float64) for n in CORPUS for t in _transforms(n)] + \
        [(n, t, np.float32) for n in FLOAT32 for t in _transforms(n) if t in ("forward", "value_and_grad")]
IDS = [f"{n}-{t}-{np.dtype(d).name}" for n, t, d in CASES]


@pytest.fixture(autouse=True)
def _no_disk_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("TRACEGRAD_CACHE", "0")


@pytest.fixture(scope="module")
def emulator():
    if shutil.which(testing.CXX) is None:
        pytest.skip(f"the emulator needs a host C++ compiler ({testing.CXX})")
    with testing.emulated_cupy() as fake:
        yield fake


# --- lowering needs neither CuPy nor a GPU; fusion is visible ---------------------------

def test_lowering_needs_no_cupy(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)   # any import of CuPy now fails
    x = np.ones(8)
    lowered = tg.grad(w2, argnums=(0, 1), backend="cupy").lower(x, x)
    assert "import cupy as np" in lowered.source and "RawModule" in lowered.source
    assert "def value_and_grad(x, y):" in lowered.source
    assert 'extern "C" __global__ void tg_k0(' in lowered.cuda_source
    # the driver embeds exactly the translation unit lowered.cuda_source shows
    assert lowered.cuda_source in lowered.source
    compile(lowered.source, "<driver>", "exec")


def test_w2_forward_and_gradient_is_one_kernel_with_fused_sum():
    x = np.ones(1 << 10)
    lowered = tg.value_and_grad(w2, argnums=(0, 1), backend="cupy").lower(x, x)
    assert codegen_cuda.kernel_count(lowered.graph) <= 3
    assert lowered.cuda_source.count("__global__") == 1
    src = lowered.cuda_source
    # the sum is the kernel's epilogue: the summand never reaches memory
    assert "partial sum" in src and "part_t" in src
    for op in ("tanh(", "exp(", "log1p(", "sin(", "cos("):
        assert op in src
    # each line names its graph node and the user's line
    assert "// %" in src and "test_cuda.py" in src


def test_groups_are_convex_and_broadcasts_are_strided():
    rng = np.random.default_rng(0)
    lowered = tg.value_and_grad(bcast_chain, argnums=(0, 1, 2), backend="cupy").lower(
        *_args("bcast_chain", np.float64))
    src = lowered.cuda_source
    # inputs of shape (4,1), (1,5), (5,) read through constant strides of [4, 5]
    assert "const long long c0 = i / 5LL;" in src and "% 5LL" in src
    from tracegrad.ir import passes
    g = lowered.graph
    groups = passes.fusion_groups(g)
    import networkx as nx
    unit = {}
    for k, grp in enumerate(groups):
        for v in grp.nodes + grp.reductions:
            unit[v] = k
        shapes = {g.nodes[v]["shape"] for v in grp.nodes}
        assert len(shapes) == 1
    c = nx.DiGraph()
    for a, b in g.edges():
        ua, ub = unit.get(a, ("n", a)), unit.get(b, ("n", b))
        if ua != ub:
            c.add_edge(ua, ub)
    assert nx.is_directed_acyclic_graph(c)
    del rng


def test_matmul_and_reductions_are_cupy_calls():
    lowered = tg.value_and_grad(mlp_loss, argnums=(0, 1, 2, 3), backend="cupy").lower(
        *_args("mlp_loss", np.float32))
    assert "np.matmul(" in lowered.source
    assert "float* __restrict__" in lowered.cuda_source and "double" not in \
        lowered.cuda_source.split("#endif")[-1].replace("(double)", "")


def test_float32_literals_stay_single_precision():
    src = tg.grad(w2, argnums=(0, 1), backend="cupy").lower(
        np.ones(4, np.float32), np.ones(4, np.float32)).cuda_source
    assert "1.0f" in src and "const float v" in src and "const double" not in src


def test_literals():
    c = cstyle.c_literal
    assert c(1.5, np.float32) == "1.5f" and c(-2.0, np.float64) == "(-2.0)"
    assert c(float("inf"), np.float64).startswith("__longlong_as_double(0x7ff0")
    assert c(float("nan"), np.float32) == "__int_as_float(0x7fc00000)"
    assert c(1e300, np.float32) == "__int_as_float(0x7f800000)"
    assert c(3, np.int64) == "3LL" and c(True, np.bool_) == "true"


def test_user_text_cannot_break_out_of_comments_or_strings():
    # user text in CUDA comments goes through templates.safe_text (the
    # templates' filter): no line break, no trailing backslash to continue
    # a // comment, no triple quote; tests/test_injection.py fuzzes it
    from tracegrad.targets.templates import safe_text
    for text in ("a \\\n b", "x = '''", "ends with \\"):
        s = safe_text(text)
        assert len(s.splitlines()) == 1 and not s.endswith("\\") and "'''" not in s
    # the translation unit embedded in the driver: exact, raw where it can be
    for tu in ("a\\b", "a\\'''b", "ends \\", "x = '''"):
        assert ast.literal_eval(cstyle.py_string(tu)) == tu
    assert cstyle.py_string("a\\b").startswith("r'''")


# --- (a) nvcc compiles every kernel of the corpus ---------------------------------------

def _corpus_sources():
    """Every translation unit the corpus generates, as each transform lowers it."""
    from tracegrad.runtime import graph_call
    seen = {}
    for name, transform, dtype in CASES:
        fn, _, argnums, _ = CORPUS[name]
        args = _args(name, dtype)
        if transform in ("vjp", "jvp"):
            trace, _, _, _, names, fname = graph_call._trace_flat(fn, args, "cupy")
            gf = graph_call.GraphFunction.from_trace(trace, names, fname)
            graphs = [gf.derived(w).graph for w in (("vjp_fwd", "vjp_bwd") if transform == "vjp"
                                                     else ("jvp",))]
            srcs = [codegen_cuda.translation_unit(g) for g in graphs]
        else:
            make = {"forward": lambda: tg.compile(fn, backend="cupy"),
                    "value_and_grad": lambda: tg.value_and_grad(fn, argnums=argnums, backend="cupy"),
                    "jacobian": lambda: tg.jacobian(fn, backend="cupy"),
                    "hessian": lambda: tg.hessian(fn, backend="cupy")}[transform]
            srcs = [make().lower(*args).cuda_source]
        for k, src in enumerate(srcs):
            if "__global__" in src:
                seen.setdefault(src, f"{name}_{transform}{k}_{np.dtype(dtype).name}")
    return seen


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on the PATH")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_nvcc_compiles_every_corpus_kernel(tmp_path, arch):
    sources = _corpus_sources()
    assert len(sources) >= 20
    # One nvcc run: a file that #includes every translation unit unchanged,
    # each inside #defines giving its kernels names unique in the whole file.
    # NVRTC has no <math.h>; nvcc pre-includes it, so its macros go first.
    lines = [f"#undef {m}" for m in ("INFINITY", "NAN", "HUGE_VAL", "HUGE_VALF")]
    entries = []
    for n, (src, label) in enumerate(sources.items()):
        (tmp_path / f"{label}.cu").write_text(src)
        kernels = list(testing.kernel_signatures(src))
        assert kernels
        for k in kernels:
            lines.append(f"#define {k} tu{n}_{k}")
            entries.append(f"tu{n}_{k}")
        lines.append(f'#include "{label}.cu"')
        lines += [f"#undef {k}" for k in kernels]
    (tmp_path / "all.cu").write_text("\n".join(lines) + "\n")
    r = subprocess.run(["nvcc", "-ptx", f"-arch={arch}", "-Werror", "all-warnings", "all.cu",
                        "-o", "all.ptx"], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-4000:]
    ptx = (tmp_path / "all.ptx").read_text()
    assert f".target {arch}" in ptx
    for e in entries:
        assert f".entry {e}(" in ptx


# --- (b) the emulator runs the generated driver and kernels ------------------------------

@pytest.mark.parametrize("name,transform,dtype", CASES, ids=IDS)
def test_emulated_cuda_target_matches_numpy_target(emulator, name, transform, dtype):
    with_numpy = _run(name, transform, dtype, "numpy")
    on_gpu = _run(name, transform, dtype, "cupy")
    for leaf in _leaves(on_gpu):
        assert type(leaf).__module__ == "cupy", type(leaf)   # results stay on the device
    _assert_close(on_gpu, with_numpy, dtype)


@pytest.mark.emulator_only
def test_emulator_really_launches_kernels(emulator):
    x = np.linspace(-1, 2, 20000)
    low = tg.value_and_grad(w2, argnums=(0, 1), backend="cupy").lower(x, x)
    ns = testing.load_driver(low.source, emulator)
    kern = ns["_tg_k0"]
    v, gx, gy = ns["value_and_grad"](x, x)
    assert kern.launches == 1
    ref = tg.value_and_grad(w2, argnums=(0, 1))(x, x)
    np.testing.assert_allclose(v, ref[0], rtol=1e-12)
    np.testing.assert_allclose(gx, ref[1][0], rtol=1e-12)
    # a grid smaller than the data: the grid-stride loop covers the rest
    assert ns["_tg_k0_grid"][0] * 256 < x.size


def test_cupy_arrays_select_the_cuda_target(emulator):
    x = emulator.asarray(np.linspace(0.1, 1, 7))
    f = tg.grad(w2, argnums=(0, 1))
    gx, gy = f(x, x)
    assert type(gx).__module__ == "cupy"
    assert tg.cache_info()["compiles"] >= 1
    entry = next(iter(f._fast.values()))
    assert "_module" in entry.ns and "CUDA_SOURCE" in entry.ns


def test_repeat_cupy_calls_take_the_fast_path_apart_from_numpy(emulator):
    # a call of CuPy arrays seen before skips the signature's general path,
    # and NumPy arrays of the same shape and dtype still run the NumPy target
    x = emulator.asarray(np.linspace(0.1, 1, 7))
    f = tg.grad(w2, argnums=(0, 1))
    f(x, x)
    hits = tg.cache_info()["memory_hits"]
    gx, _ = f(x, x)
    assert tg.cache_info()["memory_hits"] == hits + 1
    assert type(gx).__module__ == "cupy"
    assert [k[0] for k in f._arrays_only] == [type(x)]   # keyed by CuPy's type too
    host = np.linspace(0.1, 1, 7)
    hx, _ = f(host, host)
    hx2, _ = f(host, host)
    assert type(hx) is np.ndarray and type(hx2) is np.ndarray
    assert len(f._arrays_only) == 2
    np.testing.assert_allclose(testing.to_host(gx), hx, rtol=1e-12)
    gx2, _ = f(x, x)
    assert type(gx2).__module__ == "cupy"


@pytest.mark.emulator_only
def test_emulator_checks_launch_arguments(emulator):
    src = 'extern "C" __global__ void k(const double* __restrict__ a, float* __restrict__ b)\n' \
          '{ for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < 4LL; ' \
          'i += (long long)blockDim.x * gridDim.x) b[i] = (float)(2 * a[i]); }\n'
    k = emulator.RawModule(code=src).get_function("k")
    a, b = np.arange(4.0), np.zeros(4, np.float32)
    k((2,), (3,), (a, b))
    np.testing.assert_array_equal(b, [0, 2, 4, 6])
    with pytest.raises(testing.EmulatorError, match="dtype float64"):
        k((1,), (4,), (a, a))
    with pytest.raises(testing.EmulatorError, match="C-contiguous"):
        k((1,), (4,), (np.arange(8.0)[::2], b))
    with pytest.raises(testing.EmulatorError, match="takes 2 arguments"):
        k((1,), (4,), (a,))


@pytest.mark.emulator_only
def test_emulator_refuses_kernels_needing_concurrent_threads(emulator):
    src = 'extern "C" __global__ void k(float* x) { __shared__ float s[32]; ' \
          's[threadIdx.x] = x[threadIdx.x]; __syncthreads(); x[threadIdx.x] = s[0]; }\n'
    with pytest.raises(testing.EmulatorError, match="rejected"):
        emulator.RawModule(code=src)


# --- errors without CuPy ----------------------------------------------------------------

def test_running_without_cupy_says_so():
    try:
        import cupy  # noqa: F401
        pytest.skip("CuPy is installed")
    except ImportError:
        pass
    with pytest.raises(ImportError, match="needs CuPy"):
        tg.compile(w2, backend="cupy")(np.ones(3), np.ones(3))


# --- (c) for real, when CuPy and a GPU are present --------------------------------------

def _real_cupy():
    try:
        import cupy
        if getattr(cupy, "__tracegrad_emulator__", False):
            return None
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return None
        return cupy
    except Exception:  # no CuPy, no driver, no device: the GPU tests do not apply
        return None


@pytest.mark.skipif(_real_cupy() is None, reason="needs CuPy and a CUDA GPU")
@pytest.mark.parametrize("name,transform,dtype", CASES, ids=IDS)
def test_cuda_target_on_the_gpu_matches_numpy_target(name, transform, dtype):
    with_numpy = _run(name, transform, dtype, "numpy")
    on_gpu = _run(name, transform, dtype, "cupy")
    tol_dtype = dtype if dtype == np.float32 else np.float32 if name == "special" else dtype
    _assert_close(on_gpu, with_numpy, tol_dtype)


# --- the benchmark runs through the emulator --------------------------------------------

def test_gpu_benchmark_runs_emulated():
    if shutil.which(testing.CXX) is None:
        pytest.skip("needs a host C++ compiler")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "gpu.py"),
                        "--emulate", "--small"], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=ROOT, TRACEGRAD_CACHE="0"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "W2" in r.stdout and "MLP" in r.stdout and "kernels" in r.stdout


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.float64, np.float32])
def test_floor_division_and_remainder_follow_numpy_on_every_sign(emulator, dtype):
    # C's / and % truncate towards zero; NumPy (and Python) floor.  Floats
    # include the divmod rounding cases (1 // 0.1 == 9) and zero divisors.
    if np.dtype(dtype).kind == "i":
        a = np.array([7, -7, 7, -7, 0, 6, -6, 5, -5, 3], dtype)
        b = np.array([2, 2, -2, -2, 3, 3, 3, 0, 0, -1], dtype)
    else:
        a = np.array([7, -7, 7, -7, 0, 1, -1, 5, -5, 0.5, 3], dtype)
        b = np.array([2, 2, -2, -2, 3, 0.1, 0.1, 0, 0, -0.25, 3], dtype)

    def f(a, b):
        return np.floor_divide(a, b), np.remainder(a, b), (a // b) * 2 + a % b

    _as_numpy_computes_it(emulator, f, a, b)


def _as_numpy_computes_it(emulator, f, *args):
    """f's results on the emulated CUDA target are NumPy's, dtypes too."""
    with np.errstate(all="ignore"):
        want = f(*args)
        got = tg.compile(f, backend="cupy")(*[emulator.asarray(a) for a in args])
    for g, w in zip(got, want):
        g = testing.to_host(g)
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("transform", ["vjp", "jvp"])
def test_same_graph_on_numpy_then_cupy_gets_the_cuda_driver(emulator, transform):
    # The first real-GPU run found vjp/jvp reusing the NumPy target's module
    # for CuPy arrays of the same graph (np.maximum.reduce on the device,
    # host-only helpers): the stand-in's arrays let that pass on the CPU.
    def f(x):
        return np.sum(np.max(x, axis=1) ** 2)

    from tracegrad.runtime import graph_call
    x = np.linspace(0.1, 1.2, 12).reshape(3, 4)
    xd = emulator.asarray(x)
    for a, backend in ((x, "numpy"), (xd, "cupy")):
        if transform == "vjp":
            tg.vjp(f, a, backend=backend)[1](np.float64(1.0) if backend == "numpy"
                                             else emulator.asarray(1.0))
        else:
            tg.jvp(f, (a,), (a,), backend=backend)
    backends = {gf.backend for _, gf in graph_call._VJP_CACHE.items()}
    assert backends == {"numpy", "cupy"}


def _big_integer_ops(x, y):
    # abs, fmax and fmin of integers in C/CUDA went through double (53 bits)
    return np.abs(x), np.fmax(x, y), np.fmin(x, y), np.abs(x) >= 0, -np.abs(y)


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint64])
def test_integer_abs_fmax_fmin_keep_every_bit(emulator, dtype):
    info = np.iinfo(dtype)
    x = np.array([info.max, info.min, 2 ** 31 - 1, 7, 0, info.max - 1], dtype)
    y = np.array([info.max - 2, 3, info.min, 9, 0, info.max], dtype)
    if dtype == np.int64:
        x[3], y[3] = 2 ** 53 + 1, -(2 ** 62 + 1)
    _as_numpy_computes_it(emulator, _big_integer_ops, x, y)


def test_int64_against_uint64_compares_exactly(emulator):
    x = np.array([-1, 2 ** 53 + 1, 5, -2 ** 63, 2 ** 63 - 1, 0], dtype=np.int64)
    y = np.array([5, 2 ** 53, 5, 2 ** 63, 2 ** 63 - 1, 0], dtype=np.uint64)

    def f(a, b):
        return a < b, a >= b, a == b, b > a, b != a

    _as_numpy_computes_it(emulator, f, x, y)


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint64])
def test_integer_division_edges_are_numpys(emulator, dtype):
    # the most negative value // -1 traps on the emulator's host (SIGFPE);
    # np.fmod of integers went through double (fmod(x, 0) came out as the
    # most negative value instead of 0)
    info = np.iinfo(dtype)
    a = np.array([info.min, info.max, 7, 0, info.max - 2], dtype)
    b = np.array([dtype(-1) if info.min < 0 else info.max, 3, 0, 5, 2], dtype)

    def f(a, b):
        return a // b, a % b, np.fmod(a, b)

    _as_numpy_computes_it(emulator, f, a, b)
