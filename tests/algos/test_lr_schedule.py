"""The policy's learning rate per update (algos/lr_schedule.py): a linear warm-up from 0,
then constant or a cosine to min_lr_ratio at the run's last update; the train job spans the
cosine over its updates and logs the rate each step."""

from __future__ import annotations

import csv
import itertools
import json

import pytest

from rollplex.algos.lr_schedule import lr_at
from rollplex.specs import AlgoSpec
from tests.jobs.cli_run import rollplex_here, torch_settings_kept


@pytest.mark.parametrize("warmup", [0, 1, 3, 10])
@pytest.mark.parametrize("floor", [0.0, 0.1, 1.0])
@pytest.mark.parametrize("total", [10, 40])
def test_warm_up_then_a_cosine_down_to_its_floor(warmup, floor, total):
    a = AlgoSpec(lr=2e-6, lr_warmup_steps=warmup, lr_schedule="cosine", min_lr_ratio=floor,
                 lr_total_updates=total)  # fmt: skip
    lrs = [lr_at(a, u) for u in range(total + 5)]
    rising, falling = lrs[: warmup + 1], lrs[warmup:]
    assert lrs[0] == (0.0 if warmup else a.lr)  # the first update at warm-up's start
    assert all(x < y for x, y in itertools.pairwise(rising))
    assert lrs[warmup] == pytest.approx(a.lr)
    assert all(x >= y - 1e-18 for x, y in itertools.pairwise(falling))
    assert lrs[max(total, warmup)] == pytest.approx(
        max(floor, 0.0) * a.lr if total > warmup else a.lr
    )
    assert min(falling) >= floor * a.lr - 1e-18  # never below the floor, past the end too


def test_constant_keeps_lr_after_warm_up_and_cosine_needs_its_span():
    a = AlgoSpec(lr=1e-5, lr_warmup_steps=4)
    assert [lr_at(a, u) for u in range(6)] == pytest.approx([0, 2.5e-6, 5e-6, 7.5e-6, 1e-5, 1e-5])
    with pytest.raises(ValueError, match="lr_total_updates"):
        lr_at(AlgoSpec(lr_schedule="cosine"), 3)


COSINE = ("algo.lr_warmup_steps=2", "algo.lr_schedule=cosine", "algo.min_lr_ratio=0.1")


def _train(tmp_path, monkeypatch, capsys, run, *more: str) -> None:
    with torch_settings_kept():
        done = rollplex_here(
            tmp_path, monkeypatch, capsys, "train", "train.steps=4", "train.progress=false",
            *COSINE, "train.eval_every=0", f"hydra.run.dir={run}", *more,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]


def test_the_train_job_spans_the_cosine_over_its_updates_and_logs_each_rate(
    tmp_path, monkeypatch, capsys
):
    run = tmp_path / "run"
    _train(tmp_path, monkeypatch, capsys, run, "train.checkpoint_every=2")
    algo = AlgoSpec.model_validate(json.loads((run / "config.json").read_text())["algo"])
    assert algo.lr_total_updates == 4  # 4 steps x one update
    rows = list(csv.DictReader((run / "metrics.csv").open()))
    logged = [float(r["lr"]) for r in rows]
    assert logged == pytest.approx([lr_at(algo, u) for u in range(4)])
    assert logged[0] == 0.0 and logged[2] == pytest.approx(algo.lr)

    # resumed from step 2, the run continues the same curve
    again = tmp_path / "again"
    resume = f"train.resume={run / 'checkpoints' / 'step-000002'}"
    _train(tmp_path, monkeypatch, capsys, again, resume, "train.checkpoint_every=0")
    rows = list(csv.DictReader((again / "metrics.csv").open()))
    assert [float(r["lr"]) for r in rows if int(r["step"]) > 2] == pytest.approx(logged[2:])
