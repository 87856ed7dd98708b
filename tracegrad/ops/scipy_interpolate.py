"""``scipy.interpolate`` on tracegrad values, with SciPy's signatures: the
one implementation behind ``tracegrad.scipy.interpolate`` and behind SciPy's
own classes and functions called on traced or recorded values
(``tracegrad/frontend/scipy_calls.py``).

Everything is a composition of existing rows, so every derivative (in the
query points, in the data values, and in the breakpoints / knots / grid
points when those are tracegrad values) follows from their rules:

* evaluation of a piecewise polynomial (``PPoly``: ``CubicSpline``,
  ``PchipInterpolator``, ``CubicHermiteSpline``): the interval by
  ``searchsorted`` (an integer, no gradient), a gather of that interval's
  coefficients and Horner's rule in ``x - x[i]``;
* ``CubicSpline``: SciPy's linear system for the slopes (not-a-knot,
  clamped, natural, first/second derivative values, periodic) assembled
  densely from ``diff(x)`` and solved with the ``solve`` row, then the
  cubic Hermite coefficients;
* ``PchipInterpolator``: SciPy's slope formulas with ``where`` (the branch
  not taken never divides by zero, so no NaN reaches a gradient);
* ``BSpline``: de Boor's recursion for the k+1 non-zero basis functions of
  each query's knot interval; ``make_interp_spline`` solves the collocation
  system (the same basis at the data sites) with the ``solve`` row;
* ``interp1d`` (linear, nearest, nearest-up, previous, next, zero, slinear,
  quadratic, cubic, an integer order) and ``RegularGridInterpolator`` /
  ``interpn`` (linear, nearest): SciPy's index formulas, gathers and weights.

Where SciPy raises on out-of-bounds queries (``bounds_error=True``, the
default of ``interp1d`` and ``RegularGridInterpolator``) the check needs the
query values: it runs eagerly (``compile=False``), and a compiled transform
falls back to eager mode for that signature (said once in the log).  Pass
``bounds_error=False`` (with ``fill_value``) to stay compiled.  Checks on the
data (increasing x...) are made where its values are known (plain arrays,
eager values), skipped on traced ones.
"""
from __future__ import annotations

import itertools

import numpy as np

from tracegrad.ops._define import _ops as _o
from tracegrad.ops.base import is_value

__all__ = []   # reached through tracegrad.scipy.interpolate


# --- helpers -------------------------------------------------------------------------------

def _float(v):
    if is_value(v):
        return v if np.dtype(v.dtype).kind in "fc" else _o.astype(v, np.float64)
    v = np.asarray(v)
    return v if v.dtype.kind in "fc" else v.astype(np.float64)


def _shape(v):
    return tuple(_o.shape_of(v)) if is_value(v) else np.shape(v)


def _known(v):
    """v's numbers where they are known (a plain array, an eager value, a
    traced constant), else None."""
    if not is_value(v):
        return np.asarray(v)
    if hasattr(v, "_trace"):
        known = getattr(type(v), "known_value", None)
        try:
            got = None if known is None else known(v)
        except Exception:
            got = None
        return None if got is None else np.asarray(got)
    try:
        return np.asarray(v.detach().numpy())
    except Exception:
        return None


def _any_value(*vs, depth=0):
    for v in vs:
        if is_value(v):
            return True
        if depth < 4 and isinstance(v, (tuple, list)) and _any_value(*v, depth=depth + 1):
            return True
    return False


def _v1(s):
    """A scalar as a 1-element vector."""
    return _o.reshape(s, (1,)) if is_value(s) else np.reshape(np.asarray(s, np.float64), (1,))


def _cat(parts):
    if any(is_value(p) for p in parts):
        return _o.concatenate(parts)
    return np.concatenate(parts)


def _take(a, i, axis=0):
    if is_value(a) or is_value(i):
        return _o.take(a, i, axis=axis)
    return np.take(a, i, axis=axis)


def _reshape(a, shape):
    return _o.reshape(a, shape) if is_value(a) else np.reshape(a, shape)


def _where(c, a, b):
    if is_value(c) or is_value(a) or is_value(b):
        return _o.where(c, a, b)
    return np.where(c, a, b)


def _interval(breaks, xq, lo, hi):
    """clip(searchsorted(breaks, xq, 'right') - 1, lo, hi): the interval
    breaks[i] <= xq < breaks[i + 1] SciPy evaluates in (no gradient)."""
    if is_value(breaks) or is_value(xq):
        j = _o.searchsorted(breaks, xq, side="right")
        return _o.clip(_o.sub(j, 1), lo, hi)
    return np.clip(np.searchsorted(breaks, xq, side="right") - 1, lo, hi)


def _place(out, nx, axis):
    """SciPy's placement of the query dimensions at the interpolation axis."""
    if axis == 0:
        return out
    nd = len(_shape(out))
    perm = list(range(nx, nx + axis)) + list(range(nx)) + list(range(nx + axis, nd))
    return _o.transpose(out, perm) if is_value(out) else np.transpose(out, perm)


def _any_true(mask, what):
    """Is any element true?  Needs the values: eagerly a number, under tracing
    a ValueDependentTraceError (a compiled transform runs the function eagerly),
    its message and reason naming ``what`` asked."""
    if not is_value(mask):
        return bool(np.any(mask))
    try:
        return bool(_o.any(mask))
    except Exception as e:
        if type(e).__name__ == "ValueDependentTraceError" and e.args and \
                isinstance(e.args[0], str):
            why = (f"{what} with bounds_error=True checks the query points against the "
                   f"data range, which needs their values")
            e.args = (f"{why} (pass bounds_error=False, with a fill_value, to compile "
                      f"it). {e.args[0]}",) + e.args[1:]
            if getattr(e, "reason", None) is not None:
                e.reason = why
        raise


def _check_increasing(x, name, strict=True):
    k = _known(x)
    if k is None:
        return
    if k.ndim != 1:
        raise ValueError("`x` must be 1-dimensional.")
    if k.shape[0] < 2:
        raise ValueError("`x` must contain at least 2 elements.")
    d = np.diff(k)
    if np.any(d <= 0) if strict else np.any(d < 0):
        raise ValueError("`x` must be strictly increasing sequence.")


def _nan_unless_increasing(c, x):
    """Coefficients from breakpoints whose values are not known while tracing:
    NaN where SciPy would refuse them (not strictly increasing), never a wrong
    number (known ones are checked, with SciPy's error)."""
    if _known(x) is not None:
        return c
    return _o.where(_o.all(x[1:] > x[:-1]), c, np.nan)


class _Unsupported:
    """SciPy's other methods on a stand-in: refused by name (never a result
    computed on a plain copy)."""
    _scipy_name = "scipy.interpolate"
    _scipy_class = None

    def __getattr__(self, name):
        if name.startswith("__") or self._scipy_class is None:
            raise AttributeError(name)
        import sys
        mod = sys.modules.get("scipy.interpolate")
        cls = getattr(mod, self._scipy_class, None) if mod is not None else None
        if cls is not None and hasattr(cls, name):
            raise NotImplementedError(
                f"{self._scipy_name}.{name} is not supported on tracegrad values (only "
                f"evaluation and derivative() are); call it on plain arrays, outside the "
                f"differentiated code")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


# --- piecewise polynomials -----------------------------------------------------------------

def _ppoly_derivative_coefficients(c, nu):
    for _ in range(nu):
        kk = _shape(c)[0]
        if kk == 1:
            c = c * 0.0
        else:
            f = np.arange(kk - 1, 0, -1, dtype=np.float64).reshape(
                (kk - 1,) + (1,) * (len(_shape(c)) - 1))
            c = c[:-1] * f
    return c


class PPoly(_Unsupported):
    """scipy.interpolate.PPoly: c of shape (k + 1, m, ...), breakpoints x (m + 1)."""
    _scipy_name = "scipy.interpolate.PPoly"
    _scipy_class = "PPoly"

    def __init__(self, c, x, extrapolate=None, axis=0):
        self.c = _float(c)
        self.x = _float(x)
        self.extrapolate = True if extrapolate is None else extrapolate
        self.axis = axis
        self._scipy = None          # SciPy's object, for plain queries of an adopted one
        if len(_shape(self.c)) < 2:
            raise ValueError("Coefficients array must be at least 2-dimensional.")
        if _shape(self.x)[0] != _shape(self.c)[1] + 1:
            raise ValueError("x and c have incompatible sizes")

    @classmethod
    def construct_fast(cls, c, x, extrapolate=None, axis=0):
        self = object.__new__(cls)
        self.c, self.x, self.axis, self._scipy = c, x, axis, None
        self.extrapolate = True if extrapolate is None else extrapolate
        return self

    def __call__(self, x, nu=0, extrapolate=None):
        if self._scipy is not None and not _any_value(x, self.c, self.x):
            return self._scipy(x, nu, extrapolate)
        if extrapolate is None:
            extrapolate = self.extrapolate
        nu = int(nu)
        if nu < 0:
            raise NotImplementedError(f"{self._scipy_name}(x, nu={nu}) (an antiderivative) "
                                      f"is not supported on tracegrad values")
        xq = _float(x)
        xs = _shape(xq)
        flat = _reshape(xq, (-1,))
        bp = self.x
        if extrapolate == "periodic":
            flat = bp[0] + _o.remainder(flat - bp[0], bp[-1] - bp[0])
            extrapolate = False
        c = _ppoly_derivative_coefficients(self.c, nu)
        cs = _shape(c)
        m, trail = cs[1], cs[2:]
        i = _interval(bp, flat, 0, m - 1)
        ci = _take(c, i, axis=1)                       # (k + 1, q, ...)
        d = _reshape(flat - _take(bp, i), (-1,) + (1,) * len(trail))
        out = ci[0]
        for j in range(1, cs[0]):
            out = out * d + ci[j]
        if not extrapolate:
            inside = _reshape((flat >= bp[0]) & (flat <= bp[-1]), (-1,) + (1,) * len(trail))
            out = _where(inside, out, np.nan)
        out = _reshape(out, tuple(xs) + tuple(trail))
        return _place(out, len(xs), self.axis)

    def derivative(self, nu=1):
        if nu < 0:
            raise NotImplementedError(f"{self._scipy_name}.derivative({nu}) (an "
                                      f"antiderivative) is not supported on tracegrad values")
        if self._scipy is not None and not _any_value(self.c, self.x):
            return adopt(self._scipy.derivative(nu))
        c = _ppoly_derivative_coefficients(self.c, nu)
        return PPoly.construct_fast(c, self.x, self.extrapolate, self.axis)


def _hermite_coefficients(x, y, dydx):
    """CubicHermiteSpline's PPoly coefficients, y and dydx of shape (n, ...)."""
    trail = _shape(y)[1:]
    dx = _reshape(x[1:] - x[:-1], (-1,) + (1,) * len(trail))
    slope = (y[1:] - y[:-1]) / dx
    t = (dydx[:-1] + dydx[1:] - 2 * slope) / dx
    return _o.stack([t / dx, (slope - dydx[:-1]) / dx - t, dydx[:-1], y[:-1]])


def _prepare(x, y, axis, name):
    """SciPy's prepare_input: float x (1-D, increasing where known), y with
    the interpolation axis first."""
    x, y = _float(x), _float(y)
    if len(_shape(x)) != 1:
        raise ValueError("`x` must be 1-dimensional.")
    if _shape(x)[0] < 2:
        raise ValueError("`x` must contain at least 2 elements.")
    nd = len(_shape(y))
    if nd == 0:
        raise ValueError("`y` must be at least 1-dimensional.")
    axis = axis % nd
    if _shape(y)[axis] != _shape(x)[0]:
        raise ValueError(f"The length of `y` along `axis`={axis} doesn't match the length "
                         f"of `x`")
    _check_increasing(x, name)
    if axis != 0:
        y = _o.moveaxis(y, axis, 0) if is_value(y) else np.moveaxis(y, axis, 0)
    return x, y, axis


class CubicHermiteSpline(PPoly):
    """scipy.interpolate.CubicHermiteSpline."""
    _scipy_name = "scipy.interpolate.CubicHermiteSpline"
    _scipy_class = "CubicHermiteSpline"

    def __init__(self, x, y, dydx, axis=0, extrapolate=None):
        x, y, axis = _prepare(x, y, axis, self._scipy_name)
        dydx = _float(dydx)
        if axis != 0:
            dydx = _o.moveaxis(dydx, axis, 0) if is_value(dydx) else np.moveaxis(dydx, axis, 0)
        if _shape(dydx) != _shape(y):
            raise ValueError("The shapes of `y` and `dydx` must be identical.")
        self._init(x, y, dydx, axis, extrapolate)

    def _init(self, x, y, dydx, axis, extrapolate):
        c = _nan_unless_increasing(_hermite_coefficients(x, y, dydx), x)
        PPoly.__init__(self, c, x, extrapolate, 0)
        self.axis = axis


def _tridiagonal(diag, upper, lower):
    """A dense n x n matrix from its diagonal (n), upper (n - 1: entries
    (i, i + 1)) and lower (n - 1: entries (i + 1, i)) diagonals."""
    n = _shape(diag)[0]
    z = np.zeros(1)
    return (_reshape(diag, (n, 1)) * np.eye(n)
            + _reshape(_cat([upper, z]), (n, 1)) * np.eye(n, k=1)
            + _reshape(_cat([z, lower]), (n, 1)) * np.eye(n, k=-1))


_BC_WORDS = ("not-a-knot", "periodic", "clamped", "natural")


def _validate_bc(bc_type, y, deriv_shape):
    if isinstance(bc_type, str):
        if bc_type == "periodic":
            k = _known(y)
            if k is not None and not np.allclose(k[0], k[-1], rtol=1e-15, atol=1e-15):
                raise ValueError("The first and last `y` point along axis 0 must be "
                                 "identical (within machine precision) when "
                                 "bc_type='periodic'.")
        bc_type = (bc_type, bc_type)
    else:
        if len(bc_type) != 2:
            raise ValueError("`bc_type` must contain 2 elements to specify start and end "
                             "conditions.")
        if any(isinstance(b, str) and b == "periodic" for b in bc_type):
            raise ValueError("'periodic' `bc_type` is defined for both curve ends and "
                             "cannot be used with other boundary conditions.")
    out = []
    for bc in bc_type:
        if isinstance(bc, str):
            if bc == "clamped":
                out.append((1, np.zeros(deriv_shape)))
            elif bc == "natural":
                out.append((2, np.zeros(deriv_shape)))
            elif bc in ("not-a-knot", "periodic"):
                out.append(bc)
            else:
                raise ValueError(f"bc_type={bc} is not allowed.")
        else:
            try:
                order, value = bc
            except Exception:
                raise ValueError("A specified derivative value must be given in the form "
                                 "(order, value).") from None
            if order not in (1, 2):
                raise ValueError("The specified derivative order must be 1 or 2.")
            value = _float(value)
            if tuple(_shape(value)) != tuple(deriv_shape):
                raise ValueError(f"`deriv_value` shape {_shape(value)} is not the expected "
                                 f"one {tuple(deriv_shape)}.")
            out.append((order, value))
    return out


class CubicSpline(CubicHermiteSpline):
    """scipy.interpolate.CubicSpline: SciPy's system for the slopes at the
    data points, solved densely with the ``solve`` row."""
    _scipy_name = "scipy.interpolate.CubicSpline"
    _scipy_class = "CubicSpline"

    def __init__(self, x, y, axis=0, bc_type="not-a-knot", extrapolate=None):
        x, y, axis = _prepare(x, y, axis, self._scipy_name)
        n = _shape(x)[0]
        trail = tuple(_shape(y)[1:])
        bc = _validate_bc(bc_type, y, trail)
        if extrapolate is None:
            extrapolate = "periodic" if isinstance(bc[0], str) and bc[0] == "periodic" \
                else True
        p = int(np.prod(trail, dtype=int))
        y2 = _reshape(y, (n, p))
        dx = x[1:] - x[:-1]
        dxr = _reshape(dx, (n - 1, 1))
        slope = (y2[1:] - y2[:-1]) / dxr
        if n == 2:
            bc = [(1, slope[0]) if isinstance(b, str) else b for b in bc]
        bc = [b if isinstance(b, str) else (b[0], _reshape(b[1], (p,))) for b in bc]
        if n == 3 and bc[0] == "not-a-knot" and bc[1] == "not-a-knot":
            a = _tridiagonal(_cat([np.ones(1), _v1(2 * (dx[0] + dx[1])), np.ones(1)]),
                             _cat([np.ones(1), _v1(dx[0])]), _cat([_v1(dx[1]), np.ones(1)]))
            b = _o.stack([2 * slope[0], 3 * (dx[0] * slope[1] + dx[1] * slope[0]),
                          2 * slope[1]])
            s = _o.solve(a, b)
        elif isinstance(bc[0], str) and bc[0] == "periodic":
            nn = n - 1                                  # unknowns s[0..n-2]; s[n-1] = s[0]
            dxm1 = _cat([dx[-1:], dx[:-1]])             # dx[i - 1], cyclic
            slm1 = _cat([slope[-1:], slope[:-1]])
            prev = np.roll(np.eye(nn), -1, axis=1)      # (i, i - 1 mod nn)
            nxt = np.roll(np.eye(nn), 1, axis=1)        # (i, i + 1 mod nn)
            a = (_reshape(2 * (dxm1 + dx), (nn, 1)) * np.eye(nn)
                 + _reshape(dxm1, (nn, 1)) * nxt + _reshape(dx, (nn, 1)) * prev)
            b = 3 * (dxr * slm1 + _reshape(dxm1, (nn, 1)) * slope)
            s = _o.solve(a, b)
            s = _cat([s, s[:1]])
        else:
            start, end = bc
            mid_b = 3 * (dxr[1:] * slope[:-1] + dxr[:-1] * slope[1:])
            if isinstance(start, str):                  # not-a-knot
                d = x[2] - x[0]
                d0, u0 = dx[1], d
                b0 = ((dx[0] + 2 * d) * dx[1] * slope[0] + dx[0] ** 2 * slope[1]) / d
            elif start[0] == 1:
                d0, u0, b0 = 1.0, 0.0, start[1]
            else:
                d0, u0 = 2 * dx[0], dx[0]
                b0 = -0.5 * start[1] * dx[0] ** 2 + 3 * (y2[1] - y2[0])
            if isinstance(end, str):
                d = x[-1] - x[-3]
                dn, ln = dx[-2], d
                bn = (dx[-1] ** 2 * slope[-2] + (2 * d + dx[-1]) * dx[-2] * slope[-1]) / d
            elif end[0] == 1:
                dn, ln, bn = 1.0, 0.0, end[1]
            else:
                dn, ln = 2 * dx[-1], dx[-1]
                bn = 0.5 * end[1] * dx[-1] ** 2 + 3 * (y2[-1] - y2[-2])
            a = _tridiagonal(_cat([_v1(d0), 2 * (dx[:-1] + dx[1:]), _v1(dn)]),
                             _cat([_v1(u0), dx[:-1]]), _cat([dx[1:], _v1(ln)]))
            b = _cat([_reshape(b0 * np.ones(p), (1, p)), mid_b,
                      _reshape(bn * np.ones(p), (1, p))])
            s = _o.solve(a, b)
        s = _reshape(s, (n,) + trail)
        if isinstance(bc[0], str) and bc[0] == "periodic" and _known(y) is None:
            # SciPy refuses y[0] != y[-1]; unknown while tracing: NaN, never a wrong number
            same = _o.all(_o.abs(y[0] - y[-1]) <= 1e-15 * (1.0 + _o.abs(y[-1])))
            s = _o.where(same, s, np.nan)
        self._init(x, y, s, axis, extrapolate)


class PchipInterpolator(CubicHermiteSpline):
    """scipy.interpolate.PchipInterpolator: SciPy's monotone slopes."""
    _scipy_name = "scipy.interpolate.PchipInterpolator"
    _scipy_class = "PchipInterpolator"

    def __init__(self, x, y, axis=0, extrapolate=None):
        x, y, axis = _prepare(x, y, axis, self._scipy_name)
        if np.dtype(y.dtype).kind == "c":
            raise ValueError("`PchipInterpolator` only works with real values for `y`.")
        n = _shape(x)[0]
        trail = tuple(_shape(y)[1:])
        p = int(np.prod(trail, dtype=int))
        y2 = _reshape(y, (n, p))
        hk = _reshape(x[1:] - x[:-1], (n - 1, 1))
        mk = (y2[1:] - y2[:-1]) / hk
        if n == 2:
            dk = _cat([mk, mk])
        else:
            smk = _o.sign(mk)
            cond = (smk[1:] != smk[:-1]) | (mk[1:] == 0) | (mk[:-1] == 0)
            w1 = 2 * hk[1:] + hk[:-1]
            w2 = hk[1:] + 2 * hk[:-1]
            safe0 = _where(cond, 1.0, mk[:-1])
            safe1 = _where(cond, 1.0, mk[1:])
            whmean = (w1 / safe0 + w2 / safe1) / (w1 + w2)
            inner = _where(cond, 0.0, 1.0 / whmean)
            d0 = self._edge(hk[0], hk[1], mk[0], mk[1])
            dn = self._edge(hk[-1], hk[-2], mk[-1], mk[-2])
            dk = _cat([_reshape(d0, (1, p)), inner, _reshape(dn, (1, p))])
        self._init(x, y, _reshape(dk, (n,) + trail), axis, extrapolate)

    @staticmethod
    def _edge(h0, h1, m0, m1):
        d = ((2 * h0 + h1) * m0 - h0 * m1) / (h0 + h1)
        mask = _o.sign(d) != _o.sign(m0)
        mask2 = (_o.sign(m0) != _o.sign(m1)) & (_o.abs(d) > 3.0 * _o.abs(m0))
        return _where(mask, 0.0, _where(mask2, 3.0 * m0, d))


def pchip_interpolate(xi, yi, x, der=0, axis=0):
    """scipy.interpolate.pchip_interpolate."""
    p = PchipInterpolator(xi, yi, axis=axis)
    if der == 0:
        return p(x)
    if isinstance(der, (list, tuple)) or np.ndim(der) > 0:
        return [p.derivative(int(d))(x) for d in der]
    return p.derivative(int(der))(x)


# --- B-splines -----------------------------------------------------------------------------

def _basis(t, k, xq, l):
    """The k + 1 B-splines that do not vanish on t[l] <= x < t[l + 1] (de Boor's
    recursion; polynomial continuation outside), for l from _interval."""
    nb = [xq * 0.0 + 1.0]
    for j in range(1, k + 1):
        left = [None] + [xq - _take(t, l + (1 - jj)) for jj in range(1, j + 1)]
        right = [None] + [_take(t, l + jj) - xq for jj in range(1, j + 1)]
        saved = 0.0
        new = []
        for r in range(j):
            temp = nb[r] / (right[r + 1] + left[j - r])
            new.append(saved + right[r + 1] * temp)
            saved = left[j - r] * temp
        new.append(saved)
        nb = new
    return nb


class BSpline(_Unsupported):
    """scipy.interpolate.BSpline(t, c, k, extrapolate=True, axis=0)."""
    _scipy_name = "scipy.interpolate.BSpline"
    _scipy_class = "BSpline"

    def __init__(self, t, c, k, extrapolate=True, axis=0):
        self.k = int(k)
        self.t = _float(t)
        c = _float(c)
        nd = len(_shape(c))
        if nd == 0:
            raise ValueError("Coefficients must be at least 1-d.")
        axis = axis % nd
        if axis != 0:
            c = _o.moveaxis(c, axis, 0) if is_value(c) else np.moveaxis(c, axis, 0)
        self.c, self.axis, self.extrapolate, self._scipy = c, axis, extrapolate, None
        if self.k < 0:
            raise ValueError("Spline order cannot be negative.")
        if len(_shape(self.t)) != 1:
            raise ValueError("Knot vector must be one-dimensional.")
        n = _shape(self.t)[0] - self.k - 1
        if n < self.k + 1:
            raise ValueError(f"Need at least {2 * self.k + 2} knots for degree {self.k}")
        if _shape(c)[0] < n:
            raise ValueError("Knots, coefficients and degree are inconsistent.")
        kt = _known(self.t)
        if kt is not None and np.any(np.diff(kt) < 0):
            raise ValueError("Knots must be in a non-decreasing order.")

    @classmethod
    def construct_fast(cls, t, c, k, extrapolate=True, axis=0):
        self = object.__new__(cls)
        self.t, self.c, self.k, self.extrapolate, self.axis, self._scipy = \
            t, c, int(k), extrapolate, axis, None
        return self

    @property
    def tck(self):
        return self.t, self.c, self.k

    def __call__(self, x, nu=0, extrapolate=None):
        if self._scipy is not None and not _any_value(x, self.c, self.t):
            return self._scipy(x, nu, extrapolate)
        if extrapolate is None:
            extrapolate = self.extrapolate
        nu = int(nu)
        if nu < 0:
            raise NotImplementedError(f"{self._scipy_name}(x, nu={nu}) (an antiderivative) "
                                      f"is not supported on tracegrad values")
        spl = self
        for _ in range(nu):
            spl = spl.derivative()
        xq = _float(x)
        xs = _shape(xq)
        flat = _reshape(xq, (-1,))
        t, k = spl.t, spl.k
        n = _shape(t)[0] - k - 1
        if extrapolate == "periodic":
            flat = t[k] + _o.remainder(flat - t[k], t[n] - t[k])
            extrapolate = False
        c = spl.c[:n]
        trail = _shape(c)[1:]
        l = _interval(t, flat, k, n - 1)
        nb = _basis(t, k, flat, l)
        out = None
        for j in range(k + 1):
            term = _reshape(nb[j], (-1,) + (1,) * len(trail)) * _take(c, l + (j - k), axis=0)
            out = term if out is None else out + term
        if not extrapolate:
            inside = _reshape((flat >= t[k]) & (flat <= t[n]), (-1,) + (1,) * len(trail))
            out = _where(inside, out, np.nan)
        out = _reshape(out, tuple(xs) + tuple(trail))
        return _place(out, len(xs), self.axis)

    def derivative(self, nu=1):
        if nu < 0:
            raise NotImplementedError(f"{self._scipy_name}.derivative({nu}) (an "
                                      f"antiderivative) is not supported on tracegrad values")
        if self._scipy is not None and not _any_value(self.c, self.t):
            return adopt(self._scipy.derivative(nu))
        t, c, k = self.t, self.c, self.k
        for _ in range(nu):
            if k == 0:
                raise ValueError("order of derivative must be <= k")
            n = _shape(t)[0] - k - 1
            trail = _shape(c)[1:]
            dt = _reshape(t[k + 1:k + n] - t[1:n], (n - 1,) + (1,) * len(trail))
            c = (c[1:n] - c[:n - 1]) * k / dt
            t, k = t[1:-1], k - 1
            c = _cat([c, np.zeros((_shape(t)[0] - (n - 1),) + tuple(trail))])
        return BSpline.construct_fast(t, c, k, self.extrapolate, self.axis)


def _not_a_knot(x, k):
    if k % 2 == 1:
        k2 = (k + 1) // 2
        t = x
    else:
        k2 = k // 2
        t = (x[1:] + x[:-1]) / 2
    t = t[k2:-k2]
    return _cat([x[:1]] * (k + 1) + [t] + [x[-1:]] * (k + 1))


def make_interp_spline(x, y, k=3, t=None, bc_type=None, axis=0, check_finite=True):
    """scipy.interpolate.make_interp_spline (bc_type None / 'not-a-knot', or
    knots t given): the collocation system solved with the ``solve`` row."""
    name = "scipy.interpolate.make_interp_spline"
    if not (bc_type is None or (isinstance(bc_type, str) and bc_type == "not-a-knot")):
        raise NotImplementedError(f"{name}(bc_type={bc_type!r}) is not supported on tracegrad "
                                  f"values (bc_type=None / 'not-a-knot' is); use "
                                  f"scipy.interpolate.CubicSpline for clamped, natural or "
                                  f"periodic cubic splines")
    x, y = _float(x), _float(y)
    nd = len(_shape(y))
    axis = axis % nd
    if axis != 0:
        y = _o.moveaxis(y, axis, 0) if is_value(y) else np.moveaxis(y, axis, 0)
    if len(_shape(x)) != 1:
        raise ValueError("Expect x to be a 1D strictly increasing sequence.")
    if _shape(x)[0] != _shape(y)[0]:
        raise ValueError(f"Shapes of x {_shape(x)} and y {_shape(y)} are incompatible")
    kx = _known(x)
    if kx is not None:
        if np.any(kx[1:] == kx[:-1]):
            raise ValueError("Expect x to not have duplicates")
        if np.any(kx[1:] < kx[:-1]):
            raise ValueError("Expect x to be a 1D strictly increasing sequence.")
    k = int(k)
    if k < 0:
        raise ValueError("Expect non-negative k.")
    if k == 0 and t is None:
        return BSpline.construct_fast(_cat([x, x[-1:]]), y, 0, True, axis)
    if k == 1 and t is None:
        return BSpline.construct_fast(_cat([x[:1], x, x[-1:]]), y, 1, True, axis)
    t = _not_a_knot(x, k) if t is None else _float(t)
    n = _shape(x)[0]
    nt = _shape(t)[0] - k - 1
    if nt != n:
        raise ValueError(f"The number of derivatives at boundaries does not match: "
                         f"expected {nt - n}, got 0+0")
    kt = _known(t)
    if kt is not None and kx is not None and (kx[0] < kt[k] or kx[-1] > kt[-k]):
        raise ValueError(f"Out of bounds w/ x = {kx}.")
    l = _interval(t, x, k, nt - 1)
    nb = _basis(t, k, x, l)
    cols = np.arange(nt)
    coll = None
    for j in range(k + 1):
        hit = _o.equal(_reshape(l + (j - k), (n, 1)), cols) if is_value(l) else \
            np.equal(np.reshape(l + (j - k), (n, 1)), cols)
        hit = _o.astype(hit, np.float64) if is_value(hit) else hit.astype(np.float64)
        term = _reshape(nb[j], (n, 1)) * hit
        coll = term if coll is None else coll + term
    trail = tuple(_shape(y)[1:])
    p = int(np.prod(trail, dtype=int))
    c = _nan_unless_increasing(_o.solve(coll, _reshape(y, (n, p))), x)
    return BSpline.construct_fast(t, _reshape(c, (nt,) + trail), k, True, axis)


# --- interp1d ------------------------------------------------------------------------------

_KINDS = ("linear", "nearest", "nearest-up", "previous", "next")
_ORDERS = {"zero": 0, "slinear": 1, "quadratic": 2, "cubic": 3}


def _do_extrapolate(fv):
    return isinstance(fv, str) and fv == "extrapolate"


class interp1d(_Unsupported):
    """scipy.interpolate.interp1d."""
    _scipy_name = "scipy.interpolate.interp1d"
    _scipy_class = "interp1d"

    def __init__(self, x, y, kind="linear", axis=-1, copy=True, bounds_error=None,
                 fill_value=np.nan, assume_sorted=False):
        self.bounds_error, self.copy, self._scipy = bounds_error, copy, None
        order = None
        if kind in _ORDERS:
            order, kind = _ORDERS[kind], "spline"
        elif isinstance(kind, (int, np.integer)) and not isinstance(kind, bool):
            order, kind = int(kind), "spline"
        elif kind not in _KINDS:
            raise NotImplementedError(f"{kind} is unsupported: Use fitpack routines for "
                                      f"other types.")
        x, y = _float(x), _float(y)
        nd = len(_shape(y))
        if len(_shape(x)) != 1:
            raise ValueError("the x array must have exactly one dimension.")
        if nd == 0:
            raise ValueError("the y array must have at least one dimension.")
        axis = axis % nd
        if not assume_sorted:
            kx = _known(x)
            ind = np.argsort(kx, kind="mergesort") if kx is not None else _o.argsort(x)
            x = _take(x, ind)
            y = _take(y, ind, axis=axis)
        if _shape(y)[axis] != _shape(x)[0]:
            raise ValueError("x and y arrays must be equal in length along interpolation "
                             "axis.")
        self.axis, self.x, self.y, self._kind = axis, x, y, kind
        self._y = y if axis == 0 else (_o.moveaxis(y, axis, 0) if is_value(y)
                                       else np.moveaxis(y, axis, 0))
        minval = 1 if order is None else order + 1
        if _shape(x)[0] < minval:
            raise ValueError(f"x and y arrays must have at least {minval} entries")
        self._spline = None
        if kind == "spline":
            self._spline = make_interp_spline(x, self._y, k=order)
        if kind in ("previous", "next") and _do_extrapolate(fill_value):
            self._bounds_for_extrapolation()
            fill_value = (np.nan, self._y[-1]) if kind == "previous" else (self._y[0], np.nan)
        self.fill_value = fill_value

    def _bounds_for_extrapolation(self):
        if self.bounds_error:
            raise ValueError("Cannot extrapolate and raise at the same time.")
        self.bounds_error = False

    @property
    def fill_value(self):
        return self._fill_value_orig

    @fill_value.setter
    def fill_value(self, fill_value):
        if _do_extrapolate(fill_value):
            self._bounds_for_extrapolation()
            self._extrapolate = True
        else:
            if isinstance(fill_value, tuple) and len(fill_value) == 2:
                self._below, self._above = _float(fill_value[0]), _float(fill_value[1])
            else:
                self._below = self._above = _float(fill_value)
            self._extrapolate = False
            if self.bounds_error is None:
                self.bounds_error = True
        self._fill_value_orig = fill_value

    def __call__(self, x):
        if self._scipy is not None and not _any_value(x, self.x, self.y):
            return self._scipy(x)
        xq = _float(x)
        xs = _shape(xq)
        flat = _reshape(xq, (-1,))
        xx, yy = self.x, self._y
        n = _shape(xx)[0]
        trail = tuple(_shape(yy)[1:])
        col = (-1,) + (1,) * len(trail)
        kind = self._kind
        if kind == "linear":
            j = _o.searchsorted(xx, flat) if _any_value(xx, flat) else np.searchsorted(xx, flat)
            j = _o.clip(j, 1, n - 1) if is_value(j) else np.clip(j, 1, n - 1)
            x_lo, x_hi = _take(xx, j - 1), _take(xx, j)
            y_lo, y_hi = _take(yy, j - 1), _take(yy, j)
            out = (y_hi - y_lo) / _reshape(x_hi - x_lo, col) * _reshape(flat - x_lo, col) + y_lo
        elif kind in ("nearest", "nearest-up"):
            bds = xx / 2.0
            bds = bds[1:] + bds[:-1]
            side = "left" if kind == "nearest" else "right"
            j = _o.searchsorted(bds, flat, side=side) if _any_value(bds, flat) else \
                np.searchsorted(bds, flat, side=side)
            out = _take(yy, _o.clip(j, 0, n - 1) if is_value(j) else np.clip(j, 0, n - 1))
        elif kind in ("previous", "next"):
            # searchsorted(nextafter(x, -inf), v, 'left') counts x <= v: x's 'right' side
            side = "right" if kind == "previous" else "left"
            j = _o.searchsorted(xx, flat, side=side) if _any_value(xx, flat) else \
                np.searchsorted(xx, flat, side=side)
            if kind == "previous":
                j = _o.clip(j, 1, n) if is_value(j) else np.clip(j, 1, n)
                out = _take(yy, j - 1)
            else:
                j = _o.clip(j, 0, n - 1) if is_value(j) else np.clip(j, 0, n - 1)
                out = _take(yy, j)
        else:
            out = self._spline(flat)
        if not self._extrapolate:
            below, above = flat < xx[0], flat > xx[-1]
            if self.bounds_error:
                self._raise_out_of_bounds(flat, below, above)
            out = _where(_reshape(below, col), self._below,
                         _where(_reshape(above, col), self._above, out))
        out = _reshape(out, tuple(xs) + trail)
        return _place(out, len(xs), self.axis)

    def _raise_out_of_bounds(self, flat, below, above):
        for mask, word, end in ((below, "below", "minimum"), (above, "above", "maximum")):
            if _any_true(mask, self._scipy_name):
                kq, km, kx = _known(flat), _known(mask), _known(self.x)
                v = kq[np.argmax(km)] if kq is not None and km is not None else "?"
                lim = (kx[0] if word == "below" else kx[-1]) if kx is not None else "?"
                raise ValueError(f"A value ({v}) in x_new is {word} the interpolation "
                                 f"range's {end} value ({lim}).")


# --- regular grids -------------------------------------------------------------------------

class RegularGridInterpolator(_Unsupported):
    """scipy.interpolate.RegularGridInterpolator (methods linear and nearest)."""
    _scipy_name = "scipy.interpolate.RegularGridInterpolator"
    _scipy_class = "RegularGridInterpolator"
    _METHODS = ("linear", "nearest")

    def __init__(self, points, values, method="linear", bounds_error=True,
                 fill_value=np.nan, **kwargs):
        for k, v in kwargs.items():
            if k in ("solver", "solver_args") and v is None:
                continue
            raise NotImplementedError(f"{self._scipy_name}({k}=...) is not supported on "
                                      f"tracegrad values")
        self._check_method(method)
        self.method, self.bounds_error, self._scipy = method, bounds_error, None
        values = _float(values)
        grid = []
        for i, p in enumerate(points):
            p = _float(p)
            if len(_shape(p)) != 1:
                raise ValueError(f"The points in dimension {i} must be 1-dimensional")
            kp = _known(p)
            if kp is not None and not np.all(np.diff(kp) > 0):
                if np.all(np.diff(kp) < 0):
                    raise NotImplementedError(
                        f"{self._scipy_name}: descending points in dimension {i} are not "
                        f"supported on tracegrad values; flip them (and the values)")
                raise ValueError(f"The points in dimension {i} must be strictly ascending "
                                 f"or descending")
            if _shape(p)[0] != _shape(values)[i]:
                raise ValueError(f"There are {_shape(p)[0]} points and {_shape(values)[i]} "
                                 f"values in dimension {i}")
            if _shape(p)[0] < 2:
                raise ValueError(f"There are {_shape(p)[0]} points in dimension {i}, but "
                                 f"method {method} requires at least 2 points per dimension.")
            grid.append(p)
        if len(grid) > len(_shape(values)):
            raise ValueError(f"There are {len(grid)} point arrays, but values has "
                             f"{len(_shape(values))} dimensions")
        self.grid, self.values = tuple(grid), values
        self.fill_value = None if fill_value is None else _float(fill_value)

    def _check_method(self, method):
        if method not in self._METHODS:
            if method in ("slinear", "cubic", "quintic", "pchip"):
                raise NotImplementedError(f"{self._scipy_name}(method={method!r}) is not "
                                          f"supported on tracegrad values (linear and "
                                          f"nearest are)")
            raise ValueError(f"Method '{method}' is not defined")

    def __call__(self, xi, method=None, *, nu=None):
        if self._scipy is not None and not _any_value(xi, self.values, *self.grid):
            return self._scipy(xi, method=method) if nu is None else \
                self._scipy(xi, method=method, nu=nu)
        if nu is not None:
            raise NotImplementedError(f"{self._scipy_name}(xi, nu=...) is not supported on "
                                      f"tracegrad values")
        method = self.method if method is None else method
        self._check_method(method)
        ndim = len(self.grid)
        if isinstance(xi, (tuple, list)) and len(xi) == ndim and not \
                np.isscalar(xi[0]) and len(_shape(xi[0])) > 0:
            parts = [_float(v) for v in xi]
            shp = np.broadcast_shapes(*[_shape(v) for v in parts])
            parts = [_o.broadcast_to(v, shp) if is_value(v) else np.broadcast_to(v, shp)
                     for v in parts]
            xi = _o.stack(parts, axis=-1) if _any_value(*parts) else np.stack(parts, -1)
        xi = _float(xi)
        if _shape(xi)[-1] != ndim:
            raise ValueError(f"The requested sample points xi have dimension "
                             f"{_shape(xi)[-1]} but this RegularGridInterpolator has "
                             f"dimension {ndim}")
        lead = tuple(_shape(xi)[:-1])
        flat = _reshape(xi, (-1, ndim))
        trail = tuple(_shape(self.values)[ndim:])
        col = (-1,) + (1,) * len(trail)
        idx, dist, out_of_bounds = [], [], None
        for d, g in enumerate(self.grid):
            xd = flat[:, d]
            m = _shape(g)[0]
            j = _o.searchsorted(g, xd) if _any_value(g, xd) else np.searchsorted(g, xd)
            j = (_o.clip(j - 1, 0, m - 2) if is_value(j) else np.clip(j - 1, 0, m - 2))
            idx.append(j)
            dist.append((xd - _take(g, j)) / (_take(g, j + 1) - _take(g, j)))
            oob = (xd < g[0]) | (xd > g[-1])
            if self.bounds_error and _any_true(oob, self._scipy_name):
                raise ValueError(f"One of the requested xi is out of bounds in dimension {d}")
            out_of_bounds = oob if out_of_bounds is None else out_of_bounds | oob
        shape = _shape(self.values)[:ndim]
        strides = [int(np.prod(shape[d + 1:], dtype=int)) for d in range(ndim)]
        vals = _reshape(self.values, (-1,) + trail)

        def at(indices):
            lin = None
            for d, j in enumerate(indices):
                term = j * strides[d] if strides[d] != 1 else j
                lin = term if lin is None else lin + term
            return _take(vals, lin, axis=0)

        if method == "nearest":
            out = at([_where(dd <= 0.5, j, j + 1) for j, dd in zip(idx, dist)])
        else:
            out = None
            for corner in itertools.product((0, 1), repeat=ndim):
                w = None
                for e, dd in zip(corner, dist):
                    f = dd if e else 1.0 - dd
                    w = f if w is None else w * f
                term = at([j + e if e else j for j, e in zip(idx, corner)]) * \
                    _reshape(w, col)
                out = term if out is None else out + term
        if self.fill_value is not None:
            out = _where(_reshape(out_of_bounds, col), self.fill_value, out)
        for g in self.grid:                 # points not known while tracing: checked here
            if _known(g) is None:
                out = _o.where(_o.all(g[1:] > g[:-1]), out, np.nan)
        return _reshape(out, lead + trail)


def interpn(points, values, xi, method="linear", bounds_error=True, fill_value=np.nan):
    """scipy.interpolate.interpn (methods linear and nearest)."""
    return RegularGridInterpolator(points, values, method=method, bounds_error=bounds_error,
                                   fill_value=fill_value)(xi)


FUNCTIONS = {n: globals()[n] for n in (
    "PPoly", "CubicHermiteSpline", "CubicSpline", "PchipInterpolator", "pchip_interpolate",
    "BSpline", "make_interp_spline", "interp1d", "RegularGridInterpolator", "interpn")}


# --- SciPy's own objects, made outside the differentiated code -----------------------------

def adopt(obj):
    """A stand-in for a SciPy interpolator made from plain arrays (outside the
    function, or inside it on constants): SciPy's object answers plain
    queries; tracegrad values are evaluated here from its coefficients.
    None for an object this module does not know."""
    import sys
    mod = sys.modules.get("scipy.interpolate")
    if mod is None:
        return None
    if isinstance(obj, mod.PPoly):
        mine = _adopted_class(type(obj).__name__, PPoly).construct_fast(
            obj.c, obj.x, obj.extrapolate, getattr(obj, "axis", 0))
    elif isinstance(obj, mod.BSpline):
        mine = _adopted_class(type(obj).__name__, BSpline).construct_fast(
            obj.t, obj.c, obj.k, obj.extrapolate, obj.axis)
    elif isinstance(obj, mod.interp1d):
        kind = obj._kind
        if kind == "spline":
            kind = int(obj._spline.k)
        fill = obj._fill_value_orig
        mine = interp1d(obj.x, obj.y, kind=kind, axis=obj.axis,
                        bounds_error=obj.bounds_error, fill_value=fill, assume_sorted=True)
    elif isinstance(obj, mod.RegularGridInterpolator):
        mine = RegularGridInterpolator(obj.grid, obj.values, method=obj.method,
                                       bounds_error=obj.bounds_error,
                                       fill_value=obj.fill_value)
    else:
        return None
    mine._scipy = obj
    return mine


_ADOPTED = {}


def _adopted_class(name, base):
    """A subclass named as SciPy's (CubicSpline...) for an adopted PPoly / BSpline."""
    if name == base.__name__:
        return base
    got = _ADOPTED.get((name, base))
    if got is None:
        got = _ADOPTED[(name, base)] = type(name, (base,), {
            "_scipy_name": f"scipy.interpolate.{name}", "_scipy_class": name})
    return got
