"""Rewards of generated responses: token ids -> text -> the configured reward functions.

Role-free: whatever engine generated the tokens, they are decoded with the model folder's
own tokenizer (up to each row's length, special tokens dropped) and scored against the
samples they answer. Response row i answers prompt i // G (rows are grouped per prompt).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rollplex.data.rewards import Reward
from rollplex.data.rewards.overlong import OverlongPenalty
from rollplex.data.sample import Sample


@dataclass(slots=True)
class Scored:
    rewards: list[float]  # one per response row
    metrics: dict[str, float]  # mean of each component, for TensorBoard
    texts: list[str]


@dataclass(slots=True)
class ResponseScorer:
    tokenizer: Any  # a transformers tokenizer: batch_decode
    reward: Reward
    overlong: OverlongPenalty | None = None  # added to each total by its token count

    def decode(self, tokens: Sequence[Sequence[int]], lengths: Sequence[int]) -> list[str]:
        rows = [list(t[:n]) for t, n in zip(tokens, lengths, strict=True)]
        return self.tokenizer.batch_decode(rows, skip_special_tokens=True)

    def __call__(
        self,
        tokens: Sequence[Sequence[int]],
        lengths: Sequence[int],
        samples: Sequence[Sample],
        group_size: int,
    ) -> Scored:
        if len(tokens) != len(samples) * group_size:
            raise ValueError(f"{len(tokens)} responses for {len(samples)} prompts x G={group_size}")
        texts = self.decode(tokens, lengths)
        per_row = [samples[i // group_size] for i in range(len(texts))]
        result = self.reward(texts, per_row)
        metrics = {
            f"reward/{name}": statistics.fmean(values) for name, values in result.components.items()
        }
        total = list(result.total)
        if self.overlong is not None:
            penalties = self.overlong(lengths)
            total = [r + p for r, p in zip(total, penalties, strict=True)]
            metrics["reward/overlong"] = statistics.fmean(penalties)
        return Scored(total, metrics, texts)
