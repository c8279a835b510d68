"""What is live at the CUDA allocator's peak of one schedule's RL steps, and who allocated it:
issue 31's memory check (measured peak <= 1.05x planned), read where it fails.

    python bench/memory_peak.py --folder /tmp/qwen2_5_vl_3b --shape qwen2_5_vl_3b \\
        --frames 16 --mean-length 160 --max-length 512        # one GPU; bench/memory_peak.sh

Runs `--steps` RL steps of `bench/gpu_step.py`'s workload with torch's allocator history on
(`torch.cuda.memory._record_memory_history`, Python stacks), then replays that history
backwards from the allocator's end state to the moment the most bytes were allocated and
groups the blocks live there by the innermost rollplex frame that allocated them. Writes
<out>/memory_peak_<shape>_<schedule>.md beside the plan's peak and prints it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

GiB = 2**30


@dataclass(slots=True)
class Block:
    size: int
    frames: list[dict]


def peak_blocks(snapshot: dict, device: int = 0) -> tuple[int, dict[int, Block]]:
    """The most bytes allocated at once over the recorded history, and the blocks live then.

    The end state (`segments`) is exact; walking the trace backwards, an alloc had not
    happened yet and a completed free still held its block. A free whose alloc fell before
    the ring buffer keeps the free's frames."""
    live = {
        b["addr"]: Block(b["size"], b.get("frames", []))
        for seg in snapshot["segments"]
        if seg["device"] == device
        for b in seg["blocks"]
        if b["state"] == "active_allocated"
    }
    trace = snapshot["device_traces"][device]
    alloc_frames: dict[int, list[dict]] = {}
    freed_from: dict[int, list[dict]] = {}  # trace index of a free -> its alloc's frames
    for i, e in enumerate(trace):
        if e["action"] == "alloc":
            alloc_frames[e["addr"]] = e.get("frames", [])
        elif e["action"] == "free_completed":
            freed_from[i] = alloc_frames.pop(e["addr"], e.get("frames", []))
    total = sum(b.size for b in live.values())
    best, best_at = total, len(trace)
    for i in range(len(trace) - 1, -1, -1):
        e = trace[i]
        if e["action"] == "alloc":
            total -= e["size"]
        elif e["action"] == "free_completed":
            total += e["size"]
        if total > best:
            best, best_at = total, i
    for i in range(len(trace) - 1, best_at - 1, -1):
        e = trace[i]
        if e["action"] == "alloc":
            live.pop(e["addr"], None)
        elif e["action"] == "free_completed":
            live[e["addr"]] = Block(e["size"], freed_from[i])
    return best, live


def site(frames: Iterable[dict], depth: int = 2) -> str:
    """The innermost `depth` rollplex frames of a stack, else its innermost frame."""
    frames = list(frames)
    ours = [f for f in frames if "/rollplex/" in f["filename"]]
    picked = ours[:depth] or frames[:1]
    return " < ".join(f"{Path(f['filename']).stem}.{f['name']}:{f['line']}" for f in picked)


def table(blocks: dict[int, Block], top: int) -> list[tuple[str, int, int]]:
    sizes: dict[str, list[int]] = defaultdict(list)
    for b in blocks.values():
        sizes[site(b.frames)].append(b.size)
    rows = sorted(((s, sum(v), len(v)) for s, v in sizes.items()), key=lambda r: -r[1])
    return rows[:top]


def main() -> None:
    from gpu_step import add_one_schedule_arguments, compose_spec, overrides

    ap = argparse.ArgumentParser(description=__doc__)
    add_one_schedule_arguments(ap, steps=2)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--max-entries", type=int, default=2_000_000)
    ap.add_argument("--out", type=Path, default=Path("bench/results/gpu_profile"))
    args = ap.parse_args()

    import torch

    from rollplex.jobs import run_job

    spec = compose_spec(overrides(args, args.schedule))
    run = args.out / "runs" / f"{args.shape}_{args.schedule}"
    # The backward on the calling thread: recording Python stacks from autograd's device
    # thread failed the first H100 try (SystemError from run_backward).
    torch.autograd.set_multithreading_enabled(False)
    torch.cuda.memory._record_memory_history(max_entries=args.max_entries, stacks="python")
    run_job(spec, run)
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    peak, live = peak_blocks(snapshot)
    summary = json.loads((run / "summary.json").read_text())
    planned = summary["plan_peak_bytes"]
    lines = [
        f"# Live at the allocator's peak: {args.shape}, {args.schedule}",
        "",
        f"Command: `python bench/memory_peak.py --shape {args.shape} --schedule {args.schedule} "
        f"{' '.join(sys.argv[1:])}`",
        "",
        f"- replayed peak {peak / GiB:.2f} GiB; torch's max_memory_allocated "
        f"{torch.cuda.max_memory_allocated() / GiB:.2f} GiB; planned {planned / GiB:.2f} GiB "
        f"({torch.cuda.max_memory_allocated() / planned:.3f}x)",
        f"- {len(snapshot['device_traces'][0]):,} trace entries (ring of {args.max_entries:,})",
        "",
        "| allocated at (innermost rollplex frames) | GiB | blocks |",
        "|---|---:|---:|",
    ]
    lines += [f"| `{s}` | {n / GiB:.3f} | {k} |" for s, n, k in table(live, args.top)]
    text = "\n".join(lines)
    (args.out / f"memory_peak_{args.shape}_{args.schedule}.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
