"""The eager NumPy face (``compile=False``, issue 24 items 2 and 3).

* eager transforms nest to any order, with each other, with compiled
  transforms in both orders, and on torch-face Tensors;
* converting a value being differentiated to a Python number or a plain
  array raises a clear error at the line, unless the result only decides
  control flow;
* the ndarray surface means on the eager NumPy face (and the compiled one)
  what it means on an ndarray, with gradients checked against central
  finite differences in both modes.
"""
import math

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.eager.tensor import ConversionError, NumpyTensor, Tensor

E = dict(compile=False)


def fd_grad(f, x, eps=1e-6):
    """Central finite differences of a scalar function of a float64 array."""
    x = np.array(x, dtype=np.float64)
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[i] += eps
        xm[i] -= eps
        g[i] = (float(f(xp)) - float(f(xm))) / (2 * eps)
    return g


def fd_jac(f, x, eps=1e-6):
    x = np.array(x, dtype=np.float64)
    y = np.asarray(f(x))
    J = np.zeros(y.shape + x.shape)
    for i in np.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[i] += eps
        xm[i] -= eps
        J[(Ellipsis,) + i] = (np.asarray(f(xp)) - np.asarray(f(xm))) / (2 * eps)
    return J


def both(transform, f, **kw):
    """The transform of f compiled and eager."""
    return [transform(f, **kw), transform(f, compile=False, **kw)]


# --- (a) nesting ------------------------------------------------------------------------

def test_grad_of_grad_every_mix_of_modes():
    want = -np.sin(0.5)
    for outer in (True, False):
        for inner in (True, False):
            g = tg.grad(tg.grad(np.sin, compile=inner), compile=outer)(0.5)
            assert np.allclose(g, want), (outer, inner, g)


def test_third_order_eager():
    g3 = tg.grad(tg.grad(tg.grad(np.sin, **E), **E), **E)(0.5)
    assert np.allclose(g3, -np.cos(0.5))


def _f(x):
    return np.sum(np.sin(x) ** 2 * x[::-1]) + np.prod(x)


X = np.array([0.5, 1.0, -0.3])


def test_hessian_and_jacobians_of_gradients_agree_with_compiled_and_fd():
    want = tg.hessian(_f)(X)
    assert np.allclose(want, fd_jac(tg.grad(_f), X), atol=1e-5)
    for h in (tg.hessian(_f, **E)(X),
              tg.jacobian(tg.grad(_f, **E), **E)(X),
              tg.jacfwd(tg.grad(_f, **E), **E)(X),
              tg.jacobian(tg.grad(_f), **E)(X),
              tg.jacobian(tg.grad(_f, **E))(X)):
        assert np.allclose(h, want), h


def test_hessian_of_hessian_eager():
    def s(x):
        return tg.hessian(_f, **E)(x).sum()
    want = fd_jac(tg.grad(lambda x: tg.hessian(_f)(x).sum()), X)
    got = tg.hessian(s, **E)(X)
    assert np.allclose(got, want, atol=1e-4)


def test_value_and_grad_vjp_jvp_nest_inside_eager_grad():
    def through_vag(x):
        v, g = tg.value_and_grad(_f, **E)(x)
        return v + (g * g).sum()

    def through_vjp(x):
        y, back = tg.vjp(lambda x: np.sin(x) * x, x, **E)
        return (back(np.cos(x))[0] * y).sum()

    def through_jvp(x):
        y, t = tg.jvp(lambda x: np.sin(x) * x ** 2, (x,), (x,), **E)
        return (y * t).sum()

    for h in (through_vag, through_vjp, through_jvp):
        want = fd_grad(h, X)
        assert np.allclose(tg.grad(h, **E)(X), want, atol=1e-5), h.__name__


def test_eager_jvp_and_vjp_aux_differentiated_by_an_eager_level():
    def f(x):
        return np.sin(x) * x.sum()
    # d/dt sum(J t) = 1^T J
    got = tg.grad(lambda t: tg.jvp(f, (X,), (t,), **E)[1].sum(), **E)(np.ones(3))
    assert np.allclose(got, tg.jacobian(f)(X).sum(0))

    def g(x):
        return np.sum(np.sin(x)), x * 2

    def h(x):
        y, _, aux = tg.vjp(g, x, has_aux=True, **E)
        return aux.sum() + y
    assert np.allclose(tg.grad(h, **E)(X), 2 + np.cos(X))


def test_nested_eager_through_a_closure():
    # the inner level's function reads the outer level's value
    def outer(y):
        return tg.grad(lambda x: np.sin(x * y), **E)(0.5)
    want = np.cos(1.0) - np.sin(1.0)   # d/dy [y cos(0.5 y)] at y = 2
    assert np.allclose(tg.grad(outer, **E)(2.0), want)


def test_nested_result_that_depends_only_on_its_own_inputs_is_a_constant():
    # the inner gradient is taken at a fixed point: a number for the outer level
    def outer(x):
        k = tg.grad(lambda t: t ** 3, **E)(2.0)
        assert not getattr(k, "requires_grad", False)
        return x * float(k)
    assert tg.grad(outer, **E)(0.5) == 12.0


def test_eager_inside_compiled_closure_is_a_clear_error():
    def outer(y):
        return tg.grad(lambda x: np.sin(x * y), **E)(0.5)
    with pytest.raises(TypeError, match="closure variable"):
        tg.grad(outer)(2.0)


def test_top_level_eager_results_are_plain_arrays():
    g = tg.grad(_f, **E)(X)
    assert type(g) is np.ndarray and np.allclose(g, tg.grad(_f)(X))
    h = tg.hessian(_f, **E)(X)
    assert type(h) is np.ndarray


def test_torch_face_tensors_keep_torch_meaning_in_eager_mode():
    import tracegrad as torch
    t = torch.tensor([0.5, 1.0, 4.0])
    for g in both(tg.grad, lambda v: v.std()):
        out = g(t)
        assert isinstance(out, Tensor) and not isinstance(out, NumpyTensor)
        # torch's std is unbiased
        want = fd_grad(lambda a: np.std(a, ddof=1), t.numpy())
        assert np.allclose(out.detach().numpy(), want, atol=1e-6)


def test_eager_gradient_of_tensor_that_requires_grad_stays_on_the_tape():
    import tracegrad as torch
    t = torch.tensor([0.5, 1.0], requires_grad=True)
    for g in both(tg.grad, lambda v: (v ** 3).sum()):
        d = g(t)
        assert d.requires_grad
        (h,) = torch.autograd.grad(d.sum(), t)
        assert np.allclose(h.numpy(), 6 * t.detach().numpy())


def test_numpy_face_values_keep_the_face_through_detach():
    x = NumpyTensor(np.array([1.0, 2.0, 4.0]), requires_grad=True)
    d = x.detach()
    assert type(d) is NumpyTensor and not d.requires_grad
    assert np.isclose(float(d.std()), np.std([1.0, 2.0, 4.0]))   # NumPy's ddof=0


# --- (b) conversions --------------------------------------------------------------------

def _raises_at(fn, x, what):
    with pytest.raises((ConversionError, SystemError)) as info:
        tg.grad(fn, **E)(x)
    err = info.value
    if isinstance(err, SystemError):
        # a C library that calls float() without checking for an error
        # (scipy's brentq on a cold start) reports ours as the cause
        err = err.__cause__ or err.__context__
    assert isinstance(err, ConversionError)
    msg = str(err)
    assert what in msg and __file__ in msg and "detach()" in msg
    return msg


def test_conversions_of_differentiated_values_raise_at_the_line():
    def f_float(x):
        return x + float(x)
    msg = _raises_at(f_float, 0.7, "float()")
    assert "return x + float(x)" in msg

    def f_int(x):
        return x * int(x)
    _raises_at(f_int, 2.5, "int()")

    def f_complex(x):
        return x * complex(x).real
    _raises_at(f_complex, 2.5, "complex()")

    def f_item(x):
        return x + x.item()
    _raises_at(f_item, 0.7, ".item()")

    def f_tolist(x):
        return x.sum() + sum(x.tolist())
    _raises_at(f_tolist, np.ones(2), ".tolist()")

    def f_math(x):
        return math.sin(x)
    _raises_at(f_math, 0.7, "float()")

    def f_array(x):      # np.asarray in the user's code is the value itself
        return np.sum(np.asarray(x) * x)
    np.testing.assert_allclose(tg.grad(f_array, **E)(np.ones(2)), [2.0, 2.0])

    def f_foreign(x):    # a conversion NumPy makes without dispatch (x.__array__)
        return np.sum(x.__array__() * x)
    _raises_at(f_foreign, np.ones(2), "conversion to a NumPy array")


def test_scipy_code_tracegrad_cannot_see_is_refused_not_zero():
    scipy_optimize = pytest.importorskip("scipy.optimize")
    scipy_integrate = pytest.importorskip("scipy.integrate")

    import sys

    def minimum(x):
        return scipy_optimize.linprog(x * np.array([1.0, 2.0]), bounds=[(0, 1), (0, 1)]).x[0]

    def integral(x):
        return scipy_integrate.fixed_quad(lambda t: x * t, 0, 1)[0]
    # SciPy named by the function: refused by name before SciPy converts anything
    # (tracegrad/frontend/scipy_calls.py; brentq and quad themselves are differentiated there)
    for f, name in ((minimum, r"scipy\.optimize\.linprog"),
                    (integral, r"scipy\.integrate\.fixed_quad")):
        with pytest.raises(NotImplementedError, match=name):
            tg.grad(f, **E)(0.7)

    def hidden_root(x):   # SciPy reached where tracegrad cannot see: its conversion is refused
        return sys.modules["scipy.optimize"].brentq(lambda t: t - x, -3, 3)
    # brentq's C code calls float() and, once refused, may call f again with
    # the error pending: what surfaces is ours, a SystemError around it, or a
    # TypeError of the next call; never a number
    with pytest.raises((TypeError, SystemError)) as info:
        tg.grad(hidden_root, **E)(0.7)
    err = info.value
    if isinstance(err, ConversionError):
        assert "float()" in str(err) and "inside a library called from" in str(err)


PLAIN_Y = np.zeros(2)


def test_store_into_plain_array_is_refused():
    def f(x):
        PLAIN_Y[0] = np.max(x)       # a global: an array tracegrad does not follow
        return PLAIN_Y.sum()
    with pytest.raises(TypeError) as info:
        tg.grad(f, **E)(np.array([0.7, 0.2]))
    err = info.value
    assert "into a plain NumPy array" in str(err)
    assert "PLAIN_Y[0] = np.max(x)" in str(err)
    np.testing.assert_array_equal(PLAIN_Y, 0.0)

    def g(x):                        # an array the function creates: NumPy's meaning
        Y = np.zeros(2)
        Y[0] = np.max(x)
        return Y.sum()
    np.testing.assert_allclose(tg.grad(g, **E)(np.array([0.7, 0.2])), [1.0, 0.0])


def test_conversions_that_only_decide_control_flow_are_allowed():
    def f_if(x):
        if float(x) > 0.5:
            return x * 2
        return x * 3

    def f_while(x):
        y = x
        while y.item() > 0.1:
            y = y / 2
        return y

    def f_bool(x):
        return x * 2 if x else x

    def f_cmp_name(x):
        tol = 0.5
        if x.item() < tol:
            return x
        return x ** 2

    assert tg.grad(f_if, **E)(0.7) == 2.0 and tg.grad(f_if, **E)(0.2) == 3.0
    assert np.allclose(tg.grad(f_while, **E)(0.7), 0.125)
    assert tg.grad(f_bool, **E)(0.7) == 2.0
    assert np.allclose(tg.grad(f_cmp_name, **E)(0.7), 1.4)


def test_values_not_differentiated_convert_freely():
    def f(x):
        k = int(np.argmax(x))                     # an integer result
        c = float(x.detach()[0])                  # detached
        s = float(tg.stop_gradient(x)[1] * 0 + tg.stop_gradient(x).sum())
        _ = (x > 0).tolist(), f"{x[0]:.3f}", repr(x), str(x)   # printing is fine
        return (x * k).sum() + c + 0 * s
    g = tg.grad(f, **E)(np.array([0.7, 0.9]))
    assert np.allclose(g, [1.0, 1.0])

    def h(x, y):    # y is not differentiated: its conversions are fine
        return x * float(y) + y.item()
    assert tg.grad(h, **E)(0.5, np.array(3.0)) == 3.0


def test_compiled_mode_refuses_the_same_conversions():
    with pytest.raises(TypeError, match="float"):
        tg.grad(lambda x: x + float(x))(0.7)


def test_torch_face_tensors_convert_as_in_torch():
    import tracegrad as torch
    t = torch.tensor([0.5], requires_grad=True)
    assert float(t) == 0.5 and t.item() == 0.5
    g = tg.grad(lambda v: v.sum() * float(v), **E)(torch.tensor([2.0]))
    assert np.allclose(g.numpy(), [2.0])   # torch's meaning: float() is a constant


# --- (c) the ndarray surface ------------------------------------------------------------

rng = np.random.default_rng(24)
A = rng.standard_normal((3, 4))
CPLX = A + 1j * rng.standard_normal((3, 4))

# name -> (function, differentiable)
SURFACE = {
    "copy": (lambda x: x.copy(), True),
    "compress": (lambda x: x.compress([True, False, True], axis=1), True),
    "compress_flat": (lambda x: x.compress([True, False, True]), True),
    "diagonal": (lambda x: x.diagonal(1), True),
    "diagonal_axes": (lambda x: x.diagonal(-1, 1, 0), True),
    "searchsorted": (lambda x: np.sort(x.ravel()).searchsorted(np.array([0.0, 0.5])), False),
    "clip": (lambda x: x.clip(-0.5, 0.5), True),
    "clip_min": (lambda x: x.clip(min=-0.5), True),
    "cumsum": (lambda x: x.cumsum(), True),
    "cumsum_axis": (lambda x: x.cumsum(1), True),
    "cumsum_dtype": (lambda x: x.cumsum(0, np.float32), False),
    "cumprod": (lambda x: x.cumprod(axis=0), True),
    "round": (lambda x: x.round(2), False),
    "trace": (lambda x: x.trace(), True),
    "trace_offset": (lambda x: x.trace(1), True),
    "trace_axes": (lambda x: x.trace(0, 1, 0), True),
    "swapaxes": (lambda x: x.swapaxes(0, 1), True),
    "ravel": (lambda x: x.ravel(), True),
    "ravel_F": (lambda x: x.ravel("F"), True),
    "dot": (lambda x: x.dot(x.T), True),
    "argsort": (lambda x: x.argsort(), False),
    "argsort_axis": (lambda x: x.argsort(axis=0, kind="stable"), False),
    "argpartition": (lambda x: np.take_along_axis(x, x.argpartition(1, axis=1), 1)[:, 1], True),
    "partition": (lambda x: (lambda y: (y.partition(1, axis=0), y)[1][1])(x * 1.0), True),
    "sort": (lambda x: (lambda y: (y.sort(axis=0), y)[1])(x * 1.0), True),
    "all": (lambda x: (x > 0).all(), False),
    "any": (lambda x: (x > 0).any(axis=1), False),
    "all_keepdims": (lambda x: (x > 0).all(0, keepdims=True), False),
    "astype": (lambda x: x.astype(np.float32), False),
    "view": (lambda x: x.view(), True),
    "T": (lambda x: x.T, True),
    "mT": (lambda x: x.mT, True),
    "max": (lambda x: x.max(axis=1), True),
    "min": (lambda x: x.min(0, keepdims=True), True),
    "mean_dtype": (lambda x: x.mean(axis=0, dtype=np.float32), False),
    "std": (lambda x: x.std(ddof=1), True),
    "var": (lambda x: x.var(axis=1), True),
    "prod": (lambda x: x.prod(axis=1), True),
    "argmax": (lambda x: x.argmax(axis=1), False),
    "take": (lambda x: x.take([0, 2], axis=1), True),
    "take_flat": (lambda x: x.take([0, 5]), True),
    "repeat": (lambda x: x.repeat(2, axis=0), True),
    "repeat_flat": (lambda x: x.repeat(2), True),
    "reshape_F": (lambda x: x.reshape((4, 3), order="F"), True),
    "transpose": (lambda x: x.transpose(1, 0), True),
    "flatten_F": (lambda x: x.flatten("F"), True),
    "squeeze": (lambda x: x[None].squeeze(0), True),
    "flat": (lambda x: x.flat[5], True),
    "nbytes_itemsize": (lambda x: x * (x.nbytes + x.itemsize + x.ndim + x.size), True),
    "to_device": (lambda x: x.to_device("cpu"), True),
    "divmod": (lambda x: divmod(x, 0.7)[1], True),
}


def _same(want, got):
    got = np.asarray(getattr(got, "_data", got))
    want = np.asarray(want)
    return want.shape == got.shape and want.dtype == got.dtype and np.allclose(want, got)


@pytest.mark.parametrize("name", sorted(SURFACE))
def test_ndarray_surface_values_and_gradients(name):
    fn, diff = SURFACE[name]
    want = fn(A.copy())
    eager = fn(NumpyTensor(A.copy()))
    assert _same(want, eager), (want, eager)
    assert _same(want, tg.compile(fn)(A.copy()))
    if diff:
        w = np.linspace(-1.0, 1.0, np.size(want)).reshape(np.shape(want))

        def loss(x):
            return np.sum(fn(x) * w)
        fd = fd_grad(loss, A)
        for g in both(tg.grad, loss):
            assert np.allclose(g(A.copy()), fd, atol=1e-5), name


@pytest.mark.parametrize("name", ["real", "imag", "conj", "conjugate"])
def test_complex_parts(name):
    def fn(x):
        v = getattr(x, name)
        return v() if callable(v) else v
    want = fn(CPLX)
    assert _same(want, fn(NumpyTensor(CPLX.copy())))
    assert _same(want, tg.compile(fn)(CPLX))


def test_choose():
    idx = np.array([0, 1, 1, 0])
    for mode in ("raise", "wrap", "clip"):
        want = idx.choose([A[0], A[1]], mode=mode)
        got = NumpyTensor(idx).choose([NumpyTensor(A[0]), NumpyTensor(A[1])], mode=mode)
        assert _same(want, got)
        if mode != "raise":
            assert _same(want, tg.compile(lambda i, a: i.choose([a[0], a[1]], mode=mode))(idx, A))
    with pytest.raises(ValueError, match="invalid entry"):
        NumpyTensor(idx + 1).choose([NumpyTensor(A[0]), NumpyTensor(A[1])])
    # a traced index cannot be checked: mode='raise' says what to write
    with pytest.raises(TypeError, match="mode='clip'"):
        tg.compile(lambda i, a: i.choose([a[0], a[1]]))(idx, A)

    def loss(a):
        return np.sum(NumpyTensor(idx).choose([a[0], a[1]], mode="clip") * A[2])
    fd = fd_grad(lambda a: np.sum(idx.choose([a[0], a[1]]) * A[2]), A)
    assert np.allclose(tg.grad(loss, **E)(A), fd, atol=1e-6)


def test_conversions_of_values_not_differentiated_mean_numpy():
    x = NumpyTensor(A.copy())
    assert x.tolist() == A.tolist()
    assert x.item(5) == A.item(5)
    assert x.tobytes() == A.tobytes()
    assert (x > 0).nonzero()[1].tolist() == (A > 0).nonzero()[1].tolist()
    assert bool(NumpyTensor(np.array(1.0))) and not NumpyTensor(np.array(0.0))
    with pytest.raises(ValueError, match="truth value"):
        bool(x)
    with pytest.raises(TypeError, match="0-d"):
        iter(NumpyTensor(np.array(1.0)))
    assert x.device == "cpu"
    assert x.__array_namespace__() is np
    with pytest.raises(ValueError, match="size 1"):
        x.item()


def test_contains_means_any_equal():
    x = NumpyTensor(A.copy())
    assert (A[1, 2] in x) is True and (12345.0 in x) is False

    def f(v):
        return v * 2 if A[0, 0] in v else v
    assert np.allclose(tg.grad(lambda v: f(v).sum(), **E)(A), 2.0)


def test_copy_module_copies_stay_on_the_tape():
    import copy

    def f(x):
        return (copy.copy(x * 1.0) ** 2).sum() + (copy.deepcopy(x) ** 3).sum()
    want = fd_grad(f, X)
    assert np.allclose(tg.grad(f, **E)(X), want, atol=1e-6)
    assert np.allclose(tg.grad(lambda x: (copy.copy(x * 1.0) ** 2).sum())(X), 2 * X)


def test_differentiated_tobytes_is_refused():
    with pytest.raises(ConversionError, match="tobytes"):
        tg.grad(lambda x: x.sum() + len(x.tobytes()), **E)(A)


@pytest.mark.parametrize("name", ["strides", "base", "flags", "ctypes", "byteswap", "dumps",
                                  "tofile", "getfield", "setflags"])
def test_layout_and_byte_methods_are_refused_with_advice(name):
    x = NumpyTensor(A.copy())
    with pytest.raises(AttributeError, match="NumPy"):
        getattr(x, name)
    seen = []

    def f(v):
        try:
            getattr(v, name)
        except AttributeError as e:
            seen.append(str(e))
        return v.sum()
    tg.grad(f)(A)
    assert seen and "NumPy" in seen[0]


def test_bitwise_operators_on_integers_are_refused_not_logical():
    i = NumpyTensor(np.array([1, 2, 3]))
    for op in (lambda v: v & 3, lambda v: 3 | v, lambda v: v ^ 1, lambda v: ~v):
        with pytest.raises(TypeError, match="booleans only"):
            op(i)
        with pytest.raises(TypeError, match="booleans only"):
            tg.compile(op)(np.array([1, 2, 3]))
    b = NumpyTensor(np.array([True, False, True]))
    assert (b & ~b).tolist() == [False, False, False]
    assert ((b | True) ^ b).tolist() == [False, True, False]
