"""Decode throughput and HBM roofline share: the static-cache engine vs the eager loop.

Random-weight Qwen2.5-VL LLMs in the presets' shapes (bf16 on CUDA), image prompts of
about 600 tokens (256 visual tokens with random features, so the vision tower is not run),
G = 8 samples per prompt, 256 new tokens, rows that never stop (eos -1). For each model and
batch (rows) it times the engine's decode steps (CUDA graphs; warm-up and capture run
first), and the old eager loop (decode.py) for a few steps at small batches only. The
roofline counts the LM weights plus each step's useful K/V reads (prefix once per prompt,
each row's own response), against the hardware preset's peak bandwidth. It also checks
that the engine's greedy tokens agree with the eager loop's on the first steps.

    python bench/gpu_decode.py                    # H200: 3B and 7B, batch 8..256, < 4 min
    python bench/gpu_decode.py --device cpu --models tiny --batches 8,16 --new 16 --prompt 48

Prints a table last and writes JSON to $OUT/gpu_decode.json (else bench/results/gpu_decode/).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path

import torch
from gpu_sampler_check import one_scan_draw  # bench/ is on sys.path as the script's folder

from rollplex.backends.torch.decode import DecodeSession
from rollplex.backends.torch.model import build_model
from rollplex.data.prompts import PromptInputs, collate_prompts
from rollplex.engine import step as step_module
from rollplex.engine.prefix import expand_prefix, prefix_forward
from rollplex.engine.roofline import (
    kv_bytes_per_token,
    kv_token_reads,
    lm_weight_bytes,
    roofline,
)
from rollplex.engine.session import DecodeEngine
from rollplex.specs import HARDWARE_PRESETS, MODEL_PRESETS, ModelSpec


def image_prompt(spec: ModelSpec, tokens: int, gen: torch.Generator) -> PromptInputs:
    """`tokens` tokens: one image of 256 merged tokens (32 x 32 patches, fewer for a short
    prompt) between vision markers, then random text."""
    st, v = spec.special_tokens, spec.vision
    edge = 32 if tokens >= 300 else 4
    visual = edge * edge // v.merge_factor
    text = max(1, tokens - visual - 2)
    ids = torch.randint(10, min(spec.vocab_size, 150000), (text,), generator=gen)
    st_ids = [st.vision_start_token_id, *[st.image_token_id] * visual, st.vision_end_token_id]
    input_ids = torch.cat([torch.tensor(st_ids), ids])
    types = torch.zeros_like(input_ids, dtype=torch.int32)
    types[1 : 1 + visual] = 1
    pixels = torch.zeros(edge * edge, v.patch_dim)
    return PromptInputs(input_ids, pixels, torch.tensor([[1, edge, edge]]), types)


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def bench_model(name: str, args, dev: torch.device, deadline: float) -> list[dict]:
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    spec = MODEL_PRESETS[name]
    with dev:
        model = build_model(spec, seed=0, dtype=dtype).to(dev).eval()
    hw = HARDWARE_PRESETS[args.hardware]
    text = model.config.text_config
    head_dim = text.hidden_size // text.num_attention_heads
    kv_tok = kv_bytes_per_token(
        text.num_hidden_layers, text.num_key_value_heads, head_dim, torch.finfo(dtype).bits // 8
    )
    weights = lm_weight_bytes(model)
    gen = torch.Generator().manual_seed(0)
    g, r = args.group, args.new
    engine = DecodeEngine(model, keep_workspace=True)  # SDPA, compiled layers on CUDA
    others = {a: DecodeEngine(model, keep_workspace=True, **VARIANTS[a]) for a in args.compare}
    rows_out = []
    for rows in args.batches:
        if time.perf_counter() > deadline:
            print(f"{name} batch {rows}: skipped (time budget spent)", flush=True)
            rows_out.append({"model": name, "batch": rows, "skipped": "time budget"})
            continue
        prompts = max(1, rows // g)
        batch = collate_prompts(
            [image_prompt(spec, args.prompt, gen) for _ in range(prompts)],
            spec.special_tokens.pad_token_id,
        ).to(dev)
        visual = int((batch.mm_token_type_ids != 0).sum())
        feats = torch.randn(visual, text.hidden_size, dtype=dtype, device=dev)
        with torch.no_grad():
            prefix = prefix_forward(model, batch, feats, grad=False)
        lengths = [int(x) for x in batch.lengths]

        graph_error = None
        try:
            warm, times = engine_runs(engine, prefix, g, r, dev, args.repeats)
        except RuntimeError as err:  # a capture failure still leaves the eager step's numbers
            graph_error = traceback.format_exc()[-3000:]
            print(
                f"{name} batch {rows}: CUDA graphs failed ({type(err).__name__}: {err}); eager "
                f"step\n{graph_error}",
                flush=True,
            )
            engine = DecodeEngine(model, use_graphs=False, keep_workspace=True)
            warm, times = engine_runs(engine, prefix, g, r, dev, args.repeats)
        steps = r - 1  # token 0 comes from the prefix logits; each step draws one more
        reads = kv_token_reads(lengths, g, steps)
        rep = roofline(weights, reads, kv_tok, steps, statistics.median(times), hw.hbm_bandwidth)
        entry = {
            "model": name,
            "batch": prompts * g,
            "prompts": prompts,
            "group": g,
            "prompt_tokens": max(lengths),
            "new_tokens": r,
            "engine_ms_per_step": 1e3 * rep.step_seconds,
            "engine_tokens_per_s": prompts * g / rep.step_seconds,
            "engine_hbm_share": rep.efficiency,
            "decode_bw_efficiency": rep.efficiency,
            "engine_attention": engine.attention_for(prompts),
            "bytes_per_step": rep.bytes_per_step,
            "cuda_graphs": engine.use_graphs,
            "graph_error": graph_error,
            "warmup_capture_s": warm,
            "workspace_bytes": engine.workspace.cache.nbytes() if engine.workspace else 0,
            "capture_retries": engine.capture_retries,  # captures CUDA invalidated, retaken
        }
        for attention, other in others.items():  # the same engine, another attention kernel
            draw = one_scan_draw() if attention == "one_scan" else contextlib.nullcontext()
            try:
                with draw:
                    _, t = engine_runs(other, prefix, g, r, dev, args.repeats)
            except RuntimeError as err:  # one variant's failure keeps the others' numbers
                entry[f"{attention}_error"] = traceback.format_exc()[-3000:]
                print(f"{name} batch {rows} {attention}: {type(err).__name__}: {err}", flush=True)
                other.release()
                continue
            o = roofline(weights, reads, kv_tok, steps, statistics.median(t), hw.hbm_bandwidth)
            entry[f"{attention}_ms_per_step"] = 1e3 * o.step_seconds
            entry[f"{attention}_hbm_share"] = o.efficiency
            entry[f"{attention}_capture_retries"] = other.capture_retries
            if other.attention == "sdpa":
                entry["sdpa_backend"] = sdpa_backend(model, other)
            if prompts * g not in args.profile:
                other.release()
        if prompts * g in args.profile and dev.type == "cuda":
            guarded(entry, kernel_profile, engine, prefix, g, dev)
            for variant, other in others.items():
                entry[f"{variant}_profile"] = {}
                guarded(entry[f"{variant}_profile"], kernel_profile, other, prefix, g, dev)
        if prompts * g <= args.eager_max_batch and time.perf_counter() < deadline:
            guarded(entry, eager_loop, model, prefix, g, args, dev, weights, kv_tok, lengths, hw)
            guarded(entry, greedy_agreement, model, engine, prefix, g, args.check_steps)
        if dev.type == "cuda":
            entry["max_memory_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
        print(json.dumps(entry), flush=True)
        rows_out.append(entry)
    engine.release()
    del model, others
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return rows_out


# Engines compared side by side with the default one (SDPA, compiled layers).
VARIANTS = {
    "cublas": {"skinny_gemm": False},  # cuBLAS for every projection, as before skinny.py
    "split_gemm": {"split_gemm": True},  # o and down on split partials (the default on CUDA)
    "no_split_gemm": {"split_gemm": False},  # o and down on cuBLAS, as before stop 26
    "autotune": {"compile": "max-autotune-no-cudagraphs"},  # Triton GEMMs vs cuBLAS per bucket
    "default_again": {},  # the default engine measured once more, last: an order check
    "unfused": {"fused_qkv": False},  # three q/k/v GEMMs a layer, as before the stacked copy
    "before": {"fused_qkv": False, "compile_sampler": False},  # the engine of compiled.md
    "split": {"attention": "split"},  # prefix once + each row's own response K/V
    "split_kernel": {"attention": "split", "split_kernel": True},  # on split_kernel.py
    "split_torch": {"attention": "split", "split_kernel": False},  # on compiled matmuls
    # the kernels also write the step's K/V (two launches a layer fewer; the default since
    # stop 24) and the cache's two index copies before them (the default before)
    "split_kernel_writes": {"attention": "split", "split_kernel": True, "kernel_writes_kv": True},
    "index_copy_kv": {"attention": "split", "split_kernel": True, "kernel_writes_kv": False},
    "sdpa": {"attention": "sdpa"},
    "one_scan": {},  # the draw before its two-level inverse CDF (gpu_sampler_check.py)
    "flex": {"attention": "flex"},
    "uncompiled": {"compile": False},
    "sdpa_uncompiled": {"attention": "sdpa", "compile": False},  # the engine before flex
}


def kernel_profile(engine, prefix, g: int, dev, steps: int = 4, top: int = 30) -> dict:
    """Kernels per decode step and the busiest kernels (us and launches per step), from
    torch.profiler over `steps` graph replays (or eager steps)."""
    from torch.profiler import ProfilerActivity, profile

    s = engine.start(prefix, g, steps + 8, 1.0, 1.0, torch.Generator(dev).manual_seed(1), -1)
    s.advance(2)  # graphs captured outside the profile
    sync(dev)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        s.advance(steps)
        sync(dev)
    kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
    busy: dict[str, float] = {}
    launches: dict[str, float] = {}
    for e in kernels:
        busy[e.name[:60]] = busy.get(e.name[:60], 0.0) + e.device_time / steps
        launches[e.name[:60]] = launches.get(e.name[:60], 0.0) + 1 / steps
    total = sum(busy.values())
    names = sorted(busy, key=lambda n: -busy[n])[:top]
    return {
        "kernels_per_step": len(kernels) / steps,
        "kernel_us_per_step": total,
        "top_kernels_us": {n: busy[n] for n in names},
        "top_kernels_launches": {n: launches[n] for n in names},
    }


def guarded(entry: dict, fn, *args) -> None:
    """entry |= fn(*args), or the error noted in the entry: one failing check does not lose
    the run's other numbers."""
    try:
        entry |= fn(*args)
    except RuntimeError as err:
        entry.setdefault("errors", []).append(f"{fn.__name__}: {type(err).__name__}: {err}"[:500])


def engine_runs(engine, prefix, g: int, r: int, dev, repeats: int) -> tuple[float, list[float]]:
    """(seconds of the warm-up run, which captures the graphs; seconds of each timed run's
    decode steps, session start excluded)."""

    def run() -> float:
        s = engine.start(prefix, g, r, 1.0, 1.0, torch.Generator(dev).manual_seed(1), -1)
        sync(dev)
        start = time.perf_counter()
        s.advance()
        sync(dev)
        return time.perf_counter() - start

    t0 = time.perf_counter()
    run()
    warm = time.perf_counter() - t0
    return warm, [run() for _ in range(repeats)]


def sdpa_backend(model, engine) -> str:
    """Which SDPA kernel takes the engine's attention shape: the memory-efficient one
    (fast), else cuDNN, else the math fallback (slow: it materialises the scores)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    cache = engine.workspace.cache
    k = cache.keys[0]
    q = torch.zeros(
        k.shape[0], k.shape[1], cache.mask.shape[2], k.shape[3], dtype=k.dtype, device=k.device
    )
    for name, backend in (
        ("efficient", SDPBackend.EFFICIENT_ATTENTION),
        ("cudnn", SDPBackend.CUDNN_ATTENTION),
    ):
        try:
            with sdpa_kernel([backend]):
                torch.nn.functional.scaled_dot_product_attention(q, k, k, attn_mask=cache.mask)
            return name
        except RuntimeError:
            continue
    return "math"


def eager_loop(model, prefix, g, args, dev, weights, kv_tok, lengths, hw) -> dict:
    """decode.py's per-token loop on the G-times expanded prefix, `eager_steps` steps."""
    n = args.eager_steps
    state = expand_prefix(prefix, g)

    def run() -> float:
        s = DecodeSession(model, state, n + 1, 1.0, 1.0, torch.Generator(dev).manual_seed(1), -1)
        sync(dev)
        start = time.perf_counter()
        s.advance()
        sync(dev)
        return time.perf_counter() - start

    with torch.no_grad():
        run()  # warm-up
        times = [run() for _ in range(args.repeats)]
    seconds = statistics.median(times)
    rep = roofline(weights, kv_token_reads(lengths, g, n), kv_tok, n, seconds, hw.hbm_bandwidth)
    return {
        "eager_ms_per_step": 1e3 * rep.step_seconds,
        "eager_tokens_per_s": state.rows / rep.step_seconds,
        "eager_hbm_share": rep.efficiency,
        "eager_steps": n,
    }


def greedy_agreement(model, engine, prefix, g, steps: int) -> dict:
    """Greedy tokens of the engine vs the eager loop over the first `steps` tokens: the
    share of rows equal throughout (bf16 rounding may flip a near-tie late), and the
    largest logprob gap on the tokens both drew."""
    with torch.no_grad():
        s = engine.start(prefix, g, steps, 0.0, 1.0, None, -1)
        s.advance()
        tokens, logprobs, _ = s.result()
        ref = DecodeSession(model, expand_prefix(prefix, g), steps, 0.0, 1.0, None, -1)
        ref.advance()
    same = (tokens == ref.tokens).cumprod(-1).bool()
    gap = (logprobs - ref.logprobs).abs()[same]
    return {
        "greedy_rows_equal": float(same[:, -1].float().mean()),
        "greedy_first_token_equal": float(same[:, 0].float().mean()),
        "greedy_max_logprob_gap": float(gap.max()) if gap.numel() else None,
    }


def _formatter(e: dict):
    def f(key: str, fmt: str) -> str:
        return format(e[key], fmt) if e.get(key) is not None else "-"

    return f


def table(rows: list[dict], hw_name: str, variants: list[str]) -> str:
    """Engine (default) ms/step and HBM share, each variant's, the eager loop's."""
    cols = ["engine", *variants, "eager"]
    head = "| model | batch | tokens/s | " + " | ".join(
        f"{c} ms/step | {c} HBM share ({hw_name})" for c in cols
    )
    lines = [head + " |", "|---|---|---|" + "---|---|" * len(cols)]
    for e in rows:
        if "skipped" in e:
            lines.append(f"| {e['model']} | {e['batch']} | skipped |" + " | |" * len(cols))
            continue
        f = _formatter(e)
        cells = []
        for c in cols:
            share = e.get(f"{c}_hbm_share")
            cells += [f(f"{c}_ms_per_step", ".2f"), f"{100 * share:.0f}%" if share else "-"]
        lines.append(
            f"| {e['model']} | {e['batch']} | {f('engine_tokens_per_s', ',.0f')} | "
            + " | ".join(cells)
            + " |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--models", default="qwen2_5_vl_3b,qwen2_5_vl_7b")
    ap.add_argument("--batches", default="8,32,64,128,256", help="rows (prompts x group)")
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=600, help="prompt tokens (image + text)")
    ap.add_argument("--new", type=int, default=256, help="new tokens per row")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--compare", default="flex,sdpa_uncompiled", help=f"engine variants: {list(VARIANTS)}"
    )
    ap.add_argument("--profile", default="", help="batches whose kernels are profiled")
    ap.add_argument("--eager-max-batch", type=int, default=8, help="eager loop up to this batch")
    ap.add_argument("--eager-steps", type=int, default=16)
    ap.add_argument("--check-steps", type=int, default=32, help="greedy agreement steps")
    ap.add_argument("--budget-s", type=float, default=200.0, help="skip configs after this")
    ap.add_argument(
        "--split-max-rows",
        type=int,
        default=None,
        help="split_gemm's row threshold for every engine here (skinny.SPLIT_MAX_ROWS)",
    )
    ap.add_argument("--hardware", default="h200")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    args.batches = [int(x) for x in args.batches.split(",")]
    args.compare = [a for a in args.compare.split(",") if a]
    args.profile = [int(x) for x in args.profile.split(",") if x]
    dev = torch.device(args.device)
    if args.split_max_rows is not None:  # read by the layer code when it compiles
        step_module.SPLIT_MAX_ROWS = args.split_max_rows
    # Every engine variant and model in this one process compiles the same layer functions
    # (their guards differ: module shapes, fused or not, one prompt or many); a run with
    # one engine compiles them 2-3 times, well inside dynamo's default limit of 8.
    torch._dynamo.config.recompile_limit = 64
    if dev.type == "cpu":
        torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    start = time.perf_counter()
    deadline = start + args.budget_s
    rows: list[dict] = []
    for name in args.models.split(","):
        rows += bench_model(name, args, dev, deadline)
    device = torch.cuda.get_device_name() if dev.type == "cuda" else "cpu"
    result = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "device": device,
        "torch": torch.__version__,
        "command": "python " + " ".join(sys.argv),
        "hardware_preset": args.hardware,
        "wall_s": time.perf_counter() - start,
        "rows": rows,
    }
    out = args.out
    if out is None:
        folder = (
            Path(os.environ["OUT"]) if os.environ.get("OUT") else Path("bench/results/gpu_decode")
        )
        out = folder / "gpu_decode.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"\nwrote {out} ({result['wall_s']:.0f} s, {device}, torch {torch.__version__})")
    print(table(rows, args.hardware, args.compare))


if __name__ == "__main__":
    main()
