"""VllmSpec: the knobs of the vLLM rollout engine that users expect to set.

The KV cache is always bounded: vLLM otherwise sizes it from free memory (about 9 GiB on
CPU, most of the GPU on CUDA), which would take memory the plan gives to other phases.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rollplex.specs.base import Spec

GiB = 1 << 30


class VllmSpec(Spec):
    """Engine settings of the vLLM rollout role (`backend.rollout=vllm`)."""

    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "bfloat16",
        description="Weights and activations dtype. Use float32 on CPU: bf16 prefills of 1-4 "
        "tokens crash the AMX attention kernel there (FACTS.md).",
    )
    max_model_len: int = Field(
        4096, ge=16, description="Longest prompt + response, in tokens, the engine accepts."
    )
    kv_cache_bytes: int = Field(
        1 * GiB,
        ge=1 << 20,
        description="KV cache size in bytes (vLLM's kv_cache_memory_bytes). The plan's budget "
        "for the rollout's KV, when it has one, overrides this.",
    )
    enforce_eager: bool = Field(
        False, description="Disable torch.compile and CUDA graphs (slower decode, fast start)."
    )
    cuda_graph_sizes: tuple[int, ...] | None = Field(
        None,
        description="Batch sizes to capture CUDA graphs for; None keeps vLLM's default. "
        "Ignored on CPU and with enforce_eager.",
    )
    gpu_memory_utilization: float = Field(
        0.9,
        gt=0,
        le=1,
        description="Share of the GPU vLLM may use in all (weights, activations, KV). "
        "kv_cache_bytes still bounds the KV cache.",
    )
    seed: int = Field(0, ge=0, description="Engine seed; each request's seed also depends on it.")
    return_logprobs: bool = Field(
        False,
        description="Return per-token logprobs of the sampled tokens, of logits / T (needs "
        "algo.top_p=1): a one-update step then takes them as its old logprobs, as it does "
        "the torch rollout's, and algo.rollout_correction and kl_in_reward read them. Off, "
        "the old logprobs are the trainer's own, detached (exactly on-policy); asking doubles "
        "the decode step at batch 256 (FACTS.md).",
    )
    enable_prefix_caching: bool = Field(
        True, description="Reuse each prompt's prefix KV across its G samples and across steps."
    )
    max_num_seqs: int = Field(256, ge=1, description="Most sequences decoded in one engine step.")
    enable_sleep_mode: bool = Field(
        True, description="Allow sleep/wake on GPU (frees weights and KV between rollouts)."
    )
    sleep: Literal["auto", "always", "never"] = Field(
        "auto",
        description="Whether the engine sleeps (level 2) between rollouts: 'auto' lets the "
        "planner decide (awake when the plan fits without offloading, which saves the sleep "
        "and wake time), 'always' frees its weights and KV for the training phase every step.",
    )

    weights: Literal["load", "share"] = Field(
        "load",
        description="'load': the engine holds its own copy, loaded in place after every "
        "optimizer step. 'share' (CUDA, torch trainer in the engine's dtype): the trainer's "
        "parameters become views of the engine's tensors (q/k/v rows of its fused qkv_proj, "
        "gate/up of gate_up_proj...), so no second copy exists and a weight sync only resets "
        "the engine's caches; such an engine never sleeps (its weights are training storage).",
    )

    @model_validator(mode="after")
    def _check(self) -> VllmSpec:
        if self.cuda_graph_sizes is not None and any(s < 1 for s in self.cuda_graph_sizes):
            raise ValueError(f"cuda_graph_sizes must be >= 1, got {self.cuda_graph_sizes}")
        if self.weights == "share" and self.sleep == "always":
            raise ValueError(
                "weights='share' with sleep='always': a sharing engine's weights are the "
                "trainer's parameters, which sleeping would drop; use sleep='auto' or 'never'"
            )
        return self
