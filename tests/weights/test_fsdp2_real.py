"""The training side of the algebra against real FSDP2: `fully_shard` on a fake process
group (one process plays each rank in turn) gives every parameter's local shard and its
padded storage; they must be the blocks and padding `WeightSharing.train_shard` claims."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from rollplex.specs.weights import WeightsSpec
from rollplex.weights import build_sharing
from tests.weights.conftest import small_spec
from tests.weights.test_bruteforce import full_params, storage


@pytest.mark.parametrize("fsdp, rollout_tp", [(8, 4), (4, 2), (2, 2)])
def test_train_shards_are_fully_shards(fsdp: int, rollout_tp: int) -> None:
    from torch.distributed.fsdp import fully_shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    s = build_sharing(small_spec(), WeightsSpec(train_fsdp=fsdp, rollout_tp=rollout_tp))
    full = full_params(s)
    names = list(s.params)
    for rank in range(fsdp):
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=fsdp)
        try:
            root = nn.Module()
            for k, name in enumerate(names):
                holder = nn.Module()
                holder.w = nn.Parameter(storage(s, name, full[name]).clone())
                root.add_module(str(k), holder)
            fully_shard(root)
            for k, name in enumerate(names):
                w = getattr(root, str(k)).w
                local = w.to_local()
                blocks, pad = s.train_shard(name, rank)
                assert tuple(local.shape) == s.train_shape(name, rank), name
                grid = full[name].reshape(s.params[name].rows, -1)
                parts = [grid[b.r0 : b.r1, b.c0 : b.c1].reshape(-1) for b in blocks]
                values = torch.cat(parts) if parts else local[:0].reshape(-1)
                assert torch.equal(local.reshape(-1), values), name
                padded = local.untyped_storage().nbytes() // local.element_size()
                assert padded == local.numel() + pad, name
        finally:
            dist.destroy_process_group()
