"""``torch.nn.init``: in-place initialisers with torch's formulas (gains,
fans, bounds).  Draws come from tracegrad's generator (``tg.manual_seed``)
or the ``generator=`` passed, so values are reproducible in tracegrad but
are not torch's bit for bit (copy torch's weights with load_state_dict for
that).  Each runs without recording on the tape, as torch's (no_grad)."""
from __future__ import annotations

import math
import warnings

import numpy as np

from tracegrad.eager.tensor import Tensor
from tracegrad.eager.factories import numpy_generator

__all__ = ["calculate_gain", "uniform_", "normal_", "trunc_normal_", "constant_", "ones_",
           "zeros_", "eye_", "dirac_", "xavier_uniform_", "xavier_normal_", "kaiming_uniform_",
           "kaiming_normal_", "orthogonal_", "sparse_"]


def _write(tensor, values):
    """tensor's values replaced in place (its version bumped, as an in-place op)."""
    if not isinstance(tensor, Tensor):
        raise TypeError(f"nn.init takes a Tensor, got {type(tensor).__name__}")
    data = tensor._data
    if type(data) is np.ndarray:
        data[...] = values
    else:   # CuPy
        from tracegrad.ops import primitives
        data[...] = primitives.array_module(data).asarray(values)
    tensor._vbox[0] += 1
    return tensor


def _no_op_if_empty(tensor):
    if tensor._data.size == 0:
        warnings.warn("Initializing zero-element tensors is a no-op", UserWarning, stacklevel=3)
        return True
    return False


def calculate_gain(nonlinearity, param=None):
    """The recommended gain for a nonlinearity (torch's table)."""
    linear_fns = ["linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d",
                  "conv_transpose2d", "conv_transpose3d"]
    if nonlinearity in linear_fns or nonlinearity == "sigmoid":
        return 1
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        if param is None:
            negative_slope = 0.01
        elif not isinstance(param, bool) and isinstance(param, (int, float)):
            negative_slope = param
        else:
            raise ValueError(f"negative_slope {param} not a valid number")
        return math.sqrt(2.0 / (1 + negative_slope ** 2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ValueError(f"Unsupported nonlinearity {nonlinearity}")


def _calculate_fan_in_and_fan_out(tensor):
    dim = len(tensor.shape)
    if dim < 2:
        raise ValueError("Fan in and fan out can not be computed for tensor with fewer than 2 "
                         "dimensions")
    receptive = 1
    for s in tensor.shape[2:]:
        receptive *= s
    return tensor.shape[1] * receptive, tensor.shape[0] * receptive


def _calculate_correct_fan(tensor, mode):
    mode = mode.lower()
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"Mode {mode} not supported, please use one of fan_in, fan_out")
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    return fan_in if mode == "fan_in" else fan_out


def uniform_(tensor, a=0.0, b=1.0, generator=None):
    """U(a, b)."""
    if _no_op_if_empty(tensor):
        return tensor
    return _write(tensor, numpy_generator(generator).uniform(a, b, tensor.shape))


def normal_(tensor, mean=0.0, std=1.0, generator=None):
    """N(mean, std**2)."""
    if _no_op_if_empty(tensor):
        return tensor
    return _write(tensor, numpy_generator(generator).normal(mean, std, tensor.shape))


def trunc_normal_(tensor, mean=0.0, std=1.0, a=-2.0, b=2.0, generator=None):
    """N(mean, std**2) truncated to [a, b], by the inverse CDF as torch."""
    from scipy.special import erfinv
    if _no_op_if_empty(tensor):
        return tensor

    def norm_cdf(x):
        return (1.0 + math.erf(x / math.sqrt(2.0))) / 2.0

    if mean < a - 2 * std or mean > b + 2 * std:
        warnings.warn("mean is more than 2 std from [a, b] in nn.init.trunc_normal_. The "
                      "distribution of values may be incorrect.", stacklevel=2)
    lo, hi = norm_cdf((a - mean) / std), norm_cdf((b - mean) / std)
    u = numpy_generator(generator).uniform(2 * lo - 1, 2 * hi - 1, tensor.shape)
    v = erfinv(u) * std * math.sqrt(2.0) + mean
    return _write(tensor, np.clip(v, a, b))


def constant_(tensor, val):
    if _no_op_if_empty(tensor):
        return tensor
    return _write(tensor, val)


def ones_(tensor):
    return _write(tensor, 1)


def zeros_(tensor):
    return _write(tensor, 0)


def eye_(tensor):
    if len(tensor.shape) != 2:
        raise ValueError("Only tensors with 2 dimensions are supported")
    return _write(tensor, np.eye(*tensor.shape))


def dirac_(tensor, groups=1):
    dims = len(tensor.shape)
    if dims not in (3, 4, 5):
        raise ValueError("Only tensors with 3, 4, or 5 dimensions are supported")
    sizes = tensor.shape
    if sizes[0] % groups != 0:
        raise ValueError("dim 0 must be divisible by groups")
    out_per = sizes[0] // groups
    min_dim = min(out_per, sizes[1])
    v = np.zeros(sizes)
    for g in range(groups):
        for d in range(min_dim):
            idx = (g * out_per + d, d) + tuple(s // 2 for s in sizes[2:])
            v[idx] = 1
    return _write(tensor, v)


def xavier_uniform_(tensor, gain=1.0, generator=None):
    """U(-a, a) with a = gain * sqrt(6 / (fan_in + fan_out))."""
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    std = gain * math.sqrt(2.0 / float(fan_in + fan_out))
    a = math.sqrt(3.0) * std
    return uniform_(tensor, -a, a, generator)


def xavier_normal_(tensor, gain=1.0, generator=None):
    """N(0, std**2) with std = gain * sqrt(2 / (fan_in + fan_out))."""
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    std = gain * math.sqrt(2.0 / float(fan_in + fan_out))
    return normal_(tensor, 0.0, std, generator)


def kaiming_uniform_(tensor, a=0, mode="fan_in", nonlinearity="leaky_relu", generator=None):
    """U(-bound, bound) with bound = gain * sqrt(3 / fan)."""
    if _no_op_if_empty(tensor):
        return tensor
    fan = _calculate_correct_fan(tensor, mode)
    gain = calculate_gain(nonlinearity, a)
    bound = math.sqrt(3.0) * gain / math.sqrt(fan)
    return uniform_(tensor, -bound, bound, generator)


def kaiming_normal_(tensor, a=0, mode="fan_in", nonlinearity="leaky_relu", generator=None):
    """N(0, std**2) with std = gain / sqrt(fan)."""
    if _no_op_if_empty(tensor):
        return tensor
    fan = _calculate_correct_fan(tensor, mode)
    std = calculate_gain(nonlinearity, a) / math.sqrt(fan)
    return normal_(tensor, 0.0, std, generator)


def orthogonal_(tensor, gain=1, generator=None):
    """A (semi-)orthogonal matrix from the QR factorisation of a normal draw,
    signs fixed by R's diagonal, as torch."""
    if len(tensor.shape) < 2:
        raise ValueError("Only tensors with 2 or more dimensions are supported")
    if tensor._data.size == 0:
        return tensor
    rows = tensor.shape[0]
    cols = tensor._data.size // rows
    flat = numpy_generator(generator).normal(0.0, 1.0, (rows, cols))
    if rows < cols:
        flat = flat.T
    q, r = np.linalg.qr(flat)
    q = q * np.sign(np.diag(r))
    if rows < cols:
        q = q.T
    return _write(tensor, gain * q.reshape(tensor.shape))


def sparse_(tensor, sparsity, std=0.01, generator=None):
    if len(tensor.shape) != 2:
        raise ValueError("Only tensors with 2 dimensions are supported")
    rows, cols = tensor.shape
    num_zeros = int(math.ceil(sparsity * rows))
    rng = numpy_generator(generator)
    v = rng.normal(0, std, (rows, cols))
    for c in range(cols):
        v[rng.permutation(rows)[:num_zeros], c] = 0
    return _write(tensor, v)
