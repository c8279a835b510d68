"""Advantages (GRPO group-normalised, RLOO leave-one-out) and the clipped policy loss
with a k3 KL penalty."""

from __future__ import annotations

import torch


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    """(r - mean) / (std + eps) within each group of `group_size` consecutive rewards [N].

    std is the unbiased one, as in verl's GRPO; a group of one has no baseline to compare
    against, so it gets advantage 0."""
    if group_size < 1 or rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    r = rewards.float().view(-1, group_size)
    centred = r - r.mean(dim=1, keepdim=True)
    if group_size == 1:
        return centred.view(-1)
    return (centred / (r.std(dim=1, keepdim=True) + eps)).view(-1)


def leave_one_out_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """RLOO: r_i minus the mean reward of the other G - 1 samples of its group [N]."""
    if group_size < 2 or rewards.numel() % group_size:
        raise ValueError(
            f"RLOO needs groups of >= 2; got {rewards.numel()} rewards in groups of {group_size}"
        )
    r = rewards.float().view(-1, group_size)
    others = (r.sum(dim=1, keepdim=True) - r) / (group_size - 1)
    return (r - others).view(-1)


ADVANTAGES = {"grpo": group_advantages, "rloo": leave_one_out_advantages}


def grpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float,
    kl_coef: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Token-mean GRPO loss over all valid tokens of the batch (whole groups).

    Per token: max(-A r, -A clip(r, 1-eps, 1+eps)) + kl_coef * k3, where r = exp(logp - old)
    and k3 = exp(ref - logp) - (ref - logp) - 1 (Schulman's unbiased, non-negative KL
    estimator). `advantages` is [N] (one per sequence) or [N, R]. The metrics are detached
    0-dim tensors, so logging them costs no device sync until someone reads them."""
    valid = mask.bool()
    adv = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    ratio = torch.exp(logprobs - old_logprobs)
    clipped = ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps)
    pg = torch.maximum(-adv * ratio, -adv * clipped)
    log_ref_ratio = ref_logprobs - logprobs
    kl = torch.exp(log_ref_ratio) - log_ref_ratio - 1.0
    tokens = valid.sum().clamp(min=1).to(logprobs.dtype)

    def mean(x: torch.Tensor) -> torch.Tensor:
        # where, not multiply: padding may hold anything, and inf * 0 is NaN.
        return torch.where(valid, x, torch.zeros_like(x)).sum() / tokens

    pg_loss, kl_mean = mean(pg), mean(kl)
    loss = pg_loss + kl_coef * kl_mean
    with torch.no_grad():
        metrics = {
            "loss": loss.detach(),
            "pg_loss": pg_loss.detach(),
            "kl": kl_mean.detach(),
            "clip_frac": mean((ratio != clipped).to(ratio.dtype)),
            "ratio_mean": mean(ratio),
            "tokens": tokens.detach(),
        }
    return loss, metrics
