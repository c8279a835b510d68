"""`rollplex plan`: plan one step under a schedule, next to the baselines, and export it.

Writes into the run folder: plan.json, plan.md (readable summary), tb/ (the planned
timeline and memory for TensorBoard, plus scalars and hparams) and summary.json. The
speedups are ratios of predicted step times from the same graph, cost model and
interference model: verl's serial step (no dedup), serial with dedup, and disaggregated.

`naive_colocation_bytes` is verl's serial step (no dedup) with every tensor resident for
the whole step, scratch included: the `naive` memory strategy's peak per GPU, which is
the sum of that plan's slots (bench/paper_setting.py's "naive" column means the same).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from rollplex.backends import (  # torch-free: the registry's copies
    rollout_capabilities,
    trainer_capabilities,
)
from rollplex.jobs.pipeline import PlanResult, plan_step
from rollplex.planner.cost_model import CostModel
from rollplex.planner.plan import Plan, dump_plan
from rollplex.specs.calibration import load_calibration
from rollplex.specs.run import RunSpec
from rollplex.trace import (
    markdown_table,
    open_writer,
    write_hparams,
    write_profiler_traces,
    write_scalars,
    write_text,
)
from rollplex.trace.from_plan import plan_timeline

log = logging.getLogger(__name__)
GIB = 1 << 30


def cost_model_for(spec: RunSpec) -> CostModel:
    cm = CostModel(spec.hardware)
    if spec.calibration is None:
        return cm
    load_calibration(spec.calibration)  # validated first: one line naming file and field
    return cm.calibrated(spec.calibration)


def _baselines(spec: RunSpec) -> dict[str, PlanResult | None]:
    out: dict[str, PlanResult | None] = {}
    variants = {
        "serial": spec.schedule.model_copy(update={"name": "serial", "dedup": False}),
        "serial_dedup": spec.schedule.model_copy(update={"name": "serial", "dedup": True}),
    }
    if spec.hardware.num_gpus >= 2:
        variants["disaggregated"] = spec.schedule.model_copy(update={"name": "disaggregated"})
    for key, sched in variants.items():
        try:
            out[key] = plan_step(
                spec.model,
                spec.workload,
                spec.algo,
                spec.hardware,
                sched,
                cost_model=cost_model_for(spec),
                enforce_budget=False,
                rollout=rollout_capabilities(spec.backend),
                trainer=trainer_capabilities(spec.backend, spec.hardware.num_gpus),
            )
        except ValueError as err:
            log.warning("baseline %s could not be planned: %s", key, err)
            out[key] = None
    return out


def naive_colocation_bytes(verl_serial: PlanResult | None) -> int | None:
    """Every slot of verl's serial step resident at once, on its fullest device."""
    if verl_serial is None:
        return None
    return max(sum(s.size for s in d.slots) for d in verl_serial.plan.devices)


def _ratio(base: PlanResult | None, t: float) -> float | None:
    return base.plan.step_time_s / t if base is not None and t > 0 else None


def run_plan(spec: RunSpec, out: Path) -> dict[str, Any]:
    result = plan_step(
        spec.model,
        spec.workload,
        spec.algo,
        spec.hardware,
        spec.schedule,
        cost_model=cost_model_for(spec),
        rollout=rollout_capabilities(spec.backend),  # plan only what the rollout can do
        trainer=trainer_capabilities(spec.backend, spec.hardware.num_gpus),
    )
    plan, report = result.plan, result.report
    base = _baselines(spec)
    (out / "plan.json").write_text(dump_plan(plan))
    dev = max(plan.devices, key=lambda d: d.peak_bytes)
    summary: dict[str, Any] = {
        "schedule": spec.schedule.name,
        "dedup": spec.schedule.dedup,
        "model": spec.model.name,
        "workload": spec.workload.name,
        "hardware": spec.hardware.label,
        "gpus": spec.hardware.num_gpus,
        "step_time_s": plan.step_time_s,
        "peak_bytes_per_gpu": plan.peak_bytes_per_gpu,
        "peak_gib_per_gpu": plan.peak_bytes_per_gpu / GIB,
        "lower_bound_bytes": dev.lower_bound_bytes,
        "lower_bound_gib": dev.lower_bound_bytes / GIB,
        "naive_colocation_bytes": naive_colocation_bytes(base.get("serial")),
        "budget_bytes": dev.budget_bytes,
        "fits_budget": plan.fits_budget,
        "speedup_vs_serial": _ratio(base.get("serial"), plan.step_time_s),
        "speedup_vs_serial_dedup": _ratio(base.get("serial_dedup"), plan.step_time_s),
        "speedup_vs_disaggregated": _ratio(base.get("disaggregated"), plan.step_time_s),
        "busy_fraction": report.busy_fraction,
        "bubble_s": report.bubble_s,
        "offloads": sum(1 for d in plan.devices for s in d.steps if s.kind == "offload"),
        "decisions": plan.notes,
        "graph_hash": plan.graph_hash,
        "calibration": spec.calibration,
    }
    table = _summary_table(plan, summary)
    (out / "plan.md").write_text(table)
    print(table)
    _export_tensorboard(out / "tb", plan, spec, summary)
    return summary


def _summary_table(plan: Plan, s: dict[str, Any]) -> str:
    def x(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.3f}x"

    def gib(v: int | None) -> str:
        return "n/a" if v is None else f"{v / GIB:.2f} GiB"

    rows = [
        ["step time", f"{s['step_time_s'] * 1e3:.1f} ms"],
        ["speedup vs serial (verl)", x(s["speedup_vs_serial"])],
        ["speedup vs serial + dedup", x(s["speedup_vs_serial_dedup"])],
        ["speedup vs disaggregated", x(s["speedup_vs_disaggregated"])],
        ["peak / GPU", f"{s['peak_gib_per_gpu']:.2f} GiB"],
        ["lower bound / GPU", f"{s['lower_bound_gib']:.2f} GiB"],
        ["naive colocation / GPU (verl serial, nothing freed)", gib(s["naive_colocation_bytes"])],
        ["budget / GPU", f"{s['budget_bytes'] / GIB:.2f} GiB (fits: {s['fits_budget']})"],
        ["offloads", str(s["offloads"])],
    ]
    steps = [
        [
            st.name,
            st.phase,
            f"{d.name}:{d.streams[st.stream].name}",
            st.corun.value,
            f"{st.start_s * 1e3:.2f}",
            f"{st.end_s * 1e3:.2f}",
        ]
        for d in plan.devices
        for st in sorted(d.steps, key=lambda z: z.start_s)
    ]
    return (
        f"# plan: {plan.schedule}\n\n"
        + markdown_table(["metric", "value"], rows)
        + "\n\n"
        + "\n".join(f"- {n}" for n in plan.notes)
        + "\n\n"
        + markdown_table(["step", "phase", "stream", "co-run", "start ms", "end ms"], steps)
        + "\n"
    )


def _export_tensorboard(tb: Path, plan: Plan, spec: RunSpec, s: dict[str, Any]) -> None:
    timeline = plan_timeline(
        plan, label=f"planned {plan.schedule}", device_name=spec.hardware.gpu, steps=2
    )
    write_profiler_traces(timeline, tb, worker_prefix="planned")  # as train runs name it
    w = open_writer(tb)
    scalars = {"plan/step_time_s": s["step_time_s"], "plan/peak_gib": s["peak_gib_per_gpu"]}
    for key in ("speedup_vs_serial", "speedup_vs_serial_dedup", "speedup_vs_disaggregated"):
        if s[key] is not None:
            scalars[f"plan/{key}"] = s[key]
    write_scalars(w, scalars)
    write_text(w, "plan/summary", (tb.parent / "plan.md").read_text())
    write_hparams(
        w,
        {
            "schedule": spec.schedule.name,
            "dedup": spec.schedule.dedup,
            "overlap": spec.schedule.overlap,
            "model": spec.model.name,
            "gpus": spec.hardware.num_gpus,
        },
        {k: v for k, v in scalars.items()},
    )
    w.close()
