"""plan_step: specs in, a validated Plan out, along the design's one-way flow.

    graph  = algorithm builder(specs)                  (rollplex.algos)
    graph' = passes (dedup or not, per schedule)        (rollplex.graph.passes)
    plan   = planner(graph', specs) per TP degree tried  (rollplex.planner.api.plan_graph)

The graph is built and rewritten once; with `schedule.parallel.rollout_tp` unset, every
sensible rollout TP degree is planned on it and the fastest plan that fits is kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rollplex.algos import build_step
from rollplex.graph.ir import Graph
from rollplex.graph.passes import (
    DEDUP_PASSES,
    SPLIT_ONLY,
    PassFn,
    PassRecord,
    eliminate_dead_ops,
    run_passes,
)
from rollplex.planner.api import plan_graph
from rollplex.planner.cost_model import CostModel
from rollplex.planner.gc_paused import cyclic_gc_paused
from rollplex.planner.interference import InterferenceModel
from rollplex.planner.plan import Plan
from rollplex.planner.residency import PlanOverBudget
from rollplex.planner.simulate import SimReport, report
from rollplex.specs import AlgoSpec, HardwareSpec, ModelSpec, ScheduleSpec, WorkloadSpec
from rollplex.specs.schedule import check_parallel, check_tp


@dataclass(slots=True)
class PlanResult:
    plan: Plan
    graph: Graph  # after passes: what the plan runs
    source: Graph  # as the algorithm built it
    passes: list[PassRecord]
    report: SimReport


def passes_for(schedule: ScheduleSpec) -> tuple[PassFn, ...]:
    """verl's serial step runs the raw graph; rollplex needs the prefix split even without
    dedup; dedup=true applies every deduplicating pass."""
    if schedule.dedup:
        return DEDUP_PASSES
    return SPLIT_ONLY if schedule.name == "rollplex" else (eliminate_dead_ops,)


def rollout_tp_options(model: ModelSpec, hardware: HardwareSpec) -> list[int]:
    """TP degrees worth trying: powers of two inside a node that split the heads evenly
    and whose weight shard leaves at least half of HBM for KV cache and training state."""
    weights = model.param_count() * model.dtype_bytes
    valid, tp = [], 1
    while tp <= min(hardware.num_gpus, hardware.gpus_per_node):
        if _tp_ok(model, hardware, tp):
            valid.append(tp)
        tp *= 2
    return [t for t in valid if weights / t <= 0.5 * hardware.hbm_bytes] or valid[-1:] or [1]


def _tp_ok(model: ModelSpec, hardware: HardwareSpec, tp: int) -> bool:
    try:
        check_tp("rollout_tp", tp, model, hardware)
    except ValueError:
        return False
    return True


def build_graph(
    model: ModelSpec,
    workload: WorkloadSpec,
    algo: AlgoSpec,
    schedule: ScheduleSpec,
    graph: Graph | None = None,
    passes: Sequence[PassFn] | None = None,
) -> tuple[Graph, Graph, list[PassRecord]]:
    """(source, graph after passes, pass records). `passes` overrides the schedule's."""
    source = graph if graph is not None else build_step(model, workload, algo)
    after, records = run_passes(source, passes_for(schedule) if passes is None else passes)
    return source, after, records


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
) -> PlanResult:
    """Build (or take `graph`), run the passes (`passes=()`: plan `graph` as is), plan.

    If no rollout TP degree fits, the last budget error is raised."""
    check_parallel(schedule, model, hardware)
    source, after, records = build_graph(model, workload, algo, schedule, graph, passes)

    def plan(sched: ScheduleSpec) -> Plan:
        return plan_graph(
            after, model, workload, hardware, sched, cost_model, interference, enforce_budget
        )

    if schedule.parallel.rollout_tp is not None or schedule.name == "disaggregated":
        best = plan(schedule)
    else:
        best, error, options = None, None, rollout_tp_options(model, hardware)
        for tp in options:
            parallel = schedule.parallel.model_copy(update={"rollout_tp": tp})
            try:
                p = plan(schedule.model_copy(update={"parallel": parallel}))
            except PlanOverBudget as err:
                error = err
                continue
            if best is None or p.step_time_s < best.step_time_s:
                best = p
        if best is None:
            raise error or PlanOverBudget("no rollout TP degree fits")
        best.notes.insert(0, f"rollout TP {best.devices[0].tp} (fastest of {options})")
    return PlanResult(best, after, source, records, report(best))
