"""Planned step time with an offloaded AdamW state written back at the step's end (verl's
order, `schedule.write_back=step_end`) or at the next step's start (`auto`), on CPU.

Plans only: nothing runs on a GPU, so these are the planner's predictions, not
measurements. Two tables:
- the grid of `tests/planner/test_residency.py` (3B and 7B, image and video, 8 and 32
  prompts, serial and rollplex) on one H200 at 0.9-0.6 of each roomy plan's peak;
- stop 54's H100 memory run (3B, 24 video prompts x G=8, 512-token cap, its config in
  `bench/results/gpu_profile/memory_peak_runs_h100_late_onload/`) at the default reserve and
  at `hardware.hbm_reserve=0.15` (run B).

    python bench/write_back_plans.py > bench/results/write_back_plans.md
"""

from __future__ import annotations

import json
from pathlib import Path

from rollplex.jobs.pipeline import plan_step
from rollplex.jobs.plan import plan_for
from rollplex.planner.residency import PlanOverBudget
from rollplex.specs import (
    HARDWARE_PRESETS,
    MODEL_PRESETS,
    WORKLOAD_PRESETS,
    AlgoSpec,
    ScheduleSpec,
)
from rollplex.specs.run import RunSpec

GIB = 1 << 30
RUN_B = Path(
    "bench/results/gpu_profile/memory_peak_runs_h100_late_onload/runs/qwen2_5_vl_3b_rollplex"
)


def _plan(model: str, workload, name: str, gib: float, write_back: str = "auto"):
    hw = HARDWARE_PRESETS["h200"].model_copy(update={"hbm_gib": gib, "hbm_reserve": 0})
    spec = ScheduleSpec(name=name, write_back=write_back)
    try:
        return plan_step(MODEL_PRESETS[model], workload, AlgoSpec(), hw, spec).plan
    except PlanOverBudget:
        return None


def grid_rows() -> list[str]:
    rows = []
    for model in ("qwen2_5_vl_3b", "qwen2_5_vl_7b"):
        for workload in ("image", "video"):
            for prompts in (8, 32):
                wl = WORKLOAD_PRESETS[workload].model_copy(update={"prompts_per_step": prompts})
                for name in ("serial", "rollplex"):
                    roomy = _plan(model, wl, name, 2000.0).peak_bytes_per_gpu / GIB
                    for share in (0.9, 0.8, 0.7, 0.6):
                        auto = _plan(model, wl, name, share * roomy)
                        end = _plan(model, wl, name, share * roomy, "step_end")
                        head = f"| {model} | {workload} | {prompts} | {name} | {share} |"
                        if end is None or auto is None:
                            rows.append(f"{head} does not fit | does not fit | - |")
                            continue
                        a, e = auto.step_time_s, end.step_time_s
                        rows.append(f"{head} {e:.3f} | {a:.3f} | {e / a:.3f}x |")
    return rows


def run_b_rows() -> list[str]:
    cfg = json.loads((RUN_B / "config.json").read_text())
    cfg["model"]["path"] = None
    rows = []
    for reserve in (None, 0.15):
        times = {}
        for write_back in ("step_end", "auto"):
            c = json.loads(json.dumps(cfg))
            c["schedule"]["write_back"] = write_back
            if reserve is None:
                c["hardware"].pop("hbm_reserve")
            else:
                c["hardware"]["hbm_reserve"] = reserve
            plan = plan_for(RunSpec.model_validate(c)).plan
            times[write_back] = plan.step_time_s
            peak, budget = plan.devices[0].peak_bytes / GIB, plan.devices[0].budget_bytes / GIB
        e, a = times["step_end"], times["auto"]
        label = "default (0.05)" if reserve is None else str(reserve)
        rows.append(f"| {label} | {budget:.2f} | {peak:.2f} | {e:.3f} | {a:.3f} | {e / a:.3f}x |")
    return rows


def main() -> None:
    print("# AdamW's write-back at the step's end or the next step's start: planned step times\n")
    print("`python bench/write_back_plans.py` (plans on CPU, uncalibrated; not measured).\n")
    print("## One H200, budgets under each roomy plan's peak\n")
    print("| model | workload | prompts | schedule | budget / roomy peak | step_end s | auto s "
          "| step_end / auto |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(grid_rows()))
    print("\n## Stop 54's H100 memory run (3B, 24 video prompts x G=8, 512-token cap)\n")
    print("| hbm_reserve | budget GiB | auto's peak GiB | step_end s | auto s | step_end / auto |")
    print("|---|---|---|---|---|---|")
    print("\n".join(run_b_rows()))
    print(
        "\nWhere the two are equal, no trained value waits on host with copy time to pay, or "
        "its write-back at the start misses the budget even with the op at the peak waiting "
        "for it. At hbm_reserve=0.15 decode once's kept outputs (13.5 GiB) are held all "
        "step, so AdamW's state and the prefill's export miss the budget together: the "
        "prefill waits for the copy, and the step saves what the copy ran beside the vision "
        "encode. On a GPU: `SHAPE=qwen2_5_vl_3b bash bench/memory_peak.sh --schedule "
        "rollplex --hardware h100 --frames 8 --prompts 24 --mean-length 128 --max-length 512 "
        "--steps 3 hardware.hbm_reserve=0.15`."
    )


if __name__ == "__main__":
    main()
