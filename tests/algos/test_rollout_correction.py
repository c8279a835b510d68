"""algo.rollout_correction: verl's rollout IS weights, rejection and veto
(verl/trainer/ppo/rollout_corr_helper.py) re-derived one token at a time in Python floats on
test_verl_parity's fixed tensors, to 1e-6; the weights reach only the policy-gradient term
and carry no gradient; the graphs wire the rollout's logprobs to every policy loss; and the
settings that cannot hold are refused by name."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from rollplex.algos import build_step
from rollplex.backends.torch.loss import policy_loss
from rollplex.backends.torch.rollout_correction import Correction
from rollplex.graph.passes.early_backward import algo_refusal
from rollplex.specs import MODEL_PRESETS, WORKLOAD_PRESETS, AlgoSpec
from rollplex.specs.rollout_correction import RolloutCorrectionSpec
from tests.algos.test_verl_parity import ADV, LENGTHS, LOGP, MASK, OLD, REF, N, R, _agg, _verl_pg


def _rollout_logprobs() -> torch.Tensor:
    """The engine's logprobs: off the trainer's old ones by up to a few nats, so that
    weights land above 2, below 1/2 and in between; padding -inf."""
    gen = torch.Generator().manual_seed(5)
    roll = OLD + torch.randn(N, R, generator=gen) * 0.8
    roll[0, 0] = OLD[0, 0] - 30.0  # a weight past the +-20 safety clamp
    return roll.masked_fill(~MASK, float("-inf"))


ROLL = _rollout_logprobs()


def _log_ratio(i: int, j: int) -> float:
    return float(OLD[i, j]) - float(ROLL[i, j])


def _clamped_exp(x: float) -> float:
    return math.exp(min(max(x, -20.0), 20.0))


def _verl_is(level: str, threshold: float) -> list[list[float]]:
    """compute_rollout_correction_weights: exp of the token's log-ratio (token) or of its
    response's sum (sequence), clamped at +-20, then truncated above at the threshold."""
    w = [[0.0] * R for _ in range(N)]
    for i in range(N):
        total = sum(_log_ratio(i, j) for j in range(LENGTHS[i]))
        for j in range(LENGTHS[i]):
            x = _log_ratio(i, j) if level == "token" else total
            w[i][j] = min(_clamped_exp(x), threshold)
    return w


def _verl_keep(level: str, upper: float, lower: float) -> list[list[bool]]:
    """compute_rollout_rejection_mask: a token stays when its weight at the level (token,
    sequence = exp(sum), geometric = exp(mean)) is within [lower, upper]."""
    keep = [[False] * R for _ in range(N)]
    for i in range(N):
        valid = range(LENGTHS[i])
        total = sum(_log_ratio(i, j) for j in valid)
        for j in valid:
            x = {"token": _log_ratio(i, j), "sequence": total, "geometric": total / LENGTHS[i]}
            keep[i][j] = lower <= _clamped_exp(x[level]) <= upper
    return keep


def _loss(spec: RolloutCorrectionSpec, lp: torch.Tensor = LOGP, kl_coef: float = 0.0):
    corr = Correction.of(spec, OLD, ROLL, MASK)
    weights, extra = corr.rows(slice(None))
    loss, metrics = policy_loss(
        lp, OLD, REF, torch.tensor(ADV), corr.keep, 0.2, kl_coef, is_weights=weights
    )
    return loss, metrics | extra, corr


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("threshold", [2.0, 5.0])
def test_is_weights_multiply_verls_per_token_loss(level, threshold):
    spec = RolloutCorrectionSpec(rollout_is=level, rollout_is_threshold=threshold)
    _, m, _ = _loss(spec)
    w = _verl_is(level, threshold)
    pg, _, _ = _verl_pg(0.2, 0.2)
    want = _agg([[pg[i][j] * w[i][j] for j in range(R)] for i in range(N)], "token-mean")
    assert abs(float(m["pg_loss"]) - want) < 1e-6
    assert abs(want - _agg(pg, "token-mean")) > 1e-3  # the weights matter on this data
    # the metrics are of the weights before truncation
    raw = [_clamped_exp(_log_ratio(i, j) if level == "token" else
                        sum(_log_ratio(i, k) for k in range(LENGTHS[i])))
           for i in range(N) for j in range(LENGTHS[i])]  # fmt: skip
    assert abs(float(m["rollout_is_mean"]) - sum(raw) / len(raw)) < 1e-6 * max(raw)
    high = sum(x > threshold for x in raw) / len(raw)
    assert abs(float(m["rollout_is_ratio_fraction_high"]) - high) < 1e-6
    assert 0 < high < 1


@pytest.mark.parametrize(
    ("level", "upper"), [("token", 1.8), ("sequence", 6.0), ("geometric", 1.8)]
)
def test_rejection_leaves_the_loss_and_its_normaliser(level, upper):
    spec = RolloutCorrectionSpec(rollout_rs=level, rollout_rs_threshold=upper)
    _, m, corr = _loss(spec)
    keep = _verl_keep(level, upper, 1 / upper)
    assert corr.keep.tolist() == keep
    pg, _, _ = _verl_pg(0.2, 0.2)
    kept = [(i, j) for i in range(N) for j in range(R) if keep[i][j]]
    assert 0 < len(kept) < sum(LENGTHS)  # some tokens go, some stay
    assert abs(float(m["pg_loss"]) - sum(pg[i][j] for i, j in kept) / len(kept)) < 1e-6
    rejected = 1 - len(kept) / sum(LENGTHS)
    assert abs(float(m["rollout_rs_masked_fraction"]) - rejected) < 1e-6


def test_a_responses_weight_runs_over_its_rejected_tokens_too():
    """verl computes IS weights on the response mask and rejects on a copy of it: with a
    token rejected, its response's sequence weight is still the product over all of its
    tokens, and the loss keeps the rest."""
    spec = RolloutCorrectionSpec(rollout_is="sequence", rollout_is_threshold=1e3,
                                 rollout_rs="token", rollout_rs_threshold=1.8)  # fmt: skip
    _, m, corr = _loss(spec)
    keep = _verl_keep("token", 1.8, 1 / 1.8)
    assert corr.keep.tolist() == keep
    w = _verl_is("sequence", 1e3)
    partly = [i for i in range(N) if 0 < sum(keep[i]) < LENGTHS[i]]
    assert partly  # responses with some tokens rejected, some kept
    pg, _, _ = _verl_pg(0.2, 0.2)
    kept = [(i, j) for i in range(N) for j in range(R) if keep[i][j]]
    want = sum(pg[i][j] * w[i][j] for i, j in kept) / len(kept)
    assert abs(float(m["pg_loss"]) - want) < 1e-6 * max(1.0, abs(want))


def test_a_veto_drops_every_response_with_a_token_below_the_floor():
    """compute_rollout_correction_and_rejection_mask's veto: a response with any valid
    token whose ratio is under rollout_token_veto_threshold leaves the loss whole."""
    floor = 0.3
    spec = RolloutCorrectionSpec(rollout_token_veto_threshold=floor)
    _, m, corr = _loss(spec)
    vetoed = [any(_clamped_exp(_log_ratio(i, j)) < floor for j in range(LENGTHS[i]))
              for i in range(N)]  # fmt: skip
    assert 0 < sum(vetoed) < N
    assert corr.keep.tolist() == [[j < LENGTHS[i] and not vetoed[i] for j in range(R)]
                                  for i in range(N)]  # fmt: skip
    assert abs(float(m["rollout_is_veto_fraction"]) - sum(vetoed) / N) < 1e-6
    pg, _, _ = _verl_pg(0.2, 0.2)
    kept = [(i, j) for i in range(N) for j in range(LENGTHS[i]) if not vetoed[i]]
    assert abs(float(m["pg_loss"]) - sum(pg[i][j] for i, j in kept) / len(kept)) < 1e-6


def test_mismatch_metrics_are_the_sampled_tokens_kl():
    _, m, _ = _loss(RolloutCorrectionSpec(rollout_is="token"))
    d = [min(max(-_log_ratio(i, j), -20.0), 20.0) for i in range(N) for j in range(LENGTHS[i])]
    assert abs(float(m["mismatch_kl"]) - sum(d) / len(d)) < 1e-5
    k3 = sum(math.exp(-x) + x - 1 for x in d) / len(d)
    assert abs(float(m["mismatch_k3_kl"]) - k3) < 1e-5 * max(1.0, k3)


def test_weights_reach_the_policy_gradient_only_and_carry_no_gradient():
    """d loss / d logp = -A w / tokens on each valid token, on-policy in float64 (the ratio
    is 1, its clip idle); the KL term is the same with and without the weights."""
    lp = LOGP.double().masked_fill(~MASK, float("-inf")).requires_grad_(True)
    old = lp.detach()
    roll = ROLL.double()
    spec = RolloutCorrectionSpec(rollout_is="token", rollout_is_threshold=2.0)
    weights, _ = Correction.of(spec, old, roll, MASK).rows(slice(None))
    loss, _ = policy_loss(lp, old, REF.double(), torch.tensor(ADV).double(), MASK, 0.2, 0.0,
                          is_weights=weights)  # fmt: skip
    loss.backward()
    tokens = sum(LENGTHS)
    for i in range(N):
        for j in range(R):
            w = min(_clamped_exp(float(old[i, j]) - float(roll[i, j])), 2.0) if MASK[i, j] else 0
            a = float(torch.tensor(ADV)[i])  # the float32 advantage, widened
            assert abs(float(lp.grad[i, j]) - (-a * w / tokens)) < 1e-12
    assert not weights.requires_grad
    _, plain = policy_loss(lp, old, REF.double(), torch.tensor(ADV).double(), MASK, 0.2, 0.1)
    _, weighted = policy_loss(lp, old, REF.double(), torch.tensor(ADV).double(), MASK, 0.2, 0.1,
                              is_weights=weights)  # fmt: skip
    assert float(plain["loss_kl"]) == float(weighted["loss_kl"])
    assert float(plain["pg_loss"]) != float(weighted["pg_loss"])


def test_equal_logprobs_change_nothing():
    """Where the engine's logprobs are the trainer's, the weights are 1 and nothing is
    rejected: the loss is the uncorrected one (what a CPU fp32 run shows)."""
    spec = RolloutCorrectionSpec(rollout_is="sequence", rollout_rs="geometric")
    corr = Correction.of(spec, OLD, OLD.masked_fill(~MASK, float("-inf")), MASK)
    weights, m = corr.rows(slice(None))
    plain, _ = policy_loss(LOGP, OLD, REF, torch.tensor(ADV), MASK, 0.2, 0.0)
    got, _ = policy_loss(LOGP, OLD, REF, torch.tensor(ADV), corr.keep, 0.2, 0.0,
                         is_weights=weights)  # fmt: skip
    assert float(got) == float(plain)
    assert float(m["mismatch_kl"]) == 0 and float(m["rollout_rs_masked_fraction"]) == 0


# -- the graphs ----------------------------------------------------------------------------
def _graph(algo: AlgoSpec):
    work = WORKLOAD_PRESETS["image"].model_copy(update={"prompts_per_step": 4, "group_size": 2})
    return build_step(MODEL_PRESETS["tiny"], work, algo)


def _losses(graph):
    return [op for op in graph if op.kind == "policy_loss"]


def _rollout_logprobs_value(graph) -> str:
    (decode,) = [op for op in graph if op.kind in ("decode", "generate")]
    return decode.outputs["logprobs"]


@pytest.mark.parametrize("name", ["grpo", "rloo", "ppo"])
def test_one_update_reads_the_engines_logprobs_beside_the_trainers_own(name):
    kl = {"kl_coef": 0.0} if name != "ppo" else {}
    plain = _graph(AlgoSpec(name=name, **kl))
    (loss,) = _losses(plain)
    assert loss.inputs["old_logprobs"] == _rollout_logprobs_value(plain)
    assert "rollout_logprobs" not in loss.inputs
    # IS alone: the old logprobs are the trainer's own (none wired), the rollout's feed it
    corrected = _graph(AlgoSpec(name=name, rollout_correction={"rollout_is": "token"}, **kl))
    (loss,) = _losses(corrected)
    assert "old_logprobs" not in loss.inputs
    assert loss.inputs["rollout_logprobs"] == _rollout_logprobs_value(corrected)
    # rejection or a veto: the old-logprob forward runs first, as verl's recompute
    for rejects in ({"rollout_rs": "token"}, {"rollout_token_veto_threshold": 1e-4}):
        rs = _graph(AlgoSpec(name=name, rollout_correction=rejects, **kl))
        (loss,) = _losses(rs)
        made = rs.producers()
        assert made[loss.inputs["old_logprobs"]].name == "reference.old_logprob"
        assert loss.inputs["rollout_logprobs"] == _rollout_logprobs_value(rs)


def test_every_mini_batch_reads_its_rows_of_the_engines_logprobs():
    algo = AlgoSpec(kl_coef=0.0, ppo_mini_batch_size=2, ppo_epochs=2,
                    rollout_correction={"rollout_is": "sequence"})  # fmt: skip
    graph = _graph(algo)
    losses = _losses(graph)
    assert len(losses) == 4
    made = graph.producers()
    for loss in losses:
        take = made[loss.inputs["rollout_logprobs"]]
        assert take.kind == "select_rows"
        assert next(iter(take.inputs.values())) == _rollout_logprobs_value(graph)
        assert made[loss.inputs["old_logprobs"]].kind == "select_rows"


# -- refusals ------------------------------------------------------------------------------
def test_rejection_turns_off_the_zero_advantage_skip_and_refuses_it_by_name():
    rs = {"rollout_rs": "geometric"}
    assert AlgoSpec(kl_coef=0.0).skip_zero_advantage
    assert not AlgoSpec(kl_coef=0.0, rollout_correction=rs).skip_zero_advantage
    # IS weights alone leave a 0-advantage row's term 0: the skip stays
    assert AlgoSpec(kl_coef=0.0, rollout_correction={"rollout_is": "token"}).skip_zero_advantage
    with pytest.raises(ValidationError, match=r"rollout_correction\.rollout_rs=geometric"):
        AlgoSpec(kl_coef=0.0, skip_zero_advantage=True, rollout_correction=rs)
    veto = {"rollout_token_veto_threshold": 1e-4}
    assert not AlgoSpec(kl_coef=0.0, rollout_correction=veto).skip_zero_advantage
    with pytest.raises(ValidationError, match=r"rollout_token_veto_threshold=0\.0001"):
        AlgoSpec(kl_coef=0.0, skip_zero_advantage=True, rollout_correction=veto)


def test_bad_bounds_and_early_backward_are_refused_by_name():
    with pytest.raises(ValidationError, match=r"rollout_rs_threshold_lower=3\.0 must be below"):
        RolloutCorrectionSpec(rollout_rs="token", rollout_rs_threshold_lower=3.0)
    with pytest.raises(ValidationError, match="rollout_is"):
        RolloutCorrectionSpec(rollout_is="geometric")  # verl's IS levels: token, sequence
    algo = AlgoSpec(kl_coef=0.0, rollout_correction={"rollout_is": "token"})
    assert "algo.rollout_correction" in algo_refusal(algo)
    assert algo_refusal(AlgoSpec(kl_coef=0.0)) is None
