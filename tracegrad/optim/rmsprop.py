"""``RMSprop`` (centered, momentum) and ``Adagrad`` by torch's formulas."""
from __future__ import annotations

from tracegrad.eager.tensor import Tensor
from tracegrad.optim.optimizer import Optimizer, _update, _xp, _zeros_state, _step_tensor

__all__ = ["RMSprop", "Adagrad"]


class RMSprop(Optimizer):
    def __init__(self, params, lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0, momentum=0,
                 centered=False, capturable=False, foreach=None, maximize=False,
                 differentiable=False):
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not 0.0 <= momentum:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if not 0.0 <= alpha:
            raise ValueError(f"Invalid alpha value: {alpha}")
        defaults = dict(lr=lr, momentum=momentum, alpha=alpha, eps=eps, centered=centered,
                        weight_decay=weight_decay, capturable=capturable, foreach=foreach,
                        maximize=maximize, differentiable=differentiable)
        super().__init__(params, defaults)

    def step(self, closure=None):
        return self._run_step(closure)

    def _update_group(self, group):
        lr, alpha, eps = group["lr"], group["alpha"], group["eps"]
        wd, momentum = group["weight_decay"], group["momentum"]
        for p in group["params"]:
            if p._grad is None:
                continue
            grad = p._grad._data
            if group["maximize"]:
                grad = -grad
            state = self.state[p]
            if len(state) == 0:
                state["step"] = _step_tensor()
                state["square_avg"] = _zeros_state(p)
                if momentum > 0:
                    state["momentum_buffer"] = _zeros_state(p)
                if group["centered"]:
                    state["grad_avg"] = _zeros_state(p)
            state["step"]._data += 1
            if wd != 0:
                grad = grad + wd * p._data
            sq = state["square_avg"]._data
            sq *= alpha
            sq += (1 - alpha) * (grad * grad)
            xp = _xp(sq)
            if group["centered"]:
                ga = state["grad_avg"]._data
                ga += (1 - alpha) * (grad - ga)
                avg = xp.sqrt(sq - ga * ga)
            else:
                avg = xp.sqrt(sq)
            avg = avg + eps
            if momentum > 0:
                buf = state["momentum_buffer"]._data
                buf *= momentum
                buf += grad / avg
                _update(p, p._data - lr * buf)
            else:
                _update(p, p._data + (-lr) * (grad / avg))


class Adagrad(Optimizer):
    def __init__(self, params, lr=1e-2, lr_decay=0, weight_decay=0,
                 initial_accumulator_value=0, eps=1e-10, foreach=None, *, maximize=False,
                 differentiable=False, fused=None):
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= lr_decay:
            raise ValueError(f"Invalid lr_decay value: {lr_decay}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if not 0.0 <= initial_accumulator_value:
            raise ValueError(f"Invalid initial_accumulator_value value: "
                             f"{initial_accumulator_value}")
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        defaults = dict(lr=lr, lr_decay=lr_decay, eps=eps, weight_decay=weight_decay,
                        initial_accumulator_value=initial_accumulator_value, foreach=foreach,
                        maximize=maximize, differentiable=differentiable, fused=fused)
        super().__init__(params, defaults)
        for group in self.param_groups:   # torch makes Adagrad's state at construction
            for p in group["params"]:
                state = self.state[p]
                state["step"] = _step_tensor()
                xp = _xp(p._data)
                state["sum"] = Tensor(xp.full_like(p._data, group["initial_accumulator_value"]))

    def step(self, closure=None):
        return self._run_step(closure)

    def _update_group(self, group):
        lr, lr_decay, eps, wd = group["lr"], group["lr_decay"], group["eps"], \
            group["weight_decay"]
        for p in group["params"]:
            if p._grad is None:
                continue
            grad = p._grad._data
            state = self.state[p]
            if len(state) == 0:     # a parameter of a group added later
                state["step"] = _step_tensor()
                state["sum"] = Tensor(_xp(p._data).full_like(
                    p._data, group["initial_accumulator_value"]))
            state["step"]._data += 1
            step = float(state["step"]._data)
            if group["maximize"]:
                grad = -grad
            if wd != 0:
                grad = grad + wd * p._data
            clr = lr / (1 + (step - 1) * lr_decay)
            s = state["sum"]._data
            s += grad * grad
            std = _xp(s).sqrt(s) + eps
            _update(p, p._data + (-clr) * (grad / std))
