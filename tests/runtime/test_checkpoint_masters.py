"""Checkpoints of a bf16 run carry its float32 master weights: a resumed run continues from
them (not from the rounded weights) and ends where an uninterrupted run does; a checkpoint
without masters still loads; masters or an optimizer state that do not fit are refused,
naming the file, and the checkpoint stays untouched."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from rollplex.backends.torch.model import build_model
from rollplex.backends.torch.trainer import TorchTrainer
from rollplex.backends.torch.values import Loss
from rollplex.runtime.checkpoint import (
    MASTERS_FILE,
    OPTIMIZER_FILE,
    CheckpointError,
    read_checkpoint,
    restore,
    save_checkpoint,
)
from rollplex.specs import AlgoSpec
from tests.runtime.conftest import MODEL

BF16 = torch.bfloat16
# small enough that most updates stay below bf16's resolution: the masters carry them
ALGO = AlgoSpec(lr=1e-5, weight_decay=0.01)


def _trainer(dtype: torch.dtype = BF16, seed: int = 0) -> TorchTrainer:
    return TorchTrainer(build_model(MODEL, seed=seed).to(dtype), MODEL, ALGO)


def _steps(trainer: TorchTrainer, ks: range) -> TorchTrainer:
    """Steps of a fixed loss per step index k (the same gradients in every run)."""
    for k in ks:
        gen = torch.Generator().manual_seed(k)
        loss = torch.stack(
            [(p.float() * torch.randn(p.shape, generator=gen)).sum() for p in trainer.params]
        ).sum()
        trainer.optimizer_step(trainer.backward(Loss(loss, {})))
    return trainer


def _state(trainer: TorchTrainer) -> dict[str, torch.Tensor]:
    """Weights, masters and moments, by name."""
    out = {f"w.{n}": p.detach().clone() for n, p in trainer.named}
    if trainer.masters is not None:
        out |= {f"m.{n}": t.detach().clone() for n, t in trainer.masters.state_dict().items()}
    for i, st in trainer.optimizer.state_dict()["state"].items():
        out |= {f"o.{i}.{k}": v.clone() for k, v in st.items()}
    return out


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A bf16 run checkpointed after 2 steps, and the uninterrupted run's state at 4."""
    root = tmp_path_factory.mktemp("masters") / "checkpoints"
    folder = save_checkpoint(root, 2, _steps(_trainer(), range(2)), MODEL, seed=0)
    return folder, _state(_steps(_trainer(), range(4)))


def test_a_resumed_bf16_run_ends_where_an_uninterrupted_one_does(saved):
    folder, uninterrupted = saved
    masters = load_file(folder / MASTERS_FILE)
    weights = load_file(folder / "model/model.safetensors")
    # the masters hold what the bf16 weights lost
    assert any(not torch.equal(m, weights[n].float()) for n, m in masters.items())
    resumed = _trainer(seed=1)  # other weights: everything must come from the checkpoint
    restore(resumed, read_checkpoint(folder, MODEL, seed=0))
    assert resumed.counter.n == 2
    assert _equal(_state(_steps(resumed, range(2, 4))), uninterrupted)


def test_without_its_masters_a_resume_drifts_and_says_so(saved, caplog):
    folder, uninterrupted = saved
    ckpt = read_checkpoint(folder, MODEL, seed=0)
    ckpt.masters = None  # what an older checkpoint holds
    resumed = _trainer(seed=1)
    with caplog.at_level(logging.INFO):
        restore(resumed, ckpt)
    assert "no master weights" in caplog.text
    for n, p in resumed.named:  # the masters start from the (rounded) weights
        assert torch.equal(resumed.masters.state_dict()[n], p.detach().float())
    drifted = _state(_steps(resumed, range(2, 4)))
    assert any(not torch.equal(drifted[k], uninterrupted[k]) for k in uninterrupted)


def test_a_float32_checkpoint_gives_a_bf16_run_exact_masters(tmp_path):
    fp32 = _steps(_trainer(torch.float32), range(2))
    folder = save_checkpoint(tmp_path, 2, fp32, MODEL, seed=0)
    assert not (folder / MASTERS_FILE).exists()  # a float32 run keeps none
    resumed = _trainer(seed=1)
    restore(resumed, read_checkpoint(folder, MODEL, seed=0))
    for (n, p), (_, q) in zip(resumed.named, fp32.named, strict=True):
        assert torch.equal(resumed.masters.state_dict()[n], q.detach())
        assert torch.equal(p.detach(), q.detach().to(BF16))


def test_a_float32_run_resumes_a_bf16_checkpoint_from_its_masters(saved):
    folder, _ = saved
    resumed = _trainer(torch.float32, seed=1)
    restore(resumed, read_checkpoint(folder, MODEL, seed=0))
    masters = load_file(folder / MASTERS_FILE)
    assert all(torch.equal(p.detach(), masters[n]) for n, p in resumed.named)


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()
    }


def _rehash(folder: Path, rel: str) -> None:
    """Record a replaced file's sha256, so only its content can be refused."""
    state = folder / "trainer_state.json"
    raw = json.loads(state.read_text())
    raw["files"][rel] = hashlib.sha256((folder / rel).read_bytes()).hexdigest()
    state.write_text(json.dumps(raw))


def _damage(folder: Path, what: str) -> None:
    path = folder / MASTERS_FILE
    masters = load_file(path)
    if what == "flipped":  # not rehashed: the checksum catches it
        data = bytearray(path.read_bytes())
        data[-10] ^= 0xFF
        path.write_bytes(bytes(data))
        return
    if what == "garbage":
        path.write_bytes(b"not a safetensors file")
    elif what == "another step":
        save_file({n: m - 1e-3 for n, m in masters.items()}, path)
    elif what == "missing":
        save_file(dict(list(masters.items())[1:]), path)
    elif what == "bf16":
        save_file({n: m.to(BF16) for n, m in masters.items()}, path)
    elif what == "moment shape":
        path = folder / OPTIMIZER_FILE
        opt = torch.load(path, weights_only=True)
        opt["state"][0]["exp_avg"] = opt["state"][0]["exp_avg"][:1]
        torch.save(opt, path)
    elif what == "parameter count":
        path = folder / OPTIMIZER_FILE
        opt = torch.load(path, weights_only=True)
        opt["param_groups"][0]["params"] = opt["param_groups"][0]["params"][:-1]
        torch.save(opt, path)
    _rehash(folder, path.name)


@pytest.mark.parametrize(
    ("what", "message"),
    [
        ("flipped", rf"{MASTERS_FILE}: sha256 differs"),
        ("garbage", rf"{MASTERS_FILE}: cannot be read"),
        ("bf16", rf"{MASTERS_FILE}: .* is not float32"),
        ("another step", rf"{MASTERS_FILE}: does not fit .*does not round"),
        ("missing", rf"{MASTERS_FILE}: does not fit .*no master for"),
        ("moment shape", rf"{OPTIMIZER_FILE}: does not fit .*'exp_avg' has shape"),
        ("parameter count", rf"{OPTIMIZER_FILE}: does not fit"),
    ],
)
def test_masters_or_optimizer_state_that_do_not_fit_are_refused(saved, tmp_path, what, message):
    folder, _ = saved
    bad = tmp_path / folder.name
    shutil.copytree(folder, bad)
    _damage(bad, what)
    before = _snapshot(bad)
    with pytest.raises(CheckpointError, match=message):
        restore(_trainer(seed=1), read_checkpoint(bad, MODEL, seed=0))
    assert _snapshot(bad) == before
