"""Fuzz: randomly mutated graphs (as objects and as JSON) meet only the project's own
errors, each naming an op or value (or the JSON entry) at fault: lint and planning never
end in a bare KeyError, IndexError, AttributeError or RuntimeError. Seeded and fast."""

from __future__ import annotations

import copy
import json
import random
import re

import pytest

from rollplex.graph.invariants import lint
from rollplex.graph.ir import Graph, GraphError, Phase, ValueKind
from rollplex.graph.passes import DEDUP_PASSES
from rollplex.graph.schema import all_kinds
from rollplex.graph.serialize import from_dict, from_json, to_dict
from rollplex.jobs.pipeline import plan_step
from rollplex.planner.residency import PlanOverBudget
from rollplex.planner.validate import PlanError
from rollplex.specs import HARDWARE_PRESETS, MODEL_PRESETS, WORKLOAD_PRESETS, AlgoSpec, ScheduleSpec

CASES = 300
ALLOWED = (GraphError, PlanError, PlanOverBudget)
DTYPES = ["float32", "bfloat16", "int64", "int32", "float64", "float8", ""]
VERSIONS = [None, "policy@0", "policy@1", "policy@-1", "ref@0", "vision@0", "policy", "@", "x@y"]
GROUPS = [1, 2, 4, 8, 0, -1, 2.5, "4", True]
SCHEDULES = [
    ScheduleSpec(name="serial", dedup=False),
    ScheduleSpec(name="rollplex", overlap="piggyback", chunk_tokens=32),
    ScheduleSpec(name="rollplex", overlap="streams", train_micro_tokens=64),
]


def _mutate(g: Graph, rng: random.Random) -> None:
    """One random edit of an op's wiring, kind, phase or attributes, or of a value."""
    op = g.ops[rng.choice(list(g.ops))]
    names = list(g.values)
    v = g.values[rng.choice(names)]
    edit = rng.randrange(14)
    if edit == 0 and op.inputs:
        op.inputs[rng.choice(list(op.inputs))] = rng.choice([*names, "no.such.value"])
    elif edit == 1 and op.inputs:
        del op.inputs[rng.choice(list(op.inputs))]
    elif edit == 2 and op.outputs:
        del op.outputs[rng.choice(list(op.outputs))]
    elif edit == 3:
        op.inputs[rng.choice(["extra", "saved_9", "rewards_3"])] = rng.choice(names)
    elif edit == 4:
        v.dtype = rng.choice(DTYPES)
    elif edit == 5 and v.shape:
        axis = rng.randrange(len(v.shape))
        v.shape = (*v.shape[:axis], rng.choice([0, 1, 3, 64, -2]), *v.shape[axis + 1 :])
    elif edit == 6:
        v.kind = rng.choice(list(ValueKind))
    elif edit == 7:
        v.version = rng.choice(VERSIONS)
    elif edit == 8:
        v.external = not v.external
    elif edit == 9:
        op.attrs["group_size"] = rng.choice(GROUPS)
    elif edit == 10:
        op.kind = rng.choice([*all_kinds(), "no_such_kind"])
    elif edit == 11:
        op.phase = rng.choice(list(Phase))
    elif edit == 12:
        del g.ops[op.name]
    elif edit == 13 and op.outputs:
        other = g.ops[rng.choice(list(g.ops))]
        other.outputs[rng.choice(list(op.outputs))] = rng.choice(list(op.outputs.values()))
    g.invalidate()


def _names_a_part(g: Graph, message: str) -> bool:
    quoted = set(re.findall(r"'([^']+)'", message))
    return bool(quoted & (set(g.ops) | set(g.values) | set(all_kinds()))) or bool(
        re.search(r"op kind|device|step|slot|plan|value|op '", message)
    )


def test_mutated_graphs_meet_only_named_project_errors(grpo_tiny: Graph) -> None:
    refused = planned = 0
    for seed in range(CASES):
        rng = random.Random(seed)
        g = grpo_tiny.copy()
        for _ in range(rng.choice([1, 1, 2, 3])):
            _mutate(g, rng)
        try:
            lint(g)
        except GraphError as err:
            assert _names_a_part(g, str(err)), (seed, str(err))
            refused += 1
            continue
        try:
            plan_step(
                MODEL_PRESETS["tiny"], WORKLOAD_PRESETS["tiny"], AlgoSpec(),
                HARDWARE_PRESETS["h200"], rng.choice(SCHEDULES), graph=g,
                passes=rng.choice([(), DEDUP_PASSES, None]),
            )  # fmt: skip
            planned += 1
        except ALLOWED as err:
            assert _names_a_part(g, str(err)), (seed, str(err))
    assert refused > CASES // 2 and planned > 10  # the fuzz reaches both sides


def _json_mutate(data: dict, rng: random.Random) -> None:
    """One random edit anywhere in the graph's JSON: a field dropped, retyped or junked."""
    node, key = data, None
    for _ in range(rng.randrange(1, 5)):
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        if not keys:
            break
        key = rng.choice(keys)
        child = node[key]
        if not isinstance(child, dict | list) or not child or rng.random() < 0.3:
            break
        node, key = child, None
    if key is None:
        return
    junk = [None, -1, 0, 2.5, "x", [], {}, True, [1, "a"], {"a": 1}, "policy@0"]
    if isinstance(node, dict) and rng.random() < 0.3:
        del node[key]
    else:
        node[key] = rng.choice(junk)


def test_mutated_graph_json_meets_only_graph_errors(grpo_tiny: Graph) -> None:
    base = to_dict(grpo_tiny)
    refused = 0
    for seed in range(CASES):
        rng = random.Random(seed)
        data = copy.deepcopy(base)
        _json_mutate(data, rng)
        try:
            lint(from_json(json.dumps(data)))
        except GraphError as err:
            assert re.search(r"values\[|ops\[|graph JSON|'", str(err)), (seed, str(err))
            refused += 1
    assert refused > CASES // 2


@pytest.mark.parametrize("junk", ["[]", "3", "{}", '{"format": 1}', "not json"])
def test_graph_json_that_is_not_a_graph(junk: str) -> None:
    with pytest.raises(GraphError, match="graph JSON"):
        from_json(junk)
    if junk.startswith("{"):
        with pytest.raises(GraphError):
            from_dict(json.loads(junk))
