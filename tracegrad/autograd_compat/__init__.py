"""HIPS autograd's API on tracegrad: change the imports, keep the code.

    import autograd.numpy as np               ->  import tracegrad.autograd_compat.numpy as np
    import autograd.numpy.random as npr       ->  import tracegrad.autograd_compat.numpy.random as npr
    from autograd import grad, jacobian       ->  from tracegrad.autograd_compat import grad, jacobian
    from autograd.extend import primitive, defvjp
                                              ->  from tracegrad.autograd_compat.extend import ...
    from autograd.misc.optimizers import adam ->  from tracegrad.autograd_compat.misc.optimizers import adam
    from autograd.scipy.special import gammaln -> from tracegrad.autograd_compat.scipy.special import gammaln
    from autograd.scipy.integrate import odeint -> from tracegrad.autograd_compat.scipy.integrate import odeint
    from autograd.builtins import tuple       ->  from tracegrad.autograd_compat.builtins import tuple

or ``import tracegrad.autograd_compat as autograd`` and keep ``autograd.grad``.
Every operator is compiled where the function traces and runs eagerly where
its control flow depends on values (see ``differential_operators``);
docs/migrating-from-autograd.md lists the names and what differs.

A public face, on top of the layers: it may import any of them.
"""
from tracegrad.autograd_compat.differential_operators import (  # noqa: F401
    grad, value_and_grad, elementwise_grad, jacobian, hessian, hessian_tensor_product,
    hessian_vector_product, tensor_jacobian_product, vector_jacobian_product, make_hvp,
    make_vjp, make_jvp, make_ggnvp, holomorphic_grad, grad_named, grad_and_aux,
    multigrad_dict, deriv, checkpoint, set_mode, get_mode)
from tracegrad.autograd_compat.extend import primitive  # noqa: F401
from tracegrad.autograd_compat import extend, misc, test_util  # noqa: F401
from tracegrad.autograd_compat import numpy, scipy, builtins  # noqa: F401
# autograd's top level re-exports its containers (``from autograd import tuple``)
from tracegrad.autograd_compat.builtins import (  # noqa: F401,A004
    tuple, list, dict, isinstance, type)

__all__ = ["grad", "value_and_grad", "elementwise_grad", "jacobian", "hessian",
           "hessian_tensor_product", "hessian_vector_product", "tensor_jacobian_product",
           "vector_jacobian_product", "make_hvp", "make_vjp", "make_jvp", "make_ggnvp",
           "holomorphic_grad", "grad_named", "grad_and_aux", "multigrad_dict", "deriv",
           "checkpoint", "primitive", "set_mode", "get_mode", "extend", "misc", "test_util",
           "numpy", "scipy", "builtins"]
