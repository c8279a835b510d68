"""AlgoSpec: which RL algorithm builds the step graph, and its hyperparameters.

The loss settings follow verl's `core_algos` (names in brackets are verl's config keys),
so a verl or TRL user can carry their numbers over."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from rollplex.specs.base import Spec
from rollplex.specs.rollout_correction import RolloutCorrectionSpec

LossAgg = Literal[
    "token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"
]
# verl's kl_penalty names (backends/torch/kl.py); "+" keeps the value, takes k2's gradient
KL_ESTIMATORS = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
KL_ESTIMATORS += tuple(f"{n}+" for n in KL_ESTIMATORS)
GSPO_AGG = "seq-mean-token-mean"  # GSPO's aggregation (verl's compute_policy_loss_gspo)
LOSS_MODES = ("vanilla", "gspo", "cispo")  # verl's policy_loss.loss_mode names
# advantages whitened over the batch's tokens: they read the responses' lengths, no row's is
# exactly 0, and a data-parallel rank holds only part of the batch they are whitened over
TOKEN_WHITENED = ("reinforce_plus_plus_baseline",)
LossMode = Literal[LOSS_MODES]


class AlgoSpec(Spec):
    """An RL algorithm and its knobs. The builder in `rollplex.algos` reads these."""

    name: Literal["grpo", "ppo", "rloo", "reinforce_plus_plus_baseline"] = Field(
        "grpo",
        description="Graph builder to use [algorithm.adv_estimator]: grpo, rloo and "
        "reinforce_plus_plus_baseline (REINFORCE++-baseline: each reward less its group's "
        "mean, then whitened over every response token of the batch) share GRPO's step; ppo "
        "adds a critic and GAE.",
    )
    use_reference: bool | None = Field(
        None,
        description="Score with a frozen reference model. null (auto): exactly when a KL "
        "term reads it (kl_coef > 0), as verl builds its reference worker only for "
        "use_kl_loss or use_kl_in_reward; so kl_coef=0 drops the reference's forwards and "
        "weights. true with kl_coef=0 keeps it for the logged KL alone.",
    )
    skip_zero_advantage: bool | None = Field(
        None,
        description="Train only the groups with a nonzero advantage: a group whose rewards "
        "are all equal has advantage exactly 0 on every row (grpo, rloo), so with no KL or "
        "entropy term in the loss its rows add exactly 0 to the gradient, and their training "
        "forward and backward are skipped; the loss value is unchanged and the loss metrics "
        "(entropy, ratio, clip fractions) are the trained rows'. null (auto): on exactly when "
        "nothing reads those rows (grpo or rloo, entropy_coeff=0, no reference, no "
        "rejection in rollout_correction). The plan is "
        "priced and sized as if every group trains.",
    )
    kl_coef: float = Field(
        0.04,
        ge=0,
        description="Weight of the KL to the reference: of the loss's kl_loss_type term "
        "[kl_loss_coef], or with kl_in_reward of the per-token reward penalty (the adaptive "
        "controller's start) [algorithm.kl_ctrl.kl_coef].",
    )
    kl_in_reward: bool = Field(
        False,
        description="PPO only: subtract kl_coef * KL(old, ref) (kl_penalty's estimator) from "
        "each token's reward before GAE [use_kl_in_reward]; the loss then has a KL term "
        "only with kl_loss_coef.",
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
    loss_mode: LossMode = Field(
        "vanilla",
        description="The policy loss [actor.policy_loss.loss_mode]: vanilla (PPO's clipped "
        "per-token ratio, with the dual clip); gspo (GSPO, arXiv 2507.18071: every token "
        "of a response takes its sequence's ratio, exp of the mean per-token log-ratio, "
        "clipped by clip_ratio_low/high, no dual clip; its gradient is the sequence "
        "objective's; it aggregates seq-mean-token-mean, as verl's does: loss_agg_mode "
        "null follows, and another value is refused; the paper clips at 3e-4 and 4e-4); "
        "cispo (CISPO, arXiv 2506.13585: -sg(clip(r, 1 - clip_ratio_low, 1 + "
        "clip_ratio_high)) A logp, so a clipped token keeps its gradient; no dual clip).",
    )
    rollout_correction: RolloutCorrectionSpec = Field(
        default_factory=RolloutCorrectionSpec,
        description="Importance weights and rejection against the rollout engine's own "
        "logprobs [algorithm.rollout_correction]; its fields say how. The rollout must "
        "return logprobs of the distribution the trainer scores (vLLM: "
        "backend.vllm.return_logprobs=true, top_p=1).",
    )
    loss_agg_mode: LossAgg | None = Field(
        None,
        description="How per-token losses become one number [loss_agg_mode]; null: "
        "token-mean, or seq-mean-token-mean under loss_mode=gspo. token-mean "
        "(over all valid tokens of the batch), seq-mean-token-mean (mean per sequence, then "
        "over sequences), seq-mean-token-sum (sum per sequence, then mean over sequences), "
        "seq-mean-token-sum-norm (the sum over every valid token divided by a constant, "
        "loss_scale_factor: verl's Dr. GRPO recipe).",
    )
    loss_scale_factor: int | None = Field(
        None,
        gt=0,
        description="seq-mean-token-sum-norm's divisor [loss_scale_factor]; unset, the "
        "padded response width (train's max_new_tokens), as verl's loss_mask.shape[-1].",
    )
    norm_adv_by_std_in_grpo: bool = Field(
        True,
        description="GRPO: divide group-centred rewards by the group's std (+1e-6); false "
        "keeps only the centring, as Dr. GRPO does [norm_adv_by_std_in_grpo]. A group of "
        "one (workload.group_size=1) has no baseline: as in verl its advantage is the raw "
        "reward (/ (1 + 1e-6) with the std), and the train job says so in its log.",
    )
    clip_ratio_low: float | None = Field(
        None,
        gt=0,
        lt=1,
        description="Lower ratio clip: r is clipped below at 1 - this [clip_ratio_low]; "
        "unset, clip_eps.",
    )
    clip_ratio_high: float | None = Field(
        None,
        gt=0,
        description="Upper ratio clip: r is clipped above at 1 + this [clip_ratio_high]; "
        "unset, clip_eps. DAPO's clip-higher sets 0.28 with clip_ratio_low 0.2.",
    )
    entropy_coeff: float = Field(
        0.0,
        description="Subtract this times the policy's entropy (aggregated as the loss is) "
        "from the loss [entropy_coeff]: the entropy of the temperature-scaled distribution "
        "at each response position, from the training forward's own logits (no extra "
        "forward). It is logged as `entropy` every step either way; at 0 it carries no "
        "grad.",
    )
    kl_loss_type: str = Field(
        "low_var_kl",
        description="Estimator of the KL loss term [kl_loss_type]: kl/k1 (logp - ref), abs, "
        "mse/k2 (half the squared difference), low_var_kl/k3 (clamped e^-d + d - 1); a "
        "trailing '+' (k3+, low_var_kl+ ...) keeps the value but takes k2's gradient.",
    )
    kl_penalty: str = Field(
        "kl",
        description="With kl_in_reward: the estimator of the reward's per-token KL penalty, "
        "names as kl_loss_type [algorithm.kl_penalty].",
    )
    kl_loss_coef: float | None = Field(
        None,
        ge=0,
        description="With kl_in_reward: also add this times the kl_loss_type KL to the loss, "
        "so both penalties apply [use_kl_loss, kl_loss_coef]; unset, only the reward's. "
        "Without kl_in_reward kl_coef is the loss term's weight, and this is refused.",
    )
    kl_ctrl: Literal["fixed", "adaptive"] = Field(
        "fixed",
        description="With kl_in_reward: the reward penalty's coefficient stays kl_coef "
        "(fixed) or follows verl's AdaptiveKLController (adaptive): after each step it is "
        "multiplied by 1 + clip(kl / target_kl - 1, +-0.2) * batch / kl_horizon "
        "[algorithm.kl_ctrl.type].",
    )
    target_kl: float = Field(
        0.1, gt=0, description="Adaptive KL: the KL to steer to [kl_ctrl.target_kl]."
    )
    kl_horizon: int = Field(
        10000, gt=0, description="Adaptive KL: samples over which it adapts [kl_ctrl.horizon]."
    )
    lr: float = Field(1e-6, gt=0, description="AdamW learning rate (the peak of lr_schedule).")
    lr_warmup_steps: int = Field(
        0,
        ge=0,
        description="Policy updates over which the learning rate rises linearly from 0 to "
        "lr [actor.optim.lr_warmup_steps]; 0: none.",
    )
    lr_schedule: Literal["constant", "cosine"] = Field(
        "constant",
        description="After warm-up: lr throughout, or a cosine decay to min_lr_ratio x lr "
        "at the run's last update [actor.optim.warmup_style].",
    )
    min_lr_ratio: float = Field(
        0.0, ge=0, le=1, description="The cosine's floor, as a share of lr [min_lr_ratio]."
    )
    lr_total_updates: int | None = Field(
        None,
        ge=1,
        description="The updates the cosine spans; None: the train job's train.steps x "
        "updates a step (PPO mini-batches x epochs), recorded in config.json.",
    )
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

    @field_validator("kl_loss_type", "kl_penalty")
    @classmethod
    def _estimator(cls, v: str, info) -> str:
        if v in ("full", "full+"):
            raise ValueError(
                f"{info.field_name}={v!r} needs the whole vocabulary's logprobs (verl does "
                f"not implement it either); use one of {KL_ESTIMATORS}"
            )
        if v not in KL_ESTIMATORS:
            raise ValueError(f"{info.field_name}={v!r}: expected one of {KL_ESTIMATORS}")
        return v

    @model_validator(mode="before")
    @classmethod
    def _reference_when_read(cls, data: Any) -> Any:
        """use_reference=null resolves here, so every reader sees a bool."""
        if not isinstance(data, dict) or data.get("use_reference") is not None:
            return data
        try:
            coef = float(data.get("kl_coef", cls.model_fields["kl_coef"].default))
        except (TypeError, ValueError):
            return data  # kl_coef's own check names what is wrong with it
        return {**data, "use_reference": coef > 0}

    @model_validator(mode="before")
    @classmethod
    def _aggregation_of_the_loss(cls, data: Any) -> Any:
        """loss_agg_mode=null resolves here to its loss_mode's: token-mean, or gspo's
        seq-mean-token-mean (`_check` refuses gspo with another)."""
        if not isinstance(data, dict) or data.get("loss_agg_mode") is not None:
            return data
        gspo = data.get("loss_mode") == "gspo"
        return {**data, "loss_agg_mode": GSPO_AGG if gspo else "token-mean"}

    @model_validator(mode="after")
    def _skip_when_unread(self) -> AlgoSpec:
        """skip_zero_advantage=null resolves here, after use_reference has (the spec is
        frozen, and this is its own validation)."""
        if self.skip_zero_advantage is None:
            unread = self.name in ("grpo", "rloo") and self.entropy_coeff == 0
            unread = unread and not self.use_reference
            unread = unread and not self.rollout_correction.rejects
            object.__setattr__(self, "skip_zero_advantage", unread)
        return self

    @model_validator(mode="after")
    def _check(self) -> AlgoSpec:
        if self.kl_coef > 0 and not self.use_reference:
            raise ValueError("kl_coef > 0 needs use_reference=true (set kl_coef=0 to drop it)")
        if self.kl_in_reward and self.name != "ppo":
            raise ValueError(f"kl_in_reward is PPO's (GAE over token rewards), not {self.name}'s")
        self._check_kl_options()
        self._check_skip()
        if self.loss_mode == "gspo" and self.loss_agg_mode != GSPO_AGG:
            raise ValueError(
                f"loss_mode=gspo aggregates {GSPO_AGG} (each response's tokens share its "
                f"sequence ratio; verl's gspo does the same); loss_agg_mode is "
                f"{self.loss_agg_mode!r}: leave it unset"
            )
        if self.loss_scale_factor is not None and self.loss_agg_mode != "seq-mean-token-sum-norm":
            raise ValueError(
                "loss_scale_factor divides seq-mean-token-sum-norm's sum; loss_agg_mode is "
                f"{self.loss_agg_mode!r}"
            )
        return self

    def _check_skip(self) -> None:
        """skip_zero_advantage=true where a skipped row would change the gradient is refused."""
        if not self.skip_zero_advantage:
            return
        why = skip_refusal(self)
        if why:
            raise ValueError(f"skip_zero_advantage=true: {why}")

    def _check_kl_options(self) -> None:
        """The reward-KL options need kl_in_reward; each one set without it is refused."""
        if not self.kl_in_reward:
            for name, unused in (
                ("kl_loss_coef", self.kl_loss_coef is not None),
                ("kl_penalty", self.kl_penalty != "kl"),
                ("kl_ctrl", self.kl_ctrl != "fixed"),
            ):
                if unused:
                    raise ValueError(
                        f"{name} applies with kl_in_reward=true (the reward's KL penalty); "
                        "without it kl_coef weighs the loss's KL term"
                    )
        if self.kl_ctrl == "adaptive" and self.kl_coef == 0:
            raise ValueError("kl_ctrl=adaptive scales kl_coef from where it starts; it is 0")
        if self.kl_ctrl == "fixed":
            for name in ("target_kl", "kl_horizon"):
                if getattr(self, name) != type(self).model_fields[name].default:
                    raise ValueError(f"{name} steers kl_ctrl=adaptive; kl_ctrl is fixed")
        if self.kl_in_reward and not self.use_reference:
            raise ValueError("kl_in_reward needs use_reference=true (the KL is to the reference)")


def skip_refusal(algo: AlgoSpec) -> str | None:
    """Why a zero-advantage row's gradient may be nonzero under `algo`'s loss, or None."""
    if algo.name == "ppo":
        return "ppo's GAE advantages are per token and whitened: no row's is exactly 0"
    if algo.name in TOKEN_WHITENED:
        return f"{algo.name}'s advantages are whitened over the batch: no row's is exactly 0"
    if algo.entropy_coeff:
        return f"entropy_coeff={algo.entropy_coeff} gives every row a gradient"
    if algo.kl_coef and algo.use_reference:
        return f"kl_coef={algo.kl_coef} gives every row a gradient (the KL to the reference)"
    rc = algo.rollout_correction
    if rc.rejects:
        field, value = "rollout_rs", rc.rollout_rs
        if value is None:
            field, value = "rollout_token_veto_threshold", rc.rollout_token_veto_threshold
        return (
            f"rollout_correction.{field}={value} reads every row's ratio: a rejected token "
            "leaves the loss's normaliser"
        )
    return None
