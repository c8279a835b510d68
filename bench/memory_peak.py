"""What is live at the CUDA allocator's peak of one schedule's RL steps, and who allocated it:
issue 31's memory check (measured peak <= 1.05x planned), read where it fails.

    python bench/memory_peak.py --folder /tmp/qwen2_5_vl_3b --shape qwen2_5_vl_3b \\
        --frames 16 --mean-length 160 --max-length 512        # one GPU; bench/memory_peak.sh

Runs `--steps` RL steps of `bench/gpu_step.py`'s workload with torch's allocator history on
(`torch.cuda.memory._record_memory_history`), then replays that history backwards from the
allocator's end state to the moment the most bytes were allocated and groups the blocks live
there by the plan op that allocated them (`--stacks none`, the default: each op tags its
allocations) or by the innermost rollplex frame (`--stacks python`, which torch 2.11 breaks
inside a checkpointed backward: pytorch/pytorch#179536). Writes
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
# Allocations no plan op made: weights and optimizer state at load, the executor's copies.
OUTSIDE_OPS = "(outside ops: load, executor)"


@dataclass(slots=True)
class Block:
    size: int
    frames: list[dict]
    op: str = ""


def _op(entry: dict) -> str:
    return entry.get("user_metadata", "") or ""


def _addressed(segment: dict) -> Iterable[tuple[int, dict]]:
    """A segment's blocks with their addresses: blocks lie end to end from the segment's
    start, and a snapshot taken without stacks leaves `addr` out."""
    addr = segment["address"]
    for b in segment["blocks"]:
        yield b.get("addr", addr), b
        addr += b["size"]


def peak_blocks(
    snapshot: dict, device: int = 0, by_op: dict[str, int] | None = None
) -> tuple[int, dict[int, Block]]:
    """The most bytes allocated at once over the recorded history, and the blocks live then;
    `by_op` (when given) gets the most bytes allocated right after each op's allocations.

    The end state (`segments`) is exact; walking the trace backwards, an alloc had not
    happened yet and a completed free still held its block. A free whose alloc fell before
    the ring buffer keeps the free's frames. A block live at the end takes the op of its
    alloc in the trace: torch 2.11's segments carry no `user_metadata`, so the weights,
    AdamW's state and every buffer a job keeps would otherwise all read "(untagged)"."""
    live = {
        addr: Block(b["size"], b.get("frames", []), _op(b))
        for seg in snapshot["segments"]
        if seg["device"] == device
        for addr, b in _addressed(seg)
        if b["state"] == "active_allocated"
    }
    trace = snapshot["device_traces"][device]
    allocs: dict[int, Block] = {}
    freed_from: dict[int, Block] = {}  # trace index of a free -> its alloc's block
    for i, e in enumerate(trace):
        if e["action"] == "alloc":
            allocs[e["addr"]] = Block(e["size"], e.get("frames", []), _op(e))
        elif e["action"] == "free_completed":
            freed_from[i] = allocs.pop(e["addr"], Block(e["size"], e.get("frames", []), _op(e)))
    for addr, b in live.items():
        traced = allocs.get(addr)
        if not b.op and traced is not None and traced.size == b.size:
            b.op = traced.op
    total = sum(b.size for b in live.values())
    best, best_at = total, len(trace)
    for i in range(len(trace) - 1, -1, -1):
        e = trace[i]
        if e["action"] == "alloc":
            if by_op is not None:
                op = _op(e) or "(untagged)"
                by_op[op] = max(by_op.get(op, 0), total)
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
            live[e["addr"]] = freed_from[i]
    return best, live


def site(frames: Iterable[dict], depth: int = 2) -> str:
    """The innermost `depth` rollplex frames of a stack, else its innermost frame."""
    frames = list(frames)
    ours = [f for f in frames if "/rollplex/" in f["filename"]]
    picked = ours[:depth] or frames[:1]
    return " < ".join(f"{Path(f['filename']).stem}.{f['name']}:{f['line']}" for f in picked)


def where(b: Block) -> str:
    """The allocating op with the block's size class (MiB) when tagged, else its frames; a
    block of the same size allocated over and over in one op is one row."""
    if b.frames:
        return site(b.frames)
    op = b.op or "(untagged)"
    return f"{op} ({b.size / 2**20:,.0f} MiB blocks)" if b.size >= 2**28 else op


def table(blocks: dict[int, Block], top: int) -> list[tuple[str, int, int]]:
    sizes: dict[str, list[int]] = defaultdict(list)
    for b in blocks.values():
        sizes[where(b)].append(b.size)
    rows = sorted(((s, sum(v), len(v)) for s, v in sizes.items()), key=lambda r: -r[1])
    return rows[:top]


def tag_allocations_with_op(torch) -> None:
    """Every allocation made while a plan op runs carries that op's name in the snapshot."""
    from rollplex.runtime.dispatch import RoleDispatch

    if not hasattr(torch.cuda.memory, "_set_memory_metadata"):
        print(f"torch {torch.__version__} cannot tag allocations: blocks show no op")
        return
    run_op = RoleDispatch.run_op

    def tagged(self, op, inputs, chunk, carry):
        torch.cuda.memory._set_memory_metadata(op.name)
        try:
            return run_op(self, op, inputs, chunk, carry)
        finally:
            torch.cuda.memory._set_memory_metadata(OUTSIDE_OPS)

    torch.cuda.memory._set_memory_metadata(OUTSIDE_OPS)
    RoleDispatch.run_op = tagged


def main() -> None:
    from gpu_step import add_one_schedule_arguments, compose_spec, overrides

    ap = argparse.ArgumentParser(description=__doc__)
    add_one_schedule_arguments(ap, steps=2)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--max-entries", type=int, default=2_000_000)
    ap.add_argument("--stacks", choices=("none", "python"), default="none")
    ap.add_argument("--out", type=Path, default=Path("bench/results/gpu_profile"))
    args = ap.parse_args()

    import torch

    from rollplex.jobs import run_job

    spec = compose_spec(overrides(args, args.schedule))
    run = args.out / "runs" / f"{args.shape}_{args.schedule}"
    # The backward on the calling thread: the op tag is per thread, and recording Python
    # stacks from autograd's device thread fails outright.
    torch.autograd.set_multithreading_enabled(False)
    if args.stacks == "python":
        torch.cuda.memory._record_memory_history(max_entries=args.max_entries, stacks="python")
    else:  # no stacks: no Python runs inside the allocator, and each op tags its blocks
        tag_allocations_with_op(torch)
        torch.cuda.memory._record_memory_history(max_entries=args.max_entries, context=None)
    run_job(spec, run)
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    trace = snapshot["device_traces"][0]
    print("trace entry keys:", sorted(trace[-1]) if trace else "no entries")
    by_op: dict[str, int] = {}
    peak, live = peak_blocks(snapshot, by_op=by_op)
    summary = json.loads((run / "summary.json").read_text())
    planned = summary["plan_peak_bytes"]
    lines = [
        f"# Live at the allocator's peak: {args.shape}, {args.schedule}",
        "",
        f"Command: `python bench/memory_peak.py {' '.join(sys.argv[1:])}` "
        f"(schedule {args.schedule}, stacks {args.stacks})",
        "",
        f"- replayed peak {peak / GiB:.2f} GiB; torch's max_memory_allocated "
        f"{torch.cuda.max_memory_allocated() / GiB:.2f} GiB; planned {planned / GiB:.2f} GiB "
        f"({torch.cuda.max_memory_allocated() / planned:.3f}x)",
        f"- {len(snapshot['device_traces'][0]):,} trace entries (ring of {args.max_entries:,})",
        "",
        "| allocated by (op, or innermost rollplex frames) | GiB | blocks |",
        "|---|---:|---:|",
    ]
    lines += [f"| `{s}` | {n / GiB:.3f} | {k} |" for s, n, k in table(live, args.top)]
    lines += ["", "| op | most allocated during it (GiB) |", "|---|---:|"]
    lines += [f"| `{op}` | {n / GiB:.2f} |" for op, n in sorted(by_op.items(), key=lambda r: -r[1])]
    text = "\n".join(lines)
    (args.out / f"memory_peak_{args.shape}_{args.schedule}.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
