"""The public compile-mode API: tg.compile, grad, value_and_grad, vjp, jvp,
jacobian/jacrev, jacfwd, hessian, and ``.lower``.

A call flattens its arguments, looks its signature up in an in-process
table (a hit runs the generated function at once), and otherwise traces the
function, computes the cache key, and takes the generated module from the
memory or disk cache, or builds it: graph -> transform -> passes -> codegen.
Only a build imports networkx and Jinja2.
"""
from __future__ import annotations

import functools
import logging
import inspect
import os
import sys
import weakref

import numpy as np

from tracegrad.runtime import cache
from tracegrad.frontend import captured, code_deps, created
from tracegrad.runtime import distributed
from tracegrad.runtime.cache import _stats   # the counters tg.cache_info() reports
from tracegrad._version import __version__
from tracegrad.eager.profiler_state import _state as _prof_state, recording_anywhere as _profiling

_ndarray = np.ndarray
from tracegrad.runtime.graph_call import leaf_array, display_paths, describe_path
from tracegrad.ops import primitives
from tracegrad.ops.dtypes import Defaults
from tracegrad.ops.primitives import Aval
from tracegrad.ops.runtime_numpy import SHORTER_SLICE
from tracegrad.frontend.trace import (Tracer, ValueDependentTraceError, foreign_writes_explained,
                                      trace_function, tree_flatten, tree_unflatten, leaf_paths)

log = logging.getLogger("tracegrad")

_ALL = weakref.WeakSet()

KINDS = ("forward", "grad", "value_and_grad", "jvp", "vjp", "jacrev", "jacfwd", "hessian")


def _clear_fast_paths():
    for per_fn in list(_TABLES.values()):
        for tables in per_fn.values():
            tables.forget()
    for c in list(_ALL):   # those not shared (a ufunc's)
        c._tables.forget()


cache.on_clear_memory.append(_clear_fast_paths)


def _is_index(a):
    return isinstance(a, (int, np.integer)) and not isinstance(a, (bool, np.bool_))


def _norm_argnums(argnums, what="argnums"):
    """(positions, whether one int was given); an argument error names ``what``."""
    if _is_index(argnums):
        return (int(argnums),), True
    if isinstance(argnums, (tuple, list)) and all(_is_index(a) for a in argnums):
        return tuple(int(a) for a in argnums), False
    raise TypeError(f"{what} must be an int or a tuple of ints (argument positions, counted "
                    f"from 0; negative ones from the end), got {argnums!r}")


# Signatures kept per function and transform (least recently used first
# out): a function called with ever new shapes holds bounded memory.
SIGNATURES_PER_FUNCTION = 64
# retraces for changed captured state after which one warning says so
RETRACE_WARNING = 8


def _merged_checks(old_guard, checks):
    """A new trace's checks of captured state, with those of the traces
    built before it (still cached: the guard covers them all), without
    repeats."""
    out, seen = [], set()
    for c in tuple(checks) + (old_guard.checks() if old_guard is not None else ()):
        key = (type(c).__name__,) + tuple(id(getattr(c, a)) for a in ("obj", "read")
                                          if hasattr(c, a)) + (repr(getattr(c, "shape", None)),)
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


class _Tables:
    """A function's built signatures, and the guard of what they read."""
    __slots__ = ("fast", "arrays_only", "guard", "retraces", "specialised", "first_sizes",
                 "plans")

    def __init__(self):
        self.fast = cache.LRU(SIGNATURES_PER_FUNCTION)
        # runners for calls of positional ndarrays only: the hot path, a
        # plain dict (emptied when full; it is rebuilt from `fast`)
        self.arrays_only = {}
        self.guard = None   # code_deps.Guard of the captured state the traces read
        self.retraces = 0   # traces dropped because captured state changed
        self.specialised = {}   # the transform with these integer arguments static
        # (transform, dtypes and ranks) -> the shapes of its first call: a call
        # at other shapes gets the native target's generic structure
        self.first_sizes = {}
        # (structure without sizes, key parts) -> {"plans": its runtime.shape_plan
        # Plans, one per region of sizes, "failures": plans that could not be made}
        self.plans = {}

    def forget(self):
        self.fast.clear()
        self.arrays_only.clear()
        self.guard = None
        self.first_sizes.clear()
        self.plans.clear()


_TABLES = weakref.WeakKeyDictionary()   # fn -> {configuration: _Tables}


def _tables_for(fn, config):
    try:
        per_fn = _TABLES.setdefault(fn, {})
    except TypeError:   # not weakly referenceable (a ufunc, a builtin): not shared
        return _Tables()
    tables = per_fn.get(config)
    if tables is None:
        tables = per_fn[config] = _Tables()
    return tables


class Lowered:
    """What ``.lower(*args)`` returns: the graph and the generated source."""

    def __init__(self, graph, source, key, parts, backend, cuda_source=None):
        self.graph = graph
        self.source = source
        self.captured = []    # captured state the generated function takes after the arguments
        self.frozen = []      # captured arrays frozen into it as constants (the command line)
        self.key = key
        self.key_parts = parts
        self.backend = backend
        self._cuda_source = cuda_source

    @property
    def cuda_source(self):
        if self._cuda_source is None:
            from tracegrad.targets.cuda import codegen as cuda
            self._cuda_source = cuda.translation_unit(self.graph)
        return self._cuda_source

    def dot(self):
        from tracegrad.ir import graph as ir
        return ir.to_dot(self.graph)

    def text(self):
        from tracegrad.ir import graph as ir
        return ir.to_text(self.graph)

    def __repr__(self):
        return f"<Lowered {self.key_parts.get('function')} {self.key_parts.get('transform')}>"


class _Entry:
    """One compiled signature: the loaded module and how to call it."""
    __slots__ = ("ns", "fns", "out_tree", "n_out", "out_avals", "wrt", "in_avals", "extra",
                 "raw", "captured", "captured_desc", "captured_src")

    def __init__(self, ns, out_tree, n_out, out_avals, wrt, in_avals):
        self.ns = ns
        self.out_tree = out_tree
        self.n_out = n_out
        self.out_avals = out_avals
        self.wrt = wrt
        self.in_avals = in_avals
        self.extra = None
        # the captured arrays and generators the generated function takes
        # after the arguments, passed by reference on every call
        # (tracegrad.frontend.captured); ``raw``: the generated function itself
        self.raw = None
        self.captured = ()
        self.captured_desc = ()
        self.captured_src = ()   # the captured objects themselves (Tensors, not their arrays)

    def set_function(self, fn, trace):
        """The generated function, called with the captured state appended."""
        self.raw = fn
        self.captured = tuple(trace.implicit)
        self.captured_desc = tuple(trace.implicit_desc)
        self.captured_src = tuple(trace.implicit_src)
        self.fns = _with_captured(fn, self.captured)


def _with_captured(fn, cap):
    """``fn`` taking the arguments only: the captured objects are appended."""
    if not cap:
        return fn

    def with_captured_state(*args):
        return fn(*args, *cap)
    return with_captured_state


class Compiled:
    """A function compiled for one transform; called like the original."""

    def __init__(self, fn, kind="forward", argnums=0, has_aux=False, backend=None,
                 static_argnums=(), static_argnames=(), compile=True, fallback=True,
                 dynamic=None):
        if dynamic not in (None, True, False):
            raise TypeError(f"dynamic must be None (generic native code for the sizes that "
                            f"vary, once seen twice), True or False, got {dynamic!r}")
        if isinstance(fn, Compiled) and fn.kind == "forward":
            dynamic = fn.dynamic if dynamic is None else dynamic
            # tg.grad(tg.compile(f)) is tg.grad(f); a transformed function
            # (tg.grad(tg.grad(f))) stays whole: tracing it inlines its graph
            static_argnums = static_argnums or fn.static_argnums
            static_argnames = static_argnames or fn.static_argnames
            backend = backend or fn.backend
            fn = fn.fn
        if not callable(fn):
            raise TypeError(f"tracegrad expects a function, got {type(fn).__name__}")
        if backend not in (None, "numpy", "cupy", "native"):
            raise ValueError(f"backend must be None, 'numpy', 'cupy' or 'native', "
                             f"got {backend!r}")
        self.fn = fn
        self.kind = kind
        # native code generic in the sizes that vary (docs/native.md, "Generic
        # sizes"): None once a size was seen twice, True at once, False never
        self.dynamic = dynamic
        # compile=False: run fn eagerly on NumPy-face values that record the
        # tape, so control flow may depend on values (see _call_eager)
        self.compiled = bool(compile)
        # control flow that cannot become graph control flow: run eagerly
        # for that signature (fallback), or raise the TraceError
        self.fallback = bool(fallback)
        label = f"tg.{'compile' if kind == 'forward' else kind} of {getattr(fn, '__name__', fn)}"
        self.argnums, self._single = _norm_argnums(argnums, f"{label}: argnums")
        self.has_aux = has_aux
        self.backend = backend
        static_argnums = _norm_argnums(static_argnums, f"{label}: static_argnums")[0]
        if isinstance(static_argnames, str):
            static_argnames = (static_argnames,)
        if not (isinstance(static_argnames, (tuple, list))
                and all(isinstance(a, str) for a in static_argnames)):
            raise TypeError(f"{label}: static_argnames must be a str or a tuple of strs (the "
                            f"names of keyword arguments), got {static_argnames!r}")
        self.static_argnums = tuple(static_argnums)
        self.static_argnames = tuple(static_argnames)
        try:
            self._params = list(inspect.signature(fn).parameters)
        except (TypeError, ValueError):
            self._params = []
        # What was traced and built, per call signature, shared by every
        # Compiled of the same function and configuration: re-wrapping
        # tg.grad(f) in a loop does not retrace.  compile=False is part of the
        # configuration: its calls must never find the compiled code's runners.
        self._tables = _tables_for(fn, (kind, self.argnums, self._single, has_aux, backend,
                                        self.static_argnums, self.static_argnames,
                                        self.compiled, self.fallback, dynamic))
        self._fast = self._tables.fast
        self._arrays_only = self._tables.arrays_only
        # static positions whose int or str values may key the fast table
        # (negative ones depend on the call's length: none then)
        self._static_pos = frozenset(self.static_argnums) \
            if all(a >= 0 for a in self.static_argnums) else frozenset()
        # the name and docstring only: merging fn.__dict__ would copy a
        # transformed fn's own state (kind, fn) over this one's
        functools.update_wrapper(self, fn, updated=())
        if "__name__" not in self.__dict__:   # a callable object (tg.compile(module))
            self.__name__ = self.__qualname__ = type(fn).__name__
        _ALL.add(self)

    def __repr__(self):
        return f"<tracegrad {self.kind} of {getattr(self.fn, '__qualname__', self.fn)}>"

    def __get__(self, obj, objtype=None):  # usable as a method decorator
        if obj is None:
            return self
        return functools.partial(self, obj)

    # --- arguments -----------------------------------------------------------------
    def _split(self, args, kwargs):
        n = len(args)
        static_pos = {a % n if n else a for a in self.static_argnums}
        for a in self.static_argnums:
            if a >= n or a < -n:
                raise TypeError(f"static_argnums={self.static_argnums} but the function was "
                                f"called with {n} positional arguments")
        dyn_pos = [i for i in range(n) if i not in static_pos]
        statics = tuple((i, args[i]) for i in sorted(static_pos))
        statics += tuple((k, kwargs[k]) for k in sorted(kwargs) if k in self.static_argnames)
        dyn_kw = {k: v for k, v in kwargs.items() if k not in self.static_argnames}
        for i, v in statics:
            try:
                hash(v)
            except TypeError:
                raise TypeError(f"static argument {i!r} of {self.__name__} has the unhashable "
                                f"type {type(v).__name__}; static values are part of the cache "
                                f"key, so pass a tuple instead of a list, or make it a dynamic "
                                f"argument") from None
        return dyn_pos, statics, dyn_kw

    def _flatten(self, args, kwargs):
        dyn_pos, statics, dyn_kw = self._split(args, kwargs)
        leaves, ranges, names = [], [], []
        for i in dyn_pos:
            ls, tree = tree_flatten(args[i])
            pname = self._params[i] if i < len(self._params) else f"arg{i}"
            ranges.append((i, len(leaves), len(leaves) + len(ls), tree))
            leaves.extend(ls)
            names.extend(leaf_paths(tree, pname))
        kw_leaves, kw_tree = tree_flatten(dyn_kw)
        leaves.extend(kw_leaves)
        names.extend(leaf_paths(kw_tree, "kw")[i] for i in range(len(kw_leaves)))
        return leaves, ranges, kw_tree, statics, names

    def _where(self, j, ranges, kw_tree):
        """Leaf ``j`` of a call, named for an error: ``tg.grad of f: argument
        p['w']`` (leaf_array calls it only when it refuses the leaf)."""
        what = f"tg.{'compile' if self.kind == 'forward' else self.kind} of {self.__name__}"
        for i, lo, hi, tree in ranges:
            if lo <= j < hi:
                pname = self._params[i] if i < len(self._params) else f"arg{i}"
                return f"{what}: {describe_path(display_paths(tree, pname)[j - lo])}"
        n = max((r[2] for r in ranges), default=0)
        return f"{what}: {describe_path(display_paths(kw_tree, None)[j - n], 'keyword argument')}"

    def _wrt_leaves(self, ranges, nargs):
        pos_to_range = {r[0]: r for r in ranges}
        wrt = []
        for a in self.argnums:
            p = a + nargs if -nargs <= a < 0 else a    # negative: from the end, as in JAX
            if p not in pos_to_range:
                why = (f"which is static (static_argnums={self.static_argnums})"
                       if 0 <= p < nargs else
                       f"but the function was called with {nargs} positional argument"
                       f"{'s' if nargs != 1 else ''}")
                raise TypeError(f"tg.{self.kind} of {self.__name__}: argnums={self.argnums} "
                                f"refers to argument {a}, {why}; differentiate with respect "
                                f"to a dynamic array argument, passed positionally")
            _, lo, hi, tree = pos_to_range[p]
            if tree == ("none",):
                pname = self._params[p] if p < len(self._params) else f"arg{p}"
                raise TypeError(f"tg.{self.kind} of {self.__name__}: argnums={self.argnums} "
                                f"refers to argument '{pname}', which is None: there is nothing "
                                f"to differentiate. Pass an array, or choose other argnums")
            wrt.append((p, lo, hi))
        return wrt

    # --- calls -----------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        # The hottest path first: one ndarray of a signature built before, no
        # guard to check, no profiler (the general path below says the same).
        if len(args) == 1 and not kwargs:
            a = args[0]
            if type(a) is _ndarray:
                run = self._arrays_only.get((a.shape, a.dtype.char))
                if run is not None and self._tables.guard is None and not _profiling[0]:
                    _stats["memory_hits"] += 1
                    return run(*args)
        if not self.compiled:
            return self._call_eager(args, kwargs)
        tables = self._tables
        if tables.guard is not None:
            changed = tables.guard.changed()
            if changed is not None:
                self._forget_traces(changed)
        if _profiling[0] and _prof_state.current is not None:
            return self._call_profiled(args, kwargs)
        # Fast path: positional ndarrays only, a signature seen before.
        if not kwargs:
            key = []
            for a in args:
                if type(a) is not np.ndarray:
                    # ndarrays with static ints or strings, or CuPy arrays
                    if self._static_pos or type(a).__module__.startswith("cupy"):
                        run = tables.arrays_only.get(_fast_key(args, self._static_pos))
                        if run is not None:
                            _stats["memory_hits"] += 1
                            return run(*args)
                    break
                key.append(a.shape)
                key.append(a.dtype.char)
            else:
                run = tables.arrays_only.get(tuple(key))
                if run is not None:
                    _stats["memory_hits"] += 1
                    return run(*args)
        leaves, ranges, kw_tree, statics, names = self._flatten(args, kwargs)
        if _inside_another_transform(leaves, self.kind):
            if self.kind == "forward":
                return self.fn(*args, **kwargs)   # its ops join the caller's trace
            return self._call_inline(leaves, ranges, kw_tree, statics, names, len(args))
        if distributed.has_dask_arrays(leaves):   # chunk by chunk on Dask (distributed.py)
            return self._call_dask(leaves, ranges, kw_tree, statics, names, len(args))
        arrays = []
        tensors = False
        for j, x in enumerate(leaves):
            a, is_t = leaf_array(x, functools.partial(self._where, j, ranges, kw_tree))
            arrays.append(a)
            tensors |= is_t
        faces = _leaf_faces(leaves) if tensors else None
        sig = (tuple(map(_leaf_sig, arrays)),
               tuple((r[0], r[3]) for r in ranges), kw_tree, static_key(statics), len(args),
               _face_key(faces))
        if tensors:
            from tracegrad.eager.grad_mode import state
            from tracegrad.eager.tensor import _FW, _tangent
            duals = _FW.level is not None and any(_tangent(x) is not None for x in leaves)
            if duals and self.kind != "forward":
                raise NotImplementedError(
                    f"tg.{self.kind} of {self.__name__} was called on dual tensors of an open "
                    f"forward_ad level; the tangents cannot pass through a compiled derivative. "
                    f"Compose the transforms instead (tg.jvp of the function, tg.hessian), or "
                    f"call it outside the dual_level")
            if self.kind == "forward" and (duals or state.grad_enabled and any(
                    getattr(x, "requires_grad", False) for x in leaves)):
                return self._call_on_tape(args, leaves, arrays, ranges, kw_tree, statics, names, sig)
        entry = self._fast.get(sig)
        if entry is None:
            try:
                entry = self._build(self.kind, arrays, ranges, kw_tree, statics, names,
                                    len(args), faces=faces)
            except ValueDependentTraceError as e:
                if not self.fallback:
                    raise
                entry = self._fast[sig] = _EagerFallback(self.__name__, arrays, e)
            self._fast[sig] = entry
            key = _fast_key(args, self._static_pos) if not kwargs else None
            if key is not None and type(entry) is not _EagerFallback:
                if len(self._arrays_only) >= SIGNATURES_PER_FUNCTION:
                    self._arrays_only.clear()
                run = self._runner(entry, ranges)
                if statics:     # the runner takes the arrays only
                    run = _without_statics(run, [i for i in range(len(args))
                                                 if i not in self._static_pos])
                self._arrays_only[key] = run
        else:
            cache.count("memory_hits")
        if type(entry) is _EagerFallback:
            return self._call_eager(args, kwargs)
        if tensors and self.kind == "forward" and _captured_require_grad(entry):
            # captured Tensors that require grad (an nn.Module's parameters):
            # the call records one tape node, so backward reaches them too
            return self._call_on_tape(args, leaves, arrays, ranges, kw_tree, statics, names, sig)
        try:
            out = self._run(entry, arrays, ranges)
        except IndexError as e:
            specialised = str(e).startswith(SHORTER_SLICE) and \
                self._specialised_on_integers(args, kwargs)
            if not specialised:
                raise
            return specialised(*args, **kwargs)
        if tensors:
            from tracegrad.eager.tensor import Tensor
            leaves_out, tree = tree_flatten(out, keep_order=True)
            out = tree_unflatten(tree, [Tensor(np.asarray(o)) if isinstance(o, (np.ndarray, np.generic))
                                        else o for o in leaves_out])
        return out

    def _specialised_on_integers(self, args, kwargs):
        """This transform with the function's integer arguments static, or
        None when it has none: a slice ``x[i * b:(i + 1) * b]`` whose NumPy
        result is shorter than at trace time (the last, partial minibatch)
        then gets NumPy's shorter result, from code traced for that value."""
        def is_int(v):
            return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) \
                or (type(v) is np.ndarray and v.ndim == 0 and v.dtype.kind in "iu")
        static = {a % len(args) for a in self.static_argnums} if args else set()
        positions = tuple(i for i, a in enumerate(args) if i not in static and is_int(a))
        names = tuple(k for k, v in kwargs.items()
                      if k not in self.static_argnames and is_int(v))
        if not positions and not names:
            return None
        key = (positions, names)
        table = self._tables.specialised
        if key not in table:
            table[key] = Compiled(self.fn, self.kind, self.argnums if not self._single
                                  else self.argnums[0], self.has_aux, self.backend,
                                  self.static_argnums + positions,
                                  self.static_argnames + names, self.compiled, self.fallback,
                                  self.dynamic)
        return _IntValues(table[key])

    def _call_profiled(self, args, kwargs):
        """A call while a profiler records: one "compiled" event with the
        generated statements as child events."""
        from tracegrad.runtime.graph_call import instrumented
        prof = _prof_state.current
        _prof_state.current = None        # tracing and building are not the call
        try:
            self(*args, **kwargs)          # make sure the signature is built
            leaves, ranges, kw_tree, statics, names = self._flatten(args, kwargs)
            arrays = [leaf_array(x, functools.partial(self._where, j, ranges, kw_tree))[0]
                      for j, x in enumerate(leaves)]
            sig = (tuple(map(_leaf_sig, arrays)),
                   tuple((r[0], r[3]) for r in ranges), kw_tree, static_key(statics), len(args),
                   _face_key(_leaf_faces(leaves)))
            entry = self._fast.get(sig)
        finally:
            _prof_state.current = prof
        if entry is None:  # a call on the tape: no generated entry of its own
            return self(*args, **kwargs)
        fn = _with_captured(instrumented(entry.raw or entry.fns), entry.captured)
        ev = prof._begin(self.__name__, "compiled", arrays)
        try:
            return self._run(entry, arrays, ranges, fn)
        finally:
            prof._end(ev)

    def _runner(self, entry, ranges):
        """A minimal function of the arguments for calls whose arguments
        are all ndarrays (the generated function itself where its result is
        the call's)."""
        fn = entry.fns
        kind = self.kind
        single_out = entry.out_tree == ("leaf",)
        if kind == "forward" and single_out:
            return lambda *a: fn(*a)[0]
        if kind in ("grad", "value_and_grad") and not self.has_aux and single_out:
            if self._single:
                if kind == "grad":
                    return lambda *a: fn(*a)[1]
                return fn           # it returns the pair (value, gradient)
            if kind == "grad":
                return lambda *a: tuple(fn(*a)[1:])

            def value_and_grads(*a):
                outs = fn(*a)
                return outs[0], tuple(outs[1:])
            return value_and_grads
        if kind in ("jacrev", "jacfwd", "hessian") and self._single and single_out:
            return lambda *a: fn(*a)[0]
        return lambda *a: self._run(entry, list(a), ranges)

    def _run(self, entry, arrays, ranges, fn=None):
        kind = self.kind
        outs = (fn or entry.fns)(*arrays)
        if kind == "forward":
            return tree_unflatten(entry.out_tree, list(outs))
        if kind in ("grad", "value_and_grad"):
            n = entry.n_out
            value_leaves = list(outs[:n])
            grads = self._group(entry.wrt, ranges, outs[n:])
            if self.has_aux:
                value, aux = tree_unflatten(entry.out_tree, value_leaves)
            else:
                value = tree_unflatten(entry.out_tree, value_leaves)
            if kind == "grad":
                return (grads, aux) if self.has_aux else grads
            return ((value, aux), grads) if self.has_aux else (value, grads)
        n_w = sum(hi - lo for _, lo, hi in entry.wrt)
        if kind in ("jacrev", "jacfwd"):
            # output-major blocks: one group over the arguments per output
            per_out = [self._group(entry.wrt, ranges, outs[k * n_w:(k + 1) * n_w])
                       for k in range(entry.n_out)]
            return tree_unflatten(entry.out_tree, per_out)
        if kind == "hessian":
            rows = [self._group(entry.wrt, ranges, outs[k * n_w:(k + 1) * n_w])
                    for k in range(n_w)]
            return self._group(entry.wrt, ranges, rows)
        raise ValueError(kind)

    def _group(self, wrt, ranges, flat):
        """Gradients per differentiated argument, in its tree structure."""
        res = []
        k = 0
        trees = {r[0]: r[3] for r in ranges}
        for a, lo, hi in wrt:
            n = hi - lo
            res.append(tree_unflatten(trees[a], list(flat[k:k + n])))
            k += n
        return res[0] if self._single else tuple(res)

    # --- building ---------------------------------------------------------------------
    def _trace(self, arrays, ranges, kw_tree, statics, names, nargs, faces=None, capture=True):
        """faces: the dialect of each leaf (None: all NumPy).  capture: the
        arrays and generators the function captured are inputs read at call
        time (``trace.implicit``), else constants."""
        avals = [_leaf_aval(a) for a in arrays]
        from tracegrad.runtime import pipeline
        # CuPy arrays select the CUDA target; Dask arrays the NumPy target
        # (each chunk's program runs on a worker); else the default
        backend = self.backend or (
            "cupy" if any(type(a).__module__.startswith("cupy") for a in arrays) else
            "numpy" if any(distributed.is_dask_array(a) for a in arrays) else
            pipeline.default_backend())

        def rebuild(tracers):
            return _rebuild_args(tracers, ranges, kw_tree, statics, nargs)

        trace, out_tree = trace_function(self.fn, avals, rebuild, names, backend, faces,
                                         capture=capture)
        cache.count("traces")
        guard = code_deps.Guard(self.fn, checks=_merged_checks(self._tables.guard, trace.checks))
        self._tables.guard = guard if guard else None   # nothing read: nothing to check
        if guard.unchecked:
            captured.explain(self.fn, [f"{u} are not checked: a change there is not seen"
                                       for u in guard.unchecked])
        self._check_out_tree(out_tree)
        return trace, out_tree, avals, backend

    def _call_eager(self, args, kwargs):
        """compile=False: fn runs on eager values that record the tape (the
        differentiated leaves; others stay as passed), speaking the face of
        the argument they stand in for, so its Python control flow may depend
        on values; the backward engine then gives the derivatives, in the
        layout the compiled code returns.  Inside another transform that
        records the tape (an eager or torch-style outer level, or a Tensor
        argument that requires grad) the results stay on the tape, so the
        outer level differentiates through them (grad of grad, hessian)."""
        from tracegrad.autograd import enable_grad
        leaves, ranges, kw_tree, statics, names = self._flatten(args, kwargs)
        if any(type(x) is Tracer for x in leaves):
            # an enclosing compiled transform traces this call: its values
            # are symbols, so the function is traced with them (as compiled)
            return self._call_inline(leaves, ranges, kw_tree, statics, names, len(args))
        wrt = self._wrt_leaves(ranges, len(args)) if self.kind != "forward" else []
        arrays = [leaf_array(x, functools.partial(self._where, j, ranges, kw_tree))[0]
                  for j, x in enumerate(leaves)]
        avals = [_leaf_aval(a) for a in arrays]
        self._check_wrt(self.kind, avals, wrt, names, ranges, kw_tree)
        nested = _eager_nested(leaves)
        xs = {j: _eager_start(leaves[j], arrays[j], nested)
              for _, lo, hi in wrt for j in range(lo, hi)}
        values = [xs.get(j, x) for j, x in enumerate(leaves)]
        a, kw = _rebuild_args(values, ranges, kw_tree, statics, len(args))
        with enable_grad(), _EagerLevel():
            out = _run_eager(self.fn, a, kw)
        out_leaves, out_tree = tree_flatten(out)
        _refuse_traced(out_leaves, f"tg.{self.kind} of {self.__name__} (compile=False)")
        self._check_out_tree(out_tree)
        entry = _Entry(None, out_tree, len(out_leaves), None, wrt, avals)
        flat = _eager_derivatives(self.kind, out_leaves, [xs[j] for j in sorted(xs)], nested)
        if nested:
            flat = _outer_only(flat, xs.values())
        else:
            flat = _wrap_like(leaves, flat)
        return self._run(entry, leaves, ranges, lambda *_: flat)

    def _forget_traces(self, changed):
        """Captured state the traces read changed (a cell or global rebound, a
        value read from a container or attribute, a captured array's shape
        or, for one frozen into the code, its values): they are stale."""
        tables = self._tables
        retraces = tables.retraces + 1
        tables.forget()
        tables.retraces = retraces
        if os.environ.get("TRACEGRAD_EXPLAIN"):
            print(f"tracegrad: retracing {self.__name__}: {changed} changed since it was "
                  f"traced", file=sys.stderr)
        if retraces == RETRACE_WARNING:
            import warnings
            warnings.warn(f"tracegrad: {self.__name__} was traced again {retraces} times "
                          f"because captured state it reads changed between calls (last: "
                          f"{changed}). A value that changes on every call is better passed "
                          f"as an argument (a number or array argument is traced, not fixed "
                          f"into the code).", RuntimeWarning, stacklevel=3)

    def _check_out_tree(self, out_tree):
        """A derivative of a scalar needs exactly one output (and its aux)."""
        kind = self.kind
        if kind not in ("grad", "value_and_grad", "hessian"):
            return
        what = f"tg.{kind} of {self.__name__}"
        value_tree = out_tree
        if self.has_aux:
            if out_tree[0] not in ("tuple", "list") or len(out_tree[1]) != 2:
                raise TypeError(f"{what} with has_aux=True: the function must return a pair "
                                f"(output, aux), but it returned {_describe_tree(out_tree)}")
            value_tree = out_tree[1][0]
        if value_tree == ("none",):
            raise TypeError(f"{what}: the function returned None; it must return the scalar "
                            f"to differentiate (is a `return` missing?)")
        if value_tree != ("leaf",):
            raise TypeError(
                f"{what}: the function returned {_describe_tree(value_tree)}, but {kind} needs "
                f"one scalar output. If the other values are auxiliary data, return "
                f"(output, aux) and pass has_aux=True; for several outputs use tg.jacobian "
                f"or tg.vjp.")

    def _key_parts(self, kind, trace, avals, statics, backend, wrt):
        from tracegrad.runtime.cache import templates_hash
        fn = self.fn
        return {
            "function": f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', '?')}",
            "signature": [f"{a.dtype}{list(a.shape)}" for a in avals],
            "backend": backend,
            "static": repr(statics),
            "wrt": repr(wrt),
            "transform": kind + ("+aux" if self.has_aux else ""),
            "version": __version__,
            "templates": templates_hash(),
            **({"dynamic": self.dynamic} if self.dynamic is not None else {}),
            **({"captured": [f"{d}: {_describe_captured(o)}" for o, d in
                             zip(trace.implicit, trace.implicit_desc)]} if trace.implicit else {}),
        }

    def _build(self, kind, arrays, ranges, kw_tree, statics, names, nargs, lower=False,
               faces=None, capture=True):
        # the arguments differentiated are checked before tracing
        wrt = self._wrt_leaves(ranges, nargs) if kind not in ("forward", "vjp", "jvp") \
            else [(None, 0, len(arrays))]
        self._check_wrt(kind, [_leaf_aval(a) for a in arrays], wrt, names, ranges, kw_tree)
        trace, out_tree, avals, backend = self._trace(arrays, ranges, kw_tree, statics, names,
                                                      nargs, faces, capture)
        names = [trace.nodes[i].name for i in trace.inputs]   # the captured state's too
        # the key's parts but the graph's hash (a size plan does without it)
        parts = self._key_parts(kind, trace, avals, statics, backend, wrt)
        if not lower and backend == "native" and self.dynamic is not False:
            entry = self._from_plan(kind, trace, wrt, names, parts, out_tree, avals)
            if entry is not None:
                return entry
        parts["graph"] = trace.structure_hash()
        khash = cache.key_hash(parts)
        if lower:
            graph, source = _compile(kind, trace, wrt, names, self, parts, khash)
            lowered = Lowered(graph, source, khash, parts, backend)
            lowered.captured = list(trace.implicit_desc)   # the inputs after the arguments
            lowered.frozen = list(trace.frozen)            # capture="freeze": constants
            return lowered
        from tracegrad.runtime import pipeline  # a build: the code generator loads here
        probe, generic = None, False
        if backend == "native" and self.dynamic is not False:
            probe_shapes = self._probe_shapes(kind, avals)
            generic = probe_shapes is not None
            if probe_shapes:
                def probe():    # the same function at other sizes: what varies is generic
                    return self._probe(kind, probe_shapes, ranges, kw_tree, statics, nargs,
                                       faces, capture, backend, wrt, names)
        if generic:     # the first size of a structure makes its plan
            self._planned(kind, trace, wrt, names, parts, make_first=True)
        ns = pipeline.load(khash, parts,
                           lambda: _compile(kind, trace, wrt, names, self, parts, khash,
                                            probe, generic)[1],
                           explain_as=parts["function"])
        n_out = len(trace.outputs)
        entry = _Entry(ns, out_tree, n_out, None, wrt, avals)
        entry.set_function(ns[_FN_NAME[kind]], trace)
        return entry

    def _from_plan(self, kind, trace, wrt, names, parts, out_tree, avals):
        """The entry of a call served by a size plan, or None.  Only where
        the C would have the generic structure (a size after the first of
        the transform's dtypes and ranks, or dynamic=True)."""
        sig = (kind, tuple((a.dtype, len(a.shape)) for a in avals))
        first = self._tables.first_sizes.get(sig)
        if not self.dynamic and (first is None or first == tuple(a.shape for a in avals)):
            return None
        ns = self._planned(kind, trace, wrt, names, parts)
        if ns is None:
            return None
        entry = _Entry(ns, out_tree, len(trace.outputs), None, wrt, avals)
        entry.set_function(ns[_FN_NAME[kind]], trace)
        return entry

    # structures a function keeps plans for, and plans (regions of sizes
    # with other decisions) per structure; a structure that failed to give a
    # plan this many times is not tried again
    PLANS_PER_FUNCTION, REGIONS_PER_PLAN, PLAN_FAILURES = 3, 6, 2

    def _planned(self, kind, trace, wrt, names, parts, make_first=False):
        """The module of this call's sizes from one of the function's size
        plans (runtime.shape_plan: no transform, passes, code generation or
        compiler), or None where none serves (the ordinary path then
        builds).  The first size of a structure makes its first plan and
        itself takes the ordinary path (so the generic C of sizes no plan
        serves is made as before); a later size that no plan's guards admit
        (the sizes steered a decision the other way) makes another plan and
        takes it (its C is mostly the same text: no build)."""
        from tracegrad.runtime import toolchain
        rec, _ = toolchain.available()
        if rec is None:
            return None
        structure, sizes = trace.structure_sizes()
        # (the compiler's recipe too, as in the cache key: another compiler, other plans)
        pkey = (structure, rec["identity"], repr(sorted(
            (k, v) for k, v in parts.items() if k not in ("signature", "graph"))))
        plans = self._tables.plans
        known = plans.get(pkey)
        if known is None:
            if not make_first or len(plans) >= self.PLANS_PER_FUNCTION:
                # a structure that changes with every size (a constant made
                # from a size): each plan would cost a build; no more tried
                return None
            known = plans[pkey] = {"plans": [], "failures": 0}
            self._make_plan(known, rec, kind, trace, wrt, names, parts)
            return None
        if make_first:      # made before (this size's plans were tried already)
            return None
        for plan in known["plans"]:
            ns = plan.namespace(sizes)
            if ns is not None:
                break
        else:
            if len(known["plans"]) >= self.REGIONS_PER_PLAN or \
                    known["failures"] >= self.PLAN_FAILURES:
                return None
            plan = self._make_plan(known, rec, kind, trace, wrt, names, parts)
            ns = None if plan is None else plan.namespace(sizes)
            if ns is None:
                return None
        cache.count("size_plans")
        cache.note_target("native")
        return ns

    def _make_plan(self, known, rec, kind, trace, wrt, names, parts):
        """A plan made from this trace (compiler recipe ``rec``), noted in ``known``."""
        from tracegrad.runtime import shape_plan
        src, doc = _describe(kind, self.fn, wrt, names)
        plan = shape_plan.make(
            trace, lambda t: _transform_graph(kind, t, wrt),
            lambda g: [(g, _FN_NAME[kind], names, doc)], rec,
            {"source": src, "transform": parts["transform"], "key": "(a size plan)"})
        if plan is None:
            known["failures"] += 1
        else:
            known["plans"].append(plan)
        return plan

    def _probe_shapes(self, kind, avals):
        """The native target's generic structure (docs/native.md, "Generic
        sizes") for a call at ``avals``: None for the C specialised to these
        sizes (the first shapes of the transform and its dtypes and ranks,
        with dynamic=None), else the lists of argument avals to probe at,
        whose C texts tell which numbers vary: with dynamic=True, every
        dimension of 2 or more one larger, and doubled (sizes 0 and 1 stay,
        as torch's dynamic shapes specialise them); with dynamic=None, the
        first call's sizes (the code generator traces there only where no C
        text made before serves: the second size, or a new size in a process
        that loaded the others from the disk cache)."""
        sig = (kind, tuple((a.dtype, len(a.shape)) for a in avals))
        shapes = tuple(a.shape for a in avals)
        first = self._tables.first_sizes.setdefault(sig, shapes)
        if self.dynamic:
            return [[Aval(tuple(grow(d) if d >= 2 else d for d in a.shape), a.dtype)
                     if a.dtype != object else a for a in avals]
                    for grow in (lambda d: d + 1, lambda d: d * 2)]
        if shapes == first:
            return None
        # a dimension 0 or 1 at the first call is specialised there (a
        # broadcast): the probe takes this call's size one larger instead
        return [[Aval(tuple(d0 if d0 >= 2 and d >= 2 else d + 1 if d != d0 and d >= 2 else d
                            for d0, d in zip(s0, a.shape)), a.dtype)
                 if a.dtype != object else a for s0, a in zip(first, avals)]]

    def _probe(self, kind, probes, ranges, kw_tree, statics, nargs, faces, capture, backend,
               wrt, names):
        """The transform's graphs at the sizes of ``probes`` (lists of
        argument avals), whose C texts tell which numbers vary (the first
        whose C has the same structure serves); a size at which the function
        does not trace is left out (the code is then generic from the next
        size on)."""
        def rebuild(tracers):
            return _rebuild_args(tracers, ranges, kw_tree, statics, nargs)
        out = []
        for probe in probes:
            try:
                trace, _ = trace_function(self.fn, probe, rebuild, names, backend, faces,
                                          capture=capture)
                g = _transform_graph(kind, trace, wrt)
            except Exception as e:  # noqa: BLE001 -- a size it does not take: no probe, said
                log.info("tracegrad: generic sizes: %s does not trace at %s (%s: %s)",
                         self.__name__, [list(a.shape) for a in probe], type(e).__name__, e)
                continue
            out.append([(g, _FN_NAME[kind], [trace.nodes[i].name for i in trace.inputs], "")])
        return out

    def _check_wrt(self, kind, avals, wrt, names, ranges, kw_tree):
        if kind in ("grad", "value_and_grad", "jacrev", "jacfwd", "hessian"):
            for a, lo, hi in wrt:
                for j in range(lo, hi):
                    dtype = avals[j].dtype
                    if np.issubdtype(dtype, np.complexfloating):
                        raise TypeError(
                            f"{self._where(j, ranges, kw_tree)} is complex "
                            f"({dtype}); tracegrad differentiates real functions of "
                            f"real inputs only. Pass the real and imaginary parts as two "
                            f"float arguments (x.real, x.imag).")
                    if dtype == object:   # the one object input: a Generator
                        raise TypeError(
                            f"{self._where(j, ranges, kw_tree)} is a np.random.Generator, "
                            f"which has no gradient; gradients are defined for floating-point "
                            f"inputs. Choose other argnums.")
                    if not np.issubdtype(dtype, np.inexact):
                        raise TypeError(
                            f"{self._where(j, ranges, kw_tree)} has dtype "
                            f"{dtype}; gradients are defined for floating-point inputs. "
                            f"Convert it (x.astype(np.float64)) or choose other argnums.")

    def _call_inline(self, leaves, ranges, kw_tree, statics, names, nargs):
        """A transformed function called on values of an enclosing transform
        (tracers) or on Tensors that record the tape: its transformed graph
        is evaluated op by op on those values, so the caller differentiates
        through it (grad of grad, a gradient inside a compiled step)."""
        from tracegrad.ir import graph as ir
        for j, x in enumerate(leaves):   # the arguments that are not the caller's values
            if type(x) is not Tracer and not distributed.is_dask_array(x):
                leaf_array(x, functools.partial(self._where, j, ranges, kw_tree))
        avals = [primitives.aval_of(x) for x in leaves]
        faces = _leaf_faces(leaves)
        sig = ("inline", tuple(avals), tuple((r[0], r[3]) for r in ranges), kw_tree,
               static_key(statics), nargs, _face_key(faces))
        hit = self._fast.get(sig)
        if hit is None:
            trace, out_tree, avals, _ = self._trace(avals, ranges, kw_tree, statics, names, nargs,
                                                    faces)
            wrt = self._wrt_leaves(ranges, nargs)
            self._check_wrt(self.kind, avals, wrt, names, ranges, kw_tree)
            g = _transform_graph(self.kind, trace, wrt, fresh=False)
            entry = _Entry(None, out_tree, len(trace.outputs), None, wrt, avals)
            entry.captured, entry.captured_desc = tuple(trace.implicit), tuple(trace.implicit_desc)
            hit = self._fast[sig] = (g, entry)
        g, entry = hit
        outer = next((x._trace for x in leaves if type(x) is Tracer), None)
        # the captured state is the enclosing trace's captured state too
        captured.adopt(entry.captured, entry.captured_desc)
        caps = [outer.captured_value(o) for o in entry.captured] if outer is not None \
            else list(entry.captured)
        outs = ir.eval_graph(g, list(leaves) + caps, trace=outer)[0]
        return self._run(entry, leaves, ranges, lambda *_: outs)

    def _call_dask(self, leaves, ranges, kw_tree, statics, names, nargs):
        """Dask arrays among the arguments: the result, a sum or mean over their
        rows, is computed chunk by chunk by Dask (tracegrad/distributed.py)."""
        if self.kind not in ("forward", "grad", "value_and_grad") or self.has_aux:
            raise TypeError(f"tg.{self.kind}{' with has_aux=True' if self.has_aux else ''} of "
                            f"{self.__name__} does not take dask arrays; tg.compile, tg.grad and "
                            f"tg.value_and_grad do (for sums or means over rows)")
        arrays = [x if distributed.is_dask_array(x) else
                  leaf_array(x, functools.partial(self._where, j, ranges, kw_tree))[0]
                  for j, x in enumerate(leaves)]
        axes = distributed.batch_axes(arrays, names)
        sig = ("dask", tuple(map(_leaf_sig, arrays)), tuple(sorted(axes.items())),
               tuple((r[0], r[3]) for r in ranges), kw_tree, static_key(statics), nargs)
        hit = self._fast.get(sig)
        if hit is None:
            trace, out_tree, avals, backend = self._trace(arrays, ranges, kw_tree, statics,
                                                          names, nargs)
            wrt = self._wrt_leaves(ranges, nargs) if self.kind != "forward" else []
            self._check_wrt(self.kind, avals, wrt, names, ranges, kw_tree)
            fn = self.fn
            # captured arrays are inputs of each chunk's program, not split into rows
            all_avals = avals + [Aval(tuple(o.shape), o.dtype) for o in trace.implicit]
            all_names = [trace.nodes[i].name for i in trace.inputs]
            plan = distributed.Plan(
                trace, all_avals, axes, [j for _, lo, hi in wrt for j in range(lo, hi)],
                self.kind, all_names,
                f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', '?')}", backend)
            entry = _Entry(None, out_tree, len(trace.outputs), None, wrt, avals)
            entry.captured = tuple(trace.implicit)
            hit = self._fast[sig] = (plan, entry)
        plan, entry = hit
        flat = plan.run(list(arrays) + list(entry.captured))
        return self._run(entry, arrays, ranges, lambda *_: flat)

    def lower(self, *args, **kwargs):
        """Trace and generate without running: -> Lowered (graph, source, dot()).
        The captured arrays and generators the function reads are the
        generated function's parameters after the arguments
        (``Lowered.captured`` names them)."""
        return self._lower(args, kwargs)

    def _lower(self, args, kwargs, capture=True):
        """``lower``; capture="freeze": captured arrays become constants
        (the command line's standalone module), listed in ``Lowered.frozen``."""
        leaves, ranges, kw_tree, statics, names = self._flatten(args, kwargs)
        arrays = [leaf_array(x, functools.partial(self._where, j, ranges, kw_tree))[0]
                  for j, x in enumerate(leaves)]
        return self._build(self.kind, arrays, ranges, kw_tree, statics, names, len(args), lower=True,
                           faces=_leaf_faces(leaves), capture=capture)

    # --- compiled calls on the eager tape ---------------------------------------------------
    def _call_on_tape(self, args, leaves, arrays, ranges, kw_tree, statics, names, sig):
        from tracegrad.runtime import graph_call
        key = ("tape",) + sig
        entry = self._fast.get(key)
        if entry is None:
            try:
                trace, out_tree, avals, backend = self._trace(arrays, ranges, kw_tree, statics,
                                                              names, len(args),
                                                              _leaf_faces(leaves))
            except ValueDependentTraceError as e:
                if not self.fallback:
                    raise
                entry = self._fast[key] = _EagerFallback(self.__name__, arrays, e)
            else:
                # the captured objects themselves: a captured Tensor that
                # requires grad gets its gradient from the tape node
                entry = (graph_call.GraphFunction.from_trace(trace, names, self.__name__,
                                                             captured_tensors_wrt=True),
                         out_tree, tuple(trace.implicit_src))
                self._fast[key] = entry
        if type(entry) is _EagerFallback:
            # the function as written, on the tape (its ops record the backward)
            a, kw = _rebuild_args(list(leaves), ranges, kw_tree, statics, len(args))
            return self.fn(*a, **kw)
        gf, out_tree, cap = entry
        outs = gf.call_tensors(list(leaves) + list(cap))
        return tree_unflatten(out_tree, list(outs))


def _captured_require_grad(entry):
    """Does a compiled forward read a captured Tensor that requires grad
    (with grad mode on)?"""
    from tracegrad.eager.grad_mode import state
    return state.grad_enabled and any(getattr(o, "requires_grad", False)
                                      for o in getattr(entry, "captured_src", ()))


_FN_NAME = {"forward": "forward", "grad": "value_and_grad", "value_and_grad": "value_and_grad",
            "jacrev": "jacobian", "jacfwd": "jacobian", "hessian": "hessian"}


def _rebuild_args(values, ranges, kw_tree, statics, nargs):
    """(args, kwargs) of a call from its dynamic leaves' values and statics."""
    args = [None] * nargs
    for i, lo, hi, tree in ranges:
        args[i] = tree_unflatten(tree, values[lo:hi])
    for i, v in statics:
        if isinstance(i, int):
            args[i] = v
    kwargs = tree_unflatten(kw_tree, values[ranges[-1][2] if ranges else 0:])
    kwargs.update({k: v for k, v in statics if isinstance(k, str)})
    return args, kwargs


def _plain(v):
    """A result as the caller gets it: an array (a value off the tape), a
    0-d result a NumPy scalar, as the generated code returns it."""
    if not hasattr(v, "grad_fn"):
        return v
    return v._data[()] if v._data.ndim == 0 else np.array(v._data)


# How many eager transforms (compile=False) are running their function now:
# one called inside another keeps its results on the tape.
_EAGER_DEPTH = [0]


class _EagerLevel:
    def __enter__(self):
        _EAGER_DEPTH[0] += 1

    def __exit__(self, *exc):
        _EAGER_DEPTH[0] -= 1


def _eager_nested(leaves):
    """Is an eager transform called inside another computation that records
    the tape (an eager transform's function, or on Tensors that require
    grad)?  Then its results must stay on the tape, or the outer level's
    derivative would silently miss their dependence."""
    from tracegrad.eager.grad_mode import state
    if not state.grad_enabled:
        return False
    return _EAGER_DEPTH[0] > 0 or any(getattr(x, "requires_grad", False) for x in leaves)


def _outer_only(values, own):
    """Results of a nested eager level, each kept on the tape only when its
    gradient reaches something outside this level (a value of the enclosing
    computation); one that depends only on this level's own fresh leaves
    (``own``) is a constant there, and comes back detached (so converting it,
    ``float(g)``, is no conversion of a value being differentiated)."""
    from tracegrad.eager.graph import AccumulateGrad
    own = {id(x) for x in own}
    out = []
    for v in values:
        fn = getattr(v, "grad_fn", None)
        if fn is None:
            out.append(v.detach() if getattr(v, "requires_grad", False) and id(v) in own
                       else v)
            continue
        seen, todo, outer = set(), [fn], False
        while todo and not outer:
            node = todo.pop()
            if node is None or id(node) in seen:
                continue
            seen.add(id(node))
            if isinstance(node, AccumulateGrad):
                outer = id(node.variable) not in own
            else:
                todo.extend(n for n, _ in node.next_functions)
        out.append(v if outer else v.detach())
    return out


def _refuse_traced(out_leaves, what):
    """An eager transform's function computed with a value of an enclosing
    compiled trace that it did not get as an argument (a closure variable):
    the tape cannot differentiate through a symbol, and the enclosing trace
    would lose that dependence."""
    if any(type(o) is Tracer for o in out_leaves):
        raise TypeError(
            f"{what} is called inside a compiled transform (tg.grad, tg.compile...) and its "
            f"function uses a value of that trace it does not get as an argument (a closure "
            f"variable): the eager tape cannot differentiate a traced value, and the outer "
            f"derivative would lose its dependence. Pass the value as an argument, or make "
            f"the outer transform eager too (compile=False)")


def _eager_start(x, a, nested):
    """The eager value a differentiated leaf becomes: a fresh tape leaf of
    the argument's face (a Tensor stays a torch-face Tensor, anything else
    speaks NumPy), or, nested, a new node on top of the caller's value (so
    the caller differentiates through this level too)."""
    from tracegrad import ops
    from tracegrad.eager.tensor import NumpyTensor, Tensor
    if isinstance(x, Tensor):
        if nested and x.requires_grad:
            return ops.clone(x)
        cls = NumpyTensor if isinstance(x, NumpyTensor) else Tensor
        return cls(x._data.copy(), requires_grad=True)
    # the caller's array, read-only: no copy (a write into an argument is
    # refused with its own error before it reaches the memory)
    if type(a) is np.ndarray:
        data = a.view()
        data.flags.writeable = False
    else:
        data = np.array(a)
    return NumpyTensor(data, requires_grad=True)


def _face_of(x, g):
    """Gradient ``g`` (the engine gives torch-face Tensors) in the face of
    the value ``x`` it is the gradient of, still on the tape."""
    from tracegrad import ops
    from tracegrad.eager.tensor import NumpyTensor, Tensor
    cls = NumpyTensor if isinstance(x, NumpyTensor) else Tensor
    if isinstance(g, Tensor) and type(g) is not cls:
        return ops.add(cls(np.zeros((), g.dtype)), g)
    return g


def _zeros_like_leaf(x, shape, nested):
    if nested:
        return type(x)(np.zeros(shape, x.dtype))
    return np.zeros(shape, x.dtype)


def _wrap_like(leaves, flat):
    """Results of a top-level eager call on Tensor arguments come back as
    Tensors of their face (compiled calls on Tensors return Tensors too)."""
    from tracegrad.eager.tensor import NumpyTensor, Tensor
    faces = [type(x) for x in leaves if isinstance(x, Tensor)]
    if not faces:
        return flat
    cls = Tensor if any(c is not NumpyTensor for c in faces) else NumpyTensor
    return [cls(np.asarray(o)) if isinstance(o, (np.ndarray, np.generic)) else o for o in flat]


def _eager_derivatives(kind, outs, xs, nested=False):
    """The flat outputs compiled code of ``kind`` returns, from an eager run:
    outputs, then gradients / Jacobian blocks (output-major) / Hessian rows.
    ``nested``: everything stays on the tape (derivatives with create_graph)."""
    values = list(outs) if nested else [_plain(o) for o in outs]
    if kind == "forward":
        return values

    def jacobian_blocks(ys):
        blocks = []
        for y in ys:
            tensor = hasattr(y, "grad_fn")
            shape = tuple(y.shape) if tensor else np.shape(y)
            flat = y.reshape(-1) if tensor and y.requires_grad else None
            rows = [_eager_cotangents([flat[k]] if flat is not None else [], xs, [1.0],
                                      create_graph=nested)
                    for k in range(int(np.prod(shape)))]
            for i, x in enumerate(xs):
                if not nested:
                    blocks.append(np.array([r[i] for r in rows], dtype=x.dtype)
                                  .reshape(shape + x.shape))
                elif rows:
                    blocks.append(np.stack([r[i] for r in rows]).reshape(shape + tuple(x.shape)))
                else:
                    blocks.append(_zeros_like_leaf(x, shape + tuple(x.shape), True))
        return blocks

    if kind in ("grad", "value_and_grad"):
        return values + _eager_cotangents(outs[:1], xs, [1.0], create_graph=nested)
    if kind in ("jacrev", "jacfwd"):
        return jacobian_blocks(outs)
    if kind == "hessian":
        return jacobian_blocks(_eager_cotangents(outs[:1], xs, [1.0], create_graph=True))
    raise ValueError(kind)


_FAST_STATIC = (int, str, bool)


def _fast_key(args, static_pos):
    """The fast table's key of a call of positional ndarrays (shape and
    dtype each), CuPy arrays (type, shape and dtype: the type keeps them
    apart from NumPy's, which run another target) and, at static positions,
    values of exactly int, str or bool (type and value); None for any other
    call."""
    key = []
    for i, a in enumerate(args):
        t = type(a)
        if t is _ndarray:
            key.append(a.shape)
            key.append(a.dtype.char)
        elif t in _FAST_STATIC and i in static_pos:
            key.append(t)
            key.append(a)
        elif t.__module__.startswith("cupy"):
            key.append(t)
            key.append(a.shape)
            key.append(a.dtype.char)
        else:
            return None
    return tuple(key)


def _without_statics(run, dyn):
    """``run`` called with the arguments at positions ``dyn`` only."""
    if len(dyn) == 1:
        (i,) = dyn
        return lambda *a: run(a[i])
    return lambda *a: run(*[a[i] for i in dyn])


def _leaf_faces(leaves):
    """The dialect each leaf speaks: a Tensor (or a torch-face tracer) torch,
    anything else NumPy; None when all speak NumPy."""
    faces = tuple(getattr(x, "_face", "numpy") for x in leaves)
    return faces if "torch" in faces else None


def _face_key(faces):
    """The dialects of a call's leaves in its cache key; with a torch face,
    torch's default dtype too (``tg.set_default_dtype`` changes what a
    literal or a factory in torch code makes, so it changes the trace)."""
    if faces is None:
        return None
    return faces, Defaults.dtype.char


def _describe_captured(obj):
    if isinstance(obj, np.ndarray):
        return f"{obj.dtype}{list(obj.shape)}"
    return type(obj).__name__


def _leaf_sig(a):
    """An argument leaf's part of the call signature."""
    if type(a) is np.random.Generator:
        return ((), "O", np.random.Generator)   # any Generator: its state is read at run time
    return (a.shape, a.dtype.char, type(a))


def _leaf_aval(a):
    """What tracing sees of a leaf: a Generator is an object input, which the
    trace hands to the function as a proxy whose draws become nodes."""
    if type(a) is np.random.Generator:
        return Aval((), np.dtype(object))
    return Aval(tuple(a.shape), np.dtype(a.dtype))


def static_key(value):
    """A static value as a key that tells apart what compares equal but
    computes differently: 0.0 and -0.0, True and 1, 1 and 1.0, NaNs."""
    t = type(value)
    if t in (tuple, list):
        return (t.__name__,) + tuple(static_key(v) for v in value)
    if t is float:
        return ("float", value.hex())
    if t is complex:
        return ("complex", value.real.hex(), value.imag.hex())
    if isinstance(value, np.generic):
        return (t.__name__, value.tobytes())
    return (t, value)


def _describe_tree(tree):
    kind = tree[0]
    if kind == "leaf":
        return "an array"
    if kind == "none":
        return "None"
    n = len(tree[2] if kind in ("namedtuple", "dict") else tree[1])
    return f"a {kind} of {n} value{'s' if n != 1 else ''}"


def _inside_another_transform(leaves, kind):
    """Is this call part of an enclosing computation to differentiate: a
    traced argument, or (for a derivative) a Tensor recording the tape?"""
    tape = None
    for x in leaves:
        if type(x) is Tracer:
            return True
        if kind != "forward" and getattr(x, "requires_grad", False):
            if tape is None:
                from tracegrad.eager.grad_mode import state
                tape = state.grad_enabled
            if tape:
                return True
    return False


def _transform_graph(kind, trace, wrt, fresh=True):
    """Trace -> graph -> the transform's graph, optimised (``fresh``:
    pipeline.transform's; False for a graph replayed inside another trace)."""
    from tracegrad.runtime import pipeline
    return pipeline.transform(pipeline.graph_of(trace), kind,
                              [j for _, lo, hi in wrt for j in range(lo, hi)], fresh=fresh)


def _compile(kind, trace, wrt, names, compiled, parts, khash, probe=None, generic=False):
    """Trace -> transformed graph -> source (NumPy, or the CUDA target's);
    ``probe``: a function giving the same transform at other sizes (called
    only where no C text made before serves), and ``generic``: the generic
    structure (native, docs/native.md)."""
    from tracegrad.runtime import pipeline
    g = _transform_graph(kind, trace, wrt)
    src, doc = _describe(kind, compiled.fn, wrt, names)
    # the generator turns the argument names into distinct identifiers
    dynamic = getattr(compiled, "dynamic", None)
    source = pipeline.generate([(g, _FN_NAME[kind], names, doc)], parts.get("backend", "numpy"),
                               source=src, transform=parts["transform"], key=khash,
                               dynamic=dynamic, probe=probe, generic=generic)
    return g, source


def _describe(kind, fn, wrt, names):
    """(where the function is, the generated function's docstring)."""
    src = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', '?')}"
    try:
        # the code object's first line, as inspect.getsourcelines gives it
        # without tokenizing the source (which need not be valid Python)
        src += f" ({inspect.getsourcefile(fn)}:{fn.__code__.co_firstlineno})"
    except (TypeError, OSError, AttributeError):
        pass  # no source file (a builtin, a REPL lambda): the name says enough
    doc = {"forward": f"The forward computation of {src}.",
           "grad": f"The value and gradient of {src} w.r.t. {_wrt_desc(wrt, names)}.",
           "value_and_grad": f"The value and gradient of {src} w.r.t. {_wrt_desc(wrt, names)}.",
           "jacrev": f"The Jacobian of {src} w.r.t. {_wrt_desc(wrt, names)} (reverse mode).",
           "jacfwd": f"The Jacobian of {src} w.r.t. {_wrt_desc(wrt, names)} (forward mode).",
           "hessian": f"The Hessian of {src} w.r.t. {_wrt_desc(wrt, names)}."}[kind]
    return src, doc


def _wrt_desc(wrt, names):
    return ", ".join(names[lo] if hi - lo == 1 else f"{names[lo]}..{names[hi - 1]}"
                     for _, lo, hi in wrt)


# --- the public functions -----------------------------------------------------------------

# torch.compile's backend names: "inductor" (its default) is ours (native C
# where a compiler works); "eager" and "aot_eager" run the captured graph
# without a code generator of their own: the NumPy target
_TORCH_BACKENDS = {"inductor": None, "eager": "numpy", "aot_eager": "numpy"}
_TORCH_MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def compile(fn=None, *, backend=None, static_argnums=(), static_argnames=(), fallback=True,
            dynamic=None, fullgraph=False, mode=None, options=None, disable=False):
    """Compile ``fn`` (plain NumPy or Tensor code) to generated NumPy code,
    traced once per input signature and cached in memory and on disk.

    Python control flow on values (``if``, ``while``, ``break``, ``and``,
    ``min``/``max``) becomes graph control flow; what cannot (a branch that
    prints, say) runs the function eagerly for that signature, said once in
    the log; ``fallback=False`` raises the TraceError instead.

    ``dynamic`` (native target): None builds C generic in the sizes that
    vary once a function's C has been seen at two sizes, True at once,
    False never (docs/native.md, "Generic sizes"); grad, value_and_grad,
    jacobian, jacfwd and hessian take it too.

    Usable as ``@tg.compile`` or ``@tg.compile(static_argnums=...)``.  An
    object whose class says how it compiles (``__tracegrad_compile__``: an
    ``nn.Module`` gives an ``OptimizedModule``, as ``torch.compile``) is
    compiled that way.

    torch.compile's keywords: ``fullgraph=True`` is ``fallback=False`` (a
    graph break raises), ``disable=True`` returns ``fn`` itself, ``backend=``
    also takes "inductor" (the default) and "eager"/"aot_eager" (the NumPy
    target), ``mode=`` takes torch's modes and changes nothing (tracegrad
    has one way to compile), ``options=`` must be empty (Inductor's settings
    have no counterpart here)."""
    if disable:
        return fn if fn is not None else (lambda f: f)
    if isinstance(backend, str) and backend in _TORCH_BACKENDS:
        backend = _TORCH_BACKENDS[backend]
    if mode not in _TORCH_MODES:
        raise RuntimeError(f"Unrecognized mode={mode!r}, should be one of: "
                           f"{', '.join(m for m in _TORCH_MODES if m)}")
    if options:
        raise ValueError(f"tg.compile(options={options!r}): torch Inductor's settings have no "
                         f"counterpart in tracegrad; leave options out")
    if fullgraph:
        fallback = False
    if fn is None:
        return lambda f: compile(f, backend=backend, static_argnums=static_argnums,
                                 static_argnames=static_argnames, fallback=fallback,
                                 dynamic=dynamic)
    compile_object = getattr(type(fn), "__tracegrad_compile__", None)
    if compile_object is not None:
        return compile_object(fn, backend=backend, static_argnums=static_argnums,
                              static_argnames=static_argnames, fallback=fallback,
                              dynamic=dynamic)
    return Compiled(fn, "forward", backend=backend, static_argnums=static_argnums,
                    static_argnames=static_argnames, fallback=fallback, dynamic=dynamic)


def grad(fn, argnums=0, has_aux=False, *, backend=None, static_argnums=(), static_argnames=(),
         compile=True, fallback=True, dynamic=None):
    """The gradient of a scalar function w.r.t. argument(s) ``argnums``.

    compile=False runs ``fn`` eagerly on values that record the tape, so its
    control flow may depend on values (``while err > tol``), as with HIPS
    autograd; every transform takes it."""
    return Compiled(fn, "grad", argnums, has_aux, backend, static_argnums, static_argnames,
                    compile, fallback, dynamic)


def value_and_grad(fn, argnums=0, has_aux=False, *, backend=None, static_argnums=(),
                   static_argnames=(), compile=True, fallback=True, dynamic=None):
    """``(value, gradient)`` of a scalar function in one compiled call."""
    return Compiled(fn, "value_and_grad", argnums, has_aux, backend, static_argnums,
                    static_argnames, compile, fallback, dynamic)


def jacobian(fn, argnums=0, *, backend=None, static_argnums=(), static_argnames=(),
             compile=True, fallback=True, dynamic=None):
    """The full Jacobian (reverse mode): shape out.shape + in.shape, all rows
    in one compiled call."""
    return Compiled(fn, "jacrev", argnums, False, backend, static_argnums, static_argnames,
                    compile, fallback, dynamic)


jacrev = jacobian


def jacfwd(fn, argnums=0, *, backend=None, static_argnums=(), static_argnames=(),
           compile=True, fallback=True, dynamic=None):
    """The full Jacobian by forward mode (one tangent per input element)."""
    return Compiled(fn, "jacfwd", argnums, False, backend, static_argnums, static_argnames,
                    compile, fallback, dynamic)


def hessian(fn, argnums=0, *, backend=None, static_argnums=(), static_argnames=(),
            compile=True, fallback=True, dynamic=None):
    """The Hessian of a scalar function: shape in.shape + in.shape."""
    return Compiled(fn, "hessian", argnums, False, backend, static_argnums, static_argnames,
                    compile, fallback, dynamic)


def _bind_statics(fn, primals, static_argnums, static_argnames, what):
    """(function of the dynamic primals, dynamic primals, static positions)."""
    if static_argnames:
        raise TypeError(f"tg.{what} takes its primals positionally, so static_argnames has "
                        f"nothing to name; bind keyword arguments with functools.partial or "
                        f"a lambda")
    static_argnums = _norm_argnums(static_argnums, "static_argnums")[0]
    n = len(primals)
    for a in static_argnums:
        if not -n <= a < n:
            raise TypeError(f"tg.{what} of {getattr(fn, '__qualname__', fn)}: "
                            f"static_argnums={static_argnums} refers to primal {a}, but "
                            f"{n} primal{'s were' if n != 1 else ' was'} given")
    static = {a % n for a in static_argnums}
    if not static:
        return fn, tuple(primals), ()
    fixed = {i: primals[i] for i in static}

    def with_statics(*dyn):
        it = iter(dyn)
        return fn(*[fixed[i] if i in fixed else next(it) for i in range(n)])

    with_statics.__qualname__ = getattr(fn, "__qualname__", "f")
    with_statics.__name__ = getattr(fn, "__name__", "f")
    with_statics.__module__ = getattr(fn, "__module__", None)
    return with_statics, tuple(p for i, p in enumerate(primals) if i not in static), sorted(static)


def vjp(fn, *primals, has_aux=False, backend=None, static_argnums=(), static_argnames=(),
        compile=True):
    """``(outputs, vjp_fn)``: vjp_fn(cotangents) -> one cotangent per dynamic
    primal (static ones, named by ``static_argnums``, get none).
    compile=False: run ``fn`` eagerly (control flow may depend on values)."""
    from tracegrad.runtime import graph_call
    if isinstance(fn, Compiled) and fn.kind == "forward":
        fn = fn.fn
    f, dyn, _ = _bind_statics(fn, primals, static_argnums, static_argnames, "vjp")
    if not compile and not any(type(x) is Tracer for x in tree_flatten(dyn)[0]):
        # (inside a compiled transform the primals are symbols: traced as compiled)
        return _eager_vjp(f, dyn, has_aux)
    return graph_call.vjp(f, dyn, has_aux, backend)


class _EagerFallback:
    """The entry of a signature whose control flow could not become graph
    control flow: the function runs eagerly (compile=False) for it.  Made
    once per signature, with one log line saying where and why."""

    def __init__(self, name, arrays, error):
        sig = ", ".join(f"{a.dtype}{list(a.shape)}" for a in (np.asarray(x) if not hasattr(
            x, "shape") else x for x in arrays))
        self.where, self.reason = error.where, error.reason
        msg = (f"tracegrad: {name}({sig}) runs eagerly (as with compile=False) for these "
               f"argument types: at {error.where}, {error.reason}. Pass fallback=False for "
               f"the error instead")
        log.warning(msg)
        if os.environ.get("TRACEGRAD_EXPLAIN") and log.hasHandlers():
            print(msg, file=sys.stderr)


class _IntValues:
    """Calls a transform whose integer arguments are static with those
    arguments as Python ints (hashable cache keys)."""

    def __init__(self, compiled):
        self.compiled = compiled

    def __call__(self, *args, **kwargs):
        def plain(v):
            return int(v) if isinstance(v, (np.integer, np.ndarray)) else v
        c = self.compiled
        args = tuple(plain(a) if i in c.static_argnums else a for i, a in enumerate(args))
        kwargs = {k: plain(v) if k in c.static_argnames else v for k, v in kwargs.items()}
        return c(*args, **kwargs)


def _run_eager(fn, args, kwargs):
    """``fn(*args, **kwargs)`` run eagerly (compile=False): the arrays its
    code creates (np.zeros, np.copy...: tracegrad.frontend.created) are
    NumPy-face eager values, so writes of recorded values into them are on
    the tape; a store of such a value into a plain ndarray is a clear error
    (NumPy would drop the gradient)."""
    from tracegrad.eager.tensor import NumpyTensor
    from tracegrad.ops.indexing import indexable_constants
    with created.following(NumpyTensor.created), foreign_writes_explained("a value being differentiated"):
        return indexable_constants(fn, None, None, created.substitute)(*args, **kwargs)


def _eager_run(f, primals):
    """f on eager values of the primals' leaves that record the tape (of
    the primal's face: a Tensor gives a torch-face Tensor, anything else
    NumPy's): (those values, input tree, output, nested)."""
    from tracegrad.autograd import enable_grad
    from tracegrad.eager.tensor import Tensor
    leaves, tree = tree_flatten(tuple(primals))
    paths = display_paths(tree, "primals")
    name = getattr(f, "__qualname__", "f")
    nested = _eager_nested(leaves)
    xs = []
    for x, path in zip(leaves, paths):
        a = leaf_array(x, lambda: f"{name} (compile=False): {path}")[0]
        if a.dtype.kind in "fc":
            xs.append(_eager_start(x, a, nested))
        elif isinstance(x, Tensor):
            xs.append(x.detach())
        else:
            from tracegrad.eager.tensor import NumpyTensor
            xs.append(NumpyTensor(np.array(a)))
    with enable_grad(), _EagerLevel():
        out = _run_eager(f, tree_unflatten(tree, xs), {})
    _refuse_traced(tree_flatten(out)[0], f"{name} (compile=False)")
    return xs, tree, out, nested


def _eager_cotangents(outs, xs, cts, create_graph=False):
    """J^T ct for the output leaves ``outs`` (zeros where no path).
    create_graph: the results stay on the tape, each in its leaf's face."""
    from tracegrad import autograd
    from tracegrad.eager.tensor import NumpyTensor
    pairs = [(o, c if hasattr(c, "grad_fn") else
              NumpyTensor(np.asarray(c, dtype=np.asarray(_plain(o)).dtype)))
             for o, c in zip(outs, cts) if getattr(o, "requires_grad", False)]
    wrt = [x for x in xs if x.requires_grad]
    found = {}
    if pairs and wrt:
        gs = autograd.grad([o for o, _ in pairs], wrt, [c for _, c in pairs], retain_graph=True,
                           allow_unused=True, create_graph=create_graph)
        found = {id(x): g for x, g in zip(wrt, gs) if g is not None}
    if create_graph:
        return [_face_of(x, found[id(x)]) if id(x) in found else
                _zeros_like_leaf(x, x.shape, True) for x in xs]
    return [_plain(found[id(x)]) if id(x) in found else np.zeros(x.shape, x.dtype) for x in xs]


def _eager_vjp(f, primals, has_aux):
    xs, in_tree, out, nested = _eager_run(f, primals)
    if has_aux:
        out, aux = out
    out_leaves, out_tree = tree_flatten(out)

    def vjp_fn(ct):
        ct_leaves, ct_tree = tree_flatten(ct, like=out_tree)
        if ct_tree != out_tree:
            raise ValueError(f"vjp_fn expects cotangents shaped like the function's output "
                             f"({len(out_leaves)} arrays), got {len(ct_leaves)}")
        deep = nested or _eager_nested(ct_leaves)
        cts = _eager_cotangents(out_leaves, xs, ct_leaves, create_graph=deep)
        if deep:
            cts = _outer_only(cts, xs)
        return tuple(tree_unflatten(in_tree, cts))

    if nested:
        out = tree_unflatten(out_tree, _outer_only(out_leaves, xs))
        return (out, vjp_fn, aux) if has_aux else (out, vjp_fn)
    plain = tree_unflatten(out_tree, [_plain(o) for o in out_leaves])
    if has_aux:
        return plain, vjp_fn, _plain_tree(aux)
    return plain, vjp_fn


def _plain_tree(x):
    leaves, tree = tree_flatten(x)
    return tree_unflatten(tree, [_plain(v) for v in leaves])


def _eager_jvp(f, primals, tangents):
    """Forward mode on the tape: J t is the vjp of the vjp (the cotangent
    u enters J^T u linearly, so d/du <J^T u, t> = J t)."""
    from tracegrad import autograd
    from tracegrad.eager.tensor import NumpyTensor
    xs, in_tree, out, nested = _eager_run(f, primals)
    out_leaves, out_tree = tree_flatten(out)
    t_leaves, t_tree = tree_flatten(tuple(tangents), like=in_tree)
    if t_tree != in_tree:
        raise ValueError("jvp: tangents must have the same structure as primals")
    nested = nested or _eager_nested(t_leaves)
    us = [NumpyTensor(np.zeros(np.shape(_plain(o)), np.asarray(_plain(o)).dtype),
                      requires_grad=True) for o in out_leaves]
    gs = _eager_cotangents(out_leaves, xs, us, create_graph=True)
    total = None
    for g, t in zip(gs, t_leaves):
        if getattr(g, "requires_grad", False):
            t = t if hasattr(t, "grad_fn") else np.asarray(t, dtype=g.dtype)
            term = (g * t).sum()
            total = term if total is None else total + term
    if total is None:
        tans = [_zeros_like_leaf(u, u.shape, nested) for u in us]
    elif nested:
        jt = autograd.grad(total, us, allow_unused=True, create_graph=True)
        tans = [_zeros_like_leaf(u, u.shape, True) if j is None else _face_of(u, j)
                for j, u in zip(jt, us)]
    else:
        jt = autograd.grad(total, us, allow_unused=True)
        tans = [np.zeros(u.shape, u.dtype) if j is None else _plain(j) for j, u in zip(jt, us)]
    if nested:
        return (tree_unflatten(out_tree, _outer_only(out_leaves, xs)),
                tree_unflatten(out_tree, _outer_only(tans, list(xs) + us)))
    return (tree_unflatten(out_tree, [_plain(o) for o in out_leaves]),
            tree_unflatten(out_tree, tans))


def jvp(fn, primals, tangents, *, backend=None, static_argnums=(), static_argnames=(),
        compile=True):
    """``(outputs, output_tangents)`` by forward mode; ``tangents`` has one
    entry per dynamic primal.  compile=False: run ``fn`` eagerly."""
    from tracegrad.runtime import graph_call
    if isinstance(fn, Compiled) and fn.kind == "forward":
        fn = fn.fn
    for what, v in (("primals", primals), ("tangents", tangents)):
        if not isinstance(v, (tuple, list)):
            raise TypeError(f"tg.jvp(f, primals, tangents) takes {what} as a tuple or list "
                            f"with one entry per argument of f, got a {type(v).__name__}; "
                            f"for one argument write tg.jvp(f, (x,), (t,))")
    f, dyn, _ = _bind_statics(fn, tuple(primals), static_argnums, static_argnames, "jvp")
    if not compile and not any(type(x) is Tracer for x in tree_flatten((dyn, tangents))[0]):
        # (inside a compiled transform the primals are symbols: traced as compiled)
        return _eager_jvp(f, dyn, tangents)
    return graph_call.jvp(f, dyn, tangents, backend)
