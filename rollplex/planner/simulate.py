"""Replay a Plan in time: a fluid, event-driven simulation, no tensors.

Each stream issues its steps in order; a step starts once it heads its stream and every
event it waits for has fired. While several steps run on one device group, each advances
at the rate the interference model grants its class (decode is bandwidth-bound, prefix
and training work compute-bound, copies use their own engine). Time jumps from one step
end to the next, so a 10,000-step plan replays in milliseconds. The same replay predicts
every schedule, so their times compare like with like.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from rollplex.planner.interference import InterferenceModel
from rollplex.planner.plan import CoRun, DevicePlan, Plan, Step

_EPS = 1e-12


def _rates(running: list[Step], dev: DevicePlan, model: InterferenceModel) -> dict[int, float]:
    """Rate of each running step of one device group."""
    partition = {s.stream: s.partition for s in dev.streams}
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
    """Fill every step's predicted start/end; return and store the step time."""
    model = model or InterferenceModel()
    fired_at: dict[int, float] = {}
    event_of_step = {e.step: e.id for e in plan.events}
    queues = {(d.name, st.stream): deque(st.steps) for d in plan.devices for st in d.streams}
    by_index = {s.index: s for d in plan.devices for s in d.steps}
    device_of = {s.index: d for d in plan.devices for s in d.steps}
    remaining: dict[int, float] = {}
    t = 0.0
    while True:
        for q in queues.values():  # start every ready head
            if q and q[0] not in remaining and all(e in fired_at for e in by_index[q[0]].waits):
                s = by_index[q[0]]
                s.start_s = t
                remaining[s.index] = max(s.solo_s, 0.0)
        if not remaining:
            if any(queues.values()):
                stuck = [by_index[q[0]].name for q in queues.values() if q]
                raise RuntimeError(f"plan deadlocks: {stuck} wait for events that never fire")
            break
        rates: dict[int, float] = {}
        for d in plan.devices:
            running = [by_index[i] for i in remaining if device_of[i] is d]
            if running:
                rates.update(_rates(running, d, model))
        dt = min(remaining[i] / max(rates[i], _EPS) for i in remaining)
        t += dt
        for i in list(remaining):
            remaining[i] -= dt * rates[i]
            if remaining[i] <= 1e-9 * max(1.0, by_index[i].solo_s):
                s = by_index[i]
                s.end_s = t
                del remaining[i]
                queues[(device_of[i].name, s.stream)].popleft()
                if i in event_of_step:
                    fired_at[event_of_step[i]] = t
    plan.step_time_s = t
    return t


@dataclass(slots=True)
class SimReport:
    schedule: str
    gpus: int
    step_time_s: float
    peak_bytes_per_gpu: dict[str, int]
    busy_fraction: dict[str, float]  # "<device>/<stream name>" -> busy share of the step
    bubble_s: dict[str, float]  # device -> time no stream of it is busy
    phase_time_s: dict[str, float] = field(default_factory=dict)  # summed solo time


def _union_length(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def simulate(plan: Plan, model: InterferenceModel | None = None) -> SimReport:
    """Step time, peak per GPU, busy share per stream and bubbles, for any cluster size."""
    step = replay(plan, model)
    busy, bubbles, phases = {}, {}, {}
    for d in plan.devices:
        names = {st.stream: st.name for st in d.streams}
        by_index = {s.index: s for s in d.steps}
        for st in d.streams:
            spans = [(by_index[i].start_s, by_index[i].end_s) for i in st.steps]
            busy[f"{d.name}/{names[st.stream]}"] = _union_length(spans) / step if step else 0.0
        all_spans = [(s.start_s, s.end_s) for s in d.steps]
        bubbles[d.name] = step - _union_length(all_spans)
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
