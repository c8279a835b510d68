"""The loss settings against verl's `core_algos`, re-derived here plainly (Python floats,
one token at a time) from verl's formulas, on fixed tensors: 2 prompts x G=4, padded
responses, one group whose rewards are all equal, an outlier token, temperature 0.7.

verl's formulas, as re-derived below:
- logprobs: log_softmax(logits / T)[token];
- GRPO advantage: (r - mean_group) / (std_group + 1e-6), or r - mean_group (Dr. GRPO);
- policy loss (compute_policy_loss_vanilla): d = clamp(logp - old, -20, 20), r = e^d,
  l1 = -A r, l2 = -A clip(r, 1-eps, 1+eps), l = max(l1, l2); for A < 0, min(l, -A c);
  clip_frac = mean(l2 > l1), clip_frac_lower = mean(max(l1,l2) > -A c and A < 0);
- k3 (low_var_kl): k = clamp(ref - logp, -20, 20), clamp(e^k - k - 1, -10, 10);
- agg_loss: token-mean, seq-mean-token-mean, seq-mean-token-sum;
- GAE (compute_gae_advantage_return): backwards over valid tokens, whitened advantages;
- value loss (compute_value_loss): 0.5 agg(max((v-R)^2, (clip(v, old+-c) - R)^2)).
"""

from __future__ import annotations

import math

import pytest
import torch

from rollplex.backends.torch.logprob import response_logprobs, token_logprobs
from rollplex.backends.torch.loss import (
    gae,
    group_advantages,
    policy_loss,
    token_rewards,
    value_loss,
)

G, R, V, T = 4, 6, 11, 0.7
EPS, CLIP_C = 0.2, 3.0
LENGTHS = [6, 4, 2, 5, 6, 3, 1, 6]  # 2 prompts x G=4, right-padded to R
REWARDS = [1.0, 0.0, 0.5, 0.0, 1.0, 1.0, 1.0, 1.0]  # prompt 1: all equal
OUTLIER = (1, 1)  # row 1 (negative advantage), token 1
MODES = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]


def _fixed():
    gen = torch.Generator().manual_seed(7)
    logits = torch.randn(8, R, V, generator=gen) * 1.5
    tokens = torch.randint(0, V, (8, R), generator=gen)
    mask = torch.arange(R)[None, :] < torch.tensor(LENGTHS)[:, None]
    logp = token_logprobs(logits, tokens, T)
    old = logp + torch.randn(8, R, generator=gen) * 0.3
    ref = logp + torch.randn(8, R, generator=gen) * 0.3
    i, j = OUTLIER
    old[i, j] = logp[i, j] - 25.0  # ratio e^25 before the clamp
    ref[i, j] = logp[i, j] + 22.0  # k3 = e^22 - 23 ~ 3.6e9 without clamps
    # padding holds junk that must not leak
    pad = ~mask
    logp, old, ref = (x.masked_fill(pad, 123.0) for x in (logp, old, ref))
    values = torch.randn(8, R, generator=gen)
    new_values = values + torch.randn(8, R, generator=gen) * 0.8
    return logits, tokens, mask, logp, old, ref, values, new_values


LOGITS, TOKENS, MASK, LOGP, OLD, REF, VALUES, NEW_VALUES = _fixed()


def _valid(i: int) -> range:
    return range(LENGTHS[i])


def _agg(per_token: list[list[float]], mode: str) -> float:
    """verl's agg_loss over per_token[i][j] for valid j."""
    if mode == "token-mean":
        total = sum(per_token[i][j] for i in range(8) for j in _valid(i))
        return total / sum(LENGTHS)
    seqs = []
    for i in range(8):
        s = sum(per_token[i][j] for j in _valid(i))
        seqs.append(s / (LENGTHS[i] + 1e-8) if mode == "seq-mean-token-mean" else s)
    return sum(seqs) / len(seqs)


def _verl_grpo(norm: bool) -> list[float]:
    out = []
    for i in range(8):
        group = REWARDS[(i // G) * G : (i // G + 1) * G]
        mean = sum(group) / G
        std = math.sqrt(sum((x - mean) ** 2 for x in group) / (G - 1))
        out.append((REWARDS[i] - mean) / (std + 1e-6) if norm else REWARDS[i] - mean)
    return out


def test_logprobs_are_of_the_temperature_scaled_distribution():
    for i in range(8):
        for j in range(R):
            z = [float(x) / T for x in LOGITS[i, j]]
            top = max(z)
            lse = top + math.log(sum(math.exp(x - top) for x in z))
            expect = z[int(TOKENS[i, j])] - lse
            got = float(token_logprobs(LOGITS, TOKENS, T)[i, j])
            assert abs(got - expect) < 1e-6
    # the raw-logit logprobs differ a lot: the setting matters
    assert (token_logprobs(LOGITS, TOKENS) - token_logprobs(LOGITS, TOKENS, T)).abs().max() > 0.2


@pytest.mark.parametrize("norm", [True, False])
def test_grpo_advantages(norm):
    got = group_advantages(torch.tensor(REWARDS), G, norm_by_std=norm)
    torch.testing.assert_close(got, torch.tensor(_verl_grpo(norm)), atol=1e-6, rtol=0)
    assert (got[G:] == 0).all()  # the group of equal rewards teaches nothing
    if not norm:
        assert abs(float(got[0]) - 0.625) < 1e-6


def _verl_policy(adv: list[float]) -> dict[str, list[list[float]]]:
    pg, kl, clip, lower, neg_kl = ([[0.0] * R for _ in range(8)] for _ in range(5))
    for i in range(8):
        a = adv[i]
        for j in _valid(i):
            d = min(max(float(LOGP[i, j]) - float(OLD[i, j]), -20.0), 20.0)
            r = math.exp(d)
            l1 = -a * r
            l2 = -a * min(max(r, 1 - EPS), 1 + EPS)
            lmax = max(l1, l2)
            l3 = -a * CLIP_C
            pg[i][j] = min(lmax, l3) if a < 0 else lmax
            clip[i][j] = float(l2 > l1)
            lower[i][j] = float(lmax > l3 and a < 0)
            neg_kl[i][j] = -d
            k = min(max(float(REF[i, j]) - float(LOGP[i, j]), -20.0), 20.0)
            kl[i][j] = min(max(math.exp(k) - k - 1, -10.0), 10.0)
    return {"pg": pg, "kl": kl, "clip": clip, "lower": lower, "ppo_kl": neg_kl}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("norm", [True, False])
def test_policy_loss_matches_verl(mode, norm):
    adv = _verl_grpo(norm)
    ref = _verl_policy(adv)
    kl_coef = 0.05
    loss, m = policy_loss(
        LOGP, OLD, REF, torch.tensor(adv), MASK, EPS, kl_coef, clip_ratio_c=CLIP_C,
        loss_agg_mode=mode,
    )  # fmt: skip
    pg, kl = _agg(ref["pg"], mode), _agg(ref["kl"], mode)
    assert abs(float(m["pg_loss"]) - pg) < 1e-6
    assert abs(float(m["kl"]) - kl) < 1e-6
    assert abs(float(loss) - (pg + kl_coef * kl)) < 1e-6
    # metrics are token means whatever the aggregation (as verl's masked_mean)
    for key, name in [("clip", "clip_frac"), ("lower", "clip_frac_lower"), ("ppo_kl", "ppo_kl")]:
        assert abs(float(m[name]) - _agg(ref[key], "token-mean")) < 1e-6, name


def test_outlier_is_bounded_and_clip_frac_counts_only_binding_clips():
    adv = _verl_grpo(True)
    _, m = policy_loss(LOGP, OLD, REF, torch.tensor(adv), MASK, EPS, 0.05)
    i, j = OUTLIER
    assert adv[i] < 0
    ref = _verl_policy(adv)
    assert ref["kl"][i][j] == 10.0  # the k3 clamp, not ~3.6e9
    assert ref["pg"][i][j] == pytest.approx(-adv[i] * CLIP_C)  # the dual clip binds
    assert float(m["kl"]) < 1.0 and float(m["clip_frac_lower"]) > 0
    # Out of [1-eps, 1+eps] is not the same as "the clip binds": the equal-reward group
    # has A = 0 (never binds), and a ratio above 1+eps with A < 0 does not bind either.
    ratio = torch.exp((LOGP - OLD).clamp(-20, 20))
    outside = ((ratio < 1 - EPS) | (ratio > 1 + EPS)) & MASK
    assert float(m["clip_frac"]) < float(outside.sum()) / float(MASK.sum())


def _verl_gae(rewards: list[list[float]], values: list[list[float]], gamma, lam):
    adv = [[0.0] * R for _ in range(8)]
    for i in range(8):
        nxt, last = 0.0, 0.0
        for t in reversed(range(R)):
            m = 1.0 if t < LENGTHS[i] else 0.0
            delta = rewards[i][t] + gamma * nxt - values[i][t]
            step = delta + gamma * lam * last
            nxt = values[i][t] * m + (1 - m) * nxt
            last = step * m + (1 - m) * last
            adv[i][t] = last
    returns = [[adv[i][t] + values[i][t] for t in range(R)] for i in range(8)]
    flat = [adv[i][t] for i in range(8) for t in _valid(i)]
    mean = sum(flat) / len(flat)
    var = sum((x - mean) ** 2 for x in flat) / (len(flat) - 1)
    white = [[(adv[i][t] - mean) / math.sqrt(var + 1e-8) for t in range(R)] for i in range(8)]
    return white, returns


def test_gae_matches_verl():
    gamma, lam = 0.99, 0.95
    scores = token_rewards(torch.tensor(REWARDS), MASK)
    # the sequence reward sits on the last valid token, nowhere else
    for i in range(8):
        assert float(scores[i, LENGTHS[i] - 1]) == REWARDS[i]
        assert float(scores[i].abs().sum()) == abs(REWARDS[i])
    vals = [[float(VALUES[i, t]) * (t < LENGTHS[i]) for t in range(R)] for i in range(8)]
    rw = [[float(scores[i, t]) for t in range(R)] for i in range(8)]
    white, returns = _verl_gae(rw, vals, gamma, lam)
    adv, ret = gae(scores, VALUES, MASK, gamma, lam)
    torch.testing.assert_close(adv[MASK], torch.tensor(white)[MASK], atol=1e-6, rtol=0)
    torch.testing.assert_close(ret[MASK], torch.tensor(returns)[MASK], atol=1e-6, rtol=0)


@pytest.mark.parametrize("mode", MODES)
def test_value_loss_matches_verl(mode):
    clip = 0.5
    returns = VALUES + 0.7
    per, binds = [[0.0] * R for _ in range(8)], [[0.0] * R for _ in range(8)]
    for i in range(8):
        for t in _valid(i):
            v, old, ret = float(NEW_VALUES[i, t]), float(VALUES[i, t]), float(returns[i, t])
            vc = min(max(v, old - clip), old + clip)
            l1, l2 = (v - ret) ** 2, (vc - ret) ** 2
            per[i][t] = max(l1, l2)
            binds[i][t] = float(l2 > l1)
    loss, m = value_loss(NEW_VALUES, returns, VALUES, MASK, clip, mode)
    assert abs(float(loss) - 0.5 * _agg(per, mode)) < 1e-6
    assert abs(float(m["vf_clip_frac"]) - _agg(binds, "token-mean")) < 1e-6
    assert 0 < float(m["vf_clip_frac"]) < 1


def test_rollout_logprobs_equal_trainer_logprobs_at_temperature(spec, batch):
    """On-policy the ratio is 1: decode's logprobs are the scaled distribution's."""
    from rollplex.backends.torch.decode import decode
    from rollplex.backends.torch.model import build_model
    from rollplex.engine.prefix import expand_prefix, prefix_forward
    from rollplex.engine.prefix import vision_encode as encode

    model = build_model(spec, seed=0)
    with torch.no_grad():
        feats = encode(model, batch.pixel_values, batch.image_grid_thw)
        state = expand_prefix(prefix_forward(model, batch, feats, grad=False), G)
        gen = torch.Generator().manual_seed(3)
        tokens, rollout, lengths = decode(model, state, R, T, 1.0, gen, eos_id=-1)
        scored = response_logprobs(model, state, tokens, lengths, T)
        raw = response_logprobs(model, state, tokens, lengths)
    torch.testing.assert_close(rollout, scored, atol=1e-5, rtol=0)
    assert (rollout - raw).abs().max() > 1e-3  # scoring the raw logits would be off-policy


def test_kl_in_reward_matches_verl():
    """verl's apply_kl_penalty ('kl' estimator): token_rewards - beta * (old - ref)."""
    from rollplex.backends.torch.loss import kl_penalized_rewards

    beta = 0.1
    scores = token_rewards(torch.tensor(REWARDS), MASK)
    got = kl_penalized_rewards(scores, OLD, REF, MASK, beta)
    for i in range(8):
        for t in _valid(i):
            expect = float(scores[i, t]) - beta * (float(OLD[i, t]) - float(REF[i, t]))
            assert abs(float(got[i, t]) - expect) < 1e-6
