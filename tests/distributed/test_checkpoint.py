"""DCP checkpoints: sharded on save, resharded on load, a Hub export beside them, and a
resume after kill -9 of the whole torchrun group that ends where an uninterrupted run
ends, bit for bit."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from rollplex.backends.torch.model import load_model
from rollplex.runtime.checkpoint import CheckpointError
from rollplex.runtime.dcp_checkpoint import read_dcp_checkpoint
from tests.distributed.conftest import (
    ROOT,
    TRAIN,
    ckpt_model,
    command,
    env,
    train,
    weights,
)


def test_two_rank_checkpoint_is_sharded_with_a_hub_export(runs):
    ckpt = runs.two / "checkpoints" / "step-000002"
    spec = ckpt_model(ckpt)
    files = {p.name for p in (ckpt / "dcp").iterdir()}
    assert files == {".metadata", "__0_0.distcp", "__1_0.distcp"}
    state = json.loads((ckpt / "trainer_state.json").read_text())
    assert state["world"] == 2 and state["step"] == 2 and state["version"] == 2
    read_dcp_checkpoint(ckpt, spec, seed=0)  # validates (checksums included)
    # transformers' from_pretrained reads the export; it holds the trained weights.
    model = load_model(ckpt / "model", spec=spec)
    export = dict(model.named_parameters())
    assert set(export) and all(p.dtype == torch.float32 for p in export.values())


def test_corrupt_or_foreign_checkpoint_is_named(runs, tmp_path):
    ckpt = runs.two / "checkpoints" / "step-000002"
    spec = ckpt_model(ckpt)
    with pytest.raises(CheckpointError, match="seed"):
        read_dcp_checkpoint(ckpt, spec, seed=1)
    torch_ckpt = tmp_path / "torch"
    torch_ckpt.mkdir()
    (torch_ckpt / "trainer_state.json").write_text('{"format": "rollplex-checkpoint/2"}')
    with pytest.raises(CheckpointError, match="expected 'rollplex-checkpoint/dcp-1'"):
        read_dcp_checkpoint(torch_ckpt, spec, seed=0)
    bad = tmp_path / "bad"
    shutil.copytree(ckpt, bad)
    shard = bad / "dcp" / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1
    shard.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"__1_0\.distcp: sha256 differs"):
        read_dcp_checkpoint(bad, spec, seed=0)


@pytest.mark.parametrize("nproc", [1, pytest.param(4, marks=pytest.mark.slow)])
def test_saved_on_two_ranks_loads_on_one_and_four(runs, request, nproc):
    """Parameters equal the Hub export bit for bit; AdamW's state equals its 1-rank load.
    (The loads are conftest.CHECKS' `load` of the step-2 checkpoint, one per rank count.)"""
    ckpt = runs.two / "checkpoints" / "step-000002"
    spec = ckpt_model(ckpt)
    got = request.getfixturevalue(f"checks{nproc}").report("load")
    assert got["version"] == 2
    export = dict(load_model(ckpt / "model", spec=spec).named_parameters())
    assert set(got["params"]) == set(export)
    assert all(torch.equal(got["params"][n], export[n]) for n in export)
    assert got["optim"] and all({"exp_avg", "exp_avg_sq"} <= set(s) for s in got["optim"].values())
    if nproc == 4:
        ref = request.getfixturevalue("checks1").report("load")["optim"]
        for name, st in got["optim"].items():
            for k, v in st.items():
                assert torch.equal(v, ref[name][k]), (name, k)


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (torchrun starts each rank in a session of its own, so
    killing torchrun's process group would leave the ranks running)."""
    parent: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        kids = parent.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def kill_tree(pid: int) -> None:
    """kill -9 the launcher and every rank at once, as a lost node would."""
    for p in [pid, *descendants(pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)


@pytest.mark.slow  # ~25 s: two ranks killed, then resumed
def test_resume_after_kill_9_of_two_ranks_matches_uninterrupted(runs, tmp_path):
    killed = tmp_path / "killed"
    args = ["train", *TRAIN, "train.steps=8", f"hydra.run.dir={killed}"]
    proc = subprocess.Popen(
        command(2, "rollplex.cli", args),
        env=env(),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its own process group: torchrun and both ranks
    )
    first = killed / "checkpoints" / "step-000002" / "trainer_state.json"
    deadline = time.monotonic() + 240
    try:
        while not first.exists():
            assert proc.poll() is None, "the run ended before its first checkpoint"
            assert time.monotonic() < deadline, "no checkpoint within 240 s"
            time.sleep(0.1)
    finally:
        kill_tree(proc.pid)
        proc.wait(30)
    done = sorted(p.name for p in (killed / "checkpoints").glob("step-*"))
    time.sleep(2)  # nothing of the killed run survives to write more
    assert sorted(p.name for p in (killed / "checkpoints").glob("step-*")) == done
    assert "step-000008" not in done  # really killed mid-run
    resumed = train(2, tmp_path / "resumed", 4, f"train.resume={killed}")
    summary = json.loads((resumed / "summary.json").read_text())
    assert summary["start_step"] >= 2 and summary["resumed_from"]
    a, b = weights(resumed, 4), weights(runs.two, 4)
    assert all(torch.equal(a[n], b[n]) for n in a)
