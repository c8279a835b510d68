"""What the executor measured: per plan step and per RL step, and its two exports — a
`Timeline` for the trace writer (the same one the planned timeline goes through) and the
cost model's calibration entries.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from rollplex.planner.cost_model import write_calibration
from rollplex.planner.plan import CoRun, Plan, Step
from rollplex.runtime.plan_effects import COPY_KINDS
from rollplex.specs.calibration import MIN_S, kind_scales, out_of_range
from rollplex.trace.timeline import Mark, MemoryEvent, Span, Timeline

_US = 1e6
log = logging.getLogger(__name__)


@dataclass(slots=True)
class MeasuredStep:
    step: Step  # the plan step
    device: int  # device group index in the plan
    rl_step: int
    start_s: float  # since the executor's origin
    end_s: float
    resident_bytes: int  # device-group bytes right after the step, before its frees
    resident_after_free: int
    host_bytes: int
    reads: dict[str, str] = field(default_factory=dict)  # port -> weights version read
    note: str = ""  # e.g. why a step did nothing
    freed: list[str] = field(default_factory=list)  # values dropped after it (its frees)
    deviations: list[str] = field(default_factory=list)  # where the plan was not followed

    @property
    def seconds(self) -> float:
        return self.end_s - self.start_s


@dataclass(slots=True)
class StepResult:
    """One RL step run through the plan."""

    rl_step: int
    start_s: float
    end_s: float
    metrics: dict[str, float]
    steps: list[MeasuredStep]
    memory: list[MemoryEvent]
    peak_resident_bytes: dict[int, int]  # device group -> max over its steps
    notes: list[str] = field(default_factory=list)
    # the allocator's (CUDA) peak in this RL step, and since the executor's first step;
    # None without one (CPU, or a plan of several device groups in one process)
    allocator_step_peak: int | None = None
    allocator_run_peak: int | None = None

    @property
    def seconds(self) -> float:
        return self.end_s - self.start_s


def measured_timeline(
    plan: Plan, results: Sequence[StepResult], label: str = "measured", device_name: str = ""
) -> Timeline:
    """The RL steps in `results` as one timeline: a span per plan step on its plan stream,
    the resident bytes as memory events, one ProfilerStep per RL step, and a mark wherever
    the runtime did not follow the plan.

    Memory events are named for the step that changed the bytes and placed inside its span
    (what it made: in its middle; its frees: at its end), so the Memory view names the
    step rather than `<unknown>`; on CUDA the spans are the device's times, not the host's
    at which the bytes were counted."""
    if not results:
        raise ValueError("no measured steps to export")
    t0 = results[0].start_s
    spans, memory, steps, marks = [], [], [], []
    for r in results:
        steps.append(((r.start_s - t0) * _US, (r.end_s - t0) * _US))
        mine = [_span(m, t0) for m in r.steps]
        spans += mine
        for m, span in zip(r.steps, mine, strict=True):
            marks += [
                Mark(m.device, m.step.stream, span.end_us, "plan not followed", text)
                for text in m.deviations
            ]
        k = 0  # events come in step order, each named for its step (a copy's name repeats)
        for e in r.memory:
            while k < len(mine) and (mine[k].name, mine[k].device) != (e.name, e.device):
                k += 1
            t = e.t_us - t0 * _US
            if k < len(mine):
                span = mine[k]
                t = span.start_us + span.dur_us / 2 if e.delta_bytes > 0 else span.end_us
            else:
                k = 0  # not a step's event: keep its time, look again from the start
            memory.append(
                MemoryEvent(
                    e.device, t, e.addr, e.delta_bytes, e.total_allocated, e.total_reserved, e.name
                )
            )
    names = {
        (i, st.stream): f"{d.name}:{st.name}"
        for i, d in enumerate(plan.devices)
        for st in d.streams
    }
    return Timeline(
        label,
        spans,
        sorted(memory, key=lambda e: e.t_us),
        steps,
        names,
        device_name=device_name,
        device_memory_bytes=max((d.budget_bytes for d in plan.devices), default=0),
        marks=marks,
        on_cpu=device_name.lower().startswith("cpu"),
        first_step=results[0].rl_step,
    )


def _span(m: MeasuredStep, t0: float) -> Span:
    s = m.step
    args = {
        "corun": s.corun.value,
        "planned_solo_us": s.solo_s * _US,
        "resident_bytes": m.resident_bytes,
        "rl_step": m.rl_step,
        "weights": ", ".join(sorted(set(m.reads.values()))) or "",
    }
    if m.note:
        args["note"] = m.note
    if m.freed:
        args["freed"] = ", ".join(m.freed)
    cat = "gpu_memcpy" if s.kind in COPY_KINDS else "kernel"
    dur = max(m.seconds * _US, 1e-3)
    return Span(m.device, s.stream, s.name, (m.start_s - t0) * _US, dur, cat, s.phase, args)


CostFn = Callable[[Step], tuple[float, float]]


def calibration_entries(results: Sequence[StepResult], cost: CostFn | None = None) -> list[dict]:
    """One entry per measured op step that ran alone (co-run steps are priced with their
    interference, not solo, so they would skew a solo calibration); copies excluded."""
    out = []
    for r in results:
        for m in r.steps:
            s = m.step
            if s.kind in COPY_KINDS or s.corun is not CoRun.NONE or m.note:
                continue
            flops, nbytes = cost(s) if cost else (0.0, 0.0)
            out.append(
                {
                    "kind": s.kind,
                    "op": s.name,
                    "predicted_s": s.solo_s,
                    # a host-timed op under a microsecond (a no-op) is recorded as one, the
                    # floor a calibration file accepts: the file stays loadable
                    "measured_s": max(m.seconds, MIN_S),
                    "flops": flops,
                    "bytes": nbytes,
                }
            )
    return out


def write_measured_calibration(
    path,
    device: str,
    results: Sequence[StepResult],
    cost: CostFn | None = None,
    provenance: dict | None = None,
) -> None:
    """The run's calibration.json, loadable by the next run (`calibration=auto`): a kind
    whose scale the file's reader would refuse is left out, with a warning naming it."""
    entries = calibration_entries(results, cost)
    dispatch = ((provenance or {}).get("priced_with") or {}).get("dispatch_s", 0.0)
    rows = ((e["kind"], e["predicted_s"], e["measured_s"]) for e in entries)
    refused = out_of_range(kind_scales(rows, dispatch))
    for kind, k in refused.items():
        log.warning(
            "calibration.json leaves out kind '%s': predicted/measured %.3g is outside "
            "what a calibration file may hold (a no-op or a broken timer)",
            kind,
            k,
        )
    kept = [e for e in entries if e["kind"] not in refused]
    write_calibration(path, device, kept, provenance)


def step_table(plan: Plan, results: Sequence[StepResult]) -> str:
    """Markdown: per plan step (plan index order), its planned time and the median of its
    measured times over `results`, and where the runtime did not follow the plan."""
    runs: dict[int, list[MeasuredStep]] = {}
    for r in results:
        for m in r.steps:
            runs.setdefault(m.step.index, []).append(m)
    names = {(i, st.stream): st.name for i, d in enumerate(plan.devices) for st in d.streams}
    dev_of = {s.index: i for i, d in enumerate(plan.devices) for s in d.steps}
    step_s = statistics.median(r.seconds for r in results)
    lines = [
        f"Planned vs measured, {len(results)} RL step(s): step time planned "
        f"{plan.step_time_s * 1e3:.3f} ms, measured {step_s * 1e3:.3f} ms (median).",
        "",
        "| index | step | kind | stream | planned (ms) | measured (ms) | measured/planned | note |",
        "|---:|---|---|---|---:|---:|---:|---|",
    ]
    for s in plan.all_steps():
        ms = runs.get(s.index, [])
        planned = (s.end_s - s.start_s) * 1e3
        measured = statistics.median(m.seconds for m in ms) * 1e3 if ms else math.nan
        ratio = measured / planned if planned > 0 else math.nan
        notes = dict.fromkeys(n for m in ms for n in (m.note, *m.deviations) if n)
        note = "; ".join(notes) or ("not run" if not ms else "")
        stream = names.get((dev_of[s.index], s.stream), str(s.stream))
        lines.append(
            f"| {s.index} | {s.name} | {s.kind} | {stream} | {planned:.3f} | {measured:.3f} | "
            f"{ratio:.2f} | {note.replace('|', '/')} |"
        )
    return "\n".join(lines) + "\n"
