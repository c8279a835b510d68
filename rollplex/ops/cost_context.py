"""CostContext: what every op's cost formula reads besides the op itself: the specs and
the parallel layout (ops/costs.py, ops/rollout_costs.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from rollplex.specs import ModelSpec, WorkloadSpec


@dataclass(slots=True, frozen=True)
class CostContext:
    """Everything a formula needs besides the op: specs and the parallel layout."""

    model: ModelSpec
    workload: WorkloadSpec
    tp: int = 1
    dp: int = 1  # data-parallel ranks sharing the rows of a batch
    shards: int = 1  # FSDP shards of trainable state
    checkpointing: bool = True
    # the training forward over responses runs without grad and again in the backward
    # (schedule.train_micro_recompute): it keeps nothing, the backward pays a forward
    recompute_forward: bool = False
    # the training forward over responses runs inside the backward, per micro-batch, with
    # its backward (schedule.train_micro_fused, verl's): the forward step does nothing,
    # the backward pays the forward once
    fused_forward: bool = False
    # the trainer's micro-batches of a step (`planner.sizing.train_micro_batches`): its
    # forwards with grad and their backward run in these, each padded to its own longest
    # response, so rows run together (and the width they pay for) follow from it
    micro_batches: int = 1
    # the response forwards (reference, trainer, critic, verl's full per-sample one) run on
    # the rows' real tokens packed (schedule.pack_responses): they pay each row's own
    # tokens, not the padded width (response_width.py)
    packed_responses: bool = True
    # the share of the op's rows one of its runs holds (a micro-batch's: planner/layout.py),
    # which caps what the LM head's chunks hold against the op's rows (formulas/head.py)
    run_share: float = 1.0

    def per_rank(self, rows: int) -> float:
        return math.ceil(rows / self.dp)
