"""Epoch order shared by every source: stream position -> row, a pure function of the seed.

Position p of the endless stream lies in epoch p // len; each epoch is its own permutation
of the rows, seeded by (seed, epoch) through numpy's PCG64, so it is the same in every
process and after a resume, whatever steps ran before.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from functools import lru_cache

import numpy as np

from rollplex.data.sample import DataError, Sample


@lru_cache(maxsize=4)  # a step spans at most two epochs; keep a few for eval + train
def permutation(seed: int, epoch: int, length: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch]).permutation(length)


class IndexedSource(ABC):
    """A source of `length` rows, read by index; subclasses implement `row(i)`."""

    name: str
    split: str

    def __init__(self, name: str, split: str, seed: int, length: int) -> None:
        if length < 1:
            raise DataError(f"data source '{name}' split '{split}' has no rows")
        if seed < 0:
            raise DataError(f"data seed must be >= 0, got {seed}")
        self.name, self.split, self.seed, self.length = name, split, seed, length

    def __len__(self) -> int:
        return self.length

    @abstractmethod
    def row(self, index: int) -> Sample:
        """Row `index` in [0, len) of the split, in file order."""

    def rows(self, step: int, n: int) -> list[int]:
        """Row indices of step `step`: stream positions [step*n, (step+1)*n)."""
        if step < 0 or n < 1:
            raise ValueError(f"need step >= 0 and n >= 1, got step={step}, n={n}")
        out = []
        for p in range(step * n, (step + 1) * n):
            epoch, i = divmod(p, self.length)
            out.append(int(permutation(self.seed, epoch, self.length)[i]))
        return out

    def batch(self, step: int, n: int) -> list[Sample]:
        return [self.row(i) for i in self.rows(step, n)]

    def epoch(self, step: int, n: int) -> int:
        return step * n // self.length

    def uid(self, index: int) -> str:
        return f"{self.name}:{self.split}:{index}"
