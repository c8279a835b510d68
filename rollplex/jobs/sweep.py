"""A Hydra callback that turns a multirun into one comparison table (markdown + CSV).

A run that fails (bad input, a plan that cannot fit) does not end the sweep: it leaves a
summary.json with `status: failed` and its reason, and the table shows that row. A
speedup against a baseline that does not fit is empty in the CSV, with the reason in its
`speedup_vs_<key>_note` column, and the markdown cell says "does not fit (needs X GiB)".
"""

from __future__ import annotations

import csv
import json
import logging
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback

from rollplex.jobs.run_folder import is_rank0

log = logging.getLogger(__name__)

FAILED_RUNS: list[str] = []  # run folders that failed in this process's sweep

PREFERRED = (
    "status",
    "schedule",
    "model",
    "workload",
    "hardware",
    "step_time_s",
    # a train run's
    "median_step_time_s",
    "plan_step_time_s",
    "final_mean_reward",
    "eval_accuracy_last",
    "speedup_vs_serial",
    "speedup_vs_serial_dedup",
    "speedup_vs_disaggregated",
    "speedup_vs_serial_note",
    "speedup_vs_serial_dedup_note",
    "speedup_vs_disaggregated_note",
    "peak_gib_per_gpu",
    "lower_bound_gib",
    "fits_budget",
    "error",
)


def record_failure(out: Path, cfg: Any, message: str) -> None:
    """A failed run's row: what it was asked (from the raw config) and why it failed."""
    from omegaconf import OmegaConf

    out.mkdir(parents=True, exist_ok=True)
    row: dict[str, Any] = {"status": "failed", "error": message}
    for key, path in (
        ("schedule", "schedule.name"),
        ("model", "model.name"),
        ("workload", "workload.name"),
        ("hardware", "hardware.name"),
    ):
        try:
            row[key] = OmegaConf.select(cfg, path, default=None)
        except Exception:  # an interpolation that cannot resolve: leave the cell empty
            row[key] = None
    (out / "summary.json").write_text(json.dumps(row, indent=1, sort_keys=True, default=str))
    FAILED_RUNS.append(str(out))


def comparison_rows(sweep_dir: Path) -> list[dict[str, Any]]:
    rows = []
    for summary in sorted(sweep_dir.glob("*/summary.json")):
        row = {"run": summary.parent.name, "status": "ok"}
        row.update(json.loads(summary.read_text()))
        rows.append(row)
    return rows


def write_comparison(sweep_dir: Path) -> Path | None:
    rows = comparison_rows(sweep_dir)
    if not rows:
        return None
    keys = ["run"] + [k for k in PREFERRED if any(k in r for r in rows)]
    keys += sorted({k for r in rows for k in r} - set(keys))
    scalar = [k for k in keys if all(not isinstance(r.get(k), dict | list) for r in rows)]
    with (sweep_dir / "comparison.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=scalar, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    # a note is shown in its speedup's cell
    shown = [k for k in scalar if (k in PREFERRED or k == "run") and not k.endswith("_note")]

    def fmt(r: dict[str, Any], k: str) -> str:
        v = r.get(k, "")
        if k.startswith("speedup_vs_") and v is None:  # never a ratio against a misfit
            return str(r.get(f"{k}_note") or "n/a")
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(shown) + " |", "|" + "---|" * len(shown)]
    lines += ["| " + " | ".join(fmt(r, k) for k in shown) + " |" for r in rows]
    path = sweep_dir / "comparison.md"
    path.write_text("\n".join(lines) + "\n")
    return path


class ComparisonTable(Callback):
    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        if not is_rank0():  # under torchrun the sweep folder is rank 0's to write
            return
        path = write_comparison(Path(config.hydra.sweep.dir))
        if path is not None:
            print(path.read_text())
            print(f"comparison table: {path} (and comparison.csv)")
