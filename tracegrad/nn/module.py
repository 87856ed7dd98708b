"""``nn.Module``: the base class of layers, with torch's registration of
parameters, buffers and submodules through attribute assignment, the
traversals (parameters, named_modules, ...), train/eval, state_dict /
load_state_dict, hooks, ``apply``, ``to`` and ``zero_grad``.

A Module's parameters are Tensors reached as attributes: a compiled function
that calls a module reads them at call time (tracegrad.frontend.captured),
so an optimizer step between calls is seen.
"""
from __future__ import annotations

from collections import OrderedDict, namedtuple

import numpy as np

from tracegrad import api
from tracegrad.eager.graph import RemovableHandle  # what register_*_hook returns
from tracegrad.eager.tensor import Tensor
from tracegrad.eager.grad_mode import no_grad
from tracegrad.nn import functional as F
from tracegrad.nn.parameter import Parameter, Buffer
from tracegrad.ops.random import is_tracing
from tracegrad.runtime.graph_call import CompiledBackward

__all__ = ["Module", "RemovableHandle", "OptimizedModule"]


class _IncompatibleKeys(namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])):
    def __repr__(self):
        if not self.missing_keys and not self.unexpected_keys:
            return "<All keys matched successfully>"
        return super().__repr__()

    __str__ = __repr__


def _addindent(s, n):
    lines = s.split("\n")
    if len(lines) == 1:
        return s
    return lines[0] + "\n" + "\n".join(" " * n + line for line in lines[1:])


class Module:
    """Base class for all neural network modules (torch.nn.Module)."""

    training: bool
    _version = 1
    # where a compiled function that calls the module finds its Tensors, to
    # read them at call time (tracegrad.frontend.captured)
    __tracegrad_state__ = ("_parameters", "_buffers", "_modules")

    def __tracegrad_compile__(self, **options):
        """What ``tg.compile(module)`` returns (tracegrad.api.compile asks the
        object's class): an OptimizedModule, as ``torch.compile(module)``."""
        return OptimizedModule(self, **options)
    call_super_init = False

    def __init__(self, *args, **kwargs):
        if args or kwargs:
            raise TypeError(f"{type(self).__name__}.__init__() got unexpected arguments "
                            f"{args or ''}{kwargs or ''}")
        d = self.__dict__
        d["training"] = True
        d["_parameters"] = {}
        d["_buffers"] = {}
        d["_non_persistent_buffers_set"] = set()
        d["_modules"] = {}
        d["_forward_hooks"] = OrderedDict()
        d["_forward_hooks_with_kwargs"] = {}
        d["_forward_pre_hooks"] = OrderedDict()
        d["_forward_pre_hooks_with_kwargs"] = {}
        d["_state_dict_hooks"] = OrderedDict()
        d["_load_state_dict_pre_hooks"] = OrderedDict()

    # --- forward -----------------------------------------------------------------------
    def forward(self, *input):
        raise NotImplementedError(f'Module [{type(self).__name__}] is missing the required '
                                  f'"forward" function')

    def _call_impl(self, *args, **kwargs):
        for hid, hook in list(self._forward_pre_hooks.items()):
            if self._forward_pre_hooks_with_kwargs.get(hid):
                res = hook(self, args, kwargs)
                if res is not None:
                    if not (isinstance(res, tuple) and len(res) == 2):
                        raise RuntimeError("forward pre-hook must return None or a tuple of "
                                           f"(new_args, new_kwargs), but got {res}.")
                    args, kwargs = res
            else:
                res = hook(self, args)
                if res is not None:
                    args = res if isinstance(res, tuple) else (res,)
        result = self.forward(*args, **kwargs)
        for hid, hook in list(self._forward_hooks.items()):
            if self._forward_hooks_with_kwargs.get(hid):
                res = hook(self, args, kwargs, result)
            else:
                res = hook(self, args, result)
            if res is not None:
                result = res
        return result

    def __call__(self, *args, **kwargs):
        compiled = self.__dict__.get("_compiled_call_impl")
        if compiled is not None:     # Module.compile(): the compiled call in its place
            return compiled(*args, **kwargs)
        return self._call_impl(*args, **kwargs)

    def compile(self, *args, **kwargs):
        """Compile this module's call in place, as ``torch.nn.Module.compile``:
        later calls of the module run ``tg.compile(self, *args, **kwargs)``'s
        call (the same keywords as tg.compile).  Its parameters, buffers and
        state_dict stay the module's own."""
        compiled = api.compile(self, *args, **kwargs)
        self.__dict__["_compiled_call_impl"] = compiled if compiled is not self else None

    def __getstate__(self):
        state = self.__dict__.copy()
        state.pop("_compiled_call_impl", None)   # as torch: a copy or a pickle is not compiled
        return state

    def register_forward_pre_hook(self, hook, *, prepend=False, with_kwargs=False):
        handle = RemovableHandle(self._forward_pre_hooks)
        self._forward_pre_hooks[handle.id] = hook
        if with_kwargs:
            self._forward_pre_hooks_with_kwargs[handle.id] = True
        if prepend:
            self._forward_pre_hooks.move_to_end(handle.id, last=False)
        return handle

    def register_forward_hook(self, hook, *, prepend=False, with_kwargs=False,
                              always_call=False):
        handle = RemovableHandle(self._forward_hooks)
        self._forward_hooks[handle.id] = hook
        if with_kwargs:
            self._forward_hooks_with_kwargs[handle.id] = True
        if prepend:
            self._forward_hooks.move_to_end(handle.id, last=False)
        return handle

    def register_full_backward_hook(self, hook, prepend=False):
        raise NotImplementedError(
            "Module.register_full_backward_hook is not supported by tracegrad yet; register a "
            "hook on the output tensor instead (out.register_hook(fn)), or on the parameters")

    register_backward_hook = register_full_backward_hook

    # --- registration ------------------------------------------------------------------
    def register_parameter(self, name, param):
        if "_parameters" not in self.__dict__:
            raise AttributeError("cannot assign parameter before Module.__init__() call")
        self._check_name(name, "parameter", self._parameters)
        if param is None:
            self._parameters[name] = None
            return
        if not isinstance(param, Parameter):
            raise TypeError(f"cannot assign '{type(param).__name__}' object to parameter "
                            f"'{name}' (torch.nn.Parameter or None required)")
        if param.grad_fn is not None:
            raise ValueError(f"Cannot assign non-leaf Tensor to parameter '{name}'. Model "
                             f"parameters must be created explicitly. To express '{name}' as a "
                             f"function of another Tensor, compute the value in the forward() "
                             f"method.")
        self._parameters[name] = param

    def register_buffer(self, name, tensor, persistent=True):
        if "_buffers" not in self.__dict__:
            raise AttributeError("cannot assign buffer before Module.__init__() call")
        self._check_name(name, "buffer", self._buffers)
        if tensor is not None and not isinstance(tensor, Tensor):
            raise TypeError(f"cannot assign '{type(tensor).__name__}' object to buffer "
                            f"'{name}' (torch Tensor or None required)")
        self._buffers[name] = tensor
        if persistent:
            self._non_persistent_buffers_set.discard(name)
        else:
            self._non_persistent_buffers_set.add(name)

    def _check_name(self, name, kind, own):
        if not isinstance(name, str):
            raise TypeError(f"{kind} name should be a string. Got {type(name).__name__}")
        if "." in name:
            raise KeyError(f'{kind} name can\'t contain "."')
        if name == "":
            raise KeyError(f'{kind} name can\'t be empty string ""')
        if hasattr(self, name) and name not in own:
            raise KeyError(f"attribute '{name}' already exists")

    def add_module(self, name, module):
        if not isinstance(module, Module) and module is not None:
            raise TypeError(f"{type(module).__name__} is not a Module subclass")
        if not isinstance(name, str):
            raise TypeError(f"module name should be a string. Got {type(name).__name__}")
        if hasattr(self, name) and name not in self._modules:
            raise KeyError(f"attribute '{name}' already exists")
        if "." in name:
            raise KeyError(f'module name can\'t contain ".", got: {name}')
        if name == "":
            raise KeyError('module name can\'t be empty string ""')
        self._modules[name] = module

    register_module = add_module

    def get_submodule(self, target):
        if target == "":
            return self
        mod = self
        for item in target.split("."):
            if not hasattr(mod, item):
                raise AttributeError(f"{mod._get_name()} has no attribute `{item}`")
            mod = getattr(mod, item)
            if not isinstance(mod, Module):
                raise AttributeError(f"`{item}` is not an nn.Module")
        return mod

    def get_parameter(self, target):
        mod_path, _, name = target.rpartition(".")
        mod = self.get_submodule(mod_path)
        if name not in mod._parameters:
            raise AttributeError(f"{mod._get_name()} has no parameter `{name}`")
        return mod._parameters[name]

    def get_buffer(self, target):
        mod_path, _, name = target.rpartition(".")
        mod = self.get_submodule(mod_path)
        if name not in mod._buffers:
            raise AttributeError(f"{mod._get_name()} has no buffer `{name}`")
        return mod._buffers[name]

    def __getattr__(self, name):
        d = self.__dict__
        for store in ("_parameters", "_buffers", "_modules"):
            if store in d and name in d[store]:
                return d[store][name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __setattr__(self, name, value):
        d = self.__dict__

        def remove_from(*stores):
            for s in stores:
                if name in s:
                    if s is d.get("_buffers"):
                        d["_non_persistent_buffers_set"].discard(name)
                    del s[name]

        params = d.get("_parameters")
        if isinstance(value, Parameter):
            if params is None:
                raise AttributeError("cannot assign parameters before Module.__init__() call")
            remove_from(d, d["_buffers"], d["_modules"])
            self.register_parameter(name, value)
            return
        if params is not None and name in params:
            if value is not None:
                raise TypeError(f"cannot assign '{type(value).__name__}' as parameter '{name}' "
                                f"(torch.nn.Parameter or None expected)")
            self.register_parameter(name, value)
            return
        modules = d.get("_modules")
        if isinstance(value, Module):
            if modules is None:
                raise AttributeError("cannot assign module before Module.__init__() call")
            remove_from(d, d["_parameters"], d["_buffers"])
            modules[name] = value
            return
        if modules is not None and name in modules:
            if value is not None:
                raise TypeError(f"cannot assign '{type(value).__name__}' as child module "
                                f"'{name}' (torch.nn.Module or None expected)")
            modules[name] = value
            return
        buffers = d.get("_buffers")
        if isinstance(value, Buffer):
            if buffers is None:
                raise AttributeError("cannot assign buffer before Module.__init__() call")
            remove_from(d, d["_parameters"], d["_modules"])
            self.register_buffer(name, Tensor(value._data), value.persistent)
            return
        if buffers is not None and name in buffers:
            if value is not None and not isinstance(value, Tensor):
                raise TypeError(f"cannot assign '{type(value).__name__}' as buffer '{name}' "
                                f"(torch.Tensor or None expected)")
            buffers[name] = value
            return
        object.__setattr__(self, name, value)

    def __delattr__(self, name):
        d = self.__dict__
        if name in d.get("_parameters", ()):
            del d["_parameters"][name]
        elif name in d.get("_buffers", ()):
            del d["_buffers"][name]
            d["_non_persistent_buffers_set"].discard(name)
        elif name in d.get("_modules", ()):
            del d["_modules"][name]
        else:
            object.__delattr__(self, name)

    def __dir__(self):
        keys = list(super().__dir__()) + list(self._parameters) + list(self._modules) + \
            list(self._buffers)
        return sorted(k for k in set(keys) if not k[0].isdigit())

    def __setstate__(self, state):
        self.__dict__.update(state)

    # --- traversal ---------------------------------------------------------------------
    def _named_members(self, get_members, prefix="", recurse=True, remove_duplicate=True):
        memo = set()
        modules = self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate) \
            if recurse else [(prefix, self)]
        for module_prefix, module in modules:
            for k, v in get_members(module):
                if v is None or (remove_duplicate and id(v) in memo):
                    continue
                if remove_duplicate:
                    memo.add(id(v))
                yield (module_prefix + ("." if module_prefix else "") + k, v)

    def parameters(self, recurse=True):
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_parameters(self, prefix="", recurse=True, remove_duplicate=True):
        yield from self._named_members(lambda m: m._parameters.items(), prefix, recurse,
                                       remove_duplicate)

    def buffers(self, recurse=True):
        for _, b in self.named_buffers(recurse=recurse):
            yield b

    def named_buffers(self, prefix="", recurse=True, remove_duplicate=True):
        yield from self._named_members(lambda m: m._buffers.items(), prefix, recurse,
                                       remove_duplicate)

    def children(self):
        for _, m in self.named_children():
            yield m

    def named_children(self):
        memo = set()
        for name, m in self._modules.items():
            if m is not None and id(m) not in memo:
                memo.add(id(m))
                yield name, m

    def modules(self):
        for _, m in self.named_modules():
            yield m

    def named_modules(self, memo=None, prefix="", remove_duplicate=True):
        if memo is None:
            memo = set()
        if id(self) in memo and remove_duplicate:
            return
        if remove_duplicate:
            memo.add(id(self))
        yield prefix, self
        for name, m in self._modules.items():
            if m is None:
                continue
            sub = prefix + ("." if prefix else "") + name
            yield from m.named_modules(memo, sub, remove_duplicate)

    # --- modes -------------------------------------------------------------------------
    def train(self, mode=True):
        if not isinstance(mode, bool):
            raise ValueError("training mode is expected to be boolean")
        self.training = mode
        for m in self.children():
            m.train(mode)
        return self

    def eval(self):
        return self.train(False)

    def requires_grad_(self, requires_grad=True):
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def zero_grad(self, set_to_none=True):
        for p in self.parameters():
            if p._grad is not None:
                if set_to_none:
                    p._grad = None
                else:
                    g = p._grad
                    if g.grad_fn is not None:
                        g.detach_()
                    else:
                        g.requires_grad_(False)
                    g.zero_()

    # --- conversions -------------------------------------------------------------------
    def apply(self, fn):
        for m in self.children():
            m.apply(fn)
        fn(self)
        return self

    def _apply(self, fn, float_only=False):
        """Replace every parameter's and buffer's data by fn(data), keeping the
        Parameter objects (as torch's module.to does)."""
        for m in self.modules():
            for store in (m._parameters, m._buffers):
                for t in store.values():
                    if t is None or (float_only and t.dtype.kind not in "fc"):
                        continue
                    t._data = fn(t._data)
                    if t._grad is not None:
                        t._grad._data = fn(t._grad._data)
        return self

    def to(self, *args, **kwargs):
        dtype = kwargs.pop("dtype", None)
        dev = kwargs.pop("device", None)
        kwargs.pop("non_blocking", None)
        kwargs.pop("memory_format", None)
        if kwargs:
            raise TypeError(f"to() got unexpected keyword arguments {sorted(kwargs)}")
        for a in args:
            if isinstance(a, Tensor):
                dtype, dev = a.dtype, a.device
            elif isinstance(a, (np.dtype, type)) or (isinstance(a, str) and
                                                     a.split(":")[0] not in ("cpu", "cuda")):
                dtype = a
            else:
                dev = a
        if dtype is not None:
            dt = np.dtype(dtype)
            if dt.kind not in "fc":
                raise TypeError(f"nn.Module.to only accepts floating point or complex dtypes, "
                                f"but got desired dtype={dt}")
            self._apply(lambda a: a.astype(dt, copy=False), float_only=True)
        if dev is not None:
            from tracegrad.eager.device import device as _device, _xp_for
            d = _device(dev)
            if d.type == "cuda":
                xp = _xp_for(d)
                self._apply(lambda a: xp.asarray(a))
            else:
                from tracegrad.eager.device import _to_host
                self._apply(lambda a: np.asarray(_to_host(a)))
        return self

    def double(self):
        return self.to(np.float64)

    def float(self):
        return self.to(np.float32)

    def half(self):
        return self.to(np.float16)

    def type(self, dst_type):
        return self.to(dst_type)

    def cpu(self):
        return self.to("cpu")

    def cuda(self, device=None):
        return self.to("cuda" if device is None else device)

    # --- state dict --------------------------------------------------------------------
    def _save_to_state_dict(self, destination, prefix, keep_vars):
        for name, p in self._parameters.items():
            if p is not None:
                destination[prefix + name] = p if keep_vars else p.detach()
        for name, b in self._buffers.items():
            if b is not None and name not in self._non_persistent_buffers_set:
                destination[prefix + name] = b if keep_vars else b.detach()

    def state_dict(self, *args, destination=None, prefix="", keep_vars=False):
        if args:   # the deprecated positional form (destination, prefix, keep_vars)
            destination = args[0]
            if len(args) > 1:
                prefix = args[1]
            if len(args) > 2:
                keep_vars = args[2]
        if destination is None:
            destination = OrderedDict()
        self._save_to_state_dict(destination, prefix, keep_vars)
        for name, m in self._modules.items():
            if m is not None:
                m.state_dict(destination=destination, prefix=prefix + name + ".",
                             keep_vars=keep_vars)
        for hook in self._state_dict_hooks.values():
            res = hook(self, destination, prefix, {})
            if res is not None:
                destination = res
        return destination

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        persistent = {k: v for k, v in self._buffers.items()
                      if k not in self._non_persistent_buffers_set}
        local = {**{k: v for k, v in self._parameters.items() if v is not None},
                 **{k: v for k, v in persistent.items() if v is not None}}
        for name, param in local.items():
            key = prefix + name
            if key not in state_dict:
                if strict:
                    missing_keys.append(key)
                continue
            src = state_dict[key]
            if not isinstance(src, Tensor):
                try:
                    src_arr = np.asarray(src)
                except Exception as exc:   # noqa: BLE001 -- reported as torch reports it
                    error_msgs.append(f'While copying the parameter named "{key}", expected '
                                      f'torch.Tensor or Tensor-like object from checkpoint but '
                                      f'received {type(src)} ({exc})')
                    continue
            else:
                src_arr = src._data
            src_arr = _host_or_same(src_arr, param._data)
            if tuple(src_arr.shape) != tuple(param.shape):
                error_msgs.append(f"size mismatch for {key}: copying a param with shape "
                                  f"{_torch_size(src_arr.shape)} from checkpoint, the shape in "
                                  f"current model is {_torch_size(param.shape)}.")
                continue
            with no_grad():
                if local_metadata.get("assign_to_params_buffers"):
                    param._data = src_arr        # assign=True: the state dict's memory
                else:
                    param._data[...] = src_arr
                param._vbox[0] += 1
        if strict:
            for key in state_dict:
                if key.startswith(prefix):
                    input_name = key[len(prefix):].split(".", 1)
                    if input_name[0] not in self._modules and input_name[0] not in local:
                        unexpected_keys.append(key)
                    elif len(input_name) == 1 and input_name[0] in self._modules:
                        unexpected_keys.append(key)

    def load_state_dict(self, state_dict, strict=True, assign=False):
        if not hasattr(state_dict, "keys") or not hasattr(state_dict, "__getitem__"):
            raise TypeError(f"Expected state_dict to be dict-like, got {type(state_dict)}.")
        missing, unexpected, errors = [], [], []

        def load(module, prefix=""):
            module._load_from_state_dict(state_dict, prefix,
                                         {"assign_to_params_buffers": assign}, True, missing,
                                         unexpected, errors)
            for name, child in module._modules.items():
                if child is not None:
                    load(child, prefix + name + ".")

        load(self)
        if strict:
            if unexpected:
                errors.insert(0, "Unexpected key(s) in state_dict: {}. ".format(
                    ", ".join(f'"{k}"' for k in unexpected)))
            if missing:
                errors.insert(0, "Missing key(s) in state_dict: {}. ".format(
                    ", ".join(f'"{k}"' for k in missing)))
        if errors:
            raise RuntimeError("Error(s) in loading state_dict for {}:\n\t{}".format(
                type(self).__name__, "\n\t".join(errors)))
        return _IncompatibleKeys(missing, unexpected)

    # --- printing ----------------------------------------------------------------------
    def extra_repr(self):
        return ""

    def _get_name(self):
        return type(self).__name__

    def __repr__(self):
        extra = self.extra_repr()
        extra_lines = extra.split("\n") if extra else []
        child_lines = []
        for key, module in self._modules.items():
            mod_str = _addindent(repr(module), 2)
            child_lines.append("(" + key + "): " + mod_str)
        lines = extra_lines + child_lines
        main = self._get_name() + "("
        if lines:
            if len(extra_lines) == 1 and not child_lines:
                main += extra_lines[0]
            else:
                main += "\n  " + "\n  ".join(lines) + "\n"
        return main + ")"


class _CallWithBufferWrites(Module):
    """The function ``tg.compile(module)`` compiles: the module's call, which
    returns with its output the new values of the buffers its layers update
    in place (BatchNorm's running statistics in training mode), by name."""

    def __init__(self, mod):
        super().__init__()
        self.mod = mod

    def forward(self, *args, **kwargs):
        with F._buffer_writes() as writes:
            out = self.mod._call_impl(*args, **kwargs)   # (not a Module.compile()d call again)
        if not writes:
            return out, {}
        names = {id(b): n for n, b in self.mod.named_buffers(remove_duplicate=False)}
        new = {}
        for key, (buf, value) in writes.items():
            if key not in names:
                raise RuntimeError(
                    f"a compiled {type(self.mod).__name__} updates a running statistic in place "
                    f"that is not one of its buffers (a Tensor of shape {list(buf.shape)}): "
                    f"register it with register_buffer, or pass running_mean=None, "
                    f"running_var=None to F.batch_norm")
            new[names[key]] = value
        return out, new


class OptimizedModule(Module):
    """What ``tg.compile(module)`` returns, as ``torch.compile(module)`` does: a
    Module around the original (``_orig_mod``; parameters, buffers and
    ``state_dict`` through it, the state_dict's keys prefixed ``_orig_mod.``)
    whose call is the compiled call of the original's.  The compiled code reads
    the parameters and buffers at call time; the buffers the call updates in
    place (BatchNorm's running statistics and num_batches_tracked in training
    mode) are extra outputs of the compiled call, written into the buffers
    after it (torch.compile's functionalization does the same)."""

    _opt_mod_attributes = {"_orig_mod", "_compiled_call"}

    def __init__(self, mod, **options):
        if not isinstance(mod, Module):
            raise TypeError(f"OptimizedModule expects an nn.Module, got {type(mod).__name__}")
        super().__init__()
        self._modules["_orig_mod"] = mod
        self.__dict__["_compiled_call"] = api.Compiled(_CallWithBufferWrites(mod), "forward",
                                                       **options)

    @property
    def training(self):
        return self._orig_mod.training

    @training.setter
    def training(self, value):
        self._orig_mod.training = value

    def __getattr__(self, name):
        if name == "_orig_mod":
            return self.__dict__["_modules"]["_orig_mod"]
        return getattr(self._orig_mod, name)

    def __setattr__(self, name, value):
        if hasattr(type(self), name) or name in OptimizedModule._opt_mod_attributes:
            return super().__setattr__(name, value)
        return setattr(self._orig_mod, name, value)

    def __delattr__(self, name):
        if hasattr(type(self), name) or name in OptimizedModule._opt_mod_attributes:
            return super().__delattr__(name)
        return delattr(self._orig_mod, name)

    def __len__(self):
        try:
            return len(self._orig_mod)
        except TypeError:
            raise TypeError(f"{type(self._orig_mod).__name__} does not support len()") from None

    def __dir__(self):
        own = self._orig_mod.__dir__()
        return own + [a for a in super().__dir__() if a not in own]

    def forward(self, *args, **kwargs):
        if is_tracing():
            # called inside another transform (tg.grad(compiled_model)): its
            # ops join that trace, which cannot write buffers back
            return self._orig_mod._call_impl(*args, **kwargs)
        out, new = self._compiled_call(*args, **kwargs)
        if new:
            buffers = dict(self._orig_mod.named_buffers(remove_duplicate=False))
            written, nodes = [], {}
            for name, value in new.items():
                buf = buffers[name]
                buf._data[...] = value._data if isinstance(value, Tensor) else value
                buf._vbox[0] += 1
                written.append(buf)
                node = getattr(value, "grad_fn", None)
                if isinstance(node, CompiledBackward):   # the call is on the tape
                    nodes[id(node)] = node
            for node in nodes.values():
                node.written_by_the_call(written)
        return out


def _torch_size(shape):
    return "torch.Size([" + ", ".join(str(int(d)) for d in shape) + "])"


def _host_or_same(src, like):
    """src as an array of the module (numpy or cupy) of ``like``."""
    if type(src) is type(like):
        return src
    from tracegrad.ops import primitives
    from tracegrad.eager.device import _to_host
    host = np.asarray(_to_host(src))
    return primitives.array_module(like).asarray(host) if type(like) is not np.ndarray else host
