"""Fit the four parameters of a Lotka-Volterra model to noisy observations,
written as a SciPy user writes it: ``scipy.integrate.solve_ivp`` in the loss,
``scipy.optimize.minimize`` with ``jac=tg.grad(loss)``.

    python examples/lotka_volterra.py [--small]

tracegrad differentiates ``solve_ivp`` as called: the right-hand side is traced
and compiled with the loss, SciPy integrates the compiled right-hand side, and
the gradient is forward sensitivities whose right-hand side (the model's
tangents) is compiled too, integrated by the same solver at the same
tolerances (docs/scipy.md).  The
program compares that gradient with central finite differences at the start
point, then runs the same BFGS fit twice, with tracegrad's gradient and with
finite-difference gradients, and prints both times and final losses.
Needs SciPy (pip install ".[examples]").
"""
import argparse
import os
import time

import numpy as np
from scipy.integrate import solve_ivp
from scipy.optimize import minimize

import tracegrad as tg

RTOL, ATOL = 1e-7, 1e-7          # the solver's tolerances (for the data, the fit and the gradients)


def lotka_volterra(t, z, p):
    """Prey x and predators y: x' = a x - b x y, y' = -c y + d x y."""
    a, b, c, d = p[0], p[1], p[2], p[3]
    x, y = z[0], z[1]
    return np.array([a * x - b * x * y, -c * y + d * x * y])


def simulate(p, z0, t_obs):
    sol = solve_ivp(lotka_volterra, (0.0, t_obs[-1]), z0, t_eval=t_obs, args=(p,),
                    rtol=RTOL, atol=ATOL)
    return sol.y                  # (2, len(t_obs))


def make_loss(z0, t_obs, data):
    def loss(p):
        r = simulate(p, z0, t_obs) - data
        return np.sum(r * r) / data.size
    return loss


def central_differences(f, p, rel=1e-5):
    g = np.zeros_like(p)
    for i in range(p.size):
        h = rel * max(1.0, abs(p[i]))
        e = np.zeros_like(p)
        e[i] = h
        g[i] = (f(p + e) - f(p - e)) / (2 * h)
    return g


def fit(loss, jac, p0, maxiter):
    t0 = time.perf_counter()
    res = minimize(loss, p0, jac=jac, method="BFGS", options={"maxiter": maxiter, "gtol": 1e-7})
    return res, time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", default=bool(os.environ.get("TRACEGRAD_SMALL")),
                    help="a CI-sized run (also: TRACEGRAD_SMALL=1)")
    args = ap.parse_args()
    n_obs, t_end, maxiter = (12, 3.0, 2) if args.small else (25, 6.0, 6)

    rng = np.random.default_rng(0)
    p_true = np.array([1.5, 1.0, 3.0, 1.0])
    z0 = np.array([10.0, 5.0])
    t_obs = np.linspace(0.0, t_end, n_obs)
    clean = simulate(p_true, z0, t_obs)
    data = clean + 0.1 * np.std(clean, axis=1, keepdims=True) * rng.normal(size=clean.shape)
    loss = make_loss(z0, t_obs, data)
    p0 = np.array([1.3, 0.9, 3.3, 1.1])

    grad = tg.grad(loss)                       # solve_ivp inside: one node of the compiled graph
    grad(p0)                                   # the first call traces and compiles
    t0 = time.perf_counter()
    g_tg = grad(p0)
    t1 = time.perf_counter()
    g_fd = central_differences(loss, p0)
    t2 = time.perf_counter()
    rel = np.max(np.abs(g_tg - g_fd)) / np.max(np.abs(g_fd))
    print(f"start: loss {loss(p0):.6f}")
    print(f"gradient (tracegrad)           : {np.array2string(g_tg, precision=6)}")
    print(f"gradient (central differences) : {np.array2string(g_fd, precision=6)}")
    print(f"max relative difference {rel:.2e}")
    print(f"one gradient: tracegrad {1e3 * (t1 - t0):.1f} ms, central differences "
          f"({2 * p0.size} solves) {1e3 * (t2 - t1):.1f} ms")

    res_tg, time_tg = fit(loss, grad, p0, maxiter)
    res_fd, time_fd = fit(loss, lambda p: central_differences(loss, p), p0, maxiter)
    print(f"fit with tg.grad(loss)         : loss {res_tg.fun:.6f}  {res_tg.nit:3d} iterations  "
          f"{time_tg:6.2f} s  p = {np.round(res_tg.x, 4)}")
    print(f"fit with finite differences    : loss {res_fd.fun:.6f}  {res_fd.nit:3d} iterations  "
          f"{time_fd:6.2f} s  p = {np.round(res_fd.x, 4)}")
    print(f"true parameters                : p = {p_true}")
    assert res_tg.fun < loss(p0)


if __name__ == "__main__":
    main()
