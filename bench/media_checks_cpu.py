"""The data check with and without earlier runs' media checks (data/media_checks.py), side
by side in alternating order: building easy-VQA's train and test sources as a run does,
decoding every image (A) against reading unchanged files back (B). CPU, no model.

    python bench/media_checks_cpu.py --rounds 5 --md bench/results/media_checks_cpu.md
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

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
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--md", default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "media_checks.json"
        cold = build_both(cache)  # fills the cache (and warms imports and the page cache)
        rows = []
        for r in range(args.rounds):  # A B | B A | ...
            order = ("decode", "recall") if r % 2 == 0 else ("recall", "decode")
            t = {name: build_both(None if name == "decode" else cache) for name in order}
            rows.append((r, t["decode"], t["recall"], t["decode"] / t["recall"]))
    ratios = [x[3] for x in rows]
    saved = [x[1] - x[2] for x in rows]
    half = (max(ratios) - min(ratios)) / 2
    lines = [
        "# The data check with earlier runs' media checks, on CPU (easy-VQA train + test)",
        "",
        f"Command: `python {' '.join(sys.argv)}` (alternating order, A B | B A ...).",
        f"The first build, which filled the cache, took {cold:.2f} s.",
        "",
        "| round | decode every file (s) | read unchanged files back (s) | ratio |",
        "|---|---:|---:|---:|",
        *(f"| {r} | {a:.3f} | {b:.3f} | {k:.2f} |" for r, a, b, k in rows),
        "",
        f"Ratio {statistics.median(ratios):.2f} (median; half-range {half:.2f}); seconds "
        f"saved per run {statistics.median(saved):.2f} (median of {len(saved)} rounds).",
    ]
    text = "\n".join(lines)
    print(text)
    if args.md:
        Path(args.md).write_text(text + "\n")


if __name__ == "__main__":
    main()
