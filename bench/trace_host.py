"""Host time around each plan step of a profiled RL step: how long the executor's thread
spent after a step's last CUDA event record (its own bookkeeping: accounting, frees) and
before its first (reads recorded on the stream), beside the GPU's busy time in the step.

    python bench/trace_host.py bench/results/gpu_profile/trace_qwen2_5_vl_3b_rollplex.json.gz

Found by it (H100, 3B, stop 41): ~42 ms after every plan step, ~0.55 s of a 5.7 s step,
in walks of every resident tensor (runtime/executor.py now walks once per change).
"""

from __future__ import annotations

import argparse
import bisect
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from trace_kernels import load

from rollplex.planner.simulate import union_length

RECORD = "cudaEventRecordWithFlags"
GPU = ("kernel", "gpu_memcpy", "gpu_memset")


def host_rows(events: list[dict]) -> tuple[list[tuple[str, float, float, float]], float, float]:
    """(plan step, host ms, head ms, tail ms) for each step of the last profiled RL step,
    and that RL step's host ms and GPU busy ms."""
    rl = [
        e
        for e in events
        if e.get("cat") == "user_annotation" and "dur" in e and e["name"].startswith("ProfilerStep")
    ][-1]
    a, b, tid = rl["ts"], rl["ts"] + rl["dur"], rl["tid"]
    records = sorted(e["ts"] for e in events if e.get("tid") == tid and e.get("name") == RECORD)
    rows = []
    for e in sorted(
        (
            e
            for e in events
            if e.get("cat") == "user_annotation"
            and "dur" in e
            and e["tid"] == tid
            and a <= e["ts"] <= b
            and "." in e["name"]
            and not e["name"].startswith(("ProfilerStep", "Optimizer"))
        ),
        key=lambda e: e["ts"],
    ):
        lo, hi = e["ts"], e["ts"] + e["dur"]
        inside = records[bisect.bisect_left(records, lo) : bisect.bisect_right(records, hi)]
        head = (inside[0] - lo) / 1e3 if inside else float("nan")
        tail = (hi - inside[-1]) / 1e3 if inside else float("nan")
        rows.append((e["name"], e["dur"] / 1e3, head, tail))
    busy = union_length(
        [(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") in GPU and a <= e["ts"] <= b]
    )
    return rows, rl["dur"] / 1e3, busy / 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("trace", type=Path)
    args = ap.parse_args()
    rows, step_ms, busy_ms = host_rows(load(args.trace))
    print("| plan step | host ms | before its first record ms | after its last record ms |")
    print("|---|---:|---:|---:|")
    for name, ms, head, tail in rows:
        print(f"| {name} | {ms:.1f} | {head:.1f} | {tail:.1f} |")
    tails = sum(t for *_, t in rows if t == t)
    print(
        f"\nRL step {step_ms:.0f} ms on the host, GPU busy {busy_ms:.0f} ms; after-record "
        f"time summed over plan steps {tails:.0f} ms"
    )


if __name__ == "__main__":
    main()
