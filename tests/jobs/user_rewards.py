"""A user reward by import path (`reward.components=[{name: 'tests.jobs.user_rewards:...'}]`):
the signature is fn(response: str, sample: Sample) -> float."""

from __future__ import annotations

from rollplex.data import Sample


def longer_is_better(response: str, sample: Sample) -> float:
    """Varies across a random policy's samples, so even 3 steps get a learning signal."""
    return min(1.0, len(response.strip()) / 8)
