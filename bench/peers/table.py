"""Merge the runners' rows into bench/results/peers/peers.json and peers.md.

    python bench/peers/table.py --rows <dir with *.json rows> --out bench/results/peers

The rows' file names number them in the order they ran (run.sh). The markdown puts each
workload's runs side by side: step time per run (median of steps 2+), generated tokens/s,
peaks (torch's allocator and the device's in-use memory), each framework's own phase
timings, and each peer's step over that of the rollplex run beside it in run order: the
mean over the peer's runs with its half-width.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

from peer_row import write  # bench/peers/ is on sys.path as the script's folder

BASE = ("rollplex", "rollplex")  # the ratios' denominator: `rollplex train`, rollplex schedule


def _gib(n: float | None) -> str:
    return f"{n / 2**30:.1f}" if n else "-"


def by_run(rows: list[dict]) -> dict[tuple[str, str], list[dict]]:
    """(framework, schedule) -> its rows in run order (round 0, 1, ...)."""
    runs: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in rows:
        runs[(r["framework"], r["schedule"])].append(r)
    return runs


def nearest(row: dict, base: list[dict]) -> dict | None:
    """The rollplex run next to `row` in run order (the earlier one on a tie)."""
    ran = [b for b in base if b["step_time_s"]]
    return min(ran, key=lambda b: (abs(b["order"] - row["order"]), b["order"]), default=None)


def ratio(peer: list[dict], base: list[dict]) -> str:
    """Peer step over the rollplex run beside it in run order, per peer run: the mean over
    runs with its half-width (an alternating session pairs each run with its neighbour)."""
    pairs = [
        p["step_time_s"] / b["step_time_s"]
        for p in peer
        if p["step_time_s"] and (b := nearest(p, base)) is not None
    ]
    if not pairs:
        return "-"
    mean = statistics.fmean(pairs)
    if len(pairs) == 1:
        return f"{mean:.2f}x (one run)"
    return f"{mean:.2f}x +- {(max(pairs) - min(pairs)) / 2:.2f}"


def markdown(rows: list[dict], command: str) -> str:
    out = ["# Peers side by side", "", f"Command: `{command}`", ""]
    for key in sorted({(r["shape"], r["workload"]) for r in rows}):
        runs = by_run([r for r in rows if (r["shape"], r["workload"]) == key])
        devices = sorted({r["device_name"] for rs in runs.values() for r in rs})
        out += [f"## {key[0]}, {key[1]} ({', '.join(devices)})", ""]
        out += ["| framework | schedule | step s per run | tokens/s | peak alloc GiB "
                "| peak device GiB | step / rollplex's | phases (s) | error |",
                "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for (framework, schedule), rs in runs.items():
            steps = [r["step_time_s"] for r in rs if r["step_time_s"]]
            per_round = ", ".join(f"{s:.3f}" for s in steps) or "-"
            tokens = (
                f"{statistics.fmean(r['tokens_per_s'] for r in rs if r['tokens_per_s']):.0f}"
                if steps
                else "-"
            )
            last = rs[-1]
            phases = ", ".join(f"{k} {v:.2f}" for k, v in last.get("phases", {}).items() if v)
            errors = "; ".join(sorted({r["error"] for r in rs if r.get("error")}))
            same = (framework, schedule) == BASE
            out.append(
                f"| {framework} | {schedule} | {per_round} | {tokens} "
                f"| {_gib(max((r['peak_bytes'] or 0) for r in rs))} "
                f"| {_gib(max((r.get('peak_device_bytes') or 0) for r in rs))} "
                f"| {'1' if same else ratio(rs, runs.get(BASE, []))} | {phases or '-'} | {errors} |"
            )
        out.append("")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--command", default="bash bench/peers/run.sh")
    args = ap.parse_args()
    rows = []
    for i, path in enumerate(sorted(args.rows.glob("*.json"))):
        prefix = path.name.split("-")[0]  # run.sh numbers its rows in run order
        rows.append(
            {**json.loads(path.read_text()), "order": int(prefix) if prefix.isdigit() else i}
        )
    write(args.out / "peers.json", {"rows": rows, "command": args.command})
    (args.out / "peers.md").write_text(markdown(rows, args.command))
    print((args.out / "peers.md").read_text())


if __name__ == "__main__":
    main()
