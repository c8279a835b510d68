"""PPO under the FSDP2 trainer: 2 gloo ranks, the critic sharded over both as the policy is,
each rank valuing its own half of the step's rows, end where the torch trainer's PPO in one
process ends, in one training micro-batch or in two per rank (worker.py `ppo` in the checks2
launch; the torch run in this process, with the same per-sample generators, so both draw
the same tokens: ppo_checks.py).

Tolerance: test_equivalence's, for its reasons (half-row GEMMs, the loss rescaled per rank,
gradients summed by a reduce-scatter, AdamW turning that rounding into a relative error of
the update), plus GAE's whitening statistics summed over the ranks. Measured after 2 steps:
policy max 2.1e-5, 99.9th percentile 2.3e-8; critic max 1.6e-6, 99.9th percentile 5.6e-9
(both micro-batchings); value loss within 1e-7.
"""

from __future__ import annotations

import pytest
import torch

from tests.distributed.conftest import moved
from tests.distributed.ppo_checks import run_ppo
from tests.distributed.test_equivalence import _assert_close

STEPS = 2  # conftest.CHECKS[2]["ppo"]'s --steps


@pytest.fixture(scope="module")
def one() -> dict:
    """The torch trainer's PPO, one process."""
    return run_ppo("torch", STEPS)


@pytest.fixture(scope="module", params=["ppo", "ppo-micro"])
def two(checks2, request) -> list[dict]:
    """The fsdp trainer's PPO on 2 ranks, each rank's report: in one training micro-batch,
    or in 2 per rank (policy and critic: each micro-batch's backward reduce-scatters)."""
    reports = checks2.rank_reports(request.param)
    micro = 2 if request.param == "ppo-micro" else 1
    for r in reports:  # the plan's count, given to both models; run on a rank's 2 groups
        policy, critic = r["micro_batches"]
        assert policy == critic and (policy > 1) == (micro > 1)
        assert [m["train_micro_batches"] for m in r["metrics"]] == [micro] * STEPS
    return reports


@pytest.mark.parametrize("model", ["policy", "critic"])
def test_two_ranks_train_what_one_torch_process_trains(one, two, model):
    # the same start (the critic: the torch backend's copy of the policy, head from the seed)
    assert all(torch.equal(one["start"][model][n], v) for n, v in two[0]["start"][model].items())
    # a learning signal: the weights moved well past the tolerance
    assert moved(one["start"][model], one[model]) > 1e-4
    _assert_close(one[model], two[0][model])
    for rank in two[1:]:  # every rank gathers the same full parameters
        assert all(torch.equal(rank[model][n], v) for n, v in two[0][model].items())


def test_the_value_loss_is_the_global_batchs(one, two):
    assert one["critic_version"] == two[0]["critic_version"] == STEPS
    for a, b in zip(one["metrics"], two[0]["metrics"], strict=True):
        assert a["reward"] == b["reward"]  # the same tokens sampled
        assert a["vf_loss"] > 0
        for k in ("vf_loss", "vf_clip_frac", "values_mean", "returns_mean", "loss", "kl"):
            assert abs(a[k] - b[k]) < 1e-6, (k, a[k], b[k])


def test_each_rank_holds_a_shard_of_the_critic_and_of_its_adamw_state(two):
    holds = [r["holds"] for r in two]
    assert [r["rank"] for r in two] == [0, 1] and two[0]["world"] == 2
    names = list(holds[0])
    assert "lm_head.weight" in names and holds[0]["lm_head.weight"]["full"] == (1, 128)
    for name in names:
        whole = holds[0][name]["full"]
        parts = [h[name]["local"] for h in holds]
        # dim-0 shards of the parameter that together make it up, one per rank
        assert sum(p[0] for p in parts) == whole[0] and all(p[1:] == whole[1:] for p in parts)
        if whole[0] >= 2:
            assert all(p[0] < whole[0] for p in parts), name
        for h in holds:  # AdamW's moments are per shard (the frozen tower has none)
            adam = h[name]["adam"]
            trained = not name.startswith("model.visual.")
            assert set(adam) == ({"exp_avg", "exp_avg_sq"} if trained else set()), name
            assert all(shape == h[name]["local"] for shape in adam.values()), name
