"""A `rollplex train -m` sweep under torchrun (conftest's 2-rank sweep, run as a user runs
an ablation): one comparison table, every job a row with its step time and reward."""

from __future__ import annotations

import csv

from tests.distributed.conftest import RUNS


def test_a_torchrun_sweep_makes_one_table_of_its_train_runs(runs2):
    sweep = runs2.folder
    rows = list(csv.DictReader((sweep / "comparison.csv").open()))
    assert sorted(r["run"] for r in rows) == sorted(RUNS[2])
    assert all(r["status"] == "ok" for r in rows)
    assert all(float(r["median_step_time_s"]) > 0 for r in rows)
    header = (sweep / "comparison.md").read_text().splitlines()[0]
    for column in ("run", "schedule", "median_step_time_s", "final_mean_reward"):
        assert f" {column} |" in header, header
    pooled = next(r for r in rows if r["run"] == "pooled")
    assert pooled["schedule"] == "disaggregated" and pooled["eval_accuracy_last"] != ""
