"""KL to the reference: verl's per-token estimators and its KL coefficient controllers.

Estimators with d = logp - ref: kl/k1 d, abs |d|, mse/k2 d^2/2, low_var_kl/k3 e^-d + d - 1
(clamped); a trailing "+" keeps the value and takes k2's gradient (straight-through, verl's
documented intent). Controllers: fixed, and adaptive (Ziegler et al. 2019) by a factor
1 + clip(kl / target - 1, +-0.2) * n / horizon per step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rollplex.specs.algo import KL_ESTIMATORS


def kl_estimate(
    logprobs: torch.Tensor,
    ref: torch.Tensor,
    estimator: str = "low_var_kl",
    log_clamp: float = 20.0,
    kl_clamp: float = 10.0,
) -> torch.Tensor:
    """Per-token KL estimate [N, R] of `estimator` (see the module docstring); the clamps
    apply to low_var_kl / k3 only, as in verl."""
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"KL estimator {estimator!r}: expected one of {KL_ESTIMATORS}")
    base = estimator.rstrip("+")
    value = _forward(logprobs, ref, base, log_clamp, kl_clamp)
    if not estimator.endswith("+") or base in ("mse", "k2"):
        return value
    k2 = 0.5 * (logprobs - ref).square()
    return k2 - k2.detach() + value.detach()


def _forward(logp: torch.Tensor, ref: torch.Tensor, base: str, log_clamp, kl_clamp):
    d = logp - ref
    if base in ("kl", "k1"):
        return d
    if base == "abs":
        return d.abs()
    if base in ("mse", "k2"):
        return 0.5 * d.square()
    k = (-d).clamp(-log_clamp, log_clamp)  # log(pi_ref / pi)
    return (torch.exp(k) - k - 1.0).clamp(-kl_clamp, kl_clamp)


@dataclass(slots=True)
class KLController:
    """The KL coefficient of the reward penalty: `value` now; `update` after each step.
    kind "fixed" never moves; "adaptive" steers the measured KL towards `target`."""

    value: float
    kind: str = "fixed"
    target: float = 0.1
    horizon: int = 10000

    def update(self, current_kl: float, n_steps: int) -> None:
        if self.kind == "fixed":
            return
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon


def sequence_mean_kl(kl: torch.Tensor, mask: torch.Tensor) -> float:
    """verl's logged reward KL: each sequence's mean over its valid tokens, then the mean
    over sequences (a sequence with no valid token counts as 0, as masked_mean gives)."""
    valid = mask.bool()
    per_seq = torch.where(valid, kl, 0.0).sum(-1) / (valid.sum(-1) + 1e-8)
    return float(per_seq.mean())
