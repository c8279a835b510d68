"""plan.json round-trips: load_plan(dump_plan(p)) == p for every schedule and overlap mode."""

from __future__ import annotations

import json

import pytest

from rollplex.planner.plan import CoRun, dump_plan
from rollplex.planner.validate import PlanError, load_plan

from .conftest import plan_7b


@pytest.mark.parametrize(
    "schedule, kw",
    [
        ("serial", {"dedup": False}),
        ("serial", {}),
        ("disaggregated", {}),
        ("rollplex", {}),
        ("rollplex", {"overlap": "piggyback"}),
        ("rollplex", {"overlap": "streams"}),
        ("rollplex", {"overlap": "sm_partition"}),
    ],
)
def test_plan_round_trips(schedule: str, kw: dict) -> None:
    plan = plan_7b(schedule, **kw).plan
    text = dump_plan(plan)
    back = load_plan(text)
    assert back == plan
    assert dump_plan(back) == text
    steps = [s for d in back.devices for s in d.steps]
    assert all(isinstance(s.corun, CoRun) for s in steps)
    assert all(isinstance(k, int) for d in back.devices for k in d.arena_bytes)


def test_a_corrupt_plan_is_named_by_field() -> None:
    data = json.loads(dump_plan(plan_7b("serial").plan))
    data["devices"][0]["steps"][0]["corun"] = "sideways"
    with pytest.raises(PlanError, match=r"devices\.0\.steps\.0\.corun"):
        load_plan(json.dumps(data))
