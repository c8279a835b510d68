"""plan_step: specs in, a validated Plan out, along the one-way flow.

    graph  = algorithm builder(specs)                        rollplex.algos
    graph' = passes, after the rollout role's capabilities   rollplex.graph.passes
    plan   = planner(graph', specs) per rollout TP tried      rollplex.planner.api
With `schedule.parallel.rollout_tp` unset, the fastest plan that fits is kept.
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
    skip_dead_prefix,
)
from rollplex.graph.passes.early_backward import algo_refusal, early_backward_refusal
from rollplex.jobs.reuse_forwards import DECODE_ONCE, PREFILL_ONCE, REUSES, plan_reuse
from rollplex.planner.api import plan_graph
from rollplex.planner.capabilities import (
    engine_can_sleep,
    role_capabilities_pass,
    trainer_capabilities_pass,
)
from rollplex.planner.cost_model import CostModel
from rollplex.planner.gc_paused import cyclic_gc_paused
from rollplex.planner.interference import InterferenceModel
from rollplex.planner.plan import Plan
from rollplex.planner.residency import PlanOverBudget
from rollplex.planner.simulate import SimReport, report
from rollplex.specs import AlgoSpec, HardwareSpec, ModelSpec, ScheduleSpec, WorkloadSpec
from rollplex.specs.roles import RoleCapabilities
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
    if not schedule.dedup and schedule.name != "rollplex":
        return (eliminate_dead_ops,)
    chosen = DEDUP_PASSES if schedule.dedup else SPLIT_ONLY
    if schedule.name == "disaggregated":  # the trainer's GPUs may run its prefix early
        chosen = tuple(p for p in chosen if p is not skip_dead_prefix)
    return chosen


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
    rollout: RoleCapabilities | None = None,
    trainer: RoleCapabilities | None = None,
) -> tuple[Graph, Graph, list[PassRecord]]:
    """(source, graph after passes, pass records). `passes` overrides the schedule's;
    `rollout` and `trainer` (the chosen roles' capabilities) rewrite the graph first, so the
    plan asks the roles only for what they can do and sizes what they hold."""
    source = graph if graph is not None else build_step(model, workload, algo)
    chosen = list(passes_for(schedule) if passes is None else passes)
    if trainer is not None:
        chosen.insert(0, trainer_capabilities_pass(trainer))
    if rollout is not None:
        chosen.insert(0, role_capabilities_pass(rollout))
    after, records = run_passes(source, chosen)
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
    rollout: RoleCapabilities | None = None,
    engine_sleep: bool | None = None,
    trainer: RoleCapabilities | None = None,
) -> PlanResult:
    """Build (or take `graph`), run the passes (`passes=()`: plan `graph` as is), plan.
    `rollout`, `trainer`: the chosen roles' capabilities (planner/capabilities.py).
    `engine_sleep`: whether a rollout engine that can sleep does so between rollouts;
    None lets the planner decide: awake if that plan fits without offloading anything
    (sleeping and waking cost time the plan does not need to pay), else asleep.

    If no rollout TP degree fits, the last budget error is raised."""
    check_parallel(schedule, model, hardware)
    source, after, records = build_graph(
        model, workload, algo, schedule, graph, passes, rollout, trainer
    )
    early = early_backward_note(schedule, algo, after)
    if engine_sleeps_possible(after) and engine_sleep is not True:
        awake = engine_awake(after)
        if engine_sleep is False:
            after = awake
        else:
            try:
                best = _plan_layouts(
                    awake, model, workload, hardware, schedule, cost_model, interference, True
                )
            except PlanOverBudget:
                best = None
            if best is not None and not any(
                s.kind in ("offload", "onload") for d in best.devices for s in d.steps
            ):
                best.notes.insert(0, "rollout engine stays awake: the plan fits without sleep")
                return PlanResult(best, awake, source, records, report(best))
    enabled = {PREFILL_ONCE: schedule.prefill_once, DECODE_ONCE: schedule.decode_once}
    reuses = [
        reuse
        for reuse in REUSES
        if enabled[reuse]
        and schedule.name != "disaggregated"  # the rollout and the trainer on other GPUs
        and exports_activations(rollout, trainer)
    ]
    layouts = (after, model, workload, hardware, schedule, cost_model, interference)
    over = None
    try:
        best = _plan_layouts(*layouts, enforce_budget)
    except PlanOverBudget as err:
        if not reuses:
            raise
        # A reuse drops a training forward's saved activations: it may fit where this misses.
        over, best = err, _plan_layouts(*layouts, False)
    if engine_sleeps_possible(after):
        best.notes.insert(0, "rollout engine sleeps (level 2) between rollouts")
    for reuse in reuses:
        taken = plan_reuse(
            reuse, after, best, model, workload, hardware, schedule, cost_model, interference
        )
        if taken is not None:
            after, best = taken
            records.append(PassRecord(reuse.name.replace(" ", "_"), True, after))
    if over is not None and not best.fits_budget:
        raise over
    if early:
        best.notes.append(early)
    return PlanResult(best, after, source, records, report(best))


def early_backward_note(schedule: ScheduleSpec, algo: AlgoSpec, graph: Graph) -> str | None:
    """schedule.early_backward: a ValueError naming what makes the gradient nonlinear in
    per-row advantages, else the plan's note that its placement is not planned yet."""
    if not schedule.early_backward:
        return None
    why = algo_refusal(algo) or early_backward_refusal(graph)
    if why:
        raise ValueError(f"schedule.early_backward: refused, {why}")
    grads = [graph.values[op.outputs["grads"]] for op in graph if op.kind == "backward"]
    gib = 2 * max(v.nbytes for v in grads) / 2**30  # S_R and S_1 of the policy's gradient
    return (
        f"early backward: the gradient is linear in per-row advantages (two accumulators "
        f"per group, {gib:.2f} GiB per group in flight before sharding, would be exact), "
        "but per-group placement beside the decode is not planned yet: one backward after "
        "the decode"
    )


def exports_activations(rollout: RoleCapabilities | None, trainer: RoleCapabilities | None):
    """Both roles can hand over a forward's activations (prefill_once, decode_once)."""
    return bool(rollout and trainer and rollout.activation_export and trainer.activation_export)


def engine_sleeps_possible(graph: Graph) -> bool:
    """The graph's rollout is an engine that can drop its weights and KV (level 2)."""
    return any(engine_can_sleep(op) for op in graph)


def engine_awake(graph: Graph) -> Graph:
    """`graph` with its rollout engine kept awake all step (no sleep levels)."""
    ops = []
    for op in graph:
        if op.kind == "generate" and op.meta.get("sleep_levels"):
            op = op.clone()
            op.meta["sleep_levels"] = []
        ops.append(op)
    return Graph(graph.values.values(), ops)


def _plan_layouts(
    after: Graph,
    model: ModelSpec,
    workload: WorkloadSpec,
    hardware: HardwareSpec,
    schedule: ScheduleSpec,
    cost_model: CostModel | None,
    interference: InterferenceModel | None,
    enforce_budget: bool,
) -> Plan:
    """The fastest plan of `after` over the rollout TP degrees that fit."""

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
    return best
