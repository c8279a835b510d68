"""The output of a memory strategy, and the checker every strategy is tested with.

A `MemoryAssignment` gives each record an offset in its lane's arena. Two records conflict
when they share a lane, closed lifetimes and bytes; zero-size records never conflict.
`find_overlap` sweeps one lane's positions with the live records sorted by offset, so each
new record is compared with its two neighbours only.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections.abc import Sequence
from dataclasses import dataclass

from rollplex.planner.memory.records import UsageRecord, lane_indices


@dataclass(slots=True)
class MemoryAssignment:
    """Byte offsets per record (input order) and arena sizes per lane."""

    offsets: list[int]
    arena_sizes: dict[int, int]
    strategy: str

    @property
    def total_bytes(self) -> int:
        """Bytes of all arenas together: what the plan reserves on the device."""
        return sum(self.arena_sizes.values())


def find_overlap(
    records: Sequence[UsageRecord], assignment: MemoryAssignment
) -> tuple[int, int] | None:
    """Indices (i < j) of two records live together in one lane with intersecting bytes, or None."""
    offsets = assignment.offsets
    if len(offsets) != len(records):
        raise ValueError(f"assignment has {len(offsets)} offsets for {len(records)} records")
    for idx in lane_indices(records).values():
        found = _lane_overlap(records, offsets, idx)
        if found is not None:
            return found
    return None


def _lane_overlap(
    records: Sequence[UsageRecord], offsets: list[int], idx: list[int]
) -> tuple[int, int] | None:
    # Events (position, kind, index): kind 0 frees (at last + 1) sort before kind 1 allocations.
    events: list[tuple[int, int, int]] = []
    for i in idx:
        r = records[i]
        if r.size:
            events.append((r.first, 1, i))
            events.append((r.last + 1, 0, i))
    events.sort()
    live: list[tuple[int, int]] = []  # (offset, index), sorted
    for _, kind, i in events:
        key = (offsets[i], i)
        if kind == 0:
            del live[bisect_left(live, key)]
            continue
        start, end = offsets[i], offsets[i] + records[i].size
        pos = bisect_right(live, key)
        if pos > 0:
            j = live[pos - 1][1]
            if offsets[j] + records[j].size > start:
                return (min(i, j), max(i, j))
        if pos < len(live):
            j = live[pos][1]
            if offsets[j] < end:
                return (min(i, j), max(i, j))
        insort(live, key)
    return None
