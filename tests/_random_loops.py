"""Random Python loops for the loop rewrite's differential test: each
function steps two carried arrays through a `for i in range(n)` loop of a
few random statements (plain and in-place updates, a branch on a static
flag, the loop index as a number or an index, an inner loop, an alias of
a carry) and returns a scalar."""
import random

_UNARY = ["np.sin({0})", "np.tanh({0})", "np.cos({0})", "({0} * 0.9)",
          "np.sqrt(1.0 + {0} * {0})", "np.exp(-{0} * {0})"]
_INDEXED = ["0.01 * i", "W[i]", "0.5", "np.cos(0.1 * i)"]


def _expr(rng, names, depth=0):
    if depth > 2 or rng.random() < 0.3:
        return rng.choice(names)
    r = rng.random()
    if r < 0.4:
        return rng.choice(_UNARY).format(_expr(rng, names, depth + 1))
    if r < 0.8:
        return (f"({_expr(rng, names, depth + 1)} {rng.choice(['+', '-', '*'])} "
                f"{_expr(rng, names, depth + 1)})")
    return f"({_expr(rng, names, depth + 1)} * {rng.choice(_INDEXED)})"


def module_source(seed, count):
    """Source of a module defining f0 ... f{count-1}(x)."""
    rng = random.Random(seed)
    lines = ["import numpy as np", "", f"FLAG = {rng.random() < 0.5}",
             "W = np.linspace(0.5, 1.5, 500)", ""]
    for k in range(count):
        n = rng.choice([5, 40, 300])
        body = []
        for _ in range(rng.randint(1, 4)):
            target = rng.choice(["a", "b", "c"])
            names = ["a", "b", "x"] + (["c"] if any("c = " in s for s in body) else [])
            e = _expr(rng, names)
            kind = rng.random()
            if kind < 0.15 and target != "c":
                body.append(f"        {target} += 0.01 * {e}")
            elif kind < 0.25:
                body.append(f"        if FLAG:\n            {target} = 0.5 * {e}\n"
                            f"        else:\n            {target} = {e}")
            else:
                old = target if target != "c" else "a"
                body.append(f"        {target} = 0.5 * {old} + 0.1 * {e}")
        if rng.random() < 0.2:
            body.append("        for j in range(12):\n            b = b * 0.99 + 0.01 * np.sin(a)")
        alias = rng.random() < 0.2
        lines += [f"def f{k}(x):", "    a = x * 1.0", "    b = x + 0.5",
                  *(["    keep = a"] if alias else []),
                  f"    for i in range({n}):", *body,
                  f"    return np.sum(a * a) + np.sum(b)" + (" + np.sum(keep)" if alias else ""),
                  ""]
    return "\n".join(lines)
