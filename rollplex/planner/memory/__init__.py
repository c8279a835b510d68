"""Memory-slot assignment: give every tensor a byte offset in its lane's arena.

`UsageRecord`s in, a `MemoryAssignment` out. One strategy per module, looked up by the
schedule's `memory_strategy`: `naive` (the baseline) and `greedy_by_size`. Every strategy
passes the same golden tests: no two live records share bytes in a lane.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rollplex.planner.memory import greedy_by_size, naive
from rollplex.planner.memory.assignment import MemoryAssignment, find_overlap
from rollplex.planner.memory.records import UsageRecord, lane_lower_bounds, lower_bound

Strategy = Callable[[Sequence[UsageRecord]], MemoryAssignment]

STRATEGIES: dict[str, Strategy] = {
    "naive": naive.assign,
    "greedy_by_size": greedy_by_size.assign,
}


def assign(records: Sequence[UsageRecord], strategy: str) -> MemoryAssignment:
    """Offsets for `records` from the strategy named `strategy`."""
    try:
        run = STRATEGIES[strategy]
    except KeyError:
        known = ", ".join(sorted(STRATEGIES))
        raise ValueError(f"unknown memory strategy {strategy!r}; known: {known}") from None
    return run(records)


__all__ = [
    "STRATEGIES",
    "MemoryAssignment",
    "Strategy",
    "UsageRecord",
    "assign",
    "find_overlap",
    "lane_lower_bounds",
    "lower_bound",
]
