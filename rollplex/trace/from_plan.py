"""A Plan's predicted timeline, as a Timeline the trace writer exports.

One worker per device group, one lane per plan stream, one span per step. Memory events come
from the slot plan (a slot lives from its first step's start to its last step's end, at its
arena offset), so TensorBoard's memory curve is the planned residency.
"""

from __future__ import annotations

from rollplex.planner.plan import Plan
from rollplex.trace.timeline import MemoryEvent, Span, Timeline

_US = 1e6
# Weights and optimizer state live across RL steps: their bytes are named for the value
# (not the first op that reads them) and stay resident from one repeat to the next.
PERSISTENT = ("weights", "optimizer_state")


def _spans_the_step(slot, first, last, steps) -> bool:
    """A persistent slot resident from the step's first op to past its last."""
    if slot.value_kind not in PERSISTENT or not steps:
        return False
    start = min(s.start_s for s in steps)
    end = max(s.end_s for s in steps)
    return first.start_s <= start and last.end_s >= end


def plan_timeline(
    plan: Plan,
    label: str | None = None,
    device_name: str = "",
    steps: int = 1,
    first_step: int = 0,
) -> Timeline:
    """`steps` repeats the step back to back (the trace shows one ProfilerStep each),
    numbered from `first_step` (a measured run's first RL step: the same step names)."""
    spans: list[Span] = []
    memory: list[MemoryEvent] = []
    names: dict[tuple[int, int], str] = {}
    # whole nanoseconds (the trace's resolution): repeats then start exactly k periods
    # apart and every ProfilerStep is as long as the plan's step, none 0.001 us shorter
    period = round(plan.step_time_s * _US, 3)
    # plan-wide: a slot can end at another group's step (a hand-over's transfer)
    by_index = {s.index: s for d in plan.devices for s in d.steps}
    for dev_id, dev in enumerate(plan.devices):
        for st in dev.streams:
            names[(dev_id, st.stream)] = f"{dev.name}:{st.name}"
        base, lane_base = 0, {}
        for lane in sorted(dev.arena_bytes):
            lane_base[lane] = base
            base += dev.arena_bytes[lane]
        total = 0
        persistent = {sl.value for sl in dev.slots if sl.value_kind in PERSISTENT}
        for k in range(steps):
            t0 = k * period
            for s in dev.steps:
                cat = "gpu_memcpy" if s.rate_class == "copy" else "kernel"
                spans.append(
                    Span(
                        dev_id,
                        s.stream,
                        s.name,
                        t0 + s.start_s * _US,
                        max((s.end_s - s.start_s) * _US, 1e-3),
                        cat,
                        s.phase,
                        {
                            "corun": s.corun.value,
                            "solo_us": s.solo_s * _US,
                            "weights": s.weights_version or "",
                        },
                    )
                )
            events = []
            for slot in dev.slots:
                if not slot.size:
                    continue
                a, b = by_index[slot.first], by_index[slot.last]
                addr = lane_base.get(slot.lane, 0) + slot.offset
                whole = _spans_the_step(slot, a, b, dev.steps)
                if k == 0 or not whole:  # a whole-step weight stays from the last repeat
                    owner = slot.value if slot.value_kind in PERSISTENT else a.name
                    events.append((t0 + a.start_s * _US, slot.size, addr, owner))
                if not whole:  # a whole-step weight is still resident when the step ends
                    events.append((t0 + b.end_s * _US, -slot.size, addr, b.name))
            # at one time: frees first, then what persists, then the op's own bytes
            events.sort(key=lambda e: (e[0], e[1] > 0, e[3] not in persistent, e[1]))
            for t, delta, addr, name in events:
                total += delta
                memory.append(MemoryEvent(dev_id, t, addr, delta, total, base, name))
    return Timeline(
        label or plan.schedule,
        spans,
        memory,
        [(k * period, (k + 1) * period) for k in range(steps)],
        names,
        device_name=device_name,
        device_memory_bytes=max((d.budget_bytes for d in plan.devices), default=0),
        first_step=first_step,
    )
