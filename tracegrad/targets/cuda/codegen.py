"""The CUDA target: IR graphs to CUDA kernels plus a CuPy driver module.

For each graph, ``passes.fusion_groups`` (the one cost function that decides
fusion) partitions the elementwise nodes into groups.  Each group becomes one
``extern "C" __global__`` kernel: a grid-stride loop over the group's
iteration space whose shapes, strides and size are compile-time constants,
one ``const`` line per graph node, each tagged ``// %id op`` and grouped under
the user's source line.  A full ``sum`` of a value the group computes becomes
the kernel's epilogue: every thread stores its partial sum, the driver adds
the partials with CuPy.

Everything else (reductions, matrix products, indexing, shape ops, and any
elementwise row without a ``cuda=`` expression) is printed by the NumPy
target's emitters, unchanged: the driver module binds the name ``np`` to
CuPy, so ``np.matmul`` is cuBLAS through ``cupy.matmul`` and ``np.sum`` is a
CuPy reduction.  The driver is a plain Python module with the same function
names and signatures as the NumPy target (``forward``, ``value_and_grad``,
``jacobian``, ``hessian``, ``run``); it compiles its kernels once, when it
is imported, through ``cupy.RawModule``.

Generating the source needs neither CuPy nor a GPU (``translation_unit`` and
``generate_driver`` only print text); ``tracegrad.testing`` runs the output
on the CPU to test it.

The backend is a table (STYLE.md, 5): the per-op C++ expressions are the
registry rows' ``cuda=`` strings; this module only adds the dtype table and
the literal syntax.
"""
from __future__ import annotations

from tracegrad._version import __version__
from tracegrad.targets import cstyle, templates

# Threads per block of every launch, and blocks per SM at most: the
# grid-stride loop covers the rest.  Several waves of blocks, not one, so a
# kernel whose registers let fewer blocks be resident keeps no idle tail: on
# an H200, W2's kernel alone ran 1.06x faster at 32 per SM than at 8
# (benchmarks/gpu.py --sweep-grid, docs/benchmarks.md).  A kernel with a
# fused sum leaves one partial per thread for CuPy to add, and that sum cost
# more than the waves gained (W2's whole call: 121 us at 8 per SM, 155 at
# 32), so those kernels keep 8.
BLOCK = 256
BLOCKS_PER_SM = 32
BLOCKS_PER_SM_WITH_PARTIALS = 8


# The CUDA target's row of the C-style renderer's table.
CUDA = cstyle.Target("CUDA",
                     acc_store="{param}[(long long)blockIdx.x * blockDim.x + threadIdx.x] = {acc};",
                     pass_array="np.ascontiguousarray({arg})", library="CuPy")


class Function(cstyle.Function):
    """One graph lowered to a CuPy driver function and its kernels."""

    target = CUDA

    @staticmethod
    def _library_emitter(prim):
        return prim.cupy or prim.numpy

    def _launch(self, g, kern, kname, module, names, fresh):
        """The driver statements that allocate a kernel's outputs, launch it
        and finish its reductions (the target's entry)."""
        handle = module.kernel(kname, kern.n, blocks_per_sm=BLOCKS_PER_SM_WITH_PARTIALS
                               if kern.partials else BLOCKS_PER_SM)
        self._allocate_outputs(g, kern, kname, fresh)
        for r, var, dt in kern.partials:
            self.body.append({"code": f"{var} = np.empty({handle}_grid[0] * {BLOCK}, "
                                      f"dtype={dt.name!r})",
                              "comment": f"per-thread partial sums of %{r}",
                              "source": None})
        args = [a if not (a.startswith("np.ascontiguousarray(") and a[21:-1] in fresh)
                else a[21:-1] for a in kern.args]
        self.body.append({"code": f"{handle}({handle}_grid, ({BLOCK},), "
                                  f"({', '.join(args)},))",
                          "comment": f"launch {kname}", "source": None})
        for r, var, dt in kern.partials:
            d = g.nodes[r]
            names[r] = f"t{r}"
            shape = tuple(d["shape"])   # a full sum is 0-d already: no reshape call
            reshape = f".reshape({shape!r})" if shape else ""
            self.body.append({"code": f"t{r} = np.sum({var}){reshape}",
                              "comment": f"%{r} sum: the kernel's partial sums added",
                              "source": None})


def _render_tu(functions, g_of, header):
    kernels = [k.render_dict(g_of[id(f)]) for f in functions for k in f.kernels]
    # the device helpers (cuda_helpers.cuh) only where a kernel calls one
    calls = "\n".join(s["code"] for k in kernels for s in k["body"])
    helpers = "tg_floordiv(" in calls or "tg_remainder(" in calls or "tg_polygamma(" in calls
    return templates.environment().get_template("cuda_kernels.cu.j2").render(
        version=__version__, header=list(header), kernels=kernels,
        helpers=helpers)


def translation_unit(graph, header=()) -> str:
    """All kernels of one graph as one compilable CUDA translation unit (the
    text ``Lowered.cuda_source`` shows and a single-function driver embeds)."""
    names = [graph.nodes[v].get("name", f"a{i}") for i, v in enumerate(graph.graph["inputs"])]
    _, lowered, g_of = cstyle.lower_all([(graph, "run", names, "")], Function)
    return _render_tu(lowered, g_of, header)


def kernel_count(graph) -> int:
    """How many kernels the CUDA target generates for ``graph``."""
    from tracegrad.ir import passes
    return len(passes.fusion_groups(graph))


def generate_driver(functions, source="", transform="", key="") -> str:
    """Source of one Python driver module holding a function per (graph,
    name, arg names, docstring) in ``functions``, with the kernels of all of
    them in one translation unit."""
    module, lowered, g_of = cstyle.lower_all(functions, Function)
    tu = _render_tu(lowered, g_of, ())
    return templates.environment().get_template("cuda_driver.py.j2").render(
        version=__version__, source=source, transform=transform, key=key,
        cuda_source=cstyle.py_string(tu), block=BLOCK,
        needs_math=module.needs_math, needs_base64=module.needs_base64,
        helpers=module.helpers, constants=module.constants,
        kernels=module.kernel_handles,
        functions=[{"name": f.name, "args": f.args, "doc": f.doc, "body": f.body,
                    "returns": f.returns} for f in lowered])
