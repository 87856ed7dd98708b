"""The eager interpreter of one primitive: ``eager_bind`` computes the
row's ``impl`` on the arrays at once and, when grad mode is on and an
operand requires grad, records a ``PrimNode`` whose backward applies the
row's vjp rule.  It is the registry's binder for every value that is not
being traced (``primitives.bind``).
"""
from __future__ import annotations

import weakref

import numpy as np

from tracegrad.eager.device import _ndarray
from tracegrad.eager.tensor import NumpyTensor, Tensor, _NO_EDGE, _edge_of, _edges
from tracegrad.eager.nodes import LIVE_VIEWS, PrimNode
from tracegrad.ops import primitives
from tracegrad.ops.indexing import build_index
from tracegrad.eager.grad_mode import state as _mode
from tracegrad.eager.profiler_state import _state as _prof_state



def _view_chain(src, prim, attrs, rest):
    """(base, chain) of a view op's output: the chain of (prim, attrs, other
    operands) that makes the view from its base."""
    if src._base is not None:
        chain = src._view_fn
        # a view of a multi-output view stays one (chain unknown: no in-place)
        return src._base, None if chain is None else chain + ((prim, attrs, rest),)
    return src, ((prim, attrs, rest),)


def note_view(view):
    """Remember a view of its base (tracegrad.eager.torch_methods refreshes
    the histories of a base's other views after an in-place update)."""
    if view._view_fn is None:
        return
    entry = LIVE_VIEWS.get(id(view._base))
    if entry is None or entry[0]() is not view._base:
        entry = LIVE_VIEWS[id(view._base)] = (weakref.ref(view._base), [])
        if len(LIVE_VIEWS) > 4096:      # forget bases that are gone
            for k in [k for k, e in LIVE_VIEWS.items() if e[0]() is None]:
                del LIVE_VIEWS[k]
    refs = entry[1]
    if len(refs) > 64:
        refs[:] = [r for r in refs if r() is not None]
    refs.append(weakref.ref(view))


# Rows whose NumPy result is a view of the operand but whose torch result is
# a copy: np.flip is a view, torch.flip a new tensor, so an in-place op on a
# torch-face result must not reach the operand.
_TORCH_COPIES = frozenset({"flip"})


def _element_view(arrays, attrs):
    """t[i, j] with an integer for every dimension: NumPy gives a scalar (a
    copy, NumPy's meaning, which NumPy-face values keep); torch a 0-d view
    of t, so t[0].add_(1) writes into t."""
    return arrays[0][build_index(attrs["index"], arrays[1:]) + (Ellipsis,)]


def _shares_base(out, src):
    """out is a view into src's memory.  NumPy points every view's ``base``
    at the array that owns the memory, so comparing owners is enough (and
    much cheaper than np.may_share_memory)."""
    b = out.base
    if b is None:
        return False
    return b is src or (src.base is not None and b is src.base)


def _may_promote(prim, arrays):
    """Could torch's promotion change anything here?  (The common case, one
    dtype and numbers of its category or below, answers no at once.)"""
    dt = None
    scalar = 0
    for x in arrays:
        tx = type(x)
        if tx is _ndarray:
            if dt is None:
                dt = x.dtype
            elif x.dtype != dt:
                return True
        elif tx is float:
            scalar |= 2
        elif tx is int:
            scalar |= 1
        else:
            return True
    if dt is None:
        return True
    k = dt.kind
    if k == "f" or k == "c":      # a number of any category fits (NumPy's weak numbers)
        return False
    return bool(scalar & 2) or (k == "b" and bool(scalar & 1)) or prim.torch_float


def eager_bind(prim, args, attrs):
    if _mode.raw:
        # a vjp rule inside a backward without create_graph: plain arrays in,
        # plain arrays out (a Tensor operand takes the full path below)
        xp = np
        for a in args:
            t = type(a)
            if t is Tensor or t is NumpyTensor:
                break
            if t is not _ndarray and t is not float and t is not int and \
                    t.__module__.startswith("cupy"):
                xp = primitives.array_module(a)
        else:
            prof = _prof_state.current
            if prof is None:
                return prim.impl(xp, *args, **attrs)
            ev = prof._begin(prim.name, "op", args)
            out = prim.impl(xp, *args, **attrs)
            prof._end(ev)
            return out
    if prim.n_out == 1 and _prof_state.current is None:
        # The common case in one pass: a single-output primitive on CPU
        # Tensors and numbers, no profiler.  Anything else (CuPy data, lists)
        # takes the general path below.
        arrays = []
        edges = []
        needs_grad = False
        tensors = False
        for a in args:
            ta = type(a)
            if ta is Tensor:
                tensors = True
                d = a._data
                if type(d) is not _ndarray:
                    break
                arrays.append(d)
                if a._requires_grad:
                    needs_grad = True
                    fn = a.grad_fn  # _edge_of, inlined
                    edges.append((fn, a._output_nr) if fn is not None
                                 else (a._accumulate_node(), 0))
                else:
                    edges.append(_NO_EDGE)
            elif ta is float or ta is int or ta is _ndarray or ta is bool:
                arrays.append(a)
                edges.append(_NO_EDGE)
            else:
                break
        else:
            if tensors and prim.torch_promotes and _may_promote(prim, arrays):
                promoted = primitives.torch_promotion(prim, args)   # torch's (ops/dtypes.py)
                if promoted is not args:
                    return eager_bind(prim, promoted, attrs)
            try:
                out = prim.impl(np, *arrays, **attrs)
            except (ValueError, TypeError) as e:
                raise primitives.with_message(e, f"{e} (in tracegrad op '{prim.name}')") from e
            if type(out) is not _ndarray:
                if prim.name == "getitem" and type(arrays[0]) is _ndarray:
                    out = _element_view(arrays, attrs)   # every Tensor here speaks torch
                else:
                    # a NumPy scalar becomes a 0-d array; a CuPy result
                    # (to_device) stays on its device
                    out = primitives.array_module(out).asarray(out)
            if not tensors:
                return out   # plain arrays in, plain arrays out (tg.exp(ndarray))
            track = needs_grad and _mode.grad_enabled and not prim.nondiff \
                and out.dtype.kind in "fc"
            if prim.view and prim.name in _TORCH_COPIES:
                out = out.copy()     # every Tensor here speaks torch
            elif prim.view:
                src = args[0]
                if type(src) is Tensor and _shares_base(out, arrays[0]):
                    # a real view (advanced indexing and some reshapes copy
                    # instead): it shares its base's version counter
                    vbox = src._vbox
                    t = Tensor(out, track, PrimNode(prim, attrs, args, out, tuple(edges), vbox)
                               if track else None, 0, vbox)
                    t._base, t._view_fn = _view_chain(src, prim, attrs, args[1:])
                    note_view(t)
                    return t
            if track:
                vbox = [0]
                return Tensor(out, True, PrimNode(prim, attrs, args, out, tuple(edges), vbox),
                              0, vbox)
            return Tensor(out)
    if prim.torch_promotes:     # torch's promotion for torch-face operands (primitives.py)
        promoted = primitives.torch_promotion(prim, args)
        if promoted is not args:
            return eager_bind(prim, promoted, attrs)
    arrays = []
    needs_grad = False
    cls = None     # the first Tensor operand's class: its face carries over
    xp = np
    on_cpu = False  # a Tensor operand in host memory (device check below)
    for a in args:
        if isinstance(a, Tensor):
            if cls is None:
                cls = type(a)
            d = a._data
            if a._requires_grad:
                needs_grad = True
            if type(d) is not _ndarray:
                xp = primitives.array_module(d)
            else:
                on_cpu = True
            arrays.append(d)
        elif type(a) is list or type(a) is tuple:
            raise TypeError(f"{prim.name}: operands must be arrays or scalars, got a {type(a).__name__}")
        else:
            arrays.append(a)
    if on_cpu and xp is not np:  # CUDA device work: no implicit copies between devices
        raise RuntimeError(
            f"Expected all tensors to be on the same device, but found at least two devices, "
            f"cuda and cpu! (in tracegrad op '{prim.name}'); move one with .to(device), "
            f".cuda() or .cpu()")
    prof = _prof_state.current
    if prof is not None:
        ev = prof._begin(prim.name, "op", arrays)
    try:
        out = prim.impl(xp, *arrays, **attrs)
    except (ValueError, TypeError) as e:
        raise primitives.with_message(e, f"{e} (in tracegrad op '{prim.name}')") from e
    if prof is not None:
        prof._end(ev)
    track = needs_grad and not prim.nondiff and _mode.grad_enabled
    if prim.n_out == 1:
        if type(out) is not _ndarray and prim.name == "getitem" and cls is not None \
                and cls._face == "torch" and type(arrays[0]) is _ndarray:
            out = _element_view(arrays, attrs)
        elif type(out) is not _ndarray:  # a CuPy result stays CuPy (to_device to "cuda")
            mod = primitives.array_module(out)
            out = (mod if mod is not np else xp).asarray(out)
        if cls is None:
            return out
        scalar_copy = prim.view and cls._face == "numpy" and \
            getattr(args[0], "_rebinds", None) is not None and args[0]._rebinds()
        if scalar_copy or (prim.view and prim.name in _TORCH_COPIES and cls._face == "torch"):
            # (a reshape or an index of a NumPy scalar, np.var(x, axis=0) of a
            # vector say, is a new array, or a new scalar where it is 0-d:
            # writes into it do not reach the scalar)
            out = out.copy()
        elif prim.view:
            src = args[0]
            # a real view (shares memory with its operand; advanced indexing
            # and some reshapes copy instead)
            if isinstance(src, Tensor) and (type(out) is not _ndarray
                                            or _shares_base(out, src._data)):
                vbox = src._vbox
                t = cls(out, False, None, 0, vbox)
                t._base, t._view_fn = _view_chain(src, prim, attrs, tuple(args[1:]))
                note_view(t)
                if track and out.dtype.kind in "fc":
                    t.grad_fn = PrimNode(prim, attrs, args, out, _edges(args), vbox)
                    t._requires_grad = True
                return t
        if prim.name == "einsum" and cls._face == "numpy" and len(args) == 1 and \
                isinstance(args[0], Tensor) and type(args[0]._data) is _ndarray:
            # NumPy's one-operand einsum may be a view ('ij->ji', 'ii->i'):
            # then so is the eager result (it reads later writes into its
            # base, and its history follows them); in-place updates of it are
            # refused, as compiled code refuses them (torch_methods._inplace)
            a = args[0]
            view = np.einsum(attrs["subscripts"], a._data)
            if np.may_share_memory(view, a._data):
                vbox = a._vbox
                t = cls(view, False, None, 0, vbox)
                t._base, t._view_fn = _view_chain(a, prim, attrs, ())
                note_view(t)
                if track and out.dtype.kind in "fc":
                    t.grad_fn = PrimNode(prim, attrs, args, view, _edges(args), vbox)
                    t._requires_grad = True
                return t
        if not track or out.dtype.kind not in "fc":
            return cls(out)
        vbox = [0]
        node = PrimNode(prim, attrs, args, out, _edges(args), vbox)
        return cls(out, True, node, 0, vbox)
    outs = tuple(o if type(o) is _ndarray else xp.asarray(o) for o in out)
    if cls is None:
        return outs
    src = args[0] if prim.view else None
    if isinstance(src, Tensor):
        # views of one base (split): they share its version counter, and
        # in-place ops on them are refused (see Tensor._inplace)
        vboxes = tuple(src._vbox for _ in outs)
        base = src._base if src._base is not None else src
        res = tuple(cls(o, False, None, 0, src._vbox) for o in outs)
        for t in res:
            t._base, t._view_fn = base, None
        if track:
            node = PrimNode(prim, attrs, args, outs, _edges(args), vboxes)
            node.output_meta = [(o.shape, o.dtype) for o in outs]
            for i, t in enumerate(res):
                if outs[i].dtype.kind in "fc":
                    t.grad_fn, t._output_nr, t._requires_grad = node, i, True
        return res
    if not track:
        return tuple(cls(o) for o in outs)
    vboxes = tuple([0] for _ in outs)
    node = PrimNode(prim, attrs, args, outs, tuple(
        _edge_of(a) if isinstance(a, Tensor) else _NO_EDGE for a in args), vboxes)
    node.output_meta = [(o.shape, o.dtype) for o in outs]
    return tuple(cls(o, True, node, i, vb) if o.dtype.kind in "fc" else cls(o, False, None, 0, vb)
                 for i, (o, vb) in enumerate(zip(outs, vboxes)))


primitives._eager_bind = eager_bind
