"""Pure cost formulas of every op kind: FLOPs, bytes and memory per GPU.

Modules: `cost` (the `Cost` record and TP rules), `vision` (the ViT), `llm` (decoder
forwards: prefill, logprob, what a backward keeps), `decode` (the rollout's decode),
`engines` (what decode engines hold on a GPU) and `training` (backward, optimizer, sync,
reward).
"""

from rollplex.ops.formulas.cost import Cost, kv_fraction, tp_allreduce_bytes
from rollplex.ops.formulas.decode import (
    DecodeRollout,
    DecodeStepTerms,
    decode_rollout,
    decode_step,
    decode_steps,
)
from rollplex.ops.formulas.engines import (
    engine_attention,
    engine_kv_pool,
    torch_engine_fused_qkv,
    torch_engine_workspace,
)
from rollplex.ops.formulas.llm import (
    LogprobPart,
    activation_bytes_per_token,
    attention_flops,
    final_norm_bytes_per_token,
    kept_for_backward,
    kv_bytes_per_token,
    llm_forward,
    logprob,
    prefix_prefill,
    saved_activation_bytes,
    saved_tokens,
)
from rollplex.ops.formulas.training import (
    advantage,
    backward,
    optimizer_step,
    reward,
    vision_backward,
    weight_sync,
    weight_sync_link_bytes,
)
from rollplex.ops.formulas.vision import (
    vision_activation_bytes_per_patch,
    vision_encode,
    window_attention_sq_sum,
    workload_grid,
)

__all__ = [
    "Cost",
    "DecodeRollout",
    "DecodeStepTerms",
    "LogprobPart",
    "activation_bytes_per_token",
    "advantage",
    "attention_flops",
    "backward",
    "decode_rollout",
    "decode_step",
    "decode_steps",
    "engine_attention",
    "engine_kv_pool",
    "final_norm_bytes_per_token",
    "kept_for_backward",
    "kv_bytes_per_token",
    "kv_fraction",
    "llm_forward",
    "logprob",
    "optimizer_step",
    "prefix_prefill",
    "reward",
    "saved_activation_bytes",
    "saved_tokens",
    "torch_engine_fused_qkv",
    "torch_engine_workspace",
    "tp_allreduce_bytes",
    "vision_activation_bytes_per_patch",
    "vision_backward",
    "vision_encode",
    "weight_sync",
    "weight_sync_link_bytes",
    "window_attention_sq_sum",
    "workload_grid",
]
