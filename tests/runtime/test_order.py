"""The issue order: the plan's own (its step indices), within what every stream and event
allows; where the indices contradict them, the deviation is named."""

from __future__ import annotations

import copy
import random

import pytest

from rollplex.jobs.pipeline import plan_step
from rollplex.planner.plan import Event
from rollplex.runtime import OrderError, issue_order, plan_order
from rollplex.specs import ScheduleSpec
from tests.runtime.conftest import ALGO, CPU, MODEL, WORKLOAD

SCHEDULES = [
    ScheduleSpec(name="serial"),
    ScheduleSpec(name="serial", dedup=False),
    ScheduleSpec(name="rollplex", overlap="piggyback", chunk_tokens=40),
    ScheduleSpec(name="rollplex", overlap="streams", chunk_tokens=40),
    ScheduleSpec(name="rollplex", overlap="sm_partition"),
]


@pytest.fixture(scope="module", params=SCHEDULES, ids=lambda s: f"{s.name}-{s.overlap}")
def plan(request):
    return plan_step(MODEL, WORKLOAD, ALGO, CPU, request.param).plan


def test_order_respects_streams_and_events(plan):
    order = issue_order(plan)
    pos = {s.index: k for k, s in enumerate(order)}
    assert sorted(pos) == sorted(s.index for d in plan.devices for s in d.steps)
    for d in plan.devices:
        for st in d.streams:
            assert [pos[i] for i in st.steps] == sorted(pos[i] for i in st.steps)
    recorded = {e.id: e.step for e in plan.events}
    for s in order:
        assert all(pos[recorded[e]] < pos[s.index] for e in s.waits)


def test_order_is_deterministic_and_ignores_list_order(plan):
    shuffled = copy.deepcopy(plan)
    for d in shuffled.devices:
        random.Random(0).shuffle(d.steps)
    random.Random(1).shuffle(shuffled.events)
    assert [s.index for s in issue_order(plan)] == [s.index for s in issue_order(shuffled)]


def test_a_wait_that_never_fires_is_an_error(plan):
    broken = copy.deepcopy(plan)
    broken.devices[0].steps[0].waits.append(10_000)
    with pytest.raises(OrderError, match="no step records"):
        issue_order(broken)


def test_a_plan_whose_indices_agree_is_issued_in_index_order(plan):
    order, deviations = plan_order(plan)
    assert [s.index for s in order] == sorted(s.index for d in plan.devices for s in d.steps)
    assert deviations == []


def test_indices_against_an_event_are_reported_not_followed(plan):
    broken = copy.deepcopy(plan)
    dev = broken.devices[0]
    first, last = dev.streams[0].steps[0], dev.streams[0].steps[-1]
    by_index = {s.index: s for s in dev.steps}
    # The first step now waits for the last one: the indices cannot be followed.
    by_index[last].signals = 10_000
    broken.events.append(Event(10_000, last, dev.name, by_index[last].stream))
    by_index[first].waits.append(10_000)
    dev.streams[0].steps.remove(last)
    dev.streams[0].steps.insert(0, last)
    order, deviations = plan_order(broken)
    assert order[0].index == last and order[1].index == first
    (d,) = deviations
    assert (d.step.index, d.behind.index) == (last, first)
    assert f"(plan index {last})" in d.message() and by_index[first].name in d.message()
