"""Layouts the algebra cannot serve: a ValueError naming the tensor and both layouts,
raised before anything is counted; through the CLI, exit code 2 and one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from rollplex.specs import MODEL_PRESETS
from rollplex.specs.weights import WeightsSpec
from rollplex.weights import LayoutError, build_sharing


@pytest.mark.parametrize(
    "model, fields, names",
    [
        (  # 28 query heads over 8 ranks
            "qwen2_5_vl_7b",
            dict(train_fsdp=8, rollout_tp=8),
            ["qkv_proj.weight", "28 query heads", "rollout tp=8", "train fsdp=8"],
        ),
        (  # vLLM's vision MLP (3420 wide) cannot split 8 ways: ask for it anyway
            "qwen2_5_vl_32b",
            dict(train_fsdp=8, rollout_tp=8, vision="tp"),
            ["visual.blocks.0.mlp.gate_up_proj.weight", "3420 rows", "vision=tp"],
        ),
        (  # 12 ranks split neither the 40 query heads nor the 8 KV heads
            "qwen2_5_vl_32b",
            dict(train_fsdp=12, rollout_tp=12, vision="replicated"),
            ["qkv_proj.weight", "rollout tp=12"],
        ),
        (  # training TP must give each rank whole KV heads
            "qwen2_5_vl_3b",
            dict(train_fsdp=1, train_tp=4, rollout_tp=1),
            ["k_proj.weight", "training TP 4", "2 heads", "train fsdp=1 tp=4"],
        ),
        (  # a GPU used twice
            "qwen2_5_vl_32b",
            dict(train_fsdp=4, rollout_tp=2, rank_map=[[0, 1], [1, 3]]),
            ["rank map", "[0, 1, 1, 3]", "replicas=[0,1] [1,3]"],
        ),
        (  # a replica of the wrong size
            "qwen2_5_vl_32b",
            dict(train_fsdp=4, rollout_tp=2, rank_map=[[0, 1, 2], [3]]),
            ["replica [0, 1, 2] has 3 GPUs", "rollout TP is 2"],
        ),
    ],
)
def test_error_names_the_tensor_and_layouts(model: str, fields: dict, names: list[str]) -> None:
    with pytest.raises(LayoutError) as err:
        build_sharing(MODEL_PRESETS[model], WeightsSpec(**fields))
    for name in names:
        assert name in str(err.value)


def test_spec_rejects_a_rollout_that_does_not_fill_the_gpus() -> None:
    with pytest.raises(ValidationError, match="rollout_tp=16 does not divide the 8"):
        WeightsSpec(train_fsdp=8, rollout_tp=16)
    with pytest.raises(ValidationError, match="rollout_replicas=3"):
        WeightsSpec(train_fsdp=8, rollout_tp=4, rollout_replicas=3)


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rollplex.cli", "weights", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(Path(__file__).resolve().parents[2]), "PATH": "/usr/bin:/bin"},
    )


def test_cli_exits_2_with_one_line(tmp_path: Path) -> None:
    p = _cli(tmp_path, "model=qwen2_5_vl_7b", "weights.train_fsdp=8", "weights.rollout_tp=8")
    assert p.returncode == 2
    (line,) = p.stderr.strip().splitlines()
    assert "qkv_proj.weight" in line and "rollout tp=8" in line and "Traceback" not in p.stderr


def test_cli_writes_the_summary_and_table(tmp_path: Path) -> None:
    p = _cli(tmp_path, "model=qwen2_5_vl_32b", "weights.train_fsdp=8", "weights.rollout_tp=8")
    assert p.returncode == 0, p.stderr
    (out,) = (tmp_path / "outputs" / "weights").iterdir()
    s = json.loads((out / "summary.json").read_text())
    assert 0 < s["shared_fraction"] < 1
    assert s["rebuild_bytes_per_gpu"] < s["full_copy_bytes_per_gpu"]
    assert s["saved_bytes_per_gpu"] + s["rebuild_bytes_per_gpu"] >= s["full_copy_bytes_per_gpu"]
    assert "qkv_proj.weight" in (out / "weights.md").read_text()
    assert "shared fraction" in p.stdout
