"""Which torchrun ranks run which device group of a plan (the disaggregated schedule's
rollout pool and training pool), checked before any model loads. Rank r executes only the
steps of the group holding r, plus its side of every cross-group transfer that names r
(runtime/transfers.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from rollplex.planner.plan import Plan, Transfer

log = logging.getLogger(__name__)


class PoolError(ValueError):
    """The plan's device groups cannot run on this torchrun world (or spec)."""


def check_pool_spec(num_gpus: int, rollout_gpus: int | None, world: int) -> None:
    """`schedule=disaggregated` under torchrun: the plan is made for `hardware.num_gpus`
    GPUs and run on WORLD_SIZE ranks, so the two must agree (nothing is overridden: a plan
    for another GPU count would split other pools and route other bytes), and the pools must
    both be non-empty. Raises PoolError naming the field."""
    if world < 2:
        raise PoolError(
            f"schedule=disaggregated runs a rollout pool and a training pool on their own "
            f"ranks: it needs torchrun with at least 2 ranks (WORLD_SIZE={world})"
        )
    if num_gpus != world:
        raise PoolError(
            f"schedule=disaggregated: hardware.num_gpus={num_gpus} but torchrun's "
            f"WORLD_SIZE={world}; the plan's pools are made for hardware.num_gpus GPUs and run "
            f"one rank per GPU: set hardware.num_gpus={world}"
        )
    if rollout_gpus is not None and not 1 <= rollout_gpus < world:
        raise PoolError(
            f"schedule.rollout_gpus={rollout_gpus} leaves no "
            f"{'trainer' if rollout_gpus >= world else 'rollout'} among the {world} ranks "
            f"(WORLD_SIZE): give 1..{world - 1}"
        )


@dataclass(slots=True, frozen=True)
class Pools:
    """This rank's place in a plan of several device groups."""

    rank: int
    world: int
    device: int  # index into plan.devices of the group running this rank's steps
    groups: tuple[tuple[int, ...], ...]  # each device group's global ranks, plan order
    names: tuple[str, ...]  # each device group's name ("rollout", "train")
    tps: tuple[int, ...]

    @property
    def name(self) -> str:
        return self.names[self.device]

    @property
    def ranks(self) -> tuple[int, ...]:
        return self.groups[self.device]

    def index_in_pool(self) -> int:
        return self.ranks.index(self.rank)

    def pool_ranks(self, name: str) -> tuple[int, ...]:
        return self.groups[self.names.index(name)]

    def describe(self) -> str:
        pools = ", ".join(f"{n} {list(g)}" for n, g in zip(self.names, self.groups, strict=True))
        return (f"rank {self.rank} of {self.world} runs the '{self.name}' pool (ranks "
                f"{list(self.ranks)}); pools: {pools}")  # fmt: skip

    def in_transfer(self, t: Transfer) -> bool:
        return any(self.rank in (r.src, r.dst) for r in t.routes)


def pools_for(plan: Plan, rank: int, world: int, prompts: int) -> Pools:
    """This rank's pool; PoolError if the plan's groups do not cover 0..world-1 once each,
    a pool runs tensor-parallel (not executed across processes yet), or the prompts do not
    split. Within a group every rank takes an equal, contiguous slice of the step's prompts
    (a rollout replica its rows, a trainer its rows), so `prompts` must divide by each
    group's width; a replica keeps whole prompts, so a GRPO group's rewards and advantages
    are computed over all of its samples."""
    groups = tuple(tuple(d.ranks) for d in plan.devices)
    seen = sorted(r for g in groups for r in g)
    if seen != list(range(world)):
        raise PoolError(
            f"the plan's device groups hold ranks {[list(g) for g in groups]}, torchrun has "
            f"WORLD_SIZE={world}: make the plan with hardware.num_gpus={world}"
        )
    for d in plan.devices:
        if d.tp != 1:
            raise PoolError(
                f"the plan's '{d.name}' pool runs at TP {d.tp}: pools execute data-parallel "
                "only (one full rollout model per rank); set schedule.parallel.rollout_tp=1"
            )
        if prompts % len(d.ranks):
            raise PoolError(
                f"workload.prompts_per_step={prompts} does not divide over the {len(d.ranks)} "
                f"ranks of the '{d.name}' pool: each takes an equal, contiguous slice"
            )
    device = next(i for i, g in enumerate(groups) if rank in g)
    return Pools(rank, world, device, groups, tuple(d.name for d in plan.devices),
                 tuple(d.tp for d in plan.devices))  # fmt: skip


def is_pooled(plan: Plan) -> bool:
    """The plan has more than one device group: its ranks run different steps."""
    return len(plan.devices) > 1


__all__ = ["PoolError", "Pools", "check_pool_spec", "is_pooled", "pools_for"]
