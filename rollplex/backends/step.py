"""What one RL step hands its roles: the step config every role mix shares, the built-in
task's step inputs, the chosen roles, and what a trainer brings besides them (RoleRuntime).
The runtime's dispatch (runtime/dispatch.py) runs a step over these; a backend builds them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from rollplex.backends.base import ReferenceScorer, RolloutRole, Trainer, ValueOps
from rollplex.backends.hooks import StepHooks
from rollplex.data.prompts import PromptBatch
from rollplex.specs import AlgoSpec, ModelSpec


@dataclass(slots=True, frozen=True)
class StepConfig:
    """What every role mix shares: the model, the algorithm and the rollout's sampling."""

    model: ModelSpec
    algo: AlgoSpec
    seed: int
    max_new_tokens: int
    reward: str = "first_token"  # token-id rewards of the built-in task (task.py)
    device: str = "cpu"
    # Scores decoded responses against their samples (rollplex.runtime.scoring); None:
    # the built-in task's token-id `reward`.
    scorer: Any = None
    # Draw each response's length from this distribution (a ResponseLengthSpec), eos
    # ignored: benchmarks of random-weight models, which never stop (train.response_lengths)
    forced_lengths: Any = None


@dataclass(slots=True)
class StepInputs:
    """One RL step's prompts of the built-in task: a collated batch (pixels included), the
    answer token ids, and the raw media (images) an engine rollout reads instead of pixel
    patches. Real data comes as `rollplex.data.steps.StepInputs` (batch + samples, whose
    images and frames are the media)."""

    batch: PromptBatch
    answers: torch.Tensor  # [B] long
    media: Any = None


@dataclass(slots=True)
class Roles:
    """The chosen roles, the value types they share, and what supplies the step's inputs."""

    rollout: RolloutRole
    reference: ReferenceScorer | None
    trainer: Trainer
    values: ValueOps
    externals: Any  # .bind(graph) -> name -> what; .supply(step inputs, roles) -> what -> value
    critic_factory: Any = None  # () -> critic, built when a graph reads critic weights
    hooks: StepHooks = field(default_factory=StepHooks)  # data-parallel ranks (hooks.py)


@dataclass(slots=True, frozen=True)
class RoleRuntime:
    """What a trainer brings to the dispatch besides its roles."""

    config: StepConfig
    values: ValueOps
    hooks: StepHooks
    critic_factory: Any = None  # () -> its critic (PPO); None: the torch backend's


__all__ = ["RoleRuntime", "Roles", "StepConfig", "StepInputs"]
