"""What the fsdp trainer refuses is refused from the spec, before any model loads."""

from __future__ import annotations

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from rollplex.backends.fsdp.checks import check_fsdp_spec, torchrun_world
from rollplex.runtime.checkpoint import STATE_FILE
from rollplex.specs.run import RunSpec
from tests.distributed.conftest import ROOT
from tests.jobs.cli_run import rollplex_here, shown_lines, torch_settings_kept


def spec(*overrides: str) -> RunSpec:
    """The train job's config (conf/train.yaml: 4 prompts per step) with the fsdp trainer."""
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=["job=train", "backend=fsdp", *overrides])
    return RunSpec.model_validate(OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True))


def test_prompts_must_divide_over_the_ranks():
    s = spec()
    check_fsdp_spec(s, world=2)  # 4 prompts on 2 ranks
    with pytest.raises(ValueError, match=r"prompts_per_step=4 does not divide over 3"):
        check_fsdp_spec(s, world=3)


def test_alias_needs_one_float32_rank():
    check_fsdp_spec(spec("backend.fsdp.rollout_sync=alias"), world=1)
    with pytest.raises(ValueError, match="rollout_sync=alias needs 1 rank"):
        check_fsdp_spec(spec("backend.fsdp.rollout_sync=alias"), world=2)
    bf16 = spec("backend.fsdp.rollout_sync=alias", "backend.fsdp.param_dtype=bfloat16")
    with pytest.raises(ValueError, match="bfloat16"):
        check_fsdp_spec(bf16, world=1)


def test_rollout_tp_is_checked_against_sync_world_and_model():
    share = ("backend.fsdp.rollout_sync=share",)
    check_fsdp_spec(spec(*share, "backend.fsdp.rollout_tp=2"), world=2)
    check_fsdp_spec(spec(*share, "backend.fsdp.rollout_tp=1"), world=2)
    with pytest.raises(ValueError, match=r"rollout_tp=2 needs backend.fsdp.rollout_sync=share"):
        check_fsdp_spec(spec("backend.fsdp.rollout_tp=2"), world=2)
    with pytest.raises(ValueError, match=r"rollout_tp=2 does not divide the 1 torchrun ranks"):
        check_fsdp_spec(spec(*share, "backend.fsdp.rollout_tp=2"), world=1)
    # the train job's model (the demo folder's spec): name the widths that do not split
    m = spec().model
    kv = m.num_kv_heads * 2  # a degree that divides the ranks but not the KV heads
    with pytest.raises(ValueError, match=rf"rollout_tp={kv} does not divide.*KV heads.*k_proj"):
        check_fsdp_spec(spec(*share, f"backend.fsdp.rollout_tp={kv}"), world=kv)
    with pytest.raises(ValueError, match="rollout_tp"):  # the spec's own range
        spec(*share, "backend.fsdp.rollout_tp=0")


def test_the_fsdp_trainer_brings_its_own_rollout():
    with pytest.raises(ValueError, match=r"backend.rollout=vllm.*its own torch rollout"):
        check_fsdp_spec(spec("backend.rollout=vllm"), world=1)


def test_world_size_from_torchrun(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert torchrun_world() == 4
    monkeypatch.setenv("WORLD_SIZE", "four")
    with pytest.raises(ValueError, match="WORLD_SIZE='four'"):
        torchrun_world()


def test_ppo_runs_and_resumes():
    """The sharded critic trains (test_ppo.py), and its checkpoints hold it
    (test_ppo_resume.py): a PPO resume is no longer refused from the spec."""
    check_fsdp_spec(spec("algo=ppo"), world=2)
    check_fsdp_spec(spec("algo=ppo", "train.resume=/some/run"), world=2)


def test_cli_refuses_a_grpo_checkpoint_for_ppo_in_one_line(runs, tmp_path, monkeypatch, capsys):
    """A GRPO run's DCP checkpoint holds no critic: a PPO resume from it exits 2 with one
    line naming the file and field, before any model is built (no plan.json) or process
    group started. Through `rollplex.cli.main` in this process (a plain, one-rank run):
    no interpreter start-up and imports, ~8 s of a real process."""
    ckpt = runs.two / "checkpoints" / "step-000002"
    out = tmp_path / "out"
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):  # a plain run, as conftest.env() makes
        monkeypatch.delenv(var, raising=False)
    with torch_settings_kept():
        p = rollplex_here(
            tmp_path, monkeypatch, capsys, "train",
            "backend.trainer=fsdp",  # the key itself; conftest uses the group
            "algo=ppo", "algo.kl_coef=0", f"train.resume={ckpt}", f"hydra.run.dir={out}",
        )  # fmt: skip
    assert not torch.distributed.is_initialized()
    assert p.returncode == 2
    assert f"{ckpt / STATE_FILE}: no 'critic_version'" in p.stderr
    assert len(shown_lines(p.stderr)) == 1, p.stderr
    assert "train rows" not in p.stdout  # refused before the data is opened and scanned
    assert "Traceback" not in p.stderr
    assert not (out / "plan.json").exists()
