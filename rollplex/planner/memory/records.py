"""Usage records: the whole input of memory-slot assignment.

`UsageRecord(size, first, last, lane)`: `size` bytes live over the closed interval of
positions [first, last] in one arena lane (per device and stream). `lower_bound` is the most
bytes live at once; `lane_lower_bounds` the same per lane, whose sum no assignment can beat.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class UsageRecord:
    """A tensor of `size` bytes live over positions [first, last] (closed) in arena `lane`."""

    size: int
    first: int
    last: int
    lane: int = 0
    name: str = ""

    def __post_init__(self) -> None:
        if self.size < 0:
            raise ValueError(f"{self!r}: size must be >= 0, got {self.size}")
        if self.first > self.last:
            raise ValueError(
                f"{self!r}: first must be <= last (closed interval), got {self.first} > {self.last}"
            )


def _peak(records: Iterable[UsageRecord]) -> int:
    return _sweep(records)[0]


def _sweep(records: Iterable[UsageRecord]) -> tuple[int, int]:
    """(most bytes live at one position, the first position where that many are)."""
    # A record counts from `first` through `last`, so it leaves at last + 1; netting arrivals and
    # departures per position means one ending at t and one starting at t + 1 never add up.
    delta: defaultdict[int, int] = defaultdict(int)
    for r in records:
        if r.size:
            delta[r.first] += r.size
            delta[r.last + 1] -= r.size
    live = peak = where = 0
    for position in sorted(delta):
        live += delta[position]
        if live > peak:
            peak, where = live, position
    return peak, where


def lower_bound(records: Sequence[UsageRecord]) -> int:
    """Most bytes live at any one position, all lanes of the device together."""
    return _peak(records)


def peak_position(records: Sequence[UsageRecord]) -> int:
    """The first position at which `lower_bound`'s bytes are live (0 for no records)."""
    return _sweep(records)[1]


def lane_lower_bounds(records: Sequence[UsageRecord]) -> dict[int, int]:
    """Most bytes live at any one position, per lane (every lane that has a record)."""
    return {lane: _peak(records[i] for i in idx) for lane, idx in lane_indices(records).items()}


def lane_indices(records: Sequence[UsageRecord]) -> dict[int, list[int]]:
    """Input indices per lane, lanes in ascending order, input order kept within a lane."""
    groups: defaultdict[int, list[int]] = defaultdict(list)
    for i, r in enumerate(records):
        groups[r.lane].append(i)
    return dict(sorted(groups.items()))
