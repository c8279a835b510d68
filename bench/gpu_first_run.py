"""Assemble bench/results/gpu_first_run/first_run.json from the run folders that
bench/gpu_first_run.sh leaves (issue 32's "must show"): per model shape and algorithm, the
planned step (priced as a user's run is: no calibration given), the steady measured step,
the first step of a first run (empty compile cache) and of a second run (the cache warm).

    python bench/gpu_first_run.py --runs <folder of <shape>_<algo>_run{1,2}> --out <json>
        [--merge <an earlier first_run.json: its rows for other shapes or algos are kept>]

Pure Python over the run folders' summary.json, metrics.csv and calibration.json.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import statistics
from datetime import date
from pathlib import Path
from typing import Any

RUN = re.compile(r"^(?P<shape>.+)_(?P<algo>[a-z0-9]+)_run(?P<n>[12])$")
WITHIN = 0.20  # the issue: the prediction within 20% of the steady step
SECOND_FIRST_MAX = 3.0  # the issue: a second run's first step at most 3x the steady step


def step_times(run: Path) -> list[float]:
    with (run / "metrics.csv").open() as f:
        return [float(r["step_time_s"]) for r in csv.DictReader(f)]


def read_run(run: Path) -> dict[str, Any]:
    summary = json.loads((run / "summary.json").read_text())
    config = json.loads((run / "config.json").read_text())
    calibration = json.loads((run / "calibration.json").read_text())
    return {
        "times": step_times(run),
        "summary": summary,
        "config": config,
        "device": calibration.get("device"),
    }


def row_for(shape: str, algo: str, first: dict, second: dict | None) -> dict[str, Any]:
    """One row: the first run's first step, the second run's, and the steady step (the
    median of steps 2.. of both runs) against the first run's plan."""
    steady_times = first["times"][1:] + (second["times"][1:] if second else [])
    if not steady_times:
        raise ValueError(f"{shape}/{algo}: a run of one step has no steady step")
    steady = statistics.median(steady_times)
    predicted = first["summary"]["plan_step_time_s"]
    second_first = second["times"][0] if second else None
    w = first["config"]["workload"]
    return {
        "shape": shape,
        "algo": algo,
        "device_name": first["device"],
        "predicted_step_s": predicted,
        "measured_step_s": steady,
        "first_step_s": first["times"][0],
        "first_step_second_run_s": second_first,
        "priced_by": first["summary"].get("priced_by"),
        "measured_over_predicted": steady / predicted,
        "prediction_within_20pct": abs(steady / predicted - 1) <= WITHIN,
        "second_run_first_over_steady": None if second_first is None else second_first / steady,
        "second_run_first_within_3x": None
        if second_first is None
        else second_first <= SECOND_FIRST_MAX * steady,
        "step_times_s": {"run1": first["times"], "run2": second["times"] if second else None},
        "phases_s": {
            "run1": first["summary"].get("phases"),
            "run2": second["summary"].get("phases") if second else None,
        },
        "hardware": first["config"]["hardware"]["name"],
        "workload": {
            "prompts_per_step": w["prompts_per_step"],
            "group_size": w["group_size"],
            "max_new_tokens": first["config"]["train"]["max_new_tokens"],
        },
    }


def collect(runs: Path) -> list[dict[str, Any]]:
    """Rows for every <shape>_<algo>_run1 folder under `runs` (run2 optional)."""
    found: dict[tuple[str, str], dict[int, Path]] = {}
    for folder in sorted(p for p in runs.iterdir() if p.is_dir()):
        m = RUN.match(folder.name)
        if m and (folder / "summary.json").is_file():
            found.setdefault((m["shape"], m["algo"]), {})[int(m["n"])] = folder
    rows = []
    for (shape, algo), by_n in sorted(found.items()):
        if 1 not in by_n:
            continue
        second = read_run(by_n[2]) if 2 in by_n else None
        rows.append(row_for(shape, algo, read_run(by_n[1]), second))
    return rows


def merge(earlier: list[dict], rows: list[dict]) -> list[dict]:
    """`earlier`'s rows that `rows` do not replace (same shape and algo), then `rows`."""
    new = {(r["shape"], r["algo"]) for r in rows}
    kept = [r for r in earlier if (r["shape"], r["algo"]) not in new]
    return sorted(kept + rows, key=lambda r: (r["shape"], r["algo"]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--merge", type=Path, default=None)
    p.add_argument("--command", default="bash bench/gpu_first_run.sh")
    a = p.parse_args(argv)
    measured = rows = collect(a.runs)
    if a.merge is not None and a.merge.is_file():
        rows = merge(json.loads(a.merge.read_text())["rows"], measured)
    doc = {"date": date.today().isoformat(), "command": a.command, "rows": rows}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(doc, indent=1))
    for r in measured:
        print(
            f"{r['shape']} {r['algo']} on {r['device_name']}: predicted {r['predicted_step_s']:.2f}"
            f" s ({r['priced_by']}), steady {r['measured_step_s']:.2f} s "
            f"(x{r['measured_over_predicted']:.2f}), first step {r['first_step_s']:.1f} s, "
            f"second run's {r['first_step_second_run_s']} s"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
