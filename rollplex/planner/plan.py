"""The Plan: plain data the runtime applies and the simulator replays.

One `DevicePlan` per device group (its `ranks` run the same step list on their shards).
Every decision is explicit: op (or chunk) -> stream, the events it waits on, each tensor's
memory slot, the alloc/free/offload/onload actions, and predicted times.
"""

from __future__ import annotations

import functools
from copy import deepcopy
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from pydantic import ConfigDict, TypeAdapter

if TYPE_CHECKING:
    pass


class CoRun(StrEnum):
    """How a step shares its GPU with the decode stream."""

    NONE = "none"  # runs alone, or beside nothing it slows
    STREAMS = "streams"  # plain second stream: time-shares SMs and HBM bandwidth
    PARTITION = "partition"  # its own SM partition (green context)
    PIGGYBACK = "piggyback"  # rows ride a decode step's GEMMs: same weights version only


@dataclass(slots=True)
class Step:
    """One op, or one chunk of an op, on one stream."""

    index: int  # plan-wide, in issue order
    op: str  # graph op name
    kind: str
    phase: str
    stream: int
    chunk: int = 0
    chunks: int = 1
    solo_s: float = 0.0  # predicted time running alone on the device
    start_s: float = 0.0  # predicted, filled by the simulator
    end_s: float = 0.0
    waits: list[int] = field(default_factory=list)  # event ids
    signals: int | None = None  # event id recorded at the end
    corun: CoRun = CoRun.NONE
    weights_version: str | None = None  # what it reads: proves piggybacking safe
    rate_class: str = "compute"  # "bandwidth" (decode) or "compute" or "copy"
    scratch_bytes: int = 0  # transient memory while it runs
    previous_step: bool = False  # carries the previous step's update (disaggregated sync)
    # of scratch_bytes: a pool an engine allocates itself (vLLM's KV cache); the runtime
    # hands the engine this budget, and holds it all step when the engine cannot sleep
    pool_bytes: int = 0
    # offload/onload of optimizer state: the share of its bytes the copy moves (the rest
    # stays resident all step); 1 for every other step
    share: float = 1.0

    @property
    def name(self) -> str:
        return self.op if self.chunks == 1 else f"{self.op}#{self.chunk}/{self.chunks}"


@dataclass(slots=True)
class Event:
    """Recorded when step `step` (a plan-wide index) ends; waited on by later steps,
    possibly on another stream or another device group (a cross-pool transfer)."""

    id: int
    step: int
    device: str
    stream: int


@dataclass(slots=True)
class StreamPlan:
    stream: int
    name: str
    steps: list[int] = field(default_factory=list)  # step indices, in issue order
    partition: float | None = None  # SM fraction, None: whole GPU


class MemAction(StrEnum):
    ALLOC = "alloc"
    FREE = "free"
    OFFLOAD = "offload"
    ONLOAD = "onload"


@dataclass(slots=True)
class MemoryEffect:
    """A memory action taken right before (`alloc`, `onload`) or after (`free`,
    `offload`) step `at`."""

    action: MemAction
    value: str
    at: int
    bytes: int
    lane: int = 0
    offset: int = 0


@dataclass(slots=True)
class Slot:
    value: str
    size: int  # bytes on each GPU of the group
    first: int  # step index that makes it resident
    last: int  # step index after which it is freed
    lane: int
    offset: int
    value_kind: str = ""


@dataclass(slots=True)
class DevicePlan:
    name: str
    ranks: list[int]
    steps: list[Step] = field(default_factory=list)
    streams: list[StreamPlan] = field(default_factory=list)
    slots: list[Slot] = field(default_factory=list)
    effects: list[MemoryEffect] = field(default_factory=list)
    arena_bytes: dict[int, int] = field(default_factory=dict)  # lane -> arena size
    budget_bytes: int = 0
    peak_bytes: int = 0  # predicted: arenas plus what lives outside them
    lower_bound_bytes: int = 0
    tp: int = 1
    dp: int = 1

    def step_by_op(self, op: str) -> list[Step]:
        return [s for s in self.steps if s.op == op]

    def live_at_peak(self) -> list[Slot]:
        """The slots resident at the step where the most slot bytes are live, largest
        first: what an over-budget plan would have to shed."""
        delta: dict[int, int] = {}
        for s in self.slots:
            delta[s.first] = delta.get(s.first, 0) + s.size
            delta[s.last + 1] = delta.get(s.last + 1, 0) - s.size
        live, best, at = 0, -1, 0
        for i in sorted(delta):
            live += delta[i]
            if live > best:
                best, at = live, i
        return sorted(
            (s for s in self.slots if s.first <= at <= s.last), key=lambda s: (-s.size, s.first)
        )


@dataclass(slots=True)
class Route:
    """`nbytes` that GPU `src` sends to GPU `dst` (global ranks, as in `DevicePlan.ranks`)."""

    src: int
    dst: int
    nbytes: int


@dataclass(slots=True)
class Transfer:
    """What one cross-group step (plan-wide index `step`) moves, rank to rank: the weights
    into the rollout pool (from the layout algebra: each rollout rank's TP shard, from
    the training ranks whose FSDP shards hold it), or the rollout's outputs to the
    trainers (rows of the batch, from the replica that made them)."""

    step: int
    what: str  # "weights" or "rollout outputs"
    routes: list[Route] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return sum(r.nbytes for r in self.routes)


@dataclass(slots=True)
class Plan:
    schedule: str
    graph_hash: str
    devices: list[DevicePlan]
    events: list[Event] = field(default_factory=list)
    step_time_s: float = 0.0
    policy_version: str = "policy@0"  # what the update must train on
    notes: list[str] = field(default_factory=list)  # decisions, in words, for the summary
    transfers: list[Transfer] = field(default_factory=list)  # cross-group steps, rank to rank
    meta: dict[str, Any] = field(default_factory=dict)

    def all_steps(self) -> list[Step]:
        return sorted((s for d in self.devices for s in d.steps), key=lambda s: s.index)

    def device_of(self, step: Step) -> DevicePlan:
        for d in self.devices:
            if step in d.steps:
                return d
        raise KeyError(step.name)

    @property
    def peak_bytes_per_gpu(self) -> int:
        return max(d.peak_bytes for d in self.devices)

    @property
    def fits_budget(self) -> bool:
        return all(d.peak_bytes <= d.budget_bytes for d in self.devices)

    def clone(self) -> Plan:
        """An independent copy, as `copy.deepcopy` makes one (every list, dict and record
        new; strings, numbers and enums shared), at a fraction of its cost: the memory settler
        copies a plan before each rule it tries."""
        return replace(
            self,
            devices=[_clone_device(d) for d in self.devices],
            events=[replace(e) for e in self.events],
            notes=list(self.notes),
            transfers=[replace(t, routes=[replace(r) for r in t.routes]) for t in self.transfers],
            meta=deepcopy(self.meta),
        )


def _clone_device(d: DevicePlan) -> DevicePlan:
    return replace(
        d,
        ranks=list(d.ranks),
        steps=[replace(s, waits=list(s.waits)) for s in d.steps],
        streams=[replace(st, steps=list(st.steps)) for st in d.streams],
        slots=[replace(sl) for sl in d.slots],
        effects=[replace(e) for e in d.effects],
        arena_bytes=dict(d.arena_bytes),
    )


# plan.json is read strictly: an unknown field (a typo, a newer format) or a NaN is refused.
_STRICT = ConfigDict(extra="forbid", allow_inf_nan=False)
for _record in (Step, Event, StreamPlan, MemoryEffect, Slot, DevicePlan, Route, Transfer, Plan):
    _record.__pydantic_config__ = _STRICT  # type: ignore[attr-defined]


@functools.cache
def plan_adapter() -> TypeAdapter[Plan]:
    return TypeAdapter(Plan)


def dump_plan(plan: Plan, indent: int | None = 1) -> str:
    """The plan as JSON (`plan.json`); `load_plan` gives back an equal Plan."""
    return plan_adapter().dump_json(plan, indent=indent).decode()
