"""The disaggregated schedule on its two pools against colocated FSDP2, same GPUs, same job.

    python bench/gpu_disagg.py --out OUT disagg=RUN_FOLDER colocated=RUN_FOLDER

Reads each `rollplex train` run folder (metrics.csv: step time per step, the median after
the first; summary.json: the transfers a pooled run measured, gathered from every rank)
and writes OUT/gpu_disagg.json and OUT/gpu_disagg.md, then prints a short table (last).
Per transfer step it reports the bytes per step (measured against the plan's routes) and
two times: the senders' (the bytes on the wire: the receiver is already waiting) and the
receivers' (which include the wait for the other pool, since on-policy pools run one after
the other). Step times come from rank 0 (a rollout rank in the disaggregated run: its step
spans the weights' arrival to the end of the trainers' update, through the step's metrics
gathered over all ranks).
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
from pathlib import Path


def run_record(folder: Path) -> dict:
    rows = list(csv.DictReader((folder / "metrics.csv").open()))
    times = [float(r["step_time_s"]) for r in rows]
    summary = json.loads((folder / "summary.json").read_text())
    out = {
        "folder": str(folder),
        "schedule": summary.get("schedule"),
        "steps": len(rows),
        "step_time_s": times,
        "step_time_median_s": statistics.median(times[1:] or times),
        "rewards": [float(r["reward"]) for r in rows],
        "cuda_max_memory_allocated_rank0": summary.get("cuda_max_memory_allocated"),
        "transfers": {},
    }
    for step, t in (summary.get("transfers") or {}).items():
        out["transfers"][step] = {
            k: t[k]
            for k in ("what", "planned_bytes", "measured_bytes", "send_s", "recv_s", "by_value")
        }
        out["transfers"][step]["routes_match_plan"] = t["measured"] == t["planned"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("runs", nargs="*", help="name=run_folder")
    args = ap.parse_args()
    records = {}
    for item in args.runs:
        name, folder = item.split("=", 1)
        path = Path(folder)
        if not (path / "summary.json").is_file():
            records[name] = {"folder": folder, "error": "no summary.json (failed or skipped)"}
            continue
        records[name] = run_record(path)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_disagg.json").write_text(json.dumps(records, indent=1) + "\n")
    lines = ["| run | schedule | step time (median after the first) | vs colocated |",
             "|---|---|---|---|"]  # fmt: skip
    base = records.get("colocated", {}).get("step_time_median_s")
    for name, r in records.items():
        if "error" in r:
            lines.append(f"| {name} | - | {r['error']} | - |")
            continue
        t = r["step_time_median_s"]
        ratio = f"{t / base:.2f}x" if base else "-"
        lines.append(f"| {name} | {r['schedule']} | {t:.3f} s | {ratio} |")
    head = "| run | transfer | bytes/step (plan) | bytes per route = plan | send s | recv s |"
    lines += ["", head, "|---|---|---|---|---|---|"]
    for name, r in records.items():
        for step, t in r.get("transfers", {}).items():
            lines.append(
                f"| {name} | {step} ({t['what']}) | {t['measured_bytes']:,} "
                f"({t['planned_bytes']:,}) | {t['routes_match_plan']} | {t['send_s']:.4f} | "
                f"{t['recv_s']:.4f} |"
            )
    table = "\n".join(lines)
    (args.out / "gpu_disagg.md").write_text(
        "# Disaggregated (1 rollout + 1 training GPU) vs colocated FSDP2 (2 GPUs)\n\n"
        + table
        + "\n\nThe weights move exactly the plan's routes. The hand-over differs from the plan "
        "by what the plan does not size: it counts responses and old logprobs at "
        "`workload.response_length.max` tokens (8 B ids + 4 B logprobs) while the run sends "
        "`train.max_new_tokens` columns of ids, logprobs and the 1-byte mask, plus an 8-byte "
        "length per sample (per value: gpu_disagg.json `by_value`).\n"
    )
    print(table)


if __name__ == "__main__":
    main()
