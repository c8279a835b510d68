"""What the dispatch's helpers (role_free.py, rollout_ops.py, forward_ops.py) read of the
RoleDispatch that owns them (dispatch.py): its roles, config and sampling, the step in
flight and its metrics. A protocol, so the helpers need not import the dispatch that
imports them."""

from __future__ import annotations

from typing import Any, Protocol

import torch

from rollplex.backends.base import RolloutRole, Sampling, Trainer, ValueOps
from rollplex.backends.step import Roles, StepConfig, StepInputs
from rollplex.graph.ir import Op


class DispatchView(Protocol):
    config: StepConfig
    roles: Roles
    device: torch.device
    sampling: Sampling
    values: ValueOps
    rollout: RolloutRole
    trainer: Trainer
    critic: Any  # the PPO critic once a graph reads its weights, else None
    metrics: dict[str, torch.Tensor]  # the step's, replaced at each step's start
    _generator: Any  # the step's decode generator (or one per row: StepHooks)
    _step: int
    _inputs: StepInputs | None
    rollout_ops: Any  # rollout_ops.RolloutOps: decode rides and the rollout's weights check

    def role(self, op: Op) -> Any: ...

    def update_metrics(self, kind: str, metrics: dict[str, torch.Tensor]) -> None: ...

    def _reward(self, responses: Any, answers: Any, group_size: int) -> torch.Tensor: ...


__all__ = ["DispatchView"]
