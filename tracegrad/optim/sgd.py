"""``SGD`` with momentum, dampening, Nesterov momentum, weight decay and
maximize, by torch's formulas."""
from __future__ import annotations

from tracegrad.eager.tensor import Tensor
from tracegrad.optim.optimizer import Optimizer, _update

__all__ = ["SGD"]


class SGD(Optimizer):
    def __init__(self, params, lr=1e-3, momentum=0, dampening=0, weight_decay=0,
                 nesterov=False, *, maximize=False, foreach=None, differentiable=False,
                 fused=None):
        if lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if momentum < 0.0:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening,
                        weight_decay=weight_decay, nesterov=nesterov, maximize=maximize,
                        foreach=foreach, differentiable=differentiable, fused=fused)
        super().__init__(params, defaults)

    def step(self, closure=None):
        return self._run_step(closure)

    def _update_group(self, group):
        lr, momentum, dampening = group["lr"], group["momentum"], group["dampening"]
        wd, nesterov = group["weight_decay"], group["nesterov"]
        for p in group["params"]:
            if p._grad is None:
                continue
            grad = p._grad._data
            if group["maximize"]:
                grad = -grad
            if wd != 0:
                grad = grad + wd * p._data
            if momentum != 0:
                state = self.state[p]
                buf = state.get("momentum_buffer")
                if buf is None:
                    buf = state["momentum_buffer"] = Tensor(grad.copy())
                else:
                    buf._data *= momentum
                    buf._data += (1 - dampening) * grad
                grad = grad + momentum * buf._data if nesterov else buf._data
            _update(p, p._data - lr * grad)
