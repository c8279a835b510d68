"""What every schedule needs: the graph, the specs, the cost and interference models."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from rollplex.graph.ir import Graph, Op
from rollplex.graph.serialize import stable_hash
from rollplex.ops.costs import cost_key
from rollplex.planner.cost_model import CostModel, Timing
from rollplex.planner.interference import InterferenceModel
from rollplex.planner.layout import OpTimer, RoleLayout, default_rollout_tp
from rollplex.planner.order import priority_order
from rollplex.planner.placement import PlanBuilder
from rollplex.planner.plan import DevicePlan
from rollplex.specs import HardwareSpec, ModelSpec, ScheduleSpec, WorkloadSpec


@dataclass(slots=True)
class PlanningContext:
    graph: Graph  # after the schedule's passes
    model: ModelSpec
    workload: WorkloadSpec
    hardware: HardwareSpec
    schedule: ScheduleSpec
    cost_model: CostModel
    interference: InterferenceModel = field(default_factory=InterferenceModel)
    _hash: str | None = None
    _pairs: dict[str, Op] | None = None

    @property
    def pairs(self) -> dict[str, Op]:
        """logprob_prefix name -> the one logprob_response that reads its K/V with the same
        weights: the two parts of one forward, which can run as one packed forward."""
        if self._pairs is None:
            self._pairs = forward_pairs(self.graph)
        return self._pairs

    @property
    def graph_hash(self) -> str:
        if self._hash is None:
            self._hash = stable_hash(self.graph)
        return self._hash

    def rollout_tp(self, gpus: int) -> int:
        tp = self.schedule.parallel.rollout_tp
        if tp is None:
            tp = default_rollout_tp(self.model, self.hardware, gpus)
        if gpus % tp:
            raise ValueError(f"schedule.parallel.rollout_tp={tp} does not divide {gpus} GPUs")
        return tp

    def timer(
        self, rollout_gpus: int, train_gpus: int, tp: int | None = None, colocated: bool = True
    ) -> CachedTimer:
        return CachedTimer(
            OpTimer(
                self.graph,
                self.model,
                self.workload,
                self.hardware,
                self.cost_model,
                rollout=RoleLayout(rollout_gpus, tp or self.rollout_tp(rollout_gpus)),
                train=RoleLayout(train_gpus, self.schedule.parallel.train_tp),
                micro_tokens=self.schedule.train_micro_tokens,
                colocated=colocated,
                micro_recompute=self.schedule.train_micro_recompute,
                micro_fused=self.schedule.train_micro_fused,
                packed_responses=self.schedule.pack_responses,
            )
        )


@dataclass(slots=True)
class CachedTimer:
    """Each (op, chunks) is priced once per plan attempt, and ops that read the same shapes
    the same way (equal `cost_key`: the K copies of one step) share one pricing."""

    inner: OpTimer
    _cache: dict[tuple[str, int], Timing] = field(default_factory=dict)
    _by_key: dict[tuple, Timing] = field(default_factory=dict)
    _packed: dict[tuple[str, str], tuple[Timing, Timing]] = field(default_factory=dict)
    _packed_by_key: dict[tuple, tuple[Timing, Timing]] = field(default_factory=dict)

    def __call__(self, op: Op, chunks: int = 1) -> Timing:
        timing = self._cache.get((op.name, chunks))
        if timing is None:
            key = (cost_key(self.inner.graph, op), chunks)
            timing = self._by_key.get(key)
            if timing is None:
                timing = self._by_key[key] = self.inner.time(op, chunks)
            self._cache[(op.name, chunks)] = timing
        return timing

    def packed(self, prefix: Op, response: Op) -> tuple[Timing, Timing]:
        key = (prefix.name, response.name)
        pair = self._packed.get(key)
        if pair is None:
            g = self.inner.graph
            shape = (cost_key(g, prefix), cost_key(g, response))
            pair = self._packed_by_key.get(shape)
            if pair is None:
                pair = self._packed_by_key[shape] = self.inner.packed(prefix, response)
            self._packed[key] = pair
        return pair

    @property
    def rollout(self) -> RoleLayout:
        return self.inner.rollout

    @property
    def train(self) -> RoleLayout:
        return self.inner.train


def colocated(
    ctx: PlanningContext, schedule: str, timer: CachedTimer | None = None
) -> tuple[PlanBuilder, DevicePlan, CachedTimer]:
    """One device group holding every role; streams: compute (0), copy (1)."""
    n = ctx.hardware.num_gpus
    timer = timer or ctx.timer(n, n)
    pb = PlanBuilder(schedule, ctx.graph, ctx.graph_hash)
    dev = pb.device("colocated", list(range(n)), tp=timer.rollout.tp, dp=timer.rollout.dp)
    pb.stream(dev, "compute")
    pb.stream(dev, "copy")
    return pb, dev, timer


def ordered(ctx: PlanningContext, timer: CachedTimer) -> list[Op]:
    return priority_order(ctx.graph, lambda op: timer(op).seconds)


def forward_pairs(graph: Graph) -> dict[str, Op]:
    readers: dict[str, int] = {}
    for op in graph:
        for v in op.inputs.values():
            readers[v] = readers.get(v, 0) + 1
    pairs = {}
    for op in graph:
        if op.kind != "logprob_response":
            continue
        prefix = graph.producer(op.inputs["kv"])
        if (
            prefix is not None
            and prefix.kind == "logprob_prefix"
            and readers[op.inputs["kv"]] == 1
            and prefix.inputs.get("weights") == op.inputs.get("weights")
        ):
            pairs[prefix.name] = op
    return pairs


def packed_order(
    ctx: PlanningContext, order: list[Op], apart: Collection[str] = ()
) -> tuple[list[Op], dict[str, Op]]:
    """`order` with each response part moved up to run right after its prefix part, as one
    packed forward (one FSDP gather for both), unless the prefix is placed `apart` (moved
    into the decode window) or the response needs something made after the prefix.
    Returns the order and the packed pairs (prefix name -> response op)."""
    pairs = ctx.pairs
    if not pairs:
        return order, {}
    made = ctx.graph.producers()
    pos = {op.name: i for i, op in enumerate(order)}
    packed: dict[str, Op] = {}
    for name, resp in pairs.items():
        if name in apart or resp.name in apart or name not in pos or resp.name not in pos:
            continue
        here = pos[name]
        if all(
            (src := made.get(v)) is None or src.name == name or pos.get(src.name, here) < here
            for v in resp.inputs.values()
        ):
            packed[name] = resp
    if not packed:
        return order, {}
    moved = {resp.name for resp in packed.values()}
    out: list[Op] = []
    for op in order:
        if op.name in moved:
            continue
        out.append(op)
        if op.name in packed:
            out.append(packed[op.name])
    return out, packed


def packed_notes(packed: dict[str, Op]) -> list[str]:
    return [
        f"{resp.phase}: {name} + {resp.name} as one packed forward (one weight gather)"
        for name, resp in packed.items()
    ]


def serial_timings(timer: CachedTimer, order: list[Op], packed: dict[str, Op]) -> dict[str, Timing]:
    """Solo timing of each op placed in `order`: packed pairs share one gather."""
    out: dict[str, Timing] = {}
    for name, resp in packed.items():
        out[name], out[resp.name] = timer.packed(timer.inner.graph.ops[name], resp)
    return out
