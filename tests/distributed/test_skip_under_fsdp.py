"""algo.skip_zero_advantage under FSDP2 (2 gloo ranks, kl_coef=0, where it resolves on):
ranks skipping different rows would run different numbers of forwards and wait on each
other's per-layer gathers, so every row trains; the run ends, logs no `trained_rows`, and
its log says why. The run is conftest's 2-rank sweep's 'no-kl' job."""

from __future__ import annotations

import csv
import json


def test_fsdp_ranks_train_every_row_and_say_so(runs2):
    run = runs2("no-kl")
    plan = json.loads((run / "plan.json").read_text())
    assert plan["meta"]["skip_zero_advantage"] is True  # the graph gave the forward them
    with (run / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 and all(r["trained_rows"] == "" for r in rows)
    assert all(float(r["entropy"]) > 0 for r in rows)  # every row's, every step
    log = (run / "cli.log").read_text()
    assert "algo.skip_zero_advantage: every row trains under FSDP" in log
