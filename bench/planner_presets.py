"""CPU time to plan every preset combination (the planner-promise grid's plans), for two
source trees side by side in alternating order (A B A B), each in a child process on one
thread: a benchmark of planning speed, not a test. `--budgets` also plans each at 0.8 and
0.97 of its roomy serial peak (the planner-promise grid's budgets), where the offload
trials of planner/residency.py run. Prints a markdown table last.

    python bench/planner_presets.py --tree /path/to/before --tree . --rounds 3 [--budgets]

Check first that both trees make the same plans (bench/planner_same_plans.py).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = """
import json, time
from rollplex.jobs.pipeline import plan_step
from rollplex.planner.residency import PlanOverBudget
from rollplex.specs import HARDWARE_PRESETS, MODEL_PRESETS, WORKLOAD_PRESETS, AlgoSpec, ScheduleSpec
def plan(model, workload, hardware, name):
    try:
        return plan_step(model, workload, AlgoSpec(), hardware, ScheduleSpec(name=name))
    except (PlanOverBudget, ValueError):
        return None
start, n = time.process_time(), 0
for model in MODEL_PRESETS.values():
    for workload in WORKLOAD_PRESETS.values():
        for hardware in HARDWARE_PRESETS.values():
            for name in ("serial", "disaggregated", "rollplex"):
                if name != "disaggregated" or hardware.num_gpus > 1:
                    n += plan(model, workload, hardware, name) is not None
            if BUDGETS:  # below the roomy serial peak: offload trials run
                roomy = hardware.model_copy(update={"hbm_gib": 1e6})
                r = plan(model, workload, roomy, "serial")
                peak = max(d.peak_bytes for d in r.plan.devices) / 2**30
                for f in (0.8, 0.97):
                    gib = round(peak * f, 2)
                    tight = hardware.model_copy(update={"hbm_gib": gib, "hbm_reserve": 0.0})
                    for s in ("serial", "rollplex"):
                        n += plan(model, workload, tight, s) is not None
print(json.dumps({"cpu_s": time.process_time() - start, "plans": n}))
"""


def time_tree(tree: Path, budgets: bool) -> dict:
    env = os.environ | {"PYTHONPATH": str(tree.resolve()), "OMP_NUM_THREADS": "1"}
    code = f"BUDGETS = {budgets}\n" + CHILD
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", type=Path, action="append", required=True, help="twice: A, B")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--budgets", action="store_true", help="also each at 0.8 and 0.97 of its serial peak"
    )
    args = ap.parse_args()
    if len(args.tree) != 2:
        ap.error("give --tree twice (A, then B)")
    times: list[list[float]] = [[], []]
    plans = set()
    for r in range(args.rounds):
        for k, tree in enumerate(args.tree):
            got = time_tree(tree, args.budgets)
            times[k].append(got["cpu_s"])
            plans.add(got["plans"])
            print(f"round {r}: {tree}: {got['cpu_s']:.2f} s CPU, {got['plans']} plans", flush=True)
    if len(plans) != 1:
        raise SystemExit(f"the trees planned different numbers of presets: {sorted(plans)}")
    ratios = [a / b for a, b in zip(*times, strict=True)]
    half = (max(ratios) - min(ratios)) / 2
    print("\n| tree | CPU s per round | median |\n|---|---|---:|")
    for tree, ts in zip(args.tree, times, strict=True):
        print(f"| {tree} | {', '.join(f'{t:.2f}' for t in ts)} | {statistics.median(ts):.2f} |")
    mid = statistics.median(ratios)
    print(f"\nA / B: {mid:.3f}x (half-spread {half:.3f}) over {len(ratios)} rounds")


if __name__ == "__main__":
    main()
