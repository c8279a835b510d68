"""plan_effects: where the executor frees what a plan parks on host. An offload releases the
device copy itself; the plan's free at that offload is that release, not a free to defer
past the value's later readers (which warned of a plan defect on every such plan: the
long-response 7B plan that parks the prefill's export across the decode)."""

from __future__ import annotations

from types import SimpleNamespace

from rollplex.planner.plan import MemAction, MemoryEffect, Step
from rollplex.runtime.plan_effects import plan_effects

V = "rollout.prefix_prefill.exported"


def _step(i: int, op: str, kind: str, stream: int = 0) -> Step:
    return Step(index=i, op=op, kind=kind, phase="x", stream=stream)


def _ops(**reads: list[str]) -> dict[str, SimpleNamespace]:
    return {
        op: SimpleNamespace(inputs={f"in{j}": v for j, v in enumerate(vs)})
        for op, vs in reads.items()
    }


def test_a_free_at_the_offload_of_a_later_read_value_is_the_offload_itself():
    order = [
        _step(0, "prefill", "prefix_prefill"),
        _step(1, V, "offload", stream=1),
        _step(2, "decode", "decode"),
        _step(3, V, "onload", stream=1),
        _step(4, "attach", "attach_prefix"),
        _step(5, "backward", "backward"),
    ]
    graph = SimpleNamespace(
        values={V: SimpleNamespace(external=False)},
        ops=_ops(prefill=[], decode=[], attach=[V], backward=[V]),
    )
    effects = [
        MemoryEffect(MemAction.ALLOC, V, 0, 1 << 30),
        MemoryEffect(MemAction.FREE, V, 1, 1 << 30),  # the offload's release
        MemoryEffect(MemAction.OFFLOAD, V, 1, 1 << 30),
        MemoryEffect(MemAction.ONLOAD, V, 3, 1 << 30),
        MemoryEffect(MemAction.ALLOC, V, 3, 1 << 30),
        MemoryEffect(MemAction.FREE, V, 5, 1 << 30),  # after its last reader
    ]
    plan = SimpleNamespace(devices=[SimpleNamespace(effects=effects)])
    allocs, frees, moved = plan_effects(plan, graph, order)
    assert moved == []
    assert frees == {5: [V]}
    assert allocs == {}  # its onload brings it back; the prefill's output is its alloc


def test_a_free_planned_before_a_later_read_is_still_moved_and_reported():
    order = [_step(0, "make", "logprob"), _step(1, "a", "loss"), _step(2, "b", "backward")]
    graph = SimpleNamespace(
        values={"x": SimpleNamespace(external=False)}, ops=_ops(make=[], a=["x"], b=["x"])
    )
    effects = [MemoryEffect(MemAction.ALLOC, "x", 0, 8), MemoryEffect(MemAction.FREE, "x", 1, 8)]
    plan = SimpleNamespace(devices=[SimpleNamespace(effects=effects)])
    _, frees, moved = plan_effects(plan, graph, order)
    assert frees == {2: ["x"]}
    assert [k for k, _ in moved] == [1] and "moved after 'b'" in moved[0][1]
