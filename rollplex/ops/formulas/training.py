"""Costs of the training side: backward, optimizer step, weight sync, reward and advantage.

Backward ≈ 2x the forward FLOPs; checkpointing re-runs each layer's forward but lm_head and
down_proj (non-reentrant checkpoint stops once every saved tensor is back); a frozen vision
tower has no backward. `tp` splits like the forward, `shards` (FSDP) splits gradients and
optimizer state; gradients are in the compute dtype.
"""

from __future__ import annotations

from rollplex.ops.formulas.cost import FP32, Cost, check_tp
from rollplex.ops.formulas.head import head_scratch
from rollplex.ops.formulas.llm import (
    LogprobPart,
    activation_bytes_per_token,
    decoder_forward,
    kept_for_backward,
    kv_bytes_per_token,
    lm_head_forward,
    logprob_shape,
)
from rollplex.ops.formulas.vision import vision_activation_bytes_per_patch, vision_encode
from rollplex.specs.model import ModelSpec

ADAMW_FLOPS_PER_PARAM = 12  # moments, bias corrections, sqrt, divide, decay, update
ADAMW_STATE_BYTES = 12  # fp32 master weights, first and second moments
# float32 gradients a step through masters casts at a time (backends/torch/masters.py)
MASTER_STEP_CHUNK_BYTES = 1 << 30


def _check_shards(shards: int) -> None:
    if shards < 1 or int(shards) != shards:
        raise ValueError(f"shards must be a positive integer, got {shards}")


def backward(
    model: ModelSpec,
    sequences: float,
    prefix_tokens: int,
    response_tokens: int,
    part: LogprobPart = "full",
    tp: int = 1,
    *,
    checkpointing: bool = True,
    shards: int = 1,
    run_share: float = 1.0,
    entropy_grad: bool = False,
    layer_major: bool = False,
) -> Cost:
    """Backward of the actor's `logprob(..., grad=True)` forward with the same arguments.

    Reads the weights (twice with checkpointing: recompute and backward) and the saved
    activations; writes the LLM gradients, sharded over `shards` (persistent: the optimizer
    reads them). Split training (prefix and response parts) accumulates into one gradient
    buffer, which the planner should count once. Scratch: one layer's full activations (the
    recomputed layer), one layer's unsharded gradients, and the forward's own scratch, its
    head's the backward's (`head_scratch`: in runs of `run_share` of the rows, with the
    entropy's gradient where the loss has an entropy term). `layer_major`: a prefix whose
    forward was exported (prefill once; PPO's critic) replays layer by layer over every row, so its
    backward also holds the gradients at a layer's output and at its input over all rows
    (engine/riders.py `_Replayed`), not one micro-batch's.
    """
    _check_shards(shards)
    new, context, rows, keep_kv = logprob_shape(part, prefix_tokens, response_tokens)
    layers = decoder_forward(model, sequences, new, context, tp, keep_kv)
    head = lm_head_forward(model, sequences, rows, tp)
    head_bytes = sequences * rows * model.vocab_size / tp * FP32
    head_bwd = head_scratch(
        head_bytes, "backward", run_share=run_share, fused=tp == 1, entropy_grad=entropy_grad
    )
    tokens = sequences * new
    kv_tok = kv_bytes_per_token(model, tp)
    # Reads what the forward kept (`logprob(grad=True)`); the prefix part also reads the
    # K/V gradients the response part left.
    saved = kept_for_backward(
        model, sequences, prefix_tokens, response_tokens, part, tp, checkpointing
    )
    saved += tokens * kv_tok if keep_kv else 0.0
    down_proj = 2 * tokens * model.hidden_size * model.intermediate_size / tp
    recompute = layers.flops - model.num_layers * down_proj if checkpointing else 0.0
    weights = layers.weight_bytes * (2 if checkpointing else 1) + head.weight_bytes
    grads = model.llm_param_count() * model.dtype_bytes / tp / shards
    # The response part hands the gradients of the cached prefix K/V to the prefix part.
    kv_grads = sequences * context * kv_tok
    layer_acts = tokens * activation_bytes_per_token(model, False, tp) / model.num_layers
    # one layer's parameter gradients before they accumulate: whole in every run, so over
    # the run's share (the planner scales scratch by it, as `head_scratch`'s cap is)
    layer_grads = model.llm_layer_params() * model.dtype_bytes / tp / run_share
    scratch = max(layers.transient_bytes, head_bwd) + layer_acts + layer_grads
    if layer_major:  # whole in every run, as layer_grads
        scratch += 2 * tokens * model.hidden_size * model.dtype_bytes / run_share
    return Cost(
        flops=2 * (layers.flops + head.flops) + recompute,
        bytes_read=weights + saved,
        bytes_written=grads + kv_grads,
        weight_bytes=weights,
        persistent_bytes=grads + kv_grads,
        transient_bytes=scratch,
    )


def vision_backward(
    model: ModelSpec,
    images: float,
    patches_per_image: int,
    tp: int = 1,
    *,
    checkpointing: bool = True,
    shards: int = 1,
    temporal_patches: int = 1,
    grid_hw: tuple[int, int] | None = None,
) -> Cost:
    """Backward of a trainable vision tower (`model.trainable_vision`), as `backward` does.

    The patch embed needs no input gradient (pixels), so it costs 1x, not 2x; checkpointing
    recomputes the blocks (less their down_proj, see above), not the patch embed or merger.
    """
    _check_shards(shards)
    check_tp(tp)
    v = model.vision
    fwd = vision_encode(
        model, images, patches_per_image, tp, temporal_patches=temporal_patches, grid_hw=grid_hw
    )
    n = images * patches_per_image
    patch_embed = 2 * n * v.patch_dim * v.hidden_size / tp
    merger = 2 * n * v.hidden_size * (v.hidden_size * v.merge_factor + v.out_hidden_size) / tp
    down_proj = v.depth * 2 * n * v.hidden_size * v.intermediate_size / tp
    recompute = fwd.flops - patch_embed - merger - down_proj if checkpointing else 0.0
    weights = fwd.weight_bytes * (2 if checkpointing else 1)
    saved = n * vision_activation_bytes_per_patch(model, checkpointing, tp)
    grads = v.param_count() * model.dtype_bytes / tp / shards
    layer_acts = n * vision_activation_bytes_per_patch(model, False, tp) / v.depth
    return Cost(
        flops=2 * fwd.flops - patch_embed + recompute,
        bytes_read=weights + saved,
        bytes_written=grads,
        weight_bytes=weights,
        persistent_bytes=grads,
        transient_bytes=fwd.transient_bytes + layer_acts,
    )


def optimizer_step(
    model: ModelSpec,
    trainable_params: float | None = None,
    shards: int = 1,
    grad_bytes: int | None = None,
) -> Cost:
    """AdamW on this GPU's 1/`shards` of the trainable parameters (default: the model's).

    Reads the gradients and the fp32 master weights and moments (12 B/param); writes the
    state back plus the compute-dtype parameters the forward uses. Persistent: state and
    parameters (12 + 2 B/param for bf16); the gradients (`grad_bytes` a parameter, default
    the model's dtype) are `backward`'s output, so the whole training footprint is
    16 B/param / shards. Scratch: the float32 casts of gradients held in a narrower dtype
    (backends/torch/masters.py `clipped_step`): at most one tensor's while its float32 norm
    is taken (bounded as a cast: the kernel may make one), then a chunk's
    (`MASTER_STEP_CHUNK_BYTES`, or the largest tensor where that is larger) whose narrower
    gradients are freed as they are cast; and nothing for AdamW itself, which the trainers
    run fused (in place; torch's foreach default would add one fp32 temporary per
    parameter).
    """
    _check_shards(shards)
    params = model.trainable_param_count() if trainable_params is None else trainable_params
    p = params / shards
    b = model.dtype_bytes
    g = b if grad_bytes is None else grad_bytes
    kept = p * (ADAMW_STATE_BYTES + b)
    largest = min(p, model.vocab_size * model.hidden_size)  # the embedding, the largest tensor
    chunk = min(p, max(MASTER_STEP_CHUNK_BYTES / FP32, largest))
    scratch = max(largest * FP32, chunk * (FP32 - g)) if g < FP32 else 0.0
    return Cost(
        flops=ADAMW_FLOPS_PER_PARAM * p,
        bytes_read=p * (b + ADAMW_STATE_BYTES),
        bytes_written=kept,
        weight_bytes=p * FP32,  # the master weights
        persistent_bytes=kept,
        transient_bytes=scratch,
    )


def weight_sync(
    param_bytes: float, *, tp: int = 1, shards: int = 1, aliased_fraction: float = 0.0
) -> Cost:
    """Rebuild the rollout's weights (TP degree `tp`) from the trainer's after a step.

    Each GPU needs its 1/tp of the weights, less the `aliased_fraction` that shares the
    trainer's storage (parallelism-aware weight sharing). It reads that much (locally or
    from peers) and writes it into the rollout layout, which it keeps. The part that crosses
    links is `weight_sync_link_bytes`; the cost model turns both into time.
    """
    if not 0.0 <= aliased_fraction <= 1.0:
        raise ValueError(f"aliased_fraction must lie in [0, 1], got {aliased_fraction}")
    _check_shards(shards)
    check_tp(tp)
    need = (1 - aliased_fraction) * param_bytes / tp
    return Cost(bytes_read=need, bytes_written=need, weight_bytes=need, persistent_bytes=need)


def weight_sync_link_bytes(
    param_bytes: float, *, tp: int = 1, shards: int = 1, aliased_fraction: float = 0.0
) -> float:
    """Bytes each GPU receives over links in `weight_sync`: of what it needs, a GPU of an
    FSDP group of `shards` already holds about 1/shards; the rest is gathered from peers."""
    need = weight_sync(param_bytes, tp=tp, shards=shards, aliased_fraction=aliased_fraction)
    return need.bytes_written * (1 - 1 / shards)


def reward(samples: float, response_tokens: float) -> Cost:
    """Rule-based reward: a pass over each response's token ids, one fp32 score per sample.
    (A reward model would be priced as a `logprob`-style forward instead.)"""
    scores = samples * FP32
    return Cost(
        flops=samples * response_tokens,
        bytes_read=samples * response_tokens * 4,  # int32 token ids
        bytes_written=scores,
        persistent_bytes=scores,
    )


def advantage(samples: float, group_size: int, tokens_per_sample: float = 1) -> Cost:
    """Group-relative advantage (GRPO/RLOO): mean and std of each group's rewards, then a
    normalised score, broadcast over `tokens_per_sample` tokens (verl keeps it per token)."""
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    out = samples * tokens_per_sample * FP32
    return Cost(
        flops=samples * (8 + tokens_per_sample),  # sums, squares, sqrt, normalise, broadcast
        bytes_read=samples * FP32,
        bytes_written=out,
        persistent_bytes=out,
    )
