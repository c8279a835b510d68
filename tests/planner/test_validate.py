"""validate_plan rejects hand-corrupted plans, each with a message that names the fault."""

from __future__ import annotations

import copy

import pytest

from rollplex.jobs.pipeline import PlanResult
from rollplex.planner.validate import PlanError, validate_plan


def corrupt(r: PlanResult) -> PlanResult:
    return PlanResult(copy.deepcopy(r.plan), r.graph, r.source, r.passes, r.report)


def test_overlapping_slots(plans_7b: dict[str, PlanResult]) -> None:
    r = corrupt(plans_7b["rollplex"])
    dev = r.plan.devices[0]
    by_step = {s.index: s for s in dev.steps}
    # Two slots of one lane that are live together: put the second on the first's bytes.
    slots = sorted((s for s in dev.slots if s.lane == 0 and s.size), key=lambda s: -s.size)
    a = slots[0]
    b = next(
        s
        for s in slots[1:]
        if by_step[s.first].start_s < by_step[a.last].end_s
        and by_step[a.first].start_s < by_step[s.last].end_s
    )
    b.offset = a.offset
    with pytest.raises(PlanError, match="overlap while both are live") as err:
        validate_plan(r.plan, r.graph)
    assert a.value in str(err.value) and b.value in str(err.value)


def test_missing_event(plans_7b: dict[str, PlanResult]) -> None:
    r = corrupt(plans_7b["rollplex_piggyback"])
    # The response part reads the prefix made on the decode stream: drop that wait.
    step = next(s for s in r.plan.all_steps() if s.op == "train.logprob_response")
    step.waits.clear()
    with pytest.raises(PlanError, match="without waiting for its event") as err:
        validate_plan(r.plan, r.graph)
    assert "train.logprob_response" in str(err.value)


def test_over_budget(plans_7b: dict[str, PlanResult]) -> None:
    r = corrupt(plans_7b["serial_dedup"])
    r.plan.devices[0].budget_bytes = r.plan.devices[0].peak_bytes - 1
    with pytest.raises(PlanError, match=r"exceeds the budget \d+ B by 1 B"):
        validate_plan(r.plan, r.graph)


def test_stale_policy_version(plans_7b: dict[str, PlanResult]) -> None:
    r = corrupt(plans_7b["rollplex"])
    decode = next(s for s in r.plan.all_steps() if s.kind == "decode")
    decode.weights_version = "policy@-1"  # sampled with last step's weights
    with pytest.raises(PlanError, match="off-policy") as err:
        validate_plan(r.plan, r.graph)
    assert "rollout.decode" in str(err.value)


def test_transfer_after_rollout(plans_7b: dict[str, PlanResult]) -> None:
    r = corrupt(plans_7b["disaggregated"])
    roll = r.plan.devices[0]
    first = next(
        s
        for s in sorted(roll.steps, key=lambda s: s.start_s)
        if s.phase == "rollout" and s.kind != "weight_sync"
    )
    first.waits.clear()
    first.start_s = -1.0
    with pytest.raises(PlanError, match="weight transfer"):
        validate_plan(r.plan, r.graph)
