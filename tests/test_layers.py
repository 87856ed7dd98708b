"""The package imports downwards only: no import cycle between its modules,
whether the import is at module level or inside a function."""
from __future__ import annotations

import ast
import os

import networkx as nx

import tracegrad


def _modules():
    root = os.path.dirname(tracegrad.__file__)
    mods = {}
    for folder, _, files in os.walk(root):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(folder, f)
                rel = os.path.relpath(path, os.path.dirname(root))[:-3].replace(os.sep, ".")
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


def test_no_import_cycles():
    cycles = [sorted(c) for c in nx.strongly_connected_components(_import_graph()) if len(c) > 1]
    assert not cycles, f"modules that import each other (directly or around a loop): {cycles}"


def test_the_op_layer_imports_nothing_above_it():
    g = _import_graph()
    for mod in g:
        if mod.startswith("tracegrad.ops"):
            above = [t for t in g.successors(mod) if not t.startswith(("tracegrad.ops",
                     "tracegrad.primitives", "tracegrad.runtime_numpy", "tracegrad.code_deps",
                     "tracegrad._version"))]
            assert not above, f"{mod} imports {above}, above the op layer"
