"""Block arithmetic: where one sequence of blocks sits inside another, and which bytes
two block sequences have in common. Everything is in elements; callers scale to bytes.

A block sequence is a tensor stored contiguously: its blocks one after the other, each
row-major (see layouts.Block).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from rollplex.weights.layouts import Block


@dataclass(slots=True, frozen=True)
class Run:
    """`n` contiguous elements at offset `dst` of one tensor equal `n` contiguous
    elements at offset `src` of another (here: the rollout tensor and a local shard)."""

    dst: int
    src: int
    n: int


def offsets(blocks: Sequence[Block]) -> list[int]:
    """Element offset of each block in the contiguous tensor."""
    out, base = [], 0
    for b in blocks:
        out.append(base)
        base += b.numel
    return out


def numel(blocks: Sequence[Block]) -> int:
    return sum(b.numel for b in blocks)


def locate(outer: Sequence[Block], inner: Sequence[Block]) -> int | None:
    """Element offset at which `inner`'s elements appear, in order and contiguously, in
    `outer`; None if they don't. Both are normalized (no mergeable neighbours), so a
    contiguous run crosses from one outer block to the next only at block edges."""
    if not inner:
        return None
    base = offsets(outer)
    first = inner[0]
    for k, o in enumerate(outer):
        if o.param != first.param or not (o.r0 <= first.r0 < o.r1):
            continue
        if len(inner) == 1 and first.r1 - first.r0 == 1 and o.c0 <= first.c0 <= first.c1 <= o.c1:
            return base[k] + (first.r0 - o.r0) * o.width + first.c0 - o.c0  # one partial row
        if (o.c0, o.c1) != (first.c0, first.c1) or first.r1 > o.r1:
            continue
        start = base[k] + (first.r0 - o.r0) * o.width
        if _continues(outer, k, inner):
            return start
    return None


def _continues(outer: Sequence[Block], k: int, inner: Sequence[Block]) -> bool:
    """inner[0] sits in outer[k]; do the rest follow block by block?"""
    if len(inner) == 1:
        return True
    if inner[0].r1 != outer[k].r1:  # must run to the end of its outer block
        return False
    for m, b in enumerate(inner[1:], start=1):
        if k + m >= len(outer):
            return False
        o = outer[k + m]
        last = m == len(inner) - 1
        if (o.param, o.c0, o.c1, o.r0) != (b.param, b.c0, b.c1, b.r0):
            return False
        if b.r1 > o.r1 or (not last and b.r1 != o.r1):
            return False
    return True


def strided_view(chunk: Sequence[Block], x: Sequence[Block]) -> tuple[int, int] | None:
    """(storage offset, row stride) if the single block `x` is a 2-D sub-block of the
    single block `chunk` (a strided view of it); None otherwise."""
    if len(chunk) != 1 or len(x) != 1:
        return None
    c, b = chunk[0], x[0]
    inside = c.r0 <= b.r0 and b.r1 <= c.r1 and c.c0 <= b.c0 and b.c1 <= c.c1
    if c.param != b.param or not inside:
        return None
    return (b.r0 - c.r0) * c.width + b.c0 - c.c0, c.width


def overlap(x: Sequence[Block], chunk: Sequence[Block]) -> int:
    """Elements of `x` that `chunk` holds."""
    total = 0
    for b in x:
        for c in chunk:
            if b.param is None or b.param != c.param:
                continue
            rows = min(b.r1, c.r1) - max(b.r0, c.r0)
            cols = min(b.c1, c.c1) - max(b.c0, c.c0)
            if rows > 0 and cols > 0:
                total += rows * cols
    return total


def runs(x: Sequence[Block], chunk: Sequence[Block]) -> Iterator[Run]:
    """Every element of `x` that `chunk` holds, as maximal runs (dst in x, src in chunk)."""
    xo, co = offsets(x), offsets(chunk)
    pending: Run | None = None
    for bx, b in zip(xo, x, strict=True):
        for bc, c in zip(co, chunk, strict=True):
            if b.param is None or b.param != c.param:
                continue
            r0, r1 = max(b.r0, c.r0), min(b.r1, c.r1)
            c0, c1 = max(b.c0, c.c0), min(b.c1, c.c1)
            if r0 >= r1 or c0 >= c1:
                continue
            whole_rows = (b.c0, b.c1) == (c0, c1) == (c.c0, c.c1)
            rows = [(r0, r1)] if whole_rows else [(r, r + 1) for r in range(r0, r1)]
            for r, e in rows:
                run = Run(
                    bx + (r - b.r0) * b.width + c0 - b.c0,
                    bc + (r - c.r0) * c.width + c0 - c.c0,
                    (e - r) * (c1 - c0),
                )
                if (
                    pending
                    and pending.dst + pending.n == run.dst
                    and (pending.src + pending.n == run.src)
                ):
                    pending = Run(pending.dst, pending.src, pending.n + run.n)
                else:
                    if pending:
                        yield pending
                    pending = run
    if pending:
        yield pending
