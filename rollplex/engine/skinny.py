"""Weight-streaming GEMMs for a decode step's few rows (Triton, CUDA only): each program
takes a slab of output columns and the whole reduction, so every weight byte is read once.
Measured against cuBLAS in bench/results/gpu_decode/skinny.md and split_gemm.md."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

import torch

from rollplex.engine.triton_support import triton

if triton is not None:
    import triton.language as tl

# At a few rows a projection is matrix-vector work, bound by the weights' bytes over HBM
# bandwidth. These win where the weight is wide: gate + up at 8-32 rows (7B: 84% of HBM
# bandwidth against cuBLAS's two GEMMs and fused SiLU at 73%) and the LM head (92% against
# 87%); cuBLAS wins on the narrow q/k/v, o and down, so the engine uses only those two.
# All are torch custom ops (opaque to a compiled layer), each tuning its tile per (rows
# tile, N, K) on first use: the eager warm-up before a graph capture, never the capture.
MAX_ROWS = 32  # at 64 rows cuBLAS draws level (skinny.md)
# split partials for the o and down projections: 4 slices were the best of 2 / 4 / 8 alone at
# 8-32 rows of the 7B and 3B shapes; in the engine, side by side with o and down on cuBLAS,
# they won at every row bucket measured up to 64 (split_gemm.md: 7B 1.05x at 8 and 16, 1.03x
# at 32, 1.01x at 64; 3B 1.02-1.04x); 128 rows and more are compute-bound, left to cuBLAS
SPLIT_MAX_ROWS, SPLITS = 64, 4


def _row_tile(rows: int) -> int:
    return max(16, triton.next_power_of_2(rows))  # tl.dot needs 16


if triton is not None:

    def _configs() -> list[triton.Config]:
        # (output columns, reduction slab, warps, stages): narrow slabs give more programs
        # for the narrow projections, wide ones fewer loads in flight per program
        tiles = ((16, 256, 4, 4), (16, 512, 4, 3), (32, 256, 4, 4), (32, 512, 8, 3),
                 (64, 128, 4, 4), (64, 256, 8, 3), (128, 128, 8, 3), (16, 128, 2, 6))  # fmt: skip
        return [
            triton.Config({"BLOCK_N": n, "BLOCK_K": k}, num_warps=w, num_stages=s)
            for n, k, w, s in tiles
        ]

    @triton.jit
    def _linear_kernel(
        x_ptr, w_ptr, b_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
        HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
    ):  # fmt: skip
        offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_m = tl.arange(0, BLOCK_M)
        offs_k = tl.arange(0, BLOCK_K)
        rows, cols = offs_m < M, offs_n < N
        x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :]
        w_ptrs = w_ptr + offs_n[:, None] * stride_wn + offs_k[None, :]
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        # "ieee": float32 operands (CPU-interpreter and fp32 CUDA tests) without TF32, as
        # cuBLAS by default; bf16 operands are unaffected
        for k in range(0, tl.cdiv(K, BLOCK_K)):
            inside = offs_k[None, :] < K - k * BLOCK_K
            x = tl.load(x_ptrs, mask=rows[:, None] & inside, other=0.0)
            w = tl.load(w_ptrs, mask=cols[:, None] & inside, other=0.0)
            acc = tl.dot(x, tl.trans(w), acc, input_precision="ieee")
            x_ptrs += BLOCK_K
            w_ptrs += BLOCK_K
        if HAS_BIAS:
            acc += tl.load(b_ptr + offs_n, mask=cols, other=0.0).to(tl.float32)[None, :]
        y_ptrs = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :]
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=rows[:, None] & cols[None, :])

    @triton.jit
    def _gate_up_kernel(
        x_ptr, g_ptr, u_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ):  # fmt: skip
        offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_m = tl.arange(0, BLOCK_M)
        offs_k = tl.arange(0, BLOCK_K)
        rows, cols = offs_m < M, offs_n < N
        x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :]
        w_offs = offs_n[:, None] * stride_wn + offs_k[None, :]
        gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BLOCK_K)):
            inside = offs_k[None, :] < K - k * BLOCK_K
            x = tl.load(x_ptrs, mask=rows[:, None] & inside, other=0.0)
            wmask = cols[:, None] & inside
            wg = tl.load(g_ptr + w_offs, mask=wmask, other=0.0)
            wu = tl.load(u_ptr + w_offs, mask=wmask, other=0.0)
            gate = tl.dot(x, tl.trans(wg), gate, input_precision="ieee")
            up = tl.dot(x, tl.trans(wu), up, input_precision="ieee")
            x_ptrs += BLOCK_K
            w_offs += BLOCK_K
        dtype = y_ptr.dtype.element_ty
        gate = gate.to(dtype).to(tl.float32)  # the modules' bf16 outputs
        up = up.to(dtype).to(tl.float32)
        act = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)  # SiLU, rounded as F.silu
        y_ptrs = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :]
        tl.store(y_ptrs, (act * up).to(dtype), mask=rows[:, None] & cols[None, :])

    @triton.jit
    def _partials_kernel(
        x_ptr, w_ptr, y_ptr, M, N, K, stride_xm, stride_wn,
        SPLITS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
    ):  # fmt: skip
        # program (n, s): output columns n's slab over the s-th of SPLITS reduction ranges
        offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        split = tl.program_id(1)
        offs_m = tl.arange(0, BLOCK_M)
        offs_k = tl.arange(0, BLOCK_K)
        rows, cols = offs_m < M, offs_n < N
        tiles = tl.cdiv(K, BLOCK_K)
        per = tl.cdiv(tiles, SPLITS)
        start = split * per
        stop = tl.minimum(start + per, tiles)
        x_ptrs = x_ptr + offs_m[:, None] * stride_xm + start * BLOCK_K + offs_k[None, :]
        w_ptrs = w_ptr + offs_n[:, None] * stride_wn + start * BLOCK_K + offs_k[None, :]
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for t in range(start, stop):
            inside = offs_k[None, :] < K - t * BLOCK_K
            x = tl.load(x_ptrs, mask=rows[:, None] & inside, other=0.0)
            w = tl.load(w_ptrs, mask=cols[:, None] & inside, other=0.0)
            acc = tl.dot(x, tl.trans(w), acc, input_precision="ieee")
            x_ptrs += BLOCK_K
            w_ptrs += BLOCK_K
        y_ptrs = y_ptr + split * M * N + offs_m[:, None] * N + offs_n[None, :]
        tl.store(y_ptrs, acc, mask=rows[:, None] & cols[None, :])

    def _tuned(
        kernel: triton.JITFunction, key: tuple[str, ...] = ("BLOCK_M", "N", "K")
    ) -> Callable[[Callable], Callable]:
        """grid -> launcher of `kernel`, its tile tuned per `key` (rows tile, N, K). Triton's CPU
        interpreter (TRITON_INTERPRET=1, what the CPU tests run) has no GPU to time tiles
        on, so there it gets one fixed tile."""
        if os.environ.get("TRITON_INTERPRET") == "1":
            return lambda grid: functools.partial(kernel[grid], BLOCK_N=16, BLOCK_K=64)
        tuned = triton.autotune(configs=_configs(), key=list(key))(kernel)
        return lambda grid: tuned[grid]

    _linear = _tuned(_linear_kernel)
    _gate_up = _tuned(_gate_up_kernel)
    _partials = _tuned(_partials_kernel, ("BLOCK_M", "N", "K", "SPLITS"))


def _rows_2d(x: torch.Tensor) -> torch.Tensor:
    x = x.reshape(-1, x.shape[-1])
    return x if x.stride(-1) == 1 else x.contiguous()


@torch.library.custom_op("rollplex::skinny_linear", mutates_args=())
def skinny_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x @ weight.T (+ bias) for x's few rows: [..., K] -> [..., N]."""
    x2 = _rows_2d(x)
    (m, k), n = x2.shape, weight.shape[0]
    y = x2.new_empty(m, n)
    grid = lambda meta: (triton.cdiv(n, meta["BLOCK_N"]),)  # noqa: E731
    _linear(grid)(
        x2, weight, bias if bias is not None else weight, y, m, n, k,
        x2.stride(0), weight.stride(0), y.stride(0),
        HAS_BIAS=bias is not None, BLOCK_M=_row_tile(m),
    )  # fmt: skip
    return y.view(*x.shape[:-1], n)


@skinny_linear.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], weight.shape[0])


@torch.library.custom_op("rollplex::skinny_gate_up", mutates_args=())
def skinny_gate_up(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(x @ gate.T) * (x @ up.T) for x's few rows: [..., K] -> [..., N], in one kernel
    over the modules' own weights (no stacked copy), rounded where transformers' unfused
    modules round (each GEMM's output in the weights' dtype, then the activation's)."""
    x2 = _rows_2d(x)
    (m, k), n = x2.shape, gate.shape[0]
    y = x2.new_empty(m, n)
    grid = lambda meta: (triton.cdiv(n, meta["BLOCK_N"]),)  # noqa: E731
    _gate_up(grid)(
        x2, gate, up, y, m, n, k, x2.stride(0), gate.stride(0), y.stride(0),
        BLOCK_M=_row_tile(m),
    )  # fmt: skip
    return y.view(*x.shape[:-1], n)


@skinny_gate_up.register_fake
def _(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], gate.shape[0])


@torch.library.custom_op("rollplex::skinny_partials", mutates_args=())
def skinny_partials(x: torch.Tensor, weight: torch.Tensor, splits: int) -> torch.Tensor:
    """x @ weight.T as `splits` float32 partial sums over slices of the reduction:
    [..., K] -> [splits, rows, N]. More programs than output slabs alone give (what the
    narrow projections lack); the sum is left to the consumer (`split_linear`), where a
    compiled layer fuses it into the kernel that reads the output anyway."""
    x2 = _rows_2d(x)
    (m, k), n = x2.shape, weight.shape[0]
    y = x2.new_empty(splits, m, n, dtype=torch.float32)
    grid = lambda meta: (triton.cdiv(n, meta["BLOCK_N"]), splits)  # noqa: E731
    _partials(grid)(
        x2, weight, y, m, n, k, x2.stride(0), weight.stride(0),
        SPLITS=splits, BLOCK_M=_row_tile(m),
    )  # fmt: skip
    return y


@skinny_partials.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, splits: int) -> torch.Tensor:
    rows = x.numel() // x.shape[-1]
    return x.new_empty(splits, rows, weight.shape[0], dtype=torch.float32)


def sum_partials(partials: torch.Tensor) -> torch.Tensor:
    """partials.sum(0) written as pointwise adds: Inductor's Triton backend made `.sum(0)`
    a reduction kernel of its own and did not fuse it into the norm that follows (an H200
    profile, split_gemm.md), while adds fuse into it."""
    total = partials[0]
    for part in partials[1:]:
        total = total + part
    return total


def split_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, splits: int
) -> torch.Tensor:
    """F.linear(x, weight, bias) on `skinny_partials`: summed in float32 with the bias and
    rounded once, as cuBLAS rounds (the order of the float32 sum differs)."""
    total = sum_partials(skinny_partials(x, weight, splits))
    if bias is not None:
        total = total + bias.float()
    return total.to(x.dtype).view(*x.shape[:-1], weight.shape[0])
