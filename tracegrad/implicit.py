"""``tg.fixed_point``: a fixed point ``x* = f(x*, *params)`` and its
derivatives by the implicit function theorem (the registry row and the
function live in ``tracegrad.ops.control``).

A public entry point, on top of the layers: ``tracegrad`` loads this module
on first use of ``tg.fixed_point`` (so ``import tracegrad`` stays light), and
loading it loads the compiler (``tracegrad.api``, the adjoint pass and
batching), whose tracer and derivations the rules need even on eager
Tensors: f is traced once into a body, and the adjoint and tangent solves
are derived from that body.
"""
# the tracer (traces f), the adjoint pass and batching (derive the adjoint,
# tangent and batched maps): loading them installs control flow's hooks
from tracegrad import api  # noqa: F401
from tracegrad.ir import adjoint, batching  # noqa: F401
from tracegrad.ops.control import fixed_point

__all__ = ["fixed_point"]
