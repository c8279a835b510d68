"""The data check with and without earlier runs' media checks (data/media_checks.py), side
by side in alternating order: building easy-VQA's train and test sources as a run does,
decoding every image (A) against reading unchanged files back (B). CPU, no model.

    python bench/media_checks_cpu.py --rounds 6 --md bench/results/media_checks_cpu.md
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from ab import ratio_over_rounds, report, timed_rounds

from rollplex.data import build_source
from rollplex.data.media_checks import MediaChecks
from rollplex.specs.data import DataSpec


def build_both(cache: Path | None) -> float:
    """Seconds to build the train and test sources (the file read once for both, as a run's
    `prepare` does)."""
    spec = DataSpec(source="easyvqa")
    start = time.perf_counter()
    checks = MediaChecks.load(cache) if cache is not None else None
    for split in ("train", "test"):
        build_source(spec, split, 0, checks=checks)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--md", default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "media_checks.json"
        cold = build_both(cache)  # fills the cache (and warms imports and the page cache)
        t = timed_rounds(
            {"decode": lambda: build_both(None), "recall": lambda: build_both(cache)}, args.rounds
        )
    ratio = ratio_over_rounds(t["decode"], t["recall"])
    saved = statistics.fmean(a - b for a, b in zip(t["decode"], t["recall"], strict=True))
    rows = zip(t["decode"], t["recall"], ratio.per_round, strict=True)
    report(
        [
            "# The data check with earlier runs' media checks, on CPU (easy-VQA train + test)",
            "",
            f"Command: `python {' '.join(sys.argv)}` (alternating order, A B | B A ...; "
            "bench/ab.py).",
            f"The first build, which filled the cache, took {cold:.2f} s.",
            "",
            "| round | decode every file (s) | read unchanged files back (s) | ratio |",
            "|---|---:|---:|---:|",
            *(f"| {r} | {a:.3f} | {b:.3f} | {k:.2f} |" for r, (a, b, k) in enumerate(rows)),
            "",
            f"Ratio {ratio.value:.2f} +- {ratio.spread:.2f} (mean over rounds +- half-width); "
            f"{saved:.2f} s saved per run (mean).",
        ],
        args.md,
    )


if __name__ == "__main__":
    main()
