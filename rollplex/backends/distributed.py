"""Process groups from torchrun's environment, and rank-aware logging and output: gloo on
CPU, NCCL on CUDA, or a one-process gloo group without torchrun, so the same FSDP2 code
runs as a plain `python -m rollplex.cli`. Only rank 0 writes the run folder, TensorBoard
and the summary (`is_main`); every other rank logs to a file of its own.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


class DistributedError(ValueError):
    """The torchrun environment or the device cannot serve the requested run."""


@dataclass(slots=True, frozen=True)
class DistInfo:
    rank: int
    world: int
    local_rank: int
    backend: str  # "gloo" | "nccl"
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _env_int(name: str) -> int:
    raw = os.environ.get(name, "")
    try:
        return int(raw)
    except ValueError as e:
        raise DistributedError(f"environment variable {name}={raw!r} is not an integer") from e


def launched_by_torchrun() -> bool:
    return all(v in os.environ for v in TORCHRUN_VARS)


def init_distributed(device: str = "cpu", timeout_s: float = 600.0) -> DistInfo:
    """Start (or reuse) the default process group for `device` ('cpu' or 'cuda'), from
    torchrun's RANK / WORLD_SIZE / LOCAL_RANK (MASTER_ADDR/PORT come with them): gloo on
    CPU, NCCL on CUDA (each rank on cuda:LOCAL_RANK). Without torchrun's variables, a
    one-process gloo group on an in-memory store."""
    kind = torch.device(device).type
    if kind not in ("cpu", "cuda"):
        raise DistributedError(f"train.device={device!r}: FSDP runs on cpu (gloo) or cuda (nccl)")
    backend = "nccl" if kind == "cuda" else "gloo"
    if launched_by_torchrun():
        rank, world, local = _env_int("RANK"), _env_int("WORLD_SIZE"), _env_int("LOCAL_RANK")
    else:
        rank, world, local = 0, 1, 0
    if kind == "cuda":
        if not torch.cuda.is_available() or local >= torch.cuda.device_count():
            raise DistributedError(
                f"rank {rank} wants cuda:{local}, but this host has "
                f"{torch.cuda.device_count()} CUDA devices"
            )
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
    else:
        dev = torch.device("cpu")
    if not dist.is_initialized():
        timeout = timedelta(seconds=timeout_s)
        if launched_by_torchrun():
            dist.init_process_group(backend, timeout=timeout)
        else:  # one process: a private store, no port to pick
            store = dist.HashStore()
            dist.init_process_group(backend, store=store, rank=0, world_size=1, timeout=timeout)
    elif dist.get_world_size() != world:
        raise DistributedError(
            f"a process group of {dist.get_world_size()} ranks exists, torchrun says {world}"
        )
    return DistInfo(rank, world, local, backend, dev)


def rank_log_file(out: Path, rank: int) -> Path:
    """Where rank N logs (`<run folder>/ranks/rank<N>.log`): N processes never share a file."""
    return out / "ranks" / f"rank{rank}.log"


def setup_rank_logging(out: Path, info: DistInfo) -> None:
    """Rank 0 keeps the console; every rank also logs to its own file under `out/ranks/`,
    with its rank in every line."""
    path = rank_log_file(out, info.rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path)
    handler.setFormatter(
        logging.Formatter(f"%(asctime)s rank{info.rank} %(levelname)s %(name)s: %(message)s")
    )
    root = logging.getLogger()
    root.addHandler(handler)
    if not info.is_main:  # the console and Hydra's job log stay rank 0's
        for h in list(root.handlers):
            if h is not handler:
                root.removeHandler(h)
    root.setLevel(min(root.level or logging.INFO, logging.INFO))


def all_reduce_mean(values: dict[str, float]) -> dict[str, float]:
    """Each key's mean over the ranks (one collective); the same dict on every rank."""
    if not dist.is_initialized() or dist.get_world_size() == 1 or not values:
        return dict(values)
    keys = sorted(values)
    # NCCL reduces device tensors only; gloo host tensors.
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    t /= dist.get_world_size()
    return dict(zip(keys, t.tolist(), strict=True))


def barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def from_rank0(obj):
    """Rank 0's `obj` on every rank (e.g. the run folder: each rank's Hydra may time-stamp
    its own, and DCP needs one checkpoint folder for all)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]
