"""What weight sharing changes in a colocated plan (a benchmark, not a test; CPU only).

For each model x cluster x rollout TP, the same GRPO graph is planned twice (rollplex
schedule, TP pinned, budget not enforced):
- shared: weight_sync mode "alias" (a torch rollout reading the trainer's storage): the
  rollout copy costs the layout algebra's rebuild bytes per GPU (planner/shared_weights.py);
- two copies: the same graph with weight_sync mode "load" (an engine holding its own
  copy): the copy costs the whole TP shard, and the sync copies all of it.
Columns: the rollout copy charged per GPU (LLM + vision, the largest GPU), the planned
peak per GPU, and the weight_sync step's predicted time. Prints a markdown table last.

    OMP_NUM_THREADS=1 python bench/planner_share.py --out bench/results/planner_share.md
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

from rollplex.algos import build_step
from rollplex.jobs.pipeline import PlanResult, plan_step
from rollplex.specs import (
    HARDWARE_PRESETS,
    MODEL_PRESETS,
    WORKLOAD_PRESETS,
    AlgoSpec,
    ScheduleSpec,
)

GIB = 1 << 30
CASES = [
    ("qwen2_5_vl_7b", "h200x8", 8, (1, 2, 4)),
    ("qwen2_5_vl_32b", "h200x8", 8, (2, 4, 8)),
    ("qwen2_5_vl_32b", "h800x32", 32, (4, 8)),
    ("qwen2_5_vl_72b", "h800x32", 32, (8,)),
]


def plan(model: str, hardware: str, gpus: int, tp: int, mode: str) -> PlanResult:
    spec, work = MODEL_PRESETS[model], WORKLOAD_PRESETS["video"]
    graph = build_step(spec, work, AlgoSpec())
    for op in graph:
        if op.kind == "weight_sync":
            op.attrs["mode"] = mode
    hw = HARDWARE_PRESETS[hardware].model_copy(update={"num_gpus": gpus})
    sched = ScheduleSpec(name="rollplex", parallel={"rollout_tp": tp})
    return plan_step(spec, work, AlgoSpec(), hw, sched, graph=graph, enforce_budget=False)


def row(r: PlanResult) -> tuple[float, float, float]:
    (dev,) = r.plan.devices
    copy = {s.value: s.size for s in dev.slots if s.value_kind == "rollout_weights"}
    charged = copy.get("policy.weights@rollout", 0) + copy.get("vision.weights@rollout", 0)
    sync = next(s.solo_s for s in dev.steps if s.kind == "weight_sync")
    return charged / GIB, dev.peak_bytes / GIB, sync * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    t0 = time.process_time()
    lines = [
        "| model | GPUs | rollout TP | copy GiB/GPU shared / two copies | peak GiB/GPU shared / "
        "two copies | weight_sync ms shared / two copies |",
        "|---|---|---|---|---|---|",
    ]
    for model, hardware, gpus, tps in CASES:
        for tp in tps:
            a = row(plan(model, hardware, gpus, tp, "alias"))
            b = row(plan(model, hardware, gpus, tp, "load"))
            lines.append(
                f"| {model.removeprefix('qwen2_5_vl_')} | {gpus} x {hardware} | {tp} "
                f"| {a[0]:.2f} / {b[0]:.2f} | {a[1]:.2f} / {b[1]:.2f} | {a[2]:.2f} / {b[2]:.2f} |"
            )
            print(lines[-1], flush=True)
    text = "\n".join(lines)
    footer = f"CPU time: {time.process_time() - t0:.0f} s."
    print("\n" + text + "\n\n" + footer)
    if args.out:
        args.out.write_text(
            "# Weight sharing in the colocated plan\n\nCommand, from the repository root:\n\n"
            "```\nOMP_NUM_THREADS=1 python bench/planner_share.py --out "
            "bench/results/planner_share.md\n```\n\n"
            + (__doc__ or "").split("\n\n    OMP")[0]
            + "\n\n"
            + text
            + "\n\n"
            + footer
            + "\n"
        )


if __name__ == "__main__":
    main()
