"""The disaggregated split search: its bound never exceeds a split's planned step, the
pruned search picks what the exhaustive one picks, and only splits that fit are chosen."""

from __future__ import annotations

import pytest

from rollplex.jobs.pipeline import build_graph, plan_step
from rollplex.planner.cost_model import CostModel
from rollplex.planner.schedules import disaggregated as D
from rollplex.planner.schedules.common import PlanningContext
from rollplex.planner.simulate import replay
from rollplex.specs import HARDWARE_PRESETS, MODEL_PRESETS, WORKLOAD_PRESETS, AlgoSpec
from rollplex.specs.schedule import ScheduleSpec

CASES = [  # (model, workload, hardware, gpus)
    ("qwen2_5_vl_3b", "image", "h200x8", 8),
    ("qwen2_5_vl_7b", "video", "h200x8", 32),
    ("qwen2_5_vl_32b", "video", "h800x32", 32),
    ("qwen2_5_vl_72b", "image", "h800x32", 64),
]


def _ctx(model: str, workload: str, hw: str, n: int) -> PlanningContext:
    m, w = MODEL_PRESETS[model], WORKLOAD_PRESETS[workload]
    h = HARDWARE_PRESETS[hw].model_copy(update={"num_gpus": n})
    sched = ScheduleSpec(name="disaggregated")
    _, g, _ = build_graph(m, w, AlgoSpec(), sched)
    return PlanningContext(g, m, w, h, sched, CostModel(h))


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-{c[3]}")
def test_bound_is_below_every_split_and_the_search_matches_exhaustive(case) -> None:
    ctx = _ctx(*case)
    n = ctx.hardware.num_gpus
    bound = D.SplitBound(ctx, n)
    options = D._pool_layouts(ctx, n, None)
    times = {}
    for r, tp in options[:: max(1, len(options) // 12)] + options[-2:]:
        t = replay(D._plan_pools(ctx, r, n - r, tp))
        times[(r, tp)] = t
        assert bound(r, tp) <= t * (1 + 1e-9), (r, tp, bound(r, tp), t)
    # pruned search (replay score) == the fastest of every split
    best = D.plan_disaggregated(ctx)
    exhaustive = min(replay(D._plan_pools(ctx, r, n - r, tp)) for r, tp in options)
    assert best.step_time_s == pytest.approx(exhaustive, rel=1e-12)
    assert "bounded out" in best.notes[-1]


def test_infeasible_splits_are_skipped_and_none_fitting_is_reported() -> None:
    m, w = MODEL_PRESETS["qwen2_5_vl_7b"], WORKLOAD_PRESETS["video"]
    hw = HARDWARE_PRESETS["h200x8"]
    fits = plan_step(m, w, AlgoSpec(), hw, ScheduleSpec(name="disaggregated"))
    assert fits.plan.fits_budget
    tight = hw.model_copy(update={"num_gpus": 4, "hbm_gib": 20.0})
    res = plan_step(
        m, w, AlgoSpec(), tight, ScheduleSpec(name="disaggregated"), enforce_budget=False
    )
    assert not res.plan.fits_budget
    assert any("no split fits the budget" in n for n in res.plan.notes)
    with pytest.raises(ValueError, match="needs"):
        plan_step(m, w, AlgoSpec(), tight, ScheduleSpec(name="disaggregated"))
