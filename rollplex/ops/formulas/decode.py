"""Cost of the rollout's decode: one step (a token for every sequence still decoding, over
its cached keys) and the whole decode, whose batch shrinks as responses end and whose
context grows step by step. The forward each step runs is `llm.llm_forward`'s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rollplex.ops.formulas.cost import FP32, LOGPROB_BYTES, Cost, check_tp
from rollplex.ops.formulas.llm import (
    decoder_weight_bytes,
    kv_bytes_per_token,
    layer_matmul_flops_per_token,
    llm_forward,
    lm_head_weight_bytes,
)
from rollplex.specs.model import ModelSpec
from rollplex.specs.workload import WorkloadSpec


def decode_step(model: ModelSpec, batch: float, context_tokens: float, tp: int = 1) -> Cost:
    """One decode step: one new token per sequence over `context_tokens` cached keys."""
    return llm_forward(model, batch, 1, context_tokens, tp, logit_rows=1)


@dataclass(slots=True, frozen=True)
class DecodeStepTerms:
    """`decode_step`'s Cost fields for any batch and context, with the terms that do not
    depend on them computed once: a rollout prices thousands of steps, and rebuilding two
    Costs a step was a fifth of planning. The same expressions in the same order, so the
    same floats (tests/ops/test_cost_formulas.py checks them against `decode_step`)."""

    layers: int
    hidden: int
    dtype_bytes: int
    tp: int
    layer_flops: float  # layer_matmul_flops_per_token
    kv_tok: float
    weights: float  # decoder_weight_bytes
    head_weights: float  # lm_head_weight_bytes
    vocab: int
    width: float  # a row's working set: 2h + 3i / tp

    @classmethod
    def of(cls, model: ModelSpec, tp: int) -> DecodeStepTerms:
        check_tp(tp)
        h = model.hidden_size
        return cls(
            layers=model.num_layers,
            hidden=h,
            dtype_bytes=model.dtype_bytes,
            tp=tp,
            layer_flops=layer_matmul_flops_per_token(model, tp),
            kv_tok=kv_bytes_per_token(model, tp),
            weights=decoder_weight_bytes(model, tp),
            head_weights=lm_head_weight_bytes(model, tp),
            vocab=model.vocab_size,
            width=2 * h + 3 * model.intermediate_size / tp,
        )

    def fields(
        self, batch: float, context_tokens: float
    ) -> tuple[float, float, float, float, float]:
        """(flops, bytes_read, bytes_written, weight_bytes, transient_bytes) of
        `decode_step(model, batch, context_tokens, tp)` (batch > 0)."""
        h, layers, tp, b = self.hidden, self.layers, self.tp, self.dtype_bytes
        flops = batch * layers * self.layer_flops  # one row a sequence: rows == batch
        flops += 4 * batch * (context_tokens + 1) * h * layers / tp
        logits = batch * self.vocab / tp
        return (
            flops + 2 * batch * h * self.vocab / tp,
            self.weights + batch * h * b + batch * context_tokens * self.kv_tok + self.head_weights,
            batch * self.kv_tok + (logits * b + batch * LOGPROB_BYTES),
            self.weights + self.head_weights,
            max(batch * b * self.width, logits * FP32),
        )


@dataclass(slots=True, frozen=True)
class DecodeRollout:
    """The whole rollout's decode: its summed cost and the shape of the run."""

    cost: Cost
    steps: int  # decode steps until the longest response ends
    generated_tokens: float  # expected tokens over all sequences (incl. the prefill's first)


def decode_steps(workload: WorkloadSpec, batch: int) -> int:
    """Decode steps of a batch: the expected longest response, less the prefill's first token."""
    return max(0, math.ceil(workload.response_length.expected_max(batch) - 1e-9) - 1)


def decode_rollout(
    model: ModelSpec,
    workload: WorkloadSpec,
    prompts: int,
    group_size: int | None = None,
    tp: int = 1,
    step_samples: int | None = None,
) -> DecodeRollout:
    """Decode of `prompts × group_size` sequences (default G: the workload's) after the prefill.

    The prefill already sampled token 0. Step s feeds token s of every sequence still active
    (length > s+1) over its prefix plus s cached response tokens, so the batch shrinks and the
    context grows step by step. Finished sequences free their KV (vLLM does), so the scratch
    is the live response KV at its peak. Each sequence reads its own prefix KV (no cascade
    attention). Output: token ids and logprobs, 2x4 B per token.

    A synchronous step waits for its longest response anywhere: `step_samples` is every
    sample of the step, all replicas (default: this batch), and decode runs until the
    expected longest of them ends (capped at the generation limit). The replica that holds it
    runs each of those steps with at least that one sequence, so a step's work never drops
    below one row; tokens and KV stay this batch's expected ones.
    """
    group_size = workload.group_size if group_size is None else group_size
    batch = prompts * group_size
    lengths = workload.response_length
    prefix = workload.prefix_tokens(model.vision)
    steps = decode_steps(workload, max(batch, step_samples or batch))
    floor = min(1.0, float(batch))
    kv_tok = kv_bytes_per_token(model, tp)
    tokens = float(batch)  # the prefill's token 0
    peak_kv = 0.0
    # Summed field by field (the additions Cost.__add__ makes, in its order: the same
    # floats), not through a Cost per step: the planner prices thousands of steps per plan.
    flops = read = written = weights = scratch = 0.0
    terms = DecodeStepTerms.of(model, tp)
    for s in range(steps):
        active = lengths.expected_active(batch, s + 1)
        if active <= 0:
            break
        f, r, w, wt, t = terms.fields(max(active, floor), prefix + s)
        # The step's new K/V stays in the rollout's scratch; only the token leaves it.
        flops += f
        read += r
        written += w
        weights += wt
        scratch = max(scratch, t)
        tokens += active
        peak_kv = max(peak_kv, active * (s + 1) * kv_tok)
    total = Cost(flops, read, written, weights, 0.0, scratch)
    out = tokens * 2 * LOGPROB_BYTES
    # The steps wrote each token id (lm_head's 4 B per row); the logprob beside it is extra.
    extra = tokens * LOGPROB_BYTES
    total += Cost(bytes_written=extra, persistent_bytes=out, transient_bytes=peak_kv)
    return DecodeRollout(cost=total, steps=steps, generated_tokens=tokens)
