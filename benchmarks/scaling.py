"""How the compiler's graph passes grow with the graph: the fusion grouping
(``passes.fusion_groups``, which decides the native and CUDA kernels) and
the optimisation passes (``passes.optimize``) on chains of 200, 2,000 and
20,000 links (sin, scale, and a full sum broadcast back every 25 links, as
in tests/test_native.py's ``_chain``).

    python benchmarks/scaling.py [--links 200,2000,20000] [--repeat 3]

Prints the best of ``--repeat`` times per size and the ratio to the
previous size.  Target: near-linear, at most 40x the time for 10x the
links (a quadratic grouping took about 100x).
"""
import argparse
import os
import sys
import time

import networkx as nx
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import tracegrad  # noqa: E402,F401
from tracegrad.ir import passes  # noqa: E402
from test_native import _chain  # noqa: E402


def best(fn, g, repeat):
    ts = []
    for _ in range(repeat):
        h = g.copy() if isinstance(g, nx.MultiDiGraph) else g
        t = time.perf_counter()
        fn(h)
        ts.append(time.perf_counter() - t)
    return min(ts)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--links", default="200,2000,20000")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    sizes = [int(s) for s in a.links.split(",")]
    print("| links | nodes | fusion_groups (s) | ratio | optimize (s) | ratio |")
    print("|------:|------:|------------------:|------:|-------------:|------:|")
    prev = None
    for n in sizes:
        g = _chain(n)
        tf = best(passes.fusion_groups, g, a.repeat)
        to = best(passes.optimize, g, a.repeat)
        rf = f"{tf / prev[0]:.1f}" if prev else ""
        ro = f"{to / prev[1]:.1f}" if prev else ""
        print(f"| {n} | {len(g)} | {tf:.4f} | {rf} | {to:.4f} | {ro} |")
        prev = (tf, to)
    print("ratios: time at this size / time at the previous size (target: at most 40 for 10x)")


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
