"""AlgoSpec: which RL algorithm builds the step graph, and its hyperparameters."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rollplex.specs.base import Spec


class AlgoSpec(Spec):
    """An RL algorithm and its knobs. The builder in `rollplex.algos` reads these."""

    name: Literal["grpo", "ppo", "rloo"] = Field("grpo", description="Graph builder to use.")
    use_reference: bool = Field(True, description="Score with a frozen reference model (KL).")
    kl_coef: float = Field(0.04, ge=0, description="Weight of the KL-to-reference penalty.")
    clip_eps: float = Field(0.2, gt=0, lt=1, description="PPO-style ratio clip.")
    lr: float = Field(1e-6, gt=0, description="AdamW learning rate.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    adam_betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas.")
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping norm.")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature of the rollout.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass.")
    gamma: float = Field(1.0, ge=0, le=1, description="Discount (PPO/GAE).")
    gae_lambda: float = Field(0.95, ge=0, le=1, description="GAE lambda (PPO).")
    reward_models: int = Field(
        0, ge=0, description="Learned reward models scored after rollout (0: rule reward only)."
    )

    @model_validator(mode="after")
    def _check(self) -> AlgoSpec:
        if self.kl_coef > 0 and not self.use_reference:
            raise ValueError("kl_coef > 0 needs use_reference=true (set kl_coef=0 to drop it)")
        return self
