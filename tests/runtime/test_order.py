"""The issue order: one deterministic order that every stream and event agrees with."""

from __future__ import annotations

import copy
import random

import pytest

from rollplex.jobs.pipeline import plan_step
from rollplex.runtime import OrderError, issue_order
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
