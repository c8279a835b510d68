"""FsdpBackend: the torch backend's ops with an FSDP2 trainer, data-parallel over ranks.

One process per rank (torchrun); every rank runs the same plan on its slice of the step:
- **data**: rank r of N takes the contiguous prompt rows [r*B/N, (r+1)*B/N) of the step's
  collated batch (same padding as the whole batch); B must divide by N;
- **rollout**: a full, unsharded model per rank in the compute dtype. `weight_sync`
  gathers every parameter from the shards (`full_tensor`) and copies it in: the
  gather-and-copy sync. Decode draws each sample's tokens from its own generator, seeded
  by (seed, step, global sample index), so a sample's tokens are the same whichever rank
  (and however many ranks) decodes it;
- **reference**: replicated — a full frozen copy of the initial policy on every rank (it
  never changes, so it is built once from the seed, no collective);
- **trainer**: `FsdpTrainer` (sharded, AdamW on DTensors, loss over the global batch).
Step metrics are averaged over the ranks, so rank 0 logs the whole step's numbers.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar

import torch
from torch.distributed.device_mesh import init_device_mesh

from rollplex.backends.base import (
    BackendError,
    CheckpointWeights,
    LiveWeights,
    Sampling,
    WeightsSource,
    version_name,
)
from rollplex.backends.fsdp.shard import DTYPES, local
from rollplex.backends.fsdp.trainer import FsdpTrainer, ShardedWeightsHandle
from rollplex.backends.torch.backend import TorchBackend, TorchConfig
from rollplex.backends.torch.model import model_for
from rollplex.backends.torch.roles import TorchReference, TorchRollout
from rollplex.backends.torch.values import VersionCounter
from rollplex.data.prompts import PromptBatch
from rollplex.graph.ir import Graph, Op
from rollplex.runtime.distributed import all_reduce_mean, init_distributed
from rollplex.specs.fsdp import FsdpSpec


@dataclass(slots=True, frozen=True)
class FsdpConfig(TorchConfig):
    fsdp: FsdpSpec = field(default_factory=FsdpSpec)


def sample_seed(seed: int, step: int, row: int) -> int:
    """The decode generator's seed for global sample `row` of RL step `step`."""
    digest = hashlib.sha256(f"rollplex-decode:{seed}:{step}:{row}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


class GatheredRollout(TorchRollout):
    """Rolls out with a full model of its own. Live weights are gathered from the shards
    and copied in ('gather'), or, on one float32 rank, its parameters are pointed at the
    trainer's shard storage, which then is the whole parameter ('alias': no copy)."""

    def __init__(self, spec, device, model, trainer: FsdpTrainer, sync: str = "gather") -> None:
        super().__init__(spec, device)
        self.model, self.trainer, self.sync = model, trainer, sync
        if sync == "alias" and (trainer.world != 1 or trainer.compute_dtype != "float32"):
            raise BackendError(
                f"train.fsdp.rollout_sync=alias needs 1 rank computing in float32 (here "
                f"{trainer.world} ranks, {trainer.compute_dtype}): only there is a shard the "
                "whole parameter; use rollout_sync=gather"
            )

    def load_weights(self, source: WeightsSource) -> str:
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


def _rows_of(inputs: Any, lo: int, hi: int) -> Any:
    """Prompt rows [lo, hi) of a step's inputs (the batch, and its answers or samples)."""
    cut = {}
    for f in fields(inputs):
        v = getattr(inputs, f.name)
        cut[f.name] = v.select(lo, hi) if isinstance(v, PromptBatch) else v[lo:hi]
    return replace(inputs, **cut)


class FsdpBackend(TorchBackend):
    name: ClassVar[str] = "fsdp"

    def __init__(self, config: TorchConfig) -> None:
        if not isinstance(config, FsdpConfig):
            config = FsdpConfig(**{f: getattr(config, f) for f in TorchConfig.__slots__})
        if config.algo.name == "ppo":
            raise BackendError("the fsdp backend trains the policy only: algo=ppo needs a critic")
        self.config = config
        self.dist = init_distributed(config.device)
        self.device = self.dist.device
        self.rank, self.world = self.dist.rank, self.dist.world
        self.mesh = init_device_mesh(self.device.type, (self.world,))
        spec, seed = config.model, config.seed
        # float32 masters (the folder's weights when model.path is set, else from the seed)
        policy = model_for(spec, seed, self.device, torch.float32)
        self.trainer = FsdpTrainer(policy, spec, config.algo, self.mesh, config.fsdp, config.device)
        dtype = DTYPES[self.trainer.compute_dtype]
        ref = model_for(spec, seed, self.device, dtype).requires_grad_(False)
        self.reference = TorchReference(ref, config.algo.temperature)
        rollout_model = model_for(spec, seed, self.device, dtype)
        self.rollout = GatheredRollout(
            spec,
            self.device,
            rollout_model.requires_grad_(False),
            self.trainer,
            config.fsdp.rollout_sync,
        )
        self.rollout.load_weights(self.trainer.live_weights())
        self._frozen = VersionCounter(0)
        st, algo = spec.special_tokens, config.algo
        self.sampling = Sampling(
            config.max_new_tokens, algo.temperature, algo.top_p, st.eos_token_id, st.pad_token_id
        )
        self._externals: dict[str, str] = {}
        self._generator = None
        self._metrics: dict[str, torch.Tensor] = {}
        self.critic = None
        self._critic_ops = frozenset()
        self._group_size = 1

    def bind(self, graph: Graph) -> None:
        super().bind(graph)
        if self.critic is not None:
            raise BackendError("the fsdp backend trains the policy only; this graph has a critic")
        sizes = {op.attrs["group_size"] for op in graph if op.kind == "decode"}
        self._group_size = max(sizes, default=1)

    def rows(self, batch_size: int) -> tuple[int, int]:
        """This rank's prompt rows [lo, hi) of a step of `batch_size` prompts."""
        if batch_size % self.world:
            raise ValueError(
                f"workload.prompts_per_step={batch_size} does not divide over {self.world} "
                "ranks: every rank takes an equal, contiguous slice of the step's prompts"
            )
        n = batch_size // self.world
        return self.rank * n, (self.rank + 1) * n

    def begin_step(self, step: int, inputs: Any) -> dict[str, Any]:
        lo, hi = self.rows(inputs.batch.size)
        out = super().begin_step(step, _rows_of(inputs, lo, hi))
        g = self._group_size
        self._generator = [
            torch.Generator(self.device).manual_seed(sample_seed(self.config.seed, step, row))
            for row in range(lo * g, hi * g)
        ]
        return out

    def end_step(self) -> dict[str, float]:
        return all_reduce_mean(super().end_step())

    def _head(self, op: Op):
        role = self._role(op)
        return role.head if role is self.trainer else super()._head(op)

    def _weight_sync(self, op: Op, x: dict[str, Any]) -> dict[str, Any]:
        mode = op.attrs.get("mode", "alias")
        if mode not in ("alias", "copy", "gather"):
            raise BackendError(
                f"'{op.name}' weight_sync mode {mode!r} is not one the fsdp "
                "backend runs (it gathers and copies)"
            )
        self.rollout.load_weights(self.trainer.live_weights())
        return {"weights": x["weights"]}

    def move(self, value: Any, to_host: bool) -> Any:
        """Activations and prompts move as on the torch backend. The trainer's shards,
        AdamW state and gradients are DTensors: on CPU host and device are one memory, so
        they stay; on GPU their offload is not applied yet and is refused by name."""
        t = self.trainer
        sharded = (
            isinstance(value, ShardedWeightsHandle)
            or getattr(value, "optimizer", None) is t.optimizer
            or getattr(value, "params", None) is t.params
        )
        if not sharded:
            return super().move(value, to_host)
        if self.device.type == "cpu":
            return value
        raise BackendError(
            f"the plan offloads the FSDP2 trainer's {type(value).__name__}: moving sharded "
            "state between host and device is not implemented for backend fsdp yet"
        )
