"""The closed part of plan validation: every number finite and in range, every name and index
pointing at something that exists, times running forward.

`validate_plan` runs these first, so a plan read from JSON or edited by hand is refused with
a `PlanError` naming the device, step, slot, event or value, never a bare KeyError.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import get_args

from rollplex.graph.ir import Graph
from rollplex.graph.serialize import stable_hash
from rollplex.ops.micro_batches import OP_MICRO_KINDS
from rollplex.planner.plan import DevicePlan, Plan, Step
from rollplex.specs import ScheduleSpec


class PlanError(ValueError):
    """An invalid plan; the message names the part at fault."""


COPY_KINDS = ("offload", "onload", "transfer")
SCHEDULE_NAMES = get_args(ScheduleSpec.model_fields["name"].annotation)
TRANSFER_KINDS = ("weights", "rollout outputs")
_STEP_MEMORY = (".scratch", ".kv_pool")
_ROLLOUT_COPY = ("@rollout.next", "@rollout")


def check_references(plan: Plan, graph: Graph | None, graph_hash: str | None = None) -> None:
    """Raise PlanError on the first dangling reference, bad number or backward time.
    `graph_hash`: the graph's `stable_hash` when the caller already knows it."""
    _finite("plan", "step_time_s", plan.step_time_s)
    if plan.schedule not in SCHEDULE_NAMES:
        raise PlanError(f"plan: schedule {plan.schedule!r} is not one of {list(SCHEDULE_NAMES)}")
    if not plan.devices:
        raise PlanError("plan has no device groups")
    steps = _index_steps(plan)
    _check_devices(plan)
    _check_summary(plan, steps)
    events = _check_events(plan, steps)
    for dev in plan.devices:
        _check_streams(dev)
        for s in dev.steps:
            _check_waits(dev, s, events)
        _check_memory(dev, steps)
    if graph is not None:
        expected = graph_hash or stable_hash(graph)
        if plan.graph_hash != expected:
            raise PlanError(
                f"plan: graph_hash {plan.graph_hash!r} is not the graph's ({expected!r}): "
                "the plan was made for another graph"
            )
        for dev in plan.devices:
            _check_names(dev, graph)


def _finite(where: str, field: str, value: float, low: float | None = 0.0) -> None:
    if not isinstance(value, int | float) or not math.isfinite(value):
        raise PlanError(f"{where}: {field}={value!r} is not a finite number")
    if low is not None and value < low:
        raise PlanError(f"{where}: {field}={value} is below {low}")


def _index_steps(plan: Plan) -> dict[int, Step]:
    steps: dict[int, Step] = {}
    for dev in plan.devices:
        for s in dev.steps:
            where = f"device '{dev.name}' step {s.index} ('{s.op}')"
            if s.index in steps:
                raise PlanError(
                    f"{where}: step index {s.index} is used twice "
                    f"('{steps[s.index].name}' and '{s.name}')"
                )
            steps[s.index] = s
            for field in ("start_s", "end_s"):
                _finite(where, field, getattr(s, field), low=None)
            for field in ("solo_s", "scratch_bytes", "pool_bytes"):
                _finite(where, field, getattr(s, field))
            if s.end_s < s.start_s:
                raise PlanError(f"{where}: ends at {s.end_s}s, before it starts at {s.start_s}s")
            if s.chunks < 1 or not 0 <= s.chunk < s.chunks:
                raise PlanError(f"{where}: chunk {s.chunk} of {s.chunks} is out of range")
            if s.pool_bytes > s.scratch_bytes:
                raise PlanError(
                    f"{where}: pool_bytes {s.pool_bytes} exceed its scratch_bytes "
                    f"{s.scratch_bytes} (the pool is part of the scratch)"
                )
    return steps


def _check_devices(plan: Plan) -> None:
    names: set[str] = set()
    owner: dict[int, str] = {}
    for dev in plan.devices:
        where = f"device '{dev.name}'"
        if dev.name in names:
            raise PlanError(f"{where} is listed twice")
        names.add(dev.name)
        if not dev.ranks:
            raise PlanError(f"{where} has no ranks")
        for r in dev.ranks:
            if r < 0 or r in owner:
                what = "is negative" if r < 0 else f"is also in device '{owner[r]}'"
                raise PlanError(f"{where}: rank {r} {what}")
            owner[r] = dev.name
        for field in ("tp", "dp"):
            if getattr(dev, field) < 1:
                raise PlanError(f"{where}: {field}={getattr(dev, field)} must be >= 1")
        if dev.tp * dev.dp != len(dev.ranks):
            raise PlanError(f"{where}: tp={dev.tp} x dp={dev.dp} is not its {len(dev.ranks)} ranks")
        for field in ("budget_bytes", "peak_bytes", "lower_bound_bytes"):
            _finite(where, field, getattr(dev, field))
        for lane, size in dev.arena_bytes.items():
            _finite(where, f"arena_bytes[{lane}]", size)
        arenas = sum(dev.arena_bytes.values())
        if dev.peak_bytes < max(arenas, dev.lower_bound_bytes):
            raise PlanError(
                f"{where}: peak_bytes {dev.peak_bytes} is below its arenas ({arenas} B) "
                f"or its lower bound ({dev.lower_bound_bytes} B)"
            )


def _check_summary(plan: Plan, steps: dict[int, Step]) -> None:
    """The plan's totals agree with its steps, and what the trainer reads of `meta` is sane."""
    last = max((s.end_s for s in steps.values()), default=0.0)
    if abs(plan.step_time_s - last) > 1e-9 * max(1.0, last):
        raise PlanError(
            f"plan: step_time_s={plan.step_time_s} is not its last step's end ({last}s)"
        )
    micro = plan.meta.get("train_micro_batches", 1)
    if not isinstance(micro, int) or isinstance(micro, bool) or micro < 1:
        raise PlanError(f"plan: meta.train_micro_batches={micro!r} must be a positive integer")
    _check_op_micro(plan, steps)
    if not isinstance(plan.meta.get("train_micro_recompute", False), bool):
        raise PlanError("plan: meta.train_micro_recompute must be true or false")
    for t in plan.transfers:
        if t.what not in TRANSFER_KINDS:
            raise PlanError(f"transfer at step {t.step}: what={t.what!r} is not {TRANSFER_KINDS}")


def _check_op_micro(plan: Plan, steps: dict[int, Step]) -> None:
    """`meta.op_micro_batches` (op -> count, planner/api.py) names forwards the runtime can
    cut, each planned in one step (a row chunk runs whole), with a count of at least 2."""
    counts = plan.meta.get("op_micro_batches", {})
    if not isinstance(counts, dict):
        raise PlanError(f"plan: meta.op_micro_batches={counts!r} must map op names to counts")
    by_op: dict[str, list[Step]] = {}
    for s in steps.values():
        by_op.setdefault(s.op, []).append(s)
    for name, n in counts.items():
        where = f"plan: meta.op_micro_batches[{name!r}]"
        if not isinstance(n, int) or isinstance(n, bool) or n < 2:
            raise PlanError(f"{where}={n!r} must be an integer >= 2 (1 is left out)")
        ops = by_op.get(name, [])
        if not ops or ops[0].kind not in OP_MICRO_KINDS:
            raise PlanError(f"{where}: no step runs a forward of {sorted(OP_MICRO_KINDS)} so named")
        if any(s.chunks > 1 for s in ops):
            raise PlanError(f"{where}: the op runs in row chunks, each whole")


def _check_events(plan: Plan, steps: dict[int, Step]) -> dict[int, int]:
    """event id -> the step index it records."""
    devices = {d.name: {s.index for s in d.steps} for d in plan.devices}
    events: dict[int, int] = {}
    for e in plan.events:
        where = f"event {e.id}"
        if e.id in events:
            raise PlanError(f"{where} is listed twice")
        if e.step not in steps:
            raise PlanError(f"{where} records step {e.step}, which is not in the plan")
        if e.step not in devices.get(e.device, ()):
            raise PlanError(f"{where}: step {e.step} is not on device '{e.device}'")
        s = steps[e.step]
        if s.signals != e.id or s.stream != e.stream:
            raise PlanError(
                f"{where} records step '{s.name}' on stream {e.stream}, but that step "
                f"signals {s.signals} on stream {s.stream}"
            )
        events[e.id] = e.step
    for s in steps.values():
        if s.signals is not None and s.signals not in events:
            raise PlanError(f"step '{s.name}' signals event {s.signals}, which is not in the plan")
    return events


def _check_waits(dev: DevicePlan, s: Step, events: dict[int, int]) -> None:
    for e in s.waits:
        if e not in events:
            raise PlanError(
                f"device '{dev.name}' step '{s.name}' waits on event {e}, which is not in the plan"
            )
        if events[e] == s.index:
            raise PlanError(f"device '{dev.name}' step '{s.name}' waits on its own event {e}")


def _check_streams(dev: DevicePlan) -> None:
    """Each step sits on exactly one stream's list: the one its `stream` names."""
    where = f"device '{dev.name}'"
    ids = {st.stream for st in dev.streams}
    if len(ids) != len(dev.streams):
        raise PlanError(f"{where}: a stream id is listed twice")
    mine = {s.index: s for s in dev.steps}
    placed: set[int] = set()
    for st in dev.streams:
        if st.partition is not None and not 0 < st.partition <= 1:
            raise PlanError(f"{where} stream {st.stream}: partition {st.partition} not in (0, 1]")
        for i in st.steps:
            s = mine.get(i)
            if s is None:
                raise PlanError(f"{where} stream {st.stream} lists step {i}, not a step of it")
            if i in placed or s.stream != st.stream:
                raise PlanError(
                    f"{where}: step '{s.name}' (stream {s.stream}) is listed on stream "
                    f"{st.stream}" + (" twice" if i in placed else "")
                )
            placed.add(i)
    for s in dev.steps:
        if s.index not in placed:
            raise PlanError(f"{where}: step '{s.name}' is on no stream's list")


def _check_memory(dev: DevicePlan, steps: dict[int, Step]) -> None:
    """Slots and effects name plan steps: a rollout pool holds what it hands over until
    the training pool's transfer step."""
    for sl in dev.slots:
        where = f"device '{dev.name}' slot '{sl.value}'"
        for field in ("first", "last"):
            if getattr(sl, field) not in steps:
                raise PlanError(f"{where}: {field} step {getattr(sl, field)} is not in the plan")
        for field in ("size", "offset"):
            _finite(where, field, getattr(sl, field))
        if sl.size and sl.lane not in dev.arena_bytes:
            raise PlanError(f"{where}: lane {sl.lane} has no arena")
        if sl.size and sl.offset + sl.size > dev.arena_bytes[sl.lane]:
            raise PlanError(
                f"{where}: bytes [{sl.offset}, {sl.offset + sl.size}) run past lane "
                f"{sl.lane}'s arena of {dev.arena_bytes[sl.lane]} B"
            )
        if steps[sl.last].end_s < steps[sl.first].start_s:
            raise PlanError(f"{where}: freed (step {sl.last}) before it is made (step {sl.first})")
    for ef in dev.effects:
        where = f"device '{dev.name}' {ef.action} of '{ef.value}'"
        if ef.at not in steps:
            raise PlanError(f"{where}: step {ef.at} is not in the plan")
        for field in ("bytes", "offset"):
            _finite(where, field, getattr(ef, field))


def _check_names(dev: DevicePlan, graph: Graph) -> None:
    step_names = {s.name for s in dev.steps}
    held = {sl.value for sl in dev.slots}
    for s in dev.steps:
        where = f"device '{dev.name}' step {s.index} ('{s.op}')"
        if s.kind in ("offload", "onload"):
            if s.op not in held:
                raise PlanError(f"{where}: {s.kind} of a value the device holds no slot for")
            continue
        if s.kind == "transfer":
            continue  # a hand-over between pools: named by the schedule, not the graph
        op = graph.ops.get(s.op)
        if op is None:
            raise PlanError(f"{where}: names op '{s.op}', which is not in the graph")
        if s.kind != op.kind:
            raise PlanError(f"{where}: kind '{s.kind}' but the graph's op is '{op.kind}'")
    _check_values(dev, graph, step_names, (sl.value for sl in dev.slots), "slot")
    _check_values(dev, graph, step_names, (ef.value for ef in dev.effects), "memory effect")


def _check_values(
    dev: DevicePlan, graph: Graph, step_names: set[str], names: Iterable[str], what: str
) -> None:
    for name in names:
        if name in graph.values:
            continue
        base = next((name[: -len(t)] for t in _ROLLOUT_COPY if name.endswith(t)), None)
        if base is not None and base in graph.values:
            continue
        step = next((name[: -len(t)] for t in _STEP_MEMORY if name.endswith(t)), None)
        if step is not None and step in step_names:
            continue
        raise PlanError(
            f"device '{dev.name}' {what} names '{name}': not a value of the graph, a "
            "rollout copy of its weights, or a step's scratch"
        )
