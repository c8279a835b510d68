"""The engine on CUDA: the CUDA-graph replay draws exactly what the same step run eagerly
draws, across kv_len chunks and buckets, and the compiled split-KV FlexAttention kernel
(the default) sees the keys the SDPA mask lets through (skipped without CUDA)."""

from __future__ import annotations

import pytest
import torch

from rollplex.backends.torch.decode import decode
from rollplex.engine.prefix import expand_prefix, prefix_forward, vision_encode
from rollplex.engine.session import DecodeEngine

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

G, R = 4, 40


@pytest.fixture
def cuda_prefix(model, batch):
    model = model.cuda()
    b = batch.to("cuda")
    with torch.no_grad():
        feats = vision_encode(model, b.pixel_values, b.image_grid_thw)
        return model, prefix_forward(model, b, feats, grad=False)


def _run(
    model, prefix, graphs: bool, temperature: float, seed=7, attention="auto", group=G, new=R, **kw
):
    torch.use_deterministic_algorithms(False)  # index_put_/cumsum on CUDA
    engine = DecodeEngine(
        model, use_graphs=graphs, kv_chunk=16, sync_every=4, attention=attention, **kw
    )
    gen = torch.Generator("cuda").manual_seed(seed)
    s = engine.start(prefix, group, new, temperature, 1.0, gen, -1)
    s.advance(5)  # a segment boundary inside the first graph's chunk
    s.advance()
    return s.result()


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_graph_replay_equals_eager_step(cuda_prefix, temperature):
    model, prefix = cuda_prefix
    eager, graphed = _run(model, prefix, False, temperature), _run(model, prefix, True, temperature)
    assert torch.equal(eager[0], graphed[0]) and torch.equal(eager[2], graphed[2])
    torch.testing.assert_close(eager[1], graphed[1], atol=1e-5, rtol=0)


def test_graph_greedy_equals_eager_loop(cuda_prefix):
    model, prefix = cuda_prefix
    tokens, logprobs, _ = _run(model, prefix, True, 0.0)
    with torch.no_grad():
        ref = decode(model, expand_prefix(prefix, G), R, 0.0, 1.0, None, eos_id=-1)
    # fp32 on CUDA (TF32 off by default): near-ties aside, the same greedy path
    assert (tokens == ref[0]).float().mean() > 0.95
    torch.testing.assert_close(logprobs[:, :4], ref[1][:, :4], atol=1e-4, rtol=0)


def test_flex_kernel_equals_sdpa(cuda_prefix):
    """G x R = 160 response slots: the BlockMask opens a second KV block mid-decode, which
    the eager reference on CPU cannot check (it ignores block sparsity)."""
    model, prefix = cuda_prefix
    flex = _run(model, prefix, True, 1.0, attention="flex")
    sdpa = _run(model, prefix, True, 1.0, attention="sdpa")
    assert (flex[0] == sdpa[0]).float().mean() > 0.95  # fp32: reduction order differs
    torch.testing.assert_close(flex[1][:, :8], sdpa[1][:, :8], atol=1e-4, rtol=0)
