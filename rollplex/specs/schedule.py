"""ScheduleSpec and ParallelSpec: how a step's graph is laid onto the GPUs."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rollplex.specs.base import Spec
from rollplex.specs.hardware import HardwareSpec
from rollplex.specs.model import ModelSpec


class ParallelSpec(Spec):
    """Parallel degrees of the two roles; training is FSDP over all its GPUs / train_tp."""

    rollout_tp: int | None = Field(None, ge=1, description="Tensor-parallel degree of rollout.")
    train_tp: int = Field(1, ge=1, description="Tensor-parallel degree of training.")


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
    overlap: Literal["auto", "piggyback", "streams", "sm_partition", "none"] = Field(
        "auto",
        description="How rollplex co-runs prefix work with decode. piggyback: same-weights "
        "prefix rows ride decode steps; streams: a second stream; sm_partition: SM "
        "partitions (green contexts); auto: per op, whichever the interference model "
        "predicts fastest, or serial if none pays (never slower than serial); an explicit "
        "mode is an ablation that places every eligible op that way; none: serial placement.",
    )
    prefill_once: bool = Field(
        True,
        description="Let the rollout's prefill stand in for the first update's training "
        "prefix forward (graph/passes/prefill_once.py) where both roles can hand over "
        "activations and the weights version is the same: the planner keeps it when its "
        "plan (holding each layer's input and the prefix K/V across the decode) fits and "
        "is faster. false: always run the separate training prefix forward.",
    )
    decode_once: bool = Field(
        True,
        description="Let the rollout's decode stand in for the first update's training "
        "response forward (graph/passes/decode_once.py) where both roles can hand over "
        "activations and the weights version is the same: the decode keeps each layer's "
        "output of every response token and the planner keeps it when its plan (holding "
        "those across the gap to the backward) fits and is faster. false: always run the "
        "separate training response forward.",
    )
    pack_responses: bool = Field(
        True,
        description="Run the response forwards (reference, trainer, critic) on the rows' "
        "real tokens packed into one sequence, as verl's use_remove_padding does "
        "(backends/torch/packed_rows.py): the same values, without the GEMMs over padding. "
        "verl's per-sample full forward (dedup=false) runs packed too. false: each row "
        "padded to its micro-batch's longest (the path before 2026-12-06, an ablation).",
    )
    early_backward: bool = Field(
        False,
        description="Opt in to the early backward of finished rows (issue 31.3; its math "
        "is backends/torch/early_backward.py): the plan is refused, naming the setting, "
        "where the gradient is not linear in per-row advantages (PPO/GAE, kl_in_reward, a "
        "later update). Not yet placed: the plan keeps one backward after the decode and "
        "says so in its notes.",
    )
    write_back: Literal["auto", "step_end"] = Field(
        "auto",
        description="When an offloaded optimizer state (or trained weights) goes back to "
        "host. auto: at the next step's start, beside its first ops, where the plan still "
        "fits the budget and gets faster (the copy leaves the step's end); step_end: right "
        "after the update, as verl's optimizer offload does (its baseline's setting).",
    )
    offload_in_part: bool = Field(
        True,
        description="Where optimizer state must wait on host, move only the share of it "
        "the budget needs (in sixteenths of its bytes); false: all of it, as verl's "
        "optimizer offload does (an ablation).",
    )
    overlap_min_gain: float = Field(
        0.01,
        ge=0.0,
        lt=1.0,
        description="With overlap=auto, the share of the predicted step time overlap must "
        "save to replace the serial+dedup placement: smaller predicted gains are inside the "
        "calibrated cost model's error, and overlap has costs it does not price (decode "
        "segments, unpacked forwards). 0 takes any predicted gain.",
    )
    train_micro_tokens: int = Field(
        16384,
        ge=1,
        description="Tokens per GPU in one training micro-batch (activations "
        "of one micro-batch are live at a time).",
    )
    train_micro_recompute: bool = Field(
        False,
        description="Run each training micro-batch's forward again inside the backward, "
        "one micro-batch at a time: the forward step keeps nothing for the backward, so "
        "one micro-batch's checkpointed layer inputs are live at a time instead of all of "
        "them, for one more forward pass over the responses.",
    )
    train_micro_fused: bool = Field(
        False,
        description="Run each training micro-batch's forward together with its backward, "
        "inside the backward step, as verl does: one micro-batch's checkpointed layer "
        "inputs are live at a time and no forward runs twice (the forward step computes "
        "nothing; the loss's value and metrics are filled in by the backward; under FSDP2 "
        "each rank's share of the global batch's too). Excludes train_micro_recompute.",
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

    @model_validator(mode="after")
    def _one_micro_mode(self) -> ScheduleSpec:
        if self.train_micro_fused and self.train_micro_recompute:
            raise ValueError(
                "schedule.train_micro_fused and schedule.train_micro_recompute are two ways "
                "to hold one micro-batch's activations: set one"
            )
        return self


def check_parallel(schedule: ScheduleSpec, model: ModelSpec, hardware: HardwareSpec) -> None:
    """Both TP degrees of `schedule.parallel` (see `check_tp`)."""
    p = schedule.parallel
    check_tp("train_tp", p.train_tp, model, hardware)
    if p.rollout_tp is not None:
        check_tp("rollout_tp", p.rollout_tp, model, hardware)


def check_tp(field: str, tp: int, model: ModelSpec, hardware: HardwareSpec) -> None:
    """A TP degree against the cluster and the model: it divides the GPUs, stays inside one
    NVLink node, and splits the attention heads evenly (KV heads may be replicated when TP
    exceeds them, as vLLM and Megatron do). Raises ValueError naming
    `schedule.parallel.<field>`."""
    where = f"schedule.parallel.{field}={tp}"
    limit = min(hardware.num_gpus, hardware.gpus_per_node)
    if tp > limit:
        raise ValueError(
            f"{where} exceeds the {limit} GPUs of one node of hardware '{hardware.name}' "
            f"({hardware.num_gpus} GPUs, {hardware.gpus_per_node} per node)"
        )
    if hardware.num_gpus % tp:
        raise ValueError(f"{where} does not divide hardware.num_gpus={hardware.num_gpus}")
    for name, n in (("num_heads", model.num_heads), ("vision.num_heads", model.vision.num_heads)):
        if n % tp:
            raise ValueError(f"{where} does not divide model.{name}={n}")
    kv = model.num_kv_heads
    if kv % tp and tp % kv:
        raise ValueError(f"{where} neither divides nor is a multiple of model.num_kv_heads={kv}")
