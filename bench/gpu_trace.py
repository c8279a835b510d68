"""Measured GPU traces from torch.profiler beside the planned ones (issue 9, item 3).

The tiny GRPO step on one GPU under three plans (rollplex piggyback, rollplex streams, and
a serial plan under a tight budget, so that it offloads): one warm-up RL step, then two
under `step_profiler("cuda")`; `export_run` writes each schedule's TensorBoard run
(workers planned0 and measured0, same step names) and its planned_vs_measured.md. Prints
a table last: kernels and CUDA memory events in the measured trace, the share of
allocated CUDA bytes that the trace names by plan step, where the runtime did not follow
the plan, and measured peak over planned peak.

    python bench/gpu_trace.py --out "$OUT/gpu_trace"   # then: tensorboard --logdir $OUT/gpu_trace

`--device cpu` runs the same on CPU (host allocations instead of CUDA ones), as a dry run.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from rollplex.backends.step import StepConfig
from rollplex.backends.torch.data import TaskData
from rollplex.jobs.pipeline import plan_step
from rollplex.runtime import Executor
from rollplex.runtime.compose import compose
from rollplex.runtime.profile import TABLE, export_run, load_trace, step_profiler
from rollplex.specs import HARDWARE_PRESETS, MODEL_PRESETS, WORKLOAD_PRESETS, AlgoSpec, ScheduleSpec
from rollplex.trace.torch_trace import PLAN_TID

MODEL, WORKLOAD, ALGO = MODEL_PRESETS["tiny"], WORKLOAD_PRESETS["tiny"], AlgoSpec(lr=1e-3)
CPU = HARDWARE_PRESETS["cpu"]


def _tight():
    peak = plan_step(MODEL, WORKLOAD, ALGO, CPU, ScheduleSpec(name="serial")).plan.devices[0]
    return CPU.model_copy(update={"hbm_gib": 0.9 * peak.peak_bytes / (1 << 30)})


def _counts(trace: dict, device_type: int) -> tuple[int, int, float]:
    events = trace["traceEvents"]
    kernels = sum(1 for e in events if e.get("cat") == "kernel")
    mem = [
        e
        for e in events
        if e.get("name") == "[memory]"
        and e["args"].get("Device Type") == device_type
        and e["args"]["Bytes"] > 0
    ]
    named = sum(e["args"]["Bytes"] for e in mem if e["tid"] == PLAN_TID)
    return kernels, len(mem), named / max(1, sum(e["args"]["Bytes"] for e in mem))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, default=Path("bench/results/gpu_trace"))
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    device, cuda = args.device, args.device.startswith("cuda")
    name_of_device = torch.cuda.get_device_name() if cuda else "cpu"
    schedules = {
        "rollplex_piggyback": (ScheduleSpec(name="rollplex", overlap="piggyback"), CPU),
        "rollplex_streams": (
            ScheduleSpec(name="rollplex", overlap="streams", chunk_tokens=40),
            CPU,
        ),
        "serial_offload": (ScheduleSpec(name="serial"), _tight()),
    }
    command = f"python bench/gpu_trace.py --out {args.out} --device {device}"
    rows, summary = [], {"device": name_of_device, "command": command}
    for name, (schedule, hw) in schedules.items():
        planned = plan_step(MODEL, WORKLOAD, ALGO, hw, schedule)
        backend = compose(StepConfig(MODEL, ALGO, seed=0, max_new_tokens=4, device=device))
        ex = Executor(planned.plan, planned.graph, backend, device=device)
        data = TaskData(MODEL, WORKLOAD, seed=0)
        ex.run_step(0, data.step(0))
        prof = step_profiler(device)
        with prof:
            results = [ex.run_step(k, data.step(k)) for k in (1, 2)]
        paths = export_run(args.out / name, planned.plan, results, prof, device_name=name_of_device)
        trace = load_trace(next(p for p in paths if p.name.startswith("measured0")))
        kernels, mem, named = _counts(trace, 1 if cuda else 0)
        planned_peak = planned.plan.peak_bytes_per_gpu
        resident = max(max(r.peak_resident_bytes.values()) for r in results) / planned_peak
        steps_peak = max(r.allocator_step_peak or 0 for r in results)  # each step's window
        allocated = steps_peak / planned_peak if cuda else float("nan")
        deviations = len(ex.deviations)
        rows.append((name, kernels, mem, named, deviations, resident, allocated))
        summary[name] = {
            "kernels": kernels,
            "alloc_events": mem,
            "bytes_named_by_plan_step": named,
            "plan_deviations": [m for ms in ex.deviations.values() for m in ms],
            "resident_over_planned_peak": resident,
            "cuda_max_allocated_over_planned_peak": allocated,
            "table": str(args.out / name / TABLE),
        }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"traces and tables under {args.out} (tensorboard --logdir {args.out})")
    print(
        "| schedule | kernels | alloc events | bytes named by plan step | plan deviations "
        "| resident / planned peak | CUDA max allocated / planned peak |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, kernels, mem, named, deviations, resident, allocated in rows:
        print(
            f"| {name} | {kernels} | {mem} | {named:.1%} | {deviations} | {resident:.2f} "
            f"| {allocated:.2f} |"
        )


if __name__ == "__main__":
    main()
