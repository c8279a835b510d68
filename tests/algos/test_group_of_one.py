"""GRPO with workload.group_size=1 follows verl: the raw reward is the advantage (not the
zero that a centred group of one gives), and the train job says so in its log, once."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

from rollplex.backends.torch.loss import group_advantages, group_of_one_note
from tests.jobs.test_train import ENV, train_cmd


def test_the_note_names_the_case_and_only_it():
    note = group_of_one_note("grpo", 1)
    assert note is not None and "workload.group_size=1" in note and "raw reward" in note
    assert group_of_one_note("grpo", 2) is None
    assert group_of_one_note("ppo", 1) is None  # GAE: a critic is the baseline


@pytest.mark.slow  # a 2-step CLI run: ~35 s on the shared 2-core box
def test_a_grpo_run_with_groups_of_one_trains_and_says_so(tmp_path: Path):
    run = tmp_path / "run"
    cmd = train_cmd(run, "workload.group_size=1", "train.steps=2", "train.checkpoint_every=0")
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=ENV, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    log = p.stdout + p.stderr
    assert log.count("workload.group_size=1: a group of one has no baseline") == 1
    rows = (run / "metrics.csv").read_text().splitlines()
    assert len(rows) == 3


def test_advantages_are_the_rewards():
    r = torch.tensor([1.0, 0.0, 1.0])
    assert torch.equal(group_advantages(r, 1, norm_by_std=False), r)
    assert (group_advantages(r, 1) > 0).sum() == 2
