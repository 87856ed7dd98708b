"""Train with the generated module only: NumPy and loss_grad.py, no tracegrad.

Run compile_and_use.py first (it writes loss_grad.py and then runs this
script), or by hand:

    tracegrad compile examples/standalone/model.py:loss --arg w=float64[5] \\
        --arg b=float64[] --arg x=float64[400,5] --arg y=float64[400] \\
        --value-and-grad --wrt w,b -o loss_grad.py
    python examples/standalone/train_without_tracegrad.py   # with loss_grad.py importable
"""
import numpy as np

from loss_grad import loss   # the generated module: imports NumPy only


def main(steps=200):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 5))
    w_true = np.array([2.0, -1.0, 0.5, 0.0, 1.5])
    y = (x @ w_true + 0.25 + 0.3 * rng.normal(size=400) > 0).astype(np.float64)

    w, b = np.zeros(5), np.float64(0.0)
    for i in range(steps + 1):
        value, (dw, db) = loss(w, b, x, y)      # shapes and dtypes are checked at the door
        if i % (steps // 4) == 0:
            print(f"step {i:4d}  loss {value:.5f}")
        w, b = w - 1.0 * dw, b - 1.0 * db
    print("weights:", np.round(w, 2), "bias:", round(float(b), 2))
    try:
        loss(w.astype(np.float32), b, x, y)
    except ValueError as e:
        print("a float32 weight vector is refused:", e)


if __name__ == "__main__":
    import sys
    main(steps=40 if "--small" in sys.argv else 200)
