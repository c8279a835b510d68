"""What a first GPU run says and keeps, checked on CPU: each one-time phase logged once with
its duration and shown in the progress bar (engine/phases.py), and the compile cache keyed
so that a changed model shape, software version or device never reuses a stale folder
(runtime/compile_cache.py)."""

from __future__ import annotations

import logging
import os

import pytest
import torch

from rollplex.engine import phases
from rollplex.runtime.callbacks import Progress
from rollplex.runtime.compile_cache import (
    CACHE_VARS,
    KEY_FILE,
    cache_key,
    key_inputs,
    prepare_cache,
    use_compile_cache,
)
from rollplex.specs import MODEL_PRESETS

PHASE_LOG = "rollplex.engine.phases"


def phase_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == PHASE_LOG]


def test_each_phase_is_one_line_with_its_duration_and_watchers_see_the_innermost(caplog):
    seen: list[str | None] = []
    start = phases.mark()
    with caplog.at_level(logging.INFO, logger=PHASE_LOG), phases.watching(seen.append):
        with phases.phase("model load"), phases.phase("compile decode layer (before)"):
            pass
        with pytest.raises(RuntimeError), phases.phase("capture"):
            raise RuntimeError("a failed capture still ends its phase")
    assert seen == [
        "model load",
        "compile decode layer (before)",
        "model load",
        None,
        "capture",
        None,
    ]
    lines = phase_lines(caplog)
    assert [line.split(":")[0] for line in lines] == [
        "compile decode layer (before)",
        "model load",
        "capture",
    ]
    assert all(line.endswith(" s") for line in lines)
    assert [r.name for r in phases.records(start)] == [
        "compile decode layer (before)",
        "model load",
        "capture",
    ]
    with phases.phase("later"):
        pass
    assert seen[-1] is None and len(seen) == 6  # the watcher was removed with its block


def test_first_call_times_only_the_first_call(caplog):
    calls: list[int] = []
    fn = phases.first_call(lambda x: calls.append(x) or x * 2, "compile sampler")
    with caplog.at_level(logging.INFO, logger=PHASE_LOG):
        assert [fn(i) for i in range(3)] == [0, 2, 4]
    assert calls == [0, 1, 2]
    assert [line.split(":")[0] for line in phase_lines(caplog)] == ["compile sampler"]


def test_first_forward_times_a_modules_first_forward_and_removes_its_hooks(caplog):
    tower = phases.first_forward(torch.nn.Linear(3, 2), "compile vision tower")
    x = torch.ones(1, 3)
    with caplog.at_level(logging.INFO, logger=PHASE_LOG):
        for _ in range(3):
            tower(x)
    assert [line.split(":")[0] for line in phase_lines(caplog)] == ["compile vision tower"]
    assert not tower._forward_pre_hooks and not tower._forward_hooks


def test_the_progress_bar_shows_the_running_phase():
    bar = Progress(3, disable=False)
    try:
        with phases.phase("CUDA-graph capture (32 rows, kv 256)"):
            assert bar.bar.desc.startswith("train (CUDA-graph capture (32 rows, kv 256))")
        assert bar.bar.desc.rstrip(": ") == "train"
    finally:
        bar.close()
    with phases.phase("after close"):
        assert bar.bar.desc.rstrip(": ") == "train"  # a closed bar watches no more


VERSIONS = {"torch": "2.11.0", "triton": "3.5.0", "transformers": "5.17.0"}
MODEL = MODEL_PRESETS["qwen2_5_vl_3b"]


@pytest.mark.parametrize(
    "change",
    [
        ("model", MODEL.model_copy(update={"num_layers": MODEL.num_layers - 1})),
        ("model", MODEL_PRESETS["qwen2_5_vl_7b"]),
        ("model", MODEL.model_copy(update={"dtype": "float32"})),
        ("device", "NVIDIA H100 80GB HBM3"),
        ("versions", VERSIONS | {"torch": "2.13.0"}),
        ("versions", VERSIONS | {"triton": None}),
        ("versions", VERSIONS | {"transformers": "5.19.0"}),
    ],
)
def test_the_key_changes_with_shape_software_and_device(change):
    base = {"model": MODEL, "device": "NVIDIA H200", "versions": VERSIONS}
    key = cache_key(key_inputs(base["model"], base["device"], base["versions"]))
    other = base | {change[0]: change[1]}
    assert cache_key(key_inputs(other["model"], other["device"], other["versions"])) != key
    # a folder of the same model elsewhere, under another name, is the same shape
    moved = MODEL.model_copy(update={"path": "/elsewhere", "name": "hub"})
    assert cache_key(key_inputs(moved, base["device"], base["versions"])) == key


def test_a_matching_folder_is_reused_and_a_stale_one_emptied(tmp_path):
    inputs = key_inputs(MODEL, "NVIDIA H200", VERSIONS)
    folder, reused = prepare_cache(tmp_path, inputs)
    assert not reused
    (folder / "inductor").mkdir()
    (folder / "inductor" / "artifact").write_text("compiled")
    again, reused = prepare_cache(tmp_path, inputs)
    assert (again, reused) == (folder, True)
    assert (folder / "inductor" / "artifact").is_file()
    # the same folder name holding another key's artifacts (a collision, a hand edit)
    (folder / KEY_FILE).write_text('{"model": "another"}')
    again, reused = prepare_cache(tmp_path, inputs)
    assert (again, reused) == (folder, False)
    assert not (folder / "inductor").exists()
    # another version: another folder, the old one untouched
    newer, reused = prepare_cache(
        tmp_path, key_inputs(MODEL, "NVIDIA H200", VERSIONS | {"torch": "2.13.0"})
    )
    assert newer != folder and not reused


def test_the_caches_point_at_the_keyed_folder_unless_the_user_set_their_own(tmp_path, monkeypatch):
    for var in CACHE_VARS:
        monkeypatch.delenv(var, raising=False)
    folder = use_compile_cache(MODEL, "NVIDIA H200", root=tmp_path)
    assert folder is not None and folder.parent == tmp_path / "compile"
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(folder / "inductor")
    assert os.environ["TRITON_CACHE_DIR"] == str(folder / "triton")
    other = use_compile_cache(MODEL_PRESETS["qwen2_5_vl_7b"], "NVIDIA H200", root=tmp_path)
    assert other != folder and os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(other / "inductor")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    assert use_compile_cache(MODEL, "NVIDIA H200", root=tmp_path) is None
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "mine")
    # the default Inductor writes back once it has compiled anything is not the user's
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())
    assert use_compile_cache(MODEL, "NVIDIA H200", root=tmp_path) == folder
