"""Peak repair: local ruin-and-recreate that lowers one lane's arena after a greedy pass.

Per round, the records around the one that ends highest are re-inserted in a fixed list of
orders (then seeded shuffles); an arrangement is kept only if it ends lower, so the arena
never grows. Work is bounded by a count of records examined, so results are deterministic.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence

import numpy as np

from rollplex.planner.memory.records import UsageRecord

BUDGET_PER_RECORD = 64  # records examined, per record of the lane ...
BUDGET_FLOOR = 1 << 17  # ... plus this much, so small lanes still get a few rounds
_MIN_COST = 32  # what one placement costs the budget at least
_SHUFFLES = 12


class _Lane:
    """One lane's records sorted by `first`, as numpy columns."""

    __slots__ = ("first", "last", "reach", "size")

    def __init__(self, first: np.ndarray, last: np.ndarray, size: np.ndarray) -> None:
        self.first, self.last, self.size = first, last, size
        self.reach = int((last - first).max())  # a record live at t starts at t - reach or later

    def window(self, a: int, b: int) -> tuple[int, int]:
        """Slice of the records that may be live somewhere in [a, b]."""
        lo = int(np.searchsorted(self.first, a - self.reach))
        return lo, int(np.searchsorted(self.first, b, side="right"))

    def live(self, a: int, b: int) -> np.ndarray:
        """Indices of the non-empty records live somewhere in [a, b]."""
        lo, hi = self.window(a, b)
        return lo + np.flatnonzero((self.last[lo:hi] >= a) & (self.size[lo:hi] > 0))


def repair_peak(records: Sequence[UsageRecord], offsets: list[int], bound: int) -> list[int]:
    """New offsets for one lane's `records`: a valid placement, arena no larger than before.

    `offsets` must be a valid placement; `bound` is the lane's lower bound (stop when reached).
    """
    n = len(records)
    if n == 0:
        return list(offsets)
    columns = [[r.first for r in records], [r.last for r in records], [r.size for r in records]]
    by_first = np.argsort(np.asarray(columns[0]), kind="stable")
    lane = _Lane(*(np.asarray(col, dtype=np.int64)[by_first] for col in columns))
    start = np.asarray(offsets, dtype=np.int64)[by_first]
    budget = BUDGET_PER_RECORD * n + BUDGET_FLOOR
    for round_no in range(n):
        ends = np.where(lane.size > 0, start + lane.size, 0)  # empty records occupy nothing
        arena = int(ends.max())
        if arena <= bound:
            break
        top = int(np.argmax(ends))
        near = lane.live(int(lane.first[top]), int(lane.last[top]))
        hot = lane.live(int(lane.first[near].min()), int(lane.last[near].max()))
        if len(hot) * _MIN_COST > budget:
            break  # not even one full re-insertion fits in the budget
        for order, best_fit in _orders(hot, lane, round_no):
            trial, budget = _recreate(lane, start, hot, order, best_fit, budget)
            if budget < 0:
                break
            if int((trial[hot] + lane.size[hot]).max()) < arena:
                start = trial
                break
        else:
            break  # no order got below the arena: give up on this lane
        if budget < 0:
            break
    result = [0] * n
    for i, j in enumerate(by_first.tolist()):
        result[j] = int(start[i])
    return result


def _recreate(
    lane: _Lane, start: np.ndarray, hot: np.ndarray, order: list[int], best_fit: bool, budget: int
) -> tuple[np.ndarray, int]:
    """Offsets with `hot` lifted and put back one by one in `order`; the budget left."""
    trial = start.copy()
    placed = np.ones(len(trial), dtype=bool)
    placed[hot] = False
    for i in order:
        a, b = int(lane.first[i]), int(lane.last[i])
        lo, hi = lane.window(a, b)
        budget -= max(hi - lo, _MIN_COST)
        if budget < 0:
            break
        near = lo + np.flatnonzero(placed[lo:hi] & (lane.last[lo:hi] >= a) & (lane.size[lo:hi] > 0))
        trial[i] = _fit(trial[near], trial[near] + lane.size[near], int(lane.size[i]), best_fit)
        placed[i] = True
    return trial, budget


def _orders(hot: np.ndarray, lane: _Lane, round_no: int) -> Iterator[tuple[list[int], bool]]:
    """(order, best fit?) pairs, built lazily: a round stops at the first one that works."""
    size, first, last = lane.size, lane.first, lane.last
    rank = hot[np.lexsort((hot, -size[hot]))].tolist()  # largest first, ties by lane position
    yield rank, False
    yield rank, True
    # Longest-lived first: state that spans the step goes to the bottom, and the big
    # short-lived scratch of different phases stacks on it in the holes it leaves.
    yield hot[np.lexsort((hot, -size[hot], first[hot] - last[hot]))].tolist(), False
    rng = random.Random(round_no)
    for k in range(_SHUFFLES):
        noise = {i: int(size[i]) * rng.lognormvariate(0.0, 0.5) for i in rank}
        yield sorted(rank, key=lambda i: -noise[i]), k % 2 == 1


def _fit(starts: np.ndarray, ends: np.ndarray, size: int, best_fit: bool) -> int:
    """Lowest (first fit) or tightest (best fit) gap of `size` bytes between the ranges."""
    if len(starts) == 0:
        return 0
    order = np.argsort(starts, kind="stable")
    starts, covered = starts[order], np.maximum.accumulate(ends[order])
    below = np.concatenate(([0], covered[:-1]))  # highest byte in use before each range
    gaps = starts - below
    fits = np.flatnonzero(gaps >= size)
    if len(fits) == 0:
        return int(covered[-1])
    pick = fits[np.argmin(gaps[fits])] if best_fit else fits[0]
    return int(below[pick])
