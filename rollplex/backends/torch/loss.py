"""Advantages (GRPO, RLOO, PPO's GAE), the clipped policy loss with its KL and entropy terms,
and the critic's clipped value loss.

The formulas are verl's `core_algos`, re-derived on fixed tensors in tests/algos and
tests/backends/torch. Padding may hold anything (-inf included): every reduction selects
valid tokens with `where`, since inf * 0 is NaN.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from rollplex.backends.torch.kl import kl_estimate
from rollplex.backends.torch.logprob import response_mask
from rollplex.specs.algo import LOSS_MODES

# sums a 0-dim tensor over the data-parallel ranks (masked_whiten)
Total = Callable[[torch.Tensor], torch.Tensor]
AGG_MODES = (
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
)


def group_advantages(
    rewards: torch.Tensor, group_size: int, eps: float = 1e-6, norm_by_std: bool = True
) -> torch.Tensor:
    """(r - mean) / (std + eps) within each group of `group_size` consecutive rewards [N];
    `norm_by_std=False` keeps only the centring (Dr. GRPO).

    std is the unbiased one, as in verl's GRPO. A group of one has no baseline: verl
    (compute_grpo_outcome_advantage) takes mean 0 and std 1 there, so the advantage is the
    raw reward, r / (1 + eps) (r without the std); so does this."""
    if group_size < 1 or rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    r = rewards.float().view(-1, group_size)
    if group_size == 1:
        return (r / (1.0 + eps) if norm_by_std else r).view(-1)
    centred = r - r.mean(dim=1, keepdim=True)
    if not norm_by_std:
        return centred.view(-1)
    return (centred / (r.std(dim=1, keepdim=True) + eps)).view(-1)


def group_of_one_note(estimator: str, group_size: int) -> str | None:
    """What a run logs once when GRPO meets groups of one (None otherwise)."""
    if estimator != "grpo" or group_size != 1:
        return None
    return (
        "algo=grpo with workload.group_size=1: a group of one has no baseline, so each "
        "sample's advantage is its raw reward (r / (1 + 1e-6)), as verl's "
        "compute_grpo_outcome_advantage gives; sample G > 1 responses for group-relative "
        "advantages"
    )


def leave_one_out_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """RLOO: r_i minus the mean reward of the other G - 1 samples of its group [N]."""
    if group_size < 2 or rewards.numel() % group_size:
        raise ValueError(
            f"RLOO needs groups of >= 2; got {rewards.numel()} rewards in groups of {group_size}"
        )
    r = rewards.float().view(-1, group_size)
    others = (r.sum(dim=1, keepdim=True) - r) / (group_size - 1)
    return (r - others).view(-1)


def reinforce_pp_baseline_advantages(
    rewards: torch.Tensor, group_size: int, lengths: torch.Tensor
) -> torch.Tensor:
    """REINFORCE++-baseline (verl's compute_reinforce_plus_plus_baseline_outcome_advantage)
    [N]: each reward less its group's mean (a group of one keeps its reward, as verl's),
    then whitened over the batch's response tokens, each row counted once per token of its
    `lengths`, as masked_whiten does (unbiased var, + 1e-8). The value is the same on every
    token of a row, so one per row holds it."""
    if rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    r = rewards.float().view(-1, group_size)
    centred = (r - r.mean(dim=1, keepdim=True) if group_size > 1 else r).view(-1)
    width = int(lengths.max()) if lengths.numel() else 0
    if not width:
        return centred
    tokens = centred[:, None].expand(-1, width)
    return masked_whiten(tokens, response_mask(lengths, width))[:, 0]


OUTCOME_ESTIMATORS = ("grpo", "rloo", "reinforce_plus_plus_baseline")


def outcome_advantages(
    estimator: str,
    rewards: torch.Tensor,
    group_size: int,
    lengths: torch.Tensor | None = None,
    norm_by_std: bool = True,
) -> torch.Tensor:
    """[N] advantages of `estimator` from one reward per response: grpo (`norm_by_std`:
    norm_adv_by_std_in_grpo), rloo, or reinforce_plus_plus_baseline (which reads the
    responses' `lengths`)."""
    if estimator == "grpo":
        return group_advantages(rewards, group_size, norm_by_std=norm_by_std)
    if estimator == "rloo":
        return leave_one_out_advantages(rewards, group_size)
    if estimator == "reinforce_plus_plus_baseline":
        if lengths is None:
            raise ValueError("reinforce_plus_plus_baseline whitens over tokens: it needs lengths")
        return reinforce_pp_baseline_advantages(rewards, group_size, lengths)
    raise ValueError(f"estimator {estimator!r}: expected one of {OUTCOME_ESTIMATORS}")


def token_rewards(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[N, R]: each sequence's reward on its last valid token, 0 elsewhere (verl's reward
    managers place the score at valid_response_length - 1)."""
    valid = mask.bool()
    last = (valid.long().cumsum(1) == valid.sum(1, keepdim=True)) & valid
    return torch.where(last, rewards.float()[:, None], 0.0)


def kl_penalized_rewards(
    rewards: torch.Tensor,
    old_logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    mask: torch.Tensor,
    coef: float,
    estimator: str = "kl",
) -> torch.Tensor:
    """Token rewards [N, R] minus coef * KL(old, ref) on valid tokens: verl's
    apply_kl_penalty (use_kl_in_reward) with its `kl_penalty` estimator, k1 by default."""
    kl = reward_kl(old_logprobs, ref_logprobs, mask, estimator)
    return rewards - coef * kl


def reward_kl(
    old_logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor, estimator: str
) -> torch.Tensor:
    """The per-token KL [N, R] that the reward penalty subtracts, 0 on padding."""
    kl = kl_estimate(old_logprobs.detach(), ref_logprobs.detach(), estimator)
    return torch.where(mask.bool(), kl, 0.0)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, total: Total | None = None) -> torch.Tensor:
    """(x - mean) / sqrt(var + 1e-8) over the valid entries, unbiased var (verl's). `total`
    sums a 0-dim tensor over the data-parallel ranks that hold the batch's other rows (the
    FSDP2 critic), so mean and var are the whole batch's."""
    t = total or _itself
    valid = mask.bool()
    n = t(valid.sum())
    if n < 2:
        raise ValueError(f"whitening needs >= 2 valid tokens, got {int(n)}")
    mean = t(torch.where(valid, x, 0.0).sum()) / n
    var = t(torch.where(valid, (x - mean) ** 2, 0.0).sum()) / (n - 1)
    return (x - mean) * torch.rsqrt(var + 1e-8)


def _itself(x: torch.Tensor) -> torch.Tensor:
    return x


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    lam: float,
    total: Total | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over token rewards [N, R] and old values [N, R]: (whitened advantages, returns).

    Past a sequence's end the bootstrap value is 0 and padding carries nothing back (the
    recursion skips masked steps, as verl does). returns = raw advantages + values, the
    critic's regression target. `total`: see masked_whiten."""
    valid = mask.bool()
    values = torch.where(valid, values.float(), 0.0)
    rewards = torch.where(valid, rewards.float(), 0.0)
    nxt = torch.zeros_like(values[:, 0])
    run = torch.zeros_like(values[:, 0])
    out = torch.zeros_like(values)
    for t in reversed(range(values.shape[1])):
        delta = rewards[:, t] + gamma * nxt - values[:, t]
        step = delta + gamma * lam * run
        nxt = torch.where(valid[:, t], values[:, t], nxt)
        run = torch.where(valid[:, t], step, run)
        out[:, t] = run
    returns = out + values
    return masked_whiten(out, valid, total), returns


def aggregate(
    loss: torch.Tensor, mask: torch.Tensor, mode: str, scale: float | None = None
) -> torch.Tensor:
    """verl's agg_loss: one number from per-token losses [N, R]. Sequences with no valid
    token are left out of the seq-mean modes. seq-mean-token-sum-norm (Dr. GRPO) is the
    sum of every valid token's loss over a constant: `scale` [loss_scale_factor], by
    default the padded response width R (verl's loss_mask.shape[-1])."""
    valid = mask.bool()
    x = torch.where(valid, loss, torch.zeros_like(loss))
    if mode == "token-mean":
        return x.sum() / valid.sum().clamp(min=1)
    if mode not in AGG_MODES:
        raise ValueError(f"loss_agg_mode {mode!r}: expected one of {AGG_MODES}")
    if mode == "seq-mean-token-sum-norm":
        return x.sum() / (scale if scale is not None else loss.shape[-1])
    tokens = valid.sum(-1)
    per_seq = x.sum(-1)
    if mode == "seq-mean-token-mean":
        per_seq = per_seq / (tokens + 1e-8)
    has = tokens > 0
    return torch.where(has, per_seq, 0.0).sum() / has.sum().clamp(min=1)


def agg_units(mask: torch.Tensor, mode: str) -> torch.Tensor:
    """What `aggregate` averages over: valid tokens (token-mean) or sequences with a valid
    token (the seq-mean modes). seq-mean-token-sum-norm averages over nothing (a constant
    divides the sum), so it has no units."""
    if mode == "seq-mean-token-sum-norm":
        raise ValueError("seq-mean-token-sum-norm divides by a constant: it has no units")
    if mode not in AGG_MODES:
        raise ValueError(f"loss_agg_mode {mode!r}: expected one of {AGG_MODES}")
    valid = mask.bool()
    return valid.sum() if mode == "token-mean" else valid.any(-1).sum()


def micro_batch_weights(
    mask: torch.Tensor, rows: list[tuple[int, int]], mode: str
) -> list[torch.Tensor]:
    """Weights w_k of row ranges `rows` of a batch [N, R] such that sum_k w_k *
    aggregate(x[lo_k:hi_k]) == aggregate(x) for any per-token x: each range's share of the
    tokens (token-mean) or of the sequences with a token (seq-mean modes); 1 each under
    seq-mean-token-sum-norm, whose constant divisor makes the parts' sums add up."""
    if mode == "seq-mean-token-sum-norm":
        return [torch.tensor(1.0) for _ in rows]
    total = agg_units(mask, mode).clamp(min=1).to(torch.float32)
    return [agg_units(mask[lo:hi], mode).to(torch.float32) / total for lo, hi in rows]


def k3_kl(logprobs: torch.Tensor, ref: torch.Tensor, log_clamp: float, kl_clamp: float):
    """Schulman's k3 = e^d - d - 1 with d = ref - logp clamped to +-log_clamp, the result
    clamped to +-kl_clamp (verl's low_var_kl): one outlier token gives at most kl_clamp."""
    return kl_estimate(logprobs, ref, "low_var_kl", log_clamp, kl_clamp)


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float,
    kl_coef: float,
    *,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
    loss_scale_factor: float | None = None,
    log_ratio_clamp: float = 20.0,
    kl_clamp: float = 10.0,
    kl_loss_type: str = "low_var_kl",
    entropy: torch.Tensor | None = None,
    entropy_coeff: float = 0.0,
    loss_mode: str = "vanilla",
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The policy loss of `loss_mode` (`surrogate`) aggregated by `loss_agg_mode`, plus
    kl_coef * KL, minus entropy_coeff * entropy (verl's compute_policy_loss_<mode>, then
    dp_actor's terms).

    lo = clip_ratio_low and hi = clip_ratio_high are each clip_eps when None (verl's
    fallback to clip_ratio). The KL term is `kl_loss_type`'s estimator (kl.py) of logp
    against the reference, the entropy term the per-token `entropy` [N, R] of the trained
    distribution, each aggregated as the loss is. `advantages` is [N] (one per sequence)
    or [N, R]. `is_weights` [N, R] (detached; rollout_correction.py) multiply each
    token's policy-gradient term, not the KL's or the entropy's, as verl applies its
    rollout IS weights. `clip_frac` counts tokens where the clip binds, `clip_frac_lower` those
    where the dual clip does. Metrics are detached 0-dim tensors: no device sync until
    someone reads them."""
    if clip_ratio_c <= 1:
        raise ValueError(f"clip_ratio_c must be > 1, got {clip_ratio_c}")
    low = clip_eps if clip_ratio_low is None else clip_ratio_low
    high = clip_eps if clip_ratio_high is None else clip_ratio_high
    valid = mask.bool()
    adv = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    log_ratio = (logprobs - old_logprobs).clamp(-log_ratio_clamp, log_ratio_clamp)
    pg, ratio, binds, lower = surrogate(
        loss_mode, logprobs, old_logprobs, log_ratio, adv, valid, low, high, clip_ratio_c
    )
    if is_weights is not None:
        pg = pg * is_weights

    def agg(x: torch.Tensor) -> torch.Tensor:
        return aggregate(x, valid, loss_agg_mode, loss_scale_factor)

    pg_loss = agg(pg)
    loss = pg_loss
    # measured even at kl_coef 0: the KL to the reference is worth watching either way
    kl_loss = agg(kl_estimate(logprobs, ref_logprobs, kl_loss_type, log_ratio_clamp, kl_clamp))
    if kl_coef:
        loss = loss + kl_coef * kl_loss
    entropy_loss = None
    if entropy is not None:
        entropy_loss = agg(entropy)
        if entropy_coeff:
            loss = loss - entropy_coeff * entropy_loss
    with torch.no_grad():
        tokens = valid.sum().clamp(min=1).to(torch.float32)

        def mean(x: torch.Tensor) -> torch.Tensor:
            return torch.where(valid, x, torch.zeros_like(x)).sum() / tokens

        metrics = {
            "loss": loss.detach(),
            "pg_loss": pg_loss.detach(),
            "kl": kl_loss.detach(),  # the loss term's KL (older name of loss_kl)
            "loss_kl": kl_loss.detach(),
            "clip_frac": mean(binds.float()),
            "clip_frac_lower": mean(lower.float()),
            "ppo_kl": mean(-log_ratio),
            "ratio_mean": mean(ratio),
            "tokens": tokens,
        }
        if entropy_loss is not None:
            metrics["entropy"] = entropy_loss.detach()
    return loss, metrics


grpo_loss = policy_loss  # the name the GRPO engine and older tests use


def surrogate(
    mode: str,
    logprobs: torch.Tensor,
    old: torch.Tensor,
    log_ratio: torch.Tensor,
    adv: torch.Tensor,
    valid: torch.Tensor,
    low: float,
    high: float,
    clip_ratio_c: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(per-token loss, ratio, where the clip binds, where the dual clip binds), [N, R].

    vanilla (PPO), with r = exp(log_ratio):
        clipped = max(-A r, -A clip(r, 1-lo, 1+hi)),
        loss = min(clipped, -A clip_ratio_c) where A < 0, else clipped.
    gspo: the same clip of `gspo_ratio` (the row's ratio), no dual clip.
    cispo (arXiv 2506.13585): -sg(clip(r, 1-lo, 1+hi)) A logp. The clip bounds the
    importance weight, not the update, so a clipped token keeps its gradient (PPO's
    clip zeroes it); it binds wherever clip(r) != r."""
    if mode == "cispo":
        ratio = torch.exp(log_ratio)
        weight = ratio.clamp(1.0 - low, 1.0 + high)
        lp = torch.where(valid, logprobs, torch.zeros_like(logprobs))  # -inf padding: 0
        return -adv * weight.detach() * lp, ratio, weight != ratio, torch.zeros_like(valid)
    if mode == "gspo":
        ratio = gspo_ratio(logprobs, old, valid)
    elif mode == "vanilla":
        ratio = torch.exp(log_ratio)
    else:
        raise ValueError(f"loss_mode {mode!r}: expected one of {LOSS_MODES}")
    pg1 = -adv * ratio
    pg2 = -adv * ratio.clamp(1.0 - low, 1.0 + high)
    clipped = torch.maximum(pg1, pg2)
    if mode == "gspo":
        return clipped, ratio, pg2 > pg1, torch.zeros_like(valid)
    pg3 = -adv * clip_ratio_c
    pg = torch.where(adv < 0, torch.minimum(clipped, pg3), clipped)
    return pg, ratio, pg2 > pg1, (clipped > pg3) & (adv < 0)


GSPO_LOG_RATIO_MAX = 10.0  # verl's clamp of GSPO's log-ratio, before exp


def gspo_ratio(logprobs: torch.Tensor, old: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """GSPO's per-token ratio [N, R]: its value is the sequence's s_i = exp(mean over the
    row's valid tokens of logp - old), its gradient s_i * d logp_t, so that the token-mean
    of -A s_i,t over a row has the gradient of -A s_i (arXiv 2507.18071, eq. 10-11).
    Padding is zeroed first: -inf - -inf would be NaN, and NaN * 0 survives a backward."""
    lp = torch.where(valid, logprobs, torch.zeros_like(logprobs))
    diff = torch.where(valid, lp - old, torch.zeros_like(lp))
    seq = diff.sum(-1) / valid.sum(-1).clamp(min=1)
    log_s = lp - lp.detach() + seq.detach().unsqueeze(-1)
    return torch.exp(log_s.clamp(max=GSPO_LOG_RATIO_MAX))


def loss_options(algo: Any) -> dict[str, Any]:
    """policy_loss's keyword settings from an AlgoSpec (clip_eps and kl_coef come from
    the graph's op attrs)."""
    return {
        "clip_ratio_low": algo.clip_ratio_low,
        "clip_ratio_high": algo.clip_ratio_high,
        "clip_ratio_c": algo.clip_ratio_c,
        "loss_agg_mode": algo.loss_agg_mode,
        "loss_scale_factor": algo.loss_scale_factor,
        "log_ratio_clamp": algo.log_ratio_clamp,
        "kl_clamp": algo.kl_clamp,
        "kl_loss_type": algo.kl_loss_type,
        "entropy_coeff": algo.entropy_coeff,
        "loss_mode": algo.loss_mode,
    }


def value_loss(
    values: torch.Tensor,
    returns: torch.Tensor,
    old_values: torch.Tensor,
    mask: torch.Tensor,
    clip: float,
    loss_agg_mode: str = "token-mean",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """verl's compute_value_loss: 0.5 * agg(max((v - R)^2, (clip(v, old +- clip) - R)^2))."""
    valid = mask.bool()
    clipped = old_values + (values - old_values).clamp(-clip, clip)
    l1 = (values - returns) ** 2
    l2 = (clipped - returns) ** 2
    loss = 0.5 * aggregate(torch.maximum(l1, l2), valid, loss_agg_mode)
    with torch.no_grad():
        tokens = valid.sum().clamp(min=1).to(torch.float32)

        def mean(x: torch.Tensor) -> torch.Tensor:
            return torch.where(valid, x, torch.zeros_like(x)).sum() / tokens

        metrics = {
            "vf_loss": loss.detach(),
            "vf_clip_frac": mean((l2 > l1).float()),
            "values_mean": mean(values.detach()),
            "returns_mean": mean(returns),
        }
    return loss, metrics
