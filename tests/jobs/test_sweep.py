"""A sweep survives a run that crashes (a bug, not bad input): the row says why."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest

from rollplex import cli
from rollplex.jobs import plan as plan_job
from rollplex.jobs import sweep


def test_a_crashing_run_is_a_failed_row(tmp_path: Path, monkeypatch) -> None:
    real = plan_job.run_plan

    def flaky(spec, out):
        if spec.schedule.name == "serial":
            raise KeyError("boom")
        return real(spec, out)

    monkeypatch.setattr(plan_job, "run_plan", flaky)
    monkeypatch.setattr(sweep, "FAILED_RUNS", [])
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", list(sys.argv))  # main() rewrites it for Hydra
    with pytest.raises(SystemExit) as exit_:
        cli.main(["plan", "-m", "schedule=serial,rollplex", "model=qwen2_5_vl_3b",
                  "workload.prompts_per_step=8"])  # fmt: skip
    assert exit_.value.code == 1
    (folder,) = (tmp_path / "multirun" / "plan").iterdir()
    rows = {r["schedule"]: r for r in csv.DictReader((folder / "comparison.csv").open())}
    assert rows["serial"]["status"] == "failed" and rows["serial"]["error"] == "KeyError: 'boom'"
    assert rows["rollplex"]["status"] == "ok"
