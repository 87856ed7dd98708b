"""Aim a cannon through a long simulation: gradients through a loop node.

    python examples/projectile.py [--small]

A projectile with quadratic air drag is stepped with explicit Euler for
thousands of steps.  The time stepping is written with ``tg.fori_loop``, so
it becomes ONE node of the graph whose body (a dozen NumPy ops) is traced
once: compiling takes the same time for 100 or 100,000 steps, and the
generated code is a Python ``for`` loop over the body's NumPy code (its
reverse mode a second loop, backwards over the stored states).
tg.value_and_grad differentiates the whole rollout with respect to the
launch velocity, and gradient descent finds the velocity that lands the
projectile on the target at the final time.
"""
import argparse
import os

import numpy as np

import tracegrad as tg

GRAVITY = np.array([0.0, -9.81])


def simulate(v0, drag, n_steps, dt):
    """Final position and velocity of the projectile launched from the origin
    with velocity v0.  Runs eagerly on NumPy arrays too."""
    def step(i, state):
        x, v = state
        speed = np.sqrt(np.sum(v * v))
        a = GRAVITY - drag * speed * v
        v = v + dt * a
        x = x + dt * v
        return (x, v)
    return tg.fori_loop(0, n_steps, step, (np.zeros(2), v0))


def miss(v0, target, drag, n_steps, dt):
    """Squared distance between the final position and the target."""
    final, _ = simulate(v0, drag, n_steps, dt)
    d = final - target
    return np.sum(d * d)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", default=bool(os.environ.get("TRACEGRAD_SMALL")),
                    help="a CI-sized run (also: TRACEGRAD_SMALL=1)")
    args = ap.parse_args()
    n_steps, iters = (2000, 60) if args.small else (20000, 200)
    dt = 2.0 / n_steps
    target, drag = np.array([12.0, 2.0]), 0.05

    # drag, n_steps and dt are plain Python values: static, part of the cache key
    step = tg.value_and_grad(miss, static_argnums=(2, 3, 4))
    v0 = np.array([5.0, 5.0])
    lr = 0.05
    for i in range(iters + 1):
        d2, g = step(v0, target, drag, n_steps, dt)
        if i % (iters // 5) == 0:
            print(f"iteration {i:3d}  miss distance {np.sqrt(d2):8.4f} m  v0 = {np.round(v0, 3)}")
        v0 = v0 - lr * g
    final, _ = simulate(v0, drag, n_steps, dt)
    print(f"launch velocity {np.round(v0, 3)} m/s lands at {np.round(final, 3)}; "
          f"target {target}")

    # the gradient agrees with central finite differences of the same simulation
    eps = 1e-6
    fd = [(miss(v0 + eps * e, target, drag, n_steps, dt) - miss(v0 - eps * e, target, drag,
                                                               n_steps, dt)) / (2 * eps)
          for e in np.eye(2)]
    print("gradient check: tracegrad", np.round(step(v0, target, drag, n_steps, dt)[1], 6),
          " finite differences", np.round(fd, 6))


if __name__ == "__main__":
    main()
