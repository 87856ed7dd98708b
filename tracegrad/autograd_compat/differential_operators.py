"""HIPS autograd's differential operators (``autograd.differential_operators``)
on tracegrad's transforms.

Each operator keeps autograd's name, argument names (``argnum``, an int or
a tuple of ints) and return conventions (``make_vjp`` returns
``(vjp, ans)``, ``make_jvp(f)(x)`` a function ``v -> (ans, J v)``...).

Compiled or eager
-----------------
autograd runs the user's Python as it is, so its users write control flow
that depends on values (``while err > tol``, ``if x > 0``, ``float(x)``,
``npr.RandomState(int(seed))``).  Every operator here therefore runs in one
of two ways, chosen per operator object by ``mode``:

* ``"auto"`` (the default): the compiled path (trace once per signature,
  generated code, cached) is tried first; if tracing raises
  ``tracegrad.TraceError`` (a value-dependent branch, a conversion to a
  Python number or a NumPy array), the call runs eagerly instead, on values
  that record the tape, and this operator stays eager from then on.  A trace
  either succeeds, and the generated code computes what the Python computes
  for every input of the signature, or it raises: there is no third case
  that gives a different number.  (The trace runs the Python once, so side
  effects before the failing line, such as a ``print``, happen once more.)
* ``"compiled"``: compiled only; a TraceError propagates.
* ``"eager"``: always eager.

``set_mode`` changes the default for operators made afterwards.  Arguments
that are not arrays or numbers (strings, ``None``, booleans, objects) are
passed as static arguments of the compiled function; numbers are traced
(an iteration counter does not retrace), so ``range(n)`` on a number
argument goes the eager way.

The eager path nests: an operator called on values that record an
enclosing eager computation differentiates with ``create_graph``, so
``grad(grad(f))``, ``hessian`` and ``make_hvp`` are exact in either path.
"""
from __future__ import annotations

import functools
import inspect
from collections import OrderedDict

import numpy as onp

from tracegrad import api as _api, ops as _o
from tracegrad.autograd import grad as _tape_grad, enable_grad as _enable_grad
from tracegrad.eager.tensor import NumpyTensor as _NumpyTensor, Tensor as _Tensor
from tracegrad.frontend.trace import TraceError, Tracer as _Tracer, tree_flatten, tree_unflatten
from tracegrad.autograd_compat.extend import (RulesNeeded as _RulesNeeded,
                                              forward_mode_trace as _forward_mode_trace)

__all__ = ["grad", "value_and_grad", "elementwise_grad", "jacobian", "hessian",
           "hessian_tensor_product", "hessian_vector_product", "tensor_jacobian_product",
           "vector_jacobian_product", "make_hvp", "make_vjp", "make_jvp", "make_ggnvp",
           "holomorphic_grad", "grad_named", "grad_and_aux", "multigrad_dict", "deriv",
           "set_mode", "get_mode"]

_MODES = ("auto", "compiled", "eager")
_default = {"mode": "auto"}


def set_mode(mode):
    """The default ``mode`` of operators made from now on: "auto" (compiled,
    eager where tracing fails), "compiled" or "eager"."""
    _default["mode"] = _check_mode(mode)


def get_mode():
    return _default["mode"]


def _check_mode(mode):
    if mode not in _MODES:
        raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
    return mode


# --- values --------------------------------------------------------------------------------

def _is_traced(x):
    return type(x) is _Tracer


def _on_tape(x):
    return isinstance(x, _Tensor) and x.requires_grad


def _leaves(args, kwargs):
    return tree_flatten((tuple(args), dict(kwargs)))[0]


def _dynamic_leaf(x):
    """Can the compiled path take this leaf as an input (traced, not static)?"""
    if isinstance(x, bool) or x is None:
        return False
    return isinstance(x, (onp.ndarray, onp.generic, int, float, onp.random.Generator,
                          _Tensor, _Tracer)) and not isinstance(x, onp.bool_)


def _is_static(v):
    """A non-differentiated argument the compiled function takes as static:
    anything but arrays and numbers (and containers of them)."""
    leaves = tree_flatten(v)[0]
    return bool(leaves) and not all(_dynamic_leaf(x) for x in leaves)


def _as_numpy_face(t):
    """A tape value that speaks NumPy (saved Function outputs come back as
    torch-face Tensors): one add of a NumPy-face zero keeps the tape."""
    if isinstance(t, _NumpyTensor) or not isinstance(t, _Tensor):
        return t
    return _o.add(_NumpyTensor(onp.zeros((), t.dtype)), t)


def _start(x, what):
    """The eager value a differentiated leaf becomes: a fresh tape node (on
    top of an enclosing computation's value when nested)."""
    if isinstance(x, _Tensor):
        if not onp.issubdtype(x.dtype, onp.inexact):
            raise TypeError(f"{what} has dtype {x.dtype}; gradients are defined for "
                            f"floating-point inputs")
        if x.requires_grad:
            return _as_numpy_face(x) if type(x) is not _NumpyTensor else _o.add(x, 0.0)
        x = x.detach().numpy()
    a = onp.asarray(x)
    if a.dtype.kind in "c":
        raise TypeError(f"{what} is complex; tracegrad differentiates real floating-point "
                        f"arrays only (complex numbers are not supported yet)")
    if a.dtype.kind != "f":
        raise TypeError(f"{what} has dtype {a.dtype}; gradients are defined for floating-point "
                        f"inputs. Pass a float (3.0, not 3) or x.astype(float).")
    return _NumpyTensor(onp.array(a), requires_grad=True)


def _refuse_complex(args, argnums):
    """The eager path refuses complex inputs in _start; the compiled path
    would take them, so both paths refuse them here alike."""
    for a in argnums:
        if -len(args) <= a < len(args):
            for x in tree_flatten(args[a])[0]:
                if not _is_traced(x) and onp.asarray(
                        x.detach().numpy() if isinstance(x, _Tensor) else x).dtype.kind == "c":
                    raise TypeError(f"argument {a} is complex; tracegrad differentiates real "
                                    f"floating-point arrays only (complex numbers are not "
                                    f"supported yet)")


def _plain(v):
    """A result for the caller: arrays off the tape, 0-d as a NumPy scalar."""
    if isinstance(v, _Tensor):
        d = v.detach().numpy()
        return d[()] if d.ndim == 0 else onp.array(d)
    return v


def _plain_tree(v):
    leaves, tree = tree_flatten(v)
    return tree_unflatten(tree, [_plain(x) for x in leaves])


# --- the eager engine ---------------------------------------------------------------------

class _EagerVJP:
    """fun run once on tape values for the arguments ``argnums``; ``vjp(g)``
    gives the cotangents of those arguments (nested: on the tape too)."""

    def __init__(self, fun, args, kwargs, argnums, single):
        self.nested = any(_on_tape(x) for x in _leaves(args, kwargs))
        new = list(args)
        self.starts, self.trees = [], []
        for a in argnums:
            if a >= len(args) or a < -len(args):
                raise TypeError(f"argnum={a} but {getattr(fun, '__name__', 'the function')} "
                                f"was called with {len(args)} positional arguments")
            leaves, tree = tree_flatten(args[a])
            ts = [_start(x, f"argument {a}") for x in leaves]
            new[a] = tree_unflatten(tree, ts)
            self.starts.append(ts)
            self.trees.append(tree)
        self.single = single
        with _enable_grad():
            self.ans = fun(*new, **kwargs)
        self.out_leaves, self.out_tree = tree_flatten(self.ans)

    def __call__(self, g, create_graph=None):
        create = self.nested if create_graph is None else create_graph
        g_leaves, g_tree = tree_flatten(g)
        if g_tree != self.out_tree:
            raise ValueError(f"vjp: the cotangent must have the structure of the function's "
                             f"output ({len(self.out_leaves)} arrays), got {len(g_leaves)}")
        outs, cts = [], []
        for o, c in zip(self.out_leaves, g_leaves):
            if _on_tape(o):
                if onp.shape(c) != tuple(o.shape):
                    c = _o.broadcast_to(c, tuple(o.shape)) if isinstance(c, _Tensor) \
                        else onp.broadcast_to(c, tuple(o.shape))
                outs.append(o)
                cts.append(c if isinstance(c, _Tensor) else _NumpyTensor(
                    onp.asarray(c, dtype=o.dtype)))
        flat = [t for ts in self.starts for t in ts]
        found = {}
        if outs:
            with _enable_grad():
                gs = _tape_grad(outs, flat, cts, retain_graph=True, create_graph=create,
                                allow_unused=True)
            found = {id(t): gi for t, gi in zip(flat, gs) if gi is not None}
        res = []
        for ts, tree in zip(self.starts, self.trees):
            vals = []
            for t in ts:
                gi = found.get(id(t))
                if gi is None:
                    gi = onp.zeros(tuple(t.shape), t.dtype)
                    if create:
                        gi = _NumpyTensor(gi)
                vals.append(_as_numpy_face(gi) if create else _plain(gi))
            res.append(tree_unflatten(tree, vals))
        return res[0] if self.single else tuple(res)

    def value(self):
        return self.ans if self.nested else _plain_tree(self.ans)


def _ones_like_out(ans, what):
    size = int(onp.prod(onp.shape(ans)))
    if isinstance(ans, (tuple, list, dict)) or ans is None:
        raise TypeError(f"{what} only applies to real scalar-output functions (the function "
                        f"returned a {type(ans).__name__}). Try jacobian, elementwise_grad "
                        f"or make_vjp.")
    if size != 1:
        raise TypeError(f"{what} only applies to real scalar-output functions (the output "
                        f"has shape {onp.shape(ans)}). Try jacobian, elementwise_grad or "
                        f"make_vjp.")
    return onp.ones(onp.shape(ans), getattr(ans, "dtype", onp.float64))


# --- operators: compiled path, eager path, and the choice between them ------------------------

def _norm_argnum(argnum):
    if isinstance(argnum, (tuple, list)):
        return tuple(int(a) for a in argnum), False
    return (int(argnum),), True


class _Operator:
    """A transformed function: ``compiled(statics)`` builds tracegrad's
    transform for the positions/keywords given as statics; ``eager`` runs
    it on the tape."""

    def __init__(self, fun, argnum, mode, what, build, eager):
        self.fun = fun
        self.argnum = argnum
        self.argnums, self.single = _norm_argnum(argnum)
        self.mode = _check_mode(mode or _default["mode"])
        self.what = what
        self._build = build
        self._eager_fn = eager
        self._compiled = {}
        self.went_eager = None  # the TraceError that sent "auto" to the eager path
        self.plain_only = False  # compiled path for plain arrays only (not nested)
        functools.update_wrapper(self, fun, updated=())

    def __repr__(self):
        return f"<autograd_compat {self.what} of {getattr(self.fun, '__qualname__', self.fun)}>"

    def _statics(self, args, kwargs):
        pos = tuple(i for i, a in enumerate(args) if i not in self._argset(len(args))
                    and _is_static(a))
        names = tuple(sorted(k for k, v in kwargs.items() if _is_static(v)))
        return pos, names

    def _argset(self, n):
        return {a % n if n else a for a in self.argnums}

    def compiled(self, args, kwargs):
        key = self._statics(args, kwargs)
        f = self._compiled.get(key)
        if f is None:
            f = self._compiled[key] = self._build(*key)
        return f(*args, **kwargs)

    def __call__(self, *args, **kwargs):
        _refuse_complex(args, self.argnums)
        leaves = _leaves(args, kwargs)
        traced = any(_is_traced(x) for x in leaves)
        nested = self.plain_only and (traced or any(_on_tape(x) for x in leaves))
        if self.mode == "eager" or nested or (self.mode == "auto" and self.went_eager is not None):
            if traced:
                raise TraceError(
                    f"{self.what} of {self.__name__} runs eagerly (its function's control "
                    f"flow depends on values), so it cannot be part of a compiled function; "
                    f"the enclosing transform runs eagerly too when its mode is 'auto'")
            return self._eager_fn(args, kwargs)
        try:
            return self.compiled(args, kwargs)
        except TraceError as e:
            if self.mode == "compiled" or traced:
                raise
            self.went_eager = e
        return self._eager_fn(args, kwargs)


def _named(fun):
    """A callable without a __name__ (functools.partial, an object with
    __call__) wrapped in a function that has one, as tracegrad's transforms
    name what they compile."""
    if not callable(fun) or hasattr(fun, "__name__"):
        return fun

    def call(*args, **kwargs):
        return fun(*args, **kwargs)
    inner = getattr(fun, "func", type(fun))
    call.__name__ = getattr(inner, "__name__", type(fun).__name__)
    call.__qualname__ = getattr(inner, "__qualname__", call.__name__)
    call.__module__ = getattr(inner, "__module__", None)
    return call


def _op(what, fun, argnum, mode, build, eager):
    if not callable(fun):
        raise TypeError(f"{what} expects a function, got {type(fun).__name__}")
    return _Operator(fun, argnum, mode, what, build, eager)


def grad(fun, argnum=0, *, mode=None):
    """The gradient of a scalar function (a one-element array counts) with
    respect to argument ``argnum`` (a tuple gives a tuple of gradients)."""
    fun = _named(fun)
    def build(pos, names):
        return _api.grad(fun, argnums=argnum, static_argnums=pos, static_argnames=names,
                         fallback=False)

    def eager(args, kwargs):
        v = _EagerVJP(fun, args, kwargs, *_norm_argnum(argnum))
        return v(_ones_like_out(v.ans, "grad"))
    return _op("grad", fun, argnum, mode, build, eager)


def value_and_grad(fun, argnum=0, *, mode=None):
    """``(value, gradient)`` of a scalar function from one evaluation."""
    fun = _named(fun)
    def build(pos, names):
        return _api.value_and_grad(fun, argnums=argnum, static_argnums=pos,
                                   static_argnames=names, fallback=False)

    def eager(args, kwargs):
        v = _EagerVJP(fun, args, kwargs, *_norm_argnum(argnum))
        return v.value(), v(_ones_like_out(v.ans, "value_and_grad"))
    return _op("value_and_grad", fun, argnum, mode, build, eager)


def grad_and_aux(fun, argnum=0, *, mode=None):
    """fun returns ``(value, aux)``: ``(gradient of value, aux)``."""
    fun = _named(fun)
    def build(pos, names):
        g = _api.grad(fun, argnums=argnum, has_aux=True, static_argnums=pos,
                      static_argnames=names, fallback=False)
        return g

    def eager(args, kwargs):
        box = []

        def value_only(*a, **k):
            out = fun(*a, **k)
            if not (isinstance(out, (tuple, list)) and len(out) == 2):
                raise TypeError("grad_and_aux: the function must return a pair (value, aux)")
            box.append(out[1])
            return out[0]
        v = _EagerVJP(value_only, args, kwargs, *_norm_argnum(argnum))
        aux = box[0]
        return v(_ones_like_out(v.ans, "grad_and_aux")), (aux if v.nested else _plain_tree(aux))
    return _op("grad_and_aux", fun, argnum, mode, build, eager)


def elementwise_grad(fun, argnum=0, *, mode=None):
    """The vector-Jacobian product with a vector of ones: for a function
    applied elementwise, the derivative at every element.  Gives the
    gradient of ``sum(fun(...))``, the same numbers."""
    fun = _named(fun)
    def summed(*args, **kwargs):
        return _o.sum(fun(*args, **kwargs))
    summed.__name__ = getattr(fun, "__name__", "f")
    summed.__qualname__ = getattr(fun, "__qualname__", "f") + ".<elementwise>"

    def build(pos, names):
        return _api.grad(summed, argnums=argnum, static_argnums=pos, static_argnames=names,
                         fallback=False)

    def eager(args, kwargs):
        v = _EagerVJP(fun, args, kwargs, *_norm_argnum(argnum))
        if isinstance(v.ans, (tuple, list, dict)) or v.ans is None:
            raise TypeError("elementwise_grad only applies to functions returning one array")
        return v(onp.ones(onp.shape(_plain(v.ans)), getattr(_plain(v.ans), "dtype", float)))
    return _op("elementwise_grad", fun, argnum, mode, build, eager)


def jacobian(fun, argnum=0, *, mode=None):
    """The Jacobian, of shape ``out.shape + x.shape`` (a tuple argnum gives
    one block per argument)."""
    fun = _named(fun)
    def build(pos, names):
        return _api.jacobian(fun, argnums=argnum, static_argnums=pos, static_argnames=names,
                             fallback=False)

    def eager(args, kwargs):
        argnums, single = _norm_argnum(argnum)
        v = _EagerVJP(fun, args, kwargs, argnums, False)
        ans = v.ans
        if isinstance(ans, (tuple, list, dict)) or ans is None:
            raise TypeError("jacobian (eager) of a function returning a "
                            f"{type(ans).__name__}: return one array")
        shape = tuple(onp.shape(_plain(ans)))
        n = int(onp.prod(shape))
        rows = []
        for k in range(n):
            e = onp.zeros(n)
            e[k] = 1.0
            rows.append(v(e.reshape(shape)))
        blocks = []
        for i, a in enumerate(argnums):
            xshape = tuple(onp.shape(_plain(args[a]))) if not _on_tape(args[a]) \
                else tuple(args[a].shape)
            col = [r[i] for r in rows]
            if v.nested:
                blk = _o.reshape(_o.stack(col), shape + xshape) if col else \
                    _NumpyTensor(onp.zeros(shape + xshape))
            else:
                blk = onp.array(col).reshape(shape + xshape)
            blocks.append(blk)
        return blocks[0] if single else tuple(blocks)
    return _op("jacobian", fun, argnum, mode, build, eager)


def hessian(fun, argnum=0, *, mode=None):
    """``jacobian(jacobian(fun))``: for a scalar function, shape
    ``x.shape + x.shape``."""
    if not isinstance(argnum, int):
        raise TypeError("hessian takes one argnum (an int), as autograd's; for the blocks "
                        "of several arguments use tracegrad.hessian(f, argnums=(0, 1))")
    return jacobian(jacobian(fun, argnum, mode=mode), argnum, mode=mode)


def deriv(fun, argnum=0, *, mode=None):
    """The derivative along a vector of ones (forward mode): for a scalar
    input, f'(x)."""
    def d(*args, **kwargs):
        x = args[argnum]
        return make_jvp(fun, argnum, mode=mode)(*args, **kwargs)(onp.ones_like(_plain(x)))[1]
    return d


def _vjp_positions(args, argnums, statics):
    """Positions of the argnums among the dynamic primals."""
    dyn = [i for i in range(len(args)) if i not in statics]
    try:
        return [dyn.index(a % len(args)) for a in argnums]
    except ValueError:
        raise TypeError(f"argnum={argnums} names an argument that is not an array or a "
                        f"number") from None


def make_vjp(fun, argnum=0, *, mode=None):
    """``make_vjp(fun)(*args) -> (vjp, ans)``: ``vjp(g)`` is the cotangent
    of argument ``argnum`` for the output cotangent ``g``."""
    fun = _named(fun)
    argnums, single = _norm_argnum(argnum)

    def dot_out(*args_g, **kwargs):
        args, g = args_g[:-1], args_g[-1]
        outs, tree = tree_flatten(fun(*args, **kwargs))
        gs, g_tree = tree_flatten(g)
        if g_tree != tree:
            raise ValueError(f"vjp: the cotangent must have the structure of the function's "
                             f"output ({len(outs)} arrays), got {len(gs)}")
        total = 0.0
        for o, c in zip(outs, gs):
            total = total + _o.sum(o * c)
        return total
    dot_out.__qualname__ = getattr(fun, "__qualname__", "f") + ".<vjp>"

    def build(pos, names):
        # the vjp is the gradient of <fun(x), g>: a compiled gradient, which
        # nests inside other transforms and on the tape like any other
        fwd = _api.compile(fun, static_argnums=pos, static_argnames=names)
        vg = _api.grad(dot_out, argnums=argnum, static_argnums=pos, static_argnames=names,
                       fallback=False)

        def run(*args, **kwargs):
            ans = fwd(*args, **kwargs)

            def vjp(g):
                try:
                    return vg(*args, g, **kwargs)
                except TraceError:
                    if any(_is_traced(x) for x in _leaves((*args, g), kwargs)):
                        raise
                    return _EagerVJP(fun, args, kwargs, argnums, single)(g)
            return vjp, ans
        return run

    def eager(args, kwargs):
        v = _EagerVJP(fun, args, kwargs, argnums, single)
        return v, v.value()
    return _op("make_vjp", fun, argnum, mode, build, eager)


def make_jvp(fun, argnum=0, *, mode=None):
    """``make_jvp(fun)(*args) -> jvp``: ``jvp(v) -> (ans, J v)`` (forward
    mode), with ``v`` shaped like argument ``argnum``."""
    argnums, single = _norm_argnum(argnum)
    op = _jvp_op(fun, argnums, mode)

    def at(*args, **kwargs):
        _refuse_complex(args, argnums)

        def jvp(v):
            vs = (v,) if single else tuple(v)
            if len(vs) != len(argnums):
                raise ValueError(f"jvp: one tangent per argnum ({len(argnums)}), got {len(vs)}")
            return op(*args, vs, **kwargs)
        return jvp
    return at


def _jvp_op(fun, argnums, mode):
    """An operator of (*args, tangents): (ans, J tangents)."""
    fun = _named(fun)
    def build(pos, names):
        transposed = _transposed_jvp(fun, argnums, pos, names)
        state = {"primitives": False}

        def native(args, vs, kwargs):
            f = fun if not kwargs else functools.partial(fun, **kwargs)
            tangent = dict(zip([a % len(args) for a in argnums], vs))
            dyn = [i for i in range(len(args)) if i not in pos]
            primals = [args[i] for i in dyn]
            tans = [tangent[i] if i in tangent else _zeros_tree(args[i]) for i in dyn]
            with _forward_mode_trace():
                return _api.jvp(_Partial(f, args, dyn), primals, tans)

        def run(*args_vs, **kwargs):
            args, vs = args_vs[:-1], args_vs[-1]
            if not state["primitives"]:
                try:
                    return native(args, vs, kwargs)
                except _RulesNeeded:
                    # a primitive inside: tracegrad's forward mode would
                    # differentiate its body, so transpose its vjp rules
                    state["primitives"] = True
            return transposed(args, vs, kwargs)
        return run

    def eager(args_vs, kwargs):
        args, vs = args_vs[:-1], args_vs[-1]
        v = _EagerVJP(fun, args, kwargs, argnums, False)
        leaves, tree = tree_flatten(v.ans)
        us = [_NumpyTensor(onp.zeros(onp.shape(_plain(o)), _dtype(o)), requires_grad=True)
              for o in leaves]
        gx = v(tree_unflatten(tree, us), create_graph=True)
        total = None
        for g, t in zip(tree_flatten(gx)[0], tree_flatten(tuple(vs))[0]):
            if _on_tape(g):
                term = _o.sum(g * (t if isinstance(t, _Tensor) else onp.asarray(t, g.dtype)))
                total = term if total is None else total + term
        if total is None:
            tans = [onp.zeros(tuple(u.shape)) for u in us]
        else:
            with _enable_grad():
                jt = _tape_grad(total, us, allow_unused=True, create_graph=v.nested)
            tans = [onp.zeros(tuple(u.shape)) if j is None else
                    (_as_numpy_face(j) if v.nested else _plain(j)) for j, u in zip(jt, us)]
        return v.value(), tree_unflatten(tree, tans)

    # argnum=() : the tangents position is never static and never differentiated.
    # tracegrad's compiled jvp takes plain arrays: values of an enclosing
    # computation (tape or trace) take the eager path
    op = _op("make_jvp", fun, (), mode, build, eager)
    op.plain_only = True
    return op


def _transposed_jvp(fun, argnums, pos, names):
    """(ans, J v) compiled from reverse mode only: J v is the gradient over
    u of <J^T u, v>, and J^T u is linear in u, so any u will do (zeros).
    The rules of primitives inside fun are then what differentiates them."""
    fwd = _api.compile(fun, static_argnums=pos, static_argnames=names)

    def dot_out(*args_u, **kwargs):
        args, u = args_u[:-1], args_u[-1]
        total = 0.0
        for o, c in zip(tree_flatten(fun(*args, **kwargs))[0], tree_flatten(u)[0]):
            total = total + _o.sum(o * c)
        return total
    dot_out.__qualname__ = getattr(fun, "__qualname__", "f") + ".<vjp>"
    vjp = _api.grad(dot_out, argnums=tuple(argnums), static_argnums=pos,
                    static_argnames=names)

    def vjp_dot_v(*args_u_v, **kwargs):
        args, u, vs = args_u_v[:-2], args_u_v[-2], args_u_v[-1]
        total = 0.0
        for g, t in zip(tree_flatten(vjp(*args, u, **kwargs))[0], tree_flatten(tuple(vs))[0]):
            total = total + _o.sum(g * t)
        return total
    vjp_dot_v.__qualname__ = getattr(fun, "__qualname__", "f") + ".<jvp>"
    by_arity = {}

    def run(args, vs, kwargs):
        ans = fwd(*args, **kwargs)
        leaves, tree = tree_flatten(ans)
        u = tree_unflatten(tree, [onp.zeros(onp.shape(o), _dtype(o)) for o in leaves])
        n = len(args)
        if n not in by_arity:
            by_arity[n] = _api.grad(vjp_dot_v, argnums=n, static_argnums=pos,
                                    static_argnames=names, fallback=False)
        return ans, by_arity[n](*args, u, tuple(vs), **kwargs)
    return run


class _Partial:
    """fun with its static arguments in place, called on the dynamic ones;
    keyed by fun, so tracegrad's tables for it are found again."""

    def __init__(self, fun, args, dyn):
        self.fun, self.args, self.dyn = fun, args, dyn
        functools.update_wrapper(self, fun, updated=())

    def __call__(self, *d):
        return self.fun(*_merge(self.args, self.dyn, d))


def _dtype(o):
    return getattr(o, "dtype", None) or onp.asarray(o).dtype


def _zeros_tree(x):
    leaves, tree = tree_flatten(x)
    return tree_unflatten(tree, [onp.zeros(onp.shape(_plain(v)), _dtype(_plain(v))
                                           if onp.asarray(_plain(v)).dtype.kind == "f"
                                           else onp.float64) for v in leaves])


def _merge(args, dyn, d):
    out = list(args)
    for i, v in zip(dyn, d):
        out[i] = v
    return out


def make_hvp(fun, argnum=0, *, mode=None):
    """``make_hvp(fun)(*args) -> (hvp, grad)``: ``hvp(v)`` is the
    Hessian-vector product at the point, ``grad`` the gradient there."""
    return make_vjp(grad(fun, argnum, mode=mode), argnum, mode=mode)


def hessian_tensor_product(fun, argnum=0, *, mode=None):
    """``f(*args, v)``: the Hessian (w.r.t. ``argnum``) contracted with the
    tensor ``v`` over all of v's dimensions."""
    fun_grad = grad(fun, argnum, mode=mode)

    def vector_dot_grad(*args, **kwargs):
        args, vector = args[:-1], args[-1]
        return _o.tensordot(fun_grad(*args, **kwargs), vector, onp.ndim(vector))
    vector_dot_grad.__qualname__ = getattr(fun, "__qualname__", "f") + ".<hvp>"
    return grad(vector_dot_grad, argnum, mode=mode)


hessian_vector_product = hessian_tensor_product


def tensor_jacobian_product(fun, argnum=0, *, mode=None):
    """``f(*args, v)``: ``v`` contracted with the Jacobian over the output's
    dimensions (a vector-Jacobian product)."""
    def vector_dot_fun(*args, **kwargs):
        args, vector = args[:-1], args[-1]
        return _o.tensordot(vector, fun(*args, **kwargs), onp.ndim(vector))
    vector_dot_fun.__qualname__ = getattr(fun, "__qualname__", "f") + ".<vjp>"
    return jacobian(vector_dot_fun, argnum, mode=mode)


vector_jacobian_product = tensor_jacobian_product


def _half_sq(x):
    return 0.5 * _o.sum(x ** 2, axis=-1)


def make_ggnvp(f, g=_half_sq, f_argnum=0, *, mode=None):
    """``make_ggnvp(f, g)(*args) -> ggnvp``: the generalized Gauss-Newton
    product ``J_f^T H_g J_f v`` at the point (g defaults to 0.5 ||y||^2)."""
    def at(*args, **kwargs):
        f_vjp, f_x = make_vjp(f, f_argnum, mode=mode)(*args, **kwargs)
        g_hvp, _ = make_hvp(g, mode=mode)(f_x)
        f_jvp = make_jvp(f, f_argnum, mode=mode)(*args, **kwargs)

        def ggnvp(v):
            return f_vjp(g_hvp(f_jvp(v)[1]))
        return ggnvp
    return at


def holomorphic_grad(fun, argnum=0, *, mode=None):
    """autograd's derivative of a holomorphic complex function.  tracegrad
    has no complex arrays yet: this raises, naming what to do."""
    def unsupported(*args, **kwargs):
        raise TypeError(
            f"holomorphic_grad({getattr(fun, '__name__', 'f')}): tracegrad does not support "
            f"complex numbers yet, so there is no complex derivative. For a function of a "
            f"real variable use grad / elementwise_grad; for f(z) of a complex z, write it on "
            f"the real and imaginary parts (x, y) and take jacobian of (Re f, Im f).")
    return unsupported


def grad_named(fun, argname, *, mode=None):
    """The gradient with respect to the argument named ``argname``."""
    params = list(inspect.signature(fun).parameters)
    if argname not in params:
        raise TypeError(f"grad_named: {getattr(fun, '__name__', 'f')} has no argument "
                        f"{argname!r} (it has {params})")
    return grad(fun, params.index(argname), mode=mode)


def multigrad_dict(fun, *, mode=None):
    """``f(*args, **kwargs) -> OrderedDict``: the gradient with respect to
    every argument (defaults included), by name."""
    sig = inspect.signature(fun)
    params = sig.parameters
    var_pos = [n for n, p in params.items() if p.kind == p.VAR_POSITIONAL]
    var_kw = [n for n, p in params.items() if p.kind == p.VAR_KEYWORD]
    names = [n for n in params if n not in var_pos + var_kw]

    def newfun(dct):
        pos = tuple(dct[n] for n in names) + (tuple(dct[var_pos[0]]) if var_pos else ())
        kw = dict(dct[var_kw[0]]) if var_kw else {}
        return fun(*pos, **kw)
    newfun.__qualname__ = getattr(fun, "__qualname__", "f") + ".<multigrad>"
    g = grad(newfun, mode=mode)

    def gradfun(*args, **kwargs):
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        argdict = OrderedDict(bound.arguments)
        grads = g(dict(argdict))
        return OrderedDict((n, grads[n]) for n in argdict)
    return gradfun


def checkpoint(fun):
    """autograd's checkpoint trades memory for recomputation; tracegrad's
    generated code plans its own buffers, so this returns ``fun``."""
    return fun

