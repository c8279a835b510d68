"""Sharded training checkpoints through torch.distributed.checkpoint (DCP), for the FSDP2
trainer; one saved by N ranks loads on any number of ranks (DCP reshards).

`step-NNNNNN/` holds trainer_state.json, dcp/ (model and AdamW shards) and model/ (a
Hub-format export), written atomically like checkpoint.py's. No RNG file: decode draws are
seeded by (seed, step, sample). Folder layout: docs/architecture.md (Checkpoints).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

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
    verify_files,
)
from rollplex.specs import ModelSpec

DCP_FORMAT = "rollplex-checkpoint/dcp-1"
DCP_DIR = "dcp"
MODEL_DIR = "model"


class DcpCheckpointState(CheckpointState):
    """trainer_state.json of a sharded checkpoint."""

    world: int = Field(..., ge=1, description="Ranks that wrote the shards (any may load).")


@dataclass(slots=True)
class DcpCheckpoint:
    folder: Path
    state: DcpCheckpointState

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
) -> Path:
    """Write `root/step-NNNNNN` from every rank of `group` (a collective; default: all
    ranks); returns its folder."""
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
    dcp.save(trainer.sharded_state(), checkpoint_id=tmp / DCP_DIR, process_group=group)
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


def read_dcp_checkpoint(path: str | Path, model: ModelSpec, seed: int) -> DcpCheckpoint:
    """Validate a sharded checkpoint for a run of `model` with `seed`; reads no tensors."""
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
    verify_files(folder, state.files)
    return DcpCheckpoint(folder, state)


def restore_dcp(trainer, ckpt: DcpCheckpoint, group: dist.ProcessGroup | None = None) -> None:
    """Load the shards into the trainer, resharded to this run's ranks (a collective over
    `group`, default all ranks)."""
    state = trainer.sharded_state()
    dcp.load(state, checkpoint_id=ckpt.folder / DCP_DIR, process_group=group)
    trainer.load_sharded_state(state)
    trainer.load_state_dict({"version": ckpt.state.version})
