"""A training forward's saved activations on a GPU, against the formula the plan prices.

The trainer runs every micro-batch's forward before any backward, so its `saved` value
holds every micro-batch's checkpointed layer inputs until the backward; the planner sizes
it with `ops.formulas.saved_activation_bytes` (tests/planner/test_micro_saved.py checks
the same on CPU, tiny model). Here: a `--shape`-shaped decoder and vision tower (random
weights, bf16 on CUDA) with a 512-token vocabulary (the built-in task's tokenizer; the
saved bytes per token do not depend on the vocabulary), `--prompts` images x G=`--group`
responses of `--width` tokens each (the padded width the runtime holds), the trainer's
forward in M micro-batches (prefix-shared: logprob_prefix + logprob_response; verl: the
per-sample logprob), then loss and backward. Per row of the table:
- held/planned: the `saved` values' bytes by the runtime's accounting (`Env.attribution`,
  inputs stored first, as the executor does) over the formula at the shapes that ran;
- alloc/planned: CUDA bytes the forward left allocated (its outputs included: the prefix
  K/V, logprobs, and what only the autograd graph holds) over the same formula;
- bwd_peak: CUDA peak over the backward, less what was allocated before it (GiB).

    python bench/gpu_micro_saved.py --shape qwen2_5_vl_3b     # one H200, about 2 min
    python bench/gpu_micro_saved.py --device cpu --shape tiny --size 56 --width 16

Writes $OUT/gpu_micro_saved_<shape>.json (else bench/results/gpu_micro_saved/) and prints
a table last.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

GIB = 1 << 30


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--shape", default="qwen2_5_vl_3b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--size", type=int, default=448, help="square image side (pixels)")
    ap.add_argument("--width", type=int, default=1024, help="response tokens (all at the cap)")
    ap.add_argument("--micro", default="1,2,4")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    import torch

    from rollplex.backends.torch.data import TaskData
    from rollplex.backends.torch.loss import group_advantages
    from rollplex.backends.torch.model import model_for
    from rollplex.backends.torch.trainer import TorchTrainer
    from rollplex.backends.torch.values import Pixels, Responses, TokenLogprobs
    from rollplex.ops.formulas import saved_activation_bytes
    from rollplex.runtime.memory import Env
    from rollplex.specs import MODEL_PRESETS, WORKLOAD_PRESETS, AlgoSpec

    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    tiny = MODEL_PRESETS["tiny"]
    spec = MODEL_PRESETS[args.shape].model_copy(
        update={"vocab_size": 512, "special_tokens": tiny.special_tokens, "path": None}
    )
    if cuda:
        spec = spec.model_copy(update={"dtype": "bfloat16"})  # what model_for runs on CUDA
    workload = WORKLOAD_PRESETS["tiny"].model_copy(
        update={
            "prompts_per_step": args.prompts,
            "group_size": args.group,
            "height": args.size,
            "width": args.size,
        }
    )
    batch = TaskData(spec, workload, seed=0).step(0).batch.to(dev)
    t0 = time.perf_counter()
    model = model_for(spec, seed=0, device=dev)
    build_s = time.perf_counter() - t0
    n, g, w = args.prompts * args.group, args.group, args.width
    gen = torch.Generator().manual_seed(0)
    responses = Responses(
        torch.randint(7, spec.vocab_size, (n, w), generator=gen).to(dev),
        torch.full((n,), w, device=dev),
    )
    old = TokenLogprobs(
        torch.full((n, w), -4.0, device=dev), torch.ones(n, w, dtype=torch.bool, device=dev)
    )
    adv = group_advantages(torch.rand(n, generator=gen).to(dev), g)

    def alloc() -> int:
        return torch.cuda.memory_allocated(dev) if cuda else 0

    rows = []
    for mode in ("shared", "verl"):
        for micro in [int(x) for x in args.micro.split(",")]:
            trainer = TorchTrainer(model, spec, AlgoSpec())
            trainer.micro_batches = micro
            with torch.no_grad():
                feats = trainer.vision_encode(Pixels.of(batch))
            text = batch.text_only()
            if cuda:
                torch.cuda.synchronize(dev)
            before = alloc()
            t = time.perf_counter()
            ins = {"weights": trainer.handle(), "responses": responses}
            if mode == "shared":
                state, saved_p = trainer.logprob_prefix(feats, text)
                logprobs, saved_r = trainer.logprob_response(state, responses, g)
                env = Env(device={**ins, "features": feats, "text": text, "state": state})
                env.device |= {"logprobs": logprobs, "saved_p": saved_p, "saved_r": saved_r}
                ids = text.input_ids
                held = env.attribution()
                held = held["saved_p"] + held["saved_r"]
                planned = saved_activation_bytes(
                    spec, ids.shape[0], ids.shape[1], 0, "prefix"
                ) + saved_activation_bytes(spec, n, 0, w, "response")
            else:
                text_g = text.repeat(g)
                logprobs, saved = trainer.logprob(feats.repeat(g), text_g, responses)
                env = Env(device={**ins, "text": text_g, "logprobs": logprobs, "saved": saved})
                held = env.attribution()["saved"]
                lengths = text_g.lengths
                planned = sum(
                    saved_activation_bytes(spec, hi - lo, int(lengths[lo:hi].max()), w, "full")
                    for lo, hi in logprobs.micro.rows
                )
            if cuda:
                torch.cuda.synchronize(dev)
            fwd_s = time.perf_counter() - t
            kept = alloc() - before
            if cuda:
                torch.cuda.reset_peak_memory_stats(dev)
            start = alloc()
            loss = trainer.loss(logprobs, old, adv, None)
            trainer.backward(loss)
            peak = (torch.cuda.max_memory_allocated(dev) - start) if cuda else 0
            ran = int(loss.metrics["train_micro_batches"])
            rows.append(
                {
                    "mode": mode,
                    "micro_batches": ran,
                    "planned_gib": planned / GIB,
                    "held_gib": held / GIB,
                    "held_over_planned": held / planned,
                    "alloc_over_planned": kept / planned if cuda else None,
                    "bwd_peak_gib": peak / GIB,
                    "forward_s": fwd_s,
                }
            )
            del trainer, loss, logprobs, env
            for p in model.parameters():
                p.grad = None
            if cuda:
                torch.cuda.empty_cache()

    out_dir = args.out or Path(os.environ.get("OUT", "bench/results/gpu_micro_saved"))
    out_dir.mkdir(parents=True, exist_ok=True)
    result = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(dev) if cuda else "cpu",
        "torch": torch.__version__,
        "command": "python bench/gpu_micro_saved.py " + " ".join(sys.argv[1:]),
        "shape": args.shape,
        "prompts": args.prompts,
        "group": g,
        "image": args.size,
        "response_width": w,
        "model_build_s": build_s,
        "rows": rows,
    }
    path = out_dir / f"gpu_micro_saved_{args.shape}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {path}")
    head = "| mode | M | planned GiB | held/planned | alloc/planned | bwd peak GiB | fwd s |"
    print(head)
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        a = r["alloc_over_planned"]
        print(
            f"| {r['mode']} | {r['micro_batches']} | {r['planned_gib']:.2f} | "
            f"{r['held_over_planned']:.3f} | {'-' if a is None else f'{a:.3f}'} | "
            f"{r['bwd_peak_gib']:.2f} | {r['forward_s']:.2f} |"
        )


if __name__ == "__main__":
    main()
