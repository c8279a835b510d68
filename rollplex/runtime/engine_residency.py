"""What the plan's residency asks of an engine-held rollout, as sleep and wake calls.

An engine frees nothing tensor by tensor, so the plan's effects on its weight copies
(`<weights>@rollout`, freed after the last rollout step, allocated again at the weight sync)
become `sleep(2)` after the free, a weight wake before the sync, and a KV wake before each
`generate`. A plan that holds the copies all step yields no sleep.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rollplex.planner.plan import MemAction, Plan, Step

COPY, NEXT = "@rollout", "@rollout.next"


@dataclass(slots=True, frozen=True)
class EngineAction:
    kind: Literal["sleep", "wake"]
    level: int = 0  # sleep level
    tags: tuple[str, ...] = ()  # what to wake: "weights", "kv_cache"

    def __str__(self) -> str:
        if self.kind == "sleep":
            return f"sleep(level={self.level})"
        return f"wake({','.join(self.tags)})"


SLEEP = EngineAction("sleep", level=2)
WAKE_WEIGHTS = EngineAction("wake", tags=("weights",))
WAKE_KV = EngineAction("wake", tags=("kv_cache",))


@dataclass(slots=True)
class EngineSchedule:
    """Engine actions keyed by position in the executor's issue order."""

    before: dict[int, list[EngineAction]]
    after: dict[int, list[EngineAction]]


def engine_schedule(plan: Plan, order: list[Step]) -> EngineSchedule:
    """The engine actions the plan's effects imply, for steps issued in `order`."""
    pos = {s.index: k for k, s in enumerate(order)}
    before: dict[int, list[EngineAction]] = {}
    after: dict[int, list[EngineAction]] = {}
    for dev in plan.devices:
        gens = [s for s in dev.steps if s.kind == "generate"]
        if not gens:
            continue  # no engine: a torch rollout's copies are aliases
        frees = {e.at for e in dev.effects if e.action is MemAction.FREE and e.value.endswith(COPY)}
        allocs = {
            e.at for e in dev.effects if e.action is MemAction.ALLOC and e.value.endswith(NEXT)
        }
        if not allocs:
            continue  # the copies stay all step: the engine never sleeps
        # all copies leave together, after the last rollout step; one sleep there
        last = max((pos[i] for i in frees if i in pos), default=None)
        if last is not None:
            after.setdefault(last, []).append(SLEEP)
        for i in sorted(allocs):
            if i in pos:
                before.setdefault(pos[i], []).append(WAKE_WEIGHTS)
        for s in gens:
            before.setdefault(pos[s.index], []).append(WAKE_KV)
    return EngineSchedule(before, after)


def engine_kv_budget(plan: Plan) -> int | None:
    """The plan's KV pool for the rollout engine (the largest `generate` step's), or None
    when the plan has no engine rollout."""
    pools = [s.pool_bytes for d in plan.devices for s in d.steps if s.kind == "generate"]
    return max(pools) if pools and max(pools) > 0 else None
