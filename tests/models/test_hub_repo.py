"""`model.path` as a Hub repo id: the spec reads the repo's config.json, the run fetches the
files it reads into huggingface_hub's cache once, and a repo it cannot fetch is refused
naming model.path. huggingface_hub's two fetchers are replaced by the local demo folder:
no test downloads."""

from __future__ import annotations

import json
from pathlib import Path

import huggingface_hub
import pytest
from huggingface_hub.errors import LocalEntryNotFoundError

from rollplex.models import open_model_folder
from rollplex.specs.hub_repo import FILES, looks_like_repo_id, repo_folder
from rollplex.specs.model import ModelSpec
from tests.jobs.cli_run import rollplex_here, torch_settings_kept
from tests.jobs.test_train_real import SMALL

REPO = "someorg/tiny-qwen-vl"


@pytest.fixture
def hub_cache(built, monkeypatch) -> list[tuple]:
    """huggingface_hub's fetchers, serving the demo folder as REPO; the calls they got."""
    folder, calls = built[1], []

    def snapshot_download(repo_id: str, allow_patterns=None, **_):
        calls.append(("snapshot", repo_id, tuple(allow_patterns or ())))
        if repo_id != REPO:
            raise LocalEntryNotFoundError("cannot find the requested files in the local cache")
        return str(folder)

    def hf_hub_download(repo_id: str, filename: str, **_):
        calls.append(("file", repo_id, filename))
        return str(Path(snapshot_download(repo_id)) / filename)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", hf_hub_download)
    repo_folder.cache_clear()
    yield calls
    repo_folder.cache_clear()


def test_only_org_slash_name_with_no_such_folder_is_a_repo_id(tmp_path, monkeypatch):
    assert looks_like_repo_id("Qwen/Qwen2.5-VL-3B-Instruct")
    for path in ("/abs/Qwen", "./org/name", "org/name/more", "../org", "name", "org/"):
        assert not looks_like_repo_id(path), path
    (tmp_path / "org" / "name").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert not looks_like_repo_id("org/name")  # a folder here wins


def test_the_spec_reads_the_repos_config_and_keeps_its_id(hub_cache, built):
    spec = ModelSpec.model_validate({"name": "hub", "path": REPO})
    assert (spec.name, spec.path) == ("tiny-qwen-vl", REPO)
    assert hub_cache == [("file", REPO, "config.json"), ("snapshot", REPO, ())]
    config = json.loads((built[1] / "config.json").read_text())
    assert spec.hidden_size == config["text_config"]["hidden_size"]


def test_the_folder_is_fetched_once_with_only_the_files_a_run_reads(hub_cache, built):
    first = open_model_folder(REPO)
    again = open_model_folder(REPO)
    assert first.path == again.path == built[1].resolve()
    assert first.spec.name == "tiny-qwen-vl"
    assert [c for c in hub_cache if c[0] == "snapshot"] == [("snapshot", REPO, FILES)]


def test_a_repo_it_cannot_fetch_is_refused_naming_model_path(
    hub_cache, tmp_path, monkeypatch, capsys
):
    with pytest.raises(ValueError, match=r"model\.path=someorg/missing: no such folder"):
        open_model_folder("someorg/missing")
    r = rollplex_here(
        tmp_path, monkeypatch, capsys, "train", "model=hub", "model.path=someorg/missing"
    )
    assert r.returncode == 2
    assert "model.path=someorg/missing: no such folder, and the Hub repo could not be" in r.stderr


def test_one_command_trains_from_a_repo_id(hub_cache, tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    with torch_settings_kept():
        done = rollplex_here(
            tmp_path, monkeypatch, capsys, "train", "model=hub", f"model.path={REPO}",
            "data=easyvqa", "train.steps=1", *SMALL, f"hydra.run.dir={run}",
        )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    config = json.loads((run / "config.json").read_text())
    assert config["model"]["path"] == REPO  # the run records what the user named
    assert (run / "checkpoints" / "step-000001" / "model" / "config.json").is_file()
