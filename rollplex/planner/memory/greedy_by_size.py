"""Greedy-by-size strategy: best fit, largest first (TFLite GPU planner / XLA heap simulator).

Policy, per lane (lanes never share bytes):
1. Order the records largest first. Ties go to the earlier `first`, then the longer lifetime,
   then the lower input index. Names never take part, so renaming records changes nothing.
2. Place each record against the already placed records of its lane whose lifetimes intersect
   its own (no other record can conflict with it). Their byte ranges, merged, leave gaps;
   take the gap that fits with the least waste (lowest offset on ties). If none fits, place
   the record on top of the highest of them. Zero-size records occupy nothing: offset 0.
3. If the lane's arena is above its lower bound (the most bytes live at once), run peak repair
   (`repair.py`): re-place the records around the one that ends highest, in a few other orders,
   and keep an arrangement only if it ends lower. Repair never grows the arena.
The lane's arena is the highest end of any record in it.

Why: big records placed first leave the holes that small ones later fill, and best fit keeps big
holes for big records. Plain greedy-by-size mostly lands on the lower bound, but one early
choice near the peak can cost 5% (step-shaped tables) to 15% (short lifetimes only) on some
tables; step 3 brought all of those under 4% in our runs. It helps little when many long
lifetimes cross at random (bench/): there, searches over many orders also stayed 5-10% above
the bound on 2k-record tables.

Cost: the intersecting records are found through `OccupancyIndex` (a segment tree of byte
ranges), so a pass costs O(n log n) plus the size of the byte unions it reads, never a scan of
all placed records. Where consecutive windows mostly overlap (copies of one tensor issued a
position apart, thousands of long-lived records crossing each), `SlidingUnion` walks one window
along instead and touches only the records that enter or leave it. Both answer the same query,
so the offsets do not depend on which one runs. Repair's work is capped by a budget
proportional to the lane. The cyclic garbage collector is paused during a plan (see
`rollplex.planner.gc_paused`).
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
