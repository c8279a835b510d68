"""Runs of the real CLI and of worker.py on gloo, each in its own processes (torchrun for
N > 1, plain python for 1), with a timeout; worker.py's checks share one launch per rank
count (CHECKS). Tiny model, few steps: the whole folder costs about five CPU-minutes
(~3 min on 2 cores with -n 2)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rollplex.specs import ModelSpec
from tests.once import once

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


# A rank aborting in torch's C++ runtime (a std::thread destroyed while joinable), seen once
# in CI under full CPU load after a checkpoint write and not reproduced in 6 reruns: one
# retry, from a clean run folder, with a warning in the test summary. Any other failure,
# or this one twice, fails the test.
ABORT = "terminate called without an active exception"


def launch(
    nproc: int, module: str, args: list[str], timeout: float = TIMEOUT_S, clean: Path | None = None
) -> str:
    """Run to the end; fail the test with the output if it fails or hangs."""
    for attempt in (1, 2):
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
        if p.returncode == 0:
            return p.stdout
        if attempt == 1 and ABORT in p.stderr:
            warnings.warn(
                f"{module} {args}: a rank aborted ({ABORT!r}); retried once", stacklevel=2
            )
            if clean is not None:
                shutil.rmtree(clean, ignore_errors=True)
            continue
        pytest.fail(f"{module} {args} on {nproc} processes exited {p.returncode}:\n{p.stderr}")
    raise AssertionError("unreachable")


def train(nproc: int, out: Path, steps: int, *extra: str) -> Path:
    launch(
        nproc,
        "rollplex.cli",
        ["train", *TRAIN, f"train.steps={steps}", *extra, f"hydra.run.dir={out}"],
        clean=out,
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
    """Made once per pytest run: three files on possibly different xdist workers read it."""

    def make(root: Path) -> None:
        train(1, root / "one", 4)
        train(2, root / "two", 4)

    root = once(tmp_path_factory, "fsdp_runs", make)
    return Runs(root / "one", root / "two")


# The README's share line with held-out evaluation on: test_equivalence compares what it
# trains, test_share_eval that every rank evaluated (evaluation draws nothing the training
# draws: test_disagg compares runs with and without it). One launch for both, ~15 s.
SHARE_TP2 = ("backend.fsdp.rollout_sync=share", "backend.fsdp.rollout_tp=2")


@pytest.fixture(scope="session")
def share_tp2(tmp_path_factory) -> Path:
    """2 ranks, rollout_sync=share with rollout TP 2, 2 steps, 8 held-out prompts after
    every step."""

    def make(root: Path) -> None:
        train(2, root / "tp2", 2, *SHARE_TP2, "train.eval_every=1", "train.eval_prompts=8")

    return once(tmp_path_factory, "share_tp2", make) / "tp2"


# -- worker.py checks, one launch per rank count ---------------------------------------------
# A launch's start (torchrun, every rank's torch/transformers imports, gloo) costs ~10 s of a
# 2-core machine, the checks ~1-3 s each: so every check of a rank count runs in one launch,
# each from a fresh model and plan (worker.py `batch`), and the tests read their reports.
# Name -> worker.py arguments ("{ckpt}": the 2-rank run's step-2 checkpoint, from `runs`).
SHARE = ("views", "--sync", "share", "--steps", "2")
CHECKS: dict[int, dict[str, tuple[str, ...]]] = {
    1: {
        "load": ("load", "--ckpt", "{ckpt}"),
        "views-alias": ("views", "--sync", "alias", "--steps", "2"),
        "share-tp1": (*SHARE, "--tp", "1"),
    },
    2: {
        "views": ("views", "--steps", "2"),
        "share-tp2": (*SHARE, "--tp", "2"),
        "share-tp1": (*SHARE, "--tp", "1"),
        "share-tp1-bf16": (*SHARE, "--tp", "1", "--dtype", "bfloat16"),
        "share-tp2-bf16": (*SHARE, "--tp", "2", "--dtype", "bfloat16"),
        "ppo": ("ppo", "--steps", "2"),  # test_ppo.py
        "ppo-micro": ("ppo", "--steps", "2", "--micro-tokens", "100"),  # 2 per rank
        "ppo-resume": ("ppo-resume", "--steps", "2", "--stop", "1"),  # test_ppo_resume.py
    },
    4: {
        "load": ("load", "--ckpt", "{ckpt}"),
        "views": ("views", "--steps", "2"),
        "share-tp2": (*SHARE, "--tp", "2"),
        "share-tp4-kv4": (*SHARE, "--tp", "4", "--kv-heads", "4"),
    },
}


@dataclass(frozen=True)
class Checks:
    """The --out file of each check of one launch (share checks: one file per rank)."""

    folder: Path
    nproc: int

    def out(self, name: str) -> Path:
        return self.folder / f"{name}.pt"

    def report(self, name: str) -> dict:
        return torch.load(self.out(name))

    def rank_reports(self, name: str) -> list[dict]:
        return [torch.load(self.out(name).with_suffix(f".rank{r}.pt")) for r in range(self.nproc)]


def launch_checks(tmp_path_factory, nproc: int, ckpt: Path | None = None) -> Checks:
    def make(folder: Path) -> None:
        jobs = []
        for name, args in CHECKS[nproc].items():
            args = tuple(str(ckpt) if a == "{ckpt}" else a for a in args)
            jobs.append(shlex.join([*args, "--out", str(folder / f"{name}.pt")]))
        launch(nproc, "tests.distributed.worker", ["batch", *jobs], timeout=TIMEOUT_S * 2)

    return Checks(once(tmp_path_factory, f"checks{nproc}", make), nproc)


@pytest.fixture(scope="session")
def checks1(tmp_path_factory, runs) -> Checks:
    return launch_checks(tmp_path_factory, 1, runs.two / "checkpoints" / "step-000002")


@pytest.fixture(scope="session")
def checks2(tmp_path_factory) -> Checks:
    return launch_checks(tmp_path_factory, 2)


@pytest.fixture(scope="session")
def checks4(tmp_path_factory, runs) -> Checks:
    return launch_checks(tmp_path_factory, 4, runs.two / "checkpoints" / "step-000002")
