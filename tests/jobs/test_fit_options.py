"""The user's own schedule gets its baselines' memory options (jobs/fit_options.py): a
plain plan over the HBM budget is replanned holding one micro-batch's activations at a
time, the runtime told by the plan's meta; where nothing fits, the plain plan's account and
what each fallback needed."""

from __future__ import annotations

import functools
import json

import pytest

from rollplex.backends import rollout_capabilities, trainer_capabilities
from rollplex.jobs.fit_options import plan_with_options
from rollplex.jobs.pipeline import PlanResult, plan_step
from rollplex.planner.residency import PlanOverBudget
from rollplex.planner.schedules.memory_options import (
    ONE_MICRO_BATCH,
    RECOMPUTED_MICRO_BATCH,
    fallbacks,
)
from rollplex.specs import (
    HARDWARE_PRESETS,
    MODEL_PRESETS,
    WORKLOAD_PRESETS,
    AlgoSpec,
    ScheduleSpec,
)
from rollplex.specs.backend import BackendSpec
from rollplex.specs.roles import FSDP_TRAINER
from tests.jobs.cli_run import rollplex_here, run_dir

ALGO = AlgoSpec(name="grpo")


def _args(model: str, workload: str, prompts: int, hardware: str):
    hw = HARDWARE_PRESETS[hardware]
    backend = BackendSpec()
    w = WORKLOAD_PRESETS[workload].model_copy(update={"prompts_per_step": prompts})
    caps = {
        "rollout": rollout_capabilities(backend),
        "trainer": trainer_capabilities(backend, hw.num_gpus),
    }
    return (MODEL_PRESETS[model], w, ALGO, hw), caps


# One GPU, the torch trainer: prompts per step from a plan that fits as is, through ones
# only a fallback fits, to ones nothing fits (7B on an H200, 3B on an H100).
GRID = [
    (model, hardware, workload, prompts)
    for model, hardware in (("qwen2_5_vl_7b", "h200"), ("qwen2_5_vl_3b", "h100"))
    for workload in ("image", "video")
    for prompts in (4, 16, 32)
]


@functools.cache
def _outcome(point: tuple[str, str, str, int], schedule: str):
    """(plain plan, [(fallback, its plan)], plan_with_options' result or its error), every
    plan made once per test process: the grid's two tests share them."""
    model, hardware, workload, prompts = point
    args, caps = _args(model, workload, prompts, hardware)
    sched = ScheduleSpec(name=schedule)
    plain = plan_step(*args, sched, enforce_budget=False, **caps).plan
    tried = [  # only a plan over the budget needs them
        (v, plan_step(*args, v.schedule, enforce_budget=False, **caps).plan)
        for v in (fallbacks(sched) if not plain.fits_budget else [])
    ]
    try:
        got: PlanResult | PlanOverBudget = plan_with_options(*args, sched, **caps)
    except PlanOverBudget as err:
        got = err
    return plain, tried, got


@pytest.mark.parametrize("point", GRID, ids=lambda p: "-".join(map(str, p)))
@pytest.mark.parametrize("schedule", ["rollplex", "serial"])
def test_the_plan_fits_whenever_the_plain_plan_or_a_fallback_does(point, schedule):
    plain, tried, res = _outcome(point, schedule)
    if plain.fits_budget:
        assert isinstance(res, PlanResult)
        assert res.plan.step_time_s == plain.step_time_s
        assert not res.plan.meta.get("memory_options")
        assert not any(n.startswith("memory:") for n in res.plan.notes)
        return
    fitting = [(v, p) for v, p in tried if p.fits_budget]
    if not fitting:
        assert isinstance(res, PlanOverBudget)
        msg = str(res)  # the plain plan's account, then what each fallback needed
        assert msg.startswith(f"plan '{schedule}' on 'colocated' needs ") and "misses by" in msg
        for variant, p in tried:
            assert f"with {variant.options[0]}, plan '{schedule}'" in msg
            assert f"needs {p.peak_bytes_per_gpu / 2**30:.1f} GiB per GPU" in msg
        assert "train_micro_fused=true" not in msg  # it was tried: no advice to try it
        return
    assert isinstance(res, PlanResult)
    chosen, want = fitting[0]  # the first that fits: fallbacks are listed cheapest first
    assert res.plan.fits_budget and res.plan.step_time_s == want.step_time_s
    assert chosen.options[0] in res.plan.meta["memory_options"]
    fused = chosen.options[0] == ONE_MICRO_BATCH
    assert res.plan.meta["train_micro_fused"] is fused  # what the executor reads
    assert res.plan.meta["train_micro_recompute"] is not fused
    note = f"memory: planned with {chosen.options[0]}; without it, plan '{res.plan.schedule}'"
    assert res.plan.notes[0].startswith(note)
    assert res.plan.notes[0].endswith(
        f"but the budget is {res.plan.devices[0].budget_bytes / 2**30:.1f} GiB"
    )


def test_the_grid_reaches_all_three_outcomes():
    """The grid above is not vacuous: it holds plans that fit as they are, plans only a
    fallback fits, and plans nothing fits."""
    seen = set()
    for point in GRID:
        _, _, res = _outcome(point, "rollplex")
        if isinstance(res, PlanOverBudget):
            seen.add("refused")
        else:
            seen.add("fallback" if res.plan.meta.get("memory_options") else "as is")
    assert seen == {"as is", "fallback", "refused"}


def test_a_graph_fused_mode_refuses_gets_the_recomputed_micro_batch(monkeypatch):
    """Fused mode refuses a graph in which something besides the loss reads the training
    forward's values (`check_fused`): the recomputed forward is planned instead."""
    from rollplex.planner import api

    def refuse(graph):
        raise ValueError("schedule.train_micro_fused: op 'x' reads the forward's values")

    monkeypatch.setattr(api, "check_fused", refuse)
    args, caps = _args("qwen2_5_vl_3b", "image", 48, "h100")
    res = plan_with_options(*args, ScheduleSpec(name="rollplex"), **caps)
    assert res.plan.fits_budget
    assert RECOMPUTED_MICRO_BATCH in res.plan.meta["memory_options"]
    assert res.plan.meta["train_micro_recompute"] and not res.plan.meta["train_micro_fused"]


def test_an_fsdp2_plan_takes_the_fused_micro_batch_too():
    args, caps = _args("qwen2_5_vl_3b", "image", 48, "h100")
    caps["trainer"] = FSDP_TRAINER
    with pytest.raises(PlanOverBudget):
        plan_step(*args, ScheduleSpec(name="rollplex"), **caps)
    res = plan_with_options(*args, ScheduleSpec(name="rollplex"), **caps)
    assert res.plan.fits_budget and res.plan.meta["train_micro_fused"]


def test_a_schedule_that_already_holds_one_micro_batch_is_not_replanned():
    args, caps = _args("qwen2_5_vl_7b", "image", 64, "h200")
    sched = ScheduleSpec(name="rollplex", train_micro_fused=True)
    assert fallbacks(sched) == []
    with pytest.raises(PlanOverBudget):
        plan_with_options(*args, sched, **caps)


def test_the_plan_job_takes_the_fallback_and_says_so(tmp_path, monkeypatch, capsys):
    p = rollplex_here(
        tmp_path, monkeypatch, capsys, "plan", "model=qwen2_5_vl_3b", "hardware=h100",
        "workload=image", "workload.prompts_per_step=48",
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert "; without it, plan 'rollplex' on 'colocated' needs" in p.stdout + p.stderr
    out = run_dir(tmp_path, "plan")
    # the second planning pass is logged before it runs (seconds at large steps)
    log = (out / "cli.log").read_text()
    assert "; planning again with forward and backward per micro-batch" in log
    summary = json.loads((out / "summary.json").read_text())
    assert summary["fits_budget"]
    assert summary["decisions"][0].startswith("memory: planned with forward and backward")
    assert json.loads((out / "plan.json").read_text())["meta"]["train_micro_fused"] is True
