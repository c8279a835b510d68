"""Early backward of finished rows: GRPO's gradient in its two-accumulator form (issue 31.3).

Each row backpropagates as it ends, adding R_i g_i and g_i to its group's accumulators; the
group combines them once its rewards give mu and sigma. A row whose ratio leaves the clip band
waits for its group (`GroupAccumulator.add_late`). The derivation and what is refused:
docs/architecture.md (Training).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from rollplex.backends.torch.loss import agg_units, aggregate, k3_kl
from rollplex.graph.passes.early_backward import algo_refusal as refusal
from rollplex.specs import AlgoSpec

__all__ = [
    "GroupAccumulator",
    "batch_units",
    "buffer_bytes",
    "inside_clip_band",
    "refusal",
    "row_terms",
]


def batch_units(mask: torch.Tensor, algo: AlgoSpec) -> torch.Tensor:
    """What the batch's aggregate divides by: its valid tokens or sequences, or under
    seq-mean-token-sum-norm the constant (loss_scale_factor, else the padded width, which a
    row slice of the batch shares)."""
    if algo.loss_agg_mode == "seq-mean-token-sum-norm":
        return torch.tensor(float(algo.loss_scale_factor or mask.shape[-1]))
    return agg_units(mask.bool(), algo.loss_agg_mode)


def inside_clip_band(
    logprobs: torch.Tensor, old: torch.Tensor, mask: torch.Tensor, clip_eps: float, c: float
) -> bool:
    """Every valid token's ratio in (1 - eps, min(1 + eps, c)): h(r) = r for either sign."""
    r = torch.exp((logprobs.detach() - old).double())
    valid = mask.bool()
    inside = (r > 1 - clip_eps) & (r < min(1 + clip_eps, c))
    return bool((inside | ~valid).all())


def row_terms(
    logprobs: torch.Tensor,
    old: torch.Tensor,
    ref: torch.Tensor | None,
    mask: torch.Tensor,
    algo: AlgoSpec,
    kl_coef: float,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(pg at A = 1, kl_coef * KL) of rows [n, R], each unnormalised: its aggregate times
    its own units, so that summing over rows and dividing by the batch's units gives
    `aggregate` over the batch. With the ratio inside the band, pg = -sum w_t r_t."""
    valid = mask.bool()
    r = torch.exp((logprobs - old).clamp(-algo.log_ratio_clamp, algo.log_ratio_clamp))
    units = batch_units(valid, algo).to(r.dtype)
    scale = algo.loss_scale_factor
    pg = aggregate(-r, valid, algo.loss_agg_mode, scale) * units
    if ref is None or kl_coef == 0:
        return pg, None
    kl = k3_kl(logprobs, ref, algo.log_ratio_clamp, algo.kl_clamp)
    return pg, kl_coef * aggregate(kl, valid, algo.loss_agg_mode, scale) * units


def _grad(term: torch.Tensor, params: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    grads = torch.autograd.grad(term, params, retain_graph=True, allow_unused=True)
    return [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads, strict=True)]


@dataclass(slots=True)
class GroupAccumulator:
    """One group's S_R and S_1 (one gradient-sized buffer each, per parameter), the rewards
    seen, and the rows that had to wait for the group (outside the band)."""

    params: Sequence[torch.Tensor]
    group_size: int
    rewards: dict[int, float] = field(default_factory=dict)
    s_r: list[torch.Tensor] | None = None
    s_1: list[torch.Tensor] | None = None
    late: list[tuple[int, torch.Tensor]] = field(default_factory=list)  # (row, pg at A=1)

    def add(self, row: int, reward: float, pg_at_one: torch.Tensor) -> None:
        """Row `row` ended: its gradient at A = 1 goes into S_1, times R into S_R."""
        g = _grad(pg_at_one, self.params)
        if self.s_r is None:
            self.s_r = [reward * x for x in g]
            self.s_1 = g
        else:
            for a, b, x in zip(self.s_r, self.s_1, g, strict=True):
                a.add_(x, alpha=reward)
                b.add_(x)
        self.rewards[row] = reward

    def add_late(self, row: int, reward: float, pg_at_one: torch.Tensor) -> None:
        """A row outside the band: kept (its graph) until the group's advantages exist."""
        self.late.append((row, pg_at_one))
        self.rewards[row] = reward

    @property
    def complete(self) -> bool:
        return len(self.rewards) == self.group_size

    def combine(self, estimator: str, norm_by_std: bool, eps: float = 1e-6):
        """The group's sum_i A_i g_i, as group_advantages / leave_one_out_advantages give
        A_i (loss.py): (S_R - mu S_1) scaled, plus each late row's A_i g_i."""
        if not self.complete:
            raise ValueError(f"{len(self.rewards)} of {self.group_size} rows ended")
        r = torch.tensor([self.rewards[k] for k in sorted(self.rewards)], dtype=torch.float64)
        mu = r.mean()
        if estimator == "rloo":
            scale = self.group_size / (self.group_size - 1)
        elif self.group_size == 1 or not norm_by_std:
            scale = 1.0
        else:
            scale = 1.0 / (r.std() + eps)
        out = [torch.zeros_like(p) for p in self.params]
        if self.s_r is not None:
            for o, a, b in zip(out, self.s_r, self.s_1, strict=True):
                o.add_((a - float(mu) * b) * float(scale))
        for row, pg in self.late:
            adv = (self.rewards[row] - mu) * scale
            for o, x in zip(out, _grad(pg, self.params), strict=True):
                o.add_(x, alpha=float(adv))
        self.s_r = self.s_1 = None  # the two buffers are freed once combined
        self.late.clear()
        return out


def buffer_bytes(params: Sequence[torch.Tensor], groups_in_flight: int) -> int:
    """The memory the accumulators hold: two gradient-sized buffers per group in flight."""
    return 2 * groups_in_flight * sum(p.numel() * p.element_size() for p in params)
