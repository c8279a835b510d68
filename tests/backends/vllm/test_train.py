"""`rollplex train backend.rollout=vllm` as a user runs it: the plan has one engine op and a
weight_sync after every optimizer step, whose measured time lands in calibration.json; the
engine's logprobs reach the loss's rollout correction."""

from __future__ import annotations

import csv
import json

import pytest

from tests.backends.vllm.conftest import needs_vllm
from tests.jobs.cli_run import rollplex_in_process

pytestmark = needs_vllm


@pytest.mark.slow  # ~15 s: a run on CPU vLLM
def test_train_with_vllm_rollout(tmp_path):
    run = tmp_path / "run"
    args = [
        "train",
        "model=tiny",
        "workload=tiny",
        "hardware=cpu",
        "backend.rollout=vllm",
        # the engine's own logprobs, weighed against the trainer's (rollout correction)
        "backend.vllm.return_logprobs=true",
        "algo.rollout_correction.rollout_is=token",
        "train.steps=2",
        "train.eval_prompts=8",  # held-out accuracy still runs, on 8 prompts: no figure read
        "train.threads=1",
        "train.progress=false",
        f"hydra.run.dir={run}",
    ]
    # in this process (the engine is shut down at the run's end, as another may start in
    # it): what the test reads is in the run folder
    p = rollplex_in_process(tmp_path, *args)
    assert p.returncode == 0, p.stderr[-3000:]
    config = json.loads((run / "config.json").read_text())
    assert config["backend"]["rollout"] == "vllm"
    plan = (run / "plan.json").read_text()
    assert '"generate"' in plan and '"prefix_prefill"' not in plan
    calib = json.loads((run / "calibration.json").read_text())["entries"]
    syncs = [e for e in calib if e["kind"] == "weight_sync"]
    assert len(syncs) == 2 and all(e["measured_s"] > 0 and e["bytes"] > 0 for e in syncs)
    assert (run / "checkpoints" / "step-000002").is_dir()
    # vLLM-CPU in fp32 samples from the trainer's distribution, to rounding: ~1e-7 nats a
    # token (bench/results/rollout_correction_cpu.md), every weight ~1. (An engine that
    # returned no logprobs would have stopped the loss with a BackendError.)
    with (run / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2
    for row in rows:
        assert abs(float(row["mismatch_kl"])) < 1e-4
        assert abs(float(row["rollout_is_mean"]) - 1) < 1e-4
