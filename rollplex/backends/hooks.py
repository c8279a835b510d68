"""Step hooks: what a data-parallel trainer changes in the dispatch's step, and nothing else.
The dispatch calls them at the edges of each RL step; the defaults (`StepHooks`) run the
step as one process. A trainer entry with a `runtime` (rollplex.backends.ROLES) brings its
own in a `RoleRuntime` (backends/step.py).
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch

from rollplex.graph.ir import Graph


def decode_seed(seed: int, step: int) -> int:
    """The decode generator's seed for RL step `step`: a function of (seed, step) only, so
    a resumed run draws the same tokens as an uninterrupted one."""
    digest = hashlib.sha256(f"rollplex-decode:{seed}:{step}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


class StepHooks:
    """One process runs the whole step. A data-parallel trainer overrides:
    - `inputs`: the step's prompts this process runs (a rank's slice of them);
    - `generator`: the decode's random stream (one per step, or one per sample, so a
      sample's tokens do not depend on which rank decodes it);
    - `metrics`: the step's metrics as logged (averaged over ranks)."""

    def bind(self, graph: Graph) -> None:
        """Called once per graph, before its steps run."""

    def inputs(self, step: int, inputs: Any) -> Any:
        return inputs

    def generator(self, step: int, seed: int, device: torch.device) -> Any:
        return torch.Generator(device).manual_seed(decode_seed(seed, step))

    def metrics(self, values: dict[str, float]) -> dict[str, float]:
        return values


__all__ = ["StepHooks", "decode_seed"]
