"""Fit a damped oscillation with scipy.optimize.minimize, fed exact gradients.

    python examples/scipy_fit.py [--small]

SciPy's quasi-Newton methods want ``fun(p) -> (value, gradient)`` when
``jac=True``; tg.value_and_grad gives exactly that, compiled, from the
plain NumPy loss below.  Needs SciPy (pip install ".[examples]").
"""
import argparse
import os

import numpy as np
from scipy.optimize import minimize

import tracegrad as tg


def model(p, t):
    amplitude, decay, omega, phase = p[0], p[1], p[2], p[3]
    return amplitude * np.exp(-decay * t) * np.sin(omega * t + phase)


def loss(p, t, y):
    r = model(p, t) - y
    return 0.5 * np.sum(r * r)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", default=bool(os.environ.get("TRACEGRAD_SMALL")),
                    help="a CI-sized run (also: TRACEGRAD_SMALL=1)")
    args = ap.parse_args()
    n = 200 if args.small else 2000

    rng = np.random.default_rng(1)
    t = np.linspace(0.0, 10.0, n)
    p_true = np.array([2.0, 0.3, 2.5, 0.4])
    y = model(p_true, t) + 0.05 * rng.normal(size=n)

    fun = tg.value_and_grad(loss)          # p -> (loss, d loss / d p)
    calls = []

    def fun_and_jac(p):
        value, grad = fun(p, t, y)
        calls.append(float(value))
        return float(value), grad

    p0 = np.array([1.0, 0.1, 2.3, 0.0])
    res = minimize(fun_and_jac, p0, jac=True, method="BFGS", options={"gtol": 1e-8})
    for k in (0, len(calls) // 4, len(calls) // 2, len(calls) - 1):
        print(f"evaluation {k:3d}  loss {calls[k]:.6f}")
    print(f"{res.message} after {res.nit} iterations, {res.nfev} evaluations")
    print("fitted (amplitude, decay, omega, phase):", np.round(res.x, 3))
    print("true                                   :", p_true)
    assert res.fun < calls[0]


if __name__ == "__main__":
    main()
