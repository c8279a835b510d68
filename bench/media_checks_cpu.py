"""The data check with and without earlier runs' media checks (data/media_checks.py), side
by side in alternating order: building easy-VQA's train and test sources as a run does,
decoding every image (A) against reading unchanged files back (B). CPU, no model.

    python bench/media_checks_cpu.py --rounds 6 --md bench/results/media_checks_cpu.md
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from ab import pair_parser, pair_report, timed_rounds

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
    ap = pair_parser(__doc__)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "media_checks.json"
        cold = build_both(cache)  # fills the cache (and warms imports and the page cache)
        t = timed_rounds(
            {"decode": lambda: build_both(None), "recall": lambda: build_both(cache)}, args.rounds
        )
    pair_report(
        "The data check with earlier runs' media checks, on CPU (easy-VQA train + test)",
        "",
        ("decode every file", t["decode"]),
        ("read unchanged files back", t["recall"]),
        args.md,
        notes=[f"The first build, which filled the cache, took {cold:.2f} s."],
    )


if __name__ == "__main__":
    main()
