"""Forward-mode AD in eager mode: ``torch.autograd.forward_ad``.

Inside a ``dual_level()`` a tensor made by ``make_dual(primal, tangent)``
carries its tangent through every eager op: each op computes its value as
usual and its output tangent with the primitive's jvp rule from the registry
(``ops.base.jvp_apply``, the same rules the compiler's forward mode uses), so
no derivative is written twice.  ``unpack_dual`` reads the tangent back.
Custom ``Function``s take part through their ``jvp(ctx, *tangents)``.

Cost when no level is open: none.  Entering a level swaps the eager binder
(``primitives._eager_bind``) for ``_dual_bind``, which looks for tangents on
the operands and otherwise hands the call to the ordinary binder; leaving
the level puts the ordinary binder back.  As in torch, one level at a time
(nested forward AD is not supported) and levels are global, not per thread.

A tangent is kept on the tensor (``Tensor._fw = (level, tangent)``); leaving
the level forgets every tangent made in it.
"""
from __future__ import annotations

import collections
import functools

import numpy as np

from tracegrad.ops import primitives
from tracegrad.eager import tensor as _tensor
from tracegrad.ops.base import jvp_apply, reshape_p
from tracegrad.eager.tensor import Tensor, _FW
from tracegrad.eager.bind import eager_bind as _plain_bind

__all__ = ["UnpackedDualTensor", "enter_dual_level", "exit_dual_level", "make_dual",
           "unpack_dual", "dual_level"]

UnpackedDualTensor = collections.namedtuple("UnpackedDualTensor", ["primal", "tangent"])
UnpackedDualTensor.__doc__ = ("Namedtuple returned by unpack_dual: the primal and tangent "
                              "components of a dual tensor.")

_ids = iter(range(1, 1 << 62))
_duals = []   # tensors given a tangent in the open level (to forget them on exit)


def tangent_of(t):
    """The tangent ``t`` carries in the open level, or None."""
    return _tensor._tangent(t)


def _set_tangent(t, tangent):
    t._fw = (_FW.level, tangent)
    _duals.append(t)


def _dual_bind(prim, args, attrs):
    """The eager binder while a dual level is open: the value as usual, and
    the output tangent from the primitive's jvp rule."""
    tangents = None
    level = _FW.level
    for i, a in enumerate(args):
        fw = getattr(a, "_fw", None) if isinstance(a, Tensor) else None
        if fw is not None and fw[0] == level:
            if tangents is None:
                tangents = [None] * len(args)
            tangents[i] = fw[1]
    out = _plain_bind(prim, args, attrs)
    if tangents is None:
        return out
    # the rule computes on the primals; their tangents take no part in it
    primitives._eager_bind = _plain_bind
    try:
        t_out = jvp_apply(prim, attrs, tangents, out, args)
    finally:
        primitives._eager_bind = _dual_bind
    if isinstance(out, tuple):
        for o, t in zip(out, t_out):
            if t is not None and isinstance(o, Tensor) and o.dtype.kind in "fc":
                _set_tangent(o, t)
    elif t_out is not None and isinstance(out, Tensor) and out.dtype.kind in "fc":
        _set_tangent(out, t_out)
    return out


def enter_dual_level():
    """Open a forward-AD level (prefer the ``dual_level()`` context manager).
    Returns the level's index (0: one level at a time)."""
    if _FW.level is not None:
        raise RuntimeError("Nested forward mode AD is not supported at the moment")
    _FW.level = next(_ids)
    primitives._eager_bind = _dual_bind
    return 0


def exit_dual_level(*, level=None):
    """Close the open forward-AD level; every tangent made in it is forgotten."""
    if _FW.level is None:
        raise RuntimeError("Trying to exit a forward AD level but no level is open; "
                           "use `with dual_level():` around forward AD code.")
    if level is not None and level != 0:
        raise RuntimeError("Trying to exit a forward AD level that was not the last one "
                           "that was created. This is not supported.")
    primitives._eager_bind = _plain_bind
    _FW.level = None
    for t in _duals:
        t._fw = None
    _duals.clear()


class dual_level:
    """Context manager for forward AD: every dual tensor made inside lives
    until the block ends.

        with dual_level():
            x = make_dual(primal, tangent)
            y = f(x)
            jvp = unpack_dual(y).tangent
    """

    def __enter__(self):
        return enter_dual_level()

    def __exit__(self, *exc):
        exit_dual_level()
        return False

    def __call__(self, fn):
        """As a decorator: ``fn`` runs inside its own dual level."""
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with dual_level():
                return fn(*args, **kwargs)
        return wrapper


def _check_level(level, what):
    if _FW.level is None:
        raise RuntimeError(f"Trying to {what} for forward AD but no level exists, make sure to "
                           f"enter_dual_level() first.")
    if level is not None and level != 0:
        raise RuntimeError(f"Trying to {what} at level {level}, but the only open forward AD "
                           f"level is 0 (nested forward mode AD is not supported)")


def make_dual(tensor, tangent, *, level=None):
    """A view of ``tensor`` that carries ``tangent`` as its forward gradient.

    ``tangent`` must have ``tensor``'s shape; both must be floating point
    (or complex).  A float tangent of another precision is cast to the
    primal's dtype.  Gradients of reverse mode still flow to ``tensor``."""
    if _FW.level is None:
        raise RuntimeError("Trying to create a dual Tensor for forward AD but no level exists, "
                           "make sure to enter_dual_level() first.")
    _check_level(level, "create a dual Tensor")
    if not isinstance(tensor, Tensor):
        raise TypeError(f"make_dual expects a Tensor as primal, got {type(tensor).__name__}")
    if not isinstance(tangent, Tensor):
        if isinstance(tangent, (np.ndarray, list, float, int)):
            tangent = Tensor(np.asarray(tangent, dtype=tensor.dtype))
        else:
            raise TypeError(f"make_dual expects a Tensor as tangent, got "
                            f"{type(tangent).__name__}")
    if tensor.dtype.kind not in "fc":
        raise ValueError(f"Expected primal to be floating point or complex, but got: "
                         f"{tensor.dtype}")
    if tangent.dtype.kind not in "fc":
        raise ValueError(f"Expected tangent to be floating point or complex, but got: "
                         f"{tangent.dtype}")
    if tuple(tangent.shape) != tuple(tensor.shape):
        raise RuntimeError(
            f"Trying to set a forward gradient that has a different size than that of the "
            f"original Tensor, this is not supported. Tensor is of size {list(tensor.shape)} "
            f"while the given forward gradient is of size {list(tangent.shape)}.")
    if tangent_of(tensor) is not None:
        raise RuntimeError("Making a dual Tensor based on a Tensor that already has a forward "
                           "gradient at the same level 0 is not supported. Take "
                           "unpack_dual(tensor).primal first.")
    if tangent.dtype != tensor.dtype:
        tangent = tangent.to(tensor.dtype)
    dual = _view(tensor)
    _set_tangent(dual, tangent)
    return dual


def _view(t):
    """A view of ``t`` on the same memory (a ViewBackward0 node when ``t``
    requires grad), carrying no tangent."""
    prev = primitives._eager_bind
    primitives._eager_bind = _plain_bind
    try:
        return primitives.bind(reshape_p, t, shape=tuple(t.shape))
    finally:
        primitives._eager_bind = prev


def unpack_dual(tensor, *, level=None):
    """``UnpackedDualTensor(primal, tangent)``: a view of ``tensor`` without
    its tangent, and the tangent (None when it has none or no level is
    open)."""
    if _FW.level is None:
        return UnpackedDualTensor(tensor, None)
    if not isinstance(tensor, Tensor):
        raise TypeError(f"unpack_dual expects a Tensor, got {type(tensor).__name__}")
    # as in torch, a level that is not open holds no tangent (no error)
    tangent = tangent_of(tensor) if level is None or level == 0 else None
    if tangent is None:
        return UnpackedDualTensor(tensor, None)
    return UnpackedDualTensor(_view(tensor), tangent)


# --- custom Functions ---------------------------------------------------------------

def is_active():
    return _FW.level is not None


def function_tangents(args):
    """The tangent of each argument of ``Function.apply`` (None where it has
    none), or None when no argument carries one."""
    res = [tangent_of(a) if isinstance(a, Tensor) else None for a in args]
    return res if any(t is not None for t in res) else None


class plain_ops:
    """Run a block with forward AD off (a custom Function's forward and jvp)."""

    def __enter__(self):
        self.prev = primitives._eager_bind
        primitives._eager_bind = _plain_bind

    def __exit__(self, *exc):
        primitives._eager_bind = self.prev
        return False


def attach_function_tangents(cls, node, args, tangents, outputs):
    """Call ``cls.jvp(ctx, *tangents)`` and give each output its tangent."""
    grad_inputs = []
    for a, t in zip(args, tangents):
        if not isinstance(a, Tensor):
            grad_inputs.append(None)
        elif t is None:
            grad_inputs.append(Tensor(np.zeros(a.shape, a.dtype)) if a.dtype.kind in "fc"
                               else None)
        else:
            grad_inputs.append(t)
    node._in_jvp = True
    try:
        with plain_ops():
            res = cls.jvp(node, *grad_inputs)
    finally:
        node._in_jvp = False
    single = not isinstance(outputs, tuple)
    outs = (outputs,) if single else outputs
    res = (res,) if not isinstance(res, tuple) else res
    if len(res) != len(outs):
        raise RuntimeError(f"function {cls.__name__}.jvp returned an incorrect number of "
                           f"tangents (expected {len(outs)}, got {len(res)})")
    for i, (o, t) in enumerate(zip(outs, res)):
        if t is None or not isinstance(o, Tensor) or o.dtype.kind not in "fc":
            continue
        if not isinstance(t, Tensor):
            t = Tensor(np.asarray(t, dtype=o.dtype))
        if tuple(t.shape) != tuple(o.shape):
            raise RuntimeError(f"function {cls.__name__}.jvp returned a tangent of shape "
                               f"{list(t.shape)} for output {i} of shape {list(o.shape)}")
        if t.dtype != o.dtype:
            t = t.to(o.dtype)
        _set_tangent(o, t)


# --- compiled calls -------------------------------------------------------------------

def attach_compiled_tangents(gf, values, outputs):
    """Give the outputs of a compiled call on the eager tape (``gf``, a
    ``graph_call.GraphFunction`` run on ``values``) their tangents, from the
    compiled forward-mode graph (``gf.derived("jvp")``: primals and
    tangents in, outputs and their tangents out).  Nothing happens when no
    argument carries a tangent."""
    tangents = [tangent_of(v) if isinstance(v, Tensor) else None for v in values]
    if all(t is None for t in tangents):
        return
    fixed = getattr(gf, "fixed", ())    # captured state: passed as it is, no tangent input
    arrays = [v._data if isinstance(v, Tensor) else v if i in fixed else np.asarray(v)
              for i, v in enumerate(values)]
    t_arrays = []
    for i, (a, t) in enumerate(zip(arrays, tangents)):
        if i in fixed:
            continue
        xp = primitives.array_module(a)
        t_arrays.append(xp.zeros(a.shape, a.dtype) if t is None else xp.asarray(t._data, a.dtype))
    outs = gf.derived("jvp").run(*arrays, *t_arrays)
    for o, t in zip(outputs, outs[len(outputs):]):
        if isinstance(o, Tensor) and o.dtype.kind in "fc":
            _set_tangent(o, Tensor(primitives.array_module(t).asarray(t, o.dtype)))
