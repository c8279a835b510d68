"""Response scoring on packed rows vs padded rows, or with compiled layer pieces vs eager
ones (`--compare compile`), side by side in A/B rounds.

A random-weight Qwen2.5-VL LLM (`--shape`, bf16 on CUDA; the vision tower is not run,
random features stand in), `--prompts` image prompts of about `--prompt` tokens, G =
`--group` responses each, lengths drawn as the long-responses workload draws them
(lognormal, `--mean-length`, sigma `--sigma`, capped at `--max-length`). The same responses
scored two ways (backends/torch/packed_rows.py):

- padded: every decoder layer and the LM head over [rows, longest] (before packing);
- packed: over the rows' real tokens only, attention unpacked to the padded layout.

`--compare compile` runs both arms packed: eager transformers layers, or with their norms,
MLPs and attention merge compiled (backends/torch/compiled_pieces.py, the CUDA default);
`--out` then defaults to bench/results/gpu_compiled_pieces/.

For each: the reference scorer's no-grad scoring, and the training forward + backward
(checkpointed prefix forward, `response_micro_batches` in `--micro` micro-batches with
checkpointed layers, then the backward). Rounds alternate the order (padded packed |
packed padded), so drift lands on both sides; each ratio (padded s / packed s) is the mean
over rounds with its half-width. Agreement: max |logprob diff| over real tokens (bf16) and
the first and last decoder layers' gradients' relative difference.

    python bench/gpu_packed_rows.py --shape qwen2_5_vl_7b      # one GPU, ~3 min
    python bench/gpu_packed_rows.py --device cpu --shape tiny --prompts 2 --group 4 \\
        --prompt 64 --mean-length 8 --max-length 16 --rounds 2   # dry run

Prints a table last; writes $OUT/gpu_packed_rows.json (else bench/results/gpu_packed_rows/).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_shared_prefix import measured, random_llm, train_step

from rollplex.backends.torch.compiled_pieces import compile_text_pieces, eager_text_pieces
from rollplex.backends.torch.logprob import response_logprobs, response_mask
from rollplex.backends.torch.values import Responses
from rollplex.engine.prefix import prefix_forward
from rollplex.specs import MODEL_PRESETS

ARMS = {"packing": ("padded", "packed"), "compile": ("eager", "compiled")}


def score(model, batch, feats, responses: Responses, packed: bool) -> torch.Tensor:
    with torch.no_grad():
        prefix = prefix_forward(model, batch, feats, grad=False)
        return response_logprobs(model, prefix, responses.tokens, responses.lengths, packed=packed)


def sampled_grads(model) -> list[torch.Tensor]:
    """The first and last decoder layers' gradients, on the host: a full fp32 copy of a 7B
    model's would not fit beside it on one 80 GB GPU."""
    last = len(model.model.language_model.layers) - 1
    keep = (".layers.0.", f".layers.{last}.")
    named = model.named_parameters()
    return [
        p.grad.float().cpu() for n, p in named if p.grad is not None and any(k in n for k in keep)
    ]


def lognormal_lengths(n: int, mean: float, sigma: float, cap: int, gen) -> torch.Tensor:
    """Response lengths as the workload draws them: lognormal of this mean, capped."""
    mu = math.log(mean) - sigma**2 / 2
    x = torch.exp(mu + sigma * torch.randn(n, generator=gen))
    return x.round().clamp(1, cap).long()


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--shape", default="qwen2_5_vl_7b")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=1100, help="prompt tokens (image + text)")
    ap.add_argument("--mean-length", type=float, default=448)
    ap.add_argument("--sigma", type=float, default=0.45)
    ap.add_argument("--max-length", type=int, default=1024)
    ap.add_argument("--micro", type=int, default=3, help="training micro-batches")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--compare", choices=tuple(ARMS), default="packing")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    dev = torch.device(args.device)
    start = time.perf_counter()
    spec = MODEL_PRESETS[args.shape]
    model, batch, feats, gen = random_llm(spec, args.prompts, args.prompt, dev)
    dtype = model.dtype
    n, g = args.prompts * args.group, args.group
    lengths = lognormal_lengths(n, args.mean_length, args.sigma, args.max_length, gen)
    width = int(lengths.max())
    tokens = torch.randint(10, min(spec.vocab_size, 150000), (n, width), generator=gen)
    responses = Responses(tokens.to(dev), lengths.to(dev))
    valid = response_mask(responses.lengths, width)

    ops = {
        "score (no grad)": lambda packed: score(model, batch, feats, responses, packed),
        f"train fwd+bwd (micro {args.micro})": lambda packed: train_step(
            model, batch, feats, responses, g, args.micro, partial(response_logprobs, packed=packed)
        ),
    }
    arms = ARMS[args.compare]
    base, cand = arms

    def run(fn, arm: str):
        if args.compare == "compile":  # both arms packed
            (compile_text_pieces if arm == "compiled" else eager_text_pieces)(model)
            return fn(True)
        return fn(arm == "packed")

    times: dict[str, dict[str, list[float]]] = {op: {p: [] for p in arms} for op in ops}
    peaks: dict[str, dict[str, int]] = {op: {p: 0 for p in arms} for op in ops}
    agree: dict[str, float] = {}
    for op, fn in ops.items():
        outs: dict[str, torch.Tensor] = {}
        grads: dict[str, list[torch.Tensor]] = {}
        for rnd in range(args.rounds):
            for path in arms if rnd % 2 == 0 else arms[::-1]:
                out, s, peak = measured(lambda path=path, fn=fn: run(fn, path), dev, 1)
                times[op][path].append(s)
                peaks[op][path] = max(peaks[op][path], peak)
                outs[path] = out.detach().float()
                if op.startswith("train") and path not in grads:
                    grads[path] = sampled_grads(model)
                model.zero_grad(set_to_none=True)
                print(f"{op} round {rnd} {path}: {s:.3f} s", flush=True)
        agree[f"{op}: max |logprob diff|"] = float((outs[base] - outs[cand]).abs()[valid].max())
        if grads:
            num = sum(
                float((a - b).norm() ** 2) for a, b in zip(grads[cand], grads[base], strict=True)
            )
            den = sum(float(b.norm() ** 2) for b in grads[base])
            agree[f"{op}: gradient rel diff"] = (num / den) ** 0.5
        del outs, grads

    rows = []
    for op in ops:
        ratios = [a / b for a, b in zip(times[op][base], times[op][cand], strict=True)]
        half = (max(ratios) - min(ratios)) / 2
        rows.append(
            {
                "op": op,
                f"{base}_s": times[op][base],
                f"{cand}_s": times[op][cand],
                "ratio": statistics.mean(ratios),
                "spread": half,
                "peak_gib": {p: peaks[op][p] / 2**30 for p in arms},
            }
        )
    device = torch.cuda.get_device_name() if dev.type == "cuda" else "cpu"
    result = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "device": device,
        "torch": torch.__version__,
        "command": "python " + " ".join(sys.argv),
        "shape": args.shape,
        "rows": n,
        "prefix_tokens": int(batch.input_ids.shape[1]),
        "longest": width,
        "response_tokens": int(lengths.sum()),
        "padded_tokens": n * width,
        "compare": args.compare,
        "agreement": agree,
        "ops": rows,
        "wall_s": time.perf_counter() - start,
    }
    out_dir = Path(os.environ["OUT"]) if os.environ.get("OUT") else args.out
    name = "gpu_packed_rows" if args.compare == "packing" else "gpu_compiled_pieces"
    out_dir = out_dir or Path(__file__).parent / "results" / name
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{name}.json").write_text(json.dumps(result, indent=1))
    print(
        f"\n{device}, {args.shape} {dtype}, {n} rows, prefix {result['prefix_tokens']}, "
        f"{result['response_tokens']} response tokens of {result['padded_tokens']} padded "
        f"(longest {width})"
    )
    ratio = f"{base}/{cand}"
    print(f"{'op':<28}{base + ' s':>10}{cand + ' s':>10}{ratio:>17}{'+-':>7}")
    for r in rows:
        a, b = statistics.median(r[f"{base}_s"]), statistics.median(r[f"{cand}_s"])
        print(f"{r['op']:<28}{a:>10.3f}{b:>10.3f}{r['ratio']:>17.3f}{r['spread']:>7.3f}")
    for k, v in agree.items():
        print(f"{k}: {v:.3e}")


if __name__ == "__main__":
    main()
