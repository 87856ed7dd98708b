"""``torch.nn`` for code written the torch way: ``tracegrad.nn``.

``import tracegrad as torch`` then ``torch.nn.Module``, ``torch.nn.Linear``,
``torch.nn.functional`` (``F``), ``torch.nn.init`` and ``torch.nn.utils``
with torch's names, arguments, defaults, initialisation formulas and reprs.
Every layer's forward is a composition of ``F.*`` functions, and each of
those a composition of registry ops, so a model runs eagerly on Tensors
(recording the tape) and inside ``tg.grad`` / ``tg.compile``, where its
parameters (Tensors reached as attributes) are read at call time.

A public face, on top of the layers: it may import any of them.
"""
from tracegrad.nn import functional
from tracegrad.nn.parameter import Parameter, Buffer
from tracegrad.nn.module import Module, OptimizedModule
from tracegrad.nn.container import (Sequential, ModuleList, ModuleDict, ParameterList,
                                    ParameterDict)
from tracegrad.nn.linear import (Identity, Linear, Bilinear, Flatten, Unflatten, Unfold, Fold,
                                 Upsample, Dropout, Dropout1d, Dropout2d, AlphaDropout,
                                 CosineSimilarity)
from tracegrad.nn.padding import (ConstantPad1d, ConstantPad2d, ZeroPad1d, ZeroPad2d,
                                  ReflectionPad1d, ReflectionPad2d, ReplicationPad1d,
                                  ReplicationPad2d, CircularPad1d, CircularPad2d)
from tracegrad.nn.activation import (ReLU, ReLU6, LeakyReLU, ELU, CELU, SELU, GELU, SiLU, Mish,
                                     Tanh, Sigmoid, LogSigmoid, Softplus, Softsign, Tanhshrink,
                                     Hardtanh, Hardswish, Hardsigmoid, Hardshrink, Softshrink,
                                     Threshold, GLU, PReLU, Softmax, LogSoftmax, Softmin)
from tracegrad.nn.loss import (L1Loss, MSELoss, SmoothL1Loss, HuberLoss, BCELoss,
                               BCEWithLogitsLoss, NLLLoss, CrossEntropyLoss, KLDivLoss)
from tracegrad.nn.conv import (Conv1d, Conv2d, Conv3d, ConvTranspose1d, ConvTranspose2d,
                               MaxPool1d, MaxPool2d, AvgPool1d, AvgPool2d, AdaptiveAvgPool1d,
                               AdaptiveAvgPool2d)
from tracegrad.nn.normalization import (BatchNorm1d, BatchNorm2d, BatchNorm3d, LayerNorm,
                                        GroupNorm, InstanceNorm1d, InstanceNorm2d, Embedding)
from tracegrad.nn.rnn import RNNCell, LSTMCell, GRUCell, RNN, LSTM, GRU
from tracegrad.nn.transformer import (MultiheadAttention, TransformerEncoderLayer,
                                     TransformerEncoder)
from tracegrad.nn import init, utils, grad

__all__ = [
    "functional", "init", "utils", "grad", "Parameter", "Buffer", "Module", "OptimizedModule",
    "Sequential", "ModuleList",
    "ModuleDict", "ParameterList", "ParameterDict", "Identity", "Linear", "Bilinear",
    "Flatten", "Unflatten", "Unfold", "Fold", "Upsample", "Dropout", "Dropout1d", "Dropout2d",
    "AlphaDropout",
    "CosineSimilarity", "ConstantPad1d", "ConstantPad2d", "ZeroPad1d", "ZeroPad2d",
    "ReflectionPad1d", "ReflectionPad2d", "ReplicationPad1d", "ReplicationPad2d",
    "CircularPad1d", "CircularPad2d", "ReLU",
    "ReLU6", "LeakyReLU", "ELU", "CELU", "SELU", "GELU", "SiLU", "Mish", "Tanh", "Sigmoid",
    "LogSigmoid", "Softplus", "Softsign", "Tanhshrink", "Hardtanh", "Hardswish", "Hardsigmoid",
    "Hardshrink", "Softshrink", "Threshold", "GLU", "PReLU", "Softmax", "LogSoftmax", "Softmin",
    "L1Loss", "MSELoss", "SmoothL1Loss", "HuberLoss", "BCELoss", "BCEWithLogitsLoss", "NLLLoss",
    "CrossEntropyLoss", "KLDivLoss", "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d",
    "ConvTranspose2d", "MaxPool1d", "MaxPool2d", "AvgPool1d", "AvgPool2d", "AdaptiveAvgPool1d",
    "AdaptiveAvgPool2d", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "LayerNorm", "GroupNorm",
    "InstanceNorm1d", "InstanceNorm2d", "Embedding", "RNNCell", "LSTMCell", "GRUCell", "RNN",
    "LSTM", "GRU", "MultiheadAttention", "TransformerEncoderLayer", "TransformerEncoder",
]
