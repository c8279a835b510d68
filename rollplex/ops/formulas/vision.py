"""Cost of the Qwen2.5-VL vision tower: patch embed, ViT blocks and the 2x2 patch merger.

Matmul FLOPs only (2 per multiply-add): patch embed, per block fused qkv/proj/SwiGLU, and
attention over its segments (windows cut at the image edge, full-frame blocks in
`fullatt_block_indexes`), dense as eager computes them; then the merger. TP divides the
whole tower by `tp`, the output replicated.
"""

from __future__ import annotations

import math

from rollplex.ops.formulas.cost import FP32, Cost, check_tp
from rollplex.specs.model import ModelSpec, VisionSpec
from rollplex.specs.workload import WorkloadSpec


def workload_grid(workload: WorkloadSpec, vision: VisionSpec) -> tuple[int, int, int] | None:
    """(grid_t, grid_h, grid_w) in patches of one prompt's visual input, as the processor
    shapes it; None when the workload gives a token count instead of a resolution."""
    if workload.visual_tokens_per_frame is not None:
        return None
    return (
        math.ceil(workload.frames / vision.temporal_patch_size),
        workload.height // vision.patch_size,
        workload.width // vision.patch_size,
    )


def _edge_sq_sum(merged_edge: float, window_edge: int) -> float:
    """Σ (window extent)² along one axis: full windows plus the cut one at the edge."""
    full, rest = divmod(merged_edge, window_edge)
    return full * window_edge**2 + rest**2


def window_attention_sq_sum(
    vision: VisionSpec, grid_h: float, grid_w: float, temporal_patches: int = 1
) -> float:
    """ΣL² over the attention windows of one image or video (patches per window, squared).

    Windows tile the merged grid in squares of window/(merge·patch) merged tokens per edge,
    per temporal patch; the extents along the two axes multiply, so ΣL² factorises.
    """
    m = vision.spatial_merge_size
    edge = vision.window_size // m // vision.patch_size
    if edge < 1:
        raise ValueError("vision.window_size must cover at least one merged token")
    sq_h = _edge_sq_sum(grid_h / m, edge)
    sq_w = _edge_sq_sum(grid_w / m, edge)
    return temporal_patches * m**4 * sq_h * sq_w


def vision_encode(
    model: ModelSpec,
    images: float,
    patches_per_image: int,
    tp: int = 1,
    *,
    temporal_patches: int = 1,
    grid_hw: tuple[int, int] | None = None,
) -> Cost:
    """Vision tower over `images` images (or videos) of `patches_per_image` ViT patches each.

    A video has `temporal_patches` frames of patches (grid_t). `grid_hw` (patches per frame
    edge) makes the window layout exact; without it a square frame is assumed.
    """
    check_tp(tp)
    v = model.vision
    h, i, m2, b = v.hidden_size, v.intermediate_size, v.merge_factor, model.dtype_bytes
    per_frame = patches_per_image / temporal_patches
    if grid_hw is not None and grid_hw[0] * grid_hw[1] != per_frame:
        raise ValueError(f"grid_hw {grid_hw} does not hold {per_frame} patches per frame")
    grid_h, grid_w = grid_hw or (math.sqrt(per_frame),) * 2
    n = images * patches_per_image

    full_blocks = len(set(v.fullatt_block_indexes))
    window_blocks = v.depth - full_blocks
    sq_window = images * window_attention_sq_sum(v, grid_h, grid_w, temporal_patches)
    sq_full = images * temporal_patches * per_frame**2
    flops = (
        2 * n * v.patch_dim * h
        + v.depth * 2 * n * (4 * h * h + 3 * h * i)
        + 4 * h * (window_blocks * sq_window + full_blocks * sq_full)
        + 2 * n * h * (h * m2 + v.out_hidden_size)
    ) / tp

    weights = v.param_count() * b / tp
    features = n / m2 * v.out_hidden_size * b
    return Cost(
        flops=flops,
        bytes_read=weights + n * v.patch_dim * b,
        bytes_written=features,
        weight_bytes=weights,
        persistent_bytes=features,
        transient_bytes=n * b * (2 * h + 3 * i / tp),  # residual, normed, SwiGLU of one block
    )


def vision_activation_bytes_per_patch(model: ModelSpec, checkpointing: bool, tp: int = 1) -> float:
    """Activation bytes one patch keeps for the vision tower's backward (when it trains).

    Always kept: the input pixels (for the patch embed's weight gradient) and the merger's
    norm input and output, first linear's output and GELU output (4h) plus an fp32 rstd.
    Per block, the terms of `activation_bytes_per_token` with MHA (k and v are h wide); with
    checkpointing only each block's input. (Plain HF keeps more: unfused norms, and v as a
    view that pins the whole fused qkv output.)
    """
    check_tp(tp)
    v, b = model.vision, model.dtype_bytes
    h, i = v.hidden_size, v.intermediate_size
    always = v.patch_dim * b + 4 * h * b + FP32
    if checkpointing:
        return v.depth * h * b + always
    per_block = b * (4 * h + (4 * h + 4 * i) / tp) + FP32 * v.num_heads / tp + 2 * FP32
    return v.depth * per_block + always
