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


def _run(monkeypatch, capsys, root: Path, skip: bool, updates: tuple[str, ...]) -> Path:
    run = root / f"skip-{skip}"
    with torch_settings_kept():
        p = rollplex_here(
            root, monkeypatch, capsys, "train", *BASE, "algo.kl_coef=0", *updates,
            f"algo.skip_zero_advantage={str(skip).lower()}", REWARD, f"train.steps={STEPS}",
            f"train.checkpoint_every={STEPS}", "train.max_new_tokens=3", "workload.group_size=4",
            f"hydra.run.dir={run}",
        )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    return run


def _calibrated(run: Path) -> Counter[str]:
    entries = json.loads((run / "calibration.json").read_text())["entries"]
    return Counter(e["kind"] for e in entries)


# one update a step (the rollout's logprobs are the old ones), and PPO-style mini-batches
# over 2 epochs (an old-logprob forward, which skips the dead rows too, then 4 updates)
UPDATES = {"one": (), "mini_batches": ("algo.ppo_mini_batch_size=2", "algo.ppo_epochs=2")}


@pytest.mark.slow  # two short runs each (in this process: ~5 s)
@pytest.mark.parametrize("updates", list(UPDATES))
def test_skipping_trains_what_every_row_trains(monkeypatch, capsys, tmp_path, updates):
    on = _run(monkeypatch, capsys, tmp_path, True, UPDATES[updates])
    off = _run(monkeypatch, capsys, tmp_path, False, UPDATES[updates])
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
    # (one update a step: its forward and backward each once; calibration.json holds the
    # last 3 steps)
    skipped = sum(t < ROWS for t in trained[-3:])
    kinds = ("attach_response", "backward") if updates == "one" else ("backward",)
    for kind in kinds:
        fewer = _calibrated(off)[kind] - _calibrated(on)[kind]
        assert fewer == skipped if updates == "one" else fewer > 0, kind
