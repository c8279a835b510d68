"""The rollplex search scores trials on plans built from shared steps (trials.py); the
plans it returns must be the ones full builds of every trial give."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from rollplex.jobs.pipeline import plan_step
from rollplex.planner.plan import Plan, Step
from rollplex.planner.schedules import rollplex as rollplex_schedule
from rollplex.planner.schedules.trials import TrialPlans
from rollplex.planner.simulate import replay
from rollplex.specs import HARDWARE_PRESETS, MODEL_PRESETS, WORKLOAD_PRESETS, AlgoSpec, ScheduleSpec

from .conftest import VIDEO_16, replicated

ROOMY = HARDWARE_PRESETS["h200x8"].model_copy(update={"hbm_gib": 1e6})
CONFIGS = [
    # (model, workload, hardware, overlap, replicated copies or None)
    ("qwen2_5_vl_7b", "video", "h200x8", "auto", None),
    ("qwen2_5_vl_7b", "image", "h200x8", "streams", None),
    ("qwen2_5_vl_7b", "video", "h200x8", "sm_partition", None),
    ("qwen2_5_vl_3b", "video", "h200x8", "piggyback", None),
    ("qwen2_5_vl_32b", "video", "h800x32", "auto", None),
    ("qwen2_5_vl_7b", "video", "roomy", "auto", 6),
]


def _plan(cfg: tuple) -> Plan:
    model, workload, hw, overlap, copies = cfg
    hardware = ROOMY if hw == "roomy" else HARDWARE_PRESETS[hw]
    if copies:
        sched = ScheduleSpec(name="rollplex", parallel={"rollout_tp": 1})
        return plan_step(
            MODEL_PRESETS[model],
            VIDEO_16,
            AlgoSpec(),
            hardware,
            sched,
            graph=replicated(copies),
            passes=(),
        ).plan
    sched = ScheduleSpec(name="rollplex", overlap=overlap)
    return plan_step(
        MODEL_PRESETS[model], WORKLOAD_PRESETS[workload], AlgoSpec(), hardware, sched
    ).plan


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: "-".join(map(str, c)))
def test_plans_equal_full_builds_of_every_trial(
    cfg: tuple, monkeypatch: pytest.MonkeyPatch
) -> None:
    fast = _plan(cfg)
    monkeypatch.setattr(TrialPlans, "plan", lambda self, choice: None)  # every trial in full
    slow = _plan(cfg)
    assert fast == slow  # every step, time, event, slot, effect and note


def test_trial_plans_replay_like_full_builds(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[TrialPlans, dict]] = []
    real = TrialPlans.plan

    def record(self: TrialPlans, choice: dict) -> Any:
        seen.append((self, dict(choice)))
        return real(self, choice)

    monkeypatch.setattr(TrialPlans, "plan", record)
    _plan(("qwen2_5_vl_7b", "video", "roomy", "auto", 6))
    _plan(("qwen2_5_vl_7b", "video", "h200x8", "sm_partition", None))
    assert len(seen) > 10 and any(len(c) > 2 for _, c in seen)
    for trials, choice in seen:
        lean = real(trials, choice)
        full = rollplex_schedule._build(
            trials.ctx, trials.timer, trials.order, trials.decode, choice
        )
        assert lean is not None
        assert replay(lean, trials.ctx.interference) == replay(full, trials.ctx.interference)
        lean_steps = sorted((s.stream, s.op, s.chunk, s.start_s, s.end_s) for s in lean.all_steps())
        full_steps = sorted((s.stream, s.op, s.chunk, s.start_s, s.end_s) for s in full.all_steps())
        assert lean_steps == full_steps
        assert sum(s.scratch_bytes for s in lean.all_steps()) == sum(
            s.scratch_bytes for s in full.all_steps()
        )


def test_step_fields_in_the_order_builders_pass_them() -> None:
    # PlanBuilder.add and TrialPlans make steps positionally (for speed): a reordered Step
    # would silently swap fields there
    assert [f.name for f in dataclasses.fields(Step)] == [
        "index",
        "op",
        "kind",
        "phase",
        "stream",
        "chunk",
        "chunks",
        "solo_s",
        "start_s",
        "end_s",
        "waits",
        "signals",
        "corun",
        "weights_version",
        "rate_class",
        "scratch_bytes",
        "previous_step",
        "pool_bytes",  # set after scheduling (api.mark_engine_pools), never positionally
        "share",  # copy steps only (residency), by keyword
    ]
