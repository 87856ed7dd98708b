"""Random draws: ``np.random.*`` calls and Generator methods as graph nodes.

NumPy's meaning of ``np.random.normal(size=3)`` is a fresh draw on every
call.  A trace runs the user's function once, so a draw made while tracing
would be frozen into the compiled code as a constant, and a Monte Carlo
objective would silently optimise one fixed sample.  Instead:

* While a function is traced, the draw functions of ``numpy.random`` are
  replaced by wrappers (``tracing_random_draws``, entered by
  ``tracegrad.frontend.trace.trace_function``).  In the tracing thread a wrapper
  records a ``random_draw`` node; in every other thread it calls NumPy's own
  function, so threads that are not tracing keep drawing for real.  The
  wrappers are removed when the last trace ends, also on errors.
* The ``random_draw`` row emits NumPy's own call
  (``np.random.normal(0.0, 1.0, size=(3, 4))``), so compiled code draws from
  the same global state, in the same order, as the NumPy function would:
  after ``np.random.seed(0)`` both give the same numbers.  The row is
  ``nondiff``: a draw has zero gradient.  Parameters must be static (Python
  numbers, tuples, concrete arrays); a traced parameter raises an error that
  shows the reparameterised form (``mu + sigma * np.random.standard_normal(n)``),
  so the gradient the user gets is one they wrote.
* A trace input of dtype ``object`` stands for a ``np.random.Generator`` or
  ``RandomState`` handed to the function; inside the function it is a
  ``GeneratorProxy`` whose methods record nodes with that input as operand,
  and the generated code calls the real Generator's method at run time.
  A Generator or RandomState the compiled function (or a helper it calls
  by name) names itself (a global, a closure variable, a default:
  ``rs = npr.RandomState(0)`` and ``rs.randn(...)`` inside it) is such an
  input too, passed by reference on every call
  (``tracegrad.frontend.captured``), so the generated code draws from that
  very object, as NumPy would.
* A Generator reached any other way (an attribute such as ``self.rng``, a
  container, a static argument) cannot be intercepted (its methods are C
  methods).  Its state, and that of NumPy's global
  ``RandomState``, is compared before and after tracing; a change means a
  draw was frozen, and tracing fails with ``RandomTraceError``.
* ``seed``, ``set_state``, ``shuffle`` (in place), ``bytes``, ``default_rng``
  and the like raise ``RandomTraceError`` while tracing: compiled code could
  not honour them.
"""
from __future__ import annotations

import contextlib
import math
import os
import sys
import threading
import types

import numpy as np

from tracegrad.ops import primitives
from tracegrad.ops.primitives import Aval, register
from tracegrad.ops.base import broadcast_to

__all__ = []

_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class RandomTraceError(TypeError):
    """A random draw inside a traced function that compiled code could not
    redo on every call (it would be frozen at trace time)."""


# --- which names draw -------------------------------------------------------------------
# Methods of NumPy's legacy RandomState (the object behind np.random.*) and of
# Generator that return a fresh sample given their arguments.
_LEGACY_DRAWS = frozenset({
    "beta", "binomial", "chisquare", "choice", "dirichlet", "exponential", "f", "gamma",
    "geometric", "gumbel", "hypergeometric", "laplace", "logistic", "lognormal", "logseries",
    "multinomial", "multivariate_normal", "negative_binomial", "noncentral_chisquare",
    "noncentral_f", "normal", "pareto", "permutation", "poisson", "power", "rand", "randint",
    "randn", "random", "random_integers", "random_sample", "rayleigh", "standard_cauchy",
    "standard_exponential", "standard_gamma", "standard_normal", "standard_t", "triangular",
    "uniform", "vonmises", "wald", "weibull", "zipf"})
# module-level aliases of RandomState.random_sample
_LEGACY_ALIASES = {"ranf": "random_sample", "sample": "random_sample"}
_GENERATOR_DRAWS = frozenset({
    "beta", "binomial", "chisquare", "choice", "dirichlet", "exponential", "f", "gamma",
    "geometric", "gumbel", "hypergeometric", "integers", "laplace", "logistic", "lognormal",
    "logseries", "multinomial", "multivariate_hypergeometric", "multivariate_normal",
    "negative_binomial", "noncentral_chisquare", "noncentral_f", "normal", "pareto",
    "permutation", "permuted", "poisson", "power", "random", "rayleigh", "standard_cauchy",
    "standard_exponential", "standard_gamma", "standard_normal", "standard_t", "triangular",
    "uniform", "vonmises", "wald", "weibull", "zipf"})

_DRAW_ELSEWHERE = ("draw the numbers outside the compiled function and pass them in as an "
                   "argument")
# np.random functions that compiled code cannot honour: why, and what to write
_REFUSED = {
    "seed": "re-seeding inside a compiled function cannot be compiled (the graph has no "
            "statement without a result); call np.random.seed(...) before calling the "
            "compiled function",
    "set_state": "setting the random state inside a compiled function cannot be compiled; "
                 "call np.random.set_state(...) before calling the compiled function",
    "get_state": "the state read while tracing would be frozen into the compiled code; read "
                 "it outside the compiled function",
    "shuffle": "shuffle works in place, and a traced array cannot be modified in place; "
               "write x[np.random.permutation(len(x))] instead (the same permutation NumPy's "
               "shuffle would make)",
    "bytes": "it returns bytes, not an array; " + _DRAW_ELSEWHERE,
    "default_rng": "a Generator created inside a traced function would be drawn from at "
                   "trace time and its numbers frozen; use np.random.* functions (NumPy's "
                   "global state) or " + _DRAW_ELSEWHERE,
    "get_bit_generator": "draws from the bit generator would be frozen at trace time; use "
                         "np.random.* functions or " + _DRAW_ELSEWHERE,
    "set_bit_generator": "replacing the global bit generator inside a compiled function cannot "
                         "be compiled; call it before calling the compiled function",
}
_GENERATOR_REFUSED = {
    "shuffle": "shuffle works in place, and a traced array cannot be modified in place; "
               "write x[rng.permutation(len(x))] instead",
    "bytes": "it returns bytes, not an array; " + _DRAW_ELSEWHERE,
    "spawn": "child generators created while tracing would be drawn from at trace time; "
             "spawn them outside the compiled function",
    "bit_generator": "draws from the bit generator would be frozen at trace time; call the "
                     "Generator's methods (rng.normal(...)) instead",
    "seed": _REFUSED["seed"].replace("np.random.seed", "rng.seed"),
    "set_state": _REFUSED["set_state"].replace("np.random.set_state", "rng.set_state"),
    "get_state": _REFUSED["get_state"],
}

# How to write a draw whose parameters are traced, so the gradient is explicit.
# The normal and uniform forms give exactly NumPy's numbers (NumPy computes
# them this way); the others name the shape of the rewrite.
_REPARAM = {
    "normal": "{p}loc + scale * {m}standard_normal(shape)",
    "uniform": "{p}low + (high - low) * {m}{u}(shape)",
    "lognormal": "np.exp(mean + sigma * {m}standard_normal(shape))",
    "exponential": "scale * {m}standard_exponential(shape)",
    "laplace": "loc + scale * {m}laplace(0.0, 1.0, shape)",
    "logistic": "loc + scale * {m}logistic(0.0, 1.0, shape)",
    "gumbel": "loc + scale * {m}gumbel(0.0, 1.0, shape)",
    "choice": "a[{m}choice(len(a), size, replace, p)] (p static)",
    "permutation": "x[{m}permutation(len(x))]",
    "permuted": "x[..., {m}permutation(x.shape[-1])] (one permutation for all rows)",
}


# --- static arguments: hashable, and printable as literals ---------------------------------

class _Array:
    """A concrete array argument (``p=`` of choice, ``mean``/``cov`` of
    multivariate_normal), kept as a hashable tuple and emitted as a literal."""
    __slots__ = ("dtype", "shape", "flat")
    MAX_ELEMENTS = 10_000

    def __init__(self, arr):
        self.dtype = arr.dtype.str
        self.shape = tuple(arr.shape)
        self.flat = tuple(arr.ravel().tolist())

    def _key(self):
        return (self.dtype, self.shape, self.flat)

    def __eq__(self, other):
        return type(other) is _Array and self._key() == other._key()

    def __hash__(self):
        return hash(self._key())

    def __repr__(self):
        items = ", ".join(_literal(v) for v in self.flat)
        return f"np.array([{items}], dtype={self.dtype!r}).reshape({self.shape!r})"

    def value(self):
        return np.array(self.flat, dtype=self.dtype).reshape(self.shape)


class _Dtype:
    """A ``dtype=`` argument, emitted as ``np.dtype('int32')``."""
    __slots__ = ("name",)

    def __init__(self, dt):
        self.name = np.dtype(dt).str

    def __eq__(self, other):
        return type(other) is _Dtype and self.name == other.name

    def __hash__(self):
        return hash(("dtype", self.name))

    def __repr__(self):
        return f"np.dtype({self.name!r})"

    def value(self):
        return np.dtype(self.name)


def _literal(v):
    """Python source for a static value (only literals reach generated code)."""
    if isinstance(v, (_Array, _Dtype)):
        return repr(v)
    if v is None or isinstance(v, (bool, int, str)):
        return repr(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "float('nan')"
        if math.isinf(v):
            return "float('inf')" if v > 0 else "-float('inf')"
        return repr(v)
    if isinstance(v, tuple):
        return "(" + ", ".join(_literal(e) for e in v) + ("," if len(v) == 1 else "") + ")"
    raise TypeError(f"no literal for {type(v).__name__}")  # _static admits nothing else


def _value(v):
    """The static value as NumPy gets it."""
    if isinstance(v, (_Array, _Dtype)):
        return v.value()
    if isinstance(v, tuple):
        return tuple(_value(e) for e in v)
    return v


def _is_traced(v):
    t = primitives._tracer_type
    if t is not None and type(v) is t:
        return True
    if isinstance(v, (list, tuple)):
        return any(_is_traced(e) for e in v)
    return False


def _static(v, what):
    """A hashable stand-in for one static argument of a draw."""
    if v is None or isinstance(v, (bool, int, float, str)) and not isinstance(v, np.generic):
        return v
    if isinstance(v, (np.bool_, np.integer)):
        return v.item()
    if isinstance(v, np.float64):
        return float(v)
    if isinstance(v, np.dtype) or (isinstance(v, type) and (issubclass(v, np.generic)
                                                            or v in (float, int, bool))):
        return _Dtype(v)
    if isinstance(v, (list, tuple)):
        return tuple(_static(e, what) for e in v)
    if hasattr(v, "grad_fn") and hasattr(v, "_data"):  # an eager Tensor captured by the code
        v = v._data
    if isinstance(v, (np.ndarray, np.generic)):
        arr = np.asarray(v)
        if arr.dtype.kind not in "biuf":
            raise RandomTraceError(f"{what} is an array of dtype {arr.dtype}; random draws in "
                                   f"compiled code take numeric parameters")
        if arr.size > _Array.MAX_ELEMENTS:
            raise RandomTraceError(
                f"{what} is a concrete array of {arr.size} elements; compiled code writes a "
                f"draw's parameters into its source, up to {_Array.MAX_ELEMENTS} elements. "
                f"{_DRAW_ELSEWHERE[0].upper() + _DRAW_ELSEWHERE[1:]}.")
        return _Array(arr)
    raise RandomTraceError(f"{what} has the type {type(v).__name__}; a random draw in a "
                           f"compiled function takes numbers, tuples, dtypes and arrays as "
                           f"parameters")


# --- the row ------------------------------------------------------------------------------

def _method(gen, source, method):
    if gen is None:
        gen = np.random.mtrand._rand  # the RandomState behind np.random.* (np.random.seed seeds it)
    return getattr(gen, method)


def _call(gen, source, method, args, kwargs):
    return _method(gen, source, method)(*_value(args), **{k: _value(v) for k, v in kwargs})


# Operands of a random_draw node: the Generator argument (unless the source
# is NumPy's global state), then the "after" token: the previous draw of the
# trace, or for the first draw an input of the function.  The token is read by
# nobody; the edge keeps the draws in NumPy's call order, keeps an unused
# draw alive while a later one is used (so the stream stays NumPy's), and
# gives the node a traced operand, so a transform replaying the graph
# records the draw again instead of evaluating it once.

def _draw_impl(xp, *operands, method, args, kwargs, source, draw, scalar):
    gen = operands[0] if source != "global" else None
    return xp.asarray(_call(gen, source, method, args, kwargs))


def _scratch(source):
    """A generator of the same kind as the draw's, seeded, for shape rules:
    the user's own state must not move."""
    return _default_rng(0) if source == "Generator" else np.random.RandomState(0)


def _draw_shape(*operands, method, args, kwargs, source, draw, scalar):
    # Shape and dtype depend on size=, on broadcasting of the parameters and
    # on the method (multinomial, dirichlet add an axis): NumPy's own call on
    # a scratch generator answers all of these exactly.
    out = np.asarray(_call(_scratch(source), source, method, args, kwargs))
    return Aval(out.shape, out.dtype)


def _call_source(target, method, args, kwargs):
    parts = [_literal(a) for a in args] + [f"{k}={_literal(v)}" for k, v in kwargs]
    return f"{target}.{method}({', '.join(parts)})"


def _where(source, names):
    return ("NumPy's global random state" if source == "global"
            else f"the {source} {names[0]}")


def _emit_numpy(names, method, args, kwargs, source, draw, scalar):
    target = "np.random" if source == "global" else names[0]
    call = _call_source(target, method, args, kwargs)
    # A Python scalar (size=None) becomes a 0-d array: the dtype the trace
    # recorded, float64, rather than a weak Python float.
    code = f"np.asarray({call})" if scalar else call
    return f"{code}  # a fresh random draw on every call, from {_where(source, names)}"


def _emit_cupy(names, method, args, kwargs, source, draw, scalar):
    # The CUDA driver imports CuPy as np and NumPy as _numpy.  The draw runs
    # on the host with NumPy, so its numbers are NumPy's stream, and moves to
    # the device; CuPy's own generator would give other numbers.
    target = "_numpy.random" if source == "global" else names[0]
    call = _call_source(target, method, args, kwargs)
    return (f"np.asarray({call})  # a fresh random draw on every call, on the host, from "
            f"{_where(source, names)}")


def _draw_batch(vals, flags, B, **attrs):
    # One call of the function draws once: a batched token does not make B
    # draws; the one sample is shared by the batch.
    vals = [v[0] if f else v for v, f in zip(vals, flags)]
    out = primitives.bind(random_draw_p, *vals, **attrs)
    return broadcast_to(out, (B,) + tuple(out.shape))


random_draw_p = register(
    "random_draw", _draw_impl, shape=_draw_shape, nondiff=True, save_inputs=False,
    numpy=_emit_numpy, cupy=_emit_cupy, batch=_draw_batch,
    doc="A fresh sample from NumPy's global random state (no operand) or from the "
        "Generator/RandomState operand, by the named method with static parameters; zero "
        "gradient.")


def draw_attrs(method, args=(), kwargs=None, source="global", draw=0):
    """The ``random_draw`` attributes of ``method(*args, **kwargs)`` with
    static arguments (used when recording, and by the registry's test cases)."""
    kwargs = kwargs or {}
    sargs = tuple(_static(a, f"argument {i} of {method}") for i, a in enumerate(args))
    skw = tuple(sorted((k, _static(v, f"argument {k}= of {method}")) for k, v in kwargs.items()))
    attrs = {"method": method, "args": sargs, "kwargs": skw, "source": source, "draw": draw,
             "scalar": False}
    out = _call(_scratch(source), source, method, sargs, skw)
    attrs["scalar"] = not isinstance(out, np.ndarray)
    return attrs


# --- recording while tracing ---------------------------------------------------------------

class _Tracing(threading.local):
    def __init__(self):
        self.stack = []   # [trace, draws recorded] per trace in progress in this thread


_tracing = _Tracing()
_lock = threading.Lock()
_active = 0          # traces in progress in all threads; the wrappers are installed while > 0
_foreign_calls = 0   # np.random calls from threads not tracing while the wrappers were installed
_originals = {}      # name -> NumPy's function, saved while the wrappers are installed


def is_tracing():
    """Is this thread tracing a function (so a draw would be recorded)?"""
    return bool(_tracing.stack)


def traced_generator(gen, desc):
    """While tracing: a proxy recording draws from the NumPy Generator
    ``gen`` (lifted as an implicit input, so compiled code draws from that
    very object on every call), or None where the trace lifts nothing."""
    lift = getattr(_tracing.stack[-1][0], "lift_generator", None)
    return lift(gen, desc) if lift is not None else None


def _user_location():
    f = sys._getframe(1)
    while f is not None and f.f_code.co_filename.startswith(_PKG_DIR):
        f = f.f_back
    if f is None:
        return ""
    return f" at {f.f_code.co_filename}, line {f.f_lineno}, in {f.f_code.co_name}"


def _traced_parameter_error(prefix, method, source):
    m = "np.random." if source == "global" else "rng."
    u = "random_sample" if source != "Generator" else "random"
    form = _REPARAM.get(method)
    hint = (f"Write it so the gradient is explicit: {form.format(p='', m=m, u=u)}"
            if form else "Draw with static parameters and transform the sample with array "
                         "operations, or mark the parameters static (static_argnums=)")
    return RandomTraceError(
        f"{prefix}{method}() got a traced array as a parameter{_user_location()}. tracegrad "
        f"compiles random draws as fresh draws on every call, with zero gradient, and does "
        f"not differentiate through a distribution's parameters. {hint}; or {_DRAW_ELSEWHERE}.")


def record_draw(method, args, kwargs, source="global", gen=None):
    """Record ``method(*args, **kwargs)`` in the innermost trace of this
    thread; ``gen`` is the tracer of a Generator argument (None: NumPy's
    global state).  Returns the tracer of the sample."""
    prefix = "np.random." if source == "global" else f"{source}."
    if _is_traced(list(args)) or _is_traced(list(kwargs.values())):
        raise _traced_parameter_error(prefix, method, source)
    entry = _tracing.stack[-1]
    trace, n, token = entry
    # The draw number keeps two identical calls two nodes (the trace and the
    # passes merge equal nodes); it is stable from trace to trace, so the
    # cache key is too.
    attrs = draw_attrs(method, args, kwargs, source, draw=n)
    operands = ((gen,) if gen is not None else ()) + ((token,) if token is not None else ())
    out = trace.bind(random_draw_p, operands, attrs)
    entry[1:] = [n + 1, out]
    return out


def _global_wrapper(name):
    def np_random_function(*args, **kwargs):
        if not _tracing.stack:  # a thread that is not tracing draws for real
            global _foreign_calls
            _foreign_calls += 1
            return (_originals.get(name) or _NUMPY_FUNCTIONS[name])(*args, **kwargs)
        if name in _REFUSED:
            raise RandomTraceError(f"np.random.{name} cannot be used inside a traced "
                                   f"function{_user_location()}: {_REFUSED[name]}.")
        return record_draw(_LEGACY_ALIASES.get(name, name), args, kwargs)
    np_random_function.__name__ = name
    np_random_function.__qualname__ = f"tracegrad_traced_np_random.{name}"
    np_random_function.__doc__ = (f"np.random.{name}, replaced while tracegrad traces a "
                                  f"function: records a random_draw node in the tracing thread, "
                                  f"calls NumPy's function in every other thread.")
    return np_random_function


_PATCHED = sorted(n for n in (_LEGACY_DRAWS | set(_LEGACY_ALIASES) | set(_REFUSED))
                  if hasattr(np.random, n))
_WRAPPERS = {n: _global_wrapper(n) for n in _PATCHED}
# NumPy's functions as imported, for a wrapper another thread fetched
# before the last trace ended and calls after
_NUMPY_FUNCTIONS = {n: getattr(np.random, n) for n in _PATCHED}


def _install():
    global _active
    with _lock:
        if _active == 0:
            for n in _PATCHED:
                _originals[n] = getattr(np.random, n)
                setattr(np.random, n, _WRAPPERS[n])
        _active += 1


def _uninstall():
    global _active
    with _lock:
        _active -= 1
        if _active == 0:
            for n in _PATCHED:
                if getattr(np.random, n) is _WRAPPERS[n]:  # unless someone patched over us
                    setattr(np.random, n, _originals[n])
            _originals.clear()


class GeneratorProxy:
    """What the traced function sees for a Generator/RandomState argument:
    its draw methods record ``random_draw`` nodes reading that argument."""

    def __init__(self, tracer, source="Generator"):
        self._tracer = tracer
        self._source = source

    def __getattr__(self, name):
        source = self._source
        draws = _GENERATOR_DRAWS if source == "Generator" else _LEGACY_DRAWS
        if name in draws:
            def method(*args, **kwargs):
                if kwargs.get("out") is not None:
                    raise RandomTraceError(
                        f"{source}.{name}(..., out=) cannot write into an array inside a "
                        f"compiled function{_user_location()}; assign the result instead")
                kwargs.pop("out", None)
                return record_draw(name, args, kwargs, source, gen=self._tracer)
            return method
        why = _GENERATOR_REFUSED.get(name, f"tracegrad compiles the {source}'s draw methods "
                                           f"({', '.join(sorted(draws))}), not {name}")
        raise RandomTraceError(f"{source}.{name} cannot be used inside a traced "
                               f"function{_user_location()}: {why}.")

    def __repr__(self):
        return f"<traced {self._source} argument>"


def _first_tracer(v):
    if type(v) is primitives._tracer_type:
        return v
    if isinstance(v, (tuple, list)):
        vals = v
    elif isinstance(v, dict):
        vals = v.values()
    else:
        return None
    for e in vals:
        found = _first_tracer(e)
        if found is not None:
            return found
    return None


def _with_proxies(v):
    """Replace the tracers standing for Generator arguments (dtype object)
    by proxies, inside tuples, lists and dicts."""
    t = primitives._tracer_type
    if t is not None and type(v) is t and v.dtype == object:
        return GeneratorProxy(v)
    if isinstance(v, tuple) and not hasattr(v, "_fields"):
        return tuple(_with_proxies(e) for e in v)
    if isinstance(v, list):
        return [_with_proxies(e) for e in v]
    if isinstance(v, dict):
        return {k: _with_proxies(e) for k, e in v.items()}
    return v


# --- frozen draws: generators the function reaches, compared before and after --------------

_default_rng = np.random.default_rng  # replaced by a wrapper while tracing
_RANDOM_TYPES = (np.random.Generator, np.random.RandomState, np.random.BitGenerator)


def _code_names(code):
    names = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names |= _code_names(c)
    return names


def _reachable_generators(fn, args, kwargs):
    """(description, object) for each Generator/RandomState/BitGenerator the
    function can reach: its arguments, closure cells, defaults, the globals
    and module attributes it names, and, a few calls deep, the same for the
    functions and bound methods it reaches."""
    found, seen, visited = [], set(), set()

    def consider(desc, v, nested=True):
        if isinstance(v, _RANDOM_TYPES):
            if id(v) not in seen:
                seen.add(id(v))
                found.append((desc, v))
        elif nested and isinstance(v, (list, tuple)):
            for i, e in enumerate(v[:64]):
                consider(f"{desc}[{i}]", e, False)
        elif nested and isinstance(v, dict):
            for k, e in list(v.items())[:64]:
                consider(f"{desc}[{k!r}]", e, False)

    def scan_object(desc, obj):
        # instance attributes only: no property is run
        d = getattr(obj, "__dict__", None)
        if isinstance(d, dict):
            for k, v in list(d.items()):
                consider(f"{desc}.{k}", v)

    def scan(f, depth):
        if depth > 3 or id(f) in visited:
            return
        visited.add(id(f))
        if hasattr(f, "func") and hasattr(f, "keywords"):  # functools.partial
            for i, a in enumerate(getattr(f, "args", ())):
                consider(f"bound argument {i}", a)
            for k, a in (f.keywords or {}).items():
                consider(f"bound argument {k}=", a)
            return scan(f.func, depth)
        if isinstance(f, types.MethodType):
            scan_object("self", f.__self__)
            return scan(f.__func__, depth)
        if not isinstance(f, types.FunctionType):
            if callable(f) and not isinstance(f, (type, types.BuiltinFunctionType)):
                scan_object("the callable object", f)
                scan(getattr(type(f), "__call__", None), depth)
            return
        where = f"{f.__module__}.{f.__qualname__}"
        code = f.__code__
        for name, cell in zip(code.co_freevars, f.__closure__ or ()):
            try:
                v = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            consider(f"the closure variable '{name}' of {where}", v)
            if callable(v):
                scan(v, depth + 1)
        for i, v in enumerate(f.__defaults__ or ()):
            consider(f"a default argument of {where}", v)
        for k, v in (f.__kwdefaults__ or {}).items():
            consider(f"the default {k}= of {where}", v)
        names = _code_names(code)
        g = f.__globals__
        for name in names:
            if name not in g:
                continue
            v = g[name]
            consider(f"the global '{name}' of module {f.__module__}", v)
            if isinstance(v, types.ModuleType):
                vd = vars(v)
                for attr in names:
                    if attr in vd:
                        consider(f"{v.__name__}.{attr}", vd[attr])
            elif isinstance(v, (types.FunctionType, types.MethodType)):
                scan(v, depth + 1)
            elif not isinstance(v, type) and not callable(v):
                scan_object(f"the global '{name}' of module {f.__module__}", v)

    for i, a in enumerate(args):
        consider(f"argument {i}", a)
    for k, a in kwargs.items():
        consider(f"argument {k}=", a)
    scan(fn, 0)
    return found


def _freeze(v):
    if isinstance(v, dict):
        return tuple((k, _freeze(e)) for k, e in sorted(v.items()))
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(e) for e in v)
    if isinstance(v, np.ndarray):
        return (v.dtype.str, v.shape, v.tobytes())
    return v


def _state(obj):
    if isinstance(obj, np.random.RandomState):
        return _freeze(obj.get_state(legacy=False))
    if isinstance(obj, np.random.Generator):
        return _freeze(obj.bit_generator.state)
    return _freeze(obj.state)


def _frozen_draw_error(fn, what):
    name = getattr(fn, "__qualname__", getattr(fn, "__name__", repr(fn)))
    return RandomTraceError(
        f"while tracing {name}, random numbers were drawn from {' and '.join(what)}; compiled "
        f"code would replay those numbers, frozen at trace time, on every call instead of "
        f"drawing fresh ones as NumPy does. tracegrad compiles calls to the np.random.* "
        f"functions (looked up as np.random.<name> at call time, not imported by name) into "
        f"fresh draws, and so are draws from a Generator or RandomState the compiled "
        f"function or a helper it calls names (a global, a closure variable or a default: "
        f"it is drawn from at run time, by reference); one reached another way (an "
        f"attribute such as self.rng, a container, a static argument) cannot be "
        f"intercepted. Name the generator in the function, pass a Generator as an "
        f"argument, use np.random.* functions (np.random.seed(s) before the call reproduces "
        f"NumPy's numbers), or {_DRAW_ELSEWHERE}. (This check compares random states before and "
        f"after tracing; another thread drawing with a Generator the function also reaches "
        f"would trigger it too.)")


@contextlib.contextmanager
def tracing_random_draws(trace, fn, args, kwargs):
    """Around the traced call of ``fn(*args, **kwargs)``: np.random.* draws
    in this thread record nodes in ``trace``; yields (args, kwargs) with
    proxies for Generator arguments; afterwards fails if a Generator the
    function reaches, or NumPy's global state, moved (a frozen draw)."""
    watched = [(d, o, _state(o)) for d, o in _reachable_generators(fn, args, kwargs)]
    legacy = np.random.mtrand._rand
    legacy_before = _state(legacy)
    foreign_before = _foreign_calls
    _install()
    _tracing.stack.append([trace, 0, _first_tracer((args, kwargs))])
    try:
        yield _with_proxies(args), _with_proxies(kwargs)
    finally:
        _tracing.stack.pop()
        _uninstall()
    changed = [d for d, o, s in watched if _state(o) != s]
    # Threads that are not tracing draw from the global state for real; a
    # change is only ours when none did (through np.random.*) meanwhile.
    if _state(legacy) != legacy_before and _foreign_calls == foreign_before:
        changed.append("NumPy's global random state through a function bound before tracing "
                       "(from numpy.random import normal, np.random.mtrand._rand, ...)")
    if changed:
        raise _frozen_draw_error(fn, changed)
