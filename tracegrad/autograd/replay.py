"""Backward replay: compiled code for a tape structure that repeats.

A training loop records the same tape every step: the same primitives with
the same attributes, wired the same way, on arrays of the same shapes.  The
interpreter in ``engine.run`` pays Python dispatch for every node and every
op of every vjp rule, every step.  This module recognises a repeated tape and
runs its backward pass as one generated NumPy function instead (the idea of
PyTorch's "compiled autograd"):

``loss.backward()``, ``y.backward(gradient)`` and ``autograd.grad(y,
leaves)`` (without ``create_graph``) ask ``try_backward`` first:

1. ``try_backward`` walks the tape from the loss, in the order the
   interpreter runs it (newest node first), checks that nothing on it needs
   the interpreter (hooks, retain_grad, anomaly mode, the profiler,
   saved-tensor hooks, nodes other than primitives and leaves, freed or
   modified saved tensors), and builds the structure key: each node's
   primitive, attributes, wiring, the shapes and dtypes of what it saved, and
   the Python numbers it saved (they are constants of the code).
2. The third time a key is seen, ``_build`` runs the very same vjp rules of
   the registry symbolically (``ops.base.vjp_apply``, in the interpreter's
   order, summing cotangents in the interpreter's order), and the code
   generator prints the result as one function: saved arrays (and a given
   cotangent) in, leaf gradients out.  Only the exact passes run on it (folding of constants,
   identities such as x * 1, no reassociation: ``passes.optimize(exact=True)``),
   so the replay computes the interpreter's numbers in the interpreter's
   order and its results are the same to the last bit.
3. From then on a backward with that key gathers the saved arrays, calls the
   function, accumulates into ``.grad`` exactly as the interpreter does (or
   returns the gradients, for autograd.grad), and frees what the nodes that
   ran saved unless ``retain_graph``.

Anything unusual declines (returns None) and the interpreter runs, so every
documented behaviour and error message stays the interpreter's.
``set_backward_replay(False)`` (or ``TRACEGRAD_BACKWARD_REPLAY=0`` in the
environment) turns the replay off.
"""
from __future__ import annotations

import hashlib
import sys
import os
import warnings
from operator import attrgetter

import numpy as np

import tracegrad.eager.engine as _engine
from tracegrad.eager import graph as _graph
from tracegrad.eager.grad_mode import state as _mode
from tracegrad.eager.graph import AccumulateGrad
from tracegrad.ops import primitives
from tracegrad.eager.profiler_state import _state as _prof_state
from tracegrad.eager.tensor import NumpyTensor, Tensor
from tracegrad.eager.nodes import PRIM_NODE_CLASSES, PrimNode

_ndarray = np.ndarray

# Tapes longer than this run in the interpreter: compiling them would cost
# more than a replay saves over a few steps.
MAX_NODES = 400
# How many times a structure is seen before it is compiled: a script that
# calls backward once or twice never pays for the compiler (about 0.2 s to
# import it, then some milliseconds per tape); a loop compiles early on.
COMPILE_AFTER = 3
# Bounds on remembered structures, so a program whose tape changes every step
# (data-dependent control flow) does not grow memory.
MAX_PLANS = 128
MAX_SEEN = 1024

_enabled = os.environ.get("TRACEGRAD_BACKWARD_REPLAY", "1") not in ("0", "false", "no", "off")
_plans = {}   # structure key -> _Plan (or _NO_PLAN)
_seen = {}    # structure key -> times seen before it got a plan
_by_seq = attrgetter("seq")
_NO_PLAN = object()  # the key's tape cannot be compiled: interpret it
_LEAF = "leaf"
stats = {"replays": 0, "compiles": 0, "declined": 0, "uncompilable": 0}
# why the last tape that could not be compiled could not (for debugging;
# TRACEGRAD_EXPLAIN=1 also prints it)
last_error = None


def set_backward_replay(enabled: bool) -> bool:
    """Turn compiled replay of repeated backward passes on or off; returns
    the previous setting.  Results are the same either way."""
    global _enabled
    prev = _enabled
    _enabled = bool(enabled)
    return prev


def is_backward_replay_enabled() -> bool:
    return _enabled


def clear():
    """Forget every compiled tape structure (and zero the counters)."""
    for plan in _plans.values():
        _forget(plan)
    _plans.clear()
    _seen.clear()
    for k in stats:
        stats[k] = 0
    global last_error
    last_error = None


class _Plan:
    __slots__ = ("fn", "leaves", "ran", "fresh", "source", "filename")

    def __init__(self, fn, leaves, ran, fresh, source, filename):
        self.fn = fn            # generated function: saved arrays -> leaf gradients
        self.leaves = leaves    # positions (in the walk) of the leaves it returns
        self.ran = ran          # positions of the nodes whose vjp ran: freed after
        self.fresh = fresh      # per returned gradient: an array of its own?
        self.source = source
        self.filename = filename  # its name in tracebacks (linecache holds the source)


def _forget(plan):
    if type(plan) is _Plan:
        import linecache
        linecache.cache.pop(plan.filename, None)


def _walk(root):
    """Every node reachable from ``root``, newest first: the order in which
    the interpreter runs them (a node is always newer than its inputs)."""
    nodes = [root]
    seen = {root}
    stack = [root]
    while stack:
        for nf in stack.pop().next_functions:
            m = None if nf is None else nf[0]
            if m is not None and m not in seen:
                seen.add(m)
                nodes.append(m)
                stack.append(m)
    nodes.sort(key=_by_seq, reverse=True)
    return nodes


def _gather(nodes, seed_shape, seed_dtype, seed, output_nr):
    """(structure key, saved arrays, node -> position) of the tape, or None
    when some node needs the interpreter.  The arrays come in the order
    ``_build`` reads them: the seed when one is given, then per node its
    saved operands and its saved output.  Without a seed the loss's
    cotangent (ones of ``seed_shape`` and ``seed_dtype``) is a constant of
    the generated code.

    The key is flat; it cannot confuse two tapes because each node's part
    starts with its primitive, attributes, output count and operand count,
    an edge is an int (or a (node, output) pair for outputs 1 and up), and
    every operand adds a pair: (shape, dtype), (type, number) or (type,
    Aval)."""
    index = dict(zip(nodes, range(len(nodes))))
    key = [seed is None, seed_shape, seed_dtype, output_nr]
    arrays = [] if seed is None else [seed]
    put = key.append
    keep = arrays.append
    for n in nodes:
        if n._pre_hooks or n._post_hooks or n._tensor_pre_hooks or n._metadata:
            return None
        tn = type(n)
        if tn is AccumulateGrad:
            put(_LEAF)
            continue
        if (tn is not PrimNode and tn not in PRIM_NODE_CLASSES) or n.freed:
            return None
        attrs = n.attrs
        nfs = n._edges   # one per operand (next_functions is torch's view)
        put(n.prim)
        put(tuple(attrs.items()) if attrs else ())
        put(n._nout)
        put(len(nfs))
        for m, nr in nfs:
            # an edge to output nr > 0 of a node with several outputs: a pair
            put(-1 if m is None else index[m] if nr == 0 else (index[m], nr))
        saved = n.saved
        if saved is not None:
            for a, v in saved:
                ta = type(a)
                if ta is Tensor or ta is NumpyTensor:
                    if v is not None and a._vbox[0] != v:
                        return None  # modified in place: the interpreter says so
                    d = a._data
                    if type(d) is not _ndarray:
                        return None
                    keep(d)
                    put(d.shape)
                    put(d.dtype)
                elif ta is _ndarray:
                    keep(a)
                    put(a.shape)
                    put(a.dtype)
                elif ta is float:
                    put(ta)
                    put(a.hex())   # tells -0.0 from 0.0 (== does not)
                elif ta is int or ta is bool:
                    put(ta)
                    put(a)
                elif isinstance(a, np.generic):   # np.float64(2.0) * x
                    put(ta)
                    put(a.tobytes())
                else:
                    return None  # packed by saved-tensor hooks, or unusual
        else:
            for m in n.in_meta:
                put(type(m))
                put(m.hex() if type(m) is float else m)
        out = n.out_saved
        if out is not None:
            if type(out) is tuple:  # several outputs, each with its version counter
                for o, vb, ver in zip(out, n.out_vbox, n.out_ver):
                    if type(o) is not _ndarray or vb[0] != ver:
                        return None
                    keep(o)
                    put(o.shape)
                    put(o.dtype)
            else:
                if type(out) is not _ndarray or n.out_vbox[0] != n.out_ver:
                    return None
                keep(out)
                put(out.shape)
                put(out.dtype)
    return key, arrays, index


def try_backward(loss, retain_graph, seed=None, inputs=None):
    """Backward from ``loss`` (a Tensor with a grad_fn) through compiled
    code.  seed: the cotangent array (None: ones, as loss.backward()).
    inputs: leaf Tensors whose gradients to return (autograd.grad) instead
    of accumulating into every leaf's ``.grad``.

    Returns None when the interpreter must run it; else True (accumulated)
    or, with inputs, the gradient of each (a Tensor, or None where none
    flows)."""
    if (not _enabled or _mode.anomaly or _prof_state.current is not None
            or _graph._saved_hooks.stack):
        return None
    nodes = _walk(loss.grad_fn)
    if len(nodes) > MAX_NODES:
        return None
    d = loss._data
    got = _gather(nodes, d.shape, d.dtype, seed, loss._output_nr)
    if got is None:
        stats["declined"] += 1
        return None
    key, arrays, index = got
    targets = None
    if inputs is not None:
        targets = []
        for t in inputs:
            if t.grad_fn is not None:
                return None  # a non-leaf input: the interpreter captures it
            acc = t._accum   # a weak reference unless hooks pinned the node
            if acc is not None and type(acc) is not AccumulateGrad:
                acc = acc()
            targets.append(-1 if acc is None else index.get(acc, -1))
        targets = tuple(targets)
        key.append(targets)
    key = tuple(key)
    try:
        plan = _plans.get(key)
    except TypeError:  # an unhashable attribute
        return None
    if plan is None:
        n = _seen.get(key, 0) + 1
        if n < COMPILE_AFTER:
            if len(_seen) >= MAX_SEEN:
                _seen.clear()
            _seen[key] = n
            return None
        _seen.pop(key, None)
        if len(_plans) >= MAX_PLANS:
            _forget(_plans.pop(next(iter(_plans))))
        plan = _plans[key] = _build(nodes, arrays, key, seed is not None, targets)
    if plan is _NO_PLAN:
        return None
    try:
        grads = plan.fn(*arrays)
        failed = None
    except Exception as e:
        failed = e
    if failed is not None:
        # The interpreter decides: an error in the computation itself (a
        # singular matrix in a vjp, say) it raises as always; if it succeeds,
        # the replay was wrong, which is our bug.
        root = Tensor(np.ones(d.shape, d.dtype) if seed is None else seed)
        res = _engine.run((loss,), [root], retain_graph, False, inputs, accumulate=inputs is None)
        _forget(plan)
        _plans[key] = _NO_PLAN
        warnings.warn(f"tracegrad: the compiled backward replay failed ({type(failed).__name__}: "
                      f"{failed}) where the interpreter did not; this tape runs in the "
                      f"interpreter from now on. Please report it.", RuntimeWarning, stacklevel=4)
        return True if inputs is None else res
    if not retain_graph:
        for i in plan.ran:
            nodes[i].release()
    stats["replays"] += 1
    if inputs is None:
        accumulate = _engine._accumulate_array
        for i, gd in zip(plan.leaves, grads):
            leaf = nodes[i].variable
            if leaf is not None:
                accumulate(leaf, gd if type(gd) is _ndarray else np.asarray(gd))
        return True
    # autograd.grad: a gradient that is a constant or a saved array of the
    # code is copied, so the caller may change it in place
    by_node = {}
    for i, gd, fresh in zip(plan.leaves, grads, plan.fresh):
        if type(gd) is not _ndarray:
            gd = np.asarray(gd)
        elif not fresh:
            gd = gd.copy()
        by_node[i] = Tensor(gd)
    return [by_node.get(i) for i in targets]


def _reaching(nodes, index, targets):
    """Per node: does a path from it lead to one of the target positions?"""
    reach = [False] * len(nodes)
    for i in range(len(nodes) - 1, -1, -1):  # inputs come later in the list
        if i in targets:
            reach[i] = True
            continue
        for nf in nodes[i].next_functions:
            if nf is not None and nf[0] is not None and reach[index[nf[0]]]:
                reach[i] = True
                break
    return reach


def _build(nodes, arrays, key, seed_given, targets):
    """Compile the backward pass of this tape (see the module docstring).
    Without targets every leaf reached gets its gradient; with them (the
    positions of autograd.grad's inputs) only those, and only the nodes on a
    path to one run, as in the interpreter."""
    from tracegrad.runtime import pipeline
    from tracegrad.ir.adjoint import _const_tracer
    from tracegrad.runtime.cache import _exec_source
    from tracegrad.ops import add
    from tracegrad.ops.primitives import Aval
    from tracegrad.ops.base import vjp_apply
    from tracegrad.frontend.trace import Trace

    T = Trace("numpy")
    names = []
    pos = 0

    def saved_input(name):
        nonlocal pos
        a = arrays[pos]
        pos += 1
        names.append(name)
        return T.new_input(Aval(a.shape, a.dtype), name)

    index = {n: i for i, n in enumerate(nodes)}
    # cotangents by (node position, output number); the loss is output key[3]
    # of the first node
    if seed_given:
        cts = {(0, key[3]): saved_input("grad")}
    else:
        # the loss's cotangent is ones: a constant, so the exact passes drop
        # multiplications by it (x * 1 is x, to the bit)
        cts = {(0, key[3]): _const_tracer(T, np.ones(key[1], key[2]))}
    reach = None if targets is None else _reaching(nodes, index, set(targets) - {-1})
    leaves, outputs, ran = [], [], []
    raw_before = _mode.raw
    _mode.raw = True  # constant parts of a rule compute as they do in the interpreter
    try:
        for i, n in enumerate(nodes):
            if type(n) is AccumulateGrad:
                g = cts.pop((i, 0), None)
                if g is not None and (reach is None or reach[i]):
                    leaves.append(i)
                    outputs.append(g)
                continue
            prim = n.prim
            if n.saved is not None:
                inputs = [saved_input(f"n{i}_in{k}") if isinstance(a, (Tensor, _ndarray))
                          else a for k, (a, _) in enumerate(n.saved)]
                metas = inputs
            else:
                inputs = metas = n.in_meta
            out = n.out_saved
            if type(out) is tuple:
                out = tuple(saved_input(f"n{i}_out{k}") for k in range(len(out)))
            elif out is not None:
                out = saved_input(f"n{i}_out")
            gs = [cts.pop((i, k), None) for k in range(n._nout)]
            if all(x is None for x in gs):
                continue  # no gradient reached this node: nothing flows on
            if n._nout == 1 and prim.n_out == 1:
                g = gs[0]
            else:
                # outputs that got no gradient get zeros, as the interpreter
                # gives them (engine._materialize)
                metas_out = n.output_meta or ()
                g = tuple(_const_tracer(T, np.zeros(*metas_out[k]))
                          if x is None and k < len(metas_out) and metas_out[k] is not None
                          else x for k, x in enumerate(gs))
            nfs = n._edges   # one per operand, as vjp_apply's needs
            needs = [m is not None and (reach is None or reach[index[m]]) for m, _ in nfs]
            if not any(needs):
                continue  # leads to no input of autograd.grad: the interpreter skips it
            ran.append(i)
            # "<...>": linecache knows such a name is no file and looks no further
            T.loc_override = ("<tape node>", i, "?", prim.backward_name)
            in_cts = vjp_apply(prim, n.attrs, g, out, inputs, metas, needs)
            for (m, nr), ct in zip(nfs, in_cts):
                if m is None or ct is None:
                    continue
                j = (index[m], nr)
                cur = cts.get(j)
                cts[j] = ct if cur is None else add(cur, ct)
        T.outputs = [T.operand(o) for o in outputs]
        g = pipeline.graph_of(T, exact=True)
        fresh = tuple(_computed_here(g, v) for v in g.graph["outputs"])
        khash = hashlib.sha256(repr(key).encode()).hexdigest()[:32]
        doc = (f"Backward of an eager tape of {len(nodes)} nodes, replayed: "
               + ("the loss's cotangent and " if seed_given else "")
               + f"saved arrays in, the gradients of {len(leaves)} leaf tensors out"
               + ("." if seed_given else " (the loss's cotangent is ones)."))
        # the NumPy target whatever the default: the replay starts by itself at
        # a tape's third backward, and native code (vector math, fused sums)
        # would change the gradients there by a few ulp, so two backward
        # passes of the same tape would differ (gradcheck's reentrancy check)
        source = pipeline.generate([(g, "backward", names, doc)], "numpy",
                                   source="eager tape", transform="backward replay", key=khash)
        filename = f"<tracegrad backward replay {khash[:12]}>"
        fn = _exec_source(source, filename, khash)["backward"]
    except Exception as e:
        # A rule that cannot run symbolically (or has no vjp): the
        # interpreter runs this tape and reports any real error itself.
        global last_error
        last_error = f"{type(e).__name__}: {e}"
        stats["uncompilable"] += 1
        _explain(f"a tape of {len(nodes)} nodes stays interpreted: {last_error}")
        return _NO_PLAN
    finally:
        _mode.raw = raw_before
    stats["compiles"] += 1
    _explain(f"compiled the backward of a tape of {len(nodes)} nodes seen {COMPILE_AFTER} "
             f"times ({len(names)} saved arrays, {len(leaves)} leaf gradients)")
    return _Plan(fn, tuple(leaves), tuple(ran), fresh, source, filename)


def _explain(msg):
    if os.environ.get("TRACEGRAD_EXPLAIN"):
        import sys
        print(f"tracegrad: backward replay: {msg}", file=sys.stderr)


def _computed_here(g, v):
    """Is output v an array the generated code made (not an argument, a
    module constant, or a view of one)?"""
    from tracegrad.ir import graph as ir
    while True:
        op = g.nodes[v]["op"]
        if op in ("input", "const"):
            return False
        if op == "proj" or not primitives.get(op).aliases_operands:
            return op != "proj"
        v = ir.operands(g, v)[0]


_engine._replay = sys.modules[__name__]   # the engine asks this module first on backward()
