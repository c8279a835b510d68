"""Occupied bytes over a sliding lifetime window: best fit when consecutive windows overlap.

Keeps the coverage counts of one window's bytes and its gaps indexed by (length, offset), so
best fit is one bisect; moving the window edits only the records that enter or leave it.
Answers exactly what `OccupancyIndex` answers, where walking is cheaper than re-reading.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right, insort
from collections.abc import Sequence

import numpy as np

_NEAR = 32  # a move touching at most this many records (estimated) counts as a slide
_SLIDING_SHARE = 0.95  # ... and this share of all moves must be slides
# A record entering or leaving costs about what a (vectorised) rebuild spends per this many
# placed records, plus a fixed share for scanning every window: walk while it is cheaper.
_MOVE_COST = 64
_REBUILD_FLOOR = 4096
_LOW = 64  # gap keys: length << _LOW | offset; offsets fit int64 (the rebuild columns hold them)
_OFFSET = (1 << _LOW) - 1


def sliding_union(windows: Sequence[tuple[int, int]]) -> SlidingUnion | None:
    """A `SlidingUnion` over `windows` (in query order) if consecutive ones mostly overlap, so
    walking one window along beats re-reading each."""
    if len(windows) < 64:
        return None
    w = np.array(windows, dtype=np.int64)
    first, last = w[:, 0], w[:, 1]
    fb, lb = _before(first, last), _before(last, last)
    moves = _moved(fb, lb, first[:-1], last[:-1], first[1:], last[1:])
    if np.count_nonzero(moves <= _NEAR) < _SLIDING_SHARE * (len(w) - 1):
        return None
    return SlidingUnion(windows)


def _before(positions: np.ndarray, lasts: np.ndarray) -> np.ndarray:
    """How many of `positions` lie before each position 0 .. max(lasts) + 2."""
    counts = np.bincount(positions, minlength=int(lasts.max()) + 2)
    return np.concatenate(([0], counts.cumsum()))


def _moved(fb, lb, a1, b1, a2, b2):  # ints and lists, or numpy arrays alike
    """Positions walked plus records whose lifetimes end or start in them: an upper bound on the
    records that enter or leave when window [a1, b1] moves to [a2, b2]."""
    return abs(a2 - a1) + abs(b2 - b1) + abs(lb[a2] - lb[a1]) + abs(fb[b2 + 1] - fb[b1 + 1])


class SlidingUnion:
    """Placed byte ranges per window; window k of the constructor is placed with `add(k, ...)`."""

    __slots__ = (
        "_by_first",
        "_by_last",
        "_cnt",
        "_first_before",
        "_gaps",
        "_last_before",
        "_n_placed",
        "_placed",
        "_pts",
        "_ranges",
        "_vec",
        "_window",
        "_windows",
    )

    def __init__(self, windows: Sequence[tuple[int, int]]) -> None:
        n = len(windows)
        self._windows = list(windows)
        firsts = np.array([w[0] for w in windows], dtype=np.int64).reshape(n)
        lasts = np.array([w[1] for w in windows], dtype=np.int64).reshape(n)
        # Windows that start / end before each position: bounds on the records a move touches.
        self._first_before = _before(firsts, lasts).tolist() if n else [0]
        self._last_before = _before(lasts, lasts).tolist() if n else [0]
        horizon = len(self._first_before) - 2
        self._by_first: list[list[int]] = [[] for _ in range(horizon)]  # placed, by first
        self._by_last: list[list[int]] = [[] for _ in range(horizon)]
        self._ranges: list[tuple[int, int]] = [(0, 0)] * n  # bytes of each placed window
        self._n_placed = 0
        # Columns for rebuilds (first, last, start, end per window) and which are placed. The
        # written ones are plain buffers, cheap to set one item at a time, that numpy views.
        self._vec = (firsts, lasts, array("q", bytes(8 * n)), array("q", bytes(8 * n)))
        self._placed = bytearray(n)
        self._window: tuple[int, int] | None = None
        self._pts, self._cnt = [0], [0]
        self._gaps: list[int] = []  # length << _LOW | offset of each empty piece below the top

    def best_fit(self, k: int, size: int) -> int:
        """Offset of the shortest gap of at least `size` bytes free over window k (lowest on
        ties), else the top of what is placed over it."""
        window = self._windows[k]
        if self._window is None or self._too_far(window):
            self._rebuild(window)
        else:
            self._move(window)
        j = bisect_left(self._gaps, size << _LOW)
        return self._gaps[j] & _OFFSET if j < len(self._gaps) else self._pts[-1]

    def add(self, k: int, start: int, end: int) -> None:
        """Mark bytes [start, end) occupied over window k."""
        first, last = self._windows[k]
        self._ranges[k] = (start, end)
        self._n_placed += 1
        self._placed[k] = 1
        self._vec[2][k], self._vec[3][k] = start, end
        self._by_first[first].append(k)
        self._by_last[last].append(k)
        a, b = self._window or (0, -1)
        if first <= b and last >= a:
            self._cover(start, end, 1)

    # -- moving the window --------------------------------------------------------------------
    def _too_far(self, window: tuple[int, int]) -> bool:
        assert self._window is not None
        (a1, b1), (a2, b2) = self._window, window
        moved = _moved(self._first_before, self._last_before, a1, b1, a2, b2)
        return moved * _MOVE_COST > self._n_placed + _REBUILD_FLOOR

    def _move(self, window: tuple[int, int]) -> None:
        """Remove the records that leave, add those that enter (a jump `_too_far` to walk
        rebuilds the window instead)."""
        assert self._window is not None
        (a1, b1), (a2, b2) = self._window, window
        windows, ranges, cover = self._windows, self._ranges, self._cover
        by_first, by_last = self._by_first, self._by_last
        for p in range(a1, a2):  # ended before the new window
            for k in by_last[p]:
                if windows[k][0] <= b1:
                    cover(*ranges[k], -1)
        if b2 < b1:
            for p in range(b2 + 1, b1 + 1):  # start after it
                for k in by_first[p]:
                    if windows[k][1] >= a1:
                        cover(*ranges[k], -1)
        if a2 < a1:
            for p in range(a2, a1):  # end in the new window's earlier part
                for k in by_last[p]:
                    if windows[k][0] <= b2:
                        cover(*ranges[k], 1)
        for p in range(b1 + 1, b2 + 1):  # start in its later part
            for k in by_first[p]:
                if windows[k][1] >= a2:
                    cover(*ranges[k], 1)
        self._window = window

    def _rebuild(self, window: tuple[int, int]) -> None:
        """The coverage of `window` from scratch: sort the placed records' ends, sum."""
        a, b = window
        self._window = window
        firsts, lasts = self._vec[0], self._vec[1]
        starts, ends = (np.frombuffer(c, dtype=np.int64) for c in self._vec[2:])
        placed = np.frombuffer(self._placed, dtype=bool)
        inside = placed & (firsts <= b) & (lasts >= a)
        if not inside.any():
            self._pts, self._cnt, self._gaps = [0], [0], []
            return
        x = np.concatenate((starts[inside], ends[inside]))
        step = np.repeat(np.array([1, -1], dtype=np.int64), len(x) // 2)
        order = np.argsort(x, kind="stable")
        x, cover = x[order], np.cumsum(step[order])
        last = np.append(x[1:] != x[:-1], True)  # the count after all events at one offset
        x, cover = x[last], cover[last]
        if x[0] != 0:
            x, cover = np.append(0, x), np.append(0, cover)
        keep = np.append(True, cover[1:] != cover[:-1])  # merge equal neighbours
        x, cover = x[keep], cover[keep]
        self._pts, self._cnt = x.tolist(), cover.tolist()
        empty = np.flatnonzero(cover[:-1] == 0)
        lengths, offsets = (x[empty + 1] - x[empty]).tolist(), x[empty].tolist()
        self._gaps = sorted(n << _LOW | o for n, o in zip(lengths, offsets, strict=True))

    # -- the coverage step function -----------------------------------------------------------
    def _cover(self, start: int, end: int, d: int) -> None:
        """Add `d` to the coverage of bytes [start, end), keeping the pieces canonical (no two
        neighbours with equal counts) and the gap index in step.

        The pieces holding `start` and `end` are cut there; the pieces between shift by `d`,
        so they still differ from each other, and a merge can only happen where a cut was not
        needed: at `start` with the piece below, at `end` with the piece above."""
        pts, cnt, gaps = self._pts, self._cnt, self._gaps
        n_old = len(pts)
        lo = bisect_right(pts, start) - 1
        if start == pts[lo] and (lo == n_old - 1 or end < pts[lo + 1]):
            # Most common by far: the bytes start a piece and end inside it (a record placed
            # at the bottom of a gap or on the top, or one leaving from under another).
            c = cnt[lo]
            new = c + d
            if not c and lo < n_old - 1:  # a gap shrinks from below
                above = pts[lo + 1]
                del gaps[bisect_left(gaps, (above - start) << _LOW | start)]
                insort(gaps, (above - end) << _LOW | end)
            if lo and cnt[lo - 1] == new:  # the piece below grows over [start, end)
                if not new:
                    below = pts[lo - 1]
                    del gaps[bisect_left(gaps, (start - below) << _LOW | below)]
                    insort(gaps, (end - below) << _LOW | below)
                pts[lo] = end
            else:
                if not new:
                    insort(gaps, (end - start) << _LOW | start)
                cnt[lo] = new
                pts.insert(lo + 1, end)
                cnt.insert(lo + 1, c)
            return
        if lo < n_old - 1 and start == pts[lo] and end == pts[lo + 1]:
            # Next: the bytes are exactly one piece (a record leaving, or entering, alone).
            c = cnt[lo]
            new = c + d
            below = lo > 0 and cnt[lo - 1] == new
            above = cnt[lo + 1] == new
            if not c:
                del gaps[bisect_left(gaps, (end - start) << _LOW | start)]
            if not new and below:
                under = pts[lo - 1]
                del gaps[bisect_left(gaps, (start - under) << _LOW | under)]
            if not new and above and lo + 1 < n_old - 1:
                del gaps[bisect_left(gaps, (pts[lo + 2] - end) << _LOW | end)]
            if below and above:
                del pts[lo : lo + 2], cnt[lo : lo + 2]
            elif below:
                del pts[lo], cnt[lo]
            elif above:
                del pts[lo + 1], cnt[lo + 1]
                cnt[lo] = new
            else:
                cnt[lo] = new
            q = lo - 1 if below else lo  # the piece now holding [start, end)
            if not new and q < len(pts) - 1:
                insort(gaps, (pts[q + 1] - pts[q]) << _LOW | pts[q])
            return
        hi = bisect_right(pts, end, lo) - 1
        first = lo - 1 if lo and start == pts[lo] else lo  # first piece that may change
        for p in range(first, min(hi, n_old - 2) + 1):  # the piece above the top is no gap
            if not cnt[p]:
                del gaps[bisect_left(gaps, (pts[p + 1] - pts[p]) << _LOW | pts[p])]
        last = hi - 1  # last piece whose count changes, before the cuts
        if end > pts[hi]:
            pts.insert(hi + 1, end)
            cnt.insert(hi + 1, cnt[hi])
            last = hi
        if start > pts[lo]:
            pts.insert(lo + 1, start)
            cnt.insert(lo + 1, cnt[lo])
            lo += 1
            last += 1
        for p in range(lo, last + 1):
            cnt[p] += d
        if last + 1 < len(pts) and cnt[last + 1] == cnt[last]:
            del pts[last + 1], cnt[last + 1]
        if lo and cnt[lo - 1] == cnt[lo]:
            del pts[lo], cnt[lo]
        n_new = len(pts)
        for p in range(first, min(hi + n_new - n_old, n_new - 2) + 1):
            if not cnt[p]:
                insort(gaps, (pts[p + 1] - pts[p]) << _LOW | pts[p])
