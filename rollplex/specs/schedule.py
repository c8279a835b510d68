"""ScheduleSpec and ParallelSpec: how a step's graph is laid onto the GPUs."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rollplex.specs.base import Spec


class ParallelSpec(Spec):
    """Parallel degrees of the two roles. None means: let the planner choose."""

    rollout_tp: int | None = Field(None, ge=1, description="Tensor-parallel degree of rollout.")
    train_tp: int = Field(1, ge=1, description="Tensor-parallel degree of training.")
    train_fsdp: int | None = Field(
        None, ge=1, description="FSDP (sharded data-parallel) degree of training; None: all GPUs."
    )


class ScheduleSpec(Spec):
    """One of the three step schedules, with the planner's knobs."""

    name: Literal["serial", "disaggregated", "rollplex"] = Field(
        "rollplex",
        description="serial: phases back to back (verl); disaggregated: separate "
        "rollout and training pools; rollplex: prefix work moved into the decode window.",
    )
    dedup: bool = Field(
        True,
        description="Apply the deduplicating passes (share_group_prefix, "
        "reuse_across_phases). serial with dedup=false is the verl baseline.",
    )
    overlap: Literal["auto", "streams", "sm_partition"] = Field(
        "auto",
        description="How rollplex co-runs prefix work beside decode: two streams, "
        "an SM partition, or whichever the interference model predicts faster.",
    )
    decode_sm_fraction: float = Field(
        0.5, gt=0, lt=1, description="Share of SMs given to decode when partitioned."
    )
    chunk_tokens: int = Field(
        8192,
        ge=1,
        description="Prefix work is split into chunks of at most this many tokens "
        "so it fits into the decode window.",
    )
    memory_strategy: Literal["naive", "greedy_by_size"] = Field(
        "greedy_by_size", description="Offset assignment strategy for memory slots."
    )
    rollout_gpus: int | None = Field(
        None, ge=1, description="Disaggregated only: GPUs in the rollout pool (None: best split)."
    )
    parallel: ParallelSpec = Field(default_factory=ParallelSpec, description="Parallel degrees.")
