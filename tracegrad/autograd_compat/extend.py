"""autograd.extend: ``primitive``, ``defvjp``, ``defjvp``, ``defvjp_argnum``,
on tracegrad's custom Functions (``tracegrad.autograd.Function``).

``@primitive`` makes a function one differentiable operation whose
derivative is the rule given to ``defvjp``.  A call on tracegrad values
becomes one ``Function.apply``:

* eagerly, the body runs on plain arrays (as autograd hands a primitive its
  unboxed values), so it may call SciPy, ``np.asarray`` or anything else;
  the vjp runs on plain arrays too, or, when a higher derivative is being
  taken (``create_graph``), on values that record the tape, so a vjp
  written with ``tracegrad.autograd_compat.numpy`` differentiates again;
* inside compiled code, the body is traced as ordinary ops and the vjp
  becomes the backward of that piece (``tracegrad/ops/custom.py``).  A body
  that cannot be traced (it converts its argument to an array, calls SciPy)
  raises TraceError there, and the operators of
  ``tracegrad.autograd_compat`` then run the call eagerly.

Forward mode (``make_jvp``, ``deriv``, ``check_grads``' "fwd") transposes
the vjp rules, compiled or eager, so the rules, never the body's own
derivative, give every derivative of a primitive.  Given only jvps (linear
in the tangent, as autograd requires), the vjp is derived from them by
transposition: the gradient over the tangent of <jvp(t), g>, on the tape
eagerly and as a nested gradient in compiled code.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools

import numpy as onp

from tracegrad import api as _api, ops as _o
from tracegrad.runtime.cache import clear_cache as _clear_cache
from tracegrad.autograd import Function, grad as _tape_grad, enable_grad as _enable_grad
from tracegrad.autograd import is_grad_enabled as _grad_on
from tracegrad.eager.tensor import NumpyTensor as _NumpyTensor, Tensor as _Tensor
from tracegrad.frontend.trace import TraceError

__all__ = ["primitive", "defvjp", "defjvp", "defvjp_argnum", "defjvp_argnum", "Primitive",
           "notrace_primitive"]


def _traced(x):
    return hasattr(x, "_trace")


class RulesNeeded(TraceError):
    """A primitive was traced for compiled forward mode, which would
    differentiate its body instead of its rules: the forward-mode operators
    catch this and build J v from the vjp rules instead."""


_forward_trace = contextvars.ContextVar("autograd_compat_forward_trace", default=False)


@contextlib.contextmanager
def forward_mode_trace():
    """While a compiled jvp is traced, a primitive raises RulesNeeded: the
    generated forward-mode code would otherwise use the derivative of the
    body, which a primitive's rules exist to replace (a straight-through
    round, a clipped gradient, a solver's implicit derivative)."""
    token = _forward_trace.set(True)
    try:
        yield
    finally:
        _forward_trace.reset(token)


def _raw(x):
    return x.detach().numpy() if isinstance(x, _Tensor) else x


def _numpy_face(t):
    if not isinstance(t, _Tensor) or isinstance(t, _NumpyTensor):
        return t
    return _o.add(_NumpyTensor(onp.zeros((), t.dtype)), t)


def _is_arg_value(x):
    return isinstance(x, _Tensor) or _traced(x)


class Primitive:
    """A function made a primitive with ``@primitive``; called on plain
    values it is the function itself."""

    def __init__(self, fun):
        self.fun = fun
        self.vjps = {}           # argnum -> vjpmaker(ans, *args, **kwargs) -> (g -> grad)
        self.vjp_argnum = None   # vjpmaker(argnum, ans, args, kwargs)
        self.jvps = {}           # argnum -> jvp(g, ans, *args, **kwargs)
        self.jvp_argnum = None   # jvpmaker(argnum, g, ans, args, kwargs)
        functools.update_wrapper(self, fun)
        self._function = self._make_function()
        self._traced = False     # has compiled code been built with the rules?

    def __repr__(self):
        return f"<autograd_compat primitive {getattr(self.fun, '__qualname__', self.fun)}>"

    def __call__(self, *args, **kwargs):
        if not any(_is_arg_value(a) for a in args):
            for v in kwargs.values():
                if _is_arg_value(v):
                    raise TypeError(f"{self.__name__}: a differentiated value was passed by "
                                    f"keyword; pass it positionally (keyword arguments of a "
                                    f"primitive are constants, as in autograd)")
            return self.fun(*args, **kwargs)
        try:
            kw = tuple(sorted(kwargs.items()))
            hash(kw)
        except TypeError:
            raise TypeError(f"{self.__name__}: keyword arguments of a primitive must be "
                            f"hashable constants (numbers, strings, tuples); pass arrays "
                            f"positionally") from None
        for i, a in enumerate(args):
            if isinstance(a, (list, tuple)) and any(_is_arg_value(v) for v in a):
                raise TypeError(f"{self.__name__}: argument {i} is a {type(a).__name__} "
                                f"holding differentiated values; a primitive takes each "
                                f"differentiated array as its own positional argument")
        return self._function.apply(kw, *args)

    # --- the rules ------------------------------------------------------------------------
    def _vjp(self, argnum, ans, args, kwargs, g):
        if self.vjp_argnum is not None:
            return self.vjp_argnum(argnum, ans, args, kwargs)(g)
        if argnum in self.vjps:
            maker = self.vjps[argnum]
            if maker is None:
                return _zeros_like(args[argnum])
            return maker(ans, *args, **kwargs)(g)
        if argnum in self.jvps or self.jvp_argnum is not None:
            return self._vjp_from_jvp(argnum, ans, args, kwargs, g)
        if any(_traced(a) for a in (g, ans, *args)):
            # compiled code asks every traced operand for a rule; the eager
            # path asks only those whose gradient is needed
            raise TraceError(f"{self.__name__} has no vjp for argnum {argnum}; compiled code "
                             f"needs one for every traced operand, so this runs eagerly")
        raise NotImplementedError(f"VJP of {self.__name__} wrt argnum {argnum} not defined")

    def _vjp_from_jvp(self, argnum, ans, args, kwargs, g):
        """J^T g from a jvp linear in its tangent t: the gradient over t of
        <jvp(t), g> (on the tape, or as a gradient traced into compiled code)."""
        jvp = self.jvps.get(argnum)
        if argnum not in self.jvps:
            def jvp(t, ans_, *a, **k):
                return self.jvp_argnum(argnum, t, ans_, a, k)
        if any(_traced(a) for a in (g, ans, *args)):
            return self._traced_vjp_from_jvp(jvp, argnum, ans, args, kwargs, g)
        x = args[argnum]
        t = _NumpyTensor(onp.zeros(onp.shape(_raw(x)), onp.result_type(_raw(x), float)),
                         requires_grad=True)
        create = _grad_on()
        if jvp is None:
            return _zeros_like(x)
        with _enable_grad():
            out = jvp(t, ans, *args, **kwargs)
            s = _o.sum(out * g)
            got, = _tape_grad(s, [t], allow_unused=True, create_graph=create)
        if got is None:
            return onp.zeros(onp.shape(_raw(x)))
        return got if create else got.detach().numpy()

    def _traced_vjp_from_jvp(self, jvp, argnum, ans, args, kwargs, g):
        x = args[argnum]
        if jvp is None:
            return _zeros_like(x)
        vals = [i for i, a in enumerate(args) if _is_arg_value(a)]

        # a nested gradient takes the traced values as its arguments (a
        # closure over another trace's values is refused)
        def inner(t, ans_, g_, *vs):
            a = list(args)
            for i, v in zip(vals, vs):
                a[i] = v
            out = jvp(t, ans_, *a, **kwargs)
            if isinstance(out, tuple):
                return sum(_o.sum(o * c) for o, c in zip(out, g_))
            return _o.sum(out * g_)
        inner.__qualname__ = f"{getattr(self.fun, '__qualname__', 'f')}.<jvp-transposed-{argnum}>"
        t0 = _o.zeros_like_value(x) if _is_arg_value(x) else onp.zeros(onp.shape(x))
        return _api.grad(inner)(t0, ans, g, *[args[i] for i in vals])

    def _make_function(self):
        prim = self

        def forward(ctx, kw, *args):
            kwargs = dict(kw)
            pos = [i for i, a in enumerate(args) if _is_arg_value(a)]
            if any(_traced(a) for a in args):
                if _forward_trace.get():
                    raise RulesNeeded(f"primitive {prim.__name__} in compiled forward mode: "
                                      f"its derivative must come from its rules, not its body")
                prim._traced = True
                try:                                 # traced: its ops join the graph
                    out = prim.fun(*args, **kwargs)
                except TraceError:
                    raise
                except Exception as e:
                    # a body written for plain arrays (SciPy, ufuncs tracegrad has no
                    # rule for): the autograd_compat operators run it eagerly instead
                    raise TraceError(f"the body of primitive {prim.__name__} cannot be "
                                     f"traced ({type(e).__name__}: {e}); it runs on plain "
                                     f"arrays in the eager path") from e
                outs = out if isinstance(out, tuple) else (out,)
            else:
                out = prim.fun(*[_raw(a) for a in args], **kwargs)
                outs = tuple(_NumpyTensor(onp.asarray(o)) for o in
                             (out if isinstance(out, tuple) else (out,)))
                out = outs if isinstance(out, tuple) else outs[0]
            ctx.prim_args = tuple(None if i in pos else a for i, a in enumerate(args))
            ctx.prim_pos = tuple(pos)
            ctx.prim_kwargs = kwargs
            ctx.prim_multi = isinstance(out, tuple)
            ctx.save_for_backward(*[args[i] for i in pos], *outs)
            return out

        def backward(ctx, *gs):
            saved = ctx.saved_tensors
            pos = ctx.prim_pos
            vals, outs = saved[:len(pos)], saved[len(pos):]
            if any(_traced(v) for v in (*saved, *gs)):
                conv = lambda v: v                             # noqa: E731
            elif _grad_on():
                conv = _numpy_face                             # a higher derivative
            else:
                conv = _raw
            args = list(ctx.prim_args)
            for i, v in zip(pos, vals):
                args[i] = conv(v)
            ans = tuple(conv(o) for o in outs) if ctx.prim_multi else conv(outs[0])
            g = tuple(conv(x) for x in gs) if ctx.prim_multi else conv(gs[0])
            grads = [None]
            needs = ctx.needs_input_grad
            for i in range(len(args)):
                if i in pos and needs[i + 1]:
                    grads.append(prim._vjp(i, ans, args, ctx.prim_kwargs, g))
                else:
                    grads.append(None)
            return tuple(grads)

        name = getattr(self.fun, "__name__", "primitive")
        cls = type(name, (Function,), {
            "forward": staticmethod(forward), "backward": staticmethod(backward),
            "__module__": getattr(self.fun, "__module__", None) or __name__,
            "__qualname__": getattr(self.fun, "__qualname__", name),
            # the user's code, reachable from the class: the compiled code's
            # cache key changes when the body or a rule is edited
            "_user_fun": staticmethod(self.fun)})
        return cls

    def _note_rule(self, key, rule):
        if callable(rule):
            setattr(self._function, f"_user_rule_{key}", staticmethod(rule))
        if self._traced:
            # compiled code in memory baked the old rule in; the disk cache is
            # keyed by the rules' code, so only memory needs forgetting
            _clear_cache(memory=True, disk=False)


def primitive(f_raw):
    """Make ``f_raw`` one differentiable operation (give its derivative with
    ``defvjp``); calls on plain arrays run it unchanged."""
    if isinstance(f_raw, Primitive):
        return f_raw
    return Primitive(f_raw)


notrace_primitive = primitive


def _check_prim(fun, what):
    if not isinstance(fun, Primitive):
        raise TypeError(f"{what} expects a function made with @primitive, got "
                        f"{getattr(fun, '__name__', fun)!r}")


def defvjp(fun, *vjpmakers, argnums=None):
    """``defvjp(f, vjp_0, vjp_1, ...)``: ``vjp_i(ans, *args, **kwargs)``
    returns ``g -> gradient w.r.t. argument i``; None means a zero gradient."""
    _check_prim(fun, "defvjp")
    argnums = range(len(vjpmakers)) if argnums is None else argnums
    for a, v in zip(argnums, vjpmakers):
        if v is not None and not callable(v):
            raise TypeError(f"Bad VJP {v!r} for {fun.__name__}")
        fun.vjps[a] = v
        fun._note_rule(f"vjp{a}", v)


def defvjp_argnum(fun, vjpmaker):
    """``vjpmaker(argnum, ans, args, kwargs)`` returns ``g -> gradient``."""
    _check_prim(fun, "defvjp_argnum")
    fun.vjp_argnum = vjpmaker
    fun._note_rule("vjp_argnum", vjpmaker)


def defjvp(fun, *jvpfuns, argnums=None):
    """``defjvp(f, jvp_0, ...)``: ``jvp_i(g, ans, *args, **kwargs)`` is the
    output tangent for the tangent ``g`` of argument i (None: zero;
    "same": f is linear in that argument)."""
    _check_prim(fun, "defjvp")
    argnums = range(len(jvpfuns)) if argnums is None else argnums
    for a, j in zip(argnums, jvpfuns):
        if j == "same":
            j = _same_jvp(fun, a)
        elif j is not None and not callable(j):
            raise TypeError(f"Bad JVP {j!r} for {fun.__name__}")
        fun.jvps[a] = j
        fun._note_rule(f"jvp{a}", j)


def defjvp_argnum(fun, jvpmaker):
    """``jvpmaker(argnum, g, ans, args, kwargs)``: the tangent for argument argnum."""
    _check_prim(fun, "defjvp_argnum")
    fun.jvp_argnum = jvpmaker
    fun._note_rule("jvp_argnum", jvpmaker)


def _same_jvp(fun, argnum):
    """f linear in argument argnum: its tangent is f with the tangent there
    (the body itself, so the tape records it)."""
    def jvp(g, ans, *args, **kwargs):
        args = list(args)
        args[argnum] = g
        return fun.fun(*args, **kwargs)
    return jvp


def _zeros_like(x):
    if _is_arg_value(x):
        return _o.zeros_like_value(x)
    return onp.zeros(onp.shape(x), onp.result_type(x, float))
