"""The eager engine: ``Tensor`` and the tape it records, as torch.autograd.

Each op computes at once with its registry row's ``impl``; when grad mode
is on and an input requires grad it records a node on the tape
(``grad_fn``), and ``backward()`` walks the tape with the rows' vjp rules.
Here: the Tensor (``tensor``: the value, its nodes and saved tensors, its
in-place writes, its constructors), the backward engine, grad modes, hooks,
custom ``Function``s, forward-mode AD, anomaly detection, the profiler and
gradcheck.  ``tracegrad.autograd`` is the public face of these modules,
under torch's names.

Layer: above the op registry, below everything that traces or compiles.
Where the engine must reach a higher layer (the backward replay through
compiled code), the higher layer installs a hook here.

May import: tracegrad.ops.
"""
