"""algo.name=reinforce_plus_plus_baseline: verl's
compute_reinforce_plus_plus_baseline_outcome_advantage re-derived in Python floats (group
mean off, then masked_whiten over the response tokens) to 1e-6; what follows from whitening
over tokens (an all-equal group is not 0, a row weighs by its length, the on-policy
token-mean loss is 0); the graph, a real step, and the refusals by name."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from rollplex.algos import build_step
from rollplex.backends.step import StepConfig
from rollplex.backends.torch.data import TaskData
from rollplex.backends.torch.loss import policy_loss, reinforce_pp_baseline_advantages
from rollplex.graph.passes.early_backward import algo_refusal
from rollplex.jobs.pipeline import plan_step
from rollplex.runtime import Executor
from rollplex.runtime.compose import compose
from rollplex.specs import MODEL_PRESETS, WORKLOAD_PRESETS, AlgoSpec, ScheduleSpec
from tests.algos.test_reference_when_read import _algo
from tests.runtime.conftest import CPU, MODEL, WORKLOAD

NAME = "reinforce_plus_plus_baseline"
REWARDS = [1.0, 0.0, 0.5, 1.0, 1.0, 1.0, 0.2, 0.9, 0.0]  # the middle group: all equal
LENGTHS = [3, 5, 1, 4, 4, 2, 5, 3, 2]


def _verl(rewards: list[float], lengths: list[int], g: int) -> list[float]:
    """Group mean off (0 for a group of one), then verl_F.masked_whiten over the tokens:
    mean and unbiased variance over every valid token, (x - mean) / sqrt(var + 1e-8)."""
    scores = []
    for k in range(0, len(rewards), g):
        group = rewards[k : k + g]
        mean = sum(group) / g if g > 1 else 0.0
        scores += [r - mean for r in group]
    tokens = [s for s, n in zip(scores, lengths, strict=True) for _ in range(n)]
    mu = sum(tokens) / len(tokens)
    var = sum((t - mu) ** 2 for t in tokens) / (len(tokens) - 1)
    return [(s - mu) / math.sqrt(var + 1e-8) for s in scores]


@pytest.mark.parametrize("g", [3, 1])
def test_advantages_match_verl(g):
    got = reinforce_pp_baseline_advantages(torch.tensor(REWARDS), g, torch.tensor(LENGTHS))
    want = _verl(REWARDS, LENGTHS, g)
    assert all(abs(float(a) - b) < 1e-6 for a, b in zip(got, want, strict=True))


def test_whitening_over_tokens_is_what_it_says():
    adv = reinforce_pp_baseline_advantages(torch.tensor(REWARDS), 3, torch.tensor(LENGTHS))
    # an all-equal group is centred to 0, then shifted by the batch mean: not 0
    assert all(abs(float(a)) > 1e-3 for a in adv[3:6])
    # a row counts once per token: another length moves every advantage
    longer = reinforce_pp_baseline_advantages(
        torch.tensor(REWARDS), 3, torch.tensor([9, *LENGTHS[1:]])
    )
    assert (longer - adv).abs().min() > 1e-4
    # so the token-mean policy loss is 0 on-policy (ratio 1: -mean over tokens of A)
    mask = torch.arange(max(LENGTHS))[None, :] < torch.tensor(LENGTHS)[:, None]
    lp = torch.full(mask.shape, -1.0)
    loss, _ = policy_loss(lp, lp, lp, adv, mask, 0.2, 0.0)
    assert abs(float(loss)) < 1e-6


def test_the_graph_reads_the_responses_lengths():
    work = WORKLOAD_PRESETS["image"].model_copy(update={"prompts_per_step": 4, "group_size": 2})
    graph = build_step(MODEL_PRESETS["tiny"], work, AlgoSpec(name=NAME, kl_coef=0.0))
    (adv,) = [op for op in graph if op.kind == "advantage"]
    (decode,) = [op for op in graph if op.kind in ("decode", "generate")]
    assert adv.attrs["estimator"] == NAME
    assert adv.inputs["responses"] == decode.outputs["responses"]


def test_a_real_step_trains_on_token_whitened_advantages():
    algo = AlgoSpec(name=NAME, lr=1e-3, kl_coef=0.0)
    planned = plan_step(MODEL, WORKLOAD, algo, CPU, ScheduleSpec(name="serial"))
    backend = compose(StepConfig(MODEL, algo, seed=0, max_new_tokens=4))
    backend._reward = lambda responses, answers, group_size: (
        torch.arange(responses.tokens.shape[0]) % 3
    ).float()
    executor = Executor(planned.plan, planned.graph, backend, [])
    before = [p.detach().clone() for p in backend.trainer.params]
    m = executor.run_step(0, TaskData(MODEL, WORKLOAD, seed=0).step(0)).metrics
    assert abs(float(m["pg_loss"])) < 1e-5  # token-mean of whitened advantages, ratio 1
    after = backend.trainer.params
    moved = [not torch.equal(a, p.detach()) for a, p in zip(before, after, strict=True)]
    assert any(moved)  # the gradient is not 0, though the loss is


def test_its_preset_is_grpos_with_the_estimator():
    algo, grpo = _algo(f"algo={NAME}"), _algo("algo=grpo")
    assert algo.name == NAME
    assert algo.model_dump(exclude={"name"}) == grpo.model_dump(exclude={"name"})


def test_settings_it_cannot_hold_are_refused_by_name():
    assert not AlgoSpec(name=NAME, kl_coef=0.0).skip_zero_advantage
    with pytest.raises(ValidationError, match="whitened over the batch"):
        AlgoSpec(name=NAME, kl_coef=0.0, skip_zero_advantage=True)
    why = algo_refusal(AlgoSpec(name=NAME, kl_coef=0.0))
    assert why.startswith(f"algo.name={NAME}: advantages whitened over the whole batch")
