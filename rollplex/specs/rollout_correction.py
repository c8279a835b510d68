"""RolloutCorrectionSpec: correcting for the rollout engine's own distribution.

The rollout engine (vLLM in bf16, say) samples from a distribution a little unlike the one
the trainer scores. verl's rollout correction (algorithm.rollout_correction) reweights or
drops the tokens where the two disagree; the names here are verl's keys. Asking vLLM
for logprobs costs decode time (FACTS.md: twice the step at batch 256).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rollplex.specs.base import Spec


class RolloutCorrectionSpec(Spec):
    """Importance weights (IS) and rejection (RS) from the ratio of the trainer's old
    logprobs to the rollout engine's, pi_old / pi_rollout. Both off by default."""

    rollout_is: Literal["token", "sequence"] | None = Field(
        None,
        description="Truncated importance sampling (TIS): each token's policy-gradient term "
        "is multiplied by min(w, rollout_is_threshold), w = pi_old / pi_rollout of the token "
        "(token) or the product over its response (sequence); detached, so it reweights the "
        "samples and not the objective. null: off. The KL and entropy terms are not "
        "reweighted.",
    )
    rollout_is_threshold: float = Field(
        2.0, gt=0, description="The IS weight's truncation (verl's default 2.0)."
    )
    rollout_rs: Literal["token", "sequence", "geometric"] | None = Field(
        None,
        description="Rejection sampling: tokens (token), or whole responses by the product "
        "(sequence) or the geometric mean (geometric) of their ratios, whose ratio lies "
        "outside [rollout_rs_threshold_lower, rollout_rs_threshold] leave the loss and its "
        "normaliser. It needs the old logprobs before the training forward, so a one-update "
        "step gains the old-logprob forward that verl's recompute runs. null: off.",
    )
    rollout_rs_threshold: float = Field(
        2.0, gt=0, description="Rejection's upper bound on the ratio (verl's default 2.0)."
    )
    rollout_rs_threshold_lower: float | None = Field(
        None, gt=0, description="Rejection's lower bound; null: 1 / rollout_rs_threshold."
    )
    rollout_token_veto_threshold: float | None = Field(
        None,
        gt=0,
        lt=1,
        description="Veto: a response with any token whose ratio is below this leaves the "
        "loss whole, as rejection does (verl suggests 1e-4 to 1e-6: a token the trainer "
        "finds thousands of times less likely than the engine did). null: off.",
    )

    @property
    def rejects(self) -> bool:
        """Whether tokens can leave the loss (rejection or veto): the normaliser then
        depends on every row's ratio."""
        return self.rollout_rs is not None or self.rollout_token_veto_threshold is not None

    @property
    def enabled(self) -> bool:
        """Whether the loss reads the rollout's logprobs at all."""
        return self.rollout_is is not None or self.rejects

    @property
    def rs_lower(self) -> float:
        low = self.rollout_rs_threshold_lower
        return 1.0 / self.rollout_rs_threshold if low is None else low

    @model_validator(mode="after")
    def _check(self) -> RolloutCorrectionSpec:
        if self.rollout_rs is not None and self.rs_lower >= self.rollout_rs_threshold:
            raise ValueError(
                f"rollout_rs_threshold_lower={self.rs_lower} must be below "
                f"rollout_rs_threshold={self.rollout_rs_threshold}: no ratio would be kept"
            )
        return self
