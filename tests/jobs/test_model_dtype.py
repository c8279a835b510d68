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
    run, resumed = tmp_path / "run", tmp_path / "resumed"
    args = ("model=hub", f"model.path={folder}", "workload=tiny")
    args += ("train.eval_every=0", "train.progress=false", "train.threads=1")

    def train(out: Path, *more: str):
        with torch_settings_kept():
            return rollplex_here(
                tmp_path, monkeypatch, capsys, "train", *args, *more, f"hydra.run.dir={out}"
            )

    result = train(run, "train.steps=1")
    assert result.returncode == 0, result.stderr[-2000:]
    # its checkpoint (planned float32, the folder bfloat16) resumes against the folder
    again = train(resumed, "train.steps=2", f"train.resume={run / 'checkpoints/step-000001'}")
    assert again.returncode == 0, again.stderr[-2000:]
    assert (resumed / "checkpoints/step-000002").is_dir()
    assert "model.dtype=bfloat16 (as its folder or preset says) is planned as float32" in (
        (run / "cli.log").read_text()
    )
    slots = json.loads((run / "plan.json").read_text())["devices"][0]["slots"]
    (weights,) = (s["size"] for s in slots if s["value"] == "policy.weights")
    llm = open_model_folder(folder).spec.model_copy(update={"dtype": "float32"})
    assert weights == llm.llm_param_count() * 4
