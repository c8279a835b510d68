"""AlgoSpec: which RL algorithm builds the step graph, and its hyperparameters.

The loss settings follow verl's `core_algos` (names in brackets are verl's config keys),
so a verl or TRL user can carry their numbers over."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rollplex.specs.base import Spec

LossAgg = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]


class AlgoSpec(Spec):
    """An RL algorithm and its knobs. The builder in `rollplex.algos` reads these."""

    name: Literal["grpo", "ppo", "rloo"] = Field("grpo", description="Graph builder to use.")
    use_reference: bool = Field(True, description="Score with a frozen reference model (KL).")
    kl_coef: float = Field(
        0.04,
        ge=0,
        description="Weight of the KL to the reference: of the k3 loss term [kl_loss_coef], "
        "or with kl_in_reward of the per-token reward penalty [algorithm.kl_ctrl.kl_coef].",
    )
    kl_in_reward: bool = Field(
        False,
        description="PPO only: subtract kl_coef * (old - ref logprob) from each token's reward "
        "before GAE [use_kl_in_reward, kl_penalty='kl'] instead of adding a k3 term to the loss.",
    )
    clip_eps: float = Field(0.2, gt=0, lt=1, description="PPO ratio clip [clip_ratio].")
    clip_ratio_c: float = Field(
        3.0,
        gt=1,
        description="Dual clip: for negative advantages the per-token loss is capped at "
        "-A * clip_ratio_c, so a huge ratio on a bad token cannot dominate [clip_ratio_c].",
    )
    log_ratio_clamp: float = Field(
        20.0,
        gt=0,
        description="log(pi/pi_old) and log(pi_ref/pi) are clamped to +-this before exp, as "
        "verl does (hard-coded 20 there): one outlier token cannot overflow the loss.",
    )
    kl_clamp: float = Field(
        10.0,
        gt=0,
        description="The per-token k3 KL is clamped to +-this [low_var_kl's 10].",
    )
    loss_agg_mode: LossAgg = Field(
        "token-mean",
        description="How per-token losses become one number [loss_agg_mode]: token-mean "
        "(over all valid tokens of the batch), seq-mean-token-mean (mean per sequence, then "
        "over sequences), seq-mean-token-sum (sum per sequence, then mean; Dr. GRPO).",
    )
    norm_adv_by_std_in_grpo: bool = Field(
        True,
        description="GRPO: divide group-centred rewards by the group's std (+1e-6); false "
        "keeps only the centring, as Dr. GRPO does [norm_adv_by_std_in_grpo].",
    )
    lr: float = Field(1e-6, gt=0, description="AdamW learning rate.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    adam_betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas.")
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping norm.")
    temperature: float = Field(
        1.0,
        gt=0,
        description="Sampling temperature of the rollout. Every logprob (rollout, reference, "
        "trainer) is of this temperature-scaled distribution, so the ratio is 1 on-policy.",
    )
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass.")
    gamma: float = Field(1.0, ge=0, le=1, description="Discount (PPO/GAE).")
    gae_lambda: float = Field(0.95, ge=0, le=1, description="GAE lambda (PPO).")
    critic_lr: float = Field(1e-5, gt=0, description="PPO: the critic's AdamW learning rate.")
    value_clip: float = Field(
        0.5,
        gt=0,
        description="PPO: new values are clipped to old +- this in the value loss "
        "[critic.cliprange_value].",
    )
    ppo_mini_batch_size: int | None = Field(
        None,
        ge=1,
        description="Prompts per policy update, as verl counts them (each brings its "
        "group_size samples) [ppo_mini_batch_size]: the step's batch is cut, in order, into "
        "ceil(prompts_per_step / this) mini-batches, one optimizer step each; None: the "
        "whole batch, one update. At most workload.prompts_per_step.",
    )
    ppo_epochs: int = Field(
        1,
        ge=1,
        description="Passes over the step's mini-batches [ppo_epochs]. Only the first update "
        "is on-policy; the later ones are where the ratio clip engages. Not shuffled between "
        "epochs (verl's default actor.shuffle=false).",
    )
    reward_models: int = Field(
        0, ge=0, description="Learned reward models scored after rollout (0: rule reward only)."
    )

    @model_validator(mode="after")
    def _check(self) -> AlgoSpec:
        if self.kl_coef > 0 and not self.use_reference:
            raise ValueError("kl_coef > 0 needs use_reference=true (set kl_coef=0 to drop it)")
        if self.kl_in_reward and self.name != "ppo":
            raise ValueError(f"kl_in_reward is PPO's (GAE over token rewards), not {self.name}'s")
        return self
