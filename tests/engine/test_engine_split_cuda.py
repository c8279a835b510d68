"""attention="split" on CUDA (skipped without it): its compiled attention (dynamic shapes)
inside CUDA graphs replays what the same steps draw eagerly across kv_len chunks, decodes
what SDPA decodes, and in bf16 attends as cuDNN's SDPA does within bf16 rounding."""

from __future__ import annotations

import pytest
import torch

from rollplex.backends.torch.model import build_model
from rollplex.engine.prefix import prefix_forward, vision_encode
from tests.engine.test_engine_cuda import _run as run_engine
from tests.engine.test_engine_cuda import cuda_prefix  # noqa: F401
from tests.engine.test_engine_split import attend_steps

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

G, R = 4, 40


def _run(model, prefix, graphs: bool, temperature: float, attention="split", seed=7):
    return run_engine(model, prefix, graphs, temperature, seed, attention, group=G, new=R)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_split_graph_replay_equals_eager_step(cuda_prefix, temperature):  # noqa: F811
    model, prefix = cuda_prefix
    eager, graphed = _run(model, prefix, False, temperature), _run(model, prefix, True, temperature)
    assert torch.equal(eager[0], graphed[0]) and torch.equal(eager[2], graphed[2])
    torch.testing.assert_close(eager[1], graphed[1], atol=1e-5, rtol=0)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_split_decodes_what_sdpa_decodes(cuda_prefix, temperature):  # noqa: F811
    """fp32 (TF32 off by default): reduction orders differ, near-ties aside the same path."""
    model, prefix = cuda_prefix
    split = _run(model, prefix, True, temperature)
    sdpa = _run(model, prefix, True, temperature, attention="sdpa")
    assert (split[0] == sdpa[0]).float().mean() > 0.95
    torch.testing.assert_close(split[1][:, :8], sdpa[1][:, :8], atol=1e-4, rtol=0)


def test_split_attention_equals_sdpa_in_bf16():
    torch.use_deterministic_algorithms(False)
    with torch.no_grad():
        split = attend_steps("split", torch.bfloat16, 20, "cuda").float()
        sdpa = attend_steps("sdpa", torch.bfloat16, 20, "cuda").float()
        exact = attend_steps("sdpa", torch.float32, 20, "cuda")
    assert torch.isfinite(split).all()
    # bf16 outputs: a few units of bf16's last place; split's scores are bf16 matmul
    # outputs (as transformers' eager attention), cuDNN's stay fp32
    torch.testing.assert_close(split, sdpa, atol=3e-2, rtol=3e-2)
    assert (split - exact).abs().mean() < 2 * (sdpa - exact).abs().mean() + 1e-3


def test_split_greedy_agrees_with_sdpa_in_bf16(spec, batch):
    """A bf16 model, graphs and compiled layers as in production: the rows' first tokens
    agree (near-ties in bf16 aside) and, while a row's tokens agree, so do its logprobs."""
    model = build_model(spec, seed=0, dtype=torch.bfloat16).cuda()
    b = batch.to("cuda")
    with torch.no_grad():
        feats = vision_encode(model, b.pixel_values, b.image_grid_thw)
        prefix = prefix_forward(model, b, feats, grad=False)
    split = _run(model, prefix, True, 0.0)
    sdpa = _run(model, prefix, True, 0.0, attention="sdpa")
    same = (split[0] == sdpa[0]).long().cumprod(1).bool()  # agreed so far
    assert same[:, 2].float().mean() >= 0.75
    torch.testing.assert_close(split[1][same], sdpa[1][same], atol=5e-2, rtol=0)
