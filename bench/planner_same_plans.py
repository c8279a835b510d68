"""Plans before and after a planner speed-up must be identical: dump, then check.

Plans a fixed set of configurations (every schedule and overlap mode, several models,
workloads, budgets, and the K-copy graphs of bench/planner_scale.py up to 10,010 ops) and
writes one SHA-256 per plan of its canonical JSON: every step, time, event, slot, offset,
effect and note.

    OMP_NUM_THREADS=1 python bench/planner_same_plans.py --write /tmp/before.json
    ... change the planner ...
    OMP_NUM_THREADS=1 python bench/planner_same_plans.py --check /tmp/before.json
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import sys
from enum import Enum
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from planner_scale import replicated

from rollplex.jobs.pipeline import plan_step
from rollplex.planner.plan import Plan
from rollplex.planner.residency import PlanOverBudget
from rollplex.specs import (
    HARDWARE_PRESETS,
    MODEL_PRESETS,
    WORKLOAD_PRESETS,
    AlgoSpec,
    ScheduleSpec,
)


def canonical(plan: Plan) -> str:
    def conv(x):
        if isinstance(x, Enum):
            return x.value
        if isinstance(x, dict):
            return {str(k): conv(v) for k, v in x.items()}
        if isinstance(x, list | tuple):
            return [conv(v) for v in x]
        if isinstance(x, float):
            return repr(x)
        return x

    return json.dumps(conv(dataclasses.asdict(plan)), sort_keys=True)


def configs():
    for model in ("tiny", "qwen2_5_vl_3b", "qwen2_5_vl_7b", "qwen2_5_vl_32b"):
        for workload in ("image", "video"):
            hw = "cpu" if model == "tiny" else ("h800x32" if model.endswith("32b") else "h200x8")
            for name, dedup, overlap in (
                ("serial", False, "auto"),
                ("serial", True, "auto"),
                ("disaggregated", True, "auto"),
                ("rollplex", True, "auto"),
                ("rollplex", True, "streams"),
                ("rollplex", True, "sm_partition"),
                ("rollplex", True, "piggyback"),
            ):
                if name == "disaggregated" and hw == "cpu":
                    continue
                yield (model, workload, hw, None, name, dedup, overlap, None)
    for hbm in (22.0, 29.5):
        for name in ("serial", "rollplex"):
            yield ("qwen2_5_vl_32b", "video", "h800x32", hbm, name, True, "auto", None)
    for gpus in (128, 1024):
        yield ("qwen2_5_vl_32b", "video", "h800x32", None, "rollplex", True, "auto", gpus)
    for k in (1, 10, 100, 770):
        for name in ("serial", "rollplex"):
            yield ("replicated", k, "h200x8", 1e6, name, True, "auto", None)


def plan_of(cfg) -> str:
    model, workload, hw_name, hbm, name, dedup, overlap, gpus = cfg
    update = {}
    if hbm is not None:
        update["hbm_gib"] = hbm
    if gpus is not None:
        update["num_gpus"] = gpus
    hw = HARDWARE_PRESETS[hw_name].model_copy(update=update)
    try:
        if model == "replicated":
            sched = ScheduleSpec(name=name, parallel={"rollout_tp": 1})
            r = plan_step(
                MODEL_PRESETS["qwen2_5_vl_7b"],
                WORKLOAD_PRESETS["video"],
                AlgoSpec(),
                hw,
                sched,
                graph=replicated(workload),
                passes=(),
            )
        else:
            sched = ScheduleSpec(name=name, dedup=dedup, overlap=overlap)
            r = plan_step(MODEL_PRESETS[model], WORKLOAD_PRESETS[workload], AlgoSpec(), hw, sched)
    except PlanOverBudget as err:
        return "over budget: " + str(err)
    return hashlib.sha256(canonical(r.plan).encode()).hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    group = ap.add_mutually_exclusive_group(required=True)
    group.add_argument("--write", type=Path)
    group.add_argument("--check", type=Path)
    args = ap.parse_args()
    got = {json.dumps(cfg): plan_of(cfg) for cfg in configs()}
    if args.write:
        args.write.write_text(json.dumps(got, indent=1))
        print(f"{len(got)} plans written to {args.write}")
        return
    want = json.loads(args.check.read_text())
    differ = [k for k in want if got.get(k) != want[k]]
    for k in differ:
        print("DIFFERENT:", k)
    print(f"{len(want) - len(differ)} of {len(want)} plans identical")
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
