"""RewardSpec: the weighted reward components of a run (conf/reward).

A component's `name` is a registered reward (rollplex.data.rewards.REWARDS: exact_match,
format, math) or a user function by import path, "pkg.module:fn", with the signature
`fn(response: str, sample: rollplex.data.Sample) -> float`.
"""

from __future__ import annotations

import math

from pydantic import Field, field_validator

from rollplex.specs.base import Spec


class RewardComponentSpec(Spec):
    name: str = Field(
        ..., min_length=1, description="A registered reward name, or 'pkg.module:fn'."
    )
    weight: float = Field(1.0, description="Its weight in the total (may be negative).")

    @field_validator("weight")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError(f"weight must be finite, got {v}")
        return v


class RewardSpec(Spec):
    components: tuple[RewardComponentSpec, ...] = Field(
        (RewardComponentSpec(name="exact_match"),),
        min_length=1,
        description="Components; the reward is sum(weight * score). Each is logged alone.",
    )

    overlong_buffer: int = Field(
        0,
        ge=0,
        description="DAPO's soft overlong punishment [reward_model.overlong_buffer.len]: a "
        "response longer than train.max_new_tokens minus this many tokens loses "
        "overlong_penalty x (its excess / this), so one at the cap loses overlong_penalty; "
        "logged as reward/overlong. 0: off.",
    )
    overlong_penalty: float = Field(
        1.0,
        ge=0,
        description="What a response at the cap loses with overlong_buffer "
        "[reward_model.overlong_buffer.penalty_factor].",
    )

    @field_validator("components")
    @classmethod
    def _unique(cls, v: tuple[RewardComponentSpec, ...]) -> tuple[RewardComponentSpec, ...]:
        names = [c.name for c in v]
        if dupes := sorted({n for n in names if names.count(n) > 1}):
            raise ValueError(f"reward components named twice: {dupes}")
        return v


def _spec(**weights: float) -> RewardSpec:
    return RewardSpec(
        components=tuple(RewardComponentSpec(name=n, weight=w) for n, w in weights.items())
    )


REWARD_PRESETS: dict[str, RewardSpec] = {
    "exact_match": _spec(exact_match=1.0),
    "exact_match_format": _spec(exact_match=0.9, format=0.1),
    "math": _spec(math=0.9, format=0.1),
    "format": _spec(format=1.0),
}
