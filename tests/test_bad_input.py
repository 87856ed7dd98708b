"""Bad inputs to every documented entry point (issue 28, item 5).

The rows are those of docs/guide.md, "Errors and what they mean" (and a few
more of the same kind); the columns are the compiled entry points: tg.compile,
tg.grad, value_and_grad, jacobian/jacrev, jacfwd, hessian, tg.vjp, tg.jvp,
torch.func's grad, grad_and_value, vjp, jvp, jacrev, jacfwd, hessian and vmap,
and tg.autograd.functional's jacobian, hessian, vjp and jvp; each on the NumPy
target and on the default native one (when a C compiler works).

Every cell must raise one of the documented public exception types (a
function's own exception passes through unchanged), never an internal one
(AttributeError, KeyError, StopIteration, a tracegrad class that is not
documented, ...), with a message that says what happened (the argument or
the function) and what to do.
"""
import re

import numpy as np
import pytest

import tracegrad as tg
from tracegrad import TraceError
from tracegrad.autograd import functional as AF
from tracegrad.ops.random import RandomTraceError
from tracegrad.runtime import toolchain

PUBLIC = (TypeError, ValueError, NotImplementedError, RuntimeError, TraceError, RandomTraceError)
INTERNAL_WORDS = re.compile(r"GeneratorProxy|scalar_output|batched_call|jvp_of|argument leaf|"
                            r"\bdot\b|<locals>|NoneType' object has no attribute")


@pytest.fixture(params=["numpy", "native"])
def backend(request, monkeypatch, tmp_path):
    if request.param == "native" and toolchain.recipe_or_none() is None:
        pytest.skip("the native target needs a C compiler")
    monkeypatch.setenv("TRACEGRAD_BACKEND", request.param)
    monkeypatch.setenv("TRACEGRAD_CACHE_DIR", str(tmp_path / "cache"))
    return request.param


# --- the user's functions -----------------------------------------------------------------

class Mine(Exception):
    pass


class Opaque:
    pass


def sq(x):
    return (x ** 2).sum()


def double(x):
    return x * 2.0


def mm(x, w):
    return (x @ w).sum()


def with_static(x, n):
    return (x * len(n)).sum()


def two(x, y):
    return (x * y).sum()


def draws(rng, x):
    return (x * rng.normal()).sum()


def raises(x):
    raise Mine("boom from the user's function")


F = np.array([1.0, 2.0])

# --- the entry points: (family, call(f, args, argnums, static, backend)) -------------------

GRAD_LIKE = ("grad", "value_and_grad", "jacobian", "jacrev", "jacfwd", "hessian")


def _tg(name):
    def call(f, args, argnums, static, backend):
        kw = {"backend": "numpy" if backend == "numpy" else None}   # else the default: native
        if argnums is not None:
            kw["argnums"] = argnums
        if static is not None:
            kw["static_argnums"] = static
        return getattr(tg, name)(f, **kw)(*args)
    return call


def _tg_vjp(f, args, argnums, static, backend):
    out, vjp_fn = tg.vjp(f, *args, backend="numpy" if backend == "numpy" else None)
    return vjp_fn(np.ones_like(out))


def _tg_jvp(f, args, argnums, static, backend):
    return tg.jvp(f, tuple(args), tuple(args), backend="numpy" if backend == "numpy" else None)


def _func(name):
    def call(f, args, argnums, static, backend):
        kw = {} if argnums is None else {"argnums": argnums}
        return getattr(tg.func, name)(f, **kw)(*args)
    return call


def _func_vjp(f, args, argnums, static, backend):
    out, vjp_fn = tg.func.vjp(f, *args)
    return vjp_fn(np.ones_like(out))


def _func_jvp(f, args, argnums, static, backend):
    return tg.func.jvp(f, tuple(args), tuple(args))


def _func_vmap(f, args, argnums, static, backend):
    return tg.func.vmap(f)(*args)


def _af(name):
    def call(f, args, argnums, static, backend):
        ins = tuple(tg.from_numpy(a) if isinstance(a, np.ndarray) else a for a in args)
        ins = ins[0] if len(ins) == 1 else ins
        if name == "jvp":
            return AF.jvp(f, ins, ins)
        return getattr(AF, name)(f, ins)
    return call


ENTRIES = {f"tg.{n}": ("tg", _tg(n)) for n in ("compile",) + GRAD_LIKE}
ENTRIES.update({"tg.vjp": ("tgv", _tg_vjp), "tg.jvp": ("tgv", _tg_jvp)})
ENTRIES.update({f"func.{n}": ("func", _func(n))
                for n in ("grad", "grad_and_value", "jacrev", "jacfwd", "hessian")})
ENTRIES.update({"func.vjp": ("func.vjp", _func_vjp), "func.jvp": ("func.jvp", _func_jvp),
                "func.vmap": ("func.vmap", _func_vmap)})
ENTRIES.update({f"af.{n}": ("af", _af(n)) for n in ("jacobian", "hessian", "vjp", "jvp")})

TG_GRAD = {f"tg.{n}" for n in GRAD_LIKE}
FUNC_GRAD = {f"func.{n}" for n in ("grad", "grad_and_value", "jacrev", "jacfwd", "hessian")}
ALL = set(ENTRIES)

# --- the rows: where they apply, and what each family must raise --------------------------
# expect: {entry name or family or "*": (exception types, [regexes the message matches])}

ARRAYS_ONLY = (r"tracegrad compiles functions of arrays and numbers", r"static_argnums")
DTYPES = (r"bool, integer, floating-point or complex", r"np\.asarray\(x, dtype=np\.float64\)")
AF_TENSORS = (TypeError, [r"must be either a Tensor or a tuple of Tensors"])


def row(fn, args, applies=ALL, argnums=None, static=None, **expect):
    return dict(fn=fn, args=args, applies=applies, argnums=argnums, static=static,
                expect={k.replace("__", "."): v for k, v in expect.items()})


ROWS = {
    "non-scalar output": row(
        double, (F,), {"tg.grad", "tg.value_and_grad", "tg.hessian", "func.grad",
                       "func.grad_and_value", "af.hessian"},
        tg=(TypeError, [r"requires a scalar output", r"float64\[2\]", r"reduce it"]),
        func=(TypeError, [r"torch\.func\.\w+\(f\)", r"scalar \(0-d\)", r"reduce it"]),
        af=(RuntimeError, [r"hessian should return a single Tensor"])),
    "integer argument differentiated": row(
        sq, (np.arange(3),), TG_GRAD | FUNC_GRAD | {"func.vjp"} | {e for e in ALL if "af." in e},
        tg=(TypeError, [r"of sq: argument 'x' has dtype int64", r"floating-point", r"astype"]),
        func=(TypeError, [r"of sq: argument 'x' has dtype int64", r"floating-point"]),
        func__vjp=(TypeError, [r"of vjp\(sq\): argument primals\[0\] has dtype int64",
                               r"floating-point"]),
        af=(RuntimeError, [r"inputs has dtype int64", r"floating point", r"double\(\)"])),
    "unhashable static argument": row(
        with_static, (F, [1, 2]), TG_GRAD | {"tg.compile"}, static=1,
        tg=(TypeError, [r"static argument 1 of with_static has the unhashable type list",
                        r"pass a tuple"])),
    "non-array argument, not static": row(
        sq, (Opaque(),),
        tg=(TypeError, [r"of sq: argument 'x' is an Opaque", *ARRAYS_ONLY]),
        tgv=(TypeError, [r"of sq: primals\[0\] is an Opaque", *ARRAYS_ONLY]),
        func=(TypeError, [r"of sq: argument 'x' is an Opaque", *ARRAYS_ONLY]),
        func__vjp=(TypeError, [r"of sq: argument 'x' is an Opaque", *ARRAYS_ONLY]),
        func__jvp=(TypeError, [r"jvp\(sq, .*primals\[0\] is an Opaque", *ARRAYS_ONLY]),
        func__vmap=(ValueError, [r"vmap\(sq.*type Opaque", r"use None as the respective in_dim"]),
        af=AF_TENSORS),
    "matmul shapes that do not line up": row(
        mm, (np.ones((5, 4)), np.ones((3, 2))),
        **{"*": (ValueError, [r"matmul: shapes \[5, 4\] and \[3, 2\] do not line up",
                              r"must equal"])},
        func__vmap=(ValueError, [r"same size in the mapped dimension", r"\[5, 3\]"])),
    "object dtype": row(
        sq, (np.array([1.0, 2.0], dtype=object),),
        tg=(TypeError, [r"of sq: argument 'x' is an array of dtype object", *DTYPES]),
        tgv=(TypeError, [r"of sq: primals\[0\] is an array of dtype object", *DTYPES]),
        func=(TypeError, [r"of sq: argument 'x' is an array of dtype object", *DTYPES]),
        func__vjp=(TypeError, [r"of sq: argument 'x' is an array of dtype object", *DTYPES]),
        func__jvp=(TypeError, [r"jvp\(sq, .*primals\[0\] is an array of dtype object", *DTYPES]),
        func__vmap=(TypeError, [r"vmap\(sq.*input 0 is an array of dtype object", *DTYPES]),
        af=(TypeError, [r"functional\.\w+: inputs is a Tensor of dtype object",
                        r"bool, integer, floating-point or complex", r"double\(\)"])),
    "string argument": row(
        sq, ("abc",),
        tg=(TypeError, [r"of sq: argument 'x' is a str", *ARRAYS_ONLY]),
        tgv=(TypeError, [r"of sq: primals\[0\] is a str", *ARRAYS_ONLY]),
        func=(TypeError, [r"of sq: argument 'x' is a str", *ARRAYS_ONLY]),
        func__vjp=(TypeError, [r"of sq: argument 'x' is a str", *ARRAYS_ONLY]),
        func__jvp=(TypeError, [r"jvp\(sq, .*primals\[0\] is a str", *ARRAYS_ONLY]),
        func__vmap=(ValueError, [r"vmap\(sq.*type str", r"use None as the respective in_dim"]),
        af=AF_TENSORS),
    "None argument": row(
        sq, (None,),
        # None is an empty structure: the function gets it, and says so itself
        tg=(TypeError, [r"of sq: argnums=\(0,\) refers to argument 'x', which is None",
                        r"Pass an array"]),
        tg__compile=(TypeError, [r"NoneType"]),
        tgv=(TypeError, [r"NoneType"]),
        func=(TypeError, [r"of sq: argnums=\(0,\) refers to argument 'x', which is None",
                          r"Pass an array"]),
        func__vjp=(TypeError, [r"NoneType"]),
        func__jvp=(TypeError, [r"jvp\(sq, .*expected primals to be a tuple of Tensors"]),
        func__vmap=(ValueError, [r"vmap\(sq.*at least one input must be a Tensor"]),
        af=AF_TENSORS),
    "list of mixed types": row(
        sq, ([1.0, "a"],),
        tg=(TypeError, [r"of sq: argument x\[1\] is a str", *ARRAYS_ONLY]),
        tgv=(TypeError, [r"of sq: primals\[0\]\[1\] is a str", *ARRAYS_ONLY]),
        func=(TypeError, [r"of sq: argument x\[1\] is a str", *ARRAYS_ONLY]),
        func__vjp=(TypeError, [r"of sq: argument x\[1\] is a str", *ARRAYS_ONLY]),
        func__jvp=(TypeError, [r"jvp\(sq, .*primals\[0\]\[1\] is a str", *ARRAYS_ONLY]),
        func__vmap=(ValueError, [r"vmap\(sq.*non-Tensor arguments", r"use None"]),
        af=AF_TENSORS),
    "argnums out of range": row(
        two, (F, F), TG_GRAD | FUNC_GRAD, argnums=3,
        **{"*": (TypeError, [r"of two: argnums=\(3,\) refers to argument 3",
                             r"called with 2 positional arguments"])}),
    "negative argnums beyond the arguments": row(
        two, (F, F), TG_GRAD | FUNC_GRAD, argnums=-3,
        **{"*": (TypeError, [r"of two: argnums=\(-3,\) refers to argument -3",
                             r"called with 2 positional arguments"])}),
    "argnums not an int": row(
        sq, (F,), TG_GRAD | FUNC_GRAD, argnums="x",
        **{"*": (TypeError, [r"argnums must be an int or a tuple of ints", r"got 'x'"])}),
    "RandomState argument": row(
        draws, (np.random.RandomState(0), F),
        **{"*": (TypeError, [r"(of draws: argument 'rng'|draws.*: primals\[0\]) is a "
                             r"np\.random\.RandomState", r"np\.random\.Generator"])},
        func__vmap=(ValueError, [r"vmap\(draws.*type RandomState", r"use None"]),
        af=AF_TENSORS),
    "Generator argument differentiated": row(
        draws, (np.random.default_rng(0), F), TG_GRAD | FUNC_GRAD,
        **{"*": (TypeError, [r"of draws: argument 'rng' is a np\.random\.Generator",
                             r"floating-point", r"other argnums"])}),
}

CELLS = [pytest.param(r, e, id=f"{r}-{e}") for r, spec in ROWS.items()
         for e in ENTRIES if e in spec["applies"]]


def _expected(spec, entry):
    family = ENTRIES[entry][0]
    for key in (entry, family, family.split(".")[0], "*"):
        if key in spec["expect"]:
            return spec["expect"][key]
    raise LookupError(f"no expectation for {entry}")


@pytest.mark.parametrize("row_name,entry", CELLS)
def test_bad_input_gives_a_public_error_that_says_what_to_do(row_name, entry, backend):
    spec = ROWS[row_name]
    types, patterns = _expected(spec, entry)
    call = ENTRIES[entry][1]
    with pytest.raises(Exception) as info:
        call(spec["fn"], spec["args"], spec["argnums"], spec["static"], backend)
    e = info.value
    assert type(e) in PUBLIC, f"{type(e).__module__}.{type(e).__qualname__}: {e}"
    assert isinstance(e, types), f"expected {types}, got {type(e).__name__}: {e}"
    msg = str(e)
    for p in patterns:
        assert re.search(p, msg), f"{p!r} not in: {msg}"
    assert not INTERNAL_WORDS.search(msg), msg


@pytest.mark.parametrize("entry", sorted(ENTRIES))
def test_the_functions_own_exception_passes_through_unchanged(entry, backend):
    with pytest.raises(Mine, match="^boom from the user's function$") as info:
        ENTRIES[entry][1](raises, (F,), None, None, backend)
    assert type(info.value) is Mine
    tb = info.value.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    assert tb.tb_frame.f_code is raises.__code__   # raised there, not re-raised by tracegrad


# --- the same checks on the other ways in --------------------------------------------------

def test_object_dtype_is_named_inside_a_structure_and_on_tensors():
    obj = np.array([1.0, 2.0], dtype=object)
    with pytest.raises(TypeError, match=r"tg\.grad of <lambda>: argument p\['w'\] is an array "
                                        r"of dtype object"):
        tg.grad(lambda p: (p["w"] ** 2).sum())({"w": obj})
    with pytest.raises(TypeError, match=r"tg\.compile of sq: argument 'x' is a tensor of dtype "
                                        r"object"):
        tg.compile(sq)(tg.from_numpy(obj))
    with pytest.raises(TypeError, match=r"keyword argument 'y' is an array of dtype object"):
        tg.compile(lambda x, y: x + y)(F, y=obj)
    with pytest.raises(TypeError, match=r"argument 'x' is an array of dtype <U1"):
        tg.grad(sq)(np.array(["a", "b"]))
    with pytest.raises(TypeError, match=r"argument 'x' is an array of dtype object"):
        tg.grad(sq, compile=False)(obj)
    with pytest.raises(TypeError, match=r"argument 'x' is an array of dtype object"):
        tg.grad(sq).lower(obj)
    with pytest.raises(TypeError, match=r"tg\.jvp of sq: tangents\[0\] is an array of dtype "
                                        r"object"):
        tg.jvp(sq, (F,), (obj,))


def test_argument_errors_of_the_transforms_themselves():
    with pytest.raises(TypeError, match=r"tg\.compile of sq: static_argnums must be an int or a "
                                        r"tuple of ints .*, got 'x'"):
        tg.compile(sq, static_argnums="x")
    with pytest.raises(TypeError, match=r"static_argnames must be a str or a tuple of strs"):
        tg.compile(sq, static_argnames=1)
    with pytest.raises(TypeError, match=r"tg\.vjp of two: static_argnums=\(5,\) refers to "
                                        r"primal 5, but 2 primals were given"):
        tg.vjp(two, F, F, static_argnums=5)
    with pytest.raises(TypeError, match=r"tg\.vjp of draws: primals\[0\] is a "
                                        r"np\.random\.Generator"):
        tg.vjp(draws, np.random.default_rng(0), F)
    out, vjp_fn = tg.vjp(double, F)
    with pytest.raises(TypeError, match=r"tg\.vjp of double: vjp_fn's cotangent 0 is a str"):
        vjp_fn("ab")


def test_negative_argnums_count_from_the_end():
    x, y = np.array([1.0, 2.0]), np.array([3.0, 5.0])
    np.testing.assert_allclose(tg.grad(two, argnums=-1)(x, y), x)
    gx, gy = tg.grad(two, argnums=(0, -1))(x, y)
    np.testing.assert_allclose(gx, y)
    np.testing.assert_allclose(gy, x)
    np.testing.assert_allclose(tg.func.grad(two, argnums=-2)(x, y), y)


def test_inside_another_transform_the_arguments_are_checked_too():
    obj = np.array([1.0, 2.0], dtype=object)
    inner = tg.grad(lambda a, b: (a * b).sum())
    with pytest.raises(TypeError, match=r"argument 'b' is an array of dtype object"):
        tg.grad(lambda x: inner(x, obj).sum())(F)


def test_an_error_of_numpy_keeps_numpys_message():
    # NumPy's _UFuncNoLoopError is not made from a message: the error is its
    # builtin base class (a TypeError) with NumPy's text, the op and the line
    with pytest.raises(TypeError, match=r"add\(float64\[2\], <U1\[\]\) fails while tracing at "
                                        r".*test_bad_input\.py, line \d+: ufunc 'add' did not "
                                        r"contain a loop"):
        tg.compile(lambda x: x + "a")(F)
    with pytest.raises(TypeError, match=r"ufunc 'multiply' did not contain a loop .* \(in "
                                        r"tracegrad op 'mul'\)"):
        tg.tensor(F) * "a"


def test_outputs_that_are_python_numbers_or_strings():
    out, tangent = tg.jvp(lambda x: 3, (F,), (F,))       # a constant: its tangent is zero
    assert out == 3 and tangent == 0
    np.testing.assert_array_equal(tg.jacfwd(lambda x: 3)(F), np.zeros(2))
    with pytest.raises(TypeError, match=r"a Jacobian needs numeric outputs, but output 0 of the "
                                        r"function is <U3\[\]"):
        tg.jacobian(lambda x: "abc")(F)
