"""After optimizer steps the rollout reads exactly the trainer's parameters.

The torch rollout runs unsharded (TP 1), so "the gathered full parameter sliced to the
rollout layout" is the whole gathered parameter: every rollout tensor must equal it bit
for bit after each step's weight_sync, on 2 and 4 gloo ranks (the gather-and-copy sync),
and on one rank with the alias sync the rollout's tensors are the trainer's storage.
"""

from __future__ import annotations

import pytest
import torch

from tests.distributed.conftest import launch

PARAMS = 57  # tensors of the tiny Qwen2.5-VL
STEPS = 2


def _views(tmp_path, nproc: int, sync: str = "gather") -> dict:
    out = tmp_path / f"views{nproc}.pt"
    args = ["views", "--steps", str(STEPS), "--out", str(out), "--sync", sync]
    launch(nproc, "tests.distributed.worker", args)
    return torch.load(out)


@pytest.mark.parametrize("nproc", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_rollout_view_equals_gathered_parameters(tmp_path, nproc):
    report = _views(tmp_path, nproc)
    assert report["world"] == nproc
    assert report["checked"] == PARAMS * STEPS
    assert report["moved"] > 0  # the updates were real, and the rollout followed them


def test_alias_on_one_rank_shares_storage(tmp_path):
    report = _views(tmp_path, 1, "alias")
    assert report["checked"] == PARAMS * STEPS and report["moved"] > 0
