"""tg.grad / tg.value_and_grad / tg.compile on dask arrays: the value and
gradient of a sum or mean over rows, computed one Dask task per chunk, equal
the single-machine NumPy result; losses that mix rows are refused with the
op and the source line; a worker killed mid-call does not change the result.

One LocalCluster (2 worker processes, 1 thread each, loopback) serves the
module; the threaded scheduler runs the same losses without a Client."""
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

da = pytest.importorskip("dask.array")
dask = pytest.importorskip("dask")
distributed = pytest.importorskip("distributed")

import tracegrad as tg
from tracegrad.runtime.distributed import NotSeparableError

RTOL = 1e-10
N, D, K, H = 1003, 4, 3, 6
UNEVEN = (300, 250, 453)


# --- losses: sums and means over the rows of per-row terms ---------------------------

def least_squares(w, x, y):
    return np.mean((x @ w - y) ** 2)


def logistic(w, x, y):
    z = x @ w
    return np.sum(np.logaddexp(0.0, z) - y * z)


def softmax_ce(W, x, Y):
    z = x @ W
    z = z - np.max(z, axis=1, keepdims=True)
    logp = z - np.log(np.sum(np.exp(z), axis=1, keepdims=True))
    return -np.mean(np.sum(Y * logp, axis=1))


def mlp(params, x, y):
    W1, b1, W2, b2 = params
    h = np.tanh(x @ W1 + b1)
    out = (h @ W2 + b2)[:, 0]
    return 0.5 * np.mean((out - y) ** 2) + 0.1 * np.sum(np.abs(out - y))


# NumPy-only references: the same mathematics written without tracegrad
def ref_least_squares(w, x, y):
    r = x @ w - y
    return np.mean(r ** 2), 2 * x.T @ r / len(y)


def ref_logistic(w, x, y):
    z = x @ w
    return np.sum(np.logaddexp(0.0, z) - y * z), x.T @ (1 / (1 + np.exp(-z)) - y)


def ref_softmax_ce(W, x, Y):
    z = x @ W
    z = z - z.max(axis=1, keepdims=True)
    p = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    return -np.mean(np.sum(Y * np.log(p), axis=1)), x.T @ (p - Y) / len(Y)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(14)
    x = rng.normal(size=(N, D))
    w = rng.normal(size=D)
    y = x @ w + 0.1 * rng.normal(size=N)
    yb = (rng.random(N) < 1 / (1 + np.exp(-(x @ w)))).astype(np.float64)
    Y = np.eye(K)[rng.integers(0, K, N)]
    params = (rng.normal(size=(D, H)), rng.normal(size=H), rng.normal(size=(H, 1)),
              rng.normal(size=1))
    return dict(x=x, y=y, yb=yb, Y=Y, w=rng.normal(size=D), W=rng.normal(size=(D, K)),
                params=params)


def chunked(a, rows=UNEVEN):
    return da.from_array(a, chunks=(rows,) + a.shape[1:])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A LocalCluster of 2 processes on loopback, with its own tracegrad cache."""
    import dask
    from distributed import LocalCluster
    old = os.environ.get("TRACEGRAD_CACHE_DIR")
    os.environ["TRACEGRAD_CACHE_DIR"] = str(tmp_path_factory.mktemp("tg-cache"))
    # Dask's scratch space in pytest's folder, for the workers too (they read
    # the environment), not in the temporary folder
    scratch = str(tmp_path_factory.mktemp("dask-scratch"))
    os.environ["DASK_TEMPORARY_DIRECTORY"] = scratch
    dask.config.set({"temporary-directory": scratch})
    try:
        c = LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                         host="127.0.0.1", dashboard_address=None, silence_logs=40,
                         local_directory=scratch)
    except Exception as e:   # a sandbox without sockets or process spawning
        pytest.skip(f"cannot start a LocalCluster here: {e}")
    yield c
    c.close()
    if old is None:
        os.environ.pop("TRACEGRAD_CACHE_DIR", None)
    else:
        os.environ["TRACEGRAD_CACHE_DIR"] = old


@pytest.fixture(scope="module")
def client(cluster):
    from distributed import Client
    with Client(cluster) as c:
        yield c


@pytest.fixture(params=["threads", "distributed"])
def engine(request):
    """Run the test on the threaded scheduler, or with the Client active."""
    if request.param == "threads":
        with dask.config.set(scheduler="threads"):
            yield None
    else:
        yield request.getfixturevalue("client")


def check(f, ref, args, dargs):
    v, g = tg.value_and_grad(f)(*dargs)
    rv, rg = ref(*args)
    assert isinstance(v, (float, np.floating)) and isinstance(g, np.ndarray)
    np.testing.assert_allclose(v, rv, rtol=RTOL)
    np.testing.assert_allclose(g, rg, rtol=RTOL, atol=1e-13)
    np.testing.assert_allclose(tg.grad(f)(*dargs), rg, rtol=RTOL, atol=1e-13)
    np.testing.assert_allclose(tg.compile(f)(*dargs), rv, rtol=RTOL)


def test_least_squares_mean_uneven_chunks(engine, data):
    x, y, w = data["x"], data["y"], data["w"]
    check(least_squares, ref_least_squares, (w, x, y), (w, chunked(x), chunked(y)))


def test_logistic(engine, data):
    x, yb, w = data["x"], data["yb"], data["w"]
    check(logistic, ref_logistic, (w, x, yb), (w, chunked(x, 200), chunked(yb, 200)))


def test_softmax_cross_entropy(engine, data):
    x, Y, W = data["x"], data["Y"], data["W"]
    check(softmax_ce, ref_softmax_ce, (W, x, Y), (W, chunked(x), chunked(Y)))


def test_mlp_matches_single_machine(engine, data):
    """An MLP with a parameter tuple (a mean plus a sum over rows): equal to
    tracegrad on the whole data in one process, and to finite differences."""
    x, y, p = data["x"], data["y"], data["params"]
    v, g = tg.value_and_grad(mlp)(p, chunked(x), chunked(y))
    v1, g1 = tg.value_and_grad(mlp)(p, x, y)
    np.testing.assert_allclose(v, v1, rtol=RTOL)
    assert isinstance(g, tuple) and len(g) == 4
    for a, b in zip(g, g1):
        assert isinstance(a, np.ndarray) and a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=1e-13)
    e = np.zeros_like(p[0])
    e[1, 2] = 1e-6
    fd = (mlp((p[0] + e,) + p[1:], x, y) - mlp((p[0] - e,) + p[1:], x, y)) / 2e-6
    assert g[0][1, 2] == pytest.approx(fd, rel=1e-6)


def test_mean_over_the_batch_axis_divides_by_all_rows(engine, data):
    """A mean over the rows only (other axes kept), with the rows on axis 0
    or axis 1 and uneven chunks: divided by all the rows, not per chunk."""
    x, w = data["x"], data["w"]
    means = tg.compile(lambda x: np.mean(x, axis=0))(chunked(x))
    assert isinstance(means, np.ndarray) and means.shape == (D,)
    np.testing.assert_allclose(means, x.mean(axis=0), rtol=RTOL)
    # averaging the chunks' own means would be wrong here: the chunks differ in size
    starts = np.cumsum((0,) + UNEVEN[:-1])
    per_chunk = np.mean([x[a:a + n].mean(axis=0) for a, n in zip(starts, UNEVEN)], axis=0)
    assert not np.allclose(per_chunk, x.mean(axis=0), rtol=1e-6)

    def second_moments(w, xt):                 # xt: features x rows
        return np.sum(w * np.mean(xt ** 2, axis=1))

    xt = da.from_array(np.ascontiguousarray(x.T), chunks=(D, UNEVEN))
    v, g = tg.value_and_grad(second_moments)(w, xt)
    np.testing.assert_allclose(v, w @ np.mean(x ** 2, axis=0), rtol=RTOL)
    np.testing.assert_allclose(g, np.mean(x ** 2, axis=0), rtol=RTOL)


def test_rows_along_axis_one_and_argnums(data):
    """The rows may be axis 1 (the chunked axis); argnums picks the parameter."""
    with dask.config.set(scheduler="threads"):
        x, y, w = data["x"], data["y"], data["w"]

        def loss(xt, w, y):          # xt: features x rows
            return np.sum((w @ xt - y) ** 2)

        xt = da.from_array(np.ascontiguousarray(x.T), chunks=(D, 400))
        g = tg.grad(loss, argnums=1)(xt, w, chunked(y, 400))
        np.testing.assert_allclose(g, 2 * x.T @ (x @ w - y), rtol=RTOL)


def test_special_functions_work_row_by_row(data):
    # elementwise special functions without a C expression (erfinv, the
    # incomplete gamma function) are per-row terms like any ufunc
    from tracegrad.scipy import special
    with dask.config.set(scheduler="threads"):
        x, y, w = data["x"], data["y"], data["w"]

        def loss(w, x, y):
            p = 0.5 + 0.4 * np.tanh(x @ w)          # in (0.1, 0.9)
            return np.sum(special.erfinv(p) * y) + np.mean(special.gammaincc(2.0, p + 1.0))
        v, g = tg.value_and_grad(loss)(w, chunked(x, 400), chunked(y, 400))
        v_ref, g_ref = tg.value_and_grad(loss)(w, x, y)
        np.testing.assert_allclose(v, v_ref, rtol=RTOL)
        np.testing.assert_allclose(g, g_ref, rtol=RTOL)


def test_reshapes_indexing_and_several_outputs(data):
    """A reshape and an index that keep the rows whole are replayed with each
    chunk's row count; tg.compile may return several sums over rows."""
    x, y, w = data["x"], data["y"], data["w"]

    def loss(w, x, y2):
        z = (x[..., None] * w[None, :, None])[:, :, 0]           # (n, D)
        r = np.sum(z, axis=1).reshape(-1, 1) - y2                # (n, 1)
        return np.mean(np.broadcast_to(r, (r.shape[0], 2)) ** 2)

    y2 = y.reshape(-1, 1)
    with dask.config.set(scheduler="threads"):
        v, g = tg.value_and_grad(loss)(w, chunked(x), chunked(y2))
        stats = tg.compile(lambda w, x, y: (np.sum(x @ w), np.mean(y), x.T @ y))(
            w, chunked(x), chunked(y))
    rv, rg = ref_least_squares(w, x, y)
    np.testing.assert_allclose(v, rv, rtol=RTOL)
    np.testing.assert_allclose(g, rg, rtol=RTOL)
    assert isinstance(stats, tuple) and len(stats) == 3
    np.testing.assert_allclose(stats[0], np.sum(x @ w), rtol=RTOL)
    np.testing.assert_allclose(stats[1], np.mean(y), rtol=RTOL)
    np.testing.assert_allclose(stats[2], x.T @ y, rtol=RTOL)


def test_einsum(data):
    x, y, w = data["x"], data["y"], data["w"]

    def loss(w, x, y):
        return np.mean((np.einsum("ij,j->i", x, w) - y) ** 2) + np.sum(np.einsum("ij,i->j", x, y) * w)

    with dask.config.set(scheduler="threads"):
        v, g = tg.value_and_grad(loss)(w, chunked(x), chunked(y))
    rv, rg = ref_least_squares(w, x, y)
    np.testing.assert_allclose(v, rv + (x.T @ y) @ w, rtol=RTOL)
    np.testing.assert_allclose(g, rg + x.T @ y, rtol=RTOL)
    with pytest.raises(NotSeparableError, match="`einsum` at test_dask.py:\\d+ pairs the rows"):
        tg.grad(lambda w, x: np.sum(np.einsum("ij,kj->ik", x, x)) * np.sum(w))(w, chunked(x))


def test_task_graph_one_task_per_chunk_one_payload_tree_sum(monkeypatch, data):
    """What Dask is handed: one task per chunk, the parameters as one object
    of the graph (not one copy per task), and a tree of additions."""
    x, y, w = data["x"], data["y"], data["w"]
    seen = []
    real = dask.compute

    def spy(*args, **kwargs):
        seen.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(dask, "compute", spy)
    with dask.config.set(scheduler="threads"):
        tg.value_and_grad(least_squares)(w, chunked(x, 100), chunked(y, 100))   # 11 chunks
    (result,) = seen
    graph = dict(result.__dask_graph__())
    names = [k[0] if isinstance(k, tuple) else k for k in graph]
    count = {p: sum(1 for n in names if n.startswith(p)) for p in ("_Payload", "_chunk_task",
                                                                   "_add")}
    assert count == {"_Payload": 1, "_chunk_task": 11, "_add": 3}   # 11 -> 2 -> 1


def test_compiled_once_per_chunk_shape(data):
    with dask.config.set(scheduler="threads"):
        x, y, w = data["x"], data["y"], data["w"]

        def loss(w, x, y):
            return np.mean((x @ w - y) ** 2)

        f = tg.value_and_grad(loss)
        X, Y = chunked(x, 100), chunked(y, 100)       # 10 chunks of 100 and one of 3
        before = tg.cache_info()
        for _ in range(3):
            f(w, X, Y)
        after = tg.cache_info()
        # one full-shape trace for the check, one per chunk shape (100 and 3)
        assert after["traces"] - before["traces"] == 3


# --- what cannot be split ------------------------------------------------------------

def test_cumsum_over_rows_is_a_clear_error(data):
    def loss(w, x):
        return np.sum(np.cumsum(x @ w) ** 2)
    with pytest.raises(NotSeparableError) as e:
        tg.grad(loss)(data["w"], chunked(data["x"]))
    msg = str(e.value)
    assert "`cumsum`" in msg and "test_dask.py" in msg and "np.cumsum(x @ w)" in msg


def test_sort_over_rows_is_a_clear_error(data):
    def loss(w, x):
        return np.sum(np.sort(x @ w)[:10])
    with pytest.raises(NotSeparableError, match=r"`sort` at test_dask\.py:\d+ works along the row"):
        tg.value_and_grad(loss)(data["w"], chunked(data["x"]))


def test_nonlinear_function_of_a_gram_matrix_is_a_clear_error(data):
    """x.T @ x is a sum over rows; squaring it is not a sum over rows."""
    def loss(w, x):
        return np.sum((x.T @ x @ w) ** 2)
    with pytest.raises(NotSeparableError, match=r"`mul` at test_dask\.py:\d+ applies a function "
                                                r"that is not linear to a sum over the rows"):
        tg.grad(loss)(data["w"], chunked(data["x"]))
    # used linearly it is a sum over rows, and is computed chunk by chunk
    with dask.config.set(scheduler="threads"):
        g = tg.grad(lambda w, x: np.sum(x.T @ x @ w))(data["w"], chunked(data["x"]))
    x = data["x"]
    np.testing.assert_allclose(g, (x.T @ x).T @ np.ones(D), rtol=RTOL)


def test_other_errors(data):
    x, y, w = data["x"], data["y"], data["w"]
    with pytest.raises(NotSeparableError, match="adds a term that is not a sum over rows"):
        tg.grad(lambda w, x, y: np.mean((x @ w - y) ** 2) + np.sum(w ** 2))(
            w, chunked(x), chunked(y))
    with pytest.raises(NotSeparableError, match="max.*reduces over the rows"):
        tg.grad(lambda w, x: np.max(x @ w))(w, chunked(x))
    with pytest.raises(NotSeparableError, match="still in it"):
        tg.compile(lambda w, x: x @ w)(w, chunked(x))
    with pytest.raises(NotSeparableError, match="not a dask array but has the row axis"):
        tg.grad(lambda w, x, y: np.sum(x @ w - y))(w, chunked(x), y)
    with pytest.raises(TypeError, match="'x' is a dask array"):
        tg.grad(least_squares, argnums=1)(w, chunked(x), chunked(y))
    with pytest.raises(ValueError, match="rows along their chunked axes"):
        tg.grad(least_squares)(w, chunked(x), chunked(y[:-3], 200))
    with pytest.raises(TypeError, match="does not take dask arrays"):
        tg.hessian(least_squares)(w, chunked(x), chunked(y))


# --- on the cluster ------------------------------------------------------------------

def test_workers_load_from_their_tracegrad_cache(client, data):
    x, y, w = data["x"], data["y"], data["w"]

    def loss(w, x, y):
        return np.sum((x @ w - y) ** 4)

    def info():
        return __import__("tracegrad").cache_info()

    before = client.run(info)
    v, g = tg.value_and_grad(loss)(w, chunked(x), chunked(y))
    after = client.run(info)
    assert len(after) == 2
    hits = 0
    for addr, a in after.items():
        # the client compiled and stored the chunk programs (3 chunk shapes);
        # the workers loaded them from the (shared) disk cache, never compiling
        assert a["compiles"] == before[addr]["compiles"]
        hits += a["disk_hits"] - before[addr]["disk_hits"]
    assert hits >= 3
    r = x @ w - y
    np.testing.assert_allclose(v, np.sum(r ** 4), rtol=RTOL)
    np.testing.assert_allclose(g, 4 * x.T @ r ** 3, rtol=RTOL)


def test_on_the_cluster_one_task_per_chunk_and_one_payload(client, data):
    """What the scheduler runs: one task per chunk, the parameters and the
    programs as one task of the graph, the additions of the tree sum."""
    from distributed import get_task_stream
    x, y, w = data["x"], data["y"], data["w"]
    with get_task_stream(client) as ts:
        v, g = tg.value_and_grad(least_squares)(w, chunked(x, 100), chunked(y, 100))
    keys = {str(r["key"]) for r in ts.data}
    count = {p: sum(1 for k in keys if k.startswith(p)) for p in ("_Payload", "_chunk_task",
                                                                  "_add")}
    assert count == {"_Payload": 1, "_chunk_task": 11, "_add": 3}
    rv, rg = ref_least_squares(w, x, y)
    np.testing.assert_allclose(v, rv, rtol=RTOL)
    np.testing.assert_allclose(g, rg, rtol=RTOL, atol=1e-13)


def _use_cache_folder(folder, dask_worker=None):
    """On a worker: switch its tracegrad cache folder (None: back to what it
    had) and forget what it has in memory."""
    import tracegrad
    if not hasattr(dask_worker, "_tg_old_cache"):
        dask_worker._tg_old_cache = os.environ.get("TRACEGRAD_CACHE_DIR")
    if folder is None:
        folder = dask_worker._tg_old_cache
    else:
        folder = os.path.join(folder, f"worker-{dask_worker.name}")
    if folder is None:
        os.environ.pop("TRACEGRAD_CACHE_DIR", None)
    else:
        os.environ["TRACEGRAD_CACHE_DIR"] = folder
    tracegrad.clear_cache(memory=True, disk=False)


def _cache_info():
    return __import__("tracegrad").cache_info()


def test_workers_with_their_own_cache_folders_store_the_source_once(client, data, tmp_path):
    """Workers on other machines share no disk with the client: a worker
    stores the source it is sent in its own cache on the first call, and
    loads it from there later (here: after forgetting its memory)."""
    import cloudpickle
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    x, y, w = data["x"][:1000], data["y"][:1000], data["w"]

    def loss(w, x, y):
        return np.sum(np.cosh(x @ w - y))

    X, Y = chunked(x, 250), chunked(y, 250)            # one chunk shape
    client.run(_use_cache_folder, str(tmp_path))
    try:
        v, g = tg.value_and_grad(loss)(w, X, Y)
        first = client.run(_cache_info)
        names = client.run(lambda dask_worker: dask_worker.name)
        stored = {a: i["disk_entries"] for a, i in first.items()}
        for a, i in first.items():
            assert i["cache_dir"] == str(tmp_path / f"worker-{names[a]}")
            assert i["disk_entries"] == i["compiles"] <= 1      # the source sent, stored once
        assert sum(stored.values()) >= 1
        client.run(lambda: __import__("tracegrad").clear_cache(memory=True, disk=False))
        v2, g2 = tg.value_and_grad(loss)(w, X, Y)
        second = client.run(_cache_info)
        for a, i in second.items():
            if stored[a]:
                assert i["compiles"] == 0 and i["disk_hits"] >= 1
    finally:
        client.run(_use_cache_folder, None)
    r = x @ w - y
    for vv, gg in ((v, g), (v2, g2)):
        np.testing.assert_allclose(vv, np.sum(np.cosh(r)), rtol=RTOL)
        np.testing.assert_allclose(gg, x.T @ np.sinh(r), rtol=RTOL)


def _slow_rows(block):
    time.sleep(0.4)
    return block


def test_a_killed_worker_does_not_change_the_result(client, data):
    import cloudpickle
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    x, y, w = data["x"], data["y"], data["w"]
    X = chunked(x, 126).map_blocks(_slow_rows, dtype=x.dtype)     # 8 slow chunks
    Y = chunked(y, 126)
    pids = client.run(os.getpid)
    out = []
    t = threading.Thread(target=lambda: out.append(tg.value_and_grad(least_squares)(w, X, Y)))
    t.start()
    victim = None
    deadline = time.time() + 20
    while victim is None and time.time() < deadline:
        busy = [a for a, tasks in client.processing().items() if tasks]
        victim = busy[0] if busy else None
        time.sleep(0.05)
    assert victim is not None, "no task started"
    os.kill(pids[victim], signal.SIGKILL)
    t.join(60)
    assert out, "the call did not finish"
    v, g = out[0]
    rv, rg = ref_least_squares(w, x, y)
    np.testing.assert_allclose(v, rv, rtol=RTOL)
    np.testing.assert_allclose(g, rg, rtol=RTOL, atol=1e-13)
    client.wait_for_workers(2, timeout=30)


def test_import_tracegrad_does_not_import_dask():
    code = ("import sys, numpy as np, tracegrad as tg; "
            "tg.grad(lambda w: np.sum(w ** 2))(np.ones(3)); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('dask', 'distributed')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_without_a_client_the_threaded_scheduler_runs_it():
    """No Client, no configuration: the chunks run in this process, on the
    threads of Dask's threaded scheduler."""
    code = ("import os, threading, numpy as np, dask.array as da, tracegrad as tg\n"
            "seen = set()\n"
            "def where(b):\n"
            "    seen.add((os.getpid(), threading.current_thread().name))\n"
            "    return b\n"
            "x = np.arange(80.0).reshape(40, 2)\n"
            "X = da.from_array(x, chunks=(5, 2)).map_blocks(where, dtype=x.dtype)\n"
            "g = tg.grad(lambda w, x: np.sum(x @ w))(np.ones(2), X)\n"
            "assert np.allclose(g, x.sum(axis=0)), g\n"
            "assert {p for p, _ in seen} == {os.getpid()}, seen\n"
            "print(sorted({n.split('_')[0] for _, n in seen}))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "ThreadPoolExecutor-0" in r.stdout


def test_without_dask_this_file_skips_and_tracegrad_works(tmp_path):
    """With dask not importable, tracegrad works as before and these tests
    skip rather than fail."""
    code = ("import sys\n"
            "sys.modules['dask'] = sys.modules['distributed'] = None   # not importable\n"
            "import numpy as np, pytest, tracegrad as tg\n"
            "assert tg.grad(lambda w: np.sum(w ** 2))(np.ones(3)).tolist() == [2.0] * 3\n"
            f"sys.exit(pytest.main(['-q', '-rs', '-p', 'no:cacheprovider', {__file__!r}]))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120, cwd=str(tmp_path))
    # a module skipped as a whole leaves no test collected: pytest's exit code 5
    assert r.returncode == pytest.ExitCode.NO_TESTS_COLLECTED, r.stdout + r.stderr
    assert "1 skipped" in r.stdout and "could not import 'dask" in r.stdout, r.stdout


def test_unaligned_blocks_are_copied_before_the_chunk_program():
    """dask.distributed may deliver a block at an odd address; NumPy's BLAS
    path needs aligned data, so such a block is copied, others are not."""
    from tracegrad.runtime.distributed import _aligned
    buf = np.zeros(8 * 12 + 1, dtype=np.uint8)
    odd = np.frombuffer(buf.data, dtype=np.float64, count=12, offset=1).reshape(6, 2)
    assert not odd.flags.aligned
    fixed = _aligned(odd)
    assert fixed.flags.aligned and fixed.flags.c_contiguous
    np.testing.assert_array_equal(fixed, odd)
    ok = np.ones((6, 2))
    assert _aligned(ok) is ok


def test_example_dask_fit_small(tmp_path):
    """examples/dask_fit.py in its small mode: the losses fall, and the fit on
    Dask ends where the fit on one machine does."""
    pytest.importorskip("scipy")
    import re
    path = os.path.join(os.path.dirname(__file__), "..", "examples", "dask_fit.py")
    env = dict(os.environ, TRACEGRAD_CACHE_DIR=str(tmp_path / "cache"))
    r = subprocess.run([sys.executable, path, "--small"], env=env, capture_output=True,
                       text=True, timeout=120, cwd=str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    for model in ("logistic regression", "MLP"):
        ls = [float(v) for v in re.findall(rf"{model}\s+iter\s+\d+\s+loss ([0-9.]+)", r.stdout)]
        assert len(ls) >= 8 and ls[-1] < 0.8 * ls[0], r.stdout
    for model in ("logistic", "mlp"):
        m = re.search(rf"{model}: final loss on Dask ([0-9.]+), on one machine ([0-9.]+)",
                      r.stdout)
        assert float(m.group(1)) == pytest.approx(float(m.group(2)), rel=1e-9)
