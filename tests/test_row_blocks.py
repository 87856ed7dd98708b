"""Row blocks on the native target (docs/native.md, "Row blocks"), and the
fusion rule that feeds them (a node computed only for a later kernel moves
into it): a matrix product read only by one elementwise kernel is computed
a block of rows at a time, and its full array never exists.  Values and
gradients equal the NumPy target's for every kind of operand the kernel
may read, at sizes with whole and partial last blocks."""
import re

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.ir import passes
from tracegrad.targets.native import codegen as codegen_c

from test_dynamic_shapes import _NoCompiler
from test_native import needs_cc

pytestmark = needs_cc
SEEDS = 8      # 120 pass too (run by hand)


@pytest.fixture
def small_blocks(monkeypatch, tmp_path):
    # blocks of 8 rows of 16 float64 columns: several blocks at test sizes
    monkeypatch.setattr(codegen_c, "ROW_BLOCK_BYTES", 8 * 16 * 8)
    monkeypatch.setenv("TRACEGRAD_CACHE_DIR", str(tmp_path))
    tg.clear_cache()
    yield
    tg.clear_cache()


def mlp(W1, b1, W2, b2, X, Y):
    h = np.tanh(X @ W1 + b1)
    return np.mean((h @ W2 + b2 - Y) ** 2)


def _mlp_args(rows, hidden=16, dtype=np.float64, seed=0):
    r = np.random.default_rng(seed)
    return [a.astype(dtype) for a in (
        r.standard_normal((5, hidden)) * 0.3, r.standard_normal(hidden) * 0.1,
        r.standard_normal((hidden, 3)) * 0.3, r.standard_normal(3) * 0.1,
        r.standard_normal((rows, 5)), r.standard_normal((rows, 3)))]


def _same(got, want, rtol):
    flat = lambda t: [np.asarray(x) for x in (t[0], *t[1])]    # noqa: E731
    for a, b in zip(flat(got), flat(want)):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * 1e-2)


def _kept(src):
    m = re.search(r"^_scratch_value_and_grad = _Scratch\((.*)\)$", src, re.M)
    return eval(m.group(1)) if m else []


@pytest.mark.parametrize("rows", [16, 17, 24, 31, 33, 48, 50])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_mlp_gradient_in_row_blocks_equals_the_numpy_target(small_blocks, rows, dtype):
    args = _mlp_args(rows, dtype=dtype)
    argnums = (0, 1, 2, 3)
    native = tg.value_and_grad(mlp, argnums=argnums, backend="native")
    want = tg.value_and_grad(mlp, argnums=argnums, backend="numpy")(*args)
    for _ in range(2):      # the kept buffers' second use
        _same(native(*args), want, 1e-12 if dtype == np.float64 else 2e-5)
    src = native.lower(*args).source
    per = codegen_c.row_block_rows(rows, 16 * np.dtype(dtype).itemsize)
    if per is None:
        assert "for _r in range(" not in src
        return
    # both products with a hidden-sized output run in blocks (X @ W1 and
    # d @ W2.T); the last block, 1 to per rows, has its own kernel
    assert src.count("for _r in range(0, ") == 2, src
    assert f"[{(rows - 1) // per * per}:]" in src
    # one batch x hidden array (h, then dh * (1 - h*h) over it) and one
    # block buffer shared by both products
    big = [s for s, _ in _kept(src) if s == (rows, 16)]
    blocks = [s for s, _ in _kept(src) if s == (per, 16)]
    assert len(big) == 1 and len(blocks) == 1, _kept(src)


def test_the_kernel_reads_rows_columns_scalars_and_writes_outputs_in_blocks(small_blocks):
    # operands of the kernel over A @ B: a full array (M), a column (c), a
    # row (r), a 0-d array (s), a constant row; two of its values are
    # graph outputs, and one is read by a later product
    def f(A, B, M, c, r, s):
        P = A @ B
        u = np.tanh(P + r) * c + M * s + np.arange(16.0)
        v = u * u - P
        return np.sum(v @ B.T), u, v

    rng = np.random.default_rng(4)
    for rows in (16, 19, 40):
        args = (rng.standard_normal((rows, 16)), rng.standard_normal((16, 16)) * 0.2,
                rng.standard_normal((rows, 16)), rng.standard_normal((rows, 1)),
                rng.standard_normal(16), np.array(0.7))
        fn = tg.compile(f, backend="native")
        want = tg.compile(f, backend="numpy")(*args)
        got = fn(*args)
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
        assert "for _r in range(0, " in fn.lower(*args).source
        g = tg.grad(lambda *a: f(*a)[0], argnums=(0, 1, 2, 3, 4, 5), backend="native")(*args)
        w = tg.grad(lambda *a: f(*a)[0], argnums=(0, 1, 2, 3, 4, 5), backend="numpy")(*args)
        for a, b in zip(g, w):
            np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-11)


def test_an_operand_of_the_product_is_never_written_over(small_blocks):
    # the kernel reads A itself (the product's operand, dying there): an
    # output written over it would change the rows a later block reads
    def f(A, B):
        S = np.sin(A)           # a kernel's output, dying at the kernel below
        return ((S @ B) * S + 1.0) @ B

    def g(A, B):
        T = np.cos(B)           # square, as many rows as the product
        return ((A @ T) * T + 2.0) @ B

    rng = np.random.default_rng(5)
    A, B = rng.standard_normal((40, 16)), rng.standard_normal((16, 16))
    fn = tg.compile(f, backend="native")
    assert "for _r in range(" in fn.lower(A, B).source
    np.testing.assert_allclose(fn(A, B), ((np.sin(A) @ B) * np.sin(A) + 1.0) @ B, rtol=1e-12)
    A16 = A[:16].copy()
    np.testing.assert_allclose(tg.compile(g, backend="native")(A16, B),
                               ((A16 @ np.cos(B)) * np.cos(B) + 2.0) @ B, rtol=1e-12)


def test_products_too_small_or_read_elsewhere_stay_whole(small_blocks):
    rng = np.random.default_rng(6)
    A, B = rng.standard_normal((3, 16)), rng.standard_normal((16, 16))  # under two small blocks
    assert codegen_c.row_block_rows(3, 16 * 8) is None
    src = tg.compile(lambda A, B: np.tanh(A @ B), backend="native").lower(A, B).source
    assert "for _r in range(" not in src
    A = rng.standard_normal((40, 16))
    f = tg.compile(lambda A, B: (np.tanh(A @ B), A @ B), backend="native")   # P is an output
    src = f.lower(A, B).source
    assert "for _r in range(" not in src
    for a, b in zip(f(A, B), (np.tanh(A @ B), A @ B)):
        np.testing.assert_allclose(a, b, rtol=1e-12)


def test_a_product_under_two_blocks_is_split_in_quarter_blocks(small_blocks):
    # 12 rows of 16 float64 (1.5 blocks of 8 rows): blocks of 2 rows
    assert codegen_c.row_block_rows(12, 16 * 8) == 2
    assert codegen_c.row_block_rows(16, 16 * 8) == 8
    rng = np.random.default_rng(7)
    A, B = rng.standard_normal((12, 16)), rng.standard_normal((16, 16))
    f = tg.compile(lambda A, B: np.tanh(A @ B), backend="native")
    assert "for _r in range(0, 10, 2):" in f.lower(A, B).source
    np.testing.assert_allclose(f(A, B), np.tanh(A @ B), rtol=1e-12)


def test_a_node_computed_only_for_a_later_kernel_moves_into_it():
    # 1 - h*h (tanh's derivative) is read only by the backward kernel
    # dh * (1 - h*h): it is computed there, from h, and the forward kernel
    # stores h alone
    args = _mlp_args(64)
    g = tg.value_and_grad(mlp, argnums=(0, 1, 2, 3), backend="numpy").lower(*args).graph
    groups = passes.fusion_groups(g)
    tanh = next(v for v in g.nodes if g.nodes[v]["op"] == "tanh")
    fwd = next(grp for grp in groups if tanh in grp.nodes)
    stored = [v for v in fwd.nodes if any(w not in fwd.nodes for w in g.successors(v))]
    assert stored == [tanh], (fwd, stored)
    bwd = next(grp for grp in groups if grp is not fwd and any(
        g.nodes[u]["op"] == "tanh" for v in grp.nodes for u in g.predecessors(v)))
    assert len(bwd.nodes) >= 3      # h*h, 1 - h*h and the product with dh


def test_a_third_batch_size_with_row_blocks_builds_no_c(small_blocks):
    argnums = (0, 1, 2, 3)
    f = tg.value_and_grad(mlp, argnums=argnums, backend="native")
    ref = tg.value_and_grad(mlp, argnums=argnums, backend="numpy")
    for rows in (40, 37):       # the second size builds the generic C
        _same(f(*_mlp_args(rows)), ref(*_mlp_args(rows)), 1e-12)
    with _NoCompiler():         # last blocks of 3 and 5 rows, and of a whole block
        got = {rows: f(*_mlp_args(rows)) for rows in (35, 29, 48)}
    for rows, g in got.items():
        _same(g, ref(*_mlp_args(rows)), 1e-12)


@pytest.mark.parametrize("seed", range(SEEDS))
def test_random_kernels_over_row_blocks_equal_the_numpy_target(small_blocks, seed):
    # a product feeding an elementwise kernel of random operands (full,
    # column, row, 0-d, constant) and ops; the result read by a product (so
    # the kernel has no fused sum) and a sum; value and every gradient
    rng = np.random.default_rng(seed)
    rows = int(rng.integers(17, 41))
    ops = [lambda p, o: p * o, lambda p, o: p + o, lambda p, o: np.tanh(p) - o,
           lambda p, o: np.exp(-p * p) * o, lambda p, o: np.maximum(p, o),
           lambda p, o: p / (1.0 + o * o)]
    picks = rng.integers(0, len(ops), 3)
    kinds = rng.integers(0, 4, 3)

    def f(A, B, M, c, r, s):
        P = A @ B
        others = (M, c, r, s)
        u = P
        for k, j in zip(picks, kinds):
            u = ops[k](u, others[j])
        return np.sum(u @ B.T) + np.sum(u * 0.5)

    args = (rng.standard_normal((rows, 16)), rng.standard_normal((16, 16)) * 0.3,
            rng.standard_normal((rows, 16)), rng.standard_normal((rows, 1)),
            rng.standard_normal(16), np.array(rng.standard_normal()))
    argnums = tuple(range(6))
    native = tg.value_and_grad(f, argnums=argnums, backend="native")
    assert "for _r in range(0, " in native.lower(*args).source
    want = tg.value_and_grad(f, argnums=argnums, backend="numpy")(*args)
    _same(native(*args), want, 1e-11)
