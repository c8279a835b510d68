"""Synthetic record tables for the golden tests and the benchmark: seeded, name-free.

`step_records` is shaped like one RL step (micro-batch passes, nested forward/backward
lifetimes, a few phase-long tensors); `uniform_records` is the adversarial family (long
lifetimes crossing at random) that shows where greedy planning degrades.
"""

from __future__ import annotations

import random

from rollplex.planner.memory.records import UsageRecord

_KIB = 1024
_WIDTHS = (1, 2, 4, 8, 16, 32)


def step_records(n: int, seed: int, *, lanes: int = 1) -> list[UsageRecord]:
    """`n` records of step-shaped passes spread over `lanes` lanes, seeded by `seed`."""
    if n < 0 or lanes < 1:
        raise ValueError(f"need n >= 0 and lanes >= 1, got n={n}, lanes={lanes}")
    rng = random.Random(seed)
    out: list[UsageRecord] = []
    clock = [0] * lanes  # next position of each lane
    phase_long: list[list[int]] = []  # [lane, first, passes left, size]

    def emit(tokens: int, first: int, last: int, lane: int) -> None:
        out.append(UsageRecord(tokens * rng.choice(_WIDTHS) * _KIB, first, last, lane))

    while len(out) < n:
        lane = rng.randrange(lanes)
        pos = clock[lane]
        tokens = int(10 ** rng.uniform(0.0, 1.5))
        if rng.random() < 0.15:
            phase_long.append([lane, pos, rng.randint(1, 4), tokens])
        decode = rng.random() < 0.3
        saved: list[int] = []
        for _ in range(rng.randint(4, 24)):
            for _ in range(rng.randint(1, 3)):
                emit(tokens, pos, pos + min(int(rng.expovariate(1 / 2.5)), 8), lane)
            if not decode:
                saved.append(pos)
            pos += 1
        for first in reversed(saved):  # backward frees saved activations in reverse order
            emit(tokens, first, pos, lane)
            for _ in range(rng.randint(1, 2)):
                emit(tokens, pos, pos + min(int(rng.expovariate(1 / 1.5)), 4), lane)
            pos += 1
        clock[lane] = pos
        for entry in phase_long:
            if entry[0] == lane:
                entry[2] -= 1
                if entry[2] == 0:
                    emit(entry[3], entry[1], pos, lane)
        phase_long = [e for e in phase_long if e[2] > 0]
    return [UsageRecord(r.size, r.first, r.last, r.lane, f"t{i}") for i, r in enumerate(out[:n])]


def uniform_records(
    n: int, seed: int, *, lanes: int = 1, long_fraction: float = 0.01
) -> list[UsageRecord]:
    """`n` records over about `n` positions: short lifetimes plus some long, crossing ones."""
    if n < 0 or lanes < 1 or not 0.0 <= long_fraction <= 1.0:
        raise ValueError(f"need n >= 0, lanes >= 1, 0 <= long_fraction <= 1; got {n}, {lanes}")
    rng = random.Random(seed)
    horizon = max(n, 2)
    out = []
    for i in range(n):
        size = int(10 ** rng.uniform(3.0, 6.0))
        if rng.random() < long_fraction:
            span = rng.randint(horizon // 10, horizon // 2)
        else:
            span = min(int(rng.expovariate(1 / 6)), horizon - 1)
        first = rng.randrange(horizon - span)
        out.append(UsageRecord(size, first, first + span, rng.randrange(lanes), f"t{i}"))
    return out
