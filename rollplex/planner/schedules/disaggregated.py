"""disaggregated: a rollout pool and a training pool, weights shipped every step.

The GPUs split into R for rollout and N-R for reference, training and update. Being
synchronous and on-policy, each pool waits for the other: the rollout needs this step's
weights, the trainer needs this step's rollouts. The step begins with the transfer of the
weights the previous step produced (the graph's `weight_sync`, across the network), then
the rollout, the hand-over of its outputs, and the training phases. R is searched over
multiples of every sensible rollout TP degree for the shortest predicted step, so the
baseline is as strong as the cost model can make it.

Both cross-pool steps say rank to rank what they move (`Plan.transfers`, from
planner/transfers.py: the weights from the layout algebra, each rollout rank's TP shard
from the training ranks whose FSDP shards hold it; the outputs by rows), and take as long
as the busiest GPU's sends or receives over the network.
"""

from __future__ import annotations

from collections.abc import Callable

from rollplex.graph.ir import Phase, Value
from rollplex.planner.placement import PlanBuilder
from rollplex.planner.plan import DevicePlan, Plan, Route, Transfer
from rollplex.planner.schedules.common import (
    PlanningContext,
    ordered,
    packed_notes,
    packed_order,
    serial_timings,
)
from rollplex.planner.shared_weights import towers_of
from rollplex.planner.simulate import replay
from rollplex.planner.transfers import (
    busiest_bytes,
    handover_values,
    output_routes,
    weight_bytes,
    weight_routes,
)


def plan_disaggregated(
    ctx: PlanningContext, evaluate: Callable[[Plan], float] | None = None
) -> Plan:
    """`evaluate` scores a candidate split (default: replayed step time); the API's also
    settles memory and rejects splits whose pools cannot hold their state."""
    n = ctx.hardware.num_gpus
    if n < 2:
        raise ValueError(
            f"schedule=disaggregated needs at least 2 GPUs; hardware "
            f"'{ctx.hardware.name}' has num_gpus={n}"
        )
    fixed = ctx.schedule.rollout_gpus
    if fixed is not None and not 1 <= fixed < n:
        raise ValueError(f"schedule.rollout_gpus={fixed} must leave GPUs for training (1..{n - 1})")
    options = _pool_layouts(ctx, n, fixed)
    best: Plan | None = None
    score = evaluate or (lambda p: replay(p, ctx.interference))
    best_t = float("inf")
    for r, tp in options:
        plan = _plan_pools(ctx, r, n - r, tp)
        t = score(plan)
        if best is None or t < best_t:
            best, best_t = plan, t
    if best is None:
        raise ValueError(f"disaggregated: no rollout pool of {n} GPUs can hold the model")
    best.notes.append(
        f"rollout pool {len(best.devices[0].ranks)} GPUs at TP "
        f"{best.devices[0].tp}, training pool {len(best.devices[1].ranks)} GPUs "
        f"(searched {len(options)} splits)"
    )
    return best


def _pool_layouts(ctx: PlanningContext, n: int, fixed: int | None) -> list[tuple[int, int]]:
    """(rollout GPUs, rollout TP) pairs: every split and every TP whose shard fits."""
    weights = ctx.model.param_count() * ctx.model.dtype_bytes
    pinned = ctx.schedule.parallel.rollout_tp
    out = []
    for r in [fixed] if fixed else range(1, n):
        tps = [pinned] if pinned else [t for t in (1, 2, 4, 8) if t <= ctx.hardware.gpus_per_node]
        out += [(r, t) for t in tps if r % t == 0 and weights / t <= 0.5 * ctx.hardware.hbm_bytes]
    return out


def _plan_pools(ctx: PlanningContext, r: int, t: int, tp: int) -> Plan:
    timer = ctx.timer(r, t, tp, colocated=False)
    pb = PlanBuilder("disaggregated", ctx.graph, ctx.graph_hash)
    roll = pb.device("rollout", list(range(r)), tp=timer.rollout.tp, dp=timer.rollout.dp)
    train = pb.device("train", list(range(r, r + t)), tp=timer.train.tp, dp=timer.train.dp)
    for dev in (roll, train):
        pb.stream(dev, "compute")
        pb.stream(dev, "copy")
    order = ordered(ctx, timer)
    sync_ops = [op for op in order if op.kind == "weight_sync"]
    sync_steps = []
    for op in sync_ops:  # the previous step's update arrives first
        routes = _weight_routes(ctx, ctx.graph.values[op.inputs["weights"]], roll, train)
        if routes is None:  # the algebra does not answer: whole TP shards, unrouted
            s = timer.inner.sync_time(op, cross_pool=True).seconds
        else:
            s = ctx.cost_model.transfer_s(busiest_bytes(routes), ctx.hardware.internode_gbps)
        step = pb.add(roll, 1, op, s, "copy", previous_step=True)
        sync_steps.append(step)
        if routes is not None:
            pb.plan.transfers.append(Transfer(step.index, "weights", routes))
    handed = False
    order, packed = packed_order(ctx, order)
    timings = serial_timings(timer, order, packed)
    for op in order:
        if op.kind == "weight_sync":
            continue
        if op.phase is Phase.ROLLOUT:
            t_op = timer(op)
            pb.add(
                roll,
                0,
                op,
                t_op.seconds,
                t_op.rate_class,
                after=sync_steps,
                scratch_bytes=t_op.scratch_bytes,
            )
            continue
        if not handed:  # rollout outputs cross the network to the trainers
            handed = True
            _hand_over(ctx, pb, roll, train, timer)
        t_op = timings.get(op.name) or timer(op)
        pb.add(
            train,
            0,
            op,
            t_op.seconds,
            t_op.rate_class,
            after=pb.steps_of("rollout.handover"),
            scratch_bytes=t_op.scratch_bytes,
        )
    pb.plan.notes += packed_notes(packed)
    return pb.plan


def _weight_routes(
    ctx: PlanningContext, w: Value, roll: DevicePlan, train: DevicePlan
) -> list[Route] | None:
    towers = towers_of(ctx.model, w)
    mats = weight_bytes(ctx.model, towers, len(train.ranks), train.tp, roll.tp) if towers else None
    return None if mats is None else weight_routes(mats, train.ranks, roll.ranks, roll.tp)


def _hand_over(ctx, pb: PlanBuilder, roll, train, timer) -> None:
    g = ctx.graph
    made = [op for op in g if op.phase is Phase.ROLLOUT]
    routes = output_routes(
        sum(g.values[v].nbytes for v in handover_values(g)), roll.ranks, roll.tp, train.ranks
    )
    seconds = timer.inner.cost_model.transfer_s(busiest_bytes(routes), ctx.hardware.internode_gbps)
    last = [s for op in made for s in pb.steps_of(op.name)]
    anchor = made[-1]
    step = pb.add(train, 1, anchor, seconds, "copy", after=last, op_name="rollout.handover")
    step.kind = "transfer"
    pb.plan.transfers.append(Transfer(step.index, "rollout outputs", routes))
