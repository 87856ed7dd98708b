"""Peak memory of one value-and-gradient call, tracegrad against its peers.

Workloads (value and gradient, as in benchmarks/compare.py):
  W2    sum(tanh(x)*exp(-y**2) + log1p(x**2)*sin(y)), x, y float64[1_000_000],
        gradients for x and y
  W3    two-layer MLP loss (X 256x64, hidden 256, 10 outputs, tanh, MSE),
        gradients for W1, b1, W2, b2
  W3x4  the same MLP, X 1024x64, hidden 512
  loop  10,000 steps of x = x + dt*tanh(x*w) on a float64[1000] state, loss
        sum(x**2), gradients for x0 and w: a Python loop for tracegrad,
        torch and HIPS autograd, lax.fori_loop for jax, a forward pass that
        keeps every state and a hand-written backward pass for NumPy

Systems: "numpy" (forward and backward written by hand), "tg native"
(tracegrad, backend="native"), "tg numpy" (backend="numpy"), "tg eager"
(compile=False), "torch" (eager), "torch.compile" (skipped with a note where
its first call takes over 60 s or fails), "jax" (jax.jit(jax.value_and_grad))
and "autograd" (HIPS); a peer that does not import is left out.

Every (system, workload) runs in a fresh process: import, build the inputs,
one warm-up call (tracegrad and jax compile here), then two more calls:
  * RSS: the process's peak resident memory during the first of them minus
    its resident memory just before it.  The high-water mark is reset by
    writing "5" to /proc/self/clear_refs (Linux); VmHWM is read from
    /proc/self/status after the call.  Where clear_refs is not writable the
    process's ru_maxrss is used instead (the peak since the process began:
    the warm-up's peak included; the table marks it *).  Freed memory must
    leave the process, or the measured call reuses what the warm-up left
    and shows no growth: the worker runs with MALLOC_MMAP_THRESHOLD_=131072
    (large blocks are mmap'ed and unmapped when freed; glibc's sliding
    threshold would keep a freed 8 MB block in the heap; --default-malloc
    keeps glibc's defaults) and calls malloc_trim(0) before the call (the
    heap's free pages of small blocks, such as a loop's 8 KB states, go
    back too).
  * tracemalloc: the peak of Python-traced allocations during the second
    (NumPy registers its array data with tracemalloc; torch's and XLA's
    buffers, and the C buffers of tracegrad's native whole-graph functions,
    are not traced: "-" there).  tracegrad compile=False replays a repeated
    tape's backward as generated code from the third call on, so its two
    columns measure different calls.
The call's results (value and gradients) are part of both peaks; the inputs
are not (they exist before the call: their size is the "inputs" column).
Nothing a system keeps is held between calls by the harness (torch's leaves
drop their .grad after each call).  What tracegrad's native driver keeps
between calls on purpose (intermediate buffers reused by the next call,
docs/native.md) is not growth: the RSS table shows it as "a+k", a the
growth and k the kept buffers, which are resident while the call runs.

For tracegrad's generated code (tg.value_and_grad(f).lower(*args).source,
NumPy target and native driver) the last table counts the values the
generated function computes, those written into a dead value's buffer
(out=), the views, the fresh arrays and the del statements, and, walking the
statements and following which buffer each name holds, the largest total of
buffers held at once, where, how much of it is dead there (no later
statement reads a name holding it), and what that peak would be were every
dead buffer freed at once.  A native whole-graph function (one C call) has
no statements to walk.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OPENBLAS_NUM_THREADS=1 \\
        PYTHONPATH=. /work/sideenv/bin/python benchmarks/memory.py
    python benchmarks/memory.py --tiny --systems numpy,tg-numpy   # smoke test
"""
import os

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import re  # noqa: E402
import resource  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import tracemalloc  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

SYSTEMS = ["numpy", "tg-native", "tg-numpy", "tg-eager", "torch", "torch-compile", "jax",
           "autograd"]
LABELS = {"numpy": "NumPy by hand", "tg-native": "tg native", "tg-numpy": "tg numpy",
          "tg-eager": "tg compile=False", "torch": "torch eager",
          "torch-compile": "torch.compile", "jax": "jax.jit", "autograd": "HIPS autograd"}
WORKLOADS = ["W2", "W3", "W3x4", "loop"]
# sizes: (full, --tiny)
SIZES = {"W2": ({"n": 1_000_000}, {"n": 1000}),
         "W3": ({"batch": 256, "hidden": 256}, {"batch": 16, "hidden": 16}),
         "W3x4": ({"batch": 1024, "hidden": 512}, {"batch": 32, "hidden": 32}),
         "loop": ({"steps": 10_000, "size": 1000}, {"steps": 20, "size": 10})}
DESC = {"W2": "W2 chain x,y[{n}]", "W3": "W3 MLP {batch}x64 h{hidden}",
        "W3x4": "W3x4 MLP {batch}x64 h{hidden}", "loop": "loop {steps} steps [{size}]"}
COMPILE_LIMIT_S = 60     # torch.compile's first call longer than this: skipped
DT = 0.01
MiB = 2.0 ** 20


# --- the workloads, as each system writes them ---------------------------------------------

def chain(x, y):
    import numpy as np
    return np.sum(np.tanh(x) * np.exp(-y ** 2) + np.log1p(x ** 2) * np.sin(y))


def chain_by_hand(x, y):
    import numpy as np
    t = np.tanh(x)
    e = np.exp(-y * y)
    l1 = np.log1p(x * x)
    s = np.sin(y)
    f = np.sum(t * e + l1 * s)
    gx = (1 - t * t) * e + 2 * x / (1 + x * x) * s
    gy = -2 * y * t * e + l1 * np.cos(y)
    return f, gx, gy


def mlp(W1, b1, W2, b2, X, Y):
    import numpy as np
    h = np.tanh(X @ W1 + b1)
    return np.mean((h @ W2 + b2 - Y) ** 2)


def mlp_by_hand(W1, b1, W2, b2, X, Y):
    import numpy as np
    h = np.tanh(X @ W1 + b1)
    r = h @ W2 + b2 - Y
    f = np.mean(r * r)
    d = (2.0 / r.size) * r
    gW2 = h.T @ d
    gb2 = d.sum(0)
    dh = (d @ W2.T) * (1 - h * h)
    return f, X.T @ dh, dh.sum(0), gW2, gb2


def make_loop(np_mod, steps):
    """x = x + dt*tanh(x*w), ``steps`` times, as a Python loop over np_mod."""
    def loop(x, w):
        for _ in range(steps):
            x = x + DT * np_mod.tanh(x * w)
        return np_mod.sum(x * x)
    return loop


def loop_by_hand(x0, w, steps):
    """The loop's value and gradients: every state kept, the backward
    pass recomputes tanh from them."""
    import numpy as np
    xs = [x0]
    x = x0
    for _ in range(steps):
        x = x + DT * np.tanh(x * w)
        xs.append(x)
    f = np.sum(x * x)
    gx = 2 * x
    gw = np.zeros_like(w)
    for i in range(steps - 1, -1, -1):
        xi = xs[i]
        xs[i + 1] = None        # no longer needed
        t = np.tanh(xi * w)
        k = DT * (1 - t * t) * gx
        gw += k * xi
        gx = gx + k * w
    return f, gx, gw


def inputs(workload, size):
    """The NumPy inputs and the argnums differentiated."""
    import numpy as np
    rng = np.random.default_rng(0)
    if workload == "W2":
        return [rng.standard_normal(size["n"]), rng.standard_normal(size["n"])], (0, 1)
    if workload in ("W3", "W3x4"):
        b, h = size["batch"], size["hidden"]
        return [rng.standard_normal((64, h)) * 0.1, np.zeros(h), rng.standard_normal((h, 10)) * 0.1,
                np.zeros(10), rng.standard_normal((b, 64)), rng.standard_normal((b, 10))], (0, 1, 2, 3)
    if workload == "loop":
        return [rng.standard_normal(size["size"]), rng.standard_normal(size["size"])], (0, 1)
    raise ValueError(workload)


def build(system, workload, size):
    """(call, numpy inputs): call() runs one value-and-gradient call and
    returns its results (finished: jax is waited for)."""
    import numpy as np
    args, argnums = inputs(workload, size)
    steps = size.get("steps")
    if system == "numpy":
        if workload == "W2":
            return lambda: chain_by_hand(*args), args
        if workload.startswith("W3"):
            return lambda: mlp_by_hand(*args), args
        return lambda: loop_by_hand(*args, steps), args
    if system.startswith("tg-"):
        import tracegrad as tg
        fn = {"W2": chain, "W3": mlp, "W3x4": mlp}.get(workload) or make_loop(np, steps)
        kw = {"tg-native": {"backend": "native"}, "tg-numpy": {"backend": "numpy"},
              "tg-eager": {"compile": False}}[system]
        vg = tg.value_and_grad(fn, argnums=argnums, **kw)
        return lambda: vg(*args), args
    if system in ("torch", "torch-compile"):
        import torch
        torch.set_num_threads(1)
        ts = [torch.tensor(a, requires_grad=i in argnums) for i, a in enumerate(args)]
        if workload == "W2":
            def f(a, b):
                return torch.sum(torch.tanh(a) * torch.exp(-b ** 2) + torch.log1p(a ** 2) * torch.sin(b))
        elif workload.startswith("W3"):
            def f(W1, b1, W2, b2, X, Y):
                return torch.mean((torch.tanh(X @ W1 + b1) @ W2 + b2 - Y) ** 2)
        else:
            f = make_loop(torch, steps)
        if system == "torch-compile":
            f = torch.compile(f)
        diff = [ts[i] for i in argnums]

        def call():
            v = f(*ts)
            v.backward()
            gs = [t.grad for t in diff]
            for t in diff:      # the leaves hold no gradient between calls
                t.grad = None
            return v.detach(), gs
        return call, args
    if system == "jax":
        import jax
        jax.config.update("jax_enable_x64", True)
        import jax.numpy as jnp
        if workload == "W2":
            def f(x, y):
                return jnp.sum(jnp.tanh(x) * jnp.exp(-y ** 2) + jnp.log1p(x ** 2) * jnp.sin(y))
        elif workload.startswith("W3"):
            def f(W1, b1, W2, b2, X, Y):
                return jnp.mean((jnp.tanh(X @ W1 + b1) @ W2 + b2 - Y) ** 2)
        else:
            def f(x, w):
                x = jax.lax.fori_loop(0, steps, lambda i, x: x + DT * jnp.tanh(x * w), x)
                return jnp.sum(x * x)
        jf = jax.jit(jax.value_and_grad(f, argnums=argnums))
        ja = [jnp.asarray(a) for a in args]
        jax.block_until_ready(ja)
        return lambda: jax.block_until_ready(jf(*ja)), args
    if system == "autograd":
        import autograd
        import autograd.numpy as anp
        if workload == "W2":
            def f(x, y):
                return anp.sum(anp.tanh(x) * anp.exp(-y ** 2) + anp.log1p(x ** 2) * anp.sin(y))
        elif workload.startswith("W3"):
            def f(W1, b1, W2, b2, X, Y):
                return anp.mean((anp.tanh(anp.dot(X, W1) + b1) @ W2 + b2 - Y) ** 2)
        else:
            f = make_loop(anp, steps)
        vg = autograd.value_and_grad(f, argnum=argnums)
        return lambda: vg(*args), args
    raise ValueError(system)


# --- measuring, in the worker process -----------------------------------------------------

def _status_kib(field):
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def _reset_hwm():
    """Reset the peak-RSS mark; False where the kernel does not let us."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def blas_kernel():
    """threadpoolctl's description of the BLAS NumPy loaded, else NumPy's
    build configuration."""
    import numpy as np
    try:
        import threadpoolctl
        info = [i for i in threadpoolctl.threadpool_info() if i.get("user_api") == "blas"]
        if info:
            i = info[0]
            return (f"{i.get('internal_api')} {i.get('version')} {i.get('architecture')} "
                    f"threads={i.get('num_threads')} (threadpoolctl)")
    except Exception:
        pass
    try:
        cfg = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        what = f"{cfg.get('name')} {cfg.get('version')}"
    except Exception:  # noqa: BLE001
        what = "unknown BLAS"
    # no threadpoolctl: ask the loaded OpenBLAS for its kernel, as threadpoolctl does
    try:
        import ctypes
        with open("/proc/self/maps") as fh:
            libs = sorted({ln.split()[-1] for ln in fh if "openblas" in ln.lower() and ".so" in ln})
        for path in libs:
            lib = ctypes.CDLL(path)
            for sym in ("scipy_openblas_get_corename64_", "openblas_get_corename64_",
                        "scipy_openblas_get_corename", "openblas_get_corename"):
                fn = getattr(lib, sym, None)
                if fn is not None:
                    fn.restype = ctypes.c_char_p
                    return f"{what} {fn().decode()} (OpenBLAS's get_corename; no threadpoolctl)"
    except Exception:  # noqa: BLE001
        pass
    return f"{what} (numpy build config; no threadpoolctl)"


def _malloc_trim():
    """glibc's malloc_trim(0): free pages anywhere in the heap go back to the
    system.  False where there is no glibc."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        return True
    except (OSError, AttributeError):
        return False


class _Timeout(Exception):
    pass


def worker(system, workload, tiny):
    size = SIZES[workload][1 if tiny else 0]
    out = {"system": system, "workload": workload}
    call, args = build(system, workload, size)
    out["inputs"] = sum(a.nbytes for a in args)
    t0 = time.perf_counter()
    if system == "torch-compile":
        def alarm(*_):
            raise _Timeout()
        signal.signal(signal.SIGALRM, alarm)
        signal.alarm(COMPILE_LIMIT_S)
        try:
            r = call()
        except _Timeout:
            out["skipped"] = f"first call > {COMPILE_LIMIT_S} s"
            return out
        except Exception as e:  # noqa: BLE001
            if "_Timeout" in f"{type(e).__name__} {e}":     # the alarm, wrapped by Inductor
                out["skipped"] = f"first call > {COMPILE_LIMIT_S} s"
            else:
                out["skipped"] = f"fails: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:80]}"
            return out
        finally:
            signal.alarm(0)
    else:
        r = call()
    out["warmup_s"] = time.perf_counter() - t0
    del r
    gc.collect()
    # (b) RSS growth of one call; first the heap's free pages go back to the
    # system (else a call reuses the pages the warm-up left and shows no growth)
    out["malloc_trim"] = _malloc_trim()
    before = _status_kib("VmRSS")
    out["clear_refs"] = _reset_hwm()
    r = call()
    if out["clear_refs"]:
        peak = _status_kib("VmHWM")
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss    # KiB on Linux
    out["rss"] = max(peak - before, 0) * 1024
    del r
    gc.collect()
    # (a) tracemalloc peak of one more call
    tracemalloc.start()
    r = call()
    out["traced"] = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    del r
    out["blas"] = blas_kernel()
    if system in ("tg-numpy", "tg-native"):
        try:
            out["plan"] = plan_report(system, workload, size)
        except Exception as e:  # noqa: BLE001
            out["plan"] = {"error": f"{type(e).__name__}: {e}"}
    # torch's and XLA's buffers, and a native whole-graph function's C
    # buffers, are not traced
    out["traced_meaningful"] = system not in ("torch", "torch-compile", "jax") and \
        not out.get("plan", {}).get("whole C function")
    return out


# --- what the generated code holds ----------------------------------------------------------

_STMT = re.compile(r"^    (t\d+|_b\d+) = (.*?)  # %(\d+) (\S+?):?(?= |$)(.*)")
_YS = re.compile(r"^    _(t\d+)_y\d+ = np\.empty\((\(.*?\)), dtype=np\.(\w+)\)")
_TUPLE = re.compile(r"^    (t\d+) = \((.*)\)$")
_DEL = re.compile(r"^    del (.*)$")
_NAME = re.compile(r"\b(?:t|_b)\d+\b")


def source_liveness(source, graph, kept_sizes=None):
    """Walk the generated function ``value_and_grad`` statement by statement
    and follow the buffers its names hold: a fresh result is a new buffer; a
    result written with out= lives in that buffer; a view (transpose,
    reshape, a proj of a loop's tuple) shares its operand's; a loop's
    stacked outputs (np.empty) are the loop's buffer; the native driver's
    ``_s[k]`` are kept between calls.  A buffer is dead once no name that
    holds it is read again.  Returns the counts of values, of those written
    into a dead buffer (out=), of views, of fresh arrays, of kept buffers and
    of del statements; the largest total of buffers held at once (kept ones
    included), where, and how much of it is dead there and by which names.
    Statements inside loops are not followed (a loop body's arrays live for
    one step)."""
    import ast
    import numpy as np
    from tracegrad.ops import primitives
    lines = source.splitlines()
    try:
        start = next(i for i, ln in enumerate(lines) if ln.startswith("def value_and_grad("))
    except StopIteration:
        return None
    body = []
    for ln in lines[start + 1:]:
        if ln and not ln.startswith(" "):
            break
        body.append(ln)
    # (kind, name, reads, node, op, detail)
    stmts = []
    for ln in body:
        m = _STMT.match(ln)
        if m:
            name, expr, node, op = m.group(1), m.group(2), int(m.group(3)), m.group(4)
            into = re.search(r"out=(t\d+)", expr)
            # the native driver: a kernel's output over an operand or a dead buffer
            if into is None and re.fullmatch(r"t\d+", expr) and \
                    re.match(r" (over|into the buffer of) %", m.group(5)):
                into = re.match(r"(t\d+)", expr)
            reads = set(_NAME.findall(expr)) - {name}
            if expr.startswith("_s[") or "out=_s[" in expr:
                kind = "kept"
                into = re.search(r"_s\[(\d+)\]", expr)
            elif into is not None:
                kind = "into"
            else:
                try:
                    view = primitives.get(op).aliases_operands
                except Exception:  # noqa: BLE001  (proj, scan, ...)
                    view = op == "proj"
                kind = "view" if view else "fresh"
            stmts.append((kind, name, reads, node, op, into.group(1) if into else None))
            continue
        m = _YS.match(ln)
        if m:
            n = int(np.prod(ast.literal_eval(m.group(2)))) * np.dtype(m.group(3)).itemsize
            stmts.append(("ys", m.group(1), set(), None, "scan", n))
            continue
        m = _TUPLE.match(ln)
        if m:
            stmts.append(("tuple", m.group(1), set(_NAME.findall(m.group(2))), None, "scan", None))
            continue
        m = _DEL.match(ln)
        if m:
            stmts.append(("del", None, set(_NAME.findall(m.group(1))), None, None, None))
            continue
        s = ln.strip()
        if s and not s.startswith("#") and _NAME.search(s):
            # return, a kernel call, a loop's lines: reads only
            stmts.append(("read", None, set(_NAME.findall(s)), None, None, None))
    last_read = {}
    for i, s in enumerate(stmts):
        if s[0] != "del":
            for u in s[2]:
                last_read[u] = i
    buf = {}        # name -> the buffer it holds (None: an input's memory, a scalar)
    size = {}       # buffer -> bytes
    kept = set()    # buffers kept between calls
    bound = set()
    counts = {"values": 0, "into dead buffer": 0, "views": 0, "fresh arrays": 0, "kept": 0,
              "del": 0}
    peak, peak_dead, peak_at, peak_dead_names = 0, 0, None, []
    peak_live = 0       # the same, were every dead buffer freed at once
    for i, s in enumerate(stmts):
        kind, name, reads, node, op, detail = s
        if kind == "del":
            counts["del"] += 1
            bound -= reads
            continue
        if kind == "read":
            continue
        if kind == "ys":
            size[name] = size.get(name, 0) + detail
            buf["_" + name] = name
            bound.add("_" + name)
            last_read["_" + name] = max(last_read.get(name, i), i)
        elif kind == "tuple":
            buf[name] = name if name in size else None
            bound.discard("_" + name)
        else:
            counts["values"] += 1
            d = graph.nodes[node] if node in graph.nodes else {}
            shape = d.get("shape")
            nbytes = int(np.prod(shape)) * np.dtype(d.get("dtype", "float64")).itemsize \
                if shape is not None else 0
            if kind == "into" and detail in buf:
                counts["into dead buffer"] += 1
                buf[name] = buf.get(detail)
            elif kind == "view":
                counts["views"] += 1
                base = [u for u in sorted(reads) if buf.get(u) is not None]
                buf[name] = buf[base[0]] if base else None
            elif kind == "kept":
                # one kept buffer may serve several names (the native
                # driver's row blocks): its size is the _Scratch entry's
                key = f"_s[{detail}]"
                if key not in size:
                    counts["kept"] += 1
                    size[key] = kept_sizes[int(detail)] if kept_sizes else nbytes
                buf[name] = key
                kept.add(key)
            else:
                counts["fresh arrays"] += 1
                buf[name], size[name] = name, nbytes
        if name:
            bound.add(name)
        held = {buf[u] for u in bound if buf.get(u) is not None}
        live = {buf[u] for u in bound if buf.get(u) is not None and last_read.get(u, -1) >= i}
        total = sum(size[b] for b in held)
        peak_live = max(peak_live, sum(size[b] for b in live | ({buf.get(name)} - {None})
                                       if b in size) + sum(size[b] for b in kept - live))
        if total > peak + 1024:     # (not a later 0-d value on top of the same arrays)
            dead = sorted(b for b in held - live if b not in kept)
            peak, peak_at = total, f"%{node} {op} ({name})" if node is not None else f"{op} ({name})"
            peak_dead, peak_dead_names = sum(size[b] for b in dead), dead
    counts.update({"peak bound": peak, "peak live": peak_live, "dead at peak": peak_dead,
                   "peak at": peak_at,
                   "dead names": peak_dead_names})
    return counts


def plan_report(system, workload, size):
    import numpy as np
    import tracegrad as tg
    args, argnums = inputs(workload, size)
    fn = {"W2": chain, "W3": mlp, "W3x4": mlp}.get(workload) or make_loop(np, size["steps"])
    backend = "native" if system == "tg-native" else "numpy"
    low = tg.value_and_grad(fn, argnums=argnums, backend=backend).lower(*args)
    src = low.source
    rep = {"backend": backend, "lines": len(src.splitlines()),
           "whole C function": "_tg_whole(" in src or "tg_whole" in src.split("def value_and_grad")[-1]}
    # the native driver's buffers kept from one call to the next
    import ast
    kept, kept_sizes = 0, None
    for m in re.finditer(r"^_scratch_(\w+) = _Scratch\((.*)\)$", src, re.M):
        sizes = [int(np.prod(shape)) * np.dtype(dt).itemsize
                 for shape, dt in ast.literal_eval(m.group(2))]
        kept += sum(sizes)
        if m.group(1) == "value_and_grad":
            kept_sizes = sizes
    rep["kept between calls"] = kept
    live = source_liveness(src, low.graph, kept_sizes)
    if live:
        rep.update(live)
    return rep


# --- the driver -------------------------------------------------------------------------------

def run_one(system, workload, tiny, default_malloc, python):
    env = dict(os.environ)
    if not default_malloc:
        env["MALLOC_MMAP_THRESHOLD_"] = "131072"
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    cmd = [python, os.path.abspath(__file__), "--worker", system, workload]
    if tiny:
        cmd.append("--tiny")
    limit = COMPILE_LIMIT_S + 60 if system == "torch-compile" else 900
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        return {"system": system, "workload": workload, "skipped": f"no result in {limit} s"}
    wall = time.perf_counter() - t0
    for ln in reversed(p.stdout.splitlines()):
        if ln.startswith("RESULT "):
            r = json.loads(ln[7:])
            r["wall_s"] = wall
            return r
    err = (p.stderr.strip().splitlines() or ["no output"])[-1]
    return {"system": system, "workload": workload, "skipped": f"failed: {err[:100]}"}


def importable(system, python):
    mod = {"torch": "torch", "torch-compile": "torch", "jax": "jax", "autograd": "autograd"}.get(system)
    if mod is None:
        return True
    return subprocess.run([python, "-c", f"import {mod}"], capture_output=True).returncode == 0


def fmt(v, meaningful=True):
    if v is None:
        return ""
    if not meaningful:
        return "-"
    return f"{v / MiB:.1f}" if v >= 10 * MiB else f"{v / MiB:.2f}"


def table(results, systems, workloads, key, title, tiny):
    cols = ["inputs"] + [LABELS[s] for s in systems]
    lines = [f"{title}", "",
             "| workload | " + " | ".join(cols) + " |",
             "| --- |" + " ---: |" * len(cols)]
    for w in workloads:
        size = SIZES[w][1 if tiny else 0]
        row = [DESC[w].format(**size)]
        inp = next((r.get("inputs") for r in results if r["workload"] == w and "inputs" in r), None)
        row.append(fmt(inp))
        for s in systems:
            r = next((r for r in results if r["workload"] == w and r["system"] == s), None)
            if r is None or "skipped" in r:
                row.append("skip" if r is not None else "")
            elif key == "traced":
                row.append(fmt(r["traced"], r.get("traced_meaningful", True)))
            else:
                kept = r.get("plan", {}).get("kept between calls")
                row.append(fmt(r[key]) + (f"+{fmt(kept)}" if kept else "")
                           + ("" if r.get("clear_refs", True) else "*"))
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", nargs=2, metavar=("SYSTEM", "WORKLOAD"), help=argparse.SUPPRESS)
    ap.add_argument("--tiny", action="store_true", help="tiny sizes (a smoke test)")
    ap.add_argument("--systems", default=",".join(SYSTEMS),
                    help="comma-separated, of: " + ", ".join(SYSTEMS))
    ap.add_argument("--workloads", default=",".join(WORKLOADS),
                    help="comma-separated, of: " + ", ".join(WORKLOADS))
    ap.add_argument("--default-malloc", action="store_true",
                    help="keep glibc's sliding mmap threshold in the workers")
    ap.add_argument("--python", default=sys.executable, help="the workers' interpreter")
    ap.add_argument("--jobs", type=int, default=1,
                    help="worker processes at once (each measures its own process: the "
                         "memory columns do not depend on it, the warm-up times do)")
    ap.add_argument("--json", help="also write the results to this file")
    ap.add_argument("--from-json", help="print the tables of a --json file (no runs)")
    a = ap.parse_args()
    if a.worker:
        print("RESULT " + json.dumps(worker(a.worker[0], a.worker[1], a.tiny)), flush=True)
        return
    if a.from_json:
        with open(a.from_json) as fh:
            saved = json.load(fh)
        if isinstance(saved, list):     # the results alone
            saved = {"results": saved}
        results = saved["results"]
        order = [s for s in SYSTEMS if any(r["system"] == s for r in results)]
        loads = [w for w in WORKLOADS if any(r["workload"] == w for r in results)]
        report(results, saved.get("systems", order), saved.get("workloads", loads),
               saved.get("tiny", a.tiny), saved.get("default_malloc", a.default_malloc),
               saved.get("missing", []))
        return
    systems = [s.strip() for s in a.systems.split(",") if s.strip()]
    workloads = [w.strip() for w in a.workloads.split(",") if w.strip()]
    for s in systems:
        if s not in SYSTEMS:
            ap.error(f"unknown system {s!r}")
    for w in workloads:
        if w not in WORKLOADS:
            ap.error(f"unknown workload {w!r}")
    if not os.path.exists("/proc/self/status"):
        print("no /proc/self/status: this benchmark reads Linux's /proc")
        sys.exit(2)
    missing = [s for s in systems if not importable(s, a.python)]
    systems = [s for s in systems if s not in missing]
    from concurrent.futures import ThreadPoolExecutor

    def one(ws):
        w, s = ws
        r = run_one(s, w, a.tiny, a.default_malloc, a.python)
        note = r.get("skipped") or (f"rss {r['rss'] / MiB:.1f} MiB, traced "
                                    f"{r['traced'] / MiB:.1f} MiB, warm-up "
                                    f"{r['warmup_s']:.2f} s")
        print(f"  {w:5s} {s:14s} {note}", file=sys.stderr, flush=True)
        return r
    with tempfile.TemporaryDirectory() as cache:
        os.environ["TRACEGRAD_CACHE_DIR"] = cache
        with ThreadPoolExecutor(max(1, a.jobs)) as ex:
            results = list(ex.map(one, [(w, s) for w in workloads for s in systems]))
    report(results, systems, workloads, a.tiny, a.default_malloc, missing)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"results": results, "systems": systems, "workloads": workloads,
                       "tiny": a.tiny, "default_malloc": a.default_malloc, "missing": missing},
                      fh, indent=1)


def report(results, systems, workloads, tiny, default_malloc, missing):
    blas = next((r["blas"] for r in results if "blas" in r), "unknown")
    print(f"machine: {platform.machine()} {_cpu_name()}, {os.cpu_count()} cores, "
          f"Linux {platform.release()}, Python {platform.python_version()}")
    print(f"BLAS: {blas}")
    print(f"glibc malloc: {'defaults' if default_malloc else 'MALLOC_MMAP_THRESHOLD_=131072'}")
    measured = [r for r in results if "clear_refs" in r]
    if measured and all(r["clear_refs"] for r in measured):
        print("peak RSS: high-water mark reset through /proc/self/clear_refs, then VmHWM")
    elif measured:
        print("peak RSS: /proc/self/clear_refs not writable in some workers: ru_maxrss there "
              "(the peak since the process began, warm-up included; marked *)")
    if missing:
        print("not importable here (left out): " + ", ".join(LABELS[s] for s in missing))
    print()
    print(table(results, systems, workloads, "rss",
                "Peak RSS growth during one call (MiB; a+k: the native driver's a, and k "
                "held between calls; * = ru_maxrss, since process start)", tiny))
    print()
    print(table(results, systems, workloads, "traced",
                "tracemalloc peak of one call (MiB; NumPy-side allocations; - = not traced)", tiny))
    skipped = [r for r in results if "skipped" in r]
    if skipped:
        print()
        for r in skipped:
            print(f"skip: {LABELS[r['system']]} on {r['workload']}: {r['skipped']}")
    plans = [r for r in results if "plan" in r]
    if plans:
        print()
        print("tracegrad's generated code (value_and_grad(f).lower(*args).source): the values the "
              "generated function computes; of them written into a dead value's buffer (out=), "
              "views, fresh arrays and buffers kept between calls (native); del statements; the "
              "largest total of buffers held at once, how much of it is dead there (no later "
              "statement reads it), where, and that peak were every dead buffer freed at once")
        print()
        print("| workload | target | values | out= | views | fresh | kept | del | peak held MiB "
              "| dead at peak MiB | peak at | peak, dead freed MiB | kept between calls MiB "
              "| whole C function |")
        print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: "
              "| ---: | --- |")
        for r in plans:
            p = r["plan"]
            if "error" in p:
                print(f"| {r['workload']} | {p.get('backend', r['system'])} | {p['error']} |")
                continue
            if p.get("whole C function"):
                print(f"| {r['workload']} | {p['backend']} | (one C call) | | | | | | | | | "
                      f"| {p['kept between calls'] / MiB:.2f} | {p['whole C function']} |")
                continue
            print(f"| {r['workload']} | {p['backend']} | {p['values']} | {p['into dead buffer']} | "
                  f"{p['views']} | {p['fresh arrays']} | {p['kept']} | {p['del']} | "
                  f"{p['peak bound'] / MiB:.2f} | "
                  f"{p['dead at peak'] / MiB:.2f} | {p['peak at']} | {p['peak live'] / MiB:.2f} | "
                  f"{p['kept between calls'] / MiB:.2f} | {p['whole C function']} |")


def _cpu_name():
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


if __name__ == "__main__":
    main()
