"""algo.loss_mode=gspo (GSPO, arXiv 2507.18071): verl's compute_policy_loss_gspo re-derived
one token at a time in Python floats on the fixed tensors of test_verl_parity.py, to 1e-6;
its gradient is the sequence objective's, clipped or not; and the spec takes GSPO's
aggregation unless told another, which it refuses by name."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from rollplex.backends.torch.loss import loss_options, policy_loss
from rollplex.specs import AlgoSpec
from tests.algos.test_verl_parity import ADV, LENGTHS, LOGP, MASK, OLD, REF, N, R, _agg, _near

SEQ = "seq-mean-token-mean"


def _verl_gspo(low: float, high: float, adv: list[list[float]]):
    """compute_policy_loss_gspo: every valid token of row i takes s_i = exp(min(mean_j
    (logp - old), 10)); max(-A s, -A clip(s, 1 - low, 1 + high)); no dual clip."""
    pg = [[0.0] * R for _ in range(N)]
    clip = [[0.0] * R for _ in range(N)]
    for i in range(N):
        valid = range(LENGTHS[i])
        seq = sum(float(LOGP[i, j]) - float(OLD[i, j]) for j in valid) / LENGTHS[i]
        s = math.exp(min(seq, 10.0))
        for j in valid:
            a = adv[i][j]
            l1, l2 = -a * s, -a * min(max(s, 1 - low), 1 + high)
            pg[i][j], clip[i][j] = max(l1, l2), float(l2 > l1)
    return pg, clip


def value_of(t: torch.Tensor) -> float:
    return float(t.detach())


def _per_token(adv: torch.Tensor) -> list[list[float]]:
    return [[float(adv[i] if adv.dim() == 1 else adv[i, j]) for j in range(R)] for i in range(N)]


@pytest.mark.parametrize("low,high", [(0.2, 0.2), (0.2, 0.28), (3e-4, 4e-4)])
@pytest.mark.parametrize("per_token", [False, True], ids=["row-advantages", "token-advantages"])
def test_gspo_matches_verl(low, high, per_token):
    adv = torch.tensor(ADV)
    if per_token:  # GAE's shape: verl's gspo takes token advantages as they come
        adv = adv[:, None] + 0.3 * torch.arange(R, dtype=torch.float32)[None, :]
    _, m = policy_loss(
        LOGP, OLD, REF, adv, MASK, 0.2, 0.0,
        clip_ratio_low=low, clip_ratio_high=high, loss_agg_mode=SEQ, loss_mode="gspo",
    )  # fmt: skip
    pg, clip = _verl_gspo(low, high, _per_token(adv))
    assert _near(float(m["pg_loss"]), _agg(pg, SEQ))
    assert _near(float(m["clip_frac"]), _agg(clip, "token-mean"))
    ppo_kl = [[float(OLD[i, j]) - float(LOGP[i, j]) for j in range(R)] for i in range(N)]
    assert _near(float(m["ppo_kl"]), _agg(ppo_kl, "token-mean"))
    assert float(m["clip_frac_lower"]) == 0.0  # no dual clip
    _, vanilla = policy_loss(
        LOGP, OLD, REF, adv, MASK, 0.2, 0.0,
        clip_ratio_low=low, clip_ratio_high=high, loss_agg_mode=SEQ,
    )  # fmt: skip
    assert abs(float(vanilla["pg_loss"]) - float(m["pg_loss"])) > 1e-3  # the ratio matters


@pytest.mark.parametrize("low,high", [(0.2, 0.28), (0.05, 0.05), (0.9, 5.0)])
def test_gspo_has_the_gradient_of_the_sequence_objective(low, high):
    """The token form's gradient equals that of mean_i max(-A_i s_i, -A_i clip(s_i)), with
    s_i = exp(mean_t(logp - old)) taken over whole sequences (eq. 5 of the paper), in
    float64; padding that holds -inf changes nothing."""
    logp = torch.where(MASK, LOGP, -math.inf).double().requires_grad_()
    old, adv = OLD.double(), torch.tensor(ADV, dtype=torch.float64)
    loss, _ = policy_loss(
        logp, old, REF.double(), adv, MASK, 0.2, 0.0,
        clip_ratio_low=low, clip_ratio_high=high, loss_agg_mode=SEQ, loss_mode="gspo",
    )  # fmt: skip
    (got,) = torch.autograd.grad(loss, logp)
    x = torch.where(MASK, LOGP, 0.0).double().requires_grad_()
    seq = (torch.where(MASK, x - old, 0.0)).sum(-1) / MASK.sum(-1)
    s = torch.exp(seq)
    objective = torch.maximum(-adv * s, -adv * s.clamp(1 - low, 1 + high)).mean()
    (want,) = torch.autograd.grad(objective, x)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, torch.where(MASK, want, 0.0), rtol=1e-12, atol=1e-14)
    assert value_of(loss) == pytest.approx(value_of(objective), rel=1e-12)
    assert got.abs().sum() > 0


def test_on_policy_gspo_is_vanilla_at_seq_mean_token_mean():
    """At the first update (old = logp) both ratios are 1 with the gradient of logp, so
    GSPO and the token ratio give the same loss and gradient under one aggregation."""
    grads = []
    for mode in ("vanilla", "gspo"):
        logp = LOGP.double().requires_grad_()
        loss, _ = policy_loss(
            logp, LOGP.double(), REF.double(), torch.tensor(ADV, dtype=torch.float64), MASK,
            0.2, 0.0, loss_agg_mode=SEQ, loss_mode=mode,
        )  # fmt: skip
        grads.append((value_of(loss), torch.autograd.grad(loss, logp)[0]))
    assert grads[0][0] == pytest.approx(grads[1][0], rel=1e-12)
    torch.testing.assert_close(grads[0][1], grads[1][1], rtol=1e-12, atol=1e-14)


def test_the_spec_takes_gspos_aggregation_and_the_trainer_reads_the_mode():
    algo = AlgoSpec(loss_mode="gspo")
    assert algo.loss_agg_mode == SEQ and AlgoSpec().loss_agg_mode == "token-mean"
    assert loss_options(algo)["loss_mode"] == "gspo"
    assert AlgoSpec(loss_mode="gspo", loss_agg_mode=SEQ).loss_agg_mode == SEQ
    with pytest.raises(ValidationError, match="loss_mode=gspo aggregates seq-mean-token-mean"):
        AlgoSpec(loss_mode="gspo", loss_agg_mode="token-mean")
    with pytest.raises(ValidationError, match="loss_mode"):
        AlgoSpec(loss_mode="gpg")
    with pytest.raises(ValueError, match="loss_mode 'gpg'"):
        policy_loss(LOGP, OLD, REF, torch.tensor(ADV), MASK, 0.2, 0.0, loss_mode="gpg")
