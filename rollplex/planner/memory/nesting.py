"""Side arenas nested inside the main one, over the windows their streams are active.

A side lane (decode, a prefix side stream) is packed on its own, then placed as one block
record in the main lane, live over the window in which the main stream may not touch it
(`happens_before.side_windows`). Its peak then adds to the main arena's only inside that
window, not always.
"""

from __future__ import annotations

from collections.abc import Sequence

from rollplex.planner.memory.assignment import MemoryAssignment
from rollplex.planner.memory.records import UsageRecord


def assign_nested(
    records: Sequence[UsageRecord],
    run,
    windows: dict[int, tuple[int, int]],
    main: int = 0,
) -> tuple[MemoryAssignment, list[int]]:
    """Offsets for `records` with each lane in `windows` nested in lane `main`, by the
    strategy `run`. Returns the assignment and each record's lane in it (nested records
    move to `main`)."""
    side = {lane: (lo, hi) for lane, (lo, hi) in windows.items() if lane != main}
    nested = [i for i, r in enumerate(records) if r.lane in side]
    if not nested:
        return run(records), [r.lane for r in records]
    inner = run([records[i] for i in nested])
    span: dict[int, tuple[int, int]] = {}
    for i in nested:
        r = records[i]
        lo, hi = span.get(r.lane, side[r.lane])
        span[r.lane] = (min(lo, r.first), max(hi, r.last))
    lanes = sorted(span)
    blocks = [
        UsageRecord(inner.arena_sizes.get(lane, 0), *span[lane], main, f"lane {lane}")
        for lane in lanes
    ]
    kept = [i for i, r in enumerate(records) if r.lane not in side]
    outer = run([records[i] for i in kept] + blocks)
    offsets = [0] * len(records)
    for k, i in enumerate(kept):
        offsets[i] = outer.offsets[k]
    base = {lane: outer.offsets[len(kept) + k] for k, lane in enumerate(lanes)}
    for k, i in enumerate(nested):
        offsets[i] = base[records[i].lane] + inner.offsets[k]
    arenas = {lane: size for lane, size in outer.arena_sizes.items()}
    arenas.setdefault(main, 0)
    lane_of = [main if r.lane in side else r.lane for r in records]
    return MemoryAssignment(offsets, arenas, outer.strategy), lane_of
