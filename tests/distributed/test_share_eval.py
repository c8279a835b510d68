"""The README's `torchrun ... backend=fsdp backend.fsdp.rollout_sync=share
backend.fsdp.rollout_tp=2` with held-out evaluation on: a TP rollout decodes in lockstep
over its group, so every rank runs the evaluation (rank 0 alone used to hang its peer's
collectives into the training step: "zip() argument 2 is shorter than argument 1")."""

from __future__ import annotations

import csv
import json

import pytest


@pytest.mark.slow  # conftest's 2-rank sweep (its 'tp2' run: 2 steps, three evaluations)
def test_tp_rollout_evaluates_on_every_rank(runs2):
    run = runs2("tp2")
    rows = list(csv.DictReader((run / "metrics.csv").open()))
    assert [r["step"] for r in rows] == ["1", "2"]
    assert all(r["eval_accuracy"] != "" for r in rows)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["eval_accuracy_first"] is not None and summary["eval_accuracy_last"] is not None
