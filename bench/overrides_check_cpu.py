"""The command line's override check (jobs/overrides.py) as it is, one compose of the
config, beside the two composes it made before (the presets alone to look each key up, then
the full line), side by side in alternating order on CPU. Every `rollplex` command runs it.

    python bench/overrides_check_cpu.py --rounds 6 --md bench/results/overrides_check_cpu.md
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ab import pair_parser, pair_report, timed_rounds

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


def seconds(fn: Callable[[], None], repeats: int) -> float:
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats


def main() -> None:
    ap = pair_parser(__doc__)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    one_compose(), two_composes()  # imports and Hydra's first compose, outside the timing
    t = timed_rounds(
        {
            "one": lambda: seconds(one_compose, args.repeats),
            "two": lambda: seconds(two_composes, args.repeats),
        },
        args.rounds,
    )
    pair_report(
        "The override check: one compose against the two it made before (CPU)",
        f"each figure the mean of {args.repeats} checks of `{' '.join(LINE)}`",
        ("two composes", t["two"]),
        ("one compose", t["one"]),
        args.md,
        unit="ms",
        per="command",
    )


if __name__ == "__main__":
    main()
