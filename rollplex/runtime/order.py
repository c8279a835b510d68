"""The one order in which the executor issues a plan's steps.

A step may be issued once the step before it on its stream and the steps that record the
events it waits for have been issued. Among the steps that may go, the one the plan
predicts to start first goes first (ties: the lower plan-wide index). On CPU this order
*is* the execution, one step at a time; on CUDA it is the launch order, and since every
event is recorded before any wait on it is issued, a `wait_event` never sees an unrecorded
event (which CUDA would treat as already complete).
"""

from __future__ import annotations

import heapq
import itertools

from rollplex.planner.plan import Plan, Step


class OrderError(ValueError):
    """The plan's streams and events admit no order (a wait on an event that never fires)."""


def issue_order(plan: Plan) -> list[Step]:
    steps = {s.index: s for d in plan.devices for s in d.steps}
    if len(steps) != sum(len(d.steps) for d in plan.devices):
        raise OrderError("plan reuses a step index across device groups")
    event_step = {e.id: e.step for e in plan.events}
    preds: dict[int, set[int]] = {i: set() for i in steps}
    for d in plan.devices:
        for st in d.streams:
            for a, b in itertools.pairwise(st.steps):
                preds[b].add(a)
    for s in steps.values():
        for e in s.waits:
            if e not in event_step:
                raise OrderError(f"step '{s.name}' waits for event {e}, which no step records")
            if event_step[e] != s.index:
                preds[s.index].add(event_step[e])
    succ: dict[int, list[int]] = {i: [] for i in steps}
    for i, ps in preds.items():
        for p in ps:
            succ[p].append(i)
    left = {i: len(ps) for i, ps in preds.items()}
    ready = [(steps[i].start_s, i) for i, n in left.items() if n == 0]
    heapq.heapify(ready)
    out: list[Step] = []
    while ready:
        _, i = heapq.heappop(ready)
        out.append(steps[i])
        for j in succ[i]:
            left[j] -= 1
            if left[j] == 0:
                heapq.heappush(ready, (steps[j].start_s, j))
    if len(out) != len(steps):
        stuck = sorted(steps[i].name for i, n in left.items() if n)
        raise OrderError(f"plan has a dependency cycle through {stuck}")
    return out
