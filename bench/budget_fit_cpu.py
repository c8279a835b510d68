"""The smallest HBM budget each one-GPU step fits, as a fraction of its roomy peak (a
planning benchmark: no timing, the same on any machine).

For 3B and 7B Qwen2.5-VL GRPO with the torch rollout and trainer, image and video, 8 to 32
prompts, serial and rollplex: the step is planned at budgets from 1.00 down to 0.40 of its
unconstrained peak, and the table gives the lowest fraction that fits and that plan's step
time over the roomy one. Run it on two trees to compare residency rules:

    python bench/budget_fit_cpu.py --md bench/results/budget_fit_cpu.md
"""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

from rollplex.jobs.pipeline import plan_step
from rollplex.planner.residency import PlanOverBudget
from rollplex.specs import HARDWARE_PRESETS, MODEL_PRESETS, WORKLOAD_PRESETS, AlgoSpec, ScheduleSpec
from rollplex.specs.roles import TORCH_ROLLOUT, TORCH_SCORER

GIB = 1 << 30
FRACTIONS = [round(1.0 - 0.05 * i, 2) for i in range(13)]  # 1.00 ... 0.40
SHAPES = [
    (model, hardware, workload, prompts)
    for model, hardware in (("qwen2_5_vl_3b", "h100"), ("qwen2_5_vl_7b", "h200"))
    for workload in ("image", "video")
    for prompts in (8, 16, 32)
]


def plan(model: str, hardware: str, workload: str, prompts: int, hbm_gib: float, name: str):
    hw = HARDWARE_PRESETS[hardware].model_copy(update={"hbm_gib": hbm_gib, "hbm_reserve": 0.0})
    wl = WORKLOAD_PRESETS[workload].model_copy(update={"prompts_per_step": prompts})
    caps = {"rollout": TORCH_ROLLOUT, "trainer": TORCH_SCORER}
    try:
        return plan_step(MODEL_PRESETS[model], wl, AlgoSpec(), hw, ScheduleSpec(name=name), **caps)
    except PlanOverBudget:
        return None


def row(shape: tuple[str, str, str, int], name: str) -> str:
    roomy = plan(*shape, 1e6, name)
    assert roomy is not None
    peak = roomy.plan.peak_bytes_per_gpu / GIB
    fits = [(f, r) for f in FRACTIONS if (r := plan(*shape, round(peak * f, 2), name)) is not None]
    low, r = min(fits, key=lambda x: x[0])
    slower = r.plan.step_time_s / roomy.plan.step_time_s
    missing = [f for f in FRACTIONS if f >= low and f not in dict(fits)]
    gaps = ", ".join(f"{f:.2f}" for f in missing) or "-"
    model, hardware, workload, prompts = shape
    return (
        f"| {model.removeprefix('qwen2_5_vl_')} | {hardware} | {workload} | {prompts} | {name} "
        f"| {peak:.1f} | **{low:.2f}** ({peak * low:.1f} GiB) | {slower:.2f}x | {gaps} |"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--md", type=Path)
    args = ap.parse_args()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    lines = [
        f"main at {commit}: lowest fraction of the roomy peak that fits (steps of 0.05),",
        "its step time over the roomy plan's, and larger fractions that missed.",
        "",
        "| model | hardware | workload | prompts | schedule | roomy peak GiB | lowest fit "
        "| step vs roomy | larger misses |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for shape in SHAPES:
        for name in ("serial", "rollplex"):
            lines.append(row(shape, name))
            print(lines[-1], flush=True)
    if args.md:
        args.md.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
