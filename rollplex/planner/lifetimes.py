"""Lifetimes: one `UsageRecord` per tensor a device group holds, from the timed plan.

Positions are the device's steps sorted by predicted start. A value lives from the step
that makes it to the last step that reads it; what must survive into the next RL step
(weights, optimizer state, the rollout's weight copy) lives to the end. Sizes are per GPU:
- trained weights, frozen weights, gradients and optimizer state are FSDP-sharded over the
  training GPUs; a role that rolls out also holds a tensor-parallel copy of the weights it
  decodes with, dropped after its last rollout use and rebuilt by `weight_sync` (this is
  the phase-aware part: nothing keeps it through training);
- rows split over the data-parallel ranks, KV heads over TP;
- training activations are live one micro-batch at a time, except boundaries produced
  in the decode window, which wait whole for the backward;
- response-length axes count the expected length, not the padded maximum;
- every step adds its own scratch for its duration.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rollplex.graph.ir import Graph, Phase, Value, ValueKind
from rollplex.ops.formulas import kv_fraction
from rollplex.planner.memory.records import UsageRecord
from rollplex.planner.plan import CoRun, DevicePlan, Step
from rollplex.specs import ModelSpec, WorkloadSpec

PERSISTENT = (ValueKind.WEIGHTS, ValueKind.OPTIMIZER_STATE)


@dataclass(slots=True)
class Lifetime:
    """A record and what it stands for."""

    record: UsageRecord
    value: str
    kind: str  # value kind, or "rollout_weights" / "scratch"
    first_step: int  # plan-wide step index
    last_step: int


@dataclass(slots=True)
class DeviceSizer:
    graph: Graph
    model: ModelSpec
    workload: WorkloadSpec
    dev: DevicePlan
    train_gpus: int
    micro_tokens: int

    def micro_batches(self) -> int:
        samples = self.workload.samples_per_step / max(1, self.train_gpus)
        tokens = samples * (
            self.workload.prefix_tokens(self.model.vision) + self.workload.response_length.mean
        )
        return max(1, math.ceil(tokens / self.micro_tokens))

    def value_bytes(self, v: Value, producer_phase: Phase | None, overlapped: bool) -> int:
        if v.kind in PERSISTENT or v.kind is ValueKind.GRAD:
            return math.ceil(v.nbytes / self.train_gpus)
        rollout = producer_phase is Phase.ROLLOUT or (
            producer_phase is None and self.dev.name == "rollout"
        )
        dp = self.dev.dp if rollout else self.train_gpus
        size = v.nbytes / dp
        if v.kind is ValueKind.KV_CACHE and rollout:
            size *= kv_fraction(self.model.num_kv_heads, self.dev.tp)  # heads per TP rank
        if self._has_response_axis(v):
            size *= self.workload.response_length.mean / self.workload.response_length.max
        rowwise = len(v.shape) >= 2
        if not rollout and rowwise and not overlapped and v.kind is not ValueKind.HOST_DATA:
            size /= self.micro_batches()
        return math.ceil(size)

    def _has_response_axis(self, v: Value) -> bool:
        r = self.workload.response_length.max
        return v.kind is ValueKind.ACTIVATION and len(v.shape) >= 2 and r in v.shape[1:3]


def device_lifetimes(
    graph: Graph, dev: DevicePlan, sizer: DeviceSizer, rollout_tp_copy: bool
) -> list[Lifetime]:
    """Every tensor the device group holds over one step, as lifetimes."""
    trained = {op.inputs["weights"] for op in graph.ops.values() if op.kind == "optimizer_step"}
    steps = sorted(dev.steps, key=lambda s: (s.start_s, s.index))
    # Positions are the distinct instants at which any step starts or ends; a value read
    # by step c is live over [producer start, c end), so records that share a position
    # really coexist in time, across streams too.
    times = sorted({t for s in steps for t in (s.start_s, s.end_s)})
    at = {t: i for i, t in enumerate(times)}
    end = max(0, len(times) - 2)

    def begin(step: Step) -> int:
        return min(at[step.start_s], end)

    def until(step: Step) -> int:
        return max(begin(step), at[step.end_s] - 1)

    syncs = [s for s in steps if s.kind == "weight_sync"]
    made: dict[str, list[Step]] = {}
    used: dict[str, list[Step]] = {}
    for s in steps:
        op = graph.ops.get(s.op)
        if op is None or s.kind == "transfer":
            continue
        for v in op.outputs.values():
            made.setdefault(v, []).append(s)
        for v in op.inputs.values():
            used.setdefault(v, []).append(s)
    out: list[Lifetime] = []
    for name in dict.fromkeys([*made, *used]):
        v = graph.values[name]
        producers, consumers = made.get(name, []), used.get(name, [])
        if v.kind in PERSISTENT and name in made:
            continue  # optimizer outputs update the same storage in place
        if consumers and all(s.previous_step for s in consumers) and not producers:
            continue  # lands in a buffer counted where it is used
        if v.kind in PERSISTENT:
            first, last = 0, end
        else:
            first = min(begin(s) for s in (producers or consumers))
            last = max(until(s) for s in consumers) if consumers else until(producers[0])
        if v.kind is ValueKind.WEIGHTS and name in made:
            continue
        if v.kind is ValueKind.WEIGHTS and dev.name == "rollout":
            # A rollout pool holds only its TP copy; the weight sync writes into it.
            if any(s.phase == Phase.ROLLOUT.value for s in consumers):
                out.append(
                    _life(
                        f"{name}@rollout",
                        "rollout_weights",
                        math.ceil(v.nbytes / dev.tp),
                        0,
                        end,
                        0,
                        steps[0],
                        steps[-1],
                    )
                )
            continue
        phase = Phase(producers[0].phase) if producers else None
        overlapped = any(s.corun is not CoRun.NONE for s in producers)
        size = sizer.value_bytes(v, phase, overlapped)
        lane = producers[0].stream if producers else 0
        first_step = (producers or consumers)[0]
        last_step = max(consumers, key=lambda c: c.end_s) if consumers else producers[-1]
        if v.kind in PERSISTENT:
            first_step, last_step = steps[0], steps[-1]
        out.append(_life(name, v.kind.value, size, first, last, lane, first_step, last_step))
        if v.kind is ValueKind.WEIGHTS and rollout_tp_copy:
            out += _rollout_copy(
                v, consumers, until, begin, end, steps, syncs, dev, name in trained
            )
    for s in steps:
        if s.scratch_bytes:
            out.append(
                _life(
                    f"{s.name}.scratch",
                    "scratch",
                    s.scratch_bytes,
                    begin(s),
                    until(s),
                    s.stream,
                    s,
                    s,
                )
            )
    return out


def _rollout_copy(
    v: Value,
    consumers: list[Step],
    until,
    begin,
    end: int,
    steps: list[Step],
    syncs: list[Step],
    dev: DevicePlan,
    trained: bool,
) -> list[Lifetime]:
    """The TP-layout copy rollout decodes with. Of trained weights: live until its last
    rollout use, then rebuilt by the weight sync for the next step. Frozen: kept."""
    roll = [s for s in consumers if s.phase == Phase.ROLLOUT.value]
    if not roll:
        return []
    size = math.ceil(v.nbytes / dev.tp)
    if dev.name == "rollout" or not syncs or not trained:
        return [_life(f"{v.name}@rollout", "rollout_weights", size, 0, end, 0, steps[0], steps[-1])]
    last_roll = max(roll, key=lambda s: s.end_s)
    return [
        _life(
            f"{v.name}@rollout",
            "rollout_weights",
            size,
            0,
            until(last_roll),
            0,
            steps[0],
            last_roll,
        ),
        _life(
            f"{v.name}@rollout.next",
            "rollout_weights",
            size,
            begin(syncs[0]),
            end,
            0,
            syncs[0],
            steps[-1],
        ),
    ]


def _life(
    name: str,
    kind: str,
    size: int,
    first: int,
    last: int,
    lane: int,
    first_step: Step,
    last_step: Step,
) -> Lifetime:
    return Lifetime(
        UsageRecord(size=int(size), first=first, last=last, lane=lane, name=name),
        name,
        kind,
        first_step.index,
        last_step.index,
    )
