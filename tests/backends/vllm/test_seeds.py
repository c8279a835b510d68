"""Per-row sampling seeds are a function of (engine seed, step seed, row) only: runs are
reproducible, and no two rows, steps or seeds share a stream. Runs without vLLM."""

from __future__ import annotations

import pytest
import torch

from rollplex.backends.base import BackendError
from rollplex.backends.vllm.decode import row_seed, step_seed


def test_row_seeds_are_stable_and_distinct():
    assert row_seed(0, 5, 3) == row_seed(0, 5, 3)
    seeds = {row_seed(s, b, r) for s in range(3) for b in range(3) for r in range(8)}
    assert len(seeds) == 3 * 3 * 8
    assert all(0 <= x < 1 << 63 for x in seeds)


def test_step_seed_from_generator_or_int():
    a = step_seed(torch.Generator().manual_seed(11))
    assert a == step_seed(torch.Generator().manual_seed(11))
    assert a != step_seed(torch.Generator().manual_seed(12))
    assert step_seed(42) == 42
    with pytest.raises(BackendError, match="generator"):
        step_seed("seed")
