"""Token-level rewards of the tiny synthetic task; the generator lives in rollplex.data.shapes.

`reward`: 1.0 iff the response is exactly [answer, eos]. `first_token_reward`, for RL from
random weights: 1.0 iff the first token is the answer (chance ~1/V against ~1/V^2, so GRPO
groups see successes to learn from).
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
