"""What a finished train job leaves allocated on the GPU, job after job in one process (as a
Hydra multirun sweep or bench/gpu_step.py runs them): torch's allocated bytes after each
job, the CUDA tensors Python can still reach (by shape, with what holds the largest), and
the rollplex objects still alive. Bytes no reachable tensor accounts for are held outside
Python's view (CUDA graph pools, compiled-code caches). `--by-op` also records each job's
allocator history (as bench/memory_peak.py does, blocks tagged by plan op) and prints what
was live at each job's peak, by op, side by side: where a later job's higher peak comes from.

    python bench/job_residue.py --folder /tmp/qwen2_5_vl_3b --shape qwen2_5_vl_3b \\
        --frames 32 --mean-length 64 --max-length 256 --jobs 3     # bench/job_residue.sh
"""

from __future__ import annotations

import argparse
import gc
import sys
import warnings
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

GiB = 2**30


def reachable_cuda_tensors() -> dict[int, tuple[int, object]]:
    """Storage pointer -> (bytes, one tensor on it) over every CUDA tensor gc can see."""
    import torch

    found: dict[int, tuple[int, object]] = {}
    with warnings.catch_warnings():  # isinstance on torch's deprecated aliases warns
        warnings.simplefilter("ignore", FutureWarning)
        for o in gc.get_objects():
            try:
                if isinstance(o, torch.Tensor) and o.is_cuda:
                    st = o.untyped_storage()
                    found.setdefault(st.data_ptr(), (st.nbytes(), o))
            except (RuntimeError, ReferenceError):  # a tensor subclass without storage
                continue
    return found


def holder(obj: object, depth: int = 4) -> str:
    """A short chain of what refers to `obj` (type names, module and function names)."""
    chain, seen = [], {id(obj)}
    for _ in range(depth):
        refs = [
            r
            for r in gc.get_referrers(obj)
            if id(r) not in seen and type(r).__name__ not in ("frame", "list")
        ]
        if not refs:
            break
        obj = refs[0]
        seen.add(id(obj))
        name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
        chain.append(f"{type(obj).__name__}{f'({name})' if name else ''}")
    return " <- ".join(chain)


def rollplex_objects() -> Counter[str]:
    return Counter(
        f"{type(o).__module__}.{type(o).__qualname__}"
        for o in gc.get_objects()
        if str(getattr(type(o), "__module__", "")).startswith("rollplex.")
    )


def main() -> None:
    import torch
    from gpu_step import add_one_schedule_arguments, compose_spec, overrides

    from rollplex.jobs import run_job

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_one_schedule_arguments(ap, steps=1)
    ap.add_argument("--jobs", type=int, default=3)
    ap.add_argument("--out", default="bench/results/gpu_profile")
    ap.add_argument("--by-op", action="store_true", help="each job's peak split by plan op")
    ap.add_argument("--max-entries", type=int, default=2_000_000)
    args = ap.parse_args()
    out = Path(args.out)
    cuda = args.device == "cuda"  # on CPU (a smoke run) only the objects are counted
    by_op = args.by_op and cuda
    if by_op:
        from memory_peak import tag_allocations_with_op

        torch.autograd.set_multithreading_enabled(False)  # the op tag is per thread
        tag_allocations_with_op(torch)
    before = rollplex_objects()
    rows, peaks = [], []
    for job in range(args.jobs):
        spec = compose_spec(overrides(args, args.schedule))
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        if by_op:
            torch.cuda.memory._record_memory_history(max_entries=args.max_entries, context=None)
        summary = run_job(spec, out / "residue_runs" / f"job{job}")
        if by_op:
            peaks.append(peak_by_op(torch))
        gc.collect()
        tensors = reachable_cuda_tensors()
        seen = sum(b for b, _ in tensors.values())
        allocated = torch.cuda.memory_allocated() if cuda else 0
        peak = summary["cuda_max_memory_allocated"] if cuda else 0  # the executor's windows too
        rows.append((job, allocated, seen, peak))
        print(
            f"after job {job}: allocated {allocated / GiB:.3f} GiB, reachable CUDA tensors "
            f"{len(tensors)} ({seen / GiB:.3f} GiB), the job's peak {peak / GiB:.2f} GiB",
            flush=True,
        )
        largest = sorted(tensors.values(), key=lambda bt: -bt[0])[:8]
        for nbytes, t in largest:
            print(f"  {nbytes / 2**20:9.1f} MiB {tuple(t.shape)} {t.dtype}: {holder(t)}")
        grown = rollplex_objects() - before
        print("  rollplex objects alive beyond the start:", dict(grown.most_common(12)))
    print(
        "\n| job | allocated after (GiB) | reachable tensors (GiB) | held elsewhere (GiB) "
        "| job peak (GiB) |"
    )
    print("|---|---:|---:|---:|---:|")
    for job, allocated, seen, peak in rows:
        print(
            f"| {job} | {allocated / GiB:.3f} | {seen / GiB:.3f} | "
            f"{(allocated - seen) / GiB:.3f} | {peak / GiB:.2f} |"
        )
    if peaks:
        print_peaks(peaks)


def peak_by_op(torch) -> dict[str, float]:
    """GiB live at this job's replayed allocator peak, by the op that allocated each block
    (memory_peak.py's replay), and the peak itself under "(peak)"; recording stops."""
    from memory_peak import peak_blocks

    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    peak, live = peak_blocks(snapshot)
    out: Counter[str] = Counter()
    for b in live.values():
        out[b.op or "(untagged)"] += b.size / GiB
    return {"(peak)": peak / GiB, **dict(out.most_common())}


def print_peaks(peaks: list[dict[str, float]]) -> None:
    """One row per op, one column per job, largest first in the last job."""
    ops = sorted({op for p in peaks for op in p}, key=lambda op: -peaks[-1].get(op, 0.0))
    jobs = range(len(peaks))
    print(
        "\n| live at the job's peak, allocated by | "
        + " | ".join(f"job {j} (GiB)" for j in jobs)
        + " |"
    )
    print("|---|" + "---:|" * len(peaks))
    for op in ops:
        print(f"| `{op}` | " + " | ".join(f"{p.get(op, 0.0):.3f}" for p in peaks) + " |")


if __name__ == "__main__":
    main()
