"""A torch-trained run plans its parameters in the dtype its torch roles hold them
(jobs/model_dtype.py), whatever its folder's config.json says; a command-line model.dtype
they would not hold is refused (tests/jobs/test_validate_run.py)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from rollplex.backends.torch.model import load_model, save_model
from rollplex.jobs.model_dtype import as_held
from rollplex.models import ensure_demo_folder, open_model_folder
from rollplex.specs import MODEL_PRESETS
from tests.jobs.cli_run import rollplex_here, torch_settings_kept
from tests.jobs.test_validate_run import spec


def test_a_bfloat16_preset_is_planned_in_float32_on_cpu_and_left_to_fsdp() -> None:
    bf16 = MODEL_PRESETS["qwen2_5_vl_3b"]
    assert bf16.dtype == "bfloat16"
    held, note = as_held(bf16, spec())
    assert held.dtype == "float32" and held.model_copy(update={"dtype": "bfloat16"}) == bf16
    assert "model.dtype=bfloat16" in note and "float32" in note
    assert as_held(bf16, spec(**{"train.device": "cuda"})) == (bf16, None)
    assert as_held(bf16, spec(**{"backend.trainer": "fsdp"})) == (bf16, None)


def test_a_bfloat16_folder_trained_on_cpu_is_planned_as_the_float32_it_runs(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    demo = ensure_demo_folder()
    folder = tmp_path / "bf16"
    spec_of_demo = open_model_folder(demo).spec
    save_model(load_model(demo, torch.bfloat16), spec_of_demo, folder, assets_from=demo)
    assert json.loads((folder / "config.json").read_text())["dtype"] == "bfloat16"
    run = tmp_path / "run"
    args = ("model=hub", f"model.path={folder}", "workload=tiny", "train.steps=1")
    args += ("train.eval_every=0", "train.progress=false", "train.threads=1")
    with torch_settings_kept():
        result = rollplex_here(
            tmp_path, monkeypatch, capsys, "train", *args, f"hydra.run.dir={run}"
        )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "model.dtype=bfloat16 (as its folder or preset says) is planned as float32" in (
        (run / "cli.log").read_text()
    )
    slots = json.loads((run / "plan.json").read_text())["devices"][0]["slots"]
    (weights,) = (s["size"] for s in slots if s["value"] == "policy.weights")
    llm = open_model_folder(folder).spec.model_copy(update={"dtype": "float32"})
    assert weights == llm.llm_param_count() * 4
