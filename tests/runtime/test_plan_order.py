"""The executor issues the plan's steps in the plan's order and frees values where the plan
frees them. Both are observed from outside the executor: the order in which the backend
is asked to run ops and move values, and the moments values leave the environment's
device store. Where the plan cannot be followed, the run log and the trace say so."""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass, field

import pytest

from rollplex.backends.step import StepConfig
from rollplex.backends.torch.data import TaskData
from rollplex.jobs.pipeline import plan_step
from rollplex.planner.plan import MemAction, Plan
from rollplex.runtime import Callback, Executor, measured_timeline, plan_order
from rollplex.runtime import executor as executor_module
from rollplex.runtime.compose import compose
from rollplex.runtime.memory import Env
from rollplex.runtime.plan_effects import unpartitioned_streams
from rollplex.specs import ScheduleSpec
from rollplex.trace import build_profiler_trace
from tests.runtime.conftest import ALGO, CPU, MODEL, WORKLOAD
from tests.runtime.test_memory import _tight_cpu

COPIES = ("offload", "onload", "transfer")


@dataclass
class Seen:
    """What happened, in order: per plan step (from its start callback on), the ops the
    backend ran, the values moved, and the values that left the device store."""

    steps: list[int] = field(default_factory=list)  # plan indices (copies' names repeat)
    ops: dict[int, list[tuple[str, int]]] = field(default_factory=dict)
    moves: dict[int, list[bool]] = field(default_factory=dict)
    left: dict[int, list[str]] = field(default_factory=dict)
    still: dict[int, set[str]] = field(default_factory=dict)  # device keys at the step's end

    def now(self) -> int:
        return self.steps[-1] if self.steps else -1


class Store(dict):
    def __init__(self, seen: Seen) -> None:
        super().__init__()
        self.seen = seen

    def pop(self, key, *default):
        if key in self:
            self.seen.left.setdefault(self.seen.now(), []).append(key)
        return super().pop(key, *default)


class Backend:
    """The real backend, with every run_op and move written down."""

    def __init__(self, inner, seen: Seen) -> None:
        self.inner, self.seen = inner, seen

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def run_op(self, op, inputs, chunk, carry):
        self.seen.ops.setdefault(self.seen.now(), []).append((op.name, chunk.index))
        return self.inner.run_op(op, inputs, chunk, carry)

    def move(self, value, to_host, share=1.0):
        self.seen.moves.setdefault(self.seen.now(), []).append(to_host)
        return self.inner.move(value, to_host)


class Steps(Callback):
    def __init__(self, seen: Seen, env: list[Env]) -> None:
        self.seen, self.env = seen, env

    def on_step_start(self, rl_step, step):
        self.seen.steps.append(step.index)

    def on_step_end(self, rl_step, measured):
        self.seen.still[measured.step.index] = set(self.env[-1].device)


def _watched_run(monkeypatch, plan: Plan, graph, steps: int = 1):
    seen, envs = Seen(), []

    def env(**kw) -> Env:
        e = Env(device=Store(seen), **kw)
        envs.append(e)
        return e

    monkeypatch.setattr(executor_module, "Env", env)
    inner = compose(StepConfig(MODEL, ALGO, seed=0, max_new_tokens=4))
    ex = Executor(plan, graph, Backend(inner, seen), [Steps(seen, envs)])
    data = TaskData(MODEL, WORKLOAD, seed=0)
    results = [ex.run_step(k, data.step(k)) for k in range(steps)]
    return seen, ex, results


def _planned_frees(plan: Plan, graph) -> dict[int, set[str]]:
    out: dict[int, set[str]] = {}
    for d in plan.devices:
        for e in d.effects:
            if e.action is MemAction.FREE and e.value in graph.values:
                out.setdefault(e.at, set()).add(e.value)
    return out


def _check_frees(plan: Plan, graph, seen: Seen) -> None:
    """Every value leaves where the plan frees it (or offloads it), and nowhere else."""
    frees = _planned_frees(plan, graph)
    for s in plan.all_steps():
        planned = frees.get(s.index, set())
        left = set(seen.left.get(s.index, ()))
        moved = {s.op} if s.kind == "offload" else set()
        assert left <= planned | moved, (s.name, left - planned - moved)
        assert not planned & seen.still[s.index], (s.name, planned & seen.still[s.index])
        assert moved <= left


ORDERED = [
    ScheduleSpec(name="serial"),
    ScheduleSpec(name="rollplex", overlap="piggyback"),
    ScheduleSpec(name="rollplex", overlap="streams", chunk_tokens=40),
]


@pytest.mark.parametrize("schedule", ORDERED, ids=lambda s: f"{s.name}-{s.overlap}")
def test_steps_run_in_plan_index_order_and_values_leave_where_planned(monkeypatch, schedule):
    planned = plan_step(MODEL, WORKLOAD, ALGO, CPU, schedule)
    plan = planned.plan
    steps = plan.all_steps()  # by plan index
    streams = {st.stream for d in plan.devices for st in d.streams if st.steps}
    if schedule.overlap == "streams":  # several streams, events between them
        assert len(streams) >= 3 and plan.events
        by_start = sorted(steps, key=lambda s: (s.start_s, s.index))
        assert by_start != steps  # predicted times alone would give another order
    seen, ex, results = _watched_run(monkeypatch, plan, planned.graph)
    assert seen.steps == [s.index for s in steps]
    ran = [(s.op, s.chunk) for s in steps if s.kind not in COPIES]
    assert [o for i in seen.steps for o in seen.ops.get(i, ())] == ran
    _check_frees(plan, planned.graph, seen)
    assert sum(map(len, seen.left.values())) >= 5  # frees really happened
    assert not ex.deviations and not any(m.deviations for m in results[0].steps)


def test_a_plan_that_offloads_moves_values_where_planned(monkeypatch, caplog):
    planned = plan_step(MODEL, WORKLOAD, ALGO, _tight_cpu(), ScheduleSpec(name="serial"))
    plan, graph = planned.plan, planned.graph
    copies = [s for s in plan.all_steps() if s.kind in ("offload", "onload")]
    assert copies
    with caplog.at_level(logging.WARNING, logger="rollplex.runtime.executor"):
        seen, _, results = _watched_run(monkeypatch, plan, graph, steps=2)
    by_index = {s.index: s for s in plan.all_steps()}
    order = seen.steps[: len(by_index)]  # the first RL step
    pos = {i: k for k, i in enumerate(order)}
    # Compute ops keep the plan's index order; each copy moves its value, and sits where
    # the plan's copy stream and events put it.
    ops = [i for i in order if by_index[i].kind not in COPIES]
    assert ops == sorted(ops)
    event_step = {e.id: e.step for e in plan.events}
    for d in plan.devices:
        for st in d.streams:
            assert [pos[i] for i in st.steps] == sorted(pos[i] for i in st.steps)
    for s in plan.all_steps():
        assert all(pos[event_step[e]] < pos[s.index] for e in s.waits)
    for c in copies:
        assert seen.moves[c.index] == [c.kind == "offload"] * 2  # once per RL step
    _check_frees(plan, graph, seen)
    # The planner numbers copies in issue order too (planner/renumber.py): the run follows
    # the plan's indices exactly, with nothing to report.
    assert order == sorted(order)
    assert not plan_order(plan)[1] and not any(m.deviations for m in results[0].steps)
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]


def test_a_copy_numbered_after_its_waiter_is_issued_ahead_and_reported(monkeypatch, caplog):
    """A plan whose numbering disagrees with its events (as the planner's copies did
    before planner/renumber.py): the executor issues the copy first and says so."""
    planned = plan_step(MODEL, WORKLOAD, ALGO, _tight_cpu(), ScheduleSpec(name="serial"))
    plan, graph = planned.plan, planned.graph
    onload = next(s for s in plan.all_steps() if s.kind == "onload")
    _swap_index_to_end(plan, onload)
    with caplog.at_level(logging.WARNING, logger="rollplex.runtime.executor"):
        seen, _, results = _watched_run(monkeypatch, plan, graph, steps=1)
    order = seen.steps[: len(plan.all_steps())]
    ahead = {i for k, i in enumerate(order) if any(j < i for j in order[k + 1 :])}
    flagged = {m.step.index for m in results[0].steps if m.deviations}
    assert onload.index in ahead and flagged == ahead
    assert {d.step.index for d in plan_order(plan)[1]} == ahead
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    for i in ahead:
        assert any(f"(plan index {i})" in w and "issue order" in w for w in warned)


def _swap_index_to_end(plan, step) -> None:
    """Give `step` the highest index (every reference follows), as residency once did."""
    old, new = step.index, 1 + max(s.index for s in plan.all_steps())
    step.index = new
    for e in plan.events:
        e.step = new if e.step == old else e.step
    for d in plan.devices:
        for st in d.streams:
            st.steps = [new if i == old else i for i in st.steps]
        for sl in d.slots:
            sl.first = new if sl.first == old else sl.first
            sl.last = new if sl.last == old else sl.last
        for eff in d.effects:
            eff.at = new if eff.at == old else eff.at


def test_a_free_planned_before_a_read_waits_for_it_and_says_so(monkeypatch, caplog):
    planned = plan_step(MODEL, WORKLOAD, ALGO, CPU, ScheduleSpec(name="serial"))
    plan, graph = copy.deepcopy(planned.plan), planned.graph
    # A defective plan: the vision features are freed right after they are made, though
    # the training prefix reads them later.
    value = "rollout.vision_encode.features"
    maker = next(s for s in plan.all_steps() if s.op == "rollout.vision_encode")
    free = next(
        e for e in plan.devices[0].effects if e.action is MemAction.FREE and e.value == value
    )
    reader = next(s for s in plan.all_steps() if s.index == free.at)
    free.at = maker.index
    with caplog.at_level(logging.WARNING, logger="rollplex.runtime.executor"):
        seen, _, results = _watched_run(monkeypatch, plan, graph)
    assert value not in seen.left.get(maker.index, [])  # not dropped under its reader
    assert value in seen.left[reader.index]  # dropped after the last read instead
    (warning,) = [r.getMessage() for r in caplog.records if value in r.getMessage()]
    assert maker.name in warning and reader.name in warning
    step = next(m for m in results[0].steps if m.step.name == maker.name)
    assert step.deviations == [warning.split(f"at '{maker.name}': ", 1)[1]]
    trace = build_profiler_trace(measured_timeline(plan, results), 0)
    marks = [e for e in trace["traceEvents"] if e["ph"] == "i" and e["name"] != "[memory]"]
    assert [m["args"]["text"] for m in marks] == step.deviations
    assert marks[0]["tid"] == maker.stream


def test_an_sm_partition_the_runtime_cannot_set_up_is_reported_at_its_first_step():
    r = plan_step(MODEL, WORKLOAD, ALGO, CPU, ScheduleSpec(name="rollplex", overlap="sm_partition"))
    parts = [(d.name, st) for d in r.plan.devices for st in d.streams if st.partition]
    assert parts  # the plan does ask for partitions
    ex = Executor(r.plan, r.graph, compose(StepConfig(MODEL, ALGO, seed=0, max_new_tokens=4)))
    assert not any("SM partition" in m for ms in ex.deviations.values() for m in ms)  # CPU
    pos = {s.index: k for k, s in enumerate(ex.order)}
    for k, msg in unpartitioned_streams(r.plan, pos):  # what a CUDA executor reports
        ex._deviate(k, msg)
    for name, st in parts:
        first = min(pos[i] for i in st.steps)
        assert any(f"'{name}:{st.name}' is planned on an SM partition" in m
                   for m in ex.deviations[first])  # fmt: skip
