"""`backend.fsdp.rollout_sync=share`: a torch rollout, TP t_r over the trainer's ranks, that
reads the trainer's own shards where the layout algebra says they are the rollout's tensor.

Identical/view tensors are `as_strided` over the trainer's compute-dtype shard (or one bf16
copy of it, recast at each weight_sync); the rest lives in one rebuild buffer refilled by
`Exchange`. `SharedRollout.stats` measures what `torch_rollout_bytes` predicts.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)

from rollplex.backends.base import BackendError, CheckpointWeights, LiveWeights, version_name
from rollplex.backends.fsdp.exchange import Exchange
from rollplex.backends.fsdp.lockstep import (
    GroupDecodeSession,
    MemberDecode,
    gather_generators,
    gather_rows,
    member_rows,
)
from rollplex.backends.fsdp.shard import DTYPES, local
from rollplex.backends.torch.roles import TorchRollout
from rollplex.engine.prefix import expand_prefix, prefix_forward
from rollplex.specs import ModelSpec
from rollplex.specs.roles import RoleCapabilities
from rollplex.weights import LayoutError, WeightSharing
from rollplex.weights.torch_rollout import aliased, rollout_sharing

log = logging.getLogger(__name__)
EMBED = "model.language_model.embed_tokens.weight"
# TP rows are a union over the group: no other role can read its prefix state, and no
# other phase's rows can ride on its decode.
SHARED_ROLLOUT = RoleCapabilities(
    segmented_decode=True,
    in_place_weight_load=True,
    scaled_logprobs=True,
    weights_layout="torch_tp",
)
TP_PLAN = {
    "embed_tokens": RowwiseParallel(input_layouts=Replicate()),
    "layers.*.self_attn.q_proj": ColwiseParallel(),
    "layers.*.self_attn.k_proj": ColwiseParallel(),
    "layers.*.self_attn.v_proj": ColwiseParallel(),
    "layers.*.self_attn.o_proj": RowwiseParallel(),
    "layers.*.mlp.gate_proj": ColwiseParallel(),
    "layers.*.mlp.up_proj": ColwiseParallel(),
    "layers.*.mlp.down_proj": RowwiseParallel(),
}


def rollout_slice(
    full: Mapping[str, torch.Tensor], sharing: WeightSharing, tensor: str, gpu: int
) -> torch.Tensor:
    """What rollout tensor `tensor` must hold on `gpu`: the full parameters cut to the
    algebra's rollout layout, flat (a check for tests and benchmarks)."""
    parts = []
    for b in sharing.rollout_shard(tensor, gpu):
        p = sharing.params[b.param]
        parts.append(full[b.param].reshape(p.rows, p.cols)[b.r0 : b.r1, b.c0 : b.c1].flatten())
    return torch.cat(parts)


class SharedRollout(TorchRollout):
    capabilities: ClassVar[RoleCapabilities] = SHARED_ROLLOUT

    def __init__(self, spec: ModelSpec, device: torch.device, model: nn.Module, trainer, tp: int):
        super().__init__(spec, device)
        self.trainer, self.tp = trainer, tp
        self.rank, world = trainer.dist.rank, trainer.world
        self.dtype = DTYPES[trainer.compute_dtype]
        self.sharing = rollout_sharing(spec, world, tp, trainer.compute_dtype)
        self.group = None
        if tp > 1:
            mesh = init_device_mesh(device.type, (tp, world // tp), mesh_dim_names=("tp", "rep"))
            self.tp_mesh, self.group = mesh["tp"], mesh["tp"].get_group()
            parallelize_module(model.model.language_model, self.tp_mesh, TP_PLAN)
            head = ColwiseParallel(output_layouts=Replicate())
            parallelize_module(model.lm_head, self.tp_mesh, head)
        self.model = model.requires_grad_(False)
        self._cast = self.dtype != torch.float32
        self._shards = self._masters()  # with a cast, _bind allocates the bf16 copies
        self._aliased: dict[str, bool] = {}
        self._bind()
        self.exchange = Exchange(self.sharing, self.rank, self._rebuilt_on, in_place=self._cast)
        self.sync_seconds: list[float] = []
        self.cast_seconds: list[float] = []
        st, mib = self.stats(), 1 << 20
        log.info(
            "rollout_sync=share, rollout TP %d on rank %d: %.1f MiB read from training "
            "storage, %.1f MiB rebuilt (%.1f MiB received per sync), %.1f MiB own bf16 "
            "shard copy; a full copy is %.1f MiB", tp, self.rank, st["shared_bytes"] / mib,
            st["rebuild_bytes"] / mib, st["received_bytes"] / mib,
            st["compute_copy_bytes"] / mib, st["full_copy_bytes"] / mib,
        )  # fmt: skip

    # -- storage ----------------------------------------------------------------------
    def _masters(self) -> dict[str, torch.Tensor]:
        return {n: local(p.detach()) for n, p in self.trainer.model.named_parameters()}

    def _rebuilt_on(self, tensor: str, gpu: int) -> bool:
        return not aliased(self.sharing, tensor, gpu)

    def _bind(self) -> None:
        """Point every rollout parameter at its storage: a view of a shard, or a slot of
        the rebuild buffer (allocated here)."""
        sharing, me = self.sharing, self.rank
        for name, shard in self._shards.items():
            want = sharing.train_shape(name, me)
            if tuple(want) != tuple(shard.shape) or not shard.is_contiguous():
                raise LayoutError(
                    f"{sharing.where(name)}: the trainer's shard on rank {me} is "
                    f"{tuple(shard.shape)} (contiguous={shard.is_contiguous()}), the algebra "
                    f"expects {want}: the trainer does not store it as the rollout layout needs"
                )
        rebuilt = [t for t in sharing.tensors if self._rebuilt_on(t, me)]
        sizes = [math.prod(sharing.share(t, me).shape) for t in rebuilt]
        self.buffer = torch.zeros(sum(sizes), dtype=self.dtype, device=self.device)
        self.slots, o = {}, 0
        for t, n in zip(rebuilt, sizes, strict=True):
            self.slots[t], o = self.buffer[o : o + n], o + n
        if self._cast:
            self._shards = self._compute_copies(rebuilt)
        for full_name, p in list(self.model.named_parameters(remove_duplicate=False)):
            tensor = full_name if full_name in sharing.tensors else EMBED  # tied lm_head
            self._set(full_name, p, self._storage(tensor, full_name, p))

    def _compute_copies(self, rebuilt: list[str]) -> dict[str, torch.Tensor]:
        """The bf16 copy of every shard: where the algebra places a shard inside a
        rebuilt tensor (PARTIAL), the copy *is* those bytes of the rebuild buffer (the
        cast fills them, nothing is sent); elsewhere a tensor of its own (which the
        identical rollout tensors view)."""
        item, out = self.sharing.itemsize, {}
        masters = self._masters()
        for t in rebuilt:
            for pl in self.sharing.share(t, self.rank).placements:
                n = pl.nbytes // item
                view = self.slots[t][pl.offset // item : pl.offset // item + n]
                out[pl.param] = view.view(masters[pl.param].shape)
        self.placed = sum(v.numel() for v in out.values()) * item
        for name, m in masters.items():
            if name not in out:
                out[name] = torch.empty_like(m, dtype=self.dtype)
        return out

    def _storage(self, tensor: str, name: str, p: torch.Tensor) -> torch.Tensor:
        sh = self.sharing.share(tensor, self.rank)
        shape = p.to_local().shape if isinstance(p, DTensor) else p.shape
        same_rank = len(shape) == len(sh.shape)
        if math.prod(sh.shape) != math.prod(shape) or (same_rank and shape != sh.shape):
            raise LayoutError(
                f"{self.sharing.where(tensor)}: rollout parameter {name} holds {tuple(shape)} "
                f"on rank {self.rank}, the algebra's rollout layout {sh.shape}"
            )
        self._aliased[tensor] = tensor not in self.slots
        if tensor in self.slots:
            return self.slots[tensor].view(shape)
        src = self._shards[sh.host]
        off = src.storage_offset() + sh.host_offset // self.sharing.itemsize
        view = src.as_strided(sh.shape, sh.strides, off)
        return view if tuple(sh.shape) == tuple(shape) else view.view(shape)

    def _set(self, name: str, old: torch.Tensor, value: torch.Tensor) -> None:
        if isinstance(old, DTensor):
            value = DTensor.from_local(
                value, old.device_mesh, old.placements, run_check=False,
                shape=old.shape, stride=old.stride(),
            )  # fmt: skip
        module, _, leaf = name.rpartition(".")
        self.model.get_submodule(module)._parameters[leaf] = nn.Parameter(
            value, requires_grad=False
        )

    # -- weight_sync ------------------------------------------------------------------
    def load_weights(self, source) -> str:
        if isinstance(source, CheckpointWeights):
            raise BackendError(
                "backend.fsdp.rollout_sync=share reads the trainer's live weights only; a "
                "checkpoint rollout needs rollout_sync=gather"
            )
        if not isinstance(source, LiveWeights):
            raise BackendError(f"unknown weights source {source!r}")
        t0 = time.perf_counter()
        with torch.no_grad():
            masters = self._masters()
            if self._cast:  # the bf16 compute copy of the shards, by a local cast
                for n, t in masters.items():
                    self._shards[n].copy_(t)
            elif any(masters[n].data_ptr() != s.data_ptr() for n, s in self._shards.items()):
                self._shards = masters  # FSDP2 re-allocated its shards (e.g. a restore)
                self._bind()
            self._sync_device()
            t1 = time.perf_counter()
            self.exchange.run(self._shards, self.slots)
            self._sync_device()
        self.cast_seconds.append(t1 - t0)
        self.sync_seconds.append(time.perf_counter() - t0)
        self._version = version_name(source.model, source.version)
        return self._version

    def _sync_device(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def stats(self) -> dict[str, Any]:
        """Per-rank bytes and times (rollout dtype); `full_copy_bytes` is what a full
        second copy (rollout_sync=gather) holds on this rank."""
        item = self.sharing.itemsize
        full = sum(p.numel for p in self.sharing.params.values()) * item
        shared = sum(
            math.prod(self.sharing.share(t, self.rank).shape) * item
            for t, a in self._aliased.items()
            if a
        )
        placed = self.placed if self._cast else 0  # bf16 copies inside the buffer
        cast = sum(s.numel() for s in self._shards.values()) * item - placed if self._cast else 0
        times = self.sync_seconds[1:] or self.sync_seconds
        return {
            "rank": self.rank, "rollout_tp": self.tp, "world": self.trainer.world,
            "dtype": str(self.dtype).removeprefix("torch."),
            "shared_bytes": shared + placed, "rebuild_bytes": self.buffer.numel() * item - placed,
            "received_bytes": self.exchange.received, "sent_bytes": self.exchange.sent,
            "local_copy_bytes": self.exchange.copied, "compute_copy_bytes": cast,
            "full_copy_bytes": full, "extra_bytes": self.buffer.numel() * item + cast,
            "placed_bytes": placed,
            "aliased_tensors": sum(self._aliased.values()),
            "rebuilt_tensors": len(self.slots), "syncs": len(self.sync_seconds),
            "sync_s_median": statistics.median(times) if times else None,
            "cast_s_median": statistics.median(self.cast_seconds) if times else None,
        }  # fmt: skip

    # -- TP: the group runs the union of its rows in lockstep -------------------------
    def prefix_prefill(self, features, text, head: bool = True):
        if self.group is None:
            return super().prefix_prefill(features, text, head)
        features = gather_rows(features, self.group, self.device)
        text = gather_rows(text, self.group, self.device)
        return prefix_forward(self._model(), text, features.values, grad=False, head=head)

    def start_decode(self, prefix, group_size, sampling, generator):
        if self.group is None:
            return super().start_decode(prefix, group_size, sampling, generator)
        if sampling.lengths is not None:
            raise BackendError(
                f"forced response lengths (train.response_lengths=workload) with "
                f"backend.fsdp.rollout_tp={self.tp}: the TP group decodes its members' rows "
                "together; use rollout_tp=1"
            )
        mine = len(generator) if isinstance(generator, list | tuple) else None
        generator = gather_generators(generator, self.group, self.device, sampling.temperature)
        with torch.no_grad():
            state = expand_prefix(prefix, group_size)
        lo, hi = member_rows(state.rows, mine, self.group, self.device)
        s = sampling
        session = GroupDecodeSession(
            self._model(), state, s.max_new_tokens, s.temperature, s.top_p, generator,
            s.eos_id, s.pad_id,
        )  # fmt: skip
        return MemberDecode(session, lo, hi)

    def merge_rows(self, parts: list[dict[str, Any]]) -> dict[str, Any]:
        if self.group is not None and len(parts) > 1:
            raise BackendError(
                f"the rollout with backend.fsdp.rollout_tp={self.tp} runs its group's rows "
                "together and cannot take row chunks of a prefix op; plan without them"
            )
        return super().merge_rows(parts)
