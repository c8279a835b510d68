"""A rank's loss as its part of the global batch's loss. FSDP2 averages the ranks' gradients,
so a rank's mean over its own items is rescaled by world * n_local / n_global (what n counts
follows loss_agg_mode), and its metrics likewise, so that their mean over the ranks (the
hooks' end_step) is the global batch's. The policy's loss and the critic's use it alike.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from rollplex.backends.torch.loss import agg_units
from rollplex.backends.torch.values import Loss

UNSCALED = frozenset({"tokens", "train_micro_batches"})  # the same on every rank


def share(n_local: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
    """world * n_local / n_global: the factor that turns this rank's mean over its
    n_local items into its part of the mean over all ranks' items (one all-reduce)."""
    n_local = n_local.to(torch.float64)
    n_global = total(n_local, mesh)
    return (n_local / n_global.clamp(min=1) * mesh.size()).to(torch.float32)


def total(x: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
    """`x` summed over the mesh's ranks (a new tensor; one all-reduce)."""
    out = x.clone()
    dist.all_reduce(out, group=mesh.get_group())
    return out


def global_loss(
    out: Loss, mask: torch.Tensor, mode: str, mesh: DeviceMesh, aggregated: frozenset[str]
) -> Loss:
    """`out` (this rank's loss over its rows, aggregated by `mode`) rescaled to its part of
    the global batch's, every micro-batch's term too. Metrics named in `aggregated` are
    aggregated as the loss is; the others are means over valid tokens."""
    world = mesh.size()
    if world == 1:
        return out
    mask = mask.bool()
    tokens = share(mask.sum(), mesh)
    if mode == "token-mean":
        loss_share = tokens
    elif mode == "seq-mean-token-sum-norm":  # sum / a constant: the ranks' parts add up
        loss_share = torch.tensor(float(world), device=mask.device)
    else:  # the seq-mean modes average over sequences with a token
        loss_share = share(agg_units(mask, mode), mesh)

    def rescaled(metrics: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {
            k: v * (loss_share if k in aggregated else tokens) if k not in UNSCALED else v
            for k, v in metrics.items()
        }

    return out.scaled(loss_share, rescaled)


__all__ = ["UNSCALED", "global_loss", "share", "total"]
