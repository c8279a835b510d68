"""The `fsdp` trainer entry: an FSDP2 trainer, data-parallel over ranks, and the torch roles and
step hooks that go with it (one process per rank, each on its slice of the step's prompts).

Rollout: a full model per rank (`rollout_sync=gather`) or TP over the trainer's shards
(`share`, share.py), each sample drawing from its own (seed, step, sample) generator;
reference: a frozen full copy per rank; trainer: `FsdpTrainer`; PPO's critic: critic.py.
Pools: pools.py.
"""

from __future__ import annotations

import hashlib
from dataclasses import fields, is_dataclass, replace
from typing import TYPE_CHECKING, Any

import torch
from torch.distributed.device_mesh import init_device_mesh

from rollplex.backends.base import BackendError, CheckpointWeights, LiveWeights, version_name
from rollplex.backends.distributed import all_reduce_mean, init_distributed
from rollplex.backends.fsdp.critic import FsdpCritic, build_critic
from rollplex.backends.fsdp.shard import DTYPES, local
from rollplex.backends.fsdp.share import SharedRollout
from rollplex.backends.fsdp.trainer import FsdpTrainer, ShardedWeightsHandle
from rollplex.backends.hooks import StepHooks
from rollplex.backends.step import RoleRuntime
from rollplex.backends.torch.model import model_for
from rollplex.backends.torch.roles import TorchReference, TorchRollout
from rollplex.backends.torch.rows import TorchValues
from rollplex.data.prompts import PromptBatch
from rollplex.graph.ir import Graph
from rollplex.specs.backend import BackendSpec

if TYPE_CHECKING:
    from rollplex.backends.step import StepConfig


def sample_seed(seed: int, step: int, row: int) -> int:
    """The decode generator's seed for global sample `row` of RL step `step`."""
    digest = hashlib.sha256(f"rollplex-decode:{seed}:{step}:{row}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


# -- roles --------------------------------------------------------------------------------
def build_trainer(config: StepConfig, spec: BackendSpec | None = None, **_: Any) -> FsdpTrainer:
    """Joins torchrun's process group (or a private one-rank gloo group) and shards the
    float32 masters (the folder's weights when model.path is set, else from the seed). PPO's
    critic is sharded over the same mesh when a graph first reads it (critic.py)."""
    fsdp = (spec or BackendSpec()).fsdp
    info = init_distributed(config.device)
    mesh = init_device_mesh(info.device.type, (info.world,))
    policy = model_for(config.model, config.seed, info.device, torch.float32)
    trainer = FsdpTrainer(policy, config.model, config.algo, mesh, fsdp, config.device)
    trainer.dist = info
    return trainer


def build_reference(config: StepConfig, trainer: FsdpTrainer) -> TorchReference:
    """A full frozen copy per rank in the compute dtype (the trainer's tower is sharded, so
    unlike the torch roles it is not shared)."""
    dtype = DTYPES[trainer.compute_dtype]
    ref = model_for(config.model, config.seed, trainer.dist.device, dtype).requires_grad_(False)
    return TorchReference(ref, config.algo.temperature)


def build_rollout(
    config: StepConfig, trainer: FsdpTrainer, spec: BackendSpec | None = None, **_: Any
) -> GatheredRollout | SharedRollout:
    fsdp = (spec or BackendSpec()).fsdp
    sync = fsdp.rollout_sync
    dtype = DTYPES[trainer.compute_dtype]
    model = model_for(config.model, config.seed, trainer.dist.device, dtype)
    if sync == "share":  # its tensors become views of the shards, or rebuilt slots
        rollout = SharedRollout(config.model, trainer.dist.device, model, trainer, fsdp.rollout_tp)
        rollout.load_weights(trainer.live_weights())
        return rollout
    rollout = GatheredRollout(
        config.model, trainer.dist.device, model.requires_grad_(False), trainer, sync
    )
    rollout.engine = (spec or BackendSpec()).torch_engine  # its decode engine's knobs
    rollout.load_weights(trainer.live_weights())
    return rollout


def runtime(config: StepConfig, trainer: FsdpTrainer) -> RoleRuntime:
    """The dispatch's step config on this rank's device, with the rank's hooks and values,
    and PPO's critic, sharded, built when a graph first reads it."""
    info = trainer.dist
    config = replace(config, device=str(info.device))
    values = FsdpValues(trainer)

    def critic() -> FsdpCritic:
        built = build_critic(config, trainer)
        values.owners.append(built)  # its shards and AdamW state are sharded values too
        return built

    hooks = FsdpHooks(config.seed, info.rank, info.world)
    return RoleRuntime(config, values, hooks, critic)


class GatheredRollout(TorchRollout):
    """Rolls out with a full model of its own. Live weights are gathered from the shards
    and copied in ('gather'), or, on one float32 rank, its parameters are pointed at the
    trainer's shard storage, which then is the whole parameter ('alias': no copy)."""

    def __init__(self, spec, device, model, trainer: FsdpTrainer, sync: str = "gather") -> None:
        super().__init__(spec, device)
        self.model, self.trainer, self.sync = model, trainer, sync
        if sync == "alias" and (trainer.world != 1 or trainer.compute_dtype != "float32"):
            raise BackendError(
                f"backend.fsdp.rollout_sync=alias needs 1 rank computing in float32 (here "
                f"{trainer.world} ranks, {trainer.compute_dtype}): only there is a shard the "
                "whole parameter; use rollout_sync=gather"
            )

    def load_weights(self, source) -> str:
        if isinstance(source, CheckpointWeights):
            return super().load_weights(source)
        if not isinstance(source, LiveWeights):
            raise BackendError(f"unknown weights source {source!r}")
        mine = dict(self.model.named_parameters())
        with torch.no_grad():
            if self.sync == "alias":
                for name, p in self.trainer.model.named_parameters():
                    mine[name].data = local(p.detach())
            else:
                for name, value in self.trainer.full_parameters():
                    mine[name].copy_(value)
        self._version = version_name(source.model, source.version)
        return self._version


# -- the dispatch's hooks and values ------------------------------------------------------
class FsdpHooks(StepHooks):
    """Rank `rank` of `world`: its slice of the prompts, one generator per sample, metrics
    averaged over the ranks."""

    def __init__(self, seed: int, rank: int, world: int) -> None:
        self.seed, self.rank, self.world = seed, rank, world
        self.group_size = 1
        self._rows = (0, 0)

    def bind(self, graph: Graph) -> None:
        sizes = {op.attrs["group_size"] for op in graph if op.kind == "decode"}
        self.group_size = max(sizes, default=1)

    def rows(self, batch_size: int) -> tuple[int, int]:
        """This rank's prompt rows [lo, hi) of a step of `batch_size` prompts."""
        if batch_size % self.world:
            raise ValueError(
                f"workload.prompts_per_step={batch_size} does not divide over {self.world} "
                "ranks: every rank takes an equal, contiguous slice of the step's prompts"
            )
        n = batch_size // self.world
        return self.rank * n, (self.rank + 1) * n

    def inputs(self, step: int, inputs: Any) -> Any:
        self._rows = lo, hi = self.rows(inputs.batch.size)
        return _rows_of(inputs, lo, hi)

    def generator(self, step: int, seed: int, device: torch.device) -> Any:
        lo, hi = self._rows
        g = self.group_size
        return [
            torch.Generator(device).manual_seed(sample_seed(seed, step, row))
            for row in range(lo * g, hi * g)
        ]

    def metrics(self, values: dict[str, float]) -> dict[str, float]:
        return all_reduce_mean(values)


def _rows_of(inputs: Any, lo: int, hi: int) -> Any:
    """Prompt rows [lo, hi) of a step's inputs (the batch, its answers or samples, and the
    raw media an engine would read)."""
    return replace(
        inputs,
        **{f.name: _cut(getattr(inputs, f.name), lo, hi) for f in fields(inputs)},
    )


def _cut(v: Any, lo: int, hi: int) -> Any:
    if v is None:
        return None
    if isinstance(v, PromptBatch):
        return v.select(lo, hi)
    if is_dataclass(v):  # per-prompt tuples (data.prompt_media.Media)
        per_row = {f.name: getattr(v, f.name) for f in fields(v)}
        return replace(
            v, **{k: x[lo:hi] for k, x in per_row.items() if isinstance(x, tuple | list)}
        )
    return v[lo:hi]


class FsdpValues(TorchValues):
    """Activations and prompts move as torch values. The trainer's (and the critic's)
    shards, AdamW state and gradients are DTensors: on CPU host and device are one memory,
    so they stay; on GPU their offload is not implemented and is refused by name."""

    def __init__(self, trainer: FsdpTrainer) -> None:
        self.trainer = trainer
        self.owners: list[Any] = [trainer]  # what holds sharded state: the critic joins

    def move(self, value: Any, device: Any, share: float = 1.0) -> Any:
        sharded = isinstance(value, ShardedWeightsHandle) or any(
            getattr(value, "optimizer", None) is o.optimizer
            or getattr(value, "params", None) is o.params
            for o in self.owners
        )
        if not sharded:
            return super().move(value, device, share)
        if self.trainer.dist.device.type == "cpu":
            return value
        raise BackendError(
            f"the plan offloads the FSDP2 trainer's {type(value).__name__}: moving sharded "
            "state between host and device is not implemented for backend.trainer=fsdp yet"
        )


__all__ = [
    "FsdpHooks",
    "FsdpTrainer",
    "FsdpValues",
    "GatheredRollout",
    "SharedRollout",
    "build_reference",
    "build_rollout",
    "build_trainer",
    "runtime",
    "sample_seed",
]
