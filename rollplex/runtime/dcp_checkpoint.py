"""Sharded training checkpoints through torch.distributed.checkpoint (DCP), for the FSDP2
trainer; one saved by N ranks loads on any number of ranks (DCP reshards).

`step-NNNNNN/` holds trainer_state.json, dcp/ (model and AdamW shards; PPO's critic's too,
under "critic") and model/ (a Hub-format export), written atomically like checkpoint.py's.
No RNG file: decode draws are seeded by (seed, step, sample). Folder layout:
docs/architecture.md (Checkpoints).
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from pydantic import Field, ValidationError

from rollplex.models.io import copy_assets
from rollplex.runtime.checkpoint import (
    STATE_FILE,
    CheckpointError,
    CheckpointState,
    _check_model,
    _files,
    _fsync,
    _sha256,
    read_state_file,
    require_critic,
    verify_files,
)
from rollplex.specs import ModelSpec

DCP_FORMAT = "rollplex-checkpoint/dcp-1"
DCP_DIR = "dcp"
MODEL_DIR = "model"
CRITIC_KEY = "critic"  # PPO's critic's shards, beside the policy's "model" and "optim"
log = logging.getLogger(__name__)


class DcpCheckpointState(CheckpointState):
    """trainer_state.json of a sharded checkpoint."""

    world: int = Field(..., ge=1, description="Ranks that wrote the shards (any may load).")


@dataclass(slots=True)
class DcpCheckpoint:
    folder: Path
    state: DcpCheckpointState
    critic: int | None = None  # the critic's version, read for PPO; None: none is restored

    @property
    def model_folder(self) -> Path:
        return self.folder / MODEL_DIR


def save_dcp_checkpoint(
    root: Path,
    step: int,
    trainer,
    model: ModelSpec,
    seed: int,
    export: bool = True,
    group: dist.ProcessGroup | None = None,
    critic: Any = None,
    reward_kl_coef: float | None = None,
) -> Path:
    """Write `root/step-NNNNNN` from every rank of `group` (a collective; default: all
    ranks); returns its folder. `critic`: PPO's (backends/fsdp/critic.py), its shards saved
    beside the policy's; `reward_kl_coef`: the adaptive reward-KL coefficient, where one
    adapts (as checkpoint.py's)."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)

    def sync() -> None:
        if world > 1:
            dist.barrier(group=group)

    final = root / f"step-{step:06d}"
    tmp = root / f".{final.name}.tmp"
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    sync()
    dcp.save(_sharded(trainer, critic), checkpoint_id=tmp / DCP_DIR, process_group=group)
    if export:
        trainer.save_weights(tmp / MODEL_DIR)  # gathers on all ranks, rank 0 writes
    if rank == 0:
        if export and model.path is not None:
            copy_assets(Path(model.path), tmp / MODEL_DIR)
        files = {p.relative_to(tmp).as_posix(): _sha256(p) for p in _files(tmp)}
        meta = DcpCheckpointState(
            format=DCP_FORMAT,
            step=step,
            seed=seed,
            version=trainer.state_dict()["version"],
            model=model.model_dump(mode="json"),
            files=files,
            world=world,
            critic_version=None if critic is None else critic.state_dict()["version"],
            reward_kl_coef=reward_kl_coef,
        )
        (tmp / STATE_FILE).write_text(meta.model_dump_json(indent=1) + "\n")
        for p in [*_files(tmp), tmp / STATE_FILE]:
            _fsync(p)
        if final.exists():
            old = root / f".{final.name}.old"
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
        _fsync(root)
    sync()
    return final


def read_dcp_checkpoint(
    path: str | Path, model: ModelSpec, seed: int, critic: bool = False
) -> DcpCheckpoint:
    """Validate a sharded checkpoint for a run of `model` with `seed`; reads no tensors.
    `critic`: the run trains PPO's critic, so the checkpoint must hold one."""
    folder, state_path, raw = read_state_file(path)
    if raw.get("format") != DCP_FORMAT:
        raise CheckpointError(
            f"{state_path}: 'format' is {raw.get('format')!r}, expected {DCP_FORMAT!r} (a "
            "checkpoint of backend.trainer=fsdp); resume a torch checkpoint with the torch "
            "trainer"
        )
    try:
        state = DcpCheckpointState.model_validate(raw)
    except ValidationError as e:
        fields = "; ".join(f"'{'.'.join(map(str, x['loc']))}': {x['msg']}" for x in e.errors())
        raise CheckpointError(f"{state_path}: {fields}") from e
    _check_model(state_path, state.model, model)
    if state.seed != seed:
        raise CheckpointError(
            f"{state_path}: 'seed' is {state.seed} but this run has seed={seed}; pass "
            f"seed={state.seed}"
        )
    if f"{DCP_DIR}/.metadata" not in state.files:
        raise CheckpointError(f"{state_path}: 'files' lacks {DCP_DIR}/.metadata")
    critic_version = require_critic(state_path, state) if critic else None
    verify_files(folder, state.files)
    return DcpCheckpoint(folder, state, critic_version)


def restore_dcp(
    trainer, ckpt: DcpCheckpoint, group: dist.ProcessGroup | None = None, critic: Any = None
) -> None:
    """Load the shards into the trainer and PPO's `critic` (read with `critic=True`),
    resharded to this run's ranks (a collective over `group`, default all ranks)."""
    if critic is not None and ckpt.critic is None:
        raise CheckpointError(f"{ckpt.folder}: read without its critic (critic=True)")
    if critic is None and ckpt.state.critic_version is not None:
        log.info("%s: this run trains no critic: the checkpoint's critic is not used", ckpt.folder)
    state = _sharded(trainer, critic)  # DCP loads only the keys asked for
    dcp.load(state, checkpoint_id=ckpt.folder / DCP_DIR, process_group=group)
    trainer.load_sharded_state(state)
    trainer.load_state_dict({"version": ckpt.state.version})
    if critic is not None:
        critic.load_sharded_state(state[CRITIC_KEY])
        critic.load_state_dict({"version": ckpt.critic})


def _sharded(trainer, critic) -> dict[str, Any]:
    """What DCP saves and loads: the trainer's state, and the critic's under CRITIC_KEY."""
    state = trainer.sharded_state()
    return state if critic is None else {**state, CRITIC_KEY: critic.sharded_state()}
