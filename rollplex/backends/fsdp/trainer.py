"""The FSDP2 trainer role: the torch trainer's forwards, loss and AdamW on sharded DTensors.

Everything numerical is `TorchTrainer`'s; this class runs each forward inside `ShardedRoot`,
rescales each rank's loss so FSDP's gradient average is the global batch's (per micro-batch
too; each micro-batch reduce-scatters, keeping gradients sharded as planned), and gathers
full parameters where a whole model is needed.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    set_model_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh

from rollplex.backends.base import LiveWeights
from rollplex.backends.fsdp.global_batch import global_loss
from rollplex.backends.fsdp.shard import (
    full,
    load_sharded_state,
    local,
    root_kept_through_backward,
    shard_model,
    sharded_state,
)
from rollplex.backends.torch.handles import GradsHandle, WeightsHandle
from rollplex.backends.torch.model import load_model, save_model
from rollplex.backends.torch.roles import weights_params
from rollplex.backends.torch.rows import merge_chunks
from rollplex.backends.torch.trainer import TorchTrainer
from rollplex.backends.torch.values import Loss
from rollplex.engine.prefix import Model
from rollplex.specs import AlgoSpec, ModelSpec
from rollplex.specs.fsdp import FsdpSpec
from rollplex.specs.roles import FSDP_TRAINER, RoleCapabilities

log = logging.getLogger(__name__)
FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)
# aggregated by loss_agg_mode (global_batch.py)
AGGREGATED = frozenset({"loss", "pg_loss", "kl", "loss_kl", "entropy"})


class ShardedWeightsHandle(WeightsHandle):
    """A weights value whose parameters are DTensors: the runtime's accounting counts this
    rank's shards, which is what the rank really holds."""

    def tensors(self) -> Iterator[torch.Tensor]:
        return (local(p) for p in self.params)


class FsdpTrainer(TorchTrainer):
    capabilities: ClassVar[RoleCapabilities] = FSDP_TRAINER  # float32 shards: float32 grads

    def __init__(
        self,
        model: Model,
        spec: ModelSpec,
        algo: AlgoSpec,
        mesh: DeviceMesh,
        fsdp: FsdpSpec,
        device: str = "cpu",
        version: int = 0,
    ) -> None:
        self.mesh, self.fsdp = mesh, fsdp
        self.dist: Any = None  # the rank's DistInfo (build.py sets it)
        self.world = mesh.size()
        self.compute_dtype = fsdp.compute_dtype(device)
        # Shard before the optimizer exists: AdamW's state is then sharded as well.
        dims = None
        if fsdp.rollout_sync == "share":  # the shared rollout's row-parallel shards
            from rollplex.weights.torch_rollout import shard_dims

            dims = shard_dims(spec, self.world, fsdp.rollout_tp)
        self.root = shard_model(
            model, mesh, self.compute_dtype, fsdp.reduce_dtype, fsdp.reshard_after_forward, dims
        )
        super().__init__(model, spec, algo, version)

    # -- forwards run inside the sharded root ---------------------------------------------
    def vision_encode(self, pixels, advantages=None):
        _every_row_trains(advantages)
        return self.root(super().vision_encode, pixels)

    def scorer(self) -> RootedScorer:
        """The torch trainer's no-grad scorer, each forward inside the sharded root."""
        return RootedScorer(super().scorer(), self)

    def ride_rows(self, features, text) -> None:
        """No rows ride (capabilities.FSDP_ROLLOUTS): FSDP2 gathers a layer's shards in its
        own forward, which a ride's direct submodule calls would skip."""
        return None

    def logprob_prefix(self, features, text, head: bool = True, advantages=None):
        _every_row_trains(advantages)
        return self.root(super().logprob_prefix, features, text, head)

    def logprob_response(self, prefix, responses, group_size: int, advantages=None):
        _every_row_trains(advantages)
        return self.root(super().logprob_response, prefix, responses, group_size)

    def logprob(self, features, text, responses, advantages=None):
        _every_row_trains(advantages)
        return self.root(super().logprob, features, text, responses)

    def backward(self, loss: Loss) -> GradsHandle:
        with root_kept_through_backward(self.root):  # (shard.py says why)
            return super().backward(loss)

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head on merged row chunks (chunked prefix ops)."""
        return self.root(self.model.lm_head, hidden)

    def merge_rows(self, parts: list[dict[str, Any]]) -> dict[str, Any]:
        return merge_chunks(parts, self.head)

    # -- the loss over the global batch ---------------------------------------------------
    def batch_loss(self, loss: Loss, mask: torch.Tensor) -> Loss:
        return global_loss(loss, mask, self.algo.loss_agg_mode, self.mesh, AGGREGATED)

    # -- weights --------------------------------------------------------------------------
    def handle(self) -> WeightsHandle:
        return ShardedWeightsHandle(
            "policy",
            self.model,
            weights_params(self.model, self.spec),
            self.counter.n,
            self.counter,
        )

    def live_weights(self) -> LiveWeights:
        return LiveWeights(self.handle(), "policy", self.counter.n)

    def full_parameters(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, full tensor) of every parameter, gathered (a collective per tensor)."""
        for name, p in self.model.named_parameters():
            yield name, full(p.detach())

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The whole model's state dict on CPU, gathered on every rank of the mesh (torch's
        cpu_offload keeps it on global rank 0 only: a training pool without rank 0 gathers
        on device and copies)."""
        if dist.get_rank() == dist.get_rank(self.mesh.get_group()):
            return get_model_state_dict(self.model, options=FULL)
        sd = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True))
        return {k: v.cpu() for k, v in sd.items()}

    # -- checkpoint state (DCP: sharded, resharded on load) ---------------------------------
    def sharded_state(self) -> dict[str, Any]:
        """Model and optimizer state as DTensors, for torch.distributed.checkpoint."""
        return sharded_state(self.model, self.optimizer)

    def load_sharded_state(self, state: Mapping[str, Any]) -> None:
        load_sharded_state(self.model, self.optimizer, state)

    def state_dict(self) -> dict[str, Any]:
        return {"version": self.counter.n}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.counter.n = int(state["version"])

    def save_weights(self, folder: Path) -> None:
        """A Hub-format folder: every rank gathers (collective), the mesh's rank 0 writes."""
        sd = self.full_state_dict()
        if dist.get_rank(self.mesh.get_group()) == 0:
            copy = _unsharded_copy(self.spec, sd)
            # transformers writes only on global rank 0 once a process group exists; this
            # copy is a plain model and this rank writes it (a training pool without rank 0)
            copy.should_save_on_this_rank = lambda is_main_process: is_main_process
            save_model(copy, self.spec, folder)

    def load_weights(self, folder: Path) -> None:
        """Every rank reads the folder and keeps its own shards."""
        sd = load_model(folder, spec=self.spec).state_dict()
        set_model_state_dict(self.model, sd, options=StateDictOptions(full_state_dict=True))


class RootedScorer:
    """A scorer (the trainer's, or the critic's no-grad values and training) whose forwards
    run inside its owner's sharded root, where FSDP2 gathers the root's shards; `owner` is
    the FsdpTrainer or FsdpCritic (its `root` and `head`)."""

    def __init__(self, inner: Any, owner: Any) -> None:
        self.inner, self.owner = inner, owner

    @property
    def model(self) -> Any:
        return self.inner.model

    def merge_rows(self, parts: list[dict[str, Any]]) -> dict[str, Any]:
        return merge_chunks(parts, self.owner.head)

    def vision_encode(self, pixels, advantages=None):
        _every_row_trains(advantages)
        return self.owner.root(self.inner.vision_encode, pixels)

    def logprob_prefix(self, features, text, head: bool = True, advantages=None):
        _every_row_trains(advantages)
        return self.owner.root(self.inner.logprob_prefix, features, text, head)

    def logprob_response(self, prefix, responses, group_size: int, advantages=None):
        _every_row_trains(advantages)
        return self.owner.root(self.inner.logprob_response, prefix, responses, group_size)

    def logprob(self, features, text, responses, advantages=None):
        _every_row_trains(advantages)
        return self.owner.root(self.inner.logprob, features, text, responses)


def _every_row_trains(advantages: Any) -> None:
    """Ranks skipping different rows would run different numbers of forwards, and FSDP2's
    per-layer gathers would wait on each other: under FSDP every row trains (the gradient is
    the same; only the work is not saved). The run log says so once."""
    if advantages is not None:
        _note_every_row_trains()


@functools.cache
def _note_every_row_trains() -> None:
    log.info(
        "algo.skip_zero_advantage: every row trains under FSDP (each rank's forwards must "
        "match the others' for FSDP2's per-layer gathers)"
    )


def _unsharded_copy(spec: ModelSpec, sd: Mapping[str, torch.Tensor]) -> Model:
    from rollplex.backends.torch.model import build_model

    model = build_model(spec, seed=0)  # its random weights are all replaced just below
    model.load_state_dict(sd, strict=True)
    return model
