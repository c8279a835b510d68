"""`rollplex train backend.rollout=vllm` as a user runs it: the plan has one engine op and a
weight_sync after every optimizer step, whose measured time lands in calibration.json."""

from __future__ import annotations

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
