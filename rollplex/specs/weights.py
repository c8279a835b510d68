"""WeightsSpec: the training and rollout placements that `rollplex weights` compares
(rollplex.weights). Training and rollout are colocated on the same
train_fsdp * train_tp GPUs."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rollplex.specs.base import Spec

Dtype = Literal["bfloat16", "float16", "float32"]


class WeightsSpec(Spec):
    train_fsdp: int = Field(
        1, ge=1, description="FSDP2 degree d_t of training: each parameter Shard(0) over d_t ranks."
    )
    train_tp: int = Field(
        1,
        ge=1,
        description="Training TP degree (torchtitan's plan on the LLM: q/k/v/gate/up and "
        "embed/lm_head Shard(0), o/down Shard(1)); the GPUs are train_fsdp * train_tp, "
        "TP innermost (GPU = dp_rank * train_tp + tp_rank).",
    )
    rollout_tp: int = Field(
        1, ge=1, description="vLLM tensor-parallel degree t_r of each rollout replica."
    )
    rollout_replicas: int | None = Field(
        None,
        ge=1,
        description="Rollout replicas; None: as many as fill the training GPUs "
        "(train_fsdp * train_tp / rollout_tp). Set, it must equal that number.",
    )
    rank_map: Literal["auto", "contiguous", "strided", "aligned"] | list[list[int]] = Field(
        "auto",
        description="Which GPU is which rollout rank. contiguous: replica k on GPUs "
        "[k*t_r, (k+1)*t_r); strided: replica k on GPUs k, k+R, ... (R replicas); aligned: "
        "each GPU is the rank whose rows its training shard holds; a list: one list of t_r "
        "GPU ids per replica, in rank order; auto: whichever shares the most bytes.",
    )
    vision: Literal["auto", "tp", "replicated"] = Field(
        "auto",
        description="The rollout's vision tower: tp (vLLM's mm_encoder_tp_mode='weights') "
        "or replicated ('data'); auto: tp when rollout_tp divides its heads and widths.",
    )
    storage: Literal["aliasing", "fsdp"] = Field(
        "aliasing",
        description="Training storage layout. fsdp: plain FSDP2, each parameter in its own "
        "order. aliasing: row-parallel weights stored as stacked rollout column blocks "
        "(FSDP2 Shard(1) when train_fsdp == rollout_tp) and the vision qkv interleaved by "
        "rollout rank, so FSDP chunks fall inside single rollout tensors.",
    )
    dtype: Dtype = Field("bfloat16", description="dtype of the rollout copy.")
    train_dtype: Dtype = Field(
        "bfloat16",
        description="dtype of the training compute copy that rollout may alias (fp32 masters "
        "stay in the optimizer); if it differs from dtype, nothing is shared.",
    )

    @model_validator(mode="after")
    def _check(self) -> WeightsSpec:
        world = self.train_fsdp * self.train_tp
        if world % self.rollout_tp:
            raise ValueError(
                f"weights.rollout_tp={self.rollout_tp} does not divide the {world} training "
                f"GPUs (train_fsdp={self.train_fsdp} x train_tp={self.train_tp})"
            )
        if self.rollout_replicas is not None and self.rollout_replicas * self.rollout_tp != world:
            raise ValueError(
                f"weights.rollout_replicas={self.rollout_replicas} x rollout_tp="
                f"{self.rollout_tp} must equal the {world} training GPUs (colocated rollout)"
            )
        return self

    @property
    def world(self) -> int:
        return self.train_fsdp * self.train_tp
