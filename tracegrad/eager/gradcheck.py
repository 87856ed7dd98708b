"""Numerical gradient checking: ``gradcheck`` and ``gradgradcheck``.

``gradcheck`` compares the Jacobian the engine computes (one backward per
output element, with a one-hot ``grad_output``) with one from central finite
differences, ``(f(x + eps) - f(x - eps)) / (2 eps)``, element by element of
every input that requires grad.  ``fast_mode=True`` compares one random
projection ``u^T J v`` per (input, output) pair instead of the full matrix.
``gradgradcheck`` runs ``gradcheck`` on the function that maps
``(inputs, grad_outputs)`` to the gradients of the inputs, built with
``create_graph=True``: it checks second derivatives.

A failure raises ``GradcheckError`` (a ``RuntimeError``) naming the output
and the input and showing the two Jacobians, or returns False with
``raise_exception=False``.
"""
from __future__ import annotations

import warnings

import numpy as np

from tracegrad.eager import forward_ad
from tracegrad.eager.tensor import Tensor
from tracegrad.eager.device import _to_host

__all__ = ["gradcheck", "gradgradcheck", "GradcheckError", "get_numerical_jacobian"]


class GradcheckError(RuntimeError):
    """Raised by gradcheck / gradgradcheck when a check fails."""


# --- helpers ------------------------------------------------------------------------

def _as_tuple(x):
    if isinstance(x, tuple):
        return x
    if isinstance(x, list):
        return tuple(x)
    return (x,)


def _is_float_tensor(t):
    return isinstance(t, Tensor) and np.issubdtype(t.dtype, np.floating)


def _differentiable_outputs(outputs):
    return tuple(o for o in outputs if isinstance(o, Tensor) and o.requires_grad)


def _numel(t):
    return int(np.prod(t.shape, dtype=np.int64))


def _host(t):
    return np.asarray(_to_host(t._data))


def _xp(t):
    from tracegrad.ops.primitives import array_module
    return array_module(t._data)


def _fmt(a):
    with np.printoptions(precision=6, suppress=False, linewidth=120, threshold=400):
        return np.array2string(np.asarray(a), separator=", ")


def _side_by_side(numerical, analytical):
    """The two Jacobians next to each other (one above the other when they
    are too wide for that)."""
    left = ["numerical:"] + _fmt(numerical).splitlines()
    right = ["analytical:"] + _fmt(analytical).splitlines()
    width = max(len(ln) for ln in left)
    if width + max(len(ln) for ln in right) > 160:
        return "\n".join(left + right)
    rows = []
    for k in range(max(len(left), len(right))):
        a = left[k] if k < len(left) else ""
        b = right[k] if k < len(right) else ""
        rows.append(f"{a:<{width}}   |   {b}".rstrip())
    return "\n".join(rows)


def _worst(numerical, analytical, atol, rtol, k=5):
    """The entries that fail allclose, largest error first, side by side."""
    diff = np.abs(numerical - analytical)
    bad = diff > atol + rtol * np.abs(numerical)
    idx = np.argwhere(bad)
    if idx.size == 0:
        return ""
    order = np.argsort(-diff[bad], kind="stable")[:k]
    lines = [f"  {'(input elem, output elem)':<27} {'numerical':<20} {'analytical':<20} |diff|"]
    for r in order:
        i, j = idx[r]
        lines.append(f"  {f'({i}, {j})':<27} {numerical[i, j]:<20.10g} "
                     f"{analytical[i, j]:<20.10g} {diff[i, j]:.3g}")
    if len(idx) > k:
        lines.append(f"  ... {len(idx) - k} more entries differ")
    return "\n".join(lines)


def _check_inputs(tupled_inputs, check_sparse_nnz):
    if check_sparse_nnz:
        raise NotImplementedError("check_sparse_nnz=True: tracegrad has no sparse tensors")
    any_requires = False
    for idx, inp in enumerate(tupled_inputs):
        if isinstance(inp, Tensor) and inp.requires_grad:
            if np.issubdtype(inp.dtype, np.complexfloating):
                raise NotImplementedError(
                    f"gradcheck: input #{idx} is complex; tracegrad's gradcheck checks real "
                    f"inputs only")
            if inp.dtype != np.float64:
                warnings.warn(
                    f"Input #{idx} requires gradient and is not a double precision floating point "
                    f"or complex. This check will likely fail if all the inputs are not of double "
                    f"precision floating point or complex. ", UserWarning, stacklevel=3)
            any_requires = True
    if not any_requires:
        raise ValueError("gradcheck expects at least one input tensor to require gradient, "
                         "but none of the them have requires_grad=True.")


def _fail(msg, raise_exception):
    if raise_exception:
        raise GradcheckError(msg)
    return False


# --- numerical Jacobian ------------------------------------------------------------

def _eval_outputs(func, inputs):
    """Output arrays (host, float64 copies) of the float Tensor outputs."""
    outs = _as_tuple(func(*inputs))
    return [(_host(o).astype(np.float64, copy=True) if _is_float_tensor(o) else None)
            for o in outs]


def get_numerical_jacobian(func, inputs, outputs=None, eps=1e-6):
    """Finite-difference Jacobians: result[i][o] has shape (numel of input i,
    numel of output o), for each input i that requires grad and each float
    output o (None for the others).  The inputs are perturbed in place and
    restored."""
    inputs = _as_tuple(inputs)
    if outputs is None:
        outputs = _as_tuple(func(*inputs))
    result = []
    for inp in inputs:
        if not (_is_float_tensor(inp) and inp.requires_grad):
            continue
        result.append(_numerical_columns(func, inputs, inp, outputs, eps))
    return result


def _numerical_columns(func, inputs, inp, outputs, eps):
    n_in = _numel(inp)
    jac = [np.zeros((n_in, _numel(o))) if _is_float_tensor(o) else None for o in outputs]
    data = inp._data
    shape = tuple(inp.shape)
    for j in range(n_in):
        idx = np.unravel_index(j, shape) if shape else ()
        orig = data[idx].copy() if hasattr(data[idx], "copy") else data[idx]
        try:
            data[idx] = orig - eps
            minus = _eval_outputs(func, inputs)
            data[idx] = orig + eps
            plus = _eval_outputs(func, inputs)
        finally:
            data[idx] = orig
        for k, (p, m) in enumerate(zip(plus, minus)):
            if jac[k] is not None and p is not None:
                jac[k][j] = ((p - m) / (2 * eps)).reshape(-1)
    return jac


def _directional_numerical(func, inputs, inp, v, eps):
    """(f(x + eps v) - f(x - eps v)) / 2 eps for each float output."""
    data = inp._data
    orig = data.copy()
    xp = _xp(inp)
    dv = xp.asarray(v.reshape(inp.shape)).astype(data.dtype)
    try:
        data[...] = orig - eps * dv
        minus = _eval_outputs(func, inputs)
        data[...] = orig + eps * dv
        plus = _eval_outputs(func, inputs)
    finally:
        data[...] = orig
    return [None if p is None else ((p - m) / (2 * eps)).reshape(-1) for p, m in zip(plus, minus)]


# --- analytical Jacobian -----------------------------------------------------------

def _grads(output, inputs, grad_output):
    from tracegrad.eager.engine import grad as _grad
    return _grad((output,), inputs, (grad_output,), retain_graph=True, allow_unused=True)


def _analytical_for_output(output, diff_inputs, check_grad_dtypes, o_idx):
    """Rows of J (input numel x output numel) per input, by one backward per
    output element; also the problems found (dtype/shape of gradients)."""
    n_out = _numel(output)
    jacs = [np.zeros((_numel(x), n_out)) for x in diff_inputs]
    xp = _xp(output)
    problems = []
    for k in range(n_out):
        go = xp.zeros(output.shape, output.dtype)
        if output.shape:
            go[np.unravel_index(k, output.shape)] = 1
        else:
            go = xp.ones((), output.dtype)
        gs = _grads(output, diff_inputs, Tensor(go))
        for i, (x, g) in enumerate(zip(diff_inputs, gs)):
            if g is None:
                continue
            if tuple(g.shape) != tuple(x.shape):
                problems.append(f"Gradient has shape mismatch: the gradient of output {o_idx} "
                                f"with respect to input {i} has shape {list(g.shape)}, the input "
                                f"has shape {list(x.shape)}")
                continue
            if check_grad_dtypes and g.dtype != x.dtype:
                problems.append(f"Gradient has dtype mismatch: the gradient of output {o_idx} "
                                f"with respect to input {i} is {g.dtype}, the input is {x.dtype}")
            jacs[i][:, k] = _host(g).astype(np.float64).reshape(-1)
    return jacs, problems


# --- the checks ----------------------------------------------------------------------

def gradcheck(func, inputs, *, eps=1e-6, atol=1e-5, rtol=1e-3, raise_exception=True,
              check_sparse_nnz=False, nondet_tol=0.0, check_undefined_grad=True,
              check_grad_dtypes=False, check_batched_grad=False, check_batched_forward_grad=False,
              check_forward_ad=False, check_backward_ad=True, fast_mode=False, masked=None):
    """Check the gradients of ``func`` at ``inputs`` against finite differences.

    Returns True when every analytical Jacobian is ``allclose`` (``atol``,
    ``rtol``) to the numerical one; otherwise raises ``GradcheckError``
    (or returns False with ``raise_exception=False``).  The defaults are
    meant for float64 inputs; others trigger a warning."""
    if check_batched_forward_grad:
        raise NotImplementedError(
            "check_batched_forward_grad=True: tracegrad has no batched forward-mode AD in eager "
            "mode; check_forward_ad=True checks the forward-mode Jacobian column by column")
    if not check_backward_ad and not check_forward_ad:
        raise ValueError("gradcheck has nothing to check with check_backward_ad=False and "
                         "check_forward_ad=False")
    if masked:
        raise NotImplementedError("masked=True: tracegrad has no sparse or masked tensors")
    tupled_inputs = _as_tuple(inputs)
    _check_inputs(tupled_inputs, check_sparse_nnz)
    func_out = _as_tuple(func(*tupled_inputs))
    outputs = _differentiable_outputs(func_out)
    diff_idx = [i for i, x in enumerate(tupled_inputs) if isinstance(x, Tensor) and x.requires_grad]
    diff_inputs = tuple(tupled_inputs[i] for i in diff_idx)

    # Outputs that do not require grad must not depend on the inputs.
    numerical = None
    if not fast_mode or check_forward_ad or any(_is_float_tensor(o) and not o.requires_grad
                                                for o in func_out):
        numerical = [_numerical_columns(func, tupled_inputs, x, func_out, eps)
                     for x in diff_inputs]
    for o_idx, o in enumerate(func_out):
        if not _is_float_tensor(o) or o.requires_grad:
            continue
        for i, cols in enumerate(numerical):
            if cols[o_idx] is not None and not np.allclose(cols[o_idx], 0.0, rtol=rtol, atol=atol):
                return _fail(f"Numerical gradient for function expected to be zero: output "
                             f"{o_idx} does not require grad, yet it changes with input "
                             f"{diff_idx[i]}:\nnumerical:\n{_fmt(cols[o_idx])}", raise_exception)

    if check_forward_ad:
        ok = _check_forward_ad(func, tupled_inputs, func_out, diff_idx, numerical, atol, rtol,
                               raise_exception)
        if not ok:
            return False
    if not check_backward_ad:
        return True
    out_positions = [k for k, o in enumerate(func_out) if isinstance(o, Tensor) and o.requires_grad]
    if fast_mode:
        ok = _fast_check(func, tupled_inputs, func_out, diff_idx, diff_inputs, out_positions, eps,
                         atol, rtol, nondet_tol, raise_exception)
        if not ok:
            return False
    else:
        for o_pos in out_positions:
            o = func_out[o_pos]
            if not np.issubdtype(o.dtype, np.floating):
                continue
            a1, problems = _analytical_for_output(o, diff_inputs, check_grad_dtypes, o_pos)
            if problems:
                return _fail(problems[0], raise_exception)
            for i, x_idx in enumerate(diff_idx):
                n = numerical[i][o_pos]
                a = a1[i]
                if not np.allclose(a, n, rtol=rtol, atol=atol):
                    return _fail(
                        f"Jacobian mismatch for output {o_pos} with respect to input {x_idx},\n"
                        f"{_side_by_side(n, a)}\n"
                        f"(rows: elements of input {x_idx}, columns: elements of output {o_pos}; "
                        f"atol={atol}, rtol={rtol})\nlargest differences:\n"
                        f"{_worst(n, a, atol, rtol)}", raise_exception)
            a2, _ = _analytical_for_output(o, diff_inputs, check_grad_dtypes, o_pos)
            for i, x_idx in enumerate(diff_idx):
                d = np.abs(a1[i] - a2[i]).max(initial=0.0)
                if d > nondet_tol:
                    return _fail(
                        "Backward is not reentrant, i.e., running backward with same input and "
                        "grad_output multiple times gives different values, although analytical "
                        "gradient matches numerical gradient. The tolerance for nondeterminism "
                        f"was {nondet_tol}. (output {o_pos}, input {x_idx}: largest difference "
                        f"{d:.3g})", raise_exception)

    if check_batched_grad:
        ok = _check_batched_grad(outputs, diff_inputs, atol, rtol, raise_exception)
        if not ok:
            return False
    if check_undefined_grad:
        ok = _check_undefined_grad(func_out, out_positions, raise_exception)
        if not ok:
            return False
    return True


def _check_forward_ad(func, inputs, func_out, diff_idx, numerical, atol, rtol, raise_exception):
    """The Jacobian from forward-mode AD (one dual-number pass per input
    element: the tangent is that element's unit vector) against the
    numerical one."""
    positions = [k for k, o in enumerate(func_out) if _is_float_tensor(o)]
    for i, x_idx in enumerate(diff_idx):
        x = inputs[x_idx]
        n_in = _numel(x)
        jac = {k: np.zeros((n_in, _numel(func_out[k]))) for k in positions}
        for j in range(n_in):
            e = np.zeros(n_in, dtype=x.dtype)
            e[j] = 1.0
            with forward_ad.dual_level():
                args = list(inputs)
                args[x_idx] = forward_ad.make_dual(
                    x.detach(), Tensor(_xp(x).asarray(e.reshape(x.shape))))
                outs = _as_tuple(func(*args))
                for k in positions:
                    t = forward_ad.unpack_dual(outs[k]).tangent
                    if t is not None:
                        jac[k][j] = np.asarray(_to_host(t._data), dtype=np.float64).reshape(-1)
        for k in positions:
            n = numerical[i][k]
            if n is None:
                continue
            if not np.allclose(jac[k], n, rtol=rtol, atol=atol):
                return _fail(
                    f"Jacobian computed with forward mode mismatch for output {k} with respect "
                    f"to input {x_idx},\n{_side_by_side(n, jac[k])}\n(rows: elements of input "
                    f"{x_idx}, columns: elements of output {k}; atol={atol}, rtol={rtol})\n"
                    f"largest differences:\n{_worst(n, jac[k], atol, rtol)}", raise_exception)
    return True


def _fast_check(func, inputs, func_out, diff_idx, diff_inputs, out_positions, eps, atol, rtol,
                nondet_tol, raise_exception):
    rng = np.random.default_rng(0)
    for i, x in enumerate(diff_inputs):
        v = rng.standard_normal(_numel(x))
        v /= max(np.linalg.norm(v), 1e-12)
        num_dirs = _directional_numerical(func, inputs, x, v, eps)
        for o_pos in out_positions:
            o = func_out[o_pos]
            if not np.issubdtype(o.dtype, np.floating):
                continue
            u = rng.standard_normal(_numel(o))
            u /= max(np.linalg.norm(u), 1e-12)
            numerical = float(u @ num_dirs[o_pos])
            go = Tensor(_xp(o).asarray(u.reshape(o.shape)).astype(o.dtype))
            vals = []
            for _ in range(2):
                g = _grads(o, (x,), go)[0]
                vals.append(0.0 if g is None else float(_host(g).astype(np.float64).reshape(-1) @ v))
            analytical = vals[0]
            if not np.isclose(analytical, numerical, rtol=rtol, atol=atol):
                n_full = _numerical_columns(func, inputs, x, func_out, eps)[o_pos]
                a_full = _analytical_for_output(o, (x,), False, o_pos)[0][0]
                return _fail(
                    f"Jacobian mismatch for output {o_pos} with respect to input {diff_idx[i]},\n"
                    f"fast mode: u^T J v is {numerical:.10g} by finite differences and "
                    f"{analytical:.10g} by backward (random unit vectors u, v).\n"
                    f"The full Jacobians (computed again in slow mode):\n"
                    f"{_side_by_side(n_full, a_full)}\nlargest differences:\n"
                    f"{_worst(n_full, a_full, atol, rtol)}", raise_exception)
            if abs(vals[0] - vals[1]) > nondet_tol:
                return _fail(
                    "Backward is not reentrant, i.e., running backward with same input and "
                    "grad_output multiple times gives different values, although analytical "
                    "gradient matches numerical gradient. The tolerance for nondeterminism was "
                    f"{nondet_tol}.", raise_exception)
    return True


def _check_batched_grad(outputs, diff_inputs, atol, rtol, raise_exception):
    """Gradients for a batch of grad_outputs in one call
    (``is_grads_batched=True``) must equal those computed one at a time."""
    from tracegrad import ops
    from tracegrad.eager.engine import grad as _grad
    if not hasattr(ops, "stack"):
        raise NotImplementedError("check_batched_grad=True needs the 'stack' op, which this "
                                  "build of tracegrad does not have yet")
    rng = np.random.default_rng(1)
    for o_idx, o in enumerate(outputs):
        if not np.issubdtype(o.dtype, np.floating):
            continue
        xp = _xp(o)
        batch = xp.asarray(rng.standard_normal((2,) + tuple(o.shape))).astype(o.dtype)
        batched = _grad((o,), diff_inputs, (Tensor(batch),), retain_graph=True,
                        allow_unused=True, is_grads_batched=True)
        for b in range(2):
            single = _grads(o, diff_inputs, Tensor(batch[b]))
            for i, (gb, gs) in enumerate(zip(batched, single)):
                if gs is None and gb is None:
                    continue
                gb_b = np.zeros(diff_inputs[i].shape) if gb is None else _host(gb)[b]
                gs_h = np.zeros(diff_inputs[i].shape) if gs is None else _host(gs)
                if not np.allclose(gb_b, gs_h, rtol=rtol, atol=atol):
                    return _fail(
                        f"While computing batched gradients, got: the batched gradient of output "
                        f"{o_idx} with respect to input {i} (batch entry {b}) differs from the "
                        f"gradient computed alone.\nbatched:{_fmt(gb_b)}\nalone:{_fmt(gs_h)}",
                        raise_exception)
    return True


def _check_undefined_grad(func_out, out_positions, raise_exception):
    """A backward node must accept undefined (None) output gradients and
    treat them as zeros.  Primitive nodes (``PrimNode``) get their rules from
    the registry and are not checked here; custom ``Function`` nodes and
    other node kinds are called with all their output gradients None."""
    from tracegrad.eager.nodes import PrimNode
    from tracegrad.eager.grad_mode import no_grad
    seen = set()
    for o_pos in out_positions:
        node = func_out[o_pos].grad_fn
        if node is None or isinstance(node, PrimNode) or id(node) in seen:
            continue
        seen.add(id(node))
        try:
            with no_grad():
                res = node.apply([None] * node.num_outputs(), False)
        except Exception as e:
            msg = ("Expected backward function to handle undefined output grads. Please look at "
                   "\"Notes about undefined output gradients\" in the tracegrad docs: a backward "
                   f"must treat a None grad_output as zeros.\n{node.name()} raised "
                   f"{type(e).__name__}: {e}")
            if raise_exception:
                raise GradcheckError(msg) from e
            return False
        for k, g in enumerate(res):
            if g is not None and bool(np.any(_host(g) != 0)):
                return _fail(f"Expected all input grads to be undefined or zero when all output "
                             f"grads are undefined or zero: {node.name()} returned a nonzero "
                             f"gradient for input {k}.", raise_exception)
    return True


def gradgradcheck(func, inputs, grad_outputs=None, *, eps=1e-6, atol=1e-5, rtol=1e-3,
                  gen_non_contig_grad_outputs=False, raise_exception=True, nondet_tol=0.0,
                  check_undefined_grad=True, check_grad_dtypes=False, check_batched_grad=False,
                  check_fwd_over_rev=False, check_rev_over_rev=True, fast_mode=False, masked=False):
    """Check second derivatives: gradcheck of ``(inputs, grad_outputs) ->
    autograd.grad(func(inputs), inputs, grad_outputs, create_graph=True)``.

    Without ``grad_outputs``, random float64-like ones are drawn (made
    non-contiguous with ``gen_non_contig_grad_outputs``)."""
    if check_fwd_over_rev:
        raise NotImplementedError("check_fwd_over_rev=True: tracegrad's eager mode has no "
                                  "forward-mode AD")
    if not check_rev_over_rev:
        raise ValueError("gradgradcheck has nothing to check with check_rev_over_rev=False")
    tupled_inputs = _as_tuple(inputs)
    if grad_outputs is None:
        outputs = _differentiable_outputs(_as_tuple(func(*tupled_inputs)))
        rng = np.random.default_rng(2)
        gos = []
        for o in outputs:
            xp = _xp(o)
            if gen_non_contig_grad_outputs and o.shape:
                base = xp.asarray(rng.standard_normal(tuple(o.shape) + (2,))).astype(o.dtype)
                data = base[..., 0]  # every other element: not contiguous
            else:
                data = xp.asarray(rng.standard_normal(tuple(o.shape))).astype(o.dtype)
            gos.append(Tensor(data, True))
        tupled_grad_outputs = tuple(gos)
    else:
        tupled_grad_outputs = _as_tuple(grad_outputs)
    num_outputs = len(tupled_grad_outputs)
    from tracegrad.eager.engine import grad as _grad

    def new_func(*args):
        input_args = args[:-num_outputs] if num_outputs else args
        gos = args[-num_outputs:] if num_outputs else ()
        outputs = _differentiable_outputs(_as_tuple(func(*input_args)))
        diff = tuple(x for x in input_args if isinstance(x, Tensor) and x.requires_grad)
        grad_inputs = _grad(outputs, diff, gos, create_graph=True, allow_unused=True)
        return tuple(g for g in grad_inputs if g is not None)

    return gradcheck(new_func, tupled_inputs + tupled_grad_outputs, eps=eps, atol=atol, rtol=rtol,
                     raise_exception=raise_exception, nondet_tol=nondet_tol,
                     check_undefined_grad=check_undefined_grad,
                     check_grad_dtypes=check_grad_dtypes, check_batched_grad=check_batched_grad,
                     fast_mode=fast_mode, masked=masked)
