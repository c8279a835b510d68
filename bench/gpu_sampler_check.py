"""Compile the decode engine's draw at a real vocabulary on CUDA and check it against the
eager draw: the same tokens (but for a draw on a rounding boundary), their logprobs
within 1e-4 (seconds; run before the decode bench).

    python bench/gpu_sampler_check.py
"""

from __future__ import annotations

import torch

from rollplex.backends.torch.engine.sampling import next_tokens


def main() -> None:
    compiled = torch.compile(next_tokens, dynamic=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    for rows in (8, 64, 256):
        for temperature, top_p in ((1.0, 1.0), (0.7, 0.9), (0.0, 1.0)):
            logits = torch.randn(rows, 152064, device="cuda", generator=gen).bfloat16() * 3
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
            same = torch.equal(want[0], got[0])
            err = (want[1] - got[1]).abs().max().item()
            print(
                f"rows {rows} T {temperature} top_p {top_p}: same tokens {same}, lp err {err:.1e}"
            )
            assert same and err < 1e-4


if __name__ == "__main__":
    main()
