"""Control flow as graph nodes: loops and branches whose bodies are subgraphs.

``tg.fori_loop``, ``tg.scan``, ``tg.while_loop``, ``tg.cond`` and
``tg.switch`` (JAX's signatures and meaning).  Under tracing the body is
traced ONCE into a ``Body`` (a small graph of primitives) that becomes an
attribute of one node, so a loop of a million steps is one node and compile
time does not depend on the trip count.  Eagerly (Tensors, NumPy arrays)
the Python loop simply runs and the tape records each step.

The primitives, one row each:

* ``scan``: operands (*init, *xs, *consts); the body maps
  ([index,] *carry, *x_k, *consts) -> (*carry, *y_k); outputs
  (*final carry, *stacked ys).  ``fori_loop`` is a scan with an index and
  no xs (``start`` attribute).  Its vjp runs a forward scan that also stacks
  the carries, then a reverse scan over the body's own vjp (a Body derived
  by the adjoint pass); its jvp is a scan over the body's tangent Body; its
  batch rule batches the body.  All derived bodies are ordinary Bodies, so
  derivatives of any order compose.
* ``while``: operands (*init, *consts), a ``cond`` Body and a ``body``
  Body.  Reverse mode records the forward run: ``while_fwd`` runs the loop
  keeping the carry each step starts from (a tape, whose length is the trip
  count) and ``while_bwd`` walks it backwards through the body's vjp, as
  ``scan``'s rule would over that many steps.  ``while_bwd`` also takes the
  loop's init and constants and is differentiated as the function
  J(init, consts)^T ct it computes, through the loop's tangent loop, so
  derivatives of every order are those of the loop unrolled with the
  forward run's trip count.  Its jvp is a while over (carry, tangent);
  vmap runs the batch until every element's cond is false, advancing only
  the elements whose cond holds.
* ``fixed_point``: the answer x* of an iteration x = f(x, *consts) (run
  as a while node on values cut from the gradient), passed through one
  node whose rules are the implicit function theorem's (``tg.fixed_point``).
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
from tracegrad.ops.primitives import Aval, bind, is_float, register, aval_of, mark_weak
from tracegrad.ops.runtime_numpy import _fixed_point_result, _tape_add, _tape_new, _while_steps

__all__ = ["fori_loop", "scan", "while_loop", "cond", "switch", "checkpoint"]
# (fixed_point is public as tg.fixed_point through tracegrad.implicit, which loads the
# tracer and the adjoint pass its rules need)


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


def _trace(fn, avals, faces=None, contain=False):
    """Trace ``fn`` into a Body.  ``contain``: record in it every op run while
    it is traced, also one on values of the enclosing trace only (a branch
    runs only when chosen: such an op hoisted out of it would run, and be
    differentiated, on every call -- an index out of range, 0 * NaN)."""
    if hooks.trace_body is None:
        raise RuntimeError("tracegrad.frontend.trace is not loaded; import tracegrad first")
    return hooks.trace_body(fn, list(avals), faces, contain)


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


def _while_impl(xp, *ops, cond, body, n_carry, n_cc, checkpoint=None):
    carry, consts = _while_split(ops, n_carry)
    cc, bc = consts[:n_cc], consts[n_cc:]
    while bool(run_body(cond, xp, carry + cc)[0]):
        carry = run_body(body, xp, carry + bc)
    return tuple(carry)


def _while_shape(*avals, cond, body, n_carry, n_cc, checkpoint=None):
    carry = [aval_of(a) for a in avals[:n_carry]]
    for j, (a, o) in enumerate(zip(carry, body.out_avals)):
        if tuple(a.shape) != tuple(o.shape) or np.dtype(a.dtype) != np.dtype(o.dtype):
            raise TypeError(f"while_loop: body_fun returns carry {j} as {o.dtype}"
                            f"{list(o.shape)} but it entered as {a.dtype}{list(a.shape)}; "
                            f"a loop carry must keep its shape and dtype")
    return tuple(carry)


def _while_floats(avals, n_carry, n_cc):
    """The float carries and the float body constants (what has derivatives)."""
    return (tuple(_float_positions(avals[:n_carry])),
            tuple(_float_positions(avals[n_carry + n_cc:])))


def _while_reverse(g, ops, cond, body, n_carry, n_cc, checkpoint=None):
    """Reverse mode of the loop at ``ops`` with cotangent ``g`` (one per
    carry; None is zero): ``while_fwd`` runs the loop keeping the carry each
    step starts from (the trip count is the tape's length), and
    ``while_bwd`` walks that tape backwards through the body's vjp, exactly
    as a scan of that many steps would.  Returns (the final carries, one
    cotangent per operand)."""
    carry, consts = _while_split(ops, n_carry)
    cc, bc = consts[:n_cc], consts[n_cc:]
    fc, fk = _while_floats([aval_of(o) for o in ops], n_carry, n_cc)
    ck = {"checkpoint": checkpoint} if checkpoint else {}   # most loops have none
    rec = bind(while_fwd_p, *ops, cond=cond, body=body, n_carry=n_carry, n_cc=n_cc, **ck)
    outs, tape = list(rec[:n_carry]), rec[n_carry]
    gf = [g[i] if g[i] is not None else _zeros(outs[i]) for i in fc]
    acc0 = [_zeros(bc[i]) for i in fk]
    bwd = _while_bwd_body(cond, body, n_carry, n_cc, fc, fk)
    r = list(bind(while_bwd_p, tape, *gf, *acc0, *bc, *carry, *cc, bwd=bwd,
                  n_ct=len(fc) + len(fk), n_carry=n_carry, cond=cond, body=body, n_cc=n_cc,
                  **ck))
    cts = [None] * len(ops)
    for j, i in enumerate(fc):
        cts[i] = r[j]
    for j, i in enumerate(fk):
        cts[n_carry + n_cc + i] = r[len(fc) + j]
    return outs, cts


def _while_vjp(g, out, *ops, cond, body, n_carry, n_cc, checkpoint=None):
    return tuple(_while_reverse(list(g), ops, cond, body, n_carry, n_cc, checkpoint)[1])


def _while_bwd_body(cond, body, n_carry, n_cc, fc, fk):
    """The step of ``while_bwd``: (ct[fc], acc[fk], carry_k, body consts,
    init, cond consts) -> (ct_prev[fc], acc + ct_consts[fk]).  The loop's
    init and cond consts are operands of ``while_bwd`` only for its own
    derivatives (they define the loop the tape records); the step ignores
    them."""
    key = ("while_bwd", cond.key, n_carry, n_cc, fc, fk)
    b = body.memo.get(key)
    if b is not None:
        return b
    sb = _scan_bwd_body(body, n_carry, 0, None, fc, (), fk, ())
    n_in = len(sb.inputs)

    def f(*a):
        return tuple(eval_body(sb, list(a[:n_in])))
    b, _, _ = _trace(f, list(sb.in_avals) + list(body.in_avals[:n_carry])
                     + list(cond.in_avals[n_carry:]))
    body.memo[key] = b
    return b


def _while_fwd_impl(xp, *ops, cond, body, n_carry, n_cc, checkpoint=None):
    carry, consts = _while_split(ops, n_carry)
    cc, bc = consts[:n_cc], consts[n_cc:]
    steps = _tape_new(*checkpoint) if checkpoint else []
    while bool(run_body(cond, xp, carry + cc)[0]):
        if checkpoint:
            _tape_add(steps, tuple(carry))
        else:
            steps.append(tuple(carry))
        carry = run_body(body, xp, carry + bc)
    tape = np.empty((), dtype=object)
    tape[()] = steps
    return tuple(carry) + (tape,)


_TAPE = Aval((), np.dtype(object))


# Derivatives of any order.  The tape is a cache of the forward run, not a
# differentiable value: ``while_bwd`` also takes the loop's init and
# constants, and is differentiated as the function it computes,
#     G(init, consts, ct) = J(init, consts)^T ct
# (J the Jacobian of the loop run for the recorded trip count).  With the
# loop's tangent loop W' ((carry, t_carry) -> (body, jvp of body), the
# while node's own jvp):
#   * jvp of G along (dx, dθ, dct) = the vjp of W' at (init, dx; consts, dθ)
#     with cotangent (dct on the carries, ct on their tangents), read at
#     (init, consts): forward-over-reverse is reverse-over-forward;
#   * vjp of G with cotangent w: ct gets J w (W' run from (init, w)), the
#     accumulator w_θ, and (init, consts) the vjp of W' at (init, w) with
#     cotangent (0, ct).
# Both are while_fwd / while_bwd nodes of W', so every order recurses onto
# the same two rules: the derivative equals that of the unrolled loop with
# the forward run's trip count.

def _jvp_loop(cond, body, n_carry, fc, fk):
    """(cond, body) of the tangent loop W': carries (carry, t_carry[fc]),
    body consts (consts, t_consts[fk]); cond consts unchanged."""
    return (_while_jvp_cond(cond, n_carry, len(fc)),
            _scan_jvp_body(body, n_carry, 0, None, fc, (), fk, ()))


def _bwd_split(ops, n_ct, n_carry, n_cc):
    """while_bwd's operands after the tape: ct+acc, body consts, init, cond consts."""
    n_bc = len(ops) - n_ct - n_carry - n_cc
    cts = list(ops[:n_ct])
    bc = list(ops[n_ct:n_ct + n_bc])
    init = list(ops[n_ct + n_bc:n_ct + n_bc + n_carry])
    cc = list(ops[n_ct + n_bc + n_carry:])
    return cts, bc, init, cc


def _while_fwd_vjp(g, out, *ops, cond, body, n_carry, n_cc, checkpoint=None):
    # the tape carries no cotangent: while_bwd's own rules account for it
    return tuple(_while_reverse(list(g[:n_carry]), ops, cond, body, n_carry, n_cc,
                                checkpoint)[1])


def _while_fwd_jvp(tangents, out, *ops, cond, body, n_carry, n_cc, checkpoint=None):
    # the tape has no tangent (while_bwd's tangent reruns W' for its own)
    return _while_tangent(while_fwd_p, tangents, ops, cond, body, n_carry, n_cc) + (None,)


def _while_bwd_jvp(tangents, out, tape, *ops, bwd, n_ct, n_carry, cond, body, n_cc,
                   checkpoint=None):
    cts, bc, init, cc = _bwd_split(ops, n_ct, n_carry, n_cc)
    t_cts, t_bc, t_init, _ = _bwd_split(list(tangents[1:]), n_ct, n_carry, n_cc)
    fc, fk = _while_floats([aval_of(o) for o in init + cc + bc], n_carry, n_cc)
    nf = len(fc)
    dx = [t_init[i] if t_init[i] is not None else _zeros(init[i]) for i in fc]
    dk = [t_bc[i] if t_bc[i] is not None else _zeros(bc[i]) for i in fk]
    jc, jb = _jvp_loop(cond, body, n_carry, fc, fk)
    g2 = [None] * (n_carry + nf)
    for j, i in enumerate(fc):
        g2[i] = t_cts[j]
        g2[n_carry + j] = cts[j]
    _, r = _while_reverse(g2, init + dx + cc + bc + dk, jc, jb, n_carry + nf, n_cc)
    add = _ops.add
    res = [r[i] for i in fc]
    for j, i in enumerate(fk):
        d = r[n_carry + nf + n_cc + i]
        t_acc = t_cts[nf + j]
        res.append(d if t_acc is None else add(t_acc, d))
    return tuple(res)


def _while_bwd_vjp(g, out, tape, *ops, bwd, n_ct, n_carry, cond, body, n_cc, checkpoint=None):
    cts, bc, init, cc = _bwd_split(ops, n_ct, n_carry, n_cc)
    fc, fk = _while_floats([aval_of(o) for o in init + cc + bc], n_carry, n_cc)
    nf, n_bc = len(fc), len(bc)
    # each output has its ct / acc operand's shape
    w = [gi if gi is not None else _zeros(o) for gi, o in zip(g, cts)]
    jc, jb = _jvp_loop(cond, body, n_carry, fc, fk)
    g2 = [None] * (n_carry + nf)
    for j in range(nf):
        g2[n_carry + j] = cts[j]
    outs2, r = _while_reverse(g2, init + w[:nf] + cc + bc + w[nf:], jc, jb, n_carry + nf, n_cc)
    res = [None] * (1 + len(ops))
    for j in range(nf):
        res[1 + j] = outs2[n_carry + j]             # ct: J w
    for j in range(len(fk)):
        res[1 + nf + j] = w[nf + j]                  # the accumulator passes w_θ
    for i in fk:
        res[1 + n_ct + i] = r[n_carry + nf + n_cc + i]
    for i in fc:
        res[1 + n_ct + n_bc + i] = r[i]
    return tuple(res)


# vmap of a loop (tg.vmap; the batched tangents of tg.jacfwd and tg.hessian):
# one loop over the batch that runs while any element's cond holds and
# advances only those elements (a select per step), so each element takes
# its own trip count and the graph does not grow with the batch.  Every
# carry and body constant gets the batch axis, so the three rows below batch
# onto the same loop (the batched tape is that loop's tape) and their
# derivatives are the per-element ones.

def _batched_loop(cond, body, n_carry, n_cc, cflags, B):
    """(cond, body) of the batched loop: carries and body consts batched,
    cond consts batched where ``cflags``; the body reads the cond consts
    (for the select) before its own: body consts (cc, bc)."""
    key = ("batched_loop", cond.key, n_carry, n_cc, cflags, B)
    r = body.memo.get(key)
    if r is not None:
        return r
    where, reshape, any_ = _ops.where, _ops.reshape, _ops.any
    n_bc = len(body.in_avals) - n_carry
    cb = _batched_body(cond, (True,) * n_carry + tuple(cflags), B)
    bb = _batched_body(body, (True,) * (n_carry + n_bc), B)
    c_av = [Aval((B,) + tuple(a.shape), a.dtype) for a in body.in_avals[:n_carry]]
    cc_av = [Aval(((B,) if f else ()) + tuple(a.shape), a.dtype)
             for a, f in zip(cond.in_avals[n_carry:], cflags)]
    bc_av = [Aval((B,) + tuple(a.shape), a.dtype) for a in body.in_avals[n_carry:]]

    def c(*a):
        return (any_(eval_body(cb, list(a))[0]),)

    def b(*a):
        a = list(a)
        carry, cc, bc = a[:n_carry], a[n_carry:n_carry + n_cc], a[n_carry + n_cc:]
        act = eval_body(cb, carry + cc)[0]
        new = eval_body(bb, carry + bc)
        return tuple(where(reshape(act, (B,) + (1,) * (len(o.shape) - 1)), n, o)
                     for n, o in zip(new, carry))
    wc, _, _ = _trace(c, c_av + cc_av)
    wb, _, _ = _trace(b, c_av + cc_av + bc_av)
    body.memo[key] = (wc, wb)
    return wc, wb


def _batched_operands(init, cc, bc, cflags, B, cond, body, n_carry, n_cc):
    """The batched loop's (cond, body, operands): init and body consts
    broadcast to the batch."""
    from tracegrad.ops.base import broadcast_to

    def full(v, f):
        return v if f else broadcast_to(v, (B,) + tuple(getattr(v, "shape", ())))
    init = [full(v, f) for v, f in init]
    bc = [full(v, f) for v, f in bc]
    wc, wb = _batched_loop(cond, body, n_carry, n_cc, tuple(cflags), B)
    return wc, wb, init + list(cc) + list(cc) + bc


def _while_batch_rule(name):
    def batch(vals, flags, B, *, cond, body, n_carry, n_cc, checkpoint=None):
        prim = while_p if name == "while" else while_fwd_p
        vf = list(zip(vals, flags))
        init, cc, bc = vf[:n_carry], vf[n_carry:n_carry + n_cc], vf[n_carry + n_cc:]
        wc, wb, ops = _batched_operands(init, [v for v, _ in cc], bc, [f for _, f in cc], B,
                                        cond, body, n_carry, n_cc)
        return bind(prim, *ops, cond=wc, body=wb, n_carry=n_carry, n_cc=n_cc)
    return batch


def _while_bwd_batch(vals, flags, B, *, bwd, n_ct, n_carry, cond, body, n_cc,
                     checkpoint=None):
    """while_bwd over a batch: the reverse mode of the batched loop (its
    tape is the batched while_fwd's, which the same operands share)."""
    from tracegrad.ops.base import broadcast_to
    vf = list(zip(vals[1:], flags[1:]))
    cts, bc, init, cc = _bwd_split(vf, n_ct, n_carry, n_cc)
    fc, fk = _while_floats([aval_of(v) for v, _ in init + cc + bc], n_carry, n_cc)
    wc, wb, ops = _batched_operands(init, [v for v, _ in cc], bc, [f for _, f in cc], B,
                                    cond, body, n_carry, n_cc)
    cts = [v if f else broadcast_to(v, (B,) + tuple(v.shape)) for v, f in cts]
    g = [None] * n_carry
    for j, i in enumerate(fc):
        g[i] = cts[j]
    _, r = _while_reverse(g, ops, wc, wb, n_carry, n_cc)
    add = _ops.add
    return tuple([r[i] for i in fc]
                 + [add(cts[len(fc) + j], r[n_carry + 2 * n_cc + i]) for j, i in enumerate(fk)])

while_fwd_p = register(
    "while_fwd", _while_fwd_impl,
    shape=lambda *avals, cond, body, n_carry, n_cc, checkpoint=None:
    tuple(aval_of(a) for a in avals[:n_carry]) + (_TAPE,),
    vjp=_while_fwd_vjp, jvp=_while_fwd_jvp, numpy=_no_emitter("while_fwd"),
    batch=_while_batch_rule("while_fwd"),
    n_out=lambda cond, body, n_carry, n_cc, checkpoint=None: n_carry + 1, may_view=True,
    doc="A while loop that also returns the tape of the carries each step started from "
        "(the forward half of while_loop's reverse mode).")


def _while_bwd_impl(xp, tape, *ops, bwd, n_ct, n_carry, cond, body, n_cc, checkpoint=None):
    ct = list(ops[:n_ct])
    consts = list(ops[n_ct:])
    bc = _bwd_split(ops, n_ct, n_carry, n_cc)[1]
    for c in _while_steps(tape, lambda *a: tuple(run_body(body, xp, list(a))), bc):
        ct = run_body(bwd, xp, ct + list(c) + consts)
    return tuple(ct)


while_bwd_p = register(
    "while_bwd", _while_bwd_impl,
    shape=lambda tape, *avals, bwd, n_ct, n_carry, cond, body, n_cc, checkpoint=None:
    tuple(aval_of(a) for a in avals[:n_ct]),
    vjp=_while_bwd_vjp, jvp=_while_bwd_jvp, numpy=_no_emitter("while_bwd"), batch=_while_bwd_batch,
    n_out=lambda bwd, n_ct, n_carry, cond, body, n_cc, checkpoint=None: n_ct, may_view=True,
    doc="The backward half of while_loop's reverse mode: the body's vjp over the recorded "
        "tape, last step first.  Operands: (tape, ct, acc, body consts, init, cond consts); "
        "differentiable to any order as J(init, consts)^T ct.")


def _while_jvp(tangents, out, *ops, cond, body, n_carry, n_cc, checkpoint=None):
    return _while_tangent(while_p, tangents, ops, cond, body, n_carry, n_cc)


def _while_tangent(prim, tangents, ops, cond, body, n_carry, n_cc):
    """Forward mode: the loop W' over (carry, tangent), bound as ``prim``
    (``while``; ``while_fwd`` for while_fwd's own tangent, whose W' run is
    then the one while_bwd's tangent records); the carries' tangents."""
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
    r = list(bind(prim, *carry, *t_c, *cc, *bc, *t_k, cond=jc, body=jb,
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
    numpy=_no_emitter("while"), batch=_while_batch_rule("while"), may_view=True, save_out=True,
    n_out=lambda cond, body, n_carry, n_cc, checkpoint=None: n_carry,
    doc="A while loop over traced cond and body functions.  ``checkpoint`` (every, cap): "
        "its reverse mode keeps every ``every``-th carry (every > 0), or a spacing that "
        "doubles to keep at most ``cap`` carries (cap 0: about 2 sqrt(steps)), and reruns "
        "the steps between two kept carries during the backward pass.")


# --- fixed_point ---------------------------------------------------------------------
# x* = f(x*, *params), found by iterating f; differentiated by the implicit
# function theorem at x*, never through the iterations.  The iteration is a
# while node (on values cut from the gradient: nothing differentiates it);
# one ``fixed_point`` node then passes x* through and holds the rules:
#   vjp: u = g + J_x^T u (the adjoint, itself a fixed point of the same
#        kind), then ct_params = J_params^T u;
#   jvp: t = J_x t + J_params dparams (a fixed point too).
# Both read the node's own output x*, so derivatives of any order go through
# the same rules again.

def _fp_tol(tol, avals):
    if tol is None:
        eps = max(float(np.finfo(a.dtype).eps) for a in avals)
        return 1e-10 if eps < 1e-15 else 1e-5 if eps < 1e-6 else 1e-2
    if isinstance(tol, (bool, np.bool_)) or not isinstance(tol, (int, float, np.floating,
                                                                 np.integer)) or not tol > 0:
        raise ValueError(f"tg.fixed_point: tol must be a positive number, got {tol!r}")
    return float(tol)


def _fp_loop(body, nx, tol, max_iter):
    """(cond, body) of the iteration: carries (x..., change, count), body
    consts the params; ``change`` is max |x_new - x| / (1 + |x_new|) over
    every element (NaN never counts as converged)."""
    key = ("fixed_point_loop", nx, tol, max_iter)
    r = body.memo.get(key)
    if r is not None:
        return r
    o = _ops
    x_av = list(body.in_avals[:nx])
    k_av = list(body.in_avals[nx:])
    s_av = [Aval((), np.dtype(np.float64)), Aval((), np.dtype(np.int64))]

    def cond(*a):     # a NaN change stops the loop too (the check then says so)
        err, k = a[nx], a[nx + 1]
        return (o.logical_and(o.greater(err, tol), o.less(k, max_iter)),)

    def step(*a):
        a = list(a)
        x, k, consts = a[:nx], a[nx + 1], a[nx + 2:]
        new = eval_body(body, x + consts)
        err = np.float64(0.0)
        for xn, xo in zip(new, x):
            if int(np.prod(xn.shape)) == 0:
                continue
            d = o.div(o.abs(o.sub(xn, xo)), o.add(o.abs(xn), 1.0))
            err = o.maximum(err, o.astype(o.amax(d), np.float64))
        return tuple(new) + (err, o.add(k, np.int64(1)))
    wc, _, _ = _trace(cond, x_av + s_av)
    wb, _, _ = _trace(step, x_av + s_av + k_av)
    body.memo[key] = (wc, wb)
    return wc, wb


def _fixed_point_apply(body, x0, consts, tol, max_iter):
    """x* of ``body`` (x..., consts...) -> x... from x0: the iteration, then
    the fixed_point node (traced values and Tensors) or its check (arrays)."""
    nx = len(x0)
    wc, wb = _fp_loop(body, nx, tol, max_iter)
    start = [np.float64(np.inf), np.int64(0)]
    if any(_is_tracer(v) for v in list(x0) + list(consts)):
        sg = _ops.stop_gradient
        cut = [sg(v) if _is_tracer(v) else v for v in list(x0) + list(consts)]
        r = list(bind(while_p, *cut[:nx], *start, *cut[nx:], cond=wc, body=wb,
                      n_carry=nx + 2, n_cc=0))
    else:
        from tracegrad.ops.primitives import array_module
        raw = [v._data if _is_tensor(v) else v for v in list(x0) + list(consts)]
        xp = array_module(*raw)
        raw = [xp.asarray(v) for v in raw]
        r = list(_while_impl(xp, *raw[:nx], *start, *raw[nx:], cond=wc, body=wb,
                             n_carry=nx + 2, n_cc=0))
    ops = r[:nx] + r[nx:nx + 2] + list(consts)
    attrs = dict(body=body, nx=nx, tol=tol, max_iter=max_iter)
    if any(_is_tracer(v) or _is_tensor(v) for v in list(x0) + list(consts)):
        return list(bind(fixed_point_p, *ops, **attrs))
    return list(_fixed_point_impl(np, *ops, **attrs))


def _fixed_point_impl(xp, *ops, body, nx, tol, max_iter):
    return _fixed_point_result(ops[nx], ops[nx + 1], tol, max_iter, *ops[:nx])


def _fp_adjoint_body(body, nx, fk):
    """u -> g + J_x^T u at (x*, consts): inputs (u..., x..., consts..., g...)."""
    key = ("fixed_point_adjoint", nx, fk)
    b = body.memo.get(key)
    if b is not None:
        return b
    vb = _fp_vjp_body(body, nx, fk)
    x_av, k_av = list(body.in_avals[:nx]), list(body.in_avals[nx:])
    add = _ops.add

    def f(*a):
        a = list(a)
        u, x, k, g = a[:nx], a[nx:2 * nx], a[2 * nx:2 * nx + len(k_av)], a[2 * nx + len(k_av):]
        r = eval_body(vb, x + k + u)
        return tuple(add(gi, ri) for gi, ri in zip(g, r[:nx]))
    b, _, _ = _trace(f, x_av + x_av + k_av + x_av)
    body.memo[key] = b
    return b


def _fp_vjp_body(body, nx, fk):
    key = ("fixed_point_vjp", nx, fk)
    b = body.memo.get(key)
    if b is None:
        b = body.memo[key] = _need("vjp_body")(body, tuple(range(nx)) + tuple(nx + i for i in fk))
    return b


def _fp_tangent_body(body, nx, fk):
    """t -> J_x t + J_consts dk at (x*, consts): inputs (t..., x..., consts..., dk[fk]...)."""
    key = ("fixed_point_tangent", nx, fk)
    b = body.memo.get(key)
    if b is not None:
        return b
    jb = _need("jvp_body")(body, tuple(range(nx)) + tuple(nx + i for i in fk))
    x_av, k_av = list(body.in_avals[:nx]), list(body.in_avals[nx:])

    def f(*a):
        a = list(a)
        t, x = a[:nx], a[nx:2 * nx]
        k, dk = a[2 * nx:2 * nx + len(k_av)], a[2 * nx + len(k_av):]
        return tuple(eval_body(jb, x + k + t + dk)[nx:])
    b, _, _ = _trace(f, x_av + x_av + k_av + [k_av[i] for i in fk])
    body.memo[key] = b
    return b


def _fixed_point_vjp(g, out, *ops, body, nx, tol, max_iter):
    consts = list(ops[nx + 2:])
    fk = tuple(_float_positions([aval_of(c) for c in consts]))
    cts = [None] * len(ops)
    if not fk:
        return tuple(cts)
    xs = list(out)
    g = [gi if gi is not None else _zeros(o) for gi, o in zip(g, xs)]
    u = _fixed_point_apply(_fp_adjoint_body(body, nx, fk), g, xs + consts + g, tol, max_iter)
    r = eval_body(_fp_vjp_body(body, nx, fk), xs + consts + u)
    for j, i in enumerate(fk):
        cts[nx + 2 + i] = r[nx + j]
    return tuple(cts)


def _fixed_point_jvp(tangents, out, *ops, body, nx, tol, max_iter):
    consts = list(ops[nx + 2:])
    t_k = list(tangents[nx + 2:])
    fk = tuple(i for i, (c, t) in enumerate(zip(consts, t_k))
               if t is not None and is_float(aval_of(c).dtype))
    if not fk:
        return (None,) * nx
    xs = list(out)
    t0 = [_zeros(x) for x in xs]
    return tuple(_fixed_point_apply(_fp_tangent_body(body, nx, fk), t0,
                                    xs + consts + [t_k[i] for i in fk], tol, max_iter))


def _fixed_point_numpy(names, body, nx, tol, max_iter):
    return (f"_fixed_point_result({names[nx]}, {names[nx + 1]}, {tol!r}, {max_iter!r}, "
            f"{', '.join(names[:nx])})")


def _fixed_point_batch(vals, flags, B, *, body, nx, tol, max_iter):
    """vmap: the fixed point of the batched map (each element's own: the
    batched iteration ran until every element converged)."""
    from tracegrad.ops.base import broadcast_to
    amax = _ops.amax
    xs = [v if f else broadcast_to(v, (B,) + tuple(v.shape)) for v, f in
          zip(vals[:nx], flags[:nx])]
    err, k = [amax(v) if f else v for v, f in zip(vals[nx:nx + 2], flags[nx:nx + 2])]
    bb = _batched_body(body, (True,) * nx + tuple(flags[nx + 2:]), B)
    return tuple(bind(fixed_point_p, *xs, err, k, *vals[nx + 2:], body=bb, nx=nx, tol=tol,
                      max_iter=max_iter))


fixed_point_p = register(
    "fixed_point", _fixed_point_impl,
    shape=lambda *avals, body, nx, tol, max_iter: tuple(aval_of(a) for a in avals[:nx]),
    vjp=_fixed_point_vjp, jvp=_fixed_point_jvp, numpy=_fixed_point_numpy,
    helpers=("_fixed_point_result",), n_out=lambda body, nx, tol, max_iter: nx,
    batch=_fixed_point_batch, may_view=True, save_out=True,
    doc="The fixed point x* = f(x*, consts) an iteration reached (operands: x*, the last "
        "change, the iteration count, consts): passes x* through, raises when the iteration "
        "did not converge; derivatives by the implicit function theorem.")


def fixed_point(f, x0, *params, tol=None, max_iter=1000):
    """The fixed point ``x* = f(x*, *params)``, found by iterating
    ``x = f(x, *params)`` from ``x0`` until the change of every element is
    at most ``tol * (1 + |x|)`` (default: 1e-10 in float64, 1e-5 in
    float32); a RuntimeError when ``max_iter`` iterations do not get there.

    Its derivatives come from the implicit function theorem at x*, not from
    the iterations: reverse mode solves ``u = g + (df/dx)^T u`` by the same
    kind of iteration, forward mode ``t = (df/dx) t + (df/dparams) dparams``;
    both are fixed points again, so derivatives of any order work.  They are
    derivatives with respect to ``params`` and to traced values ``f`` reads
    from its closure; x* does not depend on ``x0`` (its gradient is zero).
    ``f`` must be a contraction near x* for the iterations to converge.
    ``x0`` is an array or a tree (tuple, list, dict) of float arrays, which
    ``f`` returns with the same structure, shapes and dtypes.  Works inside
    compiled functions, eagerly on Tensors and on plain arrays."""
    if not callable(f):
        raise TypeError(f"tg.fixed_point: f must be callable, got {type(f).__name__}")
    if not _check_int("max_iter", max_iter) or max_iter < 1:
        raise ValueError(f"tg.fixed_point: max_iter must be a positive int, got {max_iter!r}")
    if hooks.trace_body is None:
        raise RuntimeError("fixed_point needs the tracer and the adjoint pass: call it as "
                           "tg.fixed_point (which loads them), or import tracegrad.api first")
    x_leaves, x_tree = hooks.tree_flatten(x0)
    p_leaves, p_tree = hooks.tree_flatten(tuple(params))
    if not x_leaves:
        raise TypeError("tg.fixed_point: x0 holds no arrays")
    x_avals = [_leaf_aval(x) for x in x_leaves]
    for a in x_avals:
        if not is_float(a.dtype):
            raise TypeError(f"tg.fixed_point: x0 must hold floating-point arrays, got "
                            f"{a.dtype}{list(a.shape)}; pass x0.astype(float)")
    tol = _fp_tol(tol, x_avals)
    nx = len(x_leaves)

    def flat(*a):
        x = hooks.tree_unflatten(x_tree, list(a[:nx]))
        ps = hooks.tree_unflatten(p_tree, list(a[nx:]))
        new = f(x, *ps)
        leaves, tree = hooks.tree_flatten(new)
        if tree != x_tree:
            raise TypeError(f"tg.fixed_point: f returns another structure than x0 "
                            f"({_tree_str(tree)} vs {_tree_str(x_tree)}); f(x, *params) must "
                            f"return x's structure")
        for j, (v, a0) in enumerate(zip(leaves, x_avals)):
            av = _leaf_aval(v)
            if tuple(av.shape) != tuple(a0.shape) or np.dtype(av.dtype) != np.dtype(a0.dtype):
                leaf = f" (leaf {j})" if nx > 1 else ""
                raise TypeError(f"tg.fixed_point: f changes x{leaf} from {a0.dtype}"
                                f"{list(a0.shape)} to {av.dtype}"
                                f"{list(av.shape)}; a fixed-point map must keep the shape and "
                                f"dtype of x (cast with .astype, or start from an x0 of the "
                                f"result's shape and dtype)")
        return tuple(leaves)

    try:
        body, captured, _ = _trace(flat, x_avals + [_leaf_aval(p) for p in p_leaves],
                                   [_face(x) for x in x_leaves] + [_face(p) for p in p_leaves])
    except _Eager:
        raise TypeError("tg.fixed_point: f reads a Tensor that requires grad from its "
                        "closure; pass it in params (tg.fixed_point(f, x0, *params)) so its "
                        "gradient goes through the implicit function theorem") from None
    out = _fixed_point_apply(body, x_leaves, p_leaves + list(captured), tol, max_iter)
    return hooks.tree_unflatten(x_tree, out)

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
        if i is not None:
            mark_weak(i)      # it stands for the Python int of the loop as written
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


def while_policy(checkpoint, carry_bytes):
    """``checkpoint=`` of a while loop (whose trip count is not known before
    it runs) as its node's attribute (every, cap): an int k keeps every
    k-th carry; True a spacing that doubles as the loop runs, keeping about
    2 sqrt(steps) carries; a budget ('50MB') a spacing that doubles to keep
    the kept carries within half of it.  None: every carry is kept."""
    if checkpoint is None or checkpoint is False:
        return None
    if checkpoint is True:
        return (0, 0)
    if isinstance(checkpoint, str):
        budget = _budget_bytes(checkpoint)
        return (0, max(2, int(budget // (2 * max(carry_bytes, 1)))))
    if isinstance(checkpoint, (int, np.integer)) and not isinstance(checkpoint, bool) \
            and checkpoint >= 1:
        return (int(checkpoint), 0) if checkpoint > 1 else None
    raise ValueError(f"checkpoint={checkpoint!r}: give an int k >= 1 (every k-th carry), True "
                     f"(about 2 sqrt(n) carries) or a memory budget such as '50MB'")


def while_loop(cond_fun, body_fun, init_val, *, checkpoint=None, contain=False):
    """``while cond_fun(val): val = body_fun(val)``; returns val (JAX's
    ``lax.while_loop``).  Unlike JAX, reverse mode works, to any order: it
    records the forward run (its trip count and the states it visited), and
    every derivative is that of the loop unrolled for that trip count.
    ``checkpoint`` bounds the memory of reverse mode (``while_policy``):
    the derivatives are the same numbers, for about one more forward run.
    ``contain``: every op the bodies run is recorded in them, also one on
    values from outside only (a Python loop's body, converted: it runs each
    iteration as written, and not at all when the loop does not run)."""
    if not callable(cond_fun) or not callable(body_fun):
        raise TypeError("while_loop: cond_fun and body_fun must be callable")
    while_policy(checkpoint, 1)     # a bad value is an error in every mode
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
        cb, c_cap, _ = _trace(flat_cond, c_avals, faces, contain)
        bb, b_cap, _ = _trace(flat_body, c_avals, faces, contain)
    except _Eager:
        return eager()
    if mode is None and not any(_is_tracer(c) for c in c_cap + b_cap):
        return eager()
    policy = while_policy(checkpoint, sum(int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize
                                          for a in c_avals))
    out = bind(while_p, *c_leaves, *c_cap, *b_cap, cond=cb, body=bb, n_carry=len(c_leaves),
               n_cc=len(c_cap), **({"checkpoint": policy} if policy else {}))
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
        body, cap, _ = _trace(make(b), avals, faces, contain=True)
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
            ub, cap2, _ = _trace(flat2, all_avals, faces + [_face(c) for c in allcap],
                                 contain=True)
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
