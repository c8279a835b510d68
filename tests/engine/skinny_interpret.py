"""The skinny GEMM kernels (engine/skinny.py) under Triton's CPU interpreter, in float32:
run by test_interpreted_kernels.py in a child process with TRITON_INTERPRET=1 (Triton
reads it when the kernels are defined). Raises on the first disagreement."""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from rollplex.engine import skinny, step
from tests.engine.interpreted import decodes_agree, tiny_prefix

ROWS = (1, 5, 16, 33, 64)
SHAPES = ((70, 300), (128, 256))  # (N, K): ragged against the 16 x 64 tile, and even


def check_linear(gen: torch.Generator) -> None:
    for rows in ROWS:
        for n, k in SHAPES:
            wide = torch.randn(rows, k + 9, generator=gen)
            x = wide[:, 3 : 3 + k]  # rows with a stride wider than K
            w, b = torch.randn(n, k, generator=gen), torch.randn(n, generator=gen)
            for bias in (b, None):
                got = skinny.skinny_linear(x.view(1, rows, k), w, bias)
                assert got.shape == (1, rows, n), got.shape
                torch.testing.assert_close(got[0], F.linear(x, w, bias), rtol=1e-4, atol=1e-4)


def check_gate_up(gen: torch.Generator) -> None:
    for rows in ROWS:
        for n, k in SHAPES:
            x = torch.randn(rows, k, generator=gen)
            g, u = torch.randn(n, k, generator=gen), torch.randn(n, k, generator=gen)
            want = F.silu(F.linear(x, g)) * F.linear(x, u)
            got = skinny.skinny_gate_up(x, g, u)
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-3)


def check_partials(gen: torch.Generator) -> None:
    """Every split count, more slices than reduction tiles included (empty slices add 0)."""
    for rows in ROWS:
        for n, k in SHAPES:
            x = torch.randn(rows, k, generator=gen)
            w, b = torch.randn(n, k, generator=gen), torch.randn(n, generator=gen)
            for splits in (1, 2, 3, 8):
                parts = skinny.skinny_partials(x.view(1, rows, k), w, splits)
                assert parts.shape == (splits, rows, n) and parts.dtype == torch.float32
                got = skinny.split_linear(x.view(1, rows, k), w, b, splits)
                assert got.shape == (1, rows, n), got.shape
                torch.testing.assert_close(got[0], F.linear(x, w, b), rtol=1e-4, atol=1e-4)


def check_engine() -> None:
    """A decode on the kernels equals one on the modules: tokens, logprobs, lengths; the
    split o and down projections with 3 slices each."""
    decodes_agree("skinny_gemm", "skinny", 1.0, 4, atol=1e-4)
    step.SPLITS = 3
    calls = []
    for name in ("skinny_partials", "split_linear"):  # count what ran: down, o
        real = getattr(step, name)
        setattr(step, name, lambda *a, real=real, name=name: calls.append(name) or real(*a))
    # 2 prompts x G = 3 in a 6-row bucket: the default bucket 8 would pad them to 9 rows
    decodes_agree("split_gemm", "split_gemm", 1.0, 4, atol=1e-4, buckets=(6,))
    layers = 2 * len(tiny_prefix()[0].model.language_model.layers)  # one per layer per step
    assert calls.count("split_linear") >= layers and calls.count("skinny_partials") >= layers


def main() -> None:
    assert os.environ.get("TRITON_INTERPRET") == "1" and skinny.triton is not None
    gen = torch.Generator().manual_seed(0)
    check_linear(gen)
    check_gate_up(gen)
    check_partials(gen)
    check_engine()
    print("skinny kernels agree")


if __name__ == "__main__":
    main()
