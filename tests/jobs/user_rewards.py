"""A user reward by import path (`reward.components=[{name: 'tests.jobs.user_rewards:...'}]`):
the signature is fn(response: str, sample: Sample) -> float."""

from __future__ import annotations

from rollplex.data import Sample


def longer_is_better(response: str, sample: Sample) -> float:
    """Varies across a random policy's samples, so even 3 steps get a learning signal."""
    return min(1.0, len(response.strip()) / 8)


def at_least_six_characters(response: str, sample: Sample) -> float:
    """0 or 1: a random policy's groups of 3-token samples come all 0, all 1 and mixed."""
    return float(len(response.strip()) >= 6)
