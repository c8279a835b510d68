"""The fsdp roles of one pool of a disaggregated plan (planner/pools.py), one rank each.

Training pool: the FSDP2 trainer over the training ranks' own group and a frozen reference
per rank. Rollout pool: a full rollout model per rank (TP 1), its trained parameters filled
by the plan's weights transfer. Step metrics are averaged per pool; transfer bytes summed,
seconds the slowest.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from rollplex.backends.base import BackendError, CheckpointWeights, version_name
from rollplex.backends.distributed import DistInfo, init_distributed
from rollplex.backends.fsdp.build import FsdpHooks, FsdpValues, build_reference
from rollplex.backends.fsdp.shard import DTYPES, expected_chunk, local
from rollplex.backends.fsdp.trainer import FsdpTrainer
from rollplex.backends.step import Roles
from rollplex.backends.torch.backend import TorchExternals
from rollplex.backends.torch.handles import VersionCounter, WeightsHandle
from rollplex.backends.torch.model import model_for
from rollplex.backends.torch.roles import TorchRollout, vision_params, weights_params
from rollplex.backends.torch.rows import TorchValues, text_only
from rollplex.backends.torch.values import Pixels
from rollplex.graph.ir import Graph, ValueKind, version_model
from rollplex.planner.pools import Pools
from rollplex.specs.backend import BackendSpec

if TYPE_CHECKING:
    from rollplex.backends.step import StepConfig

log = logging.getLogger(__name__)
TRANSFER_PREFIX = "transfer/"


class PoolHooks(FsdpHooks):
    """Rows of this pool member; metrics gathered over every rank of every pool."""

    def metrics(self, values: dict[str, float]) -> dict[str, float]:
        if not dist.is_initialized() or dist.get_world_size() == 1:
            return dict(values)
        every: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(every, dict(values))
        out: dict[str, float] = {}
        for key in sorted({k for d in every for k in d}):
            xs = [d[key] for d in every if key in d]
            if key.startswith(TRANSFER_PREFIX):
                out[key] = max(xs) if key.endswith("_s") else sum(xs)
            else:
                out[key] = sum(xs) / len(xs)
        return out


class PoolRollout(TorchRollout):
    """A full model of its own, loaded by the weights transfer (`params`, `received`)."""

    def __init__(self, spec, device: torch.device, model, model_name: str = "policy") -> None:
        super().__init__(spec, device)
        self.model = model.requires_grad_(False)
        self.model_name = model_name
        self.counter = VersionCounter(-1)

    def params(self) -> list[torch.Tensor]:
        """The trained parameters the transfer fills, in the trainer's order."""
        return [p.data for p in weights_params(self.model, self.spec)]

    def received(self, version: int) -> WeightsHandle:
        self.counter.n = version
        self._version = version_name(self.model_name, version)
        return WeightsHandle(
            self.model_name, self.model, weights_params(self.model, self.spec), version,
            self.counter,
        )  # fmt: skip

    def load_weights(self, source) -> str:
        if isinstance(source, CheckpointWeights):
            return super().load_weights(source)
        raise BackendError(
            "a rollout pool's weights arrive by the plan's weights transfer, not from a "
            "trainer in this process"
        )


class RolloutExternals(TorchExternals):
    """The rollout pool's externals: prompts and the frozen vision tower (its own model's);
    the trained weights come from the transfer, the rest belong to the training pool."""

    def __init__(self, rollout: PoolRollout) -> None:
        super().__init__(None, None)  # type: ignore[arg-type]
        self.rollout = rollout

    def bind(self, graph: Graph) -> dict[str, str]:
        out = {}
        for v in graph.values.values():
            if not v.external or v.kind is ValueKind.OPTIMIZER_STATE:
                continue
            if v.kind is ValueKind.WEIGHTS:
                if version_model(v.version) == "vision":
                    out[v.name] = "vision"
                continue
            ports = {p for op in graph.consumers(v.name) for p, x in op.inputs.items()
                     if x == v.name}  # fmt: skip
            what = next((p for p in ("pixels", "text", "answers") if p in ports), None)
            if what is not None:
                out[v.name] = what
        return out

    def supply(self, names: dict[str, str], inputs: Any, dispatch: Any) -> dict[str, Any]:
        batch, wanted = inputs.batch, set(names.values())
        model = self.rollout.model
        source = {
            "pixels": Pixels.of(batch) if "pixels" in wanted else None,
            "text": text_only(batch),
            "answers": inputs.samples if dispatch.config.scorer else inputs.answers,
            "vision": WeightsHandle("vision", model, vision_params(model), 0, self._frozen),
        }
        return {name: source[what] for name, what in names.items()}


class PoolDispatch(Protocol):
    """What PoolSide reads of the dispatch over this rank's roles (runtime/dispatch.py)."""

    device: torch.device
    trainer: Any  # FsdpTrainer on a training rank
    rollout: Any  # PoolRollout on a rollout rank
    metrics: dict[str, torch.Tensor]  # the step's, replaced at each step's start


class PoolSide:
    """What the transfers read from and write into this rank's roles."""

    def __init__(self, dispatch: PoolDispatch, hooks: PoolHooks, wire: torch.dtype) -> None:
        self.d, self.hooks, self.wire = dispatch, hooks, wire

    @property
    def device(self) -> torch.device:
        return self.d.device

    def weight_shards(self) -> tuple[list[torch.Tensor], int]:
        """Training rank: its shard of every trained parameter in the rollout's dtype."""
        t = self.d.trainer
        j, n = t.mesh.get_local_rank(), t.world
        shards = []
        for p in t.handle().params:
            mine = local(p.detach())
            if mine.shape != expected_chunk(p.shape, j, n):  # what the receiver assembles
                raise BackendError(
                    f"training shard {tuple(mine.shape)} of a {tuple(p.shape)} parameter is "
                    f"not torch.chunk's dim-0 chunk {j} of {n}: the weights transfer cannot "
                    "assemble it (a Shard(d>0) placement?)"
                )
            shards.append(mine.to(self.wire).contiguous())
        return shards, t.counter.n

    def weight_params(self) -> list[torch.Tensor]:
        return self.d.rollout.params()

    def weights_received(self, version: int) -> WeightsHandle:
        return self.d.rollout.received(version)

    def local_prompts(self) -> int:
        lo, hi = self.hooks._rows
        return hi - lo

    def record(self, metrics: dict[str, float]) -> None:
        for k, v in metrics.items():
            self.d.metrics[k] = torch.tensor(float(v), dtype=torch.float64)


@dataclass(slots=True, frozen=True)
class PoolRoles:
    """This rank's roles of one pool, and what the dispatch over them needs besides
    (runtime/compose.py `build_pool_backend` puts them together)."""

    config: StepConfig  # on this rank's device
    roles: Roles
    hooks: PoolHooks
    wire: torch.dtype  # the weights transfer's dtype: the rollout's
    dist: DistInfo


def build_pool_roles(config: StepConfig, spec: BackendSpec, pools: Pools) -> PoolRoles:
    """This rank's roles of its pool. Every rank creates every pool's process group (torch
    requires it of all ranks)."""
    fsdp = spec.fsdp
    info = init_distributed(config.device)
    train_ranks = list(pools.pool_ranks("train"))
    train_group = dist.new_group(train_ranks)
    config = replace(config, device=str(info.device))
    dtype = DTYPES[fsdp.compute_dtype(config.device)]
    hooks = PoolHooks(config.seed, pools.index_in_pool(), len(pools.ranks))
    if pools.name == "train":
        mesh = DeviceMesh.from_group(train_group, info.device.type)
        policy = model_for(config.model, config.seed, info.device, torch.float32)
        trainer = FsdpTrainer(policy, config.model, config.algo, mesh, fsdp, config.device)
        trainer.dist = _pool_info(info, pools)
        reference = build_reference(config, trainer) if config.algo.use_reference else None
        roles = Roles(None, reference, trainer, FsdpValues(trainer),  # type: ignore[arg-type]
                      TorchExternals(trainer, reference), None, hooks)  # fmt: skip
    else:
        model = model_for(config.model, config.seed, info.device, dtype)
        rollout = PoolRollout(config.model, info.device, model)
        roles = Roles(rollout, None, None, TorchValues(),  # type: ignore[arg-type]
                      RolloutExternals(rollout), None, hooks)  # fmt: skip
    log.info("rank %d: built the '%s' pool's roles on %s", info.rank, pools.name, info.device)
    return PoolRoles(config, roles, hooks, dtype, info)


def _pool_info(info: DistInfo, pools: Pools) -> DistInfo:
    """The trainer's view: its rank and world within the training pool (checkpoints)."""
    return replace(info, rank=pools.index_in_pool(), world=len(pools.ranks))


__all__ = [
    "PoolDispatch",
    "PoolHooks",
    "PoolRoles",
    "PoolRollout",
    "PoolSide",
    "RolloutExternals",
    "build_pool_roles",
]
