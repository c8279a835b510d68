"""decode_once in `rollplex train` as a user runs it (tiny model, CPU, seeded): the default
plan takes it (the log and the plan say so), and the run trains what the same run with
`schedule.decode_once=false` trains: the same metrics per step and the same final weights
to the replay's rounding (tests/backends/torch/test_decode_once_step.py says how much)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.jobs.cli_run import rollplex_here, torch_settings_kept
from tests.jobs.test_train import BASE

STEPS = 4
# a reward that varies across a random policy's 3-token samples: advantages are not zero.
# (Where every reward is equal and the policy is the reference, the true gradient is 0:
# the separate forward, the same kernels as the reference's, gets exactly 0, decode once
# its rounding (1e-6 in logprobs), which Adam, dividing by |g| + 1e-8, turns into a full
# step of lr: the two runs part there, neither wrong.)
REWARD = "reward.components=[{name: 'tests.jobs.user_rewards:longer_is_better', weight: 1.0}]"


def _run(monkeypatch, capsys, root: Path, algo: str, once: bool) -> Path:
    """In this process (test_train's BASE): both runs alike, ~4 s of start-up less each; the
    peak read below is the executor's own count of resident tensors, not the RSS."""
    run = root / f"{algo}-{once}"
    with torch_settings_kept():
        p = rollplex_here(
            root, monkeypatch, capsys, "train", *BASE, f"algo={algo}",
            f"schedule.decode_once={str(once).lower()}", REWARD, f"train.steps={STEPS}",
            f"train.checkpoint_every={STEPS}", "train.max_new_tokens=3", f"hydra.run.dir={run}",
        )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    return run


def _metrics(run: Path) -> list[dict[str, str]]:
    with (run / "metrics.csv").open() as f:
        return list(csv.DictReader(f))


@pytest.mark.slow  # two short runs (in this process: ~5 s)
# GRPO end to end through the CLI; RLOO and PPO run the same path at the executor level
# (tests/backends/torch/test_decode_once_step.py), so a second CLI pair only adds ~20 s
@pytest.mark.parametrize("algo", ["grpo"])
def test_decode_once_trains_what_the_response_forward_trains(monkeypatch, capsys, tmp_path, algo):
    on = _run(monkeypatch, capsys, tmp_path, algo, True)
    off = _run(monkeypatch, capsys, tmp_path, algo, False)
    summary = json.loads((on / "summary.json").read_text())
    assert summary["measured_peak_resident_bytes"] <= summary["plan_peak_bytes"]
    rows_on, rows_off = _metrics(on), _metrics(off)
    assert len(rows_on) == len(rows_off) == STEPS
    assert all(0 < float(r["reward"]) < 1 for r in rows_on)  # a learning signal each step
    for a, b in zip(rows_on, rows_off, strict=True):
        assert a.keys() == b.keys()
        for k in a:
            if k.endswith("_s") or "bytes" in k or not b[k]:
                assert bool(a[k]) == bool(b[k]), k
                continue  # timings and memory, not the math; metrics neither run logs
            assert float(a[k]) == pytest.approx(float(b[k]), rel=1e-4, abs=1e-6), k
    ckpt = f"checkpoints/step-{STEPS:06d}/model/model.safetensors"
    w_on, w_off = load_file(on / ckpt), load_file(off / ckpt)
    assert w_on.keys() == w_off.keys()
    # Adam turns a gradient element's rounding into up to lr * delta / (|g| + 1e-8): the
    # few elements with gradients near 1e-8 (rare tokens' embedding rows) differ by a few
    # % of one step (measured: 3 of 56k elements over 2e-5, at most 4.5e-5; lr 1e-3), the
    # rest by ~1e-6
    moved = 0
    for n, w in w_off.items():
        torch.testing.assert_close(w_on[n], w, atol=1e-4, rtol=0, msg=n)
        assert (w_on[n] - w).abs().mean() < 1e-6, n
        moved += int((w_on[n] - w).abs().gt(2e-5).sum())
    assert moved <= 1e-3 * sum(w.numel() for w in w_off.values())
