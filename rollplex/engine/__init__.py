"""The per-op functions of the torch backend, in one place for the executor.

One GRPO step over B prompts and G samples each, with the prefix computed once per prompt:

    feats = vision_encode(model, *batch.visual_rows()[:2])   # images and videos, row order
    state = prefix_forward(model, batch, feats, grad=False)  # one row per prompt
    tokens, old_logp, lengths = decode(model, expand_prefix(state, G), R, temperature, ...)
    with torch.no_grad():                       # reference model, same prefix trick
        ref_logp = response_logprobs(ref, prefix_forward(ref, ...), tokens, lengths)
    adv = group_advantages(rewards, G)
    feats = vision_encode(model, ...)           # with grad when the tower/merger trains
    logp = response_logprobs(model, prefix_forward(..., grad=True), tokens, lengths)
    loss, metrics = grpo_loss(logp, old_logp, ref_logp, adv, mask, clip_eps, kl_coef)

`response_logprobs` takes one prefix row per prompt: its G responses attend to that one
prefix K/V (shared_prefix_attention.py), nothing is repeated per response.

`full_logprobs` is the verl-style path (prefix recomputed per sample), kept as the
baseline and the yardstick.

The rollout role decodes with the engine in this package instead of `decode` (which G-times
expands the prefix and runs an eager per-token loop, kept as the reference the engine is
tested against and as the benchmark's baseline):

    engine = DecodeEngine(model)                      # session.py: buffers + CUDA graphs
    session = engine.start(prefix_forward(...), G, R, temperature, top_p, gen, eos_id)
    session.advance(k); ...; tokens, logprobs, lengths = session.result()

- cache.py: static K/V, each prompt's prefix stored once for its G rows;
- step.py: one decode forward on the model's own modules over that cache (each layer's
  pieces torch.compile'd on CUDA), with fused_qkv.py's one q/k/v GEMM a layer and, at
  few rows on CUDA, skinny.py's Triton kernels for the MLP's gate/up + SiLU and the LM head;
- attention.py: attention over that cache: SDPA, FlexAttention (flex.py: the split-KV
  kernel) or "split" (the prefix once per prompt, each row only its own responses; on
  CUDA as split_kernel.py's two Triton kernels); "auto" picks split on CUDA;
- sampling.py: on-device draws, a function of (row seed, step), compiled on CUDA;
- riders.py: the training phase's prefix rows riding a decode step's GEMMs;
- roofline.py: achieved HBM bandwidth against the roofline.

`start(..., lengths=...)` forces each row's length (eos ignored): benchmarks of random-weight
models with the workload's length distribution (`train.response_lengths=workload`).
"""

from __future__ import annotations

from rollplex.backends.torch.decode import decode, sample_next
from rollplex.backends.torch.logprob import (
    full_logits,
    full_logprobs,
    response_logprobs,
    response_mask,
    token_logprobs,
)
from rollplex.backends.torch.loss import group_advantages, grpo_loss
from rollplex.backends.torch.prefix import PrefixState, expand_prefix, prefix_forward, vision_encode
from rollplex.data.prompts import PromptBatch, PromptInputs, collate_prompts
from rollplex.engine.roofline import RooflineReport, roofline
from rollplex.engine.session import DecodeEngine, EngineSession

__all__ = [
    "DecodeEngine",
    "EngineSession",
    "PrefixState",
    "PromptBatch",
    "PromptInputs",
    "RooflineReport",
    "collate_prompts",
    "decode",
    "expand_prefix",
    "full_logits",
    "full_logprobs",
    "group_advantages",
    "grpo_loss",
    "prefix_forward",
    "response_logprobs",
    "response_mask",
    "roofline",
    "sample_next",
    "token_logprobs",
    "vision_encode",
]
