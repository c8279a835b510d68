"""GPU time outside every op of each traced RL step, per plan step issued: the host's
bookkeeping between ops (accounting, frees, launches) that the GPU waits through. Read from
the recorded run folders (bench/prediction_runs.py), no GPU needed.

    PYTHONPATH=. python bench/outside_ops.py [--root bench/results/gpu_step] [--from-run 10]

Stop 41: 21-30 ms per plan step in run 14 (7B dense video) against 4.7-7.1 ms in run 16,
after the executor's accounting walks were cut (5b549a1); across sessions, not A/B.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from prediction_runs import find_runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--root", type=Path, default=Path("bench/results/gpu_step"))
    ap.add_argument("--from-run", type=int, default=10)
    args = ap.parse_args()
    print("| run folder | step | step s | outside ops ms | plan steps | ms each |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in find_runs(args.root):
        if r.run < args.from_run:
            continue
        for t in r.traced:
            out = (t.seconds - t.busy_s) * 1e3
            each = out / t.issued
            print(
                f"| {r.label} | {t.step} | {t.seconds:.2f} | {out:.0f} | {t.issued} | {each:.1f} |"
            )


if __name__ == "__main__":
    main()
