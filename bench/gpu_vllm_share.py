"""vLLM reading the trainer's storage (`backend.vllm.weights=share`) against its own copy
(`weights=load`), side by side in one process on one GPU (issue 10, item 3).

For each mode: a torch trainer (bf16, AdamW) on a model folder, an in-process vLLM engine
on the same folder (no sleep, a fixed KV pool), then three rounds of (an AdamW step on
seeded random gradients, the weight sync the plan's `weight_sync` runs) and greedy tokens
for a fixed batch of prompts. Records the device memory the engine adds beyond the
trainer (live tensor bytes, `memory_allocated`: vLLM allocates through torch's caching
allocator without sleep mode; and the device-wide use, `mem_get_info` after `empty_cache`),
each mode in a process of its own,
the sync time, and whether both modes produce the same tokens after the same updates.

    python bench/gpu_vllm_share.py --folder /tmp/qwen2_5_vl_3b --shape qwen2_5_vl_3b --out $OUT

Run through the device tool after `bash bench/gpu_train_vllm.sh prepare` (see
bench/gpu_vllm_share.sh). Prints a short table last; writes vllm_share.json/.md.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

import torch

GIB = 1 << 30


def used() -> tuple[int, int]:
    """(bytes of live tensors, bytes the device has in use): vLLM allocates through torch's
    caching allocator here (no sleep mode), so the first counts its weights and KV too."""
    torch.cuda.synchronize()
    gc.collect()
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info()
    return torch.cuda.memory_allocated(), total - free


def run(mode: str, args) -> dict:
    from vllm import SamplingParams

    from rollplex.backends.torch.model import model_for
    from rollplex.backends.torch.trainer import TorchTrainer
    from rollplex.backends.vllm.build import check_shareable
    from rollplex.backends.vllm.rollout import VllmRollout
    from rollplex.specs import MODEL_PRESETS, AlgoSpec
    from rollplex.specs.vllm import VllmSpec

    spec = MODEL_PRESETS[args.shape].model_copy(update={"path": args.folder})
    base = used()
    trainer = TorchTrainer(model_for(spec, 0, torch.device("cuda")), spec, AlgoSpec(lr=1e-4))
    with_trainer = used()
    vspec = VllmSpec(
        dtype="bfloat16",
        weights=mode,
        sleep="never",
        enable_sleep_mode=False,
        max_model_len=2048,
        kv_cache_bytes=args.kv_gib * GIB,
        gpu_memory_utilization=0.3,
        enforce_eager=False,
    )
    if mode == "share":
        check_shareable(trainer, vspec)
    t0 = time.perf_counter()
    rollout = VllmRollout(args.folder, vspec, kv_cache_bytes=args.kv_gib * GIB)
    if mode == "share":
        try:
            rollout.share_storage(trainer.model, spec)
        except Exception:  # say what the engine calls its tensors, for the fix
            (engine,) = rollout.llm.apply_model(lambda m: m)
            for name, t in list(engine.named_parameters())[:40]:
                print(name, tuple(t.shape), t.dtype, t.is_contiguous())
            raise
    start_s = time.perf_counter() - t0
    with_engine = used()
    gen = torch.Generator().manual_seed(0)
    prompts = [
        {"prompt_token_ids": torch.randint(100, 20000, (64,), generator=gen).tolist()}
        for _ in range(args.prompts)
    ]
    greedy = SamplingParams(temperature=0.0, max_tokens=args.tokens, ignore_eos=True)

    def tokens(engine: VllmRollout) -> list[list[int]]:
        out = engine.llm.generate(prompts, greedy, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in out]

    before = tokens(rollout)
    syncs = []
    torch.manual_seed(1)
    for _ in range(3):
        for p in trainer.params:
            p.grad = torch.randn_like(p) * 1e-2
        trainer.optimizer.step()
        trainer.optimizer.zero_grad(set_to_none=True)
        trainer.counter.n += 1
        torch.cuda.synchronize()
        t = time.perf_counter()
        rollout.load_weights(trainer.live_weights())
        torch.cuda.synchronize()
        syncs.append(time.perf_counter() - t)
    after = tokens(rollout)
    shared = rollout.shared
    # Can later work use what sharing freed? Allocate the trainer's size again in 256 MiB
    # pieces (as gradients or AdamW state would be) and see how much the device grows.
    probe_before = used()
    pieces = [
        torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
        for _ in range(int(with_trainer[0] - base[0]) >> 28)
    ]
    probe_after = used()
    pieces.clear()
    record = {
        "mode": mode,
        "trainer_bytes": with_trainer[0] - base[0],
        "engine_added_bytes": with_engine[0] - with_trainer[0],
        "engine_added_device_bytes": with_engine[1] - with_trainer[1],
        "probe_allocated_bytes": probe_after[0] - probe_before[0],
        "probe_device_growth_bytes": probe_after[1] - probe_before[1],
        "engine_start_s": start_s,
        "sync_s": syncs,
        "sync_s_median": statistics.median(syncs),
        "shared_bytes": shared.shared_bytes if shared else 0,
        "rebuilt_bytes": shared.rebuilt_bytes if shared else 0,
        "tokens_changed_by_update": sum(a != b for a, b in zip(before, after, strict=True)),
        "tokens_after": after,
    }
    rollout.shutdown()
    rollout = trainer = shared = None
    used()
    return record


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--folder", required=True)
    ap.add_argument("--shape", default="qwen2_5_vl_3b")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--kv-gib", type=int, default=4)
    ap.add_argument("--out", type=Path, default=Path("bench/results/vllm_share"))
    ap.add_argument("--one", choices=["load", "share"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:  # one mode in this process, its record to stdout's last line
        print("RECORD " + json.dumps(run(args.one, args)))
        return
    records = []
    for mode in ("load", "share"):  # one process each: nothing of one run stays for the next
        cmd = [sys.executable, __file__, *sys.argv[1:], "--one", mode]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        lines = [x for x in proc.stdout.splitlines() if x.startswith("RECORD ")]
        if proc.returncode or not lines:
            print(proc.stdout[-3000:], proc.stderr[-3000:])
            raise SystemExit(f"{mode} run failed ({proc.returncode})")
        records.append(json.loads(lines[-1][7:]))
    load, share = records
    same = sum(a == b for a, b in zip(load["tokens_after"], share["tokens_after"], strict=True))
    result = {
        "date": date.today().isoformat(),
        "device": torch.cuda.get_device_name(),
        "command": f"python bench/gpu_vllm_share.py --folder <{args.shape} folder> "
        f"--shape {args.shape} --prompts {args.prompts} --tokens {args.tokens} "
        f"--kv-gib {args.kv_gib}",
        "records": [{k: v for k, v in r.items() if k != "tokens_after"} for r in records],
        "saved_bytes": load["engine_added_bytes"] - share["engine_added_bytes"],
        "prompts_with_equal_tokens_after_updates": same,
        "prompts": args.prompts,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "vllm_share.json").write_text(json.dumps(result, indent=1))
    lines = [
        "| weights | trainer GiB | engine adds GiB (device-wide) | shared GiB "
        "| sync ms (median of 3) | prompts whose tokens the updates changed "
        "| device grows when the trainer's size is allocated after |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in records:
        lines.append(
            f"| {r['mode']} | {r['trainer_bytes'] / GIB:.2f} | {r['engine_added_bytes'] / GIB:.2f}"
            f" ({r['engine_added_device_bytes'] / GIB:.2f}) | {r['shared_bytes'] / GIB:.2f}"
            f" | {r['sync_s_median'] * 1e3:.1f} | "
            f"{r['tokens_changed_by_update']}/{args.prompts} | "
            f"{r['probe_device_growth_bytes'] / GIB:.2f} of "
            f"{r['probe_allocated_bytes'] / GIB:.2f} |"
        )
    lines.append(
        f"\nsaved {result['saved_bytes'] / GIB:.2f} GiB; greedy tokens after the same three "
        f"updates equal in {same}/{args.prompts} prompts (load vs share)"
    )
    (args.out / "vllm_share.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
