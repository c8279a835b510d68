"""`rollplex train` with PPO mini-batches and epochs, end to end on CPU: the updates run,
the clip engages and is logged under verl's names; bad sizes end the run before any work,
naming the field."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.jobs.cli_run import rollplex_here

BASE = (
    "model=tiny",
    "workload=tiny",  # 4 prompts a step
    "hardware=cpu",
    "algo.lr=1e-3",
    "train.threads=1",
    "train.progress=false",
    "train.eval_every=0",
    "train.checkpoint_every=0",
)
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _train(run: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "rollplex.cli", "train", *BASE, *overrides]
    return subprocess.run(
        [*cmd, f"hydra.run.dir={run}"],
        capture_output=True,
        text=True,
        timeout=600,
        env=ENV,
        cwd=run.parent,
    )


@pytest.mark.slow
def test_ppo_mini_batches_train_and_log_the_clip(tmp_path: Path) -> None:
    run = tmp_path / "run"
    p = _train(run, "algo=ppo", "algo.ppo_mini_batch_size=2", "algo.ppo_epochs=2", "train.steps=2")
    assert p.returncode == 0, p.stderr
    rows = list(csv.DictReader((run / "metrics.csv").open()))
    assert len(rows) == 2
    assert all(float(r["ppo_updates"]) == 2 * 2 for r in rows)  # epochs x ceil(4 / 2)
    assert max(float(r["clip_frac"]) for r in rows) > 0
    assert all(r["clip_frac_lower"] != "" and r["ppo_kl"] != "" for r in rows)


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("algo.ppo_mini_batch_size=5", "algo.ppo_mini_batch_size=5 exceeds"),
        ("algo.ppo_epochs=0", "ppo_epochs"),
        ("algo.ppo_mini_batch_size=0", "ppo_mini_batch_size"),
    ],
)
def test_bad_sizes_end_the_run_before_any_work(
    tmp_path: Path, monkeypatch, capsys, override: str, field: str
):
    run = tmp_path / "run"  # refused from the spec: through rollplex.cli.main, in this process
    p = rollplex_here(
        tmp_path, monkeypatch, capsys, "train", *BASE, override, f"hydra.run.dir={run}"
    )
    assert p.returncode == 2
    assert "Traceback" not in p.stderr
    assert field in p.stderr, p.stderr
    assert not (run / "plan.json").exists()
