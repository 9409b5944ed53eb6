"""Seeded, resumable prompt sampling: the order of a run continues exactly after `--resume`."""

from __future__ import annotations

import numpy as np


class EpochSampler:
    """Yields dataset indices in a seeded order, epoch after epoch (a new permutation each epoch).

    The whole position is two integers (`epoch`, `pos`): `state_dict()` / `load_state_dict()` let a resumed run
    draw exactly the prompts the interrupted run would have drawn next.

    Args:
        size: number of items (> 0).
        seed: base seed; epoch e uses permutation `default_rng(seed + e)`.
        shuffle: False gives 0..size-1 every epoch.

    Raises:
        ValueError: `size` < 1.
    """

    def __init__(self, size: int, seed: int = 0, shuffle: bool = True):
        if size < 1:
            raise ValueError("cannot sample from an empty dataset")
        self.size, self.seed, self.shuffle = size, seed, shuffle
        self.epoch, self.pos = 0, 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.size)
        return np.random.default_rng(self.seed + epoch).permutation(self.size)

    def next(self, k: int) -> list[int]:
        """The next `k` indices (crossing into the next epoch when this one runs out)."""
        out: list[int] = []
        while len(out) < k:
            take = min(k - len(out), self.size - self.pos)
            out.extend(int(i) for i in self._order[self.pos : self.pos + take])
            self.pos += take
            if self.pos == self.size:
                self.epoch, self.pos = self.epoch + 1, 0
                self._order = self._permutation(self.epoch)
        return out

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos, "size": self.size, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        if state["size"] != self.size:
            raise ValueError(f"sampler state is for {state['size']} prompts, the dataset has {self.size}")
        self.epoch, self.pos = int(state["epoch"]), int(state["pos"])
        self._order = self._permutation(self.epoch)
