"""Pack intervals into lanes in which every pair is either disjoint or nested.

torch-tb-profiler builds one call tree per host thread and drops (with "ranges on the same
thread should not intersect") any op that only partly overlaps an earlier one; the trace
viewer mis-draws such slices too. Spans of one stream normally never overlap, but measured
ones can touch or cross by clock skew, and a user's plan may stack ops on one stream, so
such spans go to overflow lanes instead of vanishing.
"""

from __future__ import annotations

from collections.abc import Sequence


def nesting_lanes(intervals: Sequence[tuple[float, float]]) -> list[int]:
    """Lane index per interval (input order); lane 0 unless it would break nesting there.

    Intervals are half-open [start, end), compared exactly as given, so pass the values a
    reader will compute (ts and ts + dur after rounding).
    """
    order = sorted(range(len(intervals)), key=lambda i: (intervals[i][0], -intervals[i][1]))
    open_ends: list[list[float]] = []  # per lane: ends of the intervals still open, innermost last
    lanes = [0] * len(intervals)
    for i in order:
        start, end = intervals[i]
        lane = 0
        while lane < len(open_ends):
            stack = open_ends[lane]
            while stack and stack[-1] <= start:
                stack.pop()  # ended before this one starts
            if not stack or end <= stack[-1]:
                break  # disjoint from or nested in what is open here
            lane += 1
        if lane == len(open_ends):
            open_ends.append([])
        open_ends[lane].append(end)
        lanes[i] = lane
    return lanes
