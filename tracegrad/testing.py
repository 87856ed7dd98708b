"""A CPU emulator for tracegrad's CUDA target, for testing without a GPU.

This is a TEST HARNESS that really executes the code tracegrad generates: the
CUDA translation unit, byte for byte as the driver embeds it, is compiled by
the host C++ compiler (g++) with a small header
(``codegen_templates/cuda_emulator.h``) that defines the CUDA built-ins the
kernels use; the library is loaded with ``ctypes``, and each launch runs the
kernel for every (block, thread) of the requested grid on NumPy buffers.  The
generated Python driver runs unchanged too, against ``fake_cupy()``: a
module object standing in for the few CuPy calls a driver makes
(``RawModule(code=...).get_function(name)`` launching through the emulator,
and ``asarray``/``empty``/``sum``/``matmul``/... mapped to NumPy).

It is NOT a replacement for CuPy in the product: it runs one thread at a
time, so it says nothing about speed, and it cannot run kernels whose
threads must run concurrently (the header leaves ``__syncthreads``,
``__shared__`` and atomics undefined, so such a kernel fails to compile
here).  The stand-in's arrays are NumPy arrays (a subclass whose type lives
in a module named ``cupy``, so tracegrad sees them as device arrays); unlike
CuPy it does not refuse implicit conversion to NumPy.

Compiled libraries are cached in a private temporary folder keyed by the
hash of the source, the header and the compiler command, so a test suite
compiles each distinct kernel source once.

Use::

    with tracegrad.testing.emulated_cupy():
        g = tg.grad(f, backend="cupy")(x)        # generated driver + kernels on the CPU
"""
from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import types

import numpy as np

CXX = os.environ.get("CXX", "g++")
CXXFLAGS = ("-O1", "-std=c++17", "-shared", "-fPIC", "-w")

_DTYPE_OF_CTYPE = {
    "float": np.float32, "double": np.float64, "bool": np.bool_,
    "signed char": np.int8, "char": np.int8, "unsigned char": np.uint8, "short": np.int16,
    "unsigned short": np.uint16, "int": np.int32, "unsigned int": np.uint32,
    "long long": np.int64, "unsigned long long": np.uint64,
}

_KERNEL_RE = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(\w+)\s*\(([^)]*)\)', re.S)
_lock = threading.Lock()
_loaded: dict = {}


class EmulatorError(RuntimeError):
    """The emulator could not compile or launch a kernel (the message says why)."""


def header_path() -> str:
    from tracegrad.targets.templates import template_dir
    return os.path.join(template_dir(), "cuda_emulator.h")


def cache_dir() -> str:
    """The private folder of compiled emulator libraries."""
    uid = os.getuid() if hasattr(os, "getuid") else "user"
    d = os.environ.get("TRACEGRAD_EMULATOR_DIR") or os.path.join(
        tempfile.gettempdir(), f"tracegrad-emulator-{uid}")
    os.makedirs(d, mode=0o700, exist_ok=True)
    st = os.stat(d)
    if hasattr(os, "getuid") and (st.st_uid != os.getuid() or st.st_mode & 0o022):
        raise EmulatorError(f"the emulator cache folder {d} is owned by another user or "
                            f"writable by others; libraries in it would be executed, so it is "
                            f"not used (set TRACEGRAD_EMULATOR_DIR to a private folder)")
    return d


def kernel_signatures(source):
    """{kernel name: [(C element type, is pointer), ...]} of the
    ``extern "C" __global__`` kernels in a CUDA source."""
    out = {}
    for name, params in _KERNEL_RE.findall(source):
        sig = []
        for p in params.split(","):
            p = p.strip()
            if not p:
                continue
            words = p.replace("*", " * ").split()
            words = [w for w in words if w not in ("const", "__restrict__", "__restrict")]
            is_ptr = "*" in words
            words = [w for w in words if w != "*"][:-1]   # drop the parameter name
            sig.append((" ".join(words), is_ptr))
        out[name] = sig
    return out


class EmulatedKernel:
    """One kernel of an ``EmulatedModule``: called like CuPy's RawKernel,
    ``kernel(grid, block, args)``."""

    def __init__(self, module, name, signature):
        self.module = module
        self.name = name
        self.signature = signature
        self._fn = getattr(module.lib, f"tg_emu_launch_{name}")
        self._fn.restype = None
        self._fn.argtypes = [ctypes.POINTER(ctypes.c_uint), ctypes.POINTER(ctypes.c_uint),
                             ctypes.POINTER(ctypes.c_void_p)]
        self.launches = 0

    def __call__(self, grid, block, args, shared_mem=0, stream=None):
        grid = _dims(grid, "grid")
        block = _dims(block, "block")
        if block[0] * block[1] * block[2] > 1024:
            raise EmulatorError(f"{self.name}: {block} is more than 1024 threads per block")
        if len(args) != len(self.signature):
            raise EmulatorError(f"{self.name} takes {len(self.signature)} arguments, "
                                f"the launch passed {len(args)}")
        keep, ptrs = [], (ctypes.c_void_p * max(1, len(args)))()
        for i, (a, (ct, is_ptr)) in enumerate(zip(args, self.signature)):
            want = np.dtype(_DTYPE_OF_CTYPE[ct])
            if is_ptr:
                if not isinstance(a, np.ndarray):
                    raise EmulatorError(f"{self.name}: argument {i} must be a device array "
                                        f"({ct}*), got {type(a).__name__}")
                if a.dtype != want:
                    raise EmulatorError(f"{self.name}: argument {i} is a {ct}* but the array "
                                        f"has dtype {a.dtype}")
                if not a.flags.c_contiguous:
                    raise EmulatorError(f"{self.name}: argument {i} is not C-contiguous; the "
                                        f"kernel's strides are compile-time constants")
                cell = ctypes.c_void_p(a.ctypes.data)
            else:
                cell = np.ctypeslib.as_ctypes(np.asarray(a, dtype=want).reshape(()))
            keep.append(cell)
            ptrs[i] = ctypes.cast(ctypes.pointer(cell), ctypes.c_void_p)
        g = (ctypes.c_uint * 3)(*grid)
        b = (ctypes.c_uint * 3)(*block)
        self._fn(g, b, ptrs)
        self.launches += 1


def _dims(d, what):
    if isinstance(d, int):
        d = (d,)
    d = tuple(int(x) for x in d) + (1,) * (3 - len(d))
    if len(d) != 3 or min(d) < 1:
        raise EmulatorError(f"invalid {what} dimensions {d}")
    return d


class EmulatedModule:
    """A CUDA source compiled for the CPU: ``get_function(name)`` as on
    ``cupy.RawModule``."""

    def __init__(self, source):
        self.source = source
        self.signatures = kernel_signatures(source)
        self.lib = _build(source, list(self.signatures))
        self._kernels = {}

    def get_function(self, name):
        k = self._kernels.get(name)
        if k is None:
            if name not in self.signatures:
                raise EmulatorError(f"no kernel named {name!r} in the module; it defines "
                                    f"{sorted(self.signatures)}")
            k = self._kernels[name] = EmulatedKernel(self, name, self.signatures[name])
        return k


def _build(source, names):
    """Compile ``source`` (unchanged) with the emulator header and one
    launcher per kernel; return the loaded library (cached by hash)."""
    with open(header_path(), "rb") as f:
        header = f.read()
    cmd_id = " ".join((CXX,) + CXXFLAGS)
    key = hashlib.sha256(header + b"\0" + source.encode() + b"\0" + cmd_id.encode()).hexdigest()[:24]
    with _lock:
        lib = _loaded.get(key)
        if lib is not None:
            return lib
        d = cache_dir()
        so = os.path.join(d, f"emu_{key}.so")
        if not os.path.exists(so):
            cu = os.path.join(d, f"emu_{key}.cu")
            cpp = os.path.join(d, f"emu_{key}_launch.cpp")
            _write_atomic(cu, source)
            stubs = "".join(
                f'extern "C" void tg_emu_launch_{n}(const unsigned int* grid, '
                f'const unsigned int* block, void** args) {{ tg_emu_launch({n}, grid, block, '
                f'args); }}\n' for n in names)
            _write_atomic(cpp, f'#include "{header_path()}"\n#include "{cu}"\n{stubs}')
            tmp = f"{so}.{os.getpid()}.{threading.get_ident()}.tmp"
            if shutil.which(CXX) is None:
                raise EmulatorError(f"the CUDA emulator needs a host C++ compiler; {CXX!r} is "
                                    f"not on the PATH (set CXX)")
            r = subprocess.run([CXX, *CXXFLAGS, "-o", tmp, cpp], capture_output=True, text=True)
            if r.returncode != 0:
                raise EmulatorError(f"the host compiler rejected the generated CUDA source "
                                    f"({cu}):\n{r.stderr[-4000:]}")
            os.replace(tmp, so)
        lib = ctypes.CDLL(so)
        _loaded[key] = lib
        return lib


def _write_atomic(path, text):
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


# --- the CuPy stand-in ------------------------------------------------------------------------

class ndarray(np.ndarray):
    """The stand-in's device array: a NumPy array whose type lives in a
    module named ``cupy``, so tracegrad treats it as a CuPy array."""

    def get(self):
        """A host copy, as ``cupy.ndarray.get()``."""
        return np.array(self, copy=True).view(np.ndarray)

    @property
    def device(self):
        return _Device(0)


ndarray.__module__ = "cupy"


def _wrap(r):
    if isinstance(r, np.ndarray):
        return r if type(r) is ndarray else r.view(ndarray)
    if isinstance(r, np.generic):
        return np.asarray(r).view(ndarray)   # CuPy returns 0-d arrays, not scalars
    if isinstance(r, tuple):
        return tuple(_wrap(x) for x in r)
    if isinstance(r, list):
        return [_wrap(x) for x in r]
    return r


def _wrapped(f):
    def call(*args, **kwargs):
        return _wrap(f(*args, **kwargs))
    call.__name__ = getattr(f, "__name__", "f")
    call.__doc__ = f"NumPy's {call.__name__}, returning stand-in device arrays."
    return call


class _Ufunc:
    def __init__(self, uf):
        self._uf = uf
        self.__name__ = uf.__name__

    def __call__(self, *args, **kwargs):
        return _wrap(self._uf(*args, **kwargs))

    def at(self, *args, **kwargs):
        return self._uf.at(*args, **kwargs)

    def reduce(self, *args, **kwargs):
        if self.__name__ not in CUPY_REDUCE_UFUNCS:   # as CuPy says it
            raise NotImplementedError(f"`cupy_{self.__name__}.reduce` is not supported yet")
        return _wrap(self._uf.reduce(*args, **kwargs))


# Functions and constants the stand-in offers: each is NumPy's, and each is
# one that CuPy provides under the same name, so a driver that runs here
# does not call something CuPy lacks.
CUPY_NAMES = frozenset("""
abs absolute add all amax amin any arange arccos arccosh arcsin arcsinh arctan arctan2
arctanh argmax argmin argpartition argsort around array asarray ascontiguousarray
broadcast_arrays broadcast_to ceil clip concatenate copy cos cosh cumprod cumsum deg2rad
degrees divide dot einsum empty empty_like equal exp exp2 expand_dims expm1 eye flip floor
floor_divide fmax fmin fmod full full_like greater greater_equal hypot isfinite isinf isnan
less less_equal linspace log log10 log1p log2 logaddexp logaddexp2 logical_and logical_not
logical_or logical_xor matmul max maximum mean min minimum mod moveaxis multiply nan_to_num
negative nonzero not_equal ones ones_like outer pad power prod rad2deg radians ravel
ravel_multi_index
reciprocal remainder repeat reshape result_type rint roll round sign sin sinc sinh sort split sqrt
square squeeze stack subtract sum swapaxes take tan tanh tensordot tile transpose trunc copyto
true_divide var std where zeros zeros_like frexp ldexp real imag conj conjugate take_along_axis
copysign nextafter signbit cbrt float_power gcd lcm heaviside bitwise_and bitwise_or bitwise_xor
invert left_shift right_shift positive
partition
""".split())
# The ufuncs whose ``.reduce`` CuPy implements (14.x): any other raises there.
CUPY_REDUCE_UFUNCS = frozenset({"add", "multiply"})
CUPY_CONSTANTS = frozenset("""
float16 float32 float64 int8 int16 int32 int64 uint8 uint16 uint32 uint64 bool_ complex64
complex128 dtype newaxis nan inf pi e
""".split())


class _Device:
    def __init__(self, id=0):
        self.id = id
        # a small emulated device: few SMs, so grids stay small on the CPU
        self.attributes = {"MultiProcessorCount": 2, "MaxThreadsPerBlock": 1024,
                           "WarpSize": 32}

    def synchronize(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _RawModule:
    """``cupy.RawModule`` for the emulator: compiles ``code`` with the host
    compiler; ``get_function`` returns a kernel launching on the CPU."""

    def __init__(self, code=None, path=None, options=(), backend="nvrtc", translate_cucomplex=False,
                 enable_cooperative_groups=False, name_expressions=None, jitify=False):
        if code is None:
            if path is None:
                raise TypeError("RawModule needs code= or path=")
            with open(path, encoding="utf-8") as f:
                code = f.read()
        self.code = code
        self.options = options
        self._mod = EmulatedModule(code)

    def get_function(self, name):
        return self._mod.get_function(name)


def fake_cupy():
    """A fresh module object standing in for ``cupy`` (see the module doc)."""
    mod = types.ModuleType("cupy", "tracegrad.testing's NumPy-backed stand-in for CuPy "
                                   "(a test harness, not a product backend)")
    mod.__tracegrad_emulator__ = True
    mod.ndarray = ndarray
    mod.RawModule = _RawModule

    def asarray(a, dtype=None, order=None):
        return np.asarray(a, dtype=dtype, order=order).view(ndarray)

    def ascontiguousarray(a, dtype=None):
        return np.ascontiguousarray(a, dtype=dtype).view(ndarray)

    def array(a, dtype=None, copy=True, order="K", ndmin=0):
        return np.array(a, dtype=dtype, copy=copy, order=order, ndmin=ndmin).view(ndarray)

    def asnumpy(a, stream=None, order="C", out=None):
        return np.array(a, copy=True).view(np.ndarray)

    def get_array_module(*args):
        return mod

    mod.asarray = asarray
    mod.ascontiguousarray = ascontiguousarray
    mod.array = array
    mod.asnumpy = asnumpy
    mod.get_array_module = get_array_module
    # cupy.fft: the 1-D transforms the registry's fft rows call
    mod.fft = types.SimpleNamespace(**{n: _wrapped(getattr(np.fft, n))
                                       for n in ("fft", "ifft", "rfft", "irfft")})
    runtime = types.SimpleNamespace(deviceSynchronize=lambda: None,
                                    getDeviceCount=lambda: 1)
    mod.cuda = types.SimpleNamespace(Device=_Device, runtime=runtime,
                                     get_current_stream=lambda: types.SimpleNamespace(
                                         synchronize=lambda: None))

    def __getattr__(name):
        if name in CUPY_CONSTANTS:
            return getattr(np, name)
        if name in CUPY_NAMES:
            f = getattr(np, name)
            return _Ufunc(f) if isinstance(f, np.ufunc) else _wrapped(f)
        raise AttributeError(
            f"tracegrad.testing's CuPy stand-in has no {name!r}; if CuPy provides it, add it "
            f"to tracegrad.testing.CUPY_NAMES")

    mod.__getattr__ = __getattr__
    return mod


def _clear_compiled_state():
    """Forget loaded generated modules (they are bound to whichever ``cupy``
    was importable), so nothing loaded under the stand-in outlives it."""
    from tracegrad.runtime import cache, graph_call
    cache.clear_cache(disk=False)
    graph_call._VJP_CACHE.clear()


@contextlib.contextmanager
def emulated_cupy():
    """Install ``fake_cupy()`` as ``cupy`` for the duration of the block, so
    ``backend="cupy"`` and device tensors run through the emulator.  The
    in-memory compile caches are cleared on entry and exit."""
    saved = sys.modules.get("cupy")
    fake = fake_cupy()
    _clear_compiled_state()
    sys.modules["cupy"] = fake
    try:
        yield fake
    finally:
        if saved is None:
            sys.modules.pop("cupy", None)
        else:
            sys.modules["cupy"] = saved
        _clear_compiled_state()


def load_driver(source, cupy_module=None):
    """Execute a generated driver module's source against ``cupy_module``
    (a fresh ``fake_cupy()`` by default); return its namespace."""
    fake = cupy_module if cupy_module is not None else fake_cupy()
    saved = sys.modules.get("cupy")
    sys.modules["cupy"] = fake
    try:
        ns = {"__name__": "tracegrad_emulated_driver"}
        exec(compile(source, "<tracegrad emulated driver>", "exec"), ns)
    finally:
        if saved is None:
            sys.modules.pop("cupy", None)
        else:
            sys.modules["cupy"] = saved
    return ns


def to_host(a):
    """A NumPy array of ``a``, whether it is a NumPy array, the stand-in's
    device array or a real CuPy array (which refuses ``np.asarray``: tests
    that run on a real GPU too, with TRACEGRAD_TEST_ON_GPU=1, read results
    through this)."""
    if type(a).__module__.startswith("cupy"):
        return a.get()
    return np.asarray(a)
