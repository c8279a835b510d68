"""What the plan's residency asks of an engine-held rollout, as sleep and wake calls.

When the rollout engine can sleep (vLLM level 2), the planner frees the engine's weight
copies (`<weights>@rollout`) after the last rollout step, allocates them again
(`<weights>@rollout.next`) at the weight sync, and holds each `generate` step's KV pool
only while it runs (planner/lifetimes.py). An engine frees nothing tensor by tensor; it
sleeps and wakes, so the plan's effects become:
- after the step where its copies are freed: `sleep(2)` (weights and KV dropped; the
  weight sync reloads every weight, frozen ones too);
- before the step that allocates them again (the weight sync): wake the weights;
- before a `generate` step: wake the KV cache (a no-op while it is awake).
A plan that holds the copies all step (an engine that cannot sleep, a rollout pool of its
own) yields no sleep, and waking an engine that is awake does nothing.
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
