"""Baselines are compared only where they fit, each after its own memory options.

- a verl-like plan that misses with its plain options gets one micro-batch's activations at
  a time (and offloads) before it is called infeasible; what it chose is on the plan;
- a baseline that fits under none has speedup None and a "does not fit (needs X GiB)" note,
  in summary fields and in the sweep's markdown and CSV;
- the grid: presets x workloads x GPU counts x budgets, every speedup is against a
  baseline that fits, and rollplex is never slower than a fitting colocated baseline;
- on CPU, the verl-like run with the options forced on trains what the plain run trains.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

from rollplex.jobs.baselines import plan_baselines, plan_fitting, speedup_fields, speedup_text
from rollplex.jobs.pipeline import plan_step
from rollplex.jobs.sweep import write_comparison
from rollplex.planner.residency import PlanOverBudget
from rollplex.planner.schedules.memory_options import ONE_MICRO_BATCH, applied
from rollplex.specs import HARDWARE_PRESETS, MODEL_PRESETS, WORKLOAD_PRESETS, AlgoSpec
from rollplex.specs.roles import TORCH_ROLLOUT
from rollplex.specs.schedule import ScheduleSpec

GIB = 1 << 30
VERL = ScheduleSpec(name="serial", dedup=False)


def _hw(name: str, n: int, hbm: float | None = None):
    update = {"num_gpus": n} | ({"hbm_gib": hbm} if hbm else {})
    return HARDWARE_PRESETS[name].model_copy(update=update)


def test_verl_like_takes_its_memory_options_before_it_is_called_infeasible() -> None:
    m, w = MODEL_PRESETS["qwen2_5_vl_32b"], WORKLOAD_PRESETS["video"]
    hw = HARDWARE_PRESETS["h800x32"]
    plain = plan_step(m, w, AlgoSpec(), hw, VERL, enforce_budget=False)
    assert not plain.plan.fits_budget  # the audit's case: it missed, and a ratio was printed
    res = plan_fitting(m, w, AlgoSpec(), hw, VERL)
    assert res.plan.fits_budget
    assert res.plan.meta["train_micro_fused"] is True  # what the runtime applies
    assert ONE_MICRO_BATCH in res.plan.meta["memory_options"]
    assert any("memory options" in n for n in res.plan.notes)
    # priced: the forward's work moves into the backward, none is added or dropped
    assert res.plan.step_time_s == pytest.approx(plain.plan.step_time_s, rel=0.01)
    fwd = [s for s in res.plan.all_steps() if s.name == "train.logprob"]
    back = [s for s in res.plan.all_steps() if s.name == "train.backward"]
    plain_back = [s for s in plain.plan.all_steps() if s.name == "train.backward"]
    assert fwd and back and back[0].solo_s > plain_back[0].solo_s
    assert back[0].scratch_bytes > plain_back[0].scratch_bytes  # one micro-batch's inputs


def test_a_baseline_that_fits_under_no_option_has_no_ratio() -> None:
    m, w = MODEL_PRESETS["qwen2_5_vl_32b"], WORKLOAD_PRESETS["video"]
    hw = _hw("h800x32", 32, hbm=20.0)
    base = plan_baselines(m, w, AlgoSpec(), hw, ScheduleSpec())
    assert not base["serial"].fits
    fields = speedup_fields(base, 1.0)
    assert fields["speedup_vs_serial"] is None
    note = fields["speedup_vs_serial_note"]
    assert note.startswith("does not fit (needs ") and "GiB" in note
    assert speedup_text(None, note) == note
    assert fields["baselines"]["serial"]["fits"] is False


def test_sweep_tables_never_show_a_ratio_against_a_misfit(tmp_path: Path) -> None:
    rows = {
        "0": {"schedule": "rollplex", "speedup_vs_serial": None,
              "speedup_vs_serial_note": "does not fit (needs 95.2 GiB per GPU)",
              "speedup_vs_serial_dedup": 1.02, "speedup_vs_serial_dedup_note": None},
        "1": {"schedule": "serial", "speedup_vs_serial": 2.5, "speedup_vs_serial_note": None},
    }  # fmt: skip
    for run, row in rows.items():
        (tmp_path / run).mkdir()
        (tmp_path / run / "summary.json").write_text(json.dumps(row))
    md = write_comparison(tmp_path).read_text()
    assert "does not fit (needs 95.2 GiB per GPU)" in md and "None" not in md
    got = list(csv.DictReader((tmp_path / "comparison.csv").open()))
    assert got[0]["speedup_vs_serial"] == "" and "95.2" in got[0]["speedup_vs_serial_note"]


GRID_FAST = [  # (model, hardware, gpus)
    ("qwen2_5_vl_3b", "h200x8", 32),
    ("qwen2_5_vl_32b", "h800x32", 32),
]
GRID_SLOW = [
    ("qwen2_5_vl_7b", "h200x8", 32),
    ("qwen2_5_vl_7b", "h200x8", 256),
    ("qwen2_5_vl_32b", "h800x32", 512),
    ("qwen2_5_vl_72b", "h800x32", 32),
    ("qwen2_5_vl_72b", "h800x32", 2048),
    ("qwen2_5_vl_72b", "h200x8", 2048),
]


def _check_grid_point(model: str, hardware: str, n: int, workload: str, share: float) -> None:
    hw = HARDWARE_PRESETS[hardware]
    hw = _hw(hardware, n, hbm=hw.hbm_gib * share)
    m, w = MODEL_PRESETS[model], WORKLOAD_PRESETS[workload]
    try:
        ours = plan_step(m, w, AlgoSpec(), hw, ScheduleSpec(), rollout=TORCH_ROLLOUT).plan
    except PlanOverBudget:
        pytest.skip("rollplex itself does not fit this budget: nothing is compared")
    base = plan_baselines(m, w, AlgoSpec(), hw, ScheduleSpec(), rollout=TORCH_ROLLOUT)
    fields = speedup_fields(base, ours.step_time_s)
    for key, b in base.items():
        ratio = fields[f"speedup_vs_{key}"]
        assert (ratio is not None) == b.fits, (key, ratio, b.note)
        if ratio is None:
            assert "does not fit (needs" in fields[f"speedup_vs_{key}_note"] or b.result is None
            continue
        assert b.result.plan.peak_bytes_per_gpu <= b.result.plan.devices[0].budget_bytes or all(
            d.peak_bytes <= d.budget_bytes for d in b.result.plan.devices
        )
        if key != "disaggregated":  # rollplex searches the colocated placements
            assert ratio >= 1.0 - 1e-9, (key, ratio)


@pytest.mark.parametrize("share", [1.0, 0.5])
@pytest.mark.parametrize("workload", ["image", "video"])
@pytest.mark.parametrize("point", GRID_FAST, ids=lambda p: f"{p[0]}-{p[2]}")
def test_grid_speedups_only_against_fitting_baselines(point, workload, share) -> None:
    _check_grid_point(*point, workload, share)


@pytest.mark.slow
@pytest.mark.parametrize("share", [1.0, 0.5])
@pytest.mark.parametrize("workload", ["image", "video"])
@pytest.mark.parametrize("point", GRID_SLOW, ids=lambda p: f"{p[0]}-{p[1]}-{p[2]}")
def test_grid_speedups_only_against_fitting_baselines_at_scale(point, workload, share) -> None:
    _check_grid_point(*point, workload, share)


@pytest.mark.parametrize(
    "dedup", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["verl", "dedup"]
)
def test_cpu_verl_like_with_the_options_forced_trains_the_same(dedup: bool) -> None:
    from tests.runtime.conftest import ALGO, CPU, MODEL, WORKLOAD, run_schedule

    # several micro-batches; dedup: the response forward over a shared prefix
    several = VERL.model_copy(update={"train_micro_tokens": 32, "dedup": dedup})
    plain = run_schedule(several, steps=2)
    forced = several.model_copy(update={"train_micro_fused": True})
    # a budget 10% under the recompute plan's peak: offloads of optimizer state and weights
    # (at 5% under, the reference's weights alone cover the dedup plan's overage)
    peak = plan_step(MODEL, WORKLOAD, ALGO, CPU, forced).plan.peak_bytes_per_gpu
    tight = CPU.model_copy(update={"hbm_gib": 0.9 * peak / GIB})
    again = run_schedule(forced, steps=2, hardware=tight)
    options = applied(again.planned.plan, again.planned.graph)
    assert again.backend.trainer.micro_fused and not plain.backend.trainer.micro_fused
    assert {"optimizer-state offload", "parameter offload"} <= set(options), options
    a, b = plain.params(), again.params()
    for n in a:  # the project's serial-vs-recompute tolerance (test_micro_recompute.py)
        torch.testing.assert_close(b[n], a[n], atol=1e-6, rtol=0, msg=n)
    # the loss and metrics the backward filled in are the plain run's (zeros would give
    # another ratio and KL)
    got, want = again.results[-1].metrics, plain.results[-1].metrics
    assert want["train_micro_batches"] > 1
    for key in ("loss", "pg_loss", "ppo_kl", "ratio_mean", "kl", "clip_frac"):
        assert got[key] == pytest.approx(want[key], abs=1e-6), key


def test_plan_job_prints_no_ratio_against_a_misfit(tmp_path: Path, monkeypatch, capsys) -> None:
    from tests.jobs.cli_run import rollplex_here, run_dir

    # a one-GPU training pool cannot hold 3B's training state in 46 GiB; colocated can
    p = rollplex_here(
        tmp_path,
        monkeypatch,
        capsys,
        "plan",
        "model=qwen2_5_vl_3b",
        "hardware=h200x2",
        "hardware.hbm_gib=46",
        "hardware.hbm_reserve=0",  # the budget is the 46 GiB itself
        "workload.prompts_per_step=16",
    )
    assert p.returncode == 0, p.stderr
    out = run_dir(tmp_path, "plan")
    s = json.loads((out / "summary.json").read_text())
    assert s["fits_budget"] and s["speedup_vs_serial_dedup"] >= 1.0
    assert s["speedup_vs_disaggregated"] is None
    assert s["speedup_vs_disaggregated_note"].startswith("does not fit (needs ")
    assert s["baselines"]["disaggregated"]["fits"] is False
    table = (out / "plan.md").read_text()
    (row,) = [ln for ln in table.splitlines() if ln.startswith("| speedup vs disaggregated")]
    assert "does not fit (needs " in row and "x |" not in row
    assert "does not fit (needs " in p.stdout


def test_a_trainer_that_cannot_fuse_refuses_the_plan_by_name() -> None:
    from rollplex.backends.base import BackendError
    from rollplex.backends.step import StepConfig
    from rollplex.runtime.compose import compose
    from tests.runtime.conftest import ALGO, MODEL

    backend = compose(StepConfig(MODEL, ALGO, seed=0, max_new_tokens=4))
    backend.train_micro_batches(2, False, True)
    assert backend.trainer.micro_fused and backend.trainer.micro_batches == 2
    backend.trainer.fused_micro_batches = False  # as a trainer that cannot would declare
    with pytest.raises(BackendError, match="train_micro_fused"):
        backend.train_micro_batches(2, False, True)


def test_cpu_ppo_fused_trains_policy_and_critic_the_same() -> None:
    from tests.runtime.test_same_result_ppo import _run

    several = ScheduleSpec(name="serial", train_micro_tokens=32)
    _, _, plain, _ = _run(several, steps=2)
    _, _, fused, results = _run(several.model_copy(update={"train_micro_fused": True}), steps=2)
    assert results[-1].metrics["train_micro_batches"] > 1
    for n in plain:  # the critic runs its fused forward as recompute: the same too
        torch.testing.assert_close(fused[n], plain[n], atol=1e-6, rtol=0, msg=n)
