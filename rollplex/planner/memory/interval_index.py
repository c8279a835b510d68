"""Occupied bytes of one lane over a lifetime window: the data structure behind best fit.

A segment tree over the lane's compressed positions keeps byte ranges per node (`own`: live
over all of the node, `sub`: live anywhere under it), so the union of the placed records
intersecting a window is read from O(log n) nodes instead of a scan.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from typing import cast

_Ranges = list[tuple[int, int]]  # (start, end) byte ranges
_COMPACT_AT = 8  # merge a node's list once it has this many ranges since the last merge


class OccupancyIndex:
    """Byte ranges of placed windows; window k of the constructor is placed with `add(k, ...)`."""

    __slots__ = ("_canonical", "_own", "_own_merged", "_paths", "_sub", "_sub_merged")

    def __init__(self, windows: Sequence[tuple[int, int]]) -> None:
        coord = {p: i for i, p in enumerate(sorted({p for w in windows for p in w}))}
        width = 1 << max(len(coord) - 1, 0).bit_length()
        self._canonical = [_cover(coord[a] + width, coord[b] + width + 1) for a, b in windows]
        used = bytearray(2 * width)
        own: list[_Ranges | None] = [None] * (2 * width)  # lists only where they can be used
        sub: list[_Ranges | None] = [None] * (2 * width)
        for nodes in self._canonical:
            for node in nodes:
                if not used[node]:
                    used[node] = 1
                    own[node], sub[node] = [], []
        # Used nodes on each root path, root first (ascending ids); unused nodes share a list.
        up: list[list[int]] = [[], [1] if used[1] else []]
        for node in range(2, width + len(coord)):  # leaves past the last position are never read
            parent = up[node >> 1]
            up.append([*parent, node] if used[node] else parent)
        self._paths: list[list[int]] = []
        for a, b in windows:
            lo, hi = coord[a] + width, coord[b] + width
            top = lo >> (lo ^ hi).bit_length()  # lowest common ancestor: its path is read once
            right = up[hi]
            self._paths.append(up[lo] + right[bisect_right(right, top) :])
        self._own = cast("list[_Ranges]", own)  # every node the loops below touch has a list
        self._sub = cast("list[_Ranges]", sub)
        # Length of each list right after its last merge: merge again once it has grown.
        self._own_merged = [0] * (2 * width)
        self._sub_merged = [0] * (2 * width)

    def add(self, k: int, start: int, end: int) -> None:
        """Mark bytes [start, end) occupied over window k."""
        item = (start, end)
        own, sub = self._own, self._sub
        for node in self._canonical[k]:
            own[node].append(item)
            sub[node].append(item)
        for node in self._paths[k]:
            sub[node].append(item)

    def best_fit(self, k: int, size: int) -> int:
        """Offset of the shortest gap of at least `size` bytes free over window k (lowest on
        ties), else the top of what is placed over it."""
        # Ranges come sorted by start and may overlap; `top` is the highest end seen so far.
        best, best_waste, top = -1, -1, 0
        for start, end in self.occupied(k):
            waste = start - top - size
            if waste >= 0 and (best < 0 or waste < best_waste):
                best, best_waste = top, waste
            if end > top:
                top = end
        return top if best < 0 else best

    def occupied(self, k: int) -> _Ranges:
        """Occupied byte ranges over window k, sorted by start; they may overlap."""
        found: _Ranges = []
        sub, merged = self._sub, self._sub_merged
        for node in self._canonical[k]:
            ranges = sub[node]
            if len(ranges) - merged[node] >= _COMPACT_AT:
                ranges = sub[node] = _union(ranges)
                merged[node] = len(ranges)
            found += ranges
        own, merged = self._own, self._own_merged
        for node in self._paths[k]:
            ranges = own[node]
            if len(ranges) - merged[node] >= _COMPACT_AT:
                ranges = own[node] = _union(ranges)
                merged[node] = len(ranges)
            found += ranges
        found.sort()  # concatenated sorted runs: timsort merges them
        return found


def _cover(lo: int, hi: int) -> list[int]:
    """Canonical nodes of leaves [lo, hi), bottom-up."""
    nodes = []
    while lo < hi:
        if lo & 1:
            nodes.append(lo)
            lo += 1
        if hi & 1:
            hi -= 1
            nodes.append(hi)
        lo >>= 1
        hi >>= 1
    return nodes


def _union(ranges: _Ranges) -> _Ranges:
    """Sorted disjoint ranges covering the same bytes; touching ranges are merged."""
    ranges.sort()
    merged: _Ranges = []
    lo, hi = ranges[0]
    for start, end in ranges:
        if start > hi:
            merged.append((lo, hi))
            lo, hi = start, end
        elif end > hi:
            hi = end
    merged.append((lo, hi))
    return merged
