"""``scipy.optimize``'s root finders and optimisers on tracegrad values
(``tracegrad.frontend.scipy_roots``, rows in ``tracegrad.ops.scipy_solvers``):
the same functions SciPy's own reach when a differentiated function calls
them as written.  SciPy's solution; derivatives by the implicit function
theorem (compiled: graph nodes of any order).  Needs SciPy at call time."""
import functools
import importlib

from tracegrad.frontend import scipy_roots as _roots

NAMES = ("brentq", "brenth", "bisect", "ridder", "toms748", "newton", "root_scalar",
         "fixed_point", "root", "fsolve", "minimize", "minimize_scalar", "least_squares",
         "curve_fit")
__all__ = list(NAMES)


def _public(module, name, table):
    def call(*args, **kwargs):
        original = getattr(importlib.import_module(module), name)
        return table[name](original, *args, **kwargs)
    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"{module}.{name} on tracegrad values (docs/scipy.md)."
    call.__wrapped__ = functools.partial(table[name])
    return call


globals().update({n: _public("scipy.optimize", n, _roots.ROOTS) for n in NAMES})
