"""Two dialects: every name whose meaning differs between NumPy and torch,
run on a traced value, an eager value and the reference library, comparing
values, shapes, dtypes, returned structure and gradients."""
from __future__ import annotations

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.eager.tensor import NumpyTensor

try:
    import torch
except ImportError:  # the torch column runs where torch is importable
    torch = None

rng = np.random.default_rng(7)
X = rng.standard_normal((3, 4))


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACEGRAD_CACHE_DIR", str(tmp_path / "cache"))


def _plain(v):
    if isinstance(v, (tuple, list)):
        return type(v), tuple(_plain(e) for e in v)
    if hasattr(v, "grad_fn"):
        v = v.detach().numpy() if v.requires_grad else v.numpy()
    if hasattr(v, "numpy") and type(v).__module__.startswith("torch"):
        v = v.detach().numpy()
    return np.asarray(v) if not isinstance(v, (int, float, bool)) else v


def _same(got, want, what):
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want[1]), what
        for g, w in zip(got[1], want[1]):
            _same(g, w, what)
        return
    if isinstance(want, (int, bool)) and not isinstance(want, np.ndarray):
        assert got == want and type(got) is type(want), what
        return
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12, err_msg=what)


# --- the NumPy face ------------------------------------------------------------------------

def _sorted_in_place(x):
    y = x * 1.0
    r = y.sort(axis=1)
    assert r is None
    return y


NUMPY_CASES = {
    "std()": lambda x: x.std(),
    "std(axis=0)": lambda x: x.std(axis=0),
    "var(1, ddof=1)": lambda x: x.var(1, ddof=1),
    "max(axis=1)": lambda x: x.max(axis=1),
    "min(0, keepdims)": lambda x: x.min(0, keepdims=True),
    "max()": lambda x: x.max(),
    "x / size": lambda x: x / x.size,
    "repeat(2, axis=0)": lambda x: x.repeat(2, axis=0),
    "repeat(2)": lambda x: x.repeat(2),
    "transpose()": lambda x: x.transpose(),
    "transpose(1, 0)": lambda x: x.transpose(1, 0),
    "transpose((1, 0))": lambda x: x.transpose((1, 0)),
    "flatten()": lambda x: x.flatten(),
    "flatten('F')": lambda x: x.flatten("F"),
    "ravel('F')": lambda x: x.ravel("F"),
    "reshape(order=F)": lambda x: x.reshape((6, 2), order="F"),
    "np.reshape F": lambda x: np.reshape(x, (2, 6), order="F"),
    "view()": lambda x: x.view() * 2,
    "squeeze(0)": lambda x: x[None].squeeze(0),
    "sort in place": _sorted_in_place,
    "argsort(axis=0)": lambda x: x.argsort(axis=0),
    "argmax(axis=1)": lambda x: x.argmax(axis=1),
    "T": lambda x: x.T,
    "real / imag": lambda x: x.real + x.imag,
    "nbytes": lambda x: x.nbytes,
    "itemsize": lambda x: x.itemsize,
    "size": lambda x: x.size,
    "flat[...]": lambda x: x.flat[[0, 5, 11]] * 2.0,
    "ndim": lambda x: x.ndim,
    "round(1)": lambda x: x.round(1),
    "cumsum(axis=0)": lambda x: x.cumsum(axis=0),
    "diagonal(1)": lambda x: x.diagonal(1),
    "trace()": lambda x: x.trace(),
    "take(axis=1)": lambda x: x.take([0, 2, 2], axis=1),
    "clip": lambda x: x.clip(-0.5, 0.5),
    "np.std": lambda x: np.std(x, axis=1),
    "np.max": lambda x: np.max(x, axis=0),
    "np.split": lambda x: np.split(x, 2, axis=1),
    "np.transpose": lambda x: np.transpose(x, (1, 0)),
    "sum(0, float32)": lambda x: x.sum(0, np.float32),
    "np.sum keepdims 5th": lambda x: np.sum(x, 1, None, None, True),
    "argmax(1, keepdims)": lambda x: x.argmax(1, keepdims=True),
    "mean(0, None, None, True)": lambda x: x.mean(0, None, None, True),
}
_NO_ARRAY = {"nbytes", "itemsize", "size", "ndim"}   # Python ints: nothing to trace


@pytest.mark.parametrize("name", list(NUMPY_CASES))
def test_numpy_face_values_traced_and_eager(name):
    f = NUMPY_CASES[name]
    want = _plain(f(X.copy()))
    eager = f(NumpyTensor(X.copy(), requires_grad=True))
    _same(_plain(eager), want, f"eager {name}")
    if name not in _NO_ARRAY:
        _same(_plain(tg.compile(f)(X.copy())), want, f"compiled {name}")


@pytest.mark.parametrize("name", [n for n in NUMPY_CASES if n not in _NO_ARRAY
                                  and not n.startswith(("argsort", "argmax", "sum(0, float32)"))])
def test_numpy_face_gradients_compiled_eager_and_fd(name):
    f = NUMPY_CASES[name]

    def loss(x):
        out = f(x)
        outs = out if isinstance(out, (list, tuple)) else (out,)
        return sum(np.sum(o * np.cos(np.arange(np.size(o)).reshape(np.shape(o)))) for o in outs)

    g_compiled = tg.grad(loss)(X.copy())
    g_eager = tg.grad(loss, compile=False)(X.copy())
    np.testing.assert_allclose(g_eager, g_compiled, rtol=1e-12, atol=1e-12)
    eps = 1e-6
    fd = np.zeros_like(X)
    for i in np.ndindex(X.shape):
        d = np.zeros_like(X)
        d[i] = eps
        fd[i] = (loss(X + d) - loss(X - d)) / (2 * eps)
    np.testing.assert_allclose(g_compiled, fd, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("call, advice", [
    (lambda x: x.numel(), "x.size"), (lambda x: x.dim(), "x.ndim"),
    (lambda x: x.split(2), "np.split"), (lambda x: x.view(np.int64), "astype"),
])
def test_numpy_face_names_it_cannot_honour_say_what_to_write(call, advice):
    for value in (NumpyTensor(X.copy()),):
        with pytest.raises((AttributeError, TypeError), match=advice):
            call(value)
    with pytest.raises((AttributeError, TypeError), match=advice):
        tg.compile(call)(X.copy())


def test_numpy_face_in_place_sort_through_a_view_writes_into_its_base():
    def f(x):
        y = x * 1.0
        y[0].sort()
        y.T[1, 1:] = -1.0      # a write through a transposed view
        return y
    np.testing.assert_allclose(tg.compile(f)(X.copy()), f(X.copy()))
    np.testing.assert_allclose(tg.grad(lambda x: (f(x) ** 2).sum())(X.copy()),
                               tg.grad(lambda x: (f(x) ** 2).sum(), compile=False)(X.copy()))


# --- the torch face ------------------------------------------------------------------------

def _t(x):
    return tg.tensor(x)


TORCH_CASES = {
    "std()": lambda m, t: t.std(),
    "std(0)": lambda m, t: t.std(0),
    "var(1, unbiased=False)": lambda m, t: t.var(1, unbiased=False),
    "max()": lambda m, t: t.max(),
    "max(1)": lambda m, t: t.max(1),
    "min(0, keepdim)": lambda m, t: t.min(0, keepdim=True),
    "repeat(2, 1)": lambda m, t: t.repeat(2, 1),
    "transpose(0, 1)": lambda m, t: t.transpose(0, 1),
    "flatten()": lambda m, t: t.flatten(),
    "view(4, 3)": lambda m, t: t.view(4, 3),
    "sort(1)": lambda m, t: t.sort(1),
    "squeeze(0)": lambda m, t: t.squeeze(0),
    "split(1, dim=1)": lambda m, t: m.split(t, 1, dim=1),
    "split([1, 3], 1)": lambda m, t: t.split([1, 3], 1),
    "m.std": lambda m, t: m.std(t),
    "m.var(dim=0)": lambda m, t: m.var(t, dim=0),
    "m.max(t, 1)": lambda m, t: m.max(t, 1),
    "m.min(t, t * 0)": lambda m, t: m.min(t, t * 0),
    "m.transpose": lambda m, t: m.transpose(t, 0, 1),
    "m.sort": lambda m, t: m.sort(t, 0, descending=True),
    "m.squeeze": lambda m, t: m.squeeze(t, 1),
    "m.norm(t, 1)": lambda m, t: m.norm(t, 1),
    "topk(2)": lambda m, t: t.topk(2),
    "topk(2, 0, largest=False)": lambda m, t: m.topk(t, 2, 0, largest=False),
    "kthvalue(2, 1)": lambda m, t: t.kthvalue(2, 1),
    "median()": lambda m, t: t.median(),
    "median(0)": lambda m, t: m.median(t, 0),
    "median(1, keepdim)": lambda m, t: t.median(1, keepdim=True),
    "m.sum(t, 1, True)": lambda m, t: m.sum(t, 1, True),
    "t.mean(1, True)": lambda m, t: t.mean(1, True),
    "m.prod(t, 0, True)": lambda m, t: m.prod(t, 0, True),
    "t.amax(0, True)": lambda m, t: t.amax(0, True),
    "m.argmax(t, 1, True)": lambda m, t: m.argmax(t, 1, True),
    "t.argmin(0, True)": lambda m, t: t.argmin(0, True),
    "m.all(t > 0, 1, True)": lambda m, t: m.all(t > 0, 1, True),
    "m.cross default dim": lambda m, t: m.cross(t[:3, :3], t[:3, 1:4] * 2),
}
TORCH_SIZES = {"size()": lambda t: t.size(), "size(1)": lambda t: t.size(1),
               "numel()": lambda t: t.numel(), "dim()": lambda t: t.dim()}


def _torch_plain(v):
    if hasattr(v, "_fields"):            # a named tuple (values, indices)
        return tuple, tuple(_torch_plain(e) for e in v)
    if isinstance(v, (tuple, list)):
        return tuple, tuple(_torch_plain(e) for e in v)
    return _plain(v)


@pytest.mark.parametrize("name", list(TORCH_CASES))
def test_torch_face_eager_and_traced_agree(name):
    f = TORCH_CASES[name]
    eager = f(tg, _t(X.copy()))
    traced = tg.compile(lambda t: f(tg, t))(_t(X.copy()))
    _same_structure(_torch_plain(traced), _torch_plain(eager), name)


def _same_structure(got, want, what):
    if isinstance(want, tuple) and len(want) == 2 and want[0] is tuple:
        assert isinstance(got, tuple) and got[0] is tuple and len(got[1]) == len(want[1]), what
        for g, w in zip(got[1], want[1]):
            _same_structure(g, w, what)
        return
    _same(got, want, what)


@pytest.mark.skipif(torch is None, reason="torch is not importable here")
@pytest.mark.parametrize("name", list(TORCH_CASES))
def test_torch_face_matches_torch(name):
    f = TORCH_CASES[name]
    ours = _torch_plain(f(tg, _t(X.copy())))
    theirs = _torch_plain(f(torch, torch.tensor(X.copy())))
    _same_structure(ours, theirs, name)


@pytest.mark.parametrize("name", list(TORCH_SIZES))
def test_torch_face_sizes(name):
    f = TORCH_SIZES[name]
    want = {"size()": (3, 4), "size(1)": 4, "numel()": 12, "dim()": 2}[name]
    assert tuple(f(_t(X))) == tuple(np.atleast_1d(want)) if name == "size()" else f(_t(X)) == want
    if torch is not None:
        got = f(torch.tensor(X))
        assert (tuple(got) if name == "size()" else got) == want


@pytest.mark.parametrize("name", [n for n in TORCH_CASES if "sort" not in n
                                  and not n.startswith(("m.argmax", "t.argmin", "m.all"))])
def test_torch_face_gradients_eager_and_traced(name):
    f = TORCH_CASES[name]

    def loss(m, t):
        out = f(m, t)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        return sum((o * o).sum() for o in outs
                   if (o.dtype.is_floating_point if m is torch else np.dtype(o.dtype).kind == "f"))

    t = tg.tensor(X.copy(), requires_grad=True)
    loss(tg, t).backward()
    eager = t.grad.numpy()
    compiled = tg.grad(lambda x: loss(tg, x))(tg.tensor(X.copy()))
    np.testing.assert_allclose(_plain(compiled), eager, rtol=1e-12, atol=1e-12)
    if torch is not None:
        tt = torch.tensor(X.copy(), requires_grad=True)
        loss(torch, tt).backward()
        np.testing.assert_allclose(eager, tt.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_a_traced_value_takes_the_face_of_its_argument():
    def f(x):
        return x.std()
    np.testing.assert_allclose(tg.compile(f)(X), X.std())                      # ndarray: NumPy
    np.testing.assert_allclose(tg.compile(f)(_t(X)).numpy(), X.std(ddof=1))   # Tensor: torch


def test_numpy_code_with_value_dependent_control_flow_differentiates_eagerly():
    def newton_sqrt(a):
        x = a
        step = 1.0
        while np.max(abs(step)) > 1e-13:
            step = (x * x - a) / (2 * x)
            x = x - step
        return x

    def f(x):
        if x.sum() > 0:
            return np.sum(np.sin(x) * x.std())
        return np.sum(newton_sqrt(x * x + 1.0))

    assert tg.grad(newton_sqrt, compile=False)(2.0) == pytest.approx(0.5 / np.sqrt(2), rel=1e-12)
    for x in (np.array([0.3, 0.5, -0.1]), np.array([-0.3, -0.5, 0.1])):
        g = tg.grad(f, compile=False)(x)
        eps = 1e-6
        fd = [(f(x + eps * e) - f(x - eps * e)) / (2 * eps) for e in np.eye(3)]
        np.testing.assert_allclose(g, fd, rtol=1e-6)
    # compiled, the if and the while become cond and while nodes: the same gradient
    for x in (np.array([0.3, 0.5, -0.1]), np.array([-0.3, -0.5, 0.1])):
        np.testing.assert_allclose(tg.grad(f, fallback=False)(x), tg.grad(f, compile=False)(x),
                                   rtol=1e-12)
    v, g = tg.value_and_grad(f, compile=False)(np.array([0.3, 0.5, -0.1]))
    assert v == pytest.approx(f(np.array([0.3, 0.5, -0.1])))
    h = tg.hessian(lambda x: np.sum(np.sin(x) * x.max()), compile=False)(np.array([.3, .5, -.1]))
    np.testing.assert_allclose(h, tg.hessian(lambda x: np.sum(np.sin(x) * x.max()))(
        np.array([.3, .5, -.1])), rtol=1e-12)


def test_eager_numpy_face_refuses_conversion_that_would_drop_the_gradient():
    def f(x):           # np.asarray in the function's own code is the value itself
        return np.sum(np.asarray(x) * x)
    np.testing.assert_allclose(tg.grad(f, compile=False)(np.ones(3)), [2.0, 2.0, 2.0])

    def g(x):           # a conversion NumPy makes without dispatch
        return np.sum(x.__array__() * x)
    with pytest.raises(TypeError, match="conversion to a NumPy array"):
        tg.grad(g, compile=False)(np.ones(3))


def test_vjp_and_jvp_without_compiling_match_the_compiled_ones():
    def branchy(x, y):
        if x.sum() > 0:
            return np.sin(x) * y, x.max()
        return x * y, x.min()

    def straight(x, y):
        return np.sin(x) * y, x.max()

    x, y = np.array([.3, .5, -.1]), np.array([1., 2., 3.])
    out, vjp_fn = tg.vjp(branchy, x, y, compile=False)
    out_c, vjp_c = tg.vjp(straight, x, y)
    ct = (np.linspace(0.5, 1.5, 3), 2.0)
    for a, b in zip(vjp_fn(ct), vjp_c(ct)):
        np.testing.assert_allclose(a, b, rtol=1e-13)
    t = (np.array([1., -1., .5]), np.array([.2, 0., 1.]))
    (o, to), (oc, tc) = tg.jvp(branchy, (x, y), t, compile=False), tg.jvp(straight, (x, y), t)
    for a, b in zip(to, tc):
        np.testing.assert_allclose(a, b, rtol=1e-13)
    np.testing.assert_allclose(tg.jacobian(branchy, argnums=(0, 1), compile=False)(x, y)[0][1],
                               tg.jacobian(straight, argnums=(0, 1))(x, y)[0][1], rtol=1e-13)


def test_torch_equal_allclose_isclose_are_torchs():
    # torch.equal is ONE bool (torch.eq and == compare elementwise); NumPy's
    # np.equal stays elementwise
    a = tg.tensor([1.0, 2.0, float("inf")], dtype=tg.float64)
    b = tg.tensor([1.0, 2.0 + 1e-7, float("inf")], dtype=tg.float64)
    assert tg.equal(a, a) is True and a.equal(a.clone()) is True
    assert tg.equal(a, b) is False and tg.equal(a, tg.tensor([1.0, 2.0])) is False
    assert tg.allclose(a, b) is True and a.allclose(b) is True
    assert tg.allclose(a, b, rtol=0, atol=1e-9) is False
    np.testing.assert_array_equal(tg.isclose(a, b, rtol=0, atol=1e-9).numpy(), [True, False, True])
    n = tg.tensor([float("nan")])
    assert tg.allclose(n, n) is False and tg.allclose(n, n, equal_nan=True) is True
    np.testing.assert_array_equal(np.equal(np.array([1.0, 2.0]), np.array([1.0, 3.0])),
                                  [True, False])


# --- sorting: equal elements in each library's own order ----------------------------------

TIES = np.random.default_rng(11).integers(0, 5, 300).astype(np.float64)
SIGNED_ZEROS = np.random.default_rng(12).choice(np.array([0.0, -0.0, 1.0]), 300)
WITH_NAN = np.where(TIES == 4, np.nan, TIES)
SORT_KINDS = [{}, {"kind": "quicksort"}, {"kind": "heapsort"}, {"kind": "stable"},
              {"kind": "mergesort"}, {"kind": "q"}, {"stable": True}, {"stable": False}]


def _numpy_sorts(x, kw):
    y = x[::-1] * 3.0                       # what the indices select
    return np.argsort(x, **kw), np.sort(x, **kw), y[np.argsort(x, **kw)], x.argsort(**kw)


@pytest.mark.parametrize("kw", SORT_KINDS, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items())
                         or "default")
@pytest.mark.parametrize("mode", ["numpy", "native", "eager"])
def test_numpy_sort_and_argsort_order_ties_as_numpy_does(kw, mode):
    # NumPy's default sort is not stable: with ties its indices (and the
    # order of -0.0 and 0.0) differ from a stable sort's, so tracegrad calls
    # NumPy with the kind the code asked for
    def f(x):
        return _numpy_sorts(x, kw)
    for x in (TIES, SIGNED_ZEROS, WITH_NAN):
        want = f(x)
        got = f(NumpyTensor(x, requires_grad=True)) if mode == "eager" else \
            tg.compile(f, backend=mode)(x)
        for g, w in zip(got, want):
            g = _plain(g)
            assert g.dtype == w.dtype
            np.testing.assert_array_equal(g, w)
            np.testing.assert_array_equal(np.signbit(g), np.signbit(w))


def test_numpy_sort_gradient_with_its_default_kind():
    # the gradient's permutation is the same kind's: tied elements may swap
    # places, any such order is a valid gradient; distinct values: exact
    x = np.random.default_rng(3).standard_normal(50)
    w = np.random.default_rng(4).permutation(50) - 10.0   # unsorted, with a zero
    for kw in ({}, {"kind": "stable"}, {"kind": "heapsort"}):
        g = tg.grad(lambda a: np.sum(np.sort(a, **kw) * w))(x)
        np.testing.assert_array_equal(g[np.argsort(x)], w)
        g = tg.grad(lambda a: np.sum(np.sort(a, **kw) * w), backend="native")(x)
        np.testing.assert_array_equal(g[np.argsort(x)], w)


@pytest.mark.parametrize("backend", ["numpy", "native"])
def test_numpy_sort_value_beside_its_gradient_is_numpys_bit_for_bit(backend):
    # the gradient's argsort also gives the value (one sort, not two) only
    # where that cannot change a bit: NumPy's unstable sort and argsort
    # order -0.0 and 0.0 differently
    for x in (TIES + 0.5, SIGNED_ZEROS, WITH_NAN, TIES.astype(np.float32)):
        for kw in ({}, {"kind": "stable"}, {"kind": "heapsort"}):
            value, pullback = tg.vjp(lambda a: np.sort(a, **kw), x, backend=backend)
            want = np.sort(x, **kw)
            np.testing.assert_array_equal(value, want)
            np.testing.assert_array_equal(np.signbit(value), np.signbit(want))
            ct = np.random.default_rng(5).permutation(x.size).astype(x.dtype) - 3
            (g,) = pullback(ct)             # unsorted, with zeros
            np.testing.assert_array_equal(g[np.argsort(x, **kw)], ct)


def test_numpy_sort_kind_errors_are_numpys():
    for kw, msg in (({"kind": "introsort"}, "sort kind must be one of"),
                    ({"kind": "stable", "stable": True}, "can't be provided at the same time")):
        with pytest.raises(ValueError, match=msg):
            np.sort(TIES, **kw)
        with pytest.raises(ValueError, match=msg):
            tg.compile(lambda x: np.sort(x, **kw))(TIES)


NAN_DATA = np.array([1.0, np.nan, 3.0, 2.0, np.nan, 0.5, 3.0])


def test_torch_sorts_put_nan_first_when_descending_and_keep_ties_in_order():
    # torch: NaN is the largest value, equal elements keep their order
    # (stable=True; unspecified otherwise, and tracegrad is always stable)
    want_desc = [1, 4, 2, 6, 3, 0, 5]
    want_asc = [5, 0, 3, 2, 6, 1, 4]

    def f(t):
        return (tg.sort(t, descending=True).indices, tg.argsort(t, descending=True),
                t.argsort(descending=True), tg.topk(t, 3).indices, tg.sort(t).indices,
                tg.argsort(t), tg.topk(t, 2, largest=False).indices)
    t = tg.tensor(NAN_DATA)
    for got in (f(t), tg.compile(f)(t)):
        got = [list(_plain(g)) for g in got]
        assert got == [want_desc, want_desc, want_desc, want_desc[:3], want_asc, want_asc,
                       want_asc[:2]]
    values = _plain(tg.topk(t, 3).values)
    assert np.isnan(values[:2]).all() and values[2] == 3.0
    if torch is not None:
        tt = torch.tensor(NAN_DATA)
        assert torch.sort(tt, descending=True, stable=True).indices.tolist() == want_desc
        assert torch.topk(tt, 3).indices.tolist()[:2] == [1, 4]
        assert torch.sort(tt, stable=True).indices.tolist() == want_asc


def test_torch_descending_sort_gradient_follows_each_element():
    x = np.array([0.3, np.nan, 2.0, -1.0])
    t = tg.tensor(x, requires_grad=True)
    v = tg.sort(t, descending=True).values
    (v[2:] * tg.tensor([10.0, 100.0])).sum().backward()
    np.testing.assert_array_equal(_plain(t.grad), [10.0, 0.0, 0.0, 100.0])


@pytest.mark.parametrize("mode", ["numpy", "native", "eager"])
def test_numpy_partition_is_numpys_own_arrangement_and_its_gradient_follows_it(mode):
    # from about 1,000 elements NumPy's partition and argpartition arrange
    # the elements on each side of kth differently: np.partition is NumPy's
    x = np.random.default_rng(21).standard_normal(3000)
    k = 700
    w = np.linspace(1.0, 2.0, k)

    def f(a):
        return np.partition(a, k)

    def loss(a):
        return np.sum(np.partition(a, k)[:k] * w)
    assert not np.array_equal(np.partition(x, k), x[np.argpartition(x, k)])
    for data in (x, np.where(x > 1.5, 0.0, x), np.where(x < -1.5, np.nan, x)):
        got = f(NumpyTensor(data, requires_grad=True)) if mode == "eager" else \
            tg.compile(f, backend=mode)(data)
        np.testing.assert_array_equal(_plain(got), np.partition(data, k))
    if mode == "eager":
        t = NumpyTensor(x, requires_grad=True)
        loss(t).backward()
        g = _plain(t.grad)
    else:
        g = tg.grad(loss, backend=mode)(x)
    out = np.partition(x, k)
    src = np.argsort(x)[np.searchsorted(np.sort(x), out)]     # distinct values: unique
    want = np.zeros_like(x)
    want[src[:k]] = w
    np.testing.assert_array_equal(g, want)
