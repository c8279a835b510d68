"""Why calibrating from round 0 of run 10 still left 1.3x: a CPU re-pricing (no GPU).

Run 10's schedules after its first (round 0's serial + dedup) were planned with
`calibration=<that run's calibration.json>`. That file's `predicted_s` were priced with the
H200 constants then shipped (runs 5 and 9, main at b95f5e0), but `CostModel.calibrated`
rescaled the *bare* model by predicted/measured: every kind lost its shipped factor (vision
1.74x, backward 1.36x, ...). Files now record `priced_with` and a calibration rescales the
model that priced them (jobs/pricing.py). Prints each run 10 folder's measured step beside
its prediction both ways; the constants of b95f5e0 are read with `git show`. With
`--before`: every run 8+ folder uncalibrated under b95f5e0's constants, on this code (what
bench/results/prediction_check.md's "before" column sums up).

    PYTHONPATH=. python bench/prediction_calibrated.py [--root bench/results/gpu_step]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from prediction_runs import find_runs, price, spec_of

from rollplex.planner.cost_model import CostModel

THEN = "b95f5e0"  # main when runs 10-12 ran (gpu_step/README.md)
RUN, SOURCE = 10, "runs_qwen2_5_vl_7b_run10/round0/serial_dedup/calibration.json"


def shipped_then() -> types.ModuleType:
    """planner/shipped_calibration.py as it was at THEN."""
    text = subprocess.run(
        ["git", "show", f"{THEN}:rollplex/planner/shipped_calibration.py"],
        capture_output=True, text=True, check=True, cwd=Path(__file__).resolve().parent,
    ).stdout  # fmt: skip
    module = types.ModuleType("shipped_then")
    exec(compile(text, f"{THEN}:shipped_calibration.py", "exec"), module.__dict__)
    return module


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=Path(__file__).parent / "results/gpu_step")
    ap.add_argument("--before", action="store_true", help="uncalibrated, b95f5e0's constants")
    args = ap.parse_args()
    entries = json.loads((args.root / SOURCE).read_text())["entries"]
    then = shipped_then()
    if args.before:
        print("| run folder | measured s | predicted s | ratio |\n|---|---:|---:|---:|")
        for run in find_runs(args.root):
            if run.run >= 8:
                spec = spec_of(run)
                file, _ = then.shipped_for(spec.hardware, spec.model)
                cm = CostModel(spec.hardware).calibrated_by([e.model_dump() for e in file.entries])
                p, m = price(spec, cm).step_s, run.measured_s
                print(f"| {run.label} | {m:.2f} | {p:.2f} | {m / p:.2f} |")
        return
    print("| run folder | measured s | bare model calibrated s | ratio | priced model calibrated"
          " s | ratio |\n|---|---:|---:|---:|---:|---:|")  # fmt: skip
    for run in find_runs(args.root):
        if run.run != RUN:
            continue
        spec = spec_of(run)
        file, _ = then.shipped_for(spec.hardware, spec.model)
        priced = CostModel(spec.hardware).calibrated_by([e.model_dump() for e in file.entries])
        bare = price(spec, CostModel(spec.hardware).calibrated_by(entries)).step_s
        right = price(spec, priced.calibrated_by(entries)).step_s
        m = run.measured_s
        cells = f"{m:.2f} | {bare:.2f} | {m / bare:.2f} | {right:.2f} | {m / right:.2f}"
        print(f"| {run.label} | {cells} |")


if __name__ == "__main__":
    main()
