"""Rollout correction: importance weights and a rejection mask from the ratio of the
trainer's old logprobs to the rollout engine's (specs/rollout_correction.py).

verl's rollout_corr_helper re-derived: log-space ratios clamped at +-20 before exp, IS
weights truncated above, rejection within [lower, upper] at the token, the sequence (sum of
log-ratios) or the geometric mean (their mean), and the veto of a response with one token
below a floor. Each is computed from the per-token log-ratio, taken once per row range.
Padding may hold -inf: every reduction selects valid tokens with `where`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from rollplex.specs.rollout_correction import RolloutCorrectionSpec

SAFETY_BOUND = 20.0  # verl's: exp(+-20) bounds every weight


def log_ratio(old: torch.Tensor, rollout: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """log(pi_old / pi_rollout) per token [N, R], 0 on padding."""
    return torch.where(valid, old.detach() - rollout.detach(), 0.0)


def level_log_ratio(lr: torch.Tensor, valid: torch.Tensor, level: str) -> torch.Tensor:
    """The log-ratio a token is judged by [N, R]: its own (token), its response's sum
    (sequence) or mean (geometric), clamped at +-SAFETY_BOUND."""
    if level == "token":
        out = lr
    elif level in ("sequence", "geometric"):
        total = lr.sum(-1, keepdim=True)
        if level == "geometric":
            total = total / valid.sum(-1, keepdim=True).clamp(min=1)
        out = total.expand_as(lr)
    else:
        raise ValueError(f"rollout correction level {level!r}: token, sequence or geometric")
    return out.clamp(-SAFETY_BOUND, SAFETY_BOUND)


def is_weights(
    lr: torch.Tensor, valid: torch.Tensor, level: str, threshold: float
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Truncated IS weights min(pi_old / pi_rollout, threshold) [N, R] from the per-token
    log-ratio `lr` (0 on padding, detached), and their metrics before truncation: mean,
    the share above the threshold and below its reciprocal (verl's
    rollout_is_ratio_fraction_high/low)."""
    w = torch.where(valid, torch.exp(level_log_ratio(lr, valid, level)), 0.0)
    metrics = {
        "rollout_is_mean": _mean(w, valid),
        "rollout_is_ratio_fraction_high": _mean((w > threshold).float(), valid),
        "rollout_is_ratio_fraction_low": _mean((w < 1.0 / threshold).float(), valid),
    }
    return w.clamp(max=threshold), metrics


def rejection_mask(
    lr: torch.Tensor, valid: torch.Tensor, level: str, upper: float, lower: float
) -> torch.Tensor:
    """The tokens kept [N, R] bool: valid ones whose ratio at `level` is within
    [lower, upper]."""
    w = torch.exp(level_log_ratio(lr, valid, level))
    return valid & (w >= lower) & (w <= upper)


def vetoed(lr: torch.Tensor, valid: torch.Tensor, threshold: float) -> torch.Tensor:
    """[N] bool: responses with a valid token whose ratio pi_old / pi_rollout is below
    `threshold` (verl's rollout_token_veto_threshold)."""
    return (valid & (level_log_ratio(lr, valid, "token") < math.log(threshold))).any(-1)


def mismatch_metrics(lr: torch.Tensor, valid: torch.Tensor) -> dict[str, torch.Tensor]:
    """How far the engine's distribution is from the trainer's, on the sampled tokens:
    mismatch_kl = mean(log pi_rollout - log pi_old) (KL(rollout || old), the tokens being
    the rollout's samples) and k3's non-negative estimate of it."""
    d = (-lr).clamp(-SAFETY_BOUND, SAFETY_BOUND)  # log pi_rollout - log pi_old
    return {
        "mismatch_kl": _mean(d, valid),
        "mismatch_k3_kl": _mean(torch.exp(-d) + d - 1.0, valid),
    }


def _mean(x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    return torch.where(valid, x, 0.0).sum() / valid.sum().clamp(min=1)


@dataclass(slots=True)
class Correction:
    """One loss's rollout correction over a batch: the tokens its loss keeps (`keep`, the
    valid ones less those rejected or vetoed), and per row range the IS weights and the
    metrics. `old` must hold its values when a rejecting correction is made: rejection is
    decided before any micro-batch runs, since their terms are weighted by the kept
    tokens. Without rejection `keep` is the valid mask and `old` is read per row range."""

    spec: RolloutCorrectionSpec
    old: torch.Tensor
    rollout: torch.Tensor
    valid: torch.Tensor
    keep: torch.Tensor
    vetoed: torch.Tensor | None  # [N] bool, with the veto on

    @classmethod
    def of(
        cls,
        spec: RolloutCorrectionSpec,
        old: torch.Tensor,
        rollout: torch.Tensor,
        mask: torch.Tensor,
    ) -> Correction:
        valid = mask.bool()
        keep, veto = valid, None
        if spec.rejects:
            lr = log_ratio(old, rollout, valid)
            if spec.rollout_rs is not None:
                keep = rejection_mask(
                    lr, valid, spec.rollout_rs, spec.rollout_rs_threshold, spec.rs_lower
                )
            if spec.rollout_token_veto_threshold is not None:
                veto = vetoed(lr, valid, spec.rollout_token_veto_threshold)
                keep = keep & ~veto[:, None]
        return cls(spec, old, rollout, valid, keep, veto)

    def rows(self, rows: slice | torch.Tensor) -> tuple[torch.Tensor | None, dict]:
        """(IS weights or None, metrics) of rows `rows`, read now (the old values of a
        fused micro-batch are written by its forward)."""
        s, valid = self.spec, self.valid[rows]
        lr = log_ratio(self.old[rows], self.rollout[rows], valid)
        metrics = mismatch_metrics(lr, valid)
        if s.rejects:
            metrics["rollout_rs_masked_fraction"] = _mean((~self.keep[rows]).float(), valid)
        if self.vetoed is not None:
            metrics["rollout_is_veto_fraction"] = self.vetoed[rows].float().mean()
        if s.rollout_is is None:
            return None, metrics
        # over every valid token, as verl's: a rejected token's weight is not read, but a
        # response's product runs over all of its tokens
        weights, is_metrics = is_weights(lr, valid, s.rollout_is, s.rollout_is_threshold)
        return weights, metrics | is_metrics
