"""PPO's critic under FSDP2: the torch backend's critic (backends/torch/critic.py: a copy of
the policy with a Linear(hidden, 1) head, its own AdamW, GAE, the clipped value loss)
sharded as the policy is (shard.py), as verl's critic is its own FSDP module.

Every number is `TorchCritic`'s. This class runs each forward inside the critic's own
sharded root, so each rank values its own rows; rescales the value loss so that FSDP's
gradient average is the global batch's (global_batch.py); and whitens GAE's advantages
over every rank's rows. Its AdamW is built after sharding, so its state is per shard, and
a checkpoint keeps both as DCP shards beside the policy's (runtime/dcp_checkpoint.py).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch.distributed.device_mesh import DeviceMesh

from rollplex.backends.fsdp.global_batch import global_loss, total
from rollplex.backends.fsdp.shard import (
    full,
    load_sharded_state,
    root_kept_through_backward,
    shard_model,
    sharded_state,
)
from rollplex.backends.fsdp.trainer import RootedScorer, ShardedWeightsHandle
from rollplex.backends.torch.critic import TorchCritic, build_critic_model
from rollplex.backends.torch.handles import GradsHandle, WeightsHandle
from rollplex.backends.torch.host_memory import forget_tags
from rollplex.backends.torch.model import build_model
from rollplex.backends.torch.roles import weights_params
from rollplex.backends.torch.values import Loss, TokenLogprobs
from rollplex.backends.torch.vision_attention import compile_vision_blocks
from rollplex.engine.prefix import Model
from rollplex.specs import AlgoSpec, ModelSpec
from rollplex.specs.fsdp import FsdpSpec

if TYPE_CHECKING:
    from rollplex.backends.fsdp.trainer import FsdpTrainer
    from rollplex.backends.step import StepConfig

# the value loss's metric aggregated by loss_agg_mode; its others are token means
AGGREGATED = frozenset({"vf_loss"})


class FsdpCritic(TorchCritic):
    """`TorchCritic` on sharded DTensors, over the policy's mesh."""

    def __init__(
        self,
        model: Model,
        spec: ModelSpec,
        algo: AlgoSpec,
        mesh: DeviceMesh,
        fsdp: FsdpSpec,
        device: str = "cpu",
    ) -> None:
        self.mesh, self.world = mesh, mesh.size()
        self.compute_dtype = fsdp.compute_dtype(device)
        # Shard before the optimizer exists: AdamW's state is then sharded as well.
        self.root = shard_model(
            model, mesh, self.compute_dtype, fsdp.reduce_dtype, fsdp.reshard_after_forward
        )
        super().__init__(model, spec, algo)
        self.batch_total = self._total
        self.scorer = RootedScorer(self.scorer, self)
        self.trainer = RootedScorer(self.trainer, self)

    def _total(self, x: torch.Tensor) -> torch.Tensor:
        return total(x, self.mesh)

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """The value head on merged row chunks (chunked prefix ops)."""
        return self.root(self.model.lm_head, hidden)

    def loss(
        self, values: TokenLogprobs, returns: torch.Tensor, old: TokenLogprobs | None, clip: float
    ) -> Loss:
        out = super().loss(values, returns, old, clip)
        return global_loss(out, values.mask, self.algo.loss_agg_mode, self.mesh, AGGREGATED)

    def backward(self, loss: Loss) -> GradsHandle:
        with root_kept_through_backward(self.root):  # (shard.py says why)
            return super().backward(loss)

    def handle(self) -> WeightsHandle:
        params = weights_params(self.model, self.spec)
        return ShardedWeightsHandle("critic", self.model, params, self.counter.n, self.counter)

    def full_parameters(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, full tensor) of every parameter, gathered (a collective per tensor)."""
        for name, p in self.model.named_parameters():
            yield name, full(p.detach())

    # -- checkpoint state (DCP, as the trainer's: sharded, resharded on load) -------------
    def sharded_state(self) -> dict[str, Any]:
        """Model and AdamW state as DTensors, for torch.distributed.checkpoint."""
        return sharded_state(self.model, self.optimizer)

    def load_sharded_state(self, state: Mapping[str, Any]) -> None:
        load_sharded_state(self.model, self.optimizer, state)
        forget_tags(self.model.parameters())  # written without a version bump

    def state_dict(self) -> dict[str, Any]:
        """The version only: the weights and AdamW state are `sharded_state`'s."""
        return {"version": self.counter.n}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.counter.n = int(state["version"])


def build_critic(config: StepConfig, trainer: FsdpTrainer) -> FsdpCritic:
    """The critic as the torch backend builds it, from the policy as it is now (its full
    weights gathered: a collective over the trainer's mesh), assembled on the host so that
    the device holds one full copy at a time, then sharded over the trainer's mesh."""
    policy = build_model(config.model, seed=0)  # its random weights are all replaced
    mine = dict(policy.named_parameters())
    with torch.no_grad():
        for name, value in trainer.full_parameters():
            mine[name].copy_(value)
    model = build_critic_model(policy, config.model, config.seed)
    del policy
    model = model.to(trainer.dist.device)
    if model.device.type == "cuda":  # as model_for does for the policy
        compile_vision_blocks(model)
    return FsdpCritic(model, config.model, config.algo, trainer.mesh, trainer.fsdp, config.device)


__all__ = ["FsdpCritic", "build_critic"]
