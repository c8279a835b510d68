"""prefill_once on CUDA: the exported prefill gives the trainer the K/V, logprobs and
gradients of the separate checkpointed prefix forward, in float32 (1e-4 relative: TF32-free
but other kernels than the CPU's) and in bf16 (3e-2 relative on K/V and logprobs, 3e-1 on
gradients: bf16 rounds each product to ~2^-8 and a gradient sums many of them; the same
bounds as the rides' test). Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

from rollplex.backends.torch.exported_prefix import prefill_exported
from rollplex.backends.torch.values import Responses
from tests.backends.torch.test_prefill_once import _train
from tests.backends.torch.test_riders import _decode, _setup
from tests.backends.torch.test_video import renderer  # noqa: F401

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("kind", ["video", "mixed"])
def test_exported_prefill_trains_as_separate_on_cuda(spec, renderer, dtype, kind):  # noqa: F811
    torch.use_deterministic_algorithms(False)  # index_put_/cumsum on CUDA
    batch, trainer, feats = _setup(spec, renderer, kind, "cuda", dtype)
    _, exported = prefill_exported(trainer.model, feats.values, batch.text_only(), "policy@0")
    session = _decode(trainer.model, batch, feats, seed=3, r=24)
    session.advance()
    tokens, _, lengths = session.result()
    responses = Responses(tokens, lengths)
    sep = _train(trainer, batch, feats, responses)
    once = _train(trainer, batch, feats, responses, exported)
    bound = 1e-4 if dtype == torch.float32 else 3e-2
    for (k0, v0), (k1, v1) in zip(sep[0], once[0], strict=True):
        assert _rel(k1, k0) < bound and _rel(v1, v0) < bound
    assert _rel(once[2], sep[2]) < bound
    worst = max(_rel(once[3][n], g) for n, g in sep[3].items())
    assert worst < bound * 10, worst
