"""What decode engines hold on one GPU: the torch engine's static workspace (its shape
constants live here, torch-free, and the engine takes them) and vLLM's paged KV pool."""

from __future__ import annotations

import math
from typing import Literal, get_args

from rollplex.ops.formulas.llm import kv_bytes_per_token
from rollplex.specs.model import ModelSpec
from rollplex.specs.workload import WorkloadSpec

# The torch decode engine's static workspace (rollplex/engine/): rows padded to a
# bucket, the prefix capacity to ENGINE_PREFIX_ALIGN tokens, each buffer's length to
# ENGINE_MASK_ALIGN. Torch-free here for the planner; the engine takes its defaults from here.
# Past the top bucket rows pad to a multiple of ENGINE_ROW_STEP (192, 256, 320, ...): a
# power of two there padded 192 rows (24 prompts x G = 8) to 256, a third more rows decoded
# and held for nothing. Training decodes the same rows every step, so a finer step costs no
# captures.
ENGINE_ROW_BUCKETS = (8, 16, 32, 64, 128)
ENGINE_ROW_STEP = 64
ENGINE_PREFIX_ALIGN = 64  # prompt lengths within 64 tokens share buffers and graphs
ENGINE_MASK_ALIGN = 16  # SDPA's memory-efficient kernel wants the mask's rows 16-aligned
ENGINE_FLEX_BLOCK = 128  # FlexAttention's KV block: the flex buffer's length is a multiple
EngineAttention = Literal["sdpa", "flex", "split"]  # the engine's attention kinds (cache.py)


# "auto" attends with "split" up to this many (prompt, K/V head) pairs a step (engine_attention)
ENGINE_SPLIT_MAX_BLOCKS = 16


def engine_attention(prompts: int, kv_heads: int, kernel: bool = False) -> EngineAttention:
    """The attention the torch engine's "auto" picks on CUDA for `prompts` padded prompts.
    With split's Triton kernels (`kernel`, engine/split_kernel.py): "split" at every size;
    on an H200 they beat SDPA at 1, 8 and 32 prompts of the 7B (4.81 / 5.38 / 9.04 ms a
    step against SDPA's 6.49 at 8 and 9.61 at 32 prompts; bench/results/gpu_decode/
    split_kernel.md). Without them (split on compiled torch matmuls): "split" while a step
    attends over at most ENGINE_SPLIT_MAX_BLOCKS (prompt, K/V head)
    pairs, else "sdpa". Measured on one H200 (bench/results/gpu_decode/split.md): split
    was faster at 1 prompt (3B: 2 pairs, 7B: 4) and at 8 prompts of 3B (16), slower at 8
    prompts of 7B (32) and at 32 prompts of either. The SDPA kernel gets one thread block
    per pair for the folded queries, which leaves most SMs idle below that; split's
    batched matmuls spread wider but write their scores out, which costs more with many
    prompts."""
    if kernel:
        return "split"
    return "split" if prompts * kv_heads <= ENGINE_SPLIT_MAX_BLOCKS else "sdpa"


def _round_up(x: int, to: int) -> int:
    return -(-x // to) * to


def engine_prompts(
    prompts: int, group_size: int, buckets: tuple[int, ...] = ENGINE_ROW_BUCKETS
) -> int:
    """Prompts the engine's buffers hold: rows padded to the next bucket (past the top
    one, to a multiple of ENGINE_ROW_STEP or of the top, the smaller), in whole groups."""
    rows, top = prompts * group_size, buckets[-1]
    bucket = next((b for b in buckets if b >= rows), _round_up(rows, min(top, ENGINE_ROW_STEP)))
    return max(prompts, -(-bucket // group_size))


def torch_engine_workspace(
    model: ModelSpec,
    prompts: int,
    group_size: int,
    prefix_tokens: int,
    max_new_tokens: int,
    tp: int = 1,
    attention: EngineAttention = "sdpa",
) -> float:
    """Bytes of the torch engine's static decode workspace on one GPU (engine/workspace.py
    and cache.py, for its `attention`): per padded prompt the K/V of its prefix capacity and
    its G rows' response slots, what says which keys are visible, and each row's token ids
    and logprobs at the cap. Allocated whole at the start (static shapes are what its CUDA
    graphs replay) and kept for the next step's decode."""
    if attention not in get_args(EngineAttention):
        raise ValueError(f"attention must be one of {get_args(EngineAttention)}, got {attention!r}")
    b = engine_prompts(prompts, group_size)
    cap = _round_up(max(prefix_tokens, 1), ENGINE_PREFIX_ALIGN)
    slots = group_size * max(max_new_tokens - 1, 1)  # G rows x (R - 1) steps written
    if attention == "split":
        # the prefix buffer and each row's own response buffer, unpadded; prefix lengths
        # and the step as int64
        visible = b * 8 + 8
        length = cap + slots
    elif attention == "flex":
        length = _round_up(cap + slots, ENGINE_FLEX_BLOCK)
        blocks = length // ENGINE_FLEX_BLOCK
        # per prompt: int64 prefix length, three int32 block lists and three counts; the
        # step and the block ids (int64); the rows' slot offsets (int64)
        visible = b * (8 + 3 * blocks * 4 + 3 * 4) + 8 + blocks * 8 + group_size * 8
    else:
        length = _round_up(cap + slots, ENGINE_MASK_ALIGN)
        q = (model.num_heads // model.num_kv_heads) * group_size
        # the additive mask [prompts, 1, q_per_kv * G, length]; the slot offsets and the
        # query rows' row ids (int64) and the opening value (one element)
        visible = (b * q * length + 1) * model.dtype_bytes + (group_size + q) * 8
    kv = b * length * kv_bytes_per_token(model, tp)
    # per row: int64 tokens and float32 logprobs at the cap, five int64 step vectors
    # (token, position, seed, length, cap) and a done flag; two int64 scalars
    outputs = b * group_size * (max_new_tokens * (8 + 4) + 5 * 8 + 1) + 2 * 8
    return float(kv + visible + outputs)


def torch_engine_fused_qkv(model: ModelSpec) -> float:
    """Bytes of the torch engine's stacked q/k/v projection weights and biases (engine/
    fused_qkv.py): a copy of those projections, refreshed at each decode's start and
    kept with the workspace. Qwen2.5's q/k/v projections carry biases."""
    head_dim = model.hidden_size // model.num_heads
    rows = (model.num_heads + 2 * model.num_kv_heads) * head_dim
    return float(model.num_layers * rows * (model.hidden_size + 1) * model.dtype_bytes)


KV_BLOCK_TOKENS = 16  # vLLM's default block: a sequence's KV is allocated in blocks of 16


def engine_kv_pool(
    model: ModelSpec,
    workload: WorkloadSpec,
    prompts: int,
    group_size: int,
    tp: int = 1,
    at_cap: bool = False,
) -> float:
    """Bytes of the KV pool an engine (vLLM) allocates up front for one rollout on one GPU.

    Each prompt's prefix blocks count once (prefix caching shares them among its G samples).
    Responses: with `at_cap`, every sample's blocks at the generation cap, all live at once,
    so that nothing is ever preempted; otherwise the expected peak of live response KV
    (finished sequences free their blocks) plus one block per sequence of rounding. A pool
    between the two serves the expected batch; past it, vLLM preempts and recomputes.
    """

    def blocks(tokens: float) -> int:
        return math.ceil(tokens / KV_BLOCK_TOKENS) * KV_BLOCK_TOKENS

    batch = prompts * group_size
    lengths = workload.response_length
    prefix = prompts * blocks(workload.prefix_tokens(model.vision))
    response = batch * blocks(lengths.max)
    if not at_cap:
        live = (lengths.expected_active(batch, s + 1) * (s + 1) for s in range(lengths.max))
        response = min(response, max(live, default=0.0) + batch * KV_BLOCK_TOKENS)
    return (prefix + response) * kv_bytes_per_token(model, tp)
