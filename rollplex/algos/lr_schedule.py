"""The policy's learning rate at each update: linear warm-up from 0, then constant or a
cosine decay to min_lr_ratio (verl's actor.optim warmup_style, HF's get_*_schedule_with_
warmup). A pure function of the update count, so a resumed run continues the curve."""

from __future__ import annotations

import math

from rollplex.specs import AlgoSpec


def lr_at(algo: AlgoSpec, update: int) -> float:
    """The learning rate of the update that follows `update` completed ones."""
    warmup = algo.lr_warmup_steps
    if update < warmup:
        return algo.lr * update / warmup
    if algo.lr_schedule == "constant":
        return algo.lr
    total = algo.lr_total_updates
    if total is None:
        raise ValueError(
            "algo.lr_schedule=cosine needs algo.lr_total_updates (the train job sets it)"
        )
    progress = min(1.0, (update - warmup) / max(1, total - warmup))
    floor = algo.min_lr_ratio
    return algo.lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))
