"""Issue order (planner/renumber.py): the executor issues steps by index, and a step the
host drives to its end holds back every step numbered after it, so a copy is numbered
where the plan starts it."""

from __future__ import annotations

from rollplex.planner.plan import DevicePlan, Event, Plan, Step, StreamPlan
from rollplex.planner.renumber import renumber_in_issue_order


def _step(index: int, op: str, kind: str, stream: int, start: float, end: float) -> Step:
    s = Step(index=index, op=op, kind=kind, phase="rollout", stream=stream, start_s=start)
    s.end_s = end
    return s


def _plan(waits_for_write_back: str | None) -> Plan:
    """vision encode, prefill, decode, backward, optimizer on the compute stream; on the
    copy stream a write-back at the step's start (waits for nothing), and AdamW's onload
    after the backward; `waits_for_write_back`: the op that waits for the write-back."""
    compute = [
        _step(0, "vision", "vision_encode", 0, 0.0, 0.4),
        _step(1, "prefill", "prefix_prefill", 0, 0.7, 1.0),
        _step(2, "decode", "decode", 0, 1.0, 3.0),
        _step(3, "backward", "backward", 0, 3.0, 7.0),
        _step(4, "optimizer", "optimizer_step", 0, 7.7, 7.8),
    ]
    write_back = _step(5, "policy.adam", "offload", 1, 0.0, 0.7)
    onload = _step(6, "policy.adam", "onload", 1, 7.0, 7.7)
    events = [Event(0, 3, "colocated", 0), Event(1, 6, "colocated", 1)]
    compute[3].signals, onload.waits = 0, [0]
    onload.signals, compute[4].waits = 1, [1]
    if waits_for_write_back is not None:
        events.append(Event(2, 5, "colocated", 1))
        write_back.signals = 2
        next(s for s in compute if s.op == waits_for_write_back).waits.append(2)
    streams = [StreamPlan(0, "compute", [0, 1, 2, 3, 4]), StreamPlan(1, "copy", [5, 6])]
    dev = DevicePlan("colocated", [0], steps=[*compute, write_back, onload], streams=streams)
    return Plan("serial", "hash", [dev], events=events)


def test_a_copy_that_waits_for_nothing_is_issued_first_even_with_a_later_reader() -> None:
    """Run 31: a write-back at the step's start that the prefill waits for was numbered just
    before the prefill, after the vision encode, whose 0.38 s the host spends inside it:
    the copy then ran after the vision encode, not beside it. It is numbered first, with a
    reader or without; an onload waiting for the backward comes right after it."""
    for reader in (None, "prefill", "decode"):
        plan = _plan(reader)
        renumber_in_issue_order(plan)
        order = [(s.op, s.kind) for s in plan.all_steps()]
        assert order[0] == ("policy.adam", "offload"), (reader, order)
        backward = order.index(("backward", "backward"))
        assert order[backward + 1] == ("policy.adam", "onload"), (reader, order)
        by_index = {s.index: s for s in plan.all_steps()}
        for e in plan.events:  # every event still names the step that signals it
            assert by_index[e.step].signals == e.id
