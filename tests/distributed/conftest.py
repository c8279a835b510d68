"""Runs of the real CLI and of worker.py on gloo, each in its own processes (torchrun for
N > 1, plain python for 1), with a timeout. Tiny model, few steps: the whole folder
costs about two to three CPU-minutes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rollplex.specs import ModelSpec

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 240
# The default data (easy-VQA on the demo folder) with a reward that about half of a random
# model's responses earn: every step has nonzero advantages, so the updates compared below
# carry a learning signal (the tests check that the weights moved).
TRAIN = [
    "backend=fsdp",
    "train.progress=false",
    "train.eval_every=0",
    "train.max_new_tokens=2",
    "train.checkpoint_every=2",
    "train.trace_steps=1",
    'reward.components=[{name: "tests.distributed.rewards:even_length", weight: 1.0}]',
]


def env() -> dict[str, str]:
    e = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    e.pop("RANK", None)  # a plain run must not think it is a torchrun rank
    return e


def command(nproc: int, module: str, args: list[str]) -> list[str]:
    if nproc == 1:
        return [sys.executable, "-m", module, *args]
    run = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    return [*run, f"--nproc-per-node={nproc}", "-m", module, *args]


def launch(nproc: int, module: str, args: list[str], timeout: float = TIMEOUT_S) -> str:
    """Run to the end; fail the test with the output if it fails or hangs."""
    try:
        p = subprocess.run(
            command(nproc, module, args),
            cwd=ROOT,
            env=env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{nproc} processes of {module} {args} ran past {timeout}s:\n{e.stdout}")
    if p.returncode != 0:
        pytest.fail(f"{module} {args} on {nproc} processes exited {p.returncode}:\n{p.stderr}")
    return p.stdout


def train(nproc: int, out: Path, steps: int, *extra: str) -> Path:
    launch(
        nproc,
        "rollplex.cli",
        ["train", *TRAIN, f"train.steps={steps}", *extra, f"hydra.run.dir={out}"],
    )
    return out


def weights(run: Path, step: int) -> dict[str, torch.Tensor]:
    """The Hub export of checkpoint `step` of a run folder."""
    return load_file(run / "checkpoints" / f"step-{step:06d}" / "model" / "model.safetensors")


def ckpt_model(ckpt: Path) -> ModelSpec:
    """The model spec a checkpoint was written for (the demo folder's, in these runs)."""
    return ModelSpec.model_validate(json.loads((ckpt / "trainer_state.json").read_text())["model"])


def moved(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max((a[n] - b[n]).abs().max().item() for n in a)


@dataclass(frozen=True)
class Runs:
    one: Path  # 1 process, gather sync
    two: Path  # torchrun, 2 gloo ranks


@pytest.fixture(scope="session")
def runs(tmp_path_factory) -> Runs:
    root = tmp_path_factory.mktemp("fsdp_runs")
    return Runs(train(1, root / "one", 4), train(2, root / "two", 4))
