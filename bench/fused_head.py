"""The LM head's training logprobs, fused (rollplex/backends/torch/fused_head.py) against the
checkpointed chunks it replaced: peak bytes of the forward with grad, of its backward and
of scoring without grad, each above what was live before it, as multiples of one chunk's
float32 logits, and the forward + backward time in alternating order (A B A B) with its
spread (a GPU figure only on CUDA).

    python bench/fused_head.py                      # CPU: memory from torch.profiler
    python bench/fused_head.py --device cuda        # GPU: the allocator's peak and time

Writes bench/results/fused_head_<device>.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from cpu_memory import cpu_peak_bytes

from rollplex.backends.torch import logprob
from rollplex.backends.torch.logprob import head_logprobs

SHAPES = {"qwen2_5_vl_3b": (2048, 151936), "qwen2_5_vl_7b": (3584, 152064)}


def _cuda_peak(run) -> int:
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    run()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def measure(
    width: int, vocab: int, tokens: int, fused: bool, device: str
) -> tuple[int, int, int, float]:
    """(forward peak with grad, backward peak, scoring peak without grad: bytes above what
    was live before each; forward + backward seconds)."""
    torch.manual_seed(0)
    head = torch.nn.Linear(width, vocab, bias=False, device=device, dtype=torch.bfloat16)
    hidden = torch.randn(1, tokens, width, device=device, dtype=torch.bfloat16)
    hidden.requires_grad_()
    ids = torch.randint(0, vocab, (1, tokens), device=device)
    saved = logprob.fusable
    if not fused:
        logprob.fusable = lambda _: False
    peak = _cuda_peak if device == "cuda" else cpu_peak_bytes
    try:
        sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
        with torch.no_grad():
            scoring = peak(lambda: head_logprobs(head, hidden, ids, 1.0))
        sync()
        t0 = time.perf_counter()
        out: list[torch.Tensor] = []
        forward = peak(lambda: out.append(head_logprobs(head, hidden, ids, 1.0)))
        backward = peak(lambda: out[0].sum().backward())
        sync()
        return forward, backward, scoring, time.perf_counter() - t0
    finally:
        logprob.fusable = saved


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--shape", default="qwen2_5_vl_3b", choices=sorted(SHAPES))
    ap.add_argument("--tokens", type=int, default=2400, help="one micro-batch's response tokens")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    args = ap.parse_args()
    width, vocab = SHAPES[args.shape]
    chunk = max(1, logprob.HEAD_CHUNK_BYTES // (4 * vocab))
    chunk_fp32 = min(chunk, args.tokens) * vocab * 4
    grads = (args.tokens * width + vocab * width) * 2  # d hidden, d weight (bf16)
    measure(width, vocab, min(chunk, args.tokens), True, args.device)  # warm up both
    measure(width, vocab, min(chunk, args.tokens), False, args.device)
    rows: dict[str, list[tuple[int, int, int, float]]] = {"fused": [], "unfused": []}
    for r in range(args.rounds):  # A B, then B A: neither always runs first
        order = ("fused", "unfused") if r % 2 == 0 else ("unfused", "fused")
        for name in order:
            rows[name].append(measure(width, vocab, args.tokens, name == "fused", args.device))
    lines = [
        f"# LM head training logprobs, fused vs checkpointed chunks ({args.device})",
        "",
        f"Command: `python bench/fused_head.py {' '.join(sys.argv[1:])}`",
        "",
        f"{args.shape}: hidden {width}, vocab {vocab}, {args.tokens} tokens, chunks of "
        f"{chunk} tokens ({chunk_fp32 / 2**30:.2f} GiB of float32 logits). Peaks are the "
        "bytes allocated above what was live before each, as multiples of one chunk's "
        f"float32 logits; the backward's less its gradients ({grads / 2**30:.2f} GiB). "
        "Scoring is the reference's: no grad, no entropy.",
        "",
        "| path | forward with grad | backward | scoring | fwd + bwd s (median) |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, got in rows.items():
        fwd = max(g[0] for g in got) / chunk_fp32
        bwd = (max(g[1] for g in got) - grads) / chunk_fp32
        score = max(g[2] for g in got) / chunk_fp32
        secs = statistics.median(g[3] for g in got)
        lines.append(f"| {name} | {fwd:.2f}x | {bwd:.2f}x | {score:.2f}x | {secs:.3f} |")
    ratios = [u[3] / f[3] for f, u in zip(rows["fused"], rows["unfused"], strict=True)]
    half = (max(ratios) - min(ratios)) / 2
    lines += ["", f"unfused / fused time: {statistics.median(ratios):.3f} ± {half:.3f} "
              f"over {args.rounds} alternating rounds"]  # fmt: skip
    text = "\n".join(lines)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"fused_head_{args.device}.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
