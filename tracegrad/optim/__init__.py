"""``torch.optim`` for code written the torch way: ``tracegrad.optim``.

The optimizers (SGD, Adam, AdamW, RMSprop, Adagrad, LBFGS) follow torch's
update formulas in torch's order of operations, and update the parameters'
arrays in place, off the tape; ``tracegrad.optim.lr_scheduler`` holds the
schedulers.

A public face, on top of the layers: it may import any of them.
"""
from tracegrad.optim.optimizer import Optimizer
from tracegrad.optim.sgd import SGD
from tracegrad.optim.adam import Adam, AdamW
from tracegrad.optim.rmsprop import RMSprop, Adagrad
from tracegrad.optim.lbfgs import LBFGS
from tracegrad.optim import lr_scheduler

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "LBFGS", "lr_scheduler"]
