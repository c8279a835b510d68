"""The audit's corrupted plans (and the rest of what a plan refers to): `validate_plan` and
`load_plan` refuse each with a PlanError that names the culprit, never a bare KeyError."""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable

import pytest

from rollplex.algos import build_step
from rollplex.graph.ir import Graph
from rollplex.jobs.pipeline import PlanResult, plan_step
from rollplex.planner.plan import Event, MemAction, MemoryEffect, Plan, Slot, dump_plan
from rollplex.planner.validate import PlanError, load_plan, validate_plan
from rollplex.specs import HARDWARE_PRESETS, MODEL_PRESETS, WORKLOAD_PRESETS, AlgoSpec, ScheduleSpec

TINY, TINY_LOAD = MODEL_PRESETS["tiny"], WORKLOAD_PRESETS["tiny"]


def _plan(schedule: ScheduleSpec, gpus: str = "h200") -> PlanResult:
    return plan_step(TINY, TINY_LOAD, AlgoSpec(), HARDWARE_PRESETS[gpus], schedule)


@pytest.fixture(scope="module")
def plans() -> dict[str, PlanResult]:
    return {
        "serial": _plan(ScheduleSpec(name="serial")),
        "piggyback": _plan(ScheduleSpec(name="rollplex", overlap="piggyback")),
        "disaggregated": _plan(ScheduleSpec(name="disaggregated"), "h200x2"),
    }


def _waiting_step(plan: Plan):
    return next(s for d in plan.devices for s in d.steps if s.waits)


def _sized_slot(plan: Plan) -> Slot:
    return next(sl for sl in plan.devices[0].slots if sl.size)


def _dup_index(p: Plan) -> str:
    a, b = p.devices[0].steps[:2]
    b.index = a.index
    return str(a.index)


def _slot_value(p: Plan) -> str:
    _sized_slot(p).value = "no.such.value"
    return "no.such.value"


def _effect_value(p: Plan) -> str:
    p.devices[0].effects.append(MemoryEffect(MemAction.ALLOC, "ghost.value", 0, 8))
    return "ghost.value"


def _step_op(p: Plan) -> str:
    p.devices[0].steps[-1].op = "train.no_such_op"
    return "train.no_such_op"


def _missing_event(p: Plan) -> str:
    s = _waiting_step(p)
    s.waits.append(999)
    return "999"


def _end_before_start(p: Plan) -> str:
    s = p.devices[0].steps[1]
    s.end_s = s.start_s - 1.0
    return s.name


def _nan_time(p: Plan) -> str:
    s = p.devices[0].steps[0]
    s.solo_s = math.nan
    return "solo_s"


def _negative_offset(p: Plan) -> str:
    sl = _sized_slot(p)
    sl.offset = -64
    return sl.value


def _slot_missing_step(p: Plan) -> str:
    sl = _sized_slot(p)
    sl.last = 10_000
    return sl.value


def _event_missing_step(p: Plan) -> str:
    p.events.append(Event(len(p.events) + 50, 10_000, p.devices[0].name, 0))
    return "10000"


def _step_on_no_stream(p: Plan) -> str:
    st = p.devices[0].streams[0]
    name = next(s.name for s in p.devices[0].steps if s.index == st.steps[-1])
    st.steps.pop()
    return name


def _stream_lists_stranger(p: Plan) -> str:
    p.devices[0].streams[0].steps.append(10_000)
    return "10000"


def _slot_past_arena(p: Plan) -> str:
    sl = _sized_slot(p)
    sl.offset = p.devices[0].arena_bytes[sl.lane]
    return sl.value


def _rank_twice(p: Plan) -> str:
    p.devices[1].ranks.append(p.devices[0].ranks[0])
    return f"rank {p.devices[0].ranks[0]}"


def _infinite_step_time(p: Plan) -> str:
    p.step_time_s = math.inf
    return "step_time_s"


def _wrong_kind(p: Plan) -> str:
    s = next(s for s in p.devices[0].steps if s.kind == "decode")
    s.kind = "backward"
    return s.op


def _offload_of_nothing(p: Plan) -> str:
    s = p.devices[0].steps[0]
    s.kind = "offload"
    return s.op


CORRUPTIONS: dict[str, tuple[str, Callable[[Plan], str]]] = {
    # the audit's
    "duplicate step index": ("serial", _dup_index),
    "slot names a missing value": ("serial", _slot_value),
    "effect names a missing value": ("serial", _effect_value),
    "step names a missing op": ("serial", _step_op),
    "missing event": ("piggyback", _missing_event),
    "end before start": ("serial", _end_before_start),
    "NaN step time": ("serial", _nan_time),
    "negative offset": ("serial", _negative_offset),
    "slot points at a missing step": ("serial", _slot_missing_step),
    # the rest of what a plan refers to
    "event records a missing step": ("piggyback", _event_missing_step),
    "step on no stream": ("piggyback", _step_on_no_stream),
    "stream lists a step of no device": ("serial", _stream_lists_stranger),
    "slot past its arena": ("serial", _slot_past_arena),
    "rank in two groups": ("disaggregated", _rank_twice),
    "infinite step time": ("serial", _infinite_step_time),
    "step kind is not its op's": ("piggyback", _wrong_kind),
    "offload of a value with no slot": ("serial", _offload_of_nothing),
}


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_corrupt_plan_is_refused_by_name(case: str, plans: dict[str, PlanResult]) -> None:
    base, corrupt = CORRUPTIONS[case]
    r = plans[base]
    plan = copy.deepcopy(r.plan)
    culprit = corrupt(plan)
    with pytest.raises(PlanError) as err:
        validate_plan(plan, r.graph)
    assert culprit in str(err.value)


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_load_plan_validates(case: str, plans: dict[str, PlanResult]) -> None:
    """The same corruptions written to plan.json: load_plan refuses them too (NaN and inf at
    the schema, which allows no non-finite number)."""
    base, corrupt = CORRUPTIONS[case]
    r = plans[base]
    plan = copy.deepcopy(r.plan)
    corrupt(plan)
    text = dump_plan(plan)
    with pytest.raises(PlanError):
        load_plan(text, r.graph)
    assert load_plan(dump_plan(r.plan), r.graph) == r.plan


def test_unknown_field_is_refused(plans: dict[str, PlanResult]) -> None:
    data = json.loads(dump_plan(plans["serial"].plan))
    data["devices"][0]["slots"][0]["offest"] = 0
    with pytest.raises(PlanError, match=r"devices\.0\.slots\.0\.offest"):
        load_plan(json.dumps(data))
    data = json.loads(dump_plan(plans["serial"].plan))
    data["predicted_speedup"] = 2.0
    with pytest.raises(PlanError, match="predicted_speedup"):
        load_plan(json.dumps(data))


def test_nan_in_json_is_refused(plans: dict[str, PlanResult]) -> None:
    text = dump_plan(plans["serial"].plan).replace('"end_s": ', '"end_s": NaN, "x": ', 1)
    data = json.loads(dump_plan(plans["serial"].plan))
    data["devices"][0]["steps"][0]["end_s"] = math.nan
    with pytest.raises(PlanError, match=r"devices\.0\.steps\.0\.end_s"):
        load_plan(json.dumps(data))
    with pytest.raises(PlanError):
        load_plan(text)


def test_plan_of_another_graph_is_refused(plans: dict[str, PlanResult]) -> None:
    r = plans["serial"]
    other: Graph = build_step(TINY, TINY_LOAD.model_copy(update={"group_size": 3}), AlgoSpec())
    with pytest.raises(PlanError, match="graph_hash"):
        validate_plan(r.plan, other)
    plan = copy.deepcopy(r.plan)
    plan.graph_hash = "0" * 64
    with pytest.raises(PlanError, match="0000000000"):
        load_plan(dump_plan(plan), r.graph)
    load_plan(dump_plan(plan))  # without a graph there is nothing to compare it with


def test_plan_totals_and_labels_agree_with_the_graph(plans: dict[str, PlanResult]) -> None:
    r = plans["piggyback"]
    for edit, culprit in (
        (lambda p: setattr(p, "policy_version", "policy@1"), "policy_version"),
        (lambda p: setattr(p, "schedule", "verl"), "schedule"),
        (lambda p: setattr(p, "step_time_s", p.step_time_s / 2), "step_time_s"),
        (lambda p: p.meta.update(train_micro_batches=0), "train_micro_batches"),
        (lambda p: setattr(p.devices[0], "dp", 2), "tp=1 x dp=2"),
        (lambda p: setattr(p.devices[0], "peak_bytes", 1), "peak_bytes"),
    ):
        plan = copy.deepcopy(r.plan)
        edit(plan)
        with pytest.raises(PlanError, match=culprit):
            validate_plan(plan, r.graph)
