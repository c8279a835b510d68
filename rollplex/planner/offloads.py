"""Offloads: the copy-stream moves residency makes, and what they may move.

Which tensors may wait on host (`may_move`, `parkable`) and in what order a rule takes them
(`offload_order`); an offload and its onload as copy steps with their events (`offload`,
just in time, or after a given instant); and the lifetimes those moves leave
(`apply_offloads`); how much of optimizer state a move takes (`partial_share`); a write-back
moved to the next step's start (`write_back_at_start`, chosen by write_backs.py).
Residency (residency.py) decides when to move and checks the budget.
"""

from __future__ import annotations

import math
from dataclasses import replace

from rollplex.graph.ir import Graph
from rollplex.planner.lifetimes import Lifetime, positions, trained_weights
from rollplex.planner.memory.records import peak_position
from rollplex.planner.plan import DevicePlan, Event, Plan, Step
from rollplex.planner.sizing import PERSISTENT

# Boundary outputs that stay where they are made: the tensors autograd saved for a backward
# (a host copy frees nothing while the graph holds them) and the decode's kept layer
# outputs (views into the engine's workspace). Run 15 parked an export the backend could not
# move; these two it cannot move at all.
UNPARKABLE_PORTS = frozenset({"saved", "kept"})


def parkable(graph: Graph, value: str) -> bool:
    """Whether `value` may wait on host: not one of `UNPARKABLE_PORTS`' outputs."""
    op = graph.producers().get(value)
    return op is None or not any(
        v == value and port in UNPARKABLE_PORTS for port, v in op.outputs.items()
    )


def apply_offloads(dev: DevicePlan, lives: list[Lifetime]) -> list[Lifetime]:
    """Cut the lifetimes of offloaded values to their resident stretches: from an onload's
    start (or the value's birth) to an offload's end (or the value's last use)."""
    moves: dict[str, list[tuple[float, str, Step]]] = {}
    for s in dev.steps:
        if s.kind in ("offload", "onload"):
            moves.setdefault(s.op, []).append((s.start_s, s.kind, s))
    if not moves:
        return lives
    times = sorted({t for s in dev.steps for t in (s.start_s, s.end_s)})
    at = {t: i for i, t in enumerate(times)}
    out, kept = [], []
    for lf in lives:
        marks = sorted(moves.get(lf.value, []), key=lambda m: (m[0], m[2].index))
        if not marks:
            out.append(lf)
            continue
        r = lf.record
        share = min(step.share for _, _, step in marks)
        if share < 1:  # the part no copy moves stays resident all step
            moved = round(share * r.size)
            rest = replace(r, size=r.size - moved, name=f"{r.name}#kept")
            kept.append(Lifetime(rest, lf.value, lf.kind, lf.first_step, lf.last_step))
            r = replace(r, size=moved)
        persistent = lf.kind in {k.value for k in PERSISTENT}
        resident = not (persistent and marks[0][1] == "onload")
        start, start_step, segments = r.first, lf.first_step, []
        if persistent and marks[0][1] == "offload":  # a write-back at the step's start:
            start_step = marks[0][2].index  # its slot ends at the copy it begins beside
        for _, kind, step in marks:
            if kind == "offload" and resident:
                stop = max(start, at[step.end_s] - 1)
                segments.append((start, stop, start_step, step.index))
                resident = False
            elif kind == "onload" and not resident:
                start, start_step, resident = at[step.start_s], step.index, True
        if resident:
            segments.append((start, r.last, start_step, lf.last_step))
        for i, (a, b, s0, s1) in enumerate(segments):
            rec = type(r)(size=r.size, first=a, last=max(a, b), lane=r.lane, name=f"{r.name}#{i}")
            out.append(Lifetime(rec, lf.value, lf.kind, s0, s1))
    return out + kept  # after the moved parts: a value's first slot sizes its copies


PARTIAL_STEPS = 16  # optimizer state moves in sixteenths of its bytes


def partial_share(victim: Lifetime, need: int | None) -> float:
    """The share of `victim` a covering move takes: for optimizer state (thousands of
    tensors, moved one by one), the sixteenths that cover `need` and one more (the offsets
    pack the rest around it); any other value, or with no `need`, all of it."""
    size = victim.record.size
    if need is None or victim.kind != "optimizer_state" or size <= 0:
        return 1.0
    return min(1.0, (math.ceil(PARTIAL_STEPS * need / size) + 1) / PARTIAL_STEPS)


def may_move(graph: Graph, lf: Lifetime) -> bool:
    """Optimizer state, weights, or a parkable boundary: what a copy may take to host."""
    if lf.kind == "boundary":
        return parkable(graph, lf.value)
    return lf.kind in ("optimizer_state", "weights")


def idle_at_peak(dev: DevicePlan, lives: list[Lifetime], peak: int, graph: Graph) -> list[Lifetime]:
    """Those of `lives` resident at position `peak` but outside their span of uses (from
    their first reader's start to their last reader's end): moving one lowers the peak."""
    _, begin, until, _ = positions(dev)
    wanted = {lf.value for lf in lives}
    uses: dict[str, tuple[int, int]] = {}  # value -> (first position, last) of its readers
    for s in dev.steps:
        op = graph.ops.get(s.op)
        for v in op.inputs.values() if op is not None else ():
            if v in wanted:
                a, b = uses.get(v, (begin[s.index], until[s.index]))
                uses[v] = (min(a, begin[s.index]), max(b, until[s.index]))
    return [
        lf
        for lf in lives
        if lf.record.first <= peak <= lf.record.last
        and lf.value in uses
        and not uses[lf.value][0] <= peak <= uses[lf.value][1]
    ]


def offload_order(
    dev: DevicePlan, lives: list[Lifetime], tried: set[str], graph: Graph, need: float | None
) -> list[Lifetime]:
    """Tensors that wait a long stretch between uses (and were not tried), in the order
    a rule takes them: preferring ones resident at the peak outside their span of uses
    (moving one lowers the peak), the largest first; with a `need`, those of at least
    `need` bytes first, the smallest first. One in use at the peak (AdamW's state at the
    optimizer step) would only stay resident there and cost its copies, so it is taken
    only when nothing else can move."""
    movable = [
        lf
        for lf in lives
        if lf.value not in tried and lf.record.last - lf.record.first >= 2 and may_move(graph, lf)
    ]
    idle = idle_at_peak(dev, movable, peak_position([lf.record for lf in lives]), graph)
    pool = sorted(idle or movable, key=lambda lf: -lf.record.size)
    covering = [lf for lf in reversed(pool) if need is not None and lf.record.size >= need]
    return covering or pool


def peak_end(dev: DevicePlan, lives: list[Lifetime]) -> float:
    """The instant at which the position holding the most live bytes ends."""
    times = sorted({t for s in dev.steps for t in (s.start_s, s.end_s)})
    peak = peak_position([lf.record for lf in lives])
    return times[min(peak + 1, len(times) - 1)]


def offload(
    plan: Plan,
    dev: DevicePlan,
    lf: Lifetime,
    graph: Graph,
    host_link_gbps: float,
    after_s: float | None = None,
    share: float = 1.0,
) -> None:
    """Move `lf`'s value (optimizer state: `share` of its bytes) to host between its uses;
    its onload starts just in time, or, where that is before `after_s` (a peak it must not
    be resident for), once a step has ended at or after `after_s`."""
    g = graph
    steps = sorted(dev.steps, key=lambda s: (s.start_s, s.index))
    users = [
        s for s in steps if (op := g.ops.get(s.op)) is not None and lf.value in op.inputs.values()
    ]
    makers = [
        s for s in steps if (op := g.ops.get(s.op)) is not None and lf.value in op.outputs.values()
    ]
    if not users or any(s.previous_step or s.stream == _copy_stream(dev) for s in users):
        return  # copies of copies would serialise on one stream
    seconds = share * lf.record.size / (host_link_gbps * 1e9)
    copy = _copy_stream(dev)
    persistent = lf.kind in {k.value for k in PERSISTENT}
    # Resident stretch: from just-in-time onload before the first use to the last use.
    first_use, last_use = users[0], users[-1]
    if persistent or makers:
        anchor = makers[-1] if makers else None
        if anchor is not None:  # write back right after it is made
            _copy_step(plan, dev, copy, "offload", lf.value, seconds, anchor, share)
        ready = [s for s in steps if s.end_s <= first_use.start_s - seconds and s.stream != copy]
        anchor = ready[-1] if ready else None
        if after_s is not None and (anchor.end_s if anchor else 0.0) < after_s:
            past = [s for s in steps if after_s <= s.end_s <= first_use.start_s]
            past = [s for s in past if s.stream != copy]
            anchor = min(past, key=lambda s: (s.end_s, s.index)) if past else anchor
        on = _copy_step(plan, dev, copy, "onload", lf.value, seconds, anchor, share)
        wait_for(plan, first_use, on)
        if persistent:
            # Frozen weights round-trip at one version: from the second step on, the host
            # holds their values already and the write-back is a drop of the device copy
            # (backends/torch/host_memory.py), free of copy time. The first step pays it.
            frozen = lf.kind == "weights" and lf.value not in trained_weights(g)
            back = 0.0 if frozen else seconds
            _copy_step(plan, dev, copy, "offload", lf.value, back, last_use, share)
    _sort_copy_stream(dev, copy)


def write_back_at_start(dev: DevicePlan, step: Step) -> None:
    """Issue `step` (an end write-back) first, at the step's start, beside its first ops:
    the value stays resident from its last use across the step boundary until the copy
    ends. A step ends once every stream has (runtime/cuda.py `finish`), so the copy reads
    the previous step's update; `apply_offloads` and the executor's `initial_host` take a
    value whose first copy is an offload as resident at the start."""
    step.waits = []
    step.start_s = 0.0
    _sort_copy_stream(dev, step.stream)


def _copy_stream(dev: DevicePlan) -> int:
    return next(st.stream for st in dev.streams if st.name == "copy")


def _copy_step(
    plan: Plan,
    dev: DevicePlan,
    stream: int,
    kind: str,
    value: str,
    seconds: float,
    after: Step | None,
    share: float = 1.0,
) -> Step:
    index = 1 + max(s.index for d in plan.devices for s in d.steps)
    step = Step(
        index=index,
        op=value,
        kind=kind,
        phase=after.phase if after else "rollout",
        stream=stream,
        solo_s=seconds,
        rate_class="copy",
        start_s=after.end_s if after else 0.0,
        share=share,
    )
    if after is not None:
        wait_for(plan, step, after)
    dev.steps.append(step)
    dev.streams[stream].steps.append(index)
    return step


def wait_for(plan: Plan, waiter: Step, on: Step) -> None:
    """`waiter` starts once `on` has ended (an event `on` signals)."""
    if on.signals is None:
        dev = next(d for d in plan.devices if on in d.steps)
        ev = Event(len(plan.events), on.index, dev.name, on.stream)
        plan.events.append(ev)
        on.signals = ev.id
    if on.signals not in waiter.waits:
        waiter.waits.append(on.signals)


def _sort_copy_stream(dev: DevicePlan, copy: int) -> None:
    """Copies run in the order their anchors finish, so none blocks an earlier one."""
    by_index = {s.index: s for s in dev.steps}
    dev.streams[copy].steps.sort(key=lambda i: (by_index[i].start_s, i))
