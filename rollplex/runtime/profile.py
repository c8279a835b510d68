"""Measured traces from torch.profiler, exported beside the planned trace of the same run.

    with step_profiler(executor.device) as prof: results = [executor.run_step(k, ...) ...]
    export_run(run_dir, plan, results, prof)
One TensorBoard run with workers `planned0` and `measured0` (memory named by plan step) and
`planned_vs_measured.md`; files appear by rename at the end (the plugin loads a run once).
"""

from __future__ import annotations

import gzip
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from rollplex.planner.plan import Plan
from rollplex.runtime.record import StepResult, measured_timeline, step_table
from rollplex.trace.from_plan import plan_timeline
from rollplex.trace.profiler_trace import build_profiler_trace
from rollplex.trace.torch_trace import attribute_to_steps

TABLE = "planned_vs_measured.md"


def step_profiler(device: str | torch.device = "cpu") -> profile:
    """A profiler that records what a measured trace needs: host ops, kernels on CUDA,
    and every allocation and free (shapes and stacks off: they cost, and add nothing here)."""
    activities = [ProfilerActivity.CPU]
    if torch.device(device).type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    return profile(activities=activities, profile_memory=True, record_shapes=False)


def device_label(device: str) -> str:
    """What the trace names a measured device: the GPU's own name ("NVIDIA H200", as the
    plan names it) for a CUDA device, else as given ("cpu")."""
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return device


def _profiler_trace(prof: profile, plan: Plan, results: Sequence[StepResult]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        trace = json.loads(path.read_text())
    seen: dict[str, int] = {}
    marks = []
    for r in results:
        for m in r.steps:
            k = seen[m.step.name] = seen.get(m.step.name, -1) + 1
            marks += [(m.step.name, k, text) for text in m.deviations]
    names = {s.name for s in plan.all_steps()}
    return attribute_to_steps(trace, names, marks)


def export_run(
    run_dir: str | os.PathLike,
    plan: Plan,
    results: Sequence[StepResult],
    prof: profile | None = None,
    *,
    device_name: str = "",
    planned_device_name: str | None = None,
    span: int = 1,
) -> list[Path]:
    """Write the planned and measured workers and the step table into `run_dir`; the
    paths written. `prof`: a finished `step_profiler` that ran exactly `results`.
    `planned_device_name` (default `device_name`): the device the plan was made for."""
    if not results:
        raise ValueError("no measured steps to export")
    run = Path(run_dir)
    run.mkdir(parents=True, exist_ok=True)
    device_name = device_label(device_name)
    planned_on = device_name if planned_device_name is None else planned_device_name
    planned = plan_timeline(
        plan, label="planned", device_name=planned_on, steps=len(results),
        first_step=results[0].rl_step,  # ProfilerStep#N names as the measured worker's
    )  # fmt: skip
    traces = {f"planned{d}": build_profiler_trace(planned, d) for d in planned.devices()}
    if prof is not None:
        traces["measured0"] = _profiler_trace(prof, plan, results)
    else:
        measured = measured_timeline(plan, results, device_name=device_name)
        traces |= {f"measured{d}": build_profiler_trace(measured, d) for d in measured.devices()}
    staged: list[tuple[Path, Path]] = []
    try:
        for worker, trace in traces.items():
            text = json.dumps(trace, separators=(",", ":"), default=str).encode()
            big = prof is not None and worker.startswith("measured")  # every aten op: gzip
            final = run / f"{worker}.{span:06d}.pt.trace.json{'.gz' if big else ''}"
            tmp = run / f".{final.name}.tmp"  # does not match the plugin's file pattern
            staged.append((tmp, final))
            tmp.write_bytes(gzip.compress(text, compresslevel=6) if big else text)
        table = run / TABLE
        staged.append((run / f".{TABLE}.tmp", table))
        staged[-1][0].write_text(step_table(plan, results), "utf-8")
    except BaseException:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
        raise
    for tmp, final in staged:
        other = final.with_suffix("") if final.suffix == ".gz" else Path(f"{final}.gz")
        other.unlink(missing_ok=True)  # an earlier export of this worker, the other format
        os.replace(tmp, final)
    return [final for _, final in staged]


def comparison_image(
    plan: Plan,
    results: Sequence[StepResult],
    *,
    calibrated: str | None,
    device_name: str = "",
    planned_device_name: str | None = None,
) -> bytes:
    """The planned-vs-measured panel (`trace/gantt.py`) of the steps in `results`, PNG."""
    from rollplex.trace.gantt import comparison_png

    device_name = device_label(device_name)
    planned_on = device_name if planned_device_name is None else planned_device_name
    first = results[0].rl_step
    planned = plan_timeline(
        plan, label=f"plan '{plan.schedule}' on {planned_on or 'its hardware'}",
        steps=len(results), first_step=first,
    )  # fmt: skip
    measured = measured_timeline(plan, results, label=f"on {device_name}", device_name=device_name)
    title = f"RL steps {first + 1}-{first + len(results)}: planned above, measured below"
    return comparison_png(planned, measured, calibrated=calibrated, title=title)


def load_trace(path: str | os.PathLike) -> dict:
    """A trace file `export_run` wrote (`.json` or `.json.gz`)."""
    data = Path(path).read_bytes()
    return json.loads(gzip.decompress(data) if str(path).endswith(".gz") else data)
