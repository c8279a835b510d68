"""Planned step time where AdamW's state waits on host: moved whole or only the share the
budget needs (`offloads.partial_share`), and written back at the step's end (verl's
order, `schedule.write_back=step_end`) or at the next step's start (`auto`), on CPU.

"whole" is `schedule.offload_in_part=false`. "whole, step_end" is the plan of 6ac7f0a,
before both changes (verl's baseline keeps it); "part, auto" today's default.

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
from collections.abc import Callable
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
VARIANTS = [(moves, wb) for moves in ("whole", "part") for wb in ("step_end", "auto")]


def _times(plan: Callable[[str, bool], object]) -> list[float | None]:
    out = []
    for moves, write_back in VARIANTS:
        p = plan(write_back, moves == "part")
        out.append(None if p is None else p.step_time_s)
    return out


def _row(head: str, times: list[float | None]) -> str:
    if any(t is None for t in times):
        return f"{head} does not fit | | | | - |"
    cells = " | ".join(f"{t:.3f}" for t in times)
    return f"{head} {cells} | {times[0] / times[-1]:.3f}x |"


def _plan(model: str, workload, name: str, gib: float, write_back: str = "auto", part: bool = True):
    hw = HARDWARE_PRESETS["h200"].model_copy(update={"hbm_gib": gib, "hbm_reserve": 0})
    spec = ScheduleSpec(name=name, write_back=write_back, offload_in_part=part)
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
                        gib = share * roomy
                        times = _times(lambda wb, part: _plan(model, wl, name, gib, wb, part))  # noqa: B023
                        rows.append(
                            _row(f"| {model} | {workload} | {prompts} | {name} | {share} |", times)
                        )
    return rows


def run_b_rows() -> list[str]:
    cfg = json.loads((RUN_B / "config.json").read_text())
    cfg["model"]["path"] = None
    rows = []
    for reserve in (None, 0.15):

        def plan(write_back: str, part: bool, reserve: float | None = reserve):
            c = json.loads(json.dumps(cfg))
            c["schedule"].update(write_back=write_back, offload_in_part=part)
            if reserve is None:
                c["hardware"].pop("hbm_reserve")
            else:
                c["hardware"]["hbm_reserve"] = reserve
            return plan_for(RunSpec.model_validate(c)).plan

        label = "default (0.05)" if reserve is None else str(reserve)
        rows.append(_row(f"| {label} |", _times(plan)))
    return rows


HEAD = (
    "whole, step_end s | whole, auto s | part, step_end s | part, auto s "
    "| whole, step_end / part, auto |"
)


def main() -> None:
    print("# AdamW's state on host: moved whole or in part, written back at the end or the start\n")
    print("`python bench/write_back_plans.py` (plans on CPU, uncalibrated; not measured).\n")
    print("## One H200, budgets under each roomy plan's peak\n")
    print(f"| model | workload | prompts | schedule | budget / roomy peak | {HEAD}")
    print("|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(grid_rows()))
    print("\n## Stop 54's H100 memory run (3B, 24 video prompts x G=8, 512-token cap)\n")
    print(f"| hbm_reserve | {HEAD}")
    print("|---|---|---|---|---|---|")
    print("\n".join(run_b_rows()))
    print(
        "\n`whole, step_end` is the planner of 6ac7f0a; `part, auto` today's. Where they are "
        "equal, nothing with copy time to pay waits on host. On a GPU: `SHAPE=qwen2_5_vl_3b "
        "bash bench/gpu_step.sh --hardware h100 --frames 8 --prompts 24 --mean-length 128 "
        "--max-length 512 --schedules rollplex_end_write_back,rollplex --steps 5 "
        "--warmup-steps 0 --paired-from 3 --budget-s 450 hardware.hbm_reserve=0.15` (the "
        "ablation schedule writes back at the end and moves in part)."
    )


if __name__ == "__main__":
    main()
