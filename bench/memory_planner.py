"""Benchmark the memory strategies: planned bytes over the lower bound, and planning time.

For each table family, table size and strategy: the ratio of planned bytes to the sum of the
per-lane lower bounds (worst and median over the seeds), and the wall and CPU time of planning
seed 0 (medians of the repeats, after one warm-up run). Every plan is checked with
`find_overlap`. One Python thread on the CPU. Prints a markdown table last.

    python bench/memory_planner.py --sizes 1000 10000 20000 --seeds 3 --repeats 5
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial

from rollplex.planner.memory import (
    STRATEGIES,
    MemoryAssignment,
    UsageRecord,
    find_overlap,
    greedy_by_size,
    lane_lower_bounds,
)
from rollplex.planner.memory.tables import step_records, uniform_records

Run = Callable[[Sequence[UsageRecord]], MemoryAssignment]
FAMILIES: dict[str, Callable[..., list[UsageRecord]]] = {
    "step": step_records,
    "uniform": uniform_records,
}


def variants() -> dict[str, Run]:
    """Registered strategies, plus greedy_by_size without its repair step for comparison."""
    return {**STRATEGIES, "greedy_by_size:plain": partial(greedy_by_size.assign, repair=False)}


def timed(
    run: Run, records: list[UsageRecord], repeats: int
) -> tuple[MemoryAssignment, float, float]:
    """The plan, and the median wall and CPU seconds of `repeats` runs after a warm-up run."""
    plan = run(records)
    wall, cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        run(records)
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return plan, statistics.median(wall), statistics.median(cpu)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 20000])
    parser.add_argument(
        "--families", nargs="+", choices=sorted(FAMILIES), default=["step", "uniform"]
    )
    parser.add_argument("--seeds", type=int, default=3, help="tables per size for the ratio")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs on seed 0")
    parser.add_argument("--lanes", type=int, default=1)
    args = parser.parse_args(argv)
    if args.seeds < 1 or args.repeats < 1:
        parser.error("--seeds and --repeats must be at least 1")

    print(f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} cpus")
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    rows = []
    for family in args.families:
        for n in args.sizes:
            tables = [FAMILIES[family](n, seed, lanes=args.lanes) for seed in range(args.seeds)]
            bounds = [sum(lane_lower_bounds(t).values()) for t in tables]
            for name, run in variants().items():
                first, wall, cpu = timed(run, tables[0], args.repeats)
                plans = [first, *(run(t) for t in tables[1:])]
                ratios = []
                for seed, (records, plan) in enumerate(zip(tables, plans, strict=True)):
                    if find_overlap(records, plan) is not None:
                        sys.exit(f"{name} produced overlapping slots on {family} n={n} seed={seed}")
                    ratios.append(plan.total_bytes / bounds[seed])
                rows.append(
                    f"| {family} | {n} | {name} | {max(ratios):.4f} "
                    f"| {statistics.median(ratios):.4f} | {wall * 1e3:.1f} | {cpu * 1e3:.1f} |"
                )
                print(rows[-1], file=sys.stderr, flush=True)  # progress
    print(f"load average at end: {os.getloadavg()[0]:.2f}\n")
    print(
        f"planned/bound: planned bytes over the sum of per-lane lower bounds, worst and median "
        f"of {args.seeds} seeded tables ({args.lanes} lane(s)). wall ms / cpu ms: one plan on "
        f"seed 0, median of {args.repeats} runs after a warm-up (cpu: this process only, so "
        "less sensitive to other load on a shared machine). step: step-shaped tables; "
        "uniform: long lifetimes crossing at random (adversarial). "
        "greedy_by_size:plain is greedy_by_size without peak repair.\n"
    )
    print(
        "| tables | records | strategy | planned/bound worst | planned/bound median "
        "| wall ms | cpu ms |"
    )
    print("|---|---:|---|---:|---:|---:|---:|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
