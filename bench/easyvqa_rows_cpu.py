"""The default data's build (easy-VQA train and test splits) on in-memory `Columns`, as it
is, beside the `datasets.Dataset.from_dict` it built before (whose first use imports
`datasets`, pandas and pyarrow): each build in a fresh process that has already imported
torch and transformers' Qwen2.5-VL classes, as a run has by then, in alternating order.

    python bench/easyvqa_rows_cpu.py --rounds 6 --md bench/results/easyvqa_rows_cpu.md
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ab import pair_parser, pair_report, timed_rounds

ROOT = Path(__file__).resolve().parents[1]
CHILD = """
import sys, time
import torch
from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl
import rollplex.data.easyvqa as e
from rollplex.data.build import build_source
from rollplex.specs.data import DataSpec
if sys.argv[1] == "dataset":  # the build before: datasets imported at first use
    def table(rows):
        import datasets
        return datasets.Dataset.from_dict(rows)
    e.Columns = table
start = time.perf_counter()
for split in ("train", "test"):
    build_source(DataSpec(source="easyvqa"), split, 0)
print(time.perf_counter() - start)
"""


def build_seconds(variant: str) -> float:
    out = subprocess.run([sys.executable, "-c", CHILD, variant], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout  # fmt: skip
    return float(out.split()[-1])


def main() -> None:
    ap = pair_parser(__doc__)
    args = ap.parse_args()
    t = timed_rounds({v: lambda v=v: build_seconds(v) for v in ("columns", "dataset")}, args.rounds)
    pair_report(
        "The default data's build: Columns against datasets.Dataset (CPU)",
        "each figure one fresh process's build of easy-VQA's train and test splits, media "
        "checks included, after torch and the Qwen2.5-VL classes are imported",
        ("datasets.Dataset", t["dataset"]),
        ("Columns", t["columns"]),
        args.md,
    )


if __name__ == "__main__":
    main()
