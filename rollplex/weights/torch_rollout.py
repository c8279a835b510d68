"""The torch rollout's side of the algebra (`backend.fsdp.rollout_sync=share`), torch-free so
the planner can read it.

`rollout_sharing`: FSDP2 over the world against torch's Qwen2 TP plan (strided rank map).
`torch_rollout_bytes`: what `SharedRollout.stats()` measures, predicted: the bytes each rank
aliases, rebuilds and receives per weight_sync.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection

from rollplex.specs.model import ModelSpec
from rollplex.weights import algebra
from rollplex.weights.layouts import RolloutPlacement, TrainPlacement
from rollplex.weights.params import torch_rollout_tensors
from rollplex.weights.sharing import Kind, WeightSharing, strided_ranks


def rollout_sharing(spec: ModelSpec, world: int, tp: int, dtype: str) -> WeightSharing:
    """The algebra between the FSDP2 trainer on `world` ranks and the TP-`tp` torch
    rollout; a LayoutError naming the parameter and both layouts when tp cannot split it."""
    train = TrainPlacement(world, 1, aliasing_storage=1 < tp == world)
    rollout = RolloutPlacement(tp, strided_ranks(world, tp), vision_tp=False)
    sharing = WeightSharing(spec, train, rollout, dtype, dtype, torch_rollout_tensors(spec))
    for name in sharing.tensors:  # every split is even on some rank, or a LayoutError now
        sharing.rollout_shard(name, 0)
    return sharing


def shard_dims(spec: ModelSpec, world: int, tp: int) -> dict[str, int]:
    """Parameters the trainer shards on dim 1 (FSDP2 `shard_placement_fn`): those the
    algebra stores as stacked rollout column blocks (o_proj, down_proj when t_r == d_t)."""
    sharing = rollout_sharing(spec, world, tp, "float32")
    out = {}
    for name, p in sharing.params.items():
        blocks, _ = sharing.train_shard(name, 0)
        if len(p.shape) == 2 and blocks and blocks[0].c1 - blocks[0].c0 < p.cols:
            out[name] = 1
    return out


def aliased(sharing: WeightSharing, tensor: str, gpu: int) -> bool:
    """The rollout tensor is a view of one local shard (else it is rebuilt)."""
    sh = sharing.share(tensor, gpu)
    return sh.kind in (Kind.IDENTICAL, Kind.VIEW) and sh.host is not None


def _once(_: str) -> int:
    return 1


def torch_rollout_bytes(
    sharing: WeightSharing,
    gpu: int,
    cast: bool,
    count: Callable[[str], int] = _once,
    towers: Collection[str] | None = None,
) -> dict[str, int]:
    """Per-rank bytes of the shared rollout (the keys of `SharedRollout.stats`): each
    rollout tensor and training parameter counted `count(name)` times, only those of
    `towers` (default: all). `local_copy_bytes`: what a sync copies from the rank's own
    shards into rebuilt tensors (the exchange's local runs). Equal to summing
    `rebuild_plan` (tests/planner/test_torch_share.py checks it), without its per-row runs."""
    item = sharing.itemsize
    shared = rebuilt = placed = received = copied = 0
    for name, t in sharing.tensors.items():
        if towers is not None and t.tower not in towers:
            continue
        n, sh = count(name), sharing.share(name, gpu)
        if aliased(sharing, name, gpu):
            shared += sh.nbytes * n
            continue
        # What `rebuild_plan(in_place=cast)` copies, by arithmetic (it takes every byte the
        # rank holds from its own shards first): the placed shards are already in place.
        inside = sum(p.nbytes for p in sh.placements) if cast else 0
        rebuilt += sh.nbytes * n
        placed += inside * n
        received += sh.remote_bytes * n
        copied += (sh.local_bytes - inside) * n
    params = [p for p in sharing.params.values() if towers is None or p.tower in towers]
    shards = sum(algebra.numel(sharing.train_shard(p.name, gpu)[0]) * count(p.name) for p in params)
    copy = shards * item - placed if cast else 0
    full = sum(math.prod(p.shape) * count(p.name) for p in params) * item
    return {
        "shared_bytes": shared + placed, "rebuild_bytes": rebuilt - placed,
        "received_bytes": received, "local_copy_bytes": copied, "placed_bytes": placed,
        "compute_copy_bytes": copy, "full_copy_bytes": full, "extra_bytes": rebuilt + copy,
    }  # fmt: skip
