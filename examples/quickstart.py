"""tracegrad in one minute: fit a tiny model with exact, compiled gradients.

    python examples/quickstart.py           # a few hundred steps, well under a second
    python examples/quickstart.py --small   # fewer steps (what the tests run)

The loss is ordinary NumPy code.  tg.value_and_grad traces it once, derives
the backward graph, generates code (fused C built by your C compiler, or
NumPy source where there is none; cached on disk) and runs it on every
later call.
"""
import argparse
import os

import numpy as np

import tracegrad as tg


def loss(w, b, x, y):
    """Mean squared error of a one-layer tanh network."""
    pred = np.tanh(x @ w + b)
    return np.mean((pred - y) ** 2)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--small", action="store_true", default=bool(os.environ.get("TRACEGRAD_SMALL")),
                   help="a CI-sized run (also: TRACEGRAD_SMALL=1)")
    p.add_argument("--show-source", action="store_true",
                   help="print the generated NumPy code (the NumPy target's, the easiest to read)")
    args = p.parse_args()
    steps = 60 if args.small else 300

    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 3))
    w_true, b_true = np.array([[1.5], [-2.0], [0.5]]), np.array([0.3])
    y = np.tanh(x @ w_true + b_true)

    w, b = np.zeros((3, 1)), np.zeros(1)
    step = tg.value_and_grad(loss, argnums=(0, 1))   # d loss / d w and d loss / d b
    lr = 0.5
    for i in range(steps + 1):
        value, (dw, db) = step(w, b, x, y)
        if i % (steps // 6) == 0:
            print(f"step {i:4d}  loss {value:.6f}")
        w -= lr * dw
        b -= lr * db
    print("fitted w:", np.round(w.ravel(), 3), " b:", np.round(b, 3))
    print("true   w:", w_true.ravel(), " b:", b_true)
    print("compiled to:", tg.cache_info()["target"])
    if args.show_source:
        readable = tg.value_and_grad(loss, argnums=(0, 1), backend="numpy")
        print(readable.lower(w, b, x, y).source)
    else:
        print("(run with --show-source to see the generated NumPy code)")


if __name__ == "__main__":
    main()
