"""Piggybacked prefix rows on a decode step, against running them separately.

Random-weight bf16 Qwen2.5-VL LLMs in the presets' shapes; image prompts of ~600 tokens
(256 visual tokens of random features: the tower is not what is measured), G = 8 rows per
prompt decoding with the engine (CUDA graphs, compiled layers; rows never stop). The
trainer's prefix forward of `--chunk` prompts, the work the rollplex plan piggybacks, is
timed three ways, each side by side in one process:
- `separate`: `TorchTrainer.logprob_prefix` (transformers' forward with grad, checkpointed
  layers), what the runtime ran between decode segments before riding; plus one decode
  step (CUDA-graph replay): what the window spends on both, run one after the other;
- `ride`: one decode step with the chunk's rows in its GEMMs (`EngineSession.ride`, eager)
  plus `attach_ridden` (the differentiable prefix);
- `alone`: the ride's layer code over the chunk with no decode rows (no grad).
It also reports the ride's K/V and last logits against the separate forward's (relative
error in bf16). CUDA events, medians over `--repeats`.

    python bench/gpu_piggyback.py                       # H200: 3B and 7B, ~2 min
    python bench/gpu_piggyback.py --device cpu --models tiny --prompt 48 --repeats 2

Prints a table last and writes JSON to $OUT/gpu_piggyback.json (else
bench/results/gpu_piggyback/).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import torch

from rollplex.backends.torch.model import build_model
from rollplex.backends.torch.roles import freeze_for_graph
from rollplex.backends.torch.trainer import TorchTrainer
from rollplex.backends.torch.values import Features
from rollplex.data.prompts import collate_prompts
from rollplex.engine.prefix import cache_kv, prefix_forward
from rollplex.engine.riders import ride_alone
from rollplex.engine.session import DecodeEngine
from rollplex.specs import MODEL_PRESETS, AlgoSpec

sys.path.insert(0, str(Path(__file__).parent))
from gpu_decode import image_prompt


def timed(fn, dev: torch.device, repeats: int) -> tuple[float, object]:
    """(median seconds of `fn()`, its last result)."""
    times, out = [], None
    for _ in range(repeats):
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12))


def bench(name: str, rows: int, args, dev: torch.device) -> dict:
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    spec = MODEL_PRESETS[name]
    with dev:
        model = build_model(spec, seed=0, dtype=dtype).to(dev)
    freeze_for_graph(model, spec)
    trainer = TorchTrainer(model, spec, AlgoSpec())
    text = model.config.text_config
    gen = torch.Generator().manual_seed(0)
    prompts = [image_prompt(spec, args.prompt, gen) for _ in range(rows // args.group)]
    batch = collate_prompts(prompts, spec.special_tokens.pad_token_id).to(dev)
    chunk = collate_prompts(prompts[: args.chunk], spec.special_tokens.pad_token_id).to(dev)
    visual = int((chunk.mm_token_type_ids != 0).sum())
    feats = Features(
        torch.randn(visual, text.hidden_size, dtype=dtype, device=dev),
        [int(x) for x in (chunk.mm_token_type_ids != 0).sum(1)],
    )
    decode_feats = torch.randn(
        int((batch.mm_token_type_ids != 0).sum()), text.hidden_size, dtype=dtype, device=dev
    )
    decode_feats[:visual] = feats.values  # the chunk's prompts are the decode's first ones
    with torch.no_grad():
        prefix = prefix_forward(model, batch, decode_feats, grad=False)
    engine = DecodeEngine(model, keep_workspace=True)
    steps = 64 + 4 * args.repeats
    session = engine.start(
        prefix, args.group, steps, 1.0, 1.0, torch.Generator(dev).manual_seed(1), -1
    )
    session.advance(16)  # graphs captured
    t_step = timed(lambda: session.advance(4), dev, args.repeats)[0] / 4

    def separate():
        return trainer.logprob_prefix(feats, chunk)[0]

    t_sep, sep_state = timed(separate, dev, args.repeats)
    rows_in = trainer.ride_rows(feats, chunk)

    def ride():
        ridden = session.ride(rows_in)
        state, _ = trainer.attach_ridden(ridden, feats)
        return ridden, state

    t_ride, (ridden, ride_state) = timed(ride, dev, args.repeats)
    assert not ridden.alone, "the decode finished before the rides"
    with torch.no_grad():
        t_alone = timed(lambda: ride_alone(model, engine.forward.rotary, rows_in), dev, 2)[0]
    kv_err = max(
        max(rel(k1, k0), rel(v1, v0))
        for (k0, v0), (k1, v1) in zip(
            cache_kv(sep_state.cache), cache_kv(ride_state.cache), strict=True
        )
    )
    entry = {
        "model": name,
        "decode_rows": rows,
        "chunk_prompts": args.chunk,
        "chunk_tokens": int(chunk.input_ids.numel()),
        "decode_step_ms": 1e3 * t_step,
        "separate_prefix_ms": 1e3 * t_sep,
        "separate_total_ms": 1e3 * (t_step + t_sep),
        "ride_ms": 1e3 * t_ride,
        "ride_over_separate": t_ride / (t_step + t_sep),
        "ride_extra_over_step_ms": 1e3 * (t_ride - t_step),
        "alone_no_grad_ms": 1e3 * t_alone,
        "kv_rel_err_bf16": kv_err,
        "last_logits_rel_err": rel(ride_state.last_logits, sep_state.last_logits),
    }
    if dev.type == "cuda":
        entry["max_memory_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
    print(json.dumps(entry), flush=True)
    return entry


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--models", default="qwen2_5_vl_3b,qwen2_5_vl_7b")
    p.add_argument("--rows", default="32,128", help="decode rows (prompts x group)")
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--prompt", type=int, default=600)
    p.add_argument("--chunk", type=int, default=1, help="prompts per ridden chunk")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    dev = torch.device(args.device)
    out = []
    for name in args.models.split(","):
        for rows in (int(r) for r in args.rows.split(",")):
            out.append(bench(name, rows, args, dev))
            if dev.type == "cuda":  # the model and engine went with bench()'s frame
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
    where = Path(os.environ.get("OUT") or "bench/results/gpu_piggyback")
    where.mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name() if dev.type == "cuda" else "cpu"
    record = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "device": device,
        "command": "python bench/gpu_piggyback.py " + " ".join(sys.argv[1:]),
        "results": out,
    }
    (where / "gpu_piggyback.json").write_text(json.dumps(record, indent=1))
    cols = ["model", "decode_rows", "chunk_tokens", "decode_step_ms", "separate_prefix_ms"]
    cols += ["ride_ms", "ride_over_separate", "alone_no_grad_ms", "kv_rel_err_bf16"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for e in out:
        cells = [f"{e[c]:.3g}" if isinstance(e[c], float) else str(e[c]) for c in cols]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
