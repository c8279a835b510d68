"""The planner takes a Graph: it never builds or rewrites one, and dispatches schedules
through the SCHEDULES registry."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import rollplex.planner
from rollplex.jobs.pipeline import build_graph
from rollplex.planner import api
from rollplex.planner.schedules import SCHEDULES
from rollplex.specs import HARDWARE_PRESETS, MODEL_PRESETS, WORKLOAD_PRESETS, AlgoSpec
from rollplex.specs.schedule import ScheduleSpec


def test_planner_imports_no_builder_and_no_passes() -> None:
    for path in Path(rollplex.planner.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert not node.module.startswith(
                    ("rollplex.algos", "rollplex.graph.passes", "rollplex.jobs")
                ), f"{path.name} imports {node.module}"


@pytest.mark.parametrize("name", ["serial", "disaggregated", "rollplex"])
def test_plan_graph_dispatches_through_the_registry(name: str, monkeypatch) -> None:
    calls = []
    inner = SCHEDULES[name]

    def spy(ctx, evaluate=None):
        calls.append(ctx.graph)
        return inner(ctx, evaluate=evaluate)

    monkeypatch.setitem(SCHEDULES, name, spy)
    model, work = MODEL_PRESETS["qwen2_5_vl_7b"], WORKLOAD_PRESETS["image"]
    schedule = ScheduleSpec(name=name, parallel={"rollout_tp": 2})
    _, graph, _ = build_graph(model, work, AlgoSpec(), schedule)
    plan = api.plan_graph(graph, model, work, HARDWARE_PRESETS["h200x8"], schedule)
    assert calls == [graph]
    assert plan.schedule == name
