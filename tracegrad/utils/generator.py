"""``Generator``: a seeded random generator object, as ``torch.Generator``.

It holds its own NumPy ``Generator`` (PCG64), so draws through it (in
``DataLoader(shuffle=True, generator=g)``, ``random_split``, ``nn.init``'s
``generator=``) do not touch tracegrad's global generator that
``tg.manual_seed`` seeds.  The streams differ from torch's (a different
algorithm): the same seed gives the same draws in tracegrad, not torch's.
"""
from __future__ import annotations

import numpy as np

__all__ = ["Generator"]

_DEFAULT_SEED = 67280421310721   # torch's default_generator seed


class Generator:
    """``Generator(device='cpu')``: ``manual_seed(s)``, ``seed()``,
    ``initial_seed()``, ``get_state()`` / ``set_state(state)``."""

    def __init__(self, device="cpu"):
        self.device = device
        self._seed = _DEFAULT_SEED
        self._rng = np.random.default_rng(self._seed)

    def manual_seed(self, seed):
        seed = int(seed)
        if seed < 0:
            seed += 2 ** 64
        self._seed = seed
        # in place: compiled code that draws from this generator holds its
        # NumPy Generator, and must draw the new stream
        self._rng.bit_generator.state = np.random.default_rng(seed).bit_generator.state
        return self

    def seed(self):
        s = int(np.random.SeedSequence().entropy % (2 ** 63))
        self.manual_seed(s)
        return s

    def initial_seed(self):
        return self._seed

    def get_state(self):
        """The generator's state (a dict of NumPy's bit generator, not torch's
        ByteTensor); set_state takes it back."""
        return {"seed": self._seed, "bit_generator": self._rng.bit_generator.state}

    def set_state(self, state):
        self._seed = state["seed"]
        self._rng.bit_generator.state = state["bit_generator"]
        return self

    def __repr__(self):
        return f"<tracegrad.Generator device={self.device!r} initial_seed={self._seed}>"
