"""validate_plan: the invariants a plan must hold before anything runs it.

References resolve (`plan_refs`); no two live slots of one arena overlap; every step follows
its producers through stream order or an event; peaks fit the budget; on-policy weight
versions; weight transfers before the rollout reads them; transfers route between groups.
Each failure raises `PlanError` naming the step, slot or device at fault.
"""

from __future__ import annotations

import bisect
import heapq

from pydantic import ValidationError

from rollplex.graph.ir import Graph, version_model
from rollplex.planner.plan import DevicePlan, Event, Plan, Slot, Step, plan_adapter
from rollplex.planner.plan_refs import COPY_KINDS, PlanError, check_references

__all__ = ["PlanError", "load_plan", "validate_plan"]


def validate_plan(
    plan: Plan, graph: Graph | None, budget: bool = True, graph_hash: str | None = None
) -> Plan:
    """Raise PlanError on the first broken invariant (`budget=False` skips rule 3).
    Without a graph only what the plan holds by itself is checked (rules 0-3 less the
    graph's names and the producers); `graph_hash`: the graph's, if already known."""
    check_references(plan, graph, graph_hash)
    steps = {s.index: s for d in plan.devices for s in d.steps}
    if graph is None:
        for dev in plan.devices:
            _check_slots(dev, steps)
            _check_budget(dev, budget)
        return plan
    events = {e.id: e for e in plan.events}
    made = _producer_steps(graph, steps)
    for dev in plan.devices:
        _check_slots(dev, steps)
        _check_order(dev, graph, made, events)
        _check_budget(dev, budget)
    _check_policy(plan, graph, steps)
    if plan.schedule == "disaggregated":
        _check_transfer_first(plan, graph, steps, events)
    _check_routes(plan, steps)
    return plan


def _check_budget(dev: DevicePlan, budget: bool) -> None:
    if budget and dev.peak_bytes > dev.budget_bytes:
        raise PlanError(
            f"device '{dev.name}': predicted peak {dev.peak_bytes} B exceeds "
            f"the budget {dev.budget_bytes} B by "
            f"{dev.peak_bytes - dev.budget_bytes} B"
        )


def _check_routes(plan: Plan, steps: dict[int, Step]) -> None:
    group = {r: d.name for d in plan.devices for r in d.ranks}
    for t in plan.transfers:
        if t.step not in steps:
            raise PlanError(f"transfer of {t.what}: step {t.step} is not in the plan")
        for r in t.routes:
            src, dst = group.get(r.src), group.get(r.dst)
            if src is None or dst is None or src == dst or r.nbytes <= 0:
                raise PlanError(
                    f"transfer of {t.what} at '{steps[t.step].name}': route {r.src} -> "
                    f"{r.dst} ({r.nbytes} B) must move bytes between ranks of two groups"
                )


_COPIES = COPY_KINDS


def _check_slots(dev: DevicePlan, steps: dict[int, Step]) -> None:
    """Sweep each lane in time, keeping the live slots sorted by offset: live slots never
    overlap each other (or we would have stopped), so a new slot can only collide with
    its neighbours by offset. O(n log n) for n slots."""
    by_lane: dict[int, list[tuple[float, float, int, int, int]]] = {}
    for k, s in enumerate(dev.slots):
        if s.size:  # k breaks ties: equal lifetimes keep their order
            item = (steps[s.first].start_s, steps[s.last].end_s, k, s.offset, s.offset + s.size)
            by_lane.setdefault(s.lane, []).append(item)
    for lane, slots in by_lane.items():
        slots.sort()
        expiry: list[tuple[float, int, int]] = []  # heap of (end, offset, k)
        live: list[tuple[int, int, int]] = []  # (offset, k, end byte), sorted
        for start, end, k, lo, hi in slots:
            while expiry and expiry[0][0] <= start:
                _, offset, gone = heapq.heappop(expiry)
                del live[bisect.bisect_left(live, (offset, gone))]
            if end <= start:
                continue  # a zero-length stretch holds nothing
            j = bisect.bisect_left(live, (lo, k))
            if j and live[j - 1][2] > lo:  # the one below reaches into it
                _overlap_error(dev, lane, dev.slots[live[j - 1][1]], dev.slots[k])
            if j < len(live) and live[j][0] < hi:  # it reaches into the one above
                _overlap_error(dev, lane, dev.slots[live[j][1]], dev.slots[k])
            live.insert(j, (lo, k, hi))
            heapq.heappush(expiry, (end, lo, k))


def _overlap_error(dev: DevicePlan, lane: int, a: Slot, s: Slot) -> None:
    raise PlanError(
        f"device '{dev.name}' lane {lane}: slots '{a.value}' "
        f"[{a.offset}, {a.offset + a.size}) and '{s.value}' "
        f"[{s.offset}, {s.offset + s.size}) overlap while both are live"
    )


def _producer_steps(graph: Graph, steps: dict[int, Step]) -> dict[str, list[Step]]:
    """value -> the steps that compute it (copies move values, they do not make them)."""
    made: dict[str, list[Step]] = {}
    for s in steps.values():
        if (op := graph.ops.get(s.op)) is not None and s.kind not in _COPIES:
            for v in op.outputs.values():
                made.setdefault(v, []).append(s)
    return made


def _check_order(
    dev: DevicePlan, graph: Graph, made: dict[str, list[Step]], events: dict[int, Event]
) -> None:
    stream_pos = {i: (st.stream, k) for st in dev.streams for k, i in enumerate(st.steps)}
    ops = graph.ops
    for s in dev.steps:
        op = ops.get(s.op)
        if op is None or s.previous_step or s.kind in _COPIES:
            continue
        here = stream_pos.get(s.index)
        waited: set[int] | None = None  # built only if some producer is on another stream
        for v in op.inputs.values():
            for p in made.get(v, ()):
                if p.op == s.op:
                    continue
                at = stream_pos.get(p.index)
                if at is None or at[0] != s.stream or here is None or at[1] >= here[1]:
                    if waited is None:
                        waited = {events[e].step for e in s.waits if e in events}
                    if p.index not in waited:
                        raise PlanError(
                            f"step '{s.name}' reads '{v}' from step '{p.name}' on "
                            f"another stream without waiting for its event"
                        )
                if p.end_s > s.start_s + 1e-12:
                    raise PlanError(
                        f"step '{s.name}' starts at {s.start_s:.6f}s before its "
                        f"producer '{p.name}' ends at {p.end_s:.6f}s"
                    )


def _check_policy(plan: Plan, graph: Graph, steps: dict[int, Step]) -> None:
    trained = {
        graph.values[op.inputs["weights"]].version
        for op in graph.ops.values()
        if op.kind == "optimizer_step"
    }
    models = {version_model(v) for v in trained}
    if trained and plan.policy_version not in trained:
        raise PlanError(
            f"plan: policy_version {plan.policy_version!r} is not what the update trains "
            f"({sorted(trained)})"
        )
    for s in steps.values():
        v = s.weights_version
        if v is None or s.kind == "weight_sync" or version_model(v) not in models:
            continue
        if v not in trained:
            raise PlanError(
                f"step '{s.name}' reads weights {v}, but the update trains "
                f"{sorted(trained)}: its data would be off-policy"
            )


def _check_transfer_first(
    plan: Plan, graph: Graph, steps: dict[int, Step], events: dict[int, object]
) -> None:
    roll = next((d for d in plan.devices if d.name == "rollout"), None)
    if roll is None:
        raise PlanError("disaggregated plan has no 'rollout' device group")
    syncs = [s for s in roll.steps if s.kind == "weight_sync"]
    if not syncs:
        raise PlanError("disaggregated plan: no weight transfer into the rollout pool")
    sync_ids = {s.signals for s in syncs}
    for s in roll.steps:
        if s.phase != "rollout" or s.weights_version is None or s.kind == "weight_sync":
            continue
        if not (sync_ids & set(s.waits)) and not _after_on_stream(roll, syncs, s):
            raise PlanError(
                f"disaggregated: rollout step '{s.name}' does not wait for the weight transfer"
            )
        if s.start_s + 1e-12 < max(x.end_s for x in syncs):
            raise PlanError(
                f"disaggregated: rollout step '{s.name}' starts before the weight transfer ends"
            )


def _after_on_stream(dev: DevicePlan, syncs: list[Step], s: Step) -> bool:
    order = {i: k for st in dev.streams for k, i in enumerate(st.steps)}
    return all(x.stream == s.stream and order[x.index] < order[s.index] for x in syncs)


def load_plan(text: str | bytes, graph: Graph | None = None, budget: bool = True) -> Plan:
    """A Plan from `dump_plan`'s JSON: its schema (types, enums, no unknown field, finite
    numbers), then `validate_plan` (with `graph`, also that it is that graph's plan).
    Raises PlanError naming the field, step, slot or event at fault."""
    try:
        plan = plan_adapter().validate_json(text)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "plan"
        more = f" (and {err.error_count() - 1} more)" if err.error_count() > 1 else ""
        raise PlanError(f"plan.json: {where}: {first['msg']}{more}") from None
    return validate_plan(plan, graph, budget=budget)
