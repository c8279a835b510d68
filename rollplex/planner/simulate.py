"""Replay a Plan in time: a fluid, event-driven simulation, no tensors.

A step starts once it heads its stream and its events have fired; co-running steps advance
at the rates the interference model grants their classes. Time jumps from one step end to
the next, and every schedule is replayed the same way, so their times compare.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from rollplex.planner.interference import InterferenceModel
from rollplex.planner.plan import CoRun, Plan, Step

_EPS = 1e-12


def _rates(
    running: list[Step], partition: dict[int, float | None], model: InterferenceModel
) -> dict[int, float]:
    """Rate of each running step of one device group (`partition`: SM share per stream)."""
    if len(running) == 1:  # the common case, as below with groups of one
        s = running[0]
        frac = partition.get(s.stream)
        if s.rate_class == "copy" or frac is None:
            return {s.index: 1.0}
        return {s.index: model.partition_solo_rate(frac, s.rate_class == "bandwidth")}
    work = [s for s in running if s.rate_class != "copy"]
    rates = {s.index: 1.0 for s in running if s.rate_class == "copy"}
    bw = [s for s in work if s.rate_class == "bandwidth"]
    cp = [s for s in work if s.rate_class != "bandwidth"]
    if bw and cp:
        frac = partition.get(bw[0].stream)
        mode = CoRun.PARTITION if frac is not None else CoRun.STREAMS
        rd, rp = model.pair_rates(mode, frac)
        rates.update({s.index: rd / len(bw) for s in bw})
        rates.update({s.index: rp / len(cp) for s in cp})
        return rates
    for group in (bw, cp):
        for s in group:
            frac = partition.get(s.stream)
            solo = (
                1.0
                if frac is None
                else model.partition_solo_rate(frac, s.rate_class == "bandwidth")
            )
            rates[s.index] = solo / len(group)
    return rates


def replay(plan: Plan, model: InterferenceModel | None = None) -> float:
    """Fill every step's predicted start/end; return and store the step time.

    Each round starts the ready stream heads, then advances time to the next step end. Only
    streams whose head changed, or whose head waits on an event that just fired, are checked
    for a ready head, and rates are recomputed only for groups whose running set changed: a
    round costs the steps it touches, not the size of the plan."""
    model = model or InterferenceModel()
    queues: list[deque[Step]] = []
    group: list[int] = []  # device group of each queue
    by_index = {s.index: s for d in plan.devices for s in d.steps}
    for g, d in enumerate(plan.devices):
        for st in d.streams:
            queues.append(deque(map(by_index.__getitem__, st.steps)))
            group.append(g)
    partitions = [{st.stream: st.partition for st in d.streams} for d in plan.devices]
    event_of_step = {e.step: e.id for e in plan.events}
    waiters: dict[int, list[tuple[int, int]]] = {}  # event -> (step, its queue) waiting on it
    unfired: dict[int, int] = {}  # step -> how many of its events have not fired yet
    for q, steps in enumerate(queues):
        for s in [s for s in steps if s.waits]:
            unfired[s.index] = len(set(s.waits))
            for e in set(s.waits):
                waiters.setdefault(e, []).append((s.index, q))
    running: list[list[Step]] = [[] for _ in plan.devices]  # per group, in start order
    remaining: dict[int, float] = {}
    rates: dict[int, float] = {}
    where: dict[int, int] = {}  # running step -> its queue
    dirty, changed = set(range(len(queues))), set(range(len(plan.devices)))
    t = 0.0
    while True:
        for q in sorted(dirty) if len(dirty) > 1 else dirty:  # start ready heads, stream order
            head = queues[q][0] if queues[q] else None
            if head is None or head.index in remaining:
                continue
            if not unfired.get(head.index):  # a count, not a scan: a join waits on many
                head.start_s = t
                remaining[head.index] = max(head.solo_s, 0.0)
                where[head.index] = q
                running[group[q]].append(head)
                changed.add(group[q])
        dirty.clear()
        if not remaining:
            if any(queues):
                stuck = [q[0].name for q in queues if q]
                raise RuntimeError(f"plan deadlocks: {stuck} wait for events that never fire")
            break
        for g in changed:
            if running[g]:
                rates.update(_rates(running[g], partitions[g], model))
        changed.clear()
        if len(remaining) == 1:  # one step runs alone: see _run_alone
            t, i = _run_alone(
                t, remaining, rates, where, queues, running, group, partitions, model, event_of_step
            )
            q = where[i]
            s = queues[q][0]
            if remaining[i] > 1e-9 * max(1.0, s.solo_s):
                continue  # not done yet (a rate far below 1): the next round goes on
            s.end_s = t
            del remaining[i], rates[i], where[i]
            queues[q].popleft()
            running[group[q]].remove(s)
            changed.add(group[q])
            dirty.add(q)
            if i in event_of_step:
                dirty.update(_fire(event_of_step[i], waiters, unfired))
            continue
        dt = min([remaining[i] / max(rates[i], _EPS) for i in remaining])
        t += dt
        for i in list(remaining):
            remaining[i] -= dt * rates[i]
            q = where[i]
            s = queues[q][0]
            if remaining[i] <= 1e-9 * max(1.0, s.solo_s):
                s.end_s = t
                del remaining[i], rates[i], where[i]
                queues[q].popleft()
                running[group[q]].remove(s)
                changed.add(group[q])
                dirty.add(q)
                if i in event_of_step:
                    dirty.update(_fire(event_of_step[i], waiters, unfired))
    plan.step_time_s = t
    return t


def _fire(
    event: int, waiters: dict[int, list[tuple[int, int]]], unfired: dict[int, int]
) -> list[int]:
    """Count `event` off its waiting steps; their queues, to check for a ready head."""
    queues = []
    for step, q in waiters.get(event, ()):
        unfired[step] -= 1
        queues.append(q)
    return queues


def _run_alone(
    t: float,
    remaining: dict[int, float],
    rates: dict[int, float],
    where: dict[int, int],
    queues: list[deque[Step]],
    running: list[list[Step]],
    group: list[int],
    partitions: list[dict[int, float | None]],
    model: InterferenceModel,
    event_of_step: dict[int, int],
) -> tuple[float, int]:
    """Advance the one running step to its end (the arithmetic of a general round), and
    while it fires no event and the next step of its stream is ready, start that one the
    same way: what the general loop would do round by round, without its bookkeeping.
    Returns the time and the last step, advanced but not retired (the caller retires it
    as a general round would). Bit for bit the times of the general loop."""
    ((i, rem),) = remaining.items()
    q = where.pop(i)
    queue, g = queues[q], group[q]
    s, r = queue[0], rates.pop(i)
    remaining.clear()  # the three are set again on return
    solo_rate: dict[str, float] = {}
    popleft = queue.popleft
    while True:
        if r == 1.0:  # dt = rem / 1.0 and rem - dt * 1.0, exactly: it ends
            t += rem
            rem = 0.0
        else:
            dt = rem / max(r, _EPS)
            t += dt
            rem -= dt * r
            if rem > 1e-9 * max(1.0, s.solo_s):
                break
        if len(queue) < 2 or i in event_of_step or queue[1].waits:
            break
        s.end_s = t
        popleft()
        s = queue[0]
        i = s.index
        s.start_s = t
        rem = s.solo_s
        if rem < 0.0:  # max(solo, 0.0)
            rem = 0.0
        r = solo_rate.get(s.rate_class)
        if r is None:
            r = solo_rate[s.rate_class] = _rates([s], partitions[g], model)[i]
    running[g][0] = s
    rates[i], where[i] = r, q
    remaining[i] = rem
    return t, i


@dataclass(slots=True)
class SimReport:
    schedule: str
    gpus: int
    step_time_s: float
    peak_bytes_per_gpu: dict[str, int]
    busy_fraction: dict[str, float]  # "<device>/<stream name>" -> busy share of the step
    bubble_s: dict[str, float]  # device -> time no stream of it is busy
    phase_time_s: dict[str, float] = field(default_factory=dict)  # summed solo time


def union_length(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def simulate(plan: Plan, model: InterferenceModel | None = None) -> SimReport:
    """Step time, peak per GPU, busy share per stream and bubbles, for any cluster size."""
    replay(plan, model)
    return report(plan)


def report(plan: Plan) -> SimReport:
    """`simulate`'s report of a plan `replay` has already timed."""
    step = plan.step_time_s
    busy, bubbles, phases = {}, {}, {}
    for d in plan.devices:
        names = {st.stream: st.name for st in d.streams}
        by_index = {s.index: s for s in d.steps}
        for st in d.streams:
            spans = [(by_index[i].start_s, by_index[i].end_s) for i in st.steps]
            busy[f"{d.name}/{names[st.stream]}"] = union_length(spans) / step if step else 0.0
        all_spans = [(s.start_s, s.end_s) for s in d.steps]
        bubbles[d.name] = step - union_length(all_spans)
        for s in d.steps:
            phases[s.phase] = phases.get(s.phase, 0.0) + s.solo_s
    gpus = sum(len(d.ranks) for d in plan.devices)
    return SimReport(
        plan.schedule,
        gpus,
        step,
        {d.name: d.peak_bytes for d in plan.devices},
        busy,
        bubbles,
        phases,
    )
