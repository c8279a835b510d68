"""Costs of the LLM decoder: forward passes, prefill, the activations a backward keeps, and
the logprob forwards (the rollout's decode: `decode.py`).

FLOPs count matmuls only (2 per multiply-add, as `torch.utils.flop_counter`): projections,
SwiGLU, dense attention over every key a query is given (no causal discount), and lm_head
for `logit_rows`. Bytes assume fused kernels: weights read once per call, the context's KV
read, new K/V written, embedding rows read and logit rows written.
"""

from __future__ import annotations

from typing import Literal

from rollplex.ops.formulas.cost import FP32, LOGPROB_BYTES, Cost, check_tp, kv_fraction
from rollplex.ops.formulas.head import HeadPass, head_scratch
from rollplex.specs.model import ModelSpec

LogprobPart = Literal["full", "prefix", "response"]


def attention_flops(
    model: ModelSpec, sequences: float, queries: float, keys: float, tp: int = 1
) -> float:
    """QKᵀ and AV over all layers: `queries` rows each scoring `keys` keys, per sequence."""
    check_tp(tp)
    return 4 * sequences * queries * keys * model.hidden_size * model.num_layers / tp


def layer_matmul_flops_per_token(model: ModelSpec, tp: int = 1) -> float:
    """q/k/v/o and SwiGLU matmul FLOPs of one decoder layer for one token, on one GPU."""
    h, i = model.hidden_size, model.intermediate_size
    kvf = kv_fraction(model.num_kv_heads, tp)
    return 2 * (2 * h * h + 3 * h * i) / tp + 2 * 2 * h * model.kv_dim * kvf


def decoder_weight_bytes(model: ModelSpec, tp: int = 1) -> float:
    """Bytes of all decoder layers plus the final norm that one GPU reads per forward."""
    h, kv = model.hidden_size, model.kv_dim
    kv_params = 2 * (h * kv + kv)  # k/v projections with bias: replicated past num_kv_heads
    split = model.llm_layer_params() - kv_params
    per_gpu = split / tp + kv_params * kv_fraction(model.num_kv_heads, tp)
    return (model.num_layers * per_gpu + h / tp) * model.dtype_bytes


def lm_head_weight_bytes(model: ModelSpec, tp: int = 1) -> float:
    """lm_head (or the tied embedding it reuses), vocab-parallel."""
    check_tp(tp)
    return model.vocab_size * model.hidden_size * model.dtype_bytes / tp


def kv_bytes_per_token(model: ModelSpec, tp: int = 1) -> float:
    """KV-cache bytes one token keeps on one GPU, all layers."""
    return model.kv_bytes_per_token() * kv_fraction(model.num_kv_heads, tp)


def decoder_forward(
    model: ModelSpec,
    sequences: float,
    new_tokens: float,
    context_tokens: float,
    tp: int,
    keep_kv: bool,
) -> Cost:
    """`llm_forward` without lm_head: embedding rows through the final norm."""
    rows = sequences * new_tokens
    keys = context_tokens + new_tokens
    flops = rows * model.num_layers * layer_matmul_flops_per_token(model, tp)
    flops += attention_flops(model, sequences, new_tokens, keys, tp)
    b, h = model.dtype_bytes, model.hidden_size
    kv_tok = kv_bytes_per_token(model, tp)
    weights = decoder_weight_bytes(model, tp)
    kv_new = rows * kv_tok if keep_kv else 0.0
    # Working set of one layer: residual + normed hidden (replicated), the SwiGLU's gate, up
    # and product (split); a forward that does not keep its K/V holds one layer's K/V too.
    layer_kv = 0.0 if keep_kv else rows * kv_tok / model.num_layers
    working = rows * b * (2 * h + 3 * model.intermediate_size / tp) + layer_kv
    return Cost(
        flops=flops,
        bytes_read=weights + rows * h * b + sequences * context_tokens * kv_tok,
        bytes_written=kv_new,
        weight_bytes=weights,
        persistent_bytes=kv_new,
        transient_bytes=working,
    )


def lm_head_forward(
    model: ModelSpec,
    sequences: float,
    logit_rows: float,
    tp: int,
    head_pass: HeadPass = "sample",
    run_share: float = 1.0,
) -> Cost:
    """lm_head over the rows that need logits; the op keeps 4 B per row (logprob or token).
    Its scratch: `head_scratch` of `head_pass` (sampling, scoring, the forward with grad),
    fused on one GPU, in runs of `run_share` of the rows."""
    rows = sequences * logit_rows
    if rows == 0:
        return Cost()
    weights = lm_head_weight_bytes(model, tp)
    logits = rows * model.vocab_size / tp
    kept = rows * LOGPROB_BYTES
    return Cost(
        flops=2 * rows * model.hidden_size * model.vocab_size / tp,
        bytes_read=weights,
        bytes_written=logits * model.dtype_bytes + kept,
        weight_bytes=weights,
        persistent_bytes=kept,
        transient_bytes=head_scratch(logits * FP32, head_pass, run_share=run_share, fused=tp == 1),
    )


def llm_forward(
    model: ModelSpec,
    sequences: float,
    new_tokens: float,
    context_tokens: float = 0,
    tp: int = 1,
    logit_rows: float | None = None,
    *,
    keep_kv: bool = True,
    head_pass: HeadPass = "sample",
    run_share: float = 1.0,
) -> Cost:
    """Decoder forward of `new_tokens` positions per sequence over `context_tokens` cached keys.

    Each new position attends to `context_tokens + new_tokens` keys. `logit_rows` rows per
    sequence go through lm_head (default: every new token), as `head_pass` (its scratch,
    `lm_head_forward`). `keep_kv=True` writes the new tokens' K/V to a cache that outlives
    the op (persistent); otherwise it is scratch. `sequences` may be fractional (an
    expected batch).
    """
    check_tp(tp)
    rows = new_tokens if logit_rows is None else logit_rows
    if min(sequences, new_tokens, context_tokens, rows) < 0 or rows > new_tokens:
        raise ValueError("sizes must be >= 0 and logit_rows <= new_tokens")
    return decoder_forward(
        model, sequences, new_tokens, context_tokens, tp, keep_kv
    ) + lm_head_forward(model, sequences, rows, tp, head_pass, run_share)


def prefix_prefill(model: ModelSpec, sequences: float, prefix_tokens: int, tp: int = 1) -> Cost:
    """Prefill of the prefix: keeps its KV cache and samples the first token from the last row."""
    return llm_forward(model, sequences, prefix_tokens, 0, tp, logit_rows=1)


def final_norm_bytes_per_token(model: ModelSpec) -> float:
    """What HF's (unfused) final RMSNorm keeps per token for the backward: its input as
    fp32 (a copy under bf16; `pow` and the rstd product read it), the fp32 rstd, and the
    normalized pre-weight output in the compute dtype (the weight product reads it)."""
    h, b = model.hidden_size, model.dtype_bytes
    return h * (FP32 + b) + FP32


def activation_bytes_per_token(model: ModelSpec, checkpointing: bool, tp: int = 1) -> float:
    """Activation bytes one token keeps for the backward, all decoder layers, on one GPU.

    Outside the layers, always: the final norm's (`final_norm_bytes_per_token`). With
    checkpointing only each layer's input hidden state is kept besides (replicated under
    TP). Without it, per layer, assuming fused RMSNorm (saves input + fp32 rstd) and flash
    attention (saves q, k, v, output and fp32 logsumexp), and an autograd-composed SwiGLU:
    - replicated under TP: layer input, norm1 output, post-attention residual, norm2 output (4h);
    - split by heads: q and attention output (2h), k and v (2 kv), logsumexp (4 B per head);
    - split by the SwiGLU: gate, up, silu(gate) and their product (4i);
    - two rstd values (2 x 4 B).
    Plain HF RMSNorm is unfused and keeps one more h-wide tensor per norm (fp32 under bf16).
    What the head keeps is `saved_activation_bytes`'s (or `logprob(grad=True)`'s) part.
    """
    b, h, i = model.dtype_bytes, model.hidden_size, model.intermediate_size
    final_norm = final_norm_bytes_per_token(model)
    if checkpointing:
        return model.num_layers * h * b + final_norm
    kvf = kv_fraction(model.num_kv_heads, tp)
    per_layer = (
        b * (4 * h + (2 * h + 4 * i) / tp + 2 * model.kv_dim * kvf)
        + FP32 * model.num_heads / tp
        + 2 * FP32
    )
    return model.num_layers * per_layer + final_norm


TOKEN_ID_BYTES = 8  # int64 ids, which the embedding keeps for its backward
MASK_BYTES = 1  # bool: where visual features go into the embeddings; the valid response tokens
# int64: where each packed token lies in the padded rows (backends/torch/packed_rows.py),
# kept for the backward of packing and unpacking (schedule.pack_responses)
PACK_INDEX_BYTES = 8


def saved_tokens(
    part: LogprobPart, prefix_tokens: float, response_tokens: float
) -> tuple[float, float]:
    """(positions through the decoder, head input rows) of the trainer's checkpointed
    forward of one sequence: full runs prefix + response and gathers the R rows that score
    the response; prefix runs the prefix and heads its last row; response runs the
    response's first R-1 tokens (the last is never fed) over the cached prefix and heads
    every one of them (token 0 is scored by the prefix's last row)."""
    if part == "full":
        return prefix_tokens + response_tokens, response_tokens
    if part == "prefix":
        return prefix_tokens, 1
    if part == "response":
        return max(0, response_tokens - 1), 0
    raise ValueError(f"unknown logprob part {part!r}")


def saved_activation_bytes(
    model: ModelSpec,
    sequences: float,
    prefix_tokens: float,
    response_tokens: float,
    part: LogprobPart,
) -> float:
    """Bytes the training forward of `sequences` rows keeps until its backward, on one GPU,
    every decoder layer checkpointed: what the torch trainer holds in its `saved` value
    (`SavedActivations`: the layers' inputs and what autograd saves around them), whatever
    the micro-batch count, since every micro-batch's forward runs before any backward. The
    planner sizes the `saved` values of the graph with it (`planner/sizing.py`).

    Per position through the decoder (`saved_tokens`): each layer's input and the final
    norm's (`activation_bytes_per_token`); the norm's output, which the head reads, where
    the head reads every position (response: the head's checkpoint input; full: the
    gather's input); prefix and full: the token ids and the visual-token mask; response and
    full: the packing's index (rows packed; a few bytes over when padded). Per row
    besides: full's gathered head inputs, prefix's last row; response: token 0's fp32
    logits (the prefix's last, one row per sample) and logsumexp, and the padding mask;
    full and response: the head's float32 log-sum-exp of every token it scores.
    Weights the forward reads and the prefix K/V a response reads are other values'
    bytes; so are response token ids (slices of the responses). Replicated under TP (no
    sequence parallelism)."""
    new, head_rows = saved_tokens(part, prefix_tokens, response_tokens)
    h, b = model.hidden_size, model.dtype_bytes
    per_token = activation_bytes_per_token(model, True)
    if part != "prefix":
        per_token += h * b  # the normed output, read by the head
    if part != "response":
        per_token += TOKEN_ID_BYTES + MASK_BYTES
    if part != "prefix":
        per_token += PACK_INDEX_BYTES
    per_row = head_rows * h * b
    # the fused head's log-sum-exp of each token it scores (backends/torch/fused_head.py)
    per_row += FP32 * {"full": response_tokens, "response": max(0, response_tokens - 1)}.get(
        part, 0
    )
    if part == "response":  # token 0's fp32 logits and logsumexp; the padding mask
        per_row += FP32 * (model.vocab_size + 1) + response_tokens * MASK_BYTES
    return sequences * (new * per_token + per_row)


def logprob_shape(
    part: LogprobPart, prefix_tokens: int, response_tokens: int
) -> tuple[int, int, int, bool]:
    """(new tokens, context tokens, logit rows, keep_kv) of one logprob part.

    The response's logprobs need the logits of the last prefix position and of the response
    positions, so full keeps R+1 rows, prefix 1 (its last) and response R (last one unused).
    """
    if part == "full":
        return prefix_tokens + response_tokens, 0, response_tokens + 1, False
    if part == "prefix":
        return prefix_tokens, 0, 1, True  # its KV feeds the response part
    if part == "response":
        return response_tokens, prefix_tokens, response_tokens, False
    raise ValueError(f"unknown logprob part {part!r}")


def logprob(
    model: ModelSpec,
    sequences: float,
    prefix_tokens: int,
    response_tokens: int,
    part: LogprobPart = "full",
    tp: int = 1,
    *,
    grad: bool = False,
    checkpointing: bool = True,
    run_share: float = 1.0,
) -> Cost:
    """Forward that scores the response tokens (reference or actor), whole or split.

    full: one forward over prefix+response (verl). prefix: the prefix alone, keeping its KV.
    response: the response over the cached prefix. prefix + response equals full in FLOPs
    except for the prefix queries against response keys, which full computes and masks.
    With `grad` (the actor's training forward) what the backward reads is kept too
    (`kept_for_backward`). It runs in runs of `run_share` of the rows (micro-batches),
    each scoring in chunks (`head_scratch`).
    """
    new, context, rows, keep_kv = logprob_shape(part, prefix_tokens, response_tokens)
    # the prefix part's head: its last position's logits, one row a sequence
    head_pass = "sample" if part == "prefix" else "forward" if grad else "score"
    cost = llm_forward(
        model, sequences, new, context, tp, logit_rows=rows, keep_kv=keep_kv,
        head_pass=head_pass, run_share=run_share,
    )  # fmt: skip
    if not grad:
        return cost
    saved = kept_for_backward(
        model, sequences, prefix_tokens, response_tokens, part, tp, checkpointing
    )
    return cost + Cost(bytes_written=saved, persistent_bytes=saved)


def kept_for_backward(
    model: ModelSpec,
    sequences: float,
    prefix_tokens: int,
    response_tokens: int,
    part: LogprobPart,
    tp: int = 1,
    checkpointing: bool = True,
) -> float:
    """What `logprob(grad=True)` keeps for `backward`: checkpointed, the trainer's
    `saved_activation_bytes` (its head is recomputed in the backward: no logits kept);
    otherwise every layer's activations and the fp32 log-softmax of the logit rows."""
    if checkpointing:
        return saved_activation_bytes(model, sequences, prefix_tokens, response_tokens, part)
    new, _, rows, keep_kv = logprob_shape(part, prefix_tokens, response_tokens)
    saved = sequences * new * activation_bytes_per_token(model, False, tp)
    if keep_kv:
        saved -= sequences * new * kv_bytes_per_token(model, tp)  # the cache is the saved k/v
    return saved + sequences * rows * model.vocab_size / tp * FP32
