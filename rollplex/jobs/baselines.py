"""The baselines `rollplex plan` compares against, each given its own memory options.

verl's serial step (no dedup), serial with the same dedup, and disaggregated (2+ GPUs), each
planned under `memory_options` variants, the fastest that fits kept (`plan_fitting`). A
baseline that fits under none gets no ratio: `speedup_vs_<key>` is None and its `_note`
says "does not fit (needs X GiB ...)".
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from rollplex.jobs.pipeline import PlanResult, plan_step
from rollplex.planner.schedules.memory_options import choose, needs_note, record, variants
from rollplex.specs import AlgoSpec, HardwareSpec, ModelSpec, ScheduleSpec, WorkloadSpec

log = logging.getLogger(__name__)
GIB = 1 << 30
KEYS = ("serial", "serial_dedup", "disaggregated")
LABELS = {
    "serial": "serial (verl)",
    "serial_dedup": "serial + dedup",
    "disaggregated": "disaggregated",
}


@dataclass(slots=True)
class Baseline:
    key: str
    result: PlanResult | None  # the chosen variant's plan (None: none could be planned)
    error: str | None = None  # why none could be planned
    plain: PlanResult | None = None  # the plan without options beyond offload

    @property
    def fits(self) -> bool:
        return self.result is not None and self.result.plan.fits_budget

    @property
    def note(self) -> str | None:
        """Why no ratio is taken against it (None when it fits)."""
        if self.result is None:
            return f"not planned: {self.error}"
        return None if self.fits else needs_note(self.result.plan)

    def speedup(self, step_time_s: float) -> float | None:
        if not self.fits or step_time_s <= 0:
            return None
        return self.result.plan.step_time_s / step_time_s  # type: ignore[union-attr]


def baseline_schedules(schedule: ScheduleSpec, num_gpus: int) -> dict[str, ScheduleSpec]:
    out = {
        "serial": schedule.model_copy(  # verl's optimizer offload: all of it, after the update
            update={
                "name": "serial",
                "dedup": False,
                "write_back": "step_end",
                "offload_in_part": False,
            }
        ),
        "serial_dedup": schedule.model_copy(update={"name": "serial", "dedup": True}),
    }
    if num_gpus >= 2:
        out["disaggregated"] = schedule.model_copy(update={"name": "disaggregated"})
    return out


def plan_fitting(
    model: ModelSpec,
    workload: WorkloadSpec,
    algo: AlgoSpec,
    hardware: HardwareSpec,
    schedule: ScheduleSpec,
    **kw: Any,
) -> PlanResult:
    """`plan_step` under each memory-option variant of `schedule` (budget not enforced):
    the fastest that fits, else the one closest to fitting. The plan records the options
    (`meta["memory_options"]`, a note; `meta["train_micro_recompute"]` for the runtime).
    Raises the first variant's error if none could be planned."""
    return _plan_variants(model, workload, algo, hardware, schedule, **kw)[0]


def _plan_variants(
    model: ModelSpec,
    workload: WorkloadSpec,
    algo: AlgoSpec,
    hardware: HardwareSpec,
    schedule: ScheduleSpec,
    **kw: Any,
) -> tuple[PlanResult, PlanResult | None]:
    """(the chosen plan, the plain variant's plan if it was planned)."""
    done, first_error = [], None
    for variant in variants(schedule):
        try:
            res = plan_step(
                model, workload, algo, hardware, variant.schedule, enforce_budget=False, **kw
            )
        except ValueError as err:
            first_error = first_error or err
            continue
        done.append((variant, res))
        if res.plan.fits_budget:
            break  # variants are listed cheapest first: a later one only adds work
    if not done:
        raise first_error or ValueError("no memory-option variant could be planned")
    variant, res = done[choose(done, lambda r: r.plan)]
    record(res.plan, res.graph, variant.options)
    plain = next((r for v, r in done if not v.options), None)
    return res, plain


def plan_baselines(
    model: ModelSpec,
    workload: WorkloadSpec,
    algo: AlgoSpec,
    hardware: HardwareSpec,
    schedule: ScheduleSpec,
    **kw: Any,
) -> dict[str, Baseline]:
    out = {}
    for key, sched in baseline_schedules(schedule, hardware.num_gpus).items():
        try:
            res, plain = _plan_variants(model, workload, algo, hardware, sched, **kw)
            out[key] = Baseline(key, res, plain=plain)
        except ValueError as err:
            log.warning("baseline %s could not be planned: %s", key, err)
            out[key] = Baseline(key, None, str(err).splitlines()[0])
    return out


def speedup_fields(baselines: dict[str, Baseline], step_time_s: float) -> dict[str, Any]:
    """summary.json's `speedup_vs_<key>` (None unless the baseline fits) and
    `speedup_vs_<key>_note` (why None), for every key, and each baseline's facts."""
    out: dict[str, Any] = {}
    for key in KEYS:
        b = baselines.get(key)
        out[f"speedup_vs_{key}"] = b.speedup(step_time_s) if b else None
        out[f"speedup_vs_{key}_note"] = b.note if b else "not planned: needs 2+ GPUs"
    out["baselines"] = {key: _facts(b) for key, b in baselines.items()}
    return out


def _facts(b: Baseline) -> dict[str, Any]:
    if b.result is None:
        return {"fits": False, "error": b.error}
    p = b.result.plan
    return {
        "fits": p.fits_budget,
        "step_time_s": p.step_time_s,
        "peak_bytes_per_gpu": p.peak_bytes_per_gpu,
        "memory_options": p.meta.get("memory_options", []),
        "note": b.note,
    }


def speedup_text(value: float | None, note: str | None) -> str:
    """A speedup cell: the ratio, or why there is none."""
    if value is not None:
        return f"{value:.3f}x"
    return note or "n/a"


def baseline_text(facts: dict[str, Any]) -> str:
    """A baseline's plan in one cell: step time, peak and the memory options it uses."""
    options = ", ".join(facts.get("memory_options") or []) or "none"
    fits = "fits" if facts["fits"] else "does not fit"
    return (
        f"{facts['step_time_s'] * 1e3:.1f} ms, peak {facts['peak_bytes_per_gpu'] / GIB:.2f} "
        f"GiB ({fits}); memory options: {options}"
    )
