"""Greedy-by-size strategy: best fit, largest first (TFLite GPU planner / XLA heap simulator).

Per lane: records largest first (ties: earlier first, longer life, input index; never
names), each into the least-wasteful gap among the placed records it intersects, else on
top; then peak repair (`repair.py`) while the arena is above the lane's lower bound.
Why and what it costs: docs/architecture.md (Memory planning).
"""

from __future__ import annotations

from collections.abc import Sequence

from rollplex.planner.gc_paused import cyclic_gc_paused
from rollplex.planner.memory.assignment import MemoryAssignment
from rollplex.planner.memory.interval_index import OccupancyIndex
from rollplex.planner.memory.records import UsageRecord, lane_indices, lower_bound
from rollplex.planner.memory.repair import repair_peak
from rollplex.planner.memory.sliding_union import sliding_union

NAME = "greedy_by_size"


def assign(records: Sequence[UsageRecord], *, repair: bool = True) -> MemoryAssignment:
    """Best-fit offsets, largest record first, per lane; then peak repair unless disabled."""
    offsets = [0] * len(records)
    arena_sizes: dict[int, int] = {}
    with cyclic_gc_paused():
        for lane, idx in lane_indices(records).items():
            idx.sort(key=lambda i: _priority(records[i], i))
            arena = place_best_fit(records, idx, offsets)
            if repair:
                arena = _repair(records, idx, offsets, arena)
            arena_sizes[lane] = arena
    return MemoryAssignment(offsets, arena_sizes, NAME if repair else f"{NAME}:plain")


def _repair(records: Sequence[UsageRecord], idx: list[int], offsets: list[int], arena: int) -> int:
    """Run peak repair on one lane if it is above its lower bound; the lane's new arena."""
    lane_records = [records[i] for i in idx]
    bound = lower_bound(lane_records)
    if arena <= bound:
        return arena
    fixed = repair_peak(lane_records, [offsets[i] for i in idx], bound)
    for i, offset in zip(idx, fixed, strict=True):
        offsets[i] = offset
    return max(o + r.size for o, r in zip(fixed, lane_records, strict=True))


def _priority(r: UsageRecord, i: int) -> tuple[int, int, int, int]:
    return (-r.size, r.first, r.first - r.last, i)


def place_best_fit(records: Sequence[UsageRecord], order: list[int], offsets: list[int]) -> int:
    """Place records `order` (one lane) one by one at their best-fit gap; return the arena.

    Writes the offsets into `offsets`.
    """
    windows = [(records[i].first, records[i].last) for i in order]
    # Both answer the same query; sliding wins when consecutive windows mostly overlap.
    occupancy = sliding_union(windows) or OccupancyIndex(windows)
    arena = 0
    for k, i in enumerate(order):
        size = records[i].size
        if not size:
            offsets[i] = 0
            continue
        best = occupancy.best_fit(k, size)
        offsets[i] = best
        occupancy.add(k, best, best + size)
        if best + size > arena:
            arena = best + size
    return arena
