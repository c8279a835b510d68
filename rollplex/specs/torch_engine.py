"""TorchEngineSpec: the torch rollout's decode engine (the `backend.torch_engine` section)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rollplex.specs.base import Spec


class TorchEngineSpec(Spec):
    """Knobs of the torch decode engine (engine/); read when rollout=torch.
    The planner prices the engine's workspace in the SDPA layout with the stacked q/k/v
    weights, which bounds every setting here."""

    attention: Literal["auto", "sdpa", "split"] = Field(
        "auto",
        description="Decode attention: 'sdpa' (the group's queries folded over the shared "
        "prefix and every row's response K/V, with a mask), 'split' (the prefix once per "
        "prompt, then each row's own response K/V only), 'auto' (on CUDA split at every size "
        "on its Triton kernels; with split_kernel=false split while a step has at most 16 "
        "prompt x K/V-head pairs, SDPA beyond: what an H200 measured, "
        "bench/results/gpu_decode/split_kernel.md and split.md; SDPA on CPU).",
    )
    fused_qkv: bool = Field(
        True,
        description="Run each layer's q/k/v projections as one GEMM over a stacked copy of "
        "their weights, refreshed at every decode's start (1.04-1.09x a step on an H200; "
        "costs the q/k/v weights once more, e.g. 0.9 GB at the 7B shape).",
    )
    skinny_gemm: bool | None = Field(
        None,
        description="Run the MLP's gate/up projections with their SiLU as one Triton kernel, "
        "and the LM head on a Triton weight-streaming GEMM, in decode steps of at most 32 "
        "rows (engine/skinny.py; measured against cuBLAS in "
        "bench/results/gpu_decode/skinny.md). None: on CUDA when Triton is installed; true "
        "elsewhere is refused when the engine starts.",
    )
    split_gemm: bool | None = Field(
        None,
        description="In decode steps of at most 64 rows, run the o and down projections on "
        "a Triton kernel that splits each one's reduction into float32 partial sums, which "
        "the next fused norm kernel adds up "
        "(engine/skinny.py; measured in bench/results/gpu_decode/"
        "split_gemm.md: 1.01-1.05x the step at 8-64 rows of the 7B and 3B shapes). None: "
        "on CUDA when Triton is installed; true elsewhere is refused when the engine starts.",
    )
    split_kernel: bool | None = Field(
        None,
        description="Under attention 'split', attend with two Triton kernels (flash-decoding's "
        "prefix chunks and per-row response pieces, then one merge: "
        "engine/split_kernel.py) instead of compiled torch matmuls. None: on "
        "CUDA when Triton is installed; true elsewhere is refused before the model loads.",
    )
    compile: bool | None = Field(
        None,
        description="torch.compile each layer's small kernels and the draw. None: on CUDA "
        "only (CPU runs eagerly, which the bit-exact CPU tests rely on).",
    )
