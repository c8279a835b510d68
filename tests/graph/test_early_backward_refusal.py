"""early_backward_refusal / algo_refusal (graph/passes/early_backward.py): the graph and
the loss settings say whether the policy gradient is linear in per-row advantages (the
two-accumulator form is then exact), and otherwise name what breaks it."""

from __future__ import annotations

import pytest

from rollplex.algos import build_step
from rollplex.graph.passes import DEDUP_PASSES, SPLIT_ONLY, run_passes
from rollplex.graph.passes.early_backward import algo_refusal, early_backward_refusal
from rollplex.specs import MODEL_PRESETS, WORKLOAD_PRESETS, AlgoSpec
from tests.graph.test_prefill_once import _two_updates

MODELS = ["tiny", "qwen2_5_vl_7b"]


@pytest.mark.parametrize("passes", [(), SPLIT_ONLY, DEDUP_PASSES], ids=["raw", "split", "dedup"])
@pytest.mark.parametrize("workload", ["image", "video"])
@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("name", ["grpo", "rloo"])
def test_grpo_and_rloo_are_linear_in_each_rows_advantage(name, model, workload, passes):
    algo = AlgoSpec(name=name)
    graph = run_passes(build_step(MODEL_PRESETS[model], WORKLOAD_PRESETS[workload], algo), passes)
    assert algo_refusal(algo) is None
    assert early_backward_refusal(graph[0]) is None


@pytest.mark.parametrize("model", MODELS)
def test_ppos_per_token_advantages_are_refused_by_name(model):
    algo = AlgoSpec(name="ppo")
    graph = build_step(MODEL_PRESETS[model], WORKLOAD_PRESETS["video"], algo)
    assert "'reference.advantage'" in early_backward_refusal(graph)
    assert "estimator gae" in early_backward_refusal(graph)
    assert "algo.name=ppo" in algo_refusal(algo)


@pytest.mark.parametrize("model", MODELS)
def test_a_later_update_is_refused_by_name(model):
    graph = _two_updates(MODEL_PRESETS[model], WORKLOAD_PRESETS["video"])
    why = early_backward_refusal(graph)
    assert "'train.epoch1' reads policy@1, the rollout decoded with policy@0" in why


def test_kl_in_reward_is_refused_by_name():
    algo = AlgoSpec(name="grpo").model_copy(update={"kl_in_reward": True})
    assert "algo.kl_in_reward" in algo_refusal(algo)


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        ({"loss_mode": "gspo"}, "algo.loss_mode=gspo"),
        ({"clip_ratio_high": 0.28}, "algo.clip_ratio_low/high"),
        ({"clip_ratio_low": 0.1}, "algo.clip_ratio_low/high"),
        ({"kl_loss_type": "k1"}, "algo.kl_loss_type=k1"),
    ],
)
def test_settings_the_row_terms_are_not_derived_for_are_refused_by_name(setting, named):
    """backends/torch/early_backward.py's row terms take the per-token ratio, the clip_eps
    band and k3's KL: GSPO, an asymmetric clip or another KL estimator would make its
    gradient differ from the batch's, so the plan refuses them."""
    assert named in algo_refusal(AlgoSpec(name="grpo", kl_coef=0.04, **setting))
    assert algo_refusal(AlgoSpec(name="grpo", kl_coef=0.0, kl_loss_type="k1")) is None
