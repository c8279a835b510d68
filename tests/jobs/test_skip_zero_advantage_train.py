"""algo.skip_zero_advantage in `rollplex train` as a user runs it (tiny model, CPU, seeded,
kl_coef=0, a 0/1 reward that leaves some groups all equal): the run that skips those groups'
rows trains what the run that trains every row trains (rewards, loss, final weights), logs
how many rows it trained, and leaves the steps that skipped out of its calibration file (the
plan priced every row)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.jobs.cli_run import rollplex_here, torch_settings_kept
from tests.jobs.test_decode_once_train import _metrics
from tests.jobs.test_train import BASE

STEPS = 4
ROWS = 16  # workload=tiny: 4 prompts x G=4
REWARD = (
    "reward.components=[{name: 'tests.jobs.user_rewards:at_least_six_characters', weight: 1.0}]"
)


def _run(monkeypatch, capsys, root: Path, skip: bool) -> Path:
    run = root / f"skip-{skip}"
    with torch_settings_kept():
        p = rollplex_here(
            root, monkeypatch, capsys, "train", *BASE, "algo.kl_coef=0",
            f"algo.skip_zero_advantage={str(skip).lower()}", REWARD, f"train.steps={STEPS}",
            f"train.checkpoint_every={STEPS}", "train.max_new_tokens=3", "workload.group_size=4",
            f"hydra.run.dir={run}",
        )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    return run


def _calibrated(run: Path) -> Counter[str]:
    entries = json.loads((run / "calibration.json").read_text())["entries"]
    return Counter(e["kind"] for e in entries)


@pytest.mark.slow  # two short runs (in this process: ~5 s)
def test_skipping_trains_what_every_row_trains(monkeypatch, capsys, tmp_path):
    on = _run(monkeypatch, capsys, tmp_path, True)
    off = _run(monkeypatch, capsys, tmp_path, False)
    rows_on, rows_off = _metrics(on), _metrics(off)
    trained = [float(r["trained_rows"]) for r in rows_on]
    assert any(0 < t < ROWS for t in trained), trained  # some groups were skipped
    assert all(r["trained_rows"] == "" for r in rows_off)
    for a, b in zip(rows_on, rows_off, strict=True):
        for k in ("reward", "loss", "pg_loss", "response_length"):
            assert float(a[k]) == pytest.approx(float(b[k]), rel=1e-4, abs=1e-6), k
    ckpt = f"checkpoints/step-{STEPS:06d}/model/model.safetensors"
    w_on, w_off = load_file(on / ckpt), load_file(off / ckpt)
    assert w_on.keys() == w_off.keys()
    for n, w in w_off.items():  # Adam's rounding on near-0 gradients: see test_decode_once_train
        torch.testing.assert_close(w_on[n], w, atol=1e-4, rtol=0, msg=n)
        assert (w_on[n] - w).abs().mean() < 1e-6, n
    # the steps that skipped rows are not the plan's price: left out of the calibration
    skipped = sum(t < ROWS for t in trained[-3:])  # calibration.json: the last 3 steps
    for kind in ("attach_response", "backward"):
        assert _calibrated(on)[kind] == _calibrated(off)[kind] - skipped, kind
