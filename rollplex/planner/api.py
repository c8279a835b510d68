"""plan_step: specs in, a validated Plan out — the one entry the CLI and runtime use.

graph  = algorithm builder(specs)
graph' = passes (dedup or not, per schedule)
plan   = schedule(graph')  -> replay -> memory + residency -> validate_plan
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rollplex.algos import build_step
from rollplex.backends.capabilities import RoleCapabilities
from rollplex.graph.ir import Graph
from rollplex.graph.passes import (
    DEDUP_PASSES,
    SPLIT_ONLY,
    PassFn,
    PassRecord,
    eliminate_dead_ops,
    run_passes,
)
from rollplex.planner.capabilities import role_capabilities_pass
from rollplex.planner.cost_model import CostModel
from rollplex.planner.gc_paused import cyclic_gc_paused
from rollplex.planner.interference import InterferenceModel
from rollplex.planner.lifetimes import DeviceSizer
from rollplex.planner.plan import Plan
from rollplex.planner.residency import (
    Memory,
    PlanOverBudget,
    check_budget,
    settle_memory,
    settled_time,
)
from rollplex.planner.schedules import SCHEDULES, PlanningContext
from rollplex.planner.simulate import SimReport, report
from rollplex.planner.validate import validate_plan
from rollplex.specs import AlgoSpec, HardwareSpec, ModelSpec, ScheduleSpec, WorkloadSpec


@dataclass(slots=True)
class PlanResult:
    plan: Plan
    graph: Graph  # after passes: what the plan runs
    source: Graph  # as the algorithm built it
    passes: list[PassRecord]
    report: SimReport


def passes_for(schedule: ScheduleSpec):
    """verl's serial step runs the raw graph; rollplex needs the prefix split even without
    dedup; dedup=true applies every deduplicating pass."""
    if schedule.dedup:
        return DEDUP_PASSES
    return SPLIT_ONLY if schedule.name == "rollplex" else (eliminate_dead_ops,)


def rollout_tp_options(model: ModelSpec, hardware: HardwareSpec) -> list[int]:
    """TP degrees worth trying: powers of two inside a node whose weight shard leaves at
    least half of HBM for KV cache and training state."""
    weights = model.param_count() * model.dtype_bytes
    options, tp = [], 1
    while tp <= min(hardware.num_gpus, hardware.gpus_per_node):
        if hardware.num_gpus % tp == 0 and weights / tp <= 0.5 * hardware.hbm_bytes:
            options.append(tp)
        tp *= 2
    return options or [min(hardware.num_gpus, hardware.gpus_per_node)]


@cyclic_gc_paused()
def plan_step(
    model: ModelSpec,
    workload: WorkloadSpec,
    algo: AlgoSpec,
    hardware: HardwareSpec,
    schedule: ScheduleSpec,
    cost_model: CostModel | None = None,
    interference: InterferenceModel | None = None,
    graph: Graph | None = None,
    enforce_budget: bool = True,
    passes: Sequence[PassFn] | None = None,
    rollout: RoleCapabilities | None = None,
) -> PlanResult:
    """Plan one step. `passes` overrides the schedule's passes (`()`: plan `graph` as is).
    `rollout`: the chosen rollout role's capabilities; the graph is rewritten for them
    first (planner/capabilities.py), so the plan asks the role only for what it can do.

    With `schedule.parallel.rollout_tp` unset, every sensible rollout TP degree is planned
    and the fastest plan that fits is kept; if none fits, the last budget error is raised."""
    if schedule.parallel.rollout_tp is not None or schedule.name == "disaggregated":
        return _plan_step(
            model,
            workload,
            algo,
            hardware,
            schedule,
            cost_model,
            interference,
            graph,
            enforce_budget,
            passes,
            rollout,
        )
    best, error = None, None
    for tp in rollout_tp_options(model, hardware):
        sched = schedule.model_copy(
            update={"parallel": schedule.parallel.model_copy(update={"rollout_tp": tp})}
        )
        try:
            r = _plan_step(
                model,
                workload,
                algo,
                hardware,
                sched,
                cost_model,
                interference,
                graph,
                enforce_budget,
                passes,
                rollout,
            )
        except PlanOverBudget as err:
            error = err
            continue
        if best is None or r.plan.step_time_s < best.plan.step_time_s:
            best = r
    if best is None:
        raise error or PlanOverBudget("no rollout TP degree fits")
    best.plan.notes.insert(
        0,
        f"rollout TP {best.plan.devices[0].tp} (fastest of {rollout_tp_options(model, hardware)})",
    )
    return best


def _plan_step(
    model: ModelSpec,
    workload: WorkloadSpec,
    algo: AlgoSpec,
    hardware: HardwareSpec,
    schedule: ScheduleSpec,
    cost_model: CostModel | None,
    interference: InterferenceModel | None,
    graph: Graph | None,
    enforce_budget: bool,
    passes: Sequence[PassFn] | None,
    rollout: RoleCapabilities | None = None,
) -> PlanResult:
    source = graph if graph is not None else build_step(model, workload, algo)
    chosen = list(passes_for(schedule) if passes is None else passes)
    if rollout is not None:
        chosen.insert(0, role_capabilities_pass(rollout))
    graph, records = run_passes(source, chosen)
    ctx = PlanningContext(
        graph,
        model,
        workload,
        hardware,
        schedule,
        cost_model or CostModel(hardware),
        interference or InterferenceModel(),
    )

    def memory(plan: Plan) -> Memory:
        return Memory(
            graph=graph,
            sizers=_sizers(plan, ctx),
            host_link_gbps=hardware.host_link_gbps,
            strategy=schedule.memory_strategy,
            budget_bytes=hardware.hbm_bytes,
        )

    def settle(plan: Plan) -> Plan:
        return settle_memory(plan, memory(plan), ctx.interference)

    def fitted_time(p: Plan) -> float:
        seconds, fits = settled_time(p, memory(p), ctx.interference)
        return seconds if fits else float("inf")

    if schedule.name == "rollplex":
        # Overlap must pay for the memory it costs: candidates are scored after residency,
        # and one that cannot fit is declined (its prefix is computed where it is consumed).
        plan = SCHEDULES["rollplex"](ctx, evaluate=fitted_time)
    elif schedule.name == "disaggregated":
        # The fastest split whose pools hold their state.
        plan = SCHEDULES["disaggregated"](ctx, evaluate=fitted_time)
    else:
        plan = SCHEDULES[schedule.name](ctx)
    settle(plan)
    if enforce_budget:
        check_budget(plan)
    validate_plan(plan, graph, budget=enforce_budget)
    return PlanResult(plan, graph, source, records, report(plan))  # settle() replayed it last


def _sizers(plan: Plan, ctx: PlanningContext) -> dict[str, DeviceSizer]:
    train_gpus = next(
        (len(d.ranks) for d in plan.devices if d.name != "rollout"), ctx.hardware.num_gpus
    )
    return {
        d.name: DeviceSizer(
            ctx.graph, ctx.model, ctx.workload, d, train_gpus, ctx.schedule.train_micro_tokens
        )
        for d in plan.devices
    }
