"""How close a decode step comes to the HBM roofline:

    efficiency = (weight bytes + useful K/V bytes) / step time / peak HBM bandwidth

The weights are the language model's (LM head included, embedding table neglected); a
prompt's prefix K/V counts once for its G rows, each row adds its own responses. Anything
read beyond that (masked slack, padding rows, the mask, sampling) is overhead it exposes."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True, frozen=True)
class RooflineReport:
    bytes_per_step: float  # useful bytes: weights + K/V read
    step_seconds: float
    peak_bytes_per_s: float

    @property
    def achieved_bytes_per_s(self) -> float:
        return self.bytes_per_step / self.step_seconds

    @property
    def efficiency(self) -> float:
        """Share of the roofline reached, in [0, 1] for a correct measurement."""
        return self.achieved_bytes_per_s / self.peak_bytes_per_s


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """K and V of one token over all layers."""
    return 2 * layers * kv_heads * head_dim * dtype_bytes


def kv_token_reads(prefix_lengths: list[int], group_size: int, steps: int) -> int:
    """K/V entries read over `steps` decode steps in which every row stays live: each step
    reads every prompt's prefix once, and each of the prompt's `group_size` rows reads its
    own response so far (1 token at the first step, `steps` at the last)."""
    if steps < 0 or group_size < 1:
        raise ValueError(f"need steps >= 0 and group_size >= 1, got {steps}, {group_size}")
    rows = len(prefix_lengths) * group_size
    return steps * sum(prefix_lengths) + rows * steps * (steps + 1) // 2


def roofline(
    weight_bytes: int,
    kv_reads: int,
    kv_token_bytes: int,
    steps: int,
    seconds: float,
    peak_bytes_per_s: float,
) -> RooflineReport:
    """The report for `steps` decode steps that took `seconds` in all and read `kv_reads`
    K/V entries (see `kv_token_reads`) of `kv_token_bytes` each."""
    if steps < 1 or seconds <= 0 or peak_bytes_per_s <= 0:
        raise ValueError(
            f"need steps >= 1, seconds > 0, peak > 0; got {steps}, {seconds}, {peak_bytes_per_s}"
        )
    per_step = weight_bytes + kv_reads * kv_token_bytes / steps
    return RooflineReport(per_step, seconds / steps, peak_bytes_per_s)


def lm_weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the weights a decode step reads: the language model's decoder layers and
    final norm, plus the LM head (once, even when tied to the embedding). The embedding
    table is not read whole, only the looked-up rows."""
    lm = model.model.language_model
    embed = lm.embed_tokens.weight
    seen = {embed.data_ptr()}
    total = 0
    for p in lm.parameters():
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            total += p.numel() * p.element_size()
    head = model.lm_head.weight
    return total + head.numel() * head.element_size()
