"""The tape's nodes: ``PrimNode``, the backward of one primitive
application (named, and with ``_saved_*`` attributes, as torch names its
nodes), and ``SavedTensor`` (saved values and their pack/unpack hooks).
"""
from __future__ import annotations

import weakref

import numpy as np

from tracegrad.eager.device import _ndarray
from tracegrad.eager.tensor import Tensor
from tracegrad.ops import primitives, _define
from tracegrad.eager import graph as _graph
from tracegrad.eager.grad_mode import state as _mode
from tracegrad.eager.graph import FREED_MSG, Node, _seq
from tracegrad.ops.base import unbroadcast, vjp_apply
from tracegrad.ops.primitives import Aval

_avals = {}

# Two-operand rows whose backward reads operand i only to give the other
# operand its gradient (d(a*b)/db = a): operand i need not stay unchanged
# when the other operand takes no gradient.
_READ_FOR_THE_OTHER = {"mul": (0, 1), "matmul": (0, 1), "div": (0,)}
# rows whose backward reads only the shapes of these operands (the written
# array and the value of an assignment): changing them in place afterwards is
# no error (c[::2] *= 2 stores a view of c into c)
_SHAPES_ONLY = {"setitem": (0, 1), "dynamic_update_slice": (0, 1)}

# Operand positions where torch's node has no edge at all (not even
# (None, 0)) when a Python number stands there, because torch's overload
# takes a Scalar there: pow(Tensor, Scalar) and pow(Scalar, Tensor),
# rsub(Tensor, Scalar) (``2 - b``), clamp(Tensor, Scalar?, Scalar?) (both
# bounds numbers; a Tensor bound takes the Tensor overload, which keeps all
# three), remainder/fmod(Tensor, Scalar).  A number in a Tensor position
# (``b * 2``, ``b - 2``: a wrapped number) keeps its (None, 0).  where's
# condition, a bool tensor, never has an edge.
_SCALAR_SLOTS = {"pow": (0, 1), "sub": (0,), "clip": (1, 2), "remainder": (1,), "fmod": (1,),
                 "where": (0,)}


def _torch_slots(name, args):
    """The operand positions that keep an edge in torch's next_functions,
    or None when all do."""
    drop = _SCALAR_SLOTS[name]
    if name == "where":
        return tuple(range(1, len(args)))
    if name == "clip" and any(isinstance(args[i], Tensor) for i in drop):
        return None
    keep = tuple(i for i in range(len(args)) if i not in drop or isinstance(args[i], Tensor))
    return keep if len(keep) < len(args) else None


# id(version box) -> [the box, [(weak reference to a node, what it saved:
# an input's position or "out")]]: NumPy-face values nodes saved at their
# current version.  NumPy code writes into arrays an earlier op read; before
# the write, keep_saved_before_write gives those nodes a copy (torch's rule,
# an error at backward, stays for the torch face).
_SAVED_BY_VBOX = {}
_NOTED = [0]


def _note_saved(vbox, node, slot):
    entry = _SAVED_BY_VBOX.get(id(vbox))
    if entry is None or entry[0] is not vbox:
        entry = _SAVED_BY_VBOX[id(vbox)] = [vbox, []]
    entry[1].append((weakref.ref(node), slot))
    _NOTED[0] += 1
    if _NOTED[0] % 4096 == 0:      # forget the boxes whose nodes are all gone
        for k in [k for k, e in _SAVED_BY_VBOX.items()
                  if all(r() is None for r, _ in e[1])]:
            del _SAVED_BY_VBOX[k]


def keep_saved_before_write(vbox):
    """An in-place write is about to change the values sharing ``vbox``:
    the nodes that saved them at this version keep copies instead."""
    entry = _SAVED_BY_VBOX.pop(id(vbox), None)
    if entry is None or entry[0] is not vbox:
        return
    for ref, slot in entry[1]:
        node = ref()
        if node is None or node.freed:
            continue
        if slot == "out":
            if node.out_vbox is vbox and node.out_ver == vbox[0]:
                node.out_saved = node.out_saved.copy()
                node.out_vbox = [node.out_ver]   # its own box: no later write reaches it
        elif node.saved is not None:
            a, v = node.saved[slot]
            if v is not None and v == vbox[0] and type(a) is not _Packed and a._vbox is vbox:
                node.saved[slot] = (_snapshot(a), None)


def _snapshot(a):
    """``a`` as it is now: its data copied, its place on the tape kept."""
    t = type(a)(a._data.copy(), a._requires_grad, a.grad_fn, a._output_nr)
    return t


# id(base) -> (weak reference to the base, weak references to the views
# taken of it with a chain): tracegrad.eager.bind notes them; an in-place
# update gives the others new histories (tracegrad.eager.torch_methods)
LIVE_VIEWS = {}


def _meta(a):
    """Shape and dtype of an operand (an Aval, shared between equal ones);
    Python scalars stay themselves."""
    if isinstance(a, (Tensor, _ndarray)):
        key = (a.shape, a.dtype)
        m = _avals.get(key)
        if m is None:
            if len(_avals) > 4096:
                _avals.clear()
            m = _avals[key] = Aval(a.shape, a.dtype)
        return m
    return a


class PrimNode(Node):
    """Backward node of one primitive application.

    It keeps only what the primitive's vjp rule reads (``save_inputs`` /
    ``save_out``), with the version of each saved tensor, so a later
    in-place change is caught when backward reads it."""
    __slots__ = ("prim", "attrs", "saved", "out_saved", "out_vbox", "out_ver", "in_meta",
                 "freed", "_nout", "_edges", "_keep")

    def __init__(self, prim, attrs, args, out_data, next_functions, out_vbox=None):
        # Node.__init__, inlined: this runs once per recorded op.
        # _edges: one per operand (what the rules index); next_functions:
        # torch's, without the slots of numbers in Scalar positions (_keep:
        # the operand positions it keeps, None for all)
        self.next_functions = self._edges = next_functions
        self._keep = None
        if prim.name in _SCALAR_SLOTS:
            keep = self._keep = _torch_slots(prim.name, args)
            if keep is not None:
                self.next_functions = tuple(next_functions[i] for i in keep)
        self.seq = next(_seq)
        self._pre_hooks = self._post_hooks = self._tensor_pre_hooks = None
        self._metadata = None
        self.output_meta = None
        self.anomaly_trace = None
        if _mode.anomaly:
            import traceback
            self.anomaly_trace = "".join(traceback.format_stack()[:-2])
        self.prim = prim
        self.attrs = attrs
        self.freed = False
        n = prim.n_out
        self._nout = n if type(n) is int else n(**attrs)
        if prim.save_inputs:
            hooks = _graph._saved_hooks.stack
            if hooks:
                pack, unpack = hooks[-1]
                self.saved = [(_Packed(pack(a), unpack), None) if isinstance(a, Tensor)
                              else (a, None) for a in args]
                self.in_meta = [_meta(a) for a in args]
            else:
                self.saved = saved = [(a, a._vbox[0]) if type(a) is Tensor or isinstance(a, Tensor)
                                      else (a, None) for a in args]
                if prim.view:
                    # a view's backward is linear in its operand and reads only
                    # its shape: an in-place change of the base is no error
                    saved[0] = (saved[0][0], None)
                for i in _SHAPES_ONLY.get(prim.name, ()):
                    saved[i] = (saved[i][0], None)
                for i, (a, v) in enumerate(saved):
                    if v is not None and a._face == "numpy":
                        # NumPy code writes into arrays an earlier op read
                        # (out[i] = f(out[i - 1])): a write keeps a copy first
                        _note_saved(a._vbox, self, i)
                reads = _READ_FOR_THE_OTHER.get(prim.name)
                if reads is not None and len(args) == 2:
                    # x * 2: the backward reads x only for the gradient of the
                    # other operand, which takes none; as torch, changing x
                    # in place afterwards is no error (y[0] = 2 * y[0])
                    for i in reads:
                        other = args[1 - i]
                        if not (isinstance(other, Tensor) and other._requires_grad):
                            saved[i] = (saved[i][0], None)
                self.in_meta = None  # the saved inputs carry their shapes and dtypes
        else:
            self.saved = None
            meta = []
            for a in args:
                if isinstance(a, Tensor):
                    d = a._data
                    m = _avals.get((d.shape, d.dtype))
                    meta.append(m if m is not None else _meta(d))
                else:
                    meta.append(_meta(a))
            self.in_meta = meta
        if prim.save_out:
            self.out_saved = out_data
            self.out_vbox = out_vbox
            self.out_ver = out_vbox[0] if type(out_vbox) is list else (
                None if out_vbox is None else tuple(v[0] for v in out_vbox))
            if type(out_vbox) is list and type(out_data) is _ndarray and \
                    any(getattr(a, "_face", None) == "numpy" for a in args):
                _note_saved(out_vbox, self, "out")
        else:
            self.out_saved = None
            self.out_vbox = None

    # torch's view of the node (name(), _saved_*, _raw_saved_*): the node
    # takes the subclass named after torch's node the first time someone
    # looks, so type(node).__name__ reads as in torch (torchviz prints it)
    # and recording stays as cheap as before.
    _torch_name = None
    _torch_attrs = None

    def name(self):
        n = type(self)._torch_name
        return n if n is not None else _specialize(self)._torch_name

    # (``_saved_<name>`` and ``_raw_saved_<name>`` are properties, installed
    # below from _SAVED_NAMES: a __getattr__ would slow every attribute read
    # of every node.)
    @property
    def variable(self):
        # only AccumulateGrad has one; asking is how torchviz tells them
        # apart, so this is where a node takes torch's class name before
        # torchviz prints type(node).__name__
        cls = type(self)
        if cls._torch_name is None:
            cls = _specialize(self)
        raise AttributeError(f"'{cls._torch_name}' object has no attribute 'variable'")

    def __dir__(self):
        cls = type(self)
        if cls._torch_name is None:
            cls = _specialize(self)
        names = {n for n in object.__dir__(self)
                 if not n.startswith("_saved_") and not n.startswith("_raw_saved_")}
        for k, spec in cls._torch_attrs.items():
            names.add("_saved_" + k)
            if spec[0] in _TENSOR_SPECS:
                names.add("_raw_saved_" + k)
        return sorted(names)

    def _metas(self):
        """Shape/dtype (or the number itself) of each operand, or None once freed."""
        if self.in_meta is not None:
            return self.in_meta
        if self.saved is None:
            return None
        return [_meta(a) for a, _ in self.saved]

    def num_outputs(self):
        return self._nout

    def release(self):
        # A node that saved nothing can run again (as in torch); one that
        # saved tensors cannot once they are freed.
        if self.saved is not None or self.out_saved is not None:
            if self.in_meta is None and self.prim.name in _NAME_NEEDS_META \
                    and self.saved is not None and type(self)._torch_name is None:
                self.in_meta = self._metas()   # torch's name of the node depends on them
            self.freed = True
            self.saved = None
            self.out_saved = None

    # (no ``saved_tensors``: torch's built-in nodes have none, only custom
    # Functions' do, and torchviz draws a node that has them as a Function's)
    def _inputs(self):
        if self.freed:
            raise RuntimeError(FREED_MSG)
        saved = self.saved
        if saved is None:
            return self.in_meta
        out = []
        for a, v in saved:
            if v is not None and a._vbox[0] != v:
                self._in_modified(a, v)
            out.append(a.unpack() if type(a) is _Packed else a)
        return out

    def _out(self, create_graph):
        if self.freed:
            raise RuntimeError(FREED_MSG)
        o = self.out_saved
        if o is None:
            return None
        if type(o) is _Packed:   # grad_fn._raw_saved_result.register_hooks(...)
            return o.unpack()
        vb = self.out_vbox
        if type(vb) is list:
            if vb[0] != self.out_ver:
                self._out_modified(0, o, vb[0], self.out_ver)
        elif vb is not None:
            for i, (b, v) in enumerate(zip(vb, self.out_ver)):
                if b[0] != v:
                    self._out_modified(i, o[i], b[0], v)
        if isinstance(o, tuple):
            return tuple(Tensor(x, create_graph, self if create_graph else None, i)
                         for i, x in enumerate(o))
        return Tensor(o, create_graph, self if create_graph else None, 0)

    def _out_modified(self, i, arr, now, expected):
        raise RuntimeError(
            f"one of the variables needed for gradient computation has been modified by an "
            f"inplace operation: [tensor of shape {list(arr.shape)} and dtype {arr.dtype}], "
            f"which is output {i} of {self.name()}, is at version {now}; expected version "
            f"{expected} instead. Hint: the backward of {self.prim.name} reads its result; "
            f"compute it out of place or clone() the result before modifying it.")

    def apply(self, grad_outputs, create_graph):
        return self._apply(grad_outputs, create_graph, None)

    def _apply(self, grad_outputs, create_graph, needs):
        """Gradients for the inputs (None where ``needs`` says not needed or
        the input does not require grad), each in its input's shape and dtype."""
        if self.freed:
            raise RuntimeError(FREED_MSG)
        prim = self.prim
        saved = self.saved
        if saved is None:
            inputs = metas = self.in_meta
        else:
            inputs = []
            for a, v in saved:
                if v is not None and a._vbox[0] != v:
                    self._in_modified(a, v)
                inputs.append(a.unpack() if type(a) is _Packed else a)
            metas = self.in_meta or inputs
        if create_graph:
            out = self._out(True) if self.out_saved is not None else None
            g = grad_outputs[0] if self._nout == 1 and prim.n_out == 1 else tuple(grad_outputs)
        else:
            # Nothing is recorded: the rule runs on the plain arrays ("raw
            # mode", where ops on arrays return arrays), skipping all Tensor
            # bookkeeping; only the results are wrapped.
            out = self.out_saved
            if out is not None:  # the in-place check of a saved output
                if type(out) is _Packed:
                    out = _asarray_like(out.unpack())
                vb = self.out_vbox
                if type(vb) is list:
                    if vb[0] != self.out_ver:
                        self._out_modified(0, out, vb[0], self.out_ver)
                elif vb is not None:
                    self._out(False)
            if self._nout == 1 and prim.n_out == 1:
                g = grad_outputs[0]._data
            else:
                g = tuple(None if x is None else x._data for x in grad_outputs)
            if saved is not None:
                inputs = [a._data if isinstance(a, Tensor) else a for a in inputs]
                if metas is not self.in_meta:
                    metas = inputs
        rule = prim.vjp
        attrs = self.attrs
        nfs = self._edges
        keep = self._keep
        if keep is not None and needs is not None:   # needs: per torch slot; here per operand
            full = [False] * len(nfs)
            for j, i in enumerate(keep):
                full[i] = needs[j]
            needs = full
        raw_before = _mode.raw
        _mode.raw = not create_graph
        try:
            if type(rule) is not tuple:
                if rule is None:
                    return vjp_apply(prim, attrs, g, out, inputs, metas, [])  # raises
                cts = list(rule(g, out, *inputs, **attrs))
            else:
                cts = [None] * len(nfs)
                nr = len(rule)
                for i, nf in enumerate(nfs):
                    if nf[0] is None or i >= nr or (needs is not None and not needs[i]):
                        continue
                    r = rule[i]
                    if r is not None:
                        cts[i] = r(g, out, *inputs, **attrs)
            for i, ct in enumerate(cts):
                if ct is None:
                    continue
                if nfs[i][0] is None or (needs is not None and not needs[i]):
                    cts[i] = None
                    continue
                m = metas[i]
                if ct.shape != m.shape or ct.dtype != m.dtype:
                    ct = cts[i] = unbroadcast(ct, tuple(m.shape), m.dtype)
                if not create_graph and type(ct) is not Tensor:
                    cts[i] = Tensor(ct if type(ct) is _ndarray else _asarray_like(ct))
        finally:
            _mode.raw = raw_before
        return cts if keep is None else [cts[i] for i in keep]

    def _in_modified(self, a, v):
        raise RuntimeError(
            f"one of the variables needed for gradient computation has been modified by "
            f"an inplace operation: [tensor of shape {list(a.shape)} and dtype {a.dtype}], "
            f"which is an input of {self.name()}, is at version {a._vbox[0]}; expected "
            f"version {v} instead. Hint: the backward of {self.prim.name} reads this "
            f"value; compute it out of place (e.g. x = x + y instead of x += y) or "
            + ("copy it (y = y.copy()) before modifying it (with compile=False tracegrad "
               "records NumPy's in-place updates as torch does; compiled code has no "
               "such limit)." if a._face == "numpy" else "clone() it before modifying it."))


_TENSOR_SPECS = ("in", "in_if", "out")


# Nodes whose torch name depends on their operands' shapes keep those (as
# Avals) when backward frees them.  Only matmul (Mm/Mv/Dot/Bmm): its own
# cost dwarfs this, while pow, as common and cheap, tells PowBackward0 from
# PowBackward1 after freeing by whether the exponent takes a gradient.
_NAME_NEEDS_META = frozenset(("matmul",))


def _is_tensor_meta(m):
    return isinstance(m, Aval)


def _generic_node(node, metas):
    spec = {}
    if node.prim.save_inputs:
        tensors = [i for i, m in enumerate(metas or ()) if _is_tensor_meta(m)]
        for k, i in zip(("self", "other"), tensors[:2]):
            spec[k] = ("in", i)
    if node.prim.save_out and node._nout == 1 and node.prim.n_out == 1:
        spec["result"] = ("out",)
    return node.prim.backward_name, spec


def _matmul_node(node, m):
    ra, rb = len(m[0].shape), len(m[1].shape)
    if ra == 2 and rb == 2:
        return "MmBackward0", {"self": ("in", 0), "mat2": ("in", 1), "self_sym_sizes": ("sizes", 0),
                               "self_sym_strides": ("strides", 0),
                               "mat2_sym_sizes": ("sizes", 1), "mat2_sym_strides": ("strides", 1)}
    if ra == 2 and rb == 1:
        return "MvBackward0", {"self": ("in", 0), "vec": ("in", 1)}
    if ra == 1 and rb == 1:
        return "DotBackward0", {"self": ("in", 0), "tensor": ("in", 1)}
    if ra == 3 and rb == 3:
        return "BmmBackward0", {"self": ("in", 0), "mat2": ("in", 1)}
    return "MatmulBackward0", {"self": ("in", 0), "other": ("in", 1)}


def _pow_node(node, m):
    if m is None:   # freed before anyone looked
        return ("PowBackward1", {"self": ("in", 0), "exponent": ("in", 1), "result": ("out",)}) \
            if node._edges[1][0] is not None else \
            ("PowBackward0", {"self": ("in", 0), "exponent": ("num", 1)})
    if not _is_tensor_meta(m[0]):   # 2 ** b: torch's pow(Scalar self, Tensor exponent)
        return "PowBackward2", {"self": ("num", 0), "exponent": ("in", 1), "result": ("out",)}
    if _is_tensor_meta(m[1]):
        return "PowBackward1", {"self": ("in", 0), "exponent": ("in", 1), "result": ("out",)}
    return "PowBackward0", {"self": ("in", 0), "exponent": ("num", 1)}


def _sum_node(node, m):
    axis, keep = node.attrs["axis"], node.attrs["keepdims"]
    if not keep and tuple(axis) == tuple(range(len(m[0].shape))):
        return "SumBackward0", {"self_sym_sizes": ("sizes", 0)}
    return "SumBackward1", {"dim": ("const", tuple(axis)), "keepdim": ("const", bool(keep)),
                            "self_sym_sizes": ("sizes", 0)}


def _transpose_node(node, m):
    axes = tuple(node.attrs["axes"])
    moved = [i for i, a in enumerate(axes) if a != i]
    if len(moved) == 2:
        return "TransposeBackward0", {"dim0": ("const", moved[0]), "dim1": ("const", moved[1])}
    return "PermuteBackward0", {"dims": ("const", axes)}


def _getitem_node(node, m):
    index = node.attrs["index"]
    kinds = {k[0] for k in index}
    ints = [d for d, k in enumerate(index) if k[0] == "i"]
    if kinds <= {"i", "s"} and ints:
        # x[0], x[:, 0], x[1:, 0], x[0, 1]: torch's last view op is a select
        # (the views before it are part of this one node); its dim counts the
        # dimensions the earlier selects removed
        d = ints[-1]
        return "SelectBackward0", {"dim": ("const", d - (len(ints) - 1)),
                                   "index": ("const", index[d][1]),
                                   "self_sym_sizes": ("sizes", 0)}
    cut = [d for d, k in enumerate(index) if k[0] == "s" and k[1:] != (None, None, None)]
    if kinds <= {"s"} and len(cut) == 1:
        # x[:, 1:]: one slice along one dimension, with torch's saved values
        # (an open end is INT64_MAX, as torch stores it)
        d = cut[0]
        start, stop, step = index[d][1:]
        return "SliceBackward0", {"dim": ("const", d), "start": ("const", start or 0),
                                  "end": ("const", (1 << 63) - 1 if stop is None else stop),
                                  "step": ("const", step or 1), "self_sym_sizes": ("sizes", 0)}
    if kinds <= {"s", "e", "n"}:
        return "SliceBackward0", {"self_sym_sizes": ("sizes", 0)}
    return "IndexBackward0", {"self_sym_sizes": ("sizes", 0)}


_TORCH_NODES = {
    "add": lambda n, m: ("AddBackward0", {"alpha": ("const", 1)}),
    "sub": lambda n, m: ("RsubBackward1", {"alpha": ("const", 1)}) if n._keep is not None
    else ("SubBackward0", {"alpha": ("const", 1)}),
    "clip": lambda n, m: ("ClampBackward1", {"self": ("in", 0)}) if n._keep is not None
    else ("ClampBackward0", {"self": ("in", 0)}),
    "mul": lambda n, m: ("MulBackward0", {"other": ("in_if", 1, 0), "self": ("in_if", 0, 1)}),
    "div": lambda n, m: ("DivBackward0", {"other": ("in", 1), "self": ("in_if", 0, 1)}),
    "neg": lambda n, m: ("NegBackward0", {}),
    "arctan2": lambda n, m: ("Atan2Backward0", {"self": ("in", 0), "other": ("in", 1)}),
    "concatenate": lambda n, m: ("CatBackward0", {"dim": ("const", n.attrs["axis"])}),
    "exp": lambda n, m: ("ExpBackward0", {"result": ("out",)}),
    "tanh": lambda n, m: ("TanhBackward0", {"result": ("out",)}),
    "sigmoid": lambda n, m: ("SigmoidBackward0", {"result": ("out",)}),
    "sqrt": lambda n, m: ("SqrtBackward0", {"result": ("out",)}),
    "relu": lambda n, m: ("ReluBackward0", {"result": ("out",)}),
    "log": lambda n, m: ("LogBackward0", {"self": ("in", 0)}),
    "sin": lambda n, m: ("SinBackward0", {"self": ("in", 0)}),
    "cos": lambda n, m: ("CosBackward0", {"self": ("in", 0)}),
    "abs": lambda n, m: ("AbsBackward0", {"self": ("in", 0)}),
    "where": lambda n, m: ("WhereBackward0", {"condition": ("in", 0)}),
    "clone": lambda n, m: ("CloneBackward0", {}),
    "astype": lambda n, m: ("ToCopyBackward0", {}),
    "reshape": lambda n, m: ("ViewBackward0", {"self_sym_sizes": ("sizes", 0)}),
    "broadcast_to": lambda n, m: ("ExpandBackward0", {"self_sym_sizes": ("sizes", 0)}),
    "matmul": _matmul_node,
    "pow": _pow_node,
    "sum": _sum_node,
    "transpose": _transpose_node,
    "getitem": _getitem_node,
}


_PRIM_NODE_TYPES = {}   # torch's name -> PrimNode subclass of that name


def _specialize(node):
    """Give ``node`` the PrimNode subclass named as torch names it."""
    metas = node._metas()
    rule = _TORCH_NODES.get(node.prim.name)
    name, spec = None, None
    if rule is not None:   # most rules need no metas (they are gone once freed)
        try:
            name, spec = rule(node, metas)
        except (KeyError, IndexError, AttributeError, TypeError):
            name = None
    if name is None:
        name, spec = _generic_node(node, metas)
    cls = node.__class__ = _node_class(name, spec)
    return cls


def _node_class(name, spec):
    """The PrimNode subclass torch calls ``name``, with ``spec``'s ``_saved_*``."""
    key = (name, tuple(sorted(dict(spec).items())))
    cls = _PRIM_NODE_TYPES.get(key)
    if cls is None:
        cls = _PRIM_NODE_TYPES[key] = type(name, (PrimNode,), {
            "__slots__": (), "_torch_name": name, "_torch_attrs": dict(spec),
            "__module__": PrimNode.__module__,
            "__doc__": f"torch's {name}: a recorded primitive node (see PrimNode)."})
        PRIM_NODE_CLASSES.add(cls)
    return cls


def _name_grad_fn(value, name, spec=()):
    """ops._define.name_grad_fn for eager values: the method that made
    ``value`` names its node as torch would (``x.t()``: TBackward0)."""
    node = value.grad_fn if isinstance(value, Tensor) else None
    if isinstance(node, PrimNode):
        node.__class__ = _node_class(name, spec)
    return value


_define.name_grad_fn = _name_grad_fn


# every name a _saved_ attribute of _TORCH_NODES or _generic_node may have
_SAVED_NAMES = ("self", "other", "result", "exponent", "alpha", "mat2", "vec", "tensor",
                "self_sym_sizes", "self_sym_strides", "mat2_sym_sizes", "mat2_sym_strides",
                "dim", "keepdim", "dim0", "dim1", "dims", "index", "condition",
                "start", "end", "step")


def _saved_property(key, raw):
    attr = ("_raw_saved_" if raw else "_saved_") + key

    def get(self):
        cls = type(self)
        if cls._torch_name is None:
            cls = _specialize(self)
        spec = cls._torch_attrs.get(key)
        if spec is None or (raw and spec[0] not in _TENSOR_SPECS):
            raise AttributeError(f"'{cls._torch_name}' object has no attribute '{attr}'")
        return SavedTensor(self, spec) if raw else _saved_value(self, spec)
    get.__name__ = attr
    return property(get, doc=f"torch's {attr} (when this node has one)")


for _k in _SAVED_NAMES:
    setattr(PrimNode, "_saved_" + _k, _saved_property(_k, False))
    setattr(PrimNode, "_raw_saved_" + _k, _saved_property(_k, True))


del _k


# The engine and replay test ``type(node) in PRIM_NODE_CLASSES``.
PRIM_NODE_CLASSES = {PrimNode}


def _as_tensor_value(a):
    if isinstance(a, Tensor):
        return a
    if type(a) is _Packed:
        return a.unpack()
    return Tensor(np.asarray(a))


def _saved_value(node, spec):
    kind = spec[0]
    if kind == "const":
        return spec[1]
    if kind in ("sizes", "strides"):
        metas = node._metas()
        if metas is None:
            raise RuntimeError(FREED_MSG)
        shape = tuple(metas[spec[1]].shape)
        if kind == "sizes":
            return shape
        strides, acc = [], 1
        for d in reversed(shape):
            strides.append(acc)
            acc *= max(d, 1)
        return tuple(reversed(strides))
    if kind == "in_if" and node._edges[spec[2]][0] is None:
        return None
    if node.freed:
        raise RuntimeError(FREED_MSG)
    if kind == "out":
        out = node.out_saved
        if out is None:   # the rule reads only the inputs: the result from them
            inputs = [a._data if isinstance(a, Tensor) else a for a in node._inputs()]
            with np.errstate(all="ignore"):
                out = node.prim.impl(primitives.array_module(*inputs), *inputs, **node.attrs)
        if type(out) is _Packed:
            return out.unpack()
        return Tensor(out)
    if node.saved is None:
        return None
    inputs = node._inputs()   # checks the versions, unpacks hooked ones
    v = inputs[spec[1]]
    if kind == "num":
        return v.item() if isinstance(v, Tensor) else v
    return _as_tensor_value(v)


class SavedTensor:
    """``grad_fn._raw_saved_<name>``: one value a node saved for backward.
    ``register_hooks(pack, unpack)`` packs it now and unpacks it when
    backward reads it (torch.autograd.graph's saved-tensor hooks for one
    tensor)."""
    __slots__ = ("_node", "_spec")

    def __init__(self, node, spec):
        self._node = node
        self._spec = spec

    def register_hooks(self, pack_hook, unpack_hook):
        if not callable(pack_hook) or not callable(unpack_hook):
            raise TypeError(f"register_hooks(): pack_hook and unpack_hook must be callables, "
                            f"got {type(pack_hook).__name__} and {type(unpack_hook).__name__}")
        node, spec = self._node, self._spec
        if node.freed:
            raise RuntimeError(FREED_MSG)
        if spec[0] == "out":
            out = node.out_saved
            if type(out) is _Packed:
                raise RuntimeError(_HOOKS_TWICE)
            if out is None or type(out) is tuple:
                raise RuntimeError("Calling register_hooks on a saved tensor with value None is "
                                   "forbidden")
            node.out_saved = _Packed(_graph.call_pack_hook(pack_hook, Tensor(out)), unpack_hook)
            node.out_vbox = None
            return
        i = spec[1]
        if spec[0] == "in_if" and node._edges[spec[2]][0] is None or node.saved is None:
            raise RuntimeError("Calling register_hooks on a saved tensor with value None is "
                               "forbidden")
        a, v = node.saved[i]
        if type(a) is _Packed:
            raise RuntimeError(_HOOKS_TWICE)
        if not isinstance(a, Tensor):
            raise RuntimeError("Calling register_hooks on a saved tensor with value None is "
                               "forbidden")
        if v is not None and a._vbox[0] != v:
            node._in_modified(a, v)
        if node.in_meta is None:
            node.in_meta = node._metas()
        node.saved[i] = (_Packed(_graph.call_pack_hook(pack_hook, a), unpack_hook), None)

    def __repr__(self):
        return f"<SavedTensor of {self._node.name()}>"


_HOOKS_TWICE = ("Calling register_hooks on a saved tensor whose hooks have already been set. "
                "Hint: only one pair of hooks is allowed at a time.")


class _Packed:
    """A saved tensor packed by a saved_tensors_hooks pack hook."""
    __slots__ = ("packed", "unpack_hook")

    def __init__(self, packed, unpack_hook):
        self.packed = packed
        self.unpack_hook = unpack_hook

    def unpack(self):
        return self.unpack_hook(self.packed)


def _asarray_like(x):
    if isinstance(x, Tensor):
        return x._data
    return primitives.array_module(x).asarray(x)
