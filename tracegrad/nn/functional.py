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

Differences from torch that remain are listed in docs (coming from PyTorch):
``inplace=True`` is refused, ``dropout`` inside a compiled function draws
from NumPy's global random state, and a few error types.
"""
from __future__ import annotations

import math
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
from tracegrad.ops.indexing import getitem
from tracegrad.ops.numpy_functions import pad as _np_pad
from tracegrad.ops import nn as _nn
from tracegrad.ops.random import is_tracing
from tracegrad.eager.tensor import Tensor
from tracegrad.eager.factories import _RNG

__all__ = [
    "binary_cross_entropy_with_logits", "binary_cross_entropy", "cross_entropy", "nll_loss",
    "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "softmax", "log_softmax", "relu",
    "gelu", "silu", "tanh", "sigmoid", "softplus", "leaky_relu", "elu", "logsigmoid", "linear",
    "dropout", "one_hot", "normalize", "pad", "cosine_similarity",
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

    Eagerly the mask is drawn from tracegrad's generator (the one behind
    tg.rand, seeded by tg.manual_seed); inside a compiled function it is a
    random-draw node drawn afresh on every call from NumPy's global state
    (np.random.seed reproduces it), never frozen at trace time.  p=0 or
    training=False is the identity."""
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
        u = np.random.random(shape)  # recorded as a fresh draw (tracegrad.ops.random)
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
