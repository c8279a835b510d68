"""`rollplex train` on what users bring: a Hub-format folder, jsonl rows with images or
video frames, and clean exits (code 2, the file/row/field named, no model loaded) for bad
input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from tests.jobs.cli_run import rollplex_here, torch_settings_kept
from tests.models.demo_home import demo_home

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
SMALL = (
    "workload=tiny",
    "hardware=cpu",
    "workload.group_size=4",
    "workload.prompts_per_step=2",
    "train.threads=1",
    "train.progress=false",
    "train.max_new_tokens=2",
)


def rollplex(job: str, run: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "rollplex.cli", job, *overrides, f"hydra.run.dir={run}"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=ENV)


@pytest.fixture(scope="module")
def hub_folder(tmp_path_factory) -> Path:
    """A tiny Qwen2.5-VL folder written by transformers' save_pretrained (model, tokenizer,
    image processor): the demo recipe, freshly built (shared with tests/models)."""
    return demo_home(tmp_path_factory)[1]


@pytest.mark.slow  # ~30 s: three steps of a hub model
def test_three_steps_from_a_hub_folder_save_a_folder_transformers_loads(
    hub_folder, tmp_path, monkeypatch, capsys
):
    from transformers import Qwen2_5_VLForConditionalGeneration

    run = tmp_path / "run"
    # a user reward by import path: random answers all score 0 on exact match
    reward = "reward.components=[{name: 'tests.jobs.user_rewards:longer_is_better', weight: 1.0}]"
    with torch_settings_kept():  # in this process: what it checks is in the run folder
        done = rollplex_here(
            tmp_path, monkeypatch, capsys, "train", "model=hub", f"model.path={hub_folder}",
            "data=easyvqa", "train.steps=3", "train.eval_every=3", "train.eval_prompts=8",
            *SMALL, reward, f"hydra.run.dir={run}",
        )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    ckpt = run / "checkpoints" / "step-000003" / "model"
    saved = {}
    for shard in sorted(ckpt.glob("*.safetensors")):
        saved.update(load_file(shard))
    loaded = Qwen2_5_VLForConditionalGeneration.from_pretrained(ckpt, dtype=torch.float32)
    state = loaded.state_dict()
    initial = {}
    for shard in sorted(hub_folder.glob("*.safetensors")):
        initial.update(load_file(shard))
    moved = 0
    for name, tensor in saved.items():
        key = next(
            k
            for k in (
                name,
                f"model.{name}",
                name.replace("model.", "model.language_model.", 1),
                name.replace("visual.", "model.visual.", 1),
            )
            if k in state
        )
        assert torch.equal(state[key], tensor), name
        moved += not torch.equal(tensor, initial[name])
    assert moved > 0, "three optimizer steps changed no tensor"
    for f in ("tokenizer.json", "tokenizer_config.json", "preprocessor_config.json"):
        assert (ckpt / f).read_bytes() == (hub_folder / f).read_bytes(), f
    summary = json.loads((run / "summary.json").read_text())
    assert summary["eval_prompts"] == 8 and 0.0 <= summary["eval_accuracy_last"] <= 1.0
    scalars = "".join(p.name for p in (run / "tb").iterdir())
    assert "pt.trace.json" in scalars

    with torch_settings_kept():  # the eval job in this process: ~4 s of start-up less
        evaluated = rollplex_here(
            tmp_path, monkeypatch, capsys, "eval", "model=hub", f"model.path={ckpt.parent}",
            "data=easyvqa", "eval.prompts=8", "eval.max_new_tokens=2",
            reward,  # held-out accuracy is by the run's own reward, exact match beside it
            f"hydra.run.dir={tmp_path / 'eval'}",
        )  # fmt: skip
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    scored = json.loads((tmp_path / "eval" / "summary.json").read_text())
    assert scored["prompts"] == 8 and scored["accuracy"] == pytest.approx(
        summary["eval_accuracy_last"]
    ), "eval of the checkpoint must score the train job's last evaluation"
    by = "tests.jobs.user_rewards:longer_is_better"
    assert scored["scored_by"] == summary["eval_scored_by"] == by
    assert scored["exact_match_accuracy"] == pytest.approx(summary["eval_exact_match_last"])


def _png(path: Path, rgb: tuple[int, int, int]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (56, 56), rgb).save(path)
    return path.name if path.parent.name == "data" else f"{path.parent.name}/{path.name}"


def _rows(folder: Path, video: bool) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, (colour, rgb) in enumerate([("red", (220, 30, 30)), ("blue", (30, 30, 220))] * 2):
        if video:
            frames = [_png(folder / f"clip{i}" / f"f{k}.png", rgb) for k in range(4)]
            rows.append({"problem": "<video>What colour?", "answer": colour, "videos": [frames]})
        else:
            rows.append({"problem": "<image>What colour?", "answer": colour,
                         "images": [_png(folder / f"img{i}.png", rgb)]})  # fmt: skip
    path = folder / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("video", [False, True], ids=["images", "video_frames"])
def test_jsonl_rows_train_and_the_plan_is_sized_from_them(
    hub_folder, tmp_path, monkeypatch, capsys, video
):
    data = _rows(tmp_path / "data", video)
    run = tmp_path / "run"
    frames = ("workload.frames=4",) if video else ()
    with torch_settings_kept():  # in this process: no interpreter start-up, ~4 s a run
        done = rollplex_here(
            tmp_path, monkeypatch, capsys, "train", "model=hub", f"model.path={hub_folder}",
            "data=jsonl", f"data.path={data}", "train.steps=2", "train.eval_every=0", *SMALL,
            *frames, f"hydra.run.dir={run}",
        )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    shape = summary["workload_measured"]
    # 56x56 pixels, patch 14, merge 2: 4 tokens a frame pair (temporal patch 2)
    assert shape["visual_tokens"] == (8 if video else 4)
    assert shape["frames"] == (4 if video else 1)
    plan_workload = json.loads((run / "config.json").read_text())["workload"]
    assert summary["steps_run"] == 2 and plan_workload is not None


def _bad_folder(hub_folder: Path, tmp_path: Path, missing: str) -> Path:
    folder = tmp_path / "bad"
    folder.mkdir()
    for f in hub_folder.iterdir():
        if f.name != missing:
            (folder / f.name).symlink_to(f)
    return folder


@pytest.mark.parametrize(
    "case, message",
    [
        ("no_tokenizer", "tokenizer.json"),
        ("no_processor", "preprocessor_config.json"),
        ("missing_image", r"rows\.jsonl.*row 1.*images"),
        # Undecodable late in the set: found by the data pass, before any step or checkpoint.
        ("corrupt_image_at_row_17", r"rows\.jsonl row 17 field 'images': cannot decode"),
        ("answer_is_a_dict", r"rows\.jsonl row 2 field 'answer': an answer is text or a number"),
        ("no_answer_column", r"rows\.jsonl.*answer"),
        ("unknown_reward", "nope"),
    ],
)
def test_bad_input_exits_2_naming_it_before_any_model_loads(
    hub_folder, tmp_path, monkeypatch, capsys, case, message
):
    data = _rows(tmp_path / "data", video=False)
    folder = hub_folder
    extra: tuple[str, ...] = ()
    if case == "no_tokenizer":
        folder = _bad_folder(hub_folder, tmp_path, "tokenizer.json")
    elif case == "no_processor":
        folder = _bad_folder(hub_folder, tmp_path, "preprocessor_config.json")
    elif case == "missing_image":
        (tmp_path / "data" / "img1.png").unlink()
    elif case == "corrupt_image_at_row_17":
        rows = [json.loads(line) for line in data.read_text().splitlines() * 5]
        (tmp_path / "data" / "broken.png").write_bytes(b"\x89PNG not really")
        rows[17]["images"] = ["broken.png"]
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
        extra = ("train.checkpoint_every=1",)
    elif case == "answer_is_a_dict":
        rows = [json.loads(line) for line in data.read_text().splitlines()]
        rows[2]["answer"] = {"colour": "red"}
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif case == "no_answer_column":
        rows = [json.loads(line) for line in data.read_text().splitlines()]
        data.write_text(
            "".join(json.dumps({k: v for k, v in r.items() if k != "answer"}) + "\n" for r in rows)
        )
    elif case == "unknown_reward":
        extra = ("reward.components=[{name: nope, weight: 1.0}]",)
    before = {p: p.read_bytes() for p in (tmp_path / "data").rglob("*") if p.is_file()}
    args = (
        "model=hub", f"model.path={folder}", "data=jsonl", f"data.path={data}",
        "train.steps=1", *SMALL, *extra,
    )  # fmt: skip
    if case == "no_tokenizer":  # one case through a real process: the streams a user sees
        done = rollplex("train", tmp_path / "run", *args)
    else:  # the rest in this one (tests/jobs/cli_run.py): no interpreter start-up, ~3 s each
        run = f"hydra.run.dir={tmp_path / 'run'}"
        done = rollplex_here(tmp_path, monkeypatch, capsys, "train", *args, run)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    import re

    assert re.search(message, done.stderr), done.stderr[-2000:]
    assert "Loading weights" not in done.stderr, "a model was loaded before the error"
    assert not (tmp_path / "run" / "checkpoints").exists()
    after = {p: p.read_bytes() for p in (tmp_path / "data").rglob("*") if p.is_file()}
    assert after == before
