"""Runtime weight sharing on 2 GPUs (issue 10 item 3): what `rollout_sync=share` saves and
costs against the gather-and-copy rollout, with 2-way FSDP2 and the rollout in TP 1 / 2.

    torchrun --standalone --nproc-per-node 2 bench/gpu_fsdp_share.py sync --device cuda \\
        --shape qwen2_5_vl_3b --folder /tmp/qwen2_5_vl_3b --out OUT
    python bench/gpu_fsdp_share.py report --out OUT [name=run_folder ...]

`sync` (every rank): one trainer per storage layout (plain FSDP2, and o/down `Shard(1)`
for TP = world), then per rollout (gather; share TP 1; share TP world): the torch
allocator's bytes the rollout adds on top of the trainer (`memory_allocated` after it is
built, caches emptied: its steady state), the build's peak, the weight_sync time (median
of repeats after one warm-up, device synchronised), the bytes it aliases / rebuilds /
receives, and a check that every rollout tensor equals the gathered full parameter cut
to its layout (bit for bit, in the compute dtype). Rank 0 writes OUT/sync.json.

`report`: sync.json plus `rollplex train` run folders (median step time after the first,
CUDA peak of rank 0) -> OUT/fsdp_share.json and .md, and a short table on stdout (last).
Device-agnostic: `--device cpu` runs it on gloo with the tiny preset (a dry run).
"""

from __future__ import annotations

import argparse
import csv
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GIB = 1 << 30


def _device_sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _alloc(device: torch.device) -> int:
    gc.collect()
    if device.type != "cuda":
        return 0
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    return torch.cuda.memory_allocated(device)


def _check(rollout, trainer, share: bool) -> int:
    """Rollout tensors that differ from the gathered full parameter (cut to its layout)."""
    from torch.distributed.tensor import DTensor

    from rollplex.backends.fsdp.share import EMBED, rollout_slice

    dtype = next(rollout.model.parameters()).dtype
    full = {n: v.to(dtype) for n, v in trainer.full_parameters()}
    bad = 0
    for name, p in rollout.model.named_parameters(remove_duplicate=False):
        lo = p.to_local() if isinstance(p, DTensor) else p
        if share:
            tensor = name if name in rollout.sharing.tensors else EMBED
            want = rollout_slice(full, rollout.sharing, tensor, rollout.rank)
        else:
            want = full[name if name in full else EMBED].flatten()
        bad += not torch.equal(lo.detach().flatten(), want)
    del full
    return bad


def sync(args) -> None:
    from rollplex.backends.fsdp.build import build_rollout, build_trainer
    from rollplex.backends.step import StepConfig
    from rollplex.specs import MODEL_PRESETS, AlgoSpec
    from rollplex.specs.backend import BackendSpec
    from rollplex.specs.fsdp import FsdpSpec

    model = MODEL_PRESETS[args.shape]
    if args.folder:
        model = model.model_copy(update={"path": args.folder})
    config = StepConfig(model, AlgoSpec(), 0, 8, device=args.device)
    records, trainer, layout = [], None, None
    world = int(__import__("os").environ.get("WORLD_SIZE", "1"))
    cases = [("gather", 1), ("share", 1)] + ([("share", world)] if world > 1 else [])
    for mode, tp in cases:
        spec = BackendSpec(trainer="fsdp", fsdp=FsdpSpec(rollout_sync=mode, rollout_tp=tp))
        want = tp if mode == "share" and tp > 1 else 1  # the trainer's storage layout
        if trainer is None or layout != want:
            trainer = None
            gc.collect()
            t0 = time.perf_counter()
            share_spec = BackendSpec(
                trainer="fsdp", fsdp=FsdpSpec(rollout_sync="share", rollout_tp=want)
            )
            trainer, layout = build_trainer(config, share_spec), want
            trainer_s = time.perf_counter() - t0
        device = trainer.dist.device
        base = _alloc(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        t0 = time.perf_counter()
        rollout = build_rollout(config, trainer, spec)
        build_s = time.perf_counter() - t0
        peak = torch.cuda.max_memory_allocated(device) - base if device.type == "cuda" else 0
        extra = _alloc(device) - base
        times = []
        for _ in range(args.repeats + 1):
            _device_sync(device)
            dist.barrier()
            t0 = time.perf_counter()
            rollout.load_weights(trainer.live_weights())
            _device_sync(device)
            times.append(time.perf_counter() - t0)
        rec = {
            "mode": mode, "rollout_tp": tp, "rank": trainer.dist.rank, "world": world,
            "device": str(device), "trainer_build_s": trainer_s, "rollout_build_s": build_s,
            "extra_bytes_measured": extra, "build_peak_bytes": peak,
            "sync_s": times[1:], "sync_s_median": statistics.median(times[1:]),
            "mismatched_tensors": _check(rollout, trainer, mode == "share"),
            "full_copy_bytes": sum(p.numel() * p.element_size() for p in rollout.model.parameters())
            if mode == "gather" else None,
        }  # fmt: skip
        if mode == "share":
            rec["stats"] = rollout.stats()
        records.append(rec)
        del rollout
        _alloc(device)
        print(f"rank {rec['rank']} {mode} tp{tp}: +{extra / GIB:.2f} GiB, sync "
              f"{rec['sync_s_median'] * 1e3:.1f} ms, mismatches {rec['mismatched_tensors']}",
              flush=True)  # fmt: skip
    gathered = [None] * world
    dist.all_gather_object(gathered, records)
    if trainer.dist.rank == 0:
        args.out.mkdir(parents=True, exist_ok=True)
        flat = [r for rank in gathered for r in rank]
        (args.out / "sync.json").write_text(json.dumps(flat, indent=1))
    dist.barrier()
    dist.destroy_process_group()


def _run(folder: Path) -> dict:
    rows = list(csv.DictReader((folder / "metrics.csv").open()))
    times = [float(r["step_time_s"]) for r in rows]
    summary = json.loads((folder / "summary.json").read_text())
    return {
        "steps": len(rows), "step_time_s": times,
        "step_time_median_s": statistics.median(times[1:] or times),
        "cuda_max_memory_allocated_rank0": summary.get("cuda_max_memory_allocated"),
        "reward": [r["reward"] for r in rows],
    }  # fmt: skip


def report(args) -> None:
    out = {"sync": [], "train": {}}
    sync_file = args.out / "sync.json"
    if sync_file.exists():
        out["sync"] = json.loads(sync_file.read_text())
    for item in args.runs:
        name, _, path = item.partition("=")
        try:
            out["train"][name] = _run(Path(path))
        except (OSError, KeyError, ValueError) as e:  # a run that failed or timed out
            out["train"][name] = {"error": f"{type(e).__name__}: {e}"}
    rank0 = [r for r in out["sync"] if r["rank"] == 0]
    gather = next((r for r in rank0 if r["mode"] == "gather"), None)
    big = gather and (gather.get("full_copy_bytes") or 0) >= GIB
    unit, div = ("GiB", GIB) if big else ("MiB", 1 << 20)  # the tiny dry run: MiB
    lines = [
        f"| rollout | extra {unit}/GPU measured (accounted) | saved vs gather | aliased "
        f"{unit} | rebuilt {unit} | received {unit} | sync ms | vs gather | mismatches |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rank0:
        st = r.get("stats", {})
        saved = gather["extra_bytes_measured"] - r["extra_bytes_measured"] if gather else 0
        ratio = r["sync_s_median"] / gather["sync_s_median"] if gather else float("nan")
        acc = st.get("extra_bytes", r.get("full_copy_bytes", 0))
        lines.append(
            f"| {r['mode']} tp{r['rollout_tp']} | {r['extra_bytes_measured'] / div:.2f} "
            f"({acc / div:.2f}) | "
            f"{saved / div:.2f} | {st.get('shared_bytes', 0) / div:.2f} | "
            f"{st.get('rebuild_bytes', 0) / div:.2f} | {st.get('received_bytes', 0) / div:.2f}"
            f" | {r['sync_s_median'] * 1e3:.1f} | {ratio:.2f}x | {r['mismatched_tensors']} |"
        )
    one = out["train"].get("gpu1", {}).get("step_time_median_s")
    lines += ["", "| `rollplex train` | step s (median) | vs 1 GPU | peak GiB rank 0 |",
              "|---|---|---|---|"]  # fmt: skip
    for name, r in out["train"].items():
        if "error" in r:
            lines.append(f"| {name} | failed: {r['error'][:60]} | | |")
            continue
        rel = f"{r['step_time_median_s'] / one:.2f}x" if one else "n/a"
        peak = r["cuda_max_memory_allocated_rank0"]
        peak_s = f"{peak / GIB:.1f}" if peak else "n/a"
        lines.append(f"| {name} | {r['step_time_median_s']:.2f} | {rel} | {peak_s} |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fsdp_share.json").write_text(json.dumps(out, indent=1))
    (args.out / "fsdp_share.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["sync", "report"])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--shape", default="qwen2_5_vl_3b")
    ap.add_argument("--folder", default=None)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=ROOT / "bench/results/fsdp_share")
    ap.add_argument("runs", nargs="*", help="name=run_folder of `rollplex train` runs")
    args = ap.parse_intermixed_args()
    sync(args) if args.what == "sync" else report(args)


if __name__ == "__main__":
    main()
