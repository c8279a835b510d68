"""schedule=disaggregated on torchrun: a rollout pool and a training pool on their own ranks,
the weights and the rollout's outputs moved by the plan's transfers, end where the same
GRPO job ends on one process with the serial schedule, and a pooled run resumed from its
checkpoint goes on as that job does.

Tolerance, and why: every run is float32 and draws the same tokens (each sample decodes
from a generator seeded by (seed, step, global sample index), whichever rollout rank
decodes it), so rewards and lengths are identical and the parameters differ only by
float rounding, as in test_equivalence.py (whose bounds are reused: all elements within
1e-4, 99.9% within 1e-6): the serial schedule scores prompt and response in one forward
where the disaggregated plan (dedup) splits prefix and response, and 2 trainers sum
gradients by reduce-scatter. With 1 rollout rank and 1 trainer each pool does exactly
the one process's arithmetic on all rows, so that run is asserted bit-equal. Measured
after 2 steps: 1+1 bit-equal; 1+2 max 6.0e-7 (92% of elements bit-equal, 99.9% within
3.7e-9); 2+1 max 3.7e-6 (88%, 99.9% within 7.5e-9).

Bytes: the weights move exactly the plan's routes. The hand-over moves the plan's
features and advantages exactly; the plan sizes responses and old logprobs at
`workload.response_length.max` tokens (8 B ids + 4 B logprobs), the run sends
`train.max_new_tokens` columns of ids, logprobs and the 1-byte mask, plus 8 B of length
per sample.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rollplex.backends.fsdp.checks import check_fsdp_spec, world_spec
from rollplex.jobs.pipeline import plan_step
from rollplex.planner.pools import PoolError, pools_for
from rollplex.specs import MODEL_PRESETS, WORKLOAD_PRESETS, AlgoSpec
from tests.distributed.conftest import (
    ROOT,
    TRAIN,
    ckpt_model,
    command,
    env,
    weights,
)
from tests.distributed.test_checks import spec
from tests.distributed.test_equivalence import _assert_close
from tests.jobs.cli_run import rollplex_here, torch_settings_kept

STEPS = 2  # each pooled run's (conftest.RUNS: 'serial' has 2 more, the resumed run's)


def _rows(run: Path) -> list[dict[str, str]]:
    with (run / "metrics.csv").open() as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def serial(runs1) -> Path:
    """The same job on one process, serial schedule."""
    return runs1("serial")


@pytest.fixture(scope="module")
def two(runs2) -> Path:
    """1 rollout rank + 1 training rank."""
    return runs2("pooled")


def _check_run(run: Path, serial: Path, world: int, rollout: int) -> None:
    one, many = _rows(serial)[:STEPS], _rows(run)
    assert [r["reward"] for r in one] == [r["reward"] for r in many]
    assert [r["response_length"] for r in one] == [r["response_length"] for r in many]
    for a, b in zip(one, many, strict=True):
        for k in ("loss", "kl"):
            assert abs(float(a[k]) - float(b[k])) < 1e-6, (k, a[k], b[k])
    ckpt = run / "checkpoints" / f"step-{STEPS:06d}"
    start = load_file(Path(ckpt_model(ckpt).path) / "model.safetensors")
    mine = weights(run, STEPS)
    assert max((mine[n] - start[n]).abs().max().item() for n in mine) > 1e-4  # it learned
    _assert_close(mine, weights(serial, STEPS))
    # Each rank ran its pool's steps (the plan's ranks: rollout first).
    for r in range(world):
        pool = "rollout" if r < rollout else "train"
        log = (run / "ranks" / f"rank{r}.log").read_text()
        assert f"rank {r} of {world} runs the '{pool}' pool" in log
    _check_bytes(run, world, rollout)


def _check_bytes(run: Path, world: int, rollout: int) -> None:
    summary = json.loads((run / "summary.json").read_text())
    config = json.loads((run / "config.json").read_text())
    moved = summary["transfers"]
    w = moved["update.weight_sync"]
    assert w["steps"] == STEPS and w["measured"] == w["planned"]
    assert set(w["planned"]) == {f"{t}->{r}" for t in range(rollout, world) for r in range(rollout)}
    out = moved["rollout.handover"]
    assert set(out["measured"]) == set(out["planned"])
    wl = config["workload"]
    samples = wl["prompts_per_step"] * wl["group_size"]
    cols, planned_cols = config["train"]["max_new_tokens"], wl["response_length"]["max"]
    v = out["by_value"]
    fixed = v["rollout.vision_encode.features"] + v["rollout.advantage.advantages"]
    assert v["rollout.advantage.advantages"] == samples * 4
    assert fixed + samples * planned_cols * (8 + 4) == out["planned_bytes"]
    responses = v["rollout.decode.responses"] + v["rollout.decode.logprobs"]
    assert responses == samples * (cols * (8 + 4 + 1) + 8)
    assert out["measured_bytes"] == fixed + responses


@pytest.mark.slow  # conftest's sweeps: the serial and 2-rank runs
def test_one_rollout_rank_one_trainer_train_what_one_process_trains(serial, two):
    _check_run(two, serial, 2, 1)
    a, b = weights(two, STEPS), weights(serial, STEPS)
    assert all(torch.equal(a[n], b[n]) for n in a)  # one rank per pool: the same arithmetic


def test_the_rollout_rank_evaluates_the_latest_update(serial, two):
    """Before each held-out evaluation (rank 0, a rollout rank) the trainers' weights are
    sent out of plan: policy@k after step k, as the one-process run evaluates them."""
    log = (two / "ranks" / "rank0.log").read_text()
    for k in range(STEPS + 1):
        assert f"rank 0: policy@{k} received out of plan" in log
    ours = [r["eval_accuracy"] for r in _rows(two)]
    assert ours == [r["eval_accuracy"] for r in _rows(serial)[:STEPS]]
    assert all(x != "" for x in ours)


def test_pooled_ranks_resume_where_one_process_goes_on(serial, two, runs2):
    """Resumed from its step-2 checkpoint (the training pool restores it, the first weights
    transfer hands it to the rollout pool), the 1+1 run's steps 3-4 are the serial run's."""
    ckpt = two / "checkpoints" / f"step-{STEPS:06d}"
    run = runs2("pooled-resumed")
    rows, ref = _rows(run), _rows(serial)[STEPS:]
    assert [r["step"] for r in rows] == ["3", "4"]
    assert [r["reward"] for r in rows] == [r["reward"] for r in ref]
    _assert_close(weights(run, 2 * STEPS), weights(serial, 2 * STEPS))
    assert json.loads((run / "summary.json").read_text())["resumed_from"] == str(ckpt)


@pytest.mark.parametrize("rollout", [1, 2])
def test_three_ranks_train_what_one_process_trains(serial, runs3, rollout):
    """1 rollout + 2 trainers (each trainer's FSDP shard travels to the rollout rank) and
    2 rollout replicas + 1 trainer (the trainer merges rows from both replicas)."""
    _check_run(runs3(f"pooled-{rollout}"), serial, 3, rollout)


def test_a_disaggregated_plan_runs_in_one_process(tmp_path, monkeypatch, capsys):
    """Without pools (one process, transfers move nothing) the plan still runs: the weight
    sync of step k carries step k-1's update, and the version check says so. (This very
    process: the torch roles start no process group; ~4 s of start-up less.)"""
    run = tmp_path / "one"
    torch_roles = [a for a in TRAIN if a != "backend=fsdp"]  # the plain torch roles
    args = [*torch_roles, "train.steps=2", "schedule=disaggregated", "hardware.num_gpus=2"]
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):  # a plain run, as conftest.env() makes
        monkeypatch.delenv(var, raising=False)
    with torch_settings_kept():
        done = rollplex_here(tmp_path, monkeypatch, capsys, "train", *args, f"hydra.run.dir={run}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert not torch.distributed.is_initialized()
    assert [r["step"] for r in _rows(run)] == ["1", "2"]


# -- bad input: refused from the spec and the plan, before any model loads -------------------
def test_the_world_must_be_the_plans_gpus():
    with pytest.raises(ValueError, match=r"hardware.num_gpus=4 but torchrun's WORLD_SIZE=2"):
        check_fsdp_spec(spec("schedule=disaggregated", "hardware.num_gpus=4"), world=2)
    with pytest.raises(ValueError, match=r"at least 2 ranks \(WORLD_SIZE=1\)"):
        check_fsdp_spec(spec("schedule=disaggregated"), world=1)
    check_fsdp_spec(spec("schedule=disaggregated", "hardware.num_gpus=2"), world=2)
    # a single-GPU preset is planned for the world (world_spec), then passes
    check_fsdp_spec(world_spec(spec("schedule=disaggregated"), world=2), world=2)


def test_rollout_gpus_must_leave_a_trainer():
    s = spec("schedule=disaggregated", "hardware.num_gpus=2", "schedule.rollout_gpus=2")
    with pytest.raises(ValueError, match=r"schedule.rollout_gpus=2 leaves no trainer"):
        check_fsdp_spec(s, world=2)


def test_the_rollout_pool_keeps_its_own_copy():
    s = spec("schedule=disaggregated", "hardware.num_gpus=2", "backend.fsdp.rollout_sync=share")
    with pytest.raises(ValueError, match=r"rollout_sync=share.*use rollout_sync=gather"):
        check_fsdp_spec(s, world=2)


def test_pools_must_cover_the_world_and_split_the_prompts():
    s = spec("schedule=disaggregated", "hardware.num_gpus=4", "schedule.rollout_gpus=1")
    model, work = MODEL_PRESETS["tiny"], WORKLOAD_PRESETS["tiny"]  # 4 prompts per step
    plan = plan_step(model, work, AlgoSpec(), s.hardware, s.schedule).plan
    with pytest.raises(PoolError, match=r"does not divide over the 3 ranks of the 'train' pool"):
        pools_for(plan, 0, 4, work.prompts_per_step)
    with pytest.raises(PoolError, match=r"WORLD_SIZE=2: make the plan with hardware.num_gpus=2"):
        pools_for(plan, 0, 2, work.prompts_per_step)
    assert pools_for(plan, 3, 4, 12).name == "train"


def test_cli_refuses_a_world_the_plan_was_not_made_for(tmp_path):
    """One rank of a 2-rank launch: the process torchrun would start, with the variables it
    sets (each rank refuses on its own, before any process group forms; a launch of both
    costs two more processes' imports for the same check). Its run folder goes to
    tmp_path, not the checkout's outputs/."""
    import subprocess

    args = ["train", *TRAIN, "schedule=disaggregated", "hardware.num_gpus=4", "train.steps=1",
            f"hydra.run.dir={tmp_path / 'run'}"]  # fmt: skip
    rank = env() | {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}
    p = subprocess.run(command(1, "rollplex.cli", args), cwd=ROOT, env=rank,
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert p.returncode != 0
    assert "hardware.num_gpus=4 but torchrun's WORLD_SIZE=2" in p.stderr
    assert "Loading weights" not in p.stderr + p.stdout  # refused before any model loads


def test_a_colocated_torchrun_job_plans_for_its_world_and_rollout_tp():
    s = world_spec(spec("backend.fsdp.rollout_sync=share", "backend.fsdp.rollout_tp=2"), world=2)
    assert s.hardware.num_gpus == 2 and s.schedule.parallel.rollout_tp == 2
    one = world_spec(spec(), world=1)
    assert one.hardware.num_gpus == 1 and one.schedule.parallel.rollout_tp == 1
    clash = spec("backend.fsdp.rollout_sync=share", "backend.fsdp.rollout_tp=2",
                 "schedule.parallel.rollout_tp=1")  # fmt: skip
    with pytest.raises(ValueError, match=r"schedule.parallel.rollout_tp=1 but .*rollout_tp=2"):
        world_spec(clash, world=2)
