"""Run the tiny GRPO step under several plans, side by side in one process (CPU).

For each schedule: the planned peak per GPU, the executor's measured peak resident bytes,
whether the parameters after the steps equal the serial+dedup run's, and the median
measured step time. Prints a markdown table last.

    python bench/runtime_cpu.py --steps 3 --out bench/results/runtime_cpu.md
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch

from rollplex.backends.step import StepConfig
from rollplex.backends.torch.data import TaskData
from rollplex.jobs.pipeline import plan_step
from rollplex.runtime import Executor
from rollplex.runtime.compose import compose
from rollplex.specs import HARDWARE_PRESETS, MODEL_PRESETS, WORKLOAD_PRESETS, AlgoSpec, ScheduleSpec

MODEL, WORKLOAD, ALGO = MODEL_PRESETS["tiny"], WORKLOAD_PRESETS["tiny"], AlgoSpec(lr=1e-3)
SCHEDULES = {
    "serial + dedup": ScheduleSpec(name="serial"),
    "serial (verl, no dedup)": ScheduleSpec(name="serial", dedup=False),
    "rollplex auto": ScheduleSpec(name="rollplex"),
    "rollplex piggyback": ScheduleSpec(name="rollplex", overlap="piggyback"),
    "rollplex streams": ScheduleSpec(name="rollplex", overlap="streams"),
}


def run(schedule: ScheduleSpec, steps: int) -> tuple[int, int, dict[str, torch.Tensor], float]:
    planned = plan_step(MODEL, WORKLOAD, ALGO, HARDWARE_PRESETS["cpu"], schedule)
    backend = compose(StepConfig(MODEL, ALGO, seed=0, max_new_tokens=4))
    executor = Executor(planned.plan, planned.graph, backend, [])
    data = TaskData(MODEL, WORKLOAD, seed=0)
    results = [executor.run_step(k, data.step(k)) for k in range(steps)]
    measured = max(max(r.peak_resident_bytes.values()) for r in results)
    params = {n: p.detach().clone() for n, p in backend.trainer.model.named_parameters()}
    step_s = statistics.median(r.end_s - r.start_s for r in results[1:] or results)
    return planned.plan.peak_bytes_per_gpu, measured, params, step_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    rows, reference = [], None
    for name, sched in SCHEDULES.items():
        planned, measured, params, step_s = run(sched, args.steps)
        reference = reference or params
        diff = max((params[k] - reference[k]).abs().max().item() for k in params)
        rows.append((name, planned, measured, diff, step_s))
    lines = [
        f"# Tiny GRPO on CPU under several plans (`python bench/runtime_cpu.py --steps "
        f"{args.steps}`)",
        "",
        f"{args.steps} RL steps each, seed 0, deterministic algorithms, one thread. CPU "
        "times are not a speed claim (streams run serialised on CPU); they show the "
        "executor's overhead only.",
        "",
        "| schedule | planned peak | measured peak | max abs param diff vs serial+dedup "
        "| median step |",
        "|---|---|---|---|---|",
    ]
    for name, planned, measured, diff, step_s in rows:
        lines.append(
            f"| {name} | {planned / 1e6:.2f} MB | {measured / 1e6:.2f} MB | "
            f"{diff:.1e} | {step_s * 1e3:.0f} ms |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
