"""The vision tower's windows in one varlen call (vision_attention.py): on CPU exactly
transformers' per-window SDPA; on CUDA bf16 the varlen kernel with torch.compile'd blocks,
close to it, backward too."""

from __future__ import annotations

import pytest
import torch

from rollplex.backends.torch.model import build_model
from rollplex.backends.torch.vision_attention import (
    VARLEN,
    _longest,
    compile_vision_blocks,
    uses_kernel,
    varlen_attention,
)
from rollplex.specs.model import MODEL_PRESETS

SPEC = MODEL_PRESETS["tiny"]
# images of 8x8 and 4x6 patches, and a 4-frame video of 8x8 (window and full blocks both)
GRID = torch.tensor([[1, 8, 8], [1, 4, 6], [2, 8, 8]])


def _pixels(device: str = "cpu", dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    n = int(GRID.prod(-1).sum())
    return torch.randn(n, SPEC.vision.patch_dim, generator=g).to(device, dtype)


def _features(model, pixels):
    out = model.model.visual(pixels, grid_thw=GRID.to(pixels.device))
    return getattr(out, "pooler_output", out)


def test_models_route_their_vision_tower_through_it_and_the_llm_keeps_sdpa():
    model = build_model(SPEC, 0)
    assert model.config.vision_config._attn_implementation == VARLEN
    assert model.config.text_config._attn_implementation == "sdpa"


def test_on_cpu_it_equals_transformers_per_window_sdpa():
    model = build_model(SPEC, 0)
    pixels = _pixels()
    assert not uses_kernel(pixels)
    ours = _features(model, pixels)
    model.config.vision_config._attn_implementation = "sdpa"
    theirs = _features(model, pixels)
    assert torch.equal(ours, theirs)


def test_it_refuses_masks_and_missing_windows():
    q = torch.zeros(1, 2, 4, 8)
    with pytest.raises(ValueError, match="vision tower's windows only"):
        varlen_attention(None, q, q, q, attention_mask=torch.ones(4, 4))
    with pytest.raises(ValueError, match="vision tower's windows only"):
        varlen_attention(None, q, q, q)


def test_the_longest_window_is_derived_once_per_cu_seqlens_tensor():
    """Every block of a forward gets the same tensor: the second block reads the first's
    answer (no host sync); another tensor is derived afresh, also at a reused id."""
    cu = torch.tensor([0, 4, 12, 15])
    assert _longest(cu) == 8
    cu[2] = 5  # not what transformers does: it shows the answer came from the first call
    assert _longest(cu) == 8
    other = torch.tensor([0, 2, 3])
    assert _longest(other) == 2
    key = id(cu)
    del cu
    for _ in range(50):  # a new tensor may land on the dead one's id: never its answer
        fresh = torch.tensor([0, 1, 2])
        assert _longest(fresh) == 1
        if id(fresh) == key:
            break
        del fresh


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_bf16_the_kernel_matches_the_window_loop_forward_and_backward():
    spec = SPEC.model_copy(update={"trainable_vision": True})
    results = []
    for impl in (VARLEN, "sdpa"):
        model = build_model(spec, 0, dtype=torch.bfloat16).cuda()
        model.config.vision_config._attn_implementation = impl
        if impl == VARLEN:  # the torch backend's CUDA tower: blocks compiled too
            compile_vision_blocks(model)
        pixels = _pixels("cuda", torch.bfloat16)
        assert uses_kernel(pixels)
        out = _features(model, pixels)
        out.float().square().mean().backward()
        grads = {n: p.grad.float() for n, p in model.model.visual.named_parameters()}
        results.append((out.float(), grads))
    (a, ga), (b, gb) = results
    assert (a - b).abs().max() <= 0.02 * b.abs().max()
    for name, g in gb.items():
        assert (ga[name] - g).abs().max() <= 0.05 * g.abs().max() + 1e-6, name
