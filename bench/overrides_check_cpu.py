"""The command line's override check (jobs/overrides.py) as it is, one compose of the
config, beside the two composes it made before (the presets alone to look each key up, then
the full line), side by side in alternating order on CPU. Every `rollplex` command runs it.

    python bench/overrides_check_cpu.py --rounds 6 --md bench/results/overrides_check_cpu.md
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from rollplex.cli import _conf_dir
from rollplex.jobs import overrides as o

LINE = ["train.steps=2", "algo.lr=1e-3", "schedule=serial"]
PRESETS = ["schedule=serial"]


def one_compose() -> None:
    o.check_overrides(_conf_dir(), "train", "train", LINE, False)


def two_composes() -> None:
    """The check before stop 51: every key looked up in the presets' config, then the line."""
    base = o.compose_config(_conf_dir(), "train", ["job=train", *PRESETS])
    for key in ("train.steps", "algo.lr"):
        o._check_key(base, key)
    o.compose_config(_conf_dir(), "train", [*LINE, "job=train"])


def seconds(fn, repeats: int) -> float:
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--md", default=None)
    args = ap.parse_args()
    one_compose(), two_composes()  # imports and Hydra's first compose, outside the timing
    rows = []
    for r in range(args.rounds):  # A B | B A | ...
        order = (one_compose, two_composes) if r % 2 == 0 else (two_composes, one_compose)
        t = {fn.__name__: seconds(fn, args.repeats) for fn in order}
        rows.append((r, t["two_composes"], t["one_compose"]))
    ratios = [b / a for _, b, a in rows]
    saved = [(b - a) * 1e3 for _, b, a in rows]
    lines = [
        "# The override check: one compose against the two it made before (CPU)",
        "",
        f"Command: `python {' '.join(sys.argv)}` (alternating order, A B | B A ...; each "
        f"figure the mean of {args.repeats} checks of `{' '.join(LINE)}`).",
        "",
        "| round | two composes (ms) | one compose (ms) | ratio |",
        "|---|---:|---:|---:|",
        *(f"| {r} | {b * 1e3:.1f} | {a * 1e3:.1f} | {b / a:.2f} |" for r, b, a in rows),
        "",
        f"Ratio {statistics.median(ratios):.2f} (median; half-range "
        f"{(max(ratios) - min(ratios)) / 2:.2f}); {statistics.median(saved):.0f} ms saved per "
        "command (median).",
    ]
    text = "\n".join(lines)
    print(text)
    if args.md:
        Path(args.md).write_text(text + "\n")


if __name__ == "__main__":
    main()
