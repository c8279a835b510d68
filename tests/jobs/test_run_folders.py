"""A run never writes into another run's folder: a failed run leaves an earlier run folder
byte for byte as it was, two runs never share a folder, and torchrun ranks other than 0
leave no folders of their own."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import pytest

from rollplex.jobs.run_folder import claim, folder_overrides
from tests.jobs.cli_run import rollplex, rollplex_here


def digest(folder: Path) -> dict[str, str]:
    """Every file under `folder` (hidden ones included) -> its sha256."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


# Failures at each stage: the override check (before Hydra), the spec validation (inside
# the Hydra run), and the job itself (a plan over budget; a device torch cannot use).
FAILURES = [
    ("graph", "workload.group_size=0"),
    ("graph", "train.stepz=1"),
    ("plan", "hardware=h200", "hardware.hbm_gib=8", "workload.prompts_per_step=8"),
    ("train", "train.device=tpu"),
    ("train", "model=nope9"),
]


@pytest.mark.parametrize("earlier", [("graph",), ("plan", "workload.prompts_per_step=8")])
def test_failed_runs_leave_an_earlier_run_folder_untouched(
    tmp_path: Path, monkeypatch, capsys, earlier: tuple[str, ...]
) -> None:
    ok = rollplex_here(tmp_path, monkeypatch, capsys, *earlier, "hydra.run.dir=runs/fixed")
    assert ok.returncode == 0, ok.stderr
    folder = tmp_path / "runs" / "fixed"
    before = digest(folder)
    assert "summary.json" in before and "config.json" in before and ".hydra/config.yaml" in before
    for args in FAILURES:
        r = rollplex_here(tmp_path, monkeypatch, capsys, *args, "hydra.run.dir=runs/fixed")
        assert r.returncode == 2, (args, r.stderr)
    assert digest(folder) == before
    # Each failure that got as far as a folder wrote only into its own, suffixed one.
    others = sorted(p.name for p in (tmp_path / "runs").iterdir() if p != folder)
    assert all(name.startswith("fixed_") for name in others)
    assert len(others) <= len(FAILURES)
    for name in others:
        assert not (tmp_path / "runs" / name / "summary.json").exists()


def test_runs_in_the_same_second_get_their_own_folders(tmp_path: Path, monkeypatch, capsys):
    # The default folder is named by the second; a pinned name stands in for "same second".
    for _ in range(3):
        r = rollplex_here(tmp_path, monkeypatch, capsys, "graph", "hydra.run.dir=out/x")
        assert r.returncode == 0, r.stderr
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert names == ["x", "x_1", "x_2"]
    assert all((tmp_path / "out" / n / "summary.json").is_file() for n in names)
    # Each reports its own folder.
    assert "out/x_2" in r.stdout


def test_a_sweep_claims_its_own_folder(tmp_path: Path, monkeypatch, capsys) -> None:
    args = ("plan", "-m", "schedule=serial,rollplex", "hydra.sweep.dir=sw")
    for _ in range(2):
        r = rollplex_here(tmp_path, monkeypatch, capsys, *args, "workload.prompts_per_step=8")
        assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("sw")) == ["sw", "sw_1"]
    assert (tmp_path / "sw_1" / "comparison.csv").is_file()


def test_claim_is_atomic_under_concurrent_runs(tmp_path: Path) -> None:
    got: list[Path] = []
    lock = threading.Lock()

    def one() -> None:
        p = claim(tmp_path / "a" / "run")
        with lock:
            got.append(p)

    threads = [threading.Thread(target=one) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(got)) == 16 and all(p.is_dir() for p in got)


@pytest.mark.parametrize("multirun", [False, True])
def test_other_ranks_get_a_temporary_folder(tmp_path: Path, monkeypatch, multirun) -> None:
    """A sweep's too: its timestamped default may name another second than rank 0's, or a
    folder rank 0 found taken and suffixed."""
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    (run_dir, subdir) = folder_overrides(None, multirun=multirun)  # type: ignore[arg-type]
    key = "sweep" if multirun else "run"
    assert run_dir.startswith(f"hydra.{key}.dir=") and str(tmp_path) in run_dir
    assert subdir == "hydra.output_subdir=null"


def test_a_torchrun_rank_leaves_no_folder_behind(tmp_path: Path) -> None:
    """A rank other than 0 (RANK=1, as torchrun sets it) writes no run folder of its own;
    its temporary one is gone when it exits."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    p = rollplex(tmp_path / "cwd", "graph", env={"RANK": "1", "TMPDIR": str(tmp)})
    assert p.returncode == 0, p.stderr
    assert not (tmp_path / "cwd" / "outputs").exists()
    assert list(tmp.iterdir()) == []
    # a sweep: no sweep folder, no comparison table (rank 0 writes them)
    p = rollplex(tmp_path / "cwd", "plan", "-m", "schedule=serial,rollplex",
                 env={"RANK": "1", "TMPDIR": str(tmp)})  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert "comparison table" not in p.stdout
    assert list((tmp_path / "cwd").iterdir()) == [] and list(tmp.iterdir()) == []
