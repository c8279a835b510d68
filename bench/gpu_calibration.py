"""Measure the torch backend's ops on a GPU and calibrate the cost model with them.

Random-weight Qwen2.5-VL (bf16, SDPA) at real shapes. For each op it prints the cost
model's predicted time, the measured median, and the achieved share of the bf16 and HBM
rooflines, then writes the measured times in the calibration format the planner reads
(`CostModel.calibrated`). Run on the GPU machine:

    python bench/gpu_calibration.py --model qwen2_5_vl_3b --out $OUT/calibration_h200.json

Decode here is the backend's plain eager loop (one forward per token, no CUDA graphs),
which FACTS.md says is Python-bound; its row shows how far it is from the HBM roofline.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from rollplex.backends.torch.decode import decode
from rollplex.backends.torch.logprob import response_logprobs
from rollplex.backends.torch.model import build_model
from rollplex.data.prompts import PromptInputs, collate_prompts
from rollplex.engine.prefix import expand_prefix, prefix_forward, vision_encode
from rollplex.ops import formulas as F
from rollplex.planner.cost_model import CostModel, write_calibration
from rollplex.specs import HARDWARE_PRESETS, MODEL_PRESETS, ModelSpec


def prompt(
    spec: ModelSpec, grid: tuple[int, int, int], text: int, gen: torch.Generator
) -> PromptInputs:
    st, v = spec.special_tokens, spec.vision
    patches = grid[0] * grid[1] * grid[2]
    visual = patches // v.merge_factor
    ids = torch.randint(10, min(spec.vocab_size, 150000), (text,), generator=gen)
    input_ids = torch.cat(
        [
            torch.tensor([st.vision_start_token_id]),
            torch.full((visual,), st.image_token_id),
            torch.tensor([st.vision_end_token_id]),
            ids,
        ]
    )
    types = torch.zeros_like(input_ids, dtype=torch.int32)
    types[1 : 1 + visual] = 1
    return PromptInputs(
        input_ids, torch.randn(patches, v.patch_dim, generator=gen), torch.tensor([grid]), types
    )


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up: kernels chosen, caches allocated
    times = []
    for _ in range(repeats):
        sync()
        t = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="qwen2_5_vl_3b")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument(
        "--train-prompts",
        type=int,
        default=2,
        help="prompts in the measured training step (its G expanded K/V copies are what bounds it)",
    )
    ap.add_argument("--image", type=int, default=896, help="square image edge in pixels")
    ap.add_argument("--text", type=int, default=256)
    ap.add_argument("--response", type=int, default=128)
    ap.add_argument("--decode-steps", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("calibration.json"))
    ap.add_argument("--device", default="cuda", help="cpu only for a smoke test")
    args = ap.parse_args()
    dev = torch.device(args.device)
    spec = MODEL_PRESETS[args.model].model_copy(update={"dtype": "bfloat16"})
    hw = HARDWARE_PRESETS["h200"]
    cm = CostModel(hw)
    torch.manual_seed(0)
    with dev:
        model = build_model(spec, seed=0, dtype=torch.bfloat16).to(dev).eval()
    gen = torch.Generator().manual_seed(0)
    edge = args.image // spec.vision.patch_size
    prompts = [prompt(spec, (1, edge, edge), args.text, gen) for _ in range(args.prompts)]
    pad = spec.special_tokens.pad_token_id
    batch = collate_prompts(prompts, pad)
    tbatch = collate_prompts(prompts[: args.train_prompts], pad).to(dev)
    tbatch.pixel_values = tbatch.pixel_values.to(torch.bfloat16)
    batch = batch.to(dev)
    batch.pixel_values = batch.pixel_values.to(torch.bfloat16)
    b, g, r = args.prompts, args.group, args.response
    prefix = int(batch.lengths.max())
    patches = edge * edge
    s = b * g
    responses = torch.randint(10, min(spec.vocab_size, 150000), (s, r), device=dev)
    lengths = torch.full((s,), r, device=dev)
    rows: list[tuple[str, str, float, float, F.Cost]] = []

    def record(name: str, kind: str, cost: F.Cost, fn: Callable[[], object]) -> None:
        predicted = cm.time(kind, cost).seconds
        measured = timed(fn, args.repeats)
        rows.append((name, kind, predicted, measured, cost))
        print(
            f"{name}: predicted {predicted * 1e3:.2f} ms, measured {measured * 1e3:.2f} ms",
            flush=True,
        )

    with torch.no_grad():
        feats = vision_encode(model, batch.pixel_values, batch.image_grid_thw)
        record(
            "vision_encode",
            "vision_encode",
            F.vision_encode(spec, b, patches),
            lambda: vision_encode(model, batch.pixel_values, batch.image_grid_thw),
        )
        record(
            "prefix (no grad)",
            "logprob_prefix",
            F.logprob(spec, b, prefix, r, "prefix"),
            lambda: prefix_forward(model, batch, feats, grad=False),
        )
        shared = prefix_forward(model, batch, feats, grad=False)
        state = expand_prefix(shared, g)  # the eager decode loop wants a row per sample
        record(
            "response logprob (no grad)",
            "logprob_response",
            F.logprob(spec, s, prefix, r, "response"),
            lambda: response_logprobs(model, shared, responses, lengths),  # as the roles run it
        )
        steps = args.decode_steps
        step_cost = F.decode_step(spec, s, prefix + steps // 2)
        record(
            f"decode x{steps} (eager loop)",
            "decode",
            step_cost.scaled(steps),
            lambda: decode(
                model,
                state,
                steps,
                1.0,
                1.0,
                torch.Generator(dev),
                eos_id=-1,
                pad_id=spec.special_tokens.pad_token_id,
            ),
        )

    tb, ts = args.train_prompts, args.train_prompts * g
    with torch.no_grad():
        tfeats = vision_encode(model, tbatch.pixel_values, tbatch.image_grid_thw)

    def train_step() -> None:
        st = prefix_forward(model, tbatch, tfeats, grad=True)  # G rows share each prefix
        lp = response_logprobs(model, st, responses[:ts], lengths[:ts])
        lp.sum().backward()
        model.zero_grad(set_to_none=True)

    train_cost = (
        F.logprob(spec, tb, prefix, r, "prefix", grad=True, checkpointing=False)
        + F.logprob(spec, ts, prefix, r, "response", grad=True, checkpointing=False)
        + F.backward(spec, tb, prefix, r, "prefix", checkpointing=False)
        + F.backward(spec, ts, prefix, r, "response", checkpointing=False)
    )
    record(f"train fwd+bwd ({tb} prompts x G)", "backward", train_cost, train_step)

    entries = [
        {
            "kind": kind,
            "op": name,
            "predicted_s": p,
            "measured_s": m,
            "flops": c.flops,
            "bytes": c.bytes,
        }
        for name, kind, p, m, c in rows
    ]
    name = torch.cuda.get_device_name() if dev.type == "cuda" else "cpu"
    write_calibration(args.out, name, entries)
    print(
        f"\n{args.model} bf16 on {name}: {b} prompts x G={g}, "
        f"prefix {prefix} tokens, responses {r} tokens; medians of {args.repeats}"
    )
    print(
        "| op | predicted ms | measured ms | measured/predicted | TFLOP/s (% of "
        f"{hw.bf16_tflops:.0f}) | GB/s (% of {hw.hbm_bandwidth_gbps:.0f}) |"
    )
    print("|---|---|---|---|---|---|")
    for name, _, p, m, c in rows:
        tf, gbs = c.flops / m / 1e12, c.bytes / m / 1e9
        print(
            f"| {name} | {p * 1e3:.2f} | {m * 1e3:.2f} | {m / p:.2f} | {tf:.0f} "
            f"({100 * tf / hw.bf16_tflops:.0f}%) | {gbs:.0f} "
            f"({100 * gbs / hw.hbm_bandwidth_gbps:.0f}%) |"
        )


if __name__ == "__main__":
    main()
