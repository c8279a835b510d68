"""Record tables shared by the memory tests: hand-built ones and seeded random ones."""

from __future__ import annotations

from rollplex.planner.memory import UsageRecord
from rollplex.planner.memory.tables import step_records, uniform_records

R = UsageRecord

# Lane 0 (hand-computed peak 800 at position 5: B + D + F), lane 1 (384 at 3-4: G + H or G + I;
# H and I are adjacent, not overlapping), lane 5 (100: K and L share a lifetime). Zero-size
# records in every lane. All lanes together peak at position 3: 700 + 384 + 100 = 1184.
COMPLEX = [
    R(400, 0, 3, 0, "A"),
    R(300, 2, 5, 0, "B"),
    R(0, 1, 4, 0, "C"),
    R(200, 4, 7, 0, "D"),
    R(100, 6, 6, 0, "E"),
    R(300, 5, 5, 0, "F"),
    R(256, 0, 9, 1, "G"),
    R(128, 3, 3, 1, "H"),
    R(128, 4, 4, 1, "I"),
    R(0, 0, 0, 1, "J"),
    R(50, 2, 8, 5, "K"),
    R(50, 2, 8, 5, "L"),
    R(0, 3, 3, 5, "M"),
]
COMPLEX_LANE_BOUNDS = {0: 800, 1: 384, 5: 100}
COMPLEX_BOUND = 1184


def chain(n: int) -> list[UsageRecord]:
    """Record i lives over [i, i + 1]: it overlaps only its neighbours."""
    return [R((i * 37 % 11 + 1) * 64, i, i + 1, 0, f"c{i}") for i in range(n)]


HAND = {
    "empty": [],
    "one": [R(4096, 3, 7, 0, "x")],
    "only-empty-records": [R(0, 0, 5, 2, "z0"), R(0, 1, 1, 2, "z1")],
    "chain": chain(40),
    "complex": COMPLEX,
}
STEP_SEEDS = (0, 1, 2, 3)
STEP = {
    f"step-s{seed}-l{lanes}": step_records(1200, seed, lanes=lanes)
    for seed in STEP_SEEDS
    for lanes in (1, 3)
}
# Adversarial lifetimes (long ones crossing at random): for validity only, not for the ratio.
UNIFORM = {
    f"uniform-s{seed}": uniform_records(1000, seed, lanes=2, long_fraction=0.02) for seed in (0, 1)
}
ALL = {**HAND, **STEP, **UNIFORM}
