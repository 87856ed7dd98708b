"""GPU benchmark of tracegrad's CUDA target.

Two workloads, each as tracegrad's generated CUDA (fused kernels + CuPy
driver), as CuPy written by hand, and as PyTorch on the GPU when torch is
importable:

* W2: value and gradient (w.r.t. x and y) of
  ``sum(tanh(x) * exp(-y**2) + log1p(x**2) * sin(y))`` on float32[16_777_216].
  Its minimum memory traffic is 16 bytes per element (read x and y, write
  both gradients), so the achieved bandwidth is reported against the
  device's measured device-to-device copy bandwidth.  Target: tracegrad's
  fused forward+gradient at >= 70% of copy bandwidth.
* MLP step: value and gradients of a one-hidden-layer tanh MLP's mean
  squared error (X 256x64, hidden 256, 10 outputs), all four parameters.

Usage::

    python benchmarks/gpu.py                   # on a machine with CuPy and a GPU
    python benchmarks/gpu.py --emulate --small # on the CPU through tracegrad.testing's
                                               # emulator: checks that it all runs; the
                                               # timings then mean nothing
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tracegrad as tg  # noqa: E402
from tracegrad import testing  # noqa: E402
from tracegrad.targets.cuda import codegen as codegen_cuda  # noqa: E402


def w2(x, y):
    return np.sum(np.tanh(x) * np.exp(-y ** 2) + np.log1p(x ** 2) * np.sin(y))


def mlp_loss(W1, b1, W2, b2, X, Y):
    h = np.tanh(X @ W1 + b1)
    return np.mean((h @ W2 + b2 - Y) ** 2)


def _mlp_inputs(xp, rng):
    """The MLP step's parameters (W1, b1, W2, b2) and data X, Y, float32."""
    X = xp.asarray(rng.normal(size=(256, 64)).astype(np.float32))
    Y = xp.asarray(rng.normal(size=(256, 10)).astype(np.float32))
    params = [xp.asarray(a.astype(np.float32)) for a in
              (rng.normal(size=(64, 256)) * 0.1, np.zeros(256), rng.normal(size=(256, 10)) * 0.1,
               np.zeros(10))]
    return params, X, Y


# --- CuPy written by hand ------------------------------------------------------------------

def w2_by_hand(xp):
    def f(x, y):
        t = xp.tanh(x)
        e = xp.exp(-(y * y))
        x2 = x * x
        lg = xp.log1p(x2)
        s = xp.sin(y)
        value = xp.sum(t * e + lg * s)
        gx = e * (1 - t * t) + s * 2 * x / (1 + x2)
        gy = -2 * y * t * e + lg * xp.cos(y)
        return value, gx, gy
    return f


def mlp_by_hand(xp):
    def f(W1, b1, W2, b2, X, Y):
        h = xp.tanh(X @ W1 + b1)
        r = h @ W2 + b2 - Y
        loss = xp.mean(r * r)
        dr = r * (2.0 / r.size)
        gW2 = h.T @ dr
        gb2 = dr.sum(axis=0)
        dz = (dr @ W2.T) * (1 - h * h)
        gW1 = X.T @ dz
        gb1 = dz.sum(axis=0)
        return loss, gW1, gb1, gW2, gb2
    return f


# --- PyTorch ----------------------------------------------------------------------------------

def _torch_cuda():
    try:
        import torch
        return torch if torch.cuda.is_available() else None
    except ImportError:
        return None


def w2_torch(torch, compiled=False):
    """torch eager, or torch.compile of the loss (inductor fuses the forward
    and, through AOTAutograd, the backward into Triton kernels)."""
    def loss(x, y):
        return torch.sum(torch.tanh(x) * torch.exp(-y ** 2) + torch.log1p(x ** 2) * torch.sin(y))
    fwd = torch.compile(loss) if compiled else loss

    def f(x, y):
        x = x.detach().requires_grad_(True)
        y = y.detach().requires_grad_(True)
        v = fwd(x, y)
        gx, gy = torch.autograd.grad(v, (x, y))
        return v, gx, gy
    return f


def mlp_torch(torch, compiled=False):
    def loss(W1, b1, W2, b2, X, Y):
        h = torch.tanh(X @ W1 + b1)
        return torch.mean((h @ W2 + b2 - Y) ** 2)
    fwd = torch.compile(loss) if compiled else loss

    def f(W1, b1, W2, b2, X, Y):
        ps = [p.detach().requires_grad_(True) for p in (W1, b1, W2, b2)]
        v = fwd(*ps, X, Y)
        return (v,) + torch.autograd.grad(v, ps)
    return f


def _jax_gpu():
    """jax with a GPU backend, told not to take most of the device's memory."""
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    try:
        import jax
        return jax if jax.default_backend() == "gpu" else None
    except Exception:  # no jax, or no GPU plugin: the row is left out
        return None


def timeit_jax(fn, args, reps, warmup=2):
    for _ in range(warmup):
        fn(*args)[0].block_until_ready()
    t0 = time.perf_counter()
    for _ in range(reps):
        out = fn(*args)
    for o in out:
        o.block_until_ready() if hasattr(o, "block_until_ready") else None
    return (time.perf_counter() - t0) / reps


# --- timing -----------------------------------------------------------------------------------

def _sync(xp):
    xp.cuda.Device().synchronize()


def timeit(fn, args, xp, reps, warmup=2):
    """Seconds per call: mean over ``reps`` back-to-back calls, the device
    synchronised before and after (launches are asynchronous, so this is
    the device's throughput once the host keeps ahead of it)."""
    for _ in range(warmup):
        fn(*args)
    _sync(xp)
    t0 = time.perf_counter()
    for _ in range(reps):
        fn(*args)
    _sync(xp)
    return (time.perf_counter() - t0) / reps


def timeit_torch(fn, args, torch, reps, warmup=2):
    for _ in range(warmup):
        fn(*args)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn(*args)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps


def copy_bandwidth(xp, nbytes, reps):
    """The device's copy bandwidth (bytes read + written per second)."""
    a = xp.ones(nbytes // 4, dtype=np.float32)
    b = xp.empty_like(a)
    t = timeit(lambda: xp.copyto(b, a), (), xp, reps)
    return 2 * a.nbytes / t


def _check(got, want, rtol):
    for g, w in zip(got, want):
        g = g.get() if hasattr(g, "get") else np.asarray(g)
        w = w.get() if hasattr(w, "get") else np.asarray(w)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol)


def run(xp, small, emulated):
    rng = np.random.default_rng(0)
    n = 1 << 14 if small else 16_777_216
    reps = 2 if emulated else (20 if small else 100)
    torch = None if emulated else _torch_cuda()
    jax = None if emulated else _jax_gpu()
    print(f"device: {'CPU emulator (tracegrad.testing), timings meaningless' if emulated else _device_name(xp)}")
    bw = copy_bandwidth(xp, n * 4, reps)
    print(f"measured copy bandwidth: {bw / 1e9:8.1f} GB/s")

    # W2
    x = xp.asarray(rng.uniform(-2, 2, n).astype(np.float32))
    y = xp.asarray(rng.uniform(-2, 2, n).astype(np.float32))
    f_tg = tg.value_and_grad(w2, argnums=(0, 1))
    low = tg.value_and_grad(w2, argnums=(0, 1), backend="cupy").lower(
        np.zeros(n, np.float32), np.zeros(n, np.float32))
    k = codegen_cuda.kernel_count(low.graph)

    def tg_call(a, b):
        v, (gx, gy) = f_tg(a, b)
        return v, gx, gy
    hand = w2_by_hand(xp)
    _check(tg_call(x, y), hand(x, y), 1e-3)
    bytes_min = 16 * n
    # the generated driver called directly: the difference to the row above
    # is what tracegrad's call layer costs on the host
    driver = testing.load_driver(low.source, xp)["value_and_grad"]
    rows = [("tracegrad CUDA", timeit(tg_call, (x, y), xp, reps), f"{k} kernels"),
            ("  driver alone", timeit(driver, (x, y), xp, reps), "generated code, no call layer"),
            ("CuPy by hand", timeit(hand, (x, y), xp, reps), "")]
    if torch is not None:
        tx, ty = (torch.as_tensor(a, device="cuda") for a in (x, y))
        rows.append(("torch", timeit_torch(w2_torch(torch), (tx, ty), torch, reps), ""))
        rows.append(("torch.compile", timeit_torch(w2_torch(torch, True), (tx, ty), torch, reps),
                     "inductor"))
    if jax is not None:
        jx, jy = (jax.device_put(a.get()) for a in (x, y))
        jw2 = jax.jit(jax.value_and_grad(
            lambda a, b: jax.numpy.sum(jax.numpy.tanh(a) * jax.numpy.exp(-b ** 2)
                                       + jax.numpy.log1p(a ** 2) * jax.numpy.sin(b)),
            argnums=(0, 1)))
        rows.append(("jax.jit", timeit_jax(lambda a, b: (lambda v, g: (v,) + g)(*jw2(a, b)),
                                           (jx, jy), reps), ""))
    print(f"\nW2 value+grad, float32[{n}] ({bytes_min / 1e6:.1f} MB minimum traffic)")
    for name, t, note in rows:
        gbs = bytes_min / t
        print(f"  {name:16s} {t * 1e6:10.1f} us  {gbs / 1e9:8.1f} GB/s  "
              f"{100 * gbs / bw:5.1f}% of copy  {note}")

    # MLP step
    params, X, Y = _mlp_inputs(xp, rng)
    f_mlp = tg.value_and_grad(mlp_loss, argnums=(0, 1, 2, 3))
    lowm = tg.value_and_grad(mlp_loss, argnums=(0, 1, 2, 3), backend="cupy").lower(
        *[np.zeros(a.shape, np.float32) for a in (*params, X, Y)])
    km = codegen_cuda.kernel_count(lowm.graph)

    def tg_mlp(*a):
        v, g = f_mlp(*a)
        return (v,) + tuple(g)
    hand_mlp = mlp_by_hand(xp)
    _check(tg_mlp(*params, X, Y), hand_mlp(*params, X, Y), 1e-3)
    driver_mlp = testing.load_driver(lowm.source, xp)["value_and_grad"]
    rows = [("tracegrad CUDA", timeit(tg_mlp, (*params, X, Y), xp, reps),
             f"{km} kernels + {lowm.source.count('np.matmul(')} cuBLAS matmuls"),
            ("  driver alone", timeit(driver_mlp, (*params, X, Y), xp, reps),
             "generated code, no call layer"),
            ("CuPy by hand", timeit(hand_mlp, (*params, X, Y), xp, reps), "")]
    if torch is not None:
        targs = [torch.as_tensor(a, device="cuda") for a in (*params, X, Y)]
        rows.append(("torch", timeit_torch(mlp_torch(torch), targs, torch, reps), ""))
        rows.append(("torch.compile", timeit_torch(mlp_torch(torch, True), targs, torch, reps),
                     "inductor"))
    if jax is not None:
        jargs = [jax.device_put(a.get()) for a in (*params, X, Y)]
        jm = jax.jit(jax.value_and_grad(
            lambda W1, b1, W2, b2, X, Y: jax.numpy.mean(
                (jax.numpy.tanh(X @ W1 + b1) @ W2 + b2 - Y) ** 2), argnums=(0, 1, 2, 3)))
        rows.append(("jax.jit", timeit_jax(lambda *a: (lambda v, g: (v,) + g)(*jm(*a)),
                                           jargs, reps), ""))
    print("\nMLP step (X 256x64, hidden 256, 10 outputs, tanh, MSE), value + 4 gradients")
    for name, t, note in rows:
        print(f"  {name:16s} {t * 1e6:10.1f} us  {note}")


def sweep_grid(xp, n=16_777_216):
    """Time W2's fused kernel alone at a range of grid sizes (the kernel's
    grid-stride loop takes any grid), and print what CuPy reports of the
    kernel's registers and the device's occupancy for it: the data behind
    the driver's choice of grid."""
    rng = np.random.default_rng(0)
    x = xp.asarray(rng.uniform(-2, 2, n).astype(np.float32))
    y = xp.asarray(rng.uniform(-2, 2, n).astype(np.float32))
    low = tg.value_and_grad(w2, argnums=(0, 1), backend="cupy").lower(
        np.zeros(n, np.float32), np.zeros(n, np.float32))
    ns = testing.load_driver(low.source, xp)
    k = ns["_tg_k0"]
    sms = xp.cuda.Device().attributes["MultiProcessorCount"]
    attrs = {a: getattr(k, a, "n/a") for a in ("num_regs", "max_threads_per_block",
                                               "local_size_bytes", "shared_size_bytes")}
    print(f"\nW2 kernel: {attrs}, {sms} SMs, driver grid {ns['_tg_k0_grid']}")
    occ = getattr(xp.cuda.driver, "occupancyMaxActiveBlocksPerMultiprocessor", None)
    if occ is None:
        print("cupy.cuda.driver has no occupancyMaxActiveBlocksPerMultiprocessor")
    else:
        try:
            print(f"occupancy: {occ(k.kernel.ptr, 256, 0)} blocks of 256 per SM")
        except Exception as e:   # the probe's answer is the data: print it
            print(f"occupancy probe failed: {type(e).__name__}: {e}")
    gx, gy = xp.empty_like(x), xp.empty_like(y)
    grids = sorted({sms * b for b in (1, 2, 4, 6, 8, 12, 16, 32)} |
                   {n // (256 * e) for e in (1, 2, 4, 8, 16, 32, 64)})
    for g in grids:
        part = xp.empty(g * 256, np.float32)
        t = timeit(lambda: k((g,), (256,), (x, y, gx, gy, part)), (), xp, 50)
        print(f"  grid {g:7d} ({g / sms:7.1f}/SM): {t * 1e6:8.1f} us  "
              f"{16 * n / t / 1e9:7.1f} GB/s")


def host_overhead(xp):
    """Where a driver call's time goes: the host time of each kind of CuPy
    call a generated driver makes (mean of many calls, device synchronised
    once at the end), and for W2 and the MLP step the CPU time and the GPU
    time of one whole call, from ``cupyx.profiler.benchmark``."""
    from cupyx.profiler import benchmark
    rng = np.random.default_rng(0)
    n = 16_777_216
    x = xp.asarray(rng.uniform(-2, 2, n).astype(np.float32))
    p = xp.zeros(1056 * 256, np.float32)
    small = xp.zeros(256, np.float32)
    k = xp.RawKernel('extern "C" __global__ void k(float* a) {}', "k")
    calls = {
        "cupy.asarray(device array)": lambda: xp.asarray(x),
        "cupy.ascontiguousarray(contiguous)": lambda: xp.ascontiguousarray(x),
        "cupy.empty((16777216,), float32)": lambda: xp.empty((n,), dtype="float32"),
        "RawKernel launch, 1 argument": lambda: k((1,), (256,), (small,)),
        "cupy.sum(270,336 float32)": lambda: xp.sum(p),
        "0-d .reshape(())": lambda: small[0].reshape(()),
        "cupy.matmul(256x64, 64x256)": None,
    }
    A = xp.zeros((256, 64), np.float32)
    B = xp.zeros((64, 256), np.float32)
    calls["cupy.matmul(256x64, 64x256)"] = lambda: xp.matmul(A, B)
    print("\nHost time per CuPy call (us, mean of 2000):")
    for name, fn in calls.items():
        for _ in range(50):
            fn()
        _sync(xp)
        t0 = time.perf_counter()
        for _ in range(2000):
            fn()
        t = (time.perf_counter() - t0) / 2000
        _sync(xp)
        print(f"  {name:38s} {t * 1e6:7.1f}")

    f = tg.value_and_grad(w2, argnums=(0, 1))
    y = xp.asarray(rng.uniform(-2, 2, n).astype(np.float32))
    params, X, Y = _mlp_inputs(xp, rng)
    fm = tg.value_and_grad(mlp_loss, argnums=(0, 1, 2, 3))
    print("\nOne call, cupyx.profiler.benchmark (us, mean of 200): CPU time, GPU time")
    for name, fn, args in (("W2 tracegrad CUDA", f, (x, y)),
                           ("MLP tracegrad CUDA", fm, (*params, X, Y)),
                           ("W2 CuPy by hand", w2_by_hand(xp), (x, y)),
                           ("MLP CuPy by hand", mlp_by_hand(xp), (*params, X, Y))):
        r = benchmark(fn, args, n_repeat=200, n_warmup=10)
        print(f"  {name:24s} CPU {r.cpu_times.mean() * 1e6:8.1f}   "
              f"GPU {r.gpu_times.mean() * 1e6:8.1f}")


def _device_name(xp):
    try:
        props = xp.cuda.runtime.getDeviceProperties(xp.cuda.Device().id)
        name = props["name"]
        return name.decode() if isinstance(name, bytes) else str(name)
    except Exception as e:  # the name is cosmetic; say why it is missing
        return f"CUDA device (name unavailable: {e})"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--emulate", action="store_true",
                   help="run on the CPU through tracegrad.testing's emulator (no GPU needed)")
    p.add_argument("--small", action="store_true", help="small sizes, few repetitions")
    p.add_argument("--host-overhead", action="store_true",
                   help="also time the host side of the CuPy calls drivers make (GPU only)")
    p.add_argument("--sweep-grid", action="store_true",
                   help="also time W2's kernel alone over a range of grid sizes (GPU only)")
    a = p.parse_args(argv)
    if a.emulate:
        with testing.emulated_cupy() as xp:
            run(xp, a.small, True)
        return
    try:
        import cupy as xp
    except ImportError:
        sys.exit("benchmarks/gpu.py needs CuPy and a CUDA GPU (or pass --emulate --small)")
    run(xp, a.small, False)
    if a.sweep_grid:
        sweep_grid(xp)
    if a.host_overhead:
        host_overhead(xp)


if __name__ == "__main__":
    main()
