"""PPO under the FSDP2 trainer resumes: its DCP checkpoint holds the critic's shards and
per-shard AdamW state beside the policy's, and 2 gloo ranks stopped after step 1 of 2 and
resumed end where the straight run ends, bit for bit as the GRPO resume does
(test_checkpoint.py): the gathered policy and critic, both AdamW states, and every metric
after the resume point (worker.py `ppo-resume` in the checks2 launch: ppo_resume_checks.py).
The run puts the KL in the reward under the adaptive controller, which sees the whole
batch's KL on every rank: each rank's coefficient is the one-process run's, and the
checkpoint carries it. A checkpoint without a critic is refused for PPO by name.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint import FileSystemReader

from rollplex.runtime.checkpoint import STATE_FILE, CheckpointError
from rollplex.runtime.dcp_checkpoint import read_dcp_checkpoint
from tests.distributed.conftest import moved
from tests.distributed.ppo_checks import ADAPTIVE, MODEL, run_ppo

STEPS, STOP = 2, 1  # conftest.CHECKS[2]["ppo-resume"]'s
PARTS = ("policy", "critic", "policy_adam", "critic_adam")


@pytest.fixture(scope="module")
def reports(checks2) -> list[dict]:
    return checks2.rank_reports("ppo-resume")


@pytest.fixture(scope="module")
def ckpt(reports) -> Path:
    return Path(reports[0]["stopped"]["saved"])


def _equal(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    return torch.equal(a, b)


def test_a_resumed_run_ends_where_the_straight_one_does(reports):
    for r in reports:
        straight, stopped, resumed = r["straight"], r["stopped"], r["resumed"]
        assert resumed["first"] == STOP and len(resumed["metrics"]) == STEPS - STOP
        assert straight["versions"] == resumed["versions"] == (STEPS, STEPS)
        # the steps after the stop moved both models: a critic that restarted would show
        for model in ("policy", "critic"):
            assert moved(stopped[model], straight[model]) > 1e-4, model
        for part in PARTS:
            assert _equal(straight[part], resumed[part]), part
        # AdamW's moments of every trained parameter, the value head's included
        assert {"exp_avg", "exp_avg_sq", "step"} <= set(resumed["critic_adam"]["lm_head.weight"])
    for part in PARTS:  # every rank gathers the same
        assert _equal(reports[0]["resumed"][part], reports[1]["resumed"][part]), part


def test_the_steps_after_the_resume_log_the_same_metrics(reports):
    for r in reports:
        straight, resumed = r["straight"]["metrics"], r["resumed"]["metrics"]
        assert resumed == straight[STOP:]
        assert all(m["vf_loss"] > 0 for m in resumed)


def test_every_rank_adapts_the_reward_kl_as_one_process_does(reports):
    """The same tokens drawn (ppo_checks.py), so the same KL up to the trained weights'
    rounding (test_ppo.py's tolerance); the last step's KL lies inside the controller's
    band, so the coefficient after it depends on the KL's value, not only its sign: a KL
    off by 1e-6 moves it by 1.2e-5 of itself (rows / horizon / target_kl per unit). A rank
    that adapted to its own rows (half the batch) would be off by tens of percent."""
    one = run_ppo("torch", STEPS, algo=ADAPTIVE)
    last = one["metrics"][-1]["reward_kl"]
    assert abs(last / ADAPTIVE.target_kl - 1) < 0.2
    for r in reports:
        straight = r["straight"]
        for a, b in zip(one["metrics"], straight["metrics"], strict=True):
            assert abs(a["reward_kl"] - b["reward_kl"]) < 1e-6, (a["reward_kl"], b["reward_kl"])
            assert a["reward_kl_coef"] == pytest.approx(b["reward_kl_coef"], rel=2e-5)
        assert straight["reward_kl_coef"] == pytest.approx(one["reward_kl_coef"], rel=2e-5)
        assert r["resumed"]["reward_kl_coef"] == straight["reward_kl_coef"]
    assert reports[0]["straight"]["reward_kl_coef"] == reports[1]["straight"]["reward_kl_coef"]


def test_the_checkpoint_holds_the_critics_shards_and_version(reports, ckpt):
    state = json.loads((ckpt / STATE_FILE).read_text())
    assert state["world"] == 2 and state["version"] == state["critic_version"] == STOP
    # the coefficient the controller moved to, which the step after the stop used
    moved_to = reports[0]["straight"]["metrics"][STOP]["reward_kl_coef"]
    assert state["reward_kl_coef"] == pytest.approx(moved_to) != ADAPTIVE.kl_coef
    assert read_dcp_checkpoint(ckpt, MODEL, seed=0, critic=True).critic == STOP
    keys = set(FileSystemReader(ckpt / "dcp").read_metadata().state_dict_metadata)
    critic = reports[0]["stopped"]["critic"]
    assert {f"critic.model.{n}" for n in critic} <= keys
    trained = reports[0]["stopped"]["critic_adam"]
    assert {f"critic.optim.state.{n}.exp_avg" for n in trained} <= keys
    assert "critic.model.lm_head.bias" in keys and "model.lm_head.bias" not in keys


def test_a_checkpoint_without_a_critic_is_refused_for_ppo(ckpt, tmp_path):
    """As a GRPO run's, or one written before FSDP checkpoints held the critic: PPO refuses
    it in one line naming the file and field; a run without a critic takes its policy."""
    bare = tmp_path / ckpt.name
    shutil.copytree(ckpt, bare)
    raw = json.loads((bare / STATE_FILE).read_text())
    raw.pop("critic_version")
    (bare / STATE_FILE).write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match=rf"{bare / STATE_FILE}: no 'critic_version'") as e:
        read_dcp_checkpoint(bare, MODEL, seed=0, critic=True)
    assert "\n" not in str(e.value)
    assert read_dcp_checkpoint(bare, MODEL, seed=0).critic is None
