"""Rewards on fixed strings: extraction, normalisation, math equivalence, user functions."""

from __future__ import annotations

import pytest

from rollplex.data import Sample
from rollplex.data.rewards import (
    REWARDS,
    build_reward,
    exact_match,
    extract_answer,
    format_reward,
    math_equal,
    normalize,
)
from rollplex.specs.reward import REWARD_PRESETS, RewardComponentSpec, RewardSpec


def _s(answer: str) -> Sample:
    return Sample("t:train:0", "q", answer)


def length_reward(response: str, sample: Sample) -> float:
    """A user reward, named by import path in the tests below."""
    return len(response) / 10


def test_extraction_prefers_the_answer_tag_then_the_last_box() -> None:
    assert extract_answer("think <answer> Blue </answer> \\boxed{red}") == " Blue "
    assert extract_answer("<answer>a</answer> then <answer>b</answer>") == "b"
    assert extract_answer("x \\boxed{1} so \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert extract_answer("unclosed \\boxed{3") == "unclosed \\boxed{3"
    assert extract_answer("just text") == "just text"
    assert normalize("  The  Answer: a Red-Circle!  ") == "answer redcircle"


@pytest.mark.parametrize(
    "response, answer, score",
    [
        ("<answer>Yes.</answer>", "yes", 1.0),
        ("I see it. \\boxed{The circle}", "circle", 1.0),
        ("  Circle! ", "circle", 1.0),
        ("<answer>no</answer>", "yes", 0.0),
        ("the answer is yes", "yes", 0.0),  # no tag, no box: the whole response must match
    ],
)
def test_exact_match(response: str, answer: str, score: float) -> None:
    assert exact_match(response, _s(answer)) == score


@pytest.mark.parametrize(
    "response, score",
    [("<answer>x</answer>", 1.0), ("so \\boxed{4}", 1.0), ("<answer>x", 0.0), ("\\boxed{4", 0.0)],
)
def test_format(response: str, score: float) -> None:
    assert format_reward(response, _s("x")) == score


@pytest.mark.parametrize(
    "response, answer, score",
    [
        ("<answer>0.5</answer>", "\\frac{1}{2}", 1.0),
        ("so \\boxed{\\frac12}", "1/2", 1.0),
        ("<answer>1+x</answer>", "x+1", 1.0),
        ("first 2, finally \\boxed{3}", "2", 0.0),
        ("<answer>4</answer>", "3", 0.0),
        ("<answer>Blue</answer>", "blue", 1.0),  # not maths: falls back to exact match
    ],
)
def test_math(response: str, answer: str, score: float) -> None:
    assert math_equal(response, _s(answer)) == score


def test_weighted_components_are_kept_apart() -> None:
    reward = build_reward(REWARD_PRESETS["exact_match_format"])
    out = reward(["<answer>red</answer>", "red", "<answer>blue</answer>"], [_s("red")] * 3)
    assert out.components == {"exact_match": [1.0, 1.0, 0.0], "format": [1.0, 0.0, 1.0]}
    assert out.total == pytest.approx([1.0, 0.9, 0.1])
    with pytest.raises(ValueError, match="2 responses for 1 samples"):
        reward(["a", "b"], [_s("a")])


def test_user_function_by_import_path() -> None:
    spec = RewardSpec(
        components=(
            RewardComponentSpec(name="tests.data.test_rewards:length_reward", weight=2.0),
            RewardComponentSpec(name="format", weight=1.0),
        )
    )
    out = build_reward(spec)(["abcde", "\\boxed{1}"], [_s("x"), _s("y")])
    assert out.components["tests.data.test_rewards:length_reward"] == [0.5, 0.9]
    assert out.total == pytest.approx([1.0, 2.8])


@pytest.mark.parametrize(
    "name, message",
    [
        ("exact", "unknown reward 'exact'"),
        ("no_such_pkg.mod:fn", "reward 'no_such_pkg.mod:fn': cannot import module"),
        ("tests.data.test_rewards:missing", "has no function 'missing'"),
        ("tests.data.test_rewards:REWARDS", "has no function 'REWARDS'"),
    ],
)
def test_bad_reward_names_are_refused_by_name(name: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_reward(RewardSpec(components=(RewardComponentSpec(name=name),)))


def test_a_reward_returning_nan_is_named() -> None:
    reward = build_reward(RewardSpec(components=(RewardComponentSpec(name="exact_match"),)))
    reward.components = (("bad", 1.0, lambda r, s: float("nan")),)
    with pytest.raises(ValueError, match="reward 'bad' returned nan for sample t:train:0"):
        reward(["x"], [_s("x")])


def test_registry_and_spec_checks() -> None:
    assert set(REWARDS) == {"exact_match", "format", "math"}
    with pytest.raises(ValueError, match="named twice"):
        RewardSpec(components=(RewardComponentSpec(name="format"),) * 2)
    with pytest.raises(ValueError, match="finite"):
        RewardComponentSpec(name="format", weight=float("inf"))
