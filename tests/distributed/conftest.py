"""Runs of the real CLI and of worker.py on gloo, each launch in its own processes
(torchrun for N > 1, plain python for 1), with a timeout. The CLI runs tests compare are
one sweep per world size (RUNS), worker.py's checks one launch per rank count (CHECKS).
Tiny model, few steps."""

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
    nproc: int,
    module: str,
    args: list[str],
    timeout: float = TIMEOUT_S,
    clean: Path | None = None,
    failed_jobs: bool = False,
) -> str:
    """Run to the end; fail the test with the output if it fails or hangs (with
    `failed_jobs`, a sweep's exit 1 for runs that failed is not the launch's failure)."""
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
        swept = failed_jobs and p.returncode == 1 and "of the sweep failed" in p.stderr
        if p.returncode == 0 or swept:
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
    """One run in a launch of its own (the sweeps below hold the runs tests share)."""
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


# -- the CLI runs tests compare: one `rollplex train -m` sweep per world size -------------------
# A launch's start costs ~11 CPU-s of the 2-core machine (torchrun, every rank's imports,
# gloo), one more job in it ~6 (measured: a 2-rank train of 2 steps alone took 17.7 CPU-s,
# two of them in one sweep 24.1). So the runs of a world size are the jobs of one sweep,
# in order, each with its overrides in a config of the `variant` group (Hydra's experiment
# pattern), and a test reads its job's folder. Every job but the first runs in a process
# that ran others: state leaking from one job into the next would break the comparisons
# (and a sweep under torchrun is a user's ablation, tested here as such).
EVAL = ("train.eval_every=1", "train.eval_prompts=4")  # held-out accuracy after every step
SUM_NORM = ("algo.loss_agg_mode=seq-mean-token-sum-norm", "algo.loss_scale_factor=8")
# the README's share line, with held-out evaluation on: test_equivalence compares what it
# trains, test_share_eval that every rank evaluated
SHARE_TP2 = ("backend.fsdp.rollout_sync=share", "backend.fsdp.rollout_tp=2")
MICRO = "schedule.train_micro_tokens=1000"  # 2 micro-batches a rank: test_micro_batches


def pooled(world: int, rollout: int, steps: int = 2, *extra: str) -> tuple[str, ...]:
    """test_disagg's runs: `rollout` rollout ranks, the others trainers."""
    pools = (f"hardware.num_gpus={world}", f"schedule.rollout_gpus={rollout}")
    return ("schedule=disaggregated", *pools, f"train.steps={steps}", *extra)


# world size -> job name -> overrides ("{sweep}": the sweep's folder)
RUNS: dict[int, dict[str, tuple[str, ...]]] = {
    1: {
        "one": ("train.steps=4",),
        "alias": ("train.steps=4", "backend.fsdp.rollout_sync=alias"),
        "sum-norm": ("train.steps=2", *SUM_NORM),
        # test_disagg's reference (2 more steps: the resumed pooled run's)
        "serial": ("train.steps=4", "schedule=serial", *EVAL),
    },
    2: {
        "two": ("train.steps=4",),
        "tp2": ("train.steps=2", *SHARE_TP2, "train.eval_every=1", "train.eval_prompts=8"),
        "micro-kept": ("train.steps=2", MICRO),
        # each micro-batch's forward runs again inside the backward
        "micro-recompute": ("train.steps=2", MICRO, "schedule.train_micro_recompute=true"),
        # only there: each rank's loss is rescaled to the global batch's after the backward
        "micro-fused": ("train.steps=2", MICRO, "schedule.train_micro_fused=true"),
        "sum-norm": ("train.steps=2", *SUM_NORM),
        # algo.skip_zero_advantage resolves on; FSDP trains every row (test_skip_under_fsdp)
        "no-kl": ("train.steps=2", "algo.kl_coef=0"),
        "pooled": pooled(2, 1, 2, *EVAL),
        # from the pooled job's step-2 checkpoint, to step 4; the launch's second pooled job
        # (one that left the process group destroyed made this one's ranks wait forever)
        "pooled-resumed": pooled(2, 1, 4, "train.resume={sweep}/pooled/checkpoints/step-000002"),
    },
    3: {"pooled-1": pooled(3, 1), "pooled-2": pooled(3, 2)},  # 1 + 2 and 2 + 1 ranks
}


def variant_config(overrides: tuple[str, ...], sweep: Path) -> str:
    """A `variant` config (yaml) applying `overrides` to the whole config."""
    from omegaconf import OmegaConf

    from rollplex.jobs.conf import conf_dir
    from rollplex.jobs.overrides import groups

    presets = groups(conf_dir())
    lines = [o.replace("{sweep}", str(sweep)) for o in overrides]
    chosen = [o.split("=", 1) for o in lines if o.split("=", 1)[0] in presets]
    values = OmegaConf.from_dotlist([o for o in lines if o.split("=", 1)[0] not in presets])
    body = OmegaConf.to_container(values)
    if chosen:
        body = {"defaults": [{f"override /{g}": v} for g, v in chosen], **body}
    return "# @package _global_\n" + OmegaConf.to_yaml(body)


@dataclass(frozen=True)
class Sweep:
    """The run folders of one world size's sweep."""

    folder: Path

    def __call__(self, name: str) -> Path:
        """Job `name`'s run folder; fails the test with the job's reason if the job failed."""
        run = self.folder / name
        summary = run / "summary.json"
        if not summary.exists():
            pytest.fail(f"run '{name}' of the {self.folder} sweep wrote no summary.json")
        status = json.loads(summary.read_text())
        if status.get("status") == "failed":
            pytest.fail(f"run '{name}' of the {self.folder} sweep failed: {status['error']}")
        return run


def sweep(tmp_path_factory, nproc: int) -> Sweep:
    """RUNS[nproc], made once for the whole pytest run."""

    def make(root: Path) -> None:
        jobs, out = RUNS[nproc], root / "runs"
        # the command line's overrides win over any config: a key some job sets goes into
        # every job's config instead, TRAIN's value first
        keys = {o.split("=", 1)[0] for overrides in jobs.values() for o in overrides}
        common = [a for a in TRAIN if a.split("=", 1)[0] not in keys]
        base = tuple(a for a in TRAIN if a not in common)
        (root / "variant").mkdir()
        for name, overrides in jobs.items():
            config = variant_config((*base, *overrides), out)
            (root / "variant" / f"{name}.yaml").write_text(config)
        args = [
            "train", "-m", *common, f"+variant={','.join(jobs)}",
            f"hydra.searchpath=[file://{root}]",
            f"hydra.sweep.dir={out}", "hydra.sweep.subdir=${hydra:runtime.choices.variant}",
        ]  # fmt: skip
        # exit 1: a job failed and the sweep went on; its tests fail with its reason (Sweep)
        launch(nproc, "rollplex.cli", args, TIMEOUT_S + 60 * len(jobs), clean=out, failed_jobs=True)

    return Sweep(once(tmp_path_factory, f"runs{nproc}", make) / "runs")


@pytest.fixture(scope="session")
def runs1(tmp_path_factory) -> Sweep:
    return sweep(tmp_path_factory, 1)


@pytest.fixture(scope="session")
def runs2(tmp_path_factory) -> Sweep:
    return sweep(tmp_path_factory, 2)


@pytest.fixture(scope="session")
def runs3(tmp_path_factory) -> Sweep:
    return sweep(tmp_path_factory, 3)


@dataclass(frozen=True)
class Runs:
    one: Path  # 1 process, gather sync
    two: Path  # torchrun, 2 gloo ranks


@pytest.fixture(scope="session")
def runs(runs1, runs2) -> Runs:
    """The plain job of 4 steps on 1 process and on 2 ranks."""
    return Runs(runs1("one"), runs2("two"))


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
