"""The order in which the executor issues a plan's steps: the plan's own.

Steps go by `Step.index`, within the hard constraints of stream order and events (CUDA runs a
stream in order, and waiting on an unrecorded event passes). Where the indices disagree, the
lowest-index step whose stream predecessor and events are issued goes next, and the
`Deviation` says where and why.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass

from rollplex.planner.plan import Plan, Step


class OrderError(ValueError):
    """The plan's streams and events admit no order (a wait on an event that never fires)."""


@dataclass(slots=True)
class Deviation:
    """A step issued ahead of a lower-index step, because that one had to wait for it."""

    step: Step  # issued early
    behind: Step  # the lowest-index step not yet issued when `step` went
    blockers: list[Step]  # what `behind` still waited for (stream predecessor, events)

    def message(self) -> str:
        why = ", ".join(f"'{b.name}' (index {b.index})" for b in self.blockers)
        return (
            f"issue order: '{self.step.name}' (plan index {self.step.index}) issued before "
            f"'{self.behind.name}' (index {self.behind.index}), which waits for {why} by "
            "stream order or event: the plan's indices contradict its streams and events"
        )


def _preds(plan: Plan, steps: dict[int, Step]) -> dict[int, set[int]]:
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
    return preds


def plan_order(plan: Plan) -> tuple[list[Step], list[Deviation]]:
    """The steps in the order the executor issues them, and where that leaves the plan's
    index order (empty when the plan's indices agree with its streams and events)."""
    steps = {s.index: s for d in plan.devices for s in d.steps}
    if len(steps) != sum(len(d.steps) for d in plan.devices):
        raise OrderError("plan reuses a step index across device groups")
    preds = _preds(plan, steps)
    succ: dict[int, list[int]] = {i: [] for i in steps}
    for i, ps in preds.items():
        for p in ps:
            succ[p].append(i)
    left = {i: len(ps) for i, ps in preds.items()}
    ready = [i for i, n in left.items() if n == 0]
    heapq.heapify(ready)
    by_index, w = sorted(steps), 0  # by_index[w]: the lowest index not issued yet
    issued: set[int] = set()
    out: list[Step] = []
    deviations: list[Deviation] = []
    while ready:
        i = heapq.heappop(ready)
        while by_index[w] in issued:
            w += 1
        if by_index[w] != i:
            behind = by_index[w]
            blockers = sorted(p for p in preds[behind] if p not in issued)
            deviations.append(Deviation(steps[i], steps[behind], [steps[p] for p in blockers]))
        out.append(steps[i])
        issued.add(i)
        for j in succ[i]:
            left[j] -= 1
            if left[j] == 0:
                heapq.heappush(ready, j)
    if len(out) != len(steps):
        stuck = sorted(steps[i].name for i, n in left.items() if n)
        raise OrderError(f"plan has a dependency cycle through {stuck}")
    return out, deviations


def issue_order(plan: Plan) -> list[Step]:
    """`plan_order`'s steps."""
    return plan_order(plan)[0]
