"""`rollplex plan`: plan one step under a schedule, next to the baselines, and export it.

Writes plan.json, plan.md, tb/ and summary.json into the run folder. Speedups are ratios of
predicted step times from the same graph and models (jobs/baselines.py).
`naive_colocation_bytes` is verl's serial step with every tensor resident all step: the
`naive` memory strategy's peak per GPU.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rollplex.backends import (  # torch-free: the registry's copies
    rollout_capabilities,
    trainer_capabilities,
)
from rollplex.jobs.baselines import (
    KEYS,
    LABELS,
    Baseline,
    baseline_text,
    plan_baselines,
    speedup_fields,
    speedup_text,
)
from rollplex.jobs.fit_options import plan_with_options
from rollplex.jobs.pricing import pricing_for, resolve_auto
from rollplex.planner.cost_model import CostModel
from rollplex.planner.plan import Plan, dump_plan
from rollplex.specs.model import ModelSpec
from rollplex.specs.run import RunSpec
from rollplex.specs.workload import WorkloadSpec
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
    """Uncalibrated, the hardware's shipped constants, or a file (jobs/pricing.py)."""
    return pricing_for(spec).cost_model


def plan_for(
    spec: RunSpec,
    model: ModelSpec | None = None,
    workload: WorkloadSpec | None = None,
    planner: Callable[..., Any] = plan_with_options,
    **kw: Any,
) -> Any:
    """`planner` (plan_with_options: the schedule, or where it misses the budget the same
    with one micro-batch's activations at a time; or plan_baselines) on `spec`'s step for
    the roles it chose (the planner plans only what they can do), priced by
    `cost_model_for(spec)`; `model` and `workload`: measured ones in place of the spec's."""
    return planner(
        model or spec.model,
        workload or spec.workload,
        spec.algo,
        spec.hardware,
        spec.schedule,
        cost_model=cost_model_for(spec),
        rollout=rollout_capabilities(spec.backend),
        trainer=trainer_capabilities(spec.backend, spec.hardware.num_gpus),
        **kw,
    )


def naive_colocation_bytes(verl_serial: Baseline | None) -> int | None:
    """Every slot of verl's serial step (its plain plan: no options beyond offload)
    resident at once, on its fullest device."""
    res = None if verl_serial is None else (verl_serial.plain or verl_serial.result)
    if res is None:
        return None
    return max(sum(s.size for s in d.slots) for d in res.plan.devices)


def run_plan(spec: RunSpec, out: Path) -> dict[str, Any]:
    spec = resolve_auto(spec, out)  # calibration=auto: an earlier run's file, or the default
    result = plan_for(spec)
    plan, report = result.plan, result.report
    base: dict[str, Baseline] = plan_for(spec, planner=plan_baselines)
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
        **speedup_fields(base, plan.step_time_s),
        "busy_fraction": report.busy_fraction,
        "bubble_s": report.bubble_s,
        "offloads": sum(1 for d in plan.devices for s in d.steps if s.kind == "offload"),
        "decisions": plan.notes,
        "graph_hash": plan.graph_hash,
        "calibration": pricing_for(spec).path,
        "priced_by": pricing_for(spec).source,
    }
    table = _summary_table(plan, summary)
    (out / "plan.md").write_text(table)
    print(table)
    _export_tensorboard(out / "tb", plan, spec, summary)
    return summary


def _summary_table(plan: Plan, s: dict[str, Any]) -> str:
    def x(key: str) -> str:
        return speedup_text(s[f"speedup_vs_{key}"], s[f"speedup_vs_{key}_note"])

    def gib(v: int | None) -> str:
        return "n/a" if v is None else f"{v / GIB:.2f} GiB"

    rows = [
        ["step time", f"{s['step_time_s'] * 1e3:.1f} ms"],
        ["priced by", s["priced_by"]],
        *[[f"speedup vs {LABELS[k]}", x(k)] for k in KEYS],
        *[
            [f"{LABELS[k]} plan", baseline_text(b)]
            for k, b in s["baselines"].items()
            if b.get("step_time_s") is not None
        ],
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
    for key in (f"speedup_vs_{k}" for k in KEYS):
        if s[key] is not None:  # None: the baseline does not fit (no ratio against it)
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
