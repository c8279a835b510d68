"""Jobs behind the CLI. Each takes a validated RunSpec and its run folder."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from rollplex.jobs.run_folder import is_rank0
from rollplex.specs.run import RunSpec


def run_job(spec: RunSpec, out: Path) -> dict[str, Any]:
    # Inputs a job would find bad only after loading data and models: refused first.
    if spec.calibration.path not in (None, "auto", "none") and spec.job in ("plan", "train"):
        from rollplex.ops.calibration import load_calibration

        load_calibration(spec.calibration.path)
    if spec.job == "eval":  # train's is checked with the rest (jobs/validate_run.py)
        from rollplex.jobs.devices import check_device

        check_device("eval.device", spec.eval.device)
    out.mkdir(parents=True, exist_ok=True)
    main = is_rank0()  # under torchrun only rank 0 writes
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
    # Not in a `finally`: after a failed kernel, synchronizing would raise over the job's error.
    from rollplex.jobs.devices import release_cuda_stream_caches

    release_cuda_stream_caches()
    from rollplex.jobs.logs import report_repeats

    report_repeats(logging.getLogger("rollplex.jobs"))  # the warnings shown only once
    if main:
        write_summary(out, summary)
        if spec.job in ("plan", "weights"):  # graph and train name their folder themselves
            print(f"run folder: {out.resolve()} ({', '.join(sorted(_listing(out)))})")
    return summary


def _listing(out: Path) -> list[str]:
    return [p.name + ("/" if p.is_dir() else "") for p in out.iterdir() if p.name[0] != "."]


def write_summary(out: Path, summary: dict[str, Any]) -> None:
    (out / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True))
