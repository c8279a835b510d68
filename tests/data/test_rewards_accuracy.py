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

    def generate(self, encoded, max_new_tokens, samples, n=1, **_):
        ids = torch.arange(self.seen, self.seen + len(samples))[:, None]
        self.seen += len(samples)
        ids = ids.repeat_interleave(n, 0)  # n answers a prompt, grouped per prompt
        return SimpleNamespace(tokens=ids, lengths=torch.ones(len(ids), dtype=torch.long))


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


class _Alternating(_Backend):
    """n answers a prompt: its own response at even rows, a wrong one ("zzz") at odd."""

    def generate(self, encoded, max_new_tokens, samples, n=1, **_):
        own = super().generate(encoded, max_new_tokens, samples, n).tokens
        odd = torch.arange(len(own))[:, None] % 2 == 1
        return SimpleNamespace(
            tokens=torch.where(odd, len(RESPONSES), own),
            lengths=torch.ones(len(own), dtype=torch.long),
        )


def test_n_answers_a_prompt_give_mean_at_n_and_pass_at_n():
    renderer = SimpleNamespace(
        encode_batch=lambda samples: samples,
        tokenizer=SimpleNamespace(
            batch_decode=lambda rows, **_: [[*RESPONSES, "zzz"][r[0]] for r in rows]
        ),
    )
    score = accuracy_scorer(REWARD_PRESETS["math"])
    one = evaluate(_Backend(), _Source(), renderer, 4, 8, batch_size=3, score=score)
    four = evaluate(
        _Alternating(), _Source(), renderer, 4, 8, batch_size=3, score=score, n=4, temperature=1.0
    )
    assert (one.samples, one.prompts) == (1, 4) and (four.samples, four.prompts) == (4, 4)
    assert one.accuracy == pytest.approx(3 / 4) == one.pass_at_n  # one answer a prompt
    assert four.accuracy == pytest.approx(3 / 4 / 2)  # half of each prompt's answers are wrong
    assert four.pass_at_n == pytest.approx(3 / 4)  # a prompt passes on its right answer
    assert four.exact_match_accuracy == pytest.approx(2 / 4 / 2)
