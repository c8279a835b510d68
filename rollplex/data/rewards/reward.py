"""build_reward: a RewardSpec -> a callable scoring a batch, with each component kept."""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rollplex.data.rewards.builtin import REWARDS
from rollplex.data.sample import Sample
from rollplex.specs.reward import RewardSpec

RewardFn = Callable[[str, Sample], float]  # (decoded response text, its sample) -> score


@dataclass(slots=True)
class RewardResult:
    total: list[float]  # weighted sum, one per response
    components: dict[str, list[float]]  # each component's raw score, for TensorBoard


class Reward:
    def __init__(self, components: Sequence[tuple[str, float, RewardFn]]) -> None:
        self.components = tuple(components)

    def __call__(self, responses: Sequence[str], samples: Sequence[Sample]) -> RewardResult:
        if len(responses) != len(samples):
            raise ValueError(f"{len(responses)} responses for {len(samples)} samples")
        scores: dict[str, list[float]] = {}
        for name, _, fn in self.components:
            scores[name] = [_score(name, fn, r, s) for r, s in zip(responses, samples, strict=True)]
        total = [
            sum(w * scores[name][i] for name, w, _ in self.components)
            for i in range(len(responses))
        ]
        return RewardResult(total, scores)


def _score(name: str, fn: RewardFn, response: str, sample: Sample) -> float:
    value = fn(response, sample)
    try:
        value = float(value)
    except (TypeError, ValueError):
        value = math.nan
    if not math.isfinite(value):
        raise ValueError(f"reward '{name}' returned {value!r} for sample {sample.uid}")
    return value


def resolve(name: str) -> RewardFn:
    """A registered reward, or a user function by import path 'pkg.module:fn'."""
    if name in REWARDS:
        return REWARDS[name]
    if ":" not in name:
        raise ValueError(
            f"unknown reward '{name}'; known: {sorted(REWARDS)}, or 'pkg.module:fn' "
            "for a function fn(response: str, sample: Sample) -> float"
        )
    module_name, _, attr = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"reward '{name}': cannot import module '{module_name}': {err}") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"reward '{name}': module '{module_name}' has no function '{attr}'")
    return fn


def build_reward(spec: RewardSpec) -> Reward:
    """Resolve every component now, so a bad name stops the run before any model loads."""
    return Reward([(c.name, c.weight, resolve(c.name)) for c in spec.components])


@dataclass(slots=True, frozen=True)
class AccuracyScorer:
    """Held-out correctness as the run's reward judges it: the weighted mean of its
    components other than `format` (which says how an answer is marked, not whether it is
    right), 1 when each of them scores 1; exact_match when `format` is all there is."""

    name: str  # e.g. "math", "exact_match", "math+pkg.mod:fn"
    components: tuple[tuple[float, RewardFn], ...]

    def __call__(self, response: str, sample: Sample) -> float:
        total = sum(w for w, _ in self.components)
        return sum(w * _score(self.name, fn, response, sample) for w, fn in self.components) / total


def accuracy_scorer(spec: RewardSpec) -> AccuracyScorer:
    parts = [c for c in spec.components if c.name != "format" and c.weight > 0]
    if not parts:
        return AccuracyScorer("exact_match", ((1.0, REWARDS["exact_match"]),))
    return AccuracyScorer(
        "+".join(c.name for c in parts), tuple((c.weight, resolve(c.name)) for c in parts)
    )
