"""Token-level rewards of the tiny synthetic task; the generator lives in rollplex.data.shapes.

Reward rule (`reward`): 1.0 iff the response is exactly [answer, eos] — the answer token
first, eos second. A wrong word, extra tokens, a missing eos or a truncated response all
score 0.0. A one-token answer plus a stop is a target a tiny model can learn, and asking
for eos teaches the policy to stop.

`first_token_reward` is the learnable variant for RL from random weights: 1.0 iff the
first generated token is the answer (still an exact match on the answer word; what
follows is ignored). The exact [answer, eos] pair has chance ~1/V^2 under a random policy,
so GRPO groups almost never see a success to learn from; the first token alone has ~1/V.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rollplex.data.shapes import (  # re-exported: the backend's tokenizer and tests use them
    ANSWER_WORDS,
    BACKGROUND,
    COUNT_WORDS,
    GRID,
    KINDS,
    MARGIN,
    PALETTE,
    QUESTIONS,
    SHAPES,
    VOCAB_WORDS,
    Shape,
    TaskSample,
    VisualTask,
)

__all__ = [
    "ANSWER_WORDS",
    "BACKGROUND",
    "COUNT_WORDS",
    "GRID",
    "KINDS",
    "MARGIN",
    "PALETTE",
    "QUESTIONS",
    "REWARDS",
    "SHAPES",
    "VOCAB_WORDS",
    "Shape",
    "TaskSample",
    "VisualTask",
    "first_token_reward",
    "reward",
]


def reward(response_ids: Sequence[int] | torch.Tensor, answer_id: int, eos_id: int) -> float:
    """1.0 iff the response is exactly [answer_id, eos_id]; padding after eos is ignored."""
    ids = response_ids.tolist() if isinstance(response_ids, torch.Tensor) else list(response_ids)
    if eos_id in ids:
        ids = ids[: ids.index(eos_id) + 1]
    return 1.0 if ids == [answer_id, eos_id] else 0.0


REWARDS = ("first_token", "answer_eos")


def first_token_reward(response_ids: Sequence[int] | torch.Tensor, answer_id: int) -> float:
    """1.0 iff the first response token is `answer_id`."""
    ids = response_ids.tolist() if isinstance(response_ids, torch.Tensor) else list(response_ids)
    return 1.0 if ids[:1] == [answer_id] else 0.0
