"""What a media check file full of deleted files costs each run (data/media_checks.py), side
by side in alternating order: reading a file of 10,000 live and 70,000 gone entries (as this
machine's had grown to, from temporary datasets) against the same file once a write has
dropped the gone ones. CPU; every run reads the file whole before its data check.

    python bench/media_checks_prune_cpu.py --rounds 6 --md bench/results/media_checks_prune_cpu.md
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from ab import pair_parser, pair_report, timed_rounds

from rollplex.data.media_checks import FORMAT, MediaChecks

LIVE, GONE = 10_000, 70_000


def entries(root: Path) -> dict[str, list[int]]:
    """LIVE files that exist under `root` and GONE paths that do not, as a check keeps them."""
    live = root / "live"
    live.mkdir()
    files = {}
    for i in range(LIVE):
        f = live / f"{i}.png"
        f.touch()
        files[str(f)] = [0, f.stat().st_mtime_ns, 64, 64]
    for i in range(GONE):
        files[str(root / "gone" / f"{i}.png")] = [1234, 1_700_000_000_000_000_000 + i, 64, 64]
    return files


def load_seconds(path: Path) -> float:
    start = time.perf_counter()
    MediaChecks.load(path)
    return time.perf_counter() - start


def main() -> None:
    args = pair_parser(__doc__).parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        grown, pruned = root / "grown.json", root / "pruned.json"
        grown.write_text(json.dumps({"format": FORMAT, "files": entries(root)}))
        checks = MediaChecks.load(grown)
        checks.path, checks.added = pruned, 1  # as after a decode: the next save writes
        start = time.perf_counter()
        checks.save()
        save_s = time.perf_counter() - start
        kept = len(json.loads(pruned.read_text())["files"])
        assert kept == LIVE, kept
        t = timed_rounds(
            {"grown": lambda: load_seconds(grown), "pruned": lambda: load_seconds(pruned)},
            args.rounds,
        )
        sizes = grown.stat().st_size / 1e6, pruned.stat().st_size / 1e6
    pair_report(
        "Reading the media check file at a run's start, on CPU",
        "",
        (f"{LIVE + GONE:,} entries, {GONE:,} gone ({sizes[0]:.1f} MB)", t["grown"]),
        (f"{LIVE:,} entries, after a write dropped the gone ({sizes[1]:.1f} MB)", t["pruned"]),
        args.md,
        notes=[
            f"The write that dropped them (a stat of every entry, then the JSON) took "
            f"{save_s:.2f} s, once."
        ],
    )


if __name__ == "__main__":
    main()
