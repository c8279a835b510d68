"""The audit's ill-formed graphs (and a few more): lint refuses each naming the op or value
at fault, and so does `plan_step(graph=g, passes=())`, which plans nothing unlinted."""

from __future__ import annotations

import pytest

from rollplex.graph.invariants import lint
from rollplex.graph.ir import Graph, GraphError
from rollplex.jobs.pipeline import plan_step
from rollplex.specs import HARDWARE_PRESETS, MODEL_PRESETS, WORKLOAD_PRESETS, AlgoSpec, ScheduleSpec
from tests.graph.bad_graphs import BAD_GRAPHS

SCHEDULES = [
    ScheduleSpec(name="serial", dedup=False),
    ScheduleSpec(name="rollplex", overlap="piggyback"),
]


def _bad(grpo_tiny: Graph, case: str) -> tuple[Graph, str]:
    g = grpo_tiny.copy()
    culprit = BAD_GRAPHS[case](g)
    g.invalidate()
    return g, culprit


@pytest.mark.parametrize("case", sorted(BAD_GRAPHS))
def test_lint_names_the_culprit(grpo_tiny: Graph, case: str) -> None:
    g, culprit = _bad(grpo_tiny, case)
    with pytest.raises(GraphError) as err:
        lint(g)
    assert culprit in str(err.value)


@pytest.mark.parametrize("case", sorted(BAD_GRAPHS))
@pytest.mark.parametrize("schedule", SCHEDULES, ids=lambda s: f"{s.name}-{s.overlap}")
def test_plan_step_lints_whatever_the_passes(
    grpo_tiny: Graph, case: str, schedule: ScheduleSpec
) -> None:
    g, culprit = _bad(grpo_tiny, case)
    for passes in ((), None):
        with pytest.raises(GraphError) as err:
            plan_step(
                MODEL_PRESETS["tiny"], WORKLOAD_PRESETS["tiny"], AlgoSpec(),
                HARDWARE_PRESETS["h200"], schedule, graph=g, passes=passes,
            )  # fmt: skip
        assert culprit in str(err.value)


def test_the_good_graph_plans(grpo_tiny: Graph) -> None:
    """The base of every case above is valid: each error is the edit's."""
    for schedule in SCHEDULES:
        plan_step(
            MODEL_PRESETS["tiny"], WORKLOAD_PRESETS["tiny"], AlgoSpec(),
            HARDWARE_PRESETS["h200"], schedule, graph=grpo_tiny, passes=(),
        )  # fmt: skip
