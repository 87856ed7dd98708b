"""``torch.nn.functional`` with torch's meaning, as compositions of registry ops.

Every function here is written with tracegrad's functional ops, so it runs
eagerly on Tensors (recording the tape), on traced values inside
``tg.grad`` / ``tg.compile``, and its derivatives of any order come from the
rows' rules: no function here has a derivative of its own.  Names, argument
names, defaults, reductions and error conditions follow torch 2.13.

Numerical care, as torch takes it:

* ``log_softmax`` / ``cross_entropy`` subtract a log-sum-exp;
* ``binary_cross_entropy_with_logits`` is ``(1 - y) x - log_sigmoid(x)``,
  with ``log_sigmoid(x) = -softplus(-x)`` (no overflow for either sign);
* ``binary_cross_entropy`` clamps each log at -100, as torch does, so
  probabilities of exactly 0 or 1 give a finite loss;
* branches that could overflow in the branch not taken (elu's exp, the
  norms' square roots at zero) are guarded, so no NaN leaks into gradients.

The layers (conv1d/2d/3d, conv_transpose1d/2d, the pools, batch_norm,
layer_norm, group_norm, embedding, bilinear, scaled_dot_product_attention)
are compositions too: a convolution stacks one strided slice of the padded
input per kernel offset (im2col) and multiplies by the weight; a transposed
convolution dilates its input with zeros and convolves with the flipped
weight.  A module's parameter met inside a compiled function is read at
call time (``_lifted``).

Differences from torch that remain are listed in docs (coming from PyTorch):
``inplace=True`` is refused, ``dropout`` inside a compiled function draws
from NumPy's global random state, ``batch_norm`` in training mode (which
updates the running statistics in place) is refused inside a compiled
function other than a compiled module's call (``tg.compile(model)`` returns
the new statistics from the compiled call and writes them into the buffers,
as torch.compile does), ``max_pool*(return_indices=True)`` and
``embedding(max_norm=)`` are not supported, and a few error types.
"""
from __future__ import annotations

import contextlib
import math
import threading
import warnings

import numpy as np

from tracegrad.ops import primitives
from tracegrad.ops.base import (add, sub, mul, div, neg, log, tanh as _tanh, where, astype,
                                stop_gradient, sum as _sum, reshape, matmul, swapaxes, equal,
                                not_equal, greater, less, logical_and, pow as _pow, broadcast_to,
                                is_value)
from tracegrad.ops.elementwise import (abs as _abs, sqrt, square, expm1, erf, maximum, clip,
                                       sigmoid as _sigmoid, relu as _relu, softplus as _softplus)
from tracegrad.ops.reductions import mean as _mean, amax
from tracegrad.ops.shape import expand_dims
from tracegrad.ops.indexing import getitem, index_add as _index_add
from tracegrad.ops.numpy_functions import pad as _np_pad
from tracegrad.ops import nn as _nn
from tracegrad.ops.random import is_tracing
from tracegrad.eager.tensor import Tensor
from tracegrad.eager.factories import _RNG, traced_draw

__all__ = [
    "binary_cross_entropy_with_logits", "binary_cross_entropy", "cross_entropy", "nll_loss",
    "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "softmax", "log_softmax", "relu",
    "gelu", "silu", "tanh", "sigmoid", "softplus", "leaky_relu", "elu", "logsigmoid", "linear",
    "dropout", "one_hot", "normalize", "pad", "cosine_similarity",
    "hardtanh", "relu6", "selu", "celu", "mish", "hardsigmoid", "hardswish", "softsign",
    "tanhshrink", "hardshrink", "softshrink", "threshold", "glu", "prelu", "softmin", "kl_div",
    "dropout1d", "dropout2d", "alpha_dropout", "bilinear", "conv1d", "conv2d", "conv3d",
    "conv_transpose1d", "conv_transpose2d", "max_pool1d", "max_pool2d", "avg_pool1d",
    "avg_pool2d", "adaptive_avg_pool1d", "adaptive_avg_pool2d", "batch_norm", "layer_norm",
    "group_norm", "instance_norm", "embedding", "scaled_dot_product_attention", "unfold",
    "fold", "interpolate",
]


# --- errors --------------------------------------------------------------------------------
# torch raises RuntimeError for most bad arguments; these are also the
# built-in class a Python user would catch (ValueError / TypeError).

class ArgumentError(ValueError, RuntimeError):
    """A bad argument to a function of tracegrad.nn.functional."""


class DtypeError(TypeError, RuntimeError):
    """An argument of a dtype the function does not take."""


# --- helpers -------------------------------------------------------------------------------

def _shape(x):
    return tuple(getattr(x, "shape", np.shape(x)))


def _dtype(x):
    return np.dtype(getattr(x, "dtype", None) or np.asarray(x).dtype)


def _size(shape):
    return "torch.Size([" + ", ".join(str(d) for d in shape) + "])"


def _concrete(v):
    """The values of v as a NumPy array when they are known now (an eager
    Tensor, an array, a number); None for a traced value."""
    if isinstance(v, Tensor):
        data = v._data
        return data if isinstance(data, np.ndarray) else data.get()  # CuPy
    if is_value(v):
        return None
    return np.asarray(v)


def _value(v, like=None):
    """Lists and numbers become arrays (of ``like``'s float dtype when it has one)."""
    if is_value(v) or isinstance(v, np.ndarray):
        return v
    a = np.asarray(v)
    if like is not None and a.dtype.kind in "biuf" and _dtype(like).kind == "f":
        a = a.astype(_dtype(like))
    return a


def _lifted(v):
    """A concrete Tensor (a module's parameter or buffer) met inside a
    compiled function: the implicit input that reads it at call time, so
    that what is computed from it alone (a transpose, a reshape) is computed
    at call time too, and a rebinding of its data (module.double()) is seen
    by the guard.  Anything else as it is."""
    if isinstance(v, Tensor) and is_tracing():
        from tracegrad.frontend import captured
        root = captured.active_root()
        if root is not None:
            t = root._lift_operand(v)
            if t is not None:
                return t
    return v


def _current(buf):
    """A running statistic read in eval mode: inside a compiled module's call,
    its value as updated earlier in the call, else as ``_lifted``."""
    if _RUNNING.writes and isinstance(buf, Tensor):
        hit = _RUNNING.writes[-1].get(id(buf))
        if hit is not None:
            return hit[1]
    return _lifted(buf)


def _cast_like(v, like):
    """A weight in the input's dtype (torch computes BCE weights in it)."""
    v = _value(v, like)
    if _dtype(v).kind == "f" and _dtype(v) != _dtype(like):
        v = astype(v, _dtype(like))
    return v


def _no_inplace(name, inplace):
    if inplace:
        raise NotImplementedError(
            f"F.{name}(..., inplace=True) is not supported by tracegrad: it has no in-place "
            f"activations. Write x = F.{name}(x) (the same values and gradients).")


def _legacy_reduction(size_average, reduce, reduction):
    """torch's size_average=/reduce= (deprecated) mapped to a reduction string."""
    if size_average is None and reduce is None:
        return reduction
    size_average = True if size_average is None else size_average
    reduce = True if reduce is None else reduce
    ret = "none" if not reduce else ("mean" if size_average else "sum")
    warnings.warn(f"size_average and reduce args will be deprecated, please use "
                  f"reduction='{ret}' instead.", UserWarning, stacklevel=3)
    return ret


def _check_reduction(reduction):
    if reduction not in ("none", "mean", "sum"):
        raise ArgumentError(f"{reduction} is not a valid value for reduction (torch's "
                            f"reductions are 'mean', 'sum' and 'none')")


def _reduce(loss, reduction):
    if reduction == "none":
        return loss
    if reduction == "sum":
        return _sum(loss)
    return _mean(loss)


def _float_input(x, name):
    dt = _dtype(x)
    if dt.kind != "f":
        raise DtypeError(f"F.{name} takes a floating-point input, got dtype {dt}; convert it "
                         f"with .float() / .double() first (torch raises for it too)")


def _same_size_warning(input, target):
    if _shape(input) != _shape(target):
        warnings.warn(
            f"Using a target size ({_size(_shape(target))}) that is different to the input size "
            f"({_size(_shape(input))}). This will likely lead to incorrect results due to "
            f"broadcasting. Please ensure they have the same size.", UserWarning, stacklevel=3)


def _weighted(loss, weight, input, reduction):
    """torch 2.13's elementwise weight= of mse_loss / l1_loss: the mean is
    sum(w * loss) / sum(w)."""
    if _shape(weight) != _shape(input):
        raise ArgumentError("Weights and input must have the same size.")
    weight = _value(weight, input)
    loss = mul(loss, weight)
    if reduction == "mean":
        return div(_sum(loss), _sum(weight))
    return _reduce(loss, reduction)


# --- activations ---------------------------------------------------------------------------

def relu(input, inplace=False):
    """max(x, 0); the gradient at 0 is 0, as torch's."""
    _no_inplace("relu", inplace)
    return _relu(input)


def leaky_relu(input, negative_slope=0.01, inplace=False):
    """x for x > 0, negative_slope * x otherwise."""
    _no_inplace("leaky_relu", inplace)
    return where(greater(input, 0), input, mul(input, negative_slope))


def elu(input, alpha=1.0, inplace=False):
    """x for x > 0, alpha * (exp(x) - 1) otherwise."""
    _no_inplace("elu", inplace)
    neg_part = mul(expm1(clip(input, max=0.0)), alpha)  # no overflow in the branch not taken
    return where(greater(input, 0), input, neg_part)


def gelu(input, approximate="none"):
    """x * Phi(x) (approximate='none') or torch's tanh approximation."""
    if approximate == "none":
        return mul(mul(input, 0.5), add(erf(mul(input, 1.0 / math.sqrt(2.0))), 1.0))
    if approximate == "tanh":
        inner = mul(add(input, mul(_pow(input, 3), 0.044715)), math.sqrt(2.0 / math.pi))
        return mul(mul(input, 0.5), add(_tanh(inner), 1.0))
    raise ArgumentError(f"F.gelu: approximate argument must be either none or tanh, got "
                        f"{approximate!r}")


def silu(input, inplace=False):
    """x * sigmoid(x)."""
    _no_inplace("silu", inplace)
    return mul(input, _sigmoid(input))


def tanh(input):
    return _tanh(input)


def sigmoid(input):
    return _sigmoid(input)


def logsigmoid(input):
    """log(sigmoid(x)) = -softplus(-x), without overflow."""
    return neg(_softplus(neg(input)))


def softplus(input, beta=1.0, threshold=20.0):
    """log(1 + exp(beta x)) / beta, and x itself where beta * x > threshold."""
    bx = mul(input, beta) if beta != 1 else input
    soft = _softplus(bx)
    if beta != 1:
        soft = div(soft, beta)
    return where(greater(bx, threshold), input, soft)


def _softmax_dim(name, ndim, dim):
    if dim is not None:
        return dim
    warnings.warn(f"Implicit dimension choice for {name} has been deprecated. Change the call "
                  f"to include dim=X as an argument.", UserWarning, stacklevel=3)
    return 0 if ndim in (0, 1, 3) else 1


def softmax(input, dim=None, _stacklevel=3, dtype=None):
    """exp(x) / sum(exp(x)) along dim.  Without dim, torch's deprecated
    implicit choice (0 for 0-, 1- and 3-d inputs, else 1) with its warning."""
    if dtype is None:
        _float_input(input, "softmax")
    return _nn.softmax(input, _softmax_dim("softmax", len(_shape(input)), dim), dtype)


def log_softmax(input, dim=None, _stacklevel=3, dtype=None):
    """x - logsumexp(x) along dim (implicit dim as in softmax)."""
    if dtype is None:
        _float_input(input, "log_softmax")
    return _nn.log_softmax(input, _softmax_dim("log_softmax", len(_shape(input)), dim), dtype)


# --- regression losses ---------------------------------------------------------------------

def mse_loss(input, target, size_average=None, reduce=None, reduction="mean", weight=None):
    """(input - target) ** 2, reduced; target broadcasts (with torch's warning)."""
    _same_size_warning(input, target)
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_reduction(reduction)
    loss = square(sub(input, _value(target, input)))
    if weight is not None:
        return _weighted(loss, weight, input, reduction)
    return _reduce(loss, reduction)


def l1_loss(input, target, size_average=None, reduce=None, reduction="mean", weight=None):
    """|input - target|, reduced; the gradient at equality is 0 (sign(0))."""
    _same_size_warning(input, target)
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_reduction(reduction)
    loss = _abs(sub(input, _value(target, input)))
    if weight is not None:
        return _weighted(loss, weight, input, reduction)
    return _reduce(loss, reduction)


def _smooth(diff, beta):
    z = _abs(diff)
    return where(less(z, beta), div(mul(square(diff), 0.5), beta), sub(z, 0.5 * beta))


def smooth_l1_loss(input, target, size_average=None, reduce=None, reduction="mean", beta=1.0):
    """0.5 d**2 / beta where |d| < beta, |d| - beta / 2 elsewhere; beta=0 is l1_loss."""
    _same_size_warning(input, target)
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_reduction(reduction)
    if beta < 0:
        raise ArgumentError(f"smooth_l1_loss does not support negative values for beta (got "
                            f"{beta}).")
    diff = sub(input, _value(target, input))
    loss = _abs(diff) if beta == 0 else _smooth(diff, beta)
    return _reduce(loss, reduction)


def huber_loss(input, target, reduction="mean", delta=1.0, weight=None):
    """0.5 d**2 where |d| < delta, delta (|d| - delta / 2) elsewhere
    (= delta * smooth_l1 with beta=delta); weight= scales elementwise and the
    mean stays a plain mean, as torch 2.13."""
    _same_size_warning(input, target)
    _check_reduction(reduction)
    if not delta > 0:
        raise ArgumentError(f"huber_loss does not support non-positive values for delta (got "
                            f"{delta}).")
    diff = sub(input, _value(target, input))
    z = _abs(diff)
    loss = where(less(z, delta), mul(square(diff), 0.5), mul(sub(z, 0.5 * delta), delta))
    if weight is not None:
        if _shape(weight) != _shape(input):
            raise ArgumentError("Weights and input must have the same size.")
        loss = mul(loss, _value(weight, input))
    return _reduce(loss, reduction)


# --- binary cross-entropy ------------------------------------------------------------------

def _safe_log(p):
    """max(log p, -100), torch's clamp; p == 0 gives -100 without a NaN in
    the gradient (the log sees 1 there, and its branch is not taken)."""
    pos = greater(p, 0)
    return where(pos, maximum(log(where(pos, p, 1.0)), -100.0), -100.0)


def binary_cross_entropy(input, target, weight=None, size_average=None, reduce=None,
                         reduction="mean"):
    """-w (y log p + (1 - y) log(1 - p)), each log clamped at -100 as torch."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_reduction(reduction)
    if _shape(target) != _shape(input):
        raise ArgumentError(
            f"Using a target size ({_size(_shape(target))}) that is different to the input size "
            f"({_size(_shape(input))}) is deprecated. Please ensure they have the same size.")
    p = _concrete(input)
    if p is not None and p.size and not (np.all(p >= 0) and np.all(p <= 1)):
        raise ArgumentError("F.binary_cross_entropy: all elements of input should be between 0 "
                            "and 1 (they are probabilities; for logits use "
                            "F.binary_cross_entropy_with_logits)")
    target = _value(target, input)
    loss = neg(add(mul(target, _safe_log(input)),
                   mul(sub(1.0, target), _safe_log(sub(1.0, input)))))
    if weight is not None:
        loss = mul(loss, _cast_like(weight, input))
    return _reduce(loss, reduction)


def binary_cross_entropy_with_logits(input, target, weight=None, size_average=None, reduce=None,
                                     reduction="mean", pos_weight=None):
    """BCE on logits, stable for any sign: (1 - y) x - l log_sigmoid(x) with
    l = 1 + (pos_weight - 1) y; weight= scales the elementwise loss."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_reduction(reduction)
    if _shape(target) != _shape(input):
        raise ArgumentError(f"Target size ({_size(_shape(target))}) must be the same as input "
                            f"size ({_size(_shape(input))})")
    target = _value(target, input)
    ls = logsigmoid(input)
    if pos_weight is not None:
        ls = mul(ls, add(mul(sub(_cast_like(pos_weight, input), 1.0), target), 1.0))
    loss = sub(mul(sub(1.0, target), input), ls)
    if weight is not None:
        loss = mul(loss, _cast_like(weight, input))
    return _reduce(loss, reduction)


# --- classification losses -----------------------------------------------------------------

def _class_layout(input, target, name):
    """Check input (C,) / (N, C, d1, ...) against class-index targets; the
    class dim, the number of classes, and the target as a value."""
    s, ts = _shape(input), _shape(target)
    nd = len(s)
    if nd < 1:
        raise ArgumentError(f"Expected 1 or more dimensions (got {nd})")
    tdt = _dtype(target)
    if tdt.kind not in "iu":
        raise DtypeError(f"F.{name}: expected target dtype to be Long or Byte (class indices), "
                         f"but got {tdt}; for class probabilities use F.cross_entropy with a "
                         f"float target of the input's shape")
    if nd == 1:
        if ts not in ((), (1,)):
            raise ArgumentError(f"F.{name}: an unbatched input of shape {s} takes a 0-d target "
                                f"(one class index), got a target of shape {ts}")
        if ts == (1,):
            target = reshape(_value(target), ())
        return 0, s[0], _value(target)
    if ts[:1] != s[:1] or len(ts) < 1:
        raise ArgumentError(f"Expected input batch_size ({s[0]}) to match target batch_size "
                            f"({ts[0] if ts else 0}).")
    if ts != s[:1] + s[2:]:
        raise ArgumentError(f"F.{name}: Expected target size {list(s[:1] + s[2:])}, got "
                            f"{list(ts)} (dim 1 of the input is the class dim)")
    return 1, s[1], _value(target)


def _check_indices(target, C, ignore_index):
    t = _concrete(target)
    if t is None:
        return
    bad = t[(t != ignore_index) & ((t < 0) | (t >= C))]
    if bad.size:
        raise IndexError(f"Target {int(bad.flat[0])} is out of bounds (the input has {C} "
                         f"classes; ignore_index={ignore_index}).")


def _class_weight(weight, C, cdim, nd, like):
    if weight is None:
        return None
    if _shape(weight) != (C,):
        raise ArgumentError(f"weight tensor should be defined either for all {C} classes or no "
                            f"classes but got weight tensor of shape: {list(_shape(weight))}")
    return reshape(_cast_like(weight, like), (C,) + (1,) * (nd - cdim - 1))


def _nll(logp, target, w, cdim, C, ignore_index, reduction):
    """-w[t] logp[t] at each position, 0 where t == ignore_index; the mean
    divides by the sum of the weights taken (torch's weighted mean)."""
    nd = len(_shape(logp))
    classes = np.arange(C).reshape((C,) + (1,) * (nd - cdim - 1))
    hit = equal(expand_dims(target, cdim), classes)
    picked = _sum(where(hit, logp, 0.0), axis=cdim)
    keep = not_equal(target, ignore_index)
    if w is None:
        wt = astype(keep, _dtype(logp))
    else:
        wt = where(keep, _sum(where(hit, w, 0.0), axis=cdim), 0.0)
    loss = where(keep, neg(mul(picked, wt)), 0.0)
    if _concrete(target) is None:
        # a traced target cannot be checked now: a class index out of range
        # (torch raises) makes its loss NaN instead of a silent 0
        hits = _sum(astype(hit, _dtype(logp)), axis=cdim)
        loss = where(logical_and(keep, equal(hits, 0.0)), math.nan, loss)
    if reduction == "mean":
        return div(_sum(loss), _sum(wt))
    return _reduce(loss, reduction)


def nll_loss(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
             reduction="mean"):
    """-input[n, target[n], ...] (input holds log-probabilities; dim 1 is the
    class dim), optionally weighted per class; positions whose target is
    ignore_index count for nothing, also in the mean's denominator.  A
    target out of range raises IndexError when its values are known, and
    gives a NaN loss inside a compiled function."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_reduction(reduction)
    cdim, C, target = _class_layout(input, target, "nll_loss")
    _check_indices(target, C, ignore_index)
    w = _class_weight(weight, C, cdim, len(_shape(input)), input)
    return _nll(input, target, w, cdim, C, ignore_index, reduction)


def cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
                  reduction="mean", label_smoothing=0.0):
    """log_softmax over dim 1 (dim 0 for an unbatched (C,) input), then
    nll_loss for class-index targets, or -sum(target * logp) over the class
    dim for class-probability targets (a float target of the input's shape),
    with torch's label smoothing and weighted means."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_reduction(reduction)
    if not 0.0 <= label_smoothing <= 1.0:
        raise ArgumentError(f"label_smoothing must be between 0.0 and 1.0. Got: {label_smoothing}")
    s = _shape(input)
    if len(s) < 1:
        raise ArgumentError(f"Expected 1 or more dimensions (got {len(s)})")
    _float_input(input, "cross_entropy")
    cdim = 0 if len(s) == 1 else 1
    C = s[cdim]
    logp = _nn.log_softmax(input, cdim)
    if _dtype(target).kind == "f":
        return _ce_probabilities(logp, target, weight, ignore_index, reduction, label_smoothing,
                                 cdim, C)
    cdim, C, target = _class_layout(input, target, "cross_entropy")
    _check_indices(target, C, ignore_index)
    w = _class_weight(weight, C, cdim, len(s), input)
    nll = _nll(logp, target, w, cdim, C, ignore_index, reduction)
    if label_smoothing == 0:
        return nll
    # torch: (1 - eps) nll + eps / C * (smooth loss), the smooth loss being
    # -sum_c w_c logp_c at each kept position, reduced like nll_loss
    keep = not_equal(target, ignore_index)
    smooth = neg(_sum(logp if w is None else mul(logp, w), axis=cdim))
    smooth = where(keep, smooth, 0.0)
    if reduction == "mean":
        if w is None:
            denom = _sum(astype(keep, _dtype(logp)))
        else:
            classes = np.arange(C).reshape((C,) + (1,) * (len(s) - cdim - 1))
            hit = equal(expand_dims(target, cdim), classes)
            denom = _sum(where(keep, _sum(where(hit, w, 0.0), axis=cdim), 0.0))
        smooth = div(_sum(smooth), denom)
    else:
        smooth = _reduce(smooth, reduction)
    return add(mul(nll, 1.0 - label_smoothing), mul(smooth, label_smoothing / C))


def _ce_probabilities(logp, target, weight, ignore_index, reduction, label_smoothing, cdim, C):
    s = _shape(logp)
    if _shape(target) != s:
        raise ArgumentError(f"F.cross_entropy: a float target holds class probabilities and must "
                            f"have the input's shape {list(s)}, got {list(_shape(target))}; for "
                            f"class indices pass an integer (int64) target")
    if ignore_index != -100:
        raise ArgumentError("ignore_index is not supported for floating point target")
    target = _value(target, logp)
    if label_smoothing > 0:
        target = add(mul(target, 1.0 - label_smoothing), label_smoothing / C)
    terms = mul(logp, target)
    w = _class_weight(weight, C, cdim, len(s), logp)
    if w is not None:
        terms = mul(terms, w)
    loss = neg(_sum(terms, axis=cdim))
    if reduction == "mean":  # torch divides by the number of positions, weights or not
        n = 1
        for i, d in enumerate(s):
            if i != cdim:
                n *= d
        return div(_sum(loss), float(n))
    return _reduce(loss, reduction)


# --- layers and helpers --------------------------------------------------------------------

def linear(input, weight, bias=None):
    """input @ weight.T + bias (weight is (out_features, in_features), or (in,))."""
    weight, bias = _lifted(weight), _lifted(bias)
    ws = _shape(weight)
    if len(ws) not in (1, 2):
        raise ArgumentError(f"F.linear: weight must be 1-d or 2-d (out_features, in_features), "
                            f"got shape {ws}")
    if _shape(input)[-1:] != ws[-1:]:
        raise ArgumentError(f"F.linear: input's last dim ({_shape(input)[-1:]}) must equal "
                            f"weight's in_features ({ws[-1]}); weight is (out_features, "
                            f"in_features) and the product is input @ weight.T")
    out = matmul(input, swapaxes(weight, 0, 1) if len(ws) == 2 else weight)
    return out if bias is None else add(out, _value(bias, input))


def dropout(input, p=0.5, training=True, inplace=False):
    """Zero each element with probability p and scale the rest by 1/(1-p).

    The mask is drawn from tracegrad's generator (the one behind tg.rand,
    seeded by tg.manual_seed), eagerly and inside compiled code alike (there
    a random-draw node reading that generator, drawn afresh on every call,
    never frozen at trace time).  p=0 or training=False is the identity."""
    _no_inplace("dropout", inplace)
    if not 0.0 <= p <= 1.0:
        raise ArgumentError(f"dropout probability has to be between 0 and 1, but got {p}")
    if not training or p == 0:
        return input
    dt = _dtype(input)
    if p == 1:
        return mul(input, 0.0)
    shape = _shape(input)
    scale = 1.0 / (1.0 - p)
    if is_tracing():
        u = _traced_uniform(shape)
        return mul(input, astype(where(less(u, 1.0 - p), scale, 0.0), dt))
    keep = _RNG.gen.random(shape) < 1.0 - p
    mask = np.where(keep, scale, 0.0).astype(dt)
    if isinstance(input, Tensor) and not isinstance(input._data, np.ndarray):
        mask = primitives.array_module(input._data).asarray(mask)  # a Tensor on the GPU
    return mul(input, mask)


def one_hot(tensor, num_classes=-1):
    """int64 (..., num_classes) with a 1 at each index; num_classes=-1 takes
    max + 1 (which needs the values: inside a compiled function pass it)."""
    if _dtype(tensor) != np.int64:
        raise DtypeError(f"one_hot is only applicable to index tensor of type LongTensor "
                         f"(int64), got {_dtype(tensor)}")
    t = _concrete(tensor)
    if num_classes == -1:
        if t is None:
            raise ArgumentError("F.one_hot(x) with num_classes=-1 reads the values of x to find "
                                "the number of classes, which a traced value does not have; "
                                "pass num_classes=")
        if t.size == 0:
            raise ArgumentError("Can not infer total number of classes from empty tensor.")
        num_classes = int(t.max()) + 1
    if t is not None and t.size:
        if t.min() < 0:
            raise ArgumentError("Class values must be non-negative.")
        if t.max() >= num_classes:
            raise ArgumentError(f"Class values must be smaller than num_classes ({num_classes}).")
    return astype(equal(expand_dims(_value(tensor), -1), np.arange(num_classes)), np.int64)


def _vector_norm(x, p, dim):
    """||x||_p along dim (keepdim), with a zero gradient at x == 0 (as
    torch's norm) instead of the NaN of sqrt/pow at zero."""
    a = _abs(x)
    if p == math.inf:
        return amax(a, axis=dim, keepdims=True)
    if p == 1:
        return _sum(a, axis=dim, keepdims=True)
    if p == 0:
        return _sum(astype(not_equal(x, 0), _dtype(x)), axis=dim, keepdims=True)
    s = _sum(square(x) if p == 2 else _pow(a, float(p)), axis=dim, keepdims=True)
    pos = greater(s, 0)
    safe = where(pos, s, 1.0)
    root = sqrt(safe) if p == 2 else _pow(safe, 1.0 / p)
    return where(pos, root, 0.0)


def normalize(input, p=2.0, dim=1, eps=1e-12, out=None):
    """input / max(||input||_p, eps) along dim."""
    if out is not None:
        raise TypeError("F.normalize(out=) is not supported by tracegrad; assign the result")
    return div(input, clip(_vector_norm(input, p, dim), min=eps))


def cosine_similarity(x1, x2, dim=1, eps=1e-8):
    """sum((x1 / n1) * (x2 / n2)) along dim, each norm clamped at eps in
    value only (torch clamps it under no_grad, so the gradient is the
    unclamped norm's)."""
    def clamped(x):
        n = _vector_norm(x, 2, dim)
        return add(n, stop_gradient(sub(clip(n, min=eps), n)))
    x1, x2 = _value(x1), _value(x2, x1)
    shape = np.broadcast_shapes(_shape(x1), _shape(x2))  # torch broadcasts first
    x1 = x1 if _shape(x1) == shape else broadcast_to(x1, shape)
    x2 = x2 if _shape(x2) == shape else broadcast_to(x2, shape)
    return _sum(mul(div(x1, clamped(x1)), div(x2, clamped(x2))), axis=dim)


_PAD_MODES = {"constant": "constant", "reflect": "reflect", "replicate": "edge",
              "circular": "wrap"}


def pad(input, pad, mode="constant", value=None):
    """torch's pad: ``pad`` lists (before, after) pairs starting from the LAST
    dim; modes constant (value, negative widths crop), reflect, replicate,
    circular."""
    pad = [int(v) for v in pad]
    s = _shape(input)
    nd = len(s)
    if len(pad) % 2:
        raise ArgumentError("Padding length must be divisible by 2")
    if len(pad) // 2 > nd:
        raise ArgumentError(f"Padding length should be less than or equal to two times the input "
                            f"dimension but got padding length {len(pad)} and input of dimension "
                            f"{nd}")
    if mode not in _PAD_MODES:
        raise NotImplementedError(f"Unrecognised padding mode {mode} (torch's modes are "
                                  f"'constant', 'reflect', 'replicate', 'circular')")
    width = [(0, 0)] * nd
    for i in range(len(pad) // 2):
        width[nd - 1 - i] = (pad[2 * i], pad[2 * i + 1])
    if mode != "constant":
        if value is not None and value != 0:
            raise ArgumentError(f'Padding mode "{mode}" doesn\'t take in value argument')
        k = len(pad) // 2
        if k > 3 or nd not in (k + 1, k + 2):
            raise NotImplementedError(
                f"Padding size {len(pad)} is not supported for {nd}D input tensor: mode "
                f"{mode!r} pads the last 1, 2 or 3 dims of an input with one or two leading "
                f"(batch, channel) dims")
        if any(a < 0 or b < 0 for a, b in width):
            raise NotImplementedError(f"F.pad: negative padding in mode {mode!r} is not "
                                      f"supported by tracegrad (it is in mode 'constant')")
        for ax, (a, b) in enumerate(width):
            if mode == "reflect" and (a >= s[ax] or b >= s[ax]):
                raise ArgumentError(f"Padding size should be less than the corresponding input "
                                    f"dimension, but got: padding ({a}, {b}) at dimension {ax} of "
                                    f"input {list(s)}")
            if mode == "circular" and (a > s[ax] or b > s[ax]):
                raise ArgumentError(f"Padding value causes wrapping around more than once: "
                                    f"padding ({a}, {b}) at dimension {ax} of input {list(s)}")
        return _np_pad(input, tuple(width), mode=_PAD_MODES[mode])
    # constant: negative widths crop first, then pad the rest
    crop = tuple(slice(-a if a < 0 else None, (s[ax] + b) if b < 0 else None)
                 for ax, (a, b) in enumerate(width))
    x = getitem(input, crop) if any(a < 0 or b < 0 for a, b in width) else input
    width = tuple((max(a, 0), max(b, 0)) for a, b in width)
    if not any(a or b for a, b in width):
        return x
    return _np_pad(x, width, mode="constant", constant_values=0 if value is None else value)


# --- more activations ----------------------------------------------------------------------

_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


def hardtanh(input, min_val=-1.0, max_val=1.0, inplace=False):
    """x clipped to [min_val, max_val]; the gradient is 0 at and beyond the
    bounds (as torch's hardtanh_backward)."""
    _no_inplace("hardtanh", inplace)
    if min_val > max_val:
        raise ArgumentError("min_val cannot be greater than max_val")
    return where(less(input, max_val) if min_val == -math.inf else
                 logical_and(greater(input, min_val), less(input, max_val)), input,
                 where(greater(input, min_val), float(max_val), float(min_val)))


def relu6(input, inplace=False):
    """min(max(x, 0), 6)."""
    _no_inplace("relu6", inplace)
    return hardtanh(input, 0.0, 6.0)


def selu(input, inplace=False):
    """scale * (x for x > 0, alpha (exp(x) - 1) otherwise), torch's constants."""
    _no_inplace("selu", inplace)
    return mul(elu(input, _SELU_ALPHA), _SELU_SCALE)


def celu(input, alpha=1.0, inplace=False):
    """x for x > 0, alpha (exp(x / alpha) - 1) otherwise."""
    _no_inplace("celu", inplace)
    if alpha == 0:
        raise ArgumentError("ZeroDivisionError: alpha cannot be 0 for CELU")
    neg_part = mul(expm1(div(clip(input, max=0.0), alpha)), alpha)
    return where(greater(input, 0), input, neg_part)


def mish(input, inplace=False):
    """x * tanh(softplus(x))."""
    _no_inplace("mish", inplace)
    return mul(input, _tanh(softplus(input)))


def hardsigmoid(input, inplace=False):
    """relu6(x + 3) / 6 (gradient 1/6 strictly inside (-3, 3))."""
    _no_inplace("hardsigmoid", inplace)
    return div(hardtanh(add(input, 3.0), 0.0, 6.0), 6.0)


def hardswish(input, inplace=False):
    """x * relu6(x + 3) / 6."""
    _no_inplace("hardswish", inplace)
    return where(less(input, -3.0), mul(input, 0.0),
                 where(greater(input, 3.0), input, div(mul(input, add(input, 3.0)), 6.0)))


def softsign(input):
    """x / (1 + |x|)."""
    return div(input, add(_abs(input), 1.0))


def tanhshrink(input):
    """x - tanh(x)."""
    return sub(input, _tanh(input))


def hardshrink(input, lambd=0.5):
    """x where |x| > lambd, else 0."""
    return where(greater(_abs(input), lambd), input, mul(input, 0.0))


def softshrink(input, lambd=0.5):
    """x - lambd above lambd, x + lambd below -lambd, else 0."""
    if lambd < 0:
        raise ArgumentError(f"lambda must be greater or equal to 0, but found to be {lambd}.")
    return where(greater(input, lambd), sub(input, lambd),
                 where(less(input, -lambd), add(input, lambd), mul(input, 0.0)))


def threshold(input, threshold, value, inplace=False):
    """x where x > threshold, else value."""
    _no_inplace("threshold", inplace)
    return where(greater(input, threshold), input, astype(_value(value), _dtype(input)))


def glu(input, dim=-1):
    """a * sigmoid(b) for the halves a, b of input along dim."""
    s = _shape(input)
    if len(s) == 0:
        raise ArgumentError("glu does not support scalars because halving size must be even")
    d = dim % len(s)
    if s[d] % 2:
        raise ArgumentError(f"Halving dimension must be even, but dimension {d} is size {s[d]}")
    h = s[d] // 2
    a = getitem(input, (slice(None),) * d + (slice(0, h),))
    b = getitem(input, (slice(None),) * d + (slice(h, None),))
    return mul(a, _sigmoid(b))


def prelu(input, weight):
    """x for x > 0, weight * x otherwise; weight is one number or one per
    channel (dim 1)."""
    s = _shape(input)
    weight = _lifted(weight)
    ws = _shape(weight)
    if len(ws) != 1:
        raise ArgumentError("prelu: weight must be 1-d")
    if ws[0] != 1:
        ch = s[1] if len(s) >= 2 else (s[0] if s else 1)
        if ws[0] != ch:
            raise ArgumentError(f"Mismatch of parameter numbers and input channel size. Found "
                                f"parameter numbers = {ws[0]} and channel size = {ch}.")
        if len(s) >= 2:
            weight = reshape(weight, (ws[0],) + (1,) * (len(s) - 2))
    else:
        weight = reshape(weight, ())
    return where(greater(input, 0), input, mul(weight, input))


def softmin(input, dim=None, _stacklevel=3, dtype=None):
    """softmax(-x) along dim."""
    return _nn.softmax(neg(input), _softmax_dim("softmin", len(_shape(input)), dim), dtype)


# --- more losses ---------------------------------------------------------------------------

def kl_div(input, target, size_average=None, reduce=None, reduction="mean", log_target=False):
    """target * (log target - input) (0 where target == 0), or
    exp(target) * (target - input) with log_target=True; 'batchmean'
    divides the sum by the batch size."""
    if size_average is not None or reduce is not None:
        reduction = _legacy_reduction(size_average, reduce, reduction)
    if reduction == "mean":
        warnings.warn("reduction: 'mean' divides the total loss by both the batch size and the "
                      "support size.'batchmean' divides only by the batch size, and aligns with "
                      "the KL div math definition.'mean' will be changed to behave the same as "
                      "'batchmean' in the next major release.", UserWarning, stacklevel=2)
    if reduction not in ("none", "mean", "sum", "batchmean"):
        raise ArgumentError(f"{reduction} is not a valid value for reduction")
    target = _value(target, input)
    if log_target:
        from tracegrad.ops.base import exp as _exp
        loss = mul(_exp(target), sub(target, input))
    else:
        pos = greater(target, 0)
        safe = where(pos, target, 1.0)
        loss = where(pos, mul(target, sub(log(safe), input)), mul(target, 0.0))
    if reduction == "batchmean":
        s = _shape(input)
        return div(_sum(loss), float(s[0]) if s else 1.0)
    return _reduce(loss, reduction)


# --- shapes, dropout variants, bilinear ----------------------------------------------------

def _flatten(input, start_dim=0, end_dim=-1):
    """torch.flatten: dims start_dim..end_dim merged into one."""
    s = _shape(input)
    if not s:
        return reshape(input, (1,))
    a, b = start_dim % len(s), end_dim % len(s)
    if a > b:
        raise ArgumentError("flatten() has invalid args: start_dim cannot come after end_dim")
    return reshape(input, s[:a] + (int(np.prod(s[a:b + 1], dtype=np.int64)),) + s[b + 1:])


def _traced_uniform(shape):
    """Inside a compiled function: uniform [0, 1) samples drawn on every call
    from tracegrad's generator (seeded by tg.manual_seed, as torch.compile's
    dropout draws from torch's), or, in a transform that lifts no captured
    state, from NumPy's global state (np.random.seed reproduces it)."""
    u = traced_draw(None, "random", tuple(shape))
    return u if u is not None else np.random.random(shape)   # recorded as a fresh draw


def _keep_mask(shape, p, input):
    """1.0 where an element is kept (probability 1 - p), else 0.0, in the
    input's dtype: from tracegrad's generator (as dropout)."""
    dt = _dtype(input)
    if is_tracing():
        u = _traced_uniform(shape)
        return astype(less(u, 1.0 - p), dt)
    mask = (_RNG.gen.random(shape) < 1.0 - p).astype(dt)
    if isinstance(input, Tensor) and not isinstance(input._data, np.ndarray):
        mask = primitives.array_module(input._data).asarray(mask)
    return mask


def _feature_dropout(input, p, training, inplace, name, nd):
    _no_inplace(name, inplace)
    if not 0.0 <= p <= 1.0:
        raise ArgumentError(f"dropout probability has to be between 0 and 1, but got {p}")
    s = _shape(input)
    if len(s) not in (nd + 1, nd + 2):
        raise ArgumentError(f"{name}: Expected {nd + 1}D or {nd + 2}D input, but received a "
                            f"{len(s)}D input")
    if not training or p == 0:
        return input
    if p == 1:
        return mul(input, 0.0)
    mshape = s[:len(s) - nd] + (1,) * nd
    return mul(input, mul(_keep_mask(mshape, p, input), 1.0 / (1.0 - p)))


def dropout1d(input, p=0.5, training=True, inplace=False):
    """Zero whole channels of (N, C, L) / (C, L) with probability p."""
    return _feature_dropout(input, p, training, inplace, "dropout1d", 1)


def dropout2d(input, p=0.5, training=True, inplace=False):
    """Zero whole channels of (N, C, H, W) / (C, H, W) with probability p."""
    return _feature_dropout(input, p, training, inplace, "dropout2d", 2)


def alpha_dropout(input, p=0.5, training=False, inplace=False):
    """Dropout for SELU networks: dropped elements take SELU's negative
    saturation, then an affine map keeps mean and variance (torch's a, b)."""
    _no_inplace("alpha_dropout", inplace)
    if not 0.0 <= p <= 1.0:
        raise ArgumentError(f"dropout probability has to be between 0 and 1, but got {p}")
    if not training or p == 0:
        return input
    if p == 1:
        return mul(input, 0.0)
    alpha = 1.7580993408473766
    a = 1.0 / math.sqrt((alpha * alpha * p + 1) * (1 - p))
    noise = _keep_mask(_shape(input), p, input)
    b = add(mul(sub(noise, 1.0), alpha * a), alpha * a * p)
    return add(mul(input, mul(noise, a)), b)


def bilinear(input1, input2, weight, bias=None):
    """y[..., o] = sum_ij x1[..., i] A[o, i, j] x2[..., j] + b[o]."""
    from tracegrad.ops.linalg import einsum
    weight, bias = _lifted(weight), _lifted(bias)
    if _shape(input1)[:-1] != _shape(input2)[:-1]:
        raise ArgumentError("bilinear(): input batch dimensions do not match")
    ws = _shape(weight)
    if len(ws) != 3 or ws[1] != _shape(input1)[-1] or ws[2] != _shape(input2)[-1]:
        raise ArgumentError(f"bilinear(): weight of shape {ws} does not match the inputs' last "
                            f"dims {_shape(input1)[-1]} and {_shape(input2)[-1]}")
    s = _shape(input1)
    x1 = reshape(input1, (-1, s[-1]))
    x2 = reshape(input2, (-1, _shape(input2)[-1]))
    out = einsum("ni,oij,nj->no", x1, weight, x2)
    out = reshape(out, s[:-1] + (ws[0],))
    return out if bias is None else add(out, _value(bias, input1))


# --- convolution and pooling ---------------------------------------------------------------
# Written as compositions: a window of the (padded) input is a strided slice,
# one per kernel offset; stacked, they are the patches (im2col) that a matmul
# with the weight turns into the output.  The slices' and the matmul's rules
# give every derivative.

def _tuple(v, n, name):
    if isinstance(v, (tuple, list)):
        if len(v) == 1:
            return tuple(int(v[0]) for _ in range(n))
        if len(v) != n:
            raise ArgumentError(f"{name} must be an int or a tuple of {n} ints, got {v}")
        return tuple(int(a) for a in v)
    return (int(v),) * n


def _batched(input, nd, name):
    """(input with a batch dim, whether one was added)."""
    s = _shape(input)
    if len(s) == nd + 1:
        return expand_dims(input, 0), True
    if len(s) != nd + 2:
        raise ArgumentError(f"{name}: Expected {nd + 1}D (unbatched) or {nd + 2}D (batched) "
                            f"input, but got input of size: {list(s)}")
    return input, False


def _out_len(L, k, s, d, lo, hi):
    return (L + lo + hi - d * (k - 1) - 1) // s + 1


def _patch_index(ks, stride, dilation, outs):
    """The index that takes (N, C, *spatial), already padded, to
    (N, C, K, *outs), K = prod(ks): the window of each kernel offset."""
    nd = len(ks)
    K = int(np.prod(ks, dtype=np.int64))
    offsets = [g.reshape(K) for g in np.meshgrid(*(np.arange(k) for k in ks), indexing="ij")]
    idx = []
    for i in range(nd):
        along = [1] * nd
        along[i] = outs[i]
        pos = offsets[i].reshape((K,) + (1,) * nd) * dilation[i] + \
            (np.arange(outs[i]) * stride[i]).reshape([1] + along)
        idx.append(np.ascontiguousarray(np.broadcast_to(pos, (K,) + tuple(outs))))
    return (slice(None), slice(None)) + tuple(idx)


def _patches(x, ks, stride, dilation, outs):
    """(N, C, *spatial) already padded -> (N, C, K, *outs): gathered by one
    integer-array index (one op and one scatter-add backward, however large
    the kernel)."""
    return getitem(x, _patch_index(ks, stride, dilation, outs))


def _pad_spatial(x, widths, value=0.0):
    """Pad the spatial dims (2, 3, ...) of x by (lo, hi) pairs (negative crops)."""
    flat = []
    for lo, hi in reversed(widths):
        flat += [lo, hi]
    if not any(flat):
        return x
    return pad(x, flat, mode="constant", value=value)


def _conv_padding(padding, nd, ks, dilation, stride, name):
    """(lo, hi) per spatial dim from an int, a tuple, 'valid' or 'same'."""
    if isinstance(padding, str):
        if padding == "valid":
            return [(0, 0)] * nd
        if padding == "same":
            if any(s != 1 for s in stride):
                raise ArgumentError(f"{name}: padding='same' is not supported for strided "
                                    f"convolutions")
            out = []
            for k, d in zip(ks, dilation):
                total = d * (k - 1)
                out.append((total // 2, total - total // 2))
            return out
        raise ArgumentError(f"Invalid padding string {padding!r}, should be one of "
                            f"{{'valid', 'same'}}")
    return [(p, p) for p in _tuple(padding, nd, "padding")]


def _convnd(input, weight, bias, stride, padding, dilation, groups, nd, name):
    x, unbatched = _batched(input, nd, name)
    weight, bias = _lifted(weight), _lifted(bias)
    ws = _shape(weight)
    if len(ws) != nd + 2:
        raise ArgumentError(f"{name}: Expected {nd + 2}-dimensional weight, got weight of size "
                            f"{list(ws)}")
    ks = ws[2:]
    stride = _tuple(stride, nd, "stride")
    dilation = _tuple(dilation, nd, "dilation")
    widths = _conv_padding(padding, nd, ks, dilation, stride, name)
    N, C = _shape(x)[:2]
    O = ws[0]
    if groups < 1 or C % groups or O % groups:
        raise ArgumentError(f"{name}: in_channels ({C}) and out_channels ({O}) must both be "
                            f"divisible by groups ({groups})")
    if ws[1] * groups != C:
        raise ArgumentError(f"Given groups={groups}, weight of size {list(ws)}, expected "
                            f"input{list(_shape(input))} to have {ws[1] * groups} channels, but "
                            f"got {C} channels instead")
    x = _pad_spatial(x, widths)
    sp = _shape(x)[2:]
    outs = tuple(_out_len(sp[i], ks[i], stride[i], dilation[i], 0, 0) for i in range(nd))
    if any(o <= 0 for o in outs):
        raise ArgumentError(f"{name}: the kernel (dilated: "
                            f"{[d * (k - 1) + 1 for k, d in zip(ks, dilation)]}) is larger "
                            f"than the padded input {list(sp)}")
    K = int(np.prod(ks, dtype=np.int64))
    L = int(np.prod(outs, dtype=np.int64))
    G = groups
    cols = reshape(_patches(x, ks, stride, dilation, outs), (N, G, (C // G) * K, L))
    w = reshape(weight, (G, O // G, (C // G) * K))
    out = reshape(matmul(w, cols), (N, O) + outs)
    if bias is not None:
        out = add(out, reshape(_value(bias, input), (O,) + (1,) * nd))
    return reshape(out, (O,) + outs) if unbatched else out


def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """1-d cross-correlation: input (N, C_in, L), weight (C_out, C_in/groups, k)."""
    return _convnd(input, weight, bias, stride, padding, dilation, groups, 1, "conv1d")


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """2-d cross-correlation: input (N, C_in, H, W), weight (C_out, C_in/groups, kH, kW)."""
    return _convnd(input, weight, bias, stride, padding, dilation, groups, 2, "conv2d")


def conv3d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """3-d cross-correlation: input (N, C_in, D, H, W)."""
    return _convnd(input, weight, bias, stride, padding, dilation, groups, 3, "conv3d")


def _dilate(x, axis, s):
    """Insert s - 1 zeros between neighbouring elements along ``axis``."""
    from tracegrad.ops.shape import concatenate
    if s == 1:
        return x
    sh = _shape(x)
    e = expand_dims(x, axis + 1)
    zshape = sh[:axis + 1] + (s - 1,) + sh[axis + 1:]
    z = np.zeros(zshape, dtype=_dtype(x))
    if isinstance(x, Tensor) and not isinstance(x._data, np.ndarray):
        z = primitives.array_module(x._data).asarray(z)
    joined = concatenate([e, z], axis=axis + 1)
    merged = reshape(joined, sh[:axis] + (sh[axis] * s,) + sh[axis + 1:])
    return getitem(merged, (slice(None),) * axis + (slice(0, sh[axis] * s - (s - 1)),))


def _conv_transposend(input, weight, bias, stride, padding, output_padding, groups, dilation,
                      nd, name):
    from tracegrad.ops.shape import flip
    x, unbatched = _batched(input, nd, name)
    weight, bias = _lifted(weight), _lifted(bias)
    ws = _shape(weight)
    if len(ws) != nd + 2:
        raise ArgumentError(f"{name}: Expected {nd + 2}-dimensional weight, got {list(ws)}")
    ks = ws[2:]
    stride = _tuple(stride, nd, "stride")
    padding = _tuple(padding, nd, "padding")
    output_padding = _tuple(output_padding, nd, "output_padding")
    dilation = _tuple(dilation, nd, "dilation")
    for op, s, d in zip(output_padding, stride, dilation):
        if op >= s and op >= d:
            raise ArgumentError(f"{name}: output padding must be smaller than either stride or "
                                f"dilation, got output_padding={output_padding}")
    C = _shape(x)[1]
    G = groups
    if ws[0] != C or C % G:
        raise ArgumentError(f"Given transposed=1, weight of size {list(ws)}, expected input"
                            f"{list(_shape(input))} to have {ws[0]} channels, but got {C} "
                            f"channels instead")
    Og = ws[1]
    for i in range(nd):
        x = _dilate(x, 2 + i, stride[i])
    widths = [(dilation[i] * (ks[i] - 1) - padding[i],
               dilation[i] * (ks[i] - 1) - padding[i] + output_padding[i]) for i in range(nd)]
    x = _pad_spatial(x, widths)
    # the equivalent convolution's weight: (G, C/G, O/G, k) -> (O, C/G, k), flipped
    w = reshape(weight, (G, C // G, Og) + ks)
    w = swapaxes(w, 1, 2)
    w = reshape(w, (G * Og, C // G) + ks)
    w = flip(w, axis=tuple(range(2, 2 + nd)))
    out = _convnd(x, w, bias, 1, 0, dilation, G, nd, name)
    return getitem(out, 0) if unbatched else out


def conv_transpose1d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1,
                     dilation=1):
    """The transpose (gradient) of conv1d: weight (C_in, C_out/groups, k)."""
    return _conv_transposend(input, weight, bias, stride, padding, output_padding, groups,
                             dilation, 1, "conv_transpose1d")


def conv_transpose2d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1,
                     dilation=1):
    """The transpose (gradient) of conv2d: weight (C_in, C_out/groups, kH, kW)."""
    return _conv_transposend(input, weight, bias, stride, padding, output_padding, groups,
                             dilation, 2, "conv_transpose2d")


def _pool_geometry(sp, ks, stride, padding, dilation, ceil_mode, name):
    outs, widths = [], []
    for i, L in enumerate(sp):
        k, s, p, d = ks[i], stride[i], padding[i], dilation[i]
        if p > k // 2:
            raise ArgumentError(f"{name}: pad should be at most half of effective kernel size, "
                                f"but got pad={p}, kernel_size={k}")
        num = L + 2 * p - d * (k - 1) - 1
        o = (num + (s - 1 if ceil_mode else 0)) // s + 1
        if ceil_mode and (o - 1) * s >= L + p:
            o -= 1
        if o <= 0:
            raise ArgumentError(f"{name}: Given input size {list(sp)}, the output size is too "
                                f"small")
        hi = max((o - 1) * s + d * (k - 1) + 1 - L - p, 0)
        outs.append(o)
        widths.append((p, hi))
    return tuple(outs), widths


def _pool_args(kernel_size, stride, padding, dilation, nd):
    ks = _tuple(kernel_size, nd, "kernel_size")
    stride = ks if stride is None or (isinstance(stride, (list, tuple)) and not stride) else \
        _tuple(stride, nd, "stride")
    return ks, stride, _tuple(padding, nd, "padding"), _tuple(dilation, nd, "dilation")


def _max_poolnd(input, kernel_size, stride, padding, dilation, ceil_mode, return_indices, nd,
                name):
    if return_indices:
        raise NotImplementedError(f"F.{name}(..., return_indices=True) is not supported by "
                                  f"tracegrad yet")
    x, unbatched = _batched(input, nd, name)
    ks, stride, padding, dilation = _pool_args(kernel_size, stride, padding, dilation, nd)
    outs, widths = _pool_geometry(_shape(x)[2:], ks, stride, padding, dilation, ceil_mode, name)
    x = _pad_spatial(x, widths, value=-math.inf)
    out = amax(_patches(x, ks, stride, dilation, outs), axis=2)
    return getitem(out, 0) if unbatched else out


def max_pool1d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
               return_indices=False):
    return _max_poolnd(input, kernel_size, stride, padding, dilation, ceil_mode, return_indices,
                       1, "max_pool1d")


def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
               return_indices=False):
    return _max_poolnd(input, kernel_size, stride, padding, dilation, ceil_mode, return_indices,
                       2, "max_pool2d")


def _avg_poolnd(input, kernel_size, stride, padding, ceil_mode, count_include_pad,
                divisor_override, nd, name):
    x, unbatched = _batched(input, nd, name)
    ks, stride, padding, dilation = _pool_args(kernel_size, stride, padding, 1, nd)
    sp = _shape(x)[2:]
    outs, widths = _pool_geometry(sp, ks, stride, padding, dilation, ceil_mode, name)
    xp = _pad_spatial(x, widths)
    total = _sum(_patches(xp, ks, stride, dilation, outs), axis=2)
    if divisor_override:
        out = div(total, float(divisor_override))
    else:
        # the divisor of each window: the positions it covers inside the input
        # (count_include_pad=False) or inside the input and its padding
        full = tuple(lo + L + hi for (lo, hi), L in zip(widths, sp))
        region = np.zeros(full)
        inner = tuple(slice(lo - (padding[i] if count_include_pad else 0),
                            lo + sp[i] + (padding[i] if count_include_pad else 0))
                      for i, (lo, _) in enumerate(widths))
        region[inner] = 1.0
        cnt = region
        import itertools
        counts = np.zeros(outs)
        for off in itertools.product(*(range(k) for k in ks)):
            idx = tuple(slice(off[i], off[i] + stride[i] * (outs[i] - 1) + 1, stride[i])
                        for i in range(nd))
            counts += cnt[idx]
        counts = counts.astype(_dtype(x))
        if isinstance(x, Tensor) and not isinstance(x._data, np.ndarray):
            counts = primitives.array_module(x._data).asarray(counts)
        out = div(total, counts)
    return getitem(out, 0) if unbatched else out


def avg_pool1d(input, kernel_size, stride=None, padding=0, ceil_mode=False,
               count_include_pad=True):
    return _avg_poolnd(input, kernel_size, stride, padding, ceil_mode, count_include_pad, None,
                       1, "avg_pool1d")


def avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode=False,
               count_include_pad=True, divisor_override=None):
    return _avg_poolnd(input, kernel_size, stride, padding, ceil_mode, count_include_pad,
                       divisor_override, 2, "avg_pool2d")


def _adaptive_matrix(L, O):
    """(O, L) averaging matrix: row i averages [floor(iL/O), ceil((i+1)L/O))."""
    m = np.zeros((O, L))
    for i in range(O):
        a = (i * L) // O
        b = -((-(i + 1) * L) // O)
        m[i, a:b] = 1.0 / (b - a)
    return m


def _adaptive_avg_poolnd(input, output_size, nd, name):
    x, unbatched = _batched(input, nd, name)
    sp = _shape(x)[2:]
    if not isinstance(output_size, (tuple, list)):
        output_size = (output_size,) * nd
    outs = tuple(sp[i] if o is None else int(o) for i, o in enumerate(output_size))
    dt = _dtype(x)
    for i in range(nd):
        m = _adaptive_matrix(sp[i], outs[i]).astype(dt)
        if isinstance(x, Tensor) and not isinstance(x._data, np.ndarray):
            m = primitives.array_module(x._data).asarray(m)
        ax = 2 + i
        x = swapaxes(matmul(m, swapaxes(x, ax, -2)), ax, -2)
    return getitem(x, 0) if unbatched else x


def adaptive_avg_pool1d(input, output_size):
    return _adaptive_avg_poolnd(input, output_size, 1, "adaptive_avg_pool1d")


def adaptive_avg_pool2d(input, output_size):
    return _adaptive_avg_poolnd(input, output_size, 2, "adaptive_avg_pool2d")


def _block_args(kernel_size, dilation, padding, stride):
    """unfold's and fold's block arguments, each as a pair (H, W)."""
    return tuple(_tuple(v, 2, name) for v, name in ((kernel_size, "kernel_size"),
                                                    (dilation, "dilation"),
                                                    (padding, "padding"), (stride, "stride")))


def unfold(input, kernel_size, dilation=1, padding=0, stride=1):
    """im2col: (N, C, H, W) -> (N, C * kH * kW, L), one column per position of
    the (dilated) kernel over the zero-padded input, as the convolutions use."""
    s = _shape(input)
    if len(s) not in (3, 4):
        raise ArgumentError(f"Input Error: Only 3D or 4D input Tensors are supported (got "
                            f"{len(s)}D)")
    x = expand_dims(input, 0) if len(s) == 3 else input
    ks, dilation, padding, stride = _block_args(kernel_size, dilation, padding, stride)
    x = _pad_spatial(x, [(p, p) for p in padding])
    sp = _shape(x)[2:]
    outs = tuple(_out_len(sp[i], ks[i], stride[i], dilation[i], 0, 0) for i in range(2))
    if any(o <= 0 for o in outs):
        raise ArgumentError(f"unfold: the kernel (dilated: "
                            f"{[d * (k - 1) + 1 for k, d in zip(ks, dilation)]}) is larger than "
                            f"the padded input {list(sp)}")
    N, C = _shape(x)[:2]
    cols = reshape(_patches(x, ks, stride, dilation, outs),
                   (N, C * ks[0] * ks[1], outs[0] * outs[1]))
    return getitem(cols, 0) if len(s) == 3 else cols


def fold(input, output_size, kernel_size, dilation=1, padding=0, stride=1):
    """col2im, the transpose of ``unfold``: (N, C * kH * kW, L) columns of
    sliding blocks -> (N, C, *output_size), the blocks' overlapping values
    added (one scatter-add, the adjoint of unfold's gather)."""
    s = _shape(input)
    if len(s) not in (2, 3):
        raise ArgumentError(f"Input Error: Only unbatched (2D) or batched (3D) input Tensors are "
                            f"supported (got {len(s)}D)")
    cols = expand_dims(input, 0) if len(s) == 2 else input
    size = _tuple(output_size, 2, "output_size")
    ks, dilation, pads, stride = _block_args(kernel_size, dilation, padding, stride)
    outs = tuple(_out_len(size[i], ks[i], stride[i], dilation[i], pads[i], pads[i])
                 for i in range(2))
    N, CK, L = _shape(cols)
    K = ks[0] * ks[1]
    if CK % K:
        raise ArgumentError(f"Expected size of input's dimension 1 to be divisible by the "
                            f"product of kernel_size, but got input.size(1)={CK} and "
                            f"kernel_size={ks}")
    if any(o <= 0 for o in outs) or L != outs[0] * outs[1]:
        raise ArgumentError(f"Given output_size={size}, kernel_size={ks}, dilation={dilation}, "
                            f"padding={pads}, stride={stride}, expected size of input's "
                            f"dimension 2 to match the calculated number of sliding blocks "
                            f"{outs[0]} * {outs[1]} = {outs[0] * outs[1]}, but got "
                            f"input.size(2)={L}.")
    padded = (N, CK // K) + tuple(size[i] + 2 * pads[i] for i in range(2))
    blocks = reshape(cols, (N, CK // K, K) + outs)
    out = _index_add(blocks, _patch_index(ks, stride, dilation, outs), padded)
    out = getitem(out, (slice(None), slice(None)) + tuple(
        slice(pads[i], pads[i] + size[i]) for i in range(2)))
    return getitem(out, 0) if len(s) == 2 else out


_INTERPOLATE_DIMS = {"linear": 1, "bilinear": 2, "bicubic": 2, "trilinear": 3}


def _cubic_along(x, src, n_in, ax, dt, trailing, A=-0.75):
    """Bicubic interpolation along axis ``ax`` at source coordinates ``src``:
    the four neighbours floor(src) - 1 .. floor(src) + 2 (clamped to the
    input), weighted by Keys' cubic convolution with torch's A = -0.75."""
    base = np.floor(src)
    t = src - base

    def near(d):      # |d| <= 1
        return ((A + 2) * d - (A + 3)) * d * d + 1

    def far(d):       # 1 < |d| < 2
        return ((A * d - 5 * A) * d + 8 * A) * d - 4 * A

    weights = (far(t + 1), near(t), near(1 - t), far(2 - t))
    out = None
    for k, w in enumerate(weights):
        idx = np.clip(base.astype(np.int64) - 1 + k, 0, n_in - 1)
        term = mul(getitem(x, (slice(None),) * ax + (idx,)),
                   _value(w.astype(dt).reshape((len(src),) + (1,) * trailing), x))
        out = term if out is None else add(out, term)
    return out


def interpolate(input, size=None, scale_factor=None, mode="nearest", align_corners=None,
                recompute_scale_factor=None, antialias=False):
    """Resize the spatial dims (2, 3, ...) of ``input`` to ``size`` or by
    ``scale_factor``: ``nearest`` / ``nearest-exact`` pick a source element,
    ``linear`` / ``bilinear`` / ``trilinear`` mix the two neighbours along
    each dim (torch's source coordinates, ``align_corners`` included),
    ``bicubic`` the four nearest with torch's cubic convolution weights
    (A = -0.75, indices clamped at the borders), ``area`` is adaptive
    average pooling.  Gathers and a weighted sum per dim, so gradients come
    from those rows."""
    s = _shape(input)
    nd = len(s) - 2
    if nd < 1:
        raise ArgumentError(f"interpolate: expected a batched input with spatial dims (N, C, "
                            f"...), got input of size {list(s)}")
    if antialias:
        raise NotImplementedError(f"F.interpolate(mode={mode!r}, antialias=True) is not "
                                  f"supported by tracegrad; leave antialias out")
    want = _INTERPOLATE_DIMS.get(mode)
    if want is not None and want != nd:
        raise NotImplementedError(f"Got {len(s)}D input, but {mode} mode needs {want + 2}D "
                                  f"input")
    if mode not in ("nearest", "nearest-exact", "area") and want is None:
        raise ArgumentError(f"interpolate: unknown mode {mode!r}; expected 'nearest', "
                            f"'nearest-exact', 'linear', 'bilinear', 'bicubic', 'trilinear' or "
                            f"'area'")
    if align_corners is not None and want is None:
        raise ArgumentError("align_corners option can only be set with the interpolating modes: "
                            "linear | bilinear | bicubic | trilinear")
    if (size is None) == (scale_factor is None):
        raise ArgumentError("only one of size or scale_factor should be defined")
    sp = s[2:]
    if size is not None:
        outs = _tuple(size, nd, "size")
        scales = [None] * nd
    else:
        sf = tuple(scale_factor) if isinstance(scale_factor, (tuple, list)) else \
            (scale_factor,) * nd
        if len(sf) != nd:
            raise ArgumentError(f"scale_factor shape must match input shape. Input is {nd}D, "
                                f"scale_factor size is {len(sf)}")
        outs = tuple(int(math.floor(float(sp[i]) * float(sf[i]))) for i in range(nd))
        scales = [None if recompute_scale_factor else float(f) for f in sf]
    if mode == "area":
        return _adaptive_avg_poolnd(input, outs, nd, "interpolate")
    x = input
    dt = _dtype(x) if _dtype(x).kind == "f" else np.dtype(np.float32)
    for i in range(nd):
        n_in, n_out, ax = sp[i], outs[i], 2 + i
        # torch's scale: in/out, or 1/scale_factor when that was given
        scale = n_in / n_out if scales[i] is None else 1.0 / scales[i]
        dst = np.arange(n_out, dtype=np.float64)
        if want is None:       # nearest, nearest-exact
            src = np.floor((dst + 0.5) * scale) if mode == "nearest-exact" else \
                np.floor(dst * np.float32(scale))
            idx = np.minimum(src.astype(np.int64), n_in - 1)
            x = getitem(x, (slice(None),) * ax + (idx,))
            continue
        if align_corners:
            src = dst * ((n_in - 1) / (n_out - 1)) if n_out > 1 else np.zeros(n_out)
        elif mode == "bicubic":
            src = (dst + 0.5) * scale - 0.5      # (torch does not clamp it at 0 for cubic)
        else:
            src = np.maximum((dst + 0.5) * scale - 0.5, 0.0)
        if mode == "bicubic":
            x = _cubic_along(x, src, n_in, ax, dt, nd - 1 - i)
            continue
        i0 = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
        i1 = np.minimum(i0 + 1, n_in - 1)
        lam = (src - i0).astype(dt).reshape((n_out,) + (1,) * (nd - 1 - i))
        a = getitem(x, (slice(None),) * ax + (i0,))
        b = getitem(x, (slice(None),) * ax + (i1,))
        x = add(mul(a, _value(1 - lam, x)), mul(b, _value(lam, x)))
    return x


# --- normalisation -------------------------------------------------------------------------

def batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False,
               momentum=0.1, eps=1e-5):
    """Normalise over every dim but the channel dim (1): with the batch's
    statistics when training (updating running_mean / running_var in place,
    the variance unbiased there, as torch), with the running ones otherwise."""
    s = _shape(input)
    if len(s) < 2:
        raise ArgumentError(f"batch_norm: expected at least 2D input (got {len(s)}D input)")
    weight, bias = _lifted(weight), _lifted(bias)
    C = s[1]
    axes = (0,) + tuple(range(2, len(s)))
    bshape = (1, C) + (1,) * (len(s) - 2)
    if training:
        n = int(np.prod([s[a] for a in axes], dtype=np.int64))
        if n <= 1:
            raise ArgumentError(f"Expected more than 1 value per channel when training, got "
                                f"input size {_size(s)}")
        mean = _mean(input, axis=axes, keepdims=True)
        centred = sub(input, mean)
        var = _mean(square(centred), axis=axes, keepdims=True)
        if running_mean is not None or running_var is not None:
            m = 0.0 if momentum is None else momentum
            _update_running(running_mean, reshape(mean, (C,)), m)
            _update_running(running_var, mul(reshape(var, (C,)), n / (n - 1)), m)
        out = div(centred, sqrt(add(var, eps)))
    else:
        if running_mean is None or running_var is None:
            raise ArgumentError("batch_norm in eval mode needs running_mean and running_var")
        mean, var = (_current(running_mean), _current(running_var))
        out = div(sub(input, reshape(_value(mean, input), bshape)),
                  sqrt(add(reshape(_value(var, input), bshape), eps)))
    if weight is not None:
        out = mul(out, reshape(_value(weight, input), bshape))
    if bias is not None:
        out = add(out, reshape(_value(bias, input), bshape))
    return out


def _update_running(buf, stat, momentum):
    """buf = (1 - momentum) buf + momentum stat, in place, off the tape; inside
    a compiled module's call (``tg.compile(module)``) the new value is an
    output of the compiled call, written into ``buf`` after it."""
    if buf is None:
        return
    if not isinstance(buf, Tensor) and not is_tracing():
        raise ArgumentError("batch_norm: running statistics must be Tensors (updated in place)")
    if is_tracing():
        keep = 1.0 - momentum if isinstance(momentum, (int, float)) else sub(1.0, momentum)
        new = add(mul(_running_value(buf, "batch_norm"), keep), mul(stat, momentum))
        _RUNNING.writes[-1][id(buf)] = (buf, astype(stop_gradient(new), buf.dtype))
        return
    val = stat._data if isinstance(stat, Tensor) else np.asarray(stat)
    buf._data[...] = (1.0 - momentum) * buf._data + momentum * val.astype(buf.dtype)
    buf._vbox[0] += 1


def _count_batch(counter):
    """``num_batches_tracked += 1``: in place (the new count as a Python int),
    or inside a compiled module's call an output written back after it (the
    new count traced)."""
    if is_tracing():
        new = add(_running_value(counter, "BatchNorm's num_batches_tracked"), 1)
        _RUNNING.writes[-1][id(counter)] = (counter, astype(new, counter.dtype))
        return new
    counter._data[...] += 1
    counter._vbox[0] += 1
    return int(counter._data)


class _RunningWrites(threading.local):
    def __init__(self):
        # one dict per compiled module call being traced: id -> (buffer, new value)
        self.writes = []


_RUNNING = _RunningWrites()


@contextlib.contextmanager
def _buffer_writes():
    """While a compiled module's call is traced: collect the new values of
    the buffers its layers update in place (batch_norm's running statistics,
    num_batches_tracked), as ``{id: (buffer, traced new value)}``, for the
    compiled call to return and its wrapper to write (as torch.compile)."""
    _RUNNING.writes.append({})
    try:
        yield _RUNNING.writes[-1]
    finally:
        _RUNNING.writes.pop()


def _running_value(buf, what):
    """A buffer read inside a compiled call: its value as updated earlier in
    this call, else the implicit input that reads it at call time.  Outside a
    compiled module's call an update cannot be written back: refused."""
    if not isinstance(buf, Tensor):   # an argument of the function traced (functional_call)
        raise NotImplementedError(
            f"{what} in training mode updates running statistics in place, and here they are "
            f"arguments of a function being transformed, which compiled code does not write "
            f"into: call torch.func.replace_all_batch_norm_modules_(model) to normalise with "
            f"the batch's statistics only, use eval mode (model.eval()), or compile the module "
            f"itself (tg.compile(model), whose call writes its buffers, as torch.compile)")
    if not _RUNNING.writes:
        raise NotImplementedError(
            f"{what} in training mode inside a compiled function updates running statistics "
            f"in place, which a compiled function can only do as a compiled module: compile "
            f"the module itself (tg.compile(model), as torch.compile(model); its call writes "
            f"the new statistics into the buffers), call the model in eval mode "
            f"(model.eval()), or pass running_mean=None, running_var=None")
    hit = _RUNNING.writes[-1].get(id(buf))
    return hit[1] if hit is not None else _lifted(buf)


def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    """Normalise over the last len(normalized_shape) dims (biased variance)."""
    if isinstance(normalized_shape, int):
        normalized_shape = (normalized_shape,)
    normalized_shape = tuple(normalized_shape)
    weight, bias = _lifted(weight), _lifted(bias)
    s = _shape(input)
    k = len(normalized_shape)
    if s[len(s) - k:] != normalized_shape:
        raise ArgumentError(f"Given normalized_shape={list(normalized_shape)}, expected input "
                            f"with shape [*, {', '.join(map(str, normalized_shape))}], but got "
                            f"input of size{list(s)}")
    axes = tuple(range(len(s) - k, len(s)))
    mean = _mean(input, axis=axes, keepdims=True)
    centred = sub(input, mean)
    var = _mean(square(centred), axis=axes, keepdims=True)
    out = div(centred, sqrt(add(var, eps)))
    if weight is not None:
        out = mul(out, _value(weight, input))
    if bias is not None:
        out = add(out, _value(bias, input))
    return out


def group_norm(input, num_groups, weight=None, bias=None, eps=1e-5):
    """Normalise each group of C / num_groups channels over it and the
    spatial dims, then a per-channel affine map."""
    s = _shape(input)
    if len(s) < 2:
        raise ArgumentError(f"Expected at least 2 dimensions for input tensor but received "
                            f"{len(s)}")
    N, C = s[:2]
    if C % num_groups:
        raise ArgumentError(f"Expected number of channels in input to be divisible by "
                            f"num_groups, but got input of shape {list(s)} and num_groups="
                            f"{num_groups}")
    weight, bias = _lifted(weight), _lifted(bias)
    g = reshape(input, (N, num_groups, -1))
    mean = _mean(g, axis=2, keepdims=True)
    centred = sub(g, mean)
    var = _mean(square(centred), axis=2, keepdims=True)
    out = reshape(div(centred, sqrt(add(var, eps))), s)
    bshape = (1, C) + (1,) * (len(s) - 2)
    if weight is not None:
        out = mul(out, reshape(_value(weight, input), bshape))
    if bias is not None:
        out = add(out, reshape(_value(bias, input), bshape))
    return out


def instance_norm(input, running_mean=None, running_var=None, weight=None, bias=None,
                  use_input_stats=True, momentum=0.1, eps=1e-5):
    """Normalise each (sample, channel) over its spatial dims."""
    if not use_input_stats or running_mean is not None or running_var is not None:
        raise NotImplementedError("F.instance_norm with running statistics is not supported by "
                                  "tracegrad yet")
    s = _shape(input)
    return group_norm(input, s[1], weight, bias, eps)


# --- embedding and attention ---------------------------------------------------------------

def embedding(input, weight, padding_idx=None, max_norm=None, norm_type=2.0,
              scale_grad_by_freq=False, sparse=False):
    """Rows of weight picked by the integer indices in input; the row at
    padding_idx gets no gradient (as torch)."""
    if _dtype(input).kind not in "iu":
        raise DtypeError(f"Expected tensor for argument #1 'indices' to have one of the "
                         f"following scalar types: Long, Int; but got {_dtype(input)} instead "
                         f"(while checking arguments for embedding)")
    if max_norm is not None or scale_grad_by_freq or sparse:
        raise NotImplementedError("F.embedding(max_norm=, scale_grad_by_freq=, sparse=) is not "
                                  "supported by tracegrad yet")
    ws = _shape(weight)
    if len(ws) != 2:
        raise ArgumentError("'weight' must be 2-D")
    t = _concrete(input)
    if t is not None and t.size and (t.min() < -ws[0] or t.max() >= ws[0]):
        raise IndexError("index out of range in self")
    out = getitem(_lifted(weight), _value(input))
    if padding_idx is not None:
        if padding_idx < 0:
            padding_idx += ws[0]
        hit = expand_dims(equal(_value(input), padding_idx), -1)
        out = where(hit, stop_gradient(out), out)
    return out


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False):
    """softmax(q k^T * scale + mask) v; a boolean mask keeps True places, a
    float mask is added; is_causal masks the upper triangle."""
    qs, ks = _shape(query), _shape(key)
    L, S, E = qs[-2], ks[-2], qs[-1]
    scale = 1.0 / math.sqrt(E) if scale is None else scale
    if enable_gqa and qs[-3] != ks[-3]:
        from tracegrad.ops import repeat_interleave
        rep = qs[-3] // ks[-3]
        key = repeat_interleave(key, rep, axis=-3)
        value = repeat_interleave(value, rep, axis=-3)
    scores = mul(matmul(query, swapaxes(key, -2, -1)), scale)
    if is_causal:
        if attn_mask is not None:
            raise ArgumentError("_scaled_dot_product_attention: Explicit attn_mask should not be "
                                "set when is_causal=True")
        attn_mask = np.tril(np.ones((L, S), dtype=bool))
    if attn_mask is not None:
        if _dtype(attn_mask) == np.bool_:
            scores = where(_value(attn_mask), scores, -math.inf)
        else:
            scores = add(scores, _value(attn_mask, query))
    attn = _nn.softmax(scores, -1)
    if dropout_p > 0.0:
        attn = dropout(attn, dropout_p, True)
    return matmul(attn, value)
