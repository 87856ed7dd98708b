# The native CPU target's builder (tracegrad, codegen_templates/native_loader.py).
# It is pasted into every generated native module, so a module written by
# `tracegrad compile --backend native` needs NumPy and a C compiler but not
# tracegrad, and tracegrad itself runs this same text to probe the compiler:
# one copy of the build recipe.
#
# recipe(): the compiler (CC or cc), its identity and flags: -O2, the ISA
# level (-march=x86-64-v4 or -v3 where the CPU and compiler have it), IEEE
# arithmetic (no -ffast-math; -fno-math-errno and -fno-trapping-math change
# no result), glibc's vector math (libmvec) through `#pragma omp simd`,
# -fopenmp-simd and `__attribute__((simd))` declarations where glibc has
# the function, scalar libm elsewhere or when asked (TRACEGRAD_NATIVE_MATH=scalar);
# threads (TRACEGRAD_NUM_THREADS, default the cores; 1 keeps one thread):
# -fopenmp -DTG_NUM_THREADS=n where the compiler builds and loads an OpenMP
# probe, else one thread (the `omp parallel` pragmas of large kernels are then
# ignored and the same loops run on the calling thread).
# load_library(): the shared object beside the module (written by atomic
# rename, so concurrent processes see a complete object or none), built on
# first use, and refused when another user owns it or others can write it.
import atexit as _atexit
import ctypes as _ctypes
import hashlib as _hashlib
import os as _os
import platform as _platform
import shlex as _shlex
import shutil as _shutil
import stat as _stat
import subprocess as _subprocess
import sys as _sys
import sysconfig as _sysconfig
import tempfile as _tempfile
import threading as _threading


class NativeBuildError(RuntimeError):
    """The C compiler is missing or failed; the message says which and why."""


# glibc's libmvec: these five since glibc 2.22, the rest since 2.35 (x86-64).
_MVEC_OLD = ("sin", "cos", "exp", "log", "pow")
_MVEC_NEW = ("tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh",
             "exp2", "expm1", "log1p", "log2", "log10", "erf")
_V3_FLAGS = ("avx", "avx2", "fma", "bmi1", "bmi2", "movbe", "f16c", "abm", "xsave")
_V4_FLAGS = _V3_FLAGS + ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl")
# -fwrapv: signed integers wrap, as NumPy's do (without it gcc took
# np.abs(x) >= 0 as true at INT_MIN and (x * 2) // 2 as x for int64)
_BASE_FLAGS = ("-O2", "-std=gnu11", "-fPIC", "-shared", "-fopenmp-simd", "-fno-builtin-sin",
               "-fno-builtin-cos", "-fno-math-errno", "-fno-trapping-math", "-fwrapv")
_recipes = {}


def _glibc_version():
    lib, ver = _platform.libc_ver()
    return ver if lib == "glibc" else ""


def _version_tuple(v):
    try:
        return tuple(int(p) for p in v.split(".")[:2])
    except ValueError:
        return ()


def _cpu_levels():
    """The x86-64 ISA levels this CPU runs, best first: x86-64-v4 (AVX-512)
    where it has AVX-512 F/BW/CD/DQ/VL, x86-64-v3 (AVX2, FMA, BMI), or
    none (another machine, or the flags cannot be read)."""
    if _platform.machine().lower() not in ("x86_64", "amd64"):
        return []
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    have = set(line.split(":", 1)[1].split())
                    return [lvl for lvl, need in (("x86-64-v4", _V4_FLAGS),
                                                  ("x86-64-v3", _V3_FLAGS))
                            if all(fl in have for fl in need)]
    except OSError:
        pass
    return []


def _run_compiler(cmd, what):
    try:
        r = _subprocess.run(cmd, stdout=_subprocess.PIPE, stderr=_subprocess.PIPE, timeout=300)
    except OSError as e:
        raise NativeBuildError(f"the C compiler {cmd[0]!r} could not be run ({e})") from None
    except _subprocess.TimeoutExpired:
        raise NativeBuildError(f"the C compiler {cmd[0]!r} took over 300 s {what}") from None
    if r.returncode != 0:
        err = r.stderr.decode(errors="replace").strip().splitlines()[-12:]
        raise NativeBuildError(f"the C compiler {cmd[0]!r} failed {what} (exit status "
                               f"{r.returncode}):\n" + "\n".join(err))
    return r


_PROBE = r"""
#include <math.h>
%s
void tg_probe(const double* __restrict__ a, double* __restrict__ b, long long n) {
#pragma omp simd
    for (long long i = 0; i < n; i++) b[i] = exp(a[i]) + log1p(a[i]);
}
"""


def _try(cmd, flags, decls, libs):
    d = _tempfile.mkdtemp(prefix="tracegrad-probe-")
    try:
        src = _os.path.join(d, "probe.c")
        with open(src, "w") as f:
            f.write(_PROBE % decls)
        _run_compiler(cmd + list(flags) + [src, "-o", _os.path.join(d, "probe.so")] + list(libs),
                      "on a probe file")
        return True
    except NativeBuildError:
        return False
    finally:
        _shutil.rmtree(d, ignore_errors=True)


_PROBE_EXT = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
static struct PyModuleDef m = {PyModuleDef_HEAD_INIT, "tg_probe", NULL, -1, NULL};
PyMODINIT_FUNC PyInit_tg_probe(void) { return PyModule_Create(&m); }
"""


def _presumed_python_include():
    """Python.h's folder where the file is there (CPython), else None."""
    inc = _sysconfig.get_paths().get("include")
    if _sys.implementation.name != "cpython" or not inc or \
            not _os.path.isfile(_os.path.join(inc, "Python.h")):
        return None
    return inc


def _python_include(cmd, flags, libs):
    """The folder of Python.h when a CPython extension builds with it, else
    None (then the kernels are called through ctypes)."""
    inc = _presumed_python_include()
    if inc is None:
        return None
    d = _tempfile.mkdtemp(prefix="tracegrad-probe-")
    try:
        src = _os.path.join(d, "probe.c")
        with open(src, "w") as f:
            f.write(_PROBE_EXT)
        _run_compiler(cmd + list(flags) + ["-I" + inc, src, "-o", _os.path.join(d, "p.so")]
                      + list(libs), "on a probe extension")
        return inc
    except NativeBuildError:
        return None
    finally:
        _shutil.rmtree(d, ignore_errors=True)


def vector_math_decls(funcs):
    """`__attribute__((simd))` declarations of the math functions libmvec has."""
    out = []
    for fn in funcs:
        two = fn == "pow"
        out.append(f"__attribute__((simd(\"notinbranch\"))) double {fn}(double"
                   f"{', double' if two else ''});")
        out.append(f"__attribute__((simd(\"notinbranch\"))) float {fn}f(float"
                   f"{', float' if two else ''});")
    return "\n".join(out)


_PROBE_OMP = r"""
int tg_probe_omp(const double* __restrict__ a, double* __restrict__ b, long long n) {
#pragma omp parallel for schedule(static) num_threads(2)
    for (long long i = 0; i < n; i++) b[i] = a[i] * 2.0;
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}
"""


def _cores():
    try:
        return len(_os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return _os.cpu_count() or 1


def num_threads(value=None):
    """The thread count of large kernels: ``value``, else TRACEGRAD_NUM_THREADS,
    else the cores this process may run on.  Only kernels large enough to
    gain use more than one (codegen.py's thread_count, thresholds measured
    in docs/native.md, Threads); TRACEGRAD_NUM_THREADS=1 keeps every kernel
    on the calling thread (a machine shared with other busy processes)."""
    v = value if value is not None else _os.environ.get("TRACEGRAD_NUM_THREADS")
    if v is None or str(v).strip() == "":
        return _cores()
    try:
        n = int(str(v).strip())
    except ValueError:
        n = 0
    if n < 1:
        raise NativeBuildError(f"TRACEGRAD_NUM_THREADS must be a positive integer, got {v!r}")
    return n


def _openmp(cmd, flags, libs):
    """Does the compiler build (and the dynamic loader load) an OpenMP object?"""
    d = _tempfile.mkdtemp(prefix="tracegrad-probe-")
    try:
        src = _os.path.join(d, "omp.c")
        so = _os.path.join(d, "omp.so")
        with open(src, "w") as f:
            f.write(_PROBE_OMP)
        _run_compiler(cmd + list(flags) + ["-fopenmp", src, "-o", so] + list(libs),
                      "on an OpenMP probe file")
        lib = _ctypes.CDLL(so)
        fn = lib.tg_probe_omp
        fn.restype = _ctypes.c_int
        fn.argtypes = [_ctypes.c_void_p, _ctypes.c_void_p, _ctypes.c_longlong]
        return fn(None, None, 0) == 1
    except (NativeBuildError, OSError):
        return False
    finally:
        _shutil.rmtree(d, ignore_errors=True)


def compiler_command(cc=None):
    """The C compiler as a command (a list): ``cc``, else ``$CC``, else
    ``cc`` from the PATH, else the pip-installable Zig toolchain's
    (``pip install ziglang``, tracegrad's ``native`` extra) when it is
    installed: ``python -m ziglang cc``, a clang.  None when there is none."""
    given = cc or _os.environ.get("CC")
    try:
        cmd = _shlex.split(given or "cc")
    except ValueError:
        return None
    if cmd and _shutil.which(cmd[0]) is not None:
        return cmd
    if given is None:
        import importlib.util
        try:
            zig = importlib.util.find_spec("ziglang")
        except (ImportError, ValueError):   # blocked (sys.modules entry None) or broken
            zig = None
        if zig is not None:
            return [_sys.executable, "-m", "ziglang", "cc"]
    return None


def recipe(cc=None, math=None, threads=None, presume=False):
    """The build recipe for this machine: a dict with the compiler command,
    flags, libraries, ISA level, vector-math functions and an identity
    string (every part that changes the object: it belongs in a cache key).
    Raises NativeBuildError when there is no working C compiler.

    presume=True runs no probe build: it presumes that every first choice
    works (the best ISA level of the CPU in the usual spelling, the vector
    math glibc's version has, Python's headers where Python.h is installed,
    OpenMP when threads are asked for), which is the recipe the probes find
    wherever they all pass, identity included.  The caller then builds with
    it and probes only when that build fails ("presumed": True marks it)."""
    cc = cc or _os.environ.get("CC") or "cc"
    math = (math or _os.environ.get("TRACEGRAD_NATIVE_MATH") or "vector").strip().lower()
    if math not in ("vector", "scalar"):
        raise NativeBuildError(f"TRACEGRAD_NATIVE_MATH must be 'vector' or 'scalar', "
                               f"got {math!r}")
    threads = num_threads(threads)
    key = (cc, math, threads, _os.environ.get("PATH", ""), presume,
           _os.geteuid() if hasattr(_os, "geteuid") else None)   # what this user may read
    if key in _recipes:
        r = _recipes[key]
        if isinstance(r, NativeBuildError):
            raise r
        return r
    try:
        cmd = compiler_command(None if cc == "cc" else cc)
        if cmd is None:
            raise NativeBuildError(f"no C compiler: {cc!r} is not on the PATH (set CC to a C "
                                   f"compiler, install gcc or clang, or pip install ziglang)")
        ver = _run_compiler(cmd + ["--version"], "to tell its version")
        ident = (ver.stdout.decode(errors="replace").strip().splitlines() or ["?"])[0]
        flags = list(_BASE_FLAGS)
        glibc = _glibc_version()
        funcs = ()
        if math == "vector" and _platform.machine().lower() in ("x86_64", "amd64") and glibc:
            if _version_tuple(glibc) >= (2, 35):
                funcs = _MVEC_OLD + _MVEC_NEW
            elif _version_tuple(glibc) >= (2, 22):
                funcs = _MVEC_OLD
        libs = ["-lmvec", "-lm"] if funcs else ["-lm"]
        if presume:
            levels = _cpu_levels()
            r = _recipe_dict(cmd, flags + [f"-march={levels[0]}"] if levels else flags, libs,
                             levels[0] if levels else "baseline", math, threads, funcs, ident,
                             glibc, _presumed_python_include())
            r["presumed"] = True
            _recipes[key] = r
            return r
        # Probing costs a compile each (about 50 ms), and a cold start pays
        # them all: the Python-header probe runs beside the others, and the
        # ISA level is tried together with the vector math (split only if
        # that fails).
        found_inc = []
        base = list(flags)
        header_probe = _threading.Thread(
            target=lambda: found_inc.append(_python_include(cmd, base, ["-lm"])), daemon=True)
        header_probe.start()
        isa = "baseline"
        proven = False      # has a probe built with the final flags, math and libraries?
        plain = False       # ... with the final flags, no vector math and -lm?
        # the best level the compiler takes; Zig's clang spells it x86_64_v3
        for level, march in [(lv, f"-march={sp}") for lv in _cpu_levels()
                             for sp in (lv, lv.replace("-", "_"))]:
            if funcs and _try(cmd, flags + [march], vector_math_decls(funcs), libs):
                proven = True
            elif _try(cmd, flags + [march], "", ["-lm"]):
                plain = True
            else:
                continue
            flags.append(march)
            isa = level
            break
        if funcs and not proven and not _try(cmd, flags, vector_math_decls(funcs), libs):
            funcs, libs = (), ["-lm"]
        elif funcs:
            proven = True
        if not proven and not (plain and not funcs) and \
                not _try(cmd, flags, vector_math_decls(funcs), libs):
            # the compiler runs but cannot build a shared object: say why
            d = _tempfile.mkdtemp(prefix="tracegrad-probe-")
            try:
                src = _os.path.join(d, "probe.c")
                with open(src, "w") as f:
                    f.write(_PROBE % "")
                _run_compiler(cmd + flags + [src, "-o", _os.path.join(d, "p.so")] + libs,
                              "on a probe file")
            finally:
                _shutil.rmtree(d, ignore_errors=True)
        header_probe.join()
        inc = found_inc[0] if found_inc else None
        if threads > 1 and not _openmp(cmd, flags, libs):
            threads = 1      # no OpenMP: one thread, no error
        r = _recipe_dict(cmd, flags, libs, isa, math, threads, funcs, ident, glibc, inc)
    except NativeBuildError as e:
        _recipes[key] = e
        raise
    _recipes[key] = r
    return r


def _recipe_dict(cmd, flags, libs, isa, math, threads, funcs, ident, glibc, inc):
    """The recipe of these choices, with its identity (threads > 1: OpenMP)."""
    openmp = "-fopenmp" if threads > 1 else "none"
    if threads > 1:
        flags = flags + ["-fopenmp", f"-DTG_NUM_THREADS={threads}"]
    r = {"cc": cmd, "flags": flags, "libs": libs, "isa": isa, "math": math,
         "threads": threads, "openmp": openmp,
         "vector_math": list(funcs), "compiler": ident, "glibc": glibc,
         "python": f"{_sys.implementation.cache_tag} {_sysconfig.get_config_var('SOABI')}",
         "entry": "python" if inc else "ctypes", "python_include": inc}
    r["identity"] = " | ".join(f"{k}={r[k]}" for k in sorted(r))
    return r


def _safe_object(path):
    """Is the existing file at path ours to load (regular, ours, writable by
    nobody else)?  A shared object is code that will run."""
    try:
        st = _os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    if not _stat.S_ISREG(st.st_mode):
        return False
    if hasattr(_os, "geteuid") and (st.st_uid != _os.geteuid() or st.st_mode & 0o022):
        return False
    return True


# Build time (docs/benchmarks.md, "Compile time").  A file of more than
# _O1_LINES lines is compiled at -O1 instead of -O2: a third less compiler
# time, where the time to build dominates.  A file the generator marked for
# it ("// @tg-prelude-end", "// @tg-unit") is compiled as several
# translation units at once, one per core (TRACEGRAD_BUILD_JOBS caps them),
# each at least _UNIT_MIN_LINES lines, then linked.
_O1_LINES = 20000
_UNIT_MIN_LINES = 1500
_PRELUDE_END = "\n// @tg-prelude-end\n"
_UNIT_MARK = "\n// @tg-unit\n"


def _build_jobs():
    """How many translation units a large file is built as at once."""
    v = _os.environ.get("TRACEGRAD_BUILD_JOBS")
    try:
        n = int(v) if v not in (None, "") else _cores()
    except ValueError:
        n = _cores()
    return max(1, n)


def _units(source, jobs=None):
    """The translation units ``source`` is built as: itself, or where the
    generator marked it and it is large, the prelude followed by each of
    up to ``jobs`` runs of its functions (of about equal size, in order)."""
    jobs = _build_jobs() if jobs is None else jobs
    if _PRELUDE_END not in source or jobs < 2:
        return [source]
    prelude, rest = source.split(_PRELUDE_END, 1)
    pieces = rest.split(_UNIT_MARK)
    sizes = [p.count("\n") + 1 for p in pieces]
    total = sum(sizes)
    k = min(jobs, len(pieces), total // _UNIT_MIN_LINES)
    if k < 2:
        return [source]
    out, cur, acc, done = [], [], 0, 0
    for p, n in zip(pieces, sizes):
        cur.append(p)
        acc += n
        if acc >= (total - done) / (k - len(out)) and len(out) < k - 1:
            out.append(cur)
            done += acc
            cur, acc = [], 0
    if cur:
        out.append(cur)
    head = prelude + _PRELUDE_END
    return [head + "\n".join(u) for u in out]


def _opt_flags(flags, source):
    if source.count("\n") > _O1_LINES:
        return ["-O1" if f == "-O2" else f for f in flags]
    return list(flags)


def build(source, out_path, rec, extra=()):
    """Compile ``source`` to the shared object ``out_path``: the C file and
    the object are written under temporary names in the same folder and the
    object is renamed into place.  ``extra``: more compiler arguments.  A
    large marked file is built as several translation units in parallel
    (``_units``), compiled to objects and linked."""
    d = _os.path.dirname(out_path)
    flags = _opt_flags(rec["flags"], source)
    parts = _units(source)
    fd, src = _tempfile.mkstemp(dir=d, prefix=".tmp-", suffix=".c")
    tmp_so = src[:-2] + ".so"
    temps = [src, tmp_so]
    lines = source.count("\n") + 1
    try:
        if len(parts) == 1:
            with _os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(source)
            _run_compiler(rec["cc"] + flags + list(extra) + [src, "-o", tmp_so] + rec["libs"],
                          f"on the generated C source ({lines} lines)")
        else:
            _os.close(fd)
            objs, errors = [], []
            for j, text in enumerate(parts):
                c = f"{src[:-2]}-{j}.c"
                temps += [c, c[:-2] + ".o"]
                objs.append(c[:-2] + ".o")
                with open(c, "w", encoding="utf-8") as f:
                    f.write(text)

            def compile_unit(j):
                try:
                    _run_compiler(rec["cc"] + flags + list(extra) +
                                  ["-c", f"{src[:-2]}-{j}.c", "-o", objs[j]],
                                  f"on the generated C source (unit {j + 1} of {len(parts)}, "
                                  f"{lines} lines in all)")
                except NativeBuildError as e:
                    errors.append(e)
            threads = [_threading.Thread(target=compile_unit, args=(j,), daemon=True)
                       for j in range(len(parts))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            if errors:
                raise errors[0]
            _run_compiler(rec["cc"] + flags + objs + ["-o", tmp_so] + rec["libs"],
                          f"linking the generated C source's {len(parts)} units")
        _os.chmod(tmp_so, 0o700)
        _os.replace(tmp_so, out_path)
    finally:
        for p in temps:
            try:
                _os.unlink(p)
            except FileNotFoundError:
                pass


_private_dir = []


def _process_dir():
    """The private temporary folder of this process's shared objects: one
    per process, whichever generated module asks (each has its own copy of
    this code, so the folder is found by name, not held here), removed when
    the process exits."""
    uid = _os.geteuid() if hasattr(_os, "geteuid") else 0
    path = _os.path.join(_tempfile.gettempdir(), f"tracegrad-native-{uid}-{_os.getpid()}")
    try:
        _os.mkdir(path, 0o700)
    except FileExistsError:
        st = _os.lstat(path)
        if not _stat.S_ISDIR(st.st_mode) or (hasattr(_os, "geteuid") and (
                st.st_uid != uid or st.st_mode & 0o077)):
            # not ours, or not private: a folder of our own instead
            path = _tempfile.mkdtemp(prefix="tracegrad-native-")
    except OSError:
        path = _tempfile.mkdtemp(prefix="tracegrad-native-")
    def remove(path=path, owner=_os.getpid()):
        if _os.getpid() == owner:      # not from a forked child exiting
            _shutil.rmtree(path, ignore_errors=True)
    _atexit.register(remove)
    return path


def _numpy_include():
    """The folder of NumPy's C headers (numpy/arrayobject.h), else None."""
    import numpy
    inc = numpy.get_include()
    return inc if _os.path.isfile(_os.path.join(inc, "numpy", "arrayobject.h")) else None


_known_objects = {}     # digest -> the last object of that digest this process loaded
_loaded = {}            # path -> (object, entry) this process loaded from there


def _link_same(folder, digest, path):
    """Put the object another module of the folder built from the same text
    (``*-<digest>.so``: the digest covers the text, recipe, entry and NumPy)
    at ``path`` too: a hard link, else a copy, renamed into place.  True
    when done; False when there is none (or it is not ours to load).  The
    object this process last loaded for the digest is tried first, then
    the folder is listed."""
    def candidates():
        known = _known_objects.get(digest)
        if known and _os.path.dirname(known) == folder:
            yield _os.path.basename(known)
        try:
            yield from _os.listdir(folder)
        except OSError:
            return
    for name in candidates():
        src = _os.path.join(folder, name)
        if name.startswith(".tmp-") or not name.endswith(f"-{digest}.so") or \
                not _safe_object(src):
            continue
        tmp = _os.path.join(folder, f".tmp-{_os.getpid()}-{_threading.get_ident()}-{digest}.so")
        try:
            try:
                _os.link(src, tmp)
            except OSError:
                _shutil.copyfile(src, tmp)
                _os.chmod(tmp, 0o700)
            _os.replace(tmp, path)
            return True
        except OSError:
            try:
                _os.unlink(tmp)
            except OSError:
                pass
    return False


def load_library(source, module_file, rec, reuse=True):
    """(library, entry) for ``source``: a CPython extension module whose
    functions take the arrays (entry "python": METH_FASTCALL, the arrays
    checked in C) where Python's and NumPy's headers are installed, else a
    ctypes library taking pointers (entry "ctypes").  The object lies beside
    ``module_file`` (a generated module on disk) when that folder is ours
    and writable, else in a private temporary folder; built on first use.
    The extension is built against NumPy's headers (its C API), so NumPy's
    version is part of the object's name.  ``reuse``: an object built from
    the same text (and recipe, entry and NumPy) for another module of the
    folder serves this one too, linked beside it: the modules of several
    sizes whose C is generic, or the same, cost one build."""
    import numpy
    np_inc = _numpy_include() if rec.get("entry") == "python" else None
    entry = "python" if np_inc else "ctypes"
    digest = _hashlib.sha256((source + "\0" + rec["identity"] + "\0" + entry + " numpy=" +
                              numpy.__version__).encode()).hexdigest()[:16]
    folder = None
    if module_file and module_file.endswith(".py") and _os.path.isfile(module_file):
        folder = _os.path.dirname(_os.path.abspath(module_file))
        base = _os.path.basename(module_file)[:-3]
        st = _os.stat(folder)
        if not _os.access(folder, _os.W_OK) or (hasattr(_os, "geteuid") and (
                st.st_uid != _os.geteuid() or st.st_mode & 0o022)):
            folder = None
    if folder is None:
        if not _private_dir:
            _private_dir.append(_process_dir())
        folder, base = _private_dir[0], "module"
    path = _os.path.join(folder, f"{base}-{digest}.so")
    got = _loaded.get(path)
    if got is not None and reuse:   # loaded before by this process (a generic text's sizes)
        return got
    name, extra = None, ()
    if entry == "python":
        name = f"tg_{digest}"
        extra = ["-DTG_PYTHON_ENTRY", f"-DTG_MODULE_NAME={name}", "-I" + rec["python_include"],
                 "-I" + np_inc]
    built = not _safe_object(path)
    if built and reuse and _link_same(folder, digest, path):
        built = False
    if built:
        build(source, path, rec, extra)
    try:
        got = _load_object(path, name), entry
        _known_objects[digest] = path
        _loaded[path] = got
        return got
    except (ImportError, OSError) as e:
        if built:
            raise NativeBuildError(f"the shared object built from the generated C source "
                                   f"could not be loaded ({e})") from None
    # an object already there that does not load (damaged, or built by
    # another toolchain under the same name): build it again
    build(source, path, rec, extra)
    try:
        return _load_object(path, name), entry
    except (ImportError, OSError) as e:
        raise NativeBuildError(f"the shared object built from the generated C source could "
                               f"not be loaded ({e})") from None


def _load_object(path, name):
    """The extension module ``name`` at path, or (name None) the library."""
    if name is None:
        return _ctypes.CDLL(path)
    import importlib.machinery
    import importlib.util
    loader = importlib.machinery.ExtensionFileLoader(name, path)
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod
