"""The options verl users set, each against a plain re-derivation (Python floats, one
token at a time) of verl's formula, on fixed tensors, to 1e-6. Each test cites the verl
function its formula is read from (verl/trainer/ppo/core_algos.py unless said otherwise);
tests/backends/torch/test_loss_verl.py covers what Rollplex had before (symmetric clip,
k3, the three older aggregations, GAE, the value loss).
"""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from rollplex.backends.torch.kl import KL_ESTIMATORS, KLController, kl_estimate
from rollplex.backends.torch.loss import (
    aggregate,
    group_advantages,
    kl_penalized_rewards,
    micro_batch_weights,
    policy_loss,
)
from rollplex.specs import AlgoSpec

N, R = 6, 5
LENGTHS = [5, 3, 1, 4, 5, 2]
ADV = [1.3, -0.7, 0.4, -1.9, 0.0, 2.2]


def _fixed():
    gen = torch.Generator().manual_seed(11)
    mask = torch.arange(R)[None, :] < torch.tensor(LENGTHS)[:, None]
    logp = -torch.rand(N, R, generator=gen) * 3
    old = logp + torch.randn(N, R, generator=gen) * 0.4  # ratios well outside 1 +- 0.28
    ref = logp + torch.randn(N, R, generator=gen) * 0.5
    ref[1, 1] = logp[1, 1] + 23.0  # an outlier the k3 clamps bound
    entropy = torch.rand(N, R, generator=gen) * 2
    pad = ~mask
    logp, old, ref, entropy = (x.masked_fill(pad, 77.0) for x in (logp, old, ref, entropy))
    return mask, logp, old, ref, entropy


MASK, LOGP, OLD, REF, ENTROPY = _fixed()


def _near(got: float, want: float, size: float = 1.0) -> bool:
    """|got - want| <= 1e-6, relative to the magnitude past 1 (fp32 carries ~7 digits)."""
    return abs(got - want) <= 1e-6 * max(1.0, abs(want), size)


def _valid(i: int) -> range:
    return range(LENGTHS[i])


def _agg(per: list[list[float]], mode: str, scale: float | None = None) -> float:
    """verl's agg_loss over per[i][j] for valid j (core_algos.agg_loss)."""
    if mode == "token-mean":
        return sum(per[i][j] for i in range(N) for j in _valid(i)) / sum(LENGTHS)
    if mode == "seq-mean-token-sum-norm":  # torch.sum(seq_losses) / loss_scale_factor
        return sum(per[i][j] for i in range(N) for j in _valid(i)) / (scale or R)
    seqs = [sum(per[i][j] for j in _valid(i)) for i in range(N)]
    if mode == "seq-mean-token-mean":
        seqs = [s / (LENGTHS[i] + 1e-8) for i, s in enumerate(seqs)]
    return sum(seqs) / N


def _table(fn) -> list[list[float]]:
    return [[fn(i, j) for j in range(R)] for i in range(N)]


# -- clip_ratio_low / clip_ratio_high ------------------------------------------------------
def _verl_pg(low: float, high: float, c: float = 3.0):
    """core_algos.compute_policy_loss_vanilla: clamp(ratio, 1 - low, 1 + high), dual clip."""
    pg, clip, lower = _table(lambda i, j: 0.0), _table(lambda i, j: 0.0), _table(lambda i, j: 0.0)
    for i in range(N):
        a = ADV[i]
        for j in _valid(i):
            r = math.exp(min(max(float(LOGP[i, j]) - float(OLD[i, j]), -20.0), 20.0))
            l1, l2 = -a * r, -a * min(max(r, 1 - low), 1 + high)
            lmax, l3 = max(l1, l2), -a * c
            pg[i][j] = min(lmax, l3) if a < 0 else lmax
            clip[i][j] = float(l2 > l1)
            lower[i][j] = float(lmax > l3 and a < 0)
    return pg, clip, lower


@pytest.mark.parametrize("low,high", [(0.2, 0.28), (0.1, 0.5), (0.3, 0.05)])
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum-norm"])
def test_asymmetric_clip_matches_verl(low, high, mode):
    pg, clip, _ = _verl_pg(low, high)
    _, m = policy_loss(
        LOGP, OLD, REF, torch.tensor(ADV), MASK, 0.2, 0.0,
        clip_ratio_low=low, clip_ratio_high=high, loss_agg_mode=mode,
    )  # fmt: skip
    assert abs(float(m["pg_loss"]) - _agg(pg, mode)) < 1e-6
    assert abs(float(m["clip_frac"]) - _agg(clip, "token-mean")) < 1e-6
    sym, _, _ = _verl_pg(0.2, 0.2)
    assert abs(_agg(pg, mode) - _agg(sym, mode)) > 1e-3  # the bounds matter on this data


def test_unset_clip_bounds_fall_back_to_clip_eps():
    """compute_policy_loss_vanilla: clip_ratio_low/high default to clip_ratio when None."""
    for low, high in [(None, 0.35), (0.15, None), (None, None)]:
        _, m = policy_loss(
            LOGP, OLD, REF, torch.tensor(ADV), MASK, 0.25, 0.0,
            clip_ratio_low=low, clip_ratio_high=high,
        )  # fmt: skip
        pg, clip, _ = _verl_pg(0.25 if low is None else low, 0.25 if high is None else high)
        assert abs(float(m["pg_loss"]) - _agg(pg, "token-mean")) < 1e-6
        assert abs(float(m["clip_frac"]) - _agg(clip, "token-mean")) < 1e-6


# -- KL estimators -------------------------------------------------------------------------
def _verl_kl(name: str, lp: float, rf: float) -> float:
    """core_algos.kl_penalty_forward, by name (the '+' variants keep the base's value)."""
    base = name.rstrip("+")
    d = lp - rf
    if base in ("kl", "k1"):
        return d
    if base == "abs":
        return abs(d)
    if base in ("mse", "k2"):
        return 0.5 * d * d
    k = min(max(rf - lp, -20.0), 20.0)  # low_var_kl / k3
    return min(max(math.exp(k) - k - 1, -10.0), 10.0)


@pytest.mark.parametrize("name", KL_ESTIMATORS)
def test_kl_estimator_values_match_verl(name):
    got = kl_estimate(LOGP, REF, name)
    for i in range(N):
        for j in _valid(i):
            assert _near(float(got[i, j]), _verl_kl(name, float(LOGP[i, j]), float(REF[i, j])))


@pytest.mark.parametrize("name", ["kl+", "k1+", "abs+", "low_var_kl+", "k3+", "mse+"])
def test_plus_variants_take_k2s_gradient(name):
    """core_algos.kl_penalty: backward_score - backward_score.detach() + forward.detach(),
    backward_score = 0.5 (logp - ref)^2, so d/dlogp = logp - ref whatever the value."""
    lp = LOGP.clone().requires_grad_(True)
    torch.where(MASK, kl_estimate(lp, REF, name), 0.0).sum().backward()
    want = torch.where(MASK, LOGP - REF, 0.0)
    torch.testing.assert_close(lp.grad, want, atol=1e-6, rtol=0)
    plain = LOGP.clone().requires_grad_(True)
    torch.where(MASK, kl_estimate(plain, REF, name.rstrip("+")), 0.0).sum().backward()
    if name.rstrip("+") not in ("mse", "k2"):
        assert (plain.grad - want).abs().max() > 1e-2  # the "+" changes the gradient


@pytest.mark.parametrize("name", ["k1", "abs", "k2", "low_var_kl+"])
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_kl_loss_type_in_the_policy_loss(name, mode):
    """dp_actor.update_policy: policy_loss + kl_loss_coef * agg_loss(kl_penalty(...))."""
    pg, _, _ = _verl_pg(0.2, 0.2)
    kl = _table(lambda i, j: _verl_kl(name, float(LOGP[i, j]), float(REF[i, j])))
    loss, m = policy_loss(
        LOGP, OLD, REF, torch.tensor(ADV), MASK, 0.2, 0.07, kl_loss_type=name, loss_agg_mode=mode
    )
    assert _near(float(m["loss_kl"]), _agg(kl, mode))
    assert float(m["kl"]) == float(m["loss_kl"])  # the older name, kept
    assert _near(float(loss), _agg(pg, mode) + 0.07 * _agg(kl, mode))


@pytest.mark.parametrize("name", ["kl", "abs", "k2", "low_var_kl"])
def test_reward_kl_penalty_estimators(name):
    """ray_trainer.apply_kl_penalty: token_level_scores - beta * kl_penalty(old, ref) * mask."""
    scores = torch.zeros(N, R)
    scores[torch.arange(N), torch.tensor(LENGTHS) - 1] = torch.tensor(ADV)
    got = kl_penalized_rewards(scores, LOGP, REF, MASK, 0.3, name)
    for i in range(N):
        for j in range(R):
            kl = _verl_kl(name, float(LOGP[i, j]), float(REF[i, j])) if j < LENGTHS[i] else 0.0
            assert _near(float(got[i, j]), float(scores[i, j]) - 0.3 * kl)


# -- seq-mean-token-sum-norm ---------------------------------------------------------------
@pytest.mark.parametrize("scale", [None, 3, 512])
def test_seq_mean_token_sum_norm_matches_verl(scale):
    """core_algos.agg_loss: sum(loss_mat * mask) / loss_scale_factor (default mask width)."""
    x = _table(lambda i, j: float(ENTROPY[i, j]) - 0.4 * j)
    got = aggregate(torch.tensor(x), MASK, "seq-mean-token-sum-norm", scale)
    assert abs(float(got) - _agg(x, "seq-mean-token-sum-norm", scale)) < 1e-6
    # it differs from seq-mean-token-sum (the mean over sequences), which the spec once
    # labelled Dr. GRPO
    assert abs(float(got) - _agg(x, "seq-mean-token-sum")) > 1e-3
    # micro-batches of rows add up to the whole (each weight 1: a constant divides)
    rows = [(0, 2), (2, 3), (3, 6)]
    parts = [aggregate(torch.tensor(x)[lo:hi], MASK[lo:hi], "seq-mean-token-sum-norm", scale)
             for lo, hi in rows]  # fmt: skip
    weights = micro_batch_weights(MASK, rows, "seq-mean-token-sum-norm")
    assert abs(sum(float(w * p) for w, p in zip(weights, parts, strict=True)) - float(got)) < 1e-6


# -- entropy -------------------------------------------------------------------------------
@pytest.mark.parametrize("coeff", [0.0, 0.01, -0.5])
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum"])
def test_entropy_term_matches_verl(coeff, mode):
    """dp_actor.update_policy: entropy_agg = agg_loss(entropy); policy_loss -= entropy_agg *
    entropy_coeff; actor/entropy is logged whatever the coefficient."""
    pg, _, _ = _verl_pg(0.2, 0.2)
    ent = _table(lambda i, j: float(ENTROPY[i, j]))
    loss, m = policy_loss(
        LOGP, OLD, REF, torch.tensor(ADV), MASK, 0.2, 0.0,
        entropy=ENTROPY, entropy_coeff=coeff, loss_agg_mode=mode,
    )  # fmt: skip
    assert abs(float(m["entropy"]) - _agg(ent, mode)) < 1e-6
    assert abs(float(loss) - (_agg(pg, mode) - coeff * _agg(ent, mode))) < 1e-6


def test_entropy_from_logits_matches_verl():
    """verl.utils.torch_functional.entropy_from_logits: logsumexp(z) - sum(softmax(z) z),
    on the temperature-scaled logits (dp_actor divides the logits by T first)."""
    from rollplex.backends.torch.logprob import token_entropy

    gen = torch.Generator().manual_seed(5)
    logits, t = torch.randn(3, 4, 9, generator=gen) * 2, 0.7
    got = token_entropy(logits, t)
    for i in range(3):
        for j in range(4):
            z = [float(v) / t for v in logits[i, j]]
            top = max(z)
            lse = top + math.log(sum(math.exp(v - top) for v in z))
            p = [math.exp(v - lse) for v in z]
            mean_z = sum(pi * zi for pi, zi in zip(p, z, strict=True))
            assert _near(float(got[i, j]), lse - mean_z, size=lse)  # a difference of two


# -- adaptive KL control -------------------------------------------------------------------
def test_adaptive_kl_controller_matches_verl():
    """core_algos.AdaptiveKLController.update: value *= 1 + clip(kl/target - 1, -0.2, 0.2)
    * n_steps / horizon; FixedKLController.update does nothing."""
    ctrl = KLController(0.05, "adaptive", target=0.1, horizon=500)
    fixed = KLController(0.05)
    expect = 0.05
    for kl, n in [(0.3, 64), (0.11, 64), (0.02, 32), (0.1, 8), (0.0, 100)]:
        ctrl.update(kl, n)
        fixed.update(kl, n)
        expect *= 1 + min(max(kl / 0.1 - 1, -0.2), 0.2) * n / 500
        assert abs(ctrl.value - expect) < 1e-12
    assert fixed.value == 0.05 and ctrl.value != 0.05


# -- GRPO with a group of one --------------------------------------------------------------
@pytest.mark.parametrize("norm", [True, False])
def test_grpo_group_of_one_is_the_raw_score(norm):
    """compute_grpo_outcome_advantage: a group of one gets mean 0 and std 1, so the
    advantage is (r - 0) / (1 + eps), or r - 0 without the std."""
    r = [1.0, 0.0, 0.5, 1.0, -2.0]
    got = group_advantages(torch.tensor(r), 1, norm_by_std=norm)
    for x, g in zip(r, got.tolist(), strict=True):
        assert abs(g - (x / (1 + 1e-6) if norm else x)) < 1e-6
    assert (got != 0).any()  # the old behaviour (all zeros) trained on nothing


# -- the spec: verl's names and defaults, bad combinations refused by name -----------------
def test_defaults_are_verls():
    a = AlgoSpec()
    assert (a.clip_ratio_low, a.clip_ratio_high) == (None, None)  # fall back to clip_eps
    assert a.entropy_coeff == 0 and a.kl_loss_type == "low_var_kl" and a.kl_penalty == "kl"
    assert (a.kl_ctrl, a.target_kl, a.kl_horizon) == ("fixed", 0.1, 10000)
    assert a.loss_scale_factor is None


@pytest.mark.parametrize(
    "update,field",
    [
        ({"kl_loss_coef": 0.01}, "kl_loss_coef"),
        ({"kl_penalty": "k3"}, "kl_penalty"),
        ({"kl_ctrl": "adaptive"}, "kl_ctrl"),
        ({"name": "ppo", "kl_in_reward": True, "kl_ctrl": "adaptive", "kl_coef": 0}, "kl_ctrl"),
        ({"name": "ppo", "kl_in_reward": True, "target_kl": 0.5}, "target_kl"),
        ({"name": "ppo", "kl_in_reward": True, "kl_horizon": 10}, "kl_horizon"),
        ({"kl_loss_type": "full"}, "kl_loss_type"),
        ({"kl_loss_type": "k4"}, "kl_loss_type"),
        ({"loss_scale_factor": 100}, "loss_scale_factor"),
        ({"clip_ratio_low": 1.0}, "clip_ratio_low"),
        ({"clip_ratio_high": 0.0}, "clip_ratio_high"),
        ({"name": "ppo", "kl_in_reward": True, "use_reference": False, "kl_coef": 0}, "kl_in_"),
    ],
)
def test_bad_combinations_are_refused_by_name(update, field):
    with pytest.raises(ValidationError, match=field):
        AlgoSpec(**update)


def test_good_combinations_pass():
    AlgoSpec(name="ppo", kl_in_reward=True, kl_loss_coef=0.001, kl_penalty="low_var_kl",
             kl_ctrl="adaptive", target_kl=0.05, kl_horizon=1000)  # fmt: skip
    AlgoSpec(loss_agg_mode="seq-mean-token-sum-norm", loss_scale_factor=1024)
    AlgoSpec(clip_ratio_low=0.2, clip_ratio_high=0.28, kl_loss_type="k3+")
    AlgoSpec(entropy_coeff=0.001)  # the training forward computes the entropy
