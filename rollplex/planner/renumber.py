"""Step indices in issue order: the last pass of planning.

Residency appends its copy steps after every scheduled step, though earlier steps wait on
them. This renumbers every step along one order that respects each stream's order and every
event wait (scheduled steps keep their order, a copy goes right after what it waits for),
and every reference to a step index follows.
"""

from __future__ import annotations

import heapq

from rollplex.planner.plan import Plan


def renumber_in_issue_order(plan: Plan) -> None:
    steps = {s.index: s for d in plan.devices for s in d.steps}
    event_step = {e.id: e.step for e in plan.events}
    before: dict[int, set[int]] = {i: set() for i in steps}
    for d in plan.devices:
        for st in d.streams:
            for a, b in zip(st.steps, st.steps[1:], strict=False):
                before[b].add(a)
    for s in steps.values():
        for ev in s.waits:
            if event_step[ev] != s.index:
                before[s.index].add(event_step[ev])
    after: dict[int, list[int]] = {i: [] for i in steps}
    for i, deps in before.items():
        for j in deps:
            after[j].append(i)
    key = _keys(steps, before)
    pending = {i: len(deps) for i, deps in before.items()}
    ready = [(key[i], i) for i, n in pending.items() if n == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        _, i = heapq.heappop(ready)
        order.append(i)
        for j in after[i]:
            pending[j] -= 1
            if pending[j] == 0:
                heapq.heappush(ready, (key[j], j))
    if len(order) != len(steps):
        return  # a cycle: leave the numbering to validate_plan, which names it
    new = {old: k for k, old in enumerate(order)}
    if all(old == k for old, k in new.items()):
        return
    for s in steps.values():
        s.index = new[s.index]
    for e in plan.events:
        e.step = new[e.step]
    for d in plan.devices:
        d.steps.sort(key=lambda s: s.index)
        for st in d.streams:
            st.steps = [new[i] for i in st.steps]
        for sl in d.slots:
            sl.first, sl.last = new[sl.first], new[sl.last]
        for eff in d.effects:
            eff.at = new[eff.at]
    for t in getattr(plan, "transfers", ()):
        t.step = new[t.step]


def _keys(steps, before) -> dict[int, float]:
    """Issue priority: the old index; a copy's, just after the step it waits for, where the
    plan starts it, else (it waits for nothing: planned at the step's start) before every
    step. Issued on its own stream a copy costs the host nothing, while a step the host
    drives to its end (the decode, the vision encode) holds back every step numbered after
    it: an onload numbered just before its reader, after the decode it was planned beside,
    ran after it instead (bench/results/gpu_step/README.md), and a write-back at the step's
    start numbered just before the prefill that waits for it ran after the vision encode
    (run 31)."""
    key: dict[int, float] = {}
    for i, s in steps.items():
        anchors = [j for j in before[i] if steps[j].stream != s.stream]
        if s.kind not in ("offload", "onload"):
            key[i] = float(i)
        elif anchors:
            key[i] = max(anchors) + 0.5
        else:
            key[i] = -0.5
    return key
