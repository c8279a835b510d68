"""Planned, not measured: the step with kl_coef=0 with the reference kept (use_reference=
true, the old default) and dropped (use_reference=null), per preset model x workload x
schedule on h200x8. The ratio is the plan's; no GPU ran.

    python bench/reference_dropped_plan.py > bench/results/reference_dropped_plan_cpu.md
"""

from __future__ import annotations

from rollplex.jobs.pipeline import plan_step
from rollplex.specs import HARDWARE_PRESETS, MODEL_PRESETS, WORKLOAD_PRESETS, AlgoSpec, ScheduleSpec

print(__doc__.split("\n\n")[0].replace("\n", " "))
print(
    "\n| model | workload | schedule | kept s | dropped s | kept/dropped | kept GiB | dropped GiB |"
)
print("|---|---|---|---:|---:|---:|---:|---:|")
hw = HARDWARE_PRESETS["h200x8"]
for model in ("qwen2_5_vl_3b", "qwen2_5_vl_7b"):
    for workload in ("image", "video"):
        for schedule in ("serial", "rollplex"):
            kept, dropped = (
                plan_step(
                    MODEL_PRESETS[model], WORKLOAD_PRESETS[workload],
                    AlgoSpec(kl_coef=0.0, use_reference=ref), hw, ScheduleSpec(name=schedule),
                ).plan
                for ref in (True, None)
            )  # fmt: skip
            gib = (kept.peak_bytes_per_gpu / 2**30, dropped.peak_bytes_per_gpu / 2**30)
            print(
                f"| {model} | {workload} | {schedule} | {kept.step_time_s:.2f} | "
                f"{dropped.step_time_s:.2f} | {kept.step_time_s / dropped.step_time_s:.3f}x | "
                f"{gib[0]:.1f} | {gib[1]:.1f} |"
            )
