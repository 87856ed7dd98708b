"""``Adam`` and ``AdamW`` (amsgrad, maximize, L2 or decoupled weight decay),
by torch's single-tensor formulas."""
from __future__ import annotations

from tracegrad.optim.optimizer import Optimizer, _update, _xp, _zeros_state, _step_tensor

__all__ = ["Adam", "AdamW"]


class Adam(Optimizer):
    _decoupled = False

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0,
                 amsgrad=False, *, foreach=None, maximize=False, capturable=False,
                 differentiable=False, fused=None, decoupled_weight_decay=False):
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not 0.0 <= betas[0] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 0: {betas[0]}")
        if not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 1: {betas[1]}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                        amsgrad=amsgrad, maximize=maximize, foreach=foreach,
                        capturable=capturable, differentiable=differentiable, fused=fused,
                        decoupled_weight_decay=decoupled_weight_decay or self._decoupled)
        super().__init__(params, defaults)

    def step(self, closure=None):
        return self._run_step(closure)

    def _update_group(self, group):
        beta1, beta2 = group["betas"]
        lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
        for p in group["params"]:
            if p._grad is None:
                continue
            grad = p._grad._data
            if group["maximize"]:
                grad = -grad
            state = self.state[p]
            if len(state) == 0:
                state["step"] = _step_tensor()
                state["exp_avg"] = _zeros_state(p)
                state["exp_avg_sq"] = _zeros_state(p)
                if group["amsgrad"]:
                    state["max_exp_avg_sq"] = _zeros_state(p)
            state["step"]._data += 1
            step = float(state["step"]._data)
            param = p._data
            if wd != 0:
                if group["decoupled_weight_decay"]:
                    param = param * (1 - lr * wd)
                else:
                    grad = grad + wd * param
            m, v = state["exp_avg"]._data, state["exp_avg_sq"]._data
            m += (1 - beta1) * (grad - m)          # exp_avg.lerp_(grad, 1 - beta1)
            v *= beta2
            v += (1 - beta2) * (grad * grad)
            bias_correction1 = 1 - beta1 ** step
            bias_correction2 = 1 - beta2 ** step
            step_size = lr / bias_correction1
            bias_correction2_sqrt = bias_correction2 ** 0.5
            xp = _xp(param)
            if group["amsgrad"]:
                vmax = state["max_exp_avg_sq"]._data
                xp.maximum(vmax, v, out=vmax)
                denom = xp.sqrt(vmax) / bias_correction2_sqrt + eps
            else:
                denom = xp.sqrt(v) / bias_correction2_sqrt + eps
            _update(p, param + (-step_size) * (m / denom))


class AdamW(Adam):
    """Adam with decoupled weight decay (default weight_decay=1e-2)."""
    _decoupled = True

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 amsgrad=False, *, maximize=False, foreach=None, capturable=False,
                 differentiable=False, fused=None):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, foreach=foreach,
                         maximize=maximize, capturable=capturable,
                         differentiable=differentiable, fused=fused,
                         decoupled_weight_decay=True)
