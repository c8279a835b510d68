"""One decode step's attention alone, per layer, by the engine's attention kind.

For the 3B and 7B presets' head shapes (bf16), G = 8 rows per prompt, a prefix of
`--prefix` tokens and a decode of `--new` tokens, it times `attend_shared` (engine/
attention.py) over one layer's cache at response steps early, mid and late in the decode,
with the kv_len the engine's graphs use (kv_chunk 64). Each timing is a CUDA graph of
`--calls` attention calls (as the step's layers issue them), replayed `--repeats` times;
the median per call is reported, with the useful K/V bytes (the prompt's valid prefix
once, each row's own response keys) over that time.

    python bench/gpu_attention.py                       # H200: sdpa vs split, < 2 min
    python bench/gpu_attention.py --kinds sdpa,split,flex   # flex compiles per shape: slower
    python bench/gpu_attention.py --device cpu --models tiny --rows 8,16 --new 16 --prefix 40

Prints a table last and writes JSON to $OUT/gpu_attention.json (else
bench/results/gpu_decode/gpu_attention.json).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import torch
from cuda_timing import graph_ms  # bench/ is on sys.path as the script's folder

from rollplex.engine.attention import attend_shared
from rollplex.engine.cache import SharedPrefixKV, round_up
from rollplex.specs.model import MODEL_PRESETS

G, KV_CHUNK = 8, 64


def build(kind: str, spec, prompts: int, prefix: int, new: int, dev) -> SharedPrefixKV:
    """One layer's cache, the prefix and every response slot filled with random K/V."""
    d = spec.hidden_size // spec.num_heads
    cap = round_up(prefix, 64)
    cache = SharedPrefixKV(
        1,
        spec.num_kv_heads,
        d,
        spec.num_heads // spec.num_kv_heads,
        prompts,
        G,
        cap,
        new - 1,
        torch.bfloat16,
        dev,
        kind,
    )
    kv = torch.randn(prompts, spec.num_kv_heads, prefix, d, device=dev, dtype=torch.bfloat16)
    cache.load([(kv, kv.clone())], torch.full((prompts,), prefix, device=dev))
    for t in (*cache.keys, *cache.values):
        t[:, :, cap:].normal_()  # sdpa/flex: the response slots (split: nothing past cap)
    for t in (*cache.split.keys, *cache.split.values) if cache.split else ():
        t.normal_()
    return cache


def time_calls(cache, spec, step: int, calls: int, repeats: int, dev) -> float:
    """Median microseconds per attention call at response step `step`."""
    d = spec.hidden_size // spec.num_heads
    q = torch.randn(cache.prompts, spec.num_heads, G, d, device=dev, dtype=torch.bfloat16)
    attn = SimpleNamespace(scaling=d**-0.5)
    kv_len = cache.kv_len(round_up(step + 1, KV_CHUNK))
    if dev.type != "cuda":  # a check of the script, not a measurement
        start = time.perf_counter()
        for _ in range(calls):
            attend_shared(attn, q, cache, 0, kv_len)
        return (time.perf_counter() - start) * 1e6 / calls
    call = lambda: attend_shared(attn, q, cache, 0, kv_len)  # noqa: E731
    return 1e3 * graph_ms(call, calls, repeats, warmup=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="qwen2_5_vl_3b,qwen2_5_vl_7b")
    ap.add_argument("--rows", default="8,64,256")
    ap.add_argument("--kinds", default="sdpa,split")
    ap.add_argument("--prefix", type=int, default=600, help="prefix tokens per prompt")
    ap.add_argument("--new", type=int, default=1024, help="new tokens per row")
    ap.add_argument("--calls", type=int, default=28, help="attention calls per graph")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--budget-s", type=float, default=200.0, help="skip configs after this")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    dev = torch.device(args.device)
    torch.manual_seed(0)
    steps = sorted({0, args.new // 4 - 1, args.new - 2})
    deadline = time.perf_counter() + args.budget_s
    results = []
    for name in args.models.split(","):
        spec = MODEL_PRESETS[name]
        kv_token = 2 * spec.num_kv_heads * (spec.hidden_size // spec.num_heads) * 2  # K+V bf16
        for rows in map(int, args.rows.split(",")):
            prompts = rows // G
            for kind in args.kinds.split(","):
                if time.perf_counter() > deadline:
                    results.append({"model": name, "rows": rows, "kind": kind, "skipped": True})
                    continue
                cache = build(kind, spec, prompts, args.prefix, args.new, dev)
                done = -1
                for step in steps:
                    for s in range(done + 1, step + 1):
                        cache.open_step(torch.tensor([s], device=dev))
                    done = step
                    us = time_calls(cache, spec, step, args.calls, args.repeats, dev)
                    useful = prompts * kv_token * (args.prefix + G * (step + 1))
                    row = {"model": name, "rows": rows, "kind": kind, "step": step, "us": us}
                    row["useful_gbps"] = useful / us / 1e3
                    results.append(row)
                    print(json.dumps(row), flush=True)
                del cache
                if dev.type == "cuda":
                    torch.cuda.empty_cache()
    out = Path(os.environ.get("OUT") or "bench/results/gpu_decode")
    out.mkdir(parents=True, exist_ok=True)
    record = {
        "date": datetime.now(UTC).isoformat(),
        "device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "command": "python bench/gpu_attention.py " + " ".join(sys.argv[1:]),
        "args": vars(args),
        "results": results,
    }
    (out / "gpu_attention.json").write_text(json.dumps(record, indent=1))
    print(f"\nattention per layer call, us (useful K/V GB/s); prefix {args.prefix}, G {G}")
    kinds = args.kinds.split(",")
    print("| model | rows | step | " + " | ".join(kinds) + " |")
    print("|---|---|---|" + "---|" * len(kinds))
    done = [r for r in results if "us" in r]
    for name in args.models.split(","):
        for rows in map(int, args.rows.split(",")):
            for step in steps:
                cells = []
                for kind in kinds:
                    key = (name, rows, kind, step)
                    hit = [r for r in done if (r["model"], r["rows"], r["kind"], r["step"]) == key]
                    cell = f"{hit[0]['us']:.1f} ({hit[0]['useful_gbps']:.0f})" if hit else "-"
                    cells.append(cell)
                print(f"| {name} | {rows} | {step} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
