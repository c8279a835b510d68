"""After optimizer steps the rollout reads exactly the trainer's parameters.

The torch rollout runs unsharded (TP 1), so "the gathered full parameter sliced to the
rollout layout" is the whole gathered parameter: every rollout tensor must equal it bit
for bit after each step's weight_sync, on 2 and 4 gloo ranks (the gather-and-copy sync),
and on one rank with the alias sync the rollout's tensors are the trainer's storage.
"""

from __future__ import annotations

import pytest

PARAMS = 57  # tensors of the tiny Qwen2.5-VL
STEPS = 2  # conftest.CHECKS' --steps


@pytest.mark.parametrize("nproc", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_rollout_view_equals_gathered_parameters(request, nproc):
    report = request.getfixturevalue(f"checks{nproc}").report("views")  # gather sync
    assert report["world"] == nproc
    assert report["checked"] == PARAMS * STEPS
    assert report["moved"] > 0  # the updates were real, and the rollout followed them


def test_alias_on_one_rank_shares_storage(checks1):
    report = checks1.report("views-alias")
    assert report["world"] == 1
    assert report["checked"] == PARAMS * STEPS and report["moved"] > 0
