"""``autograd.scipy.signal``: autograd's ``convolve(A, B, axes=None,
dot_axes=[(), ()], mode='full')``.

With the default axes (every axis of A convolved with the same axis of B,
no dot axes) it is ``scipy.signal.convolve`` and is computed by
``tracegrad.scipy.signal.convolve`` (``tracegrad/ops/scipy_more.py``).  With
``axes=`` / ``dot_axes=`` (a convnet's ``convolve(x, w, axes=([2, 3], [2,
3]), dot_axes=([1], [0]), mode='valid')``) it is the same direct sum of
shifted products, each one an ``einsum`` over the dot axes: a composition of
tracegrad's rows, so its derivatives (any order, both modes) follow.  The
result's axes are autograd's: A's ignored axes, B's ignored axes, then the
convolved axes in the order of ``axes[0]``; ``'same'`` keeps A's sizes,
centred as SciPy centres them.
"""
import itertools

import numpy as np

from tracegrad.ops._define import _ops as _o
from tracegrad.ops.base import is_value
from tracegrad.scipy.signal import convolve as _scipy_convolve

__all__ = ["convolve"]

_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _shape(x):
    return tuple(_o.shape_of(x)) if is_value(x) else np.shape(x)


def _window(la, lb, mode):
    """(start, length) of the result inside the full convolution's index range."""
    if mode == "full":
        return 0, la + lb - 1
    if mode == "same":
        return (lb - 1) // 2, la
    return min(la, lb) - 1, abs(la - lb) + 1


def convolve(A, B, axes=None, dot_axes=[(), ()], mode="full"):  # noqa: B006 (autograd's signature)
    """autograd.scipy.signal.convolve: convolve A's ``axes[0]`` with B's
    ``axes[1]`` and contract A's ``dot_axes[0]`` with B's ``dot_axes[1]``."""
    if mode not in ("valid", "full", "same"):
        raise ValueError(f"Mode {mode} undefined, it can be one of 'valid', 'full', and 'same'")
    if not is_value(A):
        A = np.asarray(A)
    if not is_value(B):
        B = np.asarray(B)
    sa, sb = _shape(A), _shape(B)
    dot_a, dot_b = tuple(dot_axes[0]), tuple(dot_axes[1])
    if axes is None and not dot_a and not dot_b and len(sa) == len(sb) and sa:
        return _scipy_convolve(A, B, mode)
    if axes is None:
        axes = (tuple(range(len(sa))), tuple(range(len(sa))))
    conv_a, conv_b = tuple(axes[0]), tuple(axes[1])
    if len(conv_a) != len(conv_b) or len(dot_a) != len(dot_b):
        raise ValueError("convolve: axes and dot_axes must pair up A's axes with B's")
    for i, j in zip(dot_a, dot_b):
        if sa[i] != sb[j]:
            raise ValueError(f"convolve: dot axes of sizes {sa[i]} and {sb[j]} differ")
    la = [sa[i] for i in conv_a]
    lb = [sb[j] for j in conv_b]
    if mode == "valid" and not (all(m >= n for m, n in zip(la, lb))
                                or all(n >= m for m, n in zip(la, lb))):
        raise ValueError("One array must be larger than the other along all convolved "
                         "dimensions")
    ign_a = [i for i in range(len(sa)) if i not in conv_a and i not in dot_a]
    ign_b = [j for j in range(len(sb)) if j not in conv_b and j not in dot_b]
    if len(ign_a) + len(ign_b) + len(conv_a) + len(dot_a) > len(_LETTERS):
        raise ValueError("convolve: too many axes")
    letters = iter(_LETTERS)
    lab_a, lab_b = [None] * len(sa), [None] * len(sb)
    for i in ign_a:
        lab_a[i] = next(letters)
    for j in ign_b:
        lab_b[j] = next(letters)
    for i, j in zip(dot_a, dot_b):
        lab_a[i] = lab_b[j] = next(letters)
    conv_labels = [next(letters) for _ in conv_a]
    for i, j, c in zip(conv_a, conv_b, conv_labels):
        lab_a[i] = lab_b[j] = c
    out_labels = "".join(lab_a[i] for i in ign_a) + "".join(lab_b[j] for j in ign_b) + \
        "".join(conv_labels)
    window = [_window(m, n, mode) for m, n in zip(la, lb)]

    # the full convolution is symmetric: loop over the operand with fewer convolved elements
    if int(np.prod(lb)) <= int(np.prod(la)):
        X, sx, conv_x, lab_x, K, sk, conv_k, lab_k, lk = A, sa, conv_a, lab_a, B, sb, conv_b, \
            lab_b, lb
    else:
        X, sx, conv_x, lab_x, K, sk, conv_k, lab_k, lk = B, sb, conv_b, lab_b, A, sa, conv_a, \
            lab_a, la
    pad = [(0, 0)] * len(sx)
    for ax, n in zip(conv_x, lk):
        pad[ax] = (n - 1, n - 1)
    Xp = _o.pad(X, pad) if any(p != (0, 0) for p in pad) else X
    k_rest = "".join(lab_k[j] for j in range(len(sk)) if j not in conv_k)
    spec = "".join(lab_x) + "," + k_rest + "->" + out_labels
    out = None
    for k in itertools.product(*[range(n) for n in lk]):
        # out[n] = sum_k X[n - k] K[k], n = start + m: Xp[start - k + (len_k - 1) + m]
        sl = [slice(None)] * len(sx)
        for d, ax in enumerate(conv_x):
            s0 = window[d][0] - k[d] + lk[d] - 1
            sl[ax] = slice(s0, s0 + window[d][1])
        kk = [slice(None)] * len(sk)
        for d, ax in enumerate(conv_k):
            kk[ax] = k[d]
        term = _o.einsum(spec, Xp[tuple(sl)], K[tuple(kk)])
        out = term if out is None else _o.add(out, term)
    return out
