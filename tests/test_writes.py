"""Writes into arrays, the idioms beyond ``y[i] = v`` (issue 24, item 1).

Each idiom runs on traced values (``tg.compile``, ``tg.grad``) and eagerly
(``tg.grad(f, compile=False)``), writing into arrays the function created
(np.zeros, np.copy, ``x * 1.0``...) and through views of them:

* ufuncs with ``out=`` (a value, a 1-tuple, a view, ``where=``, two
  outputs), reductions with ``out=`` (``np.sum(x, axis=0, out=y)``,
  ``x.sum(axis=1, out=y)``), NumPy's 'same_kind' casting into out's dtype;
* ``np.put``/``a.put``, ``np.copyto``, ``x.fill``, ``np.place``,
  ``np.putmask``, ``np.fill_diagonal``;
* ``y[mask] *= a``, ``y[mask] += b``, ``y[mask] = expr`` and
  ``y[mask].sum()`` for a traced boolean mask (a lazy selection);
* ``x.sort()`` and ``x.partition(k)`` in place, through views too.

Values are compared with NumPy's (the function run on ndarrays), gradients
with central finite differences in float64, in both modes; what cannot be
supported is a clear error in both modes.
"""
from __future__ import annotations

import numpy as np
import pytest

import tracegrad as tg

RNG = np.random.default_rng(2024)
X = RNG.uniform(-1.0, 1.0, (3, 4))
X = np.where(np.abs(X) < 0.05, 0.3, X)          # no element near a mask's edge
A = np.array(1.7)
M = np.array([[1, 0, 1, 1], [0, 0, 1, 0], [1, 1, 0, 1]], dtype=bool)
PLAIN = np.zeros((3, 4))                         # an array the function did not create


def _fd(f, args, i, eps=1e-6):
    args = [np.array(a, dtype=np.float64) for a in args]
    x = args[i]
    g = np.zeros_like(x)
    for j in np.ndindex(x.shape):
        hi = [a.copy() for a in args]
        lo = [a.copy() for a in args]
        hi[i][j] += eps
        lo[i][j] -= eps
        g[j] = (f(*hi) - f(*lo)) / (2 * eps)
    return g


def check(f, *args, argnums=(0,), grad=True, rtol=1e-7):
    """f's values equal NumPy's (compiled and eager); the gradient of a
    weighted sum of them equals central finite differences, in both modes."""
    want = f(*[np.copy(a) for a in args])
    got = tg.compile(f)(*args)
    assert np.asarray(got).dtype == np.asarray(want).dtype
    assert np.shape(got) == np.shape(want)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    w = np.random.default_rng(7).uniform(0.5, 1.5, np.shape(want))

    def loss(*a):
        return np.sum(f(*a) * w)
    ref_value = loss(*[np.copy(a) for a in args])
    refs = [_fd(loss, args, i) for i in argnums] if grad else None
    for compile in (True, False):
        v, gs = tg.value_and_grad(loss, argnums=argnums, compile=compile)(*args)
        np.testing.assert_allclose(v, ref_value, rtol=1e-12, atol=1e-12)
        if grad:
            for g, ref in zip(gs, refs):
                np.testing.assert_allclose(g, ref, rtol=rtol, atol=1e-7)
    for a, a0 in zip(args, [np.copy(a) for a in args]):
        np.testing.assert_array_equal(a, a0)          # the caller's arrays are untouched


def both_raise(f, exc, match, *args):
    """The same clear error compiled, under tg.grad, and eagerly."""
    for run in (lambda: tg.compile(f)(*args),
                lambda: tg.grad(lambda *a: np.sum(f(*a)))(*args),
                lambda: tg.grad(lambda *a: np.sum(f(*a)), compile=False)(*args)):
        with pytest.raises(exc, match=match):
            run()


# --- 1. ufuncs and reductions with out= ---------------------------------------------------

def _add_out(x):
    y = np.zeros((3, 4))
    r = np.add(x, x * x, out=y)
    assert r is y                                  # the call returns out
    return y


def _multiply_into_itself(x):
    y = np.copy(x)
    np.multiply(y, 2, out=y)
    np.multiply(y, y, out=y)
    return y


def _exp_out(x):
    y = np.ones((3, 4))
    np.exp(x, out=y)
    return y


def _out_tuple(x):
    y = np.zeros((3, 4))
    r = np.sin(x, out=(y,))
    assert r is y
    return y


def _out_view(x):
    y = np.zeros((3, 4))
    np.exp(x[1:], out=y[1:])                      # the write goes through to y
    return y


def _out_view_names(x):
    y = np.zeros((3, 4))
    v = y[:, 1:3]
    np.multiply(x[:, :2], 3, out=v)
    return y + v.sum()                           # v and y show the same write


def _out_where(x):
    y = np.full((3, 4), 0.5)
    np.add(x, 1, out=y, where=x > 0)              # y keeps its values where False
    np.multiply(y, x, out=y, where=M)
    return y


def _two_outputs(x):
    f = np.zeros((3, 4))
    i = np.zeros((3, 4))
    r = np.modf(3 * x, out=(f, i))
    assert r[0] is f and r[1] is i
    return f + 2 * i


def _one_of_two_outputs(x):
    f = np.zeros((3, 4))
    frac, whole = np.modf(3 * x, out=(f, None))
    return f * 2 + whole


def _broadcast_into_out(x):
    y = np.zeros((2, 3, 4))
    np.subtract(x, 1.0, out=y)                    # out's shape broadcasts the inputs
    return y


def _constants_into_out(x):
    y = np.zeros((3, 4))
    np.add(1.0, 2.0, out=y[0])                    # no traced operand
    return y * x


def _matmul_out(x):
    y = np.zeros((3, 3))
    np.matmul(x, x.T, out=y)
    return y


def _sum_out(x):
    z = np.empty(4)
    r = np.sum(x, axis=0, out=z)
    assert r is z
    return z


def _sum_method_out(x):
    z = np.zeros(3)
    x.sum(axis=1, out=z)
    m = np.zeros(4)
    x.max(axis=0, out=m)
    return np.concatenate([z, m])


def _method_outs(x):
    y = np.zeros((3, 4))
    x.cumsum(axis=0, out=y)
    c = np.zeros((3, 4))
    x.clip(-0.5, 0.5, out=c)
    p = np.zeros((3, 4))
    (x * 3).cumprod(axis=1, out=p)
    t = np.zeros(())
    x[:, :3].trace(out=t)
    d = np.zeros((3, 3))
    x.dot(x.T, out=d)
    k = np.zeros(3)
    x.take([0, 5, 11], out=k)
    m = np.zeros(4)
    x.mean(axis=0, out=m)
    s = np.zeros(4)
    x.std(axis=0, out=s)
    return np.concatenate([y.ravel(), c.ravel(), p.ravel(), t[None], d.ravel(), k, m, s])


def _ufunc_methods_out(x):
    a = np.zeros(4)
    np.add.reduce(x, axis=0, out=a)
    b = np.zeros((3, 4))
    np.multiply.accumulate(x, axis=1, out=b)
    c = np.zeros((2, 4))
    np.add.reduceat(x, [0, 2], axis=0, out=c)
    d = np.zeros((3, 3))
    np.maximum.outer(x[:, 0], x[:, 1], out=d)
    e = np.zeros(3)
    np.add.reduce(x, axis=1, out=(e,))
    return np.concatenate([a, b.ravel(), c.ravel(), d.ravel(), e])


def _reductions_out(x):
    y = np.zeros((4, 4))
    np.cumsum(x, axis=0, out=y[1:])
    np.prod(x, axis=0, out=y[0])
    np.mean(x, axis=0, out=y[2])                  # overwrites a row cumsum wrote
    return y


def _reduction_out_view(x):
    z = np.zeros((2, 4))
    np.sum(x * x, axis=0, out=z[1])
    np.amin(x, axis=0, out=z[0])
    return z


def _clip_out(x):
    y = np.zeros((3, 4))
    np.clip(x, -0.5, 0.5, out=y)
    return y


def _concatenate_out(x):
    y = np.zeros((6, 4))
    np.concatenate([x, 2 * x], out=y)
    return y


@pytest.mark.parametrize("f", [
    _add_out, _multiply_into_itself, _exp_out, _out_tuple, _out_view, _out_view_names,
    _out_where, _two_outputs, _one_of_two_outputs, _broadcast_into_out, _constants_into_out,
    _matmul_out, _sum_out, _sum_method_out, _method_outs, _ufunc_methods_out,
    _reductions_out, _reduction_out_view, _clip_out,
    _concatenate_out], ids=lambda f: f.__name__.strip("_"))
def test_out(f):
    check(f, X)


def test_out_into_an_array_of_another_dtype_follows_same_kind():
    def f32(x):
        y = np.zeros((3, 4), np.float32)
        np.multiply(x, x, out=y)                  # float64 loop, then cast
        return y
    check(f32, X, grad=False)
    g = tg.grad(lambda x: np.sum(f32(x)))(X)
    np.testing.assert_allclose(g, 2 * X, rtol=1e-6)
    np.testing.assert_allclose(tg.grad(lambda x: np.sum(f32(x)), compile=False)(X), 2 * X,
                               rtol=1e-6)

    def to_int(x):
        y = np.zeros((3, 4), np.int64)
        np.exp(x, out=y)                          # NumPy: same_kind forbids float -> int
        return y
    both_raise(to_int, TypeError, "same_kind", X)
    with pytest.raises(TypeError, match="same_kind"):
        to_int(X)

    def unsafe(x):
        y = np.zeros((3, 4), np.int64)
        np.multiply(x, 10, out=y, casting="unsafe")
        return y
    np.testing.assert_array_equal(tg.compile(unsafe)(X), unsafe(X))


def test_reductions_into_out_accumulate_in_numpys_loop_dtype():
    """np.sum/np.cumsum into out= accumulate in the dtype NumPy's loop picks
    for out's dtype: float32 data into a float64 out is summed in float64."""
    big = np.array([16777216.0, 1.0, 1.0], np.float32)

    def f(x):
        s = np.zeros(())
        np.sum(x, out=s)
        c = np.zeros(3)
        np.cumsum(x, out=c)
        p = np.zeros(())
        np.prod(x * 0 + np.float32(1.0000001), out=p)
        return np.concatenate([s[None], c, p[None]])
    assert f(big)[0] == 16777218.0
    check(f, big, grad=False)

    def g(x):
        q = np.zeros((), np.float32)
        np.sum(x, out=q)                          # float64 data: summed in float64
        return q
    check(g, np.array([1e8, 1.0, -1e8]), grad=False)


def test_out_shape_errors_are_numpys():
    def f(x):
        return np.add(x, 1, out=np.zeros((2, 4)))
    with pytest.raises(ValueError):
        f(X)
    both_raise(f, ValueError, "broadcast", X)

    def g(x):
        return np.sum(x, axis=0, out=np.zeros(3))
    with pytest.raises(ValueError):
        g(X)
    both_raise(g, ValueError, "dimensions|shape", X)


def test_out_a_plain_array_is_a_clear_error():
    both_raise(lambda x: np.add(x, 1, out=PLAIN), TypeError, r"out=(.|\n)*np\.copy", X)
    both_raise(lambda x: np.sum(x, axis=0, out=PLAIN[0]), TypeError, r"out=(.|\n)*np\.copy", X)
    both_raise(lambda x: x.sum(axis=0, out=PLAIN[0]), TypeError, r"out=(.|\n)*np\.copy", X)
    both_raise(lambda x: np.add.reduce(x, out=PLAIN[0]), TypeError, r"out=(.|\n)*np\.copy", X)
    np.testing.assert_array_equal(PLAIN, 0.0)


def test_a_write_through_a_view_of_a_captured_array_is_a_clear_error():
    """NumPy would write into the global: compiled code cannot, so it is an
    error (it used to be functionalized silently, the global unchanged)."""
    def f(x):
        v = PLAIN[0]
        v[...] = x[0]
        return x + PLAIN

    def g(x):
        np.sum(x, axis=0, out=PLAIN[0])
        return x
    for fn in (f, g):
        with pytest.raises(TypeError, match=r"plain NumPy array(.|\n)*np\.copy"):
            tg.compile(fn)(X)
    np.testing.assert_array_equal(PLAIN, 0.0)


def test_out_an_argument_is_a_clear_error():
    both_raise(lambda x: np.exp(x, out=x), TypeError, r"argument(.|\n)*copy", X)
    both_raise(lambda x: np.sum(x * 2, axis=1, out=x[:, 0]), TypeError, r"argument(.|\n)*copy",
               X)


def test_mean_out_of_another_dtype_is_refused():
    """NumPy computes np.mean(..., out=) step by step in out's dtype: not
    reproduced, refused (the same dtype is honoured: test_out)."""
    def f(x):
        y = np.zeros(4, np.float32)
        np.mean(x, axis=0, out=y)
        return y
    both_raise(f, TypeError, r"tracegrad(.|\n)*out=", X)


def test_where_without_out_stays_refused():
    both_raise(lambda x: np.add(x, 1, where=x > 0), TypeError, "where=", X)


# --- 2. put, copyto, fill, place, putmask, fill_diagonal ----------------------------------

def _put(x):
    y = np.zeros((3, 4))
    assert np.put(y, [0, 5, 5, -1], x[0] * 2) is None   # repeated: the last wins
    y.put([2, 3, 14], x[1, :3], mode="wrap")
    np.put(y, [20, -20], x[2, :2], mode="clip")
    np.put(y[1], [1, 2], x[2, 2:])                     # through a view
    return y


def _copyto(x):
    z = np.ones((3, 4))
    np.copyto(z, x[0])                                 # broadcast
    np.copyto(z, x * 3, where=M)
    np.copyto(z[1:], x[2], where=x[1:] > 0.2)          # a traced mask, through a view
    return z


def _fill(x):
    w = np.zeros((3, 4))
    w.fill(2.5)
    w[0].fill(x[0, 0])                                 # a traced 0-d value, through a view
    w[:, 1].fill(x[1, 1] * 3)
    return w * x


def _place(x):
    w = np.zeros((3, 4))
    np.place(w, M, x[1, :3])                           # repeated in turn
    return w


def _putmask(x):
    v = np.ones((3, 4))
    np.putmask(v, x > 0.4, x[2] * x[1])                # a traced mask; values cycled
    np.putmask(v[0], M[0], 7.0)
    return v


def _fill_diagonal(x):
    d = np.zeros((4, 4))
    np.fill_diagonal(d, x[0])
    np.fill_diagonal(d[1:], x[1, :2])                  # through a view, values repeated
    t = np.zeros((7, 3))
    np.fill_diagonal(t, x[2, :2], wrap=True)
    return np.concatenate([d.ravel(), t.ravel()])


@pytest.mark.parametrize("f", [_put, _copyto, _fill, _place, _putmask, _fill_diagonal],
                         ids=lambda f: f.__name__.strip("_"))
def test_write_functions(f):
    check(f, X)


def test_write_functions_errors():
    both_raise(lambda x: np.put(PLAIN, [0], x[0, 0]), TypeError, r"np\.copy", X)
    both_raise(lambda x: np.copyto(PLAIN, x), TypeError, r"np\.copy", X)
    both_raise(lambda x: (np.put(np.zeros(4), [9], x[0, :1]), x)[1], IndexError, "out of bounds",
               X)
    both_raise(lambda x: (np.copyto(np.zeros(4, int), x[0]), x)[1], TypeError, "same_kind", X)
    both_raise(lambda x: (np.copyto(np.zeros(3), x[0]), x)[1], ValueError, "broadcast", X)
    both_raise(lambda x: (np.place(np.zeros(4), [True, False], x[0]), x)[1], ValueError,
               "same size", X)
    both_raise(lambda x: (np.put(x, [0], 1.0), x)[1], TypeError, r"argument(.|\n)*copy", X)
    both_raise(lambda x: (x.fill(1.0), x)[1], TypeError, r"argument(.|\n)*copy", X)
    # np.place needs to know where (and how many) to write: a traced mask is refused
    with pytest.raises(TypeError, match="np.where"):
        tg.compile(lambda x: (lambda w: (np.place(w, x > 0, 1.0), w)[1])(np.zeros((3, 4))))(X)


def test_torch_face_fill_and_put_advise():
    t = tg.tensor(X)
    with pytest.raises(AttributeError, match="fill_"):
        t.fill(1.0)
    with pytest.raises(AttributeError, match="index"):
        t.put([0], [1.0])


# --- 3. writes through a traced boolean mask ----------------------------------------------

def _mask_inplace(x, a):
    y = x * 1.0
    m = x > 0
    y[m] *= a
    y[m] += x[0, 0]
    y[m] -= 0.5
    y[m] /= a
    y[m] **= 2
    return y


def _mask_assign_expr(x, a):
    y = x * a
    m = x > 0
    z = np.zeros((3, 4))
    z[m] = np.exp(x[m]) * 2 - y[m]
    z[~m] = -y[~m] / a
    return z


def _mask_leading_axes(x, a):
    w = np.ones((3, 4))
    m0 = x[:, 0] > 0
    w[m0] *= a
    w[m0] += x[0]                                      # broadcasts over the trailing axis
    w[m0] = x[m0] ** 2 + w[m0]
    return w


def _mask_sum(x, a):
    m = x > 0
    return np.stack([x[m].sum() * a, np.sum(x[m] ** 2), np.sum(m * a)])


def _mask_other_array(x, a):
    y = np.zeros((3, 4))
    m = x < 0.5
    y[m] = x[m]                                        # another array, the same mask
    y[m] *= np.sin(a)
    return y


@pytest.mark.parametrize("f", [_mask_inplace, _mask_assign_expr, _mask_leading_axes, _mask_sum,
                               _mask_other_array], ids=lambda f: f.__name__.strip("_"))
def test_traced_mask_writes(f):
    check(f, X, A, argnums=(0, 1))


def test_traced_mask_what_is_not_supported_is_a_clear_error():
    for f in (lambda x: np.mean(x[x > 0]),
              lambda x: x[x > 0] * x,                  # the selection's length is not known
              lambda x: (lambda y: (y.__setitem__(x > 0, x[x < 0]), y)[1])(x * 1.0),
              lambda x: x[x > 0].shape[0] * x,
              lambda x: x[x > 0][0]):
        with pytest.raises(tg.TraceError, match=r"traced boolean array(.|\n)*np\.where"):
            tg.compile(f)(X)
    with pytest.raises(tg.TraceError, match="np.where"):
        tg.compile(lambda x: (lambda y: (y.__setitem__(x > 0, x[0]), y)[1])(x * 1.0))(X)


# --- 4. sort and partition in place -------------------------------------------------------

def _sort(x):
    y = np.copy(x)
    y.sort(axis=0)
    y[1].sort()                                        # through a view
    z = y.T
    z[0].sort()
    return y


def _sort_names(x):
    y = x * 2.0
    v = y[:, 1:]
    v.sort(axis=1)
    u = y
    u.sort(axis=0)
    return np.concatenate([y.ravel(), v.ravel()])


def _partition(x):
    y = np.copy(x)
    y.partition(2, axis=1)
    y[0].partition(1)
    # defined by NumPy: the kth element, and the sets on either side of it
    return np.concatenate([y[:, 2], np.sort(y[:, :2], axis=1).ravel(), y[0, :1] * 0 + y[0, 1],
                           np.sort(y[1:, 3:], axis=None)])


@pytest.mark.parametrize("f", [_sort, _sort_names, _partition],
                         ids=lambda f: f.__name__.strip("_"))
def test_in_place_sort(f):
    check(f, X)


def test_views_of_a_numpy_scalar_are_new_arrays():
    # np.var(x, axis=0) of a vector and np.sum(x) are NumPy scalars: a reshape
    # or transpose of one is a new array (a new scalar where 0-d), so writes
    # into it never reach the scalar.  The fuzzer found the compiled path
    # writing through (a wrong value, no error); compile=False did the same.
    def f(x):
        s = np.sum(x)
        a = np.reshape(s, (1,))
        a += 1.0
        z = np.zeros(())
        v = z.reshape(1)
        v += 2.0                       # a 0-d array: v is its view, z changes
        r = np.reshape(s * 1.0, ())
        w = r.reshape(1)
        w += 5.0
        m = np.var(x, axis=0)
        t = np.reshape(m, (1, 1, -1)).transpose((0, 2, 1))
        t += 0.75
        return s + a[0] * 10 + z * 100 + r * 1000 + m * 10000 + np.sum(t)

    x = np.array([-0.358, -0.152, -0.916])
    want = f(x.copy())
    eps = 1e-6
    fd = np.array([(f(x + eps * e) - f(x - eps * e)) / (2 * eps) for e in np.eye(3)])
    np.testing.assert_allclose(tg.compile(f)(x.copy()), want, rtol=1e-12)
    for compile in (True, False):
        v, g = tg.value_and_grad(f, compile=compile)(x.copy())
        np.testing.assert_allclose(v, want, rtol=1e-12)
        np.testing.assert_allclose(g, fd, rtol=1e-6)


def _einsum_views(x):
    # np.einsum of one operand that sums nothing is a view ('ij->ji', 'ii->i',
    # of a view too): it reads the writes into its base that come after it.
    # The fuzzer found compiled code and compile=False reading the value from
    # before the write (a wrong value, no error).
    a = x * 2.0
    t = np.einsum("ij->ji", a)
    d = np.einsum("ii->i", a[:2, :2])
    e = np.einsum("ab->ab", a.T)
    s = np.einsum("ij->i", a)          # sums: a new array, writes do not reach it
    w = a[::-1]
    w -= 1.0
    a *= 3.0
    return np.sum(t * np.arange(6.0).reshape(3, 2)) + np.sum(d * np.array([1.0, -2.0])) \
        + np.sum(e ** 2) + np.sum(s * np.array([0.5, 4.0]))


def test_one_operand_einsum_views_read_later_writes_into_their_base():
    x = np.array([[0.3, -1.2, 0.7], [1.1, 0.4, -0.6]])
    want = _einsum_views(x.copy())
    eps = 1e-6
    fd = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        d = np.zeros_like(x)
        d[i] = eps
        fd[i] = (_einsum_views(x + d) - _einsum_views(x - d)) / (2 * eps)
    np.testing.assert_allclose(tg.compile(_einsum_views)(x.copy()), want, rtol=1e-12)
    for compile in (True, False):
        v, g = tg.value_and_grad(_einsum_views, compile=compile)(x.copy())
        np.testing.assert_allclose(v, want, rtol=1e-12)
        np.testing.assert_allclose(g, fd, rtol=1e-6, atol=1e-8)


def test_a_write_into_an_einsum_view_is_refused_and_operands_of_a_copy_are_free():
    def into_view(x):
        a = x * 1.0
        d = np.einsum("ii->i", a)
        d += 1.0                       # NumPy writes a's diagonal: not followed
        return np.sum(a)

    def into_operand_of_a_product(x):
        a = x * 1.0
        y = np.einsum("ij,jk->ik", a, a)   # two operands: a new array
        a += 1.0
        return np.sum(y) + np.sum(a)

    x = np.array([[0.3, -1.2], [1.1, 0.4]])
    with pytest.raises(Exception, match="shares memory"):
        tg.compile(into_view)(x)
    with pytest.raises(Exception, match="shares memory"):
        tg.value_and_grad(into_view, compile=False)(x)
    want = into_operand_of_a_product(x.copy())
    np.testing.assert_allclose(tg.compile(into_operand_of_a_product)(x.copy()), want, rtol=1e-12)
    np.testing.assert_allclose(tg.value_and_grad(into_operand_of_a_product, compile=False)(
        x.copy())[0], want, rtol=1e-12)
