"""The user's own schedule gets the memory options its baselines get (jobs/baselines.py).

When the plain plan misses the HBM budget, the same schedule holding one training
micro-batch's activations at a time is planned (`memory_options.fallbacks`: forward and
backward per micro-batch, then the forward rerun in the backward for a graph whose forward
values something besides the loss reads); the first that fits is kept, its options
recorded on the plan, which the runtime reads (`plan.meta["train_micro_fused"]`,
`["train_micro_recompute"]`). If none fits, the plain plan's account is raised (the
residents at its peak), with what each fallback needed and what else to change.
"""

from __future__ import annotations

import logging
from typing import Any

from rollplex.jobs.pipeline import PlanResult, plan_step
from rollplex.planner.residency import PlanOverBudget
from rollplex.planner.schedules.memory_options import fallbacks, record
from rollplex.specs import AlgoSpec, HardwareSpec, ModelSpec, ScheduleSpec, WorkloadSpec

log = logging.getLogger(__name__)


def plan_with_options(
    model: ModelSpec,
    workload: WorkloadSpec,
    algo: AlgoSpec,
    hardware: HardwareSpec,
    schedule: ScheduleSpec,
    **kw: Any,
) -> PlanResult:
    """`plan_step`, or, where its plan misses the budget, the first fallback that fits."""
    try:
        return plan_step(model, workload, algo, hardware, schedule, **kw)
    except PlanOverBudget as plain:
        tried = []
        for variant in fallbacks(schedule):
            # each try is a whole planning pass (seconds at large steps): say what runs
            log.info("%s; planning again with %s", plain.summary, variant.options[0])
            try:
                res = plan_step(model, workload, algo, hardware, variant.schedule, **kw)
            except PlanOverBudget as err:
                tried.append(f"with {variant.options[0]}, {err.summary}")
                continue
            except ValueError as err:  # a graph this option cannot run
                tried.append(f"with {variant.options[0]}, refused: {err}")
                continue
            record(res.plan, res.graph, variant.options)
            res.plan.notes.insert(
                0, f"memory: planned with {variant.options[0]}; without it, {plain.summary}"
            )
            log.info("%s", res.plan.notes[0])
            return res
        if not tried:  # the schedule already holds one micro-batch's activations
            raise
        raise PlanOverBudget(
            f"{plain.account} Planned again, holding one training micro-batch's activations "
            f"at a time: {'; '.join(tried)}. Use more GPUs, a larger rollout TP or fewer "
            "prompts per step.",
            plain.summary,
            plain.account,
        ) from plain
