"""FsdpSpec: how the FSDP2 trainer shards and casts (the `backend.fsdp` config section)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rollplex.specs.base import Spec

DTypeName = Literal["float32", "bfloat16"]


class FsdpSpec(Spec):
    """FSDP2 trainer settings; read only when backend.trainer=fsdp."""

    param_dtype: DTypeName | None = Field(
        None,
        description="Compute dtype of the unsharded parameters (MixedPrecisionPolicy."
        "param_dtype); the sharded master weights and AdamW stay float32. None: bfloat16 "
        "on cuda, float32 on cpu (the bit-exact CPU tests need float32).",
    )
    reduce_dtype: DTypeName = Field(
        "float32", description="Dtype of the gradient reduce-scatter (MixedPrecisionPolicy)."
    )
    rollout_sync: Literal["gather", "alias", "share"] = Field(
        "gather",
        description="How the torch rollout gets the trainer's weights at weight_sync: "
        "'gather' all-gathers every parameter into the rollout's own full model; 'alias' "
        "points the rollout's parameters at the trainer's storage (no copy) and needs one "
        "rank with float32 compute (there a shard is the whole parameter); 'share' runs "
        "the rollout tensor-parallel (rollout_tp) with the tensors the layout algebra "
        "calls identical/view read in place from the trainer's compute-dtype shards, and "
        "rebuilds only the rest (backends/fsdp/share.py).",
    )
    rollout_tp: int = Field(
        1,
        ge=1,
        description="Tensor-parallel degree t_r of the torch rollout (rollout_sync=share "
        "only): each group of t_r ranks runs one replica (torch's Qwen2 TP plan); must "
        "divide the world size and the model's heads, KV heads, intermediate size and "
        "vocab. 1: a full replica per rank.",
    )
    reshard_after_forward: bool = Field(
        True,
        description="Free each decoder layer's / vision block's gathered parameters after "
        "its forward (re-gathered for backward); False keeps them to backward.",
    )

    def compute_dtype(self, device: str) -> DTypeName:
        if self.param_dtype is not None:
            return self.param_dtype
        return "bfloat16" if device.startswith("cuda") else "float32"
