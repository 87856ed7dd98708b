"""``autograd.misc.flatten``: nested tuples, lists and dicts of arrays and
numbers to one 1-D array and back.  Both directions are differentiable
(``unflatten`` of a traced or taped vector slices it), as in autograd."""
from __future__ import annotations

import numpy as onp

import tracegrad.numpy as _tnp

__all__ = ["flatten", "flatten_func"]


def _ravel(v):
    return _tnp.ravel(v) if hasattr(v, "shape") else onp.ravel(onp.asarray(v))


def _walk(value, leaves):
    t = type(value)
    if t in (list, tuple):
        return (t, [_walk(v, leaves) for v in value])
    if t is dict:
        keys = sorted(value)
        return (dict, keys, [_walk(value[k], leaves) for k in keys])
    shape = tuple(onp.shape(value)) if not hasattr(value, "shape") else tuple(value.shape)
    leaves.append(value)
    return ("leaf", shape, isinstance(value, (int, float)) and not hasattr(value, "shape"))


def flatten(value):
    """``(flat, unflatten)``: every array and number in ``value`` (dict keys
    in sorted order), raveled and concatenated; ``unflatten(flat)`` rebuilds
    the structure (Python numbers come back as 0-d arrays' items)."""
    leaves = []
    tree = _walk(value, leaves)
    parts = [_ravel(v) for v in leaves]
    flat = _tnp.concatenate(parts) if parts else onp.array([])
    sizes = [int(onp.prod(_shape(tree_leaf))) for tree_leaf in _leaf_specs(tree)]

    def unflatten(vector):
        pos = [0]
        n = int(sum(sizes))
        if tuple(onp.shape(vector) if not hasattr(vector, "shape") else vector.shape) != (n,):
            raise ValueError(f"unflatten expects a vector of length {n}, got shape "
                             f"{onp.shape(vector)}")

        def build(spec):
            if spec[0] in (list, tuple):
                return spec[0](build(s) for s in spec[1])
            if spec[0] is dict:
                return {k: build(s) for k, s in zip(spec[1], spec[2])}
            _, shape, scalar = spec
            size = int(onp.prod(shape))
            piece = vector[pos[0]:pos[0] + size]
            pos[0] += size
            out = piece.reshape(shape)
            if scalar and not hasattr(out, "grad_fn") and not hasattr(out, "_trace"):
                return out[()]
            return out
        return build(tree)
    return flat, unflatten


def _leaf_specs(tree):
    if tree[0] in (list, tuple):
        return [s for t in tree[1] for s in _leaf_specs(t)]
    if tree[0] is dict:
        return [s for t in tree[2] for s in _leaf_specs(t)]
    return [tree]


def _shape(spec):
    return spec[1]


def flatten_func(func, example):
    """``(flat_func, unflatten, flat_example)``: ``flat_func(flat_x, *args)``
    is ``func(unflatten(flat_x), *args)`` flattened."""
    _ex, unflatten = flatten(example)

    def _func(_x, *args):
        return flatten(func(unflatten(_x), *args))[0]
    return _func, unflatten, _ex
