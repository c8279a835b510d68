"""Naive strategy: the baseline every other strategy is measured against.

Every record gets bytes of its own, whatever its lifetime: offsets are the running sum of sizes
in input order within each lane, and each lane's arena is the sum of its records' sizes. Nothing
is ever reused, so it is trivially correct and is what "no memory planning" costs.
"""

from __future__ import annotations

from collections.abc import Sequence

from rollplex.planner.memory.assignment import MemoryAssignment
from rollplex.planner.memory.records import UsageRecord


def assign(records: Sequence[UsageRecord]) -> MemoryAssignment:
    """Place records back to back per lane, in input order."""
    offsets: list[int] = []
    arena_sizes: dict[int, int] = {}
    for r in records:
        top = arena_sizes.get(r.lane, 0)
        offsets.append(top)
        arena_sizes[r.lane] = top + r.size
    return MemoryAssignment(offsets, dict(sorted(arena_sizes.items())), "naive")
