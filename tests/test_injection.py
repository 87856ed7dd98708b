"""Nothing a user passes reaches generated source as code.

Names (a function's __qualname__, __module__, __name__, its file name,
dict keys of pytree arguments, keyword names), static values and the
user's source lines quoted in comments are fuzzed with hostile text (line
breaks of every kind, triple quotes, backslashes, NUL, bidi controls, and
payloads that would set a sentinel in ``builtins`` or raise SystemExit if
they ever ran) through tg.compile, tg.grad, ``.lower().source``,
``.lower().cuda_source``, the CUDA driver and ``tracegrad compile``.

Each generated source must compile, contain only printable characters and
plain newlines, hold no name from the payloads as code (checked on its
tokens and AST), and still carry the hostile text exactly, decodable from
its docstrings and comments (``templates.safe_text`` escapes like repr, so
the escaping loses nothing); the sentinel must never be set; the values
must be right.
"""
import ast
import builtins
import io
import itertools
import linecache
import os
import re
import shutil
import subprocess
import sys
import textwrap
import tokenize
import unicodedata

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings, strategies as st

import tracegrad as tg
from tracegrad import cli
from tracegrad.targets import pysource, templates

SENTINEL = "tg_injection_sentinel"

# Code that, if it ever ran, would set the sentinel or stop the process.
PAYLOADS = [
    f"__import__('builtins').__setattr__('{SENTINEL}', 1)",
    f'""";__import__("builtins").__setattr__("{SENTINEL}", 2);"""',
    f"''';__import__('builtins').__setattr__('{SENTINEL}', 3);'''",
    f"\n__import__('builtins').__setattr__('{SENTINEL}', 4)\n",
    f"\r\n__import__('builtins').__setattr__('{SENTINEL}', 5)#",
    "; raise SystemExit(3)",
    "\nraise SystemExit(4)\n",
    "*/ __import__('os').system('echo PWNED') /*",
]
# Words that occur in the payloads and nowhere in generated code.
PAYLOAD_WORDS = {"__import__", "__setattr__", "SystemExit", SENTINEL, "system"}

BREAKERS = ["\n", "\r", "\r\n", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028",
            "\u2029", "\x00", "\t", '"""', "'''", '"', "'", "\\", "\\\n", "\\N{", "\\x",
            "#", "*/", "/*", "//", "\u202e", "\ufeff", "\ud800", "{{ x }}", "{% if %}", ":",
            "Größe", "𝐧𝐩", "é"]

hostile = st.lists(st.one_of(st.sampled_from(BREAKERS), st.sampled_from(PAYLOADS),
                             st.text(max_size=3)),
                   min_size=1, max_size=5).map("".join)

# Deterministic, no example database; no shrinking either: a failing example
# is reported as generated (each one compiles code, so shrinking is slow).
FUZZ = settings(max_examples=40, derandomize=True, deadline=None, database=None,
                phases=[Phase.explicit, Phase.generate],
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.fixture(autouse=True)
def _isolated(tmp_path_factory, monkeypatch):
    """A private disk cache, an empty memory cache (modules are shared by
    structure, whatever the names); the sentinel never set before or after."""
    monkeypatch.setenv("TRACEGRAD_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    monkeypatch.delenv("TRACEGRAD_CACHE", raising=False)
    tg.clear_cache(disk=False)
    assert not hasattr(builtins, SENTINEL)
    yield
    assert not hasattr(builtins, SENTINEL), "generated code ran a payload"


# --- what every generated source must satisfy --------------------------------------------------

def _decode(body):
    """The text safe_text escaped into ``body`` (a docstring or comment)."""
    return ast.literal_eval('"""' + body + '"""')


def check_python(src, must_carry=()):
    """``src`` compiles; it is printable text with plain newlines; no payload
    word is code in it; each text of ``must_carry`` survives, exactly, in a
    docstring, a string constant or a comment.  Returns the parsed module."""
    assert all(c == "\n" or c.isprintable() for c in src), \
        [c for c in src if c != "\n" and not c.isprintable()][:5]
    assert src.splitlines() == src.split("\n")[:len(src.splitlines())]
    tree = ast.parse(compile(src, "<generated>", "exec", ast.PyCF_ONLY_AST))
    compile(tree, "<generated>", "exec")
    texts = []
    for node in ast.walk(tree):
        for name in (getattr(node, "id", None), getattr(node, "attr", None),
                     getattr(node, "arg", None),
                     getattr(node, "name", None) if not isinstance(node, ast.alias) else None):
            assert name not in PAYLOAD_WORDS, f"payload name {name!r} is code in:\n{src}"
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
            allowed = {"numpy", "math", "base64", "cupy"}
            if 'TARGET = "native"' in src:      # the builder pasted into native modules
                allowed |= NATIVE_LOADER_IMPORTS
            if "\n_lib, _ENTRY = _builder.shared_library(" in src:
                # a generic-size module takes tracegrad's own copy of the builder
                # (docs/native.md, "Generic sizes"): a fixed name, never the user's
                allowed |= {"tracegrad.targets.native"}
            assert set(mods) <= allowed, mods
        if isinstance(node, ast.Raise) and node.exc is not None:
            assert "SystemExit" not in ast.unparse(node.exc)
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            texts.append(node.value)
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.NAME:
            assert tok.string not in PAYLOAD_WORDS, f"payload token {tok.string!r} in:\n{src}"
        elif tok.type == tokenize.COMMENT:
            texts.append(_decode_comment(tok.string))
    for text in must_carry:
        assert any(text in t for t in texts), f"{text!r} was lost from:\n{src}"
    return tree


def _decode_comment(comment):
    """A comment's text: decoded when it is made of safe_text pieces."""
    try:
        return _decode(comment[1:].strip())
    except (SyntaxError, ValueError):  # a helper's own comment (not ours to decode)
        return comment


def check_cuda(tu, must_carry=()):
    """A CUDA translation unit: printable, one // comment never continued
    onto the next line, no payload word outside comments."""
    assert all(c == "\n" or c.isprintable() for c in tu)
    comments = []
    for line in tu.split("\n"):
        assert not line.rstrip().endswith("\\"), line
        code, sep, comment = line.partition("//")
        assert not PAYLOAD_WORDS & set(re.findall(r"\w+", code)), line
        assert "/*" not in code and "*/" not in code, line
        if sep:
            comments.append(comment)
    for text in must_carry:
        assert any(text in _decode_comment("#" + c) for c in comments), f"{text!r} lost:\n{tu}"


# what codegen_templates/native_loader.py imports (a native module carries it)
NATIVE_LOADER_IMPORTS = {"atexit", "ctypes", "hashlib", "os", "platform", "shlex", "shutil",
                         "stat", "subprocess", "sys", "sysconfig", "tempfile", "threading",
                         "importlib.util", "importlib.machinery"}


def check_c(csrc, must_carry=()):
    """A native C file: printable; a // comment never continued onto the next
    line (a line with one never ends in a backslash); no payload word and no
    block comment outside comments.  (Lines without a comment may end in a
    backslash: the helpers' macros.)"""
    assert all(c == "\n" or c.isprintable() for c in csrc)
    comments = []
    for line in csrc.split("\n"):
        code, sep, comment = line.partition("//")
        assert not PAYLOAD_WORDS & set(re.findall(r"\w+", code)), line
        assert "/*" not in code and "*/" not in code, line
        if sep:
            assert not line.rstrip().endswith("\\"), line
            comments.append(comment)
    for text in must_carry:
        assert any(text in _decode_comment("#" + c) for c in comments), f"{text!r} lost:\n{csrc}"


def check_native(src, must_carry=(), c_must_carry=()):
    """A native driver module: a valid Python module whose C_SOURCE is a
    safe C file."""
    tree = check_python(src, must_carry)
    (csrc,) = [n.value.value for n in tree.body if isinstance(n, ast.Assign)
               and getattr(n.targets[0], "id", None) == "C_SOURCE"]
    check_c(csrc, c_must_carry)
    return csrc


def check_module(src, carry):
    """A module of the default target: the name (carry[0]) is in its Python;
    a quoted source line (carry[1:]) in the C's comments when native."""
    if 'TARGET = "native"' in src:
        return check_native(src, carry[:1], carry[1:])
    return check_python(src, carry)


def check_driver(src, must_carry=(), tu_must_carry=()):
    """A CUDA driver module: a valid Python module whose embedded CUDA_SOURCE
    is a valid translation unit (which quotes the source lines of the
    statements its kernels compute)."""
    tree = check_python(src, must_carry)
    (tu,) = [n.value.value for n in tree.body if isinstance(n, ast.Assign)
             and getattr(n.targets[0], "id", None) == "CUDA_SOURCE"]
    check_cuda(tu, tu_must_carry)
    return tu


def check_disk_cache():
    """Every entry written to the disk cache passes the same checks."""
    d = os.environ["TRACEGRAD_CACHE_DIR"]
    for root, _, files in os.walk(d):
        for f in files:
            if f.endswith(".py"):
                with open(os.path.join(root, f), encoding="utf-8") as fh:
                    check_python(fh.read())


# --- the escaping function itself -----------------------------------------------------------------

any_text = st.text(st.characters(codec=None, exclude_categories=()), max_size=30)


@settings(max_examples=300, derandomize=True, database=None)
@given(st.one_of(hostile, any_text), st.one_of(hostile, any_text))
def test_safe_text_cannot_leave_a_comment_or_docstring_and_loses_nothing(a, b):
    sa, sb = templates.safe_text(a), templates.safe_text(b)
    for s in (sa, sb):
        assert all(c.isprintable() for c in s)          # no line break, NUL, control, bidi
        assert len(s.splitlines()) <= 1 and '"""' not in s and "'''" not in s
        assert not s.endswith("\\")                      # a // comment would continue
    # lossless, and composable: pieces next to each other and to quote-free
    # template text still make one valid docstring
    assert _decode(sa) == a and _decode(sa + " of " + sb) == a + " of " + b
    mod = ast.parse(f'def f():\n    """{sa}{sb}"""\n    x = 1  # {sa}\n    return x  # {sb}\n')
    assert len(mod.body) == 1 and len(mod.body[0].body) == 3
    assert ast.get_docstring(mod.body[0], clean=False) == a + b


def test_safe_text_leaves_ordinary_text_alone():
    for text in ("model.loss (/home/me/model.py:12)", "return np.sum(p['w'] * x)",
                 "Größe", "f(x, y) w.r.t. params_w", 'y = x["a"]', r"C:\\Users"):
        s = templates.safe_text(text)
        assert _decode(s) == text
        assert s == text or "\\" in text


@settings(max_examples=300, derandomize=True, database=None)
@given(st.lists(st.one_of(hostile, any_text, st.sampled_from(
    ["np", "math", "base64", "_c0", "t2", "_erf", "input", "len", "slice", "class", "match",
     "__debug__", "𝐧𝐩", "ｎｐ", "x²", "ﬁ", "fi", "forward", "_", "3d", ""])), max_size=6))
def test_identifiers_are_valid_distinct_and_shadow_nothing(names):
    out = pysource.identifiers(names, reserved={"forward"})
    assert len(set(out)) == len(out) == len(names)
    for s in out:
        assert s.isidentifier() and unicodedata.normalize("NFKC", s) == s
        assert s not in {"forward", "np", "math", "base64", "__debug__"} and not s.startswith("_")
        assert not hasattr(builtins, s) and not (s[0] == "t" and s[1:].isdigit())
        assert pysource.identifier(s) == s                # idempotent
    # Python sees them as distinct names too (it compares them after NFKC)
    ns = {}
    exec(compile(f"def g({', '.join(out)}):\n    return ({', '.join(out)}{',' if out else ''})\n",
                 "<t>", "exec"), ns)
    assert ns["g"](*range(len(out))) == tuple(range(len(out)))


# --- tg.compile / tg.grad / .lower() ---------------------------------------------------------------

_counter = itertools.count()


def _function_with_hostile_source(qualname, module, name, filename, line):
    """f(p) = sum(sin(p['a']) * p['b']), whose __qualname__, __module__,
    __name__, file name and quoted source line are the given texts."""
    fname = f"<{filename.replace(chr(0), '0')}_{next(_counter)}>"
    src = "def f(p):\n    return np.sum(np.sin(p['a']) * p['b'])\n"
    ns = {"np": np}
    exec(compile(src, fname, "exec"), ns)
    # what tracegrad quotes from "the file": the second line is hostile
    linecache.cache[fname] = (1, None, ["def f(p):\n", "    return " + line + "\n"], fname)
    f = ns["f"]
    f.__qualname__, f.__module__, f.__name__ = qualname, module, name
    return f, fname


@pytest.mark.parametrize("backend", ["numpy", "native"])
def test_a_source_that_does_not_tokenize_still_compiles(backend):
    # the docstring's line number comes from the code object: inspect's
    # getsourcelines tokenizes the source and raised TokenError on this one
    f, fname = _function_with_hostile_source("f", "m", "f", "file", "'''" + "x")
    try:
        p = {"a": np.linspace(0.1, 1.0, 4), "b": np.arange(4.0)}
        g = tg.grad(f, backend=backend)(p)
        assert np.allclose(g["a"], np.cos(p["a"]) * p["b"])
        assert f"{fname}:1" in tg.grad(f, backend=backend).lower(p).source
    finally:
        linecache.cache.pop(fname, None)


@FUZZ
@given(hostile, hostile, hostile, hostile, hostile)
def test_hostile_function_names_and_source_lines(qualname, module, name, filename, line):
    f, fname = _function_with_hostile_source(qualname, module, name, filename, line)
    try:
        p = {"a": np.linspace(0.1, 1.0, 4), "b": np.arange(4.0)}
        assert np.allclose(tg.compile(f)(p), np.sum(np.sin(p["a"]) * p["b"]))
        g = tg.grad(f)(p)
        assert np.allclose(g["a"], np.cos(p["a"]) * p["b"]) and np.allclose(g["b"], np.sin(p["a"]))
        quoted = ("    return " + line).strip()
        carry = [f"{module}.{qualname}"] + ([quoted] if quoted else [])
        check_module(tg.compile(f).lower(p).source, carry)
        check_module(tg.grad(f).lower(p).source, carry)
        check_cuda(tg.compile(f).lower(p).cuda_source, [quoted] if quoted else [])
        check_driver(tg.compile(f, backend="cupy").lower(p).source, carry[:1], carry[1:])
        check_native(tg.grad(f, backend="native").lower(p).source, carry[:1], carry[1:])
        check_disk_cache()
    finally:
        linecache.cache.pop(fname, None)


@FUZZ
@given(st.lists(hostile, min_size=1, max_size=3, unique=True), hostile)
def test_hostile_dict_keys_and_keyword_names(keys, kwname):
    def f(p, **kw):
        total = kw[kwname] * 2.0
        for k in keys:
            total = total + np.tanh(p[k])
        return np.sum(total)

    p = {k: np.linspace(-1, 1, 3) * (i + 1) for i, k in enumerate(keys)}
    kw = {kwname: np.ones(3)}
    want = np.sum(kw[kwname] * 2.0 + sum(np.tanh(v) for v in p.values()))
    assert np.allclose(tg.compile(f)(p, **kw), want)
    g = tg.grad(f)(p, **kw)
    for k in keys:
        assert np.allclose(g[k], 1 - np.tanh(p[k]) ** 2)
    low = tg.grad(f).lower(p, **kw)
    tree = check_python(low.source)
    # the docstring names what it differentiates with respect to: p's
    # first and last leaves, under their exact keys
    doc = ast.get_docstring(tree.body[-1], clean=False)
    assert any(f"p_{k}" in doc for k in keys), doc
    args = [a.arg for a in ast.parse(low.source).body[-1].args.args]
    assert len(args) == len(keys) + 1 and all(a.isidentifier() for a in args)
    check_cuda(low.cuda_source)
    check_driver(tg.grad(f, backend="cupy").lower(p, **kw).source)
    check_native(tg.grad(f, backend="native").lower(p, **kw).source)
    check_disk_cache()


@FUZZ
@given(hostile)
def test_hostile_static_values(s):
    def f(x, s):
        return {s: np.sum(np.exp(x)) * len(s)}

    x = np.linspace(0, 1, 3)
    out = tg.compile(f, static_argnames=("s",))(x, s=s)
    assert list(out) == [s] and np.allclose(out[s], np.sum(np.exp(x)) * len(s))
    assert np.allclose(tg.grad(lambda x, s: f(x, s)[s], static_argnums=1)(x, s),
                       np.exp(x) * len(s))
    check_python(tg.compile(f, static_argnames=("s",)).lower(x, s=s).source)
    check_disk_cache()


@pytest.mark.parametrize("names", [
    ("a", "t2"), ("a", "t3", "t4", "t5"), ("_c0", "x"), ("np", "x"), ("𝐧𝐩", "x"),
    ("input", "len"), ("slice", "tuple"), ("x", "_erf"), ("x", "math"), ("forward", "x"),
])
def test_argument_names_never_shadow_what_the_generated_code_uses(names):
    # a[0] * 2 + sin(a[1]) * 3 + a constant array: temporaries t2.., a
    # constant _c0 and np all in use
    # (the user's code reaches NumPy as _np: its own argument may be np)
    body = " + ".join(f"_np.sin({n}) * {i + 2}.0" for i, n in enumerate(names))
    ns = {"_np": np}
    exec(f"def f({', '.join(names)}):\n    return {body} + _np.array([1.0, 2.0, 3.0]) ** 2\n", ns)
    f = ns["f"]
    xs = [np.linspace(0.1, 0.9, 3) * (i + 1) for i in range(len(names))]
    want = sum(np.sin(x) * (i + 2.0) for i, x in enumerate(xs)) + np.array([1.0, 4.0, 9.0])
    assert np.allclose(tg.compile(f)(*xs), want)
    assert np.allclose(tg.grad(lambda *a: np.sum(f(*a)))(*xs), np.cos(xs[0]) * 2.0)
    check_python(tg.compile(f).lower(*xs).source)


@pytest.mark.skipif(shutil.which("c++") is None, reason="no host C++ compiler for the emulator")
def test_hostile_text_through_the_emulated_cuda_target():
    # the kernels are compiled (host C++ through tracegrad's emulator
    # header) with hostile comments, and compute the right values
    from tracegrad import testing
    line = 'x \\\n"""\u2028' + PAYLOADS[1] + " //" + PAYLOADS[7] + " \\"
    f, fname = _function_with_hostile_source('q"""\n' + PAYLOADS[0], "m\\", "n\x00", "f\\", line)
    try:
        p = {'k"""\\': np.linspace(0.1, 1.0, 5), "b": np.arange(5.0)}
        g2 = lambda p: f({"a": p['k"""\\'], "b": p["b"]})  # noqa: E731
        with testing.emulated_cupy():
            got = tg.grad(g2, backend="cupy")(p)
            src = tg.grad(g2, backend="cupy").lower(p).source
        check_driver(src)
        assert np.allclose(testing.to_host(got['k"""\\']), np.cos(p['k"""\\']) * p["b"])
    finally:
        linecache.cache.pop(fname, None)


def test_hostile_text_through_the_native_target():
    # the C is built by the C compiler with hostile comments (a trailing
    # backslash would continue a // comment onto the code below it) and
    # computes the right values
    from tracegrad.runtime import toolchain
    if toolchain.recipe_or_none() is None:
        pytest.skip("the native target needs a C compiler")
    line = 'x \\\n"""\u2028' + PAYLOADS[1] + " //" + PAYLOADS[7] + " \\"
    f, fname = _function_with_hostile_source('q"""\n' + PAYLOADS[0], "m\\", "n\x00", "f\\", line)
    try:
        p = {'k"""\\': np.linspace(0.1, 1.0, 5), "b": np.arange(5.0)}
        g2 = lambda p: f({"a": p['k"""\\'], "b": p["b"]})  # noqa: E731
        got = tg.grad(g2, backend="native")(p)
        assert tg.cache_info()["target"] == "native"
        quoted = ("return " + line).strip()
        check_native(tg.grad(g2, backend="native").lower(p).source, (), [quoted])
        assert np.allclose(got['k"""\\'], np.cos(p['k"""\\']) * p["b"])
        check_disk_cache()
    finally:
        linecache.cache.pop(fname, None)


# --- tracegrad compile ----------------------------------------------------------------------------

MODEL = '''\
import numpy as np


def f(x, s):
    return {s: np.sum(np.sin(x)) * len(s)}


def h(x):
    return np.sum(x * x)  # HOSTILE


f.__qualname__ = QUALNAME
globals()[FUNC] = h
'''


@settings(max_examples=25, derandomize=True, deadline=None, database=None,
          phases=[Phase.explicit, Phase.generate], suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(hostile, hostile, hostile.filter(lambda t: t and ":" not in t and "." not in t), hostile)
def test_cli_compile_with_hostile_statics_names_and_files(tmp_path, s, qualname, func, out_name):
    d = tmp_path / f"run{next(_counter)}"
    d.mkdir()
    (d / "model.py").write_text(MODEL.replace("QUALNAME", repr(qualname)).replace(
        "FUNC", repr(func)), encoding="utf-8")
    x = np.linspace(0, 1, 4)
    # --static: the value is repr(s), read back by ast.literal_eval
    # any name the file system can spell (no "/", NUL or lone surrogate)
    safe_name = "".join(c for c in out_name if c not in "/\x00" and not 0xD800 <= ord(c) < 0xE000)
    out = d / f"{safe_name[:40]}.py"
    assert cli.main(["compile", f"{d}/model.py:f", "--arg", "x=float64[4]",
                     "--static", f"s={s!r}", "-o", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    check_python(text, [f"s={s!r}", f"f, line 4"])
    ns = {"__name__": "generated"}
    exec(compile(text, str(out), "exec"), ns)
    assert np.allclose(ns["f"](x)[s], np.sum(np.sin(x)) * len(s))
    # a function whose name is hostile, under a usable --name; its gradient
    out2 = d / "h_grad.py"
    assert cli.main(["compile", f"{d}/model.py:{func}", "--arg", "x=float64[4]", "--grad",
                     "--name", "h_grad", "-o", str(out2)]) == 0
    text = out2.read_text(encoding="utf-8")
    check_python(text, [func])
    ns = {}
    exec(compile(text, str(out2), "exec"), ns)
    assert np.allclose(ns["h_grad"](x), 2 * x)


@pytest.mark.parametrize("value, message", [
    ("tanh", "To pass this text as a string, write --static \"s='tanh'\""),
    ("[1, 2]", "is a list"),
    ("{'a': 1}", "is a dict"),
    ("{[1]: 2}", "is not a Python literal"),
    ("(" * 5000 + ")" * 5000, "is not a Python literal"),
    ("__import__('os').system('echo PWNED')", "is not a Python literal"),
    ("a'\"\"\"", "is not a Python literal"),
])
def test_cli_static_values_that_are_not_plain_literals_are_clear_errors(tmp_path, capsys,
                                                                      value, message):
    (tmp_path / "m.py").write_text("import numpy as np\ndef f(x, s):\n    return np.sum(x)\n")
    rc = cli.main(["compile", f"{tmp_path}/m.py:f", "--arg", "x=float64[2]", "--static",
                   f"s={value}"])
    err = " ".join(capsys.readouterr().err.split())
    assert rc == 2 and "--static" in err and message in err and "internal error" not in err


def test_cli_rejects_hostile_public_names(tmp_path, capsys):
    (tmp_path / "m.py").write_text("import numpy as np\ndef f(x):\n    return np.sum(x)\n")
    for name in ('g"""', "np", "𝐧𝐩", "a\nb", "_check", "class"):
        rc = cli.main(["compile", f"{tmp_path}/m.py:f", "--arg", "x=float64[2]", "--name", name])
        err = capsys.readouterr().err
        assert rc == 2 and "--name" in err and "internal error" not in err
    rc = cli.main(["compile", f"{tmp_path}/m.py:f", "--arg", "x=float64[2]", "-o",
                   str(tmp_path / "a\ud800.py")])
    err = capsys.readouterr().err
    assert rc == 2 and "choose another -o" in err and "internal error" not in err


def _run(args, cwd, env):
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def test_the_reported_cli_exploit_writes_an_inert_module(tmp_path):
    # the probe's command line, verbatim, in a fresh process; then the
    # module imported by two fresh processes
    (tmp_path / "model.py").write_text(
        "import numpy as np\ndef f(x, s):\n    return np.sum(np.sin(x)) * len(s)\n")
    marker = tmp_path / "PWNED"
    payload = f"""s='a\"\"\"; __import__("os").system("echo PWNED > {marker}"); \"\"\"'"""
    n = len(ast.literal_eval(payload[2:]))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    r = _run(["-m", "tracegrad", "compile", "model.py:f", "--arg", "x=float64[3]",
              "--static", payload, "-o", "out.py"], tmp_path, env)
    assert r.returncode == 0, r.stderr
    assert "PWNED" not in r.stdout
    check_python((tmp_path / "out.py").read_text(encoding="utf-8"), [payload])
    for _ in range(2):
        r = _run(["-c", "import numpy as np, out; print(out.f(np.ones(3)))"], tmp_path, env)
        assert r.returncode == 0, r.stderr
        assert float(r.stdout) == pytest.approx(3 * np.sin(1.0) * n)
        assert "PWNED" not in r.stdout and not marker.exists()


def test_a_hostile_disk_cache_entry_is_inert_in_every_process(tmp_path):
    # compile in one process, load the disk entry in another: neither runs
    # the payload hidden in the function's qualified name
    marker = tmp_path / "PWNED"
    touch = f"\n__import__('pathlib').Path({str(marker)!r}).touch()\n"
    qualname, module = "f" + touch + "#", 'm"""' + touch + '"""'
    script = textwrap.dedent(f"""
        import numpy as np, tracegrad as tg
        def f(x):
            return np.sum(np.cos(x))
        f.__qualname__ = {qualname!r}
        f.__module__ = {module!r}
        print(tg.compile(f)(np.zeros(3)), tg.cache_info()["disk_entries"])
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path),
               TRACEGRAD_CACHE_DIR=str(tmp_path / "cache"))
    (tmp_path / "s.py").write_text(script)
    first, second = (_run(["s.py"], tmp_path, env) for _ in range(2))
    for r in (first, second):
        assert r.returncode == 0, r.stderr
        assert r.stdout.split()[0] == "3.0"
    assert int(second.stdout.split()[1]) >= 1 and not marker.exists()
