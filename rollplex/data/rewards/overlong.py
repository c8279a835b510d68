"""DAPO's soft overlong punishment (verl's reward_model.overlong_buffer): a response that
runs into the last `buffer` tokens before the cap loses reward linearly, `penalty` at the
cap, so the policy learns to finish before truncation rather than be cut off silently."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class OverlongPenalty:
    max_new_tokens: int  # the response cap (train.max_new_tokens)
    buffer: int  # tokens before the cap where the penalty ramps (reward.overlong_buffer)
    penalty: float  # what a response at the cap loses (reward.overlong_penalty)

    def __call__(self, lengths: Sequence[int]) -> list[float]:
        """Each response's penalty (<= 0) from its token count."""
        expected = self.max_new_tokens - self.buffer
        return [min(-(n - expected) / self.buffer * self.penalty, 0.0) for n in lengths]
