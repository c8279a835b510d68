"""Merge the runners' rows into bench/results/peers/peers.json and peers.md.

    python bench/peers/table.py --rows <dir with *.json rows> --out bench/results/peers

The markdown puts each workload's frameworks side by side: step time (median of steps 2+),
generated tokens/s, peaks (torch's allocator and the device's in-use memory), each
framework's own phase timings, and rollplex's speedup over each peer that ran.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from peer_row import write  # bench/peers/ is on sys.path as the script's folder


def _gib(n: float | None) -> str:
    return f"{n / 2**30:.1f}" if n else "-"


def markdown(rows: list[dict], command: str) -> str:
    out = ["# Peers side by side", "", f"Command: `{command}`", ""]
    for key in sorted({(r["shape"], r["workload"]) for r in rows}):
        group = [r for r in rows if (r["shape"], r["workload"]) == key]
        best = min(
            (r["step_time_s"] for r in group if r["framework"] == "rollplex" and r["step_time_s"]),
            default=None,
        )
        out += [f"## {key[0]}, {key[1]} ({group[0]['device_name']})", ""]
        out += ["| framework | schedule | step s | tokens/s | peak alloc GiB | peak device GiB "
                "| rollplex speedup over it | phases (s) | error |",
                "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for r in group:
            step = r["step_time_s"]
            ratio = f"{step / best:.2f}x" if step and best else "-"
            phases = ", ".join(f"{k} {v:.2f}" for k, v in r.get("phases", {}).items() if v)
            out.append(
                f"| {r['framework']} | {r['schedule']} | {step:.3f} | {r['tokens_per_s']:.0f} "
                if step
                else f"| {r['framework']} | {r['schedule']} | - | - "
            )
            out[-1] += (
                f"| {_gib(r['peak_bytes'])} | {_gib(r.get('peak_device_bytes'))} | {ratio} "
                f"| {phases or '-'} | {r.get('error') or ''} |"
            )
        out.append("")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--command", default="bash bench/peers/run.sh")
    args = ap.parse_args()
    rows = [json.loads(p.read_text()) for p in sorted(args.rows.glob("*.json"))]
    write(args.out / "peers.json", {"rows": rows, "command": args.command})
    (args.out / "peers.md").write_text(markdown(rows, args.command))
    print((args.out / "peers.md").read_text())


if __name__ == "__main__":
    main()
