"""The ops no role owns: rows repeated per sample, a PPO mini-batch's rows, rewards,
advantages, the critic's loss.

They read values the roles produced (responses, logprobs, values) and are the same for
every mix of roles, so they run here, once, rather than in each backend.
"""

from __future__ import annotations

from typing import Any

import torch

from rollplex.backends.base import BackendError
from rollplex.backends.torch.kl import KLController, sequence_mean_kl
from rollplex.backends.torch.loss import OUTCOME_ESTIMATORS, outcome_advantages, reward_kl
from rollplex.backends.torch.task import first_token_reward, reward
from rollplex.graph.ir import Op
from rollplex.runtime.dispatch_view import DispatchView


class RoleFreeOps:
    def __init__(self, dispatch: DispatchView) -> None:
        self.d = dispatch
        self.kl_ctrl: KLController | None = None  # the reward KL's coefficient, step to step

    def run(self, op: Op, x: dict[str, Any]) -> dict[str, Any]:
        d, k, a = self.d, op.kind, op.attrs
        if k == "expand_group":
            return {"y": d.values.repeat(x["x"], a["group_size"])}
        if k == "select_rows":
            return {"y": self._select(op, x["x"])}
        if k == "reward":
            return {"rewards": d._reward(x["responses"], x["answers"], a["group_size"])}
        if (k == "value_loss" or a.get("estimator") == "gae") and d.critic is None:
            raise BackendError(f"'{op.name}' ({k}) needs a critic: no op reads critic weights")
        if k == "advantage" and a.get("estimator") == "gae":
            kl = None
            if "ref_logprobs" in x:
                if x["old_logprobs"] is None:
                    raise BackendError(
                        f"'{op.name}': kl_in_reward needs the rollout's logprobs before "
                        f"training, and {type(d.rollout).__name__} gives none of logits/T"
                    )
                kl = self._reward_kl(x["old_logprobs"], x["ref_logprobs"], x["values"].mask, a)
            adv, returns = d.critic.advantages(x["rewards"], x["values"], a["gamma"], a["lam"], kl)
            return {"advantages": adv, "returns": returns}
        if k == "value_loss":
            loss = d.critic.loss(
                x["values"], x["returns"], x.get("old_values"), a.get("clip_eps", 0.5)
            )
            d.update_metrics(k, loss.metrics)
            return {"loss": loss}
        if k == "advantage":
            estimator = a.get("estimator", "grpo")
            if estimator not in OUTCOME_ESTIMATORS:
                raise BackendError(
                    f"'{op.name}': estimator {estimator!r}; only {OUTCOME_ESTIMATORS} run"
                )
            responses = x.get("responses")  # the estimators that whiten over tokens read it
            lengths = None if responses is None else responses.lengths.to(x["rewards"].device)
            adv = outcome_advantages(
                estimator, x["rewards"], a["group_size"], lengths,
                norm_by_std=d.config.algo.norm_adv_by_std_in_grpo,
            )  # fmt: skip
            return {"advantages": adv}
        raise BackendError(f"'{op.name}' ({k}) is not a role-free op")

    def reward_kl_coef(self) -> float | None:
        """The adaptive reward-KL coefficient the next step starts from (a checkpoint keeps
        it); None where none adapts (no kl_in_reward, or kl_ctrl=fixed)."""
        ctrl = self.kl_ctrl
        return ctrl.value if ctrl is not None and ctrl.kind != "fixed" else None

    def resume_reward_kl(self, coef: float) -> None:
        """A resumed run's controller starts at its checkpoint's coefficient, not kl_coef."""
        algo = self.d.config.algo
        self.kl_ctrl = KLController(coef, algo.kl_ctrl, algo.target_kl, algo.kl_horizon)

    def _reward_kl(self, old: Any, ref: Any, mask: torch.Tensor, attrs: dict) -> tuple:
        """(old, ref, coefficient, estimator) for the critic's KL-penalised rewards, with
        verl's metrics: reward_kl (per-sequence mean KL, averaged) and reward_kl_coef (the
        coefficient this step used); then the controller sees this step's KL and row count,
        the whole batch's where data-parallel ranks hold its rows (the FSDP2 critic's
        `batch_total`), as one process holding the batch would."""
        algo = self.d.config.algo
        if self.kl_ctrl is None:
            self.kl_ctrl = KLController(
                attrs["kl_coef"], algo.kl_ctrl, algo.target_kl, algo.kl_horizon
            )
        coef = self.kl_ctrl.value
        current = sequence_mean_kl(reward_kl(old.values, ref.values, mask, algo.kl_penalty), mask)
        rows = mask.shape[0]
        if (total := self.d.critic.batch_total) is not None:  # the batch's rows on every rank
            both = torch.tensor([current * rows, rows], dtype=torch.float64, device=mask.device)
            summed = total(both)
            current, rows = float(summed[0] / summed[1]), round(float(summed[1]))
        self.d.metrics["reward_kl"] = torch.tensor(current)
        self.d.metrics["reward_kl_coef"] = torch.tensor(coef)
        self.kl_ctrl.update(current, n_steps=rows)  # so every rank's coefficient is the same
        return old, ref, coef, algo.kl_penalty

    def _select(self, op: Op, value: Any) -> Any:
        """Rows [lo, hi) of the graph's batch. A data-parallel rank holds its share of the
        batch (backends/hooks.py): it takes the same share of the window, which must then fall on
        whole rows of its own."""
        lo, hi, whole = op.attrs["lo"], op.attrs["hi"], op.attrs.get("rows")
        rows = self.d.values.row_count(value)
        if whole is not None and rows != whole:
            if (lo * rows) % whole or (hi * rows) % whole:
                raise BackendError(
                    f"'{op.name}': rows [{lo}, {hi}) of {whole} do not split evenly over this "
                    f"rank's {rows} (make algo.ppo_mini_batch_size divide the per-rank batch)"
                )
            lo, hi = lo * rows // whole, hi * rows // whole
        out = self.d.values.select(value, lo, hi)
        if out is value:
            raise BackendError(f"'{op.name}' cannot select rows of a {type(value).__name__}")
        return out


def task_reward(kind: str, responses: Any, answers: torch.Tensor, group_size: int, eos: int):
    """The synthetic task's reward per sample (backends/torch/task.py): `first_token` or
    `answer_eos`; float32 [S] on the responses' device."""
    per_sample = answers.repeat_interleave(group_size).tolist()
    rows = responses.tokens.tolist()
    if kind == "first_token":
        r = [first_token_reward(t, a) for t, a in zip(rows, per_sample, strict=True)]
    else:
        r = [reward(t, a, eos) for t, a in zip(rows, per_sample, strict=True)]
    return torch.tensor(r, dtype=torch.float32, device=responses.tokens.device)


def rewards(d: DispatchView, responses: Any, answers: Any, group_size: int) -> torch.Tensor:
    """Each response's reward, recorded in the step's metrics: the configured scorer's
    (decoded text against the samples, which `answers` then are), else the built-in task's
    token-id reward."""
    device = responses.tokens.device
    if d.config.scorer is not None:
        scored = d.config.scorer(
            responses.tokens.tolist(), responses.lengths.tolist(), answers, group_size
        )
        d.metrics.update({k: torch.tensor(v) for k, v in scored.metrics.items()})
        out = torch.tensor(scored.rewards, dtype=torch.float32, device=device)
    else:
        out = task_reward(d.config.reward, responses, answers, group_size, d.sampling.eos_id)
    d.metrics["reward"] = out.mean()
    return out
