"""Checkpoints: atomic, complete, and checked before anything is loaded from them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from rollplex.backends.torch.handles import GradsHandle
from rollplex.backends.torch.model import build_model
from rollplex.backends.torch.trainer import TorchTrainer
from rollplex.runtime.checkpoint import (
    CheckpointError,
    latest_checkpoint,
    read_checkpoint,
    restore,
    save_checkpoint,
)
from tests.runtime.conftest import ALGO, MODEL


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    trainer = TorchTrainer(build_model(MODEL, seed=0), MODEL, ALGO)
    loss = sum(p.float().pow(2).sum() for p in trainer.params)  # any step, for a real state
    loss.backward()
    trainer.optimizer_step(GradsHandle(trainer.params))
    root = tmp_path_factory.mktemp("ckpt") / "checkpoints"
    folder = save_checkpoint(root, 1, trainer, MODEL, seed=0)
    return trainer, root, folder


def test_round_trip_restores_weights_optimizer_and_version(saved):
    trainer, root, folder = saved
    assert latest_checkpoint(root) == folder
    assert not [p for p in root.iterdir() if p.name.startswith(".")]  # no temporaries left
    fresh = TorchTrainer(build_model(MODEL, seed=1), MODEL, ALGO)
    restore(fresh, read_checkpoint(root.parent, MODEL, seed=0))  # a run folder: its latest
    assert fresh.counter.n == trainer.counter.n == 1
    for (n, p), (_, q) in zip(
        trainer.model.named_parameters(), fresh.model.named_parameters(), strict=True
    ):
        assert torch.equal(p, q), n
    a, b = trainer.optimizer.state_dict()["state"], fresh.optimizer.state_dict()["state"]
    assert all(torch.equal(a[i]["exp_avg_sq"], b[i]["exp_avg_sq"]) for i in a)


def test_half_written_checkpoints_are_never_picked(saved, tmp_path):
    _, root, folder = saved
    copy = tmp_path / "checkpoints"
    shutil.copytree(root, copy)
    shutil.copytree(folder, copy / ".step-000009.tmp-1")  # what a kill leaves behind
    (copy / "step-000007").mkdir()  # no trainer_state.json: incomplete
    assert latest_checkpoint(copy) == copy / folder.name


def _damage(folder: Path, what: str) -> None:
    state = folder / "trainer_state.json"
    if what == "weights":
        data = bytearray((folder / "model/model.safetensors").read_bytes())
        data[-100] ^= 0xFF
        (folder / "model/model.safetensors").write_bytes(bytes(data))
    elif what == "json":
        state.write_text(state.read_text()[:40])
    elif what == "field":
        raw = json.loads(state.read_text())
        del raw["version"]
        state.write_text(json.dumps(raw))
    elif what == "optimizer":
        (folder / "optimizer.pt").unlink()


@pytest.mark.parametrize(
    ("what", "message"),
    [
        ("weights", r"model\.safetensors: sha256 differs"),
        ("json", r"trainer_state\.json: not valid JSON"),
        ("field", r"trainer_state\.json: 'version': Field required"),
        ("optimizer", r"optimizer\.pt: missing"),
    ],
)
def test_a_damaged_checkpoint_names_the_file_and_stays_untouched(saved, tmp_path, what, message):
    _, _, folder = saved
    bad = tmp_path / folder.name
    shutil.copytree(folder, bad)
    _damage(bad, what)
    before = _snapshot(bad)
    with pytest.raises(CheckpointError, match=message):
        read_checkpoint(bad, MODEL, seed=0)
    assert _snapshot(bad) == before


def test_another_model_or_seed_is_refused(saved):
    _, _, folder = saved
    other = MODEL.model_copy(update={"num_layers": 3})
    with pytest.raises(
        CheckpointError,
        match=r"another model.*model\.num_layers: checkpoint "
        r"has 2, this run has 3",
    ):
        read_checkpoint(folder, other, seed=0)
    with pytest.raises(CheckpointError, match=r"'seed' is 0 but this run has seed=5"):
        read_checkpoint(folder, MODEL, seed=5)


def test_checkpoint_model_is_a_hub_folder_transformers_loads(tmp_path):
    """A run from a user's folder: the checkpoint's model/ carries save_pretrained's files
    and the source folder's tokenizer/processor, and from_pretrained reads equal tensors."""
    from transformers import AutoTokenizer, Qwen2_5_VLForConditionalGeneration

    from rollplex.backends.torch.model import model_for
    from rollplex.models import open_model_folder
    from tests.models.conftest import write_hub

    hub = write_hub(tmp_path / "user-model")
    spec = open_model_folder(hub.folder).spec  # path set: the run loads this folder
    trainer = TorchTrainer(model_for(spec, seed=0), spec, ALGO)
    loss = sum(p.float().pow(2).sum() for p in trainer.params)
    loss.backward()
    trainer.optimizer_step(GradsHandle(trainer.params))
    folder = save_checkpoint(tmp_path / "checkpoints", 1, trainer, spec, seed=0)

    model_dir = folder / "model"
    assert (model_dir / "config.json").is_file()
    for name in (
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
        "preprocessor_config.json",
    ):
        assert (model_dir / name).read_bytes() == (hub.folder / name).read_bytes(), name
    hf = Qwen2_5_VLForConditionalGeneration.from_pretrained(model_dir)
    theirs, ours = hf.state_dict(), trainer.model.state_dict()
    assert theirs.keys() == ours.keys()
    assert all(torch.equal(theirs[k], ours[k]) for k in ours)
    assert not torch.equal(ours["lm_head.weight"], hub.model.state_dict()["lm_head.weight"])
    text = "what colour is the shape ?"
    assert AutoTokenizer.from_pretrained(model_dir)(text) == hub.tokenizer(text)
    assert open_model_folder(folder).spec.arch_diff(spec) == {}  # a checkpoint opens as a folder

    fresh = TorchTrainer(model_for(spec, seed=0), spec, ALGO)
    restore(fresh, read_checkpoint(folder, spec.model_copy(update={"path": "/elsewhere"}), 0))
    assert all(torch.equal(p, q) for p, q in zip(trainer.params, fresh.params, strict=True))
