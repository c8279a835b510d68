"""SlidingUnion answers every best-fit query exactly as OccupancyIndex does."""

from __future__ import annotations

import random

import pytest

from rollplex.planner.memory import UsageRecord, greedy_by_size
from rollplex.planner.memory.interval_index import OccupancyIndex
from rollplex.planner.memory.records import lane_indices
from rollplex.planner.memory.sliding_union import SlidingUnion, sliding_union
from rollplex.planner.memory.tables import step_records, uniform_records

from .cases import ALL


def copies(k: int, seed: int) -> list[UsageRecord]:
    """K copies of one small step issued one position apart (interleaved, as a serial plan of
    K micro-steps lays them out): one size's windows slide by a position per query."""
    rng = random.Random(seed)
    shape = [(rng.choice([64, 96, 256, 4096]), rng.randint(0, 40)) for _ in range(6)]
    out = []
    for i in range(k):
        for op, (size, span) in enumerate(shape):  # op j of copy i runs at j * k + i
            first = op * k + i
            out.append(UsageRecord(size, first, first + span * k // 8 + rng.randint(0, 2)))
    return out


def best_fits(records: list[UsageRecord], occupancy: type) -> list[int]:
    """Every query's answer, placing in greedy order with `occupancy` as the index."""
    out = [0] * len(records)
    for idx in lane_indices(records).values():
        idx.sort(key=lambda i: greedy_by_size._priority(records[i], i))
        index = occupancy([(records[i].first, records[i].last) for i in idx])
        for k, i in enumerate(idx):
            if records[i].size:
                out[i] = index.best_fit(k, records[i].size)
                index.add(k, out[i], out[i] + records[i].size)
    return out


def tiny(seed: int) -> list[UsageRecord]:
    """Small sizes and positions, so offsets collide, touch and nest in every way."""
    rng = random.Random(seed)
    out = []
    for _ in range(rng.randint(1, 60)):
        first = rng.randint(0, 12)
        size = rng.choice([0, 1, 2, 3, 5, 8])
        out.append(UsageRecord(size, first, first + rng.randint(0, 6), rng.randint(0, 1)))
    return out


TABLES = {
    **{name: ALL[name] for name in ("complex", "chain", "step-s0-l1", "uniform-s0")},
    **{f"copies-{k}-s{s}": copies(k, s) for k in (20, 90) for s in (0, 1)},
    "step-800": step_records(800, 7, lanes=2),
    "uniform-600": uniform_records(600, 3, long_fraction=0.05),
    **{f"tiny-s{s}": tiny(s) for s in range(40)},
}


@pytest.mark.parametrize("table", list(TABLES))
def test_same_answers_as_the_occupancy_index(table: str) -> None:
    records = TABLES[table]
    assert best_fits(records, SlidingUnion) == best_fits(records, OccupancyIndex)


def test_it_is_chosen_only_where_windows_slide() -> None:
    def windows(records: list[UsageRecord]) -> list[tuple[int, int]]:
        order = sorted(range(len(records)), key=lambda i: greedy_by_size._priority(records[i], i))
        return [(records[i].first, records[i].last) for i in order]

    assert sliding_union(windows(copies(200, 0))) is not None
    assert sliding_union(windows(uniform_records(2000, 0))) is None
    assert sliding_union(windows(step_records(2000, 0))) is None
    assert sliding_union(windows(copies(10, 0))) is None  # too few records to pay


def test_greedy_places_as_the_occupancy_index_would() -> None:
    records = copies(200, 1)
    offsets = [0] * len(records)
    idx = sorted(range(len(records)), key=lambda i: greedy_by_size._priority(records[i], i))
    greedy_by_size.place_best_fit(records, idx, offsets)
    assert offsets == best_fits(records, OccupancyIndex)
