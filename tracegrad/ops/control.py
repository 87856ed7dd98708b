"""Control flow as graph nodes: loops and branches whose bodies are subgraphs.

``tg.fori_loop``, ``tg.scan``, ``tg.while_loop``, ``tg.cond`` and
``tg.switch`` (JAX's signatures and meaning).  Under tracing the body is
traced ONCE into a ``Body`` (a small graph of primitives) that becomes an
attribute of one node, so a loop of a million steps is one node and compile
time does not depend on the trip count.  Eagerly (Tensors, NumPy arrays)
the Python loop simply runs and the tape records each step.

Three primitives, one row each:

* ``scan``: operands (*init, *xs, *consts); the body maps
  ([index,] *carry, *x_k, *consts) -> (*carry, *y_k); outputs
  (*final carry, *stacked ys).  ``fori_loop`` is a scan with an index and
  no xs (``start`` attribute).  Its vjp runs a forward scan that also stacks
  the carries, then a reverse scan over the body's own vjp (a Body derived
  by the adjoint pass); its jvp is a scan over the body's tangent Body; its
  batch rule batches the body.  All derived bodies are ordinary Bodies, so
  derivatives of any order compose.
* ``while``: operands (*init, *consts), a ``cond`` Body and a ``body``
  Body.  Reverse mode records the trip count: its vjp runs the forward
  while loop once to count the steps, and then uses ``scan``'s rule over
  exactly that many steps (the count is a value of the forward run, read at
  run time).
* ``cond``: operands (index, *operands) and one Body per branch.  Its vjp
  and jvp are ``cond`` nodes over the branches' vjp/jvp Bodies.

The op layer cannot import the tracer or the adjoint pass above it, so the
three derivations that need them (trace a Python function into a Body,
differentiate a Body, batch a Body) are hooks that ``tracegrad.frontend.trace``,
``tracegrad.ir.graph`` and ``tracegrad.ir.batching`` install when they load.
"""
from __future__ import annotations

import numpy as np

from tracegrad.ops._define import _ops
from tracegrad.ops.primitives import Aval, bind, is_float, register, aval_of

__all__ = ["fori_loop", "scan", "while_loop", "cond", "switch", "checkpoint"]


class _Hooks:
    trace_body = None   # (fn, avals, faces) -> (Body, captured values, out_tree); frontend/trace.py
    tree_flatten = None  # frontend/trace.py
    tree_unflatten = None
    vjp_body = None     # (Body, wrt) -> Body; ir/adjoint.py
    jvp_body = None     # (Body, wrt) -> Body; ir/adjoint.py
    batch_body = None   # (Body, flags, B) -> Body; ir/batching.py


hooks = _Hooks()


class Body:
    """A traced subgraph: the body of a loop or a branch.

    ``nodes`` are the trace's records (op, inputs, attrs, aval, value), so
    ``tracegrad.ir.graph.from_trace`` turns a Body into a graph.  Two Bodies are
    equal when their structure hashes are (ops, wiring, attributes, shapes,
    dtypes, constants, source lines): the hash is part of the node's
    attributes and so of the compile cache key."""
    __slots__ = ("nodes", "inputs", "outputs", "backend", "key", "in_avals", "out_avals",
                 "memo", "__weakref__")

    def __init__(self, nodes, inputs, outputs, backend, key):
        self.nodes = tuple(nodes)
        self.inputs = tuple(inputs)
        self.outputs = tuple(outputs)
        self.backend = backend
        self.key = key
        self.in_avals = tuple(_node_aval(self.nodes[i]) for i in self.inputs)
        self.out_avals = tuple(_node_aval(self.nodes[i]) for i in self.outputs)
        self.memo = {}   # derived bodies (vjp, jvp, batched), by what they were derived for

    def __eq__(self, other):
        return type(other) is Body and other.key == self.key

    def __hash__(self):
        return hash(self.key)

    def __repr__(self):
        return f"Body<{self.key[:16]}: {len(self.inputs)} in, {len(self.outputs)} out, " \
               f"{len(self.nodes)} nodes>"

    def __len__(self):
        return len(self.nodes)


def _node_aval(n):
    a = n.aval
    if isinstance(a, Aval):
        return a
    return Aval((), np.result_type(a))


def run_body(body, xp, args):
    """Evaluate ``body`` on concrete arrays with the primitives' impls."""
    from tracegrad.ops.primitives import get
    env = [None] * len(body.nodes)
    for nid, a in zip(body.inputs, args):
        env[nid] = a
    for n in body.nodes:
        op = n.op
        if op == "input":
            continue
        if op == "const":
            env[n.id] = n.value
        elif op == "proj":
            env[n.id] = env[n.inputs[0]][n.attrs["index"]]
        else:
            env[n.id] = get(op).impl(xp, *[env[i] for i in n.inputs], **n.attrs)
    return [env[i] for i in body.outputs]


def eval_body(body, args):
    """Evaluate ``body`` by binding each primitive: on tracers this inlines
    the body into the trace the values belong to; on Tensors it runs eagerly
    and records the tape."""
    from tracegrad.ops.primitives import get
    env = [None] * len(body.nodes)
    for nid, a in zip(body.inputs, args):
        env[nid] = a
    # on tracers, the nodes keep the body's source lines
    T = None
    for a in args:
        t = getattr(a, "_trace", None)
        if t is not None and (T is None or t.level > T.level):
            T = t
    old = T.loc_override if T is not None else None
    try:
        for n in body.nodes:
            op = n.op
            if op == "input":
                continue
            if op == "const":
                env[n.id] = n.value
            elif op == "proj":
                env[n.id] = env[n.inputs[0]][n.attrs["index"]]
            else:
                if T is not None and n.loc:
                    T.loc_override = n.loc
                env[n.id] = bind(get(op), *[env[i] for i in n.inputs], **n.attrs)
    finally:
        if T is not None:
            T.loc_override = old
    return [env[i] for i in body.outputs]


def _trace(fn, avals, faces=None):
    if hooks.trace_body is None:
        raise RuntimeError("tracegrad.frontend.trace is not loaded; import tracegrad first")
    return hooks.trace_body(fn, list(avals), faces)


def _need(name):
    h = getattr(hooks, name)
    if h is None:
        raise RuntimeError(f"control flow: the {name} derivation is installed by "
                           f"tracegrad.ir.adjoint / tracegrad.ir.batching, which are not loaded; "
                           f"import tracegrad.api (tg.grad and friends load it) first")
    return h


def _zeros(x):
    from tracegrad.ops.base import zeros_like_value
    return zeros_like_value(x)


def _zeros_aval(a):
    return np.zeros(a.shape, a.dtype)


# --- scan -------------------------------------------------------------------------

def _scan_split(ops, n_carry, n_xs):
    return list(ops[:n_carry]), list(ops[n_carry:n_carry + n_xs]), list(ops[n_carry + n_xs:])


def _scan_impl(xp, *ops, body, length, n_carry, n_xs, start, reverse,
                         checkpoint=None):
    carry, xs, consts = _scan_split(ops, n_carry, n_xs)
    n_y = len(body.outputs) - n_carry
    ys = [xp.empty((length,) + tuple(a.shape), a.dtype) for a in body.out_avals[n_carry:]]
    steps = range(length - 1, -1, -1) if reverse else range(length)
    for k in steps:
        args = ([np.int64(start + k)] if start is not None else []) + carry \
            + [x[k] for x in xs] + consts
        outs = run_body(body, xp, args)
        carry = outs[:n_carry]
        for j in range(n_y):
            ys[j][k] = outs[n_carry + j]
    return tuple(carry) + tuple(ys)


def _scan_shape(*avals, body, length, n_carry, n_xs, start, reverse,
                        checkpoint=None):
    carry = [aval_of(a) for a in avals[:n_carry]]
    outs = body.out_avals
    for j, (a, o) in enumerate(zip(carry, outs[:n_carry])):
        if tuple(a.shape) != tuple(o.shape) or np.dtype(a.dtype) != np.dtype(o.dtype):
            raise TypeError(f"scan: the body returns carry {j} as {o.dtype}{list(o.shape)} "
                            f"but it entered as {a.dtype}{list(a.shape)}; a loop carry must "
                            f"keep its shape and dtype")
    return tuple(carry) + tuple(Aval((length,) + tuple(o.shape), o.dtype)
                                for o in outs[n_carry:])


def _scan_nout(body, length, n_carry, n_xs, start, reverse,
               checkpoint=None):
    return len(body.outputs)


def _float_positions(avals):
    return [i for i, a in enumerate(avals) if is_float(aval_of(a).dtype)]


def _scan_vjp(g, out, *ops, body, length, n_carry, n_xs, start, reverse,
                            checkpoint=None):
    """Reverse mode: a forward scan that also stacks each step's carry, then
    a reverse scan over the body's vjp.  With ``checkpoint=k`` the loop is
    differentiated as a loop over segments of k steps whose body is the
    k-step loop: the outer reverse pass stores one carry per segment, and
    each segment's own reverse pass reruns its k steps, storing those."""
    if checkpoint and 1 < checkpoint < length and not reverse:
        return _checkpointed_vjp(g, out, ops, body, length, n_carry, n_xs, start, checkpoint)
    add = _ops.add
    carry, xs, consts = _scan_split(ops, n_carry, n_xs)
    n_y = len(body.outputs) - n_carry
    g = [gi if gi is not None else _zeros(o) for gi, o in zip(g, out)]
    ct_carry, ct_ys = g[:n_carry], g[n_carry:]
    avals = [aval_of(o) for o in ops]
    fc = _float_positions(avals[:n_carry])
    fx = _float_positions(avals[n_carry:n_carry + n_xs])
    fk = _float_positions(avals[n_carry + n_xs:])
    fy = _float_positions(body.out_avals[n_carry:])
    # 1. forward again, stacking the carry each step enters with
    stack_body = _stacking_body(body, n_carry, start)
    res = bind(scan_p, *ops, body=stack_body, length=length, n_carry=n_carry, n_xs=n_xs,
               start=start, reverse=reverse)
    stacked = list(res[n_carry + n_y:])
    # 2. the reverse scan over the body's vjp
    bwd = _scan_bwd_body(body, n_carry, n_xs, start, tuple(fc), tuple(fx), tuple(fk), tuple(fy))
    acc0 = [_zeros(consts[i]) for i in fk]
    r = bind(scan_p, *[ct_carry[i] for i in fc], *acc0,
             *stacked, *xs, *[ct_ys[i] for i in fy], *consts,
             body=bwd, length=length, n_carry=len(fc) + len(fk),
             n_xs=n_carry + n_xs + len(fy), start=start, reverse=not reverse)
    r = list(r)
    cts = [None] * len(ops)
    for j, i in enumerate(fc):
        cts[i] = r[j]
    for j, i in enumerate(fk):
        cts[n_carry + n_xs + i] = r[len(fc) + j]
    for j, i in enumerate(fx):
        cts[n_carry + i] = r[len(fc) + len(fk) + j]
    return tuple(cts)


def _checkpointed_vjp(g, out, ops, body, length, n_carry, n_xs, start, k):
    avals = [aval_of(o) for o in ops]
    fo = tuple(_float_positions(avals))
    comp = _segmented_body(body, length, n_carry, n_xs, start, k, tuple(avals))
    key = ("vjp", fo)
    vb = comp.memo.get(key)
    if vb is None:
        vb = comp.memo[key] = _need("vjp_body")(comp, fo)
    gg = [gi if gi is not None else _zeros(o) for gi, o in zip(g, out)]
    r = eval_body(vb, list(ops) + gg)
    cts = [None] * len(ops)
    for j, i in enumerate(fo):
        cts[i] = r[j]
    return tuple(cts)


def _segmented_body(body, length, n_carry, n_xs, start, k, avals):
    """The scan as a scan over length // k segments whose body is a k-step
    scan, then the remaining steps: the same operations in the same order,
    so its derivative is the loop's, with one stored carry per segment."""
    key = ("segmented", length, n_carry, n_xs, start, k, avals)
    b = body.memo.get(key)
    if b is not None:
        return b
    reshape, concatenate = _ops.reshape, _ops.concatenate
    S, n0 = length // k, (length // k) * k
    inner = body
    if start is not None:     # the step index becomes a carried counter
        def counted(i, *a):
            return (i + 1,) + tuple(eval_body(body, [i] + list(a)))
        inner, _, _ = _trace(counted, [Aval((), np.dtype(np.int64))] + list(body.in_avals[1:]))
    nc = n_carry + (start is not None)
    n_y = len(body.outputs) - n_carry

    def run(cs, xs, consts, steps):
        r = bind(scan_p, *cs, *xs, *consts, body=inner, length=steps, n_carry=nc, n_xs=n_xs,
                 start=None, reverse=False)
        return list(r[:nc]), list(r[nc:])

    def f(*ops):
        ops = list(ops)
        carry, xs, consts = _scan_split(ops, n_carry, n_xs)
        if start is not None:
            carry = [np.int64(start)] + carry
        ys = []
        if S:
            segs = [reshape(x[:n0], (S, k) + tuple(x.shape[1:])) for x in xs]

            def seg(cs, xseg):
                cs, yseg = run(list(cs), list(xseg), consts, k)
                return tuple(cs), tuple(yseg)
            cf, yss = _scan_core(lambda i, c, x: seg(c, x), tuple(carry), tuple(segs), S, None,
                                 False, "scan")
            carry = list(cf)
            ys = [reshape(y, (n0,) + tuple(y.shape[2:])) for y in yss]
        if length > n0:
            carry, ys_r = run(carry, [x[n0:] for x in xs], consts, length - n0)
            ys = [concatenate([a, b_]) for a, b_ in zip(ys, ys_r)] if ys else ys_r
        return tuple(carry[nc - n_carry:]) + tuple(ys[:n_y])

    b, _, _ = _trace(f, list(avals))
    body.memo[key] = b
    return b


def _stacking_body(body, n_carry, start):
    """The body with the carries it is entered with as extra outputs."""
    key = ("stack", n_carry, start)
    b = body.memo.get(key)
    if b is None:
        off = 1 if start is not None else 0
        extra = body.inputs[off:off + n_carry]
        b = Body(body.nodes, body.inputs, body.outputs + extra, body.backend,
                 body.key + f"+stack{n_carry}")
        body.memo[key] = b
    return b


def _scan_bwd_body(body, n_carry, n_xs, start, fc, fx, fk, fy):
    """Body of the reverse scan: ([i,] ct_carry[fc], acc[fk], carry_k, x_k,
    ct_y_k[fy], consts) -> (ct_carry_prev[fc], acc + ct_consts[fk], ct_x[fx])."""
    key = ("scan_bwd", n_carry, n_xs, start, fc, fx, fk, fy)
    b = body.memo.get(key)
    if b is not None:
        return b
    add = _ops.add
    off = 1 if start is not None else 0
    n_y = len(body.outputs) - n_carry
    in_av = body.in_avals
    wrt = tuple([off + i for i in fc] + [off + n_carry + i for i in fx]
                + [off + n_carry + n_xs + i for i in fk])
    vb = _need("vjp_body")(body, wrt)
    carry_av = in_av[off:off + n_carry]
    x_av = in_av[off + n_carry:off + n_carry + n_xs]
    k_av = in_av[off + n_carry + n_xs:]
    y_av = body.out_avals[n_carry:]
    avals = ([in_av[0]] if start is not None else []) + [carry_av[i] for i in fc] \
        + [k_av[i] for i in fk] + list(carry_av) + list(x_av) + [y_av[i] for i in fy] + list(k_av)

    def f(*a):
        a = list(a)
        idx = [a.pop(0)] if start is not None else []
        ct_c = a[:len(fc)]; a = a[len(fc):]
        acc = a[:len(fk)]; a = a[len(fk):]
        c_k = a[:n_carry]; a = a[n_carry:]
        x_k = a[:n_xs]; a = a[n_xs:]
        ct_y = a[:len(fy)]; a = a[len(fy):]
        ks = a
        outs_ct = []
        for j in range(n_carry):
            outs_ct.append(ct_c[fc.index(j)] if j in fc else _zeros_aval(body.out_avals[j]))
        for j in range(n_y):
            outs_ct.append(ct_y[fy.index(j)] if j in fy else _zeros_aval(y_av[j]))
        r = eval_body(vb, idx + c_k + x_k + ks + outs_ct)
        rc, rx, rk = r[:len(fc)], r[len(fc):len(fc) + len(fx)], r[len(fc) + len(fx):]
        return tuple(rc) + tuple(add(s, t) for s, t in zip(acc, rk)) + tuple(rx)

    b, _, _ = _trace(f, avals)
    body.memo[key] = b
    return b


def _scan_jvp(tangents, out, *ops, body, length, n_carry, n_xs, start, reverse,
                                   checkpoint=None):
    carry, xs, consts = _scan_split(ops, n_carry, n_xs)
    avals = [aval_of(o) for o in ops]
    fc = tuple(_float_positions(avals[:n_carry]))
    fx = tuple(_float_positions(avals[n_carry:n_carry + n_xs]))
    fk = tuple(_float_positions(avals[n_carry + n_xs:]))
    fy = tuple(_float_positions(body.out_avals[n_carry:]))
    tan = [t if t is not None or not is_float(a.dtype) else _zeros(o)
           for t, a, o in zip(tangents, avals, ops)]
    t_c = [tan[i] for i in fc]
    t_x = [tan[n_carry + i] for i in fx]
    t_k = [tan[n_carry + n_xs + i] for i in fk]
    jb = _scan_jvp_body(body, n_carry, n_xs, start, fc, fx, fk, fy)
    n_y = len(body.outputs) - n_carry
    r = list(bind(scan_p, *carry, *t_c, *xs, *t_x, *consts, *t_k, body=jb, length=length,
                  n_carry=n_carry + len(fc), n_xs=n_xs + len(fx), start=start,
                  reverse=reverse, **_ckpt(checkpoint)))
    tc = r[n_carry:n_carry + len(fc)]
    ty = r[n_carry + len(fc) + n_y:]
    res = [None] * (n_carry + n_y)
    for j, i in enumerate(fc):
        res[i] = tc[j]
    for j, i in enumerate(fy):
        res[n_carry + i] = ty[j]
    return tuple(res)


def _ckpt(checkpoint):
    """The checkpoint attribute, only where set (most loops have none)."""
    return {"checkpoint": checkpoint} if checkpoint else {}


def _scan_jvp_body(body, n_carry, n_xs, start, fc, fx, fk, fy):
    """([i,] carry, t_carry[fc], x, t_x[fx], consts, t_consts[fk]) ->
    (carry', t_carry'[fc], y, t_y[fy])."""
    key = ("scan_jvp", n_carry, n_xs, start, fc, fx, fk, fy)
    b = body.memo.get(key)
    if b is not None:
        return b
    off = 1 if start is not None else 0
    in_av = body.in_avals
    wrt = tuple([off + i for i in fc] + [off + n_carry + i for i in fx]
                + [off + n_carry + n_xs + i for i in fk])
    jb = _need("jvp_body")(body, wrt)
    carry_av = list(in_av[off:off + n_carry])
    x_av = list(in_av[off + n_carry:off + n_carry + n_xs])
    k_av = list(in_av[off + n_carry + n_xs:])
    avals = ([in_av[0]] if start is not None else []) + carry_av + [carry_av[i] for i in fc] \
        + x_av + [x_av[i] for i in fx] + k_av + [k_av[i] for i in fk]

    def f(*a):
        a = list(a)
        idx = [a.pop(0)] if start is not None else []
        c = a[:n_carry]; a = a[n_carry:]
        tc = a[:len(fc)]; a = a[len(fc):]
        x = a[:n_xs]; a = a[n_xs:]
        tx = a[:len(fx)]; a = a[len(fx):]
        k = a[:len(k_av)]; a = a[len(k_av):]
        tk = a
        r = eval_body(jb, idx + c + x + k + tc + tx + tk)
        outs, touts = r[:len(body.outputs)], r[len(body.outputs):]
        return tuple(outs[:n_carry]) + tuple(touts[i] for i in fc) \
            + tuple(outs[n_carry:]) + tuple(touts[n_carry + i] for i in fy)

    b, _, _ = _trace(f, avals)
    body.memo[key] = b
    return b


def _scan_batch(vals, flags, B, *, body, length, n_carry, n_xs, start, reverse,
                                   checkpoint=None):
    """vmap of a scan: the body batched once; every carry gets the batch axis
    (one batched operand batches the carry after a step); batched xs and ys
    keep it second, after the scanned axis."""
    broadcast_to, transpose = _ops.broadcast_to, _ops.transpose
    vals = list(vals)
    flags = list(flags)
    for j in range(n_carry):
        if not flags[j]:
            v = vals[j]
            vals[j] = broadcast_to(v, (B,) + tuple(getattr(v, "shape", ())))
            flags[j] = True
    for j in range(n_carry, n_carry + n_xs):
        if flags[j]:
            nd = len(vals[j].shape)
            vals[j] = transpose(vals[j], (1, 0) + tuple(range(2, nd)))
    off = 1 if start is not None else 0
    in_flags = tuple([False] * off + flags)
    bb = _batched_body(body, in_flags, B)
    r = list(bind(scan_p, *vals, body=bb, length=length, n_carry=n_carry, n_xs=n_xs,
                  start=start, reverse=reverse, **_ckpt(checkpoint)))
    for j in range(n_carry, len(r)):
        nd = len(r[j].shape)
        r[j] = transpose(r[j], (1, 0) + tuple(range(2, nd)))
    return tuple(r)


def _batched_body(body, in_flags, B):
    key = ("batch", in_flags, B)
    b = body.memo.get(key)
    if b is None:
        b = _need("batch_body")(body, in_flags, B)
        body.memo[key] = b
    return b


_USER_NAMES = {"scan": "tg.fori_loop / tg.scan", "while": "tg.while_loop",
               "cond": "tg.cond / tg.switch", "while_fwd": "tg.while_loop (reverse mode)",
               "while_bwd": "tg.while_loop (reverse mode)"}


def _no_emitter(what):
    """The emitter a one-expression generator meets: loops and branches are
    printed by the generators themselves (``targets.pysource.CONTROL_FLOW``: a Python
    loop over a function per body, on the host for every target), so
    reaching this is a generator that does not know them."""
    def emit(names, **attrs):
        raise NotImplementedError(
            f"codegen: the graph holds a '{what}' node ({_USER_NAMES[what]}) and this code "
            f"generator has no loop or branch statements; compile with backend='numpy', "
            f"'native' or 'cupy', which run the loop on the host")
    return emit


scan_p = register(
    "scan", _scan_impl, shape=_scan_shape, vjp=_scan_vjp, jvp=_scan_jvp,
    numpy=_no_emitter("scan"), n_out=_scan_nout, batch=_scan_batch, save_inputs=True,
    may_view=True, save_out=True,  # a carry the body passes through is the operand itself
    doc="A loop over a traced body: carry in, carry out, optional per-step inputs and "
        "stacked per-step outputs (fori_loop, scan).")


# --- while -----------------------------------------------------------------------

def _while_split(ops, n_carry):
    return list(ops[:n_carry]), list(ops[n_carry:])


def _while_impl(xp, *ops, cond, body, n_carry, n_cc):
    carry, consts = _while_split(ops, n_carry)
    cc, bc = consts[:n_cc], consts[n_cc:]
    while bool(run_body(cond, xp, carry + cc)[0]):
        carry = run_body(body, xp, carry + bc)
    return tuple(carry)


def _while_shape(*avals, cond, body, n_carry, n_cc):
    carry = [aval_of(a) for a in avals[:n_carry]]
    for j, (a, o) in enumerate(zip(carry, body.out_avals)):
        if tuple(a.shape) != tuple(o.shape) or np.dtype(a.dtype) != np.dtype(o.dtype):
            raise TypeError(f"while_loop: body_fun returns carry {j} as {o.dtype}"
                            f"{list(o.shape)} but it entered as {a.dtype}{list(a.shape)}; "
                            f"a loop carry must keep its shape and dtype")
    return tuple(carry)


def _while_vjp(g, out, *ops, cond, body, n_carry, n_cc):
    """Reverse mode records the forward run: ``while_fwd`` runs the loop again
    keeping the carry each step starts from (so the trip count is the tape's
    length), and ``while_bwd`` walks that tape backwards through the body's
    vjp, exactly as a scan of that many steps would."""
    carry, consts = _while_split(ops, n_carry)
    bc = consts[n_cc:]
    avals = [aval_of(o) for o in ops]
    fc = tuple(_float_positions(avals[:n_carry]))
    fk = tuple(_float_positions(avals[n_carry + n_cc:]))
    g = [gi if gi is not None else _zeros(o) for gi, o in zip(g, out)]
    rec = bind(while_fwd_p, *ops, cond=cond, body=body, n_carry=n_carry, n_cc=n_cc)
    tape = rec[n_carry]
    bwd = _scan_bwd_body(body, n_carry, 0, None, fc, (), fk, ())
    acc0 = [_zeros(bc[i]) for i in fk]
    r = list(bind(while_bwd_p, tape, *[g[i] for i in fc], *acc0, *bc, bwd=bwd,
                  n_ct=len(fc) + len(fk), n_carry=n_carry))
    cts = [None] * len(ops)
    for j, i in enumerate(fc):
        cts[i] = r[j]
    for j, i in enumerate(fk):
        cts[n_carry + n_cc + i] = r[len(fc) + j]
    return tuple(cts)


def _while_fwd_impl(xp, *ops, cond, body, n_carry, n_cc):
    carry, consts = _while_split(ops, n_carry)
    cc, bc = consts[:n_cc], consts[n_cc:]
    steps = []
    while bool(run_body(cond, xp, carry + cc)[0]):
        steps.append(tuple(carry))
        carry = run_body(body, xp, carry + bc)
    tape = np.empty((), dtype=object)
    tape[()] = steps
    return tuple(carry) + (tape,)


_TAPE = Aval((), np.dtype(object))


def _second_order_while(*a, **k):
    raise NotImplementedError(
        "second derivatives through a traced while_loop are not supported (its reverse mode "
        "walks a recorded tape of the forward run); write the loop with tg.fori_loop or "
        "tg.scan for higher derivatives")


while_fwd_p = register(
    "while_fwd", _while_fwd_impl,
    shape=lambda *avals, cond, body, n_carry, n_cc: tuple(aval_of(a) for a in avals[:n_carry])
    + (_TAPE,),
    vjp=_second_order_while, jvp=_second_order_while, numpy=_no_emitter("while_fwd"),
    n_out=lambda cond, body, n_carry, n_cc: n_carry + 1, may_view=True,
    doc="A while loop that also returns the tape of the carries each step started from "
        "(the forward half of while_loop's reverse mode).")


def _while_bwd_impl(xp, tape, *ops, bwd, n_ct, n_carry):
    ct = list(ops[:n_ct])
    consts = list(ops[n_ct:])
    for c in reversed(tape[()] if isinstance(tape, np.ndarray) else tape):
        ct = run_body(bwd, xp, ct + list(c) + consts)
    return tuple(ct)


while_bwd_p = register(
    "while_bwd", _while_bwd_impl,
    shape=lambda tape, *avals, bwd, n_ct, n_carry: tuple(aval_of(a) for a in avals[:n_ct]),
    vjp=_second_order_while, jvp=_second_order_while, numpy=_no_emitter("while_bwd"),
    n_out=lambda bwd, n_ct, n_carry: n_ct, may_view=True,
    doc="The backward half of while_loop's reverse mode: the body's vjp over the recorded "
        "tape, last step first.")


def _while_jvp(tangents, out, *ops, cond, body, n_carry, n_cc):
    carry, consts = _while_split(ops, n_carry)
    avals = [aval_of(o) for o in ops]
    fc = tuple(_float_positions(avals[:n_carry]))
    bc_av = avals[n_carry + n_cc:]
    fk = tuple(n for n in _float_positions(bc_av))
    tan = [t if t is not None or not is_float(a.dtype) else _zeros(o)
           for t, a, o in zip(tangents, avals, ops)]
    t_c = [tan[i] for i in fc]
    t_k = [tan[n_carry + n_cc + i] for i in fk]
    jb = _scan_jvp_body(body, n_carry, 0, None, fc, (), fk, ())
    # cond reads only the primal carry: (carry, t_carry, cc) -> cond(carry, cc)
    jc = _while_jvp_cond(cond, n_carry, len(fc))
    cc, bc = consts[:n_cc], consts[n_cc:]
    r = list(bind(while_p, *carry, *t_c, *cc, *bc, *t_k, cond=jc, body=jb,
                  n_carry=n_carry + len(fc), n_cc=n_cc))
    res = [None] * n_carry
    for j, i in enumerate(fc):
        res[i] = r[n_carry + j]
    return tuple(res)


def _while_jvp_cond(cond, n_carry, n_t):
    key = ("while_jvp_cond", n_carry, n_t)
    b = cond.memo.get(key)
    if b is None:
        av = list(cond.in_avals)
        avals = av[:n_carry] + [None] * 0
        tav = []
        # tangent carries have the float carries' avals, in order
        for a in av[:n_carry]:
            if is_float(a.dtype):
                tav.append(a)
        avals = av[:n_carry] + tav + av[n_carry:]

        def f(*a):
            return eval_body(cond, list(a[:n_carry]) + list(a[n_carry + n_t:]))[0]
        b, captured, _ = _trace(f, avals)
        cond.memo[key] = b
    return b


while_p = register(
    "while", _while_impl, shape=_while_shape, vjp=_while_vjp, jvp=_while_jvp,
    numpy=_no_emitter("while"), may_view=True, save_out=True,
    n_out=lambda cond, body, n_carry, n_cc: n_carry,
    doc="A while loop over traced cond and body functions.")


# --- cond / switch -----------------------------------------------------------------

def _cond_impl(xp, index, *ops, branches):
    i = int(np.clip(int(index), 0, len(branches) - 1))
    return tuple(run_body(branches[i], xp, list(ops)))


def _cond_shape(index, *avals, branches):
    outs = branches[0].out_avals
    for b in branches[1:]:
        if [(tuple(a.shape), np.dtype(a.dtype)) for a in b.out_avals] != \
                [(tuple(a.shape), np.dtype(a.dtype)) for a in outs]:
            raise TypeError(
                "cond/switch: the branches return different shapes or dtypes: "
                + " vs ".join("(" + ", ".join(f"{a.dtype}{list(a.shape)}" for a in bb.out_avals)
                              + ")" for bb in branches)
                + "; every branch must return the same structure")
    return tuple(outs)


def _cond_vjp(g, out, index, *ops, branches):
    avals = [aval_of(o) for o in ops]
    fo = tuple(_float_positions(avals))
    fy = tuple(_float_positions(branches[0].out_avals))
    g = [gi if gi is not None else _zeros(o) for gi, o in zip(g, out)]
    bb = tuple(_cond_bwd_body(b, fo, fy) for b in branches)
    r = bind(cond_p, index, *ops, *[g[i] for i in fy], branches=bb)
    cts = [None] * (1 + len(ops))
    for j, i in enumerate(fo):
        cts[1 + i] = r[j]
    return tuple(cts)


def _cond_bwd_body(b, fo, fy):
    key = ("cond_bwd", fo, fy)
    r = b.memo.get(key)
    if r is not None:
        return r
    vb = _need("vjp_body")(b, fo)
    avals = list(b.in_avals) + [b.out_avals[i] for i in fy]
    n = len(b.in_avals)

    def f(*a):
        xs, cts_in = list(a[:n]), list(a[n:])
        cts = [cts_in[fy.index(j)] if j in fy else _zeros_aval(o)
               for j, o in enumerate(b.out_avals)]
        return tuple(eval_body(vb, xs + cts))

    r, captured, _ = _trace(f, avals)
    b.memo[key] = r
    return r


def _cond_jvp(tangents, out, index, *ops, branches):
    avals = [aval_of(o) for o in ops]
    fo = tuple(_float_positions(avals))
    fy = tuple(_float_positions(branches[0].out_avals))
    tan = [tangents[1 + i] if tangents[1 + i] is not None else _zeros(ops[i]) for i in fo]
    bb = tuple(_cond_jvp_body(b, fo, fy) for b in branches)
    r = list(bind(cond_p, index, *ops, *tan, branches=bb))
    n = len(out)
    res = [None] * n
    for j, i in enumerate(fy):
        res[i] = r[n + j]
    return tuple(res)


def _cond_jvp_body(b, fo, fy):
    key = ("cond_jvp", fo, fy)
    r = b.memo.get(key)
    if r is not None:
        return r
    jb = _need("jvp_body")(b, fo)
    avals = list(b.in_avals) + [b.in_avals[i] for i in fo]
    n_out = len(b.outputs)

    def f(*a):
        rr = eval_body(jb, list(a))
        return tuple(rr[:n_out]) + tuple(rr[n_out + i] for i in fy)

    r, captured, _ = _trace(f, avals)
    b.memo[key] = r
    return r


def _cond_batch(vals, flags, B, *, branches):
    """vmap of cond: with a batched index both branches run and the results
    are selected per batch element; otherwise each branch is batched."""
    where, reshape, clip, equal = _ops.where, _ops.reshape, _ops.clip, _ops.equal
    index = vals[0]
    if flags[0]:
        n = len(branches)
        idx = clip(index, 0, n - 1)
        per_branch = []
        for b in branches:
            bb = _batched_body(b, tuple(flags[1:]), B)
            per_branch.append(list(bind(cond_p, np.int64(0), *vals[1:], branches=(bb,))))
        outs = per_branch[-1]
        for k in range(n - 2, -1, -1):
            sel = equal(idx, k)
            new = []
            for o_k, o in zip(per_branch[k], outs):
                s = reshape(sel, (B,) + (1,) * (len(o.shape) - 1))
                new.append(where(s, o_k, o))
            outs = new
        return tuple(outs)
    bb = tuple(_batched_body(b, tuple(flags[1:]), B) for b in branches)
    return tuple(bind(cond_p, index, *vals[1:], branches=bb))


cond_p = register(
    "cond", _cond_impl, shape=_cond_shape, vjp=_cond_vjp, jvp=_cond_jvp,
    numpy=_no_emitter("cond"), batch=_cond_batch, may_view=True, save_out=True,
    n_out=lambda branches: len(branches[0].outputs),
    doc="A branch on a traced index: runs one of its traced branch bodies.")


# --- the public functions ------------------------------------------------------------

class _Eager(Exception):
    """Raised while tracing a body that reads an eager Tensor which requires
    grad: the loop runs as a Python loop on the tape instead."""


def _is_tracer(x):
    return hasattr(x, "_trace")


def _is_tensor(x):
    return hasattr(x, "grad_fn")


def _leaf_aval(x):
    if _is_tracer(x):
        return x.aval
    if _is_tensor(x):
        return Aval(tuple(x.shape), np.dtype(x.dtype))
    a = np.asarray(x)
    return Aval(a.shape, a.dtype)


def _face(x):
    return getattr(x, "_face", "numpy")


def _mode(leaves):
    """'trace' when a value is traced, 'eager' when one is a Tensor, else
    None (decided by what the body reads)."""
    if any(_is_tracer(x) for x in leaves):
        return "trace"
    if any(_is_tensor(x) for x in leaves):
        return "eager"
    return None


def _check_int(name, v):
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        return False
    return True


def fori_loop(lower, upper, body_fun, init_val, *, checkpoint=None):
    """``for i in range(lower, upper): val = body_fun(i, val)``; returns val.

    As in JAX: ``init_val`` is any tree of arrays (tuples, lists, dicts); the
    body returns the same structure with the same shapes and dtypes.  Inside
    a compiled function the loop is one graph node (compile time does not
    grow with the trip count) and it is differentiable in both modes and to
    any order.  ``lower`` and ``upper`` are Python ints (use ``static_argnums``
    for a trip count given as an argument), or traced integers, in which case
    the loop becomes a ``while_loop``.

    ``checkpoint`` bounds the memory of reverse mode: by default it stores
    the carry of every step; ``checkpoint=k`` stores every k-th and reruns
    the k steps of a segment during the backward pass (one more forward
    run in all); ``checkpoint=True`` takes k = ceil(sqrt(n)), so n steps
    keep about 2 sqrt(n) carries; ``checkpoint="50MB"`` is a memory budget
    for the stored carries: all of them when they fit, else every
    ceil(sqrt(n))-th, and an error when even that does not fit.  The
    derivatives are the same numbers."""
    if not callable(body_fun):
        raise TypeError(f"fori_loop: body_fun must be callable, got {type(body_fun).__name__}")
    if not (_check_int("lower", lower) and _check_int("upper", upper)):
        if _is_tracer(lower) or _is_tracer(upper):
            # a traced trip count: a while loop over (i, val)
            def c(iv):
                return iv[0] < upper

            def b(iv):
                return (iv[0] + 1, body_fun(iv[0], iv[1]))
            astype = _ops.astype
            lo = lower if _is_tracer(lower) else np.int64(lower)
            return while_loop(c, b, (astype(lo, np.int64) if _is_tracer(lo) else lo,
                                     init_val))[1]
        raise TypeError(f"fori_loop: lower and upper must be integers, got "
                        f"{type(lower).__name__} and {type(upper).__name__}")
    lower, upper = int(lower), int(upper)
    n = max(upper - lower, 0)

    _checkpoint_every(checkpoint, n)    # a bad value is an error in every mode
    leaves = _tree_leaves(init_val)
    mode = _mode(leaves)
    if mode == "eager" or hooks.trace_body is None:
        val = init_val
        for i in range(lower, upper):
            val = body_fun(i, val)
        return val
    out = _scan_core(lambda i, c, x: (body_fun(i, c), None), init_val, None, n, lower,
                     False, "fori_loop", checkpoint)
    return out[0]


_UNITS = {"b": 1, "kb": 10 ** 3, "mb": 10 ** 6, "gb": 10 ** 9,
          "kib": 2 ** 10, "mib": 2 ** 20, "gib": 2 ** 30}


def _budget_bytes(text):
    import re
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmg]i?b|b)\s*", str(text).lower())
    if not m:
        raise ValueError(f"checkpoint={text!r}: a memory budget is written like '50MB', "
                         f"'1.5GiB' or '800kB'")
    return float(m.group(1)) * _UNITS[m.group(2)]


def _checkpoint_every(checkpoint, n, carry_bytes=None):
    """k of checkpoint= (None: every carry is stored).  A budget ('50MB'):
    every carry when they fit, else every ceil(sqrt(n))-th, which holds
    about 2 sqrt(n) carries at once; a budget below that is an error."""
    if isinstance(checkpoint, str):
        budget = _budget_bytes(checkpoint)
        if carry_bytes is None or n * carry_bytes <= budget:
            return None
        k = max(2, int(np.ceil(np.sqrt(max(n, 1)))))
        need = (-(-n // k) + k) * carry_bytes
        if need > budget:
            raise ValueError(
                f"checkpoint={checkpoint!r}: reverse mode through {n} steps of a "
                f"{carry_bytes}-byte carry needs at least {need / 1e6:.3g} MB with "
                f"checkpointing (every {k}-th carry stored and one segment of {k} "
                f"rematerialised); raise the budget or shorten the loop")
        return k
    if checkpoint is None or checkpoint is False:
        return None
    if checkpoint is True:
        return max(2, int(np.ceil(np.sqrt(max(n, 1)))))
    if isinstance(checkpoint, (bool, np.bool_)) or not isinstance(checkpoint, (int, np.integer)) \
            or checkpoint < 1:
        raise ValueError(f"checkpoint= must be None, True, a positive int (store every k-th "
                         f"carry) or a memory budget such as '50MB', got {checkpoint!r}")
    return int(checkpoint) if checkpoint > 1 else None


def scan(f, init, xs=None, length=None, reverse=False, unroll=1, *, checkpoint=None):
    """JAX's ``lax.scan``: ``carry, y = f(carry, x)`` for each leading slice
    ``x`` of ``xs``; returns ``(final carry, stacked ys)``.  ``unroll`` is
    accepted for JAX's signature; the loop is never unrolled (it changes
    only speed in JAX).  ``checkpoint`` as in ``fori_loop`` (not with
    ``reverse=True``, which stores every carry)."""
    if not isinstance(unroll, (bool, int, np.integer)) or unroll < 1:
        raise ValueError(f"scan: unroll must be a positive int or a bool, got {unroll!r}")
    if not callable(f):
        raise TypeError(f"scan: f must be callable, got {type(f).__name__}")
    x_leaves = _tree_leaves(xs)
    lengths = {int(_leaf_aval(x).shape[0]) if _leaf_aval(x).shape else None for x in x_leaves}
    if None in lengths:
        raise ValueError("scan: every leaf of xs needs a leading axis to scan over; got a "
                         "0-d array")
    if length is not None:
        if not _check_int("length", length):
            raise TypeError(f"scan: length must be a Python int, got {type(length).__name__}")
        lengths.add(int(length))
    if len(lengths) > 1:
        raise ValueError(f"scan: the leaves of xs (and length=) disagree on the number of "
                         f"steps: {sorted(lengths)}")
    if not lengths:
        raise ValueError("scan: with no xs, pass length=")
    n = lengths.pop()
    return _scan_core(lambda i, c, x: f(c, x), init, xs, n, None, bool(reverse), "scan",
                      checkpoint)


def _tree_map(f, *trees):
    """``f`` over the leaves of equally structured trees (tuples, lists,
    dicts, None): the eager loops' own small version of the tracer's trees."""
    t = trees[0]
    if isinstance(t, tuple) and not hasattr(t, "_fields"):
        return tuple(_tree_map(f, *z) for z in zip(*trees))
    if isinstance(t, list):
        return [_tree_map(f, *z) for z in zip(*trees)]
    if isinstance(t, dict):
        return {k: _tree_map(f, *[tr[k] for tr in trees]) for k in t}
    if t is None:
        return None
    return f(*trees)


def _tree_leaves(t):
    out = []
    _tree_map(lambda x: out.append(x), t)
    return out


def _stack(leaves):
    stack = _ops.stack
    if any(_is_tensor(v) or _is_tracer(v) for v in leaves):
        return stack(leaves)
    return np.stack([np.asarray(v) for v in leaves])


def _eager_scan(fn, init, xs, n, start, reverse):
    """The Python loop itself (eager values: the tape records every step)."""
    carry = init
    ys = [None] * n
    steps = range(n - 1, -1, -1) if reverse else range(n)
    for k in steps:
        x = _tree_map(lambda leaf: leaf[k], xs)
        i = (start + k) if start is not None else None
        carry, y = fn(i, carry, x)
        ys[k] = y
    if n == 0:
        raise ValueError("scan of length 0 outside a compiled function: nothing to stack")
    return carry, _tree_map(lambda *v: _stack(list(v)), *ys)


class BodyNotRepeatable(Exception):
    """Two traces of a loop body differ: it reads state that changes from
    one iteration to the next (an iterator, a counter, a random draw), so one
    traced iteration cannot stand for all of them."""


def _body_identity(body, captured):
    return body.key, [(c._trace.level, c.id) if _is_tracer(c) else id(c) for c in captured]


def _reads_carry_by_another_name(c_leaves, captured, outer):
    """Does a body read the value a carry entered with other than through the
    carry (a name bound to the same array, which an in-place update of the
    carry changes too)?  Directly, or through ops that depend only on values
    from outside the loop, which tracing records outside it (``outer``: the
    enclosing traces and their sizes before the body was traced)."""
    seen = {(id(x._trace), x.id) for x in c_leaves if _is_tracer(x)}
    for t, start in outer.values():
        for n in t.nodes[start:]:
            if any((id(t), u) in seen for u in n.inputs):
                seen.add((id(t), n.id))
    return any(_is_tracer(c) and (id(c._trace), c.id) in seen for c in captured)


def _scan_core(fn, init, xs, n, start, reverse, who, checkpoint=None, verify=False,
               index_face="numpy"):
    """Trace ``fn(i, carry, x) -> (carry, y)`` once and bind a scan node, or
    run the Python loop when nothing is traced.  ``verify``: trace it twice
    and raise BodyNotRepeatable when the traces differ (for loops rewritten
    from Python source, whose bodies nobody promised to be pure).
    ``index_face``: the dialect of the loop index inside the body."""
    _checkpoint_every(checkpoint, n)    # a bad value is an error in every mode
    if hooks.trace_body is None:   # nothing can be traced: plain values
        return _eager_scan(fn, init, xs, n, start, reverse)
    c_leaves, c_tree = hooks.tree_flatten(init)
    x_leaves, x_tree = hooks.tree_flatten(xs)
    mode = _mode(c_leaves + x_leaves)
    if mode == "eager":
        return _eager_scan(fn, init, xs, n, start, reverse)
    c_avals = [_leaf_aval(x) for x in c_leaves]
    checkpoint = _checkpoint_every(checkpoint, n, sum(
        int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize for a in c_avals))
    x_avals = [Aval(_leaf_aval(x).shape[1:], _leaf_aval(x).dtype) for x in x_leaves]
    idx_aval = [Aval((), np.dtype(np.int64))] if start is not None else []
    faces = [index_face] * len(idx_aval) + [_face(x) for x in c_leaves] + [_face(x) for x in x_leaves]
    n_c, n_x = len(c_leaves), len(x_leaves)
    y_tree_box = []

    def flat_body(*a):
        a = list(a)
        i = a.pop(0) if start is not None else None
        carry = hooks.tree_unflatten(c_tree, a[:n_c])
        x = hooks.tree_unflatten(x_tree, a[n_c:n_c + n_x])
        res = fn(i, carry, x)
        if not isinstance(res, tuple) or len(res) != 2:
            raise TypeError(f"{who}: the scanned function must return a pair (carry, y), "
                            f"got {type(res).__name__}")
        new_c, y = res
        nc_leaves, nc_tree = hooks.tree_flatten(new_c)
        if nc_tree != c_tree:
            raise TypeError(f"{who}: the body returns a carry of another structure than it "
                            f"was given ({_tree_str(nc_tree)} vs {_tree_str(c_tree)}); the "
                            f"carry must keep its structure, shapes and dtypes")
        y_leaves, y_tree = hooks.tree_flatten(y)
        y_tree_box.append(y_tree)
        return tuple(nc_leaves) + tuple(y_leaves)

    outer = {id(x._trace): (x._trace, len(x._trace.nodes)) for x in c_leaves if _is_tracer(x)}
    try:
        body, captured, _ = _trace(flat_body, idx_aval + c_avals + x_avals, faces)
        if verify:
            again = _trace(flat_body, idx_aval + c_avals + x_avals, faces)
            if _body_identity(body, captured) != _body_identity(again[0], again[1]):
                raise BodyNotRepeatable(f"{who}: two traces of its body differ (it reads state that "
                                        f"changes between iterations: an iterator, a counter, "
                                        f"a random draw)")
            if _reads_carry_by_another_name(c_leaves, captured, outer):
                raise BodyNotRepeatable(f"{who}: its body reads a carried array by another name "
                                        f"(y = x before the loop), which an in-place update "
                                        f"of the carry changes too")
    except _Eager:
        return _eager_scan(fn, init, xs, n, start, reverse)
    if mode is None and not any(_is_tracer(c) for c in captured):
        # plain NumPy values all the way: just run the loop
        return _eager_scan(fn, init, xs, n, start, reverse) if who == "scan" else \
            (hooks.tree_unflatten(c_tree, _run_plain(body, c_leaves, n, start, n_c)), None)
    out = bind(scan_p, *c_leaves, *x_leaves, *captured, body=body, length=n, n_carry=n_c,
               n_xs=n_x, start=start, reverse=reverse, **_ckpt(checkpoint))
    out = list(out)
    return (hooks.tree_unflatten(c_tree, out[:n_c]),
            hooks.tree_unflatten(y_tree_box[0], out[n_c:]))


def _run_plain(body, c_leaves, n, start, n_c):
    outs = _scan_impl(np, *[np.asarray(c) for c in c_leaves], body=body, length=n, n_carry=n_c,
                      n_xs=0, start=start, reverse=False)
    return list(outs[:n_c])


def _tree_str(tree):
    return repr(tree).replace("'leaf',", "*").replace("('leaf',)", "*")


def while_loop(cond_fun, body_fun, init_val):
    """``while cond_fun(val): val = body_fun(val)``; returns val (JAX's
    ``lax.while_loop``).  Unlike JAX, reverse mode works: it records the
    forward run's trip count."""
    if not callable(cond_fun) or not callable(body_fun):
        raise TypeError("while_loop: cond_fun and body_fun must be callable")
    def eager():
        val = init_val
        while bool(cond_fun(val)):
            val = body_fun(val)
        return val

    if hooks.trace_body is None:
        return eager()
    c_leaves, c_tree = hooks.tree_flatten(init_val)
    mode = _mode(c_leaves)
    if mode == "eager":
        return eager()
    c_avals = [_leaf_aval(x) for x in c_leaves]
    faces = [_face(x) for x in c_leaves]

    def flat_cond(*a):
        r = cond_fun(hooks.tree_unflatten(c_tree, list(a)))
        ra = _leaf_aval(r)
        if ra.shape != () or ra.dtype != np.bool_:
            raise TypeError(f"while_loop: cond_fun must return a boolean scalar, got "
                            f"{ra.dtype}{list(ra.shape)}")
        return (r,)

    def flat_body(*a):
        new = body_fun(hooks.tree_unflatten(c_tree, list(a)))
        leaves, tree = hooks.tree_flatten(new)
        if tree != c_tree:
            raise TypeError(f"while_loop: body_fun returns another structure than it was "
                            f"given ({_tree_str(tree)} vs {_tree_str(c_tree)})")
        return tuple(leaves)

    try:
        cb, c_cap, _ = _trace(flat_cond, c_avals, faces)
        bb, b_cap, _ = _trace(flat_body, c_avals, faces)
    except _Eager:
        return eager()
    if mode is None and not any(_is_tracer(c) for c in c_cap + b_cap):
        return eager()
    out = bind(while_p, *c_leaves, *c_cap, *b_cap, cond=cb, body=bb, n_carry=len(c_leaves),
               n_cc=len(c_cap))
    return hooks.tree_unflatten(c_tree, list(out))


def switch(index, branches, *operands):
    """Run ``branches[index](*operands)`` (JAX's ``lax.switch``): the index
    is clamped to the valid range; on a traced index the choice is a graph
    node and every branch is traced."""
    branches = list(branches)
    if not branches or not all(callable(b) for b in branches):
        raise TypeError("switch: branches must be a non-empty sequence of callables")
    if not _is_tracer(index):
        i = int(np.clip(int(np.asarray(index._data if _is_tensor(index) else index)),
                        0, len(branches) - 1))
        return branches[i](*operands)
    ia = index.aval
    if ia.shape != ():
        raise TypeError(f"switch/cond: the index (predicate) must be a scalar, got "
                        f"{ia.dtype}{list(ia.shape)}")
    astype = _ops.astype
    idx = index if ia.dtype == np.int64 else astype(index, np.int64)
    return _branch_node(idx, branches, operands)


def _branch_node(idx, branches, operands):
    """A cond node choosing among ``branches`` (each traced once) by ``idx``;
    None if nothing in the branches is traced (then the caller runs one)."""
    leaves, tree = hooks.tree_flatten(operands)
    avals = [_leaf_aval(x) for x in leaves]
    faces = [_face(x) for x in leaves]
    out_trees = []

    def make(fn):
        def flat(*a):
            r = fn(*hooks.tree_unflatten(tree, list(a)))
            rl, rt = hooks.tree_flatten(r)
            out_trees.append(rt)
            return tuple(rl)
        return flat

    bodies, caps = [], []
    for b in branches:
        body, cap, _ = _trace(make(b), avals, faces)
        bodies.append(body)
        caps.append(cap)
    if any(t != out_trees[0] for t in out_trees):
        raise TypeError(f"switch/cond: the branches return different structures: "
                        f"{', '.join(_tree_str(t) for t in out_trees)}")
    # every branch takes every branch's captured values: (operands, caps_0, caps_1, ...)
    allcap = [c for cap in caps for c in cap]
    if allcap:
        n = len(leaves)
        all_avals = avals + [_leaf_aval(c) for c in allcap]
        offs = np.cumsum([0] + [len(c) for c in caps])
        uniform = []
        for k, body in enumerate(bodies):
            def flat2(*a, body=body, lo=n + offs[k], hi=n + offs[k + 1]):
                return tuple(eval_body(body, list(a[:n]) + list(a[lo:hi])))
            ub, cap2, _ = _trace(flat2, all_avals, faces + [_face(c) for c in allcap])
            uniform.append(ub)
        bodies = uniform
    if not _is_tracer(idx) and not any(_is_tracer(x) for x in leaves + allcap):
        return None
    out = bind(cond_p, idx, *leaves, *allcap, branches=tuple(bodies))
    return hooks.tree_unflatten(out_trees[0], list(out))


def checkpoint(fun):
    """``fun`` with its internals rematerialised in reverse mode (JAX's
    ``jax.checkpoint``, torch's ``utils.checkpoint``): inside a compiled
    function its call is one node that keeps only its inputs for the
    backward pass, which reruns ``fun``'s forward to get the values it needs.
    The derivatives are the same; memory drops to the inputs, time grows by
    one forward run of ``fun``.  Eagerly it simply calls ``fun``."""
    if not callable(fun):
        raise TypeError(f"checkpoint: expected a function, got {type(fun).__name__}")
    import functools

    @functools.wraps(fun)
    def rematerialised(*args):
        if hooks.trace_body is None:
            return fun(*args)
        leaves, _ = hooks.tree_flatten(args)
        if any(_is_tensor(x) for x in leaves):
            return fun(*args)
        try:
            out = _branch_node(np.int64(0), [fun], args)
        except _Eager:
            return fun(*args)
        return fun(*args) if out is None else out
    return rematerialised


def cond(pred, true_fun, false_fun, *operands):
    """``true_fun(*operands) if pred else false_fun(*operands)`` (JAX's
    ``lax.cond``); on a traced ``pred`` it is a graph node, differentiable."""
    if not _is_tracer(pred):
        p = pred._data if _is_tensor(pred) else pred
        return true_fun(*operands) if bool(np.asarray(p)) else false_fun(*operands)
    astype = _ops.astype
    return switch(astype(pred, np.int64) if pred.dtype != np.int64 else pred,
                  [false_fun, true_fun], *operands)
