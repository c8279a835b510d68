"""`rollplex weights`: how much of the rollout copy aliases training storage.

Per parameter class and in total: the shared and rebuilt bytes per GPU, the rebuild buffer
and the memory saved against a full second copy, into summary.json and weights.md. No
torch: the parameter table comes from the ModelSpec.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rollplex.specs.run import RunSpec
from rollplex.weights.build import build_sharing
from rollplex.weights.report import class_table, summary_lines, tally


def run_weights(spec: RunSpec, out: Path) -> dict[str, Any]:
    report = tally(build_sharing(spec.model, spec.weights))
    summary = report.summary()
    lines = summary_lines(report)
    table = class_table(report)
    (out / "weights.md").write_text(
        "# weights: " + lines[0] + "\n\n```\n" + "\n".join(lines[1:]) + "\n```\n\n"
        "GiB, mean per GPU over all GPUs.\n\n" + table + "\n"
    )
    print("\n".join(lines) + "\n\n" + table)
    return summary
