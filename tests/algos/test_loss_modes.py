"""algo.loss_mode: GSPO (arXiv 2507.18071) and CISPO (arXiv 2506.13585), each against
verl's compute_policy_loss_<mode> re-derived one token at a time in Python floats on the
fixed tensors of test_verl_parity.py, to 1e-6; each gradient against the objective it
stands for, in float64; on-policy both give vanilla's gradient; and the spec takes GSPO's
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


def _grad(mode: str, old: torch.Tensor, low: float = 0.2, high: float = 0.28, agg=SEQ):
    """(loss, d loss / d logp) of `mode` in float64, padding holding -inf."""
    logp = torch.where(MASK, LOGP, -math.inf).double().requires_grad_()
    loss, _ = policy_loss(
        logp, old.double(), REF.double(), torch.tensor(ADV, dtype=torch.float64), MASK,
        0.2, 0.0, clip_ratio_low=low, clip_ratio_high=high, loss_agg_mode=agg, loss_mode=mode,
    )  # fmt: skip
    return loss, torch.autograd.grad(loss, logp)[0]


@pytest.mark.parametrize("mode", ["gspo", "cispo"])
def test_on_policy_every_mode_has_vanillas_gradient(mode):
    """At the first update (old = logp) every ratio is 1 with the gradient of logp, so
    each mode's gradient is vanilla's under one aggregation (GSPO's loss value too)."""
    loss, got = _grad(mode, LOGP)
    want_loss, want = _grad("vanilla", LOGP)
    assert torch.isfinite(got).all() and got.abs().sum() > 0
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)
    if mode == "gspo":
        assert value_of(loss) == pytest.approx(value_of(want_loss), rel=1e-12)


# -- CISPO ---------------------------------------------------------------------------------
def _verl_cispo(low: float, high: float):
    """compute_policy_loss_cispo: w = clip(exp(clamp(logp - old, +-20)), 1 - low, 1 + high)
    as a constant, -w A logp per token; the clip fraction counts w != r."""
    pg = [[0.0] * R for _ in range(N)]
    clip = [[0.0] * R for _ in range(N)]
    for i in range(N):
        for j in range(LENGTHS[i]):
            lp = float(LOGP[i, j])
            r = math.exp(min(max(lp - float(OLD[i, j]), -20.0), 20.0))
            w = min(max(r, 1 - low), 1 + high)
            pg[i][j], clip[i][j] = -w * ADV[i] * lp, float(w != r)
    return pg, clip


@pytest.mark.parametrize("low,high", [(0.2, 0.28), (0.2, 4.0)])
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum"])
def test_cispo_matches_verl(low, high, mode):
    _, m = policy_loss(
        LOGP, OLD, REF, torch.tensor(ADV), MASK, 0.2, 0.0,
        clip_ratio_low=low, clip_ratio_high=high, loss_agg_mode=mode, loss_mode="cispo",
    )  # fmt: skip
    pg, clip = _verl_cispo(low, high)
    assert _near(float(m["pg_loss"]), _agg(pg, mode))
    assert _near(float(m["clip_frac"]), _agg(clip, "token-mean"))
    assert float(m["clip_frac"]) > 0 and float(m["clip_frac_lower"]) == 0.0


def test_cispo_keeps_the_gradient_of_clipped_tokens():
    """d loss / d logp_t = -w_t A / tokens on every valid token (token-mean): where PPO's
    clip binds, vanilla's gradient is 0 and CISPO's is the clipped weight's."""
    low, high = 0.2, 0.28
    _, got = _grad("cispo", OLD, low, high, agg="token-mean")
    _, vanilla = _grad("vanilla", OLD, low, high, agg="token-mean")
    r = torch.exp((LOGP - OLD).double().clamp(-20, 20))
    w = r.clamp(1 - low, 1 + high)
    adv = torch.tensor(ADV, dtype=torch.float64)[:, None]
    want = torch.where(MASK, -w * adv / MASK.sum(), 0.0)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)
    bound = MASK & (w != r) & (adv != 0)
    assert bound.any() and (vanilla[bound] == 0).any() and (got[bound] != 0).all()


def test_the_spec_takes_gspos_aggregation_and_the_trainer_reads_the_mode():
    algo = AlgoSpec(loss_mode="gspo")
    assert algo.loss_agg_mode == SEQ and AlgoSpec().loss_agg_mode == "token-mean"
    assert loss_options(algo)["loss_mode"] == "gspo"
    assert AlgoSpec(loss_mode="gspo", loss_agg_mode=SEQ).loss_agg_mode == SEQ
    with pytest.raises(ValidationError, match="loss_mode=gspo aggregates seq-mean-token-mean"):
        AlgoSpec(loss_mode="gspo", loss_agg_mode="token-mean")
    assert AlgoSpec(loss_mode="cispo").loss_agg_mode == "token-mean"  # verl's default
    with pytest.raises(ValidationError, match="loss_mode"):
        AlgoSpec(loss_mode="gpg")
    with pytest.raises(ValueError, match="loss_mode 'gpg'"):
        policy_loss(LOGP, OLD, REF, torch.tensor(ADV), MASK, 0.2, 0.0, loss_mode="gpg")
