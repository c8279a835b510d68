"""FSDP2 over a transformers Qwen2.5-VL: one unit per decoder layer and per vision block, and a
root unit holding the rest (tied `embed_tokens`/`lm_head` must share one unit: FACTS.md).

The torch backend calls model pieces rather than `forward`, so the root is a thin
`ShardedRoot` whose forward runs a function: the trainer runs each forward as `root(fn,
...)` and FSDP's root hooks fire around it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Shard

from rollplex.engine.prefix import Model

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# The root returns views (logprob slices, prefix states); nothing modifies them in place.
warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")


class ShardedRoot(nn.Module):
    """The root FSDP unit: `root(fn, *args)` runs `fn(*args)` inside the root's forward."""

    def __init__(self, model: Model) -> None:
        super().__init__()
        self.model = model

    def forward(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)


def units(model: Model) -> list[nn.Module]:
    """The non-root units, innermost first: vision blocks, then decoder layers."""
    return [*model.model.visual.blocks, *model.model.language_model.layers]


def shard_model(
    model: Model,
    mesh: DeviceMesh,
    param_dtype: str = "float32",
    reduce_dtype: str = "float32",
    reshard_after_forward: bool = True,
    dims: Mapping[str, int] | None = None,
) -> ShardedRoot:
    """Shard `model` in place (every parameter becomes a Shard(0) DTensor of `mesh`, or
    Shard(d) for the parameters `dims` names: the shared rollout's layout, share.py).
    With param_dtype float32 no cast policy is set at all: the bit-exact path."""
    mp = MixedPrecisionPolicy(param_dtype=DTYPES[param_dtype], reduce_dtype=DTYPES[reduce_dtype])
    kw: dict[str, Any] = {"mesh": mesh}
    if dims:
        by_id = {id(p): dims.get(n, 0) for n, p in model.named_parameters()}
        kw["shard_placement_fn"] = lambda p: Shard(by_id.get(id(p), 0))
    if param_dtype != "float32" or reduce_dtype != "float32":
        kw["mp_policy"] = mp
    for unit in units(model):
        fully_shard(unit, reshard_after_forward=reshard_after_forward, **kw)
    root = ShardedRoot(model)
    fully_shard(root, reshard_after_forward=False, **kw)
    return root


@contextmanager
def root_kept_through_backward(root: ShardedRoot) -> Iterator[None]:
    """The root's parameters (embeddings, norm, head) stay gathered over all of a loss's
    micro-batches' backwards and are resharded once at the end: each backward recomputes
    its checkpointed head from the module's weights, which FSDP2 would otherwise have put
    back to shards after the first micro-batch."""
    root.set_reshard_after_backward(False, recurse=False)
    try:
        yield
    finally:
        root.set_reshard_after_backward(True, recurse=False)
        root.reshard()


def expected_chunk(shape: torch.Size, index: int, count: int) -> torch.Size:
    """The dim-0 chunk `index` of `count` of a tensor of `shape` (torch.chunk's sizes)."""
    meta = torch.empty(shape, device="meta").chunk(count)
    return meta[index].shape if index < len(meta) else torch.Size([0, *shape[1:]])


def local(p: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a parameter (the tensor itself when not sharded)."""
    return p.to_local() if isinstance(p, DTensor) else p


def full(p: torch.Tensor) -> torch.Tensor:
    """The whole parameter, gathered from every rank (a collective: all ranks call it)."""
    return p.full_tensor() if isinstance(p, DTensor) else p


def sharded_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """A sharded module's weights and optimizer state as DTensors, for
    torch.distributed.checkpoint (resharded on load): the trainer's and the critic's."""
    return {
        "model": get_model_state_dict(model),
        "optim": get_optimizer_state_dict(model, optimizer),
    }


def load_sharded_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, state: Mapping[str, Any]
) -> None:
    set_model_state_dict(model, state["model"])
    set_optimizer_state_dict(model, optimizer, state["optim"])
