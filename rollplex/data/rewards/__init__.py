"""Rewards: a registry of `fn(response: str, sample: Sample) -> float`, weighted by a
RewardSpec. A user reward is named by import path, "pkg.module:fn", with that signature."""

from rollplex.data.rewards.builtin import REWARDS, exact_match, format_reward, math_equal
from rollplex.data.rewards.extract import extract_answer, has_format, normalize
from rollplex.data.rewards.reward import (
    AccuracyScorer,
    Reward,
    RewardFn,
    RewardResult,
    accuracy_scorer,
    build_reward,
    resolve,
)

__all__ = [
    "REWARDS",
    "AccuracyScorer",
    "Reward",
    "RewardFn",
    "RewardResult",
    "accuracy_scorer",
    "build_reward",
    "exact_match",
    "extract_answer",
    "format_reward",
    "has_format",
    "math_equal",
    "normalize",
    "resolve",
]
