"""Does an uncalibrated H200 plan predict the step it measures? CPU only, no GPU, no model.

For every recorded run folder under bench/results/gpu_step/runs_*_runN/[round<k>/]<schedule>/
(prediction_runs.py), re-plans the run's config on this code with hardware=h200 and no
calibration file, and prints measured against predicted step seconds (the median of the
timed steps, as bench/gpu_step.py reports them). These are CPU re-pricings of GPU
measurements: the seconds measured are the H200's, the predicted ones the planner's.

Two predictions per run:
- `shipped`: the constants as shipped (planner/shipped_calibration.py), fit on the runs
  marked `fit`: in-sample for those;
- `held out`: constants fit (prediction_fit.py) on every fit run but this run's number
  (both rounds and all schedules of run N leave together): out of sample for every run.
`at drawn` re-prices each timed step at the lengths it drew (the runs force them from
(seed, step)) with the held-out constants: measured over it is the model's error alone,
without the draw's (a timed step whose longest row hit the cap is slower than expected).
Runs before FIT_FROM measured an older decode engine and trainer: shown, never fit.

    PYTHONPATH=. python bench/prediction_check.py [--root bench/results/gpu_step]
        [--fit]           print the constants fit on every fit run (shipped_calibration.py)
        [--md FILE]       also write the table as markdown
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from prediction_fit import fit, literal, observe
from prediction_runs import RecordedRun, drawn_workload, find_runs, price, spec_of

from rollplex.planner.cost_model import CostModel
from rollplex.planner.shipped_calibration import H200, CostConstants

FIT_FROM = 10  # runs 10-12: one code version (main at b95f5e0), three workloads
TARGET = 0.20
ROOT = Path(__file__).resolve().parent / "results" / "gpu_step"


def ratio_line(measured: float, predicted: float | None) -> str:
    return "-" if not predicted else f"{measured / predicted:.2f}"


def check(runs: list[RecordedRun], shipped: CostConstants, fit_from: int = FIT_FROM) -> list[dict]:
    """One row per run folder: measured, and predicted by the shipped and the held-out
    constants."""
    fit_runs = [r for r in runs if _fits(r, fit_from)]
    obs, gaps = observe(fit_runs)
    held: dict[int, CostConstants] = {}
    rows = []
    for run in runs:
        if run.run not in held:
            held[run.run] = fit(
                [o for o in obs if o.run != run.run], [g for g in gaps if g.run != run.run]
            )
        spec = spec_of(run)
        bare = CostModel(spec.hardware)
        out = held[run.run].applied_to(bare)
        row = {
            "run": run.label,
            "number": run.run,
            "used": "fit" if _fits(run, fit_from) else _unused(run),
            "steps": run.timed_s,
            "measured": run.measured_s,
        }
        try:
            row["shipped"] = price(spec, shipped.applied_to(bare)).step_s
            row["held_out"] = price(spec, out).step_s
            drawn = [price(spec, out, drawn_workload(spec, k)).step_s for k in _timed(run)]
            row["at_drawn"] = statistics.median(
                m / p for m, p in zip(run.timed_s, drawn, strict=True)
            )
        except (ValueError, RuntimeError) as e:  # a config this code refuses
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:90]}"
        rows.append(row)
    return rows


def _fits(run: RecordedRun, fit_from: int) -> bool:
    """Fit (and held out of its own fit): a traced H200 run of the current code."""
    return run.run >= fit_from and bool(run.traced) and _gpu(run) == "h200"


def _gpu(run: RecordedRun) -> str:
    return run.config["hardware"]["name"]


def _unused(run: RecordedRun) -> str:
    return "not fit" if _gpu(run) == "h200" else f"not fit ({_gpu(run)})"


def _timed(run: RecordedRun) -> range:
    return range(run.timed_from, len(run.step_s) + 1)


def table(rows: list[dict]) -> str:
    head = (
        "| run folder | used | timed steps s | measured s | shipped s | measured/shipped "
        "| held out s | measured/held out | at drawn lengths |\n"
        "|---|---|---|---:|---:|---:|---:|---:|---:|\n"
    )
    lines = []
    for r in rows:
        steps = " / ".join(f"{s:.2f}" for s in r["steps"])
        if "error" in r:
            lines.append(f"| {r['run']} | {r['used']} | {steps} | {r['measured']:.2f} | "
                         f"{r['error']} | | | | |")  # fmt: skip
            continue
        lines.append(
            f"| {r['run']} | {r['used']} | {steps} | {r['measured']:.2f} | {r['shipped']:.2f} "
            f"| {ratio_line(r['measured'], r['shipped'])} | {r['held_out']:.2f} "
            f"| **{ratio_line(r['measured'], r['held_out'])}** | {r['at_drawn']:.2f} |"
        )
    return head + "\n".join(lines) + "\n"


def summary(rows: list[dict], fit_from: int = FIT_FROM) -> str:
    fit_rows = [r for r in rows if r["used"] == "fit" and "held_out" in r]
    within = [r for r in fit_rows if abs(r["measured"] / r["held_out"] - 1) <= TARGET]
    ratios = [r["measured"] / r["held_out"] for r in fit_rows]
    per_run: dict[int, list[float]] = {}
    for r in fit_rows:
        per_run.setdefault(r["number"], []).append(r["measured"] / r["held_out"])
    runs = "; ".join(f"run {n}: {min(v):.2f}-{max(v):.2f}" for n, v in sorted(per_run.items()))
    return (
        f"Held out, runs {fit_from}+: {len(within)} of {len(fit_rows)} run folders within "
        f"{TARGET:.0%} (measured/predicted {min(ratios):.2f}-{max(ratios):.2f}; {runs})."
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=ROOT)
    ap.add_argument("--fit", action="store_true", help="print the constants of all fit runs")
    ap.add_argument("--md", type=Path, help="write the table as markdown here too")
    ap.add_argument("--fit-from", type=int, default=FIT_FROM, help="first run fit")
    args = ap.parse_args()
    runs = find_runs(args.root)
    if args.fit:
        obs, gaps = observe([r for r in runs if _fits(r, args.fit_from)])
        print(literal(fit(obs, gaps)))
        return
    rows = check(runs, H200, args.fit_from)
    text = table(rows) + "\n" + summary(rows, args.fit_from) + "\n"
    print(text)
    if args.md:
        args.md.write_text(text)


if __name__ == "__main__":
    main()
