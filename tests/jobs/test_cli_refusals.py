"""Bad command lines and bad inputs: exit code 2 and one line naming the culprit, before
any model loads (issue 34's audit cases), for every config group and every job."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollplex.cli import JOBS, _conf_dir
from rollplex.jobs.overrides import groups
from tests.jobs.cli_run import cuda_available, refusal_line, rollplex, rollplex_here

GROUPS = groups(_conf_dir())


def test_unknown_job_is_named_with_the_jobs(tmp_path: Path) -> None:
    line = refusal_line(rollplex(tmp_path, "foo"))
    assert "'foo'" in line and all(job in line for job in JOBS)


@pytest.mark.parametrize("group", sorted(GROUPS))
@pytest.mark.parametrize("job", ["graph", "train"])
def test_unknown_preset_lists_the_presets(
    tmp_path: Path, monkeypatch, capsys, group: str, job: str
) -> None:
    line = refusal_line(rollplex_here(tmp_path, monkeypatch, capsys, job, f"{group}=nope9"))
    assert f"{group} 'nope9'" in line
    assert all(name in line for name in GROUPS[group])
    assert not (tmp_path / "outputs").exists()  # refused before Hydra made a folder


def test_unknown_preset_in_a_sweep_is_named(tmp_path: Path, monkeypatch, capsys) -> None:
    r = rollplex_here(tmp_path, monkeypatch, capsys, "plan", "-m", "schedule=serial,nope9")
    line = refusal_line(r)
    assert "schedule 'nope9'" in line and "disaggregated" in line
    assert not (tmp_path / "multirun").exists()


@pytest.mark.parametrize(
    "key, siblings",
    [
        ("foo", ["model", "train", "schedule"]),
        ("train.stepz", ["steps", "eval_every"]),
        ("workload.response_length.mx", ["max", "mean"]),
        ("backend.vllm.wieghts", ["weights", "dtype"]),
    ],
)
def test_unknown_key_lists_the_keys(
    tmp_path: Path, monkeypatch, capsys, key: str, siblings: list[str]
) -> None:
    line = refusal_line(rollplex_here(tmp_path, monkeypatch, capsys, "plan", f"{key}=1"))
    assert f"'{key}'" in line and all(s in line for s in siblings), line
    assert not (tmp_path / "outputs").exists()


def test_unknown_key_through_the_real_entry_point(tmp_path: Path) -> None:
    """The exit code a shell sees (Hydra alone exits 1 here)."""
    line = refusal_line(rollplex(tmp_path, "graph", "train.stepz=3"))
    assert "'train.stepz'" in line


def test_a_sweep_without_multirun_is_refused(tmp_path: Path, monkeypatch, capsys) -> None:
    line = refusal_line(rollplex_here(tmp_path, monkeypatch, capsys, "plan", "schedule=a,b"))
    assert "schedule=a,b" in line and "-m" in line


@pytest.mark.parametrize("job", ["plan", "train"])
def test_float64_blames_the_field(tmp_path: Path, monkeypatch, capsys, job: str) -> None:
    line = refusal_line(rollplex_here(tmp_path, monkeypatch, capsys, job, "model.dtype=float64"))
    assert "'model.dtype'" in line and "float64" in line


@pytest.mark.parametrize("content", ["[1, 2]", '"qwen"', "3"])
def test_hub_config_that_is_not_an_object(
    tmp_path: Path, monkeypatch, capsys, content: str
) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(content)
    r = rollplex_here(tmp_path, monkeypatch, capsys, "train", "model=hub", f"model.path={folder}")
    line = refusal_line(r)
    assert str(folder / "config.json") in line and "not an object" in line


@pytest.mark.parametrize("job", ["plan", "train"])
def test_calibration_folder_is_named(tmp_path: Path, monkeypatch, capsys, job: str) -> None:
    folder = tmp_path / "cal"
    folder.mkdir()
    line = refusal_line(rollplex_here(tmp_path, monkeypatch, capsys, job, f"calibration={folder}"))
    assert f"'{folder}'" in line and "a folder" in line
    assert not list(tmp_path.glob("outputs/*/*/plan.json"))  # refused before planning


@pytest.mark.parametrize(
    "job, device, words",
    [
        ("train", "tpu", "not a device"),
        ("train", "cuda:x", "not a device"),
        ("eval", "tpu", "not a device"),
        ("train", "meta", "cpu or cuda"),
    ],
)
def test_bad_device_is_named(
    tmp_path: Path, monkeypatch, capsys, job: str, device: str, words: str
) -> None:
    r = rollplex_here(tmp_path, monkeypatch, capsys, job, f"{job}.device={device}")
    line = refusal_line(r)
    assert f"{job}.device={device}" in line and words in line, line


@pytest.mark.parametrize("job", ["train", "eval"])
def test_cuda_without_cuda_is_refused_at_once(
    tmp_path: Path, monkeypatch, capsys, job: str
) -> None:
    if cuda_available():
        pytest.skip("this machine has CUDA: the refusal is for one without")
    line = refusal_line(rollplex_here(tmp_path, monkeypatch, capsys, job, f"{job}.device=cuda"))
    assert f"{job}.device=cuda" in line and ("CPU-only" in line or "no CUDA device" in line)
    assert not list(tmp_path.glob("outputs/*/*/plan.json"))  # nothing loaded or planned


def _jsonl(path: Path, answers: list[object]) -> Path:
    rows = [{"problem": f"question {i}?", "answer": a} for i, a in enumerate(answers)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize(
    "answers, row",
    [
        ([{"a": 1}], 0),
        (["yes", [1, 2]], 1),
        (["yes", "no", True], 2),
        (["yes", 3, 2.5, {"x": [1]}], 3),
    ],
)
def test_answer_that_is_not_text_or_a_number_names_the_row(
    tmp_path: Path, monkeypatch, capsys, answers: list[object], row: int
) -> None:
    data = _jsonl(tmp_path / "rows.jsonl", answers)
    r = rollplex_here(tmp_path, monkeypatch, capsys, "train", "data=jsonl", f"data.path={data}")
    line = refusal_line(r)
    assert f"{data} row {row} field 'answer'" in line and "text or a number" in line, line


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_empty_jsonl_is_named(tmp_path: Path, monkeypatch, capsys, content: str) -> None:
    data = tmp_path / "empty.jsonl"
    data.write_text(content)
    r = rollplex_here(tmp_path, monkeypatch, capsys, "train", "data=jsonl", f"data.path={data}")
    line = refusal_line(r)
    assert str(data) in line and "no rows" in line, line
