"""What a role can do, declared on its class so the planner plans only that. The built roles'
declarations live here as data, so the planner (and `rollplex plan`, which stays free of
torch) reads them without importing a role's module; each role class points at its
constant, and a test keeps the registry and the classes in step. `ROLE_NAMES`: the
implementations a spec may choose for each role.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

# How a rollout's weights relate to the trainer's storage: the planner charges each its own
# rollout copy and weight_sync (planner/shared_weights.py).
WeightsLayout = Literal["algebra", "torch_tp", "replica", "engine"]


@dataclass(slots=True, frozen=True)
class RoleCapabilities:
    """What one role implementation can do. A vLLM rollout, for example, decodes in
    segments (engine steps) but cannot export its prefix KV to another role, nor host rows
    of another phase inside its decode steps: the planner must not place a piggyback there,
    and its prefix caching stands in for a separate `prefix_prefill`."""

    segmented_decode: bool = False  # decode can stop after a segment and resume
    prefix_kv_export: bool = False  # its prefix KV can be handed to another role
    piggyback_rows: bool = False  # other phases' rows can ride on its decode steps
    sleep_levels: tuple[int, ...] = ()  # levels of sleep() that free memory (vLLM: 1, 2)
    in_place_weight_load: bool = False  # load_weights updates the running engine, no restart
    # which weights versions its ops read: "live" (the trainer's current parameters,
    # aliased or copied in) and/or "checkpoint" (a model folder)
    weights_sources: tuple[str, ...] = ("live", "checkpoint")
    # the engine does prefix caching and vision encoding itself: prefix_prefill and
    # vision_encode are bookkeeping, their real work happens inside decode
    fused_prefix: bool = False
    # its decode's per-token logprobs are log softmax(logits / T), the distribution the
    # trainer scores (backends/torch/logprob.py token_logprobs); otherwise the runtime does
    # not use them as old logprobs (runtime/dispatch.py)
    scaled_logprobs: bool = False
    # how it holds the weights it decodes with (WeightsLayout), priced by the planner:
    # "algebra": reads the trainer's storage where the layout algebra's best rollout layout
    #   allows (fused qkv/gate_up, vision split when it can be, best rank map: what
    #   `rollplex weights` reports) and rebuilds the rest;
    # "torch_tp": the FSDP2 trainer's shared torch rollout (rollout_sync=share): torch's
    #   Qwen2 TP plan, vision and norms replicated, strided ranks, its own compute-dtype
    #   copy of the shards when that differs from the fp32 masters (weights/torch_rollout.py);
    # "replica": a full model of its own on every rank, refilled by a gather
    #   (rollout_sync=gather);
    # "engine": an engine that holds its own TP shard and loads into it in place (vLLM).
    weights_layout: WeightsLayout = "algebra"
    # its decode holds a static workspace (K/V at the cap for its row bucket) from the first
    # decode on, kept for the next step's (the torch engine: its CUDA graphs replay those
    # buffers); the planner holds it all step (ops/formulas/engines.py torch_engine_workspace)
    static_kv: bool = False
    # a trainer whose backward leaves float32 gradients (the FSDP2 trainer: its float32
    # shards are the masters); otherwise they are in the compute dtype, as autograd writes
    # them on bf16 parameters, and the optimizer step casts them onto float32 masters
    # (backends/torch/masters.py). The planner sizes the gradients and that cast by it.
    float32_grads: bool = False
    # its prefix forward can hand over what a checkpointed training prefix forward keeps
    # (each decoder layer's input, the prefix K/V, the last hidden state: torch's
    # `ExportedPrefix`), or, on a trainer, take those in place of running that forward
    # (`attach_exported`). Both ends declaring it let the prefill_once pass reuse the
    # rollout's prefill as the training prefix forward; an engine that keeps its
    # activations to itself (vLLM) does not, and its plan keeps the training forward.
    # Likewise its decode can keep each layer's output of every response token
    # (`start_decode_kept`), and the trainer take them in place of its response forward
    # (`attach_decoded`): the decode_once pass.
    activation_export: bool = False


# -- what the built roles declare ------------------------------------------------------------
TORCH_ROLLOUT = RoleCapabilities(
    segmented_decode=True,
    prefix_kv_export=True,  # its PrefixState is a plain value other ops can read
    piggyback_rows=True,  # same-weights prefix rows can run between its decode steps
    in_place_weight_load=True,  # LiveWeights: an alias, nothing copied
    scaled_logprobs=True,  # decode.py scores the sampled token under logits / T
    static_kv=True,  # engine/: static buffers and graphs kept across steps
    activation_export=True,  # prefix_prefill(export=True): backends/torch/exported_prefix.py
)
# torch reference and trainer; the trainer attaches an exported prefix (attach_exported)
TORCH_SCORER = RoleCapabilities(prefix_kv_export=True, activation_export=True)
# FSDP2 gathers a layer's shards only inside that layer's own forward: a recompute from
# exported inputs outside it would read shards (as for rides: piggyback_rows off)
FSDP_TRAINER = replace(TORCH_SCORER, float32_grads=True, activation_export=False)
VLLM_ROLLOUT = RoleCapabilities(
    segmented_decode=True,
    prefix_kv_export=False,
    piggyback_rows=False,
    sleep_levels=(1, 2),  # on GPU; no-ops on CPU
    in_place_weight_load=True,
    weights_sources=("live", "checkpoint"),
    fused_prefix=True,
    scaled_logprobs=True,  # logprobs_mode=processed_logprobs at top_p=1 (engine.py)
    weights_layout="engine",
)
# backend.vllm.weights=share: the trainer's parameters are views of its tensors (the
# algebra's layout at TP 1, backends/vllm/share.py), so it holds no copy and cannot sleep
VLLM_SHARED_ROLLOUT = replace(VLLM_ROLLOUT, sleep_levels=(), weights_layout="algebra")
# The FSDP2 trainer's torch rollout, by backend.fsdp.rollout_sync: the same decode as
# TORCH_ROLLOUT, its weights held as that mode holds them ("alias": one float32 rank, whose
# shard is the whole parameter: nothing added, as the algebra says on one GPU).
# None hosts the trainer's rows: a ride runs the trainer's layers' submodules directly
# (engine/riders.py), and FSDP2 gathers a layer's shards only in that layer's own forward.
_FSDP_ROLLOUT = replace(TORCH_ROLLOUT, piggyback_rows=False, activation_export=False)
FSDP_ROLLOUTS = {
    "gather": replace(_FSDP_ROLLOUT, weights_layout="replica"),
    "alias": _FSDP_ROLLOUT,
    # its tensor-parallel decode is the eager loop over a growing cache, not the engine
    "share": replace(_FSDP_ROLLOUT, weights_layout="torch_tp", static_kv=False),
}


# -- the role names a spec may choose ----------------------------------------------------------
# Each registered implementation of each role (backend.rollout=vllm ...): BackendSpec checks
# a choice against these, and the registry (rollplex.backends.ROLES) holds exactly these.
ROLE_NAMES: dict[str, tuple[str, ...]] = {
    "rollout": ("torch", "vllm"),
    "reference": ("torch",),
    "trainer": ("torch", "fsdp"),
}
