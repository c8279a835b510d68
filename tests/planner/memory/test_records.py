"""UsageRecord validation, the lower bounds and the overlap checker."""

from __future__ import annotations

import random
from collections.abc import Callable
from itertools import combinations

import pytest

from rollplex.planner.memory import (
    MemoryAssignment,
    UsageRecord,
    assign,
    find_overlap,
    lane_lower_bounds,
    lower_bound,
)
from rollplex.planner.memory.tables import step_records, uniform_records

from .cases import COMPLEX, COMPLEX_BOUND, COMPLEX_LANE_BOUNDS

R = UsageRecord


def test_record_rejects_negative_size_and_names_it() -> None:
    with pytest.raises(ValueError, match=r"name='kv_cache'.*size must be >= 0"):
        R(-1, 0, 3, 0, "kv_cache")


def test_record_rejects_reversed_lifetime_and_names_it() -> None:
    with pytest.raises(ValueError, match=r"name='grad'.*first must be <= last"):
        R(8, 5, 4, 0, "grad")


@pytest.mark.parametrize(
    ("records", "expected"),
    [
        ([], 0),
        ([R(7, 3, 3)], 7),
        ([R(5, 0, 1), R(9, 2, 3)], 9),  # adjacent, never live together
        ([R(5, 0, 2), R(9, 2, 3)], 14),  # closed intervals: both live at 2
        ([R(10, 0, 9), R(5, 2, 3), R(7, 3, 6)], 22),  # all three at 3
        ([R(0, 0, 9), R(4, 0, 0)], 4),  # zero-size records weigh nothing
        ([R(3, 0, 5, lane=0), R(4, 2, 2, lane=1)], 7),  # the device bound adds lanes up
    ],
)
def test_lower_bound_hand_computed(records: list[UsageRecord], expected: int) -> None:
    assert lower_bound(records) == expected


def test_bounds_of_the_complex_table() -> None:
    assert lower_bound(COMPLEX) == COMPLEX_BOUND
    assert lane_lower_bounds(COMPLEX) == COMPLEX_LANE_BOUNDS


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lower_bound_matches_brute_force(seed: int) -> None:
    records = uniform_records(150, seed, lanes=2, long_fraction=0.05)
    horizon = range(max(r.last for r in records) + 1)
    per_lane = {
        lane: max(
            sum(r.size for r in records if r.lane == lane and r.first <= t <= r.last)
            for t in horizon
        )
        for lane in (0, 1)
    }
    assert lane_lower_bounds(records) == per_lane
    assert lower_bound(records) == max(
        sum(r.size for r in records if r.first <= t <= r.last) for t in horizon
    )


def _conflict(records: list[UsageRecord], offsets: list[int], i: int, j: int) -> bool:
    a, b = records[i], records[j]
    return (
        a.lane == b.lane
        and a.first <= b.last
        and b.first <= a.last
        and offsets[i] < offsets[j] + b.size
        and offsets[j] < offsets[i] + a.size
    )


@pytest.mark.parametrize(
    ("records", "offsets", "expected"),
    [
        ([R(8, 0, 2), R(8, 2, 4)], [0, 4], (0, 1)),  # live together at 2, bytes 4..7 shared
        ([R(8, 0, 2), R(8, 3, 4)], [0, 0], None),  # adjacent lifetimes may share bytes
        ([R(8, 0, 2), R(8, 0, 2)], [0, 8], None),  # touching byte ranges do not overlap
        ([R(8, 0, 2, lane=0), R(8, 0, 2, lane=1)], [0, 0], None),  # lanes never conflict
        ([R(0, 0, 2), R(8, 0, 2)], [4, 0], None),  # zero-size records occupy no bytes
        ([R(4, 0, 9), R(4, 3, 3), R(4, 5, 5)], [0, 4, 2], (0, 2)),
    ],
)
def test_find_overlap_small_cases(
    records: list[UsageRecord], offsets: list[int], expected: tuple[int, int] | None
) -> None:
    assert find_overlap(records, MemoryAssignment(offsets, {}, "hand")) == expected


def test_find_overlap_detects_a_corrupted_assignment() -> None:
    records = step_records(800, 5, lanes=2)
    good = assign(records, "greedy_by_size")
    assert find_overlap(records, good) is None
    # Move one record onto the bytes of another that is live at the same time in its lane.
    i, j = next(
        (i, j)
        for i, j in combinations(range(len(records)), 2)
        if records[i].size and records[j].size and _conflict(records, [0] * len(records), i, j)
    )
    offsets = list(good.offsets)
    offsets[j] = offsets[i]
    found = find_overlap(records, MemoryAssignment(offsets, good.arena_sizes, "corrupted"))
    assert found is not None
    assert _conflict(records, offsets, *found)


@pytest.mark.parametrize("seed", range(6))
def test_find_overlap_agrees_with_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    records = uniform_records(120, seed, lanes=2, long_fraction=0.05)
    offsets = assign(records, "greedy_by_size").offsets
    for i in rng.sample(range(len(records)), seed):  # seed 0 stays valid
        offsets[i] = rng.randrange(0, 2 * max(offsets) + 1)
    pairs = [p for p in combinations(range(len(records)), 2) if _conflict(records, offsets, *p)]
    found = find_overlap(records, MemoryAssignment(offsets, {}, "random"))
    assert (found is None) == (not pairs)
    if found is not None:
        assert found in pairs


def test_find_overlap_rejects_a_wrong_length() -> None:
    with pytest.raises(ValueError, match="2 offsets for 3 records"):
        find_overlap([R(1, 0, 0)] * 3, MemoryAssignment([0, 0], {}, "short"))


@pytest.mark.parametrize("family", [step_records, uniform_records])
def test_tables_are_seeded_and_sized(family: Callable[..., list[UsageRecord]]) -> None:
    assert family(300, 4, lanes=2) == family(300, 4, lanes=2)
    assert family(300, 4, lanes=2) != family(300, 5, lanes=2)
    assert len(family(300, 4, lanes=2)) == 300
    assert {r.lane for r in family(300, 4, lanes=2)} == {0, 1}
