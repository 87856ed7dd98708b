"""SciPy as written: ``scipy.*`` calls inside a function tracegrad traces or
runs eagerly (``compile=False``) reach tracegrad's implementations.

The traced function's globals and closure variables are re-made by
``tracegrad.frontend.created.substitute``; this module gives it the stand-ins
for what SciPy the function names:

* the ``scipy`` package and its submodules (``import scipy.linalg``, ``from
  scipy import linalg``): a stand-in module whose attributes are stand-ins in
  turn (``scipy.linalg.expm`` read through it);
* a SciPy function named directly (``from scipy.linalg import expm``): a
  stand-in keyed by the identity of SciPy's function object;
* a ``scipy.stats`` distribution (``norm``) or a frozen one (``norm(0, 2)``
  made outside the function): a stand-in whose methods are tracegrad's;
* a ``scipy.interpolate`` interpolator made from plain arrays (outside the
  function, or by a SciPy class the function calls on constants): a stand-in
  that evaluates tracegrad values from its coefficients
  (``tracegrad.ops.scipy_interpolate.adopt``), plain ones with SciPy.

A stand-in calls tracegrad's implementation (``tracegrad.ops.scipy_*``, the
table ``tracegrad.scipy`` exposes too) only when an argument is a value
tracegrad follows (a tracer, or an eager value); plain arrays go to SciPy
itself, so SciPy's own results stand.  A SciPy function with no
implementation here refuses a traced value, or an eager value that requires
grad, with an error that names it: never a silently cut gradient.  SciPy's
ufuncs (``scipy.special.expit``) are left as they are: NumPy hands them to
tracegrad through ``__array_ufunc__`` (``tracegrad.ops.scipy_special``).

SciPy is imported by the user, never here: nothing happens unless the
function names SciPy.
"""
from __future__ import annotations

import builtins
import functools
import sys
import types

import numpy as np

from tracegrad.frontend import scipy_roots
from tracegrad.ops import indexing as _indexing
from tracegrad.ops import scipy_interpolate, scipy_linalg, scipy_more, scipy_special, scipy_stats
from tracegrad.ops.base import is_value

# SciPy's module -> {public name: tracegrad's implementation}
IMPLEMENTED = {
    "scipy.special": {**scipy_special.FUNCTIONS},
    "scipy.linalg": dict(scipy_linalg.FUNCTIONS),
    "scipy.signal": dict(scipy_more.SIGNAL),
    "scipy.fft": dict(scipy_more.FFT),
    "scipy.integrate": dict(scipy_more.INTEGRATE),
    "scipy.stats": {},
    "scipy.interpolate": dict(scipy_interpolate.FUNCTIONS),
}
# SciPy's private modules where the public objects live (scipy.linalg._basic.solve...)
_PUBLIC = ("scipy.special", "scipy.linalg", "scipy.signal", "scipy.fft", "scipy.integrate",
           "scipy.stats", "scipy.optimize", "scipy.interpolate", "scipy.ndimage",
           "scipy.spatial", "scipy.sparse", "scipy.cluster", "scipy.odr", "scipy.io",
           "scipy.datasets", "scipy.misc", "scipy.constants", "scipy.differentiate")

_modules = {}      # id(SciPy module) -> (its stand-in, the module)
_callables = {}    # id(SciPy object) -> (its stand-in, the object)


def substitute(value):
    """The stand-in for a SciPy module, function or distribution the traced
    function names, or None for anything else."""
    if "scipy" not in sys.modules or isinstance(value, (_SciPyModule, _Distribution,
                                                         _FrozenView)):
        return None                             # no SciPy, or a stand-in already
    if type(value) is types.FunctionType and "__tracegrad_scipy__" in value.__dict__:
        return None
    if isinstance(value, types.ModuleType):
        name = getattr(value, "__name__", "")
        if name == "scipy" or name.startswith("scipy."):
            got = _modules.get(id(value))
            if got is None:
                got = _modules[id(value)] = (_module(value), value)
            return got[0]
        return None
    mod = _module_of(value)
    if mod is None:
        return None
    got = _callables.get(id(value))
    if got is None:
        stand_in = _stand_in(value, mod)
        got = _callables[id(value)] = (stand_in, value)
    return got[0]


def _module_of(value):
    """The SciPy module a SciPy callable or distribution comes from, else None
    (only attributes of known types are read: no user object's __getattr__ runs)."""
    if isinstance(value, (types.FunctionType, types.BuiltinFunctionType)) or (
            isinstance(value, type) and not issubclass(value, BaseException)):
        mod = value.__module__
    else:
        mod = type(value).__module__
        if mod in ("uarray", "functools"):   # scipy.fft's uarray multimethods, lru_caches
            mod = getattr(value, "__module__", None)
        elif not (isinstance(mod, str) and mod.startswith("scipy.")):
            return None
        elif not (callable(value) or _is_distribution(value)) or isinstance(value, np.ufunc):
            return None
    if not isinstance(mod, str) or not mod.startswith("scipy."):
        return None
    return mod


def _is_distribution(value):
    mod = type(value).__module__
    return isinstance(mod, str) and mod.startswith("scipy.stats.")


class _SciPyModule(types.ModuleType):
    """A SciPy module as the traced function sees it: every attribute is
    SciPy's, with its functions, submodules and distributions as stand-ins."""

    def __init__(self, real):
        super().__init__(real.__name__, getattr(real, "__doc__", None))
        object.__setattr__(self, "_real", real)

    def __getattr__(self, name):
        value = getattr(object.__getattribute__(self, "_real"), name)
        stand_in = substitute(value)
        return value if stand_in is None else stand_in

    def __dir__(self):
        return dir(object.__getattribute__(self, "_real"))

    def __repr__(self):
        return f"<module {self.__name__!r} as tracegrad traces it>"


def _module(real):
    return _SciPyModule(real)


def _public_module(obj_module, name):
    """The public SciPy module (scipy.linalg) that exports ``name`` from the
    private module ``obj_module`` (scipy.linalg._matfuncs), or that module."""
    for pub in _PUBLIC:
        if obj_module == pub or obj_module.startswith(pub + "."):
            return pub
    return obj_module


def _constant(v):
    """A traced array whose value is known (one the function created and wrote
    only constants into): SciPy may compute on it, as NumPy does."""
    known = getattr(type(v), "known_value", None)
    return known is not None and hasattr(v, "_trace") and known(v) is not None


def _holds_value(args, kwargs, depth=0):
    """Does an argument hold a tracegrad value (in a tuple, list or dict, or
    in the closure of a function passed: a root finder's f)?  Traced
    constants do not count: SciPy computes on them."""
    for v in list(args) + list(kwargs.values()):
        if is_value(v) and not _constant(v):
            return True
        if depth < 2 and isinstance(v, (types.FunctionType, functools.partial)) and \
                _holds_value(_captured(v), {}, depth + 1):
            return True
        if depth < 2 and isinstance(v, (tuple, list)) and _holds_value(v, {}, depth + 1):
            return True
        if depth < 2 and isinstance(v, dict) and _holds_value((), v, depth + 1):
            return True
    return False


def _differentiated(args, kwargs, depth=0):
    """Does an argument hold a traced value, or an eager value that requires
    grad (a function passed, a root finder's f or an integrand: in its
    closure or defaults)?"""
    for v in list(args) + list(kwargs.values()):
        if is_value(v) and ((hasattr(v, "_trace") and not _constant(v))
                            or getattr(v, "requires_grad", False)):
            return True
        if depth < 2 and isinstance(v, (types.FunctionType, functools.partial)) and \
                _differentiated(_captured(v), {}, depth + 1):
            return True
        if depth < 2 and isinstance(v, (tuple, list)) and _differentiated(v, {}, depth + 1):
            return True
        if depth < 2 and isinstance(v, dict) and _differentiated((), v, depth + 1):
            return True
    return False


def _captured(f):
    """What a function passed to SciPy carries: closure cells, defaults, bound arguments."""
    if isinstance(f, functools.partial):
        return tuple(f.args) + tuple(f.keywords.values()) + (f.func,)
    out = []
    for c in f.__closure__ or ():
        try:
            out.append(c.cell_contents)
        except ValueError:
            pass
    return tuple(out) + tuple(f.__defaults__ or ())


def _implementation(public, name, original):
    if public == "scipy.optimize" and name in scipy_roots.ROOTS:
        return functools.partial(scipy_roots.ROOTS[name], original)
    if public == "scipy.integrate" and name in scipy_roots.INTEGRALS:
        return functools.partial(scipy_roots.INTEGRALS[name], original)
    table = IMPLEMENTED.get(public)
    return None if table is None else table.get(name)


def _stand_in(value, mod):
    if _is_distribution(value) and not isinstance(value, (types.FunctionType, type)):
        return _distribution(value)
    name = getattr(value, "__name__", None) or type(value).__name__
    public = _public_module(mod, name)
    impl = _implementation(public, name, value)
    if public == "scipy.interpolate":
        routed = _interpolate_stand_in(value, impl, name)
        if routed is not None:
            return routed
    if impl is not None and getattr(sys.modules.get(public), name, None) is value:
        return _routed(value, impl, f"{public}.{name}")
    return _refusing(value, f"{public}.{name}")


def _routed(original, impl, qualname):
    @functools.wraps(original)
    def call(*args, **kwargs):
        if _holds_value(args, kwargs):
            return impl(*args, **kwargs)
        return original(*args, **kwargs)
    call.__tracegrad_implementation__ = impl
    call.__tracegrad_scipy__ = qualname
    return call


# --- scipy.interpolate: classes and the interpolators they make ------------------------------

def _adopted(obj):
    """tracegrad's stand-in for a SciPy interpolator made from plain arrays, or None."""
    try:
        return scipy_interpolate.adopt(obj)
    except NotImplementedError:     # a method tracegrad does not evaluate: SciPy's refuses
        return None


def _interpolate_stand_in(value, impl, name):
    """A SciPy interpolator object the function reads (made outside it): its
    stand-in evaluates tracegrad values.  A class or function of
    scipy.interpolate: tracegrad's on tracegrad values; on plain arrays
    SciPy's, its result adopted so that it can be evaluated on tracegrad
    values later in the function."""
    if not isinstance(value, (type, types.FunctionType, types.BuiltinFunctionType)):
        return _adopted(value)
    if impl is None or getattr(sys.modules.get("scipy.interpolate"), name, None) is not value:
        return None
    qualname = f"scipy.interpolate.{name}"

    @functools.wraps(value)
    def call(*args, **kwargs):
        if _holds_value(args, kwargs) or scipy_interpolate._any_value(
                *args, *kwargs.values()):
            return impl(*args, **kwargs)
        result = value(*args, **kwargs)
        mine = _adopted(result)
        return result if mine is None else mine
    call.__tracegrad_implementation__ = impl
    call.__tracegrad_scipy__ = qualname
    return call


def _refuse_message(qualname):
    return (f"{qualname} was called on a value tracegrad differentiates (traced, or recorded "
            f"for a gradient), and tracegrad has no rule for it: SciPy would compute on a "
            f"plain copy and the gradient would be lost. See docs/scipy.md for the SciPy "
            f"functions tracegrad differentiates; otherwise call it on constants (outside "
            f"the differentiated code, or on tg.stop_gradient(...)), or wrap it in "
            f"tg.autograd.Function with a hand-written backward")


def _refusing(original, qualname):
    @functools.wraps(original)
    def call(*args, **kwargs):
        if _differentiated(args, kwargs):
            raise NotImplementedError(_refuse_message(qualname))
        try:
            return original(*args, **kwargs)
        except TypeError as e:
            # a callback (a root finder's f, an integrand) computed on a value tracegrad
            # differentiates and SciPy converted it: the same error, naming the SciPy function
            if any(c.__name__ in ("TraceError", "ConversionError") for c in type(e).__mro__) and \
                    e.args and isinstance(e.args[0], str) and qualname not in e.args[0]:
                e.args = (f"{qualname}: a function it called computed with a value tracegrad "
                          f"differentiates, and SciPy needs plain numbers there; tracegrad "
                          f"has no rule for {qualname} (see docs/scipy.md). "
                          f"{e.args[0]}",) + e.args[1:]
            raise
    call.__tracegrad_scipy__ = qualname
    call.__tracegrad_refuses__ = True
    return call


# --- scipy.stats distributions -------------------------------------------------------------

_METHODS = ("logpdf", "pdf", "logpmf", "pmf", "cdf", "logcdf", "sf", "logsf")


class _Distribution:
    """A SciPy distribution (``scipy.stats.norm``) as the traced function
    sees it: its density methods are tracegrad's on tracegrad values, SciPy's
    on plain ones; anything else is SciPy's, refused on tracegrad values."""

    def __init__(self, real, ours, frozen=None):
        self._real, self._ours, self._frozen = real, ours, frozen

    def __getattr__(self, name):
        attr = getattr(self._real, name)
        if not callable(attr):
            return attr
        label = f"scipy.stats.{getattr(self._ours, 'name', None) or _dist_name(self._real)}"
        if self._ours is not None and name in _METHODS:
            if self._frozen is None:
                mine = getattr(self._ours, name, None)
            else:
                args, kwds = self._frozen
                dist_method = getattr(self._ours, name, None)
                mine = None if dist_method is None else \
                    (lambda x, _m=dist_method: _m(x, *args, **kwds))
            if mine is not None:
                return _routed_method(attr, mine, self._frozen, f"{label}.{name}")
        return _refusing_method(attr, self._frozen, f"{label}.{name}")

    def __call__(self, *args, **kwds):
        """Freezing: ``norm(loc, scale)`` with tracegrad values gives a frozen
        stand-in; with plain values SciPy's frozen distribution, as a stand-in."""
        if self._frozen is not None:
            raise TypeError(f"a frozen {_dist_name(self._real)} distribution is not callable")
        if _holds_value(args, kwds):
            if self._ours is None:
                raise NotImplementedError(_refuse_message(
                    f"scipy.stats.{_dist_name(self._real)}"))
            return _Distribution(self._real, self._ours, (args, kwds))
        return _distribution(self._real(*args, **kwds))

    def __repr__(self):
        return f"<{self._real!r} as tracegrad traces it>"


def _held(frozen):
    return frozen is not None and _holds_value(*frozen)


def _routed_method(original, mine, frozen, qualname):
    def call(*args, **kwargs):
        if _holds_value(args, kwargs) or _held(frozen):
            return mine(*args, **kwargs)
        return original(*args, **kwargs)
    call.__name__ = call.__qualname__ = qualname.rsplit(".", 1)[-1]
    call.__tracegrad_scipy__ = qualname
    return call


def _refusing_method(original, frozen, qualname):
    def call(*args, **kwargs):
        if _differentiated(args, kwargs) or (frozen is not None and _differentiated(*frozen)):
            raise NotImplementedError(_refuse_message(qualname))
        return original(*args, **kwargs)
    call.__name__ = call.__qualname__ = qualname.rsplit(".", 1)[-1]
    call.__tracegrad_scipy__ = qualname
    return call


def _dist_name(real):
    # a frozen one: its distribution (rv_frozen.dist, multi_rv_frozen._dist)
    dist = getattr(real, "dist", None) or getattr(real, "_dist", None) or real
    name = getattr(dist, "name", None)
    if name is None:
        name = type(dist).__name__
        name = name[:-4] if name.endswith("_gen") else name
    return name


def _distribution(real):
    """The stand-in of a SciPy distribution, or of a frozen one (made
    outside the traced function, or by the stand-in from plain values)."""
    name = _dist_name(real)
    ours = scipy_stats.DISTRIBUTIONS.get(name)
    dist = getattr(real, "dist", None)
    if dist is not None and hasattr(real, "args"):                  # rv_frozen
        # (freezing copies the distribution object: its class is the public one's)
        if ours is not None and type(getattr(scipy_stats_module(), name, None)) is not type(dist):
            ours = None                                              # not the public one
        d = _Distribution(real, ours, (tuple(real.args), dict(real.kwds)))
        return _FrozenView(d)
    if type(real).__name__.endswith("_frozen"):                     # multivariate frozen
        kwds = {k: getattr(real, k) for k in ("mean", "cov", "alpha") if hasattr(real, k)}
        if name == "multivariate_normal":
            kwds = {"mean": real.mean, "cov": real.cov}
        return _FrozenView(_Distribution(real, ours, ((), kwds)))
    if ours is not None and getattr(scipy_stats_module(), name, None) is not real:
        ours = None
    return _Distribution(real, ours)


class _FrozenView:
    """A frozen distribution's stand-in: methods take x alone (SciPy's frozen
    methods on plain values; tracegrad's with the frozen parameters on
    tracegrad values)."""

    def __init__(self, d):
        self._d = d

    def __getattr__(self, name):
        real_attr = getattr(self._d._real, name)
        if not callable(real_attr):
            return real_attr
        args, kwds = self._d._frozen
        label = f"scipy.stats.{_dist_name(self._d._real)}.{name}"
        ours = self._d._ours
        if ours is not None and name in _METHODS and hasattr(ours, name):
            method = getattr(ours, name)
            return _routed_method(real_attr, lambda x: method(x, *args, **kwds), None, label)
        return _refusing_method(real_attr, None, label)

    def __repr__(self):
        return f"<{self._d._real!r} as tracegrad traces it>"


def scipy_stats_module():
    return sys.modules.get("scipy.stats")


def stand_in_of(value):
    """For tests and docs: what a traced function calling ``value`` reaches."""
    return substitute(value)


def import_hook(name, globals=None, locals=None, fromlist=(), level=0):
    """``__import__`` inside a function tracegrad traces or runs eagerly
    (``tracegrad.ops.indexing.IMPORT_HOOK``): SciPy's modules come back as
    their stand-ins, so ``import scipy.linalg`` or ``from scipy.linalg import
    expm`` in the function body means what the module-level import means."""
    mod = builtins.__import__(name, globals, locals, fromlist, level)
    if level == 0 and (name == "scipy" or name.startswith("scipy.")):
        stand_in = substitute(mod)
        if stand_in is not None:
            return stand_in
    return mod


_indexing.IMPORT_HOOK = import_hook
