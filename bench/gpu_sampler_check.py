"""The decode engine's draw at a real vocabulary on CUDA: compiled against eager, and the
two-level inverse CDF (sampling._inverse_cdf) against one cumulative sum over the
vocabulary (the draw before it), side by side in one process.

Checks: the compiled draw gives the eager draw's tokens (but for a draw on a rounding
boundary), logprobs within 1e-4; the two-level draw agrees with the one-scan draw on
(nearly) every row. Then times one draw (CUDA graph of 20 draws, median of 5 replays) per
variant at 8 / 64 / 256 rows and prints a table last; JSON to $OUT/gpu_sampler.json (else
bench/results/gpu_decode/gpu_sampler.json).

    python bench/gpu_sampler_check.py      # one H200, < 1 min
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import torch
from cuda_timing import graph_ms  # bench/ is on sys.path as the script's folder

from rollplex.engine import sampling
from rollplex.engine.sampling import next_tokens

VOCAB = 152064  # Qwen2.5-VL's padded vocabulary


@torch.compiler.disable
def one_scan_inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The draw before the two levels: a cumulative sum over the whole vocabulary."""
    cdf = probs.cumsum_(-1)
    target = (u * cdf[:, -1])[:, None]
    return torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp_(max=probs.shape[-1] - 1)


@contextlib.contextmanager
def one_scan_draw() -> Iterator[None]:
    """Draws inside use the one-scan inverse CDF (also what torch.compile traces then:
    dynamo guards on the global, so a compiled draw recompiles for it and back)."""
    two_level = sampling._inverse_cdf
    sampling._inverse_cdf = one_scan_inverse_cdf
    try:
        yield
    finally:
        sampling._inverse_cdf = two_level


def one_scan_next_tokens(*args):
    with one_scan_draw():
        return next_tokens(*args)


def main() -> None:
    compiled = torch.compile(next_tokens, dynamic=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows_out = []
    for rows in (8, 64, 256):
        for temperature, top_p in ((1.0, 1.0), (0.7, 0.9), (0.0, 1.0)):
            logits = torch.randn(rows, VOCAB, device="cuda", generator=gen).bfloat16() * 3
            seeds = torch.randint(0, 1 << 62, (rows,), device="cuda", generator=gen)
            args = (
                seeds,
                torch.tensor([5], device="cuda"),
                torch.zeros(rows, dtype=torch.bool, device="cuda"),
                torch.tensor(-1, device="cuda"),
                torch.full((rows,), 64, device="cuda"),
                temperature,
                top_p,
                0,
            )
            want, got = next_tokens(logits, *args), compiled(logits, *args)
            old = one_scan_next_tokens(logits, *args)
            same = torch.equal(want[0], got[0])
            err = (want[1] - got[1]).abs().max().item()
            agree = (want[0] == old[0]).float().mean().item()
            print(
                f"rows {rows} T {temperature} top_p {top_p}: compiled = eager tokens {same}, "
                f"lp err {err:.1e}; two-level = one-scan on {100 * agree:.1f}% of rows"
            )
            assert same and err < 1e-4 and agree >= 0.99
            if (temperature, top_p) != (1.0, 1.0):
                continue
            entry = {"rows": rows, "vocab": VOCAB}
            for name, fn in (
                ("one_scan_eager", one_scan_next_tokens),
                ("two_level_eager", next_tokens),
                ("two_level_compiled", compiled),
            ):
                entry[f"{name}_us"] = 1e3 * graph_ms(lambda fn=fn, x=logits, a=args: fn(x, *a))
            rows_out.append(entry)
    out = Path(os.environ.get("OUT", "bench/results/gpu_decode")) / "gpu_sampler.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "command": "python bench/gpu_sampler_check.py",
        "rows": rows_out,
    }
    out.write_text(json.dumps(record, indent=1))
    print("| rows | one scan, eager (us) | two levels, eager | two levels, compiled |")
    print("|---|---|---|---|")
    for e in rows_out:
        print(
            f"| {e['rows']} | {e['one_scan_eager_us']:.1f} | {e['two_level_eager_us']:.1f} | "
            f"{e['two_level_compiled_us']:.1f} |"
        )


if __name__ == "__main__":
    main()
