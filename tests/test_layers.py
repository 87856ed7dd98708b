"""The package's layers: each folder of ``tracegrad/`` says in its
``__init__`` docstring which folders it may import ("May import: ..."), and
every module keeps to it, whether the import is at module level or inside a
function.  The folders, bottom up: ops, eager, frontend, ir, targets,
runtime; the public faces and entry points (api, cli, func, autograd, nn,
scipy, ...) sit on top and may import any of them, without a cycle."""
from __future__ import annotations

import ast
import os
import re

import networkx as nx
import pytest

import tracegrad

ROOT = os.path.dirname(tracegrad.__file__)
# the layer folders, bottom up (a folder's own modules may import each other)
LAYERS = ["tracegrad.ops", "tracegrad.eager", "tracegrad.frontend", "tracegrad.ir",
          "tracegrad.targets", "tracegrad.runtime"]
TARGETS = ["tracegrad.targets.numpy", "tracegrad.targets.native", "tracegrad.targets.cuda"]
EVERYWHERE = {"tracegrad._version"}


def _modules():
    mods = {}
    for folder, _, files in os.walk(ROOT):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(folder, f)
                rel = os.path.relpath(path, os.path.dirname(ROOT))[:-3].replace(os.sep, ".")
                mods[rel[:-len(".__init__")] if rel.endswith(".__init__") else rel] = path
    return mods


def _import_graph():
    mods = _modules()

    def owner(name):
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name

    g = nx.DiGraph()
    for mod, path in mods.items():
        g.add_node(mod)
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read())
        for node in ast.walk(tree):   # every import, in functions too
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tracegrad"):
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    target = full if full in mods else owner(node.module)
                    if target and target != mod:
                        g.add_edge(mod, target)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    target = owner(alias.name) if alias.name.startswith("tracegrad") else None
                    if target and target != mod:
                        g.add_edge(mod, target)
    return g


def _folder(mod):
    """The innermost layer folder (or target folder) holding ``mod``, or None
    for the top (the faces and entry points)."""
    for f in sorted(LAYERS + TARGETS, key=len, reverse=True):
        if mod == f or mod.startswith(f + "."):
            return f
    return None


def _declared(folder):
    """What the folder's docstring says it may import."""
    path = os.path.join(os.path.dirname(ROOT), *folder.split("."), "__init__.py")
    with open(path, encoding="utf-8") as fh:
        doc = ast.get_docstring(ast.parse(fh.read())) or ""
    m = re.search(r"^May import:(.*?)(?:\n\s*\n|\Z)", doc, re.S | re.M)
    assert m, f"{path}: the docstring does not say what the folder may import ('May import: ...')"
    return set(re.findall(r"tracegrad(?:\.\w+)+", m.group(1)))


def _allowed(mod, target, folder, declared):
    if target in EVERYWHERE or target.rpartition(".")[0] == folder or target == folder:
        return True   # its own folder's modules (not its subfolders)
    return any(target == p or target.startswith(p + ".") for p in declared)


def test_no_import_cycles():
    cycles = [sorted(c) for c in nx.strongly_connected_components(_import_graph()) if len(c) > 1]
    assert not cycles, f"modules that import each other (directly or around a loop): {cycles}"


def test_every_folder_of_the_package_is_a_layer_or_a_face():
    folders = {m for m in _modules() if os.path.isdir(os.path.join(os.path.dirname(ROOT),
                                                                   *m.split(".")))}
    faces = {"tracegrad", "tracegrad.autograd", "tracegrad.autograd_compat", "tracegrad.nn",
             "tracegrad.optim", "tracegrad.utils", "tracegrad.scipy", "tracegrad.backends"}
    stray = sorted(f for f in folders - set(LAYERS) - set(TARGETS) - faces
                   if not f.startswith("tracegrad.autograd_compat."))
    assert not stray, f"folders that are neither a layer nor a public face: {stray}"


def test_the_layers_are_declared_bottom_up():
    # a folder may only name folders below it: the declarations are an order
    for i, folder in enumerate(LAYERS):
        above = [p for p in _declared(folder) if _folder(p) in LAYERS[i:] and
                 _folder(p) != folder]
        assert not above, f"{folder} declares it may import {above}, which sit above it"


@pytest.mark.parametrize("folder", LAYERS + TARGETS)
def test_every_module_imports_only_what_its_folder_allows(folder):
    g = _import_graph()
    declared = _declared(folder)
    wrong = sorted((mod, t) for mod in g if _folder(mod) == folder for t in g.successors(mod)
                   if not _allowed(mod, t, folder, declared))
    assert not wrong, (f"imports {folder} does not allow (its __init__ says what it may "
                       f"import): {wrong}")


def test_no_target_imports_another_target():
    g = _import_graph()
    crossed = sorted((mod, t) for mod in g for t in g.successors(mod)
                     if _folder(mod) in TARGETS + ["tracegrad.targets"]
                     and _folder(t) in TARGETS and _folder(t) != _folder(mod))
    assert not crossed, f"a target (or the renderers they share) imports a target: {crossed}"


def test_nothing_below_the_top_imports_a_face_or_an_entry_point():
    g = _import_graph()
    up = sorted((mod, t) for mod in g for t in g.successors(mod)
                if _folder(mod) is not None and _folder(t) is None and t not in EVERYWHERE)
    assert not up, f"imports that run back up to the top layer: {up}"


def test_a_new_c_like_target_is_a_table_and_a_function_class_beside_the_renderer():
    # what a new C-like target writes: its row of the table (the strings the
    # shared lowering prints) and its launch; cstyle does the rest
    import numpy as np
    import tracegrad as tg
    from tracegrad.targets import cstyle

    toy = cstyle.Target("toy", acc_store="{param}[0] = {acc};", pass_array="as_toy({arg})",
                        library="NumPy", math=lambda expr, dtype: expr.replace("tanh(", "toy_tanh("))

    class ToyFunction(cstyle.Function):
        target = toy

        @staticmethod
        def _library_emitter(prim):
            return prim.numpy

        def _launch(self, g, kern, kname, module, names, fresh):
            self._allocate_outputs(g, kern, kname, fresh)
            self.body.append({"code": f"{kname}({', '.join(kern.args)})", "comment": None,
                              "source": None})
            for r, var, _ in kern.partials:     # a fused sum: its partial sums added
                names[r] = f"t{r}"
                self.body.append({"code": f"t{r} = {var}.sum()", "comment": None,
                                  "source": None})

    graph = tg.grad(lambda x: np.sum(np.tanh(x) * 2.0)).lower(np.linspace(0, 1, 5)).graph
    _, (f,), g_of = cstyle.lower_all([(graph, "run", ["x"], "")], ToyFunction)
    assert f.kernels and all(k.target is toy for k in f.kernels)
    c_lines = [s["code"] for k in f.kernels for s in k.render_dict(g_of[id(f)])["body"]]
    assert any("toy_tanh(" in line for line in c_lines)
    launches = [s["code"] for s in f.body if s["code"] and s["code"].startswith("tg_k0(")]
    assert launches and "as_toy(x)" in launches[0]


def test_the_packaging_list_names_every_folder_of_the_package():
    import tomllib
    pyproject = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                             "pyproject.toml")
    if not os.path.exists(pyproject):
        pytest.skip("the tests run outside a checkout")
    with open(pyproject, "rb") as fh:
        listed = set(tomllib.load(fh)["tool"]["setuptools"]["packages"])
    folders = {m for m, path in _modules().items() if path.endswith("__init__.py")}
    assert folders <= listed, f"folders pyproject.toml does not ship: {sorted(folders - listed)}"
