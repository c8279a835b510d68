"""PPO under the FSDP2 trainer resumes: its DCP checkpoint holds the critic's shards and
per-shard AdamW state beside the policy's, and 2 gloo ranks stopped after step 1 of 2 and resumed
end where the straight run ends, bit for bit as the GRPO resume does (test_checkpoint.py):
the gathered policy and critic, both AdamW states, and every metric after the resume point
(worker.py `ppo-resume` in the checks2 launch: ppo_resume_checks.py). A checkpoint without a
critic is refused for PPO by name before any model is built.
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
from tests.distributed.ppo_checks import MODEL

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


def test_the_checkpoint_holds_the_critics_shards_and_version(reports, ckpt):
    state = json.loads((ckpt / STATE_FILE).read_text())
    assert state["world"] == 2 and state["version"] == state["critic_version"] == STOP
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
