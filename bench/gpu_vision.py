"""Vision encode on one GPU: transformers' per-window SDPA against one varlen call over
`cu_seqlens` (`rollplex/backends/torch/vision_attention.py`), side by side in one process.

The Qwen2.5-VL-7B vision tower (the 3B's differs only in the merger's output width) with
random bf16 weights, on videos of 8 frames at 448x448 (grid 4 x 32 x 32: 4,096 patches
each) and on 448x448 images; per batch the median time of `--repeats` forwards after two
warm-ups, the tower's FLOPs from the cost model (`ops/formulas/vision.py`), achieved
TFLOP/s against the H200's dense bf16 peak, and the largest difference between the two
modes' outputs.

    python bench/gpu_vision.py --out bench/results/gpu_vision

Writes vision.json / vision.md under --out and prints the table last.
"""

from __future__ import annotations

import argparse
import json
import statistics
from datetime import UTC, datetime
from pathlib import Path

import torch
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import (
    Qwen2_5_VisionTransformerPretrainedModel,
)

from rollplex.backends.torch import vision_attention
from rollplex.backends.torch.vision_attention import VARLEN, compile_vision_blocks
from rollplex.ops.formulas import vision as F
from rollplex.specs import HARDWARE_PRESETS, MODEL_PRESETS

CASES = {  # name: (grid_t, grid_h, grid_w) of one input
    "video 8f 448x448": (4, 32, 32),
    "image 448x448": (1, 32, 32),
}


def timed(fn, repeats: int) -> float:
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return statistics.median(times)


def per_block_longest(cu_seqlens: torch.Tensor) -> int:
    """The longest window derived in every block (a host sync each), as before the cache."""
    return int((cu_seqlens[1:] - cu_seqlens[:-1]).max())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="qwen2_5_vl_7b")
    ap.add_argument("--batches", default="1,4,8")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path("bench/results/gpu_vision"))
    args = ap.parse_args()
    spec = MODEL_PRESETS[args.shape]
    peak = HARDWARE_PRESETS["h200"].bf16_tflops
    cfg = spec.to_hf_config().vision_config
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    tower = Qwen2_5_VisionTransformerPretrainedModel._from_config(cfg, dtype=torch.bfloat16)
    tower = tower.cuda().eval()
    rows, outputs = [], {}
    # every mode over every input; "compiled" is varlen with the blocks torch.compile'd
    # (in place, after the eager modes ran); "compiled_sync" the same with the longest
    # window derived in each block (one host sync a block, what transformers < 5.19 does)
    cached_longest = vision_attention._longest
    for mode in ("sdpa", "varlen", "compiled", "compiled_sync"):
        tower.config._attn_implementation = "sdpa" if mode == "sdpa" else VARLEN
        if mode == "compiled":
            compile_vision_blocks(tower)
        vision_attention._longest = per_block_longest if mode == "compiled_sync" else cached_longest
        i = 0
        for case, (t, h, w) in CASES.items():
            for b in map(int, args.batches.split(",")):
                grid = torch.tensor([[t, h, w]] * b, device="cuda")
                n = b * t * h * w
                gen = torch.Generator("cuda").manual_seed(b)
                pixels = torch.randn(
                    n, spec.vision.patch_dim, device="cuda", dtype=torch.bfloat16, generator=gen
                )
                flops = F.vision_encode(
                    spec, b, t * h * w, temporal_patches=t, grid_hw=(h, w)
                ).flops
                if mode == "sdpa":
                    rows.append({"case": case, "batch": b, "patches": n, "tflop": flops / 1e12})
                row = rows[i]
                i += 1

                def run(pixels=pixels, grid=grid) -> torch.Tensor:
                    with torch.no_grad():
                        res = tower(pixels, grid_thw=grid)
                    return getattr(res, "pooler_output", res)

                out = run().float()
                s = timed(run, args.repeats)
                row[f"{mode}_ms"] = s * 1e3
                row[f"{mode}_bf16_peak_share"] = flops / s / (peak * 1e12)
                if mode == "sdpa":
                    outputs[(case, b)] = out
                    row["output_abs_max"] = out.abs().max().item()
                else:
                    row[f"{mode}_max_abs_diff"] = (out - outputs[(case, b)]).abs().max().item()
                print(mode, row, flush=True)
    for row in rows:
        row["speedup"] = row["sdpa_ms"] / row["varlen_ms"]
        row["speedup_compiled"] = row["sdpa_ms"] / row["compiled_ms"]
        row["speedup_once_vs_per_block"] = row["compiled_sync_ms"] / row["compiled_ms"]
    result = {
        "date": datetime.now(UTC).date().isoformat(),
        "device": torch.cuda.get_device_name(),
        "command": f"python bench/gpu_vision.py --shape {args.shape} --batches "
        f"{args.batches} --repeats {args.repeats}",
        "torch": torch.__version__,
        "bf16_peak_tflops": peak,
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "vision.json").write_text(json.dumps(result, indent=1))
    lines = [
        "| input | batch | TFLOP | per-window SDPA ms (of peak) | varlen ms (of peak) | "
        "varlen + compiled blocks ms (of peak) | same, a sync per block | speedup (compiled) "
        "| max abs diff |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['case']} | {r['batch']} | {r['tflop']:.2f} | {r['sdpa_ms']:.1f} "
            f"({r['sdpa_bf16_peak_share']:.0%}) | {r['varlen_ms']:.1f} "
            f"({r['varlen_bf16_peak_share']:.0%}) | {r['compiled_ms']:.1f} "
            f"({r['compiled_bf16_peak_share']:.1%}) | {r['compiled_sync_ms']:.1f} "
            f"({r['compiled_sync_bf16_peak_share']:.1%}) | {r['speedup']:.2f}x "
            f"({r['speedup_compiled']:.2f}x) | "
            f"{r['compiled_max_abs_diff']:.3g} (of {r['output_abs_max']:.3g}) |"
        )
    (args.out / "vision.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
