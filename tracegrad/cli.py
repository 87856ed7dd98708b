"""The ``tracegrad`` command line.

    tracegrad compile FILE.py:FUNC --arg w=float64[128,64] [--arg ...] [--static n=3]
              [--grad | --value-and-grad | --vjp | --jvp | --jacobian | --hessian]
              [--wrt w,b] [--backend numpy|cupy] [--name NAME] -o OUT.py
    tracegrad show FILE.py:FUNC --arg ... [--grad ...] [--format source|ir|dot] [--render g.png]
    tracegrad cache info | tracegrad cache prune [--max-bytes SIZE] | tracegrad cache clear

``compile`` writes ONE standalone module: the generated code of the chosen
transform (from ``.lower()``, exactly what the decorator runs), wrapped in a
function with the user's argument names that checks shapes and dtypes at the
door.  The module imports only NumPy (or CuPy); tracegrad is not needed to
run it.

Every mistake a user can make at the command line (a missing file or
function, an argument spec that does not parse, a shape the function
rejects, value-dependent control flow) ends in one paragraph on stderr and
exit status 2; ``--debug`` shows the Python traceback instead.
"""
from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import inspect
import keyword
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
import traceback
import unicodedata

import numpy as np

from tracegrad._version import __version__

EXIT_USAGE = 2

TRANSFORMS = {
    # option -> (description, the api kind lowered for it)
    "forward": ("the value of", "forward"),
    "grad": ("the gradient of", "grad"),
    "value_and_grad": ("the value and gradient of", "value_and_grad"),
    "vjp": ("the value and vector-Jacobian product of", "vjp"),
    "jvp": ("the value and Jacobian-vector product of", "jvp"),
    "jacobian": ("the Jacobian (reverse mode) of", "jacrev"),
    "hessian": ("the Hessian of", "hessian"),
}

# Names the generated module defines or imports at top level; the public
# function may not take one of them.
_RESERVED = {"np", "_numpy", "numpy", "cupy", "math", "base64"}


class CLIError(Exception):
    """A mistake at the command line: reported as one paragraph, exit status 2."""


# --- argument specs -------------------------------------------------------------------

_ARG_RE = re.compile(r"^\s*([A-Za-z_]\w*)\s*=\s*([A-Za-z][A-Za-z0-9_]*)\s*\[([^\]]*)\]\s*$")


def parse_arg_spec(spec):
    """``'w=float64[128,64]'`` -> ``('w', dtype('float64'), (128, 64))``;
    ``'s=float64[]'`` is a scalar."""
    m = _ARG_RE.match(spec)
    if not m:
        raise CLIError(
            f"--arg {spec!r} does not parse: write NAME=DTYPE[SHAPE], for example "
            f"--arg w=float64[128,64] for a matrix, --arg x=float32[10] for a vector or "
            f"--arg s=float64[] for a scalar.")
    name, dtype_name, dims = m.groups()
    try:
        dtype = np.dtype(dtype_name)
        if dtype.kind not in "biufc" or dtype_name != dtype.name and dtype_name not in (
                "float", "int", "bool", "complex"):
            raise TypeError
        if dtype_name in ("float", "int", "complex"):  # NumPy's defaults, spelled out
            dtype = np.dtype({"float": "float64", "int": "int64", "complex": "complex128"}[dtype_name])
    except TypeError:
        raise CLIError(
            f"--arg {spec!r}: {dtype_name!r} is not a NumPy numeric dtype name; use one of "
            f"float64, float32, float16, int64, int32, int8, uint8, bool, complex128.") from None
    shape = []
    for d in (p.strip() for p in dims.split(",")) if dims.strip() else ():
        if not d.isdigit():
            raise CLIError(
                f"--arg {spec!r}: the shape [{dims}] must be non-negative integers separated by "
                f"commas, like [128,64], or empty [] for a scalar.")
        shape.append(int(d))
    return name, dtype, tuple(shape)


# What a --static value may be: a plain literal, so that it can reach the
# generated module only as its repr() (and the cache key only as itself).
_PLAIN = (str, bytes, int, float, complex, bool, type(None))


def _is_plain_literal(value):
    if isinstance(value, tuple):
        return all(_is_plain_literal(v) for v in value)
    return type(value) in _PLAIN


def parse_static(spec):
    """``'n=3'`` -> ``('n', 3)``: the value is a plain Python literal (a
    number, a string or bytes in quotes, True/False/None, or a tuple of
    these), read with ``ast.literal_eval``, never evaluated."""
    name, eq, text = spec.partition("=")
    name = name.strip()
    text = text.strip()
    if not eq or not name.isidentifier():
        raise CLIError(f"--static {spec!r} does not parse: write NAME=VALUE with a Python "
                       f"literal value, for example --static n_steps=100 or --static mode=\"'tanh'\".")
    # the same text spelled as a Python string, quoted for the shell: in
    # double quotes where that needs no escapes, as most strings do
    as_string = f"{name}={text!r}"
    as_string = f'"{as_string}"' if not set('"$`\\!') & set(as_string) else shlex.quote(as_string)
    try:
        value = ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        # literal_eval raises these for text that is not a literal (TypeError
        # for an unhashable dict key, RecursionError for deep nesting)
        raise CLIError(
            f"--static {spec!r}: {text!r} is not a Python literal (a number, a string in "
            f"quotes, True/False/None, or a tuple of these), for example --static {name}=3 or "
            f"--static {name}=\"'tanh'\". To pass this text as a string, write "
            f"--static {as_string}.") from None
    if not _is_plain_literal(value):
        kind = type(value).__name__
        raise CLIError(
            f"--static {spec!r}: {text!r} is a {kind}; a static value must be a number, a "
            f"string, bytes, True/False/None or a tuple of these (it is part of the cache "
            f"key and is written into the generated module), for example --static {name}=(1, 2) "
            f"instead of a list [1, 2].")
    return name, value


def spec_str(dtype, shape):
    return f"{np.dtype(dtype).name}[{', '.join(str(d) for d in shape)}]"


# --- loading the user's function ----------------------------------------------------------

def load_function(target):
    """``FILE.py:FUNC`` or ``pkg.mod:FUNC`` (FUNC may be dotted) -> (function, where)."""
    mod_part, colon, func_part = target.rpartition(":")
    if not colon or not mod_part or not func_part:
        raise CLIError(f"{target!r} does not name a function: write FILE.py:FUNC (a path to a "
                       f"Python file and the function's name in it) or package.module:FUNC.")
    if mod_part.endswith(".py") or os.sep in mod_part or "/" in mod_part:
        path = os.path.abspath(mod_part)
        if not os.path.isfile(path):
            raise CLIError(f"no such file: {mod_part} (looked for {path}); give the path to the "
                           f"Python file that defines {func_part}, as FILE.py:FUNC.")
        stem = os.path.splitext(os.path.basename(path))[0]
        mod_name = stem if stem.isidentifier() and stem not in sys.modules else \
            "tracegrad_user_" + re.sub(r"\W", "_", stem)
        # the file's own folder first, so its sibling imports work as when run as a script
        sys.path.insert(0, os.path.dirname(path))
        spec = importlib.util.spec_from_file_location(mod_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = module
        where = mod_part
        try:
            spec.loader.exec_module(module)
        except SystemExit:
            raise CLIError(f"running {mod_part} to find {func_part} called sys.exit(); put the "
                           f"script part of the file under `if __name__ == \"__main__\":`.") from None
        except Exception as e:
            raise CLIError(f"running {mod_part} to find {func_part} failed with "
                           f"{_exc_summary(e, path)}; the file must import cleanly.") from e
    else:
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        where = mod_part
        try:
            module = importlib.import_module(mod_part)
        except ModuleNotFoundError as e:
            raise CLIError(f"cannot import the module {mod_part!r} ({e}); for a file write "
                           f"FILE.py:FUNC, for a module make sure it is installed or in the "
                           f"current folder.") from e
        except Exception as e:
            raise CLIError(f"importing {mod_part} failed with {_exc_summary(e)}.") from e
    obj = module
    for part in func_part.split("."):
        if not hasattr(obj, part):
            funcs = sorted(n for n, v in vars(module).items()
                           if inspect.isfunction(v) and getattr(v, "__module__", None) == module.__name__
                           or type(v).__name__ == "Compiled")
            hint = f" Functions defined there: {', '.join(funcs)}." if funcs else \
                " It defines no functions."
            raise CLIError(f"{where} has no function {func_part!r}.{hint}")
        obj = getattr(obj, part)
    fn = getattr(obj, "fn", obj) if type(obj).__name__ == "Compiled" else obj  # @tg.compile
    if not callable(fn):
        raise CLIError(f"{where}:{func_part} is a {type(fn).__name__}, not a function.")
    return fn, where


def _exc_summary(e, path=None):
    """'TypeError: ... (file.py, line 3)' with the innermost frame in ``path``."""
    text = f"{type(e).__name__}: {e}"
    tb = traceback.extract_tb(e.__traceback__)
    frames = [f for f in tb if path is None or os.path.abspath(f.filename) == path]
    if frames:
        f = frames[-1]
        text += f" ({os.path.basename(f.filename)}, line {f.lineno})"
    return text


# --- the function's arguments --------------------------------------------------------------

class Target:
    """The user's function with its arguments resolved from --arg and --static."""

    def __init__(self, fn, where, func_name, arg_specs, static_specs):
        self.fn = fn
        self.where = where
        self.func_name = func_name
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError):
            raise CLIError(f"cannot read the signature of {func_name}; compile needs a Python "
                           f"function with named arguments.") from None
        params = sig.parameters
        args = {}
        for spec in arg_specs:
            name, dtype, shape = parse_arg_spec(spec)
            if name in args:
                raise CLIError(f"--arg {name} is given twice.")
            args[name] = (dtype, shape)
        statics = {}
        for spec in static_specs:
            name, value = parse_static(spec)
            if name in statics or name in args:
                raise CLIError(f"argument {name!r} is given twice (--arg/--static).")
            statics[name] = value
        for p in params.values():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                raise CLIError(f"{func_name} takes *{p.name}/**{p.name}; compile needs a function "
                               f"whose arguments are all named, like def {func_name}(w, x, y).")
        named = list(params)
        for n in list(args) + list(statics):
            if n not in params:
                raise CLIError(f"{func_name} has no argument {n!r}; its arguments are "
                               f"{', '.join(named) or '(none)'}.")
        missing = [p.name for p in params.values()
                   if p.name not in args and p.name not in statics and p.default is p.empty]
        if missing:
            raise CLIError(
                f"{func_name}({', '.join(named)}) needs a value for "
                f"{', '.join(repr(m) for m in missing)}: give each array argument as "
                f"--arg NAME=DTYPE[SHAPE] (e.g. --arg {missing[0]}=float64[10]) and each "
                f"non-array argument as --static NAME=VALUE.")
        if not args:
            raise CLIError(f"{func_name}: give at least one array argument with --arg NAME=DTYPE[SHAPE].")
        for n in args:
            if n in _RESERVED or keyword.iskeyword(n):
                raise CLIError(f"argument name {n!r} clashes with a module the generated code "
                               f"imports; rename the argument in {func_name}.")
        self.params = params
        self.dyn = [n for n in named if n in args]        # array arguments, in signature order
        self.specs = [args[n] for n in self.dyn]
        self.statics = statics
        self.out_tree = None

    def bound(self):
        """A function of the array arguments only (static values bound), named
        like the user's; it records the structure of what the user's returns."""
        fn, params, dyn, statics = self.fn, self.params, self.dyn, self.statics
        target = self

        def bound(*arrays):
            given = dict(zip(dyn, arrays))
            given.update(statics)
            pos = [given.pop(p.name) for p in params.values()
                   if p.kind is p.POSITIONAL_ONLY and p.name in given]
            out = fn(*pos, **given)
            from tracegrad.frontend.trace import tree_flatten
            target.out_tree = tree_flatten(out)[1]
            return out

        bound.__name__ = getattr(fn, "__name__", "f")
        bound.__qualname__ = getattr(fn, "__qualname__", bound.__name__)
        bound.__module__ = getattr(fn, "__module__", None)
        bound.__signature__ = inspect.Signature(
            [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in dyn])
        return bound

    def placeholders(self):
        """Arrays of the right shapes and dtypes, without allocating them:
        lowering only reads shapes and dtypes."""
        return [np.broadcast_to(np.zeros((), dtype), shape) for dtype, shape in self.specs]

    def signature_text(self):
        return ", ".join(f"{n}: {spec_str(*s)}" for n, s in zip(self.dyn, self.specs))


def resolve_wrt(target, transform, wrt_text):
    """Positions (among the array arguments) to differentiate with respect to."""
    if transform == "forward":
        if wrt_text:
            raise CLIError("--wrt needs a transform (--grad, --value-and-grad, --vjp, --jvp, "
                           "--jacobian or --hessian); the forward computation has no derivative.")
        return []
    if wrt_text:
        names = [w.strip() for w in wrt_text.split(",") if w.strip()]
    elif transform in ("vjp", "jvp"):   # like tg.vjp / tg.jvp: every floating-point array
        names = [n for n, (dt, _) in zip(target.dyn, target.specs) if dt.kind in "fc"]
    else:                                # like tg.grad: the first argument
        names = [target.dyn[0]]
    pos = []
    for n in names:
        if n in target.statics:
            raise CLIError(f"--wrt {n}: {n!r} is a --static argument; derivatives are taken with "
                           f"respect to array arguments (--arg).")
        if n not in target.dyn:
            raise CLIError(f"--wrt {n}: {target.func_name} has no array argument {n!r}; its "
                           f"array arguments are {', '.join(target.dyn)}.")
        dtype = target.specs[target.dyn.index(n)][0]
        if dtype.kind not in "fc":
            raise CLIError(f"--wrt {n}: {n!r} is {dtype.name}; derivatives are taken with respect "
                           f"to floating-point arguments. Declare it float64 or choose another --wrt.")
        if target.dyn.index(n) in pos:
            raise CLIError(f"--wrt {n} is given twice.")
        pos.append(target.dyn.index(n))
    if not pos:
        raise CLIError(f"--{transform.replace('_', '-')}: {target.func_name} has no floating-point "
                       f"array argument to differentiate; declare one with --arg NAME=float64[...].")
    return pos


# --- lowering ---------------------------------------------------------------------------------

def lower(target, transform, wrt, backend):
    """The ``Lowered`` (graph, generated source) of one transform.

    forward/grad/value_and_grad/jacobian/hessian come straight from the
    decorator's ``.lower()``.  tg.vjp and tg.jvp have no ``.lower()``, so
    their graphs are derived here from the forward graph that ``.lower()``
    returns, with the same transforms tg.vjp/tg.jvp apply
    (tracegrad.runtime.pipeline.transform) and printed by the same code generator."""
    fn = target.bound()
    lowered = _lower(fn, target, transform, wrt, backend)
    # The generated docstring names the function's file; point it at the
    # user's file rather than at the wrapper above, which binds static values.
    try:
        ours = f"({inspect.getsourcefile(fn)}:{inspect.getsourcelines(fn)[1]})"
        theirs = f"({inspect.getsourcefile(target.fn)}:{inspect.getsourcelines(target.fn)[1]})"
        # as the generated source spells them: through the code generator's escaping
        from tracegrad.targets.templates import safe_text
        lowered.source = lowered.source.replace(safe_text(ours), safe_text(theirs))
    except (TypeError, OSError):
        pass
    return lowered


def _lower(fn, target, transform, wrt, backend):
    import tracegrad as tg
    from tracegrad.api import Lowered

    xs = target.placeholders()
    argnums = tuple(wrt) if len(wrt) > 1 else (wrt[0] if wrt else 0)
    # The standalone module cannot read the user's module at run time: the
    # arrays the function captured (globals, closure variables) are frozen
    # into it with the values they have now (Lowered.frozen lists them).
    # Its C is specialised to these sizes (dynamic=False): a generic module
    # takes its builder from tracegrad, which the standalone module must not.
    if transform == "forward":
        return tg.compile(fn, backend=backend, dynamic=False)._lower(xs, {}, capture="freeze")
    if transform in ("grad", "value_and_grad", "jacobian", "hessian"):
        make = {"grad": tg.value_and_grad, "value_and_grad": tg.value_and_grad,
                "jacobian": tg.jacobian, "hessian": tg.hessian}[transform]
        return make(fn, argnums=argnums, backend=backend, dynamic=False)._lower(
            xs, {}, capture="freeze")
    from tracegrad.runtime import cache, pipeline
    fwd = tg.compile(fn, backend=backend, dynamic=False)._lower(xs, {}, capture="freeze")
    n_out = len(fwd.graph.graph["outputs"])
    names = list(target.dyn)
    g2 = pipeline.transform(fwd.graph, transform, wrt)
    if transform == "vjp":
        names += ["ct"] if n_out == 1 else [f"ct_{i}" for i in range(n_out)]
        what = "outputs, then the cotangents of " + ", ".join(target.dyn[i] for i in wrt)
    else:
        names += [f"t_{target.dyn[i]}" for i in wrt]
        what = "outputs, then their tangents"
    parts = dict(fwd.key_parts, transform=transform, wrt=repr(list(wrt)))
    key = cache.key_hash(parts)
    src = fwd.key_parts.get("function", target.func_name)
    source = pipeline.generate(
        [(g2, transform, names, f"The {transform} of {src}: the {what}.")], fwd.backend,
        source=src, transform=transform, key=key, dynamic=False)
    lowered = Lowered(g2, source, key, parts, fwd.backend)
    lowered.frozen = fwd.frozen
    return lowered


def run_lowering(target, transform, wrt, backend):
    """``lower`` with the user's mistakes turned into CLIErrors."""
    from tracegrad.frontend.trace import TraceError
    try:
        return lower(target, transform, wrt, backend)
    except TraceError as e:
        raise CLIError(f"cannot trace {target.func_name}({target.signature_text()}): "
                       f"{_one_paragraph(str(e))} At the command line, a static argument is "
                       f"--static NAME=VALUE.") from e
    except CLIError:
        raise
    except Exception as e:
        _check_single_output(target, transform)
        user_file = inspect.getsourcefile(target.fn) if inspect.isfunction(target.fn) else None
        raise CLIError(
            f"tracing {target.func_name}({target.signature_text()}) for "
            f"--{transform.replace('_', '-')} failed with "
            f"{_exc_summary(e, os.path.abspath(user_file) if user_file else None)}."
            + (" Check that the --arg shapes and dtypes are ones the function accepts."
               if isinstance(e, ValueError) else "")) from e


def _check_single_output(target, transform):
    """grad, value_and_grad, jacobian and hessian differentiate one output array."""
    if transform in ("grad", "value_and_grad", "jacobian", "hessian") and \
            target.out_tree not in (None, ("leaf",)):
        raise CLIError(f"--{transform.replace('_', '-')} needs {target.func_name} to return one "
                       f"array, but it returns a {target.out_tree[0]} of several; return the one "
                       f"to differentiate, or use --vjp/--jvp, which take any output structure.")


def _one_paragraph(msg):
    msg = re.sub(r":\n\s+(.+?)\n", lambda m: f": `{m.group(1).strip()}`. ", msg)
    return " ".join(msg.split())


# --- the standalone module -------------------------------------------------------------------

def _tree_code(tree, leaves):
    """Python source rebuilding the output structure ``tree`` from leaf expressions."""
    it = iter(leaves)

    def rec(d):
        kind = d[0]
        if kind == "leaf":
            return next(it)
        if kind == "none":
            return "None"
        if kind in ("tuple", "namedtuple"):
            items = [rec(e) for e in (d[1] if kind == "tuple" else d[2])]
            return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
        if kind == "list":
            return "[" + ", ".join(rec(e) for e in d[1]) + "]"
        if kind == "dict":
            for k in d[1]:
                if not _is_plain_literal(k):
                    raise CLIError(
                        f"the function returns a dict with the key {k!r} of type "
                        f"{type(k).__name__}; the standalone module rebuilds dicts whose keys "
                        f"are strings, numbers, bytes, True/False/None or tuples of these.")
            return "{" + ", ".join(f"{k!r}: {rec(e)}" for k, e in zip(d[1], d[2])) + "}"
        raise ValueError(kind)

    return rec(tree)


def _group(items):
    return items[0] if len(items) == 1 else "(" + ", ".join(items) + ")"


_CHECK_NUMPY = '''
def _check(fname, names, values, specs):
    """Each argument as an array of the declared dtype and shape, or a clear error."""
    arrays = []
    for name, x, (dtype, shape) in zip(names, values, specs):
        if isinstance(x, np.ndarray):
            a = x
        elif isinstance(x, (bool, int, float, complex, list, tuple)):
            a = np.asarray(x)  # Python numbers and lists take the declared dtype when they can
            if a.dtype != dtype and np.can_cast(a.dtype, dtype, "same_kind"):
                a = a.astype(dtype)
        elif isinstance(x, np.generic):
            a = np.asarray(x)
        else:
            raise TypeError(f"{fname}(): argument {name!r} must be a NumPy array "
                            f"{_spec(dtype, shape)}, got {type(x).__name__}")
        if a.dtype != dtype or a.shape != shape:
            raise ValueError(f"{fname}(): argument {name!r} must be {_spec(dtype, shape)}, "
                             f"got {_spec(a.dtype, a.shape)}")
        arrays.append(a)
    return arrays
'''

_CHECK_CUPY = '''
def _check(fname, names, values, specs):
    """Each argument as a CuPy array of the declared dtype and shape, or a
    clear error.  (In this module the name np is CuPy, _numpy is NumPy.)"""
    arrays = []
    for name, x, (dtype, shape) in zip(names, values, specs):
        if isinstance(x, np.ndarray):
            a = x
        elif isinstance(x, (bool, int, float, complex)) and shape == ():
            a = np.asarray(_numpy.asarray(x).astype(dtype, casting="same_kind"))
        else:
            raise TypeError(f"{fname}(): argument {name!r} must be a CuPy array "
                            f"{_spec(dtype, shape)} on the GPU (cupy.asarray(x)), got "
                            f"{type(x).__module__}.{type(x).__name__}")
        if a.dtype != dtype or a.shape != shape:
            raise ValueError(f"{fname}(): argument {name!r} must be {_spec(dtype, shape)}, "
                             f"got {_spec(a.dtype, a.shape)}")
        arrays.append(a)
    return arrays
'''

_SPEC_FN = '''

def _spec(dtype, shape):
    return f"{dtype.name}[{', '.join(str(d) for d in shape)}]"
'''


def _fresh(names, taken):
    """``names`` made distinct from ``taken`` and from each other."""
    from tracegrad.targets.pysource import identifier
    out = []
    for n in names:
        out.append(identifier(n, set(taken) | set(out)))
    return out


def _wrapper_globals(kernel):
    """The module-level names the public function reads."""
    return {kernel, "_check", "_spec", "_ARGS", "_SPECS"} | _RESERVED


def standalone_module(target, transform, wrt, backend, lowered, public_name, command):
    """Source of the standalone module for ``lowered``.  User text reaches it
    as identifiers (checked), through repr() of plain literals, or escaped
    by ``templates.safe_text`` in the docstrings."""
    from tracegrad.targets.templates import safe_text
    source = lowered.source
    inner = {"forward": "forward", "grad": "value_and_grad", "value_and_grad": "value_and_grad",
             "jacobian": "jacobian", "hessian": "hessian"}.get(transform, transform)
    found = re.search(rf"^def {inner}\(", source, re.M)
    if found is None:
        raise RuntimeError(f"the generated module has no function {inner}()")
    defs = list(re.finditer(r"^def (\w+)\(", source, re.M))
    kernel = f"_{public_name}_{transform}"
    top_names = {d.group(1) for d in defs} | set(re.findall(r"^(_c\d+) =", source, re.M))
    if public_name in top_names | _wrapper_globals(kernel) \
            or not public_name.isidentifier() or keyword.iskeyword(public_name) \
            or unicodedata.normalize("NFKC", public_name) != public_name:  # 𝐧𝐩 is np
        raise CLIError(f"the function name {public_name!r} is not a usable name in the generated "
                       f"module; choose another with --name.")
    source = source[:found.start()] + f"def {kernel}(" + source[found.end():]
    if backend == "cupy" and "import cupy as np" not in source:
        raise CLIError("the CUDA target did not produce a CuPy driver for this function; "
                       "use --backend numpy.")
    xp = "_numpy" if backend == "cupy" else "np"

    dyn = target.dyn
    n_out = len(lowered.graph.graph["outputs"])
    _check_single_output(target, transform)
    wrt_names = [dyn[i] for i in wrt]
    params = list(dyn)
    out_tree = target.out_tree
    k = len(wrt)

    # what the public function returns, from the kernel's flat outputs `r`
    if transform == "forward":
        ret = _tree_code(out_tree, [f"r[{i}]" for i in range(n_out)])
        returns = f"what {safe_text(target.func_name)} returns"
    elif transform in ("grad", "value_and_grad"):
        value = _tree_code(out_tree, ["r[0]"])
        grads = _group([f"r[{1 + i}]" for i in range(k)])
        ret = grads if transform == "grad" else f"({value}, {grads})"
        gdesc = ("the gradient w.r.t. " + wrt_names[0]) if k == 1 else \
            "a tuple of gradients w.r.t. " + ", ".join(wrt_names)
        returns = gdesc if transform == "grad" else f"(value, {gdesc})"
    elif transform == "jacobian":
        ret = _group([f"r[{i}]" for i in range(k)])
        returns = ("the Jacobian w.r.t. " + wrt_names[0] + ", shape out.shape + "
                   + wrt_names[0] + ".shape") if k == 1 else \
            "a tuple of Jacobians w.r.t. " + ", ".join(wrt_names)
    elif transform == "hessian":
        if k == 1:
            ret = "r[0]"
            returns = f"the Hessian w.r.t. {wrt_names[0]}, shape {wrt_names[0]}.shape * 2"
        else:
            rows = [_group([f"r[{i * k + j}]" for j in range(k)]) for i in range(k)]
            ret = "(" + ", ".join(rows) + ")"
            returns = (f"the Hessian blocks ((d2f/d{wrt_names[0]}d{wrt_names[0]}, ...), ...) "
                       f"over {', '.join(wrt_names)}, row i column j = d2f/d(arg i)d(arg j)")
    elif transform == "vjp":
        n_prim = n_out - k
        ct_names = _fresh(["ct"] if n_prim == 1 else [f"ct_{i}" for i in range(n_prim)], params)
        params += ct_names
        value = _tree_code(out_tree, [f"r[{i}]" for i in range(n_prim)])
        cts = "(" + ", ".join(f"r[{n_prim + i}]" for i in range(k)) + ("," if k == 1 else "") + ")"
        ret = f"({value}, {cts})"
        returns = (f"(value, cotangents): the cotangent of each of {', '.join(wrt_names)} "
                   f"(a tuple, as tg.vjp's vjp_fn returns) for the output cotangent "
                   f"{', '.join(ct_names)}")
    elif transform == "jvp":
        n_prim = n_out // 2
        t_names = _fresh([f"t_{n}" for n in wrt_names], params)
        params += t_names
        value = _tree_code(out_tree, [f"r[{i}]" for i in range(n_prim)])
        tang = _tree_code(out_tree, [f"r[{n_prim + i}]" for i in range(n_prim)])
        ret = f"({value}, {tang})"
        returns = (f"(value, tangent): the output and its directional derivative along "
                   f"{', '.join(t_names)}")
    else:
        raise ValueError(transform)

    specs = list(target.specs)
    if transform == "vjp":
        g = lowered.graph
        for v in g.graph["inputs"][len(dyn):]:
            specs.append((np.dtype(g.nodes[v]["dtype"]), tuple(g.nodes[v]["shape"])))
    elif transform == "jvp":
        specs += [target.specs[i] for i in wrt]

    for p in params:  # they are the signature's names; never anything else
        if not p.isidentifier() or keyword.iskeyword(p) or p in _wrapper_globals(kernel):
            raise CLIError(f"the argument name {p!r} is not usable in the generated module "
                           f"(it would shadow {p!r} there); rename it in {target.func_name}.")
    desc = TRANSFORMS[transform][0]
    wrt_txt = f" with respect to {', '.join(wrt_names)}" if transform != "forward" else ""
    # user text reaches the docstrings only through safe_text: the function's
    # name (any attribute name), the file, the command line, static values
    fname, where = safe_text(target.func_name), safe_text(target.where)
    statics = safe_text(", ".join(f"{n}={v!r}" for n, v in target.statics.items()))
    command = safe_text(command)
    lib = "CuPy" if backend == "cupy" else "NumPy"
    try:
        line = f", line {inspect.getsourcelines(target.fn)[1]}"
    except (TypeError, OSError):
        line = ""
    arg_lines = "\n".join(f"    {n:<12} {spec_str(*s)}" for n, s in zip(params, specs))
    frozen = getattr(lowered, "frozen", None)
    frozen = (textwrap.fill("Captured arrays frozen in with the values they had when this module "
                            "was generated (the compiled function reads them at call time; "
                            "this module cannot): " + safe_text(", ".join(frozen)) + ".", 76,
                            break_long_words=False, break_on_hyphens=False) + "\n"
              if frozen else "")
    call = f"{public_name}({', '.join(params)})"
    head = f'''"""{public_name}: {desc} {fname}{wrt_txt}.

Generated by tracegrad {__version__} (`tracegrad compile`) from
{where}:{fname}{line}, transform --{transform.replace("_", "-")}.
Standalone: it needs {lib} only, not tracegrad. Regenerate it rather than edit it:

    {command}

Usage:

    from {{module}} import {public_name}
    result = {call}

Arguments (checked on every call; a wrong shape or dtype raises ValueError):
{arg_lines}
{"Static values baked in: " + statics + chr(10) if statics else ""}{frozen}Returns {returns}.
"""
'''
    # never split a word, so an escape (\n, \") stays whole
    doc = textwrap.fill(f"{desc[0].upper() + desc[1:]} {fname}"
                        f"({', '.join(dyn)}){wrt_txt}, generated by tracegrad {__version__} "
                        f"from {where}. Returns {returns}.", 76,
                        subsequent_indent="    ", break_long_words=False, break_on_hyphens=False)
    spec_tuple = "(" + ", ".join(f"({xp}.dtype({s[0].name!r}), {tuple(s[1])!r})" for s in specs) \
        + ("," if len(specs) == 1 else "") + ")"
    names_tuple = "(" + ", ".join(repr(p) for p in params) + ("," if len(params) == 1 else "") + ")"
    wrapper = f'''
{(_CHECK_CUPY if backend == "cupy" else _CHECK_NUMPY).strip()}
{_SPEC_FN}

_ARGS = {names_tuple}
_SPECS = {spec_tuple}


def {call}:
    """{doc}"""
    r = {kernel}(*_check({public_name!r}, _ARGS, ({", ".join(params)}{"," if len(params) == 1 else ""}), _SPECS))
    return {ret}
'''
    return head + "\n" + source.rstrip() + "\n\n" + wrapper.rstrip() + "\n"


# --- commands ------------------------------------------------------------------------------------

def _target_from_args(a):
    fn, where = load_function(a.target)
    func_name = a.target.rpartition(":")[2].split(".")[-1]
    target = Target(fn, where, func_name, a.arg or [], a.static or [])
    wrt = resolve_wrt(target, a.transform, a.wrt)
    return target, wrt


def cmd_compile(a):
    target, wrt = _target_from_args(a)
    lowered = run_lowering(target, a.transform, wrt, a.backend)
    name = a.name or target.func_name
    command = "tracegrad compile " + " ".join(_quote(x) for x in a.argv)
    text = standalone_module(target, a.transform, wrt, a.backend, lowered, name, command)
    if getattr(lowered, "frozen", None):
        print(f"tracegrad compile: note: {target.func_name} reads captured arrays; the "
              f"standalone module holds their current values (frozen): "
              f"{', '.join(lowered.frozen)}", file=sys.stderr)
    if a.backend == "native":
        text = _native_standalone(text)
    module_name = "OUT" if a.output == "-" else os.path.splitext(os.path.basename(a.output))[0]
    from tracegrad.targets.templates import safe_text   # the output's name is user text too
    text = text.replace("from {module} import", f"from {safe_text(module_name)} import", 1)
    compile(text, a.output, "exec")  # never write a module that does not parse
    if a.output == "-":
        sys.stdout.write(text)
    else:
        try:
            with open(a.output, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as e:
            raise CLIError(f"cannot write {a.output}: {e.strerror}.") from None
        except UnicodeEncodeError:   # a name the file system cannot spell
            raise CLIError(f"cannot write {a.output!r}: the file system cannot encode that "
                           f"name; choose another -o.") from None
        print(f"wrote {a.output}: {name}({', '.join(_params_of(text, name))}) computes "
              f"{TRANSFORMS[a.transform][0]} {target.func_name}", file=sys.stderr)
        c_text = _c_text_of(text) if a.backend == "native" else None
        if c_text is not None:
            # the C source beside the module, for people and other build systems;
            # the module embeds the same text and builds it on first import
            c_path = os.path.splitext(a.output)[0] + ".c"
            try:
                with open(c_path, "w", encoding="utf-8") as f:
                    f.write(c_text)
            except OSError as e:
                raise CLIError(f"cannot write {c_path}: {e.strerror}.") from None
            print(f"wrote {c_path}: its C kernels (the module builds them with CC or cc "
                  f"when first imported)", file=sys.stderr)
    return 0


def _params_of(text, name):
    m = re.search(rf"^def {re.escape(name)}\((.*)\):", text, re.M)
    return [p.strip() for p in m.group(1).split(",")] if m else []


def _quote(s):
    import shlex
    return shlex.quote(s)


def cmd_show(a):
    target, wrt = _target_from_args(a)
    lowered = run_lowering(target, a.transform, wrt, a.backend)
    if a.render:
        dot = shutil.which("dot")
        if dot is None:
            raise CLIError(f"cannot render {a.render}: Graphviz's `dot` program is not installed "
                           f"(not found on PATH). Install Graphviz (apt-get install graphviz, "
                           f"brew install graphviz, conda install graphviz), or write the graph "
                           f"as text with --format dot > graph.dot and render it elsewhere.")
        fmt = os.path.splitext(a.render)[1].lstrip(".").lower() or "png"
        r = subprocess.run([dot, f"-T{fmt}", "-o", a.render], input=lowered.dot(),
                           text=True, capture_output=True)
        if r.returncode != 0:
            raise CLIError(f"Graphviz `dot -T{fmt}` failed to render {a.render}: "
                           f"{_one_paragraph(r.stderr) or 'no message'}.")
        print(f"rendered the graph of {target.func_name} (--{a.transform.replace('_', '-')}) "
              f"to {a.render}", file=sys.stderr)
        return 0
    text = {"source": lambda: lowered.source, "ir": lowered.text, "dot": lowered.dot,
            "c": lambda: _c_source(lowered)}[a.format]()
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return 0


def _c_source(lowered):
    """The native target's C kernels of a lowered graph (show --format c)."""
    from tracegrad.runtime import toolchain
    from tracegrad.targets.native import codegen as native
    return native.translation_unit(lowered.graph, rec=toolchain.recipe_or_none())


def _native_standalone(text):
    """A native module for `compile`: it finds the user's compiler (CC or
    cc) when first imported instead of the one tracegrad probed here."""
    text, n = re.subn(r"^_RECIPE = .*$", "_RECIPE = None   # found on first import: CC or cc",
                      text, count=1, flags=re.M)
    if n != 1:
        raise CLIError("the native target did not produce a C module for this function (is "
                       "a C compiler installed? see the log line above); use --backend numpy.")
    return text


def _c_text_of(module_text):
    import ast
    for node in ast.parse(module_text).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] \
                == ["C_SOURCE"]:
            return ast.literal_eval(node.value)
    return None


def _human(n):
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024


def _cap_text(cap):
    return "no limit (0)" if cap == 0 else f"{_human(cap)} ({cap} bytes)"


def cmd_cache(a):
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            return _cache_action(a)
        finally:    # tracegrad's warnings (an unsafe folder, a bad cap) as plain lines
            for w in caught:
                msg = str(w.message)
                msg = msg[len("tracegrad: "):] if msg.startswith("tracegrad: ") else msg
                print(f"tracegrad cache: warning: {msg}", file=sys.stderr)


def _cache_action(a):
    from tracegrad.runtime import cache
    d = cache.cache_dir()
    if a.max_bytes is not None and a.action != "prune":
        raise CLIError(f"--max-bytes goes with `tracegrad cache prune`, not `cache {a.action}`")
    if a.action == "info":
        if d is None:
            print("disk cache: off (TRACEGRAD_CACHE=0); compiled code is kept in memory only")
            return 0
        u = cache.disk_usage(d)
        print(f"folder:  {d}{'' if os.path.isdir(d) else ' (not created yet)'}")
        print(f"entries: {u['entries']}")
        print(f"size:    {_human(u['bytes'])} ({u['bytes']} bytes)")
        env_cap = os.environ.get("TRACEGRAD_CACHE_MAX_BYTES", "").strip()
        try:
            cache.parse_size(env_cap)
            how = f"TRACEGRAD_CACHE_MAX_BYTES={env_cap}"
        except ValueError:
            how = (f"the default: TRACEGRAD_CACHE_MAX_BYTES={env_cap!r} is not a size"
                   if env_cap else "the default; TRACEGRAD_CACHE_MAX_BYTES sets it, 0 for no "
                                   "limit")
        print(f"cap:     {_cap_text(u['max_bytes'])} ({how})")
        print("by kind:")
        for kind, label, unit, counted in cache.KINDS:
            n, b = u[kind]["count"], u[kind]["bytes"]
            if kind in ("orphan", "other") and n == 0:
                continue    # rare: shown only when there are some
            note = "" if counted else ("  (not counted: writes in progress; removed by prune "
                                       "after an hour)" if kind == "temp" else
                                       "  (not counted, never removed)")
            units = unit if n == 1 else {"entry": "entries"}.get(unit, unit + "s")
            print(f"  {label + ':':<28}{n:>7} {units:<8}{_human(b):>12}{note}")
        src = "TRACEGRAD_CACHE_DIR" if os.environ.get("TRACEGRAD_CACHE_DIR") else "default"
        print(f"set by:  {src}; TRACEGRAD_CACHE=0 turns the disk cache off")
        return 0
    if d is None:
        print(f"disk cache: off (TRACEGRAD_CACHE=0); nothing to {a.action}")
        return 0
    if a.action == "prune":
        if not os.path.isdir(d):
            print(f"nothing to prune: {d} does not exist yet")
            return 0
        r = cache.prune(a.max_bytes)
        if r is None:
            raise CLIError(f"the cache folder {d} cannot be used (see the warning above)")
        rm = r["removed"]

        def n_of(n, one, many):
            return f"{n} {one if n == 1 else many}"
        parts = [n_of(r["evicted_entries"], "entry", "entries")
                 + f" ({rm['other_version']} of other tracegrad versions, {rm['lru']} least "
                   f"recently used)"]
        parts += [n_of(rm[k], one, many) for k, one, many in (
            ("recipe", "compiler recipe", "compiler recipes"),
            ("orphan", "piece of a removed entry", "pieces of removed entries"),
            ("temp", "stale temporary file", "stale temporary files")) if rm[k]]
        print(f"pruned {d} to a cap of {_cap_text(r['max_bytes'])}: removed "
              f"{', '.join(parts)}; freed {_human(r['freed_bytes'])}")
        print(f"size:    {_human(r['bytes_before'])} -> {_human(r['bytes_after'])} "
              f"({r['bytes_after']} bytes)")
        if r["kept_fresh"]:
            print(f"kept:    {n_of(r['kept_fresh'], 'entry', 'entries')} whose shared object "
                  f"was built in the last {cache.FRESH_OBJECT_SECONDS} s (a process may be "
                  f"loading it); run prune again later to remove "
                  f"{'it' if r['kept_fresh'] == 1 else 'them'}")
        return 0
    before = cache.cache_info()
    cache.clear_cache()
    print(f"cleared {before['disk_entries']} entries ({_human(before['disk_bytes'])}) from {d}")
    return 0


def _size_arg(text):
    from tracegrad.runtime import cache
    try:
        return cache.parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


# --- argument parsing ------------------------------------------------------------------------------

def build_parser():
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true",
                        help="show Python tracebacks instead of one-paragraph errors")

    fn_args = argparse.ArgumentParser(add_help=False)
    fn_args.add_argument("target", metavar="FILE.py:FUNC",
                         help="the function: a Python file and a function name in it "
                              "(or package.module:FUNC)")
    fn_args.add_argument("--arg", action="append", metavar="NAME=DTYPE[SHAPE]",
                         help="an array argument, e.g. w=float64[128,64]; a scalar is "
                              "float64[] (repeatable)")
    fn_args.add_argument("--static", action="append", metavar="NAME=VALUE",
                         help="a non-array argument fixed at compile time, as a Python "
                              "literal, e.g. n_steps=100 (repeatable)")
    t = fn_args.add_mutually_exclusive_group()
    for opt, dest in (("--forward", "forward"), ("--grad", "grad"),
                      ("--value-and-grad", "value_and_grad"), ("--vjp", "vjp"),
                      ("--jvp", "jvp"), ("--jacobian", "jacobian"), ("--hessian", "hessian")):
        t.add_argument(opt, dest="transform", action="store_const", const=dest,
                       help=f"{TRANSFORMS[dest][0]} the function"
                            + (" (default)" if dest == "forward" else ""))
    fn_args.set_defaults(transform="forward")
    fn_args.add_argument("--wrt", metavar="NAME[,NAME]",
                         help="the arguments to differentiate with respect to (default: the "
                              "first argument; for --vjp/--jvp every floating-point argument)")
    fn_args.add_argument("--backend", choices=("numpy", "cupy", "native"), default="numpy",
                         help="the target of the generated code (default numpy; native: C "
                              "kernels built by the user's C compiler on first import)")

    p = argparse.ArgumentParser(
        prog="tracegrad",
        description="tracegrad: exact gradients of ordinary numerical Python. Compile a "
                    "function (or its gradient) to a standalone NumPy module, inspect the "
                    "generated code and graph, manage the compile cache.",
        epilog="examples:\n"
               "  tracegrad compile model.py:loss --arg w=float64[3,2] --arg x=float64[10,3] "
               "--grad -o loss_grad.py\n"
               "  tracegrad show model.py:loss --arg w=float64[3,2] --arg x=float64[10,3] "
               "--grad --format ir\n"
               "  tracegrad cache info",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"tracegrad {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    c = sub.add_parser("compile", parents=[fn_args, common],
                       help="write a standalone module computing a function or a derivative",
                       description="Write ONE standalone Python module (NumPy or CuPy only, no "
                                   "tracegrad at run time) with a function of the same argument "
                                   "names that checks shapes and dtypes and computes the chosen "
                                   "transform.")
    c.add_argument("-o", "--output", default="-", metavar="OUT.py",
                   help="the module to write; - for stdout (default)")
    c.add_argument("--name", help="the generated function's name (default: the function's own)")
    s = sub.add_parser("show", parents=[fn_args, common],
                       help="print the generated source, the IR or the Graphviz graph",
                       description="Print what tracegrad generates for a function: the NumPy "
                                   "source, the graph as text (ir) or as Graphviz dot.")
    s.add_argument("--format", choices=("source", "ir", "dot", "c"), default="source",
                   help="what to print: the generated module, the graph as text or Graphviz "
                        "dot, or the native target's C kernels")
    s.add_argument("--render", metavar="OUT.png",
                   help="render the graph with Graphviz `dot` (format from the extension: png, "
                        "svg, pdf)")
    k = sub.add_parser("cache", parents=[common],
                       help="the compile cache: info, prune or clear",
                       description="The disk cache of generated code (TRACEGRAD_CACHE_DIR, "
                                   "TRACEGRAD_CACHE=0 to turn it off, TRACEGRAD_CACHE_MAX_BYTES "
                                   "its size cap, 1 GiB by default). info: its folder, cap and "
                                   "sizes by kind; prune: bring it under the cap now (entries "
                                   "of other tracegrad versions first, then the least recently "
                                   "used); clear: empty it.")
    k.add_argument("action", choices=("info", "prune", "clear"))
    k.add_argument("--max-bytes", type=_size_arg, metavar="SIZE",
                   help="with prune: the cap to prune to (bytes, or 500MB, 1.5GiB, 2G; 0: no "
                        "limit) instead of TRACEGRAD_CACHE_MAX_BYTES")
    return p


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    a = parser.parse_args(argv)       # usage errors: argparse prints them, exit status 2
    a.argv = argv[1:] if argv and argv[0] == a.command else argv
    handler = {"compile": cmd_compile, "show": cmd_show, "cache": cmd_cache}[a.command]
    if a.debug:
        try:
            return handler(a)
        except CLIError as e:  # show where the user's mistake surfaced, with the cause
            traceback.print_exc()
            print(f"tracegrad {a.command}: error: {e}", file=sys.stderr)
            return EXIT_USAGE
    try:
        return handler(a)
    except CLIError as e:
        msg = f"tracegrad {a.command}: error: {e}"
        print(textwrap.fill(msg, 100, break_long_words=False, break_on_hyphens=False),
              file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # a tracegrad bug: still one paragraph, the traceback on request
        print(textwrap.fill(f"tracegrad {a.command}: internal error: {type(e).__name__}: {e}. "
                            f"This is a bug in tracegrad; run again with --debug for the "
                            f"traceback and report it.", 100), file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
