"""tracegrad: automatic differentiation for ordinary numerical Python.

Eager mode follows torch.autograd; compile mode traces NumPy or Tensor code
into a graph, differentiates it, and generates NumPy (or CUDA) source that is
cached on disk.  See README.md and docs/.
"""
from tracegrad._version import __version__
import numpy as _np

from tracegrad.ops import primitives
from tracegrad import autograd  # before tensor: the engine imports Tensor
from tracegrad.eager.tensor import Tensor, is_tensor
# the eager binder of every primitive, and the Tensor's torch methods (both install themselves)
from tracegrad.eager import bind as _bind, torch_methods as _torch_methods  # noqa: F401
from tracegrad.eager.factories import (tensor, as_tensor, from_numpy, zeros, ones, empty, full,
                                       eye, zeros_like, ones_like, empty_like, full_like, arange,
                                       linspace, rand, randn, rand_like, randn_like, randint,
                                       randperm, normal, manual_seed, seed)
from tracegrad.eager.device import (device, set_default_dtype, get_default_dtype,
                                    set_default_device, get_default_device)
from tracegrad import ops
from tracegrad.ops import *  # noqa: F401,F403
# The two faces: methods whose meaning differs follow the value's dialect;
# the top-level names torch has mean what they mean in torch.
from tracegrad.frontend import numpy_face  # noqa: F401
from tracegrad.frontend.torch_face import (std, var, max, min, sort, split, transpose,  # noqa: F401
                                           nonzero, squeeze, norm, topk, kthvalue, median, sum, mean,
                                           prod, amax, amin, argmax, argmin, all, any, nansum, nanmean,
                                           cross, equal, isclose, allclose)
from tracegrad.frontend.torch_face import (result_type, promote_types, can_cast,  # noqa: F401
                                           finfo, iinfo)
from tracegrad.frontend.torch_surface import *  # noqa: F401,F403 (torch's meaning)
from tracegrad.frontend.torch_surface import (removed_lstsq as lstsq,  # noqa: F401
                                              removed_solve as solve, var_mean, std_mean,
                                              cdist, dist)
import importlib as _importlib
linalg = _importlib.import_module("tracegrad.linalg")    # torch.linalg (ops.linalg is NumPy's)
special = _importlib.import_module("tracegrad.special")  # torch.special
from tracegrad import autograd
from tracegrad.autograd import (no_grad, enable_grad, set_grad_enabled, inference_mode,
                                is_grad_enabled, is_inference_mode_enabled)
# torch.cuda / torch.accelerator / torch.backends queries (CuPy loads on a query)
from tracegrad import cuda, accelerator, backends  # noqa: F401

# dtype names as in torch (float is float32, double is float64)
float16 = half = _np.dtype("float16")
float32 = float = _np.dtype("float32")
float64 = double = _np.dtype("float64")
int8 = _np.dtype("int8")
int16 = short = _np.dtype("int16")
int32 = int = _np.dtype("int32")
int64 = long = _np.dtype("int64")
uint8 = _np.dtype("uint8")
bool = _np.dtype("bool")
complex64 = cfloat = _np.dtype("complex64")
complex128 = cdouble = _np.dtype("complex128")
uint16 = _np.dtype("uint16")
uint32 = _np.dtype("uint32")
uint64 = _np.dtype("uint64")
dtype = _np.dtype

_LAZY = {
    # compiler entry points load on first use, so `import tracegrad` stays light
    "compile": "tracegrad.api", "grad": "tracegrad.api", "value_and_grad": "tracegrad.api",
    "vjp": "tracegrad.api", "jvp": "tracegrad.api", "jacobian": "tracegrad.api",
    "jacrev": "tracegrad.api", "jacfwd": "tracegrad.api", "hessian": "tracegrad.api",
    "cache_info": "tracegrad.runtime.cache", "clear_cache": "tracegrad.runtime.cache",
    "TraceError": "tracegrad.frontend.trace", "testing": None,
    "nn": None,  # torch.nn: Module, layers, losses, init, utils, functional (F)
    "func": None,  # torch.func (grad, vjp, jvp, jacrev, vmap, ...) on the compiler
    "optim": None,  # torch.optim: optimizers and lr_scheduler
    "utils": None,  # torch.utils.data: Dataset, TensorDataset, DataLoader, random_split
    "Generator": "tracegrad.utils.generator",  # torch.Generator (seeded, for generator=)
    "fixed_point": "tracegrad.implicit",  # x* = f(x*, *params), implicit derivatives
    "save": "tracegrad.serialization", "load": "tracegrad.serialization",  # torch.save/load
    "serialization": None,
}


def __getattr__(name):
    if name in _LAZY:
        import importlib
        mod = _LAZY[name]
        if mod is None:
            return importlib.import_module(f"tracegrad.{name}")
        return getattr(importlib.import_module(mod), name)
    if not name.startswith("__"):
        raise AttributeError(f"tracegrad does not provide torch.{name} (module 'tracegrad' "
                             f"has no attribute {name!r})")
    raise AttributeError(f"module 'tracegrad' has no attribute {name!r}")
