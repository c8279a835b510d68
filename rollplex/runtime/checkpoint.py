"""Training checkpoints: written atomically, checked completely before anything loads.

`step-NNNNNN/` holds trainer_state.json, a Hub-format model/ folder, optimizer.pt, the float32
masters of a bf16 run, rng.pt and, for PPO, critic/ (the critic's weights, AdamW state and
masters), written into a hidden folder and renamed when complete.
`read_checkpoint` validates everything and only reads: a bad checkpoint raises
`CheckpointError` naming the file and field. Layout: docs/architecture.md (Checkpoints).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from safetensors.torch import load_file, save_file

from rollplex.backends.base import BackendError, Trainer
from rollplex.models.files import CONFIG_FILE, INDEX_FILE, WEIGHTS_FILE
from rollplex.models.io import copy_assets
from rollplex.specs import ModelSpec

FORMAT = "rollplex-checkpoint/2"  # /2: model/ is a full Hub folder (save_pretrained)
STATE_FILE = "trainer_state.json"
MODEL_DIR = "model"
OPTIMIZER_FILE = "optimizer.pt"
MASTERS_FILE = "masters.safetensors"
RNG_FILE = "rng.pt"
# PPO's critic: its trained weights (trunk copy and value head), AdamW state, bf16 masters
CRITIC_WEIGHTS = "critic/weights.safetensors"
CRITIC_OPTIMIZER = "critic/optimizer.pt"
CRITIC_MASTERS = "critic/masters.safetensors"
log = logging.getLogger(__name__)
_STEP_DIR = re.compile(r"^step-(\d+)$")
# which file holds each part of a trainer's state (a StateMismatch's `part`)
_PART_FILES = {"optimizer": OPTIMIZER_FILE, "masters": MASTERS_FILE}
_CRITIC_FILES = {
    "weights": CRITIC_WEIGHTS,
    "optimizer": CRITIC_OPTIMIZER,
    "masters": CRITIC_MASTERS,
}


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed from; the message names the file and field."""


class CheckpointState(BaseModel):
    """trainer_state.json."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    format: str = Field(..., description=f"Always {FORMAT!r}.")
    step: int = Field(..., ge=1, description="RL steps completed.")
    seed: int = Field(..., description="The run's seed (the reference model is rebuilt from it).")
    version: int = Field(..., ge=0, description="Weights version of the trained model.")
    model: dict[str, Any] = Field(..., description="The ModelSpec the weights belong to.")
    files: dict[str, str] = Field(..., description="Relative path -> sha256 of its bytes.")
    critic_version: int | None = Field(
        None,
        ge=0,
        exclude_if=lambda v: v is None,  # a run without a critic writes what it always did
        description="Optimizer steps of PPO's critic, whose state is in critic/; absent: "
        "the checkpoint holds no critic (a GRPO/RLOO run's, or one written before PPO "
        "checkpoints held it).",
    )
    reward_kl_coef: float | None = Field(
        None,
        gt=0,
        exclude_if=lambda v: v is None,
        description="PPO with kl_in_reward and kl_ctrl=adaptive: the coefficient the next "
        "step's reward penalty starts from (the controller moved it from algo.kl_coef).",
    )


@dataclass(slots=True)
class CriticState:
    """critic/ of a checkpoint, read and checked for form: `TorchCritic.state_dict`'s."""

    weights: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    version: int
    masters: dict[str, torch.Tensor] | None = None

    def as_dict(self) -> dict[str, Any]:
        out = {"weights": self.weights, "optimizer": self.optimizer, "version": self.version}
        return out | ({"masters": self.masters} if self.masters is not None else {})


@dataclass(slots=True)
class Checkpoint:
    folder: Path
    state: CheckpointState
    optimizer: dict[str, Any]
    rng: dict[str, Any]
    masters: dict[str, torch.Tensor] | None = None  # None: the checkpoint has none
    critic: CriticState | None = None  # None: none saved, or this run reads none

    @property
    def model_folder(self) -> Path:
        return self.folder / MODEL_DIR


def verify_files(folder: Path, files: dict[str, str]) -> None:
    """CheckpointError for a file of the manifest that is missing or whose sha256 differs."""
    for rel, digest in files.items():
        p = folder / rel
        if not p.is_file():
            raise CheckpointError(f"{p}: missing (listed in {STATE_FILE})")
        if _sha256(p) != digest:
            raise CheckpointError(
                f"{p}: sha256 differs from {STATE_FILE}: the file is corrupt or was modified"
            )


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != STATE_FILE)


def rng_state() -> dict[str, Any]:
    out: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        out["cuda"] = torch.cuda.get_rng_state_all()
    return out


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    root: Path,
    step: int,
    trainer: Trainer,
    model: ModelSpec,
    seed: int,
    assets_from: str | Path | None = None,
    critic: Any = None,
    reward_kl_coef: float | None = None,
) -> Path:
    """Write checkpoint `root/step-NNNNNN` atomically; returns its folder.

    The tokenizer/processor files come from `assets_from`, default the run's model folder
    (`model.path`); files the trainer's `save_weights` already wrote are kept. `critic`:
    PPO's (backends/torch/critic.py), saved beside the policy in critic/; `reward_kl_coef`:
    its adaptive reward-KL coefficient (runtime/role_free.py), where one adapts."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    tmp = root / f".{final.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
        trainer.save_weights(tmp / MODEL_DIR)
        source = assets_from if assets_from is not None else model.path
        if source is not None:
            copy_assets(Path(source), tmp / MODEL_DIR)
        state = trainer.state_dict()
        torch.save(state["optimizer"], tmp / OPTIMIZER_FILE)
        if state.get("masters"):
            save_file(state["masters"], tmp / MASTERS_FILE)
        torch.save(rng_state(), tmp / RNG_FILE)
        critic_version = _save_critic(tmp, critic.state_dict()) if critic is not None else None
        files = {p.relative_to(tmp).as_posix(): _sha256(p) for p in _files(tmp)}
        meta = CheckpointState(
            format=FORMAT,
            step=step,
            seed=seed,
            version=state["version"],
            model=model.model_dump(mode="json"),
            files=files,
            critic_version=critic_version,
            reward_kl_coef=reward_kl_coef,
        )
        (tmp / STATE_FILE).write_text(meta.model_dump_json(indent=1) + "\n")
        for p in [*_files(tmp), tmp / STATE_FILE]:
            _fsync(p)
        if final.exists():  # a re-run of the same step: swap, never leave a gap
            old = root / f".{final.name}.old-{os.getpid()}"
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
        _fsync(root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _save_critic(folder: Path, state: dict[str, Any]) -> int:
    """The critic's state into `folder`/critic/; returns its version."""
    (folder / CRITIC_WEIGHTS).parent.mkdir()
    save_file(state["weights"], folder / CRITIC_WEIGHTS)
    torch.save(state["optimizer"], folder / CRITIC_OPTIMIZER)
    if state.get("masters"):
        save_file(state["masters"], folder / CRITIC_MASTERS)
    return int(state["version"])


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def latest_checkpoint(root: Path) -> Path | None:
    """The complete checkpoint with the highest step under `root` (temporaries skipped)."""
    found = [
        (int(m.group(1)), p)
        for p in root.glob("step-*")
        if (m := _STEP_DIR.match(p.name)) and (p / STATE_FILE).is_file()
    ]
    return max(found)[1] if found else None


def resolve(path: str | Path) -> Path:
    """A checkpoint folder, or a run folder / checkpoints folder meaning its latest one."""
    p = Path(path)
    if (p / STATE_FILE).is_file() or not p.is_dir():
        return p
    for root in (p / "checkpoints", p):
        if (last := latest_checkpoint(root)) is not None:
            return last
    return p


def read_state_file(path: str | Path) -> tuple[Path, Path, dict[str, Any]]:
    """(checkpoint folder, its state file, the file's JSON) for a checkpoint, run or
    checkpoints folder; a missing or unreadable file raises CheckpointError naming it."""
    folder = resolve(path)
    state_path = folder / STATE_FILE
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: no such checkpoint folder")
    try:
        return folder, state_path, json.loads(state_path.read_text())
    except OSError as e:
        raise CheckpointError(f"{state_path}: cannot read ({e.strerror})") from e
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{state_path}: not valid JSON ({e})") from e


def read_checkpoint(
    path: str | Path, model: ModelSpec, seed: int, critic: bool = False
) -> Checkpoint:
    """Validate and read a checkpoint for a run of `model` with `seed`; never writes.
    `critic`: the run trains PPO's critic, so the checkpoint must hold one (it is read only
    then: a run without a critic resumes a PPO checkpoint's policy and leaves its critic)."""
    folder, state_path, raw = read_state_file(path)
    try:
        state = CheckpointState.model_validate(raw)
    except ValidationError as e:
        fields = "; ".join(f"'{'.'.join(map(str, x['loc']))}': {x['msg']}" for x in e.errors())
        raise CheckpointError(f"{state_path}: {fields}") from e
    if state.format != FORMAT:
        raise CheckpointError(f"{state_path}: 'format' is {state.format!r}, expected {FORMAT!r}")
    _check_model(state_path, state.model, model)
    if state.seed != seed:
        raise CheckpointError(
            f"{state_path}: 'seed' is {state.seed} but this run has seed="
            f"{seed} (the reference model is built from it); pass seed="
            f"{state.seed}"
        )
    for rel in (f"{MODEL_DIR}/{CONFIG_FILE}", OPTIMIZER_FILE, RNG_FILE):
        if rel not in state.files:
            raise CheckpointError(f"{state_path}: 'files' lacks {rel!r}")
    if not {f"{MODEL_DIR}/{WEIGHTS_FILE}", f"{MODEL_DIR}/{INDEX_FILE}"} & set(state.files):
        raise CheckpointError(f"{state_path}: 'files' lacks {MODEL_DIR}/{WEIGHTS_FILE!r}")
    critic_version = _critic_version(state_path, state) if critic else None
    verify_files(folder, state.files)
    optimizer = _load(folder / OPTIMIZER_FILE)
    rng = _load(folder / RNG_FILE)
    for key in ("state", "param_groups"):
        if key not in optimizer:
            raise CheckpointError(f"{folder / OPTIMIZER_FILE}: no {key!r} in the optimizer state")
    masters = _load_masters(folder / MASTERS_FILE) if MASTERS_FILE in state.files else None
    saved_critic = None if critic_version is None else _read_critic(folder, state, critic_version)
    return Checkpoint(folder, state, optimizer, rng, masters, saved_critic)


def require_critic(state_path: Path, state: CheckpointState) -> int:
    """The critic's version; CheckpointError unless the state file records a critic (a PPO
    run resumes only a checkpoint that holds one; the DCP format's check too)."""
    if state.critic_version is None:
        raise CheckpointError(
            f"{state_path}: no 'critic_version': the checkpoint holds no critic (written by "
            "an algo=grpo or rloo run, or before PPO checkpoints held the critic), and "
            "algo=ppo would restart its critic; resume it with the algo that wrote it, or "
            "start the PPO run without train.resume"
        )
    return state.critic_version


def _critic_version(state_path: Path, state: CheckpointState) -> int:
    """The critic's version; CheckpointError unless the state file records a critic and
    lists its files."""
    version = require_critic(state_path, state)
    for rel in (CRITIC_WEIGHTS, CRITIC_OPTIMIZER):
        if rel not in state.files:
            raise CheckpointError(f"{state_path}: 'files' lacks {rel!r} (the PPO critic's)")
    return version


def _read_critic(folder: Path, state: CheckpointState, version: int) -> CriticState:
    optimizer = _load(folder / CRITIC_OPTIMIZER)
    for key in ("state", "param_groups"):
        if key not in optimizer:
            raise CheckpointError(f"{folder / CRITIC_OPTIMIZER}: no {key!r} in the optimizer state")
    weights = _load_safetensors(folder / CRITIC_WEIGHTS)
    masters = None
    if CRITIC_MASTERS in state.files:
        masters = _load_masters(folder / CRITIC_MASTERS)
    return CriticState(weights, optimizer, version, masters)


def _load_safetensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(path)
    except Exception as e:  # safetensors raises its own and OS errors for a damaged file
        raise CheckpointError(f"{path}: cannot be read ({type(e).__name__}: {e})") from e


def _load_masters(path: Path) -> dict[str, torch.Tensor]:
    out = _load_safetensors(path)
    if bad := sorted(k for k, v in out.items() if v.dtype != torch.float32):
        raise CheckpointError(f"{path}: {bad[0]} is not float32")
    return out


# not the model's: the dtype is the device's (jobs/model_dtype.py), and a checkpoint
# (float32 masters) resumes on another device
_NOT_COMPARED = frozenset({"name", "path", "dtype"})


def _check_model(where: Path, saved: dict[str, Any], model: ModelSpec) -> None:
    ours = model.model_dump(mode="json")
    diffs = [
        f"model.{k}: checkpoint has {saved.get(k)!r}, this run has {ours.get(k)!r}"
        for k in sorted(set(saved) | set(ours))
        if k not in _NOT_COMPARED and saved.get(k) != ours.get(k)
    ]
    if diffs:
        raise CheckpointError(
            f"{where}: the checkpoint belongs to another model ("
            f"{saved.get('name')!r}): " + "; ".join(diffs)
        )


def _load(path: Path) -> dict[str, Any]:
    try:
        out = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises several types for a damaged file
        raise CheckpointError(f"{path}: cannot be read ({type(e).__name__}: {e})") from e
    if not isinstance(out, dict):
        raise CheckpointError(f"{path}: holds a {type(out).__name__}, not a dict")
    return out


def restore(trainer: Trainer, ckpt: Checkpoint, critic: Any = None) -> None:
    """Load a validated checkpoint into the trainer, PPO's `critic` (read with
    `critic=True`) and the process RNGs. An optimizer state, masters or critic state that
    do not fit raise CheckpointError naming the file; the critic is checked first, so a
    refusal leaves the trainer as it was."""
    if critic is not None:
        if ckpt.critic is None:
            raise CheckpointError(f"{ckpt.folder}: read without its critic (critic=True)")
        try:
            critic.load_state_dict(ckpt.critic.as_dict())
        except (BackendError, ValueError) as e:
            part = _CRITIC_FILES[getattr(e, "part", "optimizer")]
            raise CheckpointError(
                f"{ckpt.folder / part}: does not fit this run's critic ({e})"
            ) from e
    elif ckpt.state.critic_version is not None:
        log.info("%s: this run trains no critic: the checkpoint's critic/ is not used", ckpt.folder)
    trainer.load_weights(ckpt.model_folder)
    state: dict[str, Any] = {"optimizer": ckpt.optimizer, "version": ckpt.state.version}
    if ckpt.masters is not None:  # else a trainer with masters takes them from the weights
        state["masters"] = ckpt.masters
    try:
        trainer.load_state_dict(state)
    except (BackendError, ValueError) as e:  # ours name the part; torch's are the optimizer's
        part = _PART_FILES[getattr(e, "part", "optimizer")]
        raise CheckpointError(f"{ckpt.folder / part}: does not fit this run's trainer ({e})") from e
    set_rng_state(ckpt.rng)
