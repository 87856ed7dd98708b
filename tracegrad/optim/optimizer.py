"""``Optimizer``: the base of torch.optim's optimizers (param_groups, state,
zero_grad, step(closure), state_dict / load_state_dict, add_param_group,
step hooks).

The updates are written on the parameters' arrays (NumPy or CuPy) in place,
off the tape, with torch's formulas in torch's order of operations, so a
compiled function that reads the parameters at call time sees each step.
The state (``exp_avg``, ``momentum_buffer``, ``step``, ...) holds Tensors,
as torch's, so it can be inspected and saved.
"""
from __future__ import annotations

import copy
import itertools
from collections import OrderedDict, defaultdict

import numpy as np

from tracegrad.eager.graph import RemovableHandle
from tracegrad.eager.tensor import Tensor
from tracegrad.eager.grad_mode import no_grad
from tracegrad.ops import primitives

__all__ = ["Optimizer", "required"]


class _Required:
    def __repr__(self):
        return "<required parameter>"


required = _Required()


def _xp(a):
    return primitives.array_module(a)


def _update(p, new):
    """p's values replaced in place by ``new`` (an array), version bumped."""
    p._data[...] = new
    p._vbox[0] += 1


def _zeros_state(p):
    return Tensor(_xp(p._data).zeros_like(p._data))


def _step_tensor(value=0.0):
    """The 'step' counter torch keeps as a 0-d float tensor."""
    return Tensor(np.asarray(float(value)))


class Optimizer:
    """Base class: ``Optimizer(params, defaults)``; params is an iterable of
    Tensors, of (name, Tensor) pairs, or of dicts (parameter groups)."""

    def __init__(self, params, defaults):
        self.defaults = defaults
        self._optimizer_step_pre_hooks = OrderedDict()
        self._optimizer_step_post_hooks = OrderedDict()
        if isinstance(params, Tensor):
            raise TypeError("params argument given to the optimizer should be an iterable of "
                            "Tensors or dicts, but got " + type(params).__name__)
        self.state = defaultdict(dict)
        self.param_groups = []
        param_groups = list(params)
        if len(param_groups) == 0:
            raise ValueError("optimizer got an empty parameter list")
        if not isinstance(param_groups[0], dict):
            param_groups = [{"params": param_groups}]
        for group in param_groups:
            self.add_param_group(group)

    def __getstate__(self):
        return {"defaults": self.defaults, "state": self.state,
                "param_groups": self.param_groups}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.__dict__.setdefault("_optimizer_step_pre_hooks", OrderedDict())
        self.__dict__.setdefault("_optimizer_step_post_hooks", OrderedDict())

    def __repr__(self):
        s = self.__class__.__name__ + " ("
        for i, group in enumerate(self.param_groups):
            s += "\n"
            s += f"Parameter Group {i}\n"
            for key in sorted(group.keys()):
                if key not in ("params", "param_names"):
                    s += f"    {key}: {group[key]}\n"
        s += ")"
        return s

    def add_param_group(self, param_group):
        if not isinstance(param_group, dict):
            raise TypeError(f"param_group must be a dict, but got {type(param_group).__name__}")
        params = param_group["params"]
        if isinstance(params, Tensor):
            param_group["params"] = [params]
        elif isinstance(params, set):
            raise TypeError("optimizer parameters need to be organized in ordered collections, "
                            "but the ordering of tensors in sets will change between runs. "
                            "Please use a list instead.")
        else:
            param_group["params"] = list(params)
        plist, names = [], []
        for p in param_group["params"]:
            if isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str):
                names.append(p[0])
                p = p[1]
            plist.append(p)
        if names:
            if len(names) != len(plist):
                raise ValueError("all optimizer params should be with/without names. Some param "
                                 "names are missing")
            param_group["param_names"] = names
        param_group["params"] = plist
        for p in plist:
            if not isinstance(p, Tensor):
                raise TypeError("optimizer can only optimize Tensors, but one of the params is "
                                + type(p).__name__)
            if not p.is_leaf:
                raise ValueError("can't optimize a non-leaf Tensor")
        for name, default in self.defaults.items():
            if default is required and name not in param_group:
                raise ValueError(f"parameter group didn't specify a value of required "
                                 f"optimization parameter {name}")
            param_group.setdefault(name, default)
        if len({id(p) for p in plist}) != len(plist):
            import warnings
            warnings.warn("optimizer contains a parameter group with duplicate parameters; in "
                          "future, this will cause an error; see "
                          "github.com/pytorch/pytorch/issues/40967 for more information",
                          stacklevel=3)
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        if any(id(p) in seen for p in plist):
            raise ValueError("some parameters appear in more than one parameter group")
        self.param_groups.append(param_group)

    def zero_grad(self, set_to_none=True):
        for group in self.param_groups:
            for p in group["params"]:
                if p._grad is not None:
                    if set_to_none:
                        p._grad = None
                    else:
                        g = p._grad
                        if g.grad_fn is not None:
                            g.detach_()
                        else:
                            g.requires_grad_(False)
                        g._data[...] = 0
                        g._vbox[0] += 1

    # --- steps --------------------------------------------------------------------------
    def step(self, closure=None):
        raise NotImplementedError

    def _run_step(self, closure):
        """Call pre-hooks, the closure (with grad enabled), the update
        (without), then post-hooks; returns the closure's loss."""
        for hook in list(self._optimizer_step_pre_hooks.values()):
            res = hook(self, (), {})
            if res is not None:
                raise RuntimeError("optimizer step pre-hooks that change the arguments are not "
                                   "supported by tracegrad")
        loss = None
        if closure is not None:
            from tracegrad.eager.grad_mode import enable_grad
            with enable_grad():
                loss = closure()
        with no_grad():
            for group in self.param_groups:
                self._update_group(group)
        for hook in list(self._optimizer_step_post_hooks.values()):
            hook(self, (), {})
        return loss

    def _update_group(self, group):
        raise NotImplementedError

    def register_step_pre_hook(self, hook):
        h = RemovableHandle(self._optimizer_step_pre_hooks)
        self._optimizer_step_pre_hooks[h.id] = hook
        return h

    def register_step_post_hook(self, hook):
        h = RemovableHandle(self._optimizer_step_post_hooks)
        self._optimizer_step_post_hooks[h.id] = hook
        return h

    # --- state dict ---------------------------------------------------------------------
    def state_dict(self):
        mapping = {}
        start = 0

        def pack(group):
            nonlocal start
            packed = {k: v for k, v in group.items() if k != "params"}
            for i, p in enumerate(group["params"], start):
                if id(p) not in mapping:
                    mapping[id(p)] = i
            packed["params"] = [mapping[id(p)] for p in group["params"]]
            start += len(packed["params"])
            return packed

        groups = [pack(g) for g in self.param_groups]
        state = {mapping[id(k)]: v for k, v in self.state.items() if id(k) in mapping}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict):
        state_dict = copy.deepcopy(state_dict)
        groups = self.param_groups
        saved = state_dict["param_groups"]
        if len(groups) != len(saved):
            raise ValueError("loaded state dict has a different number of parameter groups")
        if any(len(g["params"]) != len(s["params"]) for g, s in zip(groups, saved)):
            raise ValueError("loaded state dict contains a parameter group that doesn't match "
                             "the size of optimizer's group")
        id_map = dict(zip(itertools.chain.from_iterable(g["params"] for g in saved),
                          itertools.chain.from_iterable(g["params"] for g in groups)))

        def cast(param, value, key=None):
            if isinstance(value, Tensor):
                if key == "step":
                    return value
                data = value._data
                if param.dtype.kind in "fc" and data.dtype.kind in "fc":
                    data = data.astype(param.dtype)
                if type(data) is not type(param._data):
                    from tracegrad.eager.device import _to_host
                    host = np.asarray(_to_host(data))
                    data = host if type(param._data) is np.ndarray else \
                        _xp(param._data).asarray(host)
                return Tensor(data)
            if isinstance(value, dict):
                return {k: cast(param, v, k) for k, v in value.items()}
            return value

        state = defaultdict(dict)
        for k, v in state_dict["state"].items():
            if k in id_map:
                param = id_map[k]
                state[param] = cast(param, v)
            else:
                state[k] = v
        self.__setstate__({"state": state})
        self.param_groups = [{**s, "params": g["params"]} for g, s in zip(groups, saved)]
