"""verl's custom reward for the peers bench: rollplex's exact match, so every framework is
scored by one function. verl calls compute_score(data_source, solution_str, ground_truth,
extra_info)."""

from __future__ import annotations

from typing import Any

from rollplex.data.rewards import exact_match
from rollplex.data.sample import Sample


def compute_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None, **_: Any
) -> float:
    return exact_match(solution_str, Sample("verl", "", str(ground_truth)))
