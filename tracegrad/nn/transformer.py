"""``nn.MultiheadAttention``, ``nn.TransformerEncoderLayer`` and
``nn.TransformerEncoder`` with torch's parameters (in_proj_weight,
out_proj, ...), initialisation, masks and reprs."""
from __future__ import annotations

import copy
import math

import numpy as np

from tracegrad.eager.factories import empty
from tracegrad.nn import functional as F
from tracegrad.nn import init
from tracegrad.nn.container import ModuleList
from tracegrad.nn.linear import Linear, Dropout
from tracegrad.nn.module import Module
from tracegrad.nn.normalization import LayerNorm
from tracegrad.nn.parameter import Parameter
from tracegrad.ops.base import add, matmul, reshape, swapaxes, where
from tracegrad.ops.indexing import getitem
from tracegrad.ops.reductions import mean
from tracegrad.ops.shape import expand_dims

__all__ = ["MultiheadAttention", "TransformerEncoderLayer", "TransformerEncoder"]


class NonDynamicallyQuantizableLinear(Linear):
    """The out_proj of MultiheadAttention (a Linear; torch's name)."""


def _mask_as_float(mask, dtype, name):
    """torch's masks: a boolean mask is True where attention is NOT allowed
    (-inf there), a float mask is added."""
    if mask is None:
        return None
    dt = np.dtype(mask.dtype)
    if dt == np.bool_:
        return where(mask, -math.inf, 0.0) if not isinstance(mask, np.ndarray) else \
            np.where(mask, -np.inf, 0.0).astype(dtype)
    if dt.kind != "f":
        raise TypeError(f"only bool and floating types of {name} are supported")
    return mask


class MultiheadAttention(Module):
    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False,
                 add_zero_attn=False, kdim=None, vdim=None, batch_first=False, device=None,
                 dtype=None):
        super().__init__()
        if embed_dim <= 0 or num_heads <= 0:
            raise ValueError(f"embed_dim and num_heads must be greater than 0, got "
                             f"embed_dim={embed_dim} and num_heads={num_heads} instead")
        if add_bias_kv or add_zero_attn:
            raise NotImplementedError("MultiheadAttention(add_bias_kv=, add_zero_attn=) is not "
                                      "supported by tracegrad yet")
        self.embed_dim = embed_dim
        self.kdim = kdim if kdim is not None else embed_dim
        self.vdim = vdim if vdim is not None else embed_dim
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.num_heads = num_heads
        self.dropout = dropout
        self.batch_first = batch_first
        self.head_dim = embed_dim // num_heads
        if self.head_dim * num_heads != embed_dim:
            raise AssertionError("embed_dim must be divisible by num_heads")
        kw = dict(device=device, dtype=dtype)
        if not self._qkv_same_embed_dim:
            self.q_proj_weight = Parameter(empty((embed_dim, embed_dim), **kw))
            self.k_proj_weight = Parameter(empty((embed_dim, self.kdim), **kw))
            self.v_proj_weight = Parameter(empty((embed_dim, self.vdim), **kw))
            self.register_parameter("in_proj_weight", None)
        else:
            self.in_proj_weight = Parameter(empty((3 * embed_dim, embed_dim), **kw))
            self.register_parameter("q_proj_weight", None)
            self.register_parameter("k_proj_weight", None)
            self.register_parameter("v_proj_weight", None)
        if bias:
            self.in_proj_bias = Parameter(empty(3 * embed_dim, **kw))
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = NonDynamicallyQuantizableLinear(embed_dim, embed_dim, bias=bias, **kw)
        self.bias_k = self.bias_v = None
        self.add_zero_attn = add_zero_attn
        self._reset_parameters()

    def _reset_parameters(self):
        if self._qkv_same_embed_dim:
            init.xavier_uniform_(self.in_proj_weight)
        else:
            init.xavier_uniform_(self.q_proj_weight)
            init.xavier_uniform_(self.k_proj_weight)
            init.xavier_uniform_(self.v_proj_weight)
        if self.in_proj_bias is not None:
            init.constant_(self.in_proj_bias, 0.0)
            init.constant_(self.out_proj.bias, 0.0)

    def _proj(self, x, i):
        E = self.embed_dim
        if self._qkv_same_embed_dim:
            w = getitem(F._lifted(self.in_proj_weight), slice(i * E, (i + 1) * E))
        else:
            w = (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight)[i]
        b = None if self.in_proj_bias is None else \
            getitem(F._lifted(self.in_proj_bias), slice(i * E, (i + 1) * E))
        return F.linear(x, w, b)

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True,
                attn_mask=None, average_attn_weights=True, is_causal=False):
        batched = len(query.shape) == 3
        if not batched:
            query, key, value = (expand_dims(t, 1) for t in (query, key, value))
            if key_padding_mask is not None:
                key_padding_mask = expand_dims(key_padding_mask, 0)
        elif self.batch_first:
            query, key, value = (swapaxes(t, 0, 1) for t in (query, key, value))
        L, N, E = query.shape
        S = key.shape[0]
        h, d = self.num_heads, self.head_dim
        q, k, v = self._proj(query, 0), self._proj(key, 1), self._proj(value, 2)

        def heads(t, n):   # (n, N, E) -> (N, h, n, d)
            return swapaxes(reshape(swapaxes(t, 0, 1), (N, n, h, d)), 1, 2)

        q, k, v = heads(q, L), heads(k, S), heads(v, S)
        scores = matmul(q, swapaxes(k, -2, -1))
        scores = scores * (1.0 / math.sqrt(d))
        if is_causal and attn_mask is None:
            attn_mask = np.triu(np.ones((L, S), dtype=bool), 1)
        am = _mask_as_float(attn_mask, np.dtype(q.dtype), "attn_mask")
        if am is not None:
            if len(am.shape) == 3:   # (N * h, L, S)
                am = reshape(am, (N, h, L, S))
            scores = add(scores, am)
        kpm = _mask_as_float(key_padding_mask, np.dtype(q.dtype), "key_padding_mask")
        if kpm is not None:
            scores = add(scores, reshape(kpm, (N, 1, 1, S)))
        attn = F.softmax(scores, dim=-1)
        if self.dropout > 0.0 and self.training:
            attn = F.dropout(attn, self.dropout, True)
        out = matmul(attn, v)                                   # (N, h, L, d)
        out = swapaxes(reshape(swapaxes(out, 1, 2), (N, L, E)), 0, 1)   # (L, N, E)
        out = self.out_proj(out)
        if not batched:
            out = getitem(out, (slice(None), 0))
        elif self.batch_first:
            out = swapaxes(out, 0, 1)
        if not need_weights:
            return out, None
        w = mean(attn, axis=1) if average_attn_weights else attn
        if not batched:
            w = getitem(w, 0)
        return out, w


def _activation(name):
    if callable(name):
        return name
    if name == "relu":
        return F.relu
    if name == "gelu":
        return F.gelu
    raise RuntimeError(f"activation should be relu/gelu, not {name}")


class TransformerEncoderLayer(Module):
    def __init__(self, d_model, nhead, dim_feedforward=2048, dropout=0.1, activation="relu",
                 layer_norm_eps=1e-5, batch_first=False, norm_first=False, bias=True,
                 device=None, dtype=None):
        super().__init__()
        kw = dict(device=device, dtype=dtype)
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias,
                                            batch_first=batch_first, **kw)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias, **kw)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias, **kw)
        self.norm_first = norm_first
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **kw)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **kw)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        self.activation = _activation(activation)

    def forward(self, src, src_mask=None, src_key_padding_mask=None, is_causal=False):
        x = src
        if self.norm_first:
            x = add(x, self._sa_block(self.norm1(x), src_mask, src_key_padding_mask, is_causal))
            x = add(x, self._ff_block(self.norm2(x)))
        else:
            x = self.norm1(add(x, self._sa_block(x, src_mask, src_key_padding_mask,
                                                 is_causal)))
            x = self.norm2(add(x, self._ff_block(x)))
        return x

    def _sa_block(self, x, attn_mask, key_padding_mask, is_causal=False):
        x = self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                           need_weights=False, is_causal=is_causal)[0]
        return self.dropout1(x)

    def _ff_block(self, x):
        x = self.linear2(self.dropout(self.activation(self.linear1(x))))
        return self.dropout2(x)


class TransformerEncoder(Module):
    """num_layers deep copies of encoder_layer, then an optional norm."""

    def __init__(self, encoder_layer, num_layers, norm=None, enable_nested_tensor=True,
                 mask_check=True):
        super().__init__()
        self.layers = ModuleList([copy.deepcopy(encoder_layer) for _ in range(num_layers)])
        self.num_layers = num_layers
        self.norm = norm

    def forward(self, src, mask=None, src_key_padding_mask=None, is_causal=None):
        out = src
        for mod in self.layers:
            out = mod(out, src_mask=mask, src_key_padding_mask=src_key_padding_mask,
                      is_causal=bool(is_causal))
        if self.norm is not None:
            out = self.norm(out)
        return out
