"""Held-out accuracy is scored by the run's own reward (its format part left out), with
exact match beside it: a run trained on reward=math is not judged by exact match alone."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rollplex.data import Sample
from rollplex.data.rewards import accuracy_scorer
from rollplex.runtime.evaluate import evaluate
from rollplex.specs.reward import REWARD_PRESETS, RewardComponentSpec, RewardSpec

SAMPLES = [Sample(f"t:test:{i}", f"q{i}", a) for i, a in enumerate(["0.5", "no", "3", "yes"])]
RESPONSES = ["<answer>\\frac{1}{2}</answer>", "<answer>on</answer>", "<answer>3</answer>",
             "<answer>Yes</answer>"]  # fmt: skip


class _Source:
    name = "fixed"

    def __len__(self) -> int:
        return len(SAMPLES)

    def batch(self, k: int, n: int) -> list[Sample]:
        return SAMPLES[:n]


class _Backend:
    """Generates response i (token id i) for the i-th sample it sees."""

    def __init__(self) -> None:
        self.seen = 0

    def generate(self, encoded, max_new_tokens, samples):
        ids = torch.arange(self.seen, self.seen + len(samples))[:, None]
        self.seen += len(samples)
        return SimpleNamespace(tokens=ids, lengths=torch.ones(len(samples), dtype=torch.long))


_RENDERER = SimpleNamespace(
    encode_batch=lambda samples: samples,
    tokenizer=SimpleNamespace(batch_decode=lambda rows, **_: [RESPONSES[r[0]] for r in rows]),
)


def _eval(reward: RewardSpec | None):
    score = accuracy_scorer(reward) if reward is not None else None
    return evaluate(_Backend(), _Source(), _RENDERER, 4, 8, batch_size=3, score=score)


def test_math_run_is_scored_by_math_with_exact_match_beside():
    res = _eval(REWARD_PRESETS["math"])  # 0.9 math + 0.1 format
    assert res.scored_by == "math"
    assert res.accuracy == pytest.approx(3 / 4)  # 1/2 = 0.5, 3, Yes; "on" is not "no"
    assert res.exact_match_accuracy == pytest.approx(2 / 4)  # 3 and Yes only
    assert res.prompts == 4


def test_default_and_format_only_rewards_score_by_exact_match():
    for reward in (None, REWARD_PRESETS["exact_match_format"], REWARD_PRESETS["format"]):
        res = _eval(reward)
        assert res.scored_by == "exact_match"
        assert res.accuracy == res.exact_match_accuracy == pytest.approx(2 / 4)


def test_several_correctness_components_average_by_weight():
    spec = RewardSpec(
        components=(
            RewardComponentSpec(name="math", weight=3.0),
            RewardComponentSpec(name="exact_match", weight=1.0),
            RewardComponentSpec(name="format", weight=0.5),
        )
    )
    scorer = accuracy_scorer(spec)
    assert scorer.name == "math+exact_match"
    assert scorer(RESPONSES[0], SAMPLES[0]) == pytest.approx(0.75)  # math 1, exact 0
    assert scorer(RESPONSES[2], SAMPLES[2]) == 1.0
    assert _eval(spec).accuracy == pytest.approx((0.75 + 0 + 1 + 1) / 4)
