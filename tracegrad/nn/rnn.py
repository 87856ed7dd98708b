"""Recurrent layers: ``RNNCell``, ``LSTMCell``, ``GRUCell`` and ``RNN``,
``LSTM``, ``GRU`` (num_layers, bidirectional, batch_first, dropout between
layers), with torch's parameter names, gate order, initialisation
(U(-1/sqrt(hidden), 1/sqrt(hidden))) and reprs.  The time loop is a Python
loop over compositions of registry ops."""
from __future__ import annotations

import math

from tracegrad.eager.factories import empty, zeros
from tracegrad.nn import functional as F
from tracegrad.nn import init
from tracegrad.nn.module import Module
from tracegrad.nn.parameter import Parameter
from tracegrad.ops.base import add, mul, sub, tanh, matmul, swapaxes
from tracegrad.ops.elementwise import sigmoid
from tracegrad.ops.indexing import getitem
from tracegrad.ops.shape import stack, concatenate, expand_dims

__all__ = ["RNNCell", "LSTMCell", "GRUCell", "RNN", "LSTM", "GRU"]


def _lin(x, w, b):
    out = matmul(x, swapaxes(w, 0, 1))
    return out if b is None else add(out, b)


def _chunks(x, n):
    h = x.shape[-1] // n
    return [getitem(x, (Ellipsis, slice(i * h, (i + 1) * h))) for i in range(n)]


def _rnn_step(mode, x, state, w_ih, w_hh, b_ih, b_hh, nonlinearity="tanh"):
    """One step of a cell: the new state (h, or (h, c) for an LSTM)."""
    if mode == "LSTM":
        h, c = state
        gates = add(_lin(x, w_ih, b_ih), _lin(h, w_hh, b_hh))
        i, f, g, o = _chunks(gates, 4)
        i, f, g, o = sigmoid(i), sigmoid(f), tanh(g), sigmoid(o)
        c = add(mul(f, c), mul(i, g))
        return mul(o, tanh(c)), c
    if mode == "GRU":
        h = state
        gi, gh = _lin(x, w_ih, b_ih), _lin(h, w_hh, b_hh)
        i_r, i_z, i_n = _chunks(gi, 3)
        h_r, h_z, h_n = _chunks(gh, 3)
        r = sigmoid(add(i_r, h_r))
        z = sigmoid(add(i_z, h_z))
        n = tanh(add(i_n, mul(r, h_n)))
        return add(mul(sub(1.0, z), n), mul(z, h))
    pre = add(_lin(x, w_ih, b_ih), _lin(state, w_hh, b_hh))
    return tanh(pre) if nonlinearity == "tanh" else F.relu(pre)


_GATES = {"RNN_TANH": 1, "RNN_RELU": 1, "LSTM": 4, "GRU": 3}


class _CellBase(Module):
    _mode = "RNN"

    def __init__(self, input_size, hidden_size, bias, num_chunks, device=None, dtype=None):
        super().__init__()
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.bias = bias
        self.weight_ih = Parameter(empty((num_chunks * hidden_size, input_size), device=device,
                                         dtype=dtype))
        self.weight_hh = Parameter(empty((num_chunks * hidden_size, hidden_size), device=device,
                                         dtype=dtype))
        if bias:
            self.bias_ih = Parameter(empty(num_chunks * hidden_size, device=device, dtype=dtype))
            self.bias_hh = Parameter(empty(num_chunks * hidden_size, device=device, dtype=dtype))
        else:
            self.register_parameter("bias_ih", None)
            self.register_parameter("bias_hh", None)
        self.reset_parameters()

    def reset_parameters(self):
        stdv = 1.0 / math.sqrt(self.hidden_size) if self.hidden_size > 0 else 0
        for w in self.parameters():
            init.uniform_(w, -stdv, stdv)

    def extra_repr(self):
        s = f"{self.input_size}, {self.hidden_size}"
        if self.bias is not True:
            s += f", bias={self.bias}"
        if getattr(self, "nonlinearity", "tanh") != "tanh":
            s += f", nonlinearity={self.nonlinearity}"
        return s

    def _prepare(self, input, hx, n_states):
        nd = len(input.shape)
        if nd not in (1, 2):
            raise ValueError(f"{type(self).__name__}: Expected input to be 1D or 2D, got {nd}D "
                             f"instead")
        batched = nd == 2
        x = input if batched else expand_dims(input, 0)
        if hx is None:
            z = zeros((x.shape[0], self.hidden_size), dtype=input.dtype)
            hx = z if n_states == 1 else (z, zeros((x.shape[0], self.hidden_size),
                                                   dtype=input.dtype))
        elif not batched:
            hx = expand_dims(hx, 0) if n_states == 1 else tuple(expand_dims(h, 0) for h in hx)
        return x, hx, batched

    def _finish(self, out, batched):
        if batched:
            return out
        if isinstance(out, tuple):
            return tuple(getitem(o, 0) for o in out)
        return getitem(out, 0)


class RNNCell(_CellBase):
    def __init__(self, input_size, hidden_size, bias=True, nonlinearity="tanh", device=None,
                 dtype=None):
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"Unknown nonlinearity: {nonlinearity}")
        super().__init__(input_size, hidden_size, bias, 1, device, dtype)
        self.nonlinearity = nonlinearity

    def forward(self, input, hx=None):
        x, hx, batched = self._prepare(input, hx, 1)
        out = _rnn_step("RNN", x, hx, self.weight_ih, self.weight_hh, self.bias_ih,
                        self.bias_hh, self.nonlinearity)
        return self._finish(out, batched)


class LSTMCell(_CellBase):
    def __init__(self, input_size, hidden_size, bias=True, device=None, dtype=None):
        super().__init__(input_size, hidden_size, bias, 4, device, dtype)

    def forward(self, input, hx=None):
        x, hx, batched = self._prepare(input, hx, 2)
        out = _rnn_step("LSTM", x, hx, self.weight_ih, self.weight_hh, self.bias_ih,
                        self.bias_hh)
        return self._finish(out, batched)


class GRUCell(_CellBase):
    def __init__(self, input_size, hidden_size, bias=True, device=None, dtype=None):
        super().__init__(input_size, hidden_size, bias, 3, device, dtype)

    def forward(self, input, hx=None):
        x, hx, batched = self._prepare(input, hx, 1)
        out = _rnn_step("GRU", x, hx, self.weight_ih, self.weight_hh, self.bias_ih,
                        self.bias_hh)
        return self._finish(out, batched)


class _RNNBase(Module):
    def __init__(self, mode, input_size, hidden_size, num_layers=1, bias=True,
                 batch_first=False, dropout=0.0, bidirectional=False, proj_size=0,
                 device=None, dtype=None):
        super().__init__()
        if proj_size:
            raise NotImplementedError("LSTM(proj_size=) is not supported by tracegrad yet")
        if not 0 <= dropout <= 1 or isinstance(dropout, bool):
            raise ValueError("dropout should be a number in range [0, 1] representing the "
                             "probability of an element being zeroed")
        if num_layers < 1:
            raise ValueError(f"num_layers must be greater than or equal to 1, got {num_layers}")
        if dropout > 0 and num_layers == 1:
            import warnings
            warnings.warn(f"dropout option adds dropout after all but last recurrent layer, so "
                          f"non-zero dropout expects num_layers greater than 1, but got "
                          f"dropout={dropout} and num_layers={num_layers}", stacklevel=3)
        self.mode = mode
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.bias = bias
        self.batch_first = batch_first
        self.dropout = float(dropout)
        self.bidirectional = bidirectional
        self.proj_size = proj_size
        num_dirs = 2 if bidirectional else 1
        gate = _GATES[mode] * hidden_size
        self._flat_weights_names = []
        for layer in range(num_layers):
            for d in range(num_dirs):
                in_size = input_size if layer == 0 else hidden_size * num_dirs
                sfx = "_reverse" if d == 1 else ""
                names = [f"weight_ih_l{layer}{sfx}", f"weight_hh_l{layer}{sfx}"]
                setattr(self, names[0], Parameter(empty((gate, in_size), device=device,
                                                        dtype=dtype)))
                setattr(self, names[1], Parameter(empty((gate, hidden_size), device=device,
                                                        dtype=dtype)))
                if bias:
                    names += [f"bias_ih_l{layer}{sfx}", f"bias_hh_l{layer}{sfx}"]
                    setattr(self, names[2], Parameter(empty(gate, device=device, dtype=dtype)))
                    setattr(self, names[3], Parameter(empty(gate, device=device, dtype=dtype)))
                self._flat_weights_names.extend(names)
        self.reset_parameters()

    def reset_parameters(self):
        stdv = 1.0 / math.sqrt(self.hidden_size) if self.hidden_size > 0 else 0
        for w in self.parameters():
            init.uniform_(w, -stdv, stdv)

    def extra_repr(self):
        s = f"{self.input_size}, {self.hidden_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        if self.bias is not True:
            s += f", bias={self.bias}"
        if self.batch_first is not False:
            s += f", batch_first={self.batch_first}"
        if self.dropout != 0:
            s += f", dropout={self.dropout}"
        if self.bidirectional is not False:
            s += f", bidirectional={self.bidirectional}"
        return s

    def _weights(self, layer, d):
        sfx = "_reverse" if d == 1 else ""
        get = self._parameters.get
        return (get(f"weight_ih_l{layer}{sfx}"), get(f"weight_hh_l{layer}{sfx}"),
                get(f"bias_ih_l{layer}{sfx}"), get(f"bias_hh_l{layer}{sfx}"))

    def _run(self, input, hx):
        lstm = self.mode == "LSTM"
        nd = len(input.shape)
        if nd not in (2, 3):
            raise ValueError(f"{type(self).__name__}: Expected input to be 2D or 3D, got {nd}D "
                             f"tensor instead")
        batched = nd == 3
        x = input
        if not batched:
            x = expand_dims(x, 1)
        elif self.batch_first:
            x = swapaxes(x, 0, 1)
        L, N = x.shape[0], x.shape[1]
        num_dirs = 2 if self.bidirectional else 1
        if hx is None:
            h0 = zeros((self.num_layers * num_dirs, N, self.hidden_size), dtype=input.dtype)
            hx = (h0, zeros((self.num_layers * num_dirs, N, self.hidden_size),
                            dtype=input.dtype)) if lstm else h0
        elif not batched:
            hx = tuple(expand_dims(h, 1) for h in hx) if lstm else expand_dims(hx, 1)
        mode = self.mode if self.mode in ("LSTM", "GRU") else "RNN"
        nonlin = "relu" if self.mode == "RNN_RELU" else "tanh"
        h_n, c_n = [], []
        layer_in = x
        for layer in range(self.num_layers):
            outs = []
            for d in range(num_dirs):
                k = layer * num_dirs + d
                w_ih, w_hh, b_ih, b_hh = self._weights(layer, d)
                state = (getitem(hx[0], k), getitem(hx[1], k)) if lstm else getitem(hx, k)
                steps = range(L - 1, -1, -1) if d == 1 else range(L)
                seq = [None] * L
                for t in steps:
                    state = _rnn_step(mode, getitem(layer_in, t), state, w_ih, w_hh, b_ih, b_hh,
                                      nonlin)
                    seq[t] = state[0] if lstm else state
                outs.append(stack(seq, axis=0))
                if lstm:
                    h_n.append(state[0])
                    c_n.append(state[1])
                else:
                    h_n.append(state)
            layer_in = outs[0] if num_dirs == 1 else concatenate(outs, axis=2)
            if self.dropout and self.training and layer < self.num_layers - 1:
                layer_in = F.dropout(layer_in, self.dropout, True)
        output = layer_in
        h_n = stack(h_n, axis=0)
        hidden = (h_n, stack(c_n, axis=0)) if lstm else h_n
        if not batched:
            output = getitem(output, (slice(None), 0))
            hidden = tuple(getitem(h, (slice(None), 0)) for h in hidden) if lstm else \
                getitem(hidden, (slice(None), 0))
        elif self.batch_first:
            output = swapaxes(output, 0, 1)
        return output, hidden

    def forward(self, input, hx=None):
        return self._run(input, hx)


class RNN(_RNNBase):
    """Elman RNN: h_t = tanh(x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh) (or relu)."""

    def __init__(self, *args, **kwargs):
        nonlinearity = kwargs.pop("nonlinearity", "tanh")
        if len(args) > 3:
            nonlinearity = args[3]
            args = args[:3] + args[4:]
        if nonlinearity == "tanh":
            mode = "RNN_TANH"
        elif nonlinearity == "relu":
            mode = "RNN_RELU"
        else:
            raise ValueError(f"Unknown nonlinearity '{nonlinearity}'. Select from 'tanh' or "
                             f"'relu'.")
        self.nonlinearity = nonlinearity
        super().__init__(mode, *args, **kwargs)

    def __setattr__(self, name, value):
        if name == "nonlinearity" and "_parameters" not in self.__dict__:
            object.__setattr__(self, name, value)   # set before Module.__init__
            return
        super().__setattr__(name, value)


class LSTM(_RNNBase):
    """LSTM with torch's gate order (input, forget, cell, output); returns
    (output, (h_n, c_n))."""

    def __init__(self, *args, **kwargs):
        super().__init__("LSTM", *args, **kwargs)


class GRU(_RNNBase):
    """GRU with torch's gate order (reset, update, new)."""

    def __init__(self, *args, **kwargs):
        super().__init__("GRU", *args, **kwargs)
