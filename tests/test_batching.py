"""Batching on graphs (vmap): a batched graph equals the graph applied to
each batch element, for the generic rules and the registry's own ones."""
import numpy as np
import pytest

import tracegrad as tg
from tracegrad.ir import graph as ir, passes
from tracegrad.ir.batching import batch_graph
from tracegrad.frontend.trace import trace_function
from tracegrad.ops.primitives import Aval

rng = np.random.default_rng(7)

FUNCS = {
    "elementwise-broadcast": (lambda x, y: np.tanh(x) * y + 1.0, [(3, 4), (4,)]),
    "scalar-to-vector": (lambda x, y: np.broadcast_to(np.sum(x), (3,)) * y, [(3,), (3,)]),
    "sum-axis": (lambda x, y: np.sum(x * y, axis=0, keepdims=True), [(3, 4), (3, 4)]),
    "max-axis": (lambda x, y: np.max(x, axis=1) + y[:, 0], [(3, 4), (3, 4)]),
    "reshape-transpose": (lambda x, y: np.transpose(np.reshape(x, (4, 3))) + y, [(3, 4), (3, 4)]),
    "matmul-2d": (lambda x, y: x @ y, [(3, 4), (4, 2)]),
    "matvec": (lambda x, y: x @ y, [(3, 4), (4,)]),
    "vecmat": (lambda x, y: x @ y, [(4,), (4, 2)]),
    "dot": (lambda x, y: x @ y, [(4,), (4,)]),
    "getitem": (lambda x, y: x[1:, ::2] * y[0], [(3, 4), (3, 2)]),
    "fancy-index": (lambda x, y: x[np.array([2, 0, 2])] + y, [(3, 4), (3, 4)]),
    "concatenate": (lambda x, y: np.concatenate([x, y], axis=1), [(3, 4), (3, 2)]),
    "softmax": (lambda x, y: np.exp(x - np.max(x, axis=1, keepdims=True)) / y.sum(), [(3, 4), (2,)]),
}


@pytest.mark.parametrize("name", sorted(FUNCS))
@pytest.mark.parametrize("batched", [(True, False), (False, True), (True, True)])
def test_batched_graph_equals_per_element(name, batched):
    f, shapes = FUNCS[name]
    B = 3   # equal to some axis sizes on purpose: broadcasting must not mix them up
    avals = [Aval(s, np.dtype("float64")) for s in shapes]
    trace, _ = trace_function(f, avals, lambda ts: (list(ts), {}), ["x", "y"])
    g = passes.optimize(ir.from_trace(trace))
    bg = batch_graph(g, list(batched), B)
    ir.validate(bg)
    args = [rng.standard_normal(((B,) if b else ()) + s) for b, s in zip(batched, shapes)]
    out, _ = ir.eval_graph(bg, [tg.tensor(a) for a in args])
    for k in range(B):
        ref = f(*[a[k] if b else a for a, b in zip(args, batched)])
        np.testing.assert_allclose(out[0].numpy()[k], ref, rtol=1e-12, atol=1e-12)
