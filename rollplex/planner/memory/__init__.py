"""Memory-slot assignment: give every tensor a byte offset in its lane's arena.

Input is a table of `UsageRecord`s (size, closed lifetime, lane); output is a
`MemoryAssignment`. Strategies live one per module and are looked up by name, the name the
schedule spec's `memory_strategy` field carries:
- `naive`: every record gets bytes of its own; the baseline.
- `greedy_by_size`: best fit, largest first, then a bounded local repair of the peak.
Every strategy is held to the same golden tests: no two live records share bytes in a lane.
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
