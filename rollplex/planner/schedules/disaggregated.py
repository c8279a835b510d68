"""disaggregated: a rollout pool and a training pool, weights shipped every step.

The step ships last step's weights, rolls out, hands the outputs over, then trains. The
rollout/training split is searched over every sensible rollout TP for the shortest step that
fits, pruned by a lower bound per split; if none fits, the closest is returned with a note.
Cross-pool steps name what moves rank to rank (`Plan.transfers`).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from rollplex.graph.ir import Phase, Value, ValueKind
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
    if not options:
        raise ValueError(f"disaggregated: no rollout pool of {n} GPUs can hold the model")
    score = evaluate or (lambda p: replay(p, ctx.interference))
    bound = SplitBound(ctx, n)
    # (lower bound, whether it is the full bound, split): the training sum is priced only
    # for splits whose other parts leave room under the best step found
    heap = [(bound.partial(r, tp), False, r, tp) for r, tp in options]
    heapq.heapify(heap)
    best: Plan | None = None
    closest: Plan | None = None  # the split nearest to fitting, while none fits
    best_t, planned, plan = float("inf"), 0, None
    while heap:
        low, full, r, tp = heapq.heappop(heap)
        if low >= best_t:
            break  # every split left has a step at least its bound: none beats the best
        if not full:
            heapq.heappush(heap, (bound(r, tp), True, r, tp))
            continue
        plan = _plan_pools(ctx, r, n - r, tp)
        t = score(plan)
        planned += 1
        if t < best_t:
            best, best_t = plan, t
        elif best is None and (
            closest is None or plan.peak_bytes_per_gpu < closest.peak_bytes_per_gpu
        ):
            closest = plan
    searched = f"planned {planned} of {len(options)} splits, the rest bounded out"
    if best is None:
        best = closest or plan
        best.notes.append(
            f"no split fits the budget (planned all {planned}): the closest is shown, "
            f"rollout pool {len(best.devices[0].ranks)} GPUs at TP {best.devices[0].tp}"
        )
        return best
    best.notes.append(
        f"rollout pool {len(best.devices[0].ranks)} GPUs at TP "
        f"{best.devices[0].tp}, training pool {len(best.devices[1].ranks)} GPUs "
        f"({searched})"
    )
    return best


class SplitBound:
    """A lower bound on the step time of split (R rollout GPUs at TP, N-R training GPUs):
    the rollout pool's compute ops back to back, plus the training pool's (each op alone, a
    packed forward at the cheaper of packed and apart), plus the weight sync's and the
    hand-over's least bytes per GPU. Interference and offloads only add to it; a split that
    does not fit scores infinite, so the search stops at the first split whose bound is no
    less than the best score. Pool sums are kept per (TP, rows per rollout replica) and
    per N-R."""

    def __init__(self, ctx: PlanningContext, n: int) -> None:
        g = ctx.graph
        self.ctx, self.n = ctx, n
        self.rollout = [op for op in g if op.phase is Phase.ROLLOUT and op.kind != "weight_sync"]
        self.train = [op for op in g if op.phase is not Phase.ROLLOUT and op.kind != "weight_sync"]
        self.handover = sum(g.values[v].nbytes for v in handover_values(g))
        syncs = [op for op in g if op.kind == "weight_sync"]
        self.synced = [g.values[op.inputs["weights"]].nbytes for op in syncs]
        # the row counts the rollout ops split over their replicas
        self.rows = sorted(
            {
                v.shape[2 if v.kind is ValueKind.KV_CACHE else 0]  # (layers, 2, rows, ...)
                for op in self.rollout
                for v in g.inputs_of(op).values()
                if v.shape and v.kind not in (ValueKind.WEIGHTS, ValueKind.OPTIMIZER_STATE)
            }
        )
        self._roll: dict[tuple, float] = {}
        self._train: dict[int, float] = {}
        self._split: dict[tuple[int, int], float] = {}

    def __call__(self, r: int, tp: int) -> float:
        key = (r, tp)
        out = self._split.get(key)
        if out is None:
            out = self._split[key] = self.partial(r, tp) + self._train_s(r, tp)
        return out

    def partial(self, r: int, tp: int) -> float:
        """The bound less the training pool's sum: cheaper, and no larger."""
        key = (-r, tp)
        out = self._split.get(key)
        if out is None:
            out = self._split[key] = self._roll_s(r, tp) + self._hand_s(r) + self._sync_s(r, tp)
        return out

    def _sync_s(self, r: int, tp: int) -> float:
        cm, gbps = self.ctx.cost_model, self.ctx.hardware.internode_gbps
        return sum(cm.transfer_s(w / tp, gbps) for w in self.synced)

    def _roll_s(self, r: int, tp: int) -> float:
        # A rollout op's price depends on its replica count only through the rows each
        # replica gets (`CostContext.per_rank`): splits whose replicas get the same rows
        # of every rollout input share one pricing (at 2,048 GPUs, ~60 per TP, not ~500).
        replicas = max(1, r // tp)
        key = (tp, *(-(-rows // replicas) for rows in self.rows))
        out = self._roll.get(key)
        if out is None:
            timer = self.ctx.timer(r, self.n - r, tp, colocated=False)
            out = self._roll[key] = sum(timer(op).seconds for op in self.rollout)
        return out

    def _train_s(self, r: int, tp: int) -> float:
        t = self.n - r
        out = self._train.get(t)
        if out is None:
            timer = self.ctx.timer(r, t, tp, colocated=False)
            pairs = self.ctx.pairs
            paired = {resp.name for resp in pairs.values()}
            out = 0.0
            for op in self.train:
                if op.name in paired:
                    continue  # priced with its prefix part
                s = timer(op).seconds
                resp = pairs.get(op.name)
                if resp is not None:  # packed or apart, whichever is cheaper
                    s = min(s + timer(resp).seconds, sum(x.seconds for x in timer.packed(op, resp)))
                out += s
            self._train[t] = out
        return out

    def _hand_s(self, r: int) -> float:
        # every byte leaves one of the R senders and reaches one of the N-R receivers;
        # the routes round each share down, by less than a byte per route (< R + N routes)
        t = self.n - r
        least = max(0.0, self.handover - (r + t)) / max(1, min(r, t))
        return self.ctx.cost_model.transfer_s(least, self.ctx.hardware.internode_gbps)


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
