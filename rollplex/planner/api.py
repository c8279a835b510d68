"""plan_graph: a Graph (after its passes) and the specs in, a validated Plan out.

`rollplex.jobs.pipeline` builds the graph and runs the passes, then calls this once per
parallel layout it tries:
    schedule -> replay -> memory + residency -> renumber -> check_budget -> validate_plan
"""

from __future__ import annotations

from rollplex.graph.invariants import lint
from rollplex.graph.ir import Graph
from rollplex.graph.kinds import skips_rows
from rollplex.ops.costs import CostContext
from rollplex.ops.rollout_costs import engine_kv_pool, static_kv
from rollplex.planner.cost_model import CostModel
from rollplex.planner.gc_paused import cyclic_gc_paused
from rollplex.planner.interference import InterferenceModel
from rollplex.planner.plan import Plan
from rollplex.planner.renumber import renumber_in_issue_order
from rollplex.planner.residency import (
    Memory,
    check_budget,
    settle_memory,
    settled_time,
    unshared_time,
)
from rollplex.planner.schedules import SCHEDULES, PlanningContext
from rollplex.planner.schedules.memory_options import check_fused
from rollplex.planner.shared_weights import sharing_note
from rollplex.planner.sizing import DeviceSizer, train_micro_batches
from rollplex.planner.validate import validate_plan
from rollplex.specs import HardwareSpec, ModelSpec, ScheduleSpec, WorkloadSpec


@cyclic_gc_paused()
def plan_graph(
    graph: Graph,
    model: ModelSpec,
    workload: WorkloadSpec,
    hardware: HardwareSpec,
    schedule: ScheduleSpec,
    cost_model: CostModel | None = None,
    interference: InterferenceModel | None = None,
    enforce_budget: bool = True,
) -> Plan:
    """Plan `graph` under `schedule`. Raises GraphError when the graph fails lint,
    PlanOverBudget when `enforce_budget` and the settled plan does not fit, and PlanError
    when the plan breaks an invariant."""
    lint(graph)  # whatever made it: a planner fed an ill-formed graph plans nonsense
    if schedule.train_micro_fused:
        check_fused(graph)
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
            budget_bytes=hardware.budget_bytes,
            write_back=schedule.write_back,
            offload_in_part=schedule.offload_in_part,
        )

    def fitted_time(p: Plan) -> float:
        # Candidates are scored after residency: one that cannot fit is declined. Its
        # engine pools are marked first, as on the final plan: a static KV workspace is
        # held all step, not only across the decode.
        mark_engine_pools(p, graph, model, workload)
        seconds, fits = settled_time(p, memory(p), ctx.interference)
        return seconds if fits else float("inf")

    # The same score where it needs no lifetimes, else None: for trial plans that are
    # only replayed (rollplex's search).
    fitted_time.unshared = lambda p: unshared_time(p, memory(p), ctx.interference)  # type: ignore[attr-defined]

    plan = SCHEDULES[schedule.name](ctx, evaluate=fitted_time)
    caps = mark_engine_pools(plan, graph, model, workload)
    settle_memory(plan, memory(plan), ctx.interference, closest=True)
    # A pool off the peak (the training backward's saved inputs set it) leaves the
    # headroom where it was: grow again, a few rounds at most.
    for _ in range(POOL_ROUNDS):
        if not grow_engine_pools(plan, caps):
            break
        settle_memory(plan, memory(plan), ctx.interference)
    note = sharing_note(graph, model, schedule.parallel.train_tp, plan.devices)
    if note:
        plan.notes.append(note)
    # The trainer runs the step's forward and backward in exactly the micro-batches sized here.
    plan.meta["train_micro_batches"] = train_micro_batches(
        model, workload, graph, _train_gpus(plan, ctx), schedule.train_micro_tokens
    )
    # The dispatch runs the other forwards in exactly the micro-batches priced here.
    plan.meta["op_micro_batches"] = op_micro_counts(plan, ctx)
    plan.meta["train_micro_recompute"] = schedule.train_micro_recompute
    plan.meta["train_micro_fused"] = schedule.train_micro_fused
    plan.meta["pack_responses"] = schedule.pack_responses
    # a training forward that reads the advantages skips the rows whose are all 0: work the
    # plan prices but the runtime may not run (algo.skip_zero_advantage)
    plan.meta["skip_zero_advantage"] = any(skips_rows(op) for op in graph)
    renumber_in_issue_order(plan)
    if enforce_budget:
        check_budget(plan)
    validate_plan(plan, graph, budget=enforce_budget, graph_hash=ctx.graph_hash)
    return plan


POOL_ROUNDS = 3  # rounds of `grow_engine_pools`: each grows by the headroom left


def _train_gpus(plan: Plan, ctx: PlanningContext) -> int:
    return next((len(d.ranks) for d in plan.devices if d.name != "rollout"), ctx.hardware.num_gpus)


def op_micro_counts(plan: Plan, ctx: PlanningContext) -> dict[str, int]:
    """op -> the micro-batches each rank runs it in, for the forwards the runtime cuts in
    more than one (ops/micro_batches.py): the count the plan priced them at (layout.py
    `OpTimer.op_micro_batches`), on the rollout's or the trainer's ranks."""
    train_gpus = _train_gpus(plan, ctx)
    counts: dict[str, int] = {}
    for dev in plan.devices:
        rollout_gpus = dev.tp * dev.dp  # a rollout op's device holds the rollout's layout
        timer = ctx.timer(rollout_gpus, train_gpus, dev.tp).inner
        for s in dev.steps:
            op = ctx.graph.ops.get(s.op)
            n = timer.op_micro_batches(op, s.chunks) if op is not None else 1
            if n > 1:
                counts[s.op] = n
    return counts


def _sizers(plan: Plan, ctx: PlanningContext) -> dict[str, DeviceSizer]:
    train_gpus = _train_gpus(plan, ctx)
    return {
        d.name: DeviceSizer(
            ctx.graph,
            ctx.model,
            ctx.workload,
            d,
            train_gpus,
            ctx.schedule.train_micro_tokens,
            ctx.schedule.parallel.train_tp,
            # fused or recomputed, the forward step keeps nothing for the backward
            ctx.schedule.train_micro_recompute or ctx.schedule.train_micro_fused,
        )
        for d in plan.devices
    }


def mark_engine_pools(
    plan: Plan, graph: Graph, model: ModelSpec, workload: WorkloadSpec
) -> dict[int, int]:
    """Each `generate` step's engine KV pool, as `pool_bytes` (part of its scratch, which
    the cost model sized at the expected need): the budget the runtime passes to the
    engine (vLLM's kv_cache_memory_bytes). Returns step index -> the pool at which no
    sequence is ever preempted. A torch engine's `decode` steps get its static workspace
    as `pool_bytes` (held all step, never grown)."""
    caps: dict[int, int] = {}
    for dev in plan.devices:
        for s in dev.steps:
            op = graph.ops.get(s.op)
            if s.kind == "generate":
                ctx = CostContext(model, workload, tp=dev.tp, dp=dev.dp * s.chunks)
                s.pool_bytes = int(engine_kv_pool(graph, op, ctx))
                caps[s.index] = int(engine_kv_pool(graph, op, ctx, at_cap=True))
            elif s.kind == "decode" and op is not None and op.meta.get("static_kv"):
                # the torch engine's static workspace: its size is its shape's, not grown
                s.pool_bytes = int(
                    static_kv(graph, op, CostContext(model, workload, tp=dev.tp, dp=dev.dp))
                )
    return caps


def grow_engine_pools(plan: Plan, caps: dict[int, int]) -> bool:
    """Give each engine pool the settled plan's headroom, up to its no-preemption size:
    memory the plan leaves unused at its peak is worth more as KV than as nothing. Growing
    by at most the headroom keeps the peak within the budget. True if any pool grew."""
    grew = False
    for dev in plan.devices:
        headroom = dev.budget_bytes - dev.peak_bytes
        for s in dev.steps:
            extra = min(caps.get(s.index, 0) - s.pool_bytes, headroom)
            if extra > 0:
                s.pool_bytes += extra
                s.scratch_bytes += extra
                headroom -= extra
                grew = True
    return grew
