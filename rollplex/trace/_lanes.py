"""Pack intervals into lanes in which every pair is either disjoint or nested.

torch-tb-profiler drops an op that only partly overlaps an earlier one on its thread, so
spans that cross (clock skew, a user's stacked plan) go to overflow lanes. Ends within
`tolerance` of a start count as touching (float sums), and `pack` trims them so that the
plugin's exact comparison of ts + dur agrees.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def tolerance(t: float) -> float:
    """How far apart two times may be and still count as equal: float error, not time."""
    return 1e-12 * max(1.0, abs(t))


def pack(intervals: Sequence[tuple[float, float]]) -> tuple[list[int], list[float]]:
    """(lane per interval, duration per interval), in input order. Lane 0 unless the
    interval would break nesting there; durations are `end - start`, trimmed by at most
    `tolerance` where an end passes a later start or an enclosing end only by float error,
    so that `start + duration` nests exactly."""
    order = sorted(range(len(intervals)), key=lambda i: (intervals[i][0], -intervals[i][1]))
    ends = [float(b) for _, b in intervals]
    open_ends: list[list[int]] = []  # per lane: the intervals still open, innermost last
    lanes = [0] * len(intervals)
    for i in order:
        start, end = intervals[i]
        lane = 0
        while lane < len(open_ends):
            stack = open_ends[lane]
            while stack and ends[stack[-1]] <= start + tolerance(start):
                done = stack.pop()  # ended before this one starts (or touches it)
                ends[done] = min(ends[done], start)
            if not stack:
                break
            top = ends[stack[-1]]
            if end <= top + tolerance(top):  # nested in what is open here
                ends[i] = min(end, top)
                break
            lane += 1
        if lane == len(open_ends):
            open_ends.append([])
        open_ends[lane].append(i)
        lanes[i] = lane
    # Nesting is exact for the reader only if start + dur lands on or before the trimmed end.
    durations = []
    for (start, _), end in zip(intervals, ends, strict=True):
        dur = max(end - start, 0.0)
        while dur > 0 and start + dur > end:
            dur = math.nextafter(dur, 0.0)
        durations.append(dur)
    return lanes, durations


def nesting_lanes(intervals: Sequence[tuple[float, float]]) -> list[int]:
    """Lane per interval (input order): `pack`'s lanes."""
    return pack(intervals)[0]
