"""``autograd.scipy.linalg``: ``tracegrad.scipy.linalg`` (the rows behind
SciPy's own ``scipy.linalg`` called on differentiated values:
``tracegrad/ops/scipy_linalg.py``), with ``solve_banded``.

autograd gives derivative rules for ``sqrtm``, ``solve_triangular``,
``solve_banded`` and ``solve_sylvester`` and wraps every other
``scipy.linalg`` name without one.  Here ``sqrtm``, ``solve_triangular``,
``solve_sylvester``, ``cholesky``, ``solve``, ``expm``, ``inv``, ``det``,
``eigh``, ... (``__all__``) are differentiable; ``solve_banded`` is the dense
solve of the matrix its banded storage holds (a composition, so its
derivative in both operands follows).  Any other ``scipy.linalg`` name is
SciPy's function on plain arrays and raises an error naming it on a value
tracegrad differentiates (``NotImplementedError``), where autograd raises
for a missing rule.
"""
import numpy as np
import scipy.linalg as _scipy_linalg

from tracegrad.frontend.scipy_calls import stand_in_of as _stand_in_of
from tracegrad.ops._define import _ops as _o
from tracegrad.ops.base import is_value
from tracegrad.scipy.linalg import *  # noqa: F401,F403
from tracegrad.scipy.linalg import __all__ as _tg_all
from tracegrad.scipy.linalg import solve as _solve

__all__ = sorted(list(_tg_all) + ["solve_banded"])


def solve_banded(l_and_u, ab, b, overwrite_ab=False, overwrite_b=False, check_finite=True):
    """scipy.linalg.solve_banded((l, u), ab, b): ab[u + i - j, j] = a[i, j]."""
    if not (is_value(ab) or is_value(b)):
        return _scipy_linalg.solve_banded(l_and_u, ab, b, overwrite_ab=overwrite_ab,
                                          overwrite_b=overwrite_b, check_finite=check_finite)
    nl, nu = (int(v) for v in l_and_u)
    shape = tuple(_o.shape_of(ab)) if is_value(ab) else np.shape(ab)
    if len(shape) != 2 or shape[0] != nl + nu + 1:
        raise ValueError(f"solve_banded: ab must have shape ({nl + nu + 1}, n), got {shape}")
    n = shape[1]
    i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    band = (i - j <= nl) & (j - i <= nu)
    row = np.where(band, nu + i - j, 0)
    col = np.where(band, j, 0)
    ab_v = ab if is_value(ab) else np.asarray(ab, float)
    a = _o.where(band, ab_v[row, col], 0.0)
    return _solve(a, b)


def __getattr__(name):
    """Any other public name of scipy.linalg: SciPy's, refusing differentiated values by name."""
    if name.startswith("_"):        # SciPy's private names and its package attributes (__path__)
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        value = getattr(_scipy_linalg, name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r} (nor has "
                             f"scipy.linalg)") from None
    if callable(value):
        stand_in = _stand_in_of(value)
        if stand_in is not None:
            return stand_in
    return value
