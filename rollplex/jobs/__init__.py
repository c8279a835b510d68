"""Jobs behind the CLI. Each takes a validated RunSpec and its run folder."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from rollplex.specs.run import RunSpec


def run_job(spec: RunSpec, out: Path) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    main = os.environ.get("RANK", "0") == "0"  # under torchrun only rank 0 writes
    if main:
        (out / "config.json").write_text(spec.model_dump_json(indent=1))
    if spec.job == "graph":
        from rollplex.jobs.graph import run_graph as run
    elif spec.job == "plan":
        from rollplex.jobs.plan import run_plan as run
    elif spec.job == "eval":
        from rollplex.jobs.eval import run_eval as run
    elif spec.job == "weights":
        from rollplex.jobs.weights import run_weights as run
    else:
        from rollplex.jobs.train import run_train as run
    summary = run(spec, out)
    from rollplex.jobs.logs import report_repeats

    report_repeats(logging.getLogger("rollplex.jobs"))  # the warnings shown only once
    if main:
        write_summary(out, summary)
    return summary


def write_summary(out: Path, summary: dict[str, Any]) -> None:
    (out / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True))
