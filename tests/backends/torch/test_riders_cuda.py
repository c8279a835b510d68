"""Piggybacked prefix rows on CUDA: rows that ride a CUDA-graph decode (the compiled
engine, eager for the ridden step) give the same K/V, logprobs and gradients as the
separate prefix forward, in float32 and in bf16 (to bf16's rounding); the decode draws the
same tokens in float32 (skipped without CUDA)."""

from __future__ import annotations

import pytest
import torch

from rollplex.backends.torch.values import Responses
from tests.backends.torch.test_riders import _decode, _setup, _train_pass
from tests.backends.torch.test_video import renderer  # noqa: F401

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
R = 40  # past the engine's first kv_len chunk: graphs at two kv_lens around the ride


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("vision", [False, True], ids=["frozen_vision", "trained_vision"])
def test_ridden_prefix_equals_separate_on_cuda(spec, renderer, dtype, vision):  # noqa: F811
    torch.use_deterministic_algorithms(False)  # index_put_/cumsum on CUDA
    spec = spec.model_copy(update={"trainable_vision": vision})
    batch, trainer, feats = _setup(spec, renderer, "mixed", "cuda", dtype)
    model = trainer.model
    plain = _decode(model, batch, feats, seed=3, r=R)
    plain.advance()
    riding = _decode(model, batch, feats, seed=3, r=R)
    riding.advance(20)  # graph replays, then the eager ridden step, then replays again
    ridden = riding.ride(trainer.ride_rows(feats, batch.text_only()))
    assert not ridden.alone
    riding.advance()
    a, b = plain.result(), riding.result()
    if dtype == torch.float32:
        assert torch.equal(a[0], b[0]) and torch.equal(a[2], b[2])
        torch.testing.assert_close(b[1], a[1], atol=1e-4, rtol=0)
    responses = Responses(a[0], a[2])
    sep = _train_pass(trainer, batch, responses)
    rid = _train_pass(trainer, batch, responses, ridden)
    bound = 1e-4 if dtype == torch.float32 else 3e-2  # bf16: ~2^-8 per rounding
    valid = batch.attention_mask.bool()[:, None, :, None]  # pads: attended by nothing
    for (k0, v0), (k1, v1) in zip(sep[0], rid[0], strict=True):
        assert _rel(k1 * valid, k0 * valid) < bound and _rel(v1 * valid, v0 * valid) < bound
    assert _rel(rid[2], sep[2]) < bound
    assert sep[3].keys() == rid[3].keys() and any("visual" in n for n in sep[3]) == vision
    worst = max(_rel(rid[3][n], g) for n, g in sep[3].items())
    assert worst < bound * 10, worst  # gradients: a sum of many rounded products
