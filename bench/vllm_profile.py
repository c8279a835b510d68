"""Where a vLLM decode step's time goes: torch.profiler over the rollout role on one H200.

    python3 bench/vllm_profile.py --shape qwen2_5_vl_7b --batches 64,256 [--tokens 64]

Same engine, prompts and settings as bench/vllm_gpu.py (in-process, CUDA graphs on, prefix
cache warm, eos ignored, no logprobs). Per batch: a warm run, then a run of `--tokens` new
tokens under torch.profiler (CPU + CUDA activities). The GPU kernels are grouped by name
into GEMM, attention, sampling/logits, memcpy and other; the "busy" share is the union of
kernel intervals over the decode's wall time (the rest is the GPU waiting for the host:
scheduling, input preparation, graph launch). Per decode step: kernel ms by group, and the
HBM-roofline floor of the step (LM weights + KV read) for scale.
Writes $OUT/<shape>/vllm_profile.json and .md, and the batch's Chrome trace (gzip).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import vllm_gpu as vg  # the engine set-up and roofline of the decode bench

from rollplex.planner.simulate import union_length

GROUPS = (  # first match wins: attention before GEMM (FlashAttention 3 is a cutlass kernel)
    ("attention", re.compile(r"flash|attn|attention|fmha|paged|reshape_and_cache|rotary", re.I)),
    ("gemm", re.compile(r"gemm|cutlass|nvjet|matmul|xmma|cublas|splitk|wgmma", re.I)),
    (
        "sampling",
        re.compile(r"sampl|topk|top_k|sort|softmax|argmax|multinomial|exponential|gumbel", re.I),
    ),
    ("memcpy", re.compile(r"memcpy|memset", re.I)),
)


def group_of(name: str) -> str:
    return next((g for g, pat in GROUPS if pat.search(name)), "other")


def kernels(prof: Any) -> list[tuple[str, float, float]]:
    """(name, start_us, end_us) of every GPU-side event the profiler recorded."""
    from torch.autograd import DeviceType

    out = []
    for e in prof.events():
        if e.device_type == DeviceType.CUDA:
            out.append((e.name, e.time_range.start, e.time_range.end))
    return out


def summarize(ks: list[tuple[str, float, float]], wall_s: float, steps: int) -> dict[str, Any]:
    by_group: dict[str, float] = {}
    by_name: dict[str, float] = {}
    for name, a, b in ks:
        by_group[group_of(name)] = by_group.get(group_of(name), 0.0) + (b - a)
        by_name[name] = by_name.get(name, 0.0) + (b - a)
    busy_us = union_length([(a, b) for _, a, b in ks])
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:12]
    return dict(
        kernels=len(ks),
        wall_ms_per_step=1e3 * wall_s / steps,
        busy_ms_per_step=busy_us / 1e3 / steps,
        busy_share=busy_us / 1e6 / wall_s if wall_s > 0 else float("nan"),
        group_ms_per_step={g: v / 1e3 / steps for g, v in sorted(by_group.items())},
        top_kernels_ms_per_step=[(n[:90], v / 1e3 / steps) for n, v in top],
    )


def profile_batch(bench: Any, batch: int, tokens: int, out: Path, seed: int) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, profile

    g = bench.a.group_size
    media = vg.media_for(batch // g, seed)
    prefix = bench.rollout.prefix_prefill(
        bench.rollout.vision_encode(media), [bench.ids] * (batch // g)
    )
    bench.run(prefix, g, tokens, seed)  # warm: prompts cached, graphs captured
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        r = bench.run(prefix, g, tokens, seed)
    steps = max(1, r["steps"] - 1)  # the first token comes from the (cached) prefill
    rec = dict(batch=batch, tokens=tokens, steps=steps, advance_s=r["advance_s"])
    rec.update(summarize(kernels(prof), r["advance_s"], steps))
    floor = vg.roofline(
        bench.shape["lm_weight_bytes"],
        bench.shape["kv_bytes_per_token"],
        batch,
        r["prompt_len"],
        tokens,
        rec["wall_ms_per_step"] / 1e3,
    )
    rec.update(roofline_step_ms=floor["roofline_step_ms"], roofline_share=floor["roofline_share"])
    trace = out / f"vllm_profile_b{batch}.json"
    prof.export_chrome_trace(str(trace))
    with open(trace, "rb") as f, gzip.open(f"{trace}.gz", "wb") as z:
        shutil.copyfileobj(f, z)
    trace.unlink()
    return rec


def table(shape: str, rows: list[dict[str, Any]]) -> str:
    groups = ["gemm", "attention", "sampling", "memcpy", "other"]
    head = "| batch | step ms | roofline ms | share | GPU busy | " + " | ".join(groups) + " |"
    lines = [f"### vLLM decode profile, {shape}", "", head, "|" + "---|" * (5 + len(groups))]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['batch']} | error: {r['error'][:80]} |")
            continue
        gm = r["group_ms_per_step"]
        lines.append(
            f"| {r['batch']} | {r['wall_ms_per_step']:.2f} | {r['roofline_step_ms']:.2f} | "
            f"{r['roofline_share']:.0%} | {r['busy_share']:.0%} | "
            + " | ".join(f"{gm.get(g, 0.0):.2f}" for g in groups)
            + " |"
        )
    lines.append("")
    for r in rows:
        if "top_kernels_ms_per_step" in r:
            lines.append(f"top kernels at batch {r['batch']} (ms per step):")
            lines += [f"- {v:.3f} {n}" for n, v in r["top_kernels_ms_per_step"]]
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="qwen2_5_vl_7b")
    p.add_argument("--models-dir", default="/tmp")
    p.add_argument("--batches", default="64,256", type=lambda s: [int(x) for x in s.split(",")])
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    a = p.parse_args()
    out = Path(a.out) / a.shape
    out.mkdir(parents=True, exist_ok=True)
    args = vg.parse(
        ["--shapes", a.shape, "--batches", ",".join(map(str, a.batches)), "--out", str(out)]
    )
    res = vg.Results(out, {"profile": True, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ")})
    bench = vg.Bench(args, res)
    bench.start(a.shape, Path(a.models_dir) / a.shape)
    rows: list[dict[str, Any]] = []
    try:
        for i, b in enumerate(a.batches):
            try:
                rows.append(profile_batch(bench, b, a.tokens, out, 1000 * (i + 1)))
            except Exception as e:  # keep the other batches
                rows.append(dict(batch=b, error=f"{type(e).__name__}: {e}"))
            (out / "vllm_profile.json").write_text(json.dumps(rows, indent=1))
    finally:
        bench.stop(a.shape)
    md = table(a.shape, rows)
    (out / "vllm_profile.md").write_text(md)
    print(md, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
