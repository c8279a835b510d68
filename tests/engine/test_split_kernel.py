"""The split-attention kernels (engine/split_kernel.py): how a step's prefix is cut into
chunks; off by default on CPU and refused by name where they cannot run; compiled for
Hopper. That they and a decode on them agree with the torch version under Triton's CPU
interpreter: test_interpreted_kernels.py."""

from __future__ import annotations

import itertools

import pytest

from rollplex.engine import split_kernel
from rollplex.engine.session import DecodeEngine
from rollplex.engine.split_kernel import BLOCK_KEYS, prefix_chunks


@pytest.mark.parametrize(
    ("pairs", "cap", "programs"),
    itertools.product((1, 2, 4, 32, 128, 300), (1, 64, 65, 640, 1344, 4096), (1, 8, 264)),
)
def test_prefix_chunks_cover_the_prefix_in_whole_tiles(pairs, cap, programs):
    chunks, keys = prefix_chunks(pairs, cap, programs)
    tiles = -(-cap // BLOCK_KEYS)
    assert keys % BLOCK_KEYS == 0 and 1 <= chunks <= tiles
    assert chunks * keys >= cap > (chunks - 1) * keys  # every key once, no empty chunk
    if pairs * tiles >= programs:  # enough tiles: the programs asked for are there
        assert pairs * chunks >= min(programs, pairs * tiles) / 2
    else:  # too few: one tile a chunk
        assert chunks == tiles


def test_off_by_default_on_cpu_and_refused_when_asked(model):
    assert DecodeEngine(model).forward.split_kernel is False
    assert DecodeEngine(model).forward.kernel_writes_kv is False
    with pytest.raises(ValueError, match="split_kernel needs CUDA and Triton"):
        DecodeEngine(model, split_kernel=True)
    with pytest.raises(ValueError, match="kernel_writes_kv needs split_kernel"):
        DecodeEngine(model, split_kernel=False, kernel_writes_kv=True)


@pytest.mark.skipif(split_kernel.triton is None, reason="Triton is not installed")
def test_kernels_compile_for_hopper():
    """Triton's front end types what the CPU interpreter does not (a variable set in both
    branches of an `if` must keep one type, which cost a GPU call once): both kernels
    compiled for sm_90 in bf16 at the 7B's head shape, with G = 8's query tile and the
    largest one, writing the step's K/V and not, no GPU needed."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    def signature(kernel, types: list[str]) -> dict[str, str]:
        return dict(zip(kernel.arg_names, types, strict=True))

    partials = ["*bf16"] * 7 + ["*fp32"] * 6 + ["*bf16"] * 2 + ["fp32"] + ["i32"] * 23
    partials += ["constexpr"] * 6
    merge = ["*fp32"] * 6 + ["*bf16"] + ["i32"] * 6 + ["constexpr"] * 3
    sources = [
        ASTSource(
            split_kernel._partials,
            signature(split_kernel._partials, partials),
            {"D": 128, "BLOCK_D": 128, "BLOCK_Q": block_q, "BLOCK_R": 16, "BLOCK_N": BLOCK_KEYS}
            | {"WRITE": write},
        )
        for block_q, write in ((64, False), (64, True), (split_kernel.MAX_QUERY_BLOCK, True))
    ] + [
        ASTSource(
            split_kernel._merge,
            signature(split_kernel._merge, merge),
            {"D": 128, "BLOCK_D": 128, "BLOCK_R": 8},
        ),
    ]
    for src in sources:
        try:
            compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32))
        except RuntimeError as err:  # the wheel's ptxas missing or unusable here
            if "ptxas" in str(err):
                pytest.skip(f"Triton cannot assemble for sm_90 here: {err}")
            raise
        assert compiled.asm["cubin"]
