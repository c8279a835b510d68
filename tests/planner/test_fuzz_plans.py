"""Fuzz: randomly corrupted plans, as plan.json text and as objects, meet only PlanError,
naming the part at fault: `load_plan` and `validate_plan` never end in a bare KeyError,
IndexError, AttributeError or TypeError. Seeded and fast (tiny plans)."""

from __future__ import annotations

import copy
import json
import math
import random
import re

import pytest

from rollplex.jobs.pipeline import PlanResult, plan_step
from rollplex.planner.plan import Plan, dump_plan
from rollplex.planner.validate import PlanError, load_plan, validate_plan
from rollplex.specs import HARDWARE_PRESETS, MODEL_PRESETS, WORKLOAD_PRESETS, AlgoSpec, ScheduleSpec

CASES = 400
NAMED = re.compile(r"plan\.json: \S|device '|step|slot|event|transfer|plan: \w|plan has")


@pytest.fixture(scope="module")
def plans() -> list[PlanResult]:
    tiny, load = MODEL_PRESETS["tiny"], WORKLOAD_PRESETS["tiny"]
    return [
        plan_step(tiny, load, AlgoSpec(), HARDWARE_PRESETS[hw], ScheduleSpec(**kw))
        for hw, kw in (
            ("h200", {"name": "serial", "dedup": False}),
            ("h200", {"name": "rollplex", "overlap": "piggyback"}),
            ("h200x2", {"name": "disaggregated"}),
            ("h200", {"name": "rollplex", "overlap": "streams", "chunk_tokens": 32}),
        )
    ]


def _junk(rng: random.Random, near: object) -> object:
    """A replacement for a JSON leaf: same type nudged, another type, or a non-number."""
    if isinstance(near, bool):
        return rng.choice([not near, None, 0, "yes"])
    if isinstance(near, int):
        return rng.choice([near + 1, near - 1, -1, 0, 10**6, 2**63, None, "1", 0.5, near * 2])
    if isinstance(near, float):
        return rng.choice([near * 2, -near - 1.0, 0.0, 1e308, -1e-3, None, "nan"])
    if isinstance(near, str):
        return rng.choice(["", "x", near + "x", near[:-1], None, 3])
    return rng.choice([None, [], {}, 1, "x", [1, 2], {"a": 1}])


def _mutate_json(data: dict, rng: random.Random) -> None:
    node, key = data, None
    for _ in range(rng.randrange(2, 8)):
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        if not keys:
            break
        key = rng.choice(keys)
        child = node[key]
        if not isinstance(child, dict | list) or not child or rng.random() < 0.15:
            break
        node, key = child, None
    if key is None:
        return
    roll = rng.random()
    if roll < 0.15 and isinstance(node, dict):
        del node[key]
    elif roll < 0.3 and isinstance(node, list):
        node.append(copy.deepcopy(node[key]))  # a duplicate entry (a step, a slot, an event)
    elif roll < 0.4 and isinstance(node, list):
        del node[key]
    elif roll < 0.45 and isinstance(node, dict):
        node["unexpected"] = 1
    else:
        node[key] = _junk(rng, node[key])


def test_corrupted_plan_json_meets_only_named_plan_errors(plans: list[PlanResult]) -> None:
    refused = 0
    texts = [json.loads(dump_plan(r.plan)) for r in plans]
    for seed in range(CASES):
        rng = random.Random(seed)
        k = rng.randrange(len(plans))
        data = copy.deepcopy(texts[k])
        for _ in range(rng.choice([1, 1, 2])):
            _mutate_json(data, rng)
        text = json.dumps(data)
        try:
            load_plan(text, plans[k].graph, budget=rng.random() < 0.5)
        except PlanError as err:
            assert NAMED.search(str(err)), (seed, str(err))
            refused += 1
    assert refused > CASES // 2


def _mutate_object(plan: Plan, rng: random.Random) -> None:
    """A type-correct edit of an in-memory plan: an index, name, time or size gone wrong."""
    dev = rng.choice(plan.devices)
    steps = [s.index for d in plan.devices for s in d.steps]
    edit = rng.randrange(10)
    if edit == 0 and dev.steps:
        rng.choice(dev.steps).index = rng.choice([*steps, max(steps) + 7])
    elif edit == 1 and dev.slots:
        sl = rng.choice(dev.slots)
        setattr(sl, rng.choice(["first", "last"]), rng.choice([*steps, -1, 10**6]))
    elif edit == 2 and dev.slots:
        sl = rng.choice(dev.slots)
        setattr(sl, rng.choice(["offset", "size"]), rng.choice([-1, 0, 2**40, sl.offset + 1]))
    elif edit == 3 and dev.steps:
        s = rng.choice(dev.steps)
        setattr(s, rng.choice(["start_s", "end_s", "solo_s"]), rng.choice([math.nan, -1.0, 1e9]))
    elif edit == 4 and dev.steps:
        rng.choice(dev.steps).waits.append(rng.choice([0, 1, 99, -1]))
    elif edit == 5 and dev.steps:
        rng.choice(dev.steps).op = rng.choice(["x", "rollout.decode", "train.backward"])
    elif edit == 6 and dev.streams and dev.streams[0].steps:
        st = rng.choice(dev.streams)
        st.steps.append(rng.choice(steps)) if rng.random() < 0.5 else st.steps.clear()
    elif edit == 7 and plan.events:
        e = rng.choice(plan.events)
        setattr(e, rng.choice(["step", "id", "stream"]), rng.choice([*steps, 99, -1]))
    elif edit == 8 and dev.effects:
        ef = rng.choice(dev.effects)
        ef.value, ef.at = rng.choice(["ghost", ef.value]), rng.choice([*steps, 10**6])
    elif edit == 9:
        dev.ranks = rng.choice([[], [0], [*dev.ranks, *dev.ranks]])


def test_corrupted_plan_objects_meet_only_named_plan_errors(plans: list[PlanResult]) -> None:
    refused = 0
    for seed in range(CASES):
        rng = random.Random(seed)
        r = plans[rng.randrange(len(plans))]
        plan = copy.deepcopy(r.plan)
        _mutate_object(plan, rng)
        try:
            validate_plan(plan, r.graph, budget=False)
        except PlanError as err:
            assert NAMED.search(str(err)), (seed, str(err))
            refused += 1
    assert refused > CASES // 2
