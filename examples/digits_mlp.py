"""Train a small neural network on scikit-learn's digits, twice: in eager
mode (torch.autograd style) and in compile mode (tg.value_and_grad).

    python examples/digits_mlp.py [--small] [--mode eager|compiled|both]

The digits data set (1797 8x8 images) ships inside scikit-learn, so nothing
is downloaded.  Needs scikit-learn (pip install ".[examples]").
"""
import argparse
import os
import time

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import tracegrad as tg


def data(seed=0):
    digits = load_digits()
    x = digits.data / 16.0                      # pixels in [0, 1]
    y = digits.target
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.25, random_state=seed,
                                              stratify=y)
    return x_tr, x_te, y_tr, y_te


def init(hidden, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.normal(scale=1 / 8, size=(64, hidden)), np.zeros(hidden),
            rng.normal(scale=1 / np.sqrt(hidden), size=(hidden, 10)), np.zeros(10)]


def accuracy(params, x, y):
    w1, b1, w2, b2 = params
    logits = np.maximum(x @ w1 + b1, 0.0) @ w2 + b2
    return float(np.mean(np.argmax(logits, axis=1) == y))


# --- eager mode: the torch.autograd way ----------------------------------------------

def train_eager(x, y, hidden, epochs, lr, batch):
    params = [tg.tensor(p, requires_grad=True) for p in init(hidden)]
    w1, b1, w2, b2 = params
    xt, onehot = tg.tensor(x), tg.tensor(np.eye(10)[y])
    n = len(x)
    rng = np.random.default_rng(0)
    for epoch in range(epochs):
        order = rng.permutation(n)
        total = 0.0
        for s in range(0, n, batch):
            idx = order[s:s + batch]
            xb, tb = xt[idx], onehot[idx]
            logits = (xb @ w1 + b1).relu() @ w2 + b2
            loss = -(tb * logits.log_softmax(dim=1)).sum(dim=1).mean()
            loss.backward()
            total += loss.item() * len(idx)
            with tg.no_grad():                       # plain SGD, like torch.optim.SGD
                for p in params:
                    p -= lr * p.grad
                    p.grad = None
        print(f"  eager    epoch {epoch + 1:2d}  mean loss {total / n:.4f}")
    return [p.detach().numpy() for p in params]


# --- compile mode: the same network as plain NumPy -------------------------------------

def cross_entropy(w1, b1, w2, b2, x, onehot):
    h = np.maximum(x @ w1 + b1, 0.0)
    logits = h @ w2 + b2
    z = logits - np.max(logits, axis=1, keepdims=True)
    log_p = z - np.log(np.sum(np.exp(z), axis=1, keepdims=True))
    return -np.mean(np.sum(onehot * log_p, axis=1))


def train_compiled(x, y, hidden, epochs, lr, batch):
    params = init(hidden)
    step = tg.value_and_grad(cross_entropy, argnums=(0, 1, 2, 3))
    onehot = np.eye(10)[y]
    n = len(x)
    rng = np.random.default_rng(0)
    for epoch in range(epochs):
        order = rng.permutation(n)
        total, seen = 0.0, 0
        # full batches only: one input signature, so one trace and one compile
        for s in range(0, n - batch + 1, batch):
            idx = order[s:s + batch]
            loss, grads = step(*params, x[idx], onehot[idx])
            for p, g in zip(params, grads):
                p -= lr * g
            total, seen = total + float(loss) * batch, seen + batch
        print(f"  compiled epoch {epoch + 1:2d}  mean loss {total / seen:.4f}")
    return params


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", default=bool(os.environ.get("TRACEGRAD_SMALL")),
                    help="a CI-sized run (also: TRACEGRAD_SMALL=1)")
    ap.add_argument("--mode", choices=("eager", "compiled", "both"), default="both")
    args = ap.parse_args()
    epochs, hidden = (4, 32) if args.small else (20, 64)
    x_tr, x_te, y_tr, y_te = data()
    print(f"digits: {len(x_tr)} training and {len(x_te)} test images, 64 pixels, 10 classes")
    for mode, train in (("eager", train_eager), ("compiled", train_compiled)):
        if args.mode not in (mode, "both"):
            continue
        t0 = time.perf_counter()
        params = train(x_tr, y_tr, hidden, epochs, lr=0.1, batch=32)
        print(f"{mode}: test accuracy {accuracy(params, x_te, y_te):.3f} "
              f"({time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    main()
